"""The trace file: a versioned SQLite database that carries everything needed to render.

Tables:

* ``meta(key, value)``: schema version, the trace's id (``trace_id``, random), the
  traced struct, its mini layout (JSON of `ctracer.event.Layout`), the full struct
  layout as text, host, kernel release, argv, start/end times, event and lost counts;
* ``functions``: the probed functions, how each reaches the object (``reach``/``via``),
  and whether its probes attached;
* ``events``: one row per probe hit, the header decoded into columns and the mini
  snapshot kept as raw bytes (decoded with the layout in ``meta``); ``phase`` is 0 for
  an entry, 1 for an exit, 2 for a tracepoint hit (`ctracer.event.PHASE_NAMES`), and
  ``args`` holds a tracepoint hit's arguments as a JSON object by parameter name
  (``{"oldstate": 7, "newstate": 2}``; NULL for entry/exit events).  The meta entry
  ``tracepoint_args`` says, per function id, each argument's name, C type (``s64``
  or ``u64``: how the raw slot reads), kind and C type text;
* ``spool``: batches of raw events exactly as the ring buffer delivered them.  From
  schema 4 a recording's events stay there, raw, and every reader decodes them with a
  numpy dtype built from the event layout (`RawDecoder`): decoding them into ``events``
  rows cost the recorder more than the ring buffer delivers in a flood, and reading
  rows back cost readers more than the rest of their work.  Schemas 2 and 3 moved them
  into ``events`` (the first reader of such a file finishes the move).  ``events`` rows
  are still written by `TraceWriter.add_event` (synthetic traces); an event's ``seq``
  is its rowid there, and for raw events the next numbers, in the order recorded.

Nothing recorded is lost: while recording, the writer commits the raw events it got
every few hundred milliseconds (`TraceWriter.add_raw`, one small transaction in SQLite's
write-ahead log).  After a SIGKILL or a crash the file holds every batch committed
before it; the first reader to open it (`Trace`), finding no live recorder (the
recorder holds an exclusive ``flock`` on the file), marks the trace incomplete and says
where it ends (`Trace.incomplete`).  A finished file is a
single self-contained database (the log is folded back in), created 0600 without
following symlinks; an existing file at the path is kept as ``FILE.old``
(`ctracer.files`).

The reader (`Trace`) is all the report stage needs, so a trace recorded on one machine
renders on another; a damaged or truncated file, one from a newer ctracer, and a file
that is not a trace at all each get their own one-line message.
"""

from __future__ import annotations

import datetime
import fcntl
import functools
import hashlib
import json
import os
import sqlite3
import threading
import time
import uuid

import numpy as np
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

from ctracer.errors import OutputError, TraceFileError
from ctracer.event import (FLAG_HEAD_ONLY, FLAG_READ_FAILED, PHASE_EXIT, FunctionRow,  # noqa: F401
                           Layout, event_dtype, event_size)
from ctracer.files import create_private_file, keep_old, same_file

SCHEMA_VERSION = 4
#: schemas this version reads (1: no spool table, never written incrementally;
#: 2: no events.args column; 3: raw events decoded into rows)
READABLE_VERSIONS = (1, 2, 3, 4)

#: meta ``state``: set when the file is created, and when the writer finished it
STATE_RECORDING = "recording"
STATE_FINISHED = "finished"
STATE_INTERRUPTED = "interrupted"  # the recorder died; a reader finished the file

_SQLITE_MAGIC = b"SQLite format 3\0"

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


def _from_sql_u64(v: Optional[int]) -> Optional[int]:
    if v is None:
        return None
    return v + _U64 if v < 0 else v


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
    #: a tracepoint hit's arguments by name (None for entry and exit events)
    args: Optional[dict] = None


def _json_key(name: str) -> str:
    """An argument name fit to be written into JSON text as is (an identifier)."""
    if not name.isidentifier() or not name.isascii():
        raise TraceFileError(f"tracepoint argument name {name!r} is not an identifier")
    return name


class RawDecoder:
    """Turns raw events (as the ring buffer delivers them, back to back) into rows of
    the events table, a whole batch at a time with a numpy structured dtype built from
    the event layout (`ctracer.event.event_dtype`)."""

    def __init__(self, mini: Layout, returns: Iterable[int] = (),
                 tracepoint_args: Optional[dict[int, list[dict]]] = None,
                 nargs: Optional[int] = None):
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

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> "RawDecoder":
        return cls(Layout.from_json(meta["mini_layout"]),
                   json.loads(meta.get("return_value_functions") or "[]"),
                   json.loads(meta.get("tracepoint_args") or "{}"),
                   int(meta["event_nargs"]) if meta.get("event_nargs") else None)

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

    def _comms_of(self, comm) -> tuple[list[str], Any]:
        """The distinct command names of a batch, and per event the index of its own."""
        np = self._np
        if len(comm) and (comm == comm[0]).all():  # one process
            return [self._comm(comm[0])], np.zeros(len(comm), np.intp)
        comms, inverse = np.unique(comm, return_inverse=True)
        return [self._comm(c) for c in comms.tolist()], inverse.reshape(-1)

    def count(self, raw: bytes) -> int:
        return len(raw) // self.size

    def columns(self, raw: bytes, first_seq: int) -> dict[str, Any]:
        """The events of ``raw`` as the columns of `Trace.event_columns` (``comm`` and
        ``args`` as text lists, indexed by the caller), numbered from ``first_seq``."""
        np = self._np
        if len(raw) % self.size:
            raise TraceFileError(f"a batch of raw events is not a whole number of "
                                 f"{self.size}-byte events")
        a = np.frombuffer(raw, dtype=self.dtype)
        n = len(a)
        phase, fid, flags = a["phase"], a["function_id"], a["flags"]
        failed = (flags & FLAG_READ_FAILED) != 0
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
            snapshot[(flags & FLAG_READ_FAILED) != 0] = None
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


_INSERT_EVENTS = ("INSERT INTO events(ts_ns, cpu, pid, tid, comm, function_id, phase, object,"
                  " retval, depth, flags, snapshot, args) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)")


def _decode_spool(db: sqlite3.Connection, decoder: RawDecoder,
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
        db.executemany(_INSERT_EVENTS, rows)
        db.execute("DELETE FROM spool WHERE seq = ?", (row[0],))
        db.commit()
        moved += len(rows)
        if progress:
            progress(moved)
    return moved


class TraceWriter:
    """Creates a trace file and appends to it.

    Decoded events (`add_event`) are committed every ``batch`` events;
    the recorder's raw events (`add_raw`) are committed at once, and stay raw.  The file is created 0600 with O_EXCL|O_NOFOLLOW; a
    file already at ``path`` is kept as ``path.old`` (`kept_old` names it).  While the
    writer lives it holds an exclusive ``flock`` on the file, which tells readers the
    recording is alive."""

    SPOOL_ROW_EVENTS = 2048
    #: room held back on the trace's file system (`release_reserve`): enough for the
    #: meta saying why a recording stopped and for folding the log in (a few 64 KB pages)
    RESERVE_BYTES = 1 << 20

    def __init__(self, path: str, batch: int = 2000):
        self.path = path
        self.kept_old = keep_old(path)
        self._fd = create_private_file(path)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.db = sqlite3.connect(path)
            if not same_file(self._fd, path):
                raise OutputError(f"cannot write {path}: it was replaced while ctracer "
                                  "was creating it")
            # big pages: a commit of raw events writes a third of the log frames
            self.db.execute("PRAGMA page_size=65536")
            self.db.execute("PRAGMA journal_mode=WAL")
            # a commit survives the process dying (SIGKILL, a crash), without an
            # fsync per commit; the file is synced when the writer closes it
            self.db.execute("PRAGMA synchronous=NORMAL")
            # checkpoints (copying the log into the file, with an fsync) took up to a
            # second each on a busy machine inside a commit; the recorder asks for one
            # when it is idle (`checkpoint`), and closing folds the rest in
            self.db.execute("PRAGMA wal_autocheckpoint=0")
            self.db.executescript(_SCHEMA)
        except sqlite3.Error as e:
            os.close(self._fd)
            raise OutputError(f"cannot create trace file {path}: {e}") from None
        except BaseException:
            os.close(self._fd)
            raise
        self._reserve = _hold_room(os.path.dirname(os.path.abspath(path)), self.RESERVE_BYTES)
        self.batch = batch
        self._pending: list[tuple] = []
        self._meta: dict[str, str] = {}
        self._decoder: Optional[RawDecoder] = None
        self._checkpointer: Optional[_Checkpointer] = None
        self.events_written = 0   # decoded into the events table
        self.events_spooled = 0   # raw, committed, not decoded yet
        self.set_meta(schema_version=SCHEMA_VERSION, state=STATE_RECORDING,
                      recorder_pid=os.getpid(), trace_id=uuid.uuid4().hex)

    def release_reserve(self) -> None:
        """Give the room held back since the file was created to the file system: the
        disk is full, and the meta saying so must still fit."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def set_meta(self, **items: Any) -> None:
        rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in items.items()]
        self._meta.update(rows)
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
                  depth: int, flags: int, snapshot: Optional[bytes],
                  args: Optional[dict] = None) -> None:
        self._pending.append((ts_ns, cpu, pid, tid, comm, function_id, phase,
                              to_sql_u64(object), retval, depth, flags, snapshot,
                              None if args is None else json.dumps(args)))
        if len(self._pending) >= self.batch:
            self.flush()

    def argument_values(self, names: Iterable[str]) -> set[int]:
        """The distinct integer values the events hold in the arguments called
        ``names``."""
        wanted, found = set(names), set()
        if not wanted:
            return found
        texts = {t for (t,) in self.db.execute("SELECT DISTINCT args FROM events "
                                               "WHERE args IS NOT NULL")}
        if self._decoder is not None and self._decoder.nargs:
            for (raw,) in self.db.execute("SELECT raw FROM spool"):
                texts.update(self._decoder.columns(raw, 0)["args_texts"])
        for text in texts:
            if text is None:
                continue
            try:
                values = json.loads(text)
            except (TypeError, ValueError):
                continue
            if isinstance(values, dict):
                found.update(v for k, v in values.items()
                             if k in wanted and isinstance(v, int) and v)
        return found

    def expect_raw(self) -> None:
        """Get ready for `add_raw` (numpy imported, the decoder built from the meta,
        which must hold ``mini_layout`` and the rest the decoder reads) before the first
        events arrive."""
        if self._decoder is None:
            self._decoder = RawDecoder.from_meta(self._meta)

    def add_raw(self, raw: bytes) -> None:
        """Commit raw events (the ring buffer's bytes, back to back) to the spool."""
        if not raw:
            return
        self.expect_raw()
        size = self._decoder.size
        if len(raw) % size:
            raise ValueError("raw events of an unexpected size")
        step = self.SPOOL_ROW_EVENTS * size  # small rows: decoding stops within a budget
        for at in range(0, len(raw), step):
            # each row committed on its own: a full disk keeps every row before it
            self.db.execute("INSERT INTO spool(raw) VALUES (?)", (raw[at:at + step],))
            self.db.commit()
            self.events_spooled += self._decoder.count(raw[at:at + step])

    def checkpoint(self) -> None:
        """Copy the committed log into the file and sync it (what survives a power loss,
        not only a crash): a moment's work when little is pending."""
        self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def checkpoint_in_background(self, every_s: float = 0.25) -> None:
        """From now until `close`, a thread with a connection of its own copies the
        committed log into the file every ``every_s`` seconds (a passive checkpoint
        never blocks the writer's commits; SQLite releases the GIL while it copies).
        The log then holds only the last moments of a recording, so closing folds it
        back in quickly even after a flood (every second: 0.43 s to fold in after a
        flood writing 400k events/s; every quarter of a second: 0.1-0.2 s)."""
        if self._checkpointer is None:
            self._checkpointer = _Checkpointer(self.path, every_s)

    def flush(self) -> None:
        if self._pending:
            self.db.executemany(_INSERT_EVENTS, self._pending)
            self.events_written += len(self._pending)
            self._pending.clear()
        self.db.commit()

    def close(self) -> None:
        """Mark the file finished and fold the log back in."""
        if self.db is None:
            return
        try:
            self.flush()
            self.set_meta(state=STATE_FINISHED)
            self._stop_checkpointer()  # its connection would keep the log open
            self.db.execute("PRAGMA journal_mode=DELETE")
            self.db.close()
        finally:
            self._stop_checkpointer()
            self.db = None
            os.close(self._fd)
            self.release_reserve()

    def _stop_checkpointer(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None


def _hold_room(directory: str, size: int) -> Optional[int]:
    """A descriptor of an unnamed file of ``size`` allocated bytes in ``directory`` (on
    the trace's file system): closing it frees them, and so does the process dying, so
    nothing is left behind; None where the file system cannot make one."""
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        os.close(fd)
        return None
    return fd


class _Checkpointer:
    """A thread copying a trace file's write-ahead log into the file now and then
    (`TraceWriter.checkpoint_in_background`)."""

    def __init__(self, path: str, every_s: float):
        self.db = sqlite3.connect(path, check_same_thread=False)
        self._stop = threading.Event()
        self._every_s = every_s
        self._thread = threading.Thread(target=self._run, name="ctracer-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass  # a full disk or a busy file: the writer meets it and decides

    def stop(self) -> None:
        """Stop (after the checkpoint in progress) and close the connection."""
        self._stop.set()
        self._thread.join()
        self.db.close()


def _sqlite_header(path: str) -> bytes:
    """The first 100 bytes (SQLite's header), after checking the path is a file."""
    if os.path.isdir(path):
        raise TraceFileError(f"{path} is a directory, not a trace file")
    if not os.path.exists(path):
        raise TraceFileError(f"no trace file at {path}")
    try:
        with open(path, "rb") as f:
            return f.read(100)
    except OSError as e:
        raise TraceFileError(f"cannot read {path}: {e.strerror or e}") from None


def _check_not_truncated(path: str, header: bytes) -> None:
    """SQLite's header says how many pages the database has; a shorter file was cut."""
    if len(header) < 100:
        raise TraceFileError(f"{path} is damaged: truncated to {len(header)} bytes")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96]  # the page count is current
    size = os.path.getsize(path)
    if valid and pages and size < pages * page_size:
        raise TraceFileError(f"{path} is damaged: truncated to {size} of "
                             f"{pages * page_size} bytes")


def _writer_alive(path: str) -> bool:
    """A recorder holds an exclusive flock on the file it writes while it runs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # no SQLite connection of ours is open on it yet: no lock lost


def _finish(path: str, interrupted: bool,
            progress: Optional[Callable[[int], None]] = None, decode: bool = False) -> None:
    """Fold the log back in (as SQLite itself does with a hot journal), after decoding
    the raw events a schema 2 or 3 recorder left in the spool (``decode``).
    ``interrupted``: the recorder died before finishing the file, which is then marked
    interrupted and told where it ends."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a recorder (or another reader finishing it) holds it
        if not os.access(path, os.W_OK) or not os.access(os.path.dirname(
                os.path.abspath(path)), os.W_OK):
            why = "is from a recording that was killed" if interrupted else \
                "holds events its recorder left undecoded"
            raise TraceFileError(
                f"{path} {why} and cannot be finished here (read-only): copy it "
                f"somewhere writable and open it again")
        db = sqlite3.connect(path)
        try:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            if decode and "mini_layout" in meta:
                _decode_spool(db, RawDecoder.from_meta(meta), progress=progress)
            if interrupted:
                _mark_interrupted(db, meta)
            db.execute("PRAGMA journal_mode=DELETE")
        finally:
            db.close()
    except sqlite3.Error as e:
        raise TraceFileError(f"{path} is damaged: {e}") from None
    finally:
        os.close(fd)


def _span(db: sqlite3.Connection, meta: dict[str, str]) -> tuple[int, Optional[int],
                                                                  Optional[int]]:
    """(events, first ts, last ts) of the rows and of the raw events together."""
    count, first, last = db.execute(
        "SELECT count(*), min(ts_ns), max(ts_ns) FROM events").fetchone()
    if _spooled(db) and "mini_layout" in meta:
        import numpy as np

        decoder = RawDecoder.from_meta(meta)
        for (raw,) in db.execute("SELECT raw FROM spool"):
            if not isinstance(raw, bytes) or len(raw) % decoder.size:
                continue  # a damaged batch: `Trace` says so when it reads the events
            ts = np.frombuffer(raw, dtype=decoder.dtype)["ts_ns"]
            if len(ts):
                count += len(ts)
                low, high = int(ts.min()), int(ts.max())
                first = low if first is None else min(first, low)
                last = high if last is None else max(last, high)
    return count, first, last


def _mark_interrupted(db: sqlite3.Connection, meta: dict[str, str]) -> None:
    last = _span(db, meta)[::2]
    ended = _wall_time(meta, last[1]) if last[1] is not None else ""
    entries = [
        ("state", STATE_INTERRUPTED),
        ("stopped_by", meta.get("stopped_by")  # "disk full" is kept
         or "killed: the recorder died before finishing the file; the trace ends at "
            "its last committed event"),
        ("events", json.dumps(last[0])),
        ("last_event_ns", json.dumps(last[1])),
        ("finished_by_reader", _now_iso())]
    if ended and "end_time" not in meta:
        entries.append(("end_time", ended))
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", entries)
    db.commit()


def _spooled(db: sqlite3.Connection) -> bool:
    """Raw events left in the spool (a schema 1 file has no spool)."""
    try:
        return db.execute("SELECT 1 FROM spool LIMIT 1").fetchone() is not None
    except sqlite3.OperationalError:
        return False


def _wall_time(meta: dict[str, str], ts_ns: int) -> str:
    """The wall-clock time of a probe timestamp (CLOCK_MONOTONIC of the recording host),
    from the start times the recorder wrote; "" when they are missing."""
    try:
        start = datetime.datetime.fromisoformat(meta["start_time"])
        start_ns = int(meta["start_monotonic_ns"])
    except (KeyError, ValueError):
        return ""
    at = start + datetime.timedelta(microseconds=(ts_ns - start_ns) / 1000)
    return at.isoformat(timespec="milliseconds")


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def meta_json(meta: dict[str, str], key: str, path: str, default: Any = None) -> Any:
    """The meta entry ``key`` decoded from JSON (``default`` when absent); a
    `TraceFileError` when it is not JSON (the trace at ``path`` is damaged)."""
    v = meta.get(key)
    if v is None:
        return default
    try:
        return json.loads(v)
    except ValueError:  # found by tests/test_tracefile_fuzz.py
        raise TraceFileError(f"{path} is damaged: its meta entry {key!r} is not "
                             "JSON") from None


def meta_text(meta: dict[str, str], key: str) -> str:
    """The meta entry ``key`` as text: a JSON string decoded, anything else as written
    ("" when absent)."""
    v = meta.get(key)
    if v is None:
        return ""
    try:
        d = json.loads(v)
    except ValueError:
        return v
    return d if isinstance(d, str) else v


def decoding_progress(stream=None) -> Optional[Callable[[int], None]]:
    """For `Trace`'s ``progress`` in a command: a line redrawn on a terminal while the
    raw events a recorder left are decoded (None when ``stream`` is not a terminal)."""
    import sys
    stream = stream or sys.stderr
    if not stream.isatty():
        return None

    def show(done: int) -> None:
        stream.write(f"\r\033[Kdecoding the events the recorder left: {done}")
        stream.flush()
    return show


def read_meta(path: str) -> dict[str, str]:
    """The meta table of a trace file as it is, read without `Trace`'s checks and
    without finishing a killed recording's file (a reader must still open it as a
    `Trace`): for a quick look before the work; {} when it cannot be read."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
        finally:
            db.close()
    except (sqlite3.Error, ValueError):
        return {}


#: SQL conditions true for an events/functions row a reader cannot take
_EVENT_CHECKS = """typeof(ts_ns) != 'integer' OR ts_ns < 0
 OR typeof(cpu) != 'integer' OR cpu NOT BETWEEN 0 AND 4294967295
 OR typeof(pid) != 'integer' OR pid NOT BETWEEN 0 AND 4294967295
 OR typeof(tid) != 'integer' OR tid NOT BETWEEN 0 AND 4294967295
 OR typeof(comm) NOT IN ('text', 'null') OR typeof(function_id) != 'integer'
 OR typeof(phase) != 'integer' OR phase NOT BETWEEN 0 AND 255
 OR typeof(object) != 'integer' OR typeof(retval) NOT IN ('integer', 'null')
 OR typeof(depth) != 'integer' OR depth NOT BETWEEN 0 AND 4294967295
 OR typeof(flags) != 'integer' OR flags NOT BETWEEN 0 AND 255
 OR (snapshot IS NOT NULL AND (typeof(snapshot) != 'blob' OR length(snapshot) != :size))"""
_ARGS_CHECK = " OR (args IS NOT NULL AND (typeof(args) != 'text' OR NOT json_valid(args)))"
_FUNCTION_CHECKS = """typeof(id) != 'integer' OR typeof(name) != 'text'
 OR typeof(unit) NOT IN ('text', 'null') OR typeof(reach) != 'text'
 OR typeof(via) NOT IN ('text', 'null') OR typeof(address) NOT IN ('integer', 'null')
 OR typeof(attached) NOT IN ('text', 'null')"""



def trace_id_of(meta: dict[str, str]) -> str:
    """A trace's id: written by the recorder, or (older files) a digest of what
    identifies the recording."""
    tid = meta.get("trace_id")
    if tid:
        return tid
    key = "|".join(meta.get(k, "") for k in ("host", "start_time", "struct_name",
                                             "kernel_release", "argv"))
    return hashlib.sha256(key.encode()).hexdigest()[:32]

class Trace:
    """A trace file opened for reading.

    Opening checks that the file is a ctracer trace of a schema this version reads; a
    trace whose recorder was killed is finished first (see the module docstring) and
    `incomplete` says so."""

    def __init__(self, path: str, progress: Optional[Callable[[int], None]] = None):
        """``progress`` is called with the number of events decoded so far when the file
        holds raw events its recorder left (see `TraceWriter.close`)."""
        header = _sqlite_header(path)
        if not header:
            raise TraceFileError(f"{path} is empty: not a ctracer trace file")
        if not header.startswith(_SQLITE_MAGIC):
            raise TraceFileError(f"{path} is not a ctracer trace file")
        if not os.path.exists(path + "-wal"):
            _check_not_truncated(path, header)
        self.path = path
        self.db, self.meta = self._open()
        recording = self.meta.get("state") == STATE_RECORDING
        rows_schema = str(self.meta.get("schema_version")) in ("2", "3")  # spool moved to rows
        if ((recording or (rows_schema and _spooled(self.db)))
                and not _writer_alive(path)):
            self.db.close()
            _finish(path, recording, progress, decode=rows_schema)
            self.db, self.meta = self._open()
        version = self.meta.get("schema_version")
        # a damaged meta row may hold another SQLite type than the text we write
        version = str(version) if isinstance(version, (int, str)) else ""
        if not version.isdigit():
            self._check_integrity()  # our tables, no version: a damaged meta table?
            raise TraceFileError(f"{path} is not a ctracer trace file (no schema version)")
        if int(version) > max(READABLE_VERSIONS):
            raise TraceFileError(
                f"{path} was written by a newer ctracer (trace schema {version}; this one "
                f"reads up to {max(READABLE_VERSIONS)}): upgrade ctracer to read it")
        if int(version) not in READABLE_VERSIONS:
            raise TraceFileError(
                f"{path} has trace schema {version}, this ctracer reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}")
        if "mini_layout" not in self.meta or "struct_name" not in self.meta:
            raise TraceFileError(f"{path} was never completed: no struct layout in it")
        try:
            self.db.execute("SELECT max(seq) FROM events").fetchone()
        except sqlite3.OperationalError:
            raise TraceFileError(f"{path} is not a ctracer trace file (no events table)") from None
        except sqlite3.Error as e:
            raise self._damaged(e) from None
        try:
            self.mini = Layout.from_json(self.meta["mini_layout"])
            self._check_rows()
            self.functions: dict[int, FunctionRow] = {
                r[0]: FunctionRow(r[0], r[1], r[2] or "", r[3], r[4] or "",
                                  _from_sql_u64(r[5]), r[6] or "")
                for r in self.db.execute("SELECT * FROM functions")}
        except (ValueError, KeyError, TypeError, TraceFileError) as e:
            if isinstance(e, TraceFileError) and "raw events" in str(e):
                raise
            raise TraceFileError(f"{path} is damaged: its struct layout does not "
                                 f"read ({e})") from None
        except sqlite3.Error as e:
            raise self._damaged(e) from None

    def _check_rows(self) -> None:
        """Every event and function row holds values of its column's type and range
        (one scan in SQLite), so no reader meets a string for a cpu, a negative pid or a
        snapshot of the wrong size (found by tests/test_tracefile_fuzz.py)."""
        events = _EVENT_CHECKS + (_ARGS_CHECK if self._has_args else "")
        bad = self.db.execute(f"SELECT seq FROM events WHERE {events} LIMIT 1",
                              {"size": self.mini.size}).fetchone()
        if bad is not None:
            raise TraceFileError(f"{self.path} is damaged: event {bad[0]} holds a value of "
                                 "the wrong type or range")
        if _spooled(self.db):
            bad = self.db.execute("SELECT seq FROM spool WHERE typeof(raw) != 'blob' OR "
                                  "length(raw) % :size != 0 LIMIT 1",
                                  {"size": self._raw_decoder.size}).fetchone()
            if bad is not None:
                raise TraceFileError(f"{self.path} is damaged: its raw events {bad[0]} are "
                                     "not a whole number of events")
        bad = self.db.execute(f"SELECT id FROM functions WHERE {_FUNCTION_CHECKS} "
                              "LIMIT 1").fetchone()
        if bad is not None:
            raise TraceFileError(f"{self.path} is damaged: function row {bad[0]!r} holds a "
                                 "value of the wrong type")

    def _open(self) -> tuple[sqlite3.Connection, dict[str, str]]:
        path = self.path
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        except sqlite3.Error as e:
            raise TraceFileError(f"cannot open {path}: {e}") from None
        try:
            names = {r[0] for r in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = ({r[1] for r in db.execute("PRAGMA table_info(meta)")}
                       if "meta" in names else set())
            if not {"key", "value"} <= columns:
                db.close()
                why = " (its meta table is not a trace's)" if "meta" in names else ""
                raise TraceFileError(f"{path} is an SQLite database but not a ctracer "
                                     f"trace file{why}")
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error as e:
            db.close()
            raise self._damaged(e) from None
        return db, meta

    def _damaged(self, e: object) -> TraceFileError:
        # one line, whatever SQLite said (its integrity report spans lines)
        said = "; ".join(part.strip() for part in str(e).splitlines() if part.strip())
        return TraceFileError(f"{self.path} is damaged: {said}")

    def _check_integrity(self) -> None:
        """SQLite's own check (reads the whole file: only where something is already
        off); raises the damage it finds."""
        try:
            problems = [r[0] for r in self.db.execute("PRAGMA quick_check(1)")]
        except sqlite3.Error as e:
            raise self._damaged(e) from None
        if problems != ["ok"]:
            raise self._damaged(problems[0])

    @property
    def incomplete(self) -> Optional[str]:
        """None for a finished trace; else one line saying why it is incomplete and
        where it ends."""
        state = self.meta.get("state")
        if state in (None, STATE_FINISHED) and self.meta.get("stopped_by") != "disk full":
            return None
        count, first, last = self._span()
        if state == STATE_RECORDING:
            return f"the recording is still running: {count} events written so far"
        if not count:
            return ("incomplete: the recorder was killed before it finished the file, "
                    "and no event had been committed")
        where = f"{(last - first) / 1e9:.3f} s after the first event"
        wall = _wall_time(self.meta, last)
        if self.meta.get("stopped_by") == "disk full":
            return (f"incomplete: the disk filled up while recording; it holds the {count} "
                    f"events written before that and ends at {wall + ', ' if wall else ''}"
                    f"{where}")
        return (f"incomplete: the recorder was killed before it finished the file; it "
                f"holds the {count} events committed before that and ends at "
                f"{wall + ', ' if wall else ''}{where}")


    @property
    def struct_name(self) -> str:
        return self.meta["struct_name"]

    @functools.cached_property
    def trace_id(self) -> str:
        """The trace's id (`trace_id_of` its meta)."""
        return trace_id_of(self.meta)

    @property
    def struct_kind(self) -> str:
        return self.meta.get("struct_kind", "struct")

    def meta_json(self, key: str, default: Any = None) -> Any:
        return meta_json(self.meta, key, self.path, default)

    def _span(self) -> tuple[int, Optional[int], Optional[int]]:
        try:
            return _span(self.db, self.meta)
        except sqlite3.DatabaseError as e:
            raise self._damaged(e) from None

    def events(self, object: Optional[int] = None) -> Iterator[Event]:
        """Events in recording order, optionally only those of one object address (for
        tools and tests: a reader of a whole trace takes `event_columns`)."""
        c = self.event_columns()
        order = np.argsort(c["seq"], kind="stable")
        if object is not None:
            order = order[c["object"][order] == np.uint64(object)]
        texts, comms = c["args_texts"], c["comms"]
        for i in order.tolist():
            args = int(c["args"][i])
            yield Event(int(c["seq"][i]), int(c["ts_ns"][i]), int(c["cpu"][i]),
                        int(c["pid"][i]), int(c["tid"][i]), comms[int(c["comm"][i])],
                        int(c["function_id"][i]), int(c["phase"][i]), int(c["object"][i]),
                        int(c["retval"][i]) if c["has_retval"][i] else None,
                        int(c["depth"][i]), int(c["flags"][i]),
                        c["snapshots"][i].tobytes() if c["has_snapshot"][i] else None,
                        json.loads(texts[args]) if args >= 0 else None)

    def event_columns(self, chunk: int = 131072, space: Any = None) -> dict[str, Any]:
        """Every event as columns (numpy arrays), in time order (then recording order):
        ``seq``, ``ts_ns``, ``cpu``, ``pid``, ``tid``, ``function_id``, ``phase``,
        ``object`` (u64), ``retval`` with ``has_retval``, ``flags``, ``comm`` and
        ``args`` as indexes into ``comms`` and ``args_texts`` (args -1: none), and the
        snapshots as ``snapshots`` (one row of bytes per event, zeros where
        ``has_snapshot`` is False), and the ``depth`` the probe recorded.  ``space``
        (`ctracer.analysis.mapped.ArraySpace`, or anything with its ``zeros`` and
        ``take``) says where the columns live; by default the heap."""

        size = self.mini.size
        args = "args" if self._has_args else "NULL"
        sql = ("SELECT seq, ts_ns, cpu, pid, tid, function_id, phase, object, "
               "ifnull(retval, 0), retval IS NOT NULL, flags, snapshot IS NOT NULL, depth, "
               f"comm, {args}, ifnull(snapshot, zeroblob({size})) FROM events")
        names = ("seq", "ts_ns", "cpu", "pid", "tid", "function_id", "phase", "object",
                 "retval", "has_retval", "flags", "has_snapshot", "depth")
        types = (np.int64, np.int64, np.uint32, np.uint32, np.uint32, np.int32, np.uint8,
                 np.int64, np.int64, bool, np.uint8, bool, np.uint32)
        n = self._span()[0]
        # each column allocated once and filled in place: a copy of ten million
        # events' columns is a gigabyte
        zeros = space.zeros if space is not None else np.zeros
        out: dict[str, Any] = {name: zeros(n, kind) for name, kind in zip(names, types)}
        out["comm"] = zeros(n, np.int32)
        out["args"] = zeros(n, np.int32)
        out["snapshots"] = zeros((n, size), np.uint8)
        comms: dict[str, int] = {}
        texts: dict[Optional[str], int] = {None: -1}
        at = 0

        def put(name: str, values: Any) -> None:
            out[name][at:at + len(values)] = values

        try:
            cursor = self.db.execute(sql)
            while True:
                rows = cursor.fetchmany(chunk)
                if not rows or at + len(rows) > n:
                    break
                cols = list(zip(*rows))
                for k, (name, kind) in enumerate(zip(names, types)):
                    put(name, np.array(cols[k], dtype=kind))
                put("comm", [comms.setdefault(c or "", len(comms)) for c in cols[13]])
                put("args", [texts.setdefault(a, len(texts) - 1) for a in cols[14]])
                put("snapshots", np.frombuffer(b"".join(cols[15]), np.uint8)
                    .reshape(len(rows), size))
                at += len(rows)
            seq = self.db.execute("SELECT max(seq) FROM events").fetchone()[0] or 0
            for (raw,) in (self.db.execute("SELECT raw FROM spool ORDER BY seq")
                           if _spooled(self.db) else ()):
                batch = self._raw_decoder.columns(raw, seq + 1)
                if at + len(batch["seq"]) > n:
                    break
                seq += len(batch["seq"])
                for name in names + ("snapshots",):
                    put(name, batch[name])
                comm_of = np.array([comms.setdefault(c, len(comms))
                                    for c in batch["comm_texts"]], np.int32)
                put("comm", comm_of[batch["comm"]] if len(comm_of) else [])
                text_of = np.array([texts.setdefault(a, len(texts) - 1)
                                    for a in batch["args_texts"]] + [-1], np.int32)
                put("args", text_of[batch["args"]])  # -1 (none) picks the last: -1
                at += len(batch["seq"])
        except sqlite3.DatabaseError as e:
            raise self._damaged(e) from None
        if at < n:  # the file changed under us (a live recording): what was read
            out = {name: column[:at] for name, column in out.items()}
        out["object"] = out["object"].view(np.uint64)
        order = np.lexsort((out["seq"], out["ts_ns"]))
        if (np.diff(order) < 0).any():
            for name in names + ("comm", "args", "snapshots"):
                out[name] = (space.take(out[name], order) if space is not None
                             else out[name][order])
        out["comms"] = list(comms)
        out["args_texts"] = [t for t in texts if t is not None]
        return out

    @functools.cached_property
    def _raw_decoder(self) -> RawDecoder:
        """Decodes the raw events the file holds (its meta says how)."""
        return RawDecoder.from_meta(self.meta)

    @functools.cached_property
    def _has_args(self) -> bool:
        """The events table has the tracepoint arguments' column (schema 1 has not)."""
        return any(r[1] == "args" for r in self.db.execute("PRAGMA table_info(events)"))

    @functools.cached_property
    def head_fields(self) -> Optional[frozenset[str]]:
        """The fields an event flagged `FLAG_HEAD_ONLY` carries: those inside the head
        the meta ``head_read`` names (`ctracer.plan.heads`); None when the trace has
        no such rule."""
        head = self.meta_json("head_read")
        names = head.get("fields") if isinstance(head, dict) else None
        return frozenset(str(n) for n in names) if isinstance(names, list) else None

    def values(self, event: Event) -> Optional[dict[str, Any]]:
        """The decoded mini snapshot of an event, None when the object was unreadable;
        in an event that read only the object's head, the fields outside it are None
        (not read)."""
        if event.snapshot is None or event.flags & FLAG_READ_FAILED:
            return None
        values = self.mini.decode(event.snapshot)
        if event.flags & FLAG_HEAD_ONLY:
            head = self.head_fields or frozenset()
            return {k: (v if k in head else None) for k, v in values.items()}
        return values

    def event_count(self) -> int:
        return self._span()[0]

    def objects(self) -> list[tuple[int, int]]:
        """(object address, event count), most events first."""
        addresses, counts = np.unique(self.event_columns()["object"], return_counts=True)
        order = np.lexsort((addresses, -counts))
        return list(zip(addresses[order].tolist(), counts[order].tolist()))

    def close(self) -> None:
        self.db.close()
