"""One trace reduced to what `ctracer diff` compares: plain data, no model objects.

A `TraceProfile` holds, for one trace file, counts over all its objects (each object
is one lifetime of an address, as the report counts them): calls and duration
percentiles per function, field changes per (field, function credited), the final value
of each field per lifetime, call-graph edges, how lifetimes start and end, and events per
lifetime.  Functions are named as the report shows them (``tp:NAME`` for tracepoints),
values as its pages show them, so two traces from different machines compare by what
they mean, not by ids or raw numbers.  `ctracer.report.profiles` fills it from a
trace's analysis; `ctracer.analysis.diff` compares profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

#: the caller of a call no traced function made (the call graph's root)
NO_CALLER = "(no traced caller)"
#: who changed a field when no traced function ran
NO_FUNCTION = "(no traced function)"


@dataclass(frozen=True)
class FieldInfo:
    """A recorded field: its dotted member path, C type as written, and kind."""

    name: str
    ctype: str
    kind: str


@dataclass(frozen=True)
class Timing:
    """Durations of one function's calls whose entry and exit were both seen."""

    timed: int
    p50_ns: int
    p95_ns: int


@dataclass(frozen=True)
class FinalValues:
    """One field's value at the end of each lifetime: how many lifetimes ended with
    each shown value, and (numeric fields) the median of the raw values."""

    shown: dict[str, int]
    median: Optional[float] = None


@dataclass
class TraceProfile:
    """One trace file, reduced (see the module docstring)."""

    path: str
    trace_id: str
    struct_kind: str
    struct_name: str
    host: str
    kernel: str
    command: list[str]
    events: int                   # events recorded in the file
    lost: int                     # events the kernel side counted lost
    incomplete: str               # why the file is incomplete ("" when finished)
    lifetimes: int                # objects: lifetimes of addresses
    fields: dict[str, FieldInfo]  # by dotted member path, in layout order
    calls: dict[str, int] = field(default_factory=dict)       # function -> calls or hits
    timings: dict[str, Timing] = field(default_factory=dict)  # function -> durations
    #: (field, function credited or NO_FUNCTION) -> changes
    changes: dict[tuple[str, str], int] = field(default_factory=dict)
    final: dict[str, FinalValues] = field(default_factory=dict)  # field -> final values
    edges: dict[tuple[str, str], int] = field(default_factory=dict)  # (caller, callee) -> calls
    started: dict[str, int] = field(default_factory=dict)  # why a lifetime began -> lifetimes
    ended: dict[str, int] = field(default_factory=dict)    # how it ended -> lifetimes
    events_per_lifetime: list[int] = field(default_factory=list)  # sorted
    #: for links into this trace's report: function shown -> its report stem, field -> stem
    function_stems: dict[str, str] = field(default_factory=dict)
    field_stems: dict[str, str] = field(default_factory=dict)
    #: the trace's function table: every function (tracepoint) the plan found in the
    #: traced kernel or program -> how it was probed ("" unknown) or why not
    known_functions: dict[str, str] = field(default_factory=dict)
    #: function -> its route text ("param 1", "socket->sk", ...)
    route_texts: dict[str, str] = field(default_factory=dict)
    #: the struct's members in the traced kernel's layout: dotted path -> (byte offset,
    #: C type); recorded fields and the struct's top-level members
    members: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: where the trace was recorded: "" here, else e.g. "guest (Linux 7.2.13, TCG)"
    recorded_in: str = ""

    @property
    def struct(self) -> str:
        """``struct NAME`` (or ``union NAME``)."""
        return f"{self.struct_kind} {self.struct_name}"
