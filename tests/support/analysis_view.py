"""The analysis (`ctracer.analysis.load`) seen as Python objects, for tests' assertions:
an object's rows, a row's changes, a field's series as (time, value) pairs.  The package
keeps columns; tests read them through this view, event by event."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ctracer import analysis
from ctracer.analysis.model import NO_DURATION, Analysis, ObjectKey


@dataclass
class ChangeView:
    field: str
    old: Any
    new: Any
    seq: int
    ts_ns: int
    obj: ObjectKey
    function: Optional[str]
    function_id: int
    cause: str
    seen_at: str
    credited: Optional[str]


@dataclass
class RowView:
    seq: int
    ts_ns: int
    cpu: int
    pid: int
    tid: int
    comm: str
    function_id: int
    phase: int
    address: int
    retval: Optional[int]
    flags: int
    depth: int
    caller_id: int
    object_depth: int
    duration_ns: Optional[int]
    matched: bool
    obj: Optional[ObjectKey]
    unreadable: bool
    slot: int
    args: Optional[str]
    changes: Optional[list] = None


@dataclass
class ObjectView:
    key: ObjectKey
    label: str
    dirname: str
    started_by: str
    rows: list
    changes: list
    series: dict
    methods: dict
    unreadable: int
    head_only: int
    threads: set = field(default_factory=set)

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
class ReportView:
    analysis: Analysis
    objects: list
    rows: list
    changes: list

    def __getattr__(self, name: str) -> Any:
        return getattr(self.analysis, name)


def view(a: Analysis) -> ReportView:
    ev, ch = a.events, a.changes
    rows = []
    for i in range(len(ev)):
        o = int(ev.object[i])
        rows.append(RowView(
            int(ev.seq[i]), int(ev.ts_ns[i]), int(ev.cpu[i]), int(ev.pid[i]), int(ev.tid[i]),
            ev.comms[int(ev.comm[i])], int(ev.function[i]), int(ev.phase[i]),
            int(ev.address[i]), int(ev.retval[i]) if ev.has_retval[i] else None,
            int(ev.flags[i]), int(ev.depth[i]), int(ev.caller[i]), int(ev.object_depth[i]),
            None if ev.duration_ns[i] == NO_DURATION else int(ev.duration_ns[i]),
            bool(ev.matched[i]), a.objects.keys[o] if o >= 0 else None,
            bool(ev.unreadable[i]), int(ev.function_row[i]), ev.args_text(i)))
    changes = []
    for k in range(len(ch.event)):
        e = int(ch.event[k])
        j = int(ch.field[k])
        fid = int(ch.function[k])
        c = ChangeView(a.layout.fields[j].name, a.values.decode_one(j, int(ch.old[k])),
                       a.values.decode_one(j, int(ch.new[k])), rows[e].seq,
                       rows[e].ts_ns - a.start_ns, rows[e].obj,
                       a.function_name(fid) if fid >= 0 else None, fid, a.cause(k),
                       a.function_name(rows[e].function_id), a.credited(k))
        changes.append(c)
        if rows[e].changes is None:
            rows[e].changes = []
        rows[e].changes.append(c)
    objects = []
    for o, key in enumerate(a.objects.keys):
        mine = a.objects.events(o).tolist()
        objects.append(ObjectView(
            key, a.objects.labels[o], a.objects.dirnames[o], a.objects.started_by[o],
            [rows[i] for i in mine], [changes[k] for k in a.objects.changes(o).tolist()],
            {name: list(zip(*points)) for name, points in a.series(o).items()},
            a.object_methods(o), int(a.objects.unreadable[o]), int(a.objects.head_only[o]),
            set(a.threads(o))))
    by_seq = [changes[k] for k in a.changes_by_seq().tolist()]
    return ReportView(a, objects, rows, by_seq)


def view_of(trace: Any) -> ReportView:
    """The analysis of ``trace`` (a `Trace` or a path), as Python objects."""
    return view(analysis.load(trace))
