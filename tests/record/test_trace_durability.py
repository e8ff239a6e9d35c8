"""Real eBPF: nothing recorded is lost when ctracer is killed, and SIGTERM finishes the
file cleanly (issue 10 §2).

The sample runs slowly (a delay between lifecycles) under `ctracer trace`; once the
trace file holds committed events, ctracer and the sample are killed with SIGKILL.  The
file must then open, hold at least every event that was committed before the kill, in
the order and with the values the sample's own log has (a prefix of each thread's
calls), and say it is incomplete — in `Trace.incomplete`, in `ctracer report` and in
the report.  Skipped, with the reason, only when BPF uprobes cannot run here.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

import pytest

from support import groundtruth as gt
from ctracer.tracefile import RawDecoder, Trace
from record.test_trace_bpf import (_wait_for_line, bpf_available, compare_with_log,  # noqa: F401
                                   ctracer_argv)

pytestmark = pytest.mark.bpf


def _committed(path) -> int:
    """Events committed so far (decoded or still raw), read as any other process would
    (a spool row is a batch of raw events back to back, of the meta's event size)."""
    if not os.path.exists(path):
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        events = db.execute("SELECT count(*) FROM events").fetchone()[0]
        raw = db.execute("SELECT coalesce(sum(length(raw)), 0) FROM spool").fetchone()[0]
        if not raw:
            return events
        meta = dict(db.execute("SELECT key, value FROM meta"))
        return events + raw // RawDecoder.from_meta(meta).size
    except (sqlite3.Error, KeyError):
        return 0
    finally:
        db.close()


def _start(tmp_path, out, log):
    return subprocess.Popen(
        ctracer_argv("trace", "sock", "--binary", gt.SOCKDEMO, "-o", str(out), "--",
                     gt.SOCKDEMO, "--loops", "1000000", "--delay-ms", "20"),
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True,
        env={**os.environ, gt.LOG_ENV: str(log)})


def test_sigkill_keeps_what_was_committed(tmp_path):
    out, log = tmp_path / "killed.ctrace", tmp_path / "truth.log"
    tracer = _start(tmp_path, out, log)
    try:
        _wait_for_line(tracer.stderr, "recording struct sock")
        deadline = time.monotonic() + 120
        while _committed(out) < 200:
            assert time.monotonic() < deadline, "nothing was ever committed"
            assert tracer.poll() is None, tracer.stderr.read()
            time.sleep(0.05)
        seen = _committed(out)
        os.killpg(tracer.pid, signal.SIGKILL)  # ctracer and the sample
        tracer.wait()
    finally:
        if tracer.poll() is None:
            os.killpg(tracer.pid, signal.SIGKILL)
        tracer.stderr.close()
    trace, _ = compare_with_log(out, log, prefix=True)
    assert trace.event_count() >= seen
    assert trace.incomplete and "killed" in trace.incomplete
    assert f"{trace.event_count()} events" in trace.incomplete
    trace.close()
    r = subprocess.run(ctracer_argv("callgraph", str(out), "-o", str(tmp_path / "report"),
                                    "--no-plots"),
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "incomplete: the recorder was killed" in r.stderr
    index = (tmp_path / "report" / "index.html").read_text()
    assert "killed: the recorder died before finishing the file" in index


def test_sigterm_finishes_the_file(tmp_path):
    out, log = tmp_path / "term.ctrace", tmp_path / "truth.log"
    tracer = _start(tmp_path, out, log)
    try:
        _wait_for_line(tracer.stderr, "recording struct sock")
        deadline = time.monotonic() + 120
        while _committed(out) < 200:
            assert time.monotonic() < deadline, "nothing was ever committed"
            time.sleep(0.05)
        tracer.send_signal(signal.SIGTERM)
        assert tracer.wait(timeout=120) == 128 + signal.SIGTERM
        rest = tracer.stderr.read()
    finally:
        if tracer.poll() is None:
            os.killpg(tracer.pid, signal.SIGKILL)
        tracer.stderr.close()
    assert "stopped: SIGTERM" in rest, rest
    trace, _ = compare_with_log(out, log, prefix=True)
    assert trace.incomplete is None and trace.meta["stopped_by"] == "terminated"
    assert trace.meta_json("events") == trace.event_count() > 0
    assert (os.stat(out).st_mode & 0o777) == 0o600
    assert not os.path.exists(f"{out}-wal"), "the finished trace is one self-contained file"
