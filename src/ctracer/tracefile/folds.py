"""The trace file's table of calls folded by ``--calls changes`` (`ctracer.probes.folding`).

``folded_calls``: one row per (object address, function-table row, caller) and period
the recorder read the kernel's fold map in: how many calls of that function on that
object changed nothing, their summed and longest duration, the first one's entry and
the last one's exit (monotonic ns, as event times), and ``since_ns``: the time of
the object's last written event before them (0: unknown), which says which lifetime of
the address they belong to.  ``caller_id`` is the row of the
traced call they were made in on their thread (0: none) and ``caller_object`` its
object.  Rows of one key from several periods add up.

A trace recorded with ``--calls all`` (or before folding existed) has no such table;
readers treat its absence as "nothing folded".
"""

from __future__ import annotations

import sqlite3
from typing import Iterable

import numpy as np

SCHEMA = """
CREATE TABLE IF NOT EXISTS folded_calls(
    object INTEGER NOT NULL, function_id INTEGER NOT NULL, caller_id INTEGER NOT NULL,
    caller_object INTEGER NOT NULL, calls INTEGER NOT NULL, total_ns INTEGER NOT NULL,
    max_ns INTEGER NOT NULL, first_ns INTEGER NOT NULL, last_ns INTEGER NOT NULL,
    since_ns INTEGER NOT NULL);
"""

#: the columns, in the table's order, and their numpy types when read
COLUMNS = (("object", "<u8"), ("function_id", "<i4"), ("caller_id", "<i4"),
           ("caller_object", "<u8"), ("calls", "<i8"), ("total_ns", "<i8"),
           ("max_ns", "<i8"), ("first_ns", "<i8"), ("last_ns", "<i8"), ("since_ns", "<i8"))


def _signed(v: int) -> int:
    """An unsigned 64-bit value as SQLite's signed integer."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def create(db: sqlite3.Connection) -> None:
    """Create the ``folded_calls`` table in ``db``."""
    db.executescript(SCHEMA)


def add(db: sqlite3.Connection, rows: Iterable[tuple[int, ...]]) -> int:
    """Insert rows (in `COLUMNS` order; not committed); how many."""
    out = [tuple(_signed(int(v)) for v in row) for row in rows]
    if out:
        db.executemany("INSERT INTO folded_calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", out)
    return len(out)


def read(db: sqlite3.Connection) -> dict[str, np.ndarray]:
    """The table as columns (empty columns when the trace has none)."""
    found = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                       "name = 'folded_calls'").fetchone()
    rows = db.execute("SELECT * FROM folded_calls").fetchall() if found else []
    raw = np.array(rows, dtype=np.int64).reshape(len(rows), len(COLUMNS))
    return {name: raw[:, k].astype(dtype) for k, (name, dtype) in enumerate(COLUMNS)}
