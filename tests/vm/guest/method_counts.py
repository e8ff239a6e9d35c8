#!/usr/bin/env python3
"""Run in a guest (scripts/vm-run): ctracer tracing every method of a struct (or the ones
``--functions`` names) and bpftrace counting the same functions' calls per object, in the
same run around the loopback workload; the calls per (function, object) side by side.

    scripts/vm-run --kernel 7.2 --out OUT -- .venv/bin/python tests/vm/guest/method_counts.py
        OUT [--struct sock] [--functions GLOB...] [--probes fentry.multi]

The ways each function reaches the object come from ``ctracer functions --json`` (the
parameter, then each step: a read of the pointer at an offset or an added offset); bpftrace
gets one kprobe per function (kallsyms names held once) whose body computes the same
address from ``argN`` and prints it with the time, and a kretprobe printing the return
value of the functions whose object is their return value.  Nothing of ctracer's probe
code is shared: bpftrace reads the registers and the memory itself.  ctracer records with
``--function-probes PROBES`` to guest-local tmpfs (SQLite over the guest's 9p share
fails); OUT gets result.json (the counts compared over the functions both attached, in
the window between the workload's start and a second after its end), the differing
pairs, and both tools' logs.  Exit status 0 when every count is equal, 1 when some differ.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
LOCAL = "/var/tmp/method-counts"   # the guest's tmpfs


def _kallsyms_once() -> set[str]:
    seen: collections.Counter = collections.Counter()
    with open("/proc/kallsyms") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "tT" and len(parts) == 3:
                seen[parts[2]] += 1
    return {n for n, c in seen.items() if c == 1}


def _blacklisted() -> set[str]:
    path = "/sys/kernel/debug/kprobes/blacklist"
    if not os.path.exists(path):
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"],
                       capture_output=True)
    try:
        with open(path) as f:
            return {line.split()[1] for line in f if len(line.split()) > 1}
    except OSError:
        return set()


def _expression(way: dict) -> str:
    """bpftrace's expression of the object's address for one way of a function."""
    e = f"(uint64)arg{way['param_index']}"
    for step in way["path"]:
        if step["op"] == "deref":
            e = f"(uint64)*(uint64 *)({e} + {step['offset']})"
        else:
            e = f"({e} + {step['offset']})"
    return e


def ways_of(methods: list[dict], names: set[str]) -> dict[str, list[str]]:
    """Each function's ways to the object as bpftrace expressions ("ret": the return
    value); a function with a way bpftrace cannot compute (an argument past the sixth
    register) is left out."""
    ways: dict[str, list[str]] = collections.defaultdict(list)
    out_of_reach = set()
    for m in methods:
        f = m["function"]
        if f not in names:
            continue
        if m["reach"] == "returns":
            ways[f].append("ret")
        elif m["param_index"] is not None and m["param_index"] < 6:
            ways[f].append(_expression(m))
        else:
            out_of_reach.add(f)
    return {f: w for f, w in ways.items() if f not in out_of_reach}


def bpftrace_script(ways: dict[str, list[str]]) -> str:
    """The script printing each call's objects: ``e TIME FUNCTION OBJECT`` at entry (the
    arguments' ways), ``x ...`` at return (the return value's)."""
    bodies: dict[tuple[str, ...], list[str]] = collections.defaultdict(list)
    returns = sorted(f for f, w in ways.items() if "ret" in w)
    for f, exprs in ways.items():
        exprs = tuple(e for e in exprs if e != "ret")
        if exprs:
            bodies[exprs].append(f)
    lines = ["BEGIN { printf(\"ready\\n\"); }"]
    for exprs, functions in sorted(bodies.items()):
        body = " ".join(f"$o{i} = {e}; if ($o{i} != 0) {{ printf(\"e %llu %s %llu\\n\", "
                        f"nsecs, func, $o{i}); }}" for i, e in enumerate(exprs))
        lines.append(",".join(f"kprobe:{f}" for f in sorted(functions)) + " { " + body + " }")
    if returns:
        lines.append(",".join(f"kretprobe:{f}" for f in returns) +
                     " { if (retval != 0) { printf(\"x %llu %s %llu\\n\", nsecs, func, "
                     "(uint64)retval); } }")
    return "\n".join(lines) + "\n"


def traceable() -> set[str]:
    """The functions ftrace can hook (kprobes and fentry alike)."""
    for path in ("/sys/kernel/tracing/available_filter_functions",
                 "/sys/kernel/debug/tracing/available_filter_functions"):
        try:
            with open(path) as f:
                return {line.split()[0] for line in f if line.strip()}
        except OSError:
            continue
    return set()


def start_bpftrace(script: str, out: str, probed: int) -> subprocess.Popen:
    import resource
    # bpftrace holds files per probe (3,771 probes: "Too many open files" at the default)
    want = max(65536, 8 * probed)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
    with open(os.path.join(LOCAL, "counts.bt"), "w") as f:
        f.write(script)
    env = dict(os.environ, BPFTRACE_MAX_PROBES=str(probed + 100), BPFTRACE_PERF_RB_PAGES="4096")
    return subprocess.Popen(["bpftrace", "-B", "line", os.path.join(LOCAL, "counts.bt")],
                            stdout=open(out, "w"), stderr=subprocess.STDOUT, env=env)


def wait_for(path: str, text: str, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        got = open(path, errors="replace").read()
        if text in got:
            return True
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def ctracer_calls(lines, compared: set[str], returns_only: set[str],
                  window: tuple[int, int]) -> tuple[collections.Counter, int]:
    """Calls per (function, object) in ctracer's JSON Lines export: entries with an
    object, or for a function whose object is its return value, exits; only the
    ``compared`` functions, in the ``window``; and the events read."""
    ours: collections.Counter = collections.Counter()
    events = 0
    for line in lines:
        e = json.loads(line)
        events += 1
        func = e["function"]
        if func not in compared or not window[0] <= e["time_ns"] <= window[1]:
            continue
        obj = e["object"]   # hex text; null where the way gave none (a return's entry)
        obj = int(obj, 16) if isinstance(obj, str) else int(obj or 0)
        if obj and (e["phase"] == "exit") == (func in returns_only):
            ours[(func, obj)] += 1
    return ours, events


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--struct", default="sock")
    p.add_argument("--functions", nargs="*", default=[])
    p.add_argument("--probes", default="fentry.multi")
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--messages", type=int, default=3)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(LOCAL, ignore_errors=True)
    os.makedirs(LOCAL)
    result: dict = {"kernel": os.uname().release, "probes": args.probes}
    clock = time.monotonic()

    listed = subprocess.run(CTRACER + ["functions", "struct", args.struct, "--json"],
                            capture_output=True, text=True, check=True)
    methods = [m for m in json.loads(listed.stdout)["methods"]
               if not m["tracepoint"] and m["probeable"]]
    if args.functions:
        import fnmatch
        methods = [m for m in methods if any(fnmatch.fnmatchcase(m["function"], g)
                                             for g in args.functions)]
    names = {m["function"] for m in methods} & _kallsyms_once()
    names -= _blacklisted()
    names &= traceable()
    print(f"{len(names)} functions for bpftrace after {time.monotonic() - clock:.0f} s",
          flush=True)
    bt_out = os.path.join(LOCAL, "bpftrace.txt")
    dropped: list[str] = []
    for attempt in range(8):
        ways = ways_of(methods, names)
        probed = set(ways)
        bt = start_bpftrace(bpftrace_script(ways), bt_out, len(probed))
        # every method of sock (3,771 probes) took bpftrace about 30 minutes to attach
        # in a loaded TCG guest
        if wait_for(bt_out, "ready", bt, 3600):
            break
        text = open(bt_out, errors="replace").read()
        bad = set(re.findall(r"Error attaching probe: 'k(?:ret)?probe:([\w.]+)'", text)) & names
        if bt.poll() is None:
            bt.kill()
        bt.wait()
        if not bad:
            print(f"bpftrace did not start: {text[-1500:]}", file=sys.stderr)
            return 2
        dropped += sorted(bad)
        names -= bad
        print(f"bpftrace refused {sorted(bad)}: started again", flush=True)
    else:
        print(f"bpftrace refused a function each of 8 times: {dropped}", file=sys.stderr)
        return 2
    result["bpftrace_probed"] = len(probed)
    result["bpftrace_refused"] = dropped
    result["bpftrace_attach_s"] = round(time.monotonic() - clock, 1)
    print(f"bpftrace: {len(probed)} functions ready after {result['bpftrace_attach_s']} s "
          f"(refused: {dropped})", flush=True)

    trace = os.path.join(LOCAL, "t.ctrace")
    log = os.path.join(LOCAL, "ctracer.log")
    cmd = CTRACER + ["trace", "struct", args.struct, "--function-probes", args.probes,
                     "-d", "3600", "-o", trace]
    if args.functions:
        cmd += ["--functions", *args.functions]
    ct = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    if not wait_for(log, f"recording struct {args.struct}", ct, 2400):
        print(f"ctracer did not start recording: {open(log).read()[-2000:]}", file=sys.stderr)
        shutil.copy(log, args.out)
        return 2
    begin = time.monotonic_ns()
    work = subprocess.run([TCPLOOP, "--connections", str(args.connections), "--messages",
                           str(args.messages), "--bytes", "100"], capture_output=True, text=True,
                          timeout=600)
    time.sleep(1)
    end = time.monotonic_ns()
    ct.send_signal(signal.SIGINT)
    ct.wait(900)
    bt.send_signal(signal.SIGINT)
    try:
        bt.wait(900)
    except subprocess.TimeoutExpired:
        bt.kill()
    result["tcploop"] = work.returncode
    result["ctracer_exit"] = ct.returncode
    ctracer_log = open(log).read()
    result["ctracer_summary"] = [line for line in ctracer_log.splitlines()
                                 if "probes" in line or "events" in line][-4:]
    print("\n".join(result["ctracer_summary"]), flush=True)

    db = sqlite3.connect(trace)
    rows: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for name, reach, state in db.execute("SELECT name, reach, attached FROM functions "
                                         "WHERE reach != 'tracepoint'"):
        rows[name].append((reach, state or ""))
    db.close()

    def whole(name: str) -> bool:
        return bool(rows.get(name)) and all(s and not s.startswith(
            ("failed", "skipped", "entry only")) for _, s in rows[name])
    ours_attached = {n for n in rows if whole(n)}
    # compared: both attached, with as many ways each (ctracer keeps 8 a function)
    compared = {f for f in probed & ours_attached if len(rows[f]) == len(ways[f])}
    result["ctracer_functions"] = len(rows)
    result["ctracer_attached"] = len(ours_attached)
    result["ctracer_refused"] = {n: [s for _, s in r if s.startswith(("failed", "entry only"))][0]
                                 for n, r in rows.items()
                                 if any(s.startswith(("failed", "entry only")) for _, s in r)}
    result["not_compared"] = {
        "bpftrace only": len(probed - set(rows)),
        "ctracer only": len(ours_attached - probed),
        "ways differ": sorted(f for f in probed & ours_attached if len(rows[f]) != len(ways[f]))}
    result["compared_functions"] = len(compared)

    returns_only = {f for f, w in ways.items() if set(w) == {"ret"}}
    theirs: collections.Counter = collections.Counter()
    lost = 0
    for line in open(bt_out, errors="replace"):
        parts = line.split()
        if len(parts) == 4 and parts[0] in ("e", "x"):
            phase, ns, func, obj = parts
            if func not in compared or not begin <= int(ns) <= end:
                continue
            if (phase == "x") == (func in returns_only):
                theirs[(func, int(obj))] += 1
        elif "Lost" in line:
            lost += int(re.findall(r"\d+", line)[0])
    result["bpftrace_lost"] = lost

    jsonl = os.path.join(LOCAL, "t.jsonl")
    subprocess.run(CTRACER + ["export", trace, "--format", "jsonl", "-o", jsonl], check=True,
                   capture_output=True)
    with open(jsonl) as f:
        ours, events = ctracer_calls(f, compared, returns_only, (begin, end))
    result["events"] = events
    result["calls_ctracer"] = sum(ours.values())
    result["calls_bpftrace"] = sum(theirs.values())
    result["pairs"] = len(set(ours) | set(theirs))
    differ = {f"{f} {o:#x}": [ours.get((f, o), 0), theirs.get((f, o), 0)]
              for f, o in sorted(set(ours) | set(theirs)) if ours.get((f, o)) != theirs.get((f, o))}
    result["differing_pairs"] = len(differ)
    result["differ"] = dict(list(differ.items())[:200])
    result["functions_called"] = len({f for f, _ in set(ours) | set(theirs)})
    result["objects"] = len({o for _, o in set(ours) | set(theirs)})
    result["seconds"] = round(time.monotonic() - clock, 1)
    for name in ("ctracer.log", "counts.bt"):
        shutil.copy(os.path.join(LOCAL, name), args.out)
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k not in ("differ",)}, indent=1))
    return 0 if not differ and result["calls_ctracer"] else 1


if __name__ == "__main__":
    sys.exit(main())
