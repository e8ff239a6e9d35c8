#!/usr/bin/env python3
"""A flood: the sample producing far more events than the recorder can take, recorded
with a small ring buffer (needs root; run with the project's venv):

    .venv/bin/python bench/bench_flood.py [--loops N] [--threads T] [--buffer-mb MB]

1. To completion: the sample (its ground-truth log on) runs ``--loops`` under
   ``ctracer trace``.  Produced (the log's lines: every call logs its entry and exit)
   must equal written (the trace's events) + lost (the kernel-side drop counter in the
   trace's meta).  Prints the three, the recorder's peak RSS and the sample's wall time
   against its untraced run (the anchor).
2. Responsiveness: the same flood without end, then SIGINT after a few seconds: how long
   ctracer takes from the signal to its exit (file finished, probes detached), its peak
   RSS, and the time between progress lines while flooded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from support import groundtruth as gt  # noqa: E402
from ctracer.tracefile import Trace  # noqa: E402


def ctracer(*args: str) -> list[str]:
    return [sys.executable, "-m", "ctracer", *args]


def wait_rss(proc: subprocess.Popen) -> tuple[int, int]:
    """(exit status, peak RSS in MB) of ``proc``."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss // 1024


def to_completion(folder: str, loops: int, threads: int, buffer_mb: int) -> dict:
    log = os.path.join(folder, "truth.log")
    env = {**os.environ, gt.LOG_ENV: log}
    sample = [gt.SOCKDEMO, "--loops", str(loops), "--threads", str(threads)]
    start = time.perf_counter()
    subprocess.run(sample, check=True, stdout=subprocess.DEVNULL, env=env)
    untraced = time.perf_counter() - start
    os.unlink(log)
    out = os.path.join(folder, "flood.ctrace")
    proc = subprocess.Popen(ctracer("trace", "sock", "--binary", gt.SOCKDEMO,
                                    "--buffer-mb", str(buffer_mb), "-o", out, "--", *sample),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    for line in proc.stderr:
        if "recording struct" in line:
            break
    start = time.perf_counter()
    status, rss = wait_rss(proc)
    traced = time.perf_counter() - start
    summary = proc.stderr.read()
    trace = Trace(out)
    produced = sum(1 for _ in open(log))
    written, lost = trace.event_count(), trace.meta_json("lost_events")
    return dict(status=status, produced=produced, written=written, lost=lost,
                exact=produced == written + lost, peak_rss_mb=rss,
                sample_untraced_s=round(untraced, 2), sample_traced_s=round(traced, 2),
                slowdown=round(traced / untraced, 1),
                summary=[ln for ln in summary.splitlines() if ln.startswith("ctracer:")][:2])


def responsiveness(folder: str, threads: int, buffer_mb: int, flood_s: float) -> dict:
    out = os.path.join(folder, "sigint.ctrace")
    proc = subprocess.Popen(ctracer("trace", "sock", "--binary", gt.SOCKDEMO, "--buffer-mb",
                                    str(buffer_mb), "-o", out, "--", gt.SOCKDEMO, "--loops",
                                    "1000000", "--threads", str(threads)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.set_blocking(proc.stderr.fileno(), True)
    for line in proc.stderr:
        if "recording struct" in line:
            break
    time.sleep(flood_s)
    sent = time.perf_counter()
    os.kill(proc.pid, signal.SIGINT)
    status, rss = wait_rss(proc)
    stop_s = time.perf_counter() - sent
    trace = Trace(out)
    return dict(status=status, stop_after_sigint_s=round(stop_s, 2), peak_rss_mb=rss,
                written=trace.event_count(), lost=trace.meta_json("lost_events"),
                flood_s=flood_s)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=4000)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--buffer-mb", type=int, default=1)
    p.add_argument("--flood-seconds", type=float, default=8.0)
    p.add_argument("--sigint-rounds", type=int, default=3)
    args = p.parse_args()
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average at the start: {load}")
    with tempfile.TemporaryDirectory() as folder:
        first = to_completion(folder, args.loops, args.threads, args.buffer_mb)
        print("to completion:", json.dumps(first))
        print(f"  produced {first['produced']} = written {first['written']} + lost "
              f"{first['lost']}: {'exact' if first['exact'] else 'NOT EXACT'}; "
              f"RATIO sample traced / untraced: {first['slowdown']}x")
        stops = []
        for _ in range(args.sigint_rounds):
            second = responsiveness(folder, args.threads, args.buffer_mb, args.flood_seconds)
            print("SIGINT in a flood:", json.dumps(second))
            stops.append(second["stop_after_sigint_s"])
            os.unlink(os.path.join(folder, "sigint.ctrace"))
    print(f"  SIGINT to exit: {', '.join(f'{s:.2f} s' for s in stops)}; worst "
          f"{max(stops):.2f} s (goal <= 1 s)")
    return 0 if first["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
