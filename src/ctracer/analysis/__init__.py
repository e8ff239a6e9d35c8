"""The analysis stage: one model of a trace, for the report and the exports.

`load` reads a trace file once and answers what its readers ask: the objects and their
lifetimes, every event on its object and on its thread's calls (depth, caller,
duration), the field changes with the function that made them, each field's series,
call counts and durations, and the call graphs' counts (`callgraph`).  `report/` (HTML,
plots) and `export/` (JSON Lines, CSV, Perfetto, Parquet, SQL) read this and nothing
else, so a report and an export never disagree.

Everything is columns (`model.Events`, `model.Changes`: numpy arrays), never a Python
object per event or per change.  The modules, in the order `load` runs them:

* `functions` — the functions table as the passes read it (names, creators, rules);
* `passes` — events read in time order, calls paired, repeats dropped, objects placed;
* `lifetimes` — where each reused address starts a new object, and why;
* `snapshots`, `changes` — every object's snapshots compared with its previous one;
  a change a tracepoint announces moved to its event;
* `summary` — what the trace says about itself;
* `callgraph` — who called whom, per object and over all of them;
* `model` — the result: `Analysis` and its columns;
* `memory` — the allocator's settings while the passes run, and what they freed given
  back to the system.

Beside them, `diff` compares two traces' `profile.TraceProfile` (what ``ctracer diff``
reads of each trace, made by `ctracer.report.profiles`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ctracer.analysis.model import Analysis, EventCounts

if TYPE_CHECKING:
    from ctracer.analysis.functions import FunctionTable
    from ctracer.analysis.mapped import ArraySpace

__all__ = ["load", "open_trace", "Analysis"]


def open_trace(path: str, progress: Optional[Callable[[int], None]] = None) -> Any:
    """The trace file at ``path`` opened for `load` (`ctracer.tracefile.Trace`: a file
    that is not a trace, damaged or newer is refused in one line), for readers that
    need its struct's name before the analysis runs."""
    from ctracer.tracefile import Trace

    return Trace(path, progress)


def load(trace: Union[str, Any], progress: Optional[Callable[[str], None]] = None, *,
         snapshots: bool = False, spill_dir: Optional[str] = None) -> Analysis:
    """Analyse the trace file at ``trace`` (a path, or an open `ctracer.tracefile.Trace`);
    with ``snapshots`` the result keeps every event's snapshot bytes (`Analysis.snapshots`,
    what the exports' field columns are decoded from).  A big trace's big arrays live in
    unnamed files mapped from ``spill_dir`` (default: the temporary directory; see
    `ctracer.analysis.mapped`)."""
    from ctracer.tracefile import Trace

    if isinstance(trace, str):
        opened = Trace(trace)
        try:
            return _analyse(opened, progress or (lambda _m: None), snapshots, spill_dir)
        finally:
            opened.close()
    return _analyse(trace, progress or (lambda _m: None), snapshots, spill_dir)


def _analyse(trace: Any, say: Callable[[str], None], keep_snapshots: bool,
             spill_dir: Optional[str]) -> Analysis:
    from ctracer.analysis.functions import function_table
    from ctracer.analysis.mapped import ArraySpace
    from ctracer.analysis.memory import passes_memory
    from ctracer.analysis.passes import ROW_BYTES

    announced = trace.meta.announced_stores
    fns = function_table(trace.functions, trace.meta.lifetime_rules, announced)
    space = ArraySpace.for_trace(trace.event_count(), ROW_BYTES + trace.mini.size, spill_dir)
    with passes_memory(mapped=space.directory is not None), space.writing_back():
        return _run_passes(trace, say, keep_snapshots, fns, announced, space)


def _run_passes(trace: Any, say: Callable[[str], None], keep_snapshots: bool,
                fns: "FunctionTable", announced: Any, space: "ArraySpace") -> Analysis:
    import numpy as np

    from ctracer.analysis import changes as changing
    from ctracer.analysis import passes
    from ctracer.analysis.functions import lifetime_rule
    from ctracer.analysis.mapped import is_mapped
    from ctracer.analysis.model import Events, FieldValues, MethodStats, Objects
    from ctracer.analysis.summary import trace_summary

    say("reading events")
    read = passes.read_events(trace, fns, space)
    c = read.columns
    say(f"read {len(read)} events")
    arguments = _Arguments(c["args_texts"], c["args"])
    identities, identity_rule = passes.head_identities(trace, read)
    pairing = passes.pair_calls(read, fns, say, identities, identity_rule, arguments.of_read,
                                space)
    calls = passes.count_calls(read, pairing, fns)
    placed = passes.assign_objects(pairing, calls.duplicate, space)
    keep = placed.keep
    every = len(keep) == len(read)

    def kept(column: Any) -> Any:
        return column if every else space.take(column, keep)  # no copy when none dropped

    events = Events(
        seq=kept(c["seq"]), ts_ns=kept(c["ts_ns"]), cpu=kept(c["cpu"]), pid=kept(c["pid"]),
        tid=kept(c["tid"]), comm=kept(c["comm"]), function_row=kept(read.function_row),
        function=kept(read.function), phase=kept(c["phase"]), flags=kept(c["flags"]),
        address=kept(pairing.address), retval=kept(c["retval"]),
        has_retval=kept(c["has_retval"]), args=kept(c["args"]),
        depth=kept(pairing.depth), caller=kept(pairing.caller),
        duration_ns=kept(pairing.duration_ns), matched=kept(pairing.matched),
        object=placed.object, object_depth=np.zeros(len(keep), np.int32),
        unreadable=np.zeros(len(keep), bool), object_caller=None, thread_caller=None,
        comms=c["comms"], args_texts=c["args_texts"])
    events.object_depth, events.object_caller, events.thread_caller = passes.nesting(
        events.object, events.tid, events.function, events.phase, space)
    objects = Objects(placed.keys, placed.labels, placed.dirnames, placed.started_by,
                      events.object, np.zeros(0, np.int64))
    say(f"{len(events)} events, {len(objects)} objects")
    values = FieldValues(trace.mini)
    say("finding field changes")
    found = changing.find_changes(events, kept(c["object"]), c["snapshots"], keep,
                                  kept(c["has_snapshot"]), objects, trace.mini, values,
                                  trace.head_fields, space)
    held = (kept(c["snapshots"]), kept(c["has_snapshot"])) if keep_snapshots else (None, None)
    del c["snapshots"], c["depth"]
    changing.count_attributed(found, events, objects, calls.methods,
                              lambda f: MethodStats(f, fns.name(f)))
    arguments.events = events
    found = changing.announce_changes(found, events, objects, values, dict(fns.names),
                                      announced, arguments.of_event, space)
    objects.regroup_changes(events.object, found.event, space)
    folded = _folded(trace, events, fns, calls.methods)
    summary = trace_summary(trace, len(read))
    recorded, shown = len(read), len(events)
    incomplete = getattr(trace, "incomplete", None)
    lifetime_rule_text = lifetime_rule(fns) + (
        f"; {pairing.identity_rule}" if pairing.identity_rule else "")
    null_events, unmatched = placed.null_events, pairing.unmatched_exits
    del read, c, placed, pairing
    for name in events.names:  # helpers forked later share these pages: none may write
        column = getattr(events, name)
        if is_mapped(column):
            column.setflags(write=False)
    for columns in (events, found, objects):  # a big trace's finished arrays into files
        columns.settle(space)
    for stats in calls.methods.values():
        stats.durations, stats.call_times = (space.settle(stats.durations),
                                             space.settle(stats.call_times))
    counts = EventCounts(recorded=recorded, shown=shown, repeated=recorded - shown,
                    lost=summary.lost_events, unreadable=int(events.unreadable.sum()),
                    claimed=(summary.events_claimed
                             if summary.events_claimed not in (None, recorded) else None),
                    incomplete=incomplete or "")
    return Analysis(
        summary=summary, counts=counts, layout=trace.mini, meta=trace.meta,
        events=events, objects=objects, changes=found, values=values,
        methods=calls.methods, function_names=fns.names, canonical=fns.canon,
        route_kind={fid: f.route_kind for fid, f in trace.functions.items()},
        start_ns=int(events.ts_ns[0]) if len(events) else 0,
        lifetime_rule=lifetime_rule_text,
        null_object_events=null_events, unmatched_exits=unmatched,
        unfinished_calls=calls.unfinished, incomplete=incomplete,
        head_fields=trace.head_fields, trace_path=trace.path,
        snapshots=held[0], has_snapshot=held[1], space=space,
        calls_mode=trace.meta.text("calls") or "all", folded=folded)


def _folded(trace: Any, events: Any, fns: "FunctionTable", methods: dict) -> Any:
    """The trace's folded calls (`ctracer.analysis.folds`) on their objects, added to
    the per-function counts ``methods``."""
    import numpy as np

    from ctracer.analysis import folds
    from ctracer.analysis.model import MethodStats
    from ctracer.tracefile import folds as folds_table

    db = getattr(trace, "db", None)
    if db is None:
        return folds.Folded()
    found = folds.place(folds_table.read(db), events.address, events.ts_ns, events.object,
                        fns.canon)
    for fid, (n, total, longest) in found.per_function(np.arange(len(found))).items():
        if fid not in methods:
            methods[fid] = MethodStats(fid, fns.name(fid))
        methods[fid].add_folded(n, total, longest)
    return found


class _Arguments:
    """Tracepoint arguments by event, parsed once per distinct text."""

    def __init__(self, texts: list[str], index: Any):
        self.texts, self.read_index = texts, index
        self.parsed: dict[int, Optional[dict]] = {}
        self.events: Any = None

    def parse(self, k: int) -> Optional[dict]:
        if k < 0:
            return None
        found = self.parsed.get(k, False)
        if found is False:
            found = self.parsed[k] = parse_arguments(self.texts[k])
        return found

    def of_read(self, i: int) -> Optional[dict]:
        return self.parse(int(self.read_index[i]))

    def of_event(self, i: int) -> Optional[dict]:
        return self.parse(int(self.events.args[i]))


def parse_arguments(text: Optional[str]) -> Optional[dict[str, Any]]:
    """A tracepoint hit's arguments text as a dict by name (None when absent or not a
    JSON object)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
