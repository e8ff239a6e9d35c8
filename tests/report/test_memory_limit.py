"""A render inside a memory cgroup, as a container or a systemd unit's ``MemoryMax=``
runs it: the limit counts the page cache of the trace read, of the arrays the analysis
maps and of the pages written, dirty ones included, and the helpers' copies.

* A trace whose events take more memory than the limit (2M events, their columns
  ~280 MB before the analysis' own arrays, in 256 MB) renders: exit 0, no OOM kill.
  (Before the analysis wrote its mapped arrays back, sliced its passes by the limit and
  sized its helpers by it, the OOM killer ended it: checked with those reverted.)
* In a limit far too small the render ends in one line that says memory ran out and
  what to try, exits 137, and leaves no report a reader takes for finished.
* Progress (reading, the analysis' passes, pages n of N) on a terminal, none otherwise.

Skipped, saying why, only where no memory cgroup can be made (not root, no memory
controller, a read-only cgroup hierarchy): `support.memcgroup.cgroup_unavailable`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support.memcgroup import cgroup_unavailable, run_limited
from support.terminal import run_on_a_terminal

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))

from rounds_trace import write_rounds  # noqa: E402

MB = 1 << 20


def _ctracer(*args: str) -> list[str]:
    return [sys.executable, "-m", "ctracer", *args]


@pytest.fixture(scope="module")
def cgroups():
    why = cgroup_unavailable()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory):
    """2,011,340 events (200 objects of ~1,000 events, ten rounds: 2,000 lifetimes),
    a 280 MB file, written as a recorder writes them (raw batches)."""
    path = str(tmp_path_factory.mktemp("big") / "big.ctrace")
    assert write_rounds(path, 10, "long") > 2_000_000
    return path


def _env(tmp_path) -> dict:
    return {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}


def test_a_trace_bigger_than_the_limit_renders_inside_it(cgroups, big_trace, tmp_path):
    out = tmp_path / "report"
    run = run_limited(_ctracer("report", big_trace, "-o", str(out), "--max-objects", "50"),
                      256 * MB, env=_env(tmp_path), timeout=900)
    print(run.line())
    assert run.oom_kills == 0, f"OOM-killed inside 256 MB: {run.line()}\n{run.stderr}"
    assert run.returncode == 0, run.stderr
    assert run.peak_mb <= 256
    from ctracer.report.html import report_trace_id
    from ctracer.tracefile import Trace

    trace = Trace(big_trace)
    assert report_trace_id(str(out)) == trace.trace_id  # marked finished
    trace.close()
    assert "2011340 events" in run.stdout and "incomplete" not in (out / "index.html").read_text()


def test_out_of_memory_is_one_line_and_no_finished_report(cgroups, big_trace, tmp_path):
    out = tmp_path / "report"
    run = run_limited(_ctracer("report", big_trace, "-o", str(out)), 96 * MB,
                      env=_env(tmp_path), timeout=600)
    assert run.oom_kills >= 1, run.line()
    assert run.returncode == 137, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    line = lines[0]
    assert line.startswith("ctracer: error: out of memory"), line
    assert "--max-objects" in line and "(memory limit 96 MB)" in line, line
    from ctracer.report.html import is_unfinished, report_trace_id

    # the directory says it is unfinished, and nothing names it a report of the trace
    assert report_trace_id(str(out)) is None
    assert is_unfinished(str(out))
    assert "This report is incomplete" in (out / "index.html").read_text()


def test_progress_on_a_terminal_and_quiet_otherwise(big_trace, tmp_path):
    argv = _ctracer("report", big_trace, "-o", str(tmp_path / "tty"), "--max-objects", "50")
    status, shown = run_on_a_terminal(argv, _env(tmp_path), timeout=900)
    assert status == 0, shown
    for stage in ("reading events", "read 2011340 events", "paired", "finding field changes",
                  "2011340 events, 2000 objects", "laying out", "writing pages: "):
        assert stage in shown, (stage, shown[-2000:])
    assert re.search(r"writing pages: (\d+)/\1 done", shown), shown[-2000:]
    piped = subprocess.run(_ctracer("report", big_trace, "-o", str(tmp_path / "pipe"),
                                    "--max-objects", "50"),
                           capture_output=True, text=True, env=_env(tmp_path), timeout=900)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == "", piped.stderr  # no progress where no one watches
    assert "\r" not in piped.stdout and "open file://" in piped.stdout
