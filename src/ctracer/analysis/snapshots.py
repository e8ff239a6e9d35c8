"""The table that compares each object's snapshots with its previous one.

The snapshots are one array of bytes (a row per event, `Trace.event_columns`);
`SnapshotTable` reads the fields straight out of it with the layout's numpy dtype,
never copying the whole table, and finds per field where each object's value differs
from its previous snapshot.
"""

from __future__ import annotations

from typing import Any, Optional

from ctracer.analysis.mapped import ArraySpace
from ctracer.analysis.memory import at_once
from ctracer.event import Layout

#: snapshots compared with their predecessors at a time
_COMPARED_AT_ONCE = 1 << 20


class SnapshotTable:
    """The readable snapshots of objects (the events at ``positions``, in time order),
    each knowing the one of its object's previous snapshot (`prev`, -1 for an object's
    first), and per field the ones where it differs from that previous snapshot
    (`changed_at`).  Indices 0..n-1 here are positions in ``positions``."""

    def __init__(self, layout: Layout, snapshots: Any, owners: Any, positions: Any,
                 partial: Optional[Any] = None, head_fields: frozenset[str] = frozenset(),
                 space: Optional[ArraySpace] = None):
        import numpy

        space = space or ArraySpace(None)
        self.full = (snapshots.reshape(-1).view(layout.numpy_dtype()) if layout.size
                     else numpy.zeros(len(snapshots), dtype=layout.numpy_dtype()))
        self.owner = owners
        self.position = positions
        n = len(self.owner)
        # an object's snapshots one after the other (stable: in time order), to find
        # each one's predecessor
        order = numpy.argsort(self.owner, kind="stable")
        starts = numpy.ones(n, dtype=bool)
        starts[1:] = self.owner[order][1:] != self.owner[order][:-1]
        self.prev = space.zeros(n, numpy.int64)
        self.prev[order[1:]] = order[:-1]
        self.prev[order[starts]] = -1
        self.first = self.prev < 0
        self.names = [f.name for f in layout.fields]
        self.array_kinds = {f.name: f.kind for f in layout.fields if f.ctype.startswith("char[")}
        #: per field outside the head: where it holds a value read (None: everywhere),
        #: and the snapshot whose value a head-only one carries over
        self.known: dict[int, Any] = {}
        self.source: Any = None
        if partial is not None:
            self._carry_over_unread(partial, order, starts, head_fields)
        del order, starts
        found: list[list[Any]] = [[] for _ in self.names]
        step = at_once(_COMPARED_AT_ONCE)
        for lo in range(0, n, step):  # a slice at a time: no n-sized temporaries
            self._compare(lo, min(n, lo + step), found)
        self.changed_at = [numpy.concatenate(parts) if parts else numpy.zeros(0, numpy.int64)
                           for parts in found]

    def _compare(self, lo: int, hi: int, found: list[list[Any]]) -> None:
        """Each field's changes among the snapshots ``lo..hi``."""
        import numpy

        later = lo + numpy.flatnonzero(~self.first[lo:hi])
        before = self.prev[later]
        at_later, at_before = self.position[later], self.position[before]
        if self.source is not None:
            carried = self.position[self.source[later]], self.position[self.source[before]]
        for j, name in enumerate(self.names):
            col = self.full[name]
            known = self.known.get(j)
            if known is None:
                differs = col[at_later] != col[at_before]
            else:  # a first value read after snapshots that read none is no change
                differs = (col[carried[0]] != col[carried[1]]) & known[before]
            found[j].append(later[differs])

    def _carry_over_unread(self, partial, order, starts, head_fields: frozenset[str]) -> None:
        """In snapshots that read only the head, each field outside it takes the value its
        object's last full read had (so nothing changes there, and the next read is
        compared with the last value read); `known` says where there was one."""
        import numpy

        n = len(partial)
        at = numpy.arange(n)
        group = numpy.maximum.accumulate(numpy.where(starts, at, 0))
        last = numpy.maximum.accumulate(numpy.where(~partial[order], at, -1))
        known_sorted = last >= group
        known = numpy.empty(n, dtype=bool)
        known[order] = known_sorted
        self.source = numpy.empty(n, dtype=numpy.int64)
        self.source[order] = order[numpy.where(known_sorted, last, at)]
        for j, name in enumerate(self.names):
            if name not in head_fields:
                self.known[j] = known

    def release(self) -> None:
        """Let the snapshots go (their buffer is freed unless someone else holds it);
        what was found (`prev`, `changed_at`, `owner`, `position`) stays."""
        self.full = None

    def value_known(self, j: int, rows: Any) -> Any:
        import numpy

        known = self.known.get(j)
        return numpy.ones(len(rows), bool) if known is None else known[rows]

    def column(self, j: int, rows: Any) -> Any:
        """Field ``j``'s raw values (the layout's numpy type) in the given snapshots."""
        if j in self.known:
            rows = self.source[rows]
        return self.full[self.names[j]][self.position[rows]]
