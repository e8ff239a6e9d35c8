"""Whether the running kernel runs an fsession program on a tracing_multi link: one
program at a function's entry and at its return, the two runs of one call sharing a
session cookie (``BPF_TRACE_FSESSION_MULTI``; kfuncs ``bpf_session_is_return`` and
``bpf_session_cookie``).

Tried, not read from the version: a small program written here instruction by
instruction (bcc has no way to call kfuncs) is loaded as fsession.multi, linked to one
function, and the function is called; at entry the program writes a mark into the
session cookie, at return it counts into an array map the calls whose cookie still holds
the mark.  `try_fsession_multi` says what the kernel answered at each step: whether it
loads the program, takes the link, and whether the cookie written at entry was read at
return.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Callable, Optional

from ctracer.host.bpf_calls import (TRACE_FSESSION_MULTI, bpf_syscall, errno_text,
                                    tracing_multi_link)
from ctracer.host.facts import Mechanism
_PROG_TYPE_TRACING = 26
_BPF_MAP_CREATE, _BPF_MAP_LOOKUP_ELEM, _BPF_PROG_LOAD = 0, 1, 5
_MAP_TYPE_ARRAY = 2
_PSEUDO_MAP_FD, _PSEUDO_KFUNC_CALL = 1, 2
_HELPER_MAP_LOOKUP_ELEM = 1
#: what the entry leaves in the cookie
MARK = 0x5E55
KFUNCS = ("bpf_session_cookie", "bpf_session_is_return")


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def session_program(cookie_id: int, is_return_id: int, map_fd: int) -> bytes:
    """At entry: ``*bpf_session_cookie(ctx) = MARK``; at return: if the cookie holds
    MARK, add one to the array map's slot 0."""
    mov_reg, mov_imm, call, exit_ = 0xBF, 0xB7, 0x85, 0x95
    code = [
        _insn(mov_reg, 6, 1),                                   # r6 = ctx
        _insn(call, 0, _PSEUDO_KFUNC_CALL, 0, cookie_id),       # r0 = cookie
        _insn(mov_reg, 7, 0),                                   # r7 = r0
        _insn(mov_reg, 1, 6),                                   # r1 = ctx
        _insn(call, 0, _PSEUDO_KFUNC_CALL, 0, is_return_id),    # r0 = is_return
        _insn(0x55, 0, 0, 3, 0),                                # if r0 != 0 goto +3
        _insn(0x7A, 7, 0, 0, MARK),                             # *(u64 *)r7 = MARK
        _insn(mov_imm, 0, 0, 0, 0),
        _insn(exit_),
        _insn(0x79, 1, 7, 0, 0),                                # r1 = *(u64 *)r7
        _insn(0x55, 1, 0, 10, MARK),                            # if r1 != MARK goto out
        _insn(0x62, 10, 0, -4, 0),                              # *(u32 *)(r10 - 4) = 0
        _insn(mov_reg, 2, 10),
        _insn(0x07, 2, 0, 0, -4),                               # r2 = r10 - 4
        _insn(0x18, 1, _PSEUDO_MAP_FD, 0, map_fd), _insn(0),    # r1 = map
        _insn(call, 0, 0, 0, _HELPER_MAP_LOOKUP_ELEM),
        _insn(0x15, 0, 0, 3, 0),                                # if r0 == 0 goto out
        _insn(mov_imm, 1, 0, 0, 1),
        _insn(0xDB, 0, 1, 0, 0),                                # lock *(u64 *)r0 += r1
        _insn(0x05, 0, 0, 0, 0),                                # goto out (next)
        _insn(mov_imm, 0, 0, 0, 0),                             # out: r0 = 0
        _insn(exit_),
    ]
    return b"".join(code)


def _array_map() -> tuple[int, int]:
    attr = ctypes.create_string_buffer(72)
    for offset, value in ((0, _MAP_TYPE_ARRAY), (4, 4), (8, 8), (12, 1)):
        ctypes.c_uint32.from_buffer(attr, offset).value = value
    return bpf_syscall(_BPF_MAP_CREATE, attr)


def _slot0(map_fd: int) -> int:
    key, value = ctypes.c_uint32(0), ctypes.c_uint64(0)
    attr = ctypes.create_string_buffer(32)
    ctypes.c_uint32.from_buffer(attr, 0).value = map_fd
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(key)
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(value)
    ret, _ = bpf_syscall(_BPF_MAP_LOOKUP_ELEM, attr)
    return int(value.value) if ret == 0 else -1


def _load(insns: bytes) -> tuple[int, str]:
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 16)
    attr = ctypes.create_string_buffer(144)
    for offset, value in ((0, _PROG_TYPE_TRACING), (4, len(insns) // 8), (24, 1),
                          (28, len(log)), (68, TRACE_FSESSION_MULTI)):
        ctypes.c_uint32.from_buffer(attr, offset).value = value
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(code)
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(license_)
    ctypes.c_uint64.from_buffer(attr, 32).value = ctypes.addressof(log)
    attr[48:48 + len(b"ctracer_fsess")] = b"ctracer_fsess"
    fd, err = bpf_syscall(_BPF_PROG_LOAD, attr)
    if fd >= 0:
        return fd, ""
    lines = [line for line in log.value.decode("utf-8", "replace").splitlines()
             if line.strip() and not line.startswith(("processed ", "verification time"))]
    return -1, errno_text(err) + (f": {lines[-1][:200]}" if lines else "")


def kernel_func_ids(names) -> dict[str, int]:
    """The vmlinux BTF FUNC ids of ``names`` (those found)."""
    from ctracer.debuginfo.btf import KERNEL_BTF
    from ctracer.debuginfo.btf import format as btf_format
    from ctracer.debuginfo.btf import reader as btf
    from ctracer.errors import CtracerError
    try:
        data = btf.open_btf(KERNEL_BTF).btf
    except CtracerError:
        return {}
    wanted, out = set(names), {}
    for tid in data.ids_of_kind(btf_format.FUNC):
        name = data.name(tid)
        if name in wanted:
            out.setdefault(name, tid)
    return out


def _read_a_file() -> None:
    with open("/proc/version", "rb") as f:
        f.read()


def try_fsession_multi(target: str = "vfs_read",
                       call: Callable[[], None] = _read_a_file,
                       calls: int = 20) -> Mechanism:
    """Load the session program, link it to ``target`` with a tracing_multi link, run
    ``call`` ``calls`` times; works when the return runs found the entry's mark."""
    ids = kernel_func_ids(KFUNCS + (target,))
    missing = [n for n in KFUNCS + (target,) if n not in ids]
    if missing:
        return Mechanism(False, f"no {', '.join(missing)} in the kernel's BTF")
    map_fd, err = _array_map()
    if map_fd < 0:
        return Mechanism(None, f"the trial's array map was refused ({errno_text(err)})")
    fds = [map_fd]
    try:
        fd, why = _load(session_program(ids["bpf_session_cookie"],
                                        ids["bpf_session_is_return"], map_fd))
        if fd < 0:
            return Mechanism(False, f"the kernel refused to load an fsession.multi program "
                                    f"({why})")
        fds.append(fd)
        link, err = tracing_multi_link(fd, TRACE_FSESSION_MULTI, [ids[target]], [0])
        if link < 0:
            return Mechanism(False, f"an fsession.multi program loaded but a tracing_multi "
                                    f"link to {target} was refused ({errno_text(err)})")
        fds.append(link)
        for _ in range(calls):
            call()
        paired = _slot0(map_fd)
        if paired < calls:
            return Mechanism(False, f"linked to {target}, but {paired} of {calls} returns "
                                    "found the mark their entry left in the session cookie")
        return Mechanism(True, f"an fsession.multi program linked to {target}: {paired} "
                               f"returns found the mark their entry left in the session "
                               f"cookie ({calls} calls made)")
    finally:
        for fd in reversed(fds):
            os.close(fd)


def main() -> Optional[int]:
    """``python -m ctracer.host.fsession``: say what the kernel answered."""
    m = try_fsession_multi()
    print(f"fsession.multi: {'yes' if m.works else 'no' if m.works is False else 'unknown'}: "
          f"{m.why}")
    return 0 if m.works else 1


if __name__ == "__main__":
    raise SystemExit(main())
