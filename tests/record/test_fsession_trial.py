"""The fsession.multi trial (`ctracer.host.fsession`): its hand-written program's
instructions, and on a kernel without fsession.multi (this machine's 6.18) the kernel's
answer said, not raised.  Whether 7.2 runs it: tests/vm/test_kernel_methods.py."""

from __future__ import annotations

import os
import struct

import pytest

from ctracer.host import fsession

COOKIE_ID, IS_RETURN_ID, MAP_FD = 111, 222, 9


def _decode(code: bytes) -> list[tuple[int, int, int, int, int]]:
    out = []
    for i in range(0, len(code), 8):
        op, regs, off, imm = struct.unpack("<BBhi", code[i:i + 8])
        out.append((op, regs & 0xF, regs >> 4, off, imm))
    return out


def _run(insns, is_return: bool, cookie: list[int], slot: list[int]) -> None:
    """Step the program: the two kfuncs and the map lookup as the kernel's would
    answer them; ``cookie`` and ``slot`` are the session cookie and the map's slot 0."""
    regs: list = [0] * 10 + ["fp"]
    pc = 0
    while True:
        op, dst, src, off, imm = insns[pc]
        pc += 1
        if op == 0xBF:
            regs[dst] = regs[src]
        elif op == 0xB7:
            regs[dst] = imm
        elif op == 0x07:
            regs[dst] = f"{regs[dst]}{imm}" if isinstance(regs[dst], str) else regs[dst] + imm
        elif op == 0x85 and src == 2:
            regs[0] = {COOKIE_ID: "cookie", IS_RETURN_ID: int(is_return)}[imm]
        elif op == 0x85 and imm == 1:
            assert regs[1] == ("map", MAP_FD) and regs[2] == "fp-4"
            regs[0] = "slot"
        elif op == 0x18:
            assert src == 1
            regs[dst] = ("map", imm)
            pc += 1
        elif op == 0x7A:
            assert regs[dst] == "cookie"
            cookie[0] = imm
        elif op == 0x79:
            assert regs[src] == "cookie"
            regs[dst] = cookie[0]
        elif op == 0x62:
            assert dst == 10
        elif op == 0xDB:
            assert regs[dst] == "slot"
            slot[0] += regs[src]
        elif op in (0x55, 0x15):
            taken = (regs[dst] != imm) if op == 0x55 else (regs[dst] == imm)
            pc += off if taken else 0
        elif op == 0x05:
            pc += off
        elif op == 0x95:
            assert regs[0] == 0
            return
        else:
            raise AssertionError(f"unexpected instruction {op:#x} at {pc - 1}")


def test_entry_marks_the_cookie_and_the_return_counts_only_marked_calls():
    insns = _decode(fsession.session_program(COOKIE_ID, IS_RETURN_ID, MAP_FD))
    cookie, slot = [0], [0]
    _run(insns, False, cookie, slot)
    assert cookie == [fsession.MARK] and slot == [0]
    _run(insns, True, cookie, slot)
    assert slot == [1]
    _run(insns, True, [0], slot)        # a return whose entry left nothing
    assert slot == [1]


@pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root")
def test_a_kernel_without_it_answers_with_its_reason():
    if os.uname().release.split(".")[0] not in ("5", "6"):
        pytest.skip("this kernel may have fsession.multi")
    got = fsession.try_fsession_multi()
    assert got.works is False
    assert got.why.startswith(("the kernel refused to load", "no bpf_session")), got.why
