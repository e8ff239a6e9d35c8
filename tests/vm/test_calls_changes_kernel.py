"""``trace --calls changes`` on kernel functions, in the 6.12 guest (fentry/fexit),
against bpftrace counting the same functions in the same run.

The loopback workload is recorded twice in one boot, with ``--calls all`` and with
``--calls changes``, each time with bpftrace's kprobes counting calls per (function,
socket address) at the same time.  Checked: with ``--calls changes`` some calls were
folded and the calls per (function, socket) — the written entries plus the folded
counts — are bpftrace's exactly; with ``--calls all`` too; the folded recording wrote
fewer events.  Only 6.12 runs it: the programs are the kernel-function programs every
kind shares (`ctracer.probes.kfunctions` over `ctracer.probes.tracepoint.ctracer_hit`).
The kprobe programs with the fold go past BPF's 512-byte stack: ``--calls changes`` with
kprobe probes is refused in one line, checked here too.
"""

from __future__ import annotations

import collections
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import groundtruth as gt
from support.kernelrun import stop_bpftrace, wait_for_text

pytestmark = pytest.mark.vm(kernels=("6.12",))

CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(gt.ROOT, "samples", "tcp", "build", "tcploop")
#: functions taking the socket (or a struct that starts with it) as their first argument
FUNCTIONS = ("tcp_sendmsg", "tcp_sendmsg_locked", "tcp_push", "tcp_recvmsg",
             "tcp_set_state", "tcp_rcv_established", "tcp_v4_do_rcv", "tcp_ack",
             "tcp_data_queue", "tcp_rcv_state_process", "tcp_close", "tcp_done",
             "tcp_current_mss", "tcp_send_mss", "tcp_cleanup_rbuf", "tcp_rcv_space_adjust",
             "tcp_check_space", "tcp_event_data_recv", "tcp_rate_check_app_limited",
             "tcp_mstamp_refresh")


def _present() -> tuple[str, ...]:
    """`FUNCTIONS` this kernel has exactly once (bpftrace attaches by name)."""
    names = collections.Counter(line.split()[2] for line in open("/proc/kallsyms"))
    return tuple(f for f in FUNCTIONS if names[f] == 1)


def _record(tmp: Path, calls: str, functions: tuple[str, ...]) -> dict:
    script = ",".join(f"kprobe:{f}" for f in functions) + \
        " { printf(\"call %llu %s %llu\\n\", nsecs, func, (uint64)arg0); }"
    bt_out = tmp / f"bpftrace-{calls}.txt"
    bt = subprocess.Popen(["bpftrace", "-B", "line", "-e", script], stdout=open(bt_out, "w"),
                          stderr=subprocess.STDOUT)
    wait_for_text(bt_out, "Attaching", bt, 900)
    trace, log = tmp / f"{calls}.ctrace", tmp / f"ctracer-{calls}.log"
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "sock", "--functions", *functions,
                                     "--function-probes", "fentry", "--calls", calls,
                                     "-d", "900", "-o", str(trace)],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for_text(log, "recording struct sock", ct, 1800)
    begin = time.monotonic_ns()
    work = subprocess.run([TCPLOOP, "--connections", "4", "--messages", "50"],
                          capture_output=True, text=True, timeout=600)
    assert work.returncode == 0, work.stderr
    time.sleep(1)
    end = time.monotonic_ns()
    ct.send_signal(signal.SIGINT)
    assert ct.wait(600) == 130, log.read_text()
    stop_bpftrace(bt, bt_out)
    theirs: collections.Counter = collections.Counter()
    for line in bt_out.read_text().splitlines():
        if line.startswith("call "):
            _, ns, func, address = line.split()
            if begin <= int(ns) <= end:
                theirs[(func, int(address))] += 1
    return {"theirs": theirs, "trace": trace, "log": log.read_text(), "window": (begin, end)}


def _ours(r: dict) -> tuple[collections.Counter, int, int, int]:
    """Calls per (function, socket address) in the window: written entries and folded
    counts; the events, the folded calls and the file's bytes."""
    from ctracer.event import PHASE_ENTRY
    from ctracer.tracefile import Trace
    from ctracer.tracefile import folds

    begin, end = r["window"]
    trace = Trace(str(r["trace"]))
    names = {fid: f.name for fid, f in trace.functions.items()}
    c = trace.event_columns()
    ours: collections.Counter = collections.Counter()
    entry = (c["phase"] == PHASE_ENTRY) & (c["ts_ns"] >= begin) & (c["ts_ns"] <= end)
    for fid, obj in zip(c["function_id"][entry].tolist(), c["object"][entry].tolist()):
        ours[(names[fid], int(obj))] += 1
    rows = folds.read(sqlite3.connect(str(r["trace"])))
    folded = 0
    for k in range(len(rows["calls"])):
        # the guest is quiet: every folded call is the workload's, inside the window
        assert begin <= rows["first_ns"][k] and rows["last_ns"][k] <= end
        ours[(names[int(rows["function_id"][k])], int(rows["object"][k]))] += \
            int(rows["calls"][k])
        folded += int(rows["calls"][k])
    events = trace.event_count()
    trace.close()
    return ours, events, folded, os.path.getsize(r["trace"])


def test_folded_calls_per_socket_equal_bpftrace(vm_kernel, tmp_path):
    functions = _present()
    assert len(functions) >= 12, functions
    every = _record(tmp_path, "all", functions)
    changes = _record(tmp_path, "changes", functions)
    assert "fentry" in changes["log"] and " 0 failed" in changes["log"], changes["log"]
    assert "calls: changes: " in changes["log"]
    got = {}
    for name, r in (("all", every), ("changes", changes)):
        ours, events, folded, size = _ours(r)
        traced = {f for f, _ in ours}
        theirs = collections.Counter({k: n for k, n in r["theirs"].items() if k[0] in traced})
        assert theirs, "bpftrace counted nothing"
        assert ours == theirs, name
        got[name] = (events, folded, size, sum(ours.values()))
        print(f"--calls {name}: {events} events, {folded} calls folded, {size} bytes, "
              f"{sum(ours.values())} calls of {len(traced)} functions on "
              f"{len({a for _, a in ours})} sockets, equal to bpftrace's")
    assert got["all"][1] == 0 and got["changes"][1] > 0
    # each folded call is two events fewer (the two runs' workloads are alike, not equal)
    per_call = got["changes"][0] / got["changes"][3]
    assert per_call < got["all"][0] / got["all"][3]


def test_calls_changes_with_kprobes_is_refused_in_one_line(vm_kernel, tmp_path):
    run = subprocess.run(CTRACER + ["trace", "struct", "sock", "--functions", "tcp_sendmsg",
                                    "--function-probes", "kprobe", "--calls", "changes",
                                    "-d", "1", "-o", str(tmp_path / "k.ctrace")],
                         capture_output=True, text=True, timeout=1800)
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "512-byte stack" in lines[0], run.stderr
    assert not (tmp_path / "k.ctrace").exists()
