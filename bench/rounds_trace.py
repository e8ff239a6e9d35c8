#!/usr/bin/env python3
"""A big trace for the benchmarks: a synthetic trace's raw events written ``--rounds``
times over, each round later than the last (its timestamps shifted past the previous
round's end), so a 1M-event trace of 2,700 objects becomes a 10M-event one of 27,000
(every round's objects are new lifetimes of the same reused addresses):

    .venv/bin/python bench/rounds_trace.py /tmp/big10.ctrace --rounds 10
    .venv/bin/python bench/bench_report.py --trace /tmp/big10.ctrace

The base trace is `bench_report.py`'s shape (``--shape``, default the 1M flood).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from ctracer.tracefile import RawDecoder  # noqa: E402

#: name -> (threads, lifecycles per thread, sends per lifecycle, addresses per thread)
SHAPES = {
    "flood": (4, 675, 66, 2),   # ~1M events on 2,700 objects, 8 addresses reused
    "long": (4, 50, 190, 8),    # ~200k events on 200 objects of ~1000 events each
}


def write_rounds(path: str, rounds: int, shape: str = "flood") -> int:
    """Write the trace at ``path``; return its number of events."""
    import numpy as np
    from support.synthetic_trace import write_synthetic_trace

    threads, lifecycles, sends, addresses = SHAPES[shape]
    write_synthetic_trace(path, threads=threads, lifecycles=lifecycles, sends=sends,
                          addresses_per_thread=addresses, raw=True)
    db = sqlite3.connect(path)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    decoder = RawDecoder.from_meta(meta)
    blobs = [raw for (raw,) in db.execute("SELECT raw FROM spool ORDER BY seq")]
    first = min(int(np.frombuffer(b, decoder.dtype)["ts_ns"].min()) for b in blobs)
    last = max(int(np.frombuffer(b, decoder.dtype)["ts_ns"].max()) for b in blobs)
    span = last - first + 1_000_000
    events = sum(decoder.count(b) for b in blobs)
    for r in range(1, rounds):
        for b in blobs:
            a = np.frombuffer(b, decoder.dtype).copy()
            a["ts_ns"] += r * span
            db.execute("INSERT INTO spool(raw) VALUES (?)", (a.tobytes(),))
        db.commit()
    db.execute("UPDATE meta SET value = ? WHERE key = 'events'", (str(events * rounds),))
    db.execute("UPDATE meta SET value = ? WHERE key = 'ended_at'",
               (str(float(meta["started_at"]) + rounds * span / 1e9),))
    db.commit()
    db.close()
    return events * rounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--shape", choices=SHAPES, default="flood")
    args = ap.parse_args()
    if os.path.exists(args.path):
        ap.error(f"{args.path} exists")
    n = write_rounds(args.path, args.rounds, args.shape)
    print(f"{args.path}: {n:,} events, {os.path.getsize(args.path) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
