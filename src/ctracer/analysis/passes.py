"""The passes that place a trace's events on calls and objects, each linear in the events.

1. `read_events` — every event once, as columns, in time order (recording order across
   CPUs is not time order).
2. `pair_calls` — per thread a stack pairs each exit with its entry (a lost event closes
   the frames above it), giving depths, durations and callers; the events of one call that
   reaches objects several ways (one function row per way) are one call.
   Objects known only at exit (what a creation function returns, a holder filled in during
   the call) are resolved there.  A creation function (route kind ``returns``) returning an
   address, a lifetime rule of the trace, and failing both an allocator-looking call
   after a free-looking one, mark where a new lifetime of a reused address starts.
3. `count_calls` — one call per frame, however many function rows; events repeating an object
   another row of the same call showed are dropped.
4. `assign_objects` — each event on its object (address + lifetime), and its nesting
   among the calls on that object.

The pairing is the one loop over events in Python (a thread's stack is sequential); it
reads plain lists of one chunk of columns and writes arrays.  `ctracer.analysis.changes`
then finds the field changes.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ctracer.analysis.functions import FunctionTable
from ctracer.analysis.memory import at_once
from ctracer.calls import Thread, closes
from ctracer.analysis.lifetimes import Lifetimes
from ctracer.analysis.mapped import ArraySpace
from ctracer.analysis.model import NO_DURATION, MethodStats, ObjectKey
from ctracer.decode import object_name
from ctracer.event import FLAG_HEAD_ONLY, FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY, \
    PHASE_TRACEPOINT, Layout
from ctracer.tracefile import Trace

_U64_MASK = (1 << 64) - 1
_ERR_PTR_LOWEST = (1 << 64) - 4095  # the kernel's ERR_PTR(-MAX_ERRNO)


def _is_pointer(retval: int) -> bool:
    """A returned value that can be an object: not NULL, not an ERR_PTR error code."""
    return bool(retval) and (retval & _U64_MASK) < _ERR_PTR_LOWEST


@dataclass
class Read:
    """Every event in time order, as the trace holds it (pass 1)."""

    columns: dict[str, Any]   # `Trace.event_columns`
    function_row: np.ndarray  # functions-table row (an event's function_id)
    function: np.ndarray      # the id standing for its function

    def __len__(self) -> int:
        return len(self.function_row)


#: bytes per event of `Trace.event_columns` besides its snapshot
ROW_BYTES = 64


def read_events(trace: Trace, fns: FunctionTable, space: Optional[ArraySpace] = None) -> Read:
    """The trace's event columns, with each event's function row mapped to the id standing
    for its function (`FunctionTable.canon`)."""
    space = space or ArraySpace(None)
    columns = trace.event_columns(space=space)
    row = columns["function_id"]
    canon = fns.canon
    if canon:
        table = np.arange(max(max(canon), int(row.max(initial=0))) + 1, dtype=np.int32)
        for k, v in canon.items():
            table[k] = v
        function = space.take(table, row) if len(row) else row.copy()
    else:
        function = space.copy(row)
    return Read(columns, row, function)


class _Frame:
    """One open call on a thread.  A function reaching the object in several ways has one
    function row per way, and each row emits its own entry and exit
    event, one after the other: they all belong to this one call."""

    __slots__ = ("id", "function_id", "ts_ns", "index", "depth", "caller", "entries",
                 "exits")

    def __init__(self, fid: int, ts: int, index: int, depth: int, caller: int, number: int):
        self.id, self.function_id, self.ts_ns, self.index = number, fid, ts, index
        self.depth, self.caller = depth, caller
        #: row -> (entry event index, its time, its address)
        self.entries: dict[int, tuple[int, int, int]] = {}
        self.exits: dict[int, int] = {}


@dataclass
class Pairing:
    """Pass 2's result, per event (arrays) and per frame (one per call)."""

    address: np.ndarray    # resolved at exit where the probe had none
    depth: np.ndarray
    caller: np.ndarray
    duration_ns: np.ndarray
    matched: np.ndarray
    frame: np.ndarray      # the call each entry or exit belongs to (-1: none)
    frame_function: np.ndarray
    frame_ts: np.ndarray
    lifetimes: Lifetimes
    #: per event, the position whose lifetime it belongs to (-1: its own): an entry whose
    #: object became known at its call's exit takes that exit's (the object was made
    #: during the call), an exit its entry's (a call is one lifetime's); an array, not a
    #: dict: half the events have one
    lifetime_at: np.ndarray
    unmatched_exits: int
    #: the identity rule of objects read only in their head, when it split any lifetime
    identity_rule: str = ""


#: events the pairing turns into Python lists at a time (ten million at once would be
#: gigabytes of Python ints)
PAIRING_CHUNK = 1 << 18


def pair_calls(read: Read, fns: FunctionTable, say: Callable[[str], None] = lambda _m: None,
               identities: Optional[dict[int, tuple]] = None,
               identity_rule: str = "", args: Optional[Callable[[int], Optional[dict]]] = None,
               space: Optional[ArraySpace] = None) -> Pairing:
    """Pair each exit with its entry per thread (a lost event closes the frames above
    it), giving depths, durations and callers; resolve objects known only at exit; find
    where reused addresses start new lifetimes (``identities``: see `head_identities`;
    ``args(i)``: event ``i``'s tracepoint arguments)."""
    pairer = _Pairer(read, fns, identities or {}, identity_rule, args or (lambda _i: None),
                     space or ArraySpace(None))
    n = len(read)
    step = at_once(PAIRING_CHUNK)
    for start in range(0, n, step):
        pairer.chunk(start, min(n, start + step))
        if start:
            say(f"paired {start} events")
    return pairer.result()


class _Pairer:
    """The pairing's state across chunks of events: each thread's stack, lifetimes."""

    def __init__(self, read: Read, fns: FunctionTable, identities: dict[int, tuple],
                 identity_rule: str, args: Callable[[int], Optional[dict]], space: ArraySpace):
        self.read, self.fns, self.args = read, fns, args
        self.identities, self.identity_rule = identities, identity_rule
        n = len(read)
        self.address = space.copy(read.columns["object"])
        self.depth = space.zeros(n, np.int32)
        self.caller = space.full(n, -1, np.int32)
        self.duration = space.full(n, NO_DURATION, np.int64)
        self.matched = space.full(n, True, bool)
        self.frame = space.full(n, -1, np.int64)
        self.frame_fn = array("q")  # per call (half the events): 8 bytes, not a Python int
        self.frame_ts = array("q")
        self.threads: dict[int, Thread] = {}
        self.lifetimes = Lifetimes()
        self.lifetime_at = space.full(n, -1, np.int64)
        self.resolved: dict[int, int] = {}  # entry index -> the address its exit found
        self.stored: dict[int, Any] = {}    # address -> the value its last announcing hit stored
        self.identity_of: dict[int, tuple] = {}
        self.identity_split = False
        self.unmatched = 0

    def result(self) -> Pairing:
        for entry, a in self.resolved.items():
            self.address[entry] = a
        return Pairing(self.address, self.depth, self.caller, self.duration, self.matched,
                       self.frame, np.frombuffer(self.frame_fn, np.int64).astype(np.int32),
                       np.frombuffer(self.frame_ts, np.int64).copy(), self.lifetimes,
                       self.lifetime_at,
                       self.unmatched, self.identity_rule if self.identity_split else "")

    def chunk(self, lo: int, hi: int) -> None:
        c, read = self.read.columns, self.read
        tids, fns_, fn_rows = (c["tid"][lo:hi].tolist(), read.function[lo:hi].tolist(),
                               read.function_row[lo:hi].tolist())
        phases, flags_, ts_ = (c["phase"][lo:hi].tolist(), c["flags"][lo:hi].tolist(),
                               c["ts_ns"][lo:hi].tolist())
        address = self.address[lo:hi].tolist()
        retvals = [r if h else None for r, h in zip(c["retval"][lo:hi].tolist(),
                                                    c["has_retval"][lo:hi].tolist())]
        m = hi - lo
        depth, caller = [0] * m, [-1] * m
        duration, matched, frame_of = [NO_DURATION] * m, [True] * m, [-1] * m
        frame_fn, frame_ts = self.frame_fn, self.frame_ts
        threads, lifetimes = self.threads, self.lifetimes
        ended, first_seen = lifetimes.ended, lifetimes.first_seen
        fns = self.fns
        name = fns.name
        rules, held, announced = fns.rules, fns.held, fns.announced
        alloc_like, use_names = fns.alloc_like, fns.use_names
        lifetime_at = self.lifetime_at
        # rows whose exits `returned` must see: they create, end or free objects
        special_exit = fns.creators | set(fns.ending) | (fns.free_like if use_names else set())
        for k in range(m):
            index = lo + k
            tid, fid, row, phase = tids[k], fns_[k], fn_rows[k], phases[k]
            th = threads.get(tid)
            if th is None:
                th = threads[tid] = Thread()
            stack = th.stack
            a = address[k]
            if phase == PHASE_ENTRY:
                frame = th.last_entry
                # `ctracer.calls.continues`, inline: this runs once per event
                if not (frame is not None and stack and stack[-1] is frame
                        and frame.function_id == fid and row not in frame.entries):
                    frame = _Frame(fid, ts_[k], index, len(stack),
                                   stack[-1].function_id if stack else -1, len(frame_fn))
                    frame_fn.append(fid)
                    frame_ts.append(ts_[k])
                    stack.append(frame)
                frame.entries[row] = (index, ts_[k], a)
                frame_of[k] = frame.id
                depth[k], caller[k] = frame.depth, frame.caller
                th.last_entry, th.last_exit = frame, None
                if a:
                    # the two calls' own tests, inline: this runs once per event
                    if a in ended:
                        lifetimes.seen_again(a, index, tid, stack, len(stack) - 1)
                    if a not in first_seen:
                        lifetimes.seen(a, index, name(fid))
                    if use_names and row in alloc_like:
                        lifetimes.maybe_reallocated(a, index, name(fid))
            elif phase == PHASE_TRACEPOINT:
                depth[k] = len(stack)
                caller[k] = stack[-1].function_id if stack else -1
                if a:
                    self.point(a, index, fid, row, held, announced, rules, tid, stack)
            else:
                # `ctracer.calls.closes`, its usual case inline: the exit of the
                # innermost call, one row
                last = th.last_exit
                if stack and stack[-1].function_id == fid and not flags_[k] & FLAG_NO_ENTRY \
                        and (last is None or last.function_id != fid):
                    frame = stack.pop()
                    th.last_entry, th.last_exit = None, frame
                else:
                    frame = closes(th, fid, row, bool(flags_[k] & FLAG_NO_ENTRY))
                    if frame is None:
                        self.unmatched += 1
                        matched[k] = False
                        depth[k] = len(stack)
                        if a:
                            lifetimes.seen(a, index, name(fid))
                        continue
                frame_of[k], depth[k] = frame.id, frame.depth
                frame.exits[row] = index
                entry = frame.entries.get(row)
                if entry is not None and a and entry[2] == a and row not in special_exit:
                    # an exit on the object its entry had: one lifetime's call
                    duration[k] = ts_[k] - entry[1]
                    lifetime_at[index] = entry[0]
                    if a not in first_seen:
                        lifetimes.seen(a, index, name(fid))
                else:
                    duration[k], address[k] = self.returned(th, tid, frame, index, ts_[k],
                                                            fid, row, a, retvals[k])
        self.address[lo:hi] = address
        self.depth[lo:hi] = depth
        self.caller[lo:hi] = caller
        self.duration[lo:hi] = duration
        self.matched[lo:hi] = matched
        self.frame[lo:hi] = frame_of

    def returned(self, th: Thread, tid: int, frame: _Frame, index: int, ts: int, fid: int,
                 row: int, a: int, retval: Optional[int]) -> tuple[int, int]:
        """An exit of ``frame``'s ``row`` (on thread ``tid``, whose open calls are now
        ``th.stack``): its duration, and its object (known at exit for a creation
        function, or a holder filled in during the call); a freeing function's exit ends
        the object's lifetime (a lifetime rule), once the calls around it return."""
        fns, lifetimes, name = self.fns, self.lifetimes, self.fns.name
        entry = frame.entries.get(row)
        duration = ts - (entry[1] if entry is not None else frame.ts_ns)
        creates = row in fns.creators and retval is not None and _is_pointer(retval)
        if not a and entry is not None:
            a = entry[2]
        if not a and creates:
            a = retval & _U64_MASK
        if entry is not None and not entry[2] and a:
            self.resolved[entry[0]] = a
            frame.entries[row] = (entry[0], entry[1], a)
            self.lifetime_at[entry[0]] = index
        elif entry is not None and entry[2] == a and not creates:
            self.lifetime_at[index] = entry[0]  # a call is one lifetime's
        if a and a not in lifetimes.first_seen:
            lifetimes.seen(a, index, name(fid))
        if creates:
            returned = retval & _U64_MASK
            lifetimes.seen(returned, frame.index, name(fid))
            lifetimes.returned(returned, frame.index, name(fid))
        if a and row in fns.ending:
            lifetimes.rule_ends(a, fns.ending[row], tid, th.stack[-1] if th.stack else None,
                                frame.index)
        if fns.use_names and a and row in fns.free_like:
            lifetimes.freed(a, name(fid))
        return duration, a

    def point(self, a: int, index: int, fid: int, row: int, held: set, announced: dict,
              rules: dict, tid: int, stack: list) -> None:
        """A tracepoint hit on address ``a``: no pair, inside whatever traced call runs on
        the thread; the trace's lifetime rules for this tracepoint start or end
        lifetimes here."""
        lifetimes, args = self.lifetimes, self.args
        if row not in held:
            # a hit through a holder after the object's end (a buffer freed after its
            # socket, still pointing to it) is the ended object's: the next direct hit
            # starts the new one
            lifetimes.seen_again(a, index, tid, stack, len(stack))
        lifetimes.seen(a, index, self.fns.name(fid))
        store = announced.get(row)
        if store is not None and store.before:
            hit = args(index) or {}
            last, before = self.stored.get(a), hit.get(store.before)
            if last is not None and before is not None and before != last:
                lifetimes.rule_starts(a, index, store.continuity_text)
            if hit.get(store.argument) is not None:
                self.stored[a] = hit[store.argument]
        identity = self.identities.get(index) if self.identities else None
        if identity is not None:
            last = self.identity_of.get(a)
            self.identity_of[a] = identity
            if last is not None and last != identity:
                lifetimes.rule_starts(a, index, self.identity_rule)
                self.identity_split = True
        for rule in rules.get(row, ()):
            arg = rule.get("arg")
            if arg is not None and (args(index) or {}).get(arg) != rule.get("equals"):
                continue
            why = rule.get("rule") or f"{rule.get('function')} {rule.get('effect')} a lifetime"
            if rule.get("effect") == "starts":
                lifetimes.rule_starts(a, index, why)
            elif rule.get("effect") == "ends":
                lifetimes.rule_ends(a, why, tid, stack[-1] if stack else None, index)


def head_identities(trace: Trace, read: Read) -> tuple[dict[int, tuple], str]:
    """Event index -> the identity (the trace's meta ``head_read``: the connection's
    addresses and ports) of each event that read only its object's head, and the rule
    saying why another identity at the same address is another object; ({}, "") when
    the trace has none.  Such events are few: only they are decoded here."""
    head = trace.meta.head_read
    names = head.get("identity") if isinstance(head, dict) else None
    layout = trace.mini
    known = {f.name for f in layout.fields}
    if not isinstance(names, list) or not names or not all(n in known for n in names):
        return {}, ""
    flags = read.columns["flags"]
    picked = np.flatnonzero(((flags & FLAG_HEAD_ONLY) != 0) & ((flags & FLAG_READ_FAILED) == 0)
                            & read.columns["has_snapshot"])
    out = {}
    snapshots = read.columns["snapshots"]
    for i in picked.tolist():
        values = layout.decode(snapshots[i].tobytes())
        out[i] = tuple(values[n] for n in names)
    return out, str(head.get("identity_rule") or "")


@dataclass
class CallCounts:
    """What `count_calls` finds: per-method statistics, entries never exited, and the
    events that only repeat an object another row of their call showed."""

    methods: dict[int, MethodStats]  # over all objects
    unfinished: int                  # entries whose exit was never seen
    duplicate: np.ndarray            # events repeating an object another row of the call showed


def count_calls(read: Read, pairing: Pairing, fns: FunctionTable) -> CallCounts:
    """One call per frame, however many function rows it had; durations from the first exit;
    entries whose row never exited are unmatched; of the events of one call reaching
    the same object, one is kept (the first readable)."""
    c = read.columns
    ts, phase, frame = c["ts_ns"], c["phase"], pairing.frame
    start_ns = int(ts[0]) if len(ts) else 0
    nframes = len(pairing.frame_function)
    exits = np.flatnonzero((frame >= 0) & (phase != PHASE_ENTRY))
    entries = np.flatnonzero((frame >= 0) & (phase == PHASE_ENTRY))
    end = np.full(nframes, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(end, frame[exits], ts[exits])
    timed = end != np.iinfo(np.int64).max
    # entries whose row's exit never came
    width = int(read.function_row.max(initial=0)) + 1
    exited = np.zeros(nframes * width, bool)  # by frame and row (np.isin: 6 s at 10M)
    exited[frame[exits] * width + read.function_row[exits]] = True
    unfinished = entries[~exited[frame[entries] * width + read.function_row[entries]]]
    del exited
    pairing.matched[unfinished] = False
    methods: dict[int, MethodStats] = {}
    fn_of_frame = pairing.frame_function
    order = np.argsort(fn_of_frame, kind="stable")
    bounds = np.flatnonzero(np.r_[True, fn_of_frame[order][1:] != fn_of_frame[order][:-1]]) \
        if nframes else np.zeros(0, np.int64)
    for b, e in zip(bounds.tolist(), np.r_[bounds[1:], nframes].tolist()):
        picks = order[b:e]
        fid = int(fn_of_frame[picks[0]])
        picks_timed = picks[timed[picks]]
        methods[fid] = MethodStats(fid, fns.name(fid), calls=len(picks),
                                   durations=end[picks_timed] - pairing.frame_ts[picks_timed],
                                   call_times=pairing.frame_ts[picks_timed] - start_ns)
    # tracepoint hits, and exits whose entry was lost, are calls too
    lone = (phase == PHASE_TRACEPOINT) | ((phase != PHASE_ENTRY) & (frame < 0))
    for fid, count in zip(*(a.tolist() for a in np.unique(read.function[lone],
                                                           return_counts=True))):
        stats = methods.get(fid)
        if stats is None:
            stats = methods[fid] = MethodStats(fid, fns.name(fid))
        stats.calls += count
    duplicate = np.zeros(len(read), bool)
    failed = (c["flags"] & FLAG_READ_FAILED) != 0
    for rows in (entries, exits):
        _mark_duplicates(rows, frame, pairing.address, failed, duplicate)
    return CallCounts(methods, len(unfinished), duplicate)


def _mark_duplicates(rows: np.ndarray, frame: np.ndarray, address: np.ndarray,
                     failed: np.ndarray, duplicate: np.ndarray) -> None:
    """Rows of one call that reach the same object show it once, by the first readable
    event (else the first): the others are marked in ``duplicate``."""
    rows = rows[address[rows] != 0]
    if not len(rows):
        return
    order = np.lexsort((rows, failed[rows], address[rows], frame[rows]))
    rows = rows[order]
    f, a = frame[rows], address[rows]
    first = np.r_[True, (f[1:] != f[:-1]) | (a[1:] != a[:-1])]
    duplicate[rows[~first]] = True


@dataclass
class ObjectPlacement:
    """Pass 4's result: the kept events' object, the objects and their names."""

    keep: np.ndarray          # positions (in the read events) of the events shown
    object: np.ndarray        # per kept event, its object (-1: none)
    keys: list[ObjectKey]
    labels: list[str]
    dirnames: list[str]
    started_by: list[str]
    null_events: int


def assign_objects(pairing: Pairing, duplicate: np.ndarray,
                   space: Optional[ArraySpace] = None) -> ObjectPlacement:
    """Each kept event's object: the lifetime of its address it falls in, numbered in order
    of first appearance (events repeating an object in one call dropped)."""
    space = space or ArraySpace(None)
    lifetimes = pairing.lifetimes
    keep = space.copy(np.flatnonzero(~duplicate))
    address = space.take(pairing.address, keep)
    lifetime = space.full(len(keep), 1, np.int64)
    reused = {a: s for a, s in lifetimes.starts.items() if s}
    if reused:
        # where each event's lifetime is decided: its own position, or the one it
        # takes its lifetime from (`Pairing.lifetime_at`)
        at = space.take(pairing.lifetime_at, keep)
        own = at < 0
        at[own] = keep[own]
        del own
        starts_of = {a: np.array([s for s, _ in starts], np.int64)
                     for a, starts in reused.items()}
        step = at_once(1 << 20)
        for base in range(0, len(address), step):  # no sort of every event's address
            part = address[base:base + step]
            order = np.argsort(part, kind="stable")
            sorted_addresses = part[order]
            for a, positions in starts_of.items():
                lo = np.searchsorted(sorted_addresses, np.uint64(a), "left")
                hi = np.searchsorted(sorted_addresses, np.uint64(a), "right")
                rows = base + order[lo:hi]
                lifetime[rows] = 1 + np.searchsorted(positions, at[rows], "right")
        del at
    has = address != 0
    obj = space.full(len(keep), -1, np.int64)
    keys: list[ObjectKey] = []
    labels, dirnames, started_by = [], [], []
    if has.any():
        # (address, lifetime) as one int64 key: an address's index, times the most
        # lifetimes any address has, plus the lifetime; found a slice at a time (a
        # kernel trace's few objects have millions of events: sorting every event's
        # key at once took hundreds of megabytes)
        n = len(address)
        step = at_once(1 << 20)
        addresses = np.unique(np.concatenate(
            [np.unique(address[lo:lo + step][has[lo:lo + step]]) for lo in range(0, n, step)]
            or [np.zeros(0, address.dtype)]))
        width = int(lifetime.max())

        def keys_of(lo: int) -> tuple[np.ndarray, np.ndarray]:
            at = np.flatnonzero(has[lo:lo + step])
            index = np.searchsorted(addresses, address[lo:lo + step][at]).astype(np.int64)
            return at, index * width + (lifetime[lo:lo + step][at] - 1)

        uniques, first = np.zeros(0, np.int64), np.zeros(0, np.int64)
        for lo in range(0, n, step):
            at, key = keys_of(lo)
            found, where = np.unique(key, return_index=True)
            # an object's first event: the earliest slice's (slices come in order)
            merged, pick = np.unique(np.r_[uniques, found], return_index=True)
            first = np.r_[first, lo + at[where]][pick]
            uniques = merged
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(uniques), np.int64)
        rank[order] = np.arange(len(uniques))
        for lo in range(0, n, step):
            at, key = keys_of(lo)
            obj[lo + at] = rank[np.searchsorted(uniques, key)]
        in_order = [(addresses[u // width], u % width + 1) for u in uniques[order].tolist()]
        for a, life in in_order:
            key = ObjectKey(int(a), int(life))
            keys.append(key)
            name = object_name(key.address, key.lifetime)  # its label and its folder
            labels.append(name)
            dirnames.append(name)
            started_by.append(lifetimes.reason(key))
    return ObjectPlacement(keep, obj, keys, labels, dirnames, started_by, int((~has).sum()))


def nesting(obj: np.ndarray, tid: np.ndarray, function: np.ndarray, phase: np.ndarray,
            space: Optional[ArraySpace] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nesting among each object's calls, per thread (a call on the object made inside
    another call on it is one level deeper), and for call graphs the function on top of
    each event's stack — among its object's events, and among all events — when it was
    counted (-1: none)."""
    n = len(obj)
    space = space or ArraySpace(None)
    depth = space.zeros(n, np.int32)
    top_obj, top_all = space.full(n, -1, np.int32), space.full(n, -1, np.int32)
    stacks: dict[tuple[int, int], list[int]] = {}
    threads: dict[int, list[int]] = {}
    step = at_once(PAIRING_CHUNK)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        depth[lo:hi], top_obj[lo:hi], top_all[lo:hi] = _nesting(
            obj[lo:hi].tolist(), tid[lo:hi].tolist(), function[lo:hi].tolist(),
            phase[lo:hi].tolist(), stacks, threads)
    return depth, top_obj, top_all


def _nesting(obj: list, tid: list, function: list, phase: list,
             stacks: dict, threads: dict) -> tuple[list, list, list]:
    n = len(obj)
    depth = [0] * n
    top_obj, top_all = [-1] * n, [-1] * n
    for i, (o, t, fid, ph) in enumerate(zip(obj, tid, function, phase)):
        every = threads.get(t)
        if every is None:
            every = threads[t] = []
        if ph == PHASE_ENTRY:
            top_all[i] = every[-1] if every else -1
            every.append(fid)
        elif ph == PHASE_TRACEPOINT:
            top_all[i] = every[-1] if every else -1
        else:
            if fid in every:
                while every and every.pop() != fid:
                    pass
            top_all[i] = every[-1] if every else -1
        if o < 0:
            continue
        # only open calls are kept: a dict of every object's stack outgrows the CPU's
        # caches (10M events, 27,000 objects: 1.5x the time per event)
        key = (o, t)
        stack = stacks.get(key)
        if ph == PHASE_ENTRY:
            if stack is None:
                stacks[key] = [fid]
                continue
            depth[i] = len(stack)
            top_obj[i] = stack[-1]
            stack.append(fid)
        elif stack is not None:
            if fid in stack:
                while stack.pop() != fid:
                    pass
            depth[i] = len(stack)
            if stack:
                top_obj[i] = stack[-1]
            else:
                del stacks[key]
    return depth, top_obj, top_all
