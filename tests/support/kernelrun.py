"""What the real-BPF kernel tests share: skipping (with the reason) only where BPF is
truly unavailable, a free loopback port, a private copy of the loopback workload (its
own comm), bpftrace as the independent observer started before and stopped after the
traced run, and the run of `ctracer trace` under it with the comparison of per-socket
``inet_sock_set_state`` transitions (on this machine's kernel and in the guests)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from typing import Optional

import pytest

from support import groundtruth as gt
from ctracer.tracefile import Trace

TCPLOOP = os.path.join(gt.ROOT, "samples", "tcp", "build", "tcploop")


def bpf_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("tracing the kernel needs root")
    from ctracer.host import features
    support = features.probe_support().raw_tracepoints
    if support.works is False:
        pytest.skip(f"raw tracepoints unavailable: {support.why}")


def wait_for_text(path, text: str, proc: subprocess.Popen, timeout: float = 900) -> None:
    """Wait until the output file ``path`` of ``proc`` holds ``text`` (bpftrace's
    "Attaching", ctracer's "recording struct ..."); fail with its end if the process
    ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            where = _where_it_waits(proc.pid) if proc.poll() is None else ""
            if proc.poll() is None:
                proc.kill()   # a process left hung would hold the next tests up too
                proc.wait(60)
            raise AssertionError(f"{proc.args[0]} did not get to {text!r} (exit "
                                 f"{proc.returncode}){where}: "
                                 f"{path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)


#: how long a Ctrl-C'd bpftrace may take to detach before it is killed
BPFTRACE_DETACH_S = 300


def stop_bpftrace(bt: subprocess.Popen, out) -> None:
    """Ctrl-C bpftrace (started with ``-B line``: each line it prints is in its output
    file ``out`` at once); one still detaching after `BPFTRACE_DETACH_S` is killed, its
    lines kept.  In a loaded TCG guest its kprobes' detach once outlasted 900 s (6.1,
    CI rehearsal of 2026-12-04) and failed the tests on the lines it had printed."""
    bt.send_signal(signal.SIGINT)
    try:
        bt.wait(BPFTRACE_DETACH_S)
    except subprocess.TimeoutExpired:
        where = _where_it_waits(bt.pid)
        bt.kill()
        print(f"bpftrace still detaching after {BPFTRACE_DETACH_S} s{where}: killed; "
              f"its {len(out.read_text(errors='replace').splitlines())} lines kept")
        try:
            bt.wait(60)
        except subprocess.TimeoutExpired:
            pass   # still in the kernel's detach: it ends on its own


def _where_it_waits(pid: int) -> str:
    """Where a process that did not get on waits: its kernel wait channel and stack
    (readable as root), for the failure's message."""
    found = []
    for name in ("wchan", "stack"):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                found.append(f"{name}: {f.read().strip()[:1500]}")
        except OSError:
            pass
    return ("; " + "; ".join(found)) if found else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workload_copy(tmp_path) -> str:
    """A copy of tcploop under a name of its own (its comm), so that tests running at
    the same time on this machine do not see each other's packets."""
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    path = tmp_path / f"tl{os.getpid() % 100000:05d}{secrets.token_hex(3)}"
    shutil.copy(TCPLOOP, path)
    return str(path)


class Observer:
    """bpftrace running a script, its output in a file, started before and stopped
    after the traced run."""

    def __init__(self, script: str, path, start_timeout: float = 60):
        self.out = open(path, "w+")
        self.proc = subprocess.Popen(["bpftrace", "-B", "line", "-e", script],
                                     stdout=self.out, stderr=subprocess.STDOUT)
        start = time.monotonic()
        while "Attaching" not in self.text():
            if self.proc.poll() is not None or time.monotonic() > start + start_timeout:
                raise AssertionError(f"bpftrace did not start within {start_timeout:.0f} s: "
                                     f"{self.text()}")
            time.sleep(0.1)
        print(f"bpftrace attached in {time.monotonic() - start:.1f} s")

    def text(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def stop(self) -> list[str]:
        time.sleep(0.3)  # the last softirq transitions of the run
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # what it printed so far is what it saw
            self.proc.kill()
            self.proc.wait(timeout=30)
        return [ln for ln in self.text().splitlines() if ln.startswith("E ")]


def trace_with_observer(tmp_path, struct: str, port: int, observer_script: str,
                        workload: Optional[str] = None, options: tuple = (),
                        timeout: float = 600, start_timeout: float = 60,
                        system_wide: bool = False):
    """`ctracer trace struct STRUCT [OPTIONS] -- tcploop` (6 connections on `port`) while
    bpftrace runs `observer_script`: (the trace, tcploop's stdout, bpftrace's ``E``
    lines); `start_timeout`: how long bpftrace may take to attach.  `system_wide`:
    ctracer records every object (no command: `options` choose them, e.g. ``--where``),
    tcploop runs once it says it is recording, and Ctrl-C ends the recording after."""
    bpf_or_skip()
    workload = workload or workload_copy(tmp_path)
    observer = Observer(observer_script, tmp_path / f"{struct}.bpftrace", start_timeout)
    output = tmp_path / f"{struct}.ctrace"
    argv = [sys.executable, "-m", "ctracer", "trace", "struct", struct, "-o", str(output),
            *options]
    tcploop = [workload, "--connections", "6", "--port", str(port)]
    start = time.monotonic()
    try:
        if system_wide:
            returncode, stdout, stderr = _record_around(argv, tcploop, tmp_path, timeout)
        else:
            r = subprocess.run([*argv, "-q", "--", *tcploop], capture_output=True,
                               text=True, timeout=timeout, cwd=tmp_path)
            returncode, stdout, stderr = r.returncode, r.stdout, r.stderr
    finally:
        seen = observer.stop()
    print(f"ctracer trace struct {struct}: {time.monotonic() - start:.1f} s")
    # system-wide, Ctrl-C ends the recording: 128 + SIGINT, as a shell says
    assert returncode == (130 if system_wide else 0), stderr
    assert " 0 lost" in stderr, stderr
    return Trace(str(output)), stdout, seen


def _record_around(argv: list, command: list, cwd, timeout: float) -> tuple[int, str, str]:
    """ctracer recording system-wide around one run of `command`: (ctracer's exit
    status, the command's stdout, ctracer's stderr)."""
    log = open(os.path.join(cwd, "ctracer.stderr"), "w+")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, cwd=cwd)
    try:
        deadline = time.monotonic() + timeout
        while True:
            log.seek(0)
            if "ctracer: recording " in log.read():
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"ctracer did not start recording: {log.read()}")
            time.sleep(0.2)
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd)
        assert done.returncode == 0, done.stderr
        time.sleep(0.3)  # the last softirq transitions of the run
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log.seek(0)
    return proc.returncode, done.stdout, log.read()


def sock_states_script(port: int) -> str:
    """bpftrace: each TCP ``inet_sock_set_state`` of the workload's port, as
    ``E ADDRESS OLDSTATE NEWSTATE``."""
    return ("tracepoint:sock:inet_sock_set_state /args->protocol == 6 && "
            f"(args->sport == {port} || args->dport == {port})/ "
            '{ printf("E %lx %d %d\\n", args->skaddr, args->oldstate, args->newstate); }')


def sock_transitions(trace: Trace, seen: list[str]) -> tuple[dict, dict]:
    """(bpftrace's, the trace's) ``inet_sock_set_state`` transitions per socket address:
    address -> [(oldstate, newstate), ...] in order."""
    expected: dict[int, list] = defaultdict(list)
    for line in seen:
        _, addr, old, new = line.split()
        expected[int(addr, 16)].append((int(old), int(new)))
    fid = next(fid for fid, f in trace.functions.items() if f.name == "inet_sock_set_state")
    recorded: dict[int, list] = defaultdict(list)
    for e in trace.events():
        if e.function_id == fid:
            recorded[e.object].append((e.args["oldstate"], e.args["newstate"]))
    return dict(expected), dict(recorded)
