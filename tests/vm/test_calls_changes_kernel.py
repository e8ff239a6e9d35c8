"""``trace --calls changes`` on kernel functions through kprobe.multi, in the 6.12 guest,
against bpftrace counting the same functions' calls in its maps in the same run
(tests/vm/guest/fold_counts.py: bpftrace counts per (function, socket address) while a
window is open, inside ctracer's recording).

Recorded once around the loopback workload, ``--calls changes --function-probes kprobe``
(kprobe.multi links on 6.12).  Checked: per (function, socket) ctracer's calls, its entry
events plus its folded calls, equal bpftrace's counts; calls were folded, and without
them the counts would fall short (the written calls alone differ from bpftrace's).
``--calls all`` against bpftrace on kprobe.multi is tests/vm/test_kernel_methods.py's.
The functions are a dozen ``tcp_*`` methods, leaves that change nothing among them
(``tcp_current_mss``, ``tcp_check_space``, ``tcp_rate_check_app_limited``,
``tcp_stream_memory_free``), so that the run stays within minutes of guest time (the
compile is most of it); docs/calls.md says what the script gave with ``--calls all`` in
the same run and over every ``tcp_*`` method.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import groundtruth as gt

pytestmark = pytest.mark.vm(kernels=("6.12",))

FUNCTIONS = ("tcp_sendmsg", "tcp_recvmsg", "tcp_current_mss", "tcp_check_space",
             "tcp_rate_check_app_limited", "tcp_stream_memory_free", "tcp_send_mss",
             "tcp_cleanup_rbuf", "tcp_push", "tcp_set_state", "tcp_rcv_established",
             "tcp_v4_do_rcv")
SCRIPT = os.path.join(gt.ROOT, "tests", "vm", "guest", "fold_counts.py")


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    out = tmp_path_factory.mktemp("fold-counts")
    run = subprocess.run([sys.executable, SCRIPT, str(out), "--functions", *FUNCTIONS,
                          "--probes", "kprobe", "--calls", "changes",
                          "--connections", "4", "--messages", "50"],
                         capture_output=True, text=True, timeout=3000)
    print(run.stdout)
    assert run.returncode in (0, 1), (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    result = json.loads((out / "result.json").read_text())
    return {r["calls"]: r for r in result["runs"]}


def test_the_recording_ran_on_kprobe_multi(vm_kernel, counted):
    run = counted["changes"]
    assert run["ctracer_exit"] == 130 and run["tcploop"] == 0, run
    assert run["kprobe_multi"], run["summary"]


def test_written_and_folded_calls_equal_bpftrace_per_socket(vm_kernel, counted):
    run = counted["changes"]
    # 4 connections, 50 messages each way: thousands of calls on a few addresses
    # (a closed socket's address is soon another's)
    assert run["bpftrace_calls"] > 1000 and run["pairs"] >= 12, run
    assert run["equal"], (run["differ_count"], run["differ"])
    assert run["written_calls"] + run["folded_calls"] == run["bpftrace_calls"]


def test_without_the_folded_calls_the_counts_fall_short(vm_kernel, counted):
    run = counted["changes"]
    assert run["folded_calls"] > 0 and not run["written_alone_equal"], run
