#!/usr/bin/env python3
"""Every kernel method of a struct traced under a loopback load, then the kernel checked
(needs root and a kernel with fentry or kprobes: run it in a guest):

    scripts/vm-run --kernel 6.12 -- .venv/bin/python -u bench/soak_kmethods.py
        [--structs sock sk_buff] [--seconds 30] [--logs DIR]

(``--logs`` a directory the host sees, e.g. vm-run's ``--out DIR``: ctracer's output of
each recording is written there as it runs; the trace files stay in the guest.)

For each struct: tcploop runs in a loop (many connections, orderly closes, an abort)
while ``ctracer trace struct S -d SECONDS`` probes every method the plan places and its
tracepoints; then two short recordings are stopped with Ctrl-C and with SIGKILL once
recording has begun.  After each, it prints ctracer's summary (functions probed and
failed, events, lost, compile/attach/detach seconds, missed calls) and counts the BPF
programs and links of ctracer still loaded (``bpftool prog/link show``; after SIGKILL
the kernel frees them with the process).  At the end, the kernel log's new lines are
searched for oopses, BUGs, lockups, RCU stalls and WARNINGs.  Nothing is asserted: it
prints what it saw, and exits 1 when a program stayed or the kernel complained.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
TROUBLE = re.compile(r"Oops|BUG:|soft lockup|hard LOCKUP|rcu_sched|rcu_preempt|"
                     r"self-detected stall|WARNING:|general protection|Call Trace", re.I)


def kernel_log() -> list[str]:
    return subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()


def ctracer_left() -> int:
    """BPF programs and links of ctracer's still in the kernel."""
    left = 0
    for what in ("prog", "link"):
        r = subprocess.run(["bpftool", "-j", what, "show"], capture_output=True, text=True)
        try:
            rows = json.loads(r.stdout or "[]")
        except json.JSONDecodeError:
            rows = []
        left += sum(1 for row in rows if "ctracer_" in str(row.get("name", "")) or
                    "ctracer_" in str(row.get("prog_name", "")))
    return left


class Load:
    """tcploop in a loop until stopped."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["sh", "-c", f"while :; do {TCPLOOP} --connections 20 --messages 50; done"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def summary(text: str) -> str:
    keep = [ln for ln in text.splitlines() if ln.startswith("ctracer: ") and
            any(k in ln for k in ("probes", " events, ", "warning", "lost", "failed"))]
    return "\n    ".join(keep[:6])


def one(struct: str, out: str, log_path: str, stop: str,
        seconds: float) -> tuple[float, int]:
    """A recording of every method of ``struct`` ended by ``stop`` ("duration", "SIGINT",
    "SIGKILL"); returns (wall seconds, programs of ctracer left afterwards)."""
    cmd = CTRACER + ["trace", "struct", struct, "-o", out, "--buffer-mb", "64"]
    if stop == "duration":
        cmd += ["-d", str(seconds)]
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        if stop != "duration":
            while "recording struct" not in open(log_path).read():
                if proc.poll() is not None:
                    break
                time.sleep(0.5)
            time.sleep(seconds)
            proc.send_signal(signal.SIGINT if stop == "SIGINT" else signal.SIGKILL)
        code = proc.wait()
    wall = time.monotonic() - start
    for leftover in (out, out + "-wal", out + "-shm", out + ".old"):
        if os.path.exists(leftover):   # the guest's /tmp is its memory: one trace at a time
            os.unlink(leftover)
    time.sleep(1)   # a killed process's files close after it is reaped
    left = ctracer_left()
    print(f"  {struct}, stopped by {stop}: exit {code}, {wall:.0f} s, "
          f"ctracer programs/links left: {left}")
    print("    " + summary(open(log_path).read()))
    return wall, left


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--structs", nargs="+", default=["sock", "sk_buff"])
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--logs", help="where ctracer's output goes (default: a temporary "
                   "directory)")
    o = p.parse_args()
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    before = len(kernel_log())
    print(f"kernel {os.uname().release}; every method of {', '.join(o.structs)}, "
          f"{o.seconds:.0f} s each under tcploop")
    bad = False
    with tempfile.TemporaryDirectory() as tmp:
        for struct in o.structs:
            load = Load()
            try:
                for stop, secs in (("duration", o.seconds), ("SIGINT", 5), ("SIGKILL", 5)):
                    logs = o.logs or tmp
                    os.makedirs(logs, exist_ok=True)
                    _, left = one(struct, os.path.join(tmp, f"{struct}-{stop}.ctrace"),
                                  os.path.join(logs, f"{struct}-{stop}.log"), stop, secs)
                    bad |= left > 0
            finally:
                load.stop()
    new = kernel_log()[before:]
    trouble = [ln for ln in new if TROUBLE.search(ln)]
    print(f"kernel log: {len(new)} new lines, {len(trouble)} of trouble")
    for ln in trouble[:20]:
        print("  " + ln)
    return 1 if bad or trouble else 0


if __name__ == "__main__":
    sys.exit(main())
