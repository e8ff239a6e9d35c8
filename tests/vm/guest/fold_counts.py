#!/usr/bin/env python3
"""Run in a guest (scripts/vm-run): ``ctracer trace --calls changes`` (and ``--calls all``)
against bpftrace COUNTING the same functions' calls per (function, object) in its maps, in
the same run around the loopback workload.

    scripts/vm-run --kernel 6.12 --out OUT -- .venv/bin/python tests/vm/guest/fold_counts.py
        OUT [--functions GLOB...] [--probes kprobe] [--calls all changes]

One bpftrace runs for every recording: a kprobe per function (a kretprobe instead for
the functions whose object is only their return value) computing each way's object
address from ``argN`` itself (``ctracer functions --json`` says the parameter and the
steps), adding one to ``@calls[func, address]`` (``probe`` in a kretprobe) only while
the window is open.  The window is opened and closed by this script (a ``prctl`` with an option no kernel knows, seen by bpftrace's
``sys_enter_prctl``): open once ctracer says it is recording, closed before ctracer is
stopped, so every call bpftrace counts is inside ctracer's recording.  At the close
bpftrace prints its map and clears it.  Counting in the kernel, bpftrace loses nothing
(a line per call through its perf buffer may be lost, "Lost N events").

Per recording, ctracer's calls of a (function, object) are its entry events (exit events
for a function whose object is its return value) plus its folded calls (the export's
``.folded-calls.jsonl``).  OUT gets result.json: per recording the events, the folded
calls, the trace's bytes, bpftrace's and ctracer's totals, the pairs that differ, and
each BPF program's missed runs (``bpftool prog show``: a kprobe program does not run
when another kprobe-type program is running on its CPU).  Exit status 0 when every
recording's counts equal bpftrace's, 1 when some differ, 2 when a run failed.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from method_counts import (PROBE_KEY, attachable, count_body, groups_of, missed_runs,
                           probeable_methods, ways_of)   # this script's folder is on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
LOCAL = "/var/tmp/fold-counts"   # the guest's tmpfs
#: the prctl option that opens (arg 1) and closes (arg 0) bpftrace's counting window
WINDOW_OPTION = 0x43540F01


def bpftrace_script(ways: dict[str, list[str]], pid: int) -> str:
    """Count calls per (function, object) in ``@calls`` while the window is open; print
    and clear the map when it closes.  The ways counted and the key are
    method_counts.py's (`groups_of`, `count_body`): a kretprobe only for a function
    reaching the object by its return value alone, keyed by the probe's name (in a
    kretprobe bpftrace 0.17's ``func`` names the caller returned into), an entry by
    ``func``."""
    lines = ["BEGIN { printf(\"ready\\n\"); }",
             f"tracepoint:syscalls:sys_enter_prctl /pid == {pid} && args->option == "
             f"{WINDOW_OPTION}/ {{ if (args->arg2 == 1) {{ @on = 1; printf(\"window open\\n\"); }} "
             "else { @on = 0; print(@calls); clear(@calls); printf(\"window closed\\n\"); } }"]
    for exprs, functions in sorted(groups_of(ways).items()):
        kind = "kretprobe" if exprs == ("ret",) else "kprobe"
        lines.append(",".join(f"{kind}:{f}" for f in functions) + " /@on/ { " +
                     count_body(exprs, "@calls") + " }")
    lines.append("END { clear(@calls); clear(@on); }")
    return "\n".join(lines) + "\n"


_MAP_LINE = re.compile(rf"^@calls\[{PROBE_KEY}, (-?\d+)\]: (\d+)$")


def window_counts(text: str) -> list[collections.Counter]:
    """bpftrace's counts per (function, object) of each window, in order (a window's
    map is printed before its "window closed"; a kernel address is printed signed)."""
    windows: list[collections.Counter] = []
    current: collections.Counter = collections.Counter()
    for line in text.splitlines():
        m = _MAP_LINE.match(line.strip())
        if m:
            current[(m.group(1), int(m.group(2)) % (1 << 64))] += int(m.group(3))
        elif line.startswith("window closed"):
            windows.append(current)
            current = collections.Counter()
    return windows


def _window(open_it: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(ctypes.c_int(WINDOW_OPTION), ctypes.c_ulong(1 if open_it else 0),
               ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))   # EINVAL: no such option


def _wait_for(path: str, text: str, proc: subprocess.Popen, timeout: float,
              count: int = 1) -> bool:
    deadline = time.monotonic() + timeout
    while open(path, errors="replace").read().count(text) < count:
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


def ctracer_calls(trace: str, compared: set[str], returns_only: set[str]
                  ) -> tuple[collections.Counter, collections.Counter, int]:
    """(written calls, folded calls) per (function, object) of a trace, and its events."""
    jsonl = os.path.join(LOCAL, "t.jsonl")
    for old in (jsonl, os.path.join(LOCAL, "t.folded-calls.jsonl")):
        if os.path.exists(old):
            os.unlink(old)
    subprocess.run(CTRACER + ["export", trace, "--format", "jsonl", "-o", jsonl], check=True,
                   capture_output=True)
    written: collections.Counter = collections.Counter()
    events = 0
    with open(jsonl) as f:
        for line in f:
            e = json.loads(line)
            events += 1
            func, obj = e["function"], e["object"]
            if func not in compared or e["phase"] not in ("entry", "exit") or not obj:
                continue
            if (e["phase"] == "exit") == (func in returns_only):
                written[(func, int(obj, 16))] += 1
    folded: collections.Counter = collections.Counter()
    beside = os.path.join(LOCAL, "t.folded-calls.jsonl")
    if os.path.exists(beside):
        with open(beside) as f:
            for line in f:
                row = json.loads(line)
                if row["function"] in compared:
                    folded[(row["function"], int(row["address"], 16))] += row["calls"]
    return written, folded, events


def record(calls: str, args, bt: subprocess.Popen, bt_out: str, closed: int) -> dict:
    """One ctracer recording with ``--calls calls`` inside one bpftrace window."""
    trace = os.path.join(LOCAL, f"{calls}.ctrace")
    log = os.path.join(LOCAL, f"ctracer-{calls}.log")
    cmd = CTRACER + ["trace", "struct", "sock", "--function-probes", args.probes,
                     "--calls", calls, "-d", "3600", "-o", trace]
    if args.functions:
        cmd += ["--functions", *args.functions]
    clock = time.monotonic()
    ct = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    if not _wait_for(log, "recording struct sock", ct, 2400):
        shutil.copy(log, args.out)
        raise RuntimeError(f"ctracer --calls {calls} did not start recording: "
                           f"{open(log).read()[-1500:]}")
    started = round(time.monotonic() - clock, 1)
    _window(True)
    work = subprocess.run([TCPLOOP, "--connections", str(args.connections), "--messages",
                           str(args.messages), "--bytes", "100"], capture_output=True,
                          text=True, timeout=1200)
    time.sleep(1)
    _window(False)
    if not _wait_for(bt_out, "window closed", bt, 600, closed + 1):
        raise RuntimeError("bpftrace did not print its counts")
    missed = missed_runs()
    ct.send_signal(signal.SIGINT)
    ct.wait(1200)
    shutil.copy(log, args.out)
    text = open(log).read()
    return {"calls": calls, "tcploop": work.returncode, "ctracer_exit": ct.returncode,
            "compile_and_attach_s": started, "trace_bytes": os.path.getsize(trace),
            "summary": [ln for ln in text.splitlines() if ln.strip()][-6:],
            "kprobe_multi": "kprobe.multi" in text, "missed_runs": missed, "trace": trace}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--functions", nargs="*", default=[])
    p.add_argument("--probes", default="kprobe")
    p.add_argument("--calls", nargs="+", default=["all", "changes"])
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--messages", type=int, default=50)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(LOCAL, ignore_errors=True)
    os.makedirs(LOCAL)
    result: dict = {"kernel": os.uname().release, "probes": args.probes,
                    "functions": args.functions, "workload": [args.connections, args.messages]}
    methods = probeable_methods("sock", args.functions)
    ways = ways_of(methods, {m["function"] for m in methods} & attachable())
    returns_only = {f for f, w in ways.items() if set(w) == {"ret"}}

    import resource
    want = max(65536, 8 * len(ways))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    script = os.path.join(LOCAL, "counts.bt")
    with open(script, "w") as f:
        f.write(bpftrace_script(ways, os.getpid()))
    shutil.copy(script, args.out)
    bt_out = os.path.join(LOCAL, "bpftrace.txt")
    env = dict(os.environ, BPFTRACE_MAX_PROBES=str(len(ways) * 2 + 100),
               BPFTRACE_MAP_KEYS_MAX="200000")
    clock = time.monotonic()
    bt = subprocess.Popen(["bpftrace", "-B", "line", script], stdout=open(bt_out, "w"),
                          stderr=subprocess.STDOUT, env=env)
    if not _wait_for(bt_out, "ready", bt, 3600):
        print(f"bpftrace did not start: {open(bt_out).read()[-1500:]}", file=sys.stderr)
        return 2
    result["bpftrace_functions"] = len(ways)
    result["bpftrace_attach_s"] = round(time.monotonic() - clock, 1)
    print(f"bpftrace: {len(ways)} functions ready after {result['bpftrace_attach_s']} s",
          flush=True)
    runs = []
    status = 0
    try:
        for n, calls in enumerate(args.calls):
            runs.append(record(calls, args, bt, bt_out, n))
            print(f"--calls {calls}: {runs[-1]['summary'][-3:]}", flush=True)
    except RuntimeError as e:
        print(str(e), file=sys.stderr)
        status = 2
    bt.send_signal(signal.SIGINT)
    try:
        bt.wait(900)
    except subprocess.TimeoutExpired:
        bt.kill()
    shutil.copy(bt_out, args.out)
    windows = window_counts(open(bt_out, errors="replace").read())
    compared = set(ways)
    for run, theirs in zip(runs, windows):
        written, folded, events = ctracer_calls(run.pop("trace"), compared, returns_only)
        ours = written + folded
        differ = {f"{f} {a:#x}": [ours.get((f, a), 0), theirs.get((f, a), 0)]
                  for f, a in set(ours) | set(theirs) if ours.get((f, a), 0) != theirs.get((f, a), 0)}
        per_function: dict = collections.defaultdict(lambda: [0, 0, 0])
        for (f, _a), c in written.items():
            per_function[f][0] += c
        for (f, _a), c in folded.items():
            per_function[f][1] += c
        for (f, _a), c in theirs.items():
            per_function[f][2] += c
        run.update({"events": events, "written_calls": sum(written.values()),
                    "folded_calls": sum(folded.values()), "ctracer_calls": sum(ours.values()),
                    "bpftrace_calls": sum(theirs.values()), "pairs": len(theirs),
                    "objects": len({a for _f, a in theirs}),
                    "equal": not differ and bool(theirs),
                    "written_alone_equal": written == theirs,
                    "differ": dict(sorted(differ.items())[:40]), "differ_count": len(differ),
                    "per_function_written_folded_bpftrace": dict(sorted(per_function.items()))})
        if not run["equal"] and status == 0:
            status = 1
        print(f"--calls {run['calls']}: {events} events, {run['written_calls']} calls written, "
              f"{run['folded_calls']} folded; ctracer {run['ctracer_calls']} calls, bpftrace "
              f"{run['bpftrace_calls']} over {run['pairs']} (function, socket) pairs; "
              f"{len(differ)} differ; {run['trace_bytes']} bytes", flush=True)
    if len(windows) < len(runs):
        status = 2
    result["runs"] = runs
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
