"""The trace file's tables of ``--watch``: every trapped write, the arming of each
watched object, and where the writing instructions and their callers are.

* ``watch_writes``: one row a write: time, CPU, process, thread, the object and the
  field written, the word's offset and length, the trap's ip (just after the writing
  instruction), the field's value after the write and before it (None when unknown:
  the first write after arming on a kernel object), ``unchanged`` (the write stored the
  value the field held), and the call stack's return addresses (JSON).
* ``watch_arms``: one row an object's arming: when it was admitted (its first event),
  when its breakpoints were armed and moved away, its writes, and why it was left.
* ``watch_sites``: where a code address is (``kind`` writer: the instruction ending at
  a trap ip; caller: the call before a return address): function + offset, source
  file:line, the inlined function around it, the ELF file (program, library, vmlinux).

These tables are beside the events (the event layout is untouched): a trace without
``--watch`` has none of them, and readers treat their absence as "no writes".
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Iterable, Optional

SCHEMA = """
CREATE TABLE IF NOT EXISTS watch_writes(
    seq INTEGER PRIMARY KEY, ts_ns INTEGER NOT NULL, cpu INTEGER, pid INTEGER, tid INTEGER,
    object INTEGER NOT NULL, field TEXT NOT NULL, word_offset INTEGER, length INTEGER,
    ip INTEGER, value INTEGER, old INTEGER, unchanged INTEGER, stack TEXT);
CREATE TABLE IF NOT EXISTS watch_arms(
    object INTEGER NOT NULL, pid INTEGER, admitted_ns INTEGER, armed_ns INTEGER,
    disarmed_ns INTEGER, writes INTEGER, ended TEXT);
CREATE TABLE IF NOT EXISTS watch_sites(
    pid INTEGER NOT NULL, address INTEGER NOT NULL, kind TEXT NOT NULL, function TEXT,
    offset INTEGER, file TEXT, line INTEGER, inlined TEXT, module TEXT, inlined_from TEXT,
    PRIMARY KEY(pid, address, kind));
"""


def _sql(v: Optional[int]) -> Optional[int]:
    """An unsigned 64-bit value as SQLite's signed integer."""
    if v is None:
        return None
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _u64(v: Optional[int]) -> Optional[int]:
    return None if v is None else v & ((1 << 64) - 1)


def create(db: sqlite3.Connection) -> None:
    """Create the tables of ``--watch``'s writes, arms and sites in ``db``."""
    db.executescript(SCHEMA)


@dataclass(frozen=True)
class Write:
    """One write a breakpoint trapped: when, where (object, field, word), the instruction,
    the value written and the one before, and its call stack."""

    ts_ns: int
    cpu: int
    pid: int
    tid: int
    object: int
    field: str
    word_offset: int
    length: int
    ip: int
    value: Optional[int]
    old: Optional[int]
    unchanged: bool
    stack: tuple[int, ...]


@dataclass(frozen=True)
class Arm:
    """One object's time under watch: when admitted, armed and disarmed, its writes and
    why it ended."""

    object: int
    pid: int
    admitted_ns: int
    armed_ns: int
    disarmed_ns: Optional[int]
    writes: int
    ended: str


@dataclass(frozen=True)
class Site:
    """An instruction address resolved to its function, source line and inlining."""

    pid: int
    address: int
    kind: str
    function: Optional[str]
    offset: int
    file: Optional[str]
    line: Optional[int]
    inlined: str
    module: str
    #: where ``inlined`` was inlined, and each outer inlined function, innermost first
    #: (``file:line in fn, ...``); "" when not inlined or not known (a trace before it)
    inlined_from: str = ""

    @property
    def where(self) -> str:
        if self.function:
            return f"{self.function}+{self.offset:#x}"
        return f"{self.module}+{self.offset:#x}" if self.module else f"{self.address:#x}"

    @property
    def source(self) -> str:
        """``file:line`` ("" when unknown)."""
        return f"{self.file}:{self.line}" if self.file and self.line else ""

    @property
    def label(self) -> str:
        """How the report names it: ``file:line in fn`` where a line table said,
        else ``function+offset``; a line of an inlined function says where in the
        function it was inlined (``inlined in fn+0x31``: one helper inlined at several
        places of a function is one line, but several writers) and, where DWARF says,
        at which lines (``at tcp_input.c:3531 in tcp_clean_rtx_queue, ...``)."""
        fn = self.inlined or self.function or f"{self.address:#x}"
        if self.source:
            inside = f" (inlined in {self.where}" + (
                f" at {self.inlined_from})" if self.inlined_from else ")") \
                if self.inlined and self.function and self.inlined != self.function else ""
            return f"{self.source} in {fn}{inside}"
        return self.where


def add_writes(db: sqlite3.Connection, rows: Iterable[Write]) -> None:
    """Insert the write rows."""
    db.executemany(
        "INSERT INTO watch_writes(ts_ns, cpu, pid, tid, object, field, word_offset, length,"
        " ip, value, old, unchanged, stack) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [(_sql(w.ts_ns), w.cpu, w.pid, w.tid, _sql(w.object), w.field, w.word_offset,
          w.length, _sql(w.ip), w.value, w.old, int(w.unchanged),
          json.dumps([_sql(a) for a in w.stack])) for w in rows])


def add_arms(db: sqlite3.Connection, rows: Iterable[Arm]) -> None:
    """Insert the arm rows."""
    db.executemany("INSERT INTO watch_arms VALUES (?,?,?,?,?,?,?)",
                   [(_sql(a.object), a.pid, a.admitted_ns, a.armed_ns, a.disarmed_ns,
                     a.writes, a.ended) for a in rows])


def add_sites(db: sqlite3.Connection, rows: Iterable[Site]) -> None:
    """Insert (or replace) the site rows."""
    db.executemany("INSERT OR REPLACE INTO watch_sites VALUES (?,?,?,?,?,?,?,?,?,?)",
                   [(s.pid, _sql(s.address), s.kind, s.function, s.offset, s.file, s.line,
                     s.inlined, s.module, s.inlined_from) for s in rows])


def _has(db: sqlite3.Connection, table: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                      (table,)).fetchone() is not None


def read_writes(db: sqlite3.Connection) -> list[Write]:
    """The writes recorded, in time order ([] in a trace without them)."""
    if not _has(db, "watch_writes"):
        return []
    return [Write(_u64(r[0]), r[1], r[2], r[3], _u64(r[4]), r[5], r[6], r[7], _u64(r[8]),
                  r[9], r[10], bool(r[11]), tuple(_u64(a) for a in json.loads(r[12] or "[]")))
            for r in db.execute("SELECT ts_ns, cpu, pid, tid, object, field, word_offset, "
                                "length, ip, value, old, unchanged, stack FROM watch_writes "
                                "ORDER BY ts_ns, seq")]


def read_arms(db: sqlite3.Connection) -> list[Arm]:
    """The arms recorded, in time order ([] in a trace without them)."""
    if not _has(db, "watch_arms"):
        return []
    return [Arm(_u64(r[0]), *r[1:]) for r in db.execute(
        "SELECT * FROM watch_arms ORDER BY armed_ns")]


def read_sites(db: sqlite3.Connection) -> dict[tuple[int, int, str], Site]:
    """The sites, by (pid, address, kind) ({} in a trace without them)."""
    if not _has(db, "watch_sites"):
        return {}
    out = {}
    for r in db.execute("SELECT * FROM watch_sites"):
        s = Site(r[0], _u64(r[1]), *r[2:9], r[9] or "" if len(r) > 9 else "")
        out[(s.pid, s.address, s.kind)] = s
    return out
