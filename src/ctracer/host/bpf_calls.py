"""bpf(2) from Python, without bcc: the system call, the kernel's refusals quoted, the
numbers of the link and attach kinds the host's trials and ctracer's own loader use, and
kprobe.multi and tracing_multi links (`ctracer.host.features`, `ctracer.host.fsession`,
`ctracer.record.kattach`)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

#: bpf(2) command numbers, from include/uapi/linux/bpf.h
BPF_LINK_CREATE = 28
#: BPF_TRACE_FENTRY_MULTI and BPF_TRACE_FEXIT_MULTI (kernels with tracing_multi links)
TRACE_FENTRY_MULTI, TRACE_FEXIT_MULTI = 59, 60
#: BPF_TRACE_FSESSION_MULTI: one program at entry and return (a session) on such links
TRACE_FSESSION_MULTI = 61
#: the attach_btf_id an fentry.multi or fexit.multi program is loaded with: none (its
#: functions are named by the link)
MULTI_ATTACH_BTF_ID = 0
#: BPF_TRACE_KPROBE_MULTI, and its link's flag for returns (BPF_F_KPROBE_MULTI_RETURN)
TRACE_KPROBE_MULTI, KPROBE_MULTI_RETURN = 42, 1

_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "ppc64": 361,
                "s390x": 351, "i686": 357, "i386": 357, "armv7l": 386, "loongarch64": 280}
#: an empty program (r0 = 0; exit): what trial loads load
RETURN_ZERO = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


def errno_text(err: int) -> str:
    """An errno as the kernel's refusals are quoted: ``E2BIG: Argument list too long``."""
    return f"{errno.errorcode.get(err, err)}: {os.strerror(err)}"


def bpf_syscall(cmd: int, attr: ctypes.Array) -> tuple[int, int]:
    """bpf(2) without bcc: (its result, 0) or (-1, errno); the runtime links uprobe.multi
    programs with it too (`ctracer.record.bpf_runtime`)."""
    nr = _BPF_SYSCALL.get(platform.machine())
    if nr is None:
        return -1, errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr,
                       ctypes.c_uint(len(attr)))
    return int(ret), (ctypes.get_errno() if ret < 0 else 0)


def tracing_multi_link(prog_fd: int, attach_type: int, btf_ids: list[int],
                       cookies: list[int]) -> tuple[int, int]:
    """One tracing_multi link of an fentry.multi or fexit.multi program on the functions
    of the BTF FUNC ids ``btf_ids`` (of the BTF object the program was loaded against),
    each with its cookie; (fd, 0) or (-1, errno)."""
    ids = (ctypes.c_uint32 * len(btf_ids))(*btf_ids)
    marks = (ctypes.c_uint64 * len(cookies))(*cookies)
    attr = ctypes.create_string_buffer(64)
    # link_create: prog_fd @0, target_fd @4, attach_type @8, flags @12;
    # tracing_multi: ids @16 (u32 BTF ids), cookies @24 (u64), cnt @32
    ctypes.c_uint32.from_buffer(attr, 0).value = prog_fd
    ctypes.c_uint32.from_buffer(attr, 8).value = attach_type
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(ids)
    ctypes.c_uint64.from_buffer(attr, 24).value = ctypes.addressof(marks)
    ctypes.c_uint32.from_buffer(attr, 32).value = len(btf_ids)
    return bpf_syscall(BPF_LINK_CREATE, attr)


def kprobe_multi_link(prog_fd: int, symbols: list[str], retprobe: bool = False,
                      cookies: list[int] | None = None) -> tuple[int, int]:
    """One kprobe.multi (``retprobe``: kretprobe.multi) link of a kprobe.multi program on
    the functions named ``symbols``, each with its cookie when ``cookies`` are given;
    (fd, 0) or (-1, errno)."""
    names = [ctypes.create_string_buffer(s.encode()) for s in symbols]
    syms = (ctypes.c_uint64 * len(names))(*[ctypes.addressof(n) for n in names])
    marks = (ctypes.c_uint64 * len(cookies))(*cookies) if cookies is not None else None
    attr = ctypes.create_string_buffer(64)
    # link_create: prog_fd @0, attach_type @8; kprobe_multi: flags @16, cnt @20,
    # syms @24, addrs @32, cookies @40
    ctypes.c_uint32.from_buffer(attr, 0).value = prog_fd
    ctypes.c_uint32.from_buffer(attr, 8).value = TRACE_KPROBE_MULTI
    ctypes.c_uint32.from_buffer(attr, 16).value = KPROBE_MULTI_RETURN if retprobe else 0
    ctypes.c_uint32.from_buffer(attr, 20).value = len(names)
    ctypes.c_uint64.from_buffer(attr, 24).value = ctypes.addressof(syms)
    if marks is not None:
        ctypes.c_uint64.from_buffer(attr, 40).value = ctypes.addressof(marks)
    return bpf_syscall(BPF_LINK_CREATE, attr)
