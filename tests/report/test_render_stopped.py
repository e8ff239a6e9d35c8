"""A render stopped early — Ctrl-C to the terminal's process group, SIGTERM, a helper
process killed — ends in one line and a non-zero exit, never a traceback (the helpers'
`KeyboardInterrupt`s were what users saw), and leaves an index.html that says the report
is incomplete.  The signals are sent once the helpers are writing pages, as a user's
would be in the middle of a long render."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from support.synthetic_trace import write_synthetic_trace
from support.terminal import as_from_a_terminal


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory):
    """Enough objects (1,600) that pages are written by two forked helpers."""
    path = tmp_path_factory.mktemp("trace") / "t.ctrace"
    write_synthetic_trace(str(path), threads=4, lifecycles=400)
    return path


def _start(trace, out, tmp_path):
    return subprocess.Popen([sys.executable, "-m", "ctracer", "callgraph", str(trace), "-o",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=as_from_a_terminal,
                            env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")})


def _helpers_writing(p, out, timeout=240.0) -> list[int]:
    """Once object pages appear under ``out``: the helper processes (python children)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pages = [d for d in os.listdir(out) if d.startswith("0x")] if out.exists() else []
        if pages:
            # ctracer waits for the renderer it forked (commands/supervised.py): the
            # helpers are its children
            renderers = _children(p.pid)
            helpers = [int(k) for r in renderers for k in _children(r)
                       if b"python" in open(f"/proc/{k}/cmdline", "rb").read()]
            if helpers:
                return helpers
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    raise AssertionError("the render never started writing object pages")


def _children(pid) -> list[int]:
    try:
        return [int(k) for k in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_pages_is_one_line_and_marks_the_report(big_trace, tmp_path,
                                                                    sig, status):
    out = tmp_path / "report"
    p = _start(big_trace, out, tmp_path)
    try:
        _helpers_writing(p, out)
        os.killpg(p.pid, sig)  # as a terminal's Ctrl-C: every process of the group
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == status, err
    line = _one_line(err)
    assert line.startswith(f"ctracer: interrupted: the report in {out} is incomplete"), line
    index = (out / "index.html").read_text()
    assert 'id="incomplete"' in index and "This report is incomplete" in index


def test_a_helper_that_dies_is_one_line_and_marks_the_report(big_trace, tmp_path):
    out = tmp_path / "report"
    p = _start(big_trace, out, tmp_path)
    try:
        helpers = _helpers_writing(p, out)
        os.kill(helpers[0], signal.SIGKILL)
        _, err = p.communicate(timeout=60)  # a multiprocessing.Pool waited for ever here
    finally:
        p.kill()
    assert p.returncode == 1, err
    line = _one_line(err)
    assert "a helper process writing pages died" in line and "is incomplete" in line, line
    assert "This report is incomplete" in (out / "index.html").read_text()


def test_a_render_left_alone_is_not_marked(tmp_path):
    trace = tmp_path / "small.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=2)
    r = subprocess.run([sys.executable, "-m", "ctracer", "callgraph", str(trace), "-o",
                        str(tmp_path / "r"), "-q"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")})
    assert r.returncode == 0, r.stderr
    assert "incomplete" not in (tmp_path / "r" / "index.html").read_text()
