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

from support.busy_trace import ctracer as _ctracer
from support.memcgroup import run_limited

MB = 1 << 20
LIMIT = 256 * MB


def test_a_kernel_trace_of_few_busy_objects_renders_inside_a_limit_it_exceeds(
        busy_kernel_trace, tmp_path):
    path, events = busy_kernel_trace
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
