"""The report's data: what happened to each object, as plain dataclasses.

`build.build_report` fills these from a trace; the renderers (`html`, `graph`, `plots`)
only read them.  Nothing here knows about HTML or files.

Vocabulary:

* a **row** is one probe hit (entry or exit of a function) placed on a timeline, with
  its nesting depth and, on exits, the call's duration;
* an **object** is one lifetime of an address: when a creation function hands out an
  address again, a new `ObjectKey` (same address, next ``lifetime``) starts;
* a **change** is a field whose value differs from the object's previous snapshot,
  attributed to the function that made it (see `Change.cause`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple, Optional

from ctracer.tracefile import FunctionRow

#: Change.cause values
CAUSE_DURING = "during"    # seen at the exit of the function: it (or untraced code it ran) did it
CAUSE_CALLER = "caller"    # seen at an entry: the traced caller did it before this call
CAUSE_OUTSIDE = "outside"  # seen at an entry with no traced caller on the thread
CAUSE_ANNOUNCED = "announced"  # a tracepoint firing just before the store, by its argument


class ObjectKey(NamedTuple):
    """One object: an address and which lifetime of it (a tuple: hashed at C speed)."""

    address: int
    lifetime: int = 1  # 1 for the first object seen at an address, 2 after reuse...


@dataclass(slots=True)
class Change:
    """One field of one object taking a new value."""

    field: str
    old: Any
    new: Any
    seq: int            # the event (timeline row) where the new value was first seen
    ts_ns: int
    obj: ObjectKey
    function: Optional[str]  # who changed it; None when no traced function was running
    function_id: int         # its id in the functions table, -1 for None
    cause: str               # CAUSE_DURING | CAUSE_CALLER | CAUSE_OUTSIDE | CAUSE_ANNOUNCED
    seen_at: str             # the function whose entry/exit showed the new value

    @property
    def credited(self) -> Optional[str]:
        """Who the exports credit (``changed_by``): the traced function, else the
        tracepoint that announced or showed the change (``tp:NAME``: on a kernel traced
        through tracepoints that is all there is), else None."""
        if self.function is not None:
            return self.function
        return self.seen_at if self.seen_at.startswith("tp:") else None


@dataclass(slots=True)
class Row:
    """One probe hit on a timeline."""

    seq: int
    ts_ns: int
    cpu: int
    pid: int
    tid: int
    comm: str
    function_id: int        # the function (one id even when it has several table rows)
    phase: int
    address: int            # the object address (resolved at exit for creation functions)
    retval: Optional[int]
    flags: int
    depth: int = 0          # open traced calls of this thread around this row
    caller_id: int = -1     # entry rows: the innermost open traced call of the thread
    object_depth: int = 0   # the same, counting only calls on this object
    duration_ns: Optional[int] = None  # exit rows whose entry was seen
    matched: bool = True    # False: an entry whose exit never came, or an exit without entry
    obj: Optional[ObjectKey] = None
    changes: Optional[list[Change]] = None
    unreadable: bool = False  # the probe could not read the object
    slot: int = -1          # the functions-table row the event came from (the object's reach)
    #: a tracepoint hit's arguments, as the trace holds them (JSON text: a kernel trace
    #: has a million of them, and a dict costs three times the text); `arguments` reads it
    args: Optional[str] = None

    def arguments(self) -> Optional[dict[str, Any]]:
        """The tracepoint hit's arguments by name (None without any, or when the text
        is not a JSON object)."""
        return parse_arguments(self.args)


@dataclass(slots=True)
class MethodStats:
    """Calls of one function (on one object, or on all of them)."""

    function_id: int
    name: str
    calls: int = 0
    changed_fields: int = 0   # changes attributed to this function
    durations: list[int] = field(default_factory=list)   # ns, of calls whose exit was seen
    call_times: list[int] = field(default_factory=list)  # ns from trace start, per duration

    @property
    def total_ns(self) -> int:
        return sum(self.durations)

    def percentile(self, p: float) -> Optional[int]:
        if not self.durations:
            return None
        ordered = sorted(self.durations)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]

    @property
    def mean_ns(self) -> Optional[float]:
        return self.total_ns / len(self.durations) if self.durations else None


def parse_arguments(text: Optional[str]) -> Optional[dict[str, Any]]:
    """A tracepoint hit's arguments text as a dict by name (None when absent or not a
    JSON object)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class Points:
    """One field's values over time: (ns from trace start, value) pairs, first value
    then each change, kept as two lists (a pair as a tuple costs 72 bytes: a kernel
    trace has millions of changes).  Reads as a sequence of pairs."""

    __slots__ = ("times", "values")

    def __init__(self, pairs: Iterable[tuple[int, Any]] = ()):
        self.times: list[int] = []
        self.values: list[Any] = []
        for point in pairs:
            self.append(point)

    def append(self, point: tuple[int, Any]) -> None:
        self.times.append(point[0])
        self.values.append(point[1])

    def clear(self) -> None:
        self.times.clear()
        self.values.clear()

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return zip(self.times, self.values)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return self.times[i], self.values[i]

    def __eq__(self, other: object) -> bool:
        try:
            return list(self) == list(other)  # type: ignore[call-overload]
        except TypeError:
            return NotImplemented

    def __repr__(self) -> str:
        return f"Points({list(self)!r})"


@dataclass(slots=True)
class ObjectTimeline:
    """Everything seen of one object (one lifetime of an address)."""

    key: ObjectKey
    label: str       # "0x55d0c0a0" or "0x55d0c0a0-2" (`ctracer.report.names.object_name`)
    dirname: str     # the same: its pages' folder
    started_by: str  # why this lifetime starts where it does
    rows: list[Row] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    #: per field, (ns from trace start, value) from the first value seen, at each change
    series: dict[str, Points] = field(default_factory=dict)
    methods: dict[int, MethodStats] = field(default_factory=dict)
    unreadable: int = 0
    #: events that read only the object's head (a time-wait or request socket)
    head_only: int = 0
    threads: set[int] = field(default_factory=set)

    @property
    def first_ns(self) -> int:
        return self.rows[0].ts_ns if self.rows else 0

    @property
    def last_ns(self) -> int:
        return self.rows[-1].ts_ns if self.rows else 0

    @property
    def calls(self) -> int:
        return sum(m.calls for m in self.methods.values())

    @property
    def changed_fields(self) -> list[str]:
        return [name for name, points in self.series.items() if len(points) > 1]


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
class Counts:
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
            text += f" ({self.repeated} repeats of one call folded)"
        return text


@dataclass
class ReportData:
    """The whole report: summary, every object, all rows interleaved, method stats."""

    summary: TraceSummary
    objects: list[ObjectTimeline]          # by first appearance
    rows: list[Row]                        # every event, in recording order
    methods: dict[int, MethodStats]        # over all objects
    function_names: dict[int, str]        # display names, by functions-table id
    canonical: dict[int, int]              # functions-table id -> the id standing for its function
    start_ns: int                          # timestamp of the first event
    lifetime_rule: str                     # how address reuse was detected
    null_object_events: int = 0            # events with no object address
    unmatched_exits: int = 0               # exits whose entry was never seen
    unfinished_calls: int = 0              # entries whose exit was never seen
    counts: Optional[Counts] = None
    unreadable_rows: list[Row] = field(default_factory=list)  # in time order

    @property
    def changes(self) -> list[Change]:
        out = [c for o in self.objects for c in o.changes]
        out.sort(key=lambda c: c.seq)
        return out
