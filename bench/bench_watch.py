#!/usr/bin/env python3
"""What a watched write costs the program (needs root; run with the project's venv):

    .venv/bin/python bench/bench_watch.py [--ops N] [--runs R]

samples/watch's program stores to one field ~4.4 times per operation of account_work
and reports the time spent there.  It runs (1) alone, the anchor, (2) under `ctracer
trace` without --watch (uprobes only: account_work is entered once per account, so this
costs the stores nothing), (3) under `ctracer trace --watch balance` (every store traps
and runs the write program).  Printed: each run's time in account_work, the ratio of (3)
to the anchor, the cost of one trapped write ((3) - (2)) / writes, and the write
program's own time per write as the kernel measured it (BPF_ENABLE_STATS), so the rest
is the trap itself (debug exception, perf event dispatch).  Best of R runs each.
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

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
WATCHDEMO = os.path.join(ROOT, "samples", "watch", "build", "watchdemo")


def run(argv: list[str]) -> tuple[int, int, str]:
    p = subprocess.run(argv, capture_output=True, text=True, check=True)
    work = int(re.search(r"watchdemo: work_ns (\d+)", p.stderr).group(1))
    writes = int(re.search(r"watchdemo: writes (\d+)", p.stderr).group(1))
    return work, writes, p.stderr


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples", "watch")], check=True)
    program = [WATCHDEMO, "--accounts", "3", "--ops", str(args.ops), "--settle-ms", "400"]
    ctracer = [sys.executable, "-m", "ctracer", "trace", "struct", "account", "--binary",
               WATCHDEMO, "-q"]
    best: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t.ctrace")
        for _ in range(args.runs):
            for name, argv in (("alone", program),
                               ("traced", ctracer + ["-o", out, "--", *program]),
                               ("watched", ctracer + ["--watch", "balance", "-o", out, "--",
                                                      *program])):
                work, writes, err = run(argv)
                extra = None
                if name == "watched":
                    db = sqlite3.connect(out)
                    meta = json.loads(dict(db.execute("SELECT key, value FROM meta"))["watch"])
                    db.close()
                    extra = meta
                if name not in best or work < best[name][0]:
                    best[name] = (work, writes, extra)
    alone, traced, watched = best["alone"][0], best["traced"][0], best["watched"][0]
    writes, meta = best["watched"][1], best["watched"][2]
    per_write = (watched - traced) / max(1, meta["writes"])
    print(f"account_work, {writes} stores (best of {args.runs}): alone {alone / 1e6:.2f} ms "
          f"(anchor), traced {traced / 1e6:.2f} ms ({traced / alone:.2f}x), watched "
          f"{watched / 1e6:.2f} ms ({watched / alone:.1f}x)")
    print(f"recorded writes {meta['writes']} of {writes} stores; one trapped write costs "
          f"{per_write:.0f} ns ({per_write / (alone / writes):.0f}x an untraced store), of "
          f"which the write program {meta.get('program_ns_per_write', '?')} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
