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
    fn = events.function[rows].astype(np.int64)
    phase = events.phase[rows]
    d = depth[rows].astype(np.int64)
    group = np.asarray(group, np.int64)
    pos = np.arange(m, dtype=np.int64)
    if m == 0:
        empty = np.zeros(0, np.int64)
        return StackTree(empty, empty, empty, empty, empty, empty, empty, empty, empty,
                         np.zeros(0, bool))
    _, thread = np.unique(group << 32 | events.tid[rows].astype(np.int64), return_inverse=True)
    levels = int(d.max()) + 2
    slot = thread.reshape(-1).astype(np.int64) * levels + d  # (group, thread, depth)
    span = m + 1

    entry = np.flatnonzero(phase == PHASE_ENTRY)
    entry = entry[np.argsort(slot[entry], kind="stable")]  # by slot, then time
    entry_keys = slot[entry] * span + entry
    exits = np.flatnonzero((phase != PHASE_ENTRY) & (phase != PHASE_TRACEPOINT))
    exit_keys = np.sort(slot[exits] * span + exits)

    # entries of one call (one per way it reached objects): same slot and function as
    # the entry before them there, with no exit at that slot in between
    same = np.zeros(len(entry), bool)
    if len(entry) > 1:
        prev, cur = entry[:-1], entry[1:]
        between = (np.searchsorted(exit_keys, entry_keys[1:])
                   - np.searchsorted(exit_keys, entry_keys[:-1]))
        same[1:] = (slot[prev] == slot[cur]) & (fn[prev] == fn[cur]) & (between == 0)
    starts = np.where(~same, np.arange(len(entry)), 0)
    head_of_sorted = entry[np.maximum.accumulate(starts)] if len(entry) else entry
    head = np.full(m, -1, np.int64)  # an entry row -> the row of its call's first entry
    head[entry] = head_of_sorted

    # each exit: the call it ends, if its function is the open call's at its depth
    found = _last_before(entry_keys, slot[exits] * span + exits)
    ok = found >= 0
    ok[ok] = slot[entry[found[ok]]] == slot[exits[ok]]
    ends = np.full(len(exits), -1, np.int64)
    ends[ok] = head_of_sorted[found[ok]]
    ok[ok] = fn[ends[ok]] == fn[exits[ok]]
    ends[~ok] = -1
    # the first exit that ends a call ends it; later ones are its other ways' exits
    ended = np.flatnonzero(ok)
    calls_ended, first = np.unique(ends[ended], return_index=True)
    end_row = np.full(m, -1, np.int64)
    end_row[calls_ended] = exits[ended[first]]
    lone_exits = exits[~ok]

    frames = np.sort(np.concatenate([entry[~same], np.flatnonzero(phase == PHASE_TRACEPOINT),
                                     lone_exits]))
    frame_of = np.full(m, -1, np.int64)  # row -> frame index (rows of the same call too)
    frame_of[frames] = np.arange(len(frames))
    frame_of[entry] = frame_of[head[entry]]
    ended_rows = exits[ok]
    frame_of[ended_rows] = frame_of[ends[ok]]

    ts = events.ts_ns[rows].astype(np.int64)
    time_ns = np.zeros(len(frames), np.int64)
    has_end = end_row[frames] >= 0
    time_ns[has_end] = ts[end_row[frames[has_end]]] - ts[frames[has_end]]
    lone = np.isin(frames, lone_exits)
    lone_dur = events.duration_ns[rows[frames[lone]]].astype(np.int64)
    time_ns[lone] = np.where(lone_dur != NO_DURATION, lone_dur, 0)
    time_ns = np.maximum(time_ns, 0)

    # each frame's parent: the call open at one level up when it started
    fd = d[frames]
    parent = np.full(len(frames), -1, np.int64)
    up = np.flatnonzero(fd > 0)
    found = _last_before(entry_keys, (slot[frames[up]] - 1) * span + frames[up])
    good = found >= 0
    good[good] = slot[entry[found[good]]] == slot[frames[up[good]]] - 1
    parent[up[good]] = frame_of[head_of_sorted[found[good]]]

    # nodes, a depth level at a time: (parent's node or the group, function)
    _, fn_rank = np.unique(fn[frames], return_inverse=True)
    fn_rank = fn_rank.reshape(-1).astype(np.int64)
    width = int(fn_rank.max()) + 1
    groups = int(group.max()) + 1
    node_of = np.full(len(frames), -1, np.int64)
    node_parent: list[np.ndarray] = []
    node_frame: list[np.ndarray] = []  # one frame of each node: its function, group
    count = 0
    # frames whose parent was not found hang from the root: their level is 0
    level = np.where(parent >= 0, fd, 0)
    # a parent found is at one level up, so levels in order place parents first; a
    # frame whose parent hangs from the root sits below it whatever its depth
    level = _levels(parent, level)
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
    nparent = np.concatenate(node_parent)
    nframe = np.concatenate(node_frame)
    calls = np.bincount(node_of, minlength=count).astype(np.int64)

    child_time = np.bincount(parent[parent >= 0], weights=time_ns[parent >= 0],
                             minlength=len(frames))
    self_frame = np.maximum(time_ns - child_time.astype(np.int64), 0)
    self_ns = np.bincount(node_of, weights=self_frame, minlength=count).astype(np.int64)
    total_ns = self_ns.copy()
    ndepth = level[nframe]
    for lv in range(int(ndepth.max()), 0, -1):
        at = np.flatnonzero(ndepth == lv)
        np.add.at(total_ns, nparent[at], total_ns[at])

    first_row = np.full(count, m, np.int64)
    np.minimum.at(first_row, node_of, frames)

    changes = np.zeros(count, np.int64)
    if len(change_rows):
        crow = np.asarray(change_rows, np.int64)
        credited = np.asarray(change_function, np.int64)
        own = frame_of[crow]
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
        changes = np.bincount(node_of[picked], minlength=count).astype(np.int64)

    return StackTree(group[frames[nframe]], nparent, fn[frames[nframe]], ndepth, calls,
                     self_ns, total_ns, changes, first_row,
                     phase[frames[nframe]] == PHASE_TRACEPOINT)


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
