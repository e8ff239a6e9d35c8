#!/usr/bin/env python3
"""The 10M-event report and exports inside a 1 GB memory cgroup, against the 1M render
of the same workload in the same run (needs root: uprobes and cgroups):

    .venv/bin/python bench/bench_memlimit.py [--work DIR] [--limit 1G] [--keep]
        [--workload objflood|tcploop] [--exports-only]

1. Records the workload, unless DIR already holds its two traces:
   - ``objflood`` (many objects, few calls each): the user-space flood bench/objflood.c
     (2,700 objects made and freed one after another, five methods, entry and exit,
     addresses reused) with ``ctracer trace --buffer-mb 64``: 37 rounds an object
     (1,009,800 events) and 375 (10,135,800 events): flood1m/flood10m.ctrace;
   - ``tcploop`` (few objects, millions of calls each): this host's tracepoints of
     struct sock around samples/tcp's loopback workload, 4 connections of 12,500 and of
     125,000 messages (about 1M and 10M events): tcp1m/tcp10m.ctrace.
2. Renders the 1M trace with no limit (the anchor), then the 10M trace inside a fresh
   memory cgroup of ``--limit`` (`tests/support/memcgroup.py`); then, for parquet and
   jsonl, exports the 1M trace with no limit (that export's anchor) and the 10M trace
   inside a fresh cgroup of ``--limit`` (``--exports-only``: the exports alone).
   Each export is deleted once measured unless ``--keep`` (the kernel trace's 10M JSON
   Lines export is ~29 GB).
3. Prints, for each, what the limit saw: exit status, seconds, the cgroup's peak and
   OOM kills, peak RSS, peak anonymous memory and dirty pages; and each 10M run's
   time as a ratio to its anchor (the goal: exit 0, oom_kill 0, <= 10x).

Run it under ``flock`` of the benchmarks' lock when others time things on the machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))

from support.memcgroup import cgroup_unavailable, run_limited  # noqa: E402

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")


def ctracer(*args: str) -> list[str]:
    return [sys.executable, "-m", "ctracer", *args]


def record_tcploop(work: str, messages: int, name: str) -> str:
    path = os.path.join(work, name)
    if os.path.exists(path):
        return path
    done = subprocess.run(ctracer("trace", "struct", "sock", "--buffer-mb", "64", "-o", path,
                                  "-q", "--", TCPLOOP, "--connections", "4", "--messages",
                                  str(messages)), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_memlimit: recording failed: {done.stderr.strip()}")
    print(next((ln for ln in done.stderr.splitlines() if " events, " in ln), "").strip())
    return path


def record(work: str, rounds: int, name: str) -> str:
    path = os.path.join(work, name)
    if os.path.exists(path):
        return path
    program = os.path.join(work, "objflood")
    if not os.path.exists(program):
        subprocess.run(["cc", "-g", "-O0", "-o", program,
                        os.path.join(ROOT, "bench", "objflood.c")], check=True)
    done = subprocess.run(ctracer("trace", "struct", "conn", "--binary", program,
                                  "--buffer-mb", "64", "-o", path, "-q", "--",
                                  program, "2700", str(rounds)),
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_memlimit: recording failed: {done.stderr.strip()}")
    print(next((ln for ln in done.stderr.splitlines() if " events, " in ln), "").strip())
    return path


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.unlink(path)


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path) if os.path.exists(path) else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="where the traces are (made when missing) and outputs go")
    ap.add_argument("--limit", default="1G", help="the 10M runs' memory limit (default 1G)")
    ap.add_argument("--keep", action="store_true", help="keep the outputs")
    ap.add_argument("--workload", choices=("objflood", "tcploop"), default="objflood",
                    help="many objects with few calls (default), or few with many")
    ap.add_argument("--exports-only", action="store_true",
                    help="only the exports and their anchors (the 1M exports, no limit)")
    args = ap.parse_args()
    why = cgroup_unavailable()
    if why:
        print(f"bench_memlimit: {why}", file=sys.stderr)
        return 1
    limit = int(float(args.limit[:-1]) * UNITS[args.limit[-1].upper()]) \
        if args.limit[-1:].upper() in UNITS else int(args.limit)
    work = args.work or tempfile.mkdtemp(prefix="ctracer-memlimit-")
    os.makedirs(work, exist_ok=True)
    if args.workload == "tcploop":
        small = record_tcploop(work, 12500, "tcp1m.ctrace")
        big = record_tcploop(work, 125000, "tcp10m.ctrace")
    else:
        small = record(work, 37, "flood1m.ctrace")
        big = record(work, 375, "flood10m.ctrace")
    outputs = {n: os.path.join(work, n) for n in
               ("r1", "r10", "e1.parquet", "e10.parquet", "e1.jsonl", "e10.jsonl")}
    for o in outputs.values():
        _remove(o)
    renders = [
        ("1M render, no limit (anchor)", ctracer("callgraph", small, "-o", outputs["r1"], "-q"),
         64 << 30, "r1"),
        ("10M render", ctracer("callgraph", big, "-o", outputs["r10"], "-q"), limit, "r10"),
    ]
    exports = []
    for fmt in ("parquet", "jsonl"):
        exports += [
            (f"1M export {fmt}, no limit (anchor)",
             ctracer("export", small, "--format", fmt, "-o", outputs[f"e1.{fmt}"]), 64 << 30,
             f"e1.{fmt}"),
            (f"10M export {fmt}", ctracer("export", big, "--format", fmt, "-o",
                                          outputs[f"e10.{fmt}"]), limit, f"e10.{fmt}"),
        ]
    runs = ([] if args.exports_only else renders) + exports
    seconds = {}
    for name, argv, cap, output in runs:
        run = run_limited(argv, cap)
        seconds[name] = run.seconds
        size = _size(outputs[output])
        print(f"{name}: {run.line()}" + (f"; {size / 1e6:.0f} MB written" if size else ""))
        if run.returncode != 0:
            print(f"  {run.stderr.strip()[-500:]}")
        if not args.keep and output.startswith("e"):  # a 10M JSON Lines export: tens of GB
            _remove(outputs[output])
    for (anchor, _, _, _), (name, _, _, _) in zip(runs[::2], runs[1::2]):
        print(f"{name}: {seconds[name] / seconds[anchor]:.1f}x the 1M run's "
              f"{seconds[anchor]:.1f} s ({anchor})")
    if not args.keep:
        for o in outputs.values():
            _remove(o)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
