"""Calls folded by ``--calls changes`` (`ctracer.probes.folding`), placed on objects.

The trace file's ``folded_calls`` (`ctracer.tracefile.folds`) counts, per object
address, function, caller and last written event of the object, the calls that
changed nothing and were never written as events.  `place` gives each row the object
(one lifetime of its address) of that last written event (of the address's last event
up to that time; its first one when none came before), so a folded call adds to the
same object its written neighbours are on.  Rows of addresses no written event has are left
out (`Folded.unplaced` counts their calls).

What each number means: `Folded.calls` calls of `Folded.function` on
`Folded.object`, made inside a traced call of `Folded.caller` on its thread (`ROOT`
-1: none); `Folded.same_object` when that caller's call was on the same object (the
edge of the object's own call graph; otherwise the folded calls hang from the object's
root there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ROOT = -1


@dataclass
class Folded:
    """The folded calls placed on objects, one array per column (`place`)."""

    object: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    function: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    caller: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    same_object: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    calls: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    total_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    max_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: calls of rows whose address no written event has
    unplaced: int = 0

    def __len__(self) -> int:
        return len(self.calls)

    @property
    def total_calls(self) -> int:
        """The folded calls placed, summed."""
        return int(self.calls.sum())

    def of_object(self, i: int) -> np.ndarray:
        """The rows placed on object ``i``."""
        return np.flatnonzero(self.object == i)

    def per_function(self, rows: np.ndarray) -> dict[int, tuple[int, int, int]]:
        """(calls, summed ns, longest ns) by function among ``rows``."""
        out: dict[int, tuple[int, int, int]] = {}
        for f, n, t, m in zip(self.function[rows].tolist(), self.calls[rows].tolist(),
                              self.total_ns[rows].tolist(), self.max_ns[rows].tolist()):
            c, s, x = out.get(f, (0, 0, 0))
            out[f] = (c + n, s + t, max(x, m))
        return out


def _canonical(ids: np.ndarray, canon: dict[int, int]) -> np.ndarray:
    if not canon or not len(ids):
        return ids.astype(np.int64)
    table = np.arange(max(max(canon), int(ids.max())) + 1, dtype=np.int64)
    for k, v in canon.items():
        table[k] = v
    return table[ids]


def place(table: dict[str, np.ndarray], address: np.ndarray, ts_ns: np.ndarray,
          obj: np.ndarray, canon: dict[int, int]) -> Folded:
    """The rows of ``table`` (`ctracer.tracefile.folds.read`) on the objects of the
    events whose ``address``, ``ts_ns`` and ``obj`` columns are given."""
    n = len(table["calls"])
    if not n:
        return Folded()
    has = obj >= 0
    ev_addr = address[has].astype(np.uint64)
    ev_ts, ev_obj = ts_ns[has].astype(np.int64), obj[has].astype(np.int64)
    order = np.lexsort((ev_ts, ev_addr))
    ev_addr, ev_ts, ev_obj = ev_addr[order], ev_ts[order], ev_obj[order]
    row_addr = table["object"].astype(np.uint64)
    row_ts = np.where(table["since_ns"] > 0, table["since_ns"], table["first_ns"])
    lo = np.searchsorted(ev_addr, row_addr, side="left")
    hi = np.searchsorted(ev_addr, row_addr, side="right")
    placed = np.full(n, -1, np.int64)
    for k in np.flatnonzero(hi > lo).tolist():
        a, b = int(lo[k]), int(hi[k])
        at = a + int(np.searchsorted(ev_ts[a:b], row_ts[k], side="right")) - 1
        placed[k] = ev_obj[max(at, a)]
    ok = placed >= 0
    fn = _canonical(table["function_id"], canon)
    caller_id = table["caller_id"]
    caller = np.where(caller_id > 0, _canonical(caller_id, canon), ROOT)
    same = (caller_id > 0) & (table["caller_object"] == table["object"])
    return _merged(Folded(placed[ok], fn[ok], caller[ok], same[ok], table["calls"][ok],
                          table["total_ns"][ok], table["max_ns"][ok],
                          int(table["calls"][~ok].sum())))


def _merged(f: Folded) -> Folded:
    """One row per (object, function, caller, same object), in order of first row."""
    if not len(f):
        return f
    keys = np.stack([f.object, f.function, f.caller, f.same_object.astype(np.int64)], 1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(first, kind="stable")        # groups in order of first row
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    group = rank[inverse]
    n = len(order)
    at = first[order]
    maxes = np.zeros(n, np.int64)
    np.maximum.at(maxes, group, f.max_ns)
    return Folded(f.object[at], f.function[at], f.caller[at], f.same_object[at],
                  np.bincount(group, weights=f.calls, minlength=n).astype(np.int64),
                  np.bincount(group, weights=f.total_ns, minlength=n).astype(np.int64),
                  maxes, f.unplaced)
