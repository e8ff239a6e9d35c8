#!/usr/bin/env python3
"""How long `ctracer report` takes, and its peak memory, on a big synthetic trace, as
ratios to an anchor measured in the same run: reading and decoding every event of the
trace once, one by one (the least a report built event by event must do).  Prints one
line per stage, the output's size and its largest file; run with the project's venv:

    .venv/bin/python bench/bench_report.py                 # 1M events, 2,700 objects
    .venv/bin/python bench/bench_report.py --shape long    # ~200k events, 200 objects
    .venv/bin/python bench/bench_report.py --shape tenk    # ~400k events, 10,000 objects
    .venv/bin/python bench/bench_report.py --trace big.ctrace --keep   # reuse a trace
    .venv/bin/python bench/rounds_trace.py /tmp/big10.ctrace --rounds 10   # 10M events
    .venv/bin/python bench/bench_report.py --trace /tmp/big10.ctrace

The goal (issue 16): the 1M-event trace in <= 15 s and <= 600 MB, the 10M one in <= 10x
the 1M time and <= 1 GB, on a 2-core machine, no HTML file over 2 MB.  Memory is the
anonymous memory of the renderer and its helpers together (`anon_memory`): a big
trace's arrays are mapped files, whose pages peak RSS counts but the kernel can drop.  The anchor makes runs on a loaded machine comparable.
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
from ctracer.tracefile import Trace  # noqa: E402
from anon_memory import AnonSampler  # noqa: E402

#: name -> (threads, lifecycles per thread, sends per lifecycle, addresses per thread)
SHAPES = {
    "flood": (4, 675, 66, 2),   # ~1M events on 2,700 objects, 8 addresses reused
    "long": (4, 50, 190, 8),    # ~200k events on 200 objects of ~1000 events each
    "many": (4, 1000, 2, 16),   # ~4000 objects of ~30 events
    "tenk": (4, 2500, 1, 16),   # ~10,000 objects of ~40 events (the index's object list)
}


def anchor_seconds(path: str) -> tuple[float, float, int]:
    """Wall and CPU seconds of reading and decoding every event once, and the count
    (in a child process: its memory is not the renderer's)."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        return pool.apply(_anchor, (path,))


def _anchor(path: str) -> tuple[float, float, int]:
    start, cpu = time.perf_counter(), time.process_time()
    trace = Trace(path)
    n = 0
    for event in trace.events():
        trace.values(event)
        n += 1
    trace.close()
    return time.perf_counter() - start, time.process_time() - cpu, n


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def tree_size(path: str) -> tuple[int, int, int, str]:
    files = size = biggest = 0
    name = ""
    for d, _, names in os.walk(path):
        for n in names:
            p = os.path.join(d, n)
            s = os.path.getsize(p)
            files += 1
            size += s
            if s > biggest and n.endswith(".html"):
                biggest, name = s, os.path.relpath(p, path)
    return files, size, biggest, name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="flood")
    ap.add_argument("--trace", help="render this trace instead of making one")
    ap.add_argument("--keep", action="store_true", help="keep the report (path printed)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctracer-bench-")
    try:
        trace = args.trace
        if trace is None:
            from support.synthetic_trace import write_synthetic_trace

            threads, lifecycles, sends, addresses = SHAPES[args.shape]
            trace = os.path.join(work, "big.ctrace")
            write_synthetic_trace(trace, threads=threads, lifecycles=lifecycles,
                                  sends=sends, addresses_per_thread=addresses, raw=True)
        load = os.getloadavg()[0]
        anchor, anchor_cpu, events = anchor_seconds(trace)
        out = os.path.join(work, "callgraph", "sock")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        cpu_before = _cpu_seconds()
        with AnonSampler() as anon:
            result = render_report(trace, out)
        cpu = _cpu_seconds() - cpu_before
        files, size, biggest, name = tree_size(out)
        s = result.seconds
        print(f"{result.events} events, {result.objects_total} objects, "
              f"{result.objects_rendered} with pages (load average {load:.1f} on "
              f"{os.cpu_count()} cores)")
        print(f"anchor (read + decode every event once, one by one): {anchor:.2f} s")
        for stage, what in (("model", "model"), ("graphs", "graphs"),
                            ("html", "pages (HTML, data files and plots)"), ("total", "total")):
            line = f"  {s.get(stage, 0):7.2f} s  = {s.get(stage, 0) / anchor:5.2f} x anchor: {what}"
            if f"{stage}_cpu" in s:
                line += f"; {s[stage + '_cpu']:.2f} cpu s"
            print(line)
        print(f"  ({s.get('plots', 0):.2f} s of the pages' time went to plots, summed over "
              "the helper processes)")
        print(f"  cpu     {cpu:7.2f} s  = {cpu / anchor_cpu:5.2f} x the anchor's "
              f"{anchor_cpu:.2f} cpu s (renderer and helpers, user + system: steadier "
              "under load than wall time)")
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"  peak anonymous memory: {anon.tree:.0f} MB (renderer and helpers together, "
              f"proportional; sampled {anon.samples} times), {anon.own:.0f} MB the renderer's")
        print(f"  peak RSS: {own:.0f} MB (renderer; {before:.0f} MB before rendering), "
              f"{kids:.0f} MB (largest child: a helper process, or the anchor's); RSS "
              "counts the pages of the mapped arrays, which the kernel can drop")
        print(f"  output: {files} files, {size / 1e6:.0f} MB; largest HTML {name} "
              f"{biggest / 1e6:.2f} MB")
        print(f"  index.html {os.path.getsize(os.path.join(out, 'index.html')) / 1e3:.1f} KB, "
              f"its object list objects.js "
              f"{os.path.getsize(os.path.join(out, 'objects.js')) / 1e6:.2f} MB")
        if args.keep:
            print(f"report kept at {out}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
