#!/usr/bin/env python3
"""How long `ctracer diff` takes on two big traces, as a ratio to an anchor measured in
the same run: reading and decoding every event of both traces once, one by one, one
after the other (`bench_report.anchor_seconds` on each).  The goal (issue 17): two
1M-event traces diff in no more than the time of reading both.  Prints the anchor, the
diff (the whole command, as a user runs it: wall, CPU of every process, the largest
process's peak memory) and their ratios; run with the project's venv:

    .venv/bin/python bench/bench_diff.py                    # two synthetic 1M-event traces
    .venv/bin/python bench/bench_diff.py --dir /tmp/d       # keep (or reuse) them there
    .venv/bin/python bench/bench_diff.py --traces a.ctrace b.ctrace --rounds 3

The diff builds each trace's model in a helper process, two at a time: its CPU time is
the sum over both, its wall time what a user waits.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

from bench_report import SHAPES, anchor_seconds  # noqa: E402


def _children() -> tuple[float, float]:
    """CPU seconds and peak RSS (MB, the largest child) of the waited-for children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def diff_seconds(before: str, after: str, out: str) -> tuple[float, float, float]:
    """Wall and CPU seconds of `ctracer diff` and its helpers, and their peak MB."""
    cpu_before, _ = _children()
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ctracer", "diff", before, after, "-o", out,
                        "--limit", "5"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"ctracer diff failed: {r.stderr.strip()}")
    cpu_after, peak = _children()
    return wall, cpu_after - cpu_before, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="diff these instead of two synthetic traces")
    ap.add_argument("--shape", choices=SHAPES, default="flood",
                    help="the synthetic traces' shape (bench_report's; default flood: "
                         "~1M events, 2,700 objects)")
    ap.add_argument("--dir", help="keep the synthetic traces here (reused when present)")
    ap.add_argument("--rounds", type=int, default=1, help="anchor and diff this many times")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="ctracer-bench-diff-")
    os.makedirs(work, exist_ok=True)
    try:
        if args.traces:
            before, after = args.traces
        else:
            from support.synthetic_trace import write_synthetic_trace

            threads, lifecycles, sends, addresses = SHAPES[args.shape]
            before, after = (os.path.join(work, f"{n}.ctrace") for n in ("before", "after"))
            for path, seed in ((before, 1), (after, 2)):
                if not os.path.exists(path):
                    print(f"writing {path} ...", file=sys.stderr)
                    write_synthetic_trace(path, threads=threads, lifecycles=lifecycles,
                                          sends=sends, addresses_per_thread=addresses,
                                          seed=seed)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        for round_ in range(1, args.rounds + 1):
            a_wall = a_cpu = 0.0
            events = 0
            for path in (before, after):
                wall, cpu, n = anchor_seconds(path)
                a_wall, a_cpu, events = a_wall + wall, a_cpu + cpu, events + n
            wall, cpu, peak = diff_seconds(before, after, os.path.join(work, "diff"))
            print(f"round {round_}: {events} events in two traces (load average "
                  f"{os.getloadavg()[0]:.1f})")
            print(f"  anchor (read + decode every event of both, one by one): "
                  f"{a_wall:6.2f} s wall, {a_cpu:6.2f} cpu s")
            print(f"  ctracer diff:                                          "
                  f"{wall:6.2f} s wall, {cpu:6.2f} cpu s, {peak:.0f} MB peak (largest process)")
            print(f"  ratio: {wall / a_wall:.2f}x the anchor's wall time (goal <= 1), "
                  f"{cpu / a_cpu:.2f}x its cpu time")
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
