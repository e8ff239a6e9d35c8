#!/usr/bin/env python3
"""What the flame view's stack trees cost the report, as a ratio to the call-graph
counting beside them (`analysis.callgraph.grouped_call_counts`, which the report ran
before them), both over the same analysed trace, per object and over all objects:

    .venv/bin/python bench/bench_stacks.py                  # the 1M synthetic flood
    .venv/bin/python bench/bench_stacks.py --trace k.ctrace  # any trace
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from ctracer import analysis  # noqa: E402
from ctracer.analysis.callgraph import call_counts, grouped_call_counts  # noqa: E402
from ctracer.analysis.stacks import all_objects_tree, object_trees  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace")
    args = ap.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="ctracer-stacks-") as work:
        trace = args.trace
        if trace is None:
            from support.synthetic_trace import write_synthetic_trace

            trace = os.path.join(work, "big.ctrace")
            write_synthetic_trace(trace, threads=4, lifecycles=675, sends=66,
                                  addresses_per_thread=2, raw=True)
        a = analysis.load(trace)
        ev = a.events
        chosen = list(range(len(a.objects)))
        print(f"{len(ev)} events, {len(chosen)} objects (load average {os.getloadavg()[0]:.1f})")
        start = time.perf_counter()
        positions, offsets = a.objects.event_groups(chosen)
        grouped_call_counts(ev, positions, offsets, ev.object_caller)
        call_counts(ev, np.arange(len(ev)), ev.thread_caller)
        anchor = time.perf_counter() - start
        start = time.perf_counter()
        trees = object_trees(a, chosen)
        per_object = time.perf_counter() - start
        start = time.perf_counter()
        whole = all_objects_tree(a)
        every = time.perf_counter() - start
        print(f"anchor (the call graphs' counts, per object and over all): {anchor:.2f} s")
        print(f"  stack trees per object {per_object:6.2f} s = {per_object / anchor:5.2f} x anchor "
              f"({sum(len(t) for t in trees)} nodes)")
        print(f"  stack tree of all      {every:6.2f} s = {every / anchor:5.2f} x anchor "
              f"({len(whole)} nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
