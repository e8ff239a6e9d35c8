"""The host's tracefs: where it is mounted (mounting it when root and absent), the trace
events it lists, and a trace event's format (the fields a tracepoint's event records)."""

from __future__ import annotations

import ctypes
import errno
import os
import re
from typing import Optional

from ctracer.errors import CtracerError


TRACEFS_DEFAULT = "/sys/kernel/tracing"


DEBUGFS_TRACING = "/sys/kernel/debug/tracing"


def _mount_table() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount, in /proc/self/mounts order."""
    try:
        with open("/proc/self/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            out.append((point, parts[2]))
    return out


def find_tracefs() -> Optional[str]:
    """The path of a mounted tracefs (the canonical one first), None when there is none."""
    mounts = _mount_table()
    points = [p for p, fs in mounts if fs == "tracefs"]
    if TRACEFS_DEFAULT in points:
        return TRACEFS_DEFAULT
    if points:
        return points[0]
    # old kernels expose tracing under debugfs without a tracefs mount of their own
    if any(fs == "debugfs" for _, fs in mounts) and \
            os.path.exists(os.path.join(DEBUGFS_TRACING, "available_events")):
        return DEBUGFS_TRACING
    return None


def tracepoint_format_fields(name: str) -> list[tuple[str, str]]:
    """The fields of tracepoint ``name``'s record as its tracefs ``format`` file lists
    them: (C type, name), the ``common_*`` ones left out; [] when tracefs or the file is
    not there."""
    import glob
    root = find_tracefs()
    if root is None or not re.fullmatch(r"[A-Za-z0-9_]+", name):
        return []
    out = []
    for path in glob.glob(os.path.join(root, "events", "*", name, "format"))[:1]:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            return []
        for m in re.finditer(r"field:([^;]*?)\s*([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?;", text):
            if not m.group(2).startswith("common_"):
                out.append((m.group(1).strip(), m.group(2)))
    return out


def _kernel_has_filesystem(name: str) -> bool:
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == name for line in f if line.strip())
    except OSError:
        return True  # cannot tell: let mount say


def ensure_tracefs() -> str:
    """The tracefs path, mounting tracefs at /sys/kernel/tracing when root and absent."""
    found = find_tracefs()
    if found:
        return found
    if not _kernel_has_filesystem("tracefs"):
        raise CtracerError("this kernel has no tracefs (built without tracing support)")
    if os.geteuid() != 0:
        raise CtracerError(f"tracefs is not mounted and mounting it needs root: run as root "
                           f"or 'mount -t tracefs nodev {TRACEFS_DEFAULT}'")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                           ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"nodev", TRACEFS_DEFAULT.encode(), b"tracefs", 0, None) != 0:
        err = ctypes.get_errno()
        if err == errno.EBUSY and find_tracefs():  # mounted meanwhile
            return find_tracefs()  # type: ignore[return-value]
        raise CtracerError(f"cannot mount tracefs at {TRACEFS_DEFAULT}: {os.strerror(err)}")
    return TRACEFS_DEFAULT


def tracepoint_names(tracefs: Optional[str] = None) -> Optional[set[str]]:
    """``category:name`` of every tracepoint (available_events), None when unreadable."""
    tracefs = tracefs or find_tracefs()
    if not tracefs:
        return None
    try:
        with open(os.path.join(tracefs, "available_events")) as f:
            return {line.strip() for line in f if ":" in line}
    except OSError:
        return None
