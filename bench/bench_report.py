#!/usr/bin/env python3
"""How long `ctracer callgraph` takes on big synthetic traces, as ratios to an anchor
measured in the same run: reading and decoding every event of the trace once (the least
any report must do).  Prints one line per stage; run with the project's venv:

    .venv/bin/python bench/bench_report.py            # ~200k events, 200 objects
    .venv/bin/python bench/bench_report.py --shape many   # ~4000 small objects
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

from ctracer.report import render_report  # noqa: E402
from synthetic_trace import write_synthetic_trace  # noqa: E402
from ctracer.tracefile import Trace  # noqa: E402

#: name -> (threads, lifecycles per thread, sends per lifecycle, addresses per thread)
SHAPES = {
    "long": (4, 50, 190, 8),    # ~200k events on 200 objects of ~1000 events each
    "many": (4, 1000, 2, 16),   # ~4000 objects of ~30 events, most without pages
}


def anchor_seconds(path: str) -> float:
    start = time.perf_counter()
    trace = Trace(path)
    for event in trace.events():
        trace.values(event)
    trace.close()
    return time.perf_counter() - start


def tree_size(path: str) -> tuple[int, int]:
    files = size = 0
    for d, _, names in os.walk(path):
        for n in names:
            files += 1
            size += os.path.getsize(os.path.join(d, n))
    return files, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="long")
    ap.add_argument("--max-objects", type=int, default=200)
    ap.add_argument("--keep", action="store_true", help="keep the report (path printed)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctracer-bench-")
    try:
        threads, lifecycles, sends, addresses = SHAPES[args.shape]
        trace = os.path.join(work, "big.ctrace")
        truth = write_synthetic_trace(trace, threads=threads, lifecycles=lifecycles,
                                      sends=sends, addresses_per_thread=addresses)
        anchor = anchor_seconds(trace)
        out = os.path.join(work, "callgraph", "sock")
        result = render_report(trace, out, max_objects=args.max_objects or None)
        files, size = tree_size(out)
        s = result.seconds
        print(f"shape {args.shape}: {result.events} events, {result.objects_total} objects, "
              f"{result.objects_rendered} with pages, {len(truth.changes)} field changes")
        print(f"anchor (read + decode every event once): {anchor:.2f} s")
        for stage in ("model", "html", "graphs", "plots", "total"):
            print(f"  {stage:<7} {s[stage]:7.2f} s  = {s[stage] / anchor:6.1f} x anchor")
        per_k = 1e6 / max(result.events, 1)  # seconds per event -> ms per 1000 events
        print(f"  per 1000 events: {s['total'] * per_k:.0f} ms in all, "
              f"{(s['model'] + s['html']) * per_k:.0f} ms without graphs and plots")
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"  peak memory: {own:.0f} MB (renderer), {kids:.0f} MB (largest helper process)")
        print(f"  output: {files} files, {size / 1e6:.1f} MB")
        if args.keep:
            print(f"report kept at {out}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
