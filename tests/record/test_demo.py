"""`ctracer demo`, the README's first command: struct sock traced on the running kernel
over the bundled loopback workload and rendered; where the kernel cannot be traced, one
line saying why and the user-space sample instead.  Needs root and BPF (skipped, saying
why, otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from support import groundtruth as gt
from ctracer.tracefile import Trace


def _demo(tmp_path, *args):
    if os.geteuid() != 0:
        pytest.skip("ctracer demo records, which needs root")
    from ctracer.host import features
    support = features.probe_support()
    if support.raw_tracepoints.works is False or support.uprobes.works is False:
        pytest.skip(f"BPF unavailable: {support.summary()}")
    return subprocess.run([sys.executable, "-m", "ctracer", "demo", *args],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)


@pytest.mark.bpf
@pytest.mark.kernel
def test_demo_traces_the_kernel_and_renders(tmp_path):
    r = _demo(tmp_path, "--connections", "3", "--samples", os.path.join(gt.ROOT, "samples"))
    assert r.returncode == 0, r.stderr
    assert "ctracer trace struct sock -- " in r.stderr and "tcploop" in r.stderr
    assert "cannot be traced" not in r.stderr
    trace = Trace(str(tmp_path / "sock.ctrace"))
    assert trace.meta["traced"] == "kernel"
    assert trace.event_count() > 0
    assert (tmp_path / "callgraph" / "sock" / "index.html").is_file()
    assert r.stdout.splitlines()[-1] == f"open file://{tmp_path / 'callgraph' / 'sock' / 'index.html'}"


@pytest.mark.bpf
@pytest.mark.kernel
def test_demo_falls_back_to_the_user_space_sample_in_one_line(tmp_path):
    samples = tmp_path / "samples"
    shutil.copytree(os.path.join(gt.ROOT, "samples", "sock"), samples / "sock",
                    ignore=shutil.ignore_patterns("build"))
    shutil.copy(os.path.join(gt.ROOT, "samples", "Makefile"), samples / "Makefile")
    r = _demo(tmp_path, "--samples", str(samples), "--loops", "2", "--threads", "1")
    assert r.returncode == 0, r.stderr
    reason = [ln for ln in r.stderr.splitlines() if "cannot be traced" in ln]
    assert len(reason) == 1 and "tcploop" in reason[0], r.stderr
    assert "tracing the user-space sample instead" in reason[0]
    trace = Trace(str(tmp_path / "sock.ctrace"))
    assert trace.meta["traced"] == "user"
    assert (tmp_path / "callgraph" / "sock" / "index.html").is_file()
