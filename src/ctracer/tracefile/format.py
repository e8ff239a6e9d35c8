"""The trace file's format: its SQLite schema and version, the states a file is in, how a
u64 is stored, the decoded `Event`, and `RawDecoder`, which turns the raw events a
recorder spooled into columns or rows with a numpy dtype built from the event layout
(`ctracer.event`).  The writer, the recovery and the reader all build on it."""

from __future__ import annotations

import datetime
import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import numpy as np

from ctracer.errors import TraceFileError
from ctracer.deltas import PIECE, DeltaDecoder, cut_records
from ctracer.event import (DELTA_FIXED, ENCODING_COMPACT, ENCODING_FULL, FLAG_READ_FAILED,
                           FLAG_SNAPSHOT_LOST, HEADER, PHASE_EXIT, Layout, args_offset,
                           event_dtype, event_size)


SCHEMA_VERSION = 5
#: bytes of compact records a reader decodes at once (`RawDecoder.pieces`): at most
#: `ctracer.deltas.PIECE` records of the smallest size
PIECE_BYTES = 64 * PIECE


#: schemas this version reads (1: no spool table, never written incrementally;
#: 2: no events.args column; 3: raw events decoded into rows; 4: raw events kept raw, each
#: whole; 5: raw events may be compact, as the meta ``event_encoding`` says)
READABLE_VERSIONS = (1, 2, 3, 4, 5)


#: meta ``state``: set when the file is created, and when the writer finished it
STATE_RECORDING = "recording"


STATE_FINISHED = "finished"


STATE_INTERRUPTED = "interrupted"  # the recorder died; a reader finished the file


SQLITE_MAGIC = b"SQLite format 3\0"


SCHEMA_SQL = """
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
    snapshot BLOB,
    args TEXT
);
CREATE INDEX events_by_object ON events(object, seq);
CREATE TABLE spool(
    seq INTEGER PRIMARY KEY,
    raw BLOB NOT NULL
);
"""


_U64 = 1 << 64


def to_sql_u64(v: Optional[int]) -> Optional[int]:
    """SQLite integers are signed 64-bit; store u64 addresses in two's complement."""
    if v is None:
        return None
    return v - _U64 if v >= 1 << 63 else v


def from_sql_u64(v: Optional[int]) -> Optional[int]:
    """A u64 back from SQLite's signed 64-bit integer."""
    if v is None:
        return None
    return v + _U64 if v < 0 else v


@dataclass(frozen=True)
class Event:
    """One event as the trace file's reader yields it (`Trace.events`)."""

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
    #: a tracepoint hit's arguments by name (None for entry and exit events)
    args: Optional[dict] = None


def _json_key(name: str) -> str:
    """An argument name fit to be written into JSON text as is (an identifier)."""
    if not name.isidentifier() or not name.isascii():
        raise TraceFileError(f"tracepoint argument name {name!r} is not an identifier")
    return name


def _encoding(value: Optional[str]) -> str:
    """The meta ``event_encoding`` (a JSON string, or as written; none: whole events)."""
    if not value:
        return ENCODING_FULL
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    return decoded if isinstance(decoded, str) else value


class RawDecoder:
    """Turns raw events (as the ring buffer delivers them, back to back) into rows of
    the events table, a whole batch at a time with a numpy structured dtype built from
    the event layout (`ctracer.event.event_dtype`)."""

    def __init__(self, mini: Layout, returns: Iterable[int] = (),
                 tracepoint_args: Optional[dict[int, list[dict]]] = None,
                 nargs: Optional[int] = None, encoding: str = ENCODING_FULL):
        self.mini = mini
        #: per function id, the tracepoint's arguments (name, ctype) in slot order
        self.arg_specs = {int(k): [(_json_key(a["name"]), a.get("ctype") == "s64") for a in v]
                          for k, v in (tracepoint_args or {}).items()}
        #: argument slots in every event: the meta's ``event_nargs`` (a kernel-function
        #: probe has a fixed number), else the most any row's arguments take
        self.nargs = nargs if nargs is not None else \
            max((len(v) for v in self.arg_specs.values()), default=0)
        self.size = event_size(mini, self.nargs)
        self.dtype = event_dtype(mini, self.nargs)
        self.returns = sorted(set(returns))  # function ids whose exits carry a value
        self._comms: dict[bytes, str] = {}
        import numpy as np
        self._np = np
        #: compact events (`ctracer.deltas`): batches of ring records, rebuilt in order
        self.deltas: Optional[DeltaDecoder] = None
        if encoding == ENCODING_COMPACT:
            self.deltas = DeltaDecoder(mini, self.nargs)
        elif encoding != ENCODING_FULL:
            raise TraceFileError(f"events encoded as {encoding!r}, which this version of "
                                 "ctracer does not know")

    @property
    def unit(self) -> int:
        """A batch of raw events is a whole number of these bytes."""
        return 8 if self.deltas is not None else self.size

    def fresh(self) -> "RawDecoder":
        """A decoder like this one, starting again from the first batch."""
        other = RawDecoder.__new__(RawDecoder)
        other.__dict__.update(self.__dict__)
        if self.deltas is not None:
            other.deltas = DeltaDecoder(self.mini, self.nargs)
        return other

    def _whole(self, raw: bytes) -> bytes:
        """``raw`` as whole events: compact ones rebuilt (in recording order)."""
        if self.deltas is None:
            return raw
        try:
            return self.deltas.to_full(raw)
        except ValueError as e:
            raise TraceFileError(f"damaged compact events: {e}") from None

    def pieces(self, raw: bytes):
        """``raw`` in consecutive pieces of about `PIECE_BYTES` of compact records
        (whole events: ``raw`` itself), cut at record boundaries: a quarter of a second
        of a fast recording may be one batch of hundreds of thousands of events, and
        what a reader builds from one batch at once is several times its size."""
        if self.deltas is None or len(raw) <= PIECE_BYTES:
            return [raw]
        try:
            return [piece for piece, _ in cut_records(raw, self.deltas.shape, PIECE_BYTES)]
        except ValueError:
            return [raw]  # its decoding says what is wrong with it

    def timestamps(self, raw: bytes):
        """The ``ts_ns`` of every event of a batch (no snapshot decoded)."""
        np = self._np
        if self.deltas is None:
            return np.frombuffer(raw, dtype=self.dtype)["ts_ns"]
        heads = self.deltas.heads(raw)
        at = HEADER.field("ts_ns").offset  # within the fixed bytes of a compact event
        return heads[:, at:at + 8].copy().view("<u8").ravel()

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> "RawDecoder":
        """The decoder of the events of a trace with this meta."""
        return cls(Layout.from_json(meta["mini_layout"]),
                   json.loads(meta.get("return_value_functions") or "[]"),
                   json.loads(meta.get("tracepoint_args") or "{}"),
                   int(meta["event_nargs"]) if meta.get("event_nargs") else None,
                   _encoding(meta.get("event_encoding")))

    def _args(self, fid, slots) -> tuple[list[str], Any]:
        """The JSON texts of the events' arguments, each distinct one once, and per event
        the index of its text (-1: no arguments); built per function from a format
        string of validated names, once per distinct row of values (no json call: this
        runs for every tracepoint hit)."""
        np = self._np
        index = np.full(len(fid), -1, np.int32)
        texts: list[str] = []
        for k, spec in self.arg_specs.items():
            at = np.flatnonzero(fid == k)
            if not len(at) or not spec:
                continue
            rows, inverse = np.unique(slots[at, :len(spec)], axis=0, return_inverse=True)
            columns = [rows[:, i].view(np.int64) if signed else rows[:, i]
                       for i, (_, signed) in enumerate(spec)]
            template = "{" + ", ".join(f'"{name}": %d' for name, _ in spec) + "}"
            index[at] = len(texts) + inverse.reshape(-1)
            texts.extend(template % row for row in zip(*(c.tolist() for c in columns)))
        return texts, index

    def argument_values(self, raw: bytes, names: set[str]) -> set[int]:
        """The distinct non-zero integers the batch's events hold in the tracepoint
        arguments called ``names``.  A compact batch's are read without rebuilding its
        events (`DeltaDecoder.carried`): every value any event carries in an argument
        slot that holds one of ``names`` for some function, a superset (an event may
        hold a word carried by its object's previous event of another function, where
        the slot is another argument)."""
        np = self._np
        found: set[int] = set()
        fid_at = HEADER.field("function_id").offset
        carried: dict[int, tuple] = {}   # per delta word: what `DeltaDecoder.carried` says
        events = np.frombuffer(raw, dtype=self.dtype) if self.deltas is None else None
        for k, spec in self.arg_specs.items():
            for slot, (name, signed) in enumerate(spec):
                if name not in names:
                    continue
                if events is not None:
                    values = events["args"][events["function_id"] == k, slot]
                else:
                    word = (args_offset() + 8 * slot - DELTA_FIXED) // 8
                    if word not in carried:
                        try:
                            fixed, has, value = self.deltas.carried(raw, word)
                        except ValueError as e:
                            raise TraceFileError(f"damaged compact events: {e}") from None
                        fid = fixed[:, fid_at:fid_at + 4].copy().view("<u4").ravel()
                        carried[word] = (fid, has, value)
                    fid, has, value = carried[word]
                    values = value[has]
                if signed:
                    values = values.view(np.int64)
                found.update(v for v in np.unique(values).tolist() if v)
        return found

    def _comms_of(self, comm) -> tuple[list[str], Any]:
        """The distinct command names of a batch, and per event the index of its own."""
        np = self._np
        if len(comm) and (comm == comm[0]).all():  # one process
            return [self._comm(comm[0])], np.zeros(len(comm), np.intp)
        comms, inverse = np.unique(comm, return_inverse=True)
        return [self._comm(c) for c in comms.tolist()], inverse.reshape(-1)

    def count(self, raw: bytes) -> int:
        if self.deltas is not None:
            try:
                return self.deltas.count(raw)
            except ValueError as e:
                raise TraceFileError(f"damaged compact events: {e}") from None
        return len(raw) // self.size

    def columns(self, raw: bytes, first_seq: int) -> dict[str, Any]:
        """The events of ``raw`` as the columns of `Trace.event_columns` (``comm`` and
        ``args`` as text lists, indexed by the caller), numbered from ``first_seq``."""
        np = self._np
        raw = self._whole(raw)
        if len(raw) % self.size:
            raise TraceFileError(f"a batch of raw events is not a whole number of "
                                 f"{self.size}-byte events")
        a = np.frombuffer(raw, dtype=self.dtype)
        n = len(a)
        phase, fid, flags = a["phase"], a["function_id"], a["flags"]
        failed = (flags & (FLAG_READ_FAILED | FLAG_SNAPSHOT_LOST)) != 0
        comm_texts, comm = self._comms_of(a["comm"])
        args_texts, args = self._args(fid, a["args"]) if self.nargs else \
            ([], np.full(n, -1, np.int32))
        if self.mini.size:
            snapshots = np.ascontiguousarray(a["snapshot"]).view(np.uint8).reshape(
                n, self.mini.size).copy()
            snapshots[failed] = 0
            has_snapshot = ~failed
        else:
            snapshots = np.zeros((n, 0), np.uint8)
            has_snapshot = np.ones(n, bool)
        has_retval = (phase == PHASE_EXIT) & np.isin(fid, self.returns)
        return {
            "seq": np.arange(first_seq, first_seq + n, dtype=np.int64),
            "ts_ns": a["ts_ns"].astype(np.int64), "cpu": a["cpu"].copy(),
            "pid": a["pid"].copy(), "tid": a["tid"].copy(),
            "function_id": fid.astype(np.int32), "phase": phase.copy(),
            "object": a["object"].view(np.int64).copy(),
            "retval": np.where(has_retval, a["retval"], 0), "has_retval": has_retval,
            "depth": a["depth"].astype(np.int64), "flags": flags.copy(),
            "has_snapshot": has_snapshot, "snapshots": snapshots,
            "comm_texts": comm_texts, "comm": comm, "args_texts": args_texts, "args": args}

    def rows(self, raw: bytes) -> list[tuple]:
        raw = self._whole(raw)

        if len(raw) % self.size:
            raise TraceFileError(f"a batch of raw events is not a whole number of "
                                 f"{self.size}-byte events")
        np = self._np
        a = np.frombuffer(raw, dtype=self.dtype)
        if not len(a):
            return []
        phase, fid, flags = a["phase"], a["function_id"], a["flags"]
        retval = a["retval"].astype(object)
        has_value = (phase == PHASE_EXIT) & np.isin(fid, self.returns)
        retval[~has_value] = None
        names, inverse = self._comms_of(a["comm"])
        comm = [names[i] for i in inverse.tolist()]
        if self.mini.size:
            snapshot = np.array(a["snapshot"].tolist(), dtype=object)
            snapshot[(flags & (FLAG_READ_FAILED | FLAG_SNAPSHOT_LOST)) != 0] = None
            snapshot = snapshot.tolist()
        else:
            snapshot = [b""] * len(a)
        fids = fid.tolist()
        if self.nargs:
            texts, index = self._args(fid, a["args"])
            args = [texts[i] if i >= 0 else None for i in index.tolist()]
        else:
            args = [None] * len(a)
        return list(zip(
            a["ts_ns"].astype(np.int64).tolist(), a["cpu"].tolist(), a["pid"].tolist(),
            a["tid"].tolist(), comm, fids, phase.tolist(),
            a["object"].astype(np.int64).tolist(),  # two's complement, as to_sql_u64
            retval.tolist(), a["depth"].tolist(), flags.tolist(), snapshot, args))

    def _comm(self, raw: bytes) -> str:
        name = self._comms.get(raw)
        if name is None:
            name = self._comms[raw] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
        return name


INSERT_EVENTS = ("INSERT INTO events(ts_ns, cpu, pid, tid, comm, function_id, phase, object,"
                  " retval, depth, flags, snapshot, args) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)")


def decode_spool(db: sqlite3.Connection, decoder: RawDecoder,
                  budget_s: Optional[float] = None,
                  progress: Optional[Callable[[int], None]] = None) -> int:
    """Move spooled batches into the events table, oldest first, each in one
    transaction (a crash leaves every event in exactly one of the two tables); stops
    after ``budget_s`` seconds.  The number of events moved."""
    moved = 0
    deadline = None if budget_s is None else time.monotonic() + budget_s
    while deadline is None or time.monotonic() < deadline:
        row = db.execute("SELECT seq, raw FROM spool ORDER BY seq LIMIT 1").fetchone()
        if row is None:
            break
        rows = decoder.rows(row[1])
        db.executemany(INSERT_EVENTS, rows)
        db.execute("DELETE FROM spool WHERE seq = ?", (row[0],))
        db.commit()
        moved += len(rows)
        if progress:
            progress(moved)
    return moved


def now_iso() -> str:
    """Now, in UTC, as ISO 8601 with milliseconds."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


#: SQL conditions true for an events/functions row a reader cannot take
EVENT_CHECKS = """typeof(ts_ns) != 'integer' OR ts_ns < 0
 OR typeof(cpu) != 'integer' OR cpu NOT BETWEEN 0 AND 4294967295
 OR typeof(pid) != 'integer' OR pid NOT BETWEEN 0 AND 4294967295
 OR typeof(tid) != 'integer' OR tid NOT BETWEEN 0 AND 4294967295
 OR typeof(comm) NOT IN ('text', 'null') OR typeof(function_id) != 'integer'
 OR typeof(phase) != 'integer' OR phase NOT BETWEEN 0 AND 255
 OR typeof(object) != 'integer' OR typeof(retval) NOT IN ('integer', 'null')
 OR typeof(depth) != 'integer' OR depth NOT BETWEEN 0 AND 4294967295
 OR typeof(flags) != 'integer' OR flags NOT BETWEEN 0 AND 255
 OR (snapshot IS NOT NULL AND (typeof(snapshot) != 'blob' OR length(snapshot) != :size))"""


ARGS_CHECK = " OR (args IS NOT NULL AND (typeof(args) != 'text' OR NOT json_valid(args)))"


FUNCTION_CHECKS = """typeof(id) != 'integer' OR typeof(name) != 'text'
 OR typeof(unit) NOT IN ('text', 'null') OR typeof(reach) != 'text'
 OR typeof(via) NOT IN ('text', 'null') OR typeof(address) NOT IN ('integer', 'null')
 OR typeof(attached) NOT IN ('text', 'null')"""
