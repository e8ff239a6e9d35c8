"""``ctracer trace --tail``: one line per event as it arrives, while the trace file is
written as usual (what nfs_trace's reader and bpftrace users expect).

A line is: seconds since the first event, the object's address, the function (a
tracepoint as ``tp:NAME`` with its arguments by name), entry/exit, and the fields it
changed since the object's previous event, ``old → new`` (the first event of an object
shows none: there is nothing to compare with).
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO

from ctracer.event import (FLAG_READ_FAILED, HEADER, PHASE_ENTRY, PHASE_TRACEPOINT,
                           args_offset, mini_offset)

#: changed fields shown on one line before the rest is counted
MAX_CHANGES_SHOWN = 8


class Tail:
    """A ring buffer callback printing each event on one line."""

    def __init__(self, program, out: Optional[TextIO] = None):
        self.out = out or sys.stdout
        self.mini = program.mini
        self.nargs = program.nargs
        self.start = mini_offset(self.mini, self.nargs)
        self.names = {r.id: (f"tp:{r.name}" if r.reach == "tracepoint" else r.name)
                      for r in program.rows}
        self.args = program.args_by_row()
        self.last: dict[int, dict] = {}
        self.first_ns: Optional[int] = None

    def line(self, raw: bytes) -> str:
        h = HEADER.decode(raw)
        if self.first_ns is None:
            self.first_ns = h["ts_ns"]
        obj, fid, phase = h["object"], h["function_id"], h["phase"]
        what = self.names.get(fid, f"#{fid}")
        parts = [f"{(h['ts_ns'] - self.first_ns) / 1e9:12.6f}", f"{obj:#x}", what]
        if phase == PHASE_TRACEPOINT:
            spec = self.args.get(fid, ())
            if spec:
                import struct
                raw_args = struct.unpack_from(f"<{self.nargs}Q", raw, args_offset())
                parts.append("(" + ", ".join(f"{a.name}={a.value(v)}"
                                            for a, v in zip(spec, raw_args)) + ")")
        else:
            parts.append("entry" if phase == PHASE_ENTRY else f"exit ret={h['retval']}")
        comm = "".join(c if c.isprintable() and c != " " else "?" for c in h["comm"])
        parts.append(f"{comm}[{h['pid']}]")
        if h["flags"] & FLAG_READ_FAILED:
            parts.append("(object unreadable)")
        else:
            values = self.mini.decode(raw, self.start)
            before = self.last.get(obj)
            self.last[obj] = values
            if before is not None:
                changed = [f"{k}: {before[k]} → {v}" for k, v in values.items()
                           if before.get(k) != v]
                shown = changed[:MAX_CHANGES_SHOWN]
                if len(changed) > len(shown):
                    shown.append(f"… {len(changed) - len(shown)} more")
                if shown:
                    parts.append("| " + ", ".join(shown))
        return " ".join(parts)

    def __call__(self, raw: bytes) -> None:
        self.out.write(self.line(raw) + "\n")
        self.out.flush()
