#!/usr/bin/env python3
"""What exporting costs, on a big synthetic trace, as ratios to an anchor measured in
the same run: reading and decoding every event of the trace once, one by one in Python
(`Trace.events` + `Trace.values`, what any consumer must at least do).  Prints one line
per stage; run with the project's venv:

    .venv/bin/python bench/bench_export.py              # ~200k events
    .venv/bin/python bench/bench_export.py --sends 950  # ~1M events

Stages: the event table (the report stage's passes, then every snapshot field decoded at
once with the numpy dtype of the event layout), and each writer on that table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from ctracer import analysis  # noqa: E402
from ctracer.export import parquet, perfetto, text  # noqa: E402
from ctracer.export.table import event_table  # noqa: E402
from ctracer.tracefile import Trace  # noqa: E402
from synthetic_trace import write_synthetic_trace  # noqa: E402


def anchor_seconds(path: str) -> float:
    start = time.perf_counter()
    trace = Trace(path)
    for event in trace.events():
        trace.values(event)
    trace.close()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sends", type=int, default=190, help="sends per lifecycle (size)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctracer-bench-export-")
    try:
        path = os.path.join(work, "big.ctrace")
        truth = write_synthetic_trace(path, threads=4, lifecycles=50, sends=args.sends,
                                      addresses_per_thread=8, raw=True)
        print(f"trace: {truth.events:,} events, {len(truth.lifetimes)} objects, "
              f"{os.path.getsize(path) / 1e6:.0f} MB")
        anchor = anchor_seconds(path)
        print(f"anchor: reading and decoding every event one by one: {anchor:.2f} s")

        def stage(name: str, fn) -> None:
            start = time.perf_counter()
            fn()
            took = time.perf_counter() - start
            print(f"{name}: {took:.2f} s = {took / anchor:.2f}x the anchor")

        holder = {}
        stage("analysis (ctracer.analysis.load, with the snapshots)",
              lambda: holder.setdefault("a", analysis.load(path, snapshots=True)))
        analysed = holder["a"]
        stage("event table (numpy decode of the snapshots)",
              lambda: holder.setdefault("t", event_table(analysed)))
        table = holder["t"]
        stage("parquet file (pyarrow, zstd)",
              lambda: parquet.write_parquet(table, os.path.join(work, "big.parquet")))
        stage("parquet, Hive partitioned",
              lambda: parquet.write_parquet(table, os.path.join(work, "dataset")))
        stage("jsonl (DuckDB)", lambda: text.write_jsonl(table, os.path.join(work, "b.jsonl")))
        stage("csv (DuckDB)", lambda: text.write_csv(table, os.path.join(work, "b.csv")))
        stage("perfetto (JSON)",
              lambda: perfetto.write_perfetto(analysed, os.path.join(work, "b.json")))
        for name in ("big.parquet", "b.jsonl", "b.csv", "b.json"):
            print(f"  {name}: {os.path.getsize(os.path.join(work, name)) / 1e6:.1f} MB")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak memory: {peak:.0f} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
