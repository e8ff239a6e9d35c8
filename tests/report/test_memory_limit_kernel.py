"""A kernel-shaped trace rendered inside a memory cgroup: few objects with hundreds of
thousands of calls each (this host's tracepoints of struct sock around the loopback
sample, every field: 408-byte snapshots, millions of field changes), several times
bigger than the limit, as a container or a systemd unit's ``MemoryMax=`` runs it.

A trace of many objects with few calls each (tests/report/test_memory_limit.py) never
held more than one object's share at a time; this shape did: each object's snapshots
compared field by field over every snapshot, every change sorted on the heap, every
field's series as Python values until the plots were drawn.  Before those were done a
slice at a time the OOM killer ended this render (checked on that code: killed inside
256 MB, ``exit -9``).

Needs root (BPF and cgroups); skipped, saying why, where either is missing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support.memcgroup import cgroup_unavailable, run_limited

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")

MB = 1 << 20
LIMIT = 256 * MB


def _ctracer(*args: str) -> list[str]:
    return [sys.executable, "-m", "ctracer", *args]


@pytest.fixture(scope="module")
def kernel_trace(bpf, tmp_path_factory):
    """About 2M events of 4 sockets (tcploop 4 x 28,000 messages), every field."""
    why = cgroup_unavailable()
    if why:
        pytest.skip(why)
    if not os.access(TCPLOOP, os.X_OK):
        pytest.skip(f"the loopback sample is not built ({TCPLOOP}: scripts/setup.sh)")
    path = str(tmp_path_factory.mktemp("kernel") / "tcp.ctrace")
    done = subprocess.run(_ctracer("trace", "struct", "sock", "--buffer-mb", "64", "-o", path,
                                   "-q", "--", TCPLOOP, "--connections", "4", "--messages",
                                   "28000"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if " events, " in ln)
    events, objects = (int(n) for n in
                       re.search(r"(\d+) events, (\d+) object addresses", line).groups())
    assert events > 1_500_000 and objects <= 16, line
    return path, events


def test_a_kernel_trace_of_few_busy_objects_renders_inside_a_limit_it_exceeds(
        kernel_trace, tmp_path):
    path, events = kernel_trace
    from ctracer.tracefile import Trace

    trace = Trace(path)
    row = trace.mini.size + 64
    trace_id = trace.trace_id
    trace.close()
    assert events * row > 3 * LIMIT  # its events' columns alone: several times the limit
    out = tmp_path / "report"
    run = run_limited(_ctracer("report", path, "-o", str(out)), LIMIT,
                      env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}, timeout=1500)
    print(run.line())
    assert run.oom_kills == 0, f"OOM-killed inside {LIMIT // MB} MB: {run.line()}\n{run.stderr}"
    assert run.returncode == 0, run.stderr
    from ctracer.report.html import report_trace_id

    assert report_trace_id(str(out)) == trace_id  # marked finished
    assert "incomplete" not in (out / "index.html").read_text()
