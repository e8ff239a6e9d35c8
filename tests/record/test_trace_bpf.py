"""Real eBPF: `ctracer trace` on the sample, compared with the sample's own log.

For every thread, the recorded events must be the logged calls in the same order, with
the same function (static functions told apart by compile unit), entry/exit phase,
depth, object address, return value and every recorded field value.  Then the modes:
a command, a running process (-p), a duration (-d), Ctrl-C; lost events accounted for;
failures that happen only once BPF is involved.

Skipped, with the reason, only when not root or when the kernel or bcc cannot run a
trivial uprobe program here.
"""

from __future__ import annotations

from support import bpfcheck
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support import groundtruth as gt
from ctracer.tracefile import Trace

pytestmark = pytest.mark.bpf


def _skip_reason() -> str:
    if os.geteuid() != 0:
        return "not root: loading BPF programs and uprobes needs root"
    from ctracer.record import bpf_runtime
    from ctracer.errors import CtracerError
    try:
        bpfcheck.uprobe_self_test(str(gt.SOCKDEMO), "main")
    except CtracerError as e:
        return str(e)
    return ""


@pytest.fixture(scope="module", autouse=True)
def bpf_available(tmp_path_factory):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    saved = os.environ.get("XDG_CACHE_HOME")
    # the header tree is built once, here, for this module's ctracer runs
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    try:
        reason = _skip_reason()
        if reason:
            print(f"skipping real BPF tests: {reason}", file=sys.stderr)
            pytest.skip(reason)
        yield
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


def ctracer_argv(*args) -> list[str]:
    return [sys.executable, "-m", "ctracer", *args]


def run_trace(tmp_path, *args, log=None, timeout=300):
    env = {**os.environ}
    if log:
        env[gt.LOG_ENV] = str(log)
    r = subprocess.run(ctracer_argv(*args), capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def compare_with_log(trace_path, log_path, *, prefix=False, only_probed=False):
    trace = Trace(str(trace_path))
    log = gt.parse_log(str(log_path))
    names = {f.name for f in trace.mini.fields}
    if only_probed:
        probed = {(r.name, os.path.basename(r.unit)) for r in trace.functions.values()
                  if r.attached == "entry,exit"}
        log = [c for c in log if (c.function, c.unit) in probed]
    expected = gt.by_thread(gt.restrict_fields(log, names))
    got = gt.by_thread(gt.trace_calls(trace))
    assert set(got) <= set(expected), "events of threads the sample never logged"
    for tid, calls in expected.items():
        recorded = got.get(tid, [])
        if prefix:
            # a recording cut short ends in the middle: the last event may precede its
            # log line (entry) and the log runs on after the recording stopped
            recorded = recorded[:-1]
            calls = calls[:len(recorded)]
        problems = gt.differences(calls, recorded)
        assert not problems, f"thread {tid}:\n" + "\n".join(problems)
    return trace, log


def test_trace_equals_ground_truth(tmp_path):
    out, log = tmp_path / "sock.ctrace", tmp_path / "truth.log"
    r = run_trace(tmp_path, "trace", "struct", "sock", "--binary", gt.SOCKDEMO, "-o", str(out),
                  "--", gt.SOCKDEMO, "--loops", "8", "--threads", "2", log=log)
    assert r.returncode == 0, r.stderr
    trace, calls = compare_with_log(out, log)
    assert trace.event_count() == len(calls) > 500
    assert trace.meta_json("lost_events") == 0
    assert all(row.attached == "entry,exit" for row in trace.functions.values())
    assert trace.meta["stopped_by"] == "command exited"
    # the meta table carries everything the report needs
    assert trace.struct_name == "sock" and trace.struct_kind == "struct"
    assert "struct sock {" in trace.meta["full_layout"]
    assert "ctracer__mini_sock" in trace.meta["mini_layout_text"]
    assert trace.meta_json("events") == trace.event_count()
    assert trace.meta["kernel_release"] == os.uname().release
    assert json.loads(trace.meta["argv"])[1:4] == ["trace", "struct", "sock"]
    assert trace.meta_json("command")[0] == gt.SOCKDEMO
    for key in ("host", "start_time", "end_time", "binary", "bpf_program"):
        assert trace.meta.get(key), key
    # objects come back at the same address: lifetimes of one address
    allocs = [c.object for c in calls if c.function == "sk_alloc" and c.phase == "exit"]
    assert len(set(allocs)) < len(allocs)
    assert "0 lost" in r.stderr and f"ctracer report {out}" in r.stderr


def test_fixed_address_executable(tmp_path):
    """A non-PIE program: DWARF addresses are virtual addresses, not file offsets."""
    out, log = tmp_path / "nopie.ctrace", tmp_path / "truth.log"
    r = run_trace(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO_NOPIE, "-o", str(out),
                  "--", gt.SOCKDEMO_NOPIE, "--loops", "4", log=log)
    assert r.returncode == 0, r.stderr
    trace, calls = compare_with_log(out, log)
    assert trace.event_count() == len(calls) > 0
    assert min(row.address for row in trace.functions.values()) >= 0x400000


def test_optimized_build_matches_on_what_is_probed(tmp_path):
    out, log = tmp_path / "o2.ctrace", tmp_path / "truth.log"
    r = run_trace(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO_O2, "-o", str(out),
                  "--", gt.SOCKDEMO_O2, "--loops", "6", log=log)
    assert r.returncode == 0, r.stderr
    trace, _ = compare_with_log(out, log, only_probed=True)
    skipped = [row for row in trace.functions.values() if row.attached.startswith("skipped")]
    assert [row.name for row in skipped] == ["sk_is_listener"]


def test_selected_functions_and_fields(tmp_path):
    out, log = tmp_path / "some.ctrace", tmp_path / "truth.log"
    r = run_trace(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "-o", str(out),
                  "--functions", "tcp_*", "--fields", "sk_stats", "__sk_common.skc_state",
                  "--", gt.SOCKDEMO, "--loops", "4", log=log)
    assert r.returncode == 0, r.stderr
    trace = Trace(str(out))
    assert {f.name for f in trace.mini.fields} == {
        "sk_stats.rx_bytes", "sk_stats.tx_bytes", "sk_stats.rx_packets",
        "sk_stats.tx_packets", "sk_stats.drops", "__sk_common.skc_state"}
    assert {row.name for row in trace.functions.values()} == {
        "tcp_set_state", "tcp_rcv_nxt_update", "tcp_sendmsg", "tcp_recvmsg", "tcp_close",
        "tcp_accept"}
    # depth counts traced calls only, so compare everything but the depth
    names = {f.name for f in trace.mini.fields}
    want = [c for c in gt.restrict_fields(gt.parse_log(str(log)), names)
            if c.function.startswith("tcp_")]
    got = gt.trace_calls(trace)
    strip = lambda cs: [(c.function, c.phase, c.slot, c.object, c.ret, c.fields) for c in cs]
    assert strip(got) == strip(want)


def _wait_for_line(stream, needle: str, timeout: float = 240) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"never saw {needle!r}: {''.join(seen)}")


def test_pid_mode_follows_a_running_process(tmp_path):
    out, log = tmp_path / "pid.ctrace", tmp_path / "truth.log"
    sample = subprocess.Popen([gt.SOCKDEMO, "--wait-signal", "--loops", "5", "--threads", "2"],
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, gt.LOG_ENV: str(log)})
    tracer = None
    try:
        assert sample.stdout.readline().split()[0] == "ready"
        tracer = subprocess.Popen(ctracer_argv("trace", "sock", "--binary", gt.SOCKDEMO, "-p",
                                               str(sample.pid), "-o", str(out)),
                                  stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        _wait_for_line(tracer.stderr, "recording struct sock in process")
        sample.send_signal(signal.SIGUSR1)
        assert sample.wait(timeout=60) == 0
        assert tracer.wait(timeout=120) == 0
        rest = tracer.stderr.read()
    finally:
        sample.kill()
        if tracer:
            tracer.kill()
    assert "the process exited" in rest and "Traceback" not in rest
    trace, calls = compare_with_log(out, log)
    assert trace.event_count() == len(calls) > 0
    assert trace.meta["stopped_by"] == "process exited" and trace.meta_json("pid") == sample.pid


def test_duration_ends_the_recording_and_the_command(tmp_path):
    out, log = tmp_path / "d.ctrace", tmp_path / "truth.log"
    r = run_trace(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "-d", "1.5", "-o", str(out),
                  "--", gt.SOCKDEMO, "--loops", "1000000", "--delay-ms", "5", log=log)
    assert r.returncode == 0, r.stderr
    trace, calls = compare_with_log(out, log, prefix=True)
    assert trace.meta["stopped_by"] == "duration"
    assert trace.event_count() > 100
    pid = calls[0].tid  # single-threaded: the main thread's id is the process id
    assert not os.path.exists(f"/proc/{pid}"), "the command outlived the recording"


def test_ctrl_c_keeps_everything_recorded(tmp_path):
    out, log = tmp_path / "c.ctrace", tmp_path / "truth.log"
    tracer = subprocess.Popen(ctracer_argv("trace", "sock", "--binary", gt.SOCKDEMO, "-o", str(out),
                                           "--", gt.SOCKDEMO, "--loops", "1000000",
                                           "--delay-ms", "5"),
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, gt.LOG_ENV: str(log)})
    try:
        _wait_for_line(tracer.stderr, "recording struct sock")
        time.sleep(1.0)
        _ctrl_c(tracer)
    finally:
        tracer.kill()
    trace, calls = compare_with_log(out, log, prefix=True)
    assert trace.meta["stopped_by"] == "ctrl-c" and trace.event_count() > 0
    assert not os.path.exists(f"/proc/{calls[0].tid}"), "the command outlived the recording"


def _trace_sample_through_1mb(tmp_path, name: str, loops: int):
    """``ctracer trace`` of two threads of the sample running ``loops`` loops through a
    1 MB ring buffer, started and recording; (process, trace path, the sample's log)."""
    out, log = tmp_path / name, tmp_path / "truth.log"
    tracer = subprocess.Popen(ctracer_argv("trace", "sock", "--binary", gt.SOCKDEMO,
                                           "--buffer-mb", "1", "-o", str(out), "--",
                                           gt.SOCKDEMO, "--loops", str(loops), "--threads",
                                           "2"),
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, gt.LOG_ENV: str(log)})
    try:
        _wait_for_line(tracer.stderr, "recording struct sock")
    except BaseException:
        tracer.kill()
        raise
    return tracer, out, log


def _ctrl_c(tracer) -> str:
    """Ctrl-C to a recording: it exits 130 (128 + SIGINT, as a shell says) saying so, no
    traceback; the rest of its stderr."""
    tracer.send_signal(signal.SIGINT)
    assert tracer.wait(timeout=120) == 130
    rest = tracer.stderr.read()
    assert "stopped: Ctrl-C" in rest and "Traceback" not in rest, rest
    return rest


def _wait_for_log(log, size: int, failure: str) -> None:
    deadline = time.monotonic() + 120
    while not (log.exists() and log.stat().st_size > size):
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)


def test_every_event_is_recorded_or_counted_lost(tmp_path):
    """The recorder is stopped (SIGSTOP) for a second while the sample runs, so its 1 MB
    buffer overflows: what it could not take is in the lost count, so recorded + lost
    equals what the sample logged, and the summary says so."""
    tracer, out, log = _trace_sample_through_1mb(tmp_path, "lossy.ctrace", loops=1500)
    try:
        # stop the recorder only once the sample is producing events (it is released from
        # its start gate after that line; stopping earlier would just hold it at the gate)
        _wait_for_log(log, 100_000, "the sample never started logging")
        tracer.send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        tracer.send_signal(signal.SIGCONT)
        assert tracer.wait(timeout=300) == 0
        rest = tracer.stderr.read()
    finally:
        tracer.kill()
    trace = Trace(str(out))
    logged = sum(1 for _ in open(log))
    lost = trace.meta_json("lost_events")
    print(f"logged {logged}, recorded {trace.event_count()}, lost {lost}")
    assert lost > 0
    assert trace.event_count() + lost == logged
    assert f"{lost} events were lost" in rest and f"{lost} lost" in rest


def test_command_that_cannot_run(tmp_path):
    r = run_trace(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "--",
                  str(tmp_path / "missing"))
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [f"ctracer: error: cannot run {tmp_path / 'missing'}: "
                                             "no such file"]
    assert not (tmp_path / "sock.ctrace").exists()


def test_bcc_failure_is_one_line(tmp_path):
    empty = tmp_path / "no-headers"
    empty.mkdir()
    r = subprocess.run(ctracer_argv("trace", "sock", "--binary", gt.SOCKDEMO, "--",
                                    gt.SOCKDEMO), capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "BCC_KERNEL_SOURCE": str(empty)}, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctracer: error: bcc could not compile")


def test_without_command_or_pid_every_process_of_the_binary_is_recorded(tmp_path):
    out = tmp_path / "all.ctrace"
    tracer = subprocess.Popen(ctracer_argv("trace", "sock", "--binary", gt.SOCKDEMO, "-d", "4",
                                           "-o", str(out)),
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    try:
        _wait_for_line(tracer.stderr, "in every process running")
        for log in logs:
            subprocess.run([gt.SOCKDEMO, "--loops", "3"], check=True, stdout=subprocess.DEVNULL,
                           env={**os.environ, gt.LOG_ENV: str(log)})
        assert tracer.wait(timeout=120) == 0
    finally:
        tracer.kill()
    trace = Trace(str(out))
    names = {f.name for f in trace.mini.fields}
    got = gt.by_thread(gt.trace_calls(trace))
    for log in logs:
        for tid, calls in gt.by_thread(gt.restrict_fields(gt.parse_log(str(log)), names)).items():
            assert not gt.differences(calls, got.get(tid, [])), tid
    ours = {gt.parse_log(str(log))[0].tid for log in logs}  # single-threaded: tid = pid
    assert len(ours) == 2 and ours <= {e.pid for e in trace.events()}
    assert trace.meta["stopped_by"] == "duration"


def test_a_probe_that_cannot_attach_is_recorded_and_the_others_go_on():
    import dataclasses

    from ctracer.record import bpf_runtime
    from ctracer.plan import discovery
    from ctracer.debuginfo.dwarf import reader as dwarf
    from ctracer.plan import mini
    from ctracer.probes import uprobe
    types = dwarf.open_elf_types(gt.SOCKDEMO)
    found = discovery.discover(types.catalog(), "sock")
    program = uprobe.build_program(found.methods, mini.build_mini(types.find_struct("sock")).layout)
    broken = dataclasses.replace(program.functions[0], address=0x7ffffff0)  # in no segment
    program = dataclasses.replace(program, functions=(broken,) + program.functions[1:])
    session = bpf_runtime.ProbeSession(program, gt.SOCKDEMO, lambda raw: None)
    try:
        session.compile()
        results = session.attach()
    finally:
        session.close()
    assert not results[0].ok and results[0].attached.startswith("failed: ")
    assert all(r.attached == "entry,exit" for r in results[1:])
    attached = bpf_runtime.row_attachments(program, results)
    assert all(attached[i].startswith("failed: ") for i in broken.row_ids)
    assert bpf_runtime.attach_summary(results) == (len(results) - 1, 1)


def test_events_submitted_without_a_wake_up_are_delivered_by_the_next_poll(tmp_path):
    """The probes wake the reader only once per batch (`ctext.submit_function`): a
    command producing fewer events than a batch never wakes it, and one poll after the
    command has exited still delivers all of them, each once."""
    from ctracer.record import bpf_runtime
    from ctracer.record.recorder import GatedCommand
    from ctracer.plan import discovery
    from ctracer.debuginfo.dwarf import reader as dwarf
    from ctracer.plan import mini
    from ctracer.probes import ctext, uprobe
    from ctracer.event import HEADER, event_size
    types = dwarf.open_elf_types(gt.SOCKDEMO)
    found = discovery.discover(types.catalog(), "sock")
    layout = mini.build_mini(types.find_struct("sock")).layout
    program = uprobe.build_program(found.methods, layout, filtered=True)
    log = tmp_path / "truth.log"
    os.environ[gt.LOG_ENV] = str(log)
    try:
        command = GatedCommand([gt.SOCKDEMO, "--loops", "1", "--threads", "1"])
    finally:
        del os.environ[gt.LOG_ENV]
    delivered: list[bytes] = []
    session = bpf_runtime.ProbeSession(program, gt.SOCKDEMO, delivered.append)
    try:
        session.compile()
        session.follow(command.pid)
        session.attach()
        command.release()
        while command.poll() is None:
            time.sleep(0.01)
        logged = sum(1 for _ in open(log))  # a line per entry and per exit
        assert 0 < logged < ctext.wake_every(program.ring_bytes, event_size(layout),
                                             os.cpu_count() or 1)
        session.poll(timeout_ms=10)
        first = sum(len(chunk) for chunk in delivered) // event_size(layout)
        session.stop_probes()
        session.drain()
        assert session.lost() == 0
    finally:
        session.close()
    size = event_size(layout)
    events = [chunk[at:at + size] for chunk in delivered for at in range(0, len(chunk), size)]
    assert first == len(events) == logged
    stamps = [HEADER.decode(raw)["ts_ns"] for raw in events]
    assert len(set(stamps)) == len(stamps)  # none twice


def test_ctrl_c_in_a_busy_recording_finishes_the_file_with_every_event_once(tmp_path):
    """Ctrl-C while two threads of the sample fill a 1 MB buffer: the probes are
    detached while what the ring buffer holds is committed, the file is finished (the
    raw events the recorder did not decode in time, if any, are decoded by its first
    reader, once), and nothing is in it twice or more than was produced (written + lost
    <= logged: the sample logs on after the stop)."""
    import sqlite3
    tracer, out, log = _trace_sample_through_1mb(tmp_path, "flood.ctrace", loops=1_000_000)
    try:
        _wait_for_log(log, 20_000_000, "the sample never flooded")
        _ctrl_c(tracer)
    finally:
        tracer.kill()
    assert not os.path.exists(str(out) + "-wal")
    db = sqlite3.connect(str(out))
    meta = dict(db.execute("SELECT key, value FROM meta"))
    left = db.execute("SELECT count(*) FROM spool").fetchone()[0]
    db.close()
    assert meta["state"] == "finished" and meta["stopped_by"] == "ctrl-c"
    print(f"raw events in {left} spool rows (a recording's events stay raw)")
    trace = Trace(str(out))
    assert trace.event_count() == int(meta["events"])
    lost = trace.meta_json("lost_events")
    logged = sum(1 for _ in open(log))
    assert 0 < trace.event_count() and trace.event_count() + lost <= logged
    columns = trace.event_columns()
    seen = set(zip(columns["tid"].tolist(), columns["ts_ns"].tolist()))
    assert len(seen) == trace.event_count()  # no event twice
