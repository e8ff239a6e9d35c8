"""Fills the report model (`ctracer.report.model`) from a trace file.

Two passes, both linear in the number of events:

1. **Calls and lifetimes.**  Events are read once in recording order.  Per thread a
   stack pairs each exit with its entry (a lost event closes the frames above it),
   giving depths and durations.  Creation functions (``reach = returns`` in the
   functions table) resolve the object they hand out at their exit; that exit, and
   failing it an allocator-looking call after a free-looking one, marks where a new
   lifetime of a reused address starts.
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
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ctracer.event import FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY
from ctracer.report.model import (CAUSE_CALLER, CAUSE_DURING, CAUSE_OUTSIDE, Change,
                                  MethodStats, ObjectKey, ObjectTimeline, ReportData, Row,
                                  TraceSummary)
from ctracer.report.names import object_dir, object_label
from ctracer.tracefile import Trace

_U64_MASK = (1 << 64) - 1
_ERR_PTR_LOWEST = (1 << 64) - 4095  # the kernel's ERR_PTR(-MAX_ERRNO)

#: name heuristics, used only where the functions table gives no structural signal
_FREE_LIKE = re.compile(r"(^|_)(free|destroy|destruct|dealloc|kfree)(_|$)")
_ALLOC_LIKE = re.compile(r"(^|_)(alloc|new|create|clone)(_|$)")
#: creation-typed functions that usually return an object that already exists
_LOOKUP_LIKE = re.compile(r"(^|_)(lookup|find|get|peek|search|next|prev|first|last)(_|$)")


@dataclass(slots=True)
class _Frame:
    function_id: int
    index: int        # of the entry row in the global (time-ordered) row list
    address: int      # 0 while a creation function has not returned yet
    ts_ns: int


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
        return [str(decoded)]

    def when(key: str) -> str:
        v = trace.meta.get(key)
        if v is None:
            return ""
        try:
            number = float(json.loads(v))
        except (ValueError, TypeError):
            return text(key)
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
        target=text("target"), host=text("host"), kernel_release=text("kernel_release"),
        argv=words("argv"), command=words("command"),
        started_at=when("started_at"), ended_at=when("ended_at"),
        events=events, events_claimed=count("events"),
        lost_events=count("lost_events") or 0, full_layout=text("full_layout"),
        trace_path=trace.path, functions=functions, failed_probes=failed)


def _attached_fully(attached: str) -> bool:
    parts = {p.strip() for p in attached.split(",")}
    return {"entry", "exit"} <= parts


def build_report(trace: Trace, progress: Optional[Callable[[str], None]] = None) -> ReportData:
    """Read every event of ``trace`` once and build the report model."""
    say = progress or (lambda _msg: None)
    names: dict[int, str] = {fid: f.name for fid, f in trace.functions.items()}
    reach: dict[int, str] = {fid: f.reach for fid, f in trace.functions.items()}
    creators = {fid for fid, r in reach.items()
                if r == "returns" and not _LOOKUP_LIKE.search(names[fid])}
    use_names = not any(r == "returns" for r in reach.values())
    free_like = {fid for fid, n in names.items() if _FREE_LIKE.search(n)}
    alloc_like = {fid for fid, n in names.items() if _ALLOC_LIKE.search(n)}

    def name_of(fid: int) -> str:
        n = names.get(fid)
        if n is None:
            n = names[fid] = f"function#{fid}"
        return n

    # ---- pass 1: pair calls, resolve creation functions' objects, find lifetimes
    rows: list[Row] = []
    stacks: dict[int, list[_Frame]] = {}
    open_on: dict[tuple[int, int], int] = {}  # (tid, address) -> open calls on it
    lifetimes = _Lifetimes()
    unmatched_exits = unfinished = 0

    # recording order across CPUs is not time order; a thread's events are in time order
    ordered = sorted(trace.events(), key=lambda e: (e.ts_ns, e.seq))
    for index, ev in enumerate(ordered):
        row = Row(ev.seq, ev.ts_ns, ev.cpu, ev.pid, ev.tid, ev.comm, ev.function_id,
                  ev.phase, ev.object, ev.retval, ev.flags)
        stack = stacks.setdefault(ev.tid, [])
        fid = ev.function_id
        if ev.phase == PHASE_ENTRY:
            row.depth = len(stack)
            if stack:
                row.caller_id = stack[-1].function_id
            address = ev.object
            if address:
                key = (ev.tid, address)
                row.object_depth = open_on.get(key, 0)
                open_on[key] = row.object_depth + 1
                lifetimes.seen(address, index, name_of(fid))
                if use_names and fid in alloc_like:
                    lifetimes.maybe_reallocated(address, index, name_of(fid))
            stack.append(_Frame(fid, index, address, ev.ts_ns))
        else:
            at = -1
            if not ev.flags & FLAG_NO_ENTRY:
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i].function_id == fid:
                        at = i
                        break
            if at < 0:
                row.matched = False
                row.depth = len(stack)
                unmatched_exits += 1
                if ev.object:
                    row.object_depth = open_on.get((ev.tid, ev.object), 0)
                    lifetimes.seen(ev.object, index, name_of(fid))
            else:
                for lost in stack[at + 1:]:
                    rows[lost.index].matched = False
                    unfinished += 1
                    _close(open_on, ev.tid, lost.address)
                frame = stack[at]
                del stack[at:]
                row.depth = at
                row.duration_ns = ev.ts_ns - frame.ts_ns
                address = ev.object or frame.address
                if not address and fid in creators and _is_pointer(ev.retval):
                    address = ev.retval & _U64_MASK
                row.address = address
                if frame.address:
                    _close(open_on, ev.tid, frame.address)
                elif address:
                    _resolve_pending(rows, frame, index, ev.tid, address, open_on)
                if address:
                    row.object_depth = open_on.get((ev.tid, address), 0)
                    lifetimes.seen(address, index, name_of(fid))
                if fid in creators and _is_pointer(ev.retval):
                    returned = ev.retval & _U64_MASK
                    lifetimes.seen(returned, frame.index, name_of(fid))
                    lifetimes.returned(returned, frame.index, name_of(fid))
                if use_names and address and fid in free_like:
                    lifetimes.freed(address, name_of(fid))
        rows.append(row)
        if len(rows) % 100_000 == 0:
            say(f"read {len(rows)} events")
    for stack in stacks.values():
        for frame in stack:
            rows[frame.index].matched = False
            unfinished += 1

    # ---- objects, in order of first appearance
    objects: dict[ObjectKey, ObjectTimeline] = {}
    lifetimes_per_address: dict[int, int] = {
        a: 1 + len(lifetimes.starts.get(a, ())) for a in lifetimes.first_seen}
    null_events = 0
    for index, row in enumerate(rows):
        if not row.address:
            null_events += 1
            continue
        key = ObjectKey(row.address, lifetimes.lifetime_of(row.address, index))
        row.obj = key
        obj = objects.get(key)
        if obj is None:
            count = lifetimes_per_address.get(key.address, 1)
            obj = objects[key] = ObjectTimeline(
                key, object_label(key.address, key.lifetime, count),
                object_dir(key.address, key.lifetime), lifetimes.reason(key))
        obj.rows.append(row)
        obj.threads.add(row.tid)

    # ---- pass 2: field changes and method statistics
    all_methods: dict[int, MethodStats] = {}
    last_bytes: dict[ObjectKey, Optional[bytes]] = {}
    last_values: dict[ObjectKey, dict[str, Any]] = {}
    start_ns = rows[0].ts_ns if rows else 0  # rows are in time order
    fields = [f.name for f in trace.mini.fields]
    for row, ev in zip(rows, ordered):
        _count_call(all_methods, row, name_of, start_ns)
        key = row.obj
        if key is None:
            continue
        obj = objects[key]
        _count_call(obj.methods, row, name_of, start_ns)
        if ev.flags & FLAG_READ_FAILED:
            row.unreadable = True
            obj.unreadable += 1
            continue
        if ev.snapshot is None:  # e.g. the entry of a creation function: no object yet
            continue
        if last_bytes.get(key) == ev.snapshot:
            continue
        last_bytes[key] = ev.snapshot
        values = trace.values(ev)
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
        if function_id >= 0:
            for table in (obj.methods, all_methods):
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
        summary=_summary(trace, len(rows)),
        objects=list(objects.values()),
        rows=rows, methods=all_methods, function_names=names, start_ns=start_ns,
        lifetime_rule=rule, null_object_events=null_events,
        unmatched_exits=unmatched_exits, unfinished_calls=unfinished)


def _is_pointer(retval: Optional[int]) -> bool:
    """A returned value that can be an object: not NULL, not an ERR_PTR error code."""
    if not retval:
        return False
    return (retval & _U64_MASK) < _ERR_PTR_LOWEST


def _close(open_on: dict[tuple[int, int], int], tid: int, address: int) -> None:
    if not address:
        return
    key = (tid, address)
    n = open_on.get(key, 0) - 1
    if n > 0:
        open_on[key] = n
    else:
        open_on.pop(key, None)


def _resolve_pending(rows: list[Row], frame: _Frame, exit_index: int, tid: int,
                     address: int, open_on: dict[tuple[int, int], int]) -> None:
    """A creation function returned ``address``: its entry row is on that object, and
    the calls on the object it made meanwhile nest inside it."""
    entry = rows[frame.index]
    entry.address = address
    entry.object_depth = open_on.get((tid, address), 0)
    for i in range(frame.index + 1, exit_index):
        r = rows[i]
        if r.tid == tid and r.address == address:
            r.object_depth += 1


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
