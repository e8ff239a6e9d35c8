"""Today's trace model read into `TraceProfile`s: the one module of the analysis stage
that reads that model.

The model of a trace is still built by the report stage (`ctracer.report.build`,
`build_report(trace) -> ReportData`, dataclasses of `ctracer.report.data`); `diff` and
the rest of this stage see only the profiles made here.  When the model moves into
this stage, this module is the one to change.  Each trace's model is built in a forked
helper process (`ctracer.report.helpers`), two at a time on two cores, and only its
profile comes back: a model is hundreds of megabytes at a million events.

What is read, and how it is named (the report's own words):

* calls and durations: the report's method statistics (`MethodStats`: calls or tracepoint
  hits, the median and p95 of the timed calls, as the methods page shows them);
* changes: every `Change` by field and by the function credited with it
  (`Change.credited`, the exports' ``changed_by``);
* final values: each object's last value of each field (its series), shown as the
  pages show values (`ValueFormatter`); pointers only as NULL or not;
* edges: the all-objects call graph (`ctracer.report.graph.call_graph`);
* lifetimes: why each object's lifetime began (`ObjectTimeline.started_by`), the function
  of its last event (how it ended), its number of events.
"""

from __future__ import annotations

import os
import statistics
from typing import Callable, Sequence

from ctracer.analysis.profile import (NO_CALLER, NO_FUNCTION, FieldInfo, FinalValues,
                                      Timing, TraceProfile)
from ctracer.tracefile import Trace

#: field kinds whose final values also compare by their median
_NUMERIC = ("int", "uint", "float")

#: the paths the helper processes read (inherited through fork, never pickled)
_paths: list[str] = []


def read_profiles(paths: Sequence[str],
                  say: Callable[[str], None] = lambda _m: None) -> list[TraceProfile]:
    """The profile of each trace at ``paths``, in order, each model built in a helper
    process (once per file, however often it is named).  A trace that cannot be read
    raises its own `TraceFileError`."""
    global _paths
    from ctracer.report.helpers import map_in_helpers

    files: dict[str, str] = {}  # each file, by the first name it is given
    for path in paths:
        files.setdefault(os.path.realpath(path), path)
    _paths = list(files.values())
    workers = max(1, min(len(_paths), os.cpu_count() or 1, 2))
    profiles = map_in_helpers(_task, len(_paths), workers, say, doing="reading traces",
                              every=1)
    by_file = dict(zip(files, profiles))
    return [by_file[os.path.realpath(path)] for path in paths]


def _task(index: int) -> TraceProfile:
    return read_profile(_paths[index])


def read_profile(path: str) -> TraceProfile:
    """Open the trace at ``path`` (finishing a killed recording's file, as every reader
    does), build its model and reduce it to a profile."""
    from ctracer.report.build import build_report

    trace = Trace(path)
    try:
        _refuse_unfinished(trace)
        return _profile(trace, build_report(trace))
    finally:
        trace.close()


def _refuse_unfinished(trace: Trace) -> None:
    """A trace whose recorder is still writing it is not diffed (its end is unknown)."""
    from ctracer.errors import TraceFileError
    from ctracer.tracefile import STATE_RECORDING

    if trace.meta.get("state") == STATE_RECORDING:
        raise TraceFileError(f"{trace.path} is unfinished: {trace.incomplete}; diff it once "
                             "the recording has stopped")


def _profile(trace: Trace, data) -> TraceProfile:
    from ctracer.report import graph
    from ctracer.report.names import field_stems, function_stems
    from ctracer.report.values import ValueFormatter

    summary = data.summary
    layout = trace.mini
    out = TraceProfile(
        path=trace.path, trace_id=trace.trace_id, struct_kind=trace.struct_kind,
        struct_name=trace.struct_name, host=summary.host, kernel=summary.kernel_release,
        command=list(summary.command), events=summary.events, lost=summary.lost_events,
        incomplete=trace.incomplete or "", lifetimes=len(data.objects),
        fields={f.name: FieldInfo(f.name, str(f.source.get("ctype") or f.ctype), f.kind)
                for f in layout.fields})
    for stats in data.methods.values():
        if stats.calls:
            out.calls[stats.name] = stats.calls
        if stats.durations:
            out.timings[stats.name] = Timing(len(stats.durations), stats.percentile(50),
                                             stats.percentile(95))
    names = data.function_names
    stems = function_stems({fid: f.name for fid, f in trace.functions.items()},
                           data.canonical, data.methods)
    out.function_stems = {names.get(fid, f"function#{fid}"): stem for fid, stem in stems.items()}
    out.field_stems = field_stems(out.fields)

    fmt = ValueFormatter(layout, trace.meta_json("tracepoint_args") or {},
                         trace.meta_json("kernel_symbols") or {})
    shown: dict[str, dict[str, int]] = {name: {} for name in out.fields}
    numbers: dict[str, list] = {name: [] for name, f in out.fields.items() if f.kind in _NUMERIC}
    changes = out.changes
    for obj in data.objects:
        for c in obj.changes:
            key = (c.field, c.credited or NO_FUNCTION)
            changes[key] = changes.get(key, 0) + 1
        for name, points in obj.series.items():
            if not len(points):
                continue
            last = points.values[-1]
            if last is None:
                continue  # never read in this lifetime
            text = (("NULL" if last == 0 else "not NULL")
                    if out.fields[name].kind == "pointer" else fmt.show(name, last))
            counts = shown[name]
            counts[text] = counts.get(text, 0) + 1
            if name in numbers:
                numbers[name].append(last)
        began = obj.started_by
        out.started[began] = out.started.get(began, 0) + 1
        if obj.rows:
            end = f"last seen in {names.get(obj.rows[-1].function_id, '?')}"
            out.ended[end] = out.ended.get(end, 0) + 1
    out.final = {name: FinalValues(counts, statistics.median(numbers[name])
                                   if numbers.get(name) else None)
                 for name, counts in shown.items() if counts}
    out.events_per_lifetime = sorted(len(obj.rows) for obj in data.objects)

    g = graph.call_graph(data.rows, names, NO_CALLER)
    for a, b, attrs in g.edges(data=True):
        key = (g.nodes[a]["label"], g.nodes[b]["label"])
        out.edges[key] = out.edges.get(key, 0) + attrs["calls"]
    return out
