"""kfunc calls in bcc-compiled programs (`ctracer.probes.kfunc_calls`): the session
programs' C calls ``bpf_session_is_return`` through a placeholder helper number, bcc
compiles it to a plain helper call, and the patch turns exactly those calls into kfunc
calls (the kernel's BTF id), refusing a program where the placeholder shows up elsewhere
or the kfunc is missing.  Compiled by bcc here; loading them needs a kernel with fsession
(tests/vm/test_kernel_methods.py, 7.2)."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess

import pytest

from support import groundtruth as gt
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.errors import CtracerError
from ctracer.host.facts import KernelFacts, Mechanism
from ctracer.plan import attach, discovery, mini
from ctracer.probes import kfunc_calls
from ctracer.probes.kernel_program import build_kernel_program
from ctracer.probes.uprobe import ARCHES

IS_RETURN = "bpf_session_is_return"
PLACEHOLDER = kfunc_calls.PLACEHOLDERS[IS_RETURN]
KFUNC_ID = 61234


def _insns(code: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack_from("<BBhi", code, i) for i in range(0, len(code), 8)]


@pytest.fixture(scope="module")
def compiled(bpf):
    """name -> instructions of every kernel-function program of the sample's sock methods,
    as session programs and as an fentry/fexit pair, compiled by bcc."""
    from ctracer.record import bpf_runtime
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    types = dwarf.open_elf_types(gt.SOCKDEMO, use_cache=False)
    found = discovery.discover(types.catalog(), "sock")
    facts = KernelFacts(fentry=Mechanism(True, "works"), kprobes=Mechanism(True, "works"))
    methods = [m for p in attach.plan_probes(found.methods, facts).of_kind("fentry")
               for m in p.methods]
    layout = mini.build_mini(types.find_struct("sock")).layout
    bpf_runtime.prepare()
    bcc = bpf_runtime._import_bcc()
    out = {}
    for kind in ("fsession.multi", "fentry.multi"):
        program = build_kernel_program((), layout, types.catalog(), function_methods=methods,
                                       entry_kind=kind, arch=ARCHES["x86_64"])
        b = bpf_runtime._compile(bcc, program.text, [], "bcc could not compile")
        lib = bcc.libbcc.lib
        for name in program.program_names() + program.program_names(task_storage=False):
            start = lib.bpf_function_start(b.module, name.encode())
            out[name] = ctypes.string_at(start, lib.bpf_function_size(b.module, name.encode()))
        b.cleanup()
    return out


def test_each_session_program_calls_the_placeholder_once_as_a_plain_helper_call(compiled):
    sessions = {n: c for n, c in compiled.items() if n.startswith("ctracer_fsession_")}
    assert len(sessions) >= 2   # task storage and LRU-hash variants at least
    for name, code in sessions.items():
        calls = [i for i, (op, regs, off, imm) in enumerate(_insns(code))
                 if op == 0x85 and imm == PLACEHOLDER]
        assert len(calls) == 1, name
        assert kfunc_calls.placeholder_calls(code) == {IS_RETURN: calls}
        assert _insns(code)[calls[0]][1] == 0   # src_reg 0: a helper call, as bcc left it


def test_the_patch_rewrites_exactly_the_placeholder_calls_into_kfunc_calls(compiled):
    for name, code in compiled.items():
        if not name.startswith("ctracer_fsession_"):
            continue
        patched = kfunc_calls.patch(code, {IS_RETURN: KFUNC_ID})
        before, after = _insns(code), _insns(patched)
        changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
        assert len(patched) == len(code) and len(changed) == 1, name
        op, regs, off, imm = after[changed[0]]
        assert (op, regs >> 4, regs & 0xF, off, imm) == (0x85, 2, 0, 0, KFUNC_ID)
        assert kfunc_calls.placeholder_calls(patched) == {}


def test_the_pair_programs_call_no_placeholder_and_the_patch_refuses_them(compiled):
    pair = {n: c for n, c in compiled.items() if not n.startswith("ctracer_fsession_")}
    assert pair
    for name, code in pair.items():
        assert kfunc_calls.placeholder_calls(code) == {}, name
        assert kfunc_calls.patch(code, {}, expected=()) == code
        with pytest.raises(CtracerError, match="calls none of bpf_session_is_return"):
            kfunc_calls.patch(code, {IS_RETURN: KFUNC_ID})


def test_the_patch_refuses_a_missing_kfunc_or_an_unexpected_call(compiled):
    code = compiled["ctracer_fsession_r1"]
    with pytest.raises(CtracerError, match="no kfunc bpf_session_is_return"):
        kfunc_calls.patch(code, {})
    with pytest.raises(CtracerError, match="should not"):
        kfunc_calls.patch(code, {IS_RETURN: KFUNC_ID}, expected=())


def test_the_placeholder_number_anywhere_but_a_helper_call_is_refused():
    mov = struct.pack("<BBhi", 0xB7, 1, 0, PLACEHOLDER)            # r1 = <the number>
    call = struct.pack("<BBhi", 0x85, 0, 0, PLACEHOLDER)
    ret = struct.pack("<BBhi", 0x95, 0, 0, 0)
    with pytest.raises(CtracerError, match="not a helper call"):
        kfunc_calls.placeholder_calls(mov + call + ret)
    kfunc_as_is = struct.pack("<BBhi", 0x85, 2 << 4, 0, PLACEHOLDER)   # already a kfunc call
    with pytest.raises(CtracerError, match="not a helper call"):
        kfunc_calls.patch(kfunc_as_is + ret, {IS_RETURN: KFUNC_ID})
    # the high word of a 64-bit constant is not an instruction of its own
    ld64 = struct.pack("<BBhi", 0x18, 1, 0, 0) + struct.pack("<BBhi", 0, 0, 0, PLACEHOLDER)
    assert kfunc_calls.placeholder_calls(ld64 + call + ret) == {IS_RETURN: [2]}
