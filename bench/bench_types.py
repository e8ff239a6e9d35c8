#!/usr/bin/env python3
"""How fast ctracer finds the methods of struct sock, against pfunct in the same run.

    bench/bench_types.py [VMLINUX] [--rounds N] [--warm-runs N] [--phases]

Runs, each as its own process, timing wall clock and peak memory (wait4):

1. the anchor, ``pfunct --class=sock VMLINUX``, alternating with
2. ``ctracer functions struct sock --binary VMLINUX`` cold (empty cache directory),
   ``--rounds`` times each (medians reported); then warm (the cache just written),
   ``--warm-runs`` times;
3. ``ctracer functions struct sock`` on the running kernel's BTF, when it has one.

and prints each time, its ratio to the anchor and the goals of issue 3: cold ≤ pfunct,
warm ≤ 0.3 s, BTF ≤ 0.5 s, peak memory ≤ 2 GB.  Each warm run is printed (wall and CPU),
after a bare ``python -c pass`` measured just before it: the interpreter's start-up, the
floor of any Python command, under the same load.  ``--phases`` adds, in process, where
the cold build spends its time.  The load average is printed because a busy machine
slows every line alike; compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

DEFAULT_VMLINUX = "/work/corpus/x/usr/lib/debug/boot/vmlinux-6.1.0-50-cloud-amd64"
KERNEL_BTF = "/sys/kernel/btf/vmlinux"
GOAL_WARM_S = 0.3
GOAL_BTF_S = 0.5
GOAL_RSS_MB = 2048


def run_measured(argv: list[str], env: dict) -> dict:
    """Run a command; its wall time, CPU time and peak RSS (wait4 on the child: the
    largest process of its tree, forked workers included)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode:
            err.seek(0)
            sys.exit(f"bench: {' '.join(argv)} failed ({proc.returncode}): "
                     f"{err.read().decode(errors='replace').strip()[-500:]}")
        out.seek(0)
        lines = out.read().count(b"\n")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024, "lines": lines}


def median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda m: m["wall"])[len(runs) // 2]


def ctracer(*args: str) -> list[str]:
    return [sys.executable, "-m", "ctracer", *args]


def row(label: str, m: dict, anchor: float) -> str:
    return (f"{label:<44} {m['wall']:8.2f} s {m['wall'] / anchor:7.2f}x "
            f"{m['cpu']:8.2f} s {m['rss_mb']:8.0f} MB")


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def phases(vmlinux: str) -> None:
    """Where a cold catalog build spends its time, in this process."""
    import gc
    import resource

    from ctracer.debuginfo.dwarf import cache
    from ctracer.debuginfo import elf
    from ctracer.debuginfo.dwarf import reader as dwarf
    from ctracer.debuginfo.dwarf import sections
    from ctracer.debuginfo.dwarf import scan as ds
    from ctracer.debuginfo.dwarf import units as du

    gc.disable()  # as DwarfTypes.catalog builds (ctracer.debuginfo.gcpause); this process ends here
    t0 = time.perf_counter()
    headers = elf.read_elf_headers(vmlinux)
    model = dwarf.DwarfTypes(vmlinux, headers, use_cache=False)
    secs = sections.dwarf_sections(headers)
    units = ds.list_units(secs)
    t1 = time.perf_counter()
    summaries, declared_rows = model.unit_summaries()
    t2 = time.perf_counter()
    rows = du.assemble_rows(summaries, declared_rows)
    t3 = time.perf_counter()
    model.resolve_addresses(rows)
    t4 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = tmp
        with cache.CatalogWriter("bench", "dwarf", "bench", {"size": 0}) as writer:
            du.store_rows(rows, writer)
        size = os.path.getsize(cache.cache_path("bench", "dwarf"))
    t5 = time.perf_counter()
    self_usage = resource.getrusage(resource.RUSAGE_SELF)
    child_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\ncold build phases ({len(units)} units, {secs.info_size / 1e6:.0f} MB "
          f".debug_info, {dwarf.scan_workers(secs.info_size)} scanning processes):")
    print(f"  unit headers        {t1 - t0:6.2f} s")
    print(f"  scan + summarize    {t2 - t1:6.2f} s")
    print(f"  merge + declared    {t3 - t2:6.2f} s   ({len(rows.functions)} functions, "
          f"{len(rows.structs)} structs, {len(rows.tracepoints)} tracepoints)")
    print(f"  symbols, addresses  {t4 - t3:6.2f} s")
    print(f"  cache write         {t5 - t4:6.2f} s   ({size / 1e6:.1f} MB)")
    print(f"  CPU: this process {self_usage.ru_utime + self_usage.ru_stime:.2f} s, "
          f"workers {child_usage.ru_utime + child_usage.ru_stime:.2f} s; peak RSS this "
          f"process {self_usage.ru_maxrss / 1024:.0f} MB, worker "
          f"{child_usage.ru_maxrss / 1024:.0f} MB")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure_warm(query: list[str], env: dict, runs: int) -> dict:
    """The warm query ``runs`` times, with a bare Python start-up (the interpreter's own
    floor, ``python -c pass``) before each: both meet the same load."""
    starts, warm = [], []
    load_before = loadavg()
    for _ in range(runs):
        starts.append(run_measured([sys.executable, "-c", "pass"], env))
        warm.append(run_measured(ctracer(*query), env))
    return {"runs": warm, "best": min(warm, key=lambda m: m["wall"]),
            "median": statistics.median(m["wall"] for m in warm),
            "start": min(starts, key=lambda m: m["wall"]),
            "load": f"{load_before} before, {loadavg()} after"}


def print_warm(warm: dict, anchor: dict, cold: dict) -> None:
    """Each warm run, and the best against every anchor of this run."""
    best, start = warm["best"], warm["start"]
    print("\nwarm query, each run (the cache the cold run wrote):")
    print("  wall " + "  ".join(f"{m['wall']:.3f}" for m in warm["runs"]) + " s")
    print("  CPU  " + "  ".join(f"{m['cpu']:.3f}" for m in warm["runs"]) + " s")
    print(f"  load average {warm['load']}")
    print(f"  best {best['wall']:.3f} s, median {warm['median']:.3f} s: "
          f"{best['wall'] / anchor['wall']:.3f}x pfunct ({anchor['wall']:.2f} s), "
          f"{best['wall'] / cold['wall']:.3f}x the cold run ({cold['wall']:.2f} s), "
          f"{best['wall'] / start['wall']:.1f}x a bare Python start-up "
          f"({start['wall'] * 1000:.0f} ms wall, {start['cpu'] * 1000:.0f} ms CPU)")


def print_goals(anchor: dict, cold: dict, warm: dict, btf: Optional[dict]) -> None:
    print("\ngoals (issue 3):")
    print(f"  cold ≤ pfunct:      {cold['wall']:.2f} s vs {anchor['wall']:.2f} s  "
          f"ratio {cold['wall'] / anchor['wall']:.2f}  "
          f"{verdict(cold['wall'] <= anchor['wall'])}  (CPU {cold['cpu']:.1f} s over "
          f"its processes vs {anchor['cpu']:.1f} s)")
    best = warm["best"]
    warm_cpu = min(m["cpu"] for m in warm["runs"])
    print(f"  warm ≤ {GOAL_WARM_S} s:       best {best['wall']:.3f} s, median "
          f"{warm['median']:.3f} s  {verdict(best['wall'] <= GOAL_WARM_S)}  (CPU "
          f"{warm_cpu:.3f} s: one process, so its wall time on an idle machine)")
    if btf is not None:
        print(f"  BTF ≤ {GOAL_BTF_S} s:        {btf['wall']:.3f} s  "
              f"{verdict(btf['wall'] <= GOAL_BTF_S)}")
    print(f"  peak RSS ≤ {GOAL_RSS_MB} MB:  cold {cold['rss_mb']:.0f} MB per process "
          f"(pfunct {anchor['rss_mb']:.0f} MB)  {verdict(cold['rss_mb'] <= GOAL_RSS_MB)}")
    if cold["lines"] != best["lines"]:
        print(f"  WARNING: cold printed {cold['lines']} lines, warm {best['lines']}")


def bench(vmlinux: str, rounds: int, warm_runs: int, env: dict, cache_home: str) -> None:
    print(f"load average before: {loadavg()}, {len(os.sched_getaffinity(0))} CPUs")
    print(f"{'':<44} {'wall':>10} {'ratio':>8} {'cpu':>10} {'peak RSS':>11}")
    query = ["functions", "struct", "sock", "--binary", vmlinux]
    anchors, colds = [], []
    for _ in range(rounds):  # alternate, so that both meet the same load
        anchors.append(run_measured(["pfunct", "--class=sock", vmlinux], env))
        shutil.rmtree(os.path.join(cache_home, "ctracer"), ignore_errors=True)
        colds.append(run_measured(ctracer(*query), env))
    anchor, cold = median_run(anchors), median_run(colds)
    print(row(f"pfunct --class=sock (anchor, median of {len(anchors)})", anchor,
              anchor["wall"]))
    print(row(f"ctracer functions, cold (median of {len(colds)})", cold, anchor["wall"]))
    warm = measure_warm(query, env, warm_runs)
    print(row(f"ctracer functions, warm (best of {warm_runs})", warm["best"], anchor["wall"]))
    print(row("python -c pass (start-up floor, best)", warm["start"], anchor["wall"]))
    btf = None
    if os.path.exists(KERNEL_BTF):
        run_measured(ctracer("functions", "struct", "sock"), env)  # its cache, if any
        runs = [run_measured(ctracer("functions", "struct", "sock"), env)
                for _ in range(warm_runs)]
        btf = min(runs, key=lambda m: m["wall"])
        print(row(f"ctracer functions on {KERNEL_BTF} (best of {len(runs)})", btf,
                  anchor["wall"]))
    print(f"load average after: {loadavg()}")
    print_warm(warm, anchor, cold)
    print_goals(anchor, cold, warm, btf)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("vmlinux", nargs="?", default=DEFAULT_VMLINUX)
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2,
                        help="cold runs, each after a run of the anchor (default 2)")
    parser.add_argument("--phases", action="store_true",
                        help="also time the phases of a cold build (in a fresh process)")
    parser.add_argument("--phases-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phases_only:
        phases(args.vmlinux)
        return 0
    if not os.path.isfile(args.vmlinux):
        sys.exit(f"bench: {args.vmlinux} not found; get it with `apt-get download "
                 "linux-image-6.1.0-50-cloud-amd64-dbg` and `dpkg-deb -x` the .deb, then "
                 "pass the path of usr/lib/debug/boot/vmlinux-*")
    if shutil.which("pfunct") is None:
        sys.exit("bench: pfunct (Debian package pahole) is needed for the anchor")
    cache_home = tempfile.mkdtemp(prefix="ctracer-bench-")
    # an installed ctracer has its bytecode compiled: let the children cache theirs
    # (under the temporary directory) even where PYTHONDONTWRITEBYTECODE is set
    env = {**os.environ, "XDG_CACHE_HOME": cache_home,
           "PYTHONPYCACHEPREFIX": os.path.join(cache_home, "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        bench(args.vmlinux, args.rounds, args.warm_runs, env, cache_home)
    finally:
        shutil.rmtree(cache_home, ignore_errors=True)
    if args.phases:
        subprocess.run([sys.executable, __file__, "--phases-only", args.vmlinux], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
