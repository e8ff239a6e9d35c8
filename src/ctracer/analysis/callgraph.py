"""Who called whom among a set of events (one object's, or all of them): the counts a
call graph draws.

Nesting is per thread among the events given (`Events.object_caller` for one object's
events: calls made on that object inside calls on that object; `Events.thread_caller`
for all events: the threads' nesting).  An entry or a tracepoint hit is a call from the
function on top of its stack; an exit counts as a call only when its function was not
seen before among the events (its entry was lost).  Nodes and edges come in the order
they were first counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ctracer.analysis.model import NO_DURATION, Events, unique_pairs
from ctracer.analysis.memory import at_once
from ctracer.event import PHASE_ENTRY, PHASE_TRACEPOINT

#: the node standing for "not called by a traced function"
ROOT = -1


@dataclass
class CallGraphCounts:
    """A call graph's counts: functions and caller → callee edges in order of first call,
    with calls and summed time."""

    functions: list[int]     # function ids, in order of first call
    calls: list[int]         # calls of each
    total_ns: list[int]      # summed durations of each
    edges: list[tuple[int, int]]  # (caller or ROOT, callee), in order of first call
    edge_calls: list[int]
    #: the tracepoints among ``functions``: their counts are hits, not calls
    hits: frozenset[int] = frozenset()


#: events counted at a time (all of a big trace's at once would be n-sized temporaries)
COUNTED_AT_ONCE = 1 << 20


def call_counts(events: Events, rows: np.ndarray, callers: np.ndarray) -> CallGraphCounts:
    """The call counts among the events at ``rows`` (time order); ``callers`` is the
    caller column of those events (``object_caller`` or ``thread_caller``, whole)."""
    calls: dict[int, int] = {}              # in order of first call
    totals: dict[int, int] = {}
    edges: dict[tuple[int, int], int] = {}  # in order of first call
    seen: set[int] = set()                  # functions among the events so far
    hits: set[int] = set()
    step = at_once(COUNTED_AT_ONCE)
    for lo in range(0, len(rows), step):
        part = rows[lo:lo + step]
        fn = events.function[part]
        phase = events.phase[part]
        fids, first = np.unique(fn, return_index=True)
        fresh = np.array([f not in seen for f in fids.tolist()], bool)
        seen.update(fids.tolist())
        first = first[fresh] if len(fresh) else first
        first_is_exit = np.zeros(len(part), bool)
        first_is_exit[first] = (phase[first] != PHASE_ENTRY) & (phase[first] != PHASE_TRACEPOINT)
        counted = (phase == PHASE_ENTRY) | (phase == PHASE_TRACEPOINT) | first_is_exit
        at = np.flatnonzero(counted)
        callee, caller = fn[at], callers[part][at].astype(np.int64)
        functions, first_call, n_calls = np.unique(callee, return_index=True,
                                                   return_counts=True)
        for i in np.argsort(first_call, kind="stable").tolist():
            f = int(functions[i])
            calls[f] = calls.get(f, 0) + int(n_calls[i])
        durations = events.duration_ns[part]
        timed = durations != NO_DURATION
        for f, total in zip(*(a.tolist() for a in _sums(fn[timed], durations[timed]))):
            totals[f] = totals.get(f, 0) + total
        found_caller, found_callee, edge_first, edge_calls = unique_pairs(caller, callee)
        for i in np.argsort(edge_first, kind="stable").tolist():
            edge = (int(found_caller[i]), int(found_callee[i]))
            edges[edge] = edges.get(edge, 0) + int(edge_calls[i])
        hits.update(np.unique(fn[phase == PHASE_TRACEPOINT]).tolist())
    fn_list = list(calls)
    return CallGraphCounts(fn_list, list(calls.values()), [totals.get(f, 0) for f in fn_list],
                      list(edges), list(edges.values()), frozenset(hits))


def add_folded(counts: CallGraphCounts, functions: np.ndarray, callers: np.ndarray,
               calls: np.ndarray, total_ns: np.ndarray) -> CallGraphCounts:
    """``counts`` with folded calls added (`ctracer.analysis.folds`): ``calls[k]`` calls
    of ``functions[k]`` made from ``callers[k]`` (ROOT: none), ``total_ns[k]`` long in
    all; new nodes and edges come after the others."""
    by_fn = dict(zip(counts.functions, zip(counts.calls, counts.total_ns)))
    edges = dict(zip(counts.edges, counts.edge_calls))
    for f, c, n, t in zip(functions.tolist(), callers.tolist(), calls.tolist(),
                          total_ns.tolist()):
        had, took = by_fn.get(f, (0, 0))
        by_fn[f] = (had + n, took + t)
        if c != ROOT and c not in by_fn:
            by_fn[c] = (0, 0)  # a caller none of the given events shows
        edges[(c, f)] = edges.get((c, f), 0) + n
    fns = list(by_fn)
    return CallGraphCounts(fns, [by_fn[f][0] for f in fns], [by_fn[f][1] for f in fns],
                           list(edges), list(edges.values()), counts.hits)


def with_folded(data: Any, counts: CallGraphCounts, i: Optional[int] = None) -> CallGraphCounts:
    """Call-graph counts of object ``i`` of the analysis ``data`` (of all objects when
    None) with its folded calls (``--calls changes``) added: counts on the edge from the
    traced call they were made in (for one object: from its call on that object, else
    from the root)."""
    rows = data.folded_rows(i)
    if not len(rows):
        return counts
    f = data.folded
    callers = f.caller[rows] if i is None else np.where(f.same_object[rows],
                                                        f.caller[rows], -1)
    return add_folded(counts, f.function[rows], callers, f.calls[rows], f.total_ns[rows])


def _sums(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniques, inverse = np.unique(keys, return_inverse=True)
    return uniques, np.bincount(inverse.reshape(-1), weights=values,
                                minlength=len(uniques)).astype(np.int64) \
        if len(uniques) else np.zeros(0, np.int64)


def grouped_call_counts(events: Events, positions: np.ndarray, offsets: np.ndarray,
                        callers: np.ndarray) -> list[CallGraphCounts]:
    """`call_counts` of many groups of events at once (one object's each): group ``g``'s
    events are ``positions[offsets[g]:offsets[g + 1]]``, in time order.  Groups are
    counted together a slice of about `COUNTED_AT_ONCE` events at a time: per group,
    six `np.unique` calls on a few events cost more than counting them (2,700 objects
    of a million events: 0.84 s one at a time)."""
    out: list[CallGraphCounts] = []
    n = len(offsets) - 1
    widest = int(max(events.function.max(initial=0), callers.max(initial=0))) + 2
    apart = len(events.function) and int(events.function.min()) < 0  # keys need functions >= 0
    g = 0
    while g < n:
        end = int(np.searchsorted(offsets, offsets[g] + COUNTED_AT_ONCE, "right")) - 1
        end = max(end, g + 1)
        if apart or (end - g) * widest * widest >= 1 << 62:
            end = g + 1  # keys would not fit: this group alone
        rows = positions[offsets[g]:offsets[end]]
        if end - g == 1:
            out.append(call_counts(events, rows, callers))
        else:
            out.extend(_counted_together(events, rows, offsets[g:end + 1] - offsets[g],
                                         callers, widest))
        g = end
    return out


def _counted_together(events: Events, rows: np.ndarray, bounds: np.ndarray,
                      callers: np.ndarray, widest: int) -> list[CallGraphCounts]:
    """`call_counts` of each group of ``rows`` (group ``k``: ``bounds[k]:bounds[k+1]``),
    on keys that put the group first: (group, function) and (group, caller, callee)."""
    groups = len(bounds) - 1
    group = np.repeat(np.arange(groups, dtype=np.int64), np.diff(bounds))
    fn = events.function[rows].astype(np.int64)
    phase = events.phase[rows]
    own = group * widest + fn   # (group, function), functions >= 0
    _, first = np.unique(own, return_index=True)
    first_is_exit = np.zeros(len(rows), bool)
    first_is_exit[first] = (phase[first] != PHASE_ENTRY) & (phase[first] != PHASE_TRACEPOINT)
    counted = (phase == PHASE_ENTRY) | (phase == PHASE_TRACEPOINT) | first_is_exit
    at = np.flatnonzero(counted)
    called, first_call, n_calls = np.unique(own[at], return_index=True, return_counts=True)
    order = np.argsort(first_call, kind="stable")  # groups are contiguous: group, then time
    called, n_calls = called[order], n_calls[order]
    call_group = called // widest
    call_bounds = np.searchsorted(call_group, np.arange(groups + 1))

    durations = events.duration_ns[rows]
    timed = durations != NO_DURATION
    timed_keys, timed_total = _sums(own[timed], durations[timed])
    total_of = dict(zip(timed_keys.tolist(), timed_total.tolist()))

    caller = callers[rows][at].astype(np.int64) + 1  # ROOT (-1) is 0
    edge_key = (group[at] * widest + caller) * widest + fn[at] + 1
    edges, edge_first, edge_calls = np.unique(edge_key, return_index=True, return_counts=True)
    order = np.argsort(edge_first, kind="stable")
    edges, edge_calls = edges[order], edge_calls[order]
    edge_group = edges // (widest * widest)
    edge_bounds = np.searchsorted(edge_group, np.arange(groups + 1))
    edge_caller = (edges // widest) % widest - 1
    edge_callee = edges % widest - 1

    hit_keys = np.unique(own[phase == PHASE_TRACEPOINT])
    hit_bounds = np.searchsorted(hit_keys // widest, np.arange(groups + 1))

    called_fn, called_keys = (called % widest).tolist(), called.tolist()
    n_calls_list = n_calls.tolist()
    callers_list, callees_list = edge_caller.tolist(), edge_callee.tolist()
    edge_calls_list = edge_calls.tolist()
    hit_fn = (hit_keys % widest).tolist()
    cb, eb, hb = call_bounds.tolist(), edge_bounds.tolist(), hit_bounds.tolist()
    out = []
    for k in range(groups):
        lo, hi = cb[k], cb[k + 1]
        elo, ehi = eb[k], eb[k + 1]
        out.append(CallGraphCounts(
            called_fn[lo:hi], n_calls_list[lo:hi],
            [total_of.get(key, 0) for key in called_keys[lo:hi]],
            list(zip(callers_list[elo:ehi], callees_list[elo:ehi])),
            edge_calls_list[elo:ehi], frozenset(hit_fn[hb[k]:hb[k + 1]])))
    return out
