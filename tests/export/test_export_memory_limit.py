"""Exports of a kernel-shaped trace inside a memory cgroup several times smaller than it:
few objects with hundreds of thousands of calls each (this host's tracepoints of struct
sock around the loopback sample, every field: 408-byte snapshots, ~3.2 KB of JSON an
event), as a container or a systemd unit's ``MemoryMax=`` runs them.

Before an export's batches were sized by the limit and the row's width (and DuckDB held
to one thread), both failed inside 256 MB (checked on that code): Parquet was ended by
the OOM killer (``exit -9``), JSON Lines by DuckDB's own out-of-memory error, shown as
an internal error (exit 70).

Needs root (BPF and cgroups); skipped, saying why, where either is missing.
"""

from __future__ import annotations

import functools
import os
import threading

import pytest

from support.busy_trace import ctracer as _ctracer
from support.memcgroup import run_limited

MB = 1 << 20
LIMIT = 256 * MB


@pytest.fixture(scope="module")
def kernel_trace(busy_kernel_trace):
    """The session's busy kernel trace (`support.busy_trace`), several times the limit."""
    path, events = busy_kernel_trace
    from ctracer.tracefile import Trace

    trace = Trace(path)
    row = trace.mini.size + 64
    trace.close()
    assert events * row > 3 * LIMIT  # its events' columns alone: several times the limit
    return path


@functools.lru_cache(maxsize=None)
def _events(path: str) -> int:
    """The rows an export of ``path`` has (the analysis' events), counted once."""
    from ctracer import analysis

    return len(analysis.load(path).events)


def test_a_parquet_export_of_a_kernel_trace_fits_a_limit_it_exceeds(kernel_trace, tmp_path):
    out = tmp_path / "tcp.parquet"
    run = run_limited(_ctracer("export", kernel_trace, "--format", "parquet", "-o", str(out)),
                      LIMIT, timeout=1200)
    print(run.line())
    assert run.oom_kills == 0, f"OOM-killed inside {LIMIT // MB} MB: {run.line()}\n{run.stderr}"
    assert run.returncode == 0, run.stderr
    import pyarrow.parquet as pq

    assert pq.read_metadata(str(out)).num_rows == _events(kernel_trace)


def test_a_jsonl_export_of_a_kernel_trace_fits_a_limit_it_exceeds(kernel_trace):
    # to a pipe whose lines are counted: the text (~6 GB) is not kept
    reader, writer = os.pipe()
    lines = [0]

    def count() -> None:
        with os.fdopen(reader, "rb") as f:
            while chunk := f.read(1 << 20):
                lines[0] += chunk.count(b"\n")
    counter = threading.Thread(target=count)
    counter.start()
    try:
        run = run_limited(_ctracer("export", kernel_trace, "--format", "jsonl"), LIMIT,
                          timeout=1200, stdout=writer)
    finally:
        os.close(writer)
        counter.join()
    print(run.line())
    assert run.oom_kills == 0, f"OOM-killed inside {LIMIT // MB} MB: {run.line()}\n{run.stderr}"
    assert run.returncode == 0, run.stderr
    assert lines[0] == _events(kernel_trace)
