"""The vmlinux with DWARF that names the running kernel's source lines (``trace --watch``
on kernel objects): given (``--vmlinux FILE``) or found where Debian's ``-dbg``
packages put it (``/usr/lib/debug/boot/vmlinux-<release>``,
``/usr/lib/debug/lib/modules/<release>/vmlinux``), and checked to be this kernel's
build by its GNU build-id against the running kernel's (``/sys/kernel/notes``): lines
from another build would be wrong silently.
"""

from __future__ import annotations

import os
from typing import Optional

from ctracer.debuginfo.elf import build_id, notes_build_id, read_elf_headers
from ctracer.errors import InputFileError

KERNEL_NOTES = "/sys/kernel/notes"
DEBUG_PLACES = ("/usr/lib/debug/boot/vmlinux-{release}",
                "/usr/lib/debug/lib/modules/{release}/vmlinux")


def running_build_id(notes: str = KERNEL_NOTES) -> Optional[str]:
    """The running kernel's build id from its notes (None when they cannot be read)."""
    try:
        with open(notes, "rb") as f:
            return notes_build_id(f.read())
    except OSError:
        return None


def problem(path: str, running: Optional[str]) -> Optional[str]:
    """Why ``path`` cannot give the running kernel's lines, or None."""
    try:
        headers = read_elf_headers(path)
    except (OSError, InputFileError) as e:
        return str(e) if isinstance(e, InputFileError) else f"{path}: {e.strerror}"
    if headers.section(".debug_info") is None or headers.section(".debug_line") is None:
        return f"{path} has no DWARF line table (.debug_info, .debug_line)"
    found = build_id(path)
    if running and found != running:
        return (f"{path} is another kernel build (build-id {found or 'none'}, the "
                f"running kernel's {running})")
    return None


def kernel_vmlinux(given: Optional[str], release: Optional[str] = None) -> Optional[str]:
    """``given`` when it is this kernel's vmlinux with DWARF (else `InputFileError`,
    saying why), else the first of `DEBUG_PLACES` that is, else None."""
    running = running_build_id()
    if given:
        why = problem(given, running)
        if why:
            raise InputFileError(f"--vmlinux: {why}")
        return given
    release = release or os.uname().release
    for place in DEBUG_PLACES:
        path = place.format(release=release)
        if os.path.exists(path) and problem(path, running) is None:
            return path
    return None
