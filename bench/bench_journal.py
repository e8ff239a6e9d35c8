#!/usr/bin/env python3
"""What SQLite costs the recorder a megabyte of ring records, for each way the trace file
could be written while recording, in one run: the CPU time (user + system, the whole
process: a checkpoint thread's too) of committing 1 MB spool rows paced as a recording at
2M compact records/s makes them (50 rows every 0.25 s), per MB and per 104-byte record.
Run under the bench lock:

    flock LOCK .venv/bin/python bench/bench_journal.py [--rows 400] [--dir DIR]

The ways, each on a fresh file with the trace file's 64 KB pages and its spool table:
* ``wal`` — what `ctracer.tracefile.TraceWriter` does: a write-ahead log, synchronous
  NORMAL, automatic checkpoints off, a thread checkpointing (PASSIVE) after each
  flush's commits, one commit a row (`TraceWriter.add_raw`); the anchor;
* ``wal, one commit a flush`` — the same, the flush's rows in one transaction;
* ``wal, synchronous OFF`` — checkpoints without fsync;
* ``rollback journal (PERSIST), synchronous OFF`` and ``NORMAL`` — no log: each row
  written once into the file, the journal holding only the few pages a commit changes.
Each figure is against the anchor (same run); the ratios are what docs/compact-events.md
quotes for its choice of journal.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sqlite3
import sys
import tempfile
import threading
import time

ROW = 1 << 20
FLUSH_ROWS = 50          # a flush's rows at 2M records/s of 104 bytes (0.25 s)
FLUSH_S = 0.25
RECORD = 104             # bytes a compact record of `trace struct sock` takes in the ring

WAYS = [("wal", "WAL", "NORMAL", "row"),
        ("wal, one commit a flush", "WAL", "NORMAL", "flush"),
        ("wal, synchronous OFF", "WAL", "OFF", "row"),
        ("rollback journal (PERSIST), synchronous OFF", "PERSIST", "OFF", "row"),
        ("rollback journal (PERSIST), synchronous NORMAL", "PERSIST", "NORMAL", "row")]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Checkpoints:
    """A thread checkpointing the log when kicked or every 0.25 s, as the writer's."""

    def __init__(self, path: str):
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.kicked, self.stopping = threading.Event(), False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            self.kicked.wait(FLUSH_S)
            self.kicked.clear()
            if not self.stopping:
                self.db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def stop(self) -> None:
        self.stopping = True
        self.kicked.set()
        self.thread.join()
        self.db.close()


def one_way(directory: str, journal: str, synchronous: str, commits: str,
            rows: int) -> tuple[float, float]:
    """CPU seconds while recording ``rows`` rows, then closing the file."""
    path = os.path.join(directory, "t.ctrace")
    db = sqlite3.connect(path)
    db.execute("PRAGMA page_size=65536")
    db.execute(f"PRAGMA journal_mode={journal}")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE spool(seq INTEGER PRIMARY KEY, raw BLOB NOT NULL)")
    db.commit()
    checkpoints = Checkpoints(path) if journal == "WAL" else None
    data = memoryview(os.urandom(ROW))
    before = _cpu()
    for flush in range(0, rows, FLUSH_ROWS):
        began = time.perf_counter()
        for _ in range(min(FLUSH_ROWS, rows - flush)):
            cursor = db.execute("INSERT INTO spool(raw) VALUES (zeroblob(?))", (ROW,))
            with db.blobopen("spool", "raw", cursor.lastrowid) as blob:
                blob.write(data)
            if commits == "row":
                db.commit()
        db.commit()
        if checkpoints:
            checkpoints.kicked.set()
        time.sleep(max(0.0, FLUSH_S - (time.perf_counter() - began)))
    time.sleep(FLUSH_S)   # the last checkpoint
    recording = _cpu() - before
    if checkpoints:
        checkpoints.stop()
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    closing = _cpu() - before - recording
    os.unlink(path)
    return recording, closing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=400, help="1 MB rows a way (default 400)")
    parser.add_argument("--dir", default=None, help="where the files are written (default: "
                        "the system's temporary directory)")
    args = parser.parse_args()
    if args.rows < FLUSH_ROWS:
        print(f"bench_journal: --rows must be at least {FLUSH_ROWS}", file=sys.stderr)
        return 1
    print("load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    directory = tempfile.mkdtemp(prefix="bench_journal.", dir=args.dir)
    try:
        anchor = None
        for name, journal, synchronous, commits in WAYS:
            recording, closing = one_way(directory, journal, synchronous, commits, args.rows)
            per_mb = recording / args.rows
            anchor = anchor or per_mb
            print(f"{name}: {per_mb * 1e6:,.0f} µs CPU a MB = "
                  f"{per_mb * 1e9 * RECORD / ROW:.1f} ns a record ({per_mb / anchor:.2f}x "
                  f"the first); closing {closing * 1e3:.0f} ms")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
