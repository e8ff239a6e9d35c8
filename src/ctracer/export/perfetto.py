"""Chrome trace JSON for the Perfetto UI (https://ui.perfetto.dev opens the file, and so
does chrome://tracing): a track per object, a slice per call, field changes as args.

Each object (one lifetime of an address) is a process named ``struct sock 0x…``, or
``0x…-2`` for the address's second lifetime as the report names it (``process_name``,
ordered by ``process_sort_index``); inside it, a thread track per real
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
stage's passes, so the slices and changes are the report's.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any, Optional

from ctracer.event import PHASE_ENTRY
from ctracer.export.table import function_names, report_rows, trace_id
from ctracer.files import staged_output
from ctracer.report.names import object_name
from ctracer.tracefile import Trace


def _us(ns: int) -> float:
    """``ns`` in microseconds, the float nearest above ``ns / 1000`` whose product by 1000
    is not below ``ns``: Perfetto reads it back as ``ns`` by rounding and by truncating."""
    us = ns / 1000.0
    while us * 1000.0 < ns:
        us = math.nextafter(us, math.inf)
    return us


def _changes(row) -> dict[str, str]:
    return {c.field: f"{c.old} → {c.new}" for c in row.changes or ()}


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


def perfetto_events(trace: Trace) -> dict[str, Any]:
    """The Chrome trace JSON object of ``trace``."""
    rows, _, fns = report_rows(trace)
    names = function_names(trace, fns)
    reach = {fid: f.reach for fid, f in trace.functions.items()}
    start = rows[0].ts_ns if rows else 0
    ids = itertools.count(1)
    pids: dict[tuple[int, int], int] = {}
    tids: dict[tuple[int, int], int] = {}
    meta: list[dict[str, Any]] = []
    timed: list[tuple[int, int, dict[str, Any]]] = []  # (ts ns, dur ns or -1, event)
    kind = f"{trace.struct_kind} {trace.struct_name}"

    def track(row) -> Optional[tuple[int, int]]:
        if row.obj is None:
            return None
        key = (row.obj.address, row.obj.lifetime)
        pid = pids.get(key)
        if pid is None:
            pid = pids[key] = next(ids)
            label = object_name(key[0], key[1])
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": pid,
                         "args": {"name": f"{kind} {label}"}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
                         "args": {"sort_index": len(pids)}})
        tid = tids.get((pid, row.tid))
        if tid is None:
            tid = tids[(pid, row.tid)] = next(ids)
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                         "args": {"name": f"{row.comm}/{row.tid}" if row.comm
                                  else str(row.tid)}})
        return pid, tid

    def instant(ts_ns: int, pid_tid, name: str, args: dict[str, Any]) -> None:
        timed.append((ts_ns - start, -1, {"ph": "i", "s": "t", "name": name, "pid": pid_tid[0],
                                          "tid": pid_tid[1], "args": args}))

    for row in rows:
        where = track(row)
        if where is None:
            continue
        name = names.get(row.function_id, f"function#{row.function_id}")
        args: dict[str, Any] = {"comm": row.comm, "tid": row.tid, "depth": row.depth}
        changes = _changes(row)
        if reach.get(row.slot) == "tracepoint":
            instant(row.ts_ns, where, name, {**args, "changes": changes})
        elif row.phase == PHASE_ENTRY:
            if changes:
                by = row.changes[0].function or "code outside traced calls"
                instant(row.ts_ns, where, f"changed by {by}",
                        {"comm": row.comm, "tid": row.tid, "changes": changes,
                         "seen_at": f"entry of {name}"})
            if not row.matched:
                instant(row.ts_ns, where, f"{name} (no exit seen)", args)
        elif row.matched and row.duration_ns is not None:
            if row.retval is not None:
                args["ret"] = row.retval
            timed.append((row.ts_ns - row.duration_ns - start, row.duration_ns,
                          {"ph": "X", "name": name, "pid": where[0], "tid": where[1],
                           "args": {**args, "changes": changes}}))
        else:
            instant(row.ts_ns, where, f"{name} (no entry seen)", {**args, "changes": changes})

    out = meta + _in_order(timed)
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "metadata": {"ctracer": {"struct": trace.struct_name,
                                     "host": trace.meta.get("host", ""),
                                     "trace_id": trace_id(trace),
                                     "incomplete": trace.incomplete}}}


def perfetto_json(trace: Trace) -> str:
    """The file's text: `perfetto_events` as JSON, UTF-8 kept, every backslash written
    ``\\u005c`` and DEL ``\\u007f`` (in JSON text a backslash pair is only ever an escaped
    backslash, and DEL only ever inside a string)."""
    text = json.dumps(perfetto_events(trace), ensure_ascii=False, separators=(",", ":"))
    return text.replace("\\\\", "\\u005c").replace("\x7f", "\\u007f")


def write_perfetto(trace: Trace, output: str) -> None:
    text = perfetto_json(trace)
    with staged_output(output) as staged:
        with open(staged, "w", encoding="utf-8") as f:
            f.write(text)
