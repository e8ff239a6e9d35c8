#!/usr/bin/env python3
"""Run a command inside a fresh memory cgroup and print what the limit saw (needs root):

    .venv/bin/python bench/memlimit.py 1G -- ctracer report big.ctrace -o out

Prints the exit status, the time, the cgroup's peak and OOM kills, the largest process's
peak RSS and the cgroup's peak anonymous memory and dirty pages (tests/support/memcgroup.py).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from support.memcgroup import cgroup_unavailable, run_limited  # noqa: E402

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    if text[-1:].upper() in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1].upper()])
    return int(text)


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    why = cgroup_unavailable()
    if why:
        print(f"memlimit: {why}", file=sys.stderr)
        return 1
    run = run_limited(sys.argv[3:], parse_size(sys.argv[1]))
    sys.stdout.write(run.stdout)
    sys.stderr.write(run.stderr)
    print(f"memlimit: {run.line()}")
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
