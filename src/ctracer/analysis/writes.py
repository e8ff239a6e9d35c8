"""The writes ``--watch`` recorded, joined to the objects and changes of an analysis.

Every write is placed in the object (lifetime) of its address whose events span its
time (the latest lifetime begun by then).  A change of a watched field, found between
two snapshots of an object, is explained by the writes to that field in between: the
last of them wrote the value the later snapshot shows (its **writer**: the instruction,
its source line, the call stack that led there).  Per field, the writing lines are
ranked by writes (`FieldWriters`): the field's writers, the changes they made and the
writes that left the value as it was.
"""

from __future__ import annotations

import bisect
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ctracer.tracefile import writes as table
from ctracer.tracefile.writes import Site, Write


@dataclass(frozen=True)
class Writer:
    """Who made a change: the last write in its window and how many there were."""

    write: int          # index into `WriteView.writes`
    writes: int         # writes to the field between the two snapshots


@dataclass
class WriteView:
    """The writes ``--watch`` recorded, their call sites, each write's object and each
    explained change's writer."""

    writes: list[Write]
    sites: dict[tuple[int, int, str], Site]
    kernel: bool
    #: each write's object (index into the analysis' objects), -1 when none spans it
    object_of: list[int] = field(default_factory=list)
    #: change position -> its writer
    writer_of: dict[int, Writer] = field(default_factory=dict)
    fields: list[str] = field(default_factory=list)

    def _pid(self, w: Write) -> int:
        return 0 if self.kernel else w.pid

    def writer_site(self, i: int) -> Optional[Site]:
        """Where write ``i``'s instruction is (None: not resolved)."""
        w = self.writes[i]
        return self.sites.get((self._pid(w), w.ip, "writer"))

    def writer_label(self, i: int) -> str:
        """Write ``i``'s instruction as ``file:line in fn``, else its address."""
        site = self.writer_site(i)
        return site.label if site is not None else f"{self.writes[i].ip:#x}"

    def callers(self, i: int) -> list[str]:
        """The call stack above the writer, innermost first (function names, or
        ``file:line in fn`` where lines are known)."""
        w = self.writes[i]
        out = []
        for a in w.stack[1:]:
            if not a:
                continue
            site = self.sites.get((self._pid(w), a, "caller"))
            out.append(f"{a:#x}" if site is None else site.inlined or site.function
                       or site.where)
        return out

    def described(self, i: int) -> str:
        """``file:line in fn, called from a → b`` (callers outermost first)."""
        chain = list(reversed(self.callers(i)))
        called = f", called from {' → '.join(chain)}" if chain else ""
        return f"{self.writer_label(i)}{called}"

    def of_object(self, o: int) -> list[int]:
        """The writes placed on object ``o``."""
        return [i for i, x in enumerate(self.object_of) if x == o]


@dataclass(frozen=True)
class FieldWriters:
    """One writing line of a field: how many writes, changes and unchanged writes."""

    label: str
    writes: int
    changed: int
    unchanged: int
    example: int        # a write of it (index), for its call stack


def load(analysis) -> Optional[WriteView]:
    """The writes of the analysed trace (None when it was recorded without --watch)."""
    path = getattr(analysis, "trace_path", "")
    plan = analysis.meta.watch_plan if path else None
    if plan is None:
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows, sites = table.read_writes(db), table.read_sites(db)
    finally:
        db.close()
    view = WriteView(rows, sites, analysis.meta.traced == "kernel", fields=plan.fields)
    _place(view, analysis)
    _explain_changes(view, analysis)
    return view


def _place(view: WriteView, a) -> None:
    """Each write's object: of the lifetimes of its address, the latest begun by the
    write's time (the first one when the write came before any event of it)."""
    ts = a.events.ts_ns
    lifetimes: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for o, key in enumerate(a.objects.keys):
        rows = a.objects.events(o)
        if len(rows):
            lifetimes[key.address].append((int(ts[rows[0]]), o))
    for spans in lifetimes.values():
        spans.sort()
    for w in view.writes:
        spans = lifetimes.get(w.object)
        if not spans:
            view.object_of.append(-1)
            continue
        at = bisect.bisect_right(spans, (w.ts_ns, 1 << 62)) - 1
        view.object_of.append(spans[max(at, 0)][1])


def _explain_changes(view: WriteView, a) -> None:
    """The writer of each change of a watched field: the last write to it between the
    object's snapshot before the change and the one showing it."""
    names = [f.name for f in a.layout.fields]
    watched = {names.index(f) for f in view.fields if f in names}
    if not watched or not len(a.changes):
        return
    by_key: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for i, (w, o) in enumerate(zip(view.writes, view.object_of)):
        if o >= 0:
            by_key[(o, w.field)].append((w.ts_ns, i))
    ts, obj = a.events.ts_ns, a.events.object
    for k in np.flatnonzero(np.isin(a.changes.field, list(watched))).tolist():
        e = int(a.changes.event[k])
        o = int(obj[e])
        found = by_key.get((o, names[int(a.changes.field[k])]))
        if not found:
            continue
        rows = a.objects.events(o)
        at = int(np.searchsorted(rows, e))
        before = int(ts[rows[at - 1]]) if at > 0 else -1
        now = int(ts[e])
        lo = bisect.bisect_right(found, (before, 1 << 62))
        hi = bisect.bisect_right(found, (now, 1 << 62))
        changing = [i for _, i in found[lo:hi] if not view.writes[i].unchanged]
        if changing:
            view.writer_of[k] = Writer(changing[-1], hi - lo)


def field_writers(view: WriteView, name: str, writes: Optional[list[int]] = None
                  ) -> list[FieldWriters]:
    """The writing lines of field ``name`` (of the writes at ``writes``, default all),
    most writes first."""
    counts: Counter = Counter()
    changed: Counter = Counter()
    same: Counter = Counter()
    example: dict[str, int] = {}
    for i in (range(len(view.writes)) if writes is None else writes):
        w = view.writes[i]
        if w.field != name:
            continue
        label = view.writer_label(i)
        counts[label] += 1
        example.setdefault(label, i)
        if w.unchanged:
            same[label] += 1
        elif w.old is not None:
            changed[label] += 1
    return [FieldWriters(label, n, changed[label], same[label], example[label])
            for label, n in counts.most_common()]
