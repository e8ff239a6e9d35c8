"""`Trace`: a trace file opened for reading, the only thing the analysis needs.  Opening
checks that the file is a ctracer trace of a schema this version reads, reports a
damaged, truncated or newer file in one line, and finishes the file of a killed
recorder first (`ctracer.tracefile.recovery`)."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ctracer.errors import TraceFileError
from ctracer.event import FLAG_HEAD_ONLY, FLAG_READ_FAILED, FunctionRow, Layout
from ctracer.tracefile.format import (READABLE_VERSIONS, STATE_RECORDING, STATE_FINISHED,
                                      SQLITE_MAGIC, from_sql_u64, Event, RawDecoder, EVENT_CHECKS,
                                      ARGS_CHECK, FUNCTION_CHECKS)
from ctracer.tracefile.recovery import writer_alive, finish, span, spooled, wall_time
from ctracer.tracefile.meta import TraceMeta


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
        if not header.startswith(SQLITE_MAGIC):
            raise TraceFileError(f"{path} is not a ctracer trace file")
        if not os.path.exists(path + "-wal"):
            _check_not_truncated(path, header)
        self.path = path
        self.db, self.meta = self._open()
        recording = self.meta.get("state") == STATE_RECORDING
        rows_schema = str(self.meta.get("schema_version")) in ("2", "3")  # spool moved to rows
        if ((recording or (rows_schema and spooled(self.db)))
                and not writer_alive(path)):
            self.db.close()
            finish(path, recording, progress, decode=rows_schema)
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
                                  from_sql_u64(r[5]), r[6] or "")
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
        events = EVENT_CHECKS + (ARGS_CHECK if self._has_args else "")
        bad = self.db.execute(f"SELECT seq FROM events WHERE {events} LIMIT 1",
                              {"size": self.mini.size}).fetchone()
        if bad is not None:
            raise TraceFileError(f"{self.path} is damaged: event {bad[0]} holds a value of "
                                 "the wrong type or range")
        if spooled(self.db):
            bad = self.db.execute("SELECT seq FROM spool WHERE typeof(raw) != 'blob' OR "
                                  "length(raw) % :size != 0 LIMIT 1",
                                  {"size": self._raw_decoder.unit}).fetchone()
            if bad is not None:
                raise TraceFileError(f"{self.path} is damaged: its raw events {bad[0]} are "
                                     "not a whole number of events")
        bad = self.db.execute(f"SELECT id FROM functions WHERE {FUNCTION_CHECKS} "
                              "LIMIT 1").fetchone()
        if bad is not None:
            raise TraceFileError(f"{self.path} is damaged: function row {bad[0]!r} holds a "
                                 "value of the wrong type")

    def _open(self) -> tuple[sqlite3.Connection, TraceMeta]:
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
            meta = TraceMeta(db.execute("SELECT key, value FROM meta").fetchall(), path)
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
        wall = wall_time(self.meta, last)
        if self.meta.get("stopped_by") == "disk full":
            return (f"incomplete: the disk filled up while recording; it holds the {count} "
                    f"events written before that and ends at {wall + ', ' if wall else ''}"
                    f"{where}")
        return (f"incomplete: the recorder was killed before it finished the file; it "
                f"holds the {count} events committed before that and ends at "
                f"{wall + ', ' if wall else ''}{where}")


    @property
    def struct_name(self) -> str:
        """The name of the struct traced."""
        return self.meta.struct_name

    @functools.cached_property
    def trace_id(self) -> str:
        """The trace's id (`trace_id_of` its meta)."""
        return self.meta.trace_id

    @property
    def struct_kind(self) -> str:
        """``struct`` or ``union``."""
        return self.meta.struct_kind

    def meta_json(self, key: str, default: Any = None) -> Any:
        """The meta entry ``key`` decoded from JSON (`TraceMeta.json`)."""
        return self.meta.json(key, default)

    def _span(self) -> tuple[int, Optional[int], Optional[int]]:
        try:
            return span(self.db, self.meta)
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
                    try:
                        put(name, np.array(cols[k], dtype=kind))
                    except (OverflowError, ValueError, TypeError) as e:
                        raise self._damaged(f"events.{name} holds a value no recorder "
                                            f"writes ({e})") from None
                put("comm", [comms.setdefault(c or "", len(comms)) for c in cols[13]])
                put("args", [texts.setdefault(a, len(texts) - 1) for a in cols[14]])
                put("snapshots", np.frombuffer(b"".join(cols[15]), np.uint8)
                    .reshape(len(rows), size))
                at += len(rows)
            seq = self.db.execute("SELECT max(seq) FROM events").fetchone()[0] or 0
            decoder = self._raw_decoder.fresh()  # a compact trace rebuilds from its start
            rows = self.db.execute("SELECT raw FROM spool ORDER BY seq") \
                if spooled(self.db) else ()
            for raw in (piece for (row,) in rows for piece in decoder.pieces(row)):
                batch = decoder.columns(raw, seq + 1)
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
        head = self.meta.head_read
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
        """How many events the trace holds."""
        return self._span()[0]

    def objects(self) -> list[tuple[int, int]]:
        """(object address, event count), most events first."""
        addresses, counts = np.unique(self.event_columns()["object"], return_counts=True)
        order = np.lexsort((addresses, -counts))
        return list(zip(addresses[order].tolist(), counts[order].tolist()))

    def close(self) -> None:
        """Close the trace file."""
        self.db.close()
