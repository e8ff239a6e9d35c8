#!/usr/bin/env python3
"""Events lost with the default ring on a loaded machine: the reading thread at realtime
priority (the default) against normal priority, in one run.  Needs root; run with the
project's venv, under the bench lock (other timed work would change the load):

    flock LOCK .venv/bin/python bench/bench_lost.py [--rounds 3] [--connections 4]
        [--messages 30000]

Each round records the bundled loopback workload (samples/tcp) on this host's
tracepoints of struct sock twice, the default ring (16 MB), one recording right after
the other: ``--reader-priority normal`` (the anchor: how the reader ran before), then
the default (``realtime``).  For each: the load average when it started, events written
and lost, and the most the reader found waiting in the ring at a take (the trace's
``ring_fullest_bytes``, in % of the ring: how close it came to losing events; a take
sees the ring only when it runs, so the true peak may be higher).  The load is the
machine's own (the guests and other work around): the bench adds none.

Exits non-zero when a recording fails or its events and lost differ from what the
workload makes (every run records the same events: their sum must agree across runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
CTRACER = [sys.executable, "-m", "ctracer"]
#: how far apart two runs' written + lost may be (the workload's own events vary a
#: little: a retransmission, a timer)
SAME_WORK = 0.01


def record(out: str, priority: str, connections: int, messages: int) -> dict:
    load = os.getloadavg()[0]
    r = subprocess.run(CTRACER + ["trace", "struct", "sock", "-q", "-o", out,
                                  "--reader-priority", priority, "--",
                                  TCPLOOP, "--connections", str(connections),
                                  "--messages", str(messages)],
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        sys.exit(f"bench_lost: ctracer trace failed ({r.returncode}): {r.stderr.strip()}")
    m = re.search(r"(\d+) events, \d+ object addresses, (\d+) lost in ([\d.]+) (m?s)", r.stderr)
    if m is None:
        sys.exit(f"bench_lost: no summary in ctracer's output: {r.stderr.strip()}")
    db = sqlite3.connect(out)
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN "
                           "('ring_bytes', 'ring_fullest_bytes', 'reader_priority')"))
    db.close()
    fullest = json.loads(meta.get("ring_fullest_bytes") or "null")
    ring = json.loads(meta.get("ring_bytes") or "0")
    return dict(priority=priority, load=load, events=int(m.group(1)), lost=int(m.group(2)),
                seconds=float(m.group(3)) / (1000 if m.group(4) == "ms" else 1),
                fullest=100 * fullest / ring if fullest is not None and ring else None,
                ran=meta.get("reader_priority", "?"))


def line(r: dict) -> str:
    total = r["events"] + r["lost"]
    fullest = f"{r['fullest']:.1f}%" if r["fullest"] is not None else "?"
    return (f"  {r['priority']:8} load {r['load']:5.2f}: {r['events']:>9,} written "
            f"{r['lost']:>9,} lost ({100 * r['lost'] / max(1, total):4.1f}%) in "
            f"{r['seconds']:.1f} s; the ring at its fullest {fullest} ({r['ran']})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--messages", type=int, default=30000)
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench_lost: needs root", file=sys.stderr)
        return 1
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    print(f"tcploop --connections {args.connections} --messages {args.messages}, "
          "tracepoints of struct sock, default ring")
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_lost.") as work:
        out = os.path.join(work, "t.ctrace")
        for n in range(args.rounds):
            print(f"round {n + 1}")
            for priority in ("normal", "realtime"):
                r = record(out, priority, args.connections, args.messages)
                os.unlink(out)
                print(line(r), flush=True)
                runs.append(r)
    problems = []
    totals = [r["events"] + r["lost"] for r in runs]
    if max(totals) > min(totals) * (1 + SAME_WORK):
        problems.append(f"written + lost differ between runs: {min(totals):,} to "
                        f"{max(totals):,}")
    for priority in ("normal", "realtime"):
        mine = [r for r in runs if r["priority"] == priority]
        lost = [r["lost"] for r in mine]
        fullest = [r["fullest"] for r in mine if r["fullest"] is not None]
        print(f"{priority}: lost {', '.join(f'{x:,}' for x in lost)} "
              f"({sum(1 for x in lost if x == 0)} of {len(lost)} runs lost nothing); the "
              f"ring at its fullest {min(fullest, default=0):.1f}-{max(fullest, default=0):.1f}%; "
              f"load {min(r['load'] for r in mine):.2f}-{max(r['load'] for r in mine):.2f}")
    for problem in problems:
        print(f"bench_lost: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
