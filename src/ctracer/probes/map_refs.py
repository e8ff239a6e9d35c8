"""The maps a compiled program refers to, and pointing them at other maps.

bcc relocates a program's map references as it compiles: each is a 64-bit load whose
source register says BPF_PSEUDO_MAP_FD (or BPF_PSEUDO_MAP_VALUE, a map's value) and
whose immediate is the fd of the map bcc created for that compile.  Programs compiled
apart from a recording's text (the kprobe fallback's: `ctracer.record.kattach`) share the
recording's maps once `repoint` has rewritten those fds into the recording's own.
"""

from __future__ import annotations

import struct
from typing import Mapping

from ctracer.errors import CtracerError

_LD_IMM64 = 0x18
#: include/uapi/linux/bpf.h: a 64-bit load's source register naming a map by fd
_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE = 1, 2
_INSN = struct.Struct("<BBhi")


def map_fds(insns: bytes) -> list[tuple[int, int]]:
    """(instruction index, map fd) of every map reference in ``insns``."""
    if len(insns) % _INSN.size:
        raise CtracerError(f"instructions of {len(insns)} bytes: not whole instructions")
    found = []
    i, count = 0, len(insns) // _INSN.size
    while i < count:
        code, regs, _off, imm = _INSN.unpack_from(insns, i * _INSN.size)
        if code == _LD_IMM64:
            if regs >> 4 in (_PSEUDO_MAP_FD, _PSEUDO_MAP_VALUE):
                found.append((i, imm))
            i += 2   # the second half holds the high word
        else:
            i += 1
    return found


def repoint(insns: bytes, fds: Mapping[int, int]) -> bytes:
    """``insns`` with each map fd ``fds`` maps written as the fd it maps to; refuses
    (CtracerError) a reference to a map ``fds`` does not know."""
    out = bytearray(insns)
    for i, fd in map_fds(insns):
        if fd not in fds:
            raise CtracerError(f"instruction {i} refers to map fd {fd}, which has no "
                               "counterpart among the recording's maps")
        code, regs, off, _ = _INSN.unpack_from(insns, i * _INSN.size)
        _INSN.pack_into(out, i * _INSN.size, code, regs, off, fds[fd])
    return bytes(out)
