"""Chrome trace JSON for the Perfetto UI (https://ui.perfetto.dev opens the file, and so
does chrome://tracing): a track per object, a slice per call, field changes as args.

Each object (one lifetime of an address) is a process-level track named
``struct sock 0x… #n``; inside it, one thread track per thread that called a function
on it, so calls nest as they did on that thread.  A call whose entry and exit were both
seen is a complete slice (``ph: X``) named by the function, with the changes it made
(``{"sk_refcnt": "1 → 2"}``), the return value, comm and depth as args; an entry whose
exit never came, an exit whose entry was lost, a tracepoint hit, and changes a caller
made before a call are instant events on the same track.  Times are microseconds from
the trace's first event.  Everything comes from the report stage's passes, so the
slices and changes are the report's.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from ctracer.event import PHASE_ENTRY
from ctracer.export.table import function_names, report_rows, trace_id
from ctracer.files import staged_output
from ctracer.report.names import object_label
from ctracer.tracefile import Trace


def _us(ns: int) -> float:
    return ns / 1000.0


def _changes(row) -> dict[str, str]:
    return {c.field: f"{c.old} → {c.new}" for c in row.changes or ()}


def perfetto_events(trace: Trace) -> dict[str, Any]:
    """The Chrome trace JSON object of ``trace``."""
    rows, _, fns = report_rows(trace)
    names = function_names(trace, fns)
    reach = {fid: f.reach for fid, f in trace.functions.items()}
    start = rows[0].ts_ns if rows else 0
    lifetimes: dict[int, int] = {}
    for r in rows:
        if r.obj:
            lifetimes[r.obj.address] = max(lifetimes.get(r.obj.address, 0), r.obj.lifetime)
    tracks: dict[tuple[int, int], int] = {}
    out: list[dict[str, Any]] = []
    threads: set[tuple[int, int]] = set()
    kind = f"{trace.struct_kind} {trace.struct_name}"

    def track(row) -> Optional[int]:
        if row.obj is None:
            return None
        key = (row.obj.address, row.obj.lifetime)
        pid = tracks.get(key)
        if pid is None:
            pid = tracks[key] = len(tracks) + 1
            label = object_label(key[0], key[1], lifetimes.get(key[0], 1))
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": f"{kind} {label}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                        "args": {"sort_index": pid}})
        if (pid, row.tid) not in threads:
            threads.add((pid, row.tid))
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": row.tid,
                        "args": {"name": f"{row.comm}/{row.tid}" if row.comm else str(row.tid)}})
        return pid

    for row in rows:
        pid = track(row)
        if pid is None:
            continue
        name = names.get(row.function_id, f"function#{row.function_id}")
        args: dict[str, Any] = {"comm": row.comm, "depth": row.depth}
        changes = _changes(row)
        if reach.get(row.slot) == "tracepoint":
            out.append({"ph": "i", "s": "t", "name": name, "pid": pid, "tid": row.tid,
                        "ts": _us(row.ts_ns - start), "args": {**args, "changes": changes}})
        elif row.phase == PHASE_ENTRY:
            if changes:
                by = row.changes[0].function or "code outside traced calls"
                out.append({"ph": "i", "s": "t", "name": f"changed by {by}", "pid": pid,
                            "tid": row.tid, "ts": _us(row.ts_ns - start),
                            "args": {"changes": changes, "seen_at": f"entry of {name}"}})
            if not row.matched:
                out.append({"ph": "i", "s": "t", "name": f"{name} (no exit seen)", "pid": pid,
                            "tid": row.tid, "ts": _us(row.ts_ns - start), "args": args})
        elif row.matched and row.duration_ns is not None:
            if row.retval is not None:
                args["ret"] = row.retval
            out.append({"ph": "X", "name": name, "pid": pid, "tid": row.tid,
                        "ts": _us(row.ts_ns - row.duration_ns - start),
                        "dur": _us(row.duration_ns), "args": {**args, "changes": changes}})
        else:
            out.append({"ph": "i", "s": "t", "name": f"{name} (no entry seen)", "pid": pid,
                        "tid": row.tid, "ts": _us(row.ts_ns - start),
                        "args": {**args, "changes": changes}})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "metadata": {"ctracer": {"struct": trace.struct_name,
                                     "host": trace.meta.get("host", ""),
                                     "trace_id": trace_id(trace),
                                     "incomplete": trace.incomplete}}}


def write_perfetto(trace: Trace, output: str) -> None:
    data = perfetto_events(trace)
    with staged_output(output) as staged:
        with open(staged, "w") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
