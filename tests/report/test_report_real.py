"""The report on a real trace: the sample traced with real eBPF uprobes, its report's
objects and field changes checked against the sample's own ground-truth log, and the
rendered pages opened in headless Chromium.

Skipped, with the reason, when BPF cannot run here (see test_trace_bpf) or when
Chromium/Playwright are missing (see test_browser_report).
"""

from __future__ import annotations

from support import bpfcheck
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from support import groundtruth as gt
from ctracer.report import render_report
from support.analysis_view import view_of
from ctracer.tracefile import Trace

pytestmark = [pytest.mark.bpf, pytest.mark.browser]


def _skip_reason() -> str:
    """Why real BPF cannot run here ("" when it can): not root, or the kernel refuses a
    trivial uprobe program (the runtime's own self-test says why)."""
    if os.geteuid() != 0:
        return "not root: loading BPF programs and uprobes needs root"
    from ctracer.errors import CtracerError
    from ctracer.record import bpf_runtime
    try:
        bpfcheck.uprobe_self_test(str(gt.SOCKDEMO), "main")
    except CtracerError as e:
        return str(e)
    return ""


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    reason = _skip_reason()
    if reason:
        print(f"skipping the report on a real trace: {reason}", file=sys.stderr)
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("real")
    out, log = work / "sock.ctrace", work / "truth.log"
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock",
                        "--binary", gt.SOCKDEMO, "-o", str(out), "--", gt.SOCKDEMO,
                        "--loops", "3", "--threads", "2"],
                       capture_output=True, text=True, cwd=work, timeout=300,
                       env={**os.environ, gt.LOG_ENV: str(log)})
    assert r.returncode == 0, r.stderr
    return out, log


def expected_changes(log_path, fields: set[str]) -> Counter:
    """Changes as the sample's log shows them: consecutive snapshots of an address
    compared, a new object each time sk_alloc hands the address out."""
    lifetime: Counter = Counter()
    last: dict[int, dict] = {}
    out: Counter = Counter()
    for call in gt.parse_log(str(log_path)):
        if call.function == "sk_alloc" and call.phase == "exit" and call.ret:
            lifetime[call.ret] += 1
            last.pop(call.ret, None)
        if not call.object or not call.fields:
            continue
        now = {k: v for k, v in call.fields if k in fields}
        before = last.get(call.object)
        if before is not None:
            for name, value in now.items():
                if before[name] != value:
                    out[(call.object, lifetime[call.object], name, before[name], value)] += 1
        last[call.object] = now
    return out


def test_objects_and_changes_match_the_sample_log(real_trace):
    path, log = real_trace
    trace = Trace(str(path))
    report = view_of(trace)
    kinds = {f.name: f.kind for f in trace.mini.fields}

    def text(field, value):
        return (hex(value) if value else "0") if kinds[field] == "pointer" else str(value)

    got = Counter((c.obj.address, c.obj.lifetime, c.field, text(c.field, c.old),
                   text(c.field, c.new)) for o in report.objects for c in o.changes)
    expected = expected_changes(log, set(kinds))
    assert sum(expected.values()) > 100
    assert got == expected
    allocations = sum(1 for c in gt.parse_log(str(log))
                      if c.function == "sk_alloc" and c.phase == "exit" and c.ret)
    assert len(report.objects) == allocations
    assert max(o.key.lifetime for o in report.objects) > 1  # the sample reuses memory
    assert report.unmatched_exits == report.unfinished_calls == 0


def test_real_report_pages_load_and_links_resolve(real_trace, tmp_path):
    from support.timeline_rows import page_rows
    from support.browser_pages import CHROMIUM, FLAGS, Links, PageProblems, not_blank, playwright

    path, _ = real_trace
    result = render_report(str(path), str(tmp_path / "callgraph" / "sock"), max_objects=3)
    out = Path(result.out_dir)
    assert result.objects_rendered == 3 < result.objects_total
    pages = [out / "index.html", next(out.glob("0x*")) / "index.html",
             next(out.glob("0x*")) / "changes.html", out / "many_objects" / "changes.html"]
    sync_playwright = playwright()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            for page_path in pages:
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                watch = PageProblems(page)
                page.goto(page_path.as_uri(), wait_until="load")
                shot = tmp_path / "shot.png"
                page.screenshot(path=str(shot))
                page.close()
                assert watch.problems == [], page_path
                assert not_blank(shot), page_path
        finally:
            browser.close()
    parsed = {}
    for html in out.rglob("*.html"):
        links = Links()
        links.feed(html.read_text(encoding="utf-8"))
        links.ids.update(row["id"] for row in page_rows(html))
        parsed[html.resolve()] = links
    for html, links in parsed.items():
        for _, link in links.links:
            if link.startswith("data:"):
                continue
            target, _, anchor = link.partition("#")
            resolved = (html.parent / target).resolve() if target else html
            assert resolved.is_file(), (html, link)
            if anchor and resolved.suffix == ".html":
                assert anchor in parsed[resolved].ids, (html, link)
