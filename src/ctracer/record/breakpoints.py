"""Hardware write breakpoints through perf_event_open(2), each running a BPF program.

`Breakpoint` is one armed word: a perf event of type ``PERF_TYPE_BREAKPOINT``
(``HW_BREAKPOINT_W``, length 1/2/4/8), on one thread of a process (a process's address:
the debug registers are loaded when that thread runs; ``inherit`` carries it to the
threads it starts) or on one CPU (a kernel address: one event per CPU watches the
whole system), with the write program attached by ``PERF_EVENT_IOC_SET_BPF``.  Moving
it to another object's word is ``PERF_EVENT_IOC_MODIFY_ATTRIBUTES`` (the kernel
re-validates the address and keeps the program), so a move costs one ioctl per event.

This talks to the kernel with ctypes, as `ctracer.host.features` does for bpf(2):
bcc's ``attach_perf_event_raw`` builds an attr without the breakpoint fields.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from typing import Optional

_NR_PERF_EVENT_OPEN = 298          # x86-64
_PERF_TYPE_BREAKPOINT = 5
_HW_BREAKPOINT_W = 2
_ATTR_SIZE = 128                   # PERF_ATTR_SIZE_VER8 and below fit
_FLAG_DISABLED, _FLAG_INHERIT, _FLAG_EXCLUDE_KERNEL, _FLAG_EXCLUDE_HV = 1, 2, 32, 64
_IOC_ENABLE, _IOC_DISABLE = 0x2400, 0x2401
_IOC_SET_BPF = 0x40042408
_IOC_MODIFY_ATTRIBUTES = 0x4008240B
_PERF_FLAG_FD_CLOEXEC = 8
_BPF_PROG_TYPE_PERF_EVENT = 7

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BreakpointRefused(OSError):
    """The kernel refused a breakpoint (EPERM: kernel addresses not allowed here;
    ENOSPC: no debug register free; EINVAL: an address it will not watch)."""


def _attr(address: int, length: int, user: bool, disabled: bool) -> ctypes.Array:
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    ctypes.c_uint32.from_buffer(attr, 0).value = _PERF_TYPE_BREAKPOINT
    ctypes.c_uint32.from_buffer(attr, 4).value = _ATTR_SIZE
    ctypes.c_uint64.from_buffer(attr, 16).value = 1       # sample_period: every write
    flags = _FLAG_EXCLUDE_HV | (_FLAG_DISABLED if disabled else 0)
    if user:
        flags |= _FLAG_INHERIT | _FLAG_EXCLUDE_KERNEL
    ctypes.c_uint64.from_buffer(attr, 40).value = flags
    ctypes.c_uint32.from_buffer(attr, 52).value = _HW_BREAKPOINT_W
    ctypes.c_uint64.from_buffer(attr, 56).value = address  # bp_addr
    ctypes.c_uint64.from_buffer(attr, 64).value = length   # bp_len
    return attr


def refusal_text(err: int) -> str:
    """Why the kernel refused a breakpoint with ``err``, in words."""
    why = {errno.EPERM: "not permitted here (kernel addresses need a kernel that allows "
                        "kernel breakpoints)",
           errno.EACCES: "not permitted here",
           errno.ENOSPC: "no debug register free",
           errno.EINVAL: "the kernel will not watch that address",
           errno.ENODEV: "this CPU has no hardware breakpoints",
           errno.ENOENT: "this kernel has no hardware breakpoints"}.get(err, "")
    name = errno.errorcode.get(err, str(err))
    return f"{name}: {why or os.strerror(err)}"


class Breakpoint:
    """One perf event watching one word for writes, with the write program attached."""

    def __init__(self, prog_fd: int, address: int, length: int, *, tid: int = -1,
                 cpu: int = -1):
        user = tid >= 0
        attr = _attr(address, length, user, disabled=True)
        fd = _libc.syscall(_NR_PERF_EVENT_OPEN, attr, tid, cpu, -1, _PERF_FLAG_FD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise BreakpointRefused(err, refusal_text(err))
        self.fd, self.user, self.length, self.address = int(fd), user, length, address
        try:
            fcntl.ioctl(self.fd, _IOC_SET_BPF, prog_fd)
            fcntl.ioctl(self.fd, _IOC_ENABLE, 0)
        except OSError as e:
            os.close(self.fd)
            raise BreakpointRefused(e.errno, refusal_text(e.errno)) from None

    def move(self, address: int) -> None:
        """Watch ``address`` from now on (same length)."""
        attr = _attr(address, self.length, self.user, disabled=False)
        try:
            fcntl.ioctl(self.fd, _IOC_MODIFY_ATTRIBUTES, attr)
        except OSError as e:
            raise BreakpointRefused(e.errno, refusal_text(e.errno)) from None
        self.address = address

    def close(self) -> None:
        if self.fd >= 0:
            try:
                fcntl.ioctl(self.fd, _IOC_DISABLE, 0)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = -1


def online_cpus() -> list[int]:
    """The CPUs a kernel-address watch needs an event on."""
    try:
        with open("/sys/devices/system/cpu/online") as f:
            return _parse_cpus(f.read())
    except OSError:
        return list(range(os.cpu_count() or 1))


def _parse_cpus(text: str) -> list[int]:
    out: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    return out


def threads_of(pid: int) -> list[int]:
    """The thread ids of process ``pid`` ([] when it has gone)."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def _kernel_data_address() -> Optional[int]:
    """A kernel variable's address (``jiffies_64``, else the first data symbol listed),
    from /proc/kallsyms."""
    first = None
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3 or parts[1] not in "DdBb" or not int(parts[0], 16):
                    continue
                if parts[2] == "jiffies_64":
                    return int(parts[0], 16)
                if first is None:
                    first = int(parts[0], 16) // 8 * 8
    except (OSError, ValueError):
        pass
    return first


def refusal(*, kernel: bool) -> Optional[str]:
    """Why the kernel refuses a write breakpoint like the ones ``--watch`` arms, with a
    BPF program attached, or None: one is armed on a kernel variable (``kernel``) or on
    a word of this process, and closed at once."""
    from ctracer.host.features import load_trial_program

    word = ctypes.c_uint64(0)
    address = _kernel_data_address() if kernel else ctypes.addressof(word)
    if address is None:
        return "no kernel variable's address could be read from /proc/kallsyms"
    prog_fd, err = load_trial_program(_BPF_PROG_TYPE_PERF_EVENT)
    if prog_fd < 0:
        return f"a perf_event BPF program is refused ({refusal_text(err)})"
    try:
        Breakpoint(prog_fd, address, 8, tid=-1 if kernel else 0, cpu=0 if kernel else -1).close()
    except BreakpointRefused as e:
        return e.strerror
    finally:
        os.close(prog_fd)
    return None
