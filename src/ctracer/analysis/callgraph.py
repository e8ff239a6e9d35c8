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

import numpy as np

from ctracer.analysis.model import NO_DURATION, Events, unique_pairs
from ctracer.event import PHASE_ENTRY, PHASE_TRACEPOINT

#: the node standing for "not called by a traced function"
ROOT = -1


@dataclass
class CallCounts:
    functions: list[int]     # function ids, in order of first call
    calls: list[int]         # calls of each
    total_ns: list[int]      # summed durations of each
    edges: list[tuple[int, int]]  # (caller or ROOT, callee), in order of first call
    edge_calls: list[int]
    #: the tracepoints among ``functions``: their counts are hits, not calls
    hits: frozenset[int] = frozenset()


#: events counted at a time (all of a big trace's at once would be n-sized temporaries)
COUNTED_AT_ONCE = 1 << 20


def call_counts(events: Events, rows: np.ndarray, callers: np.ndarray) -> CallCounts:
    """The call counts among the events at ``rows`` (time order); ``callers`` is the
    caller column of those events (``object_caller`` or ``thread_caller``, whole)."""
    calls: dict[int, int] = {}              # in order of first call
    totals: dict[int, int] = {}
    edges: dict[tuple[int, int], int] = {}  # in order of first call
    seen: set[int] = set()                  # functions among the events so far
    hits: set[int] = set()
    for lo in range(0, len(rows), COUNTED_AT_ONCE):
        part = rows[lo:lo + COUNTED_AT_ONCE]
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
    return CallCounts(fn_list, list(calls.values()), [totals.get(f, 0) for f in fn_list],
                      list(edges), list(edges.values()), frozenset(hits))


def _sums(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniques, inverse = np.unique(keys, return_inverse=True)
    return uniques, np.bincount(inverse.reshape(-1), weights=values,
                                minlength=len(uniques)).astype(np.int64) \
        if len(uniques) else np.zeros(0, np.int64)
