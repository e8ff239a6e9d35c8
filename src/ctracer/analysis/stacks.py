"""Call stacks: every call placed under the calls open around it, merged into a tree
whose nodes are stacks (root → … → function), with calls, time and field changes each —
what a flame view draws and what ``export --format folded`` writes.

The events are taken in groups (one object's each, or every event as one group), each
group in time order, with a depth column: `Events.object_depth` (calls on the object
nested in calls on it, per thread) or `Events.depth` (the thread's nesting).  Within a
group and thread, the call at depth ``d`` open when an event at depth ``d + 1`` happens
is the most recent entry at depth ``d``: that is its parent.  An exit ends the most
recent entry at its own depth when the function is the same (else its entry was lost
among these events and the exit stands for a call of its own, its duration as the
pairing measured it); entries of one call that reached objects several ways (one event
per way, no exit in between) are one call.  Everything is found with sorts and binary
searches over whole columns, one `np.unique` per depth level: no Python loop per event.

A node's ``calls`` are the calls (and tracepoint hits) whose stack is exactly that
node's; ``self_ns`` the time of those calls not spent in traced calls they made;
``total_ns`` the node's self time plus its children's totals (so children always fit in
their parent, as a flame graph draws them).  Field changes go to the call that made
them: the call an event belongs to when its function is the one credited, else the
call around it (a traced caller's changes, seen at its callee's entry).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from typing import TYPE_CHECKING

from ctracer.analysis.model import NO_DURATION, Events
from ctracer.event import PHASE_ENTRY, PHASE_TRACEPOINT

if TYPE_CHECKING:
    from ctracer.analysis.model import Analysis


@dataclass
class StackTree:
    """Nodes of one or many groups' stack trees, parents before children (by depth)."""

    group: np.ndarray     # the group (object) of each node
    parent: np.ndarray    # parent node, -1 at a root
    function: np.ndarray  # function id
    depth: np.ndarray     # 0 at a root
    calls: np.ndarray     # calls (tracepoint hits) at exactly this stack
    self_ns: np.ndarray
    total_ns: np.ndarray
    changes: np.ndarray   # field changes made by calls at this stack
    first_row: np.ndarray  # index in the rows given of the first call's event
    hit: np.ndarray       # a tracepoint's node (its calls are hits)

    def __len__(self) -> int:
        return len(self.parent)

    def of_group(self, g: int) -> "StackTree":
        """Group ``g``'s nodes (renumbered, parents still first)."""
        return self.take(np.flatnonzero(self.group == g))

    def groups(self, count: int) -> list["StackTree"]:
        """Every group's nodes, ``count`` groups (one sort, not a scan per group)."""
        order = np.argsort(self.group, kind="stable")  # keeps parents first in a group
        bounds = np.searchsorted(self.group[order], np.arange(count + 1))
        return [self.take(order[bounds[g]:bounds[g + 1]]) for g in range(count)]

    def take(self, nodes: np.ndarray) -> "StackTree":
        """The nodes at ``nodes`` (ascending, closed under parents), renumbered."""
        new = np.full(len(self.parent) + 1, -1, np.int64)
        new[nodes] = np.arange(len(nodes))
        parent = self.parent[nodes]
        return StackTree(self.group[nodes], np.where(parent >= 0, new[parent], -1),
                         *(getattr(self, name)[nodes] for name in
                           ("function", "depth", "calls", "self_ns", "total_ns", "changes",
                            "first_row", "hit")))

    def paths(self, label) -> list[list[str]]:
        """Each node's stack as names, root first (``label(function id)``)."""
        out: list[list[str]] = []
        for p, fid in zip(self.parent.tolist(), self.function.tolist()):
            out.append((out[p] if p >= 0 else []) + [label(fid)])
        return out


def all_objects_tree(a: "Analysis") -> StackTree:
    """The threads' stacks over every event (one group)."""
    ev = a.events
    rows = np.arange(len(ev))
    return stack_tree(ev, rows, np.zeros(len(rows), np.int64), ev.depth, a.changes.event,
                      a.changes.function)


def object_trees(a: "Analysis", chosen: list[int]) -> list[StackTree]:
    """Each chosen object's stacks, its calls nested among its own (one pass for all)."""
    ev = a.events
    positions, offsets = a.objects.event_groups(chosen)
    group = np.repeat(np.arange(len(chosen), dtype=np.int64), np.diff(offsets))
    cpos, coff = a.objects.change_groups(chosen)
    cgroup = np.repeat(np.arange(len(chosen), dtype=np.int64), np.diff(coff))
    # a change's event as an index into ``positions`` (groups' keys sorted, then search)
    width = len(ev) + 1
    keys = group * width + positions
    at = np.searchsorted(keys, cgroup * width + a.changes.event[cpos])
    tree = stack_tree(ev, positions, group, ev.object_depth, at, a.changes.function[cpos])
    tree.first_row = tree.first_row - offsets[tree.group]  # an index in its object's events
    return tree.groups(len(chosen))


def _last_before(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """For each of ``keys``, the index of the last of ``sorted_keys`` below it (-1: none)."""
    return np.searchsorted(sorted_keys, keys, "left") - 1


def stack_tree(events: Events, rows: np.ndarray, group: np.ndarray, depth: np.ndarray,
               change_rows: np.ndarray, change_function: np.ndarray) -> StackTree:
    """The stack trees of the events at ``rows`` (each group's in time order; ``group``
    per row, groups contiguous); ``depth`` is the depth column to nest by (whole);
    ``change_rows`` are the indexes in ``rows`` of the events that showed field changes
    (one per change), ``change_function`` the function each is credited to."""
    m = len(rows)
    if m == 0:
        empty = np.zeros(0, np.int64)
        return StackTree(empty, empty, empty, empty, empty, empty, empty, empty, empty,
                         np.zeros(0, bool))
    fn = events.function[rows].astype(np.int64)
    phase = events.phase[rows]
    d = depth[rows].astype(np.int64)
    group = np.asarray(group, np.int64)
    _, thread = np.unique(group << 32 | events.tid[rows].astype(np.int64), return_inverse=True)
    levels = int(d.max()) + 2
    stack_level = thread.reshape(-1).astype(np.int64) * levels + d  # (group, thread, depth)
    calls = _Calls(fn, phase, stack_level)
    time_ns = _frame_times(events, rows, calls)
    parent = _frame_parents(calls, d)
    nodes = _Nodes(calls, parent, d, fn, group)
    counts = np.bincount(nodes.node_of, minlength=nodes.count).astype(np.int64)
    self_ns, total_ns = _node_times(nodes, parent, time_ns)
    first_row = np.full(nodes.count, m, np.int64)
    np.minimum.at(first_row, nodes.node_of, calls.frames)
    changes = _node_changes(calls, nodes, parent, fn, change_rows, change_function)
    frames = calls.frames[nodes.frame]
    return StackTree(group[frames], nodes.parent, fn[frames], nodes.depth, counts,
                     self_ns, total_ns, changes, first_row, phase[frames] == PHASE_TRACEPOINT)


class _Calls:
    """The calls of a stack tree's rows: each entry's call (its first entry: a call
    reaching objects several ways has one entry a way), the exit ending each call, and
    the frames: one row per call, tracepoint hit or exit whose entry was not seen."""

    def __init__(self, fn: np.ndarray, phase: np.ndarray, stack_level: np.ndarray):
        m = len(fn)
        self.stack_level = stack_level
        self.span = span = m + 1
        entry = np.flatnonzero(phase == PHASE_ENTRY)
        entry = entry[np.argsort(stack_level[entry], kind="stable")]  # by level, then time
        self.entry = entry
        self.entry_keys = entry_keys = stack_level[entry] * span + entry
        exits = np.flatnonzero((phase != PHASE_ENTRY) & (phase != PHASE_TRACEPOINT))
        exit_keys = np.sort(stack_level[exits] * span + exits)

        # entries of one call (one per way it reached objects): same stack level and
        # function as the entry before them there, with no exit at that level in between
        same = np.zeros(len(entry), bool)
        if len(entry) > 1:
            prev, cur = entry[:-1], entry[1:]
            between = (np.searchsorted(exit_keys, entry_keys[1:])
                       - np.searchsorted(exit_keys, entry_keys[:-1]))
            same[1:] = ((stack_level[prev] == stack_level[cur]) & (fn[prev] == fn[cur])
                        & (between == 0))
        starts = np.where(~same, np.arange(len(entry)), 0)
        self.head_of_sorted = entry[np.maximum.accumulate(starts)] if len(entry) else entry
        head = np.full(m, -1, np.int64)  # an entry row -> the row of its call's first entry
        head[entry] = self.head_of_sorted

        # each exit: the call it ends, if its function is the open call's at its depth
        found = _last_before(entry_keys, stack_level[exits] * span + exits)
        ok = found >= 0
        ok[ok] = stack_level[entry[found[ok]]] == stack_level[exits[ok]]
        ends = np.full(len(exits), -1, np.int64)
        ends[ok] = self.head_of_sorted[found[ok]]
        ok[ok] = fn[ends[ok]] == fn[exits[ok]]
        ends[~ok] = -1
        # the first exit that ends a call ends it; later ones are its other ways' exits
        ended = np.flatnonzero(ok)
        calls_ended, first = np.unique(ends[ended], return_index=True)
        self.end_row = np.full(m, -1, np.int64)
        self.end_row[calls_ended] = exits[ended[first]]
        self.lone_exits = exits[~ok]

        self.frames = frames = np.sort(np.concatenate(
            [entry[~same], np.flatnonzero(phase == PHASE_TRACEPOINT), self.lone_exits]))
        self.frame_of = np.full(m, -1, np.int64)  # row -> frame (rows of one call too)
        self.frame_of[frames] = np.arange(len(frames))
        self.frame_of[entry] = self.frame_of[head[entry]]
        self.frame_of[exits[ok]] = self.frame_of[ends[ok]]


def _frame_times(events: Events, rows: np.ndarray, calls: _Calls) -> np.ndarray:
    """Each frame's time: from its entry to its exit, or a lone exit's own duration."""
    frames = calls.frames
    ts = events.ts_ns[rows].astype(np.int64)
    time_ns = np.zeros(len(frames), np.int64)
    has_end = calls.end_row[frames] >= 0
    time_ns[has_end] = ts[calls.end_row[frames[has_end]]] - ts[frames[has_end]]
    lone = np.isin(frames, calls.lone_exits)
    lone_dur = events.duration_ns[rows[frames[lone]]].astype(np.int64)
    time_ns[lone] = np.where(lone_dur != NO_DURATION, lone_dur, 0)
    return np.maximum(time_ns, 0)


def _frame_parents(calls: _Calls, d: np.ndarray) -> np.ndarray:
    """Each frame's parent frame: the call open at one level up when it started (-1)."""
    frames, stack_level, span = calls.frames, calls.stack_level, calls.span
    parent = np.full(len(frames), -1, np.int64)
    up = np.flatnonzero(d[frames] > 0)
    found = _last_before(calls.entry_keys, (stack_level[frames[up]] - 1) * span + frames[up])
    good = found >= 0
    good[good] = (stack_level[calls.entry[found[good]]]
                  == stack_level[frames[up[good]]] - 1)
    parent[up[good]] = calls.frame_of[calls.head_of_sorted[found[good]]]
    return parent


class _Nodes:
    """The frames merged into tree nodes, a level at a time: one node per (parent's
    node or the group, function); ``node_of`` per frame, and per node its ``parent``
    node, one ``frame`` of it and its ``depth``."""

    def __init__(self, calls: _Calls, parent: np.ndarray, d: np.ndarray, fn: np.ndarray,
                 group: np.ndarray):
        frames = calls.frames
        _, fn_rank = np.unique(fn[frames], return_inverse=True)
        fn_rank = fn_rank.reshape(-1).astype(np.int64)
        width = int(fn_rank.max()) + 1
        groups = int(group.max()) + 1
        self.node_of = node_of = np.full(len(frames), -1, np.int64)
        node_parent: list[np.ndarray] = []
        node_frame: list[np.ndarray] = []  # one frame of each node: its function, group
        count = 0
        # frames whose parent was not found hang from the root: their level is 0; a
        # parent found is at one level up, so levels in order place parents first; a
        # frame whose parent hangs from the root sits below it whatever its depth
        level = _levels(parent, np.where(parent >= 0, d[frames], 0))
        order = np.argsort(level, kind="stable")
        bounds = np.searchsorted(level[order], np.arange(int(level.max()) + 2))
        for lv in range(len(bounds) - 1):
            at = order[bounds[lv]:bounds[lv + 1]]
            if not len(at):
                continue
            pnode = np.where(parent[at] >= 0, node_of[np.maximum(parent[at], 0)], -1)
            owner = np.where(pnode >= 0, pnode + groups, group[frames[at]])
            key = owner * width + fn_rank[at]
            uniq, first_at, inverse = np.unique(key, return_index=True, return_inverse=True)
            node_of[at] = inverse.reshape(-1) + count
            node_parent.append(pnode[first_at])
            node_frame.append(at[first_at])
            count += len(uniq)
        self.count = count
        self.parent = np.concatenate(node_parent)
        self.frame = np.concatenate(node_frame)
        self.depth = level[self.frame]


def _node_times(nodes: _Nodes, parent: np.ndarray,
                time_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's self time (its frames' time less their children's) and total time."""
    child_time = np.bincount(parent[parent >= 0], weights=time_ns[parent >= 0],
                             minlength=len(time_ns))
    self_frame = np.maximum(time_ns - child_time.astype(np.int64), 0)
    self_ns = np.bincount(nodes.node_of, weights=self_frame,
                          minlength=nodes.count).astype(np.int64)
    total_ns = self_ns.copy()
    for lv in range(int(nodes.depth.max()), 0, -1):
        at = np.flatnonzero(nodes.depth == lv)
        np.add.at(total_ns, nodes.parent[at], total_ns[at])
    return self_ns, total_ns


def _node_changes(calls: _Calls, nodes: _Nodes, parent: np.ndarray, fn: np.ndarray,
                  change_rows: np.ndarray, change_function: np.ndarray) -> np.ndarray:
    """Changes per node: each change at the frame of its row when that frame's function
    is the one credited, else at that frame's parent when the parent's is."""
    if not len(change_rows):
        return np.zeros(nodes.count, np.int64)
    frames = calls.frames
    crow = np.asarray(change_rows, np.int64)
    credited = np.asarray(change_function, np.int64)
    own = calls.frame_of[crow]
    pick = np.full(len(crow), -1, np.int64)
    has = own >= 0
    mine = has.copy()
    mine[has] = fn[frames[own[has]]] == credited[has]
    pick[mine] = own[mine]
    up_frame = np.where(has & ~mine, parent[np.maximum(own, 0)], -1)
    theirs = up_frame >= 0
    theirs[theirs] = fn[frames[up_frame[theirs]]] == credited[theirs]
    pick[theirs] = up_frame[theirs]
    picked = pick[pick >= 0]
    return np.bincount(nodes.node_of[picked], minlength=nodes.count).astype(np.int64)


def _levels(parent: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Each frame's level in its tree (its parent's + 1, 0 at a root), from the depth
    levels given; a frame whose parent was lost starts again at 0.  Parents start before
    their children, so a pass in frame order sees every parent's level first (runs a
    Python loop only over frames whose level differs from their depth)."""
    out = level.copy()
    has = parent >= 0
    wrong = np.flatnonzero(has & (out[np.maximum(parent, 0)] + 1 != out))
    while len(wrong):
        out[wrong] = out[parent[wrong]] + 1
        wrong = np.flatnonzero(has & (out[np.maximum(parent, 0)] + 1 != out))
    return out


def folded_lines(tree: StackTree, label, weight: str, prefix: str = "") -> list[str]:
    """The tree as folded stacks, one line a node with weight (``a;b;c N``): ``calls``
    (the calls at exactly that stack) or ``time`` (their self time, ns); lines of weight
    0 are left out (a viewer sums a frame's lines below it).  ``prefix`` starts every
    stack (an object's name).  Names are cleaned of ``;`` and line breaks."""
    values = tree.calls if weight == "calls" else tree.self_ns
    names = {fid: _frame_name(label(fid)) for fid in np.unique(tree.function).tolist()}
    out: list[str] = []
    paths: list[str] = []
    head = _frame_name(prefix) + ";" if prefix else ""
    for p, fid, v in zip(tree.parent.tolist(), tree.function.tolist(), values.tolist()):
        path = (paths[p] + ";" if p >= 0 else head) + names[fid]
        paths.append(path)
        if v > 0:
            out.append(f"{path} {v}")
    return out


def _frame_name(name: str) -> str:
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")
