"""Kernel functions traced on entry and exit, in the guests (Debian 6.1, 6.12 and 7.2: each
kernel attaches them its own way), against bpftrace counting the same functions in the
same run.

Each kernel is traced twice over the loopback workload: with the kind the plan picks
(fentry/fexit on both kernels) and with kprobes forced (``--function-probes kprobe``:
kprobe.multi links on 6.12 and 7.2, one perf kprobe per function on 6.1, which has no
kprobe.multi).  ctracer records every object (the guest is quiet: only the workload's
sockets); bpftrace's kprobes count calls per (function, socket address) at the same
time.  Checked: the calls per (function, socket) are bpftrace's exactly, softirq
receive paths included (tcp_v4_do_rcv, tcp_rcv_established); tcp_sendmsg's return
values add up to the bytes the workload sent; tcp_set_state's exit snapshot has
skc_state equal to its state argument; a method called inside tcp_sendmsg is one level
deeper; no program of ctracer stays attached once it has exited; the report renders;
each thread's state in task storage, or where a verifier refuses those programs (6.1's
refused its kprobe ones of more routes) their LRU-hash variants, with the kernel's reason.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.kernelrun import stop_bpftrace, wait_for_text

from support import groundtruth as gt

#: 7.2 runs the two full recordings below only on 6.1 and 6.12: in the CI rehearsal of
#: 2026-12-05 they did not reach "recording" within the wait with five emulated guests sharing
#: two cores; 7.2 has one short recording of its own (the tests at the end: fentry.multi)
pytestmark = pytest.mark.vm(kernels=("6.1", "6.12"))

CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(gt.ROOT, "samples", "tcp", "build", "tcploop")
#: functions taking the socket as their first argument, counted by bpftrace too
COUNTED = ("tcp_sendmsg", "tcp_recvmsg", "tcp_set_state", "tcp_rcv_established",
           "tcp_v4_do_rcv", "tcp_ack", "tcp_data_queue", "tcp_rcv_state_process",
           "tcp_close", "tcp_done")
#: called inside tcp_sendmsg
NESTED = ("tcp_push", "tcp_sendmsg_locked")
CONNECTIONS, MESSAGES, BYTES = 4, 3, 100


def _attached_ctracer_programs() -> list[str]:
    out = subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "ctracer_" in line]


def _record(tmp: Path, probes: str, counted=COUNTED, nested=NESTED,
            connections: int = CONNECTIONS, messages: int = MESSAGES) -> dict:
    """bpftrace counting, ctracer recording every sock object, the workload between."""
    script = " ".join([",".join(f"kprobe:{f}" for f in counted) +
                       " { printf(\"call %llu %s %llu\\n\", nsecs, func, (uint64)arg0); }",
                       "kretprobe:tcp_sendmsg { printf(\"sent %lld\\n\", retval); }"])
    bt_out = tmp / "bpftrace.txt"
    bt = subprocess.Popen(["bpftrace", "-B", "line", "-e", script], stdout=open(bt_out, "w"),
                          stderr=subprocess.STDOUT)
    wait_for_text(bt_out, "Attaching", bt, 900)
    trace = tmp / "sock.ctrace"
    log = tmp / "ctracer.log"
    started = time.monotonic()
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "sock", "--functions", *counted,
                                     *nested, "--function-probes", probes, "-d", "900",
                                     "-o", str(trace)],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT)
    # compile and attach in an emulated guest sharing two cores with the other guests
    wait_for_text(log, "recording struct sock", ct, 1800)
    attached = time.monotonic() - started
    begin = time.monotonic_ns()   # CLOCK_MONOTONIC, the probes' bpf_ktime_get_ns too
    work = subprocess.run([TCPLOOP, "--connections", str(connections), "--messages",
                           str(messages), "--bytes", str(BYTES)],
                          capture_output=True, text=True, timeout=300)
    assert work.returncode == 0, work.stderr
    time.sleep(1)
    end = time.monotonic_ns()
    stop = time.monotonic()
    ct.send_signal(signal.SIGINT)
    assert ct.wait(300) == 130, log.read_text()  # 128 + SIGINT
    detached = time.monotonic() - stop
    stop_bpftrace(bt, bt_out)
    calls: collections.Counter = collections.Counter()
    sent = None
    for line in bt_out.read_text().splitlines():
        if line.startswith("call "):
            _, ns, func, address = line.split()
            if begin <= int(ns) <= end:   # the window both recorders saw
                calls[(func, int(address))] += 1
        elif line.startswith("sent "):
            sent = (sent or 0) + int(line.split()[1])
    jsonl = tmp / "sock.jsonl"
    done = subprocess.run(CTRACER + ["export", str(trace), "--format", "jsonl", "-o",
                                     str(jsonl)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in jsonl.read_text().splitlines()]
    print(f"{probes}: {len(events)} events; attach {attached:.1f} s (with the compile), "
          f"detach {detached:.1f} s; {log.read_text().splitlines()[-3:]}")
    return {"calls": calls, "sent": sent, "events": events, "trace": trace, "log": log.read_text(),
            "tmp": tmp, "window": (begin, end), "attach_s": attached, "detach_s": detached}


@pytest.fixture(scope="module", params=["auto", "kprobe"])
def run(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"methods-{request.param}")
    return request.param, _record(tmp, request.param)


def test_the_plan_picks_the_kind_and_says_so(vm_kernel, run):
    probes, r = run
    if probes == "auto":
        assert "probes: fentry/fexit on" in r["log"], r["log"]
    elif vm_kernel != "6.1":
        assert "probes: kprobe/kretprobe on" in r["log"] and "kprobe.multi" in r["log"], r["log"]
    else:
        assert "probes: kprobe/kretprobe on" in r["log"] and "one kprobe per function" in r["log"]
    assert " 0 failed" in r["log"], r["log"]


def test_thread_state_in_task_storage_or_lru_hashes_where_6_1_refuses_it(vm_kernel, run):
    """Where the functions' programs kept each thread's depth: task storage, but where
    6.1's verifier refuses a task-storage program (its kprobe programs of more routes
    were refused as too complex, E2BIG, before the events were built outside the ring
    buffer and the arguments normalised without branches): the LRU-hash variants for
    every function, with the kernel's reason, said in the meta and the summary (the
    other tests of the run check the calls are all there)."""
    from ctracer.tracefile import read_meta
    probes, r = run
    state = read_meta(str(r["trace"])).get("thread_state")
    print(f"\n{probes} on {vm_kernel}: thread state in {state}")
    if probes == "kprobe" and vm_kernel == "6.1" and state != "task storage":
        assert state.startswith("LRU hashes, as the kernel refused ctracer_k"), state
        assert "E2BIG" in state, state
        assert f"note: each thread's call depth and saved entries in {state}" in r["log"]
    else:
        assert state == "task storage"
        assert "note: each thread's" not in r["log"]


def test_calls_per_socket_equal_bpftrace(vm_kernel, run):
    _, r = run
    begin, end = r["window"]
    ours = collections.Counter((e["function"], int(e["object"], 16)) for e in r["events"]
                               if e["phase"] == "entry" and e["function"] in COUNTED
                               and begin <= e["time_ns"] <= end)
    assert r["calls"], "bpftrace counted nothing"
    assert ours == r["calls"]
    receive = sum(n for (f, _), n in ours.items() if f in ("tcp_v4_do_rcv", "tcp_rcv_established"))
    assert receive > 0
    sockets = {a for _, a in ours}
    assert len(sockets) >= 3


def test_tcp_sendmsg_returns_add_up_to_the_bytes_sent(vm_kernel, run):
    _, r = run
    rets = [e["ret"] for e in r["events"] if e["function"] == "tcp_sendmsg"
            and e["phase"] == "exit"]
    assert sum(rets) == CONNECTIONS * MESSAGES * 2 * BYTES == r["sent"]


def test_tcp_set_state_exit_has_the_state_it_was_given(vm_kernel, run):
    _, r = run
    exits = [e for e in r["events"] if e["function"] == "tcp_set_state" and e["phase"] == "exit"]
    assert exits
    for e in exits:
        assert e["fields"]["__sk_common.skc_state"] == e["args"]["state"], e


def test_methods_nest_inside_tcp_sendmsg(vm_kernel, run):
    _, r = run
    open_calls: dict[int, int] = {}
    nested = 0
    for e in r["events"]:
        if e["function"] == "tcp_sendmsg":
            if e["phase"] == "entry":
                open_calls[e["tid"]] = e["depth"]
            else:
                open_calls.pop(e["tid"], None)
        elif e["function"] in NESTED and e["phase"] == "entry" and e["tid"] in open_calls:
            assert e["depth"] > open_calls[e["tid"]], e
            nested += 1
    assert nested >= CONNECTIONS * MESSAGES


def test_nothing_stays_attached_and_the_report_renders(vm_kernel, run):
    _, r = run
    assert _attached_ctracer_programs() == []
    out = r["tmp"] / "report"
    done = subprocess.run(CTRACER + ["callgraph", str(r["trace"]), "-o", str(out), "--no-plots",
                                     "--max-objects", "2"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "probes</dt>" in (out / "index.html").read_text()
    assert "tcp_sendmsg" in (out / "methods" / "index.html").read_text()


def test_sigkill_leaves_no_program_attached(vm_kernel, tmp_path):
    log = tmp_path / "ctracer.log"
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "sock", "--functions", "tcp_sendmsg",
                                     "tcp_recvmsg", "-d", "600", "-o", str(tmp_path / "k.ctrace")],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT)
    # compile and attach in an emulated guest sharing two cores with the other guests
    wait_for_text(log, "recording struct sock", ct, 1800)
    assert _attached_ctracer_programs()
    ct.kill()
    ct.wait(60)
    deadline = time.monotonic() + 60
    while _attached_ctracer_programs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _attached_ctracer_programs() == []


# ---------------------------------------------------------------- 7.2: tracing_multi links

#: a few functions for 7.2's one short run (CI runs three emulated guests in 70 minutes)
MULTI_COUNTED = ("tcp_sendmsg", "tcp_set_state", "tcp_v4_do_rcv", "tcp_close")


@pytest.fixture(scope="module")
def multi_run(tmp_path_factory):
    """One recording on 7.2 with the kind ``auto`` picks there: fsession.multi."""
    return _record(tmp_path_factory.mktemp("methods-multi"), "auto", MULTI_COUNTED,
                   ("tcp_sendmsg_locked",), connections=2, messages=3)


@pytest.mark.vm(kernels=("7.2",))
def test_7_2_attaches_every_function_on_tracing_multi_links(vm_kernel, multi_run):
    """``auto`` takes fsession.multi on 7.2 (one session program a function on its
    tracing_multi links), says so, and every function attaches (test_plan.py checks
    ``ctracer plan`` shows the kind there)."""
    log = multi_run["log"]
    assert "probes: fsession.multi on 5 functions" in log, log
    assert "tracing_multi links and session programs work here" in log, log
    assert "functions (fsession.multi), 0 failed" in log, log


@pytest.mark.vm(kernels=("7.2",))
def test_7_2_calls_returns_and_states_equal_bpftrace(vm_kernel, multi_run):
    """Through session programs on tracing_multi links, per (function, socket) the
    calls are bpftrace's,
    tcp_sendmsg's returns add up to the bytes sent (bpf_get_func_ret), tcp_set_state's
    exit has the state argument (bpf_get_func_arg), and nothing stays attached."""
    r = multi_run
    begin, end = r["window"]
    ours = collections.Counter((e["function"], int(e["object"], 16)) for e in r["events"]
                               if e["phase"] == "entry" and e["function"] in MULTI_COUNTED
                               and begin <= e["time_ns"] <= end)
    assert r["calls"], "bpftrace counted nothing"
    assert ours == r["calls"]
    rets = [e["ret"] for e in r["events"] if e["function"] == "tcp_sendmsg"
            and e["phase"] == "exit"]
    assert sum(rets) == 2 * 3 * 2 * BYTES == r["sent"]
    exits = [e for e in r["events"] if e["function"] == "tcp_set_state" and e["phase"] == "exit"]
    assert exits
    for e in exits:
        assert e["fields"]["__sk_common.skc_state"] == e["args"]["state"], e
    assert _attached_ctracer_programs() == []


def _ctracer_links() -> set[int]:
    """The ids of the links holding a program of ctracer's."""
    def rows(what: str) -> list[dict]:
        out = subprocess.run(["bpftool", "-j", what, "show"], capture_output=True,
                             text=True).stdout
        return json.loads(out or "[]")
    ours = {p["id"] for p in rows("prog") if "ctracer_" in str(p.get("name", ""))}
    return {link["id"] for link in rows("link") if link.get("prog_id") in ours}


@pytest.mark.vm(kernels=("7.2",))
def test_7_2_sigkill_leaves_no_tracing_multi_link_or_program(vm_kernel, tmp_path):
    """A recording on tracing_multi links killed with SIGKILL (no detach of its own):
    the kernel frees every link and program with the process."""
    log = tmp_path / "ctracer.log"
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "sock", "--functions", "tcp_sendmsg",
                                     "tcp_recvmsg", "-d", "600", "-o", str(tmp_path / "k.ctrace")],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for_text(log, "recording struct sock", ct, 1800)
    assert "fsession.multi on 2 functions" in log.read_text(), log.read_text()
    links = _ctracer_links()
    # a session link at least, besides the raw tracepoints' links
    assert len(links) >= 1 and _attached_ctracer_programs(), links
    ct.kill()
    ct.wait(60)
    deadline = time.monotonic() + 60
    while (_ctracer_links() or _attached_ctracer_programs()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ctracer_links() == set()
    assert _attached_ctracer_programs() == []


@pytest.mark.vm(kernels=("7.2",))
def test_7_2_runs_an_fsession_program_on_a_tracing_multi_link(vm_kernel):
    """7.2 loads an fsession.multi program, links it with a tracing_multi link, and the
    returns find what their entries left in the session cookie, at least as many as the
    calls made (`ctracer.host.fsession`; seconds, no bcc)."""
    from ctracer.host.fsession import try_fsession_multi
    got = try_fsession_multi()
    print(f"\nfsession.multi on 7.2: {got.why}")
    assert got.works, got.why
