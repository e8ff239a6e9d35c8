"""Finishing the file of a recorder that died: whether a recorder still holds the file
(`writer_alive`, its ``flock``), folding the write-ahead log back in and marking the trace
interrupted with where it ends (`finish`), and the events' span that says so."""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import sqlite3
from typing import Callable, Optional

import numpy as np

from ctracer.errors import TraceFileError
from ctracer.tracefile.format import STATE_INTERRUPTED, RawDecoder, decode_spool, now_iso


def writer_alive(path: str) -> bool:
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


def finish(path: str, interrupted: bool,
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
                decode_spool(db, RawDecoder.from_meta(meta), progress=progress)
            if interrupted:
                _mark_interrupted(db, meta)
            db.execute("PRAGMA journal_mode=DELETE")
        finally:
            db.close()
    except sqlite3.Error as e:
        raise TraceFileError(f"{path} is damaged: {e}") from None
    finally:
        os.close(fd)


def span(db: sqlite3.Connection, meta: dict[str, str]) -> tuple[int, Optional[int],
                                                                  Optional[int]]:
    """(events, first ts, last ts) of the rows and of the raw events together."""
    count, first, last = db.execute(
        "SELECT count(*), min(ts_ns), max(ts_ns) FROM events").fetchone()
    if spooled(db) and "mini_layout" in meta:
        import numpy as np

        decoder = RawDecoder.from_meta(meta)
        for (raw,) in db.execute("SELECT raw FROM spool"):
            if not isinstance(raw, bytes) or len(raw) % decoder.unit:
                continue  # a damaged batch: `Trace` says so when it reads the events
            try:
                ts = decoder.timestamps(raw)
            except (ValueError, TraceFileError):
                continue
            if len(ts):
                count += len(ts)
                low, high = int(ts.min()), int(ts.max())
                first = low if first is None else min(first, low)
                last = high if last is None else max(last, high)
    return count, first, last


def _mark_interrupted(db: sqlite3.Connection, meta: dict[str, str]) -> None:
    last = span(db, meta)[::2]
    ended = wall_time(meta, last[1]) if last[1] is not None else ""
    entries = [
        ("state", STATE_INTERRUPTED),
        ("stopped_by", meta.get("stopped_by")  # "disk full" is kept
         or "killed: the recorder died before finishing the file; the trace ends at "
            "its last committed event"),
        ("events", json.dumps(last[0])),
        ("last_event_ns", json.dumps(last[1])),
        ("finished_by_reader", now_iso())]
    if ended and "end_time" not in meta:
        entries.append(("end_time", ended))
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", entries)
    db.commit()


def spooled(db: sqlite3.Connection) -> bool:
    """Raw events left in the spool (a schema 1 file has no spool)."""
    try:
        return db.execute("SELECT 1 FROM spool LIMIT 1").fetchone() is not None
    except sqlite3.OperationalError:
        return False


def wall_time(meta: dict[str, str], ts_ns: int) -> str:
    """The wall-clock time of a probe timestamp (CLOCK_MONOTONIC of the recording host),
    from the start times the recorder wrote; "" when they are missing."""
    try:
        start = datetime.datetime.fromisoformat(meta["start_time"])
        start_ns = int(meta["start_monotonic_ns"])
    except (KeyError, ValueError):
        return ""
    at = start + datetime.timedelta(microseconds=(ts_ns - start_ns) / 1000)
    return at.isoformat(timespec="milliseconds")
