"""Pages say and show only what a trace's probe kinds fill: a tracepoint-only kernel
trace has hits, not timed calls (no duration, p95 or "changes made" columns, no
"→ entry ← exit" legend, not "snapshotted at every entry and exit"), and counts hits
where it counts (an object's header, the object list, the graph's boxes); a trace with
function entries and exits keeps them all, and one with both counts each by its name."""

import re

from ctracer.report import render_report
from ctracer.report.index_data import read_objects_file
from test_announced import _trace
from test_kernel_values import kernel_trace


def _pages(tmp_path, write):
    write(tmp_path / "t.ctrace")
    out = tmp_path / "out"
    render_report(str(tmp_path / "t.ctrace"), str(out), plots=False)
    obj = min(p for p in out.iterdir() if p.name.startswith("0x"))  # the first object
    return ((out / "index.html").read_text(), (out / "methods" / "index.html").read_text(),
            (obj / "index.html").read_text())


def _facts(page):
    return dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", page.split("<h2>")[0]))


def _objects(tmp_path):
    text = (tmp_path / "out" / "objects.js").read_text()
    return re.search(r'"counts":(\[[^]]*\])', text).group(1), read_objects_file(text)


def test_a_tracepoint_only_trace_shows_hits_not_calls(tmp_path):
    index, methods, timeline = _pages(tmp_path, _trace)
    assert "snapshotted at every tracepoint hit<" in index
    assert "entry and exit" not in index
    for page in (methods, timeline):
        assert ">p95<" not in page and ">changes made<" not in page and ">hits<" in page
    assert "→ entry" not in timeline and "• a tracepoint hit" in timeline
    assert 'class="data timeline no-calls"' in timeline
    assert "announced is the store a tracepoint fires just before" in timeline
    # counted as hits wherever counted: the object's header, its graph, the object list
    facts = _facts(timeline)
    assert facts["hits"] == "4" and "calls" not in facts
    assert re.search(r">\d+ hits?(<| ·)", timeline)
    assert not re.search(r">\d+ calls?(<| ·)", timeline)
    assert "<h2>Tracepoints hit</h2>" in timeline and "<th>hit</th>" in timeline
    changes = (min(p for p in (tmp_path / "out").iterdir() if p.name.startswith("0x"))
               / "changes.html").read_text()
    assert "Tracepoints hit &amp; timeline" in changes and "Call graph" not in changes
    counts, objects = _objects(tmp_path)
    assert counts == '["hits"]' and [o["hits"] for o in objects] == [4]
    assert '<th class="num">hits</th>' in index and '<th class="num">calls</th>' not in index
    assert "every tracepoint hit on each sock object" in index


def test_a_trace_with_calls_keeps_durations(tmp_path):
    index, methods, timeline = _pages(tmp_path, kernel_trace)
    assert "snapshotted at every entry and exit and tracepoint hit<" in index
    for page in (methods, timeline):
        assert ">p95<" in page and ">changes made<" in page
    assert "→ entry" in timeline and "no-calls" not in timeline
    # a trace with calls and hits counts each by its name
    facts = _facts(timeline)
    assert (facts["calls"], facts["hits"]) == ("1", "2")  # tcp_close; the first lifetime's hits
    assert re.search(r">1 call(<| ·)", timeline) and re.search(r">2 hits(<| ·)", timeline)
    assert "<h2>Call graph</h2>" in timeline and "<th>call or hit</th>" in timeline
    counts, objects = _objects(tmp_path)
    assert counts == '["calls","hits"]'
    assert [(o["calls"], o["hits"]) for o in objects] == [(1, 2), (0, 1)]
    assert '<th class="num">calls</th><th class="num">hits</th>' in index
