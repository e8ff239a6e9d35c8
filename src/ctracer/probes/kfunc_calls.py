"""Kernel functions (kfuncs) called from bcc-compiled programs.

bcc's C has no way to call a kfunc: a kfunc call is a ``call`` instruction whose source
register says BPF_PSEUDO_KFUNC_CALL and whose immediate is the kfunc's BTF id in the
running kernel, which only a loader knowing that BTF can write.  So the generated C calls
a placeholder: a helper pointer with a reserved number that no real helper has (helper
numbers are small and dense; `PLACEHOLDERS` are far above them), which clang compiles to a
plain ``call <number>``; before loading, `patch` rewrites exactly those instructions into
kfunc calls.  The numbers are defined here once, for the C emitter
(`declarations`) and for the loader (`patch`).
"""

from __future__ import annotations

import struct
from typing import Mapping

from ctracer.errors import CtracerError

#: kfunc name -> the reserved helper number its placeholder is called by
PLACEHOLDERS = {"bpf_session_is_return": 0x7E5100}
#: the C name of each kfunc's placeholder
C_NAMES = {"bpf_session_is_return": "ctracer_session_is_return"}

_CALL = 0x85            # BPF_JMP | BPF_CALL
_PSEUDO_KFUNC_CALL = 2
_LD_IMM64 = 0x18
_INSN = struct.Struct("<BBhi")


def declarations(kfuncs=tuple(PLACEHOLDERS)) -> str:
    """The C declaring each kfunc's placeholder (taking the program's ctx, as the
    session kfuncs do)."""
    return "".join(f"/* {name}(ctx): a kfunc, called through a placeholder the loader "
                   f"rewrites */\nstatic long (*{C_NAMES[name]})(void *ctx) = "
                   f"(void *){PLACEHOLDERS[name]:#x};\n" for name in kfuncs)


def placeholder_calls(insns: bytes) -> dict[str, list[int]]:
    """The instruction indexes of each kfunc's placeholder call in ``insns``; raises
    where a placeholder number shows up as anything but a plain helper call (a
    kfunc or BPF-to-BPF call, another instruction's immediate)."""
    numbers = {n: k for k, n in PLACEHOLDERS.items()}
    found: dict[str, list[int]] = {}
    if len(insns) % _INSN.size:
        raise CtracerError(f"instructions of {len(insns)} bytes: not whole instructions")
    skip = False
    for i in range(len(insns) // _INSN.size):
        code, regs, _off, imm = _INSN.unpack_from(insns, i * _INSN.size)
        if skip:   # the second half of a 64-bit load: its immediate is the high word
            skip = False
            continue
        skip = code == _LD_IMM64
        if imm not in numbers:
            continue
        if code != _CALL or regs != 0:
            raise CtracerError(
                f"instruction {i} holds {numbers[imm]}'s placeholder number {imm:#x} "
                f"but is not a helper call to it (code {code:#x}, registers {regs:#x})")
        found.setdefault(numbers[imm], []).append(i)
    return found


def patch(insns: bytes, btf_ids: Mapping[str, int], expected=tuple(PLACEHOLDERS)) -> bytes:
    """``insns`` with every placeholder call turned into a call of its kfunc
    (``btf_ids``: kfunc name -> its vmlinux BTF FUNC id).  Refuses (CtracerError) a
    program calling no ``expected`` kfunc, calling one it does not expect, or calling
    one ``btf_ids`` has no id for."""
    calls = placeholder_calls(insns)
    unexpected = sorted(set(calls) - set(expected))
    if unexpected:
        raise CtracerError(f"the program calls {', '.join(unexpected)}, which it should not")
    if not calls and expected:
        raise CtracerError(f"the program calls none of {', '.join(expected)} (its placeholder "
                           "calls were not found in the compiled instructions)")
    missing = sorted(name for name in calls if not btf_ids.get(name))
    if missing:
        raise CtracerError(f"the kernel's BTF has no kfunc {', '.join(missing)}")
    out = bytearray(insns)
    for name, where in calls.items():
        for i in where:
            _INSN.pack_into(out, i * _INSN.size, _CALL, _PSEUDO_KFUNC_CALL << 4, 0,
                            btf_ids[name])
    return bytes(out)
