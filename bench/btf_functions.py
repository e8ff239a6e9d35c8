#!/usr/bin/env python3
"""Speed of ``ctracer functions struct sock`` on the running kernel's BTF.

Goal (issue 3): the whole process in at most 0.5 s.  Prints, measured in this run:
anchors (the interpreter starting and exiting; pahole's ``pfunct -F btf --class=sock``
on the same BTF, a C tool), the command cold (an empty cache directory: every index
built and saved) and warm (indexes and symbol list loaded), each as the best of several
runs in wall time and CPU time, and the ratios to the goal and to the anchors; then the
reader's own stages in-process.  Run it on an idle machine: wall times on a busy one
say more about the other load than about ctracer (CPU times stay comparable).

    .venv/bin/python bench/btf_functions.py [--runs N] [--struct NAME]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
KERNEL_BTF = "/sys/kernel/btf/vmlinux"
GOAL = 0.5


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall, user+sys CPU) of one run of a command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def best(cmd: list[str], runs: int, env: dict, fresh_cache: bool = False) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(runs):
        if fresh_cache:
            shutil.rmtree(env["XDG_CACHE_HOME"], ignore_errors=True)
        wall, cpu = timed(cmd, env)
        walls.append(wall)
        cpus.append(cpu)
    return min(walls), min(cpus)


def stages() -> None:
    """The reader's stages in this process, without saved indexes."""
    sys.path.insert(0, str(ROOT / "src"))
    from ctracer.debuginfo.btf import reader as btf
    from ctracer.host import kallsyms
    from ctracer.debuginfo.catalog import ShapeKind
    t = time.process_time
    t0 = t()
    model = btf.open_btf(KERNEL_BTF, use_cache=False)
    t1 = t()
    cat = model.catalog()
    direct = cat.functions_referencing(ShapeKind.STRUCT, "sock")
    t2 = t()
    holders = cat.structs_with_member_of(ShapeKind.STRUCT, "sock")
    t3 = t()
    tps = cat.tracepoints_referencing(ShapeKind.STRUCT, "sock")
    t4 = t()
    symbols = kallsyms.kernel_symbols(use_cache=False)
    t5 = t()
    counts = set(model.btf.kinds[1:])
    print(f"\nreader stages (CPU s, no saved indexes): parse {t1 - t0:.3f} "
          f"({model.btf.count - 1} types, {len(counts)} kinds), "
          f"function index + lookup {t2 - t1:.3f} ({len(direct)} functions), "
          f"member index + lookup {t3 - t2:.3f} ({len(holders)} structs), "
          f"tracepoints {t4 - t3:.3f} ({len(tps)}), "
          f"kernel symbols {t5 - t4:.3f} ({len(symbols) if symbols else 0})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--struct", default="sock")
    args = ap.parse_args()
    if not os.path.exists(KERNEL_BTF):
        print(f"no {KERNEL_BTF}: nothing to measure", file=sys.stderr)
        return 1
    cache = tempfile.mkdtemp(prefix="ctracer-bench-")
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    command = [PYTHON, "-m", "ctracer", "functions", "struct", args.struct]
    try:
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        startup = best([PYTHON, "-c", "pass"], args.runs, env)
        anchors = {"python startup": startup}
        if shutil.which("pfunct"):
            anchors["pfunct -F btf"] = best(
                ["pfunct", "-F", "btf", f"--class={args.struct}", KERNEL_BTF], args.runs, env)
        cold = best(command, max(2, args.runs // 2), env, fresh_cache=True)
        timed(command, env)  # leave the cache filled
        warm = best(command, args.runs, env)
        print(f"\n{'':<28}{'wall s':>8}{'CPU s':>8}")
        for name, (wall, cpu) in anchors.items():
            print(f"{name:<28}{wall:8.3f}{cpu:8.3f}")
        for name, (wall, cpu) in (("ctracer functions (cold)", cold),
                                  ("ctracer functions (warm)", warm)):
            print(f"{name:<28}{wall:8.3f}{cpu:8.3f}")
        print(f"\nwarm / goal {GOAL} s: wall {warm[0] / GOAL:.2f}, CPU {warm[1] / GOAL:.2f}")
        print(f"cold / goal {GOAL} s: wall {cold[0] / GOAL:.2f}, CPU {cold[1] / GOAL:.2f}")
        for name, (wall, cpu) in anchors.items():
            print(f"warm / {name}: wall {warm[0] / wall:.1f}x, CPU {warm[1] / max(cpu, 1e-3):.1f}x")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    stages()
    return 0


if __name__ == "__main__":
    sys.exit(main())
