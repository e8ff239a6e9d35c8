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
   and attach come before the start).  Goal: ≥ 2×, with 0 events lost.
2. **Cost per traced call** (user space, uprobes): the -O2 socket sample under
   `ctracer trace --binary` (entry and exit snapshots of struct sock on every method
   with a unique name) against bpftrace with empty uprobe+uretprobe pairs on the same
   functions (the anchor); cost per call = (traced run - untraced run) / calls, the
   runs timed by the workload's own shell.  Goal: ≤ 1.25×.
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

from ctracer import pipeline  # noqa: E402
from ctracer.debuginfo.model import ShapeKind  # noqa: E402
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


def kernel_throughput(connections: int, messages: int, tmp: str) -> None:
    stamp = os.path.join(tmp, "started")
    workload = (f"echo $EPOCHREALTIME > {stamp}; exec {TCPLOOP} --connections {connections} "
                f"--messages {messages} --settle-ms 0 >/dev/null")
    request = pipeline.TraceRequest(ShapeKind.STRUCT, "sock", functions=TRACEPOINTS,
                                    fields=FIELDS, follow_processes=True, buffer_mb=64)
    built = pipeline.build(request)
    out = os.path.join(tmp, "k.ctrace")
    result = recorder.record(built.program, None, out, meta=built.meta,
                             command=[BASH, "-c", workload])
    ctracer_s = time.time() - _started(stamp)
    recording_s = result.seconds
    stored = Trace(out).event_count()

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
    bt_run = time.time() - _started(stamp)
    with open(os.path.join(tmp, "b.txt")) as f:
        output = f.read()
    printed = sum(1 for line in output.splitlines()
                  if line[:1] in "0123456789abcdef" and " " in line)
    text += output  # bpftrace reports its losses ("Lost N events") in its output
    ours, theirs = stored / ctracer_s, printed / bt_run
    print(f"kernel, tcploop --connections {connections} --messages {messages}, "
          f"{len(TRACEPOINTS)} tracepoints, {len(FIELDS)} fields:")
    print(f"  ctracer: {stored} events stored in {ctracer_s:.2f} s = {ours:,.0f} events/s, "
          f"{result.lost} lost (from the workload's start to the trace file written)")
    print(f"    of which recording {recording_s:.2f} s (the workload under the probes, every "
          f"event delivered and committed raw: {stored / recording_s:,.0f} events/s), then "
          f"{ctracer_s - recording_s:.2f} s decoding into the events table")
    print(f"  bpftrace (anchor): {printed} lines printed in {bt_run:.2f} s = "
          f"{theirs:,.0f} events/s, {_lost(text)} lost (from the workload's start to "
          "bpftrace's exit)")
    print(f"  ratio: {ours / theirs:.2f}x (goal >= 2x); events: ctracer {stored}, "
          f"bpftrace {printed} (+ {_lost(text)} lost) of the same workload")


def _timed(command: list[str], stamp: str) -> str:
    """A shell line running ``command`` and writing its elapsed seconds to ``stamp``."""
    quoted = " ".join(subprocess.list2cmdline([c]) for c in command)
    return (f"s=$EPOCHREALTIME; {quoted} >/dev/null; e=$EPOCHREALTIME; "
            f"echo \"$s $e\" > {stamp}")


def _elapsed(stamp: str) -> float:
    with open(stamp) as f:
        s, e = f.read().split()
    return float(e) - float(s)


def uprobe_cost(loops: int, tmp: str) -> None:
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

    untraced = []
    for _ in range(3):
        subprocess.run([BASH, "-c", _timed(command, stamp)], check=True)
        untraced.append(_elapsed(stamp))
    base = min(untraced)

    request = pipeline.TraceRequest(ShapeKind.STRUCT, "sock", TypeSource(binary=SAMPLE),
                                    functions=tuple(names), follow_processes=True,
                                    buffer_mb=64)
    built = pipeline.build(request)
    out = os.path.join(tmp, "u.ctrace")
    result = recorder.record(built.program, SAMPLE, out, meta=built.meta,
                             command=[BASH, "-c", _timed(command, stamp)])
    traced = _elapsed(stamp)
    calls = sum(1 for e in Trace(out).events() if e.phase == 0)

    probes = ",".join(f"uprobe:{SAMPLE}:{n},uretprobe:{SAMPLE}:{n}" for n in names)
    script_file = os.path.join(tmp, "sample.sh")
    with open(script_file, "w") as f:
        f.write(_timed(command, stamp) + "\n")
    _bpftrace(probes + " {}", f"{BASH} {script_file}", os.path.join(tmp, "empty.txt"))
    empty = _elapsed(stamp)
    ours, theirs = (traced - base) / calls, (empty - base) / calls
    print(f"user space, sockdemo-O2 --loops {loops}: {len(names)} functions, {calls} calls:")
    print(f"  untraced {base:.3f} s; ctracer {traced:.3f} s ({result.lost} lost); "
          f"bpftrace empty uprobe+uretprobe {empty:.3f} s (anchor)")
    print(f"  cost per call: ctracer {ours * 1e6:.2f} us, empty probes {theirs * 1e6:.2f} us; "
          f"ratio {ours / theirs:.2f}x (goal <= 1.25x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=300)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--loops", type=int, default=20000)
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--skip-uprobes", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_ktrace needs root")
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    with tempfile.TemporaryDirectory(prefix="ctracer-bench-") as tmp:
        if not args.skip_kernel:
            kernel_throughput(args.connections, args.messages, tmp)
        if not args.skip_uprobes:
            uprobe_cost(args.loops, tmp)


if __name__ == "__main__":
    main()
