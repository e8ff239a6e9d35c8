#!/usr/bin/env python3
"""Tracing the kernel and a program, against bpftrace measured in the same run (needs
root and bpftrace; run with the project's venv):

    .venv/bin/python bench/bench_ktrace.py [--connections N] [--messages N] [--loops N]

1. **Kernel throughput**: the loopback workload samples/tcp/tcploop under
   `ctracer trace struct sock` on three tracepoints (inet_sock_set_state,
   sock_send_length, sock_recv_length) recording five fields of the socket and the
   tracepoints' arguments, against bpftrace printing the same fields from the same
   tracepoints to a file (the anchor).  Events per second = events stored / the time
   from the workload's start until the tool's output is complete (ctracer: the trace
   file written; bpftrace: its output flushed and the tool gone; each tool's compile
   and attach come before the start).  Goal: ≥ 2×, with 0 events lost.  The same
   workload is then traced with the collectors' default selection of struct sock and
   with only its cacheline 1 (``--selections``), each with its snapshot size, so the
   cost of the fields a user keeps is seen against the same anchor.
2. **Cost per traced call** (user space, uprobes): the -O2 socket sample under
   `ctracer trace --binary` (entry and exit snapshots of struct sock on every method
   with a unique name) against bpftrace with empty uprobe+uretprobe pairs on the same
   functions (the anchor); cost per call = (traced run - untraced run) / calls, the
   runs timed by the workload's own shell.  Goal: ≤ 1.25×.

The machine is shared and noisy: each tool runs ``--rounds`` times, alternating, and
the best run of each is compared (every round's ratio is printed too), with the load
average at the start.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from ctracer.record import request as trace_request  # noqa: E402
from ctracer.debuginfo.catalog import ShapeKind  # noqa: E402
from ctracer.debuginfo.sources import TypeSource  # noqa: E402
from ctracer.record import recorder  # noqa: E402
from ctracer.tracefile import Trace  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
SAMPLE = os.path.join(ROOT, "samples", "sock", "build", "sockdemo-O2")
BASH = "/bin/bash"
TRACEPOINTS = ("inet_sock_set_state", "sock_send_length", "sock_recv_length")
FIELDS = ("__sk_common.skc_state", "__sk_common.skc_num", "__sk_common.skc_dport",
          "sk_sndbuf", "sk_rcvbuf")


def _bpftrace(script: str, command: str, out: str) -> tuple[float, str]:
    start = time.perf_counter()
    r = subprocess.run(["bpftrace", "-o", out, "-e", script, "-c", command],
                       capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"bpftrace failed: {r.stderr.strip()[-300:]}")
    return seconds, r.stdout + r.stderr


def _lost(text: str) -> int:
    return sum(int(n) for n in re.findall(r"Lost (\d+) events", text))


def _started(stamp: str) -> float:
    with open(stamp) as f:
        return float(f.read().split()[0])


#: what each kernel run of ctracer snapshots: the five fields bpftrace prints, the
#: collectors' default selection (every recordable field), one cacheline
SELECTIONS = {"five": {"fields": FIELDS}, "default": {}, "cacheline1": {"cachelines": (1,)}}


def _kernel_program(selection: str) -> trace_request.BuiltTrace:
    request = trace_request.TraceRequest(ShapeKind.STRUCT, "sock", functions=TRACEPOINTS,
                                    follow_processes=True, buffer_mb=64,
                                    **SELECTIONS[selection])
    return trace_request.build(request)


def _snapshot_bytes(built: trace_request.BuiltTrace) -> int:
    return built.program.mini.size


def _ctracer_kernel(built: trace_request.BuiltTrace, workload: str, stamp: str,
                    tmp: str) -> tuple[int, float, float, float, int]:
    """(events stored, seconds from the workload's start to the trace file written and
    finished, seconds of recording, seconds the first reader then takes to count the
    events (they stay raw in the file: trace schema 4), events lost) of one ctracer run."""
    out = os.path.join(tmp, "k.ctrace")
    for old in (out, out + ".old"):
        if os.path.exists(old):
            os.unlink(old)
    result = recorder.record(built.program, None, out, meta=built.meta,
                             command=[BASH, "-c", workload])
    seconds = time.time() - _started(stamp)
    start = time.perf_counter()
    stored = Trace(out).event_count()
    return stored, seconds, result.seconds, time.perf_counter() - start, result.lost


def _bpftrace_kernel(workload: str, stamp: str, tmp: str) -> tuple[int, float, int]:
    """(lines printed, seconds from the workload's start to bpftrace's exit, events
    lost) of one bpftrace run printing the same fields."""
    fields = ("$s->__sk_common.skc_state, $s->__sk_common.skc_num, "
              "$s->__sk_common.skc_dport, $s->sk_sndbuf, $s->sk_rcvbuf")
    script = (
        "tracepoint:sock:inet_sock_set_state /pid == cpid || @f[args->skaddr]/ {"
        " @f[args->skaddr] = 1; $s = (struct sock *)args->skaddr;"
        ' printf("%lx %d %d %d %d %d %d %d\\n", args->skaddr, args->oldstate,'
        f" args->newstate, {fields}); }}\n"
        "tracepoint:sock:sock_send_length, tracepoint:sock:sock_recv_length"
        " /pid == cpid || @f[args->sk]/ {"
        " @f[args->sk] = 1; $s = (struct sock *)args->sk;"
        ' printf("%lx %d %d %d %d %d %d %d\\n", args->sk, args->ret, args->flags,'
        f" {fields}); }}\n"
        "END { clear(@f); }")
    script_file = os.path.join(tmp, "workload.sh")
    with open(script_file, "w") as f:
        f.write(workload + "\n")
    _, text = _bpftrace(script, f"{BASH} {script_file}", os.path.join(tmp, "b.txt"))
    seconds = time.time() - _started(stamp)
    with open(os.path.join(tmp, "b.txt")) as f:
        output = f.read()
    printed = sum(1 for line in output.splitlines()
                  if line[:1] in "0123456789abcdef" and " " in line)
    text += output  # bpftrace reports its losses ("Lost N events") in its output
    return printed, seconds, _lost(text)


def kernel_throughput(connections: int, messages: int, rounds: int, selections: list[str],
                      tmp: str) -> None:
    stamp = os.path.join(tmp, "started")
    workload = (f"echo $EPOCHREALTIME > {stamp}; exec {TCPLOOP} --connections {connections} "
                f"--messages {messages} --settle-ms 0 >/dev/null")
    programs = {name: _kernel_program(name) for name in selections}
    print(f"kernel, tcploop --connections {connections} --messages {messages}, "
          f"{len(TRACEPOINTS)} tracepoints, {rounds} rounds (load average {_load()}); "
          "ctracer's snapshots: " + ", ".join(
              f"{name} {len(p.program.mini.fields)} fields / {_snapshot_bytes(p)} bytes"
              for name, p in programs.items()) + ":")
    ours = {name: [] for name in selections}
    decoded = {name: [] for name in selections}
    theirs = []
    for r in range(rounds):
        for name, built in programs.items():
            stored, seconds, recording_s, decode_s, lost = _ctracer_kernel(
                built, workload, stamp, tmp)
            ours[name].append(stored / seconds)
            decoded[name].append(stored / (seconds + decode_s))
            print(f"  round {r + 1} ctracer ({name}): {stored} events stored, {lost} lost, in "
                  f"{seconds:.2f} s = {stored / seconds:,.0f} events/s (recording "
                  f"{recording_s:.2f} s, then {seconds - recording_s:.2f} s finishing the "
                  f"file); the first reader opening and counting them: {decode_s:.2f} s "
                  f"more = {decoded[name][-1]:,.0f} events/s")
        printed, seconds, lost = _bpftrace_kernel(workload, stamp, tmp)
        theirs.append(printed / seconds)
        print(f"  round {r + 1} bpftrace (anchor, {len(FIELDS)} fields): {printed} lines "
              f"printed, {lost} lost, in {seconds:.2f} s = {printed / seconds:,.0f} events/s")
    print(f"  events/s from the workload's start to the output complete, best of {rounds}: "
          + ", ".join(f"ctracer {name} {max(ours[name]):,.0f} (with the first reader's "
                      f"count {max(decoded[name]):,.0f})" for name in selections)
          + f", bpftrace {max(theirs):,.0f}")
    for name in selections:
        size = _snapshot_bytes(programs[name])
        print(f"  RATIO kernel events/s ctracer ({name}, {size}-byte snapshot) / bpftrace: "
              f"{max(ours[name]) / max(theirs):.2f}x"
              + (" (goal >= 2x)" if name == "five" else "") + "; per round: "
              + ", ".join(f"{o / t:.2f}x" for o, t in zip(ours[name], theirs)))
        print(f"  RATIO ({name}) counting the first reader's count: "
              f"{max(decoded[name]) / max(theirs):.2f}x; per round: "
              + ", ".join(f"{o / t:.2f}x" for o, t in zip(decoded[name], theirs)))


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _timed(command: list[str], stamp: str) -> str:
    """A shell line running ``command`` and writing its elapsed seconds to ``stamp``."""
    quoted = " ".join(subprocess.list2cmdline([c]) for c in command)
    return (f"s=$EPOCHREALTIME; {quoted} >/dev/null; e=$EPOCHREALTIME; "
            f"echo \"$s $e\" > {stamp}")


def _elapsed(stamp: str) -> float:
    with open(stamp) as f:
        s, e = f.read().split()
    return float(e) - float(s)


def uprobe_cost(loops: int, rounds: int, tmp: str) -> None:
    from ctracer.debuginfo.dwarf import reader as dwarf
    from ctracer.plan import discovery
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    found = discovery.discover(dwarf.open_elf_types(SAMPLE).catalog(), "sock")
    counts: dict[str, int] = {}
    for m in found.methods:
        if not m.is_tracepoint and m.probeable and getattr(m.function, "address", None):
            counts.setdefault(m.name, set()).add(m.key)  # type: ignore[arg-type]
    names = sorted(n for n, keys in counts.items() if len(keys) == 1)
    command = [SAMPLE, "--loops", str(loops), "--threads", "1"]
    stamp = os.path.join(tmp, "stamp")
    builds = {encoding: trace_request.build(trace_request.TraceRequest(
        ShapeKind.STRUCT, "sock", TypeSource(binary=SAMPLE), functions=tuple(names),
        follow_processes=True, buffer_mb=64, full_snapshots=encoding == "full"))
        for encoding in ("compact", "full")}
    probes = ",".join(f"uprobe:{SAMPLE}:{n},uretprobe:{SAMPLE}:{n}" for n in names)
    script_file = os.path.join(tmp, "sample.sh")
    with open(script_file, "w") as f:
        f.write(_timed(command, stamp) + "\n")
    print(f"user space, sockdemo-O2 --loops {loops}: {len(names)} functions, {rounds} rounds "
          f"(load average {_load()}):")
    untraced, empty, calls = [], [], 0
    traced: dict[str, list[float]] = {encoding: [] for encoding in builds}
    for r in range(rounds):
        subprocess.run([BASH, "-c", _timed(command, stamp)], check=True)
        untraced.append(_elapsed(stamp))
        said = []
        for encoding, built in builds.items():
            out = os.path.join(tmp, f"u{r}-{encoding}.ctrace")
            result = recorder.record(built.program, SAMPLE, out, meta=built.meta,
                                     command=[BASH, "-c", _timed(command, stamp)])
            traced[encoding].append(_elapsed(stamp))
            trace = Trace(out)
            calls = int((trace.event_columns()["phase"] == 0).sum())
            trace.close()
            said.append(f"ctracer {encoding} {traced[encoding][-1]:.3f} s ({calls} calls, "
                        f"{result.lost} lost)")
        _bpftrace(probes + " {}", f"{BASH} {script_file}", os.path.join(tmp, "empty.txt"))
        empty.append(_elapsed(stamp))
        print(f"  round {r + 1}: untraced {untraced[-1]:.3f} s; {'; '.join(said)}; bpftrace "
              f"empty uprobe+uretprobe {empty[-1]:.3f} s (anchor)")
    if not calls:
        sys.exit("bench_ktrace: the traced runs recorded no calls")
    base = min(untraced)
    theirs = (min(empty) - base) / calls
    for encoding in builds:
        ours = (min(traced[encoding]) - base) / calls
        print(f"  cost per call, best of {rounds}: ctracer ({encoding} events) "
              f"{ours * 1e6:.2f} us, empty probes {theirs * 1e6:.2f} us: RATIO "
              f"{ours / theirs:.2f}x (goal <= 1.25x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--loops", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs of each tool, alternating; the best of each is compared")
    ap.add_argument("--selections", default=",".join(SELECTIONS),
                    help="ctracer's kernel snapshots to run, of: " + ", ".join(SELECTIONS))
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--skip-uprobes", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_ktrace needs root")
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    with tempfile.TemporaryDirectory(prefix="ctracer-bench-") as tmp:
        if not args.skip_kernel:
            selections = [n.strip() for n in args.selections.split(",") if n.strip()]
            unknown = sorted(set(selections) - set(SELECTIONS))
            if unknown:
                raise SystemExit(f"bench_ktrace: unknown selection {', '.join(unknown)}")
            kernel_throughput(args.connections, args.messages, args.rounds, selections, tmp)
        if not args.skip_uprobes:
            uprobe_cost(args.loops, args.rounds, tmp)


if __name__ == "__main__":
    main()
