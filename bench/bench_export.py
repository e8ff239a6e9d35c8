#!/usr/bin/env python3
"""What exporting costs, on a big synthetic trace, as ratios to an anchor measured in
the same run: reading and decoding every event of the trace once, one by one in Python
(`Trace.events` + `Trace.values`, what any consumer must at least do).  Prints one line
per stage; run with the project's venv:

    .venv/bin/python bench/bench_export.py              # ~200k events
    .venv/bin/python bench/bench_export.py --sends 950  # ~1M events
    .venv/bin/python bench/bench_export.py --trace big.ctrace --commands parquet jsonl

Stages: the analysis (with the snapshots), the event table of every row at once (what
`ctracer sql` registers), then each writer on the batches of rows
(`ctracer.export.table.event_tables`, as `ctracer export` writes them), the process's
peak memory after each.  With ``--commands`` each format is instead exported by
``ctracer export`` in a process of its own: its wall time, its peak RSS (its
``ru_maxrss``, from ``wait4``: it counts the pages of the analysis' mapped arrays, which
the kernel may drop) and its peak anonymous memory (`anon_memory`, sampled).  ``--trace`` exports a trace made elsewhere
(`rounds_trace.py` makes a 10M-event one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from ctracer import analysis  # noqa: E402
from ctracer.export import parquet, perfetto, text  # noqa: E402
from ctracer.export.table import event_table, event_tables  # noqa: E402
from ctracer.tracefile import Trace  # noqa: E402
from support.synthetic_trace import write_synthetic_trace  # noqa: E402
from anon_memory import AnonSampler  # noqa: E402


def anchor_seconds(path: str) -> float:
    start = time.perf_counter()
    trace = Trace(path)
    for event in trace.events():
        trace.values(event)
    trace.close()
    return time.perf_counter() - start


def peak_mb() -> float:
    """This process's peak resident memory so far (VmHWM), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_command(trace: str, fmt: str, out: str) -> tuple[float, float, float]:
    """``ctracer export`` of ``trace`` as ``fmt`` in a process of its own: wall seconds,
    peak RSS and peak anonymous memory (MB)."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "src"))
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ctracer", "export", trace, "--format",
                             fmt, "-o", out], env=env, stderr=subprocess.DEVNULL)
    with AnonSampler(proc.pid) as anon:
        _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"ctracer export --format {fmt} failed ({proc.returncode})")
    return took, usage.ru_maxrss / 1024, anon.tree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sends", type=int, default=190, help="sends per lifecycle (size)")
    ap.add_argument("--trace", help="export this trace instead of making one")
    ap.add_argument("--commands", nargs="+", metavar="FORMAT",
                    choices=("parquet", "jsonl", "csv", "perfetto"),
                    help="run `ctracer export` per format in its own process instead")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctracer-bench-export-")
    try:
        path = args.trace
        if path is None:
            path = os.path.join(work, "big.ctrace")
            write_synthetic_trace(path, threads=4, lifecycles=50, sends=args.sends,
                                  addresses_per_thread=8, raw=True)
        size = os.path.getsize(path) / 1e6
        print(f"trace: {path}, {size:.0f} MB (load average {os.getloadavg()[0]:.1f})")
        anchor = anchor_seconds(path)
        print(f"anchor: reading and decoding every event one by one: {anchor:.2f} s")
        names = {"parquet": "big.parquet", "jsonl": "b.jsonl", "csv": "b.csv",
                 "perfetto": "b.json"}
        if args.commands:
            for fmt in args.commands:
                out = os.path.join(work, names[fmt])
                took, peak, anon = run_command(path, fmt, out)
                print(f"ctracer export --format {fmt}: {took:.2f} s = {took / anchor:.2f}x "
                      f"the anchor; peak anonymous memory {anon:.0f} MB (RSS {peak:.0f} MB "
                      f"with mapped pages); {os.path.getsize(out) / 1e6:.1f} MB")
                os.unlink(out)
            return 0

        def stage(name: str, fn) -> None:
            start = time.perf_counter()
            fn()
            took = time.perf_counter() - start
            print(f"{name}: {took:.2f} s = {took / anchor:.2f}x the anchor; "
                  f"peak so far {peak_mb():.0f} MB")

        holder = {}
        stage("analysis (ctracer.analysis.load, with the snapshots)",
              lambda: holder.setdefault("a", analysis.load(path, snapshots=True)))
        analysed = holder["a"]
        print(f"  {len(analysed.events):,} events, {len(analysed.objects):,} objects")
        stage("parquet file (pyarrow, zstd, in batches)",
              lambda: parquet.write_parquet(event_tables(analysed),
                                            os.path.join(work, "big.parquet")))
        stage("parquet, Hive partitioned",
              lambda: parquet.write_parquet(event_tables(analysed),
                                            os.path.join(work, "dataset")))
        stage("jsonl (DuckDB, in batches)",
              lambda: text.write_jsonl(event_tables(analysed), os.path.join(work, "b.jsonl")))
        stage("csv (DuckDB, in batches)",
              lambda: text.write_csv(event_tables(analysed), os.path.join(work, "b.csv")))
        stage("perfetto (JSON)",
              lambda: perfetto.write_perfetto(analysed, os.path.join(work, "b.json")))
        stage("event table of every row at once (what ctracer sql registers)",
              lambda: holder.setdefault("t", event_table(analysed)))
        for name in ("big.parquet", "b.jsonl", "b.csv", "b.json"):
            print(f"  {name}: {os.path.getsize(os.path.join(work, name)) / 1e6:.1f} MB")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
