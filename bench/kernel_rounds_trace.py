#!/usr/bin/env python3
"""A big kernel-shaped trace for the call-graph benchmark: a real kernel trace's raw
events (every method of a struct, recorded in a guest) written ``--rounds`` times over,
each round later than the last, and each round cut into ``--slices`` spans of time whose
objects get addresses of their own (the address plus a multiple of 2**32): one
tcploop run of 30 sockets becomes thousands of objects with the kernel's real call
stacks.  A call cut by a slice's edge reads as a lost entry or exit, as in a real trace
that lost events.  Return values equal to an object's address (what creation functions
return) are moved with it.

    .venv/bin/python bench/kernel_rounds_trace.py k.ctrace /tmp/k1m.ctrace --events 1000000 --objects 10000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from ctracer.tracefile import RawDecoder  # noqa: E402


def write_rounds(source: str, path: str, events: int, objects: int) -> tuple[int, int]:
    """Write the trace at ``path``; return its events and distinct addresses."""
    import numpy as np

    shutil.copyfile(source, path)
    db = sqlite3.connect(path)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    decoder = RawDecoder.from_meta(meta)
    raw = b"".join(r for (r,) in db.execute("SELECT raw FROM spool ORDER BY seq"))
    base = np.frombuffer(raw, decoder.dtype).copy()
    base = base[np.argsort(base["ts_ns"], kind="stable")]
    n = len(base)
    rounds = max(1, -(-events // n))
    addresses = np.unique(base["object"][base["object"] != 0])
    per_round = max(1, objects // rounds)
    slices = max(1, -(-per_round // max(1, len(addresses))) * 3)  # not every object is in every slice
    first, last = int(base["ts_ns"][0]), int(base["ts_ns"][-1])
    span = last - first + 1_000_000
    cut = np.searchsorted(base["ts_ns"], first + (np.arange(1, slices) * (span // slices)))
    slice_of = np.zeros(n, np.int64)
    for c in cut.tolist():
        slice_of[c:] += 1
    is_address = np.isin(base["retval"], addresses)
    db.execute("DELETE FROM spool")
    written, seen = 0, set()
    for r in range(rounds):
        a = base.copy()
        a["ts_ns"] += r * span
        shift = (np.uint64(1) << np.uint64(32)) * (r * slices + slice_of + 1).astype(np.uint64)
        has = a["object"] != 0
        a["object"][has] += shift[has]
        a["retval"][is_address] = (a["retval"][is_address].astype(np.uint64)
                                   + shift[is_address]).astype(a["retval"].dtype)
        take = min(n, events - written)
        a = a[:take]
        seen.update(np.unique(a["object"][a["object"] != 0]).tolist())
        for at in range(0, len(a), 65536):
            db.execute("INSERT INTO spool(raw) VALUES (?)", (a[at:at + 65536].tobytes(),))
        written += take
        db.commit()
    db.execute("UPDATE meta SET value = ? WHERE key = 'events'", (str(written),))
    db.execute("UPDATE meta SET value = ? WHERE key = 'lost_events'", ("0",))
    db.commit()
    db.execute("VACUUM")
    db.close()
    return written, len(seen)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a kernel trace file (raw events)")
    ap.add_argument("path")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--objects", type=int, default=10_000, help="about this many addresses")
    args = ap.parse_args()
    if os.path.exists(args.path):
        ap.error(f"{args.path} exists")
    n, addresses = write_rounds(args.source, args.path, args.events, args.objects)
    print(f"{args.path}: {n:,} events, {addresses:,} addresses, "
          f"{os.path.getsize(args.path) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
