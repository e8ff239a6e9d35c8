"""The analysis of a trace, as columns: what `ctracer.analysis.load` returns.

Vocabulary (one name, one thing):

* an **event** is one probe hit (entry or exit of a function, or a tracepoint hit);
  `Events` holds the events shown, in time order, one numpy array per column — the
  ``address`` an event is about, the ``function`` (the id standing for it, even when it
  has several function rows) and its ``function_row`` (the functions-table row: the way
  it reached the object), nesting ``depth``, ``caller``, ``duration_ns`` of exits...;
* an **object** is one lifetime of an address (`ObjectKey`): when a creation function
  hands out an address again, or a lifetime rule says so, the next lifetime starts;
  `Objects` lists them in order of first appearance, and ``Events.object`` places each
  event on one (-1: the event has no address);
* a **change** is a field whose value differs from the object's previous snapshot,
  attributed to the function that made it (`Changes.cause`); `Changes` holds them in
  event order, values as int64 codes (`FieldValues` turns them back into values).

Nothing here knows about HTML or files, and nothing holds a Python object per event or
per change: per-object and per-event questions are answered from the arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
from ctracer.analysis.memory import at_once

from ctracer.event import FunctionRow, Layout, array_value
from ctracer.tracefile import TraceMeta

#: Changes.cause values, and how they are spelled
CAUSE_DURING = "during"    # seen at the exit of the function: it (or untraced code it ran) did it
CAUSE_CALLER = "caller"    # seen at an entry: the traced caller did it before this call
CAUSE_OUTSIDE = "outside"  # seen at an entry with no traced caller on the thread
CAUSE_ANNOUNCED = "announced"  # a tracepoint firing just before the store, by its argument
CAUSES = (CAUSE_DURING, CAUSE_CALLER, CAUSE_OUTSIDE, CAUSE_ANNOUNCED)

#: Events.duration_ns where the event has none (entries, exits whose entry was lost)
NO_DURATION = -1


def unique_pairs(high: np.ndarray, low: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (high, low) pairs of two integer columns, in (high, low) order, with
    each one's first position and count: what ``np.unique(np.stack([high, low], 1),
    axis=0, return_index=True, return_counts=True)`` gives, found on one int64 key
    instead of rows compared as bytes (crediting 10M events' changes: 3.67 s, now
    0.33 s).  Values
    from -1 to 2**32 - 2."""
    key = (high.astype(np.int64) + 1) << 32 | (low.astype(np.int64) + 1)
    keys, first, counts = np.unique(key, return_index=True, return_counts=True)
    return (keys >> 32) - 1, (keys & 0xFFFFFFFF) - 1, first, counts


def function_label(names: dict[int, str], fid: int) -> str:
    """A function's name, or ``function#<id>`` for an id the trace names nowhere."""
    return names.get(fid, f"function#{fid}")


def counts_per_group(values: np.ndarray, offsets: np.ndarray) -> list[dict[int, int]]:
    """How many times each value (>= 0; others are not counted) occurs in each group,
    group ``g`` being ``values[offsets[g]:offsets[g + 1]]``: a dict per group, by value."""
    groups = len(offsets) - 1
    group = np.repeat(np.arange(groups, dtype=np.int64), np.diff(offsets))
    counted = values >= 0
    found_group, found, _, counts = unique_pairs(group[counted], values[counted])
    bounds = np.searchsorted(found_group, np.arange(groups + 1)).tolist()
    found_list, counts_list = found.tolist(), counts.tolist()
    return [dict(zip(found_list[bounds[g]:bounds[g + 1]], counts_list[bounds[g]:bounds[g + 1]]))
            for g in range(groups)]


class ObjectKey(NamedTuple):
    """One object: an address and which lifetime of it."""

    address: int
    lifetime: int = 1  # 1 for the first object seen at an address, 2 after reuse...


class Columns:
    """Equal-length numpy arrays as attributes (`names`); `take` selects rows."""

    names: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(getattr(self, self.names[0]))

    def settle(self, space: Any) -> None:
        """Every column where ``space`` keeps finished arrays (`ArraySpace.settle`)."""
        for name in self.names:
            setattr(self, name, space.settle(getattr(self, name)))

    def take(self, rows: Any) -> "Columns":
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        for name in self.names:
            setattr(out, name, getattr(self, name)[rows])
        return out


class Events(Columns):
    """The events shown, in time order (then recording order)."""

    names = ("seq", "ts_ns", "cpu", "pid", "tid", "comm", "function_row", "function", "phase",
             "flags", "address", "retval", "has_retval", "args", "depth", "caller",
             "duration_ns", "matched", "object", "object_depth", "unreadable",
             "object_caller", "thread_caller")

    def __init__(self, **columns: Any):
        for name in self.names:
            setattr(self, name, columns[name])
        #: object_caller, thread_caller: the function on top of the event's stack among
        #: its object's events, and among its thread's (call graphs; -1: none)
        #: the texts ``comm`` and ``args`` index (args -1: none)
        self.comms: list[str] = columns.get("comms", [])
        self.args_texts: list[str] = columns.get("args_texts", [])

    def args_text(self, i: int) -> Optional[str]:
        """Event ``i``'s tracepoint arguments as recorded (None: it has none)."""
        k = int(self.args[i])
        return self.args_texts[k] if k >= 0 else None


class FieldValues:
    """Values of the mini layout's fields as int64 codes: integers as themselves (u64 in
    two's complement), floats by their bits, char arrays as an index into a table of
    texts per field.  `decode` gives the Python values the trace holds (str for char
    arrays), exactly as decoding one snapshot would."""

    def __init__(self, layout: Layout):
        self.fields = list(layout.fields)
        self.index = {f.name: j for j, f in enumerate(self.fields)}
        self._texts: list[list[str]] = [[] for _ in self.fields]
        self._text_codes: list[dict[str, int]] = [{} for _ in self.fields]

    def encode(self, j: int, column: np.ndarray) -> np.ndarray:
        """Codes of field ``j``'s values in a column of the layout's numpy dtype."""
        f = self.fields[j]
        if column.dtype.kind == "S":
            uniques, inverse = np.unique(column, return_inverse=True)
            codes = np.array([self.text_code(j, array_value(f.kind, u))
                              for u in uniques.tolist()], dtype=np.int64)
            return codes[inverse.reshape(-1)] if len(codes) else np.zeros(0, np.int64)
        if column.dtype.kind == "f":
            return column.astype(np.float64).view(np.int64)
        if column.dtype == np.uint64:
            return column.view(np.int64)
        return column.astype(np.int64)

    def text_code(self, j: int, text: str) -> int:
        codes = self._text_codes[j]
        code = codes.get(text)
        if code is None:
            code = codes[text] = len(self._texts[j])
            self._texts[j].append(text)
        return code

    def encode_value(self, j: int, value: Any) -> int:
        """The code of one Python value of field ``j``."""
        f = self.fields[j]
        if f.ctype.startswith("char["):
            return self.text_code(j, str(value))
        if f.ctype in ("float", "double"):
            return int(np.array([value], np.float64).view(np.int64)[0])
        v = int(value)
        return v - (1 << 64) if v >= 1 << 63 else v

    def decode(self, j: int, codes: np.ndarray) -> list:
        f = self.fields[j]
        codes = np.asarray(codes, dtype=np.int64)
        if f.ctype.startswith("char["):
            texts = self._texts[j]
            return [texts[c] for c in codes.tolist()]
        if f.ctype in ("float", "double"):
            return codes.view(np.float64).tolist()
        if f.ctype == "u64":
            return codes.view(np.uint64).tolist()
        return codes.tolist()

    def decode_one(self, j: int, code: int) -> Any:
        """The value of field ``j`` that ``code`` stands for."""
        return self.decode(j, np.array([code], np.int64))[0]


class Changes(Columns):
    """Every change, in event order (within an event: by field, the announced one last).

    ``event`` is the position in `Events`, ``field`` the index in the layout's fields,
    ``old``/``new`` value codes (`FieldValues`), ``function`` the function credited
    (-1: none traced), ``cause`` an index into `CAUSES`."""

    names = ("event", "field", "old", "new", "function", "cause")

    def __init__(self, **columns: Any):
        for name in self.names:
            setattr(self, name, columns[name])

    @classmethod
    def empty(cls) -> "Changes":
        """No changes."""
        return cls(event=np.zeros(0, np.int64), field=np.zeros(0, np.int32),
                   old=np.zeros(0, np.int64), new=np.zeros(0, np.int64),
                   function=np.zeros(0, np.int32), cause=np.zeros(0, np.int8))


@dataclass(slots=True)
class MethodStats:
    """Calls of one function (on one object, or on all of them)."""

    function_id: int
    name: str
    calls: int = 0
    changed_fields: int = 0   # changes attributed to this function
    #: ns, of calls whose exit was seen, and when each started (ns from trace start)
    durations: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    call_times: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: of ``calls``, those folded by ``--calls changes`` (they changed nothing and were
    #: never events: no time of their own, only their summed and longest duration)
    folded: int = 0
    folded_ns: int = 0
    folded_max_ns: int = 0

    def add_folded(self, calls: int, total_ns: int, max_ns: int) -> None:
        self.calls += calls
        self.folded += calls
        self.folded_ns += total_ns
        self.folded_max_ns = max(self.folded_max_ns, max_ns)

    @property
    def timed_calls(self) -> int:
        """Calls with a duration: written ones whose exit was seen, and folded ones."""
        return len(self.durations) + self.folded

    @property
    def total_ns(self) -> int:
        """Time in the method's timed calls and its folded ones."""
        return int(self.durations.sum()) + self.folded_ns

    def percentile(self, p: float) -> Optional[int]:
        """The ``p``-th percentile of the timed calls' durations (None: none timed)."""
        return self.percentiles(p)[0]

    def percentiles(self, *ps: float) -> list[Optional[int]]:
        """Durations at percentiles ``ps`` (the nearest call's, rounding down), sorting
        once; None without any."""
        n = len(self.durations)
        if not n:
            return [None] * len(ps)
        ordered = np.sort(self.durations)
        return [int(ordered[min(n - 1, int(p / 100 * n))]) for p in ps]

    @property
    def mean_ns(self) -> Optional[float]:
        """The mean duration of a timed call (None: none timed)."""
        return self.total_ns / self.timed_calls if self.timed_calls else None


@dataclass
class TraceSummary:
    """What the trace says about itself (its meta table), ready to show."""

    struct_name: str
    struct_kind: str
    target: str
    host: str
    kernel_release: str
    argv: list[str]
    command: list[str]
    pid: str               # the process followed (-p), when one was
    stopped_by: str        # why the recording ended
    started_at: str
    ended_at: str
    events: int            # rows in the trace
    events_claimed: Optional[int]  # what the recorder says it wrote, when it says
    lost_events: int
    full_layout: str
    trace_path: str
    functions: list[FunctionRow]
    failed_probes: list[FunctionRow]  # functions whose probes did not (all) attach
    #: a kernel trace's probe kinds and why (meta ``probe_plan.kinds``); calls the
    #: kernel ran no probe for, by why (meta ``probe_misses``)
    probe_kinds: str = ""
    probe_misses: dict = field(default_factory=dict)


@dataclass
class EventCounts:
    """The one set of event counts every page and the CLI show.

    ``recorded`` = ``shown`` + ``repeated``: every event in the trace file is on a
    timeline, except the repeats of a call that reached one object two ways (one row per
    way in the functions table) and showed it once.  ``lost`` events never reached the
    file (the kernel-side drop counter); ``unreadable`` are shown, flagged, without
    values (the probe could not read the object)."""

    recorded: int
    shown: int
    repeated: int
    lost: int
    unreadable: int
    claimed: Optional[int] = None   # what the recorder said it wrote, when it differs
    incomplete: str = ""            # why the trace file is incomplete, when it is

    def line(self) -> str:
        text = (f"{self.recorded} events recorded, {self.lost} lost, "
                f"{self.unreadable} unreadable, {self.shown} shown")
        if self.repeated:
            text += f" ({self.repeated} repeats of one call shown once)"
        return text


class Objects:
    """The objects, in order of first appearance, and per object where its events and
    changes are (positions into `Events` and `Changes`, in time order)."""

    def __init__(self, keys: list[ObjectKey], labels: list[str], dirnames: list[str],
                 started_by: list[str], event_of: np.ndarray, change_object: np.ndarray):
        self.keys, self.labels, self.dirnames, self.started_by = keys, labels, dirnames, started_by
        self.index = {k: i for i, k in enumerate(keys)}
        n = len(keys)
        self._events = _Groups(event_of, n)
        self._changes = _Groups(change_object, n)
        self.unreadable = np.zeros(n, np.int64)
        self.head_only = np.zeros(n, np.int64)
        #: the position of each object's first snapshot (-1: none) and every field's
        #: value there (codes; ``initial_known`` False where the field was not read)
        self.first_snapshot = np.full(n, -1, np.int64)
        self.initial = np.zeros((n, 0), np.int64)
        self.initial_known = np.zeros((n, 0), bool)
        #: changes attributed to each function, per object, before announced stores
        #: moved any (as the method tables count them)
        self.changed_by: list[dict[int, int]] = [{} for _ in range(n)]

    def __len__(self) -> int:
        return len(self.keys)

    def events(self, i: int) -> np.ndarray:
        """Positions in `Events` of object ``i``'s events, in time order."""
        return self._events.of(i)

    def event_counts(self) -> np.ndarray:
        """Events per object."""
        return self._events.counts()

    def event_groups(self, chosen: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The events of the objects ``chosen`` together: positions, and offsets where
        the ``k``th chosen object's are ``offsets[k]:offsets[k + 1]``."""
        return self._events.of_many(chosen)

    def changes(self, i: int) -> np.ndarray:
        """Positions in `Changes` of object ``i``'s changes, in order."""
        return self._changes.of(i)

    def change_counts(self) -> np.ndarray:
        """Field changes per object."""
        return self._changes.counts()

    def change_groups(self, chosen: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The changes of the objects ``chosen`` together, as `event_groups`."""
        return self._changes.of_many(chosen)

    def regroup_changes(self, event_object: np.ndarray, change_event: np.ndarray,
                        space: Any = None) -> None:
        """The changes grouped by object anew (``event_object[change_event]``: each
        change's), their positions where ``space`` keeps big arrays."""
        self._changes = _Groups(event_object, len(self.keys), space, change_event)

    def settle(self, space: Any) -> None:
        """The groups' positions where ``space`` keeps finished arrays."""
        for groups in (self._events, self._changes):
            groups.positions = space.settle(groups.positions)


class _Groups:
    """Positions grouped by a group index (-1: none), each group's in ascending order:
    ``group_of[p]``, or with ``rows`` ``group_of[rows[p]]``.  Sorted by counting a
    slice at a time, the positions written where ``space`` keeps big arrays: no
    temporaries the size of every position."""

    def __init__(self, group_of: np.ndarray, n: int, space: Any = None,
                 rows: Optional[np.ndarray] = None):
        length = len(group_of) if rows is None else len(rows)
        step = at_once(_SLICE)

        def groups(lo: int) -> np.ndarray:
            return group_of[lo:lo + step] if rows is None else group_of[rows[lo:lo + step]]

        counts = np.zeros(n, np.int64)
        for lo in range(0, length, step):
            g = groups(lo)
            counts += np.bincount(g[g >= 0], minlength=n)[:n]
        self.offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=self.offsets[1:])
        total = int(self.offsets[-1])
        self.positions = space.zeros(total, np.int64) if space is not None else \
            np.zeros(total, np.int64)
        filled = self.offsets[:-1].copy()
        for lo in range(0, length, step):
            g = groups(lo)
            has = np.flatnonzero(g >= 0)
            g = g[has]
            order = np.argsort(g, kind="stable")
            g_sorted = g[order]
            here = np.bincount(g, minlength=n)[:n]
            first_here = np.cumsum(here) - here
            self.positions[filled[g_sorted] + np.arange(len(g)) - first_here[g_sorted]] = \
                lo + has[order]
            filled += here

    def of(self, i: int) -> np.ndarray:
        return self.positions[self.offsets[i]:self.offsets[i + 1]]

    def of_many(self, chosen: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The positions of groups ``chosen`` together, and their offsets (every group:
        no copy)."""
        if chosen == list(range(len(self.offsets) - 1)):
            return self.positions, self.offsets
        spans = [self.of(i) for i in chosen]
        offsets = np.zeros(len(chosen) + 1, np.int64)
        np.cumsum([len(s) for s in spans], out=offsets[1:])
        return (np.concatenate(spans) if spans else np.zeros(0, np.int64)), offsets

    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


#: rows of a per-event computation done at once
_SLICE = 1 << 20


@dataclass
class Analysis:
    """A whole trace analysed: its summary, counts, events, objects and changes."""

    summary: TraceSummary
    counts: EventCounts
    layout: Layout                  # the mini struct the snapshots hold
    meta: TraceMeta                 # the trace's meta entries (`ctracer.tracefile.TraceMeta`)
    events: Events
    objects: Objects
    changes: Changes
    values: FieldValues
    methods: dict[int, MethodStats]  # over all objects
    function_names: dict[int, str]   # display names, by functions-table id
    canonical: dict[int, int]        # functions-table id -> the id standing for its function
    route_kind: dict[int, str]       # functions-table id -> its route kind
    start_ns: int                    # timestamp of the first event
    lifetime_rule: str               # how address reuse was detected
    null_object_events: int = 0      # events with no object address
    unmatched_exits: int = 0         # exits whose entry was never seen
    unfinished_calls: int = 0        # entries whose exit was never seen
    incomplete: Optional[str] = None  # why the trace file is incomplete
    #: the fields an event that read only its object's head carries (None: no such rule)
    head_fields: Optional[frozenset[str]] = None
    trace_path: str = ""
    #: with `load`'s ``snapshots``: every event's snapshot (a row of bytes each) and
    #: whether it has one
    snapshots: Optional[np.ndarray] = None
    has_snapshot: Optional[np.ndarray] = None
    #: where the analysis keeps its big arrays (`ctracer.analysis.mapped.ArraySpace`;
    #: None: the heap), for the per-event arrays its readers ask for (`change_rows`)
    space: Any = None
    #: ``--calls`` of the recording ("all": every call written; "changes": calls that
    #: changed nothing counted in `folded`)
    calls_mode: str = "all"
    folded: Any = None              # `ctracer.analysis.folds.Folded`

    def folded_rows(self, i: Optional[int] = None) -> np.ndarray:
        """Rows of `folded` on object ``i`` (every row when None)."""
        if self.folded is None or not len(self.folded):
            return np.zeros(0, np.int64)
        return np.arange(len(self.folded)) if i is None else self.folded.of_object(i)

    def function_name(self, fid: int) -> str:
        """The name shown for function id ``fid``."""
        return function_label(self.function_names, fid)

    # ---------------------------------------------------------------- changes

    def cause(self, k: int) -> str:
        """What caused change ``k``, in words (`CAUSES`)."""
        return CAUSES[int(self.changes.cause[k])]

    def credited(self, k: int) -> Optional[str]:
        """Who the exports credit (``changed_by``) for change ``k``: the traced function,
        else the tracepoint that announced or showed it (``tp:NAME``), else None."""
        fid = int(self.changes.function[k])
        if fid >= 0:
            return self.function_name(fid)
        seen = self.function_name(int(self.events.function[self.changes.event[k]]))
        return seen if seen.startswith("tp:") else None

    def change_rows(self, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Per event (of the positions ``rows``), where its changes start and end in
        `Changes` (two arrays)."""
        lo, hi, _ = rows.indices(len(self.events))
        n = max(hi - lo, 0)
        zeros = self.space.zeros if self.space is not None else np.zeros
        start, end = zeros(n, np.int64), zeros(n, np.int64)
        step = at_once(_SLICE)
        for at in range(0, n, step):  # no n-sized temporaries
            positions = np.arange(lo + at, lo + min(at + step, n))
            start[at:at + step] = np.searchsorted(self.changes.event, positions, "left")
            end[at:at + step] = np.searchsorted(self.changes.event, positions, "right")
        return self._settled(start), self._settled(end)

    def changes_by_seq(self) -> np.ndarray:
        """Every change's position, all objects together, in order of event seq (the
        order of recording)."""
        seq = self.events.seq[self.changes.event]
        return self._settled(np.argsort(seq, kind="stable"))  # ties: time order

    def _settled(self, array: np.ndarray) -> np.ndarray:
        return self.space.settle(array) if self.space is not None else array

    # ---------------------------------------------------------------- objects

    def series(self, i: int, fields: Optional[Sequence[str]] = None
               ) -> dict[str, tuple[list[int], list[Any]]]:
        """Object ``i``'s fields (all, or those named) over time: per field, (ns from
        trace start, value) from the first value seen, at each change; {} when nothing
        of it was read."""
        at = int(self.objects.first_snapshot[i])
        if at < 0:
            return {}
        t0 = int(self.events.ts_ns[at]) - self.start_ns
        mine = self.objects.changes(i)
        fields_of = self.changes.field[mine]
        order = np.argsort(fields_of, kind="stable")
        bounds = np.searchsorted(fields_of[order], np.arange(len(self.layout.fields) + 1))
        times = (self.events.ts_ns[self.changes.event[mine]] - self.start_ns)
        wanted = None if fields is None else set(fields)
        out = {}
        for j, f in enumerate(self.layout.fields):
            if wanted is not None and f.name not in wanted:
                continue
            picks = mine[order[bounds[j]:bounds[j + 1]]]
            known = bool(self.objects.initial_known[i, j])
            first = self.values.decode_one(j, int(self.objects.initial[i, j])) if known else None
            ts = times[order[bounds[j]:bounds[j + 1]]].tolist()
            vals = self.values.decode(j, self.changes.new[picks])
            if first is None and ts:  # not read at first: it starts at the first value read
                out[f.name] = (ts, vals)
            else:
                out[f.name] = ([t0] + ts, [first] + vals)
        return out

    def first_values(self, i: int) -> dict[str, Any]:
        """Each field's first value in object ``i``'s series ({} when nothing was read)."""
        if self.objects.first_snapshot[i] < 0:
            return {}
        mine = self.objects.changes(i)
        out = {}
        for j, f in enumerate(self.layout.fields):
            if self.objects.initial_known[i, j]:
                out[f.name] = self.values.decode_one(j, int(self.objects.initial[i, j]))
                continue
            later = mine[self.changes.field[mine] == j]
            out[f.name] = self.values.decode_one(j, int(self.changes.new[later[0]])) \
                if len(later) else None
        return out

    def series_lengths(self) -> np.ndarray:
        """Points in each object's series of each field (objects x fields)."""
        n, nf = len(self.objects), len(self.layout.fields)
        obj = self.events.object[self.changes.event]
        changes = np.bincount(obj * nf + self.changes.field, minlength=n * nf)[:n * nf] \
            .reshape(n, nf) if nf else np.zeros((n, 0), np.int64)
        known = self.objects.initial_known
        lengths = np.where(known, 1 + changes, np.where(changes > 0, changes, 1))
        lengths[self.objects.first_snapshot < 0] = 0
        return lengths

    def object_methods(self, i: int) -> dict[int, MethodStats]:
        """Calls of each function on object ``i`` (folded ones too)."""
        out = self.method_table(self.objects.events(i), self.objects.changed_by[i])
        rows = self.folded_rows(i)
        if len(rows):
            for fid, (n, total, longest) in self.folded.per_function(rows).items():
                if fid not in out:
                    out[fid] = MethodStats(fid, self.function_name(fid))
                out[fid].add_folded(n, total, longest)
        return out

    def method_table(self, rows: np.ndarray, changed_by: dict[int, int]) -> dict[int, MethodStats]:
        ev = self.events
        fn, phase = ev.function[rows], ev.phase[rows]
        from ctracer.event import PHASE_ENTRY, PHASE_TRACEPOINT
        counted = (phase == PHASE_ENTRY) | (phase == PHASE_TRACEPOINT) | \
            ((phase != PHASE_ENTRY) & (phase != PHASE_TRACEPOINT) & ~ev.matched[rows])
        timed = ~counted & (ev.duration_ns[rows] != NO_DURATION)
        out: dict[int, MethodStats] = {}
        fids, first = np.unique(fn, return_index=True)
        for fid in fids[np.argsort(first)].tolist():
            out[fid] = MethodStats(fid, self.function_name(fid))
        calls = np.unique(fn[counted], return_counts=True)
        for fid, n in zip(*(a.tolist() for a in calls)):
            out[fid].calls = n
        at = np.flatnonzero(timed)
        if len(at):
            # each function's timed calls, in time order: a stable sort by function
            at = at[np.argsort(fn[at], kind="stable")]
            fns, durations, times = fn[at], ev.duration_ns[rows[at]], ev.ts_ns[rows[at]]
            starts = np.flatnonzero(np.r_[True, fns[1:] != fns[:-1]])
            for lo, hi in zip(starts.tolist(), starts[1:].tolist() + [len(at)]):
                d = durations[lo:hi]
                stats = out[int(fns[lo])]
                stats.durations = d
                stats.call_times = times[lo:hi] - d - self.start_ns
        for fid, n in changed_by.items():
            if fid not in out:
                out[fid] = MethodStats(fid, self.function_name(fid))
            out[fid].changed_fields += n
        return out

    def object_calls(self) -> np.ndarray:
        """Calls on each object: entries, tracepoint hits and exits whose entry was lost
        (what its method table sums)."""
        ev = self.events
        from ctracer.event import PHASE_ENTRY, PHASE_TRACEPOINT
        counted = (ev.object >= 0) & ((ev.phase == PHASE_ENTRY) | (ev.phase == PHASE_TRACEPOINT)
                                      | ~ev.matched)
        out = np.bincount(ev.object[counted], minlength=len(self.objects))[:len(self.objects)]
        rows = self.folded_rows()
        if len(rows):
            out = out + np.bincount(self.folded.object, weights=self.folded.calls,
                                    minlength=len(self.objects)).astype(np.int64)
        return out

    def threads(self, i: int) -> list[int]:
        """The threads that touched object ``i``, sorted."""
        return np.unique(self.events.tid[self.objects.events(i)]).tolist()
