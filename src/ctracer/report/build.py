"""Fills the report's data (`ctracer.report.data`) from a trace file, pass by pass.

Each pass is a named function, linear in the number of events, tested on its own:

1. `read_events` — every event once, as a `Row`, in time order (recording order across
   CPUs is not time order).
2. `pair_calls` — per thread a stack pairs each exit with its entry (a lost event closes
   the frames above it), giving depths, durations and callers; the events of one call that
   reaches objects several ways (one functions-table row, or "slot", per way) are one call.
   Objects known only at exit (what a creation function returns, a holder filled in during
   the call) are resolved there.  A creation function (``reach = returns``) returning an
   address, and failing any such function an allocator-looking call after a free-looking
   one, marks where a new lifetime of a reused address starts.
3. `count_calls` — one call per frame, however many slots; rows repeating an object
   another slot of the same call showed are dropped.
4. `assign_objects` — each row on its object (address + lifetime).
5. `find_changes` — every object's snapshots compared with its previous one (raw bytes
   first, so unchanged snapshots are never decoded); each difference attributed: at an
   exit, to the function exiting; at an entry, to the traced caller running on that
   thread, or to code outside any traced call.
6. `announce_changes` (`ctracer.report.announced`) — a change a tracepoint announces
   before its store (``inet_sock_set_state``'s ``newstate``) moved to that tracepoint's row.
"""

from __future__ import annotations

import bisect
from array import array
import datetime
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from ctracer.debuginfo.gcpause import collector_paused
from ctracer.event import (FLAG_HEAD_ONLY, FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY,
                           PHASE_TRACEPOINT, Layout, array_value)
from ctracer.report.data import (Counts, CAUSE_CALLER, CAUSE_DURING, CAUSE_OUTSIDE, Change,
                                  MethodStats, ObjectKey, ObjectTimeline, Points, ReportData, Row,
                                  TraceSummary)
from ctracer.plan.lifetimes import ALLOC_LIKE, FREE_LIKE, LOOKUP_LIKE
from ctracer.report.announced import announce_changes
from ctracer.report.names import object_dir, object_label
from ctracer.report.snapshots import SnapshotColumn, SnapshotTable
from ctracer.tracefile import FunctionRow, Trace

_U64_MASK = (1 << 64) - 1
_ERR_PTR_LOWEST = (1 << 64) - 4095  # the kernel's ERR_PTR(-MAX_ERRNO)



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
    #: per slot, [slot, entry row index, exit row index] one after the other, -1 where
    #: not seen: one short list, not two dicts (a trace has half a million calls)
    slots: list[int] = field(default_factory=list)

    def _get(self, slot: int, offset: int) -> Optional[int]:
        """The row index at ``offset`` (1 entry, 2 exit) of ``slot``, if seen."""
        s = self.slots
        for k in range(0, len(s), 3):
            if s[k] == slot:
                return s[k + offset] if s[k + offset] >= 0 else None
        return None

    def entry(self, slot: int) -> Optional[int]:
        """The row index of ``slot``'s entry, if seen."""
        return self._get(slot, 1)

    def exit(self, slot: int) -> Optional[int]:
        return self._get(slot, 2)

    def _set(self, slot: int, offset: int, index: int) -> None:
        s = self.slots
        for k in range(0, len(s), 3):
            if s[k] == slot:
                s[k + offset] = index
                return
        s += (slot, index, -1) if offset == 1 else (slot, -1, index)

    def add_entry(self, slot: int, index: int) -> None:
        self._set(slot, 1, index)

    def add_exit(self, slot: int, index: int) -> None:
        self._set(slot, 2, index)

    def _seen(self, offset: int) -> list[tuple[int, int]]:
        """(slot, row index at ``offset``) of every slot seen there, in time order."""
        s = self.slots
        if len(s) == 3:  # one slot: most calls
            return [(s[0], s[offset])] if s[offset] >= 0 else []
        return sorted(((s[k], s[k + offset]) for k in range(0, len(s), 3)
                       if s[k + offset] >= 0), key=lambda p: p[1])

    def entries(self) -> list[tuple[int, int]]:
        """(slot, row index) of every entry seen, in time order."""
        return self._seen(1)

    def exits(self) -> list[tuple[int, int]]:
        return self._seen(2)

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
        #: address -> (why, thread, the call it happened in) of an end not yet passed
        self._ended: dict[int, tuple[str, int, Optional[_Frame]]] = {}
        #: addresses whose current lifetime a creation function's return began
        self._made: set[int] = set()
        self._positions: dict[int, list[int]] = {}

    def seen(self, address: int, at: int, function: str) -> None:
        if address not in self.first_seen:
            self.first_seen[address] = at
            self.first_reason[address] = f"first seen in {function}"

    def returned(self, address: int, at: int, function: str) -> None:
        """A creation function entered at row ``at`` returned ``address``."""
        reason = f"returned by {function}"
        self._freed_by.pop(address, None)
        self._ended.pop(address, None)
        self._made.add(address)
        starts = self.starts.setdefault(address, [])
        if starts and starts[-1][0] >= at:
            # a lifetime begun inside this call (a nested allocator): this call owns it
            starts[-1] = (at, reason)
        elif self.first_seen.get(address, at) >= at and not starts:
            self.first_reason[address] = reason
        else:
            starts.append((at, reason))

    def rule_starts(self, address: int, at: int, why: str) -> None:
        """A lifetime rule says the hit at row ``at`` is the first of a new lifetime,
        unless a creation function's return began the current one (and nothing ended
        it since): the rule stands in for creations a trace does not see."""
        if address in self._made:
            return
        self._freed_by.pop(address, None)
        self._ended.pop(address, None)
        starts = self.starts.get(address)
        if self.first_seen.get(address, at) >= at and not starts:
            self.first_seen.setdefault(address, at)
            self.first_reason[address] = why
        elif not (starts and starts[-1][0] == at):  # an ending rule already split here
            self.starts.setdefault(address, []).append((at, why))

    def rule_ends(self, address: int, why: str, tid: int = -1,
                  within: Optional["_Frame"] = None, since: int = -1) -> None:
        """A lifetime rule says this hit (or the exit of the call entered at row
        ``since``) is the last of the address's lifetime, on thread ``tid`` inside the
        traced call ``within`` still running there (None: none): its next sighting
        outside that call starts a new one (`seen_again`).  A lifetime begun since
        (another CPU allocated the address while the freeing call was returning) is not
        ended; an end pending inside a call still running keeps its place."""
        starts = self.starts.get(address)
        if starts and starts[-1][0] > since:
            return
        ended = self._ended.get(address)
        if ended is not None and ended[1] == tid and ended[2] is not None and within is not None \
                and within.depth > ended[2].depth:
            return
        self._ended[address] = (why, tid, within)

    def seen_again(self, address: int, at: int, tid: int = -1,
                   stack: Sequence["_Frame"] = (), around: int = 0) -> None:
        """The address is seen at row ``at`` on ``tid``, inside the first ``around``
        calls of the thread's ``stack``; after an end, a new lifetime starts here unless
        this is still inside the call the end happened in (the rest of the freeing call
        on that thread)."""
        ended = self._ended.get(address)
        if ended is None:
            return
        within = ended[2]
        if ended[1] == tid and within is not None and \
                any(stack[i] is within for i in range(around)):
            return
        del self._ended[address]
        self._made.discard(address)
        self.starts.setdefault(address, []).append((at, f"after {ended[0]}"))

    def freed(self, address: int, function: str) -> None:
        self._freed_by[address] = function

    def maybe_reallocated(self, address: int, at: int, function: str) -> None:
        freed_by = self._freed_by.pop(address, None)
        if freed_by is not None:
            self._made.discard(address)
            self.starts.setdefault(address, []).append(
                (at, f"{function} after {freed_by} (by name)"))

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
        if decoded is None:
            return ""
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

    def mapping(key: str) -> dict:
        v = trace.meta_json(key) if key in trace.meta else None
        return v if isinstance(v, dict) else {}

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
        trace_path=trace.path, functions=functions, failed_probes=failed,
        probe_kinds=str(mapping("probe_plan").get("kinds") or ""),
        probe_misses={str(k): int(v) for k, v in mapping("probe_misses").items()
                      if isinstance(v, (int, float)) and v})


def _attached_fully(attached: str) -> bool:
    """Every probe the function needs attached: entry and exit of a function, or the one
    program of a tracepoint (which has no exit)."""
    parts = {p.strip() for p in attached.split(",")}
    return any(pair <= parts for pair in ({"entry", "exit"}, {"fentry", "fexit"},
                                          {"kprobe", "kretprobe"})) or parts == {"raw_tracepoint"}


def _canonical_ids(functions: dict[int, FunctionRow]) -> dict[int, int]:
    """Functions-table rows of the same function (same name, unit and address; a
    tracepoint is never the function of its name, ``consume_skb``) → the smallest of
    their ids, which then stands for the function."""
    first: dict[tuple, int] = {}
    out = {}
    for fid in sorted(functions):
        f = functions[fid]
        out[fid] = first.setdefault((f.reach == "tracepoint", f.name, f.unit, f.address), fid)
    return out


def _display_names(functions: dict[int, FunctionRow], canon: dict[int, int]) -> dict[int, str]:
    """Names to show, telling apart different functions of the same name (statics of
    several compile units): ``sk_check (tcp.c)``."""
    by_name: dict[str, set[int]] = {}
    for fid, c in canon.items():
        if functions[fid].reach != "tracepoint":   # tp:NAME is told apart by its prefix
            by_name.setdefault(functions[fid].name, set()).add(c)
    out = {}
    for fid, c in canon.items():
        f = functions[c]
        if f.reach == "tracepoint":
            out[fid] = f"tp:{f.name}"
        elif len(by_name[f.name]) == 1:
            out[fid] = f.name
        elif f.unit and len({functions[o].unit for o in by_name[f.name]}) == len(by_name[f.name]):
            out[fid] = f"{f.name} ({f.unit})"
        else:
            out[fid] = f"{f.name} @0x{f.address or 0:x}" if f.address else f"{f.name} #{c}"
    return out


@dataclass
class FunctionTable:
    """What the functions table tells the passes: which rows ("slots") are one function,
    the names to show, and which slots create, free or allocate objects."""

    canon: dict[int, int]        # slot -> the id standing for its function
    names: dict[int, str]        # slot or function id -> display name
    creators: set[int]           # slots returning a new object (reach = returns, not lookups)
    use_names: bool              # no creation function traced: lifetimes found by names
    free_like: set[int]
    alloc_like: set[int]
    #: tracepoint slot -> the lifetime rules (meta ``lifetime_rules``) naming it
    rules: dict[int, list[dict]] = field(default_factory=dict)
    #: function slot -> the rule whose function's exit ends the object's life (its text)
    ending: dict[int, str] = field(default_factory=dict)
    #: tracepoint slots reaching the object through a holder (``skb->sk``)
    held: set[int] = field(default_factory=set)
    #: tracepoint slot -> the store it announces (meta ``announced_stores``)
    announced: dict[int, Any] = field(default_factory=dict)

    def name(self, fid: int) -> str:
        n = self.names.get(fid)
        if n is None:
            n = self.names[fid] = f"function#{fid}"
        return n


def function_table(functions: dict[int, FunctionRow],
                   lifetime_rules: Iterable[dict] = (),
                   announced_stores: Optional[Sequence[dict]] = None) -> FunctionTable:
    """The passes' view of the functions table; ``lifetime_rules`` and
    ``announced_stores`` are the trace's (`ctracer.plan.lifetimes`,
    `ctracer.plan.stores`, as its meta carries them)."""
    from ctracer.plan import stores
    by_tp = stores.rules_by_tracepoint(announced_stores)
    canon = _canonical_ids(functions)
    rules: dict[int, list[dict]] = {}
    ending: dict[int, str] = {}
    for rule in lifetime_rules:
        on_function = rule.get("probe") == "function"
        for fid, f in functions.items():
            if f.name != rule.get("function"):
                continue
            if not on_function and f.reach == "tracepoint":
                rules.setdefault(fid, []).append(rule)
            elif on_function and f.reach == "direct" and rule.get("effect") == "ends":
                ending[fid] = rule.get("rule") or f"{f.name} ends a lifetime"
    raw = {fid: f.name for fid, f in functions.items()}
    reach = {fid: f.reach for fid, f in functions.items()}
    return FunctionTable(
        canon=canon, names=_display_names(functions, canon),
        creators={fid for fid, r in reach.items()
                  if r == "returns" and not LOOKUP_LIKE.search(raw[fid])},
        use_names=not any(r == "returns" for r in reach.values()) and not rules
        and not ending, ending=ending,
        free_like={fid for fid, n in raw.items() if FREE_LIKE.search(n)},
        alloc_like={fid for fid, n in raw.items() if ALLOC_LIKE.search(n)}, rules=rules,
        held={fid for fid, f in functions.items()
              if f.reach == "tracepoint" and "->" in (f.via or "")},
        announced={fid: by_tp[f.name] for fid, f in functions.items()
                   if f.reach == "tracepoint" and f.name in by_tp and not "->" in (f.via or "")})


@dataclass
class Events:
    """Every event in time order: a `Row` each, plus what rows do not keep."""

    rows: list[Row]
    snapshots: SnapshotColumn
    recorded: list[int]  # the object address as the probe recorded it (0: none)


def read_events(trace: Trace, fns: FunctionTable) -> Events:
    """Read the trace once, in time order (recording order across CPUs is not time
    order; a thread's events are), then recording order."""
    canon = fns.canon
    intern = sys.intern
    rows, snapshots = [], SnapshotColumn(trace.mini.size)
    add_row, add_snapshot = rows.append, snapshots.append
    addresses: dict[int, int] = {}  # one int object per address or tid, not one per event
    for seq, ts, cpu, pid, tid, comm, slot, phase, obj, ret, _depth, flags, snapshot \
            in trace.event_tuples():
        obj = addresses.setdefault(obj, obj)
        add_row(Row(seq, ts, cpu, addresses.setdefault(pid, pid),
                    addresses.setdefault(tid, tid), intern(comm or ""),
                    canon.get(slot, slot),
                    phase, obj, ret, flags, slot=slot))
        add_snapshot(snapshot)
    args = trace.tracepoint_args()
    if args:
        for row in rows:
            row.args = args.get(row.seq)
    return Events(rows, snapshots, [r.address for r in rows])


@dataclass
class Pairing:
    """Pass 1's result: calls paired per thread, lifetimes of reused addresses."""

    frames: list[_Frame]
    lifetimes: _Lifetimes
    #: rows whose object became known at their call's exit: that exit's position decides
    #: which lifetime they belong to (the object was made during the call)
    lifetime_at: dict[int, int]
    unmatched_exits: int
    #: the identity rule of objects read only in their head, when it split any lifetime
    identity_rule: str = ""


class _Pairer:
    """Pass 1 over the time-ordered rows (see the module docstring)."""

    def __init__(self, fns: FunctionTable, rows: list[Row],
                 identities: Optional[dict[int, tuple]] = None, identity_rule: str = ""):
        self.fns, self.rows = fns, rows
        #: row index -> identity of an object read only in its head (`head_identities`)
        self.identities = identities or {}
        self.identity_rule = identity_rule
        self.identity_split = False
        self._identity: dict[int, tuple] = {}
        #: address -> the value its last announcing hit stored (`FunctionTable.announced`)
        self._stored: dict[int, Any] = {}
        self.frames: list[_Frame] = []
        self.threads: dict[int, _Thread] = {}
        self.lifetimes = _Lifetimes()
        self.lifetime_at: dict[int, int] = {}
        self.unmatched_exits = 0

    def entry(self, th: _Thread, row: Row, index: int) -> None:
        stack, fid, slot = th.stack, row.function_id, row.slot
        frame = th.last_entry
        if not (frame is not None and stack and stack[-1] is frame
                and frame.function_id == fid and frame.entry(slot) is None):
            frame = _Frame(fid, row.ts_ns, index, len(stack),
                           stack[-1].function_id if stack else -1)
            stack.append(frame)
            self.frames.append(frame)
        frame.add_entry(slot, index)
        row.depth, row.caller_id = frame.depth, frame.caller
        th.last_entry, th.last_exit = frame, None
        if row.address:
            name = self.fns.name(fid)
            self.lifetimes.seen_again(row.address, index, row.tid, stack, len(stack) - 1)
            self.lifetimes.seen(row.address, index, name)
            if self.fns.use_names and slot in self.fns.alloc_like:
                self.lifetimes.maybe_reallocated(row.address, index, name)

    def point(self, th: _Thread, row: Row, index: int) -> None:
        """A tracepoint hit: no pair, inside whatever traced call runs on the thread;
        the trace's lifetime rules for this tracepoint start or end lifetimes here."""
        stack = th.stack
        row.depth = len(stack)
        row.caller_id = stack[-1].function_id if stack else -1
        address = row.address
        if not address:
            return
        lifetimes = self.lifetimes
        if row.slot not in self.fns.held:
            # a hit through a holder after the object's end (a buffer freed after its
            # socket, still pointing to it) is the ended object's: the next direct hit
            # starts the new one
            lifetimes.seen_again(address, index, row.tid, stack, len(stack))
        lifetimes.seen(address, index, self.fns.name(row.function_id))
        store = self.fns.announced.get(row.slot)
        if store is not None and store.before:
            args = row.arguments() or {}
            last, before = self._stored.get(address), args.get(store.before)
            if last is not None and before is not None and before != last:
                lifetimes.rule_starts(address, index, store.continuity_text)
            if args.get(store.argument) is not None:
                self._stored[address] = args[store.argument]
        identity = self.identities.get(index) if self.identities else None
        if identity is not None:
            last = self._identity.get(address)
            self._identity[address] = identity
            if last is not None and last != identity:
                lifetimes.rule_starts(address, index, self.identity_rule)
                self.identity_split = True
        for rule in self.fns.rules.get(row.slot, ()):
            arg = rule.get("arg")
            if arg is not None and (row.arguments() or {}).get(arg) != rule.get("equals"):
                continue
            why = rule.get("rule") or f"{rule.get('function')} {rule.get('effect')} a lifetime"
            if rule.get("effect") == "starts":
                lifetimes.rule_starts(address, index, why)
            elif rule.get("effect") == "ends":
                lifetimes.rule_ends(address, why, row.tid, stack[-1] if stack else None,
                                    index)

    def _frame_of_exit(self, th: _Thread, row: Row) -> Optional[_Frame]:
        if row.flags & FLAG_NO_ENTRY:
            return None
        fid, slot, stack = row.function_id, row.slot, th.stack
        last = th.last_exit
        if (last is not None and last.function_id == fid and last.entry(slot) is not None
                and last.exit(slot) is None):
            return last  # the next slot of the call that just returned
        for i in range(len(stack) - 1, -1, -1):
            if stack[i].function_id == fid:
                frame = stack[i]
                del stack[i:]  # frames above it lost their exits
                return frame
        return None

    def exit(self, th: _Thread, row: Row, index: int) -> None:
        fns, lifetimes = self.fns, self.lifetimes
        fid, slot = row.function_id, row.slot
        frame = self._frame_of_exit(th, row)
        th.last_entry, th.last_exit = None, frame
        if frame is None:
            row.matched = False
            row.depth = len(th.stack)
            self.unmatched_exits += 1
            if row.address:
                lifetimes.seen(row.address, index, fns.name(fid))
            return
        frame.add_exit(slot, index)
        row.depth = frame.depth
        entry_index = frame.entry(slot)
        entry = self.rows[entry_index] if entry_index is not None else None
        row.duration_ns = row.ts_ns - (entry.ts_ns if entry else frame.ts_ns)
        creates = slot in fns.creators and _is_pointer(row.retval)
        address = row.address or (entry.address if entry else 0)
        if not address and creates:
            address = row.retval & _U64_MASK
        row.address = address
        if entry is not None and not entry.address and address:
            entry.address = address
            self.lifetime_at[entry_index] = index
        elif entry is not None and entry.address == address and not creates:
            self.lifetime_at[index] = entry_index  # a call is one lifetime's
        if address:
            lifetimes.seen(address, index, fns.name(fid))
        if creates:
            returned = row.retval & _U64_MASK
            lifetimes.seen(returned, frame.index, fns.name(fid))
            lifetimes.returned(returned, frame.index, fns.name(fid))
        if address and slot in fns.ending:
            lifetimes.rule_ends(address, fns.ending[slot], row.tid,
                                th.stack[-1] if th.stack else None, frame.index)
        if fns.use_names and address and slot in fns.free_like:
            lifetimes.freed(address, fns.name(fid))


def pair_calls(rows: list[Row], fns: FunctionTable,
               say: Callable[[str], None] = lambda _m: None,
               identities: Optional[dict[int, tuple]] = None,
               identity_rule: str = "") -> Pairing:
    """Pass 1: pair each exit with its entry per thread (a lost event closes the frames
    above it), giving depths, durations and callers; resolve objects known only at exit;
    find where reused addresses start new lifetimes (``identities``: see
    `head_identities`)."""
    pairer = _Pairer(fns, rows, identities, identity_rule)
    threads = pairer.threads
    for index, row in enumerate(rows):
        th = threads.get(row.tid)
        if th is None:
            th = threads[row.tid] = _Thread()
        if row.phase == PHASE_ENTRY:
            pairer.entry(th, row, index)
        elif row.phase == PHASE_TRACEPOINT:
            pairer.point(th, row, index)
        else:
            pairer.exit(th, row, index)
        if index and index % 100_000 == 0:
            say(f"paired {index} events")
    return Pairing(pairer.frames, pairer.lifetimes, pairer.lifetime_at,
                   pairer.unmatched_exits,
                   pairer.identity_rule if pairer.identity_split else "")


def head_identities(trace: Trace, events: Events) -> tuple[dict[int, tuple], str]:
    """Row index -> the identity (the trace's meta ``head_read``: the connection's
    addresses and ports) of each event that read only its object's head, and the rule
    saying why another identity at the same address is another object; ({}, "") when
    the trace has none.  Such events are few: only they are decoded here."""
    head = trace.meta_json("head_read")
    names = head.get("identity") if isinstance(head, dict) else None
    layout = trace.mini
    known = {f.name for f in layout.fields}
    if not isinstance(names, list) or not names or not all(n in known for n in names):
        return {}, ""
    out = {}
    snapshots = events.snapshots
    for i, row in enumerate(events.rows):
        if row.flags & FLAG_HEAD_ONLY and not row.flags & FLAG_READ_FAILED:
            snapshot = snapshots[i]
            if snapshot is not None:
                values = layout.decode(snapshot)
                out[i] = tuple(values[n] for n in names)
    return out, str(head.get("identity_rule") or "")


@dataclass
class CallCounts:
    methods: dict[int, MethodStats]  # over all objects
    unfinished: int                  # entries whose exit was never seen
    duplicates: set[int]             # rows repeating an object another slot of the call showed


def _stats(table: dict[int, MethodStats], fid: int, fns: FunctionTable) -> MethodStats:
    stats = table.get(fid)
    if stats is None:
        stats = table[fid] = MethodStats(fid, fns.name(fid))
    return stats


def count_calls(rows: list[Row], pairing: Pairing, fns: FunctionTable) -> CallCounts:
    """One call per frame, however many slots it had; durations from the first exit."""
    methods: dict[int, MethodStats] = {}
    start_ns = rows[0].ts_ns if rows else 0
    unfinished = 0
    duplicates: set[int] = set()
    for frame in pairing.frames:
        stats = _stats(methods, frame.function_id, fns)
        stats.calls += 1
        exits = frame.exits()
        if exits:
            end = min(rows[i].ts_ns for _, i in exits)
            stats.durations.append(end - frame.ts_ns)
            stats.call_times.append(frame.ts_ns - start_ns)
        entries = frame.entries()
        for slot, i in entries:
            if frame.exit(slot) is None:
                rows[i].matched = False
                unfinished += 1
        for table in (entries, exits):
            if len(table) > 1:
                duplicates.update(_duplicate_slots(rows, [i for _, i in table]))
    for row in rows:
        if row.phase == PHASE_TRACEPOINT:
            _stats(methods, row.function_id, fns).calls += 1  # a hit
        elif not row.matched and row.phase != PHASE_ENTRY:
            _stats(methods, row.function_id, fns).calls += 1  # its entry was lost
    return CallCounts(methods, unfinished, duplicates)


def _duplicate_slots(rows: list[Row], indexes: Iterable[int]) -> list[int]:
    """Slots of one call that reach the same object show it once, by a readable event:
    the other rows' indexes."""
    kept: dict[int, int] = {}
    dropped = []
    for i in indexes:
        address = rows[i].address
        if not address:
            continue
        j = kept.get(address)
        if j is None:
            kept[address] = i
        elif rows[j].flags & FLAG_READ_FAILED and not rows[i].flags & FLAG_READ_FAILED:
            dropped.append(j)
            kept[address] = i
        else:
            dropped.append(i)
    return dropped


@dataclass
class Objects:
    """The objects pass: every kept row on its object, in order of first appearance."""

    objects: dict[ObjectKey, ObjectTimeline]
    events: Events   # the rows kept (duplicates dropped), with their snapshots
    null_events: int


def assign_objects(events: Events, pairing: Pairing, duplicates: set[int]) -> Objects:
    lifetimes = pairing.lifetimes
    per_address = {a: 1 + len(lifetimes.starts.get(a, ())) for a in lifetimes.first_seen}
    objects: dict[ObjectKey, ObjectTimeline] = {}
    #: the one object of an address never reused (the common case): no lookup of lifetimes
    single: dict[int, ObjectTimeline] = {}
    # lifetimes were found at positions among all rows: kept positions map back
    original = (range(len(events.rows)) if not duplicates else
                [i for i in range(len(events.rows)) if i not in duplicates])
    kept = events if not duplicates else Events(
        [events.rows[i] for i in original], events.snapshots.select(original),
        [events.recorded[i] for i in original])
    lifetime_at = pairing.lifetime_at
    null_events = 0
    for index, row in enumerate(kept.rows):
        address = row.address
        if not address:
            null_events += 1
            continue
        obj = single.get(address)
        if obj is None:
            at = original[index]
            at = lifetime_at.get(at, at)
            key = ObjectKey(address, lifetimes.lifetime_of(address, at))
            obj = objects.get(key)
            if obj is None:
                count = per_address.get(address, 1)
                obj = objects[key] = ObjectTimeline(
                    key, object_label(address, key.lifetime, count),
                    object_dir(address, key.lifetime), lifetimes.reason(key))
                if count == 1:
                    single[address] = obj
        row.obj = obj.key
        obj.rows.append(row)
        obj.threads.add(row.tid)
    for obj in objects.values():
        _object_depths(obj.rows)
    return Objects(objects, kept, null_events)


def find_changes(found: Objects, layout: Layout, fns: FunctionTable,
                 methods: dict[int, MethodStats], start_ns: int,
                 head_fields: Optional[frozenset[str]] = None,
                 release_snapshots: bool = False) -> None:
    """Pass 5: compare every object's snapshots with its previous one and attribute each
    difference (`_attribute`); fills each object's changes, series, method statistics
    and unreadable counts.  The snapshots are decoded as one numpy table (the layout's
    dtype) and compared column by column; only rows that changed reach Python.  In a
    snapshot that read only the object's head (`FLAG_HEAD_ONLY`), the fields outside
    ``head_fields`` were not read: they neither change there nor count as values.  With
    ``release_snapshots`` the events' snapshots are let go once in the table."""
    objects = found.objects
    index_of = {key: i for i, key in enumerate(objects)}
    owners, positions = array("q"), array("q")  # 8 bytes an entry, not a Python int
    partial = array("b")
    events = found.events
    snapshots = events.snapshots
    present = snapshots.present
    for pos, (row, recorded) in enumerate(zip(events.rows, events.recorded)):
        key = row.obj
        if key is None:
            continue
        obj = objects[key]
        _count_call(obj.methods, row, fns.name, start_ns)
        if row.flags & FLAG_READ_FAILED:
            if recorded:  # an object the probe could not read (no object yet is normal)
                row.unreadable = True
                obj.unreadable += 1
            continue
        if present[pos]:
            owners.append(index_of[key])
            positions.append(pos)
            partial.append(1 if row.flags & FLAG_HEAD_ONLY else 0)
            if row.flags & FLAG_HEAD_ONLY:
                obj.head_only += 1
    if release_snapshots:
        events.snapshots = SnapshotColumn(snapshots.size)
    if positions:
        table = SnapshotTable(layout, snapshots, owners, positions,
                              partial if head_fields is not None and any(partial) else None,
                              head_fields or frozenset())
        del snapshots
        _walk_changes(table, list(objects.values()), events.rows, fns, methods, start_ns)


def _walk_changes(snaps: SnapshotTable, objects: list[ObjectTimeline], rows: list[Row],
                  fns: FunctionTable, methods: dict[int, MethodStats], start_ns: int) -> None:
    """Series start at each object's first snapshot; then every changed row, in time
    order, becomes its `Change` records.  Only changed values become Python objects (a
    million snapshots of 100 fields would be 100 million), and the work is one step per
    change, not per field of every changed row."""
    import numpy

    names = snaps.names
    firsts = numpy.flatnonzero(snaps.first)
    initial = [[v if k else None for v, k in zip(snaps.values(j, firsts),
                                                 snaps.value_known(j, firsts))]
               for j in range(len(names))]
    for k, (o, p) in enumerate(zip(snaps.owner[firsts].tolist(),
                                   snaps.position[firsts].tolist())):
        ts = rows[p].ts_ns - start_ns
        objects[o].series = {name: Points(((ts, initial[j][k]),))
                             for j, name in enumerate(names)}
    # the changed values out of the table, field by field, side by side; then the
    # table is let go before the changes become objects
    at_parts, field_parts, olds, news = [], [], [], []
    for j in range(len(names)):
        at = snaps.changed_at[j]
        if len(at):
            at_parts.append(at)
            field_parts.append(numpy.full(len(at), j, dtype=numpy.int32))
            olds += snaps.values(j, snaps.prev[at])
            news += snaps.values(j, at)
    snaps.release()
    if not at_parts:
        return
    at_all, field_all = numpy.concatenate(at_parts), numpy.concatenate(field_parts)
    del at_parts, field_parts
    order = numpy.lexsort((field_all, at_all))  # row, then field
    at_sorted, field_of = at_all[order], field_all[order]
    starts = numpy.flatnonzero(numpy.r_[True, at_sorted[1:] != at_sorted[:-1]])
    ends = numpy.r_[starts[1:], len(order)]
    heads = at_sorted[starts]
    owners, positions = snaps.owner[heads], snaps.position[heads]
    # rows a block at a time: a million changed rows as Python ints at once would cost
    # more than their changes
    for g0 in range(0, len(starts), _ROWS_A_BLOCK):
        g1 = min(g0 + _ROWS_A_BLOCK, len(starts))
        base, stop = int(starts[g0]), int(ends[g1 - 1])
        picks, fields = order[base:stop].tolist(), field_of[base:stop].tolist()
        for start, end, o, p in zip((starts[g0:g1] - base).tolist(),
                                    (ends[g0:g1] - base).tolist(),
                                    owners[g0:g1].tolist(), positions[g0:g1].tolist()):
            row = rows[p]
            _record_changes(objects[o], row,
                            [(names[fields[x]], olds[picks[x]], news[picks[x]])
                             for x in range(start, end)],
                            row.ts_ns - start_ns, fns, methods)


#: changed rows turned into `Change` records a block at a time
_ROWS_A_BLOCK = 65536


def _record_changes(obj: ObjectTimeline, row: Row, changed: list[tuple[str, Any, Any]],
                    ts: int, fns: FunctionTable, methods: dict[int, MethodStats]) -> None:
    function_id, cause = _attribute(row)
    function = fns.name(function_id) if function_id >= 0 else None
    seen_at = fns.name(row.function_id)
    row.changes = []
    for name, old, new in changed:
        change = Change(name, old, new, row.seq, ts, obj.key,
                        function, function_id, cause, seen_at)
        row.changes.append(change)
        obj.changes.append(change)
        points = obj.series[name]
        if len(points) == 1 and points[0][1] is None:
            points.clear()  # not read at first: the series starts at the first value read
        points.append((ts, new))
    if function_id >= 0:
        for table in (obj.methods, methods):
            # a caller working on this object through another one may be new to the table
            _stats(table, function_id, fns).changed_fields += len(changed)


def lifetime_rule(fns: FunctionTable) -> str:
    if fns.rules or fns.ending:
        texts = sorted({r.get("rule") or f"{r.get('function')} {r.get('effect')} a lifetime"
                        for rules in fns.rules.values() for r in rules}
                       | set(fns.ending.values()))
        creators = sorted({fns.name(fns.canon.get(f, f)) for f in fns.creators})
        if creators:
            texts.append("a new lifetime starts where a creation function returns the "
                         "address (" + ", ".join(creators[:6])
                         + (", ..." if len(creators) > 6 else "") + ")")
        return "rules recorded with the trace: " + "; ".join(texts)
    if fns.creators:
        return "structural: a new lifetime starts when a creation function returns the address"
    if fns.use_names:
        return ("by name: no creation function was traced, so an allocator-looking call "
                "after a free-looking one starts a new lifetime")
    return "none: the traced creation functions all look like lookups"


def build_report(trace: Trace, progress: Optional[Callable[[str], None]] = None) -> ReportData:
    """Read every event of ``trace`` once and build the report model, pass by pass."""
    with collector_paused(freeze=True):  # millions of objects that all survive the build
        return _build(trace, progress or (lambda _msg: None))


@dataclass
class Passes:
    """What the passes found, before the report packs it: also what the export stage
    reads (`ctracer.export.table`), so the two never disagree."""

    fns: FunctionTable
    pairing: Pairing
    calls: CallCounts
    found: Objects   # found.events: the rows shown, in time order, with their snapshots
    start_ns: int
    read: int        # events read (before rows repeating an object were dropped)


def run_passes(trace: Trace, say: Callable[[str], None] = lambda _m: None,
               keep_snapshots: bool = True) -> Passes:
    """Every pass over ``trace``, in order (see the module docstring); without
    ``keep_snapshots`` the rows' snapshots are let go once compared (the report needs
    only the changes)."""
    fns = function_table(trace.functions, trace.meta_json("lifetime_rules") or (),
                         trace.meta_json("announced_stores"))
    events = read_events(trace, fns)
    rows = events.rows
    say(f"read {len(rows)} events")
    identities, identity_rule = head_identities(trace, events)
    pairing = pair_calls(rows, fns, say, identities, identity_rule)
    calls = count_calls(rows, pairing, fns)
    pairing.frames = []  # half a million calls: their memory is needed from here
    found = assign_objects(events, pairing, calls.duplicates)
    start_ns = rows[0].ts_ns if rows else 0
    find_changes(found, trace.mini, fns, calls.methods, start_ns, trace.head_fields,
                 release_snapshots=not keep_snapshots)
    tracepoints = {r.function_id for r in rows if r.phase == PHASE_TRACEPOINT}
    announce_changes(list(found.objects.values()), {f: fns.name(f) for f in tracepoints},
                     trace.meta_json("announced_stores"), start_ns)
    return Passes(fns, pairing, calls, found, start_ns, len(rows))


def _build(trace: Trace, say: Callable[[str], None]) -> ReportData:
    p = run_passes(trace, say, keep_snapshots=False)
    fns, found = p.fns, p.found
    say(f"{len(found.events.rows)} events, {len(found.objects)} objects")
    summary = _summary(trace, p.read)
    unreadable = [r for r in found.events.rows if r.unreadable]
    counts = Counts(recorded=p.read, shown=len(found.events.rows),
                    repeated=p.read - len(found.events.rows),
                    lost=summary.lost_events, unreadable=len(unreadable),
                    claimed=(summary.events_claimed
                             if summary.events_claimed not in (None, p.read) else None),
                    incomplete=getattr(trace, "incomplete", None) or "")
    return ReportData(
        summary=summary, counts=counts, unreadable_rows=unreadable,
        objects=list(found.objects.values()),
        rows=found.events.rows, methods=p.calls.methods, function_names=fns.names,
        canonical=fns.canon, start_ns=p.start_ns, lifetime_rule=lifetime_rule(fns) + (
            f"; {p.pairing.identity_rule}" if p.pairing.identity_rule else ""),
        null_object_events=found.null_events, unmatched_exits=p.pairing.unmatched_exits,
        unfinished_calls=p.calls.unfinished)


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
    if row.phase == PHASE_ENTRY or row.phase == PHASE_TRACEPOINT:
        stats.calls += 1
    elif not row.matched:
        stats.calls += 1  # its entry was lost, but the call happened
    elif row.duration_ns is not None:
        stats.durations.append(row.duration_ns)
        stats.call_times.append(row.ts_ns - row.duration_ns - start_ns)


def _attribute(row: Row) -> tuple[int, str]:
    """Which function made the changes a row shows (-1: none traced), and how we know.
    A tracepoint hit is seen like an entry: the traced call running on the thread made
    the change, or code outside any traced call did."""
    if row.phase != PHASE_ENTRY and row.phase != PHASE_TRACEPOINT:
        return row.function_id, CAUSE_DURING
    if row.caller_id >= 0:
        return row.caller_id, CAUSE_CALLER
    return -1, CAUSE_OUTSIDE
