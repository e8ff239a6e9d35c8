#!/usr/bin/env python3
"""``--calls changes`` against ``--calls all`` on the same deterministic workload (needs
root; run with the project's venv):

    .venv/bin/python bench/bench_calls.py [--loops N]

The sample (one thread, no address randomisation) is recorded twice, once writing every
call (the anchor) and once folding the calls that changed nothing.  Prints, for each:
events written, trace file bytes, folded calls; the per-(object, function) call counts
must be equal (the script fails otherwise); and the ratios of events and bytes of
``changes`` to ``all`` measured in this run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "src"))
SOCKDEMO = os.path.join(ROOT, "samples", "sock", "build", "sockdemo")


def record(work: str, calls: str, loops: int) -> str:
    out = os.path.join(work, f"{calls}.ctrace")
    subprocess.run(["setarch", "-R", sys.executable, "-m", "ctracer", "trace", "struct", "sock",
                    "--binary", SOCKDEMO, "-q", "-o", out, "--calls", calls, "--",
                    SOCKDEMO, "--loops", str(loops), "--threads", "1"],
                   check=True, stderr=subprocess.DEVNULL, cwd=work)
    return out


def per_object_function(path: str):
    from ctracer import analysis
    a = analysis.load(path)
    calls = {(i, a.function_name(f)): s.calls for i in range(len(a.objects))
             for f, s in a.object_methods(i).items()}
    return a, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", type=int, default=2000)
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    with tempfile.TemporaryDirectory() as work:
        figures = {}
        for calls in ("all", "changes"):
            path = record(work, calls, args.loops)
            a, counts = per_object_function(path)
            folded = a.folded.total_calls if a.folded is not None else 0
            figures[calls] = (a.counts.recorded, os.path.getsize(path), folded, counts)
            print(f"--calls {calls:7}: {a.counts.recorded:,} events, "
                  f"{os.path.getsize(path):,} bytes, {folded:,} calls folded, "
                  f"{sum(counts.values()):,} calls counted")
        same = figures["all"][3] == figures["changes"][3]
        print(f"per-(object, function) call counts equal: {same} "
              f"({len(figures['all'][3]):,} pairs)")
        events = figures["changes"][0] / figures["all"][0]
        size = figures["changes"][1] / figures["all"][1]
        print(f"changes/all: events {events:.3f}x, file bytes {size:.3f}x "
              f"(anchor: --calls all, same run)")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
