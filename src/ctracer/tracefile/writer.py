"""`TraceWriter`: creates a trace file (0600, without following symlinks, an existing file
kept as ``FILE.old``) and appends to it while recording: the recorder's raw events
committed at once in small transactions, decoded rows (synthetic traces) in batches, a
background checkpoint of SQLite's write-ahead log, and room held back on the file system
to finish the file when the disk fills up."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import uuid
from typing import Any, Iterable, Optional

from ctracer.errors import OutputError
from ctracer.event import FunctionRow
from ctracer.files import create_private_file, keep_old, same_file
from ctracer.tracefile.format import (SCHEMA_VERSION, STATE_RECORDING, STATE_FINISHED, SCHEMA_SQL,
                                      to_sql_u64, RawDecoder, INSERT_EVENTS)


class TraceWriter:
    """Creates a trace file and appends to it.

    Decoded events (`add_event`) are committed every ``batch`` events;
    the recorder's raw events (`add_raw`) are committed at once, and stay raw.  The file is created 0600 with O_EXCL|O_NOFOLLOW; a
    file already at ``path`` is kept as ``path.old`` (`kept_old` names it).  While the
    writer lives it holds an exclusive ``flock`` on the file, which tells readers the
    recording is alive."""

    SPOOL_ROW_EVENTS = 2048
    #: about how many bytes of compact ring records a spool row holds
    SPOOL_ROW_BYTES = 1 << 20
    #: room held back on the trace's file system (`release_reserve`): enough for the
    #: meta saying why a recording stopped and for folding the log in (a few 64 KB pages)
    RESERVE_BYTES = 1 << 20
    #: room left on the file system below which rows written without committing are
    #: committed at once (`_room_is_short`): more than a quarter-second of rows at the
    #: fastest rates measured (~160 MB/s)
    SHORT_ROOM_BYTES = 256 << 20

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
            self.db.executescript(SCHEMA_SQL)
        except sqlite3.Error as e:
            os.close(self._fd)
            raise OutputError(f"cannot create trace file {path}: {e}") from None
        except BaseException:
            os.close(self._fd)
            raise
        self._directory = os.path.dirname(os.path.abspath(path))
        self._reserve = _hold_room(self._directory, self.RESERVE_BYTES)
        self.batch = batch
        self._pending: list[tuple] = []
        self._meta: dict[str, str] = {}
        self._decoder: Optional[RawDecoder] = None
        self._checkpointer: Optional[_Checkpointer] = None
        self.events_written = 0   # decoded into the events table
        self.events_spooled = 0   # raw, committed, not decoded yet
        self._uncommitted = 0     # raw, written by `add_raw` without committing
        self.set_meta(schema_version=SCHEMA_VERSION, state=STATE_RECORDING,
                      recorder_pid=os.getpid(), trace_id=uuid.uuid4().hex)

    def release_reserve(self) -> None:
        """Give the room held back since the file was created to the file system: the
        disk is full, and the meta saying so must still fit."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def set_meta(self, **items: Any) -> None:
        """Write meta entries (JSON for anything not text)."""
        rows = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in items.items()]
        self._meta.update(rows)
        self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", rows)
        self.db.commit()

    def add_functions(self, rows: Iterable[FunctionRow]) -> None:
        """Write the functions table's rows."""
        self.db.executemany(
            "INSERT OR REPLACE INTO functions VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(r.id, r.name, r.unit, r.route_kind, r.route_text, to_sql_u64(r.address), r.attached)
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
            for (raw,) in self.db.execute("SELECT raw FROM spool ORDER BY seq"):
                found |= self._decoder.argument_values(raw, wanted)
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

    def add_raw(self, raw, events: Optional[int] = None,
                starts: Optional[Any] = None, commit: bool = True) -> None:
        """Commit raw events (the ring buffer's bytes, back to back: bytes or any
        bytes-like object, copied before this returns) to the spool; ``events``: how
        many records ``raw`` holds when the caller knows (a compact batch of at most
        `SPOOL_ROW_BYTES` is then committed in one row, not counted again); ``starts``:
        where each of its ring records starts, when known (a longer compact batch is
        then cut into rows without finding its records again).  ``commit`` False: the
        rows are written into the open transaction and `commit` commits them (a
        SIGKILL before that loses them, as it loses what the caller still holds)."""
        if not len(raw):
            return
        self.expect_raw()
        size = self._decoder.size
        if len(raw) % self._decoder.unit:
            raise ValueError("raw events of an unexpected size")
        # small rows: decoding stops within a budget, and a full disk keeps every row
        # before the one that did not fit (a compact trace's rows are cut between its
        # ring records: a row must not split one)
        if self._decoder.deltas is None:
            step = self.SPOOL_ROW_EVENTS * size
            rows = [(raw[at:at + step], None) for at in range(0, len(raw), step)]
        else:
            rows = self._compact_rows(raw, events, starts)
        for row, count in rows:
            # each row committed on its own, written into its blob in place (SQLite
            # would otherwise copy a bound blob twice before writing it)
            cursor = self.db.execute("INSERT INTO spool(raw) VALUES (zeroblob(?))",
                                     (len(row),))
            with self.db.blobopen("spool", "raw", cursor.lastrowid) as blob:
                blob.write(row)
            self._uncommitted += count if count is not None else self._decoder.count(row)
            if commit or self._room_is_short():
                self.commit()

    def _room_is_short(self) -> bool:
        """Whether the trace's file system has less than `SHORT_ROOM_BYTES` left: each
        row is then committed as it is written, because SQLite gives up the whole open
        transaction when a row does not fit (a full disk keeps the rows before it)."""
        try:
            st = os.statvfs(self._directory)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < self.SHORT_ROOM_BYTES

    def commit(self) -> None:
        """Commit the rows `add_raw` wrote without committing."""
        self.db.commit()
        self.events_spooled += self._uncommitted
        self._uncommitted = 0

    def rollback(self) -> None:
        """Give up what was written since the last commit (a full disk)."""
        self.db.rollback()
        self._uncommitted = 0

    def _compact_rows(self, raw, events: Optional[int],
                      starts: Optional[Any]) -> list[tuple[Any, Any]]:
        """``raw`` (compact ring records) cut between records into rows of about
        `SPOOL_ROW_BYTES`, each with the events it holds (None: to be counted)."""
        if len(raw) <= self.SPOOL_ROW_BYTES:
            return [(raw, events)]
        from ctracer.deltas import cut_records

        try:
            return list(cut_records(raw, self._decoder.deltas.shape, self.SPOOL_ROW_BYTES,
                                    starts))
        except ValueError:
            return [(raw, None)]  # counting it says what is wrong with it

    def checkpoint_in_background(self, every_s: float = 0.25) -> None:
        """From now until `close`, a thread with a connection of its own copies the
        committed log into the file every ``every_s`` seconds (a passive checkpoint
        never blocks the writer's commits; SQLite releases the GIL while it copies).
        The log then holds only the last moments of a recording, so closing folds it
        back in quickly even after a flood (every second: 0.43 s to fold in after a
        flood writing 400k events/s; every quarter of a second: 0.1-0.2 s)."""
        if self._checkpointer is None:
            self._checkpointer = _Checkpointer(self.path, every_s)

    def checkpoint_soon(self) -> None:
        """Ask the background checkpoint (`checkpoint_in_background`) to run now: a
        recorder calls this after committing what it held, so the log is folded in
        before its next commit and SQLite then writes it again from its beginning
        (the log grows only while commits come faster than it is folded in)."""
        if self._checkpointer is not None:
            self._checkpointer.kick()

    def flush(self) -> None:
        """Write the events added since the last flush."""
        if self._pending:
            self.db.executemany(INSERT_EVENTS, self._pending)
            self.events_written += len(self._pending)
            self._pending.clear()
        self.commit()

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
        self._kicked = threading.Event()
        self._every_s = every_s
        self._thread = threading.Thread(target=self._run, name="ctracer-checkpoint",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._kicked.wait(self._every_s)
            self._kicked.clear()
            if self._stop.is_set():
                break
            try:
                self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass  # a full disk or a busy file: the writer meets it and decides

    def kick(self) -> None:
        """Checkpoint now (or once the one in progress is done)."""
        self._kicked.set()

    def stop(self) -> None:
        """Stop (after the checkpoint in progress) and close the connection."""
        self._stop.set()
        self._kicked.set()
        self._thread.join()
        self.db.close()
