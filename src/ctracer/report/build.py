"""Fills the report model (`ctracer.report.model`) from a trace file.

Two passes, both linear in the number of events:

1. **Calls and lifetimes.**  Events are read once and put in time order.  Per thread a
   stack pairs each exit with its entry (a lost event closes the frames above it),
   giving depths and durations; the events of one call that reaches objects several
   ways (one functions-table row, or "slot", per way) are one call.  Objects known only
   at exit (what a creation function returns, a holder filled in during the call) are
   resolved there.  A creation function (``reach = returns``) returning an address,
   and failing any such function an allocator-looking call after a free-looking one,
   marks where a new lifetime of a reused address starts.
2. **Changes.**  With lifetimes known, every object's snapshots are compared with its
   previous one (raw bytes first, so unchanged snapshots are never decoded) and each
   difference is attributed: at an exit, to the function exiting; at an entry, to the
   traced caller running on that thread, or to code outside any traced call.
"""

from __future__ import annotations

import bisect
import datetime
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ctracer.event import FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY
from ctracer.report.model import (CAUSE_CALLER, CAUSE_DURING, CAUSE_OUTSIDE, Change,
                                  MethodStats, ObjectKey, ObjectTimeline, ReportData, Row,
                                  TraceSummary)
from ctracer.report.names import object_dir, object_label
from ctracer.tracefile import Event, FunctionRow, Trace

_U64_MASK = (1 << 64) - 1
_ERR_PTR_LOWEST = (1 << 64) - 4095  # the kernel's ERR_PTR(-MAX_ERRNO)

#: name heuristics, used only where the functions table gives no structural signal
_FREE_LIKE = re.compile(r"(^|_)(free|destroy|destruct|dealloc|kfree)(_|$)")
_ALLOC_LIKE = re.compile(r"(^|_)(alloc|new|create|clone)(_|$)")
#: creation-typed functions that usually return an object that already exists
_LOOKUP_LIKE = re.compile(r"(^|_)(lookup|find|get|peek|search|next|prev|first|last)(_|$)")


@dataclass(slots=True)
class _Frame:
    """One call on a thread.  A function reaching the object in several ways (a holder
    and a direct parameter, two parameters, a parameter and its return value) has one
    functions-table row per way, and each row ("slot") emits its own entry and exit
    event, one after the other: they all belong to this one call."""

    function_id: int
    ts_ns: int
    index: int        # first entry row (position in the time-ordered rows)
    depth: int
    caller: int
    entries: dict[int, int] = field(default_factory=dict)  # slot -> entry row index
    exits: dict[int, int] = field(default_factory=dict)    # slot -> exit row index


class _Compact:
    """An event as the report keeps it while building: the trace's `Event` minus what it
    no longer needs, in a fraction of the memory (a big trace holds millions)."""

    __slots__ = ("seq", "ts_ns", "cpu", "pid", "tid", "comm", "function_id", "phase",
                 "object", "retval", "depth", "flags", "snapshot")

    def __init__(self, e: Event):
        self.seq, self.ts_ns, self.cpu, self.pid, self.tid = e.seq, e.ts_ns, e.cpu, e.pid, e.tid
        self.comm = sys.intern(e.comm)
        self.function_id, self.phase, self.object, self.retval = (
            e.function_id, e.phase, e.object, e.retval)
        self.depth, self.flags, self.snapshot = e.depth, e.flags, e.snapshot

    def event(self) -> Event:
        return Event(self.seq, self.ts_ns, self.cpu, self.pid, self.tid, self.comm,
                     self.function_id, self.phase, self.object, self.retval, self.depth,
                     self.flags, self.snapshot)


class _Thread:
    __slots__ = ("stack", "last_entry", "last_exit")

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.last_entry: Optional[_Frame] = None  # the frame the thread's last event opened
        self.last_exit: Optional[_Frame] = None   # the frame the thread's last event closed


class _Lifetimes:
    """Where each address's lifetimes start (as indexes into the time-ordered rows) and why."""

    def __init__(self) -> None:
        self.first_seen: dict[int, int] = {}
        self.first_reason: dict[int, str] = {}
        self.starts: dict[int, list[tuple[int, str]]] = {}
        self._freed_by: dict[int, str] = {}
        self._positions: dict[int, list[int]] = {}
        self.structural = 0
        self.heuristic = 0

    def seen(self, address: int, at: int, function: str) -> None:
        if address not in self.first_seen:
            self.first_seen[address] = at
            self.first_reason[address] = f"first seen in {function}"

    def returned(self, address: int, at: int, function: str) -> None:
        """A creation function entered at row ``at`` returned ``address``."""
        reason = f"returned by {function}"
        self._freed_by.pop(address, None)
        starts = self.starts.setdefault(address, [])
        if starts and starts[-1][0] >= at:
            # a lifetime begun inside this call (a nested allocator): this call owns it
            starts[-1] = (at, reason)
        elif self.first_seen.get(address, at) >= at and not starts:
            self.first_reason[address] = reason
        else:
            starts.append((at, reason))
            self.structural += 1

    def freed(self, address: int, function: str) -> None:
        self._freed_by[address] = function

    def maybe_reallocated(self, address: int, at: int, function: str) -> None:
        freed_by = self._freed_by.pop(address, None)
        if freed_by is not None:
            self.starts.setdefault(address, []).append(
                (at, f"{function} after {freed_by} (by name)"))
            self.heuristic += 1

    def lifetime_of(self, address: int, at: int) -> int:
        """Which lifetime of ``address`` the row at ``at`` belongs to (call once recording
        is over: start positions are cached)."""
        starts = self.starts.get(address)
        if not starts:
            return 1
        positions = self._positions.get(address)
        if positions is None:
            positions = self._positions[address] = [s for s, _ in starts]
        return 1 + bisect.bisect_right(positions, at)

    def reason(self, key: ObjectKey) -> str:
        if key.lifetime == 1:
            return self.first_reason.get(key.address, "first seen")
        return self.starts[key.address][key.lifetime - 2][1]


def _summary(trace: Trace, events: int) -> TraceSummary:
    def text(key: str) -> str:
        v = trace.meta.get(key)
        if v is None:
            return ""
        try:
            decoded = json.loads(v)
        except ValueError:
            return v
        return decoded if isinstance(decoded, str) else v

    def words(key: str) -> list[str]:
        v = trace.meta.get(key)
        if v is None:
            return []
        try:
            decoded = json.loads(v)
        except ValueError:
            return [v]
        if isinstance(decoded, list):
            return [str(x) for x in decoded]
        return [] if decoded is None else [str(decoded)]

    def when(*keys: str) -> str:
        key = next((k for k in keys if trace.meta.get(k) is not None), None)
        if key is None:
            return ""
        v = trace.meta[key]
        try:
            number = float(json.loads(v))
        except (ValueError, TypeError):
            try:  # ISO 8601, as the recorder writes it
                stamp = datetime.datetime.fromisoformat(text(key))
            except ValueError:
                return text(key)
            if stamp.tzinfo is not None:
                stamp = stamp.astimezone(datetime.timezone.utc)
                return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
            return stamp.strftime("%Y-%m-%d %H:%M:%S")
        if number > 1e12:  # ns since the epoch
            number /= 1e9
        stamp = datetime.datetime.fromtimestamp(number, tz=datetime.timezone.utc)
        return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")

    def count(key: str) -> Optional[int]:
        v = trace.meta_json(key) if key in trace.meta else None
        if isinstance(v, dict):
            return sum(int(x) for x in v.values())
        try:
            return int(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    functions = sorted(trace.functions.values(), key=lambda f: (f.name, f.id))
    failed = [f for f in functions if f.attached and not _attached_fully(f.attached)]
    return TraceSummary(
        struct_name=trace.struct_name, struct_kind=trace.struct_kind,
        target=text("target") or text("binary"), host=text("host"),
        kernel_release=text("kernel_release"), argv=words("argv"), command=words("command"),
        pid=text("pid") if text("pid") not in ("", "null") else "",
        stopped_by=text("stopped_by"),
        started_at=when("started_at", "start_time"), ended_at=when("ended_at", "end_time"),
        events=events, events_claimed=count("events"),
        lost_events=count("lost_events") or 0, full_layout=text("full_layout"),
        trace_path=trace.path, functions=functions, failed_probes=failed)


def _attached_fully(attached: str) -> bool:
    parts = {p.strip() for p in attached.split(",")}
    return {"entry", "exit"} <= parts


def _canonical_ids(functions: dict[int, FunctionRow]) -> dict[int, int]:
    """Functions-table rows of the same function (same name, unit and address) → the
    smallest of their ids, which then stands for the function."""
    first: dict[tuple, int] = {}
    out = {}
    for fid in sorted(functions):
        f = functions[fid]
        out[fid] = first.setdefault((f.name, f.unit, f.address), fid)
    return out


def _display_names(functions: dict[int, FunctionRow], canon: dict[int, int]) -> dict[int, str]:
    """Names to show, telling apart different functions of the same name (statics of
    several compile units): ``sk_check (tcp.c)``."""
    by_name: dict[str, set[int]] = {}
    for fid, c in canon.items():
        by_name.setdefault(functions[fid].name, set()).add(c)
    out = {}
    for fid, c in canon.items():
        f = functions[c]
        if len(by_name[f.name]) == 1:
            out[fid] = f.name
        elif f.unit and len({functions[o].unit for o in by_name[f.name]}) == len(by_name[f.name]):
            out[fid] = f"{f.name} ({f.unit})"
        else:
            out[fid] = f"{f.name} @0x{f.address or 0:x}" if f.address else f"{f.name} #{c}"
    return out


def build_report(trace: Trace, progress: Optional[Callable[[str], None]] = None) -> ReportData:
    """Read every event of ``trace`` once and build the report model."""
    say = progress or (lambda _msg: None)
    canon = _canonical_ids(trace.functions)
    raw: dict[int, str] = {fid: f.name for fid, f in trace.functions.items()}
    names = _display_names(trace.functions, canon)
    reach: dict[int, str] = {fid: f.reach for fid, f in trace.functions.items()}
    creators = {fid for fid, r in reach.items()  # slots, not functions
                if r == "returns" and not _LOOKUP_LIKE.search(raw[fid])}
    use_names = not any(r == "returns" for r in reach.values())
    free_like = {fid for fid, n in raw.items() if _FREE_LIKE.search(n)}
    alloc_like = {fid for fid, n in raw.items() if _ALLOC_LIKE.search(n)}

    def name_of(fid: int) -> str:
        n = names.get(fid)
        if n is None:
            n = names[fid] = f"function#{fid}"
        return n

    # ---- pass 1: pair calls, resolve objects known only at exit, find lifetimes
    rows: list[Row] = []
    frames: list[_Frame] = []
    threads: dict[int, _Thread] = {}
    lifetimes = _Lifetimes()
    #: rows whose object became known at their call's exit: that exit's position decides
    #: which lifetime they belong to (the object was made during the call)
    lifetime_at: dict[int, int] = {}
    unmatched_exits = 0

    # recording order across CPUs is not time order; a thread's events are in time order
    ordered = sorted((_Compact(e) for e in trace.events()), key=lambda e: (e.ts_ns, e.seq))
    for index, ev in enumerate(ordered):
        slot = ev.function_id
        fid = canon.get(slot, slot)
        row = Row(ev.seq, ev.ts_ns, ev.cpu, ev.pid, ev.tid, ev.comm, fid, ev.phase,
                  ev.object, ev.retval, ev.flags, slot=slot)
        th = threads.get(ev.tid)
        if th is None:
            th = threads[ev.tid] = _Thread()
        stack = th.stack
        if ev.phase == PHASE_ENTRY:
            frame = th.last_entry
            if not (frame is not None and stack and stack[-1] is frame
                    and frame.function_id == fid and slot not in frame.entries):
                frame = _Frame(fid, ev.ts_ns, index, len(stack),
                               stack[-1].function_id if stack else -1)
                stack.append(frame)
                frames.append(frame)
            frame.entries[slot] = index
            row.depth, row.caller_id = frame.depth, frame.caller
            th.last_entry, th.last_exit = frame, None
            if ev.object:
                lifetimes.seen(ev.object, index, name_of(fid))
                if use_names and slot in alloc_like:
                    lifetimes.maybe_reallocated(ev.object, index, name_of(fid))
        else:
            frame = None
            if not ev.flags & FLAG_NO_ENTRY:
                last = th.last_exit
                if (last is not None and last.function_id == fid and slot in last.entries
                        and slot not in last.exits):
                    frame = last  # the next slot of the call that just returned
                else:
                    for i in range(len(stack) - 1, -1, -1):
                        if stack[i].function_id == fid:
                            frame = stack[i]
                            del stack[i:]  # frames above it lost their exits
                            break
            th.last_entry = None
            th.last_exit = frame
            if frame is None:
                row.matched = False
                row.depth = len(stack)
                unmatched_exits += 1
                if ev.object:
                    lifetimes.seen(ev.object, index, name_of(fid))
            else:
                frame.exits[slot] = index
                row.depth = frame.depth
                entry_index = frame.entries.get(slot)
                entry = rows[entry_index] if entry_index is not None else None
                row.duration_ns = ev.ts_ns - (entry.ts_ns if entry else frame.ts_ns)
                address = ev.object or (entry.address if entry else 0)
                if not address and slot in creators and _is_pointer(ev.retval):
                    address = ev.retval & _U64_MASK
                row.address = address
                if entry is not None and not entry.address and address:
                    entry.address = address
                    lifetime_at[entry_index] = index
                if address:
                    lifetimes.seen(address, index, name_of(fid))
                if slot in creators and _is_pointer(ev.retval):
                    returned = ev.retval & _U64_MASK
                    lifetimes.seen(returned, frame.index, name_of(fid))
                    lifetimes.returned(returned, frame.index, name_of(fid))
                if use_names and address and slot in free_like:
                    lifetimes.freed(address, name_of(fid))
        rows.append(row)
        if len(rows) % 100_000 == 0:
            say(f"read {len(rows)} events")

    # ---- calls: one per frame, however many slots it had
    all_methods: dict[int, MethodStats] = {}
    start_ns = rows[0].ts_ns if rows else 0  # rows are in time order
    unfinished = 0
    duplicate: set[int] = set()
    for frame in frames:
        stats = all_methods.get(frame.function_id)
        if stats is None:
            stats = all_methods[frame.function_id] = MethodStats(
                frame.function_id, name_of(frame.function_id))
        stats.calls += 1
        if frame.exits:
            end = min(rows[i].ts_ns for i in frame.exits.values())
            stats.durations.append(end - frame.ts_ns)
            stats.call_times.append(frame.ts_ns - start_ns)
        for slot, i in frame.entries.items():
            if slot not in frame.exits:
                rows[i].matched = False
                unfinished += 1
        # slots of one call that reach the same object show it once, by a readable event
        for table in (frame.entries, frame.exits):
            if len(table) > 1:
                kept: dict[int, int] = {}
                for i in table.values():
                    address = rows[i].address
                    if not address:
                        continue
                    j = kept.get(address)
                    if j is None:
                        kept[address] = i
                    elif rows[j].flags & FLAG_READ_FAILED and not rows[i].flags & FLAG_READ_FAILED:
                        duplicate.add(j)
                        kept[address] = i
                    else:
                        duplicate.add(i)
    for row in rows:
        if not row.matched and row.phase != PHASE_ENTRY:
            stats = all_methods.get(row.function_id)
            if stats is None:
                stats = all_methods[row.function_id] = MethodStats(
                    row.function_id, name_of(row.function_id))
            stats.calls += 1  # an exit whose entry was lost: the call happened

    # ---- objects, in order of first appearance
    objects: dict[ObjectKey, ObjectTimeline] = {}
    lifetimes_per_address: dict[int, int] = {
        a: 1 + len(lifetimes.starts.get(a, ())) for a in lifetimes.first_seen}
    null_events = 0
    kept_rows: list[Row] = []
    kept_events = []
    for index, row in enumerate(rows):
        if index in duplicate:
            continue
        kept_rows.append(row)
        kept_events.append(ordered[index])
        if not row.address:
            null_events += 1
            continue
        at = lifetime_at.get(index, index)
        key = ObjectKey(row.address, lifetimes.lifetime_of(row.address, at))
        row.obj = key
        obj = objects.get(key)
        if obj is None:
            count = lifetimes_per_address.get(key.address, 1)
            obj = objects[key] = ObjectTimeline(
                key, object_label(key.address, key.lifetime, count),
                object_dir(key.address, key.lifetime), lifetimes.reason(key))
        obj.rows.append(row)
        obj.threads.add(row.tid)
    rows = kept_rows
    for obj in objects.values():
        _object_depths(obj.rows)

    # ---- pass 2: field changes and per-object method statistics
    last_bytes: dict[ObjectKey, Optional[bytes]] = {}
    last_values: dict[ObjectKey, dict[str, Any]] = {}
    fields = [f.name for f in trace.mini.fields]
    for row, ev in zip(rows, kept_events):
        key = row.obj
        if key is None:
            continue
        obj = objects[key]
        _count_call(obj.methods, row, name_of, start_ns)
        if ev.flags & FLAG_READ_FAILED:
            if ev.object:  # an object the probe could not read (no object yet is normal)
                row.unreadable = True
                obj.unreadable += 1
            continue
        if ev.snapshot is None:
            continue
        if last_bytes.get(key) == ev.snapshot:
            continue
        last_bytes[key] = ev.snapshot
        values = trace.values(ev.event())
        if values is None:
            continue
        previous = last_values.get(key)
        last_values[key] = values
        ts = row.ts_ns - start_ns
        if previous is None:
            obj.series = {name: [(ts, values[name])] for name in fields}
            continue
        changed = [name for name in fields if values[name] != previous[name]]
        if not changed:
            continue
        function_id, cause = _attribute(row)
        function = name_of(function_id) if function_id >= 0 else None
        seen_at = name_of(row.function_id)
        row.changes = []
        for name in changed:
            change = Change(name, previous[name], values[name], row.seq, ts, key,
                            function, function_id, cause, seen_at)
            row.changes.append(change)
            obj.changes.append(change)
            obj.series[name].append((ts, values[name]))
        for table in (obj.methods, all_methods):
            if function_id >= 0:
                stats = table.get(function_id)
                if stats is None:  # a caller working on this object through another one
                    stats = table[function_id] = MethodStats(function_id, name_of(function_id))
                stats.changed_fields += len(changed)

    if creators:
        rule = "structural: a new lifetime starts when a creation function returns the address"
    elif use_names:
        rule = ("by name: no creation function was traced, so an allocator-looking call after "
                "a free-looking one starts a new lifetime")
    else:
        rule = "none: the traced creation functions all look like lookups"
    say(f"{len(rows)} events, {len(objects)} objects")
    return ReportData(
        summary=_summary(trace, len(ordered)),
        objects=list(objects.values()),
        rows=rows, methods=all_methods, function_names=names, canonical=canon,
        start_ns=start_ns,
        lifetime_rule=rule, null_object_events=null_events,
        unmatched_exits=unmatched_exits, unfinished_calls=unfinished)


def _object_depths(rows: list[Row]) -> None:
    """Nesting among one object's calls, per thread: a call on the object made inside
    another call on it is one level deeper."""
    stacks: dict[int, list[int]] = {}
    for row in rows:
        stack = stacks.setdefault(row.tid, [])
        if row.phase == PHASE_ENTRY:
            row.object_depth = len(stack)
            stack.append(row.function_id)
        else:
            if row.function_id in stack:
                while stack.pop() != row.function_id:
                    pass
            row.object_depth = len(stack)


def _is_pointer(retval: Optional[int]) -> bool:
    """A returned value that can be an object: not NULL, not an ERR_PTR error code."""
    if not retval:
        return False
    return (retval & _U64_MASK) < _ERR_PTR_LOWEST


def _count_call(table: dict[int, MethodStats], row: Row,
                name_of: Callable[[int], str], start_ns: int) -> None:
    stats = table.get(row.function_id)
    if stats is None:
        stats = table[row.function_id] = MethodStats(row.function_id, name_of(row.function_id))
    if row.phase == PHASE_ENTRY:
        stats.calls += 1
    elif not row.matched:
        stats.calls += 1  # its entry was lost, but the call happened
    elif row.duration_ns is not None:
        stats.durations.append(row.duration_ns)
        stats.call_times.append(row.ts_ns - row.duration_ns - start_ns)


def _attribute(row: Row) -> tuple[int, str]:
    """Which function made the changes a row shows (-1: none traced), and how we know."""
    if row.phase != PHASE_ENTRY:
        return row.function_id, CAUSE_DURING
    if row.caller_id >= 0:
        return row.caller_id, CAUSE_CALLER
    return -1, CAUSE_OUTSIDE
