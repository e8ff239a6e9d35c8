"""Pages say and show only what a trace's probe kinds fill: a tracepoint-only kernel
trace has hits, not timed calls (no duration, p95 or "changes made" columns, no
"→ entry ← exit" legend, not "snapshotted at every entry and exit"); a trace with
function entries and exits keeps them all."""

from ctracer.report import render_report
from test_announced import _trace
from test_kernel_values import kernel_trace


def _pages(tmp_path, write):
    write(tmp_path / "t.ctrace")
    out = tmp_path / "out"
    render_report(str(tmp_path / "t.ctrace"), str(out), plots=False)
    obj = next(p for p in out.iterdir() if p.name.startswith("0x"))
    return ((out / "index.html").read_text(), (out / "methods" / "index.html").read_text(),
            (obj / "index.html").read_text())


def test_a_tracepoint_only_trace_shows_hits_not_calls(tmp_path):
    index, methods, timeline = _pages(tmp_path, _trace)
    assert "snapshotted at every tracepoint hit<" in index
    assert "entry and exit" not in index
    for page in (methods, timeline):
        assert ">p95<" not in page and ">changes made<" not in page and ">hits<" in page
    assert "→ entry" not in timeline and "• a tracepoint hit" in timeline
    assert 'class="data timeline no-calls"' in timeline
    assert "announced is the store a tracepoint fires just before" in timeline


def test_a_trace_with_calls_keeps_durations(tmp_path):
    index, methods, timeline = _pages(tmp_path, kernel_trace)
    assert "snapshotted at every entry and exit and tracepoint hit<" in index
    for page in (methods, timeline):
        assert ">p95<" in page and ">changes made<" in page
    assert "→ entry" in timeline and "no-calls" not in timeline
