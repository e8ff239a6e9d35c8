#!/usr/bin/env python3
"""Run in a guest (scripts/vm-run): ctracer tracing every method of a struct (or the ones
``--functions`` names) and bpftrace counting the same functions' calls per object, in the
same run around the loopback workload; the calls per (function, object) side by side,
and with ``--timing`` the workload's slowdown under each tool alone.

    scripts/vm-run --kernel 6.12 --out OUT -- .venv/bin/python tests/vm/guest/method_counts.py
        OUT [--struct sock] [--functions GLOB...] [--probes auto] [--calls all [changes]]
        [--seconds 30] [--timing]

The ways each function reaches the object come from ``ctracer functions --json`` (the
parameter, then each step: a read of the pointer at an offset or an added offset).
bpftrace computes the same address from ``argN`` (or the return value, for a function
whose object is what it returns) and counts calls in a map, ``@c[func, address] =
count()``: one map update a call and way, nothing printed per call.  A return is keyed by
the probe's name (``kretprobe:F``), not ``func``: in a kretprobe bpftrace 0.17's ``func``
names the caller the function returned into (6.12 guest, 2026-12-05: ``sk_prot_alloc``'s
returns were counted as ``sk_alloc``'s and ``sk_clone_lock``'s).  An entry keeps
``func`` (right in a kprobe): with ``probe`` bpftrace makes a program and a perf kprobe
of each function a wildcard matches, no kprobe.multi link (6.12 guest, 2026-12-05:
``kprobe:tcp_v4_*`` keyed by ``func`` was one kprobe.multi link, by ``probe`` 27 perf
kprobes).  Functions sharing their ways are one group; a group of `MULTI_GROUP`
functions or more is one bpftrace process whose ``kprobe:*`` attaches the group as one
kprobe.multi link (bpftrace 0.17 multi-attaches only a wildcard, matched against
ftrace's ``available_filter_functions``: each such process sees, in a mount namespace of
its own, that file bind-mounted over by the group's names).  The functions reached only
by their return value are one more process whatever their number (a perf kretprobe each,
for ``probe``: few functions).  The other smaller groups share one more such process,
whose wildcard computes every way of theirs and counts each under its number (a way a
function does not have is left out when read): a perf kprobe a function took bpftrace
longer to attach than a guest's 40 minutes.  Nothing of ctracer's probe code is shared: bpftrace reads
the registers and the memory itself.

The recordings (``ctracer trace struct S --calls MODE`` to the guest's tmpfs,
``--function-probes PROBES``, default settings otherwise), one per mode ``--calls``
gives, in its order, bpftrace attached once for all of them: the first recording starts
and, with ``--timing``, the workload is timed under it alone; then bpftrace starts.  In
each recording bpftrace's maps are cleared, the workload runs in a loop for ``--seconds``
between a quiet second on each side, and bpftrace prints its maps (a trigger: a
``getpgid`` of a pid no process has, which bpftrace's tracepoint probe watches).
ctracer's calls in that window, its entry events (exits for a function reached only
through its return value) plus, with ``--calls changes``, the calls it folded in the
kernel (rows whose first and last call are inside the window), are compared with
bpftrace's over the functions both attached.  The first recording stops, the workload
is timed under bpftrace alone; the next recordings start with bpftrace attached; before
the last one stops, bpftrace stops and the workload is timed under that recording
alone; at the end, untraced.  OUT gets result-LABEL.json (per mode: counts, the
differing pairs with each way's counts on both sides and the calls ctracer saw in the
quiet seconds, ctracer's summary, events, lost, bytes written per event and per call,
the BPF programs' skipped runs; the timings), both tools' logs.
Exit status 0 when every count is equal, 1 when some differ (or a bpftrace map was
full), 2 when a tool did not start.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "src"))
CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
LOCAL = "/var/tmp/method-counts"   # the guest's tmpfs
#: one unit of the workload (timed, and looped for the comparison)
UNIT = ["--connections", "4", "--messages", "200", "--bytes", "100", "--settle-ms", "0"]
#: a group of this many functions or more gets a bpftrace process of its own (one
#: kprobe.multi link); fewer share one process, a kprobe each
MULTI_GROUP = 40
#: getpgid(pid) of pids no process has: bpftrace clears its maps, prints them
CLEAR_PID, PRINT_PID = 1999999001, 1999999002
#: distinct (function, object) keys a bpftrace map holds
MAP_KEYS = 262144
#: the same for the process sharing the small groups: its every way is read on every
#: call of each of its functions, and a way through another function's pointer reads
#: whatever is there (counted under a key no function has, left out when read)
SHARED_MAP_KEYS = 1 << 20


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


def counted_ways(ways: list[str]) -> tuple[str, ...]:
    """The ways whose calls are counted: the arguments' at entry; the return value only
    for a function reaching the object by nothing else (as ctracer's exits)."""
    entry = tuple(sorted(w for w in ways if w != "ret"))
    return entry or ("ret",)


def groups_of(ways: dict[str, list[str]]) -> dict[tuple[str, ...], list[str]]:
    """The functions by the ways counted, each group's names sorted."""
    groups: dict[tuple[str, ...], list[str]] = collections.defaultdict(list)
    for f, w in ways.items():
        groups[counted_ways(w)].append(f)
    return {k: sorted(v) for k, v in groups.items()}


#: a key bpftrace printed for a function counted: ``func`` (an entry's) or the probe's name
#: (``kretprobe:F``, a return's; ``kprobe:F`` and an offset are read too), the function
#: its group
PROBE_KEY = r"(?:kretprobe:|kprobe:)?([\w.]+)(?:\+\d+)?"


def count_body(exprs: tuple[str, ...], counter: str = "@c") -> str:
    """bpftrace's action adding one to ``counter[KEY, address]`` for each way's object
    address (``exprs``, or ``("ret",)``: the return value), a null address left out;
    KEY is ``func`` at entry, the probe's name at return (`PROBE_KEY`)."""
    if exprs == ("ret",):
        return f"if (retval != 0) {{ {counter}[probe, (uint64)retval] = count(); }}"
    return " ".join(f"$o{i} = {e}; if ($o{i} != 0) {{ {counter}[func, $o{i}] = count(); }}"
                    for i, e in enumerate(exprs))


CONTROL = (f"tracepoint:syscalls:sys_enter_getpgid /args->pid == {CLEAR_PID}/ "
           "{ clear(@c); printf(\"cleared\\n\"); }\n"
           f"tracepoint:syscalls:sys_enter_getpgid /args->pid == {PRINT_PID}/ "
           "{ printf(\"counts\\n\"); print(@c); printf(\"printed\\n\"); }\n"
           # not printed again at exit (up to a million keys in the shared process)
           "END { clear(@c); }\n")


def bpftrace_scripts(groups: dict[tuple[str, ...], list[str]],
                     multi_group: int = MULTI_GROUP) -> list[tuple[str, list[str]]]:
    """bpftrace programs counting the groups' calls: (script, the names its wildcards
    match).  A big group's script is one wildcard probe, ``kprobe:*`` (``kretprobe:*``
    for objects returned), one map update a call and way.  The small groups share one
    script whose ``kprobe:*`` computes every way of theirs and counts each under its way's
    number, ``@c[func, WAY, address]`` (the counts of ways a function does not have are
    left out when read, `parse_counts`): named probes, one perf kprobe each, took bpftrace
    longer to attach than the guest's 40 minutes (6.12, every method of sock, loaded
    TCG guest, 2026-12-05).  The functions reached only by their return value are a
    process of their own whatever their number: keyed by ``probe`` (`count_body`), its
    ``kretprobe:*`` is a perf kretprobe a function matched, so it matches those only."""
    scripts = []
    small: list[tuple[tuple[str, ...], list[str]]] = []
    for exprs, functions in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        kind = "kretprobe" if exprs == ("ret",) else "kprobe"
        if len(functions) >= multi_group or exprs == ("ret",):
            scripts.append(("BEGIN { printf(\"ready\\n\"); }\n" + CONTROL +
                            f"{kind}:* {{ {count_body(exprs)} }}\n", functions))
        else:
            small.append((exprs, functions))
    if small:
        numbered = way_numbers(dict(small))
        scripts.append(("BEGIN { printf(\"ready\\n\"); }\n" + CONTROL + "kprobe:* { " + " ".join(
            f"$o{n} = {e}; if ($o{n} != 0) {{ @c[func, {n}, $o{n}] = count(); }}"
            for e, n in numbered.items()) + " }\n", sorted(f for _, fs in small for f in fs)))
    return scripts


def way_numbers(groups: dict[tuple[str, ...], list[str]]) -> dict[str, int]:
    """Each way of the groups (expressions, and "ret") numbered in order."""
    return {e: n for n, e in enumerate(sorted({e for exprs in groups for e in exprs}))}


def kept_ways(groups: dict[tuple[str, ...], list[str]],
              multi_group: int = MULTI_GROUP) -> dict[str, set[int]]:
    """For the functions of the small groups, the numbers of the ways they have."""
    small = {k: v for k, v in groups.items() if len(v) < multi_group and k != ("ret",)}
    numbered = way_numbers(small)
    return {f: {numbered[e] for e in exprs} for exprs, fs in small.items() for f in fs}


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


def probeable_methods(struct: str, functions: list[str]) -> list[dict]:
    """The probeable functions of ``struct`` (``ctracer functions --json``'s methods, one
    a way; tracepoints left out), of those matching ``functions`` (globs) when given."""
    listed = subprocess.run(CTRACER + ["functions", "struct", struct, "--json"],
                            capture_output=True, text=True, check=True)
    methods = [m for m in json.loads(listed.stdout)["methods"]
               if not m["tracepoint"] and m["probeable"]]
    if functions:
        methods = [m for m in methods if any(fnmatch.fnmatchcase(m["function"], g)
                                             for g in functions)]
    return methods


def attachable() -> set[str]:
    """Functions named once in kallsyms, hookable by ftrace, not on the kprobe deny list
    (what both tools can attach to by name)."""
    return (_kallsyms_once() - _blacklisted()) & traceable()


def parse_counts(text: str, kept: dict[str, set[int]]) -> collections.Counter:
    """The calls per (function, object) bpftrace printed last ("counts" ... "printed"):
    ``@c[KEY, address]``, or ``@c[KEY, way, address]`` (`PROBE_KEY`) counted only where the function
    has that way (``kept``).  bpftrace 0.17 prints a 64-bit key as a signed number (a
    kernel address is negative)."""
    start = text.rfind("counts\n")
    counts: collections.Counter = collections.Counter()
    if start < 0:
        return counts
    for m in re.finditer(rf"^@c\[{PROBE_KEY}, (?:(\d+), )?(-?\d+)\]: (\d+)$", text[start:], re.M):
        func, way = m.group(1), m.group(2)
        if way is None or int(way) in kept.get(func, ()):
            counts[(func, int(m.group(3)) & 0xFFFFFFFFFFFFFFFF)] += int(m.group(4))
    return counts


class Bpftrace:
    """One bpftrace process counting calls; its wildcards see ``names`` as the functions
    ftrace can hook (a mount namespace of its own)."""

    def __init__(self, index: int, script: str, names: list[str], probes: int):
        self.map_keys = SHARED_MAP_KEYS if re.search(r"@c\[(?:func|probe), \d+, ", script) else MAP_KEYS
        self.out = os.path.join(LOCAL, f"bpftrace-{index}.txt")
        path = os.path.join(LOCAL, f"counts-{index}.bt")
        with open(path, "w") as f:
            f.write(script)
        env = dict(os.environ, BPFTRACE_MAX_PROBES=str(probes + 100),
                   BPFTRACE_MAP_KEYS_MAX=str(self.map_keys))
        listed = os.path.join(LOCAL, f"functions-{index}.txt")
        with open(listed, "w") as f:
            f.write("\n".join(names) + "\n")
        binds = " ".join(f"mount --bind {listed} {d}/available_filter_functions &&"
                         for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
                         if os.path.exists(f"{d}/available_filter_functions"))
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
               f"{binds} exec bpftrace -B line {path}"]
        self.names, self.script = names, script
        self.proc = subprocess.Popen(cmd, stdout=open(self.out, "w"), stderr=subprocess.STDOUT,
                                     env=env)

    def text(self) -> str:
        return open(self.out, errors="replace").read()

    def wait_for(self, text: str, timeout: float, after: int = 0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if text in self.text()[after:]:
                return True
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def stop(self, timeout: float = 600) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)


def stop_all(tools: list[Bpftrace], timeout: float = 240) -> dict:
    """Ctrl-C every bpftrace at once; the seconds until all exited, and how many did
    not within ``timeout`` (killed: one did not exit in 600 s in the 7.2 guest)."""
    start = time.monotonic()
    for t in tools:
        if t.proc.poll() is None:
            t.proc.send_signal(signal.SIGINT)
    while any(t.proc.poll() is None for t in tools) and time.monotonic() - start < timeout:
        time.sleep(0.5)
    killed = [t for t in tools if t.proc.poll() is None]
    for t in killed:
        t.proc.kill()
        t.proc.wait(60)
    print(f"bpftrace stopped in {time.monotonic() - start:.1f} s, {len(killed)} killed", flush=True)
    return {"s": round(time.monotonic() - start, 1), "killed": len(killed)}


def all_do(tools: list[Bpftrace], pid: int, text: str, timeout: float = 300) -> bool:
    """Trigger every bpftrace's control probe and wait until each printed ``text``."""
    marks = [len(t.text()) for t in tools]
    try:
        os.getpgid(pid)
    except ProcessLookupError:
        pass
    return all(t.wait_for(text, timeout, m) for t, m in zip(tools, marks))


def ctracer_calls(columns: dict, functions: dict, compared: set[str], returns_only: set[str],
                  window: tuple[int, int]) -> tuple[collections.Counter, int]:
    """Calls per (function, object) in a trace's event columns (`Trace.event_columns`):
    entries with an object, or for a function whose object is its return value, exits;
    only the ``compared`` functions, in the ``window``; and the events read."""
    import numpy as np
    fid, phase, obj, ts = (columns["function_id"], columns["phase"], columns["object"],
                           columns["ts_ns"])
    wanted_phase = np.full(max(functions, default=0) + 1, 255, np.uint8)
    for k, row in functions.items():
        if row.name in compared:
            wanted_phase[k] = 1 if row.name in returns_only else 0
    keep = ((phase == wanted_phase[fid]) & (obj != 0) & (ts >= window[0]) & (ts <= window[1]))
    pairs, counts = np.unique(np.stack([fid[keep].astype(np.uint64), obj[keep]]), axis=1,
                              return_counts=True)
    ours: collections.Counter = collections.Counter()
    for k, o, n in zip(pairs[0].tolist(), pairs[1].tolist(), counts.tolist()):
        ours[(functions[k].name, int(o))] += int(n)
    return ours, len(fid)


def run_unit() -> float:
    start = time.monotonic()
    done = subprocess.run([TCPLOOP, *UNIT], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"tcploop failed: {done.stderr.strip()}")
    return time.monotonic() - start


def timed(label: str, seconds: float) -> dict:
    """The workload's unit run again and again for ``seconds`` (at least twice)."""
    runs = []
    start = time.monotonic()
    while len(runs) < 2 or time.monotonic() - start < seconds:
        runs.append(run_unit())
    mean = sum(runs) / len(runs)
    print(f"{label}: {len(runs)} runs of tcploop {' '.join(UNIT)}, {mean:.3f} s each",
          flush=True)
    return {"runs": len(runs), "mean_s": round(mean, 4), "each_s": [round(r, 3) for r in runs]}


def missed_runs() -> dict[str, int]:
    """Each loaded BPF program's runs the kernel skipped (bpftool's ``recursion_misses``:
    a kprobe-type program does not run while another runs on its CPU), summed by name."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    try:
        progs = json.loads(out.stdout or "[]")
    except ValueError:
        return {}
    missed: collections.Counter = collections.Counter()
    for p in progs:
        if p.get("recursion_misses"):
            missed[p.get("name", "?")] += int(p["recursion_misses"])
    return dict(missed)


def printed_keys(text: str) -> int:
    """How many keys bpftrace's last print of ``@c`` had (a map as full as its size
    may have refused some calls' updates)."""
    start = text.rfind("counts\n")
    return 0 if start < 0 else len(re.findall(r"^@c\[", text[start:], re.M))


def parse_way_counts(text: str) -> collections.Counter:
    """bpftrace's last printed counts of the shared process, per (function, way number,
    object): what each way of a function counted (`parse_counts` sums the kept ones)."""
    start = text.rfind("counts\n")
    out: collections.Counter = collections.Counter()
    if start < 0:
        return out
    for m in re.finditer(rf"^@c\[{PROBE_KEY}, (\d+), (-?\d+)\]: (\d+)$", text[start:], re.M):
        out[(m.group(1), int(m.group(2)), int(m.group(3)) & 0xFFFFFFFFFFFFFFFF)] += int(m.group(4))
    return out


def start_bpftrace(scripts: list[tuple[str, list[str]]], timeout: float = 3600
                   ) -> tuple[list[Bpftrace], list[float]]:
    """Start one bpftrace per script; each one's seconds until ready (None: never)."""
    started = time.monotonic()
    tools = [Bpftrace(i, s, n, len(n)) for i, (s, n) in enumerate(scripts)]
    ready: list = [None] * len(tools)
    while any(r is None for r in ready) and time.monotonic() - started < timeout:
        for i, t in enumerate(tools):
            if ready[i] is None and "ready" in t.text():
                ready[i] = round(time.monotonic() - started, 1)
        if any(ready[i] is None and t.proc.poll() is not None for i, t in enumerate(tools)):
            break
        time.sleep(0.5)
    return tools, ready


class Recording:
    """One ``ctracer trace struct S --calls MODE`` into the guest's tmpfs."""

    def __init__(self, args: argparse.Namespace, mode: str):
        self.mode = mode
        self.trace = os.path.join(LOCAL, f"{mode}.ctrace")
        self.log = os.path.join(LOCAL, f"ctracer-{mode}.log")
        cmd = CTRACER + ["trace", "struct", args.struct, "--function-probes", args.probes,
                         "--calls", mode, "-d", "7200", "-o", self.trace]
        if args.functions:
            cmd += ["--functions", *args.functions]
        self.struct = args.struct
        self.clock = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.result: dict = {"calls": mode}

    def text(self) -> str:
        return open(self.log, errors="replace").read()

    def wait_ready(self, timeout: float = 2400) -> bool:
        while f"recording struct {self.struct}" not in self.text():
            if self.proc.poll() is not None or time.monotonic() - self.clock > timeout:
                return False
            time.sleep(0.5)
        self.result["ready_s"] = round(time.monotonic() - self.clock, 1)
        self.result["plan"] = [ln for ln in self.text().splitlines() if "probes" in ln][:3]
        print(f"ctracer --calls {self.mode} recording after {self.result['ready_s']} s: "
              f"{self.result['plan']}", flush=True)
        return True

    def stop(self) -> None:
        """SIGINT, wait, and what its summary says (events, lost, bytes)."""
        stop = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.proc.wait(1800)
        r = self.result
        r["stop_s"] = round(time.monotonic() - stop, 1)
        r["exit"] = self.proc.returncode
        log = self.text()
        r["summary"] = [ln for ln in log.splitlines() if ln.startswith("ctracer:")][-8:]
        print("\n".join(r["summary"]), flush=True)
        got = (re.findall(r"([\d,]+) events, .*?([\d,]+) lost", log) or [None])[-1]
        if got:
            r["events_written"] = int(got[0].replace(",", ""))
            r["events_lost"] = int(got[1].replace(",", ""))
            total = r["events_written"] + r["events_lost"]
            r["lost_percent"] = round(100 * r["events_lost"] / max(total, 1), 3)
        r["trace_bytes"] = sum(os.path.getsize(self.trace + s) for s in ("", "-wal")
                               if os.path.exists(self.trace + s))


def window(tools: list[Bpftrace], seconds: float) -> dict:
    """bpftrace's maps cleared, the workload looped for ``seconds`` between a second of
    quiet on each side, the maps printed: the window's bounds (monotonic ns, the clock of
    ctracer's events), the margins' outer bounds, each bpftrace's printed text, the BPF
    programs' runs skipped in it."""
    missed_before = missed_runs()
    outer_begin = time.monotonic_ns()
    cleared = all_do(tools, CLEAR_PID, "cleared")
    time.sleep(1)
    begin = time.monotonic_ns()
    loops = 0
    while loops == 0 or (time.monotonic_ns() - begin) / 1e9 < seconds:
        run_unit()
        loops += 1
    time.sleep(1)
    end = time.monotonic_ns()
    printed = all_do(tools, PRINT_PID, "printed", 900)
    outer_end = time.monotonic_ns()
    missed_after = missed_runs()
    w = {"begin": begin, "end": end, "outer": (outer_begin, outer_end), "loops": loops,
         "cleared": cleared, "printed": printed, "texts": [t.text() for t in tools],
         "map_keys": [t.map_keys for t in tools],
         "missed_runs": {k: v - missed_before.get(k, 0) for k, v in missed_after.items()
                         if v - missed_before.get(k, 0)}}
    print(f"window: {loops} runs of tcploop in {(end - begin) / 1e9:.1f} s; cleared "
          f"{cleared}, printed {printed}; runs skipped {w['missed_runs']}", flush=True)
    return w


def folded_calls(table: dict, functions: dict, compared: set[str], returns_only: set[str],
                 span: tuple[int, int]) -> tuple[collections.Counter, int]:
    """Calls ``--calls changes`` folded (the trace's ``folded_calls``) per (function,
    object) in rows (``table``: `ctracer.tracefile.folds.read`'s columns) whose first
    and last call are inside ``span``, and the calls of rows
    crossing its bounds (read from neither side).  As for the written calls
    (`ctracer_calls`), a function's calls through its return value count only for a
    function reaching the object by nothing else."""
    inside: collections.Counter = collections.Counter()
    crossing = 0
    for obj, fid, calls, first, last in zip(
            table["object"].tolist(), table["function_id"].tolist(), table["calls"].tolist(),
            table["first_ns"].tolist(), table["last_ns"].tolist()):
        row = functions.get(fid)
        if row is None or row.name not in compared or not obj:
            continue
        if (row.route_kind == "returns") != (row.name in returns_only):
            continue
        if span[0] <= first and last <= span[1]:
            inside[(row.name, int(obj))] += calls
        elif first <= span[1] and last >= span[0]:
            crossing += calls
    return inside, crossing


def compare(rec: Recording, w: dict, ways: dict[str, list[str]], kept: dict[str, set[int]]
            ) -> dict:
    """One recording's calls per (function, object) in the window against bpftrace's."""
    import numpy as np
    from ctracer.tracefile import Trace
    r = rec.result
    opened = Trace(rec.trace)
    rows: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for row in opened.functions.values():
        if row.route_kind != "tracepoint":
            rows[row.name].append((row.route_kind, row.attached))

    def whole(name: str) -> bool:
        return bool(rows.get(name)) and all(s and not s.startswith(
            ("failed", "skipped", "entry only")) for _, s in rows[name])
    ours_attached = {n for n in rows if whole(n)}
    probed = set(ways)
    compared = {f for f in probed & ours_attached if len(rows[f]) == len(ways[f])}
    r["functions"] = len(rows)
    r["attached"] = len(ours_attached)
    r["refused"] = {n: [s for _, s in rs if s.startswith(("failed", "entry only"))][0]
                    for n, rs in rows.items()
                    if any(s.startswith(("failed", "entry only")) for _, s in rs)}
    r["not_compared"] = {
        "bpftrace only": len(probed - set(rows)),
        "ctracer only": len(ours_attached - probed),
        "ways differ": sorted(f for f in probed & ours_attached if len(rows[f]) != len(ways[f]))}
    r["compared_functions"] = len(compared)
    returns_only = {f for f, wy in ways.items() if counted_ways(wy) == ("ret",)}
    columns = opened.event_columns()
    written, events = ctracer_calls(columns, opened.functions, compared, returns_only,
                                    (w["begin"], w["end"]))
    from ctracer.tracefile.folds import read
    table = read(opened.db)
    folded, crossing = folded_calls(table, opened.functions, compared, returns_only,
                                    (w["begin"], w["end"]))
    # what ctracer saw in the quiet seconds bpftrace's window holds and the compared one not
    margin_written = (ctracer_calls(columns, opened.functions, compared, returns_only,
                                    (w["outer"][0], w["begin"] - 1))[0] +
                      ctracer_calls(columns, opened.functions, compared, returns_only,
                                    (w["end"] + 1, w["outer"][1]))[0])
    margin_folded = (folded_calls(table, opened.functions, compared, returns_only,
                                  (w["outer"][0], w["begin"] - 1))[0] +
                     folded_calls(table, opened.functions, compared, returns_only,
                                  (w["end"] + 1, w["outer"][1]))[0])
    margin = margin_written + margin_folded
    # per way: ctracer's rows (their route) and bpftrace's way numbers, for differing pairs
    fid, phase, obj, ts = (columns["function_id"], columns["phase"], columns["object"],
                           columns["ts_ns"])
    entries = int((phase == 0).sum())
    opened_functions = opened.functions
    opened.close()
    theirs: collections.Counter = collections.Counter()
    their_ways: collections.Counter = collections.Counter()
    for text in w["texts"]:
        for (f, o), n in parse_counts(text, kept).items():
            if f in compared:
                theirs[(f, o)] += n
        their_ways.update(parse_way_counts(text))
    ours = written + folded
    r["bpftrace_map_keys"] = [[printed_keys(text), size]
                              for text, size in zip(w["texts"], w["map_keys"])]
    r["bpftrace_map_full"] = any(n >= size for n, size in r["bpftrace_map_keys"])
    r["events"] = events
    r["calls_written"] = sum(written.values())
    r["calls_folded"] = sum(folded.values())
    r["folded_rows_crossing_window_calls"] = crossing
    r["calls_ctracer"] = sum(ours.values())
    r["calls_bpftrace"] = sum(theirs.values())
    r["pairs"] = len(set(ours) | set(theirs))
    differ = {(f, o): [ours.get((f, o), 0), theirs.get((f, o), 0)]
              for f, o in sorted(set(ours) | set(theirs)) if ours.get((f, o)) != theirs.get((f, o))}
    r["differing_pairs"] = len(differ)
    r["differing_functions"] = dict(collections.Counter(f for f, _ in differ))
    r["differ"] = {f"{f} {o:#x}": v + ([f"margin {margin[(f, o)]}"] if margin.get((f, o)) else [])
                   for (f, o), v in list(differ.items())[:300]}
    if differ:
        diff_functions = {f for f, _ in differ}
        per_row: collections.Counter = collections.Counter()
        inside = (ts >= w["begin"]) & (ts <= w["end"]) & (obj != 0)
        for k, row in opened_functions.items():
            if row.name in diff_functions:
                sel = inside & (fid == k)
                for p in (0, 1):
                    for o, n in zip(*np.unique(obj[sel & (phase == p)], return_counts=True)):
                        if (row.name, int(o)) in differ:
                            per_row[f"{row.name} {int(o):#x} {row.route_kind} "
                                    f"{row.route_text} {'entry' if p == 0 else 'exit'}"] += int(n)
        r["differ_ctracer_rows"] = dict(sorted(per_row.items())[:400])
        r["differ_bpftrace_ways"] = {f"{f} {o:#x} way {n}": c
                                     for (f, n, o), c in sorted(their_ways.items())
                                     if (f, o) in differ}
    r["margin_calls"] = sum(margin.values())
    r["functions_called"] = len({f for f, _ in set(ours) | set(theirs)})
    r["objects"] = len({o for _, o in set(ours) | set(theirs)})
    r["window_s"] = round((w["end"] - w["begin"]) / 1e9, 1)
    r["window_units"] = w["loops"]
    r["missed_runs"] = w["missed_runs"]
    if r.get("trace_bytes") and events:
        calls = entries + int(table["calls"].sum())   # the whole trace's, as the bytes
        r["calls_recorded"] = entries
        r["calls_folded_in_trace"] = calls - entries
        r["bytes_per_event"] = round(r["trace_bytes"] / events, 1)
        r["bytes_per_call"] = round(r["trace_bytes"] / max(calls, 1), 1)
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--struct", default="sock")
    p.add_argument("--functions", nargs="*", default=[])
    p.add_argument("--probes", default="auto")
    p.add_argument("--calls", nargs="+", choices=("all", "changes"), default=["all"],
                   help="record once per mode given, in this order, bpftrace attached once")
    p.add_argument("--seconds", type=float, default=30, help="the compared window's load")
    p.add_argument("--timing", action="store_true", help="time the workload untraced, "
                   "under ctracer alone and under bpftrace alone")
    p.add_argument("--timing-seconds", type=float, default=20)
    p.add_argument("--label", default="run")
    p.add_argument("--unit-messages", type=int, default=200,
                   help="messages a connection in one run of the workload")
    args = p.parse_args()
    UNIT[UNIT.index("--messages") + 1] = str(args.unit_messages)
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(LOCAL, ignore_errors=True)
    os.makedirs(LOCAL)
    result: dict = {"kernel": os.uname().release, "probes": args.probes,
                    "functions_asked": args.functions, "unit": UNIT, "runs": {}}
    clock = time.monotonic()

    def save() -> None:
        with open(os.path.join(args.out, f"result-{args.label}.json"), "w") as f:
            json.dump(result, f, indent=1)

    methods = probeable_methods(args.struct, args.functions)
    names = {m["function"] for m in methods} & attachable()
    ways = ways_of(methods, names)
    groups = groups_of(ways)
    scripts = bpftrace_scripts(groups)
    kept = kept_ways(groups)
    import resource
    # a named probe holds files of its own (3,771 of them: "Too many open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1 << 18, 1 << 18))

    tools: list[Bpftrace] = []
    done: list[tuple[Recording, dict]] = []
    status = 0
    for k, mode in enumerate(args.calls):
        last = k == len(args.calls) - 1
        rec = Recording(args, mode)
        result["runs"][mode] = rec.result
        if not rec.wait_ready():
            print(f"ctracer --calls {mode} did not start recording: {rec.text()[-2000:]}",
                  file=sys.stderr)
            shutil.copy(rec.log, args.out)
            status = 2
            break
        if args.timing and k == 0:
            rec.result["time_alone"] = timed(f"under ctracer --calls {mode} alone",
                                             args.timing_seconds)
            save()
        if k == 0:
            tools, ready = start_bpftrace(scripts)
            result["bpftrace_processes"] = len(tools)
            result["bpftrace_groups"] = [len(n) for _, n in scripts]
            result["bpftrace_functions"] = len(ways)
            result["bpftrace_ready_s"] = ready
            print(f"bpftrace: {len(ways)} functions in {len(tools)} processes "
                  f"({result['bpftrace_groups']}), ready after {ready} s", flush=True)
            save()
            if any(r is None for r in ready):
                for i, t in enumerate(tools):
                    if ready[i] is None:
                        print(f"bpftrace {i} did not start: {t.text()[-1500:]}", file=sys.stderr)
                        shutil.copy(t.out, args.out)
                    t.stop(60)
                rec.stop()
                return 2
        w = window(tools, args.seconds)
        if last and k > 0:
            result["bpftrace_stop"] = stop_all(tools)
            if args.timing:
                rec.result["time_alone"] = timed(f"under ctracer --calls {mode} alone",
                                                 args.timing_seconds)
            rec.stop()
        else:
            rec.stop()
            if k == 0 and args.timing:
                result["time_bpftrace"] = timed("under bpftrace alone", args.timing_seconds)
            if last:
                result["bpftrace_stop"] = stop_all(tools)
        done.append((rec, w))
        save()
    for t in tools:
        t.stop(60)
    if args.timing and status == 0:
        result["time_untraced"] = timed("untraced", args.timing_seconds)
        base = result["time_untraced"]["mean_s"]
        result["slowdown_bpftrace"] = round(result["time_bpftrace"]["mean_s"] / base, 2)
        for rec, _w in done:
            mean = rec.result["time_alone"]["mean_s"]
            rec.result["slowdown"] = round(mean / base, 2)
            rec.result["over_bpftrace"] = round(mean / result["time_bpftrace"]["mean_s"], 2)
    save()
    for rec, w in done:
        r = compare(rec, w, ways, kept)
        shutil.copy(rec.log, os.path.join(args.out, f"{args.label}-ctracer-{rec.mode}.log"))
        for i, text in enumerate(w["texts"]):
            with open(os.path.join(args.out, f"{args.label}-bpftrace-{i}-{rec.mode}.txt"),
                      "w") as f:
                f.write(scripts[i][0] + "\n---\n" + text[-6000:])
        print(f"--calls {rec.mode}: {r['events']} events ({r.get('lost_percent')}% lost), "
              f"{r['calls_written']} calls written and {r['calls_folded']} folded in the window; "
              f"ctracer {r['calls_ctracer']} calls, bpftrace {r['calls_bpftrace']} over "
              f"{r['pairs']} (function, object) pairs; {r['differing_pairs']} differ", flush=True)
        if r["differing_pairs"] or not r["calls_ctracer"] or r["bpftrace_map_full"]:
            status = max(status, 1)
        save()
    result["seconds"] = round(time.monotonic() - clock, 1)
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    for mode, r in result["runs"].items():
        print(mode, json.dumps({k: v for k, v in r.items()
                                if k not in ("differ", "differ_ctracer_rows",
                                             "differ_bpftrace_ways", "refused")}, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
