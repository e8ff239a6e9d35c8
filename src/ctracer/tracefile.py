"""The trace file: a versioned SQLite database that carries everything needed to render.

Tables:

* ``meta(key, value)``: schema version, the traced struct, its mini layout (JSON of
  `ctracer.event.Layout`), the full struct layout as text, host, kernel release, argv,
  start/end times, event and lost counts;
* ``functions``: the probed functions, how each reaches the object (``reach``/``via``),
  and whether its probes attached;
* ``events``: one row per probe hit, the header decoded into columns and the mini
  snapshot kept as raw bytes (decoded with the layout in ``meta``).

The writer commits in batches so an interrupted recording keeps what it had; the
reader (`Trace`) is all the report stage needs, so a trace recorded on one machine
renders on another.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

from ctracer.errors import TraceFileError
from ctracer.event import FLAG_READ_FAILED, Layout

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE functions(
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    unit TEXT,
    reach TEXT NOT NULL,
    via TEXT,
    address INTEGER,
    attached TEXT
);
CREATE TABLE events(
    seq INTEGER PRIMARY KEY,
    ts_ns INTEGER NOT NULL,
    cpu INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    comm TEXT,
    function_id INTEGER NOT NULL REFERENCES functions(id),
    phase INTEGER NOT NULL,
    object INTEGER NOT NULL,
    retval INTEGER,
    depth INTEGER NOT NULL,
    flags INTEGER NOT NULL,
    snapshot BLOB
);
CREATE INDEX events_by_object ON events(object, seq);
"""

_U64 = 1 << 64


def to_sql_u64(v: Optional[int]) -> Optional[int]:
    """SQLite integers are signed 64-bit; store u64 addresses in two's complement."""
    if v is None:
        return None
    return v - _U64 if v >= 1 << 63 else v


def _from_sql_u64(v: Optional[int]) -> Optional[int]:
    if v is None:
        return None
    return v + _U64 if v < 0 else v


@dataclass(frozen=True)
class FunctionRow:
    id: int
    name: str
    unit: str = ""
    reach: str = "direct"  # direct | alias | holder | double_pointer | returns | tracepoint
    via: str = ""          # e.g. "struct inet_sock", "socket->sk", "param 2"
    address: Optional[int] = None
    attached: str = ""     # "entry,exit", or why not


@dataclass(frozen=True)
class Event:
    seq: int
    ts_ns: int
    cpu: int
    pid: int
    tid: int
    comm: str
    function_id: int
    phase: int  # ctracer.event.PHASE_ENTRY / PHASE_EXIT
    object: int
    retval: Optional[int]
    depth: int
    flags: int
    snapshot: Optional[bytes]


class TraceWriter:
    """Creates a trace file and appends to it; commit happens every ``batch`` events."""

    def __init__(self, path: str, batch: int = 2000):
        self.path = path
        if os.path.exists(path):
            os.unlink(path)
        try:
            self.db = sqlite3.connect(path)
        except sqlite3.Error as e:
            raise TraceFileError(f"cannot create trace file {path}: {e}") from None
        self.db.executescript(_SCHEMA)
        self.batch = batch
        self._pending: list[tuple] = []
        self.events_written = 0
        self.set_meta(schema_version=SCHEMA_VERSION)

    def set_meta(self, **items: Any) -> None:
        rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in items.items()]
        self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows)
        self.db.commit()

    def add_functions(self, rows: Iterable[FunctionRow]) -> None:
        self.db.executemany(
            "INSERT OR REPLACE INTO functions VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(r.id, r.name, r.unit, r.reach, r.via, to_sql_u64(r.address), r.attached)
             for r in rows])
        self.db.commit()

    def add_event(self, ts_ns: int, cpu: int, pid: int, tid: int, comm: str,
                  function_id: int, phase: int, object: int, retval: Optional[int],
                  depth: int, flags: int, snapshot: Optional[bytes]) -> None:
        self._pending.append((ts_ns, cpu, pid, tid, comm, function_id, phase,
                              to_sql_u64(object), retval, depth, flags, snapshot))
        if len(self._pending) >= self.batch:
            self.flush()

    def add_events(self, rows: Iterable[tuple]) -> None:
        """Many events at once, each a tuple in `add_event`'s parameter order with the
        object already converted by `to_sql_u64` (the recorder's fast path)."""
        self._pending.extend(rows)
        if len(self._pending) >= self.batch:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self.db.executemany(
                "INSERT INTO events(ts_ns, cpu, pid, tid, comm, function_id, phase, object,"
                " retval, depth, flags, snapshot) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                self._pending)
            self.events_written += len(self._pending)
            self._pending.clear()
        self.db.commit()

    def close(self) -> None:
        self.flush()
        self.db.close()


class Trace:
    """A trace file opened for reading."""

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise TraceFileError(f"no trace file at {path}")
        try:
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            rows = self.db.execute("SELECT key, value FROM meta").fetchall()
        except sqlite3.Error:
            raise TraceFileError(f"{path} is not a ctracer trace file") from None
        self.path = path
        self.meta: dict[str, str] = dict(rows)
        version = self.meta.get("schema_version")
        if version != str(SCHEMA_VERSION):
            raise TraceFileError(
                f"{path} has trace schema {version}, this ctracer reads {SCHEMA_VERSION}")
        if "mini_layout" not in self.meta or "struct_name" not in self.meta:
            raise TraceFileError(f"{path} was never completed: no struct layout in it")
        self.mini = Layout.from_json(self.meta["mini_layout"])
        self.functions: dict[int, FunctionRow] = {
            r[0]: FunctionRow(r[0], r[1], r[2] or "", r[3], r[4] or "", _from_sql_u64(r[5]),
                              r[6] or "")
            for r in self.db.execute("SELECT * FROM functions")}

    @property
    def struct_name(self) -> str:
        return self.meta["struct_name"]

    @property
    def struct_kind(self) -> str:
        return self.meta.get("struct_kind", "struct")

    def meta_json(self, key: str, default: Any = None) -> Any:
        v = self.meta.get(key)
        return default if v is None else json.loads(v)

    def events(self, object: Optional[int] = None) -> Iterator[Event]:
        """Events in recording order, optionally only those of one object address."""
        sql = "SELECT * FROM events"
        args: tuple = ()
        if object is not None:
            sql += " WHERE object = ?"
            args = (to_sql_u64(object),)
        for r in self.db.execute(sql + " ORDER BY seq", args):
            yield Event(r[0], r[1], r[2], r[3], r[4], r[5] or "", r[6], r[7],
                        _from_sql_u64(r[8]), r[9], r[10], r[11], r[12])

    def values(self, event: Event) -> Optional[dict[str, Any]]:
        """The decoded mini snapshot of an event, None when the object was unreadable."""
        if event.snapshot is None or event.flags & FLAG_READ_FAILED:
            return None
        return self.mini.decode(event.snapshot)

    def event_count(self) -> int:
        return self.db.execute("SELECT count(*) FROM events").fetchone()[0]

    def objects(self) -> list[tuple[int, int]]:
        """(object address, event count), most events first."""
        return [(_from_sql_u64(o), n) for o, n in self.db.execute(
            "SELECT object, count(*) FROM events GROUP BY object ORDER BY count(*) DESC, object")]

    def close(self) -> None:
        self.db.close()
