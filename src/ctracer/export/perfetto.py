"""Chrome trace JSON for the Perfetto UI (https://ui.perfetto.dev opens the file, and so
does chrome://tracing): a track per object, a slice per call, field changes as args.

Each object (one lifetime of an address) is a process named ``struct sock 0x… #n``
(``process_name``, ordered by ``process_sort_index``); inside it, a thread track per real
thread that called a function on it, named ``comm/tid``.  The file's pids and tids are
synthetic, drawn from one counter, so no tid is shared by two processes or equals a pid:
Perfetto's importer finds a thread by (tid, pid), but older versions named it by tid
alone, and each process gets a main thread whose tid is its pid.  The real tid and comm
are in every event's args.

A call whose entry and exit were both seen is a complete slice (``ph: X``) named by the
function, with the changes it made (``{"sk_refcnt": "1 → 2"}``), the return value, comm,
tid and depth as args; an entry whose exit never came, an exit whose entry was lost, a
tracepoint hit, and changes a caller made before a call are thread-scoped instant events
(``ph: i``, ``s: t``) on the same track.  Times are microseconds from the trace's first
event, written as floats that read back as the exact nanosecond (Perfetto multiplies by
1000 and rounds; older versions truncated ``dur``).  Events are in time order, a longer
slice before a shorter one starting at the same nanosecond and slices before instants,
which is the order Perfetto's sorter gives them; slices on a track nest in integer
nanoseconds, and one that would end after its enclosing slice (which Perfetto would
drop) is cut at the enclosing slice's end, its own duration kept as ``dur_ns``.
Backslashes in strings are written ``\\u005c`` (Perfetto's string scanner takes a quote
after a backslash as escaped) and DEL as ``\\u007f``.  Everything comes from the report
stage (`ctracer.analysis`), so the slices and changes are the report's.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np

from ctracer.analysis import Analysis
from ctracer.analysis.model import NO_DURATION, function_label
from ctracer.decode import object_name
from ctracer.event import PHASE_ENTRY
from ctracer.export.table import function_names, trace_id
from ctracer.files import staged_output


def _us(ns: int) -> float:
    """``ns`` in microseconds, the float nearest above ``ns / 1000`` whose product by 1000
    is not below ``ns``: Perfetto reads it back as ``ns`` by rounding and by truncating."""
    us = ns / 1000.0
    while us * 1000.0 < ns:
        us = math.nextafter(us, math.inf)
    return us


def _changes(a: Analysis, lo: int, hi: int) -> dict[str, str]:
    """Changes ``lo``..``hi`` (one event's) as ``{field: "old → new"}``."""
    out = {}
    ch = a.changes
    for k in range(lo, hi):
        j = int(ch.field[k])
        out[a.layout.fields[j].name] = (f"{a.values.decode_one(j, int(ch.old[k]))} → "
                                        f"{a.values.decode_one(j, int(ch.new[k]))}")
    return out


def _in_order(timed: list[tuple[int, int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The events of ``timed`` (ts ns, dur ns or -1 for an instant, event) in Perfetto's
    order, with ``ts`` and ``dur`` set; a slice that would end after the slice enclosing
    it on its track is cut at that slice's end (``dur_ns`` in its args keeps its own)."""
    ends: dict[tuple[int, int], list[int]] = {}  # per track: ends of the open slices
    out = []
    for ts, dur, e in sorted(timed, key=lambda t: (t[0], t[1] < 0, -t[1])):
        e["ts"] = _us(ts)
        if dur >= 0:
            stack = ends.setdefault((e["pid"], e["tid"]), [])
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and ts + dur > stack[-1]:
                e["args"]["dur_ns"] = dur
                dur = stack[-1] - ts
            if dur:
                stack.append(ts + dur)
            e["dur"] = _us(dur)
        out.append(e)
    return out


def perfetto_events(a: Analysis) -> dict[str, Any]:
    """The Chrome trace JSON object of the analysed trace ``a``."""
    names = function_names(a)
    ev = a.events
    start = a.start_ns
    change_start, change_end = a.change_rows()
    ids = itertools.count(1)
    pids: dict[int, int] = {}
    tids: dict[tuple[int, int], int] = {}
    meta: list[dict[str, Any]] = []
    timed: list[tuple[int, int, dict[str, Any]]] = []  # (ts ns, dur ns or -1, event)
    kind = f"{a.summary.struct_kind} {a.summary.struct_name}"

    def label(o: int) -> str:
        key = a.objects.keys[o]
        return object_name(key.address, key.lifetime)

    def track(o: int, tid: int, comm: str) -> tuple[int, int]:
        pid = pids.get(o)
        if pid is None:
            pid = pids[o] = next(ids)
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": pid,
                         "args": {"name": f"{kind} {label(o)}"}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
                         "args": {"sort_index": len(pids)}})
        t = tids.get((pid, tid))
        if t is None:
            t = tids[(pid, tid)] = next(ids)
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t,
                         "args": {"name": f"{comm}/{tid}" if comm else str(tid)}})
        return pid, t

    def instant(ts_ns: int, pid_tid, name: str, args: dict[str, Any]) -> None:
        timed.append((ts_ns - start, -1, {"ph": "i", "s": "t", "name": name, "pid": pid_tid[0],
                                          "tid": pid_tid[1], "args": args}))

    placed = np.flatnonzero(ev.object >= 0)
    for i, o, tid, comm_index, fid, row, phase, ts, depth, matched, duration, has_ret, \
            retval in zip(placed.tolist(), *(c[placed].tolist() for c in (
                ev.object, ev.tid, ev.comm, ev.function, ev.function_row, ev.phase, ev.ts_ns,
                ev.depth, ev.matched, ev.duration_ns, ev.has_retval, ev.retval))):
        comm = ev.comms[comm_index]
        where = track(o, tid, comm)
        name = function_label(names, fid)
        args: dict[str, Any] = {"comm": comm, "tid": tid, "depth": depth}
        lo, hi = int(change_start[i]), int(change_end[i])
        changes = _changes(a, lo, hi)
        if a.route_kind.get(row) == "tracepoint":
            instant(ts, where, name, {**args, "changes": changes})
        elif phase == PHASE_ENTRY:
            if changes:
                f = int(a.changes.function[lo])
                by = a.function_name(f) if f >= 0 else "code outside traced calls"
                instant(ts, where, f"changed by {by}",
                        {"comm": comm, "tid": tid, "changes": changes,
                         "seen_at": f"entry of {name}"})
            if not matched:
                instant(ts, where, f"{name} (no exit seen)", args)
        elif matched and duration != NO_DURATION:
            if has_ret:
                args["ret"] = retval
            timed.append((ts - duration - start, duration,
                          {"ph": "X", "name": name, "pid": where[0], "tid": where[1],
                           "args": {**args, "changes": changes}}))
        else:
            instant(ts, where, f"{name} (no entry seen)", {**args, "changes": changes})

    out = meta + _in_order(timed)
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "metadata": {"ctracer": {"struct": a.summary.struct_name,
                                     "host": a.summary.host,
                                     "trace_id": trace_id(a),
                                     "incomplete": a.incomplete}}}


def perfetto_json(a: Analysis) -> str:
    """The file's text: `perfetto_events` as JSON, UTF-8 kept, every backslash written
    ``\\u005c`` and DEL ``\\u007f`` (in JSON text a backslash pair is only ever an escaped
    backslash, and DEL only ever inside a string)."""
    text = json.dumps(perfetto_events(a), ensure_ascii=False, separators=(",", ":"))
    return text.replace("\\\\", "\\u005c").replace("\x7f", "\\u007f")


def write_perfetto(a: Analysis, output: str) -> None:
    """Write the Perfetto JSON of the analysis to ``output`` (renamed into place once whole)."""
    text = perfetto_json(a)
    with staged_output(output) as staged:
        with open(staged, "w", encoding="utf-8") as f:
            f.write(text)
