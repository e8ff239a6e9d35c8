"""The events' snapshots held in one buffer, and the table that compares each object's
snapshots with its previous one.

A kernel trace of a million events of `struct sock` carries 400 MB of snapshots: as a
million bytes objects they cost more than their bytes and must be joined again to be
compared.  `SnapshotColumn` keeps them back to back from the start; `SnapshotTable`
reads the fields straight out of it with numpy, never copying the whole table.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ctracer.event import Layout, array_value


class SnapshotColumn:
    """Every event's snapshot in event order, ``size`` bytes each back to back (zeros
    where the event has none); an element reads back as bytes, or None where there was
    no snapshot."""

    def __init__(self, size: int):
        self.size = size
        self.data = bytearray()
        #: 1 where the event has a snapshot
        self.present = bytearray()
        self._zero = bytes(size)

    def append(self, snapshot: Optional[bytes]) -> None:
        if snapshot is None:
            self.data += self._zero
            self.present.append(0)
            return
        if len(snapshot) != self.size:  # a valid trace has none: its rows are checked
            snapshot = bytes(snapshot[:self.size]).ljust(self.size, b"\0")
        self.data += snapshot
        self.present.append(1)

    def __len__(self) -> int:
        return len(self.present)

    def __getitem__(self, i: int) -> Optional[bytes]:
        if not self.present[i]:
            return None
        start = (i if i >= 0 else len(self) + i) * self.size
        return bytes(self.data[start:start + self.size])

    def select(self, keep: Sequence[int]) -> "SnapshotColumn":
        """The snapshots of the events at ``keep``, in that order."""
        import numpy

        out = SnapshotColumn(self.size)
        at = numpy.asarray(keep, dtype=numpy.int64)
        if self.size:
            rows = numpy.frombuffer(self.data, dtype=numpy.uint8).reshape(-1, self.size)
            out.data = bytearray(rows[at].tobytes())
        out.present = bytearray(numpy.frombuffer(self.present, dtype=numpy.uint8)[at]
                                .tobytes())
        return out

    def table(self, layout: Layout) -> Any:
        """Every event's snapshot decoded as one numpy record array (a view)."""
        import numpy

        return numpy.frombuffer(self.data, dtype=layout.numpy_dtype()) if self.size else \
            numpy.zeros(len(self), dtype=layout.numpy_dtype())

    def present_mask(self) -> Any:
        import numpy

        return numpy.frombuffer(self.present, dtype=numpy.uint8).astype(bool)


class SnapshotTable:
    """The readable snapshots of objects (the events at ``positions``, in time order),
    each knowing the one of its object's previous snapshot (`prev`, -1 for an object's
    first), and per field the ones where it differs from that previous snapshot
    (`changed_at`).  Indices 0..n-1 here are positions in ``positions``."""

    def __init__(self, layout: Layout, column: SnapshotColumn, owners: Sequence[int],
                 positions: Sequence[int], partial: Optional[Sequence[int]] = None,
                 head_fields: frozenset[str] = frozenset()):
        import numpy

        self.full = column.table(layout)
        self.owner = numpy.frombuffer(owners, dtype=numpy.int64)
        self.position = numpy.frombuffer(positions, dtype=numpy.int64)
        n = len(self.owner)
        # an object's snapshots one after the other (stable: in time order), to find
        # each one's predecessor
        order = numpy.argsort(self.owner, kind="stable")
        starts = numpy.ones(n, dtype=bool)
        starts[1:] = self.owner[order][1:] != self.owner[order][:-1]
        self.prev = numpy.empty(n, dtype=numpy.int64)
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
            self._carry_over_unread(numpy.frombuffer(partial, dtype=numpy.int8) != 0,
                                    order, starts, head_fields)
        later = numpy.flatnonzero(~self.first)
        before = self.prev[later]
        at_later, at_before = self.position[later], self.position[before]
        if self.source is not None:
            carried = self.position[self.source[later]], self.position[self.source[before]]
        self.changed_at = []
        for j, name in enumerate(self.names):
            col = self.full[name]
            known = self.known.get(j)
            if known is None:
                differs = col[at_later] != col[at_before]
            else:  # a first value read after snapshots that read none is no change
                differs = (col[carried[0]] != col[carried[1]]) & known[before]
            self.changed_at.append(later[differs])

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

    def value_known(self, j: int, rows: Any) -> list[bool]:
        known = self.known.get(j)
        return [True] * len(rows) if known is None else known[rows].tolist()

    def values(self, j: int, rows: Any) -> list[Any]:
        """Python values of field ``j`` in the given snapshots."""
        name = self.names[j]
        if j in self.known:
            rows = self.source[rows]
        vals = self.full[name][self.position[rows]].tolist()
        kind = self.array_kinds.get(name)
        if kind is not None:
            vals = [array_value(kind, v) for v in vals]
        return vals
