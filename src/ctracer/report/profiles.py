"""Each trace's analysis reduced to a `ctracer.analysis.profile.TraceProfile`, for
``ctracer diff``: what the report's pages show of a trace, as plain data.

Each trace is analysed (`ctracer.analysis.load`) in a forked helper process
(`ctracer.report.helpers`), two at a time on two cores, and only its profile comes
back.  What is read, and how it is named (the report's own words):

* calls and durations: the method statistics (`MethodStats`: calls or tracepoint hits,
  the median and p95 of the timed calls, as the methods page shows them);
* changes: every change by field and by who is credited with it (`Analysis.credited`,
  the exports' ``changed_by``);
* final values: each object's last value of each field, shown as the pages show values
  (`ValueFormatter`); pointers only as NULL or not;
* edges: the all-objects call graph's counts (`ctracer.analysis.callgraph`);
* lifetimes: why each object's lifetime began, the function of its last event (how it
  ended), its number of events.
"""

from __future__ import annotations

import os
import re
import statistics
from collections import Counter
from typing import Callable, Sequence

import numpy as np

from ctracer.analysis.model import function_label
from ctracer.analysis.profile import (NO_CALLER, NO_FUNCTION, FieldInfo, FinalValues,
                                      Timing, TraceProfile)
from ctracer.tracefile import Trace

#: field kinds whose final values also compare by their median
_NUMERIC = ("int", "uint", "float")

#: the paths the helper processes read (inherited through fork, never pickled)
_paths: list[str] = []


def read_profiles(paths: Sequence[str],
                  say: Callable[[str], None] = lambda _m: None) -> list[TraceProfile]:
    """The profile of each trace at ``paths``, in order, each analysed in a helper
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
    does), analyse it and reduce it to a profile."""
    from ctracer import analysis

    trace = Trace(path)
    try:
        _refuse_unfinished(trace)
        return _profile(trace, analysis.load(trace))
    finally:
        trace.close()


#: a top-level member line of the struct's pahole-style layout: "\tTYPE NAME; /* OFF SIZE */"
_MEMBER = re.compile(r"^(?P<indent>\t+)(?P<type>[^\t/{}][^;]*?)\s+\**(?P<name>[A-Za-z_]\w*)"
                     r"(?:\[\d*\])*(?::\d+)?;\s*/\*\s*(?P<offset>\d+)")


def top_level_members(full_layout: str) -> list[tuple[str, tuple[int, str]]]:
    """The top-level members of the layout text a trace keeps (``full_layout``, as
    pahole prints it): (name, (byte offset, C type)) in order, members of an anonymous
    union or struct at the top level included (C names them as the struct's own).
    Named nested structs' members are skipped (recorded ones come from the mini layout)."""
    out: list[tuple[str, tuple[int, str]]] = []
    held: list[tuple[str, tuple[int, str]]] = []   # inside a top-level union/struct
    inside = False
    for line in full_layout.splitlines():
        if re.match(r"^\t(union|struct)\s*\{", line):
            inside, held = True, []
            continue
        if inside and line.startswith("\t}"):
            if re.match(r"^\t\}\s*;", line):   # anonymous: its members are the struct's
                out.extend(held)
            inside = False
            continue
        m = _MEMBER.match(line)
        if not m or m.group("name").startswith("__cacheline_group_"):
            continue
        member = (m.group("name"), (int(m.group("offset")), " ".join(m.group("type").split())))
        depth = len(m.group("indent"))
        if depth == 1 and not inside:
            out.append(member)
        elif depth == 2 and inside:
            held.append(member)
    return out


def _refuse_unfinished(trace: Trace) -> None:
    """A trace whose recorder is still writing it is not diffed (its end is unknown)."""
    from ctracer.errors import TraceFileError
    from ctracer.tracefile import STATE_RECORDING

    if trace.meta.state == STATE_RECORDING:
        raise TraceFileError(f"{trace.path} is unfinished: {trace.incomplete}; diff it once "
                             "the recording has stopped")


def _profile(trace: Trace, a) -> TraceProfile:
    from ctracer.analysis.callgraph import ROOT, call_counts
    from ctracer.report.names import field_stems, function_stems
    from ctracer.report.values import ValueFormatter

    summary = a.summary
    layout = a.layout
    out = TraceProfile(
        path=trace.path, trace_id=trace.trace_id, struct_kind=trace.struct_kind,
        struct_name=trace.struct_name, host=summary.host, kernel=summary.kernel_release,
        command=list(summary.command), events=summary.events, lost=summary.lost_events,
        incomplete=trace.incomplete or "", lifetimes=len(a.objects),
        fields={f.name: FieldInfo(f.name, str(f.source.get("ctype") or f.ctype), f.kind)
                for f in layout.fields})
    for stats in a.methods.values():
        if stats.calls:
            out.calls[stats.name] = stats.calls
        if len(stats.durations):
            out.timings[stats.name] = Timing(len(stats.durations), stats.percentile(50),
                                             stats.percentile(95))
    names = a.function_names
    stems = function_stems({f.id: f.name for f in summary.functions}, a.canonical, a.methods)
    out.function_stems = {function_label(names, fid): stem for fid, stem in stems.items()}
    out.field_stems = field_stems(out.fields)
    for f in summary.functions:
        out.known_functions.setdefault(f.name, f.attached)
        out.route_texts.setdefault(f.name, f.route_text)
    out.members = dict(top_level_members(summary.full_layout))
    for f in layout.fields:
        if "byte_offset" in f.source:
            out.members[f.name] = (int(f.source["byte_offset"]),
                                   str(f.source.get("ctype") or f.ctype))
    guest = trace.meta_json("guest") if "guest" in trace.meta else None
    if isinstance(guest, dict):
        out.recorded_in = (f"a {guest.get('accel', '').upper() or 'QEMU'} guest booting "
                           f"Linux {guest.get('kernel_release', '?')}")
    out.changes = _changes(a, [f.name for f in layout.fields])

    fmt = ValueFormatter(layout, a.meta.tracepoint_args,
                         a.meta.kernel_symbols)
    for j, f in enumerate(layout.fields):
        objects, codes = _final_codes(a, j)
        if not len(codes):
            continue
        kinds, counts = np.unique(codes, return_counts=True)
        values = a.values.decode(j, kinds)
        shown: dict[str, int] = {}
        numbers: list = []
        for value, n in zip(values, counts.tolist()):
            if value is None:
                continue  # never read in a lifetime
            text = (("NULL" if value == 0 else "not NULL") if f.kind == "pointer"
                    else fmt.show(f.name, value))
            shown[text] = shown.get(text, 0) + n
            if f.kind in _NUMERIC:
                numbers.extend([value] * n)
        if shown:
            out.final[f.name] = FinalValues(shown, statistics.median(numbers)
                                            if numbers else None)

    out.started = dict(Counter(a.objects.started_by))
    ends = Counter(int(a.events.function[a.objects.events(o)[-1]])
                   for o in range(len(a.objects)) if len(a.objects.events(o)))
    for fid, n in ends.items():
        key = f"last seen in {names.get(fid, '?')}"
        out.ended[key] = out.ended.get(key, 0) + n
    out.events_per_lifetime = sorted(a.objects.event_counts().tolist())

    ev = a.events
    counts = call_counts(ev, np.arange(len(ev)), ev.thread_caller)
    for (caller, callee), n in zip(counts.edges, counts.edge_calls):
        key = (NO_CALLER if caller == ROOT else function_label(names, caller),
               function_label(names, callee))
        out.edges[key] = out.edges.get(key, 0) + n
    return out


def _changes(a, fields: list[str]) -> dict[tuple[str, str], int]:
    """Changes per (field, who is credited: `Analysis.credited`, else `NO_FUNCTION`)."""
    ch = a.changes
    if not len(ch):
        return {}
    seen = np.where(ch.function >= 0, -1, a.events.function[ch.event]).astype(np.int64)
    keys = np.stack([ch.field.astype(np.int64), ch.function.astype(np.int64), seen], axis=1)
    unique, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
    out: dict[tuple[str, str], int] = {}
    for (j, _, _), k, n in zip(unique.tolist(), first.tolist(), counts.tolist()):
        key = (fields[j], a.credited(k) or NO_FUNCTION)
        out[key] = out.get(key, 0) + n
    return out


def _final_codes(a, j: int) -> tuple[np.ndarray, np.ndarray]:
    """(objects, the code of field ``j``'s last value in each): its last change, else its
    first value read; objects where it was never read are left out."""
    n = len(a.objects)
    codes = np.zeros(n, np.int64)
    known = a.objects.initial_known[:, j].copy() if a.objects.initial_known.shape[1] else \
        np.zeros(n, bool)
    codes[known] = a.objects.initial[known, j]
    mine = np.flatnonzero(a.changes.field == j)
    if len(mine):
        objects = a.events.object[a.changes.event[mine]]
        # the last change of each object (changes are in event order)
        last = len(objects) - 1 - np.unique(objects[::-1], return_index=True)[1]
        codes[objects[last]] = a.changes.new[mine[last]]
        known[objects[last]] = True
    known &= a.objects.first_snapshot >= 0
    picked = np.flatnonzero(known)
    return picked, codes[picked]
