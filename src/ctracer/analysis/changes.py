"""Field changes: every object's snapshots compared with its previous one, each
difference attributed, as columns (`ctracer.analysis.model.Changes`).

Attribution: at an exit, to the function exiting; at an entry or a tracepoint hit, to
the traced caller running on that thread, or to code outside any traced call.  The
snapshots are decoded as one numpy table (the layout's dtype) and compared column by
column; values become codes (`FieldValues`), never Python objects.  In a snapshot that
read only the object's head (`FLAG_HEAD_ONLY`), the fields outside the head were not
read: they neither change there nor count as values.  Then `announce_changes` moves a
change a tracepoint announces before its store to that tracepoint's event.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ctracer.analysis.mapped import ArraySpace, is_mapped
from ctracer.analysis.model import (CAUSE_ANNOUNCED, CAUSE_CALLER, CAUSE_DURING, CAUSE_OUTSIDE,
                                    CAUSES, Changes, Events, FieldValues, Objects,
                                    unique_pairs)
from ctracer.analysis.memory import at_once
from ctracer.analysis.snapshots import COMPARED_AT_ONCE, SnapshotStream
from ctracer.event import FLAG_HEAD_ONLY, FLAG_READ_FAILED, PHASE_ENTRY, PHASE_TRACEPOINT, Layout
from ctracer.plan import stores


def find_changes(events: Events, recorded: np.ndarray, snapshots: np.ndarray,
                 snapshot_row: np.ndarray, has_snapshot: np.ndarray, objects: Objects,
                 layout: Layout, values: FieldValues,
                 head_fields: Optional[frozenset[str]],
                 space: Optional[ArraySpace] = None) -> Changes:
    """The changes of every object (``recorded``: each event's address as the probe
    recorded it, 0 where it had none; ``snapshots``: rows of bytes, event ``i``'s at
    ``snapshot_row[i]``); fills the objects' unreadable and head-only counts and first
    values.  The events are compared a slice at a time (`SnapshotStream`) and their
    changes written out as they are found, in event order: nothing the size of every
    snapshot or every change is held on the heap (a 9M-event kernel trace of 7 objects
    has some 22M changes)."""
    obj, flags = events.object, events.flags
    placed = obj >= 0
    failed = (flags & FLAG_READ_FAILED) != 0
    # an object the probe could not read (no object yet is normal)
    events.unreadable = placed & failed & (recorded != 0)
    n_obj = len(objects)
    objects.unreadable = np.bincount(obj[events.unreadable], minlength=n_obj)[:n_obj]
    readable = placed & ~failed & has_snapshot
    del placed, failed
    partial = (flags & FLAG_HEAD_ONLY) != 0
    objects.head_only = np.bincount(obj[readable & partial], minlength=n_obj)[:n_obj]
    space = space or ArraySpace(None)
    nf = len(layout.fields)
    objects.initial = np.zeros((n_obj, nf), np.int64)
    objects.initial_known = np.zeros((n_obj, nf), bool)
    careful = head_fields is not None and bool((readable & partial).any())
    stream = SnapshotStream(layout, snapshots, n_obj, values,
                            (head_fields or frozenset()) if careful else None)
    out = {name: space.growing(dtype) for name, dtype in _CHANGE_TYPES}
    n = len(obj)
    step = at_once(COMPARED_AT_ONCE)
    for lo in range(0, n, step):
        positions = lo + np.flatnonzero(readable[lo:lo + step])
        if not len(positions):
            continue
        owners = obj[positions]
        firsts, found, initial = stream.compare(snapshot_row[positions], owners,
                                                partial[positions] if careful else None)
        if len(firsts):
            first_owner = owners[firsts]
            objects.first_snapshot[first_owner] = positions[firsts]
            for j, (codes, read) in initial.items():
                objects.initial[first_owner, j] = codes
                objects.initial_known[first_owner, j] = read
        if not len(found.at):
            continue
        event = positions[found.at]
        function, cause = attribute(events, event)
        for name, column in (("event", event), ("field", found.field), ("old", found.old),
                             ("new", found.new), ("function", function), ("cause", cause)):
            out[name].append(column)
    del readable, partial
    columns = {name: growing.finish() for name, growing in out.items()}
    if not len(columns["event"]):
        return Changes.empty()
    _final_text_codes(stream.text_codes(), columns, objects, space)
    return Changes(**columns)


#: the columns of `Changes`, as `find_changes` writes them
_CHANGE_TYPES = (("event", np.int64), ("field", np.int32), ("old", np.int64),
                 ("new", np.int64), ("function", np.int32), ("cause", np.int8))


def _final_text_codes(final: dict[int, np.ndarray], columns: dict[str, np.ndarray],
                      objects: Objects, space: ArraySpace) -> None:
    """Char array fields' provisional codes (`SnapshotStream`) replaced by their final
    ones, in the first values and in the changes' old and new values."""
    for j, codes in final.items():
        if len(codes):
            objects.initial[:, j] = np.where(objects.first_snapshot >= 0,
                                             codes[np.minimum(objects.initial[:, j],
                                                              len(codes) - 1)], 0)
    if not final or not any(len(c) for c in final.values()):
        return
    for name in ("old", "new"):
        column = columns[name]
        remapped = space.zeros(len(column), np.int64) if is_mapped(column) else column
        step = at_once(1 << 20)
        for lo in range(0, len(column), step):
            part = column[lo:lo + step].copy()
            fields = columns["field"][lo:lo + step]
            for j, codes in final.items():
                mine = fields == j
                if mine.any():
                    part[mine] = codes[part[mine]]
            remapped[lo:lo + step] = part
        if remapped is not column:
            remapped.setflags(write=False)
            columns[name] = remapped


def attribute(events: Events, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which function made the changes the events at ``at`` show (-1: none traced), and
    how we know (an index into `CAUSES`).  A tracepoint hit is seen like an entry: the
    traced call running on the thread made the change, or code outside any traced call
    did."""
    phase, caller = events.phase[at], events.caller[at]
    seen_on_entry = (phase == PHASE_ENTRY) | (phase == PHASE_TRACEPOINT)
    function = np.where(seen_on_entry, np.where(caller >= 0, caller, -1),
                        events.function[at]).astype(np.int32)
    cause = np.where(seen_on_entry, np.where(caller >= 0, CAUSES.index(CAUSE_CALLER),
                                             CAUSES.index(CAUSE_OUTSIDE)),
                     CAUSES.index(CAUSE_DURING)).astype(np.int8)
    return function, cause


def count_attributed(changes: Changes, events: Events, objects: Objects,
                     methods: dict, stats: Any) -> None:
    """Changes attributed to each function, per object and over all (method tables)."""
    has = changes.function >= 0
    obj = events.object[changes.event[has]]
    fid = changes.function[has]
    if not len(fid):
        return
    found_obj, found_fid, _, counts = unique_pairs(obj, fid)
    for o, f, n in zip(found_obj.tolist(), found_fid.tolist(), counts.tolist()):
        objects.changed_by[o][f] = objects.changed_by[o].get(f, 0) + n
    for f, n in zip(*(a.tolist() for a in np.unique(fid, return_counts=True))):
        if f not in methods:
            methods[f] = stats(f)
        methods[f].changed_fields += n


def announce_changes(changes: Changes, events: Events, objects: Objects,
                     values: FieldValues, names: dict[int, str],
                     meta_rules: Optional[Sequence[dict]], args: Any,
                     space: Optional[ArraySpace] = None) -> Changes:
    """A change a tracepoint announces before its store (`ctracer.plan.stores`,
    ``inet_sock_set_state``: ``skc_state`` ← ``newstate``) shown on the tracepoint's own
    event: per object and in time order, the change ``old → argument`` is added to the
    announcing event (cause announced, no function credited: the tracepoint's caller
    makes the store) and the delayed copy the next snapshot showed is taken back; if
    the value moved on before that snapshot, the snapshot's change then starts from
    the announced value.  Never across lifetimes: an object is one lifetime.
    ``args(i)``: event ``i``'s arguments by name."""
    by_tp = stores.rules_by_tracepoint(meta_rules)
    rule_of = {fid: by_tp[n[3:]] for fid, n in names.items()
               if n.startswith("tp:") and n[3:] in by_tp}
    if not rule_of:
        return changes
    field_of = {r.field: values.index[r.field] for r in rule_of.values()
                if r.field in values.index}
    hits = np.flatnonzero((events.phase == PHASE_TRACEPOINT)
                          & np.isin(events.function, list(rule_of))
                          & ((events.flags & FLAG_READ_FAILED) == 0) & (events.object >= 0)
                          & (objects.first_snapshot[np.maximum(events.object, 0)] >= 0))
    if not len(hits):
        return changes
    watched = np.flatnonzero(np.isin(changes.field, list(field_of.values())))
    removed: list[int] = []
    new_old: dict[int, int] = {}
    added: list[tuple[int, int, int, int]] = []  # event, field, old, new
    # per object, the watched changes and the announcing hits in time order (at one
    # event the snapshot's changes come first)
    items = np.concatenate([changes.event[watched], hits])
    kind = np.r_[np.zeros(len(watched), np.int8), np.ones(len(hits), np.int8)]
    ref = np.r_[watched, hits]
    owner = events.object[items]
    order = np.lexsort((kind, items, owner))
    current: dict[int, Any] = {}
    pending: dict[int, Any] = {}
    last_owner = -1
    for o, k, r in zip(owner[order].tolist(), kind[order].tolist(), ref[order].tolist()):
        if o != last_owner:
            last_owner, pending = o, {}
            current = {j: (values.decode_one(j, int(objects.initial[o, j]))
                           if objects.initial_known[o, j] else None)
                       for j in field_of.values()}
        if k == 0:
            j = int(changes.field[r])
            new = values.decode_one(j, int(changes.new[r]))
            if j in pending:
                want = pending.pop(j)
                if new == want:   # the announced store, seen late: shown already
                    removed.append(r)
                    continue
                new_old[r] = values.encode_value(j, want)  # the value moved on after it
            current[j] = new
            continue
        rule = rule_of[int(events.function[r])]
        j = field_of.get(rule.field)
        if j is None:
            continue
        state = {rule.field: current[j]}
        done = stores.apply(rule, state, args(r))
        if done is None:
            continue
        old, new = done
        current[j] = new
        added.append((r, j, values.encode_value(j, old), values.encode_value(j, new)))
        pending[j] = new
    return _rebuilt(changes, removed, new_old, added, space)


def _rebuilt(changes: Changes, removed: list[int], new_old: dict[int, int],
             added: list[tuple[int, int, int, int]],
             space: Optional[ArraySpace] = None) -> Changes:
    """``changes`` without the rows ``removed``, with the old values ``new_old`` and the
    changes ``added`` (each after the changes its event showed), still in event order:
    written a slice at a time where ``space`` keeps big arrays, never a copy of every
    change on the heap."""
    if not removed and not new_old and not added:
        return changes
    space = space or ArraySpace(None)
    n = len(changes.event)
    gone = np.unique(np.array(removed, np.int64))
    moved = np.array(sorted(new_old), np.int64)
    moved_to = np.array([new_old[k] for k in moved.tolist()], np.int64)
    announced = np.array(added, np.int64).reshape(-1, 4)
    announced = announced[np.argsort(announced[:, 0], kind="stable")]
    total = n - len(gone) + len(announced)
    out = {name: space.zeros(total, dtype) for name, dtype in _CHANGE_TYPES}
    step = at_once(1 << 20)
    for lo in range(0, n, step):
        rows = np.arange(lo, min(n, lo + step))
        kept = np.ones(len(rows), bool)
        kept[np.searchsorted(rows, gone[(gone >= lo) & (gone < lo + step)])] = False
        event = changes.event[lo:lo + step]
        # each kept change moves back by the removed before it and on by the announced
        # ones of earlier events
        at = (rows - np.searchsorted(gone, rows) + np.searchsorted(announced[:, 0], event))[kept]
        old = changes.old[lo:lo + step].copy()
        here = (moved >= lo) & (moved < lo + step)
        old[moved[here] - lo] = moved_to[here]
        for name, part in (("event", event), ("field", changes.field[lo:lo + step]),
                           ("old", old), ("new", changes.new[lo:lo + step]),
                           ("function", changes.function[lo:lo + step]),
                           ("cause", changes.cause[lo:lo + step])):
            out[name][at] = part[kept]
    if len(announced):
        after = np.searchsorted(changes.event, announced[:, 0], "right")
        at = after - np.searchsorted(gone, after) + np.arange(len(announced))
        out["event"][at] = announced[:, 0]
        out["field"][at] = announced[:, 1]
        out["old"][at] = announced[:, 2]
        out["new"][at] = announced[:, 3]
        out["function"][at] = -1
        out["cause"][at] = CAUSES.index(CAUSE_ANNOUNCED)
    for column in out.values():
        if is_mapped(column):  # finished: a forked helper must not write into ours
            column.setflags(write=False)
    return Changes(**out)
