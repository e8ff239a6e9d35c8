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

from ctracer.analysis.model import NO_DURATION, Events
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


def call_counts(events: Events, rows: np.ndarray, callers: np.ndarray) -> CallCounts:
    """The call counts among the events at ``rows`` (time order); ``callers`` is the
    caller column of those events (``object_caller`` or ``thread_caller``, whole)."""
    fn = events.function[rows]
    phase = events.phase[rows]
    fids, first = np.unique(fn, return_index=True)
    first_is_exit = np.zeros(len(rows), bool)
    first_is_exit[first] = (phase[first] != PHASE_ENTRY) & (phase[first] != PHASE_TRACEPOINT)
    counted = (phase == PHASE_ENTRY) | (phase == PHASE_TRACEPOINT) | first_is_exit
    at = np.flatnonzero(counted)
    callee, caller = fn[at], callers[rows][at].astype(np.int64)
    functions, first_call, calls = np.unique(callee, return_index=True, return_counts=True)
    in_order = np.argsort(first_call, kind="stable")
    timed = events.duration_ns[rows] != NO_DURATION
    totals = dict(zip(*(a.tolist() for a in _sums(fn[timed], events.duration_ns[rows][timed]))))
    pairs = np.stack([caller, callee.astype(np.int64)], axis=1) if len(at) else \
        np.zeros((0, 2), np.int64)
    edges, edge_first, edge_calls = np.unique(pairs, axis=0, return_index=True,
                                              return_counts=True)
    edge_order = np.argsort(edge_first, kind="stable")
    fn_list = functions[in_order].tolist()
    return CallCounts(fn_list, calls[in_order].tolist(),
                      [totals.get(f, 0) for f in fn_list],
                      [tuple(e) for e in edges[edge_order].tolist()],
                      edge_calls[edge_order].tolist(),
                      frozenset(np.unique(fn[phase == PHASE_TRACEPOINT]).tolist()))


def _sums(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniques, inverse = np.unique(keys, return_inverse=True)
    return uniques, np.bincount(inverse.reshape(-1), weights=values,
                                minlength=len(uniques)).astype(np.int64) \
        if len(uniques) else np.zeros(0, np.int64)
