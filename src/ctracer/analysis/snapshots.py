"""Each object's snapshots compared with its previous one, a slice of events at a time.

The snapshots are one array of bytes (a row per event, `Trace.event_columns`), in a
mapped file for a big trace.  `SnapshotStream` takes the readable snapshots in time
order, a slice at a time: it finds each one's predecessor of the same object (carried
over from earlier slices per object, never an array over every snapshot), copies the
slice's rows and their predecessors' once (whole rows, read in one pass over the
mapped pages), and compares them field by field.  A trace of few objects with millions
of snapshots each (a kernel trace) so never holds more than a slice's rows, however
many snapshots and changes it has: comparing one field at a time over every snapshot
read every page of the snapshots once per field, which under a memory limit smaller
than the snapshots read them from disk a hundred times.

Values become codes (`FieldValues`).  Char array fields get their codes in the order
the whole trace would give them (each object's first values, then every old value,
then every new one, each set in sorted order): `SnapshotStream.finish` maps the codes
given slice by slice to those (`text_codes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ctracer.event import Layout, array_value

#: snapshots compared at a time (their rows and their predecessors' copied: ~100 MB of
#: 408-byte kernel snapshots, read-only partial ones counted twice)
COMPARED_AT_ONCE = 1 << 16


@dataclass
class SliceChanges:
    """The changes one slice showed, in order of snapshot then field: ``at`` indexes
    the slice's snapshots, ``old``/``new`` are value codes (char arrays: provisional,
    see `SnapshotStream.finish`)."""

    at: np.ndarray
    field: np.ndarray
    old: np.ndarray
    new: np.ndarray


class SnapshotStream:
    """Compares snapshots slice by slice (`compare`), in time order; per object the
    state the next slice needs: its last snapshot's row, and for snapshots that read
    only the object's head (``partial``), the row whose values the fields outside the
    head carry over (its last full read) and whether there was one."""

    def __init__(self, layout: Layout, snapshots: Any, n_objects: int, values: Any,
                 head_fields: Optional[frozenset[str]] = None):
        """``head_fields``: the fields a head-only snapshot holds, when the trace has
        head-only snapshots (None: it has none, or they need no care)."""
        self.layout, self.values = layout, values
        self.full = (snapshots.reshape(-1).view(layout.numpy_dtype()) if layout.size
                     else np.zeros(len(snapshots), dtype=layout.numpy_dtype()))
        self.names = [f.name for f in layout.fields]
        #: fields outside the head (they carry over in head-only snapshots); None: no
        #: head-only snapshots to care about (`compare` then takes no ``partial``)
        self.carried = None if head_fields is None else \
            [j for j, n in enumerate(self.names) if n not in head_fields]
        self.last = np.full(n_objects, -1, np.int64)       # its last snapshot's row
        self.last_source = np.full(n_objects, -1, np.int64)  # that one's carried row
        self.last_known = np.zeros(n_objects, bool)          # ... and whether it had one
        self.last_full = np.full(n_objects, -1, np.int64)    # its last full read's row
        self.texts = {j: _TextCodes() for j, f in enumerate(layout.fields)
                      if self.full.dtype[f.name].kind == "S"}

    def compare(self, rows: np.ndarray, owners: np.ndarray,
                partial: Optional[np.ndarray]) -> tuple[np.ndarray, "SliceChanges", dict]:
        """The snapshots at ``rows`` (ascending) of objects ``owners``; ``partial``: which
        read only the head (None: none did).  Returns which are their object's first
        snapshot (positions in the slice), the slice's changes, and per field the codes
        of the first snapshots' values and whether they were read."""
        m = len(rows)
        order = np.argsort(owners, kind="stable")
        so, rs = owners[order], rows[order]
        starts = np.ones(m, bool)
        starts[1:] = so[1:] != so[:-1]
        ends = np.r_[starts[1:], True] if m else starts
        prev = np.empty(m, np.int64)
        prev_sorted = np.empty(m, np.int64)
        prev_sorted[1:] = rs[:-1]
        prev_sorted[starts] = self.last[so[starts]]
        prev[order] = prev_sorted
        carry = self.carried is not None
        if carry:
            source, known, prev_source, prev_known = self._sources(order, so, rs, starts, ends,
                                                                    partial)
        self.last[so[ends]] = rs[ends]
        if carry:
            self.last_source[so[ends]] = source[order][ends]
            self.last_known[so[ends]] = known[order][ends]
        firsts = np.flatnonzero(prev < 0)
        later = np.flatnonzero(prev >= 0)
        now, before = self.full[rows[later]], self.full[prev[later]]
        if carry:
            now_carried, before_carried = self.full[source[later]], self.full[prev_source[later]]
            was_known = prev_known[later]
            carried = set(self.carried)
        ats, fields, olds, news = [], [], [], []
        initial: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        first_rows = self.full[rows[firsts]] if len(firsts) else None
        first_carried = self.full[source[firsts]] if carry and len(firsts) else first_rows
        for j, name in enumerate(self.names):
            if carry and j in carried:
                a, b = now_carried[name], before_carried[name]
                differs = (a != b) & was_known
            else:
                a, b = now[name], before[name]
                differs = a != b
            if len(firsts):
                values = (first_carried if carry and j in carried else first_rows)[name]
                read = known[firsts] if carry and j in carried else np.ones(len(firsts), bool)
                initial[j] = (self._encode(j, values, "initial"), read)
            picked = np.flatnonzero(differs)
            if not len(picked):
                continue
            ats.append(later[picked])
            fields.append(np.full(len(picked), j, np.int32))
            olds.append(self._encode(j, b[picked], "old"))
            news.append(self._encode(j, a[picked], "new"))
        if not ats:
            return firsts, SliceChanges(np.zeros(0, np.int64), np.zeros(0, np.int32),
                                        np.zeros(0, np.int64), np.zeros(0, np.int64)), initial
        at = np.concatenate(ats)
        by_snapshot = np.argsort(at, kind="stable")  # fields were laid down in order
        return firsts, SliceChanges(at[by_snapshot], np.concatenate(fields)[by_snapshot],
                                    np.concatenate(olds)[by_snapshot],
                                    np.concatenate(news)[by_snapshot]), initial

    def _sources(self, order, so, rs, starts, ends, partial):
        """Per snapshot of the slice (slice order): the row whose values its fields
        outside the head carry (its object's last full read, itself when there was none)
        and whether there was one; the same for its predecessor."""
        m = len(rs)
        at = np.arange(m)
        group = np.maximum.accumulate(np.where(starts, at, 0)) if m else at
        full_read = ~partial[order]
        last = np.maximum.accumulate(np.where(full_read, at, -1)) if m else at
        inside = last >= group
        carried_in = self.last_full[so]
        known_sorted = inside | (carried_in >= 0)
        source_sorted = np.where(inside, rs[np.maximum(last, 0)],
                                 np.where(carried_in >= 0, carried_in, rs))
        # the predecessor's: the one before in the group, or the object's last one
        prev_source_sorted = np.empty(m, np.int64)
        prev_known_sorted = np.empty(m, bool)
        prev_source_sorted[1:], prev_known_sorted[1:] = source_sorted[:-1], known_sorted[:-1]
        prev_source_sorted[starts] = self.last_source[so[starts]]
        prev_known_sorted[starts] = self.last_known[so[starts]]
        # the objects' last full reads, for the slices after this one
        reads = ends & inside
        self.last_full[so[reads]] = rs[last[reads]]
        source, known = np.empty(m, np.int64), np.empty(m, bool)
        prev_source, prev_known = np.empty(m, np.int64), np.empty(m, bool)
        source[order], known[order] = source_sorted, known_sorted
        prev_source[order], prev_known[order] = prev_source_sorted, prev_known_sorted
        return source, known, prev_source, prev_known

    def _encode(self, j: int, column: np.ndarray, kind: str) -> np.ndarray:
        texts = self.texts.get(j)
        if texts is None:
            return self.values.encode(j, column)
        return texts.provisional(column, kind)

    def text_codes(self) -> dict[int, np.ndarray]:
        """Per char array field, the final code (`FieldValues`) of each provisional one,
        given in the order the whole trace's values would have been: the first values,
        then every old value, then every new one, each set sorted."""
        out = {}
        for j, texts in self.texts.items():
            kind = self.layout.fields[j].kind
            final = np.zeros(len(texts.raw), np.int64)
            for which in ("initial", "old", "new"):
                seen = texts.seen[which]
                if not seen:
                    continue
                uniques = np.unique(np.concatenate(seen))
                for u in uniques.tolist():
                    final[texts.raw[u]] = self.values.text_code(j, array_value(kind, u))
            out[j] = final
        return out


class _TextCodes:
    """A char array field's values given provisional codes as they come (by their
    bytes), and the distinct values seen as first, old and new values."""

    def __init__(self) -> None:
        self.raw: dict[bytes, int] = {}
        self.seen: dict[str, list[np.ndarray]] = {"initial": [], "old": [], "new": []}

    def provisional(self, column: np.ndarray, kind: str) -> np.ndarray:
        uniques, inverse = np.unique(column, return_inverse=True)
        if not len(uniques):
            return np.zeros(0, np.int64)
        self.seen[kind].append(uniques)
        raw = self.raw
        codes = np.array([raw.setdefault(u, len(raw)) for u in uniques.tolist()], np.int64)
        return codes[inverse.reshape(-1)]
