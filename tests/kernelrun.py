"""What the real-BPF kernel tests share: skipping (with the reason) only where BPF is
truly unavailable, a free loopback port, a private copy of the loopback workload (its
own comm), and bpftrace as the independent observer started before and stopped after
the traced run."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time

import pytest

import groundtruth as gt

TCPLOOP = os.path.join(gt.ROOT, "samples", "tcp", "build", "tcploop")


def bpf_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("tracing the kernel needs root")
    from ctracer.record import kernel
    support = kernel.probe_support().raw_tracepoints
    if support.works is False:
        pytest.skip(f"raw tracepoints unavailable: {support.why}")


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

    def __init__(self, script: str, path):
        self.out = open(path, "w+")
        self.proc = subprocess.Popen(["bpftrace", "-B", "line", "-e", script],
                                     stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "Attaching" not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"bpftrace did not start: {self.text()}")
            time.sleep(0.1)

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
