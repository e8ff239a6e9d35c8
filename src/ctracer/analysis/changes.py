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
from ctracer.analysis.snapshots import SnapshotTable
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
    values."""
    obj, flags = events.object, events.flags
    placed = obj >= 0
    failed = (flags & FLAG_READ_FAILED) != 0
    # an object the probe could not read (no object yet is normal)
    events.unreadable = placed & failed & (recorded != 0)
    n_obj = len(objects)
    objects.unreadable = np.bincount(obj[events.unreadable], minlength=n_obj)[:n_obj]
    readable = placed & ~failed & has_snapshot
    partial = (flags & FLAG_HEAD_ONLY) != 0
    objects.head_only = np.bincount(obj[readable & partial], minlength=n_obj)[:n_obj]
    space = space or ArraySpace(None)
    positions = space.copy(np.flatnonzero(readable))
    del readable
    owners = space.take(obj, positions)
    nf = len(layout.fields)
    objects.initial = np.zeros((n_obj, nf), np.int64)
    objects.initial_known = np.zeros((n_obj, nf), bool)
    if not len(positions):
        return Changes.empty()
    head_partial = partial[positions] if head_fields is not None and partial[positions].any() \
        else None
    table = SnapshotTable(layout, snapshots, owners, space.take(snapshot_row, positions),
                          head_partial, head_fields or frozenset(), space)
    firsts = np.flatnonzero(table.first)
    objects.first_snapshot[owners[firsts]] = positions[firsts]
    # the changes of every field, each array made once where the space keeps big ones
    # (a 9M-event kernel trace has some 22M changes: lists of parts concatenated and
    # then reordered held three copies of them on the heap at once)
    counts = [len(at) for at in table.changed_at]
    total = sum(counts)
    at_all = space.zeros(total, np.int64)
    field_all = space.zeros(total, np.int32)
    old_all = space.zeros(total, np.int64)
    new_all = space.zeros(total, np.int64)
    lo = 0
    for j in range(nf):
        objects.initial[owners[firsts], j] = values.encode(j, table.column(j, firsts))
        objects.initial_known[owners[firsts], j] = table.value_known(j, firsts)
        at = table.changed_at[j]
        if len(at):
            hi = lo + len(at)
            at_all[lo:hi] = at
            field_all[lo:hi] = j
            old_all[lo:hi] = values.encode(j, table.column(j, table.prev[at]))
            new_all[lo:hi] = values.encode(j, table.column(j, at))
            lo = hi
    table.release()
    if not total:
        return Changes.empty()
    # event, then field: fields were laid down in order, so a stable sort by event
    order = np.argsort(at_all, kind="stable")
    event = space.take(positions, space.take(at_all, order))
    del at_all
    function, cause = attribute(events, event)
    columns = [event, space.take(field_all, order), space.take(old_all, order),
               space.take(new_all, order)]
    for column in columns:
        if is_mapped(column):  # finished: a forked helper must not write into ours
            column.setflags(write=False)
    return Changes(event=columns[0], field=columns[1], old=columns[2], new=columns[3],
                   function=function, cause=cause)


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
                     meta_rules: Optional[Sequence[dict]], args: Any) -> Changes:
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
    return _rebuilt(changes, removed, new_old, added)


def _rebuilt(changes: Changes, removed: list[int], new_old: dict[int, int],
             added: list[tuple[int, int, int, int]]) -> Changes:
    if not removed and not new_old and not added:
        return changes
    old = changes.old.copy()
    for k, v in new_old.items():
        old[k] = v
    keep = np.ones(len(changes.event), bool)
    keep[removed] = False
    announced = np.array(added, np.int64).reshape(-1, 4)
    n = len(announced)
    event = np.r_[changes.event[keep], announced[:, 0]]
    field = np.r_[changes.field[keep], announced[:, 1].astype(np.int32)]
    rank = np.r_[changes.field[keep].astype(np.int64), np.full(n, 1 << 30)]
    order = np.lexsort((rank, event))
    return Changes(event=event[order], field=field[order].astype(np.int32),
                   old=np.r_[old[keep], announced[:, 2]][order],
                   new=np.r_[changes.new[keep], announced[:, 3]][order],
                   function=np.r_[changes.function[keep], np.full(n, -1, np.int32)][order]
                   .astype(np.int32),
                   cause=np.r_[changes.cause[keep],
                               np.full(n, CAUSES.index(CAUSE_ANNOUNCED), np.int8)][order]
                   .astype(np.int8))
