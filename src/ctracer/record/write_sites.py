"""Where the writes of ``--watch`` came from: the trace's ``watch_sites`` rows.

Only the recording host can say: a program's code addresses are those of its
process's mappings (read while the process lives, `ProcessMaps`), resolved in the
mapped file's ELF (`ctracer.debuginfo.code.CodeMap`: symbol + offset, DWARF line,
inlined function; the writer is the instruction ending at the trap's ip); a kernel's
through /proc/kallsyms, as function + offset (no line without a vmlinux with DWARF: then
``vmlinux``, the running kernel's build (`ctracer.host.vmlinux`), gives the lines and
inlined functions through the same `CodeMap`, each address moved back by the kernel's
KASLR offset: the running ``_text`` less the vmlinux's ``.text``).
"""

from __future__ import annotations

import bisect
import os
from typing import Iterable, Optional

from ctracer.tracefile.writes import Site, Write


class ProcessMaps:
    """The file mappings of processes, kept from /proc/PID/maps (read at arming)."""

    def __init__(self) -> None:
        self.maps: dict[int, list[tuple[int, int, int, str]]] = {}

    def read(self, pid: int) -> None:
        rows = []
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    parts = line.split(maxsplit=5)
                    if len(parts) < 6 or not parts[5].startswith("/"):
                        continue
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    rows.append((lo, hi, int(parts[2], 16), parts[5].strip()))
        except OSError:
            return
        if rows:
            self.maps[pid] = sorted(rows)

    def file_offset(self, pid: int, address: int) -> Optional[tuple[str, int]]:
        rows = self.maps.get(pid, [])
        i = bisect.bisect_right(rows, (address, 1 << 64)) - 1
        if i >= 0 and rows[i][0] <= address < rows[i][1]:
            lo, _hi, offset, path = rows[i]
            return path, address - lo + offset
        return None


def _vaddr(code_map, file_offset: int) -> Optional[int]:
    for seg in code_map.elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and \
                seg["p_offset"] <= file_offset < seg["p_offset"] + seg["p_filesz"]:
            return file_offset - seg["p_offset"] + seg["p_vaddr"]
    return None


def callers(w: Write) -> tuple[int, ...]:
    """The return addresses of a write's stack: its first frame is the trap's own ip."""
    return tuple(a for a in w.stack[1:] if a)


def resolve(rows: Iterable[Write], *, kernel: bool, maps: Optional[ProcessMaps] = None,
            vmlinux: Optional[str] = None, kallsyms=None) -> list[Site]:
    """A site for every writer ip and every stack return address of ``rows``; a
    kernel's named by ``kallsyms`` (a `ctracer.host.kallsyms.Kallsyms`, by default the
    running kernel's)."""
    rows = list(rows)
    wanted: set[tuple[int, int, str]] = set()
    for w in rows:
        pid = 0 if kernel else w.pid
        wanted.add((pid, w.ip, "writer"))
        for a in callers(w):
            wanted.add((pid, a, "caller"))
    return _kernel_sites(wanted, vmlinux, kallsyms) if kernel else \
        _user_sites(wanted, maps)


def _user_sites(wanted, maps: Optional[ProcessMaps]) -> list[Site]:
    from ctracer.debuginfo.code import CodeMap

    by_file: dict[str, list[tuple[int, int, str, int]]] = {}
    out = []
    for pid, address, kind in wanted:
        found = maps.file_offset(pid, address if kind == "caller" else address - 1) \
            if maps else None
        if found is None:
            out.append(Site(pid, address, kind, None, 0, None, None, "", ""))
            continue
        path, offset = found
        by_file.setdefault(path, []).append((pid, address, kind,
                                             offset + (1 if kind == "writer" else 0)))
    for path, items in by_file.items():
        try:
            code = CodeMap(path)
        except Exception:   # not readable or not ELF: name the file, no more
            out += [Site(p, a, k, None, 0, None, None, "", os.path.basename(path))
                    for p, a, k, _ in items]
            continue
        try:
            vaddrs = {(p, a, k): _vaddr(code, off) for p, a, k, off in items}
            writers = code.writers(v for (p, a, k), v in vaddrs.items()
                                   if k == "writer" and v is not None)
            callers = code.callers(v for (p, a, k), v in vaddrs.items()
                                   if k == "caller" and v is not None)
            for (p, a, k), v in vaddrs.items():
                loc = None if v is None else (writers if k == "writer" else callers).get(v)
                if loc is None or loc.function is None:   # no symbol: the file's offset
                    out.append(Site(p, a, k, None, v or 0, loc.file if loc else None,
                                    loc.line if loc else None, "", os.path.basename(path)))
                else:
                    out.append(Site(p, a, k, loc.function, loc.offset, loc.file, loc.line,
                                    loc.inlined, os.path.basename(path), loc.inlined_from))
        finally:
            code.close()
    return out


def _kernel_sites(wanted, vmlinux: Optional[str], names=None) -> list[Site]:
    from ctracer.host.kallsyms import Kallsyms

    names = names or Kallsyms()
    located = {}
    if vmlinux:
        located = _kernel_lines(vmlinux, names, {a - 1 for _p, a, _k in wanted})
    out = []
    for pid, address, kind in wanted:
        text = names.name(address if kind == "writer" else address - 1) or ""
        function, _, offset = text.partition("+")
        off = int(offset.split()[0], 16) if offset else 0
        if kind == "caller" and function:
            off += 1
        # the byte before a trap's ip (or a return address) is inside its instruction
        loc = located.get(address - 1)
        out.append(Site(pid, address, kind, function or None, off, loc and loc.file,
                        loc and loc.line, loc.inlined if loc else "", "vmlinux",
                        loc.inlined_from if loc else ""))
    return out


def _kernel_lines(vmlinux: str, names, addresses: set[int]) -> dict:
    """The `Location` (file:line, inlined function) of running-kernel ``addresses`` in
    ``vmlinux``, moved by the KASLR offset; none when the offset is unknown."""
    from ctracer.debuginfo.code import CodeMap

    code = CodeMap(vmlinux)
    try:
        running, linked = names.address("_text"), code.section_address(".text")
        if running is None or linked is None:
            return {}
        slide = running - linked
        found = code.lines(a - slide for a in addresses)
        return {a: found[a - slide] for a in addresses}
    finally:
        code.close()
