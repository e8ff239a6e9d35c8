"""`ctracer diff` on real traces: a C program (tests/fixtures/diff/session.c) compiled
with DWARF and recorded with real uprobes, run with and without a flag that makes
``session_send`` change one more field (``last_len``) and call one more function
(``session_note``).  The diff of the two runs must be exactly that and its
consequences; two runs of the same command differ in nothing but timings; runs of
different lengths compare per lifetime; repeated runs mark what is within their spread
as noise; two builds whose struct differs list the fields of one only; the page links
each row to both traces' reports and opens cleanly in Chromium.  The expected numbers
come from the program's own arguments, never from a diff.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from support.browser_pages import Links, browser, not_blank, open_page  # noqa: F401
from support.cbuild import Build, compile_c
from record.test_trace_bpf import bpf_available, ctracer_argv, run_trace  # noqa: F401

pytestmark = pytest.mark.bpf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SESSIONS, SENDS, LONG = 4, 5, 8  # sessions of a run, sends per session; a longer run


def ctracer(cwd, *args, timeout=600):
    r = subprocess.run(ctracer_argv(*map(str, args)), capture_output=True, text=True,
                       cwd=cwd, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def diff_json(cwd, before, after, *more):
    r = ctracer(cwd, "diff", before, after, "--json", *more)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def behaviour(result) -> list[dict]:
    """The differences in what the code did (every kind but timings)."""
    return [d for d in result["differences"] if d["kind"] != "timing"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The session program recorded: twice plainly, once with --note, once longer."""
    d = tmp_path_factory.mktemp("diff")
    exe = d / "session"
    compile_c(FIXTURES / "diff" / "session.c", exe, Build(opt=2))
    out = {}
    for name, args in (("plain1", (SESSIONS, SENDS)), ("plain2", (SESSIONS, SENDS)),
                       ("note", (SESSIONS, SENDS, "--note")), ("long", (LONG, SENDS))):
        trace = d / f"{name}.ctrace"
        r = run_trace(d, "trace", "session", "--binary", exe, "-o", trace, "--", exe,
                      *map(str, args))
        assert r.returncode == 0, r.stderr
        out[name] = trace
    out["dir"] = d
    return out


def test_a_flag_gives_exactly_that_diff(runs, tmp_path):
    result = diff_json(tmp_path, runs["plain1"], runs["note"])
    got = {(d["kind"], d["subject"], d["detail"]): (d["before"], d["after"])
           for d in behaviour(result)}
    last = str(100 + SENDS - 1)  # session_send(s, 100 + j): the last send's length
    assert got == {
        ("function", "session_note", ""): (0, SENDS),
        ("changes", "last_len", "session_send"): (0, SENDS),
        ("final", "last_len", ""): (None, None),
        ("edge", "session_send → session_note", ""): (0, SENDS),
        ("events", "events per lifetime", ""): (2 * (SENDS + 2), 2 * (2 * SENDS + 2)),
    }
    final = next(d for d in behaviour(result) if d["kind"] == "final")
    assert (final["shares_before"], final["shares_after"]) == ({"0": 1.0}, {last: 1.0})
    assert result["layout"] == [] and result["noise_measured"] is False
    # the counts of what the code did rank first, the new things (size 1) first of
    # all; a final value and the timings vary from run to run: counted apart, after
    events_before, events_after = 2 * (SENDS + 2), 2 * (2 * SENDS + 2)
    assert [(d["kind"], d["size"]) for d in result["differences"][:4]] == [
        ("function", 1.0), ("changes", 1.0), ("edge", 1.0),
        ("events", pytest.approx((events_after - events_before) / events_after))]
    assert all(d["verdict"] == "noise unknown" for d in result["differences"][4:])
    assert result["differences"][4]["kind"] == "final"
    assert result["counts"]["differences"] == 4
    assert [r["lifetimes"] for r in result["before"] + result["after"]] == [SESSIONS] * 2
    texts = [d["text"] for d in behaviour(result)]
    assert "last_len: now changed by session_send (5 per lifetime; unchanged before)" in texts
    assert "session_note: now called (5 per lifetime; never before)" in texts


def test_the_same_command_twice_differs_in_nothing_but_timings(runs, tmp_path):
    result = diff_json(tmp_path, runs["plain1"], runs["plain2"])
    assert behaviour(result) == []
    assert result["counts"]["differences"] == 0
    # a run that is one of the repeats is within their spread, timings included
    result = diff_json(tmp_path, f"{runs['plain1']},{runs['plain2']}", runs["plain2"])
    assert result["noise_measured"] is True
    assert all(d["noise"] is True for d in result["differences"])
    assert result["counts"]["differences"] == result["counts"]["noise_unknown"] == 0


def test_repeats_keep_the_flags_differences_beyond_noise(runs, tmp_path):
    result = diff_json(tmp_path, f"{runs['plain1']},{runs['plain2']}", runs["note"])
    flagged = {(d["kind"], d["subject"]) for d in behaviour(result)}
    assert flagged == {("function", "session_note"), ("changes", "last_len"),
                       ("final", "last_len"), ("edge", "session_send → session_note"),
                       ("events", "events per lifetime")}
    assert all(d["noise"] is False and d["verdict"] == "beyond noise"
               for d in behaviour(result))
    # the counts of what the code did are the same in both plain runs: no spread
    assert all(d["spread"] == 0 for d in behaviour(result))


def test_runs_of_different_length_compare_per_lifetime_or_per_iteration(runs, tmp_path):
    result = diff_json(tmp_path, runs["plain1"], runs["long"])
    assert behaviour(result) == []
    assert [r["lifetimes"] for r in result["before"] + result["after"]] == [SESSIONS, LONG]
    # per call of session_send (one iteration): session_note once per send
    result = diff_json(tmp_path, runs["long"], runs["note"], "--per", "session_send")
    assert result["unit"] == "per call of session_send"
    got = {(d["kind"], d["subject"]): (d["before"], d["after"]) for d in behaviour(result)}
    assert got[("function", "session_note")] == (0, 1)
    assert got[("changes", "last_len")] == (0, 1)
    assert ("lifetimes", "lifetimes") not in got  # a session per SENDS sends in both
    r = ctracer(tmp_path, "diff", runs["plain1"], runs["note"], "--per", "session_note")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "has no call of it" in r.stderr


def test_builds_whose_struct_differs_list_the_fields_of_one_only(tmp_path):
    """tests/fixtures/export/conn.c: -DWIDE widens ``window`` and adds ``retrans``."""
    traces = []
    for name, flags in (("narrow", ()), ("wide", ("-DWIDE",))):
        exe = tmp_path / name
        compile_c(FIXTURES / "export" / "conn.c", exe, Build(opt=2, flags=flags))
        trace = tmp_path / f"{name}.ctrace"
        r = run_trace(tmp_path, "trace", "conn", "--binary", exe, "-o", trace, "--", exe,
                      "2", "4")
        assert r.returncode == 0, r.stderr
        traces.append(trace)
    r = ctracer(tmp_path, "diff", *traces, "-o", tmp_path / "d")
    assert r.returncode == 0, r.stderr
    assert "layout: retrans: not recorded → " in r.stdout
    result = diff_json(tmp_path, *traces)
    layout = {f["field"]: (f["before"], f["after"]) for f in result["layout"]}
    assert set(layout) == {"window", "retrans"}
    assert layout["retrans"][0] is None and "long" in layout["retrans"][1]
    assert "short" in layout["window"][0] and "int" in layout["window"][1]
    # conn_send now changes retrans on every even send: 2 of 4 sends
    got = {(d["kind"], d["subject"], d["detail"]): d for d in behaviour(result)}
    retrans = got[("changes", "retrans", "conn_send")]
    assert retrans["after"] == 2
    # retrans is not in the narrow build's struct: said so, not "unchanged" or "0"
    assert retrans["text"] == "retrans: not in the before side's layout (changed by " \
                              "conn_send 2 per lifetime)"


def _links(page: Path) -> list[str]:
    parser = Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return [href for tag, href in parser.links if tag == "a"]


def _ids(page: Path) -> set[str]:
    parser = Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.ids


@pytest.mark.browser
def test_the_page_links_each_row_to_both_reports(runs, browser, tmp_path):  # noqa: F811
    out = tmp_path / "cmp"
    r = ctracer(tmp_path, "diff", runs["plain1"], runs["note"], "--render", "-o", out)
    assert r.returncode == 0, r.stderr
    assert f"open file://{out}/index.html" in r.stdout
    page_path = out / "index.html"
    links = [h for h in _links(page_path) if not h.startswith(("http", "data:"))]
    checked = 0
    for href in links:
        url = urlsplit(href)
        target = (out / unquote(url.path)).resolve()
        assert target.is_file(), href
        assert str(target).startswith(str(out.resolve())), href
        if url.fragment and "=" not in url.fragment:
            assert url.fragment in _ids(target), href
        checked += 1
    assert checked >= 15
    page, watch = open_page(browser, page_path)
    shot = tmp_path / "diff.png"
    page.screenshot(path=str(shot), full_page=True)
    rows = page.locator("#diff-table tbody tr")
    first = rows.first
    assert "session_note: now called" in first.inner_text()
    assert first.locator("a", has_text="before").count() == 0  # never called before
    first.locator("a", has_text="after").click()
    page.wait_for_load_state("load")
    assert page.url.endswith("after/methods/index.html#fn-session_note")
    assert page.evaluate("document.querySelector(':target')?.id") == "fn-session_note"
    page.go_back()
    page.wait_for_load_state("load")
    # an edge opens the other report's all-objects timeline filtered by its callee
    edge = page.locator("#diff-table tbody tr", has_text="a new call edge")
    edge.locator("a", has_text="after").click()
    page.wait_for_load_state("load")
    assert page.eval_on_selector("[data-timeline=function]", "e => e.value") == "session_note"
    page.go_back()
    page.wait_for_load_state("load")
    # the filter narrows the rows
    page.fill("input[data-filter=diff-table]", "last_len")
    visible = page.evaluate("Array.from(document.querySelectorAll('#diff-table tbody tr'))"
                            ".filter(r => !r.hidden).map(r => r.cells[2].innerText)")
    assert visible and all("last_len" in v for v in visible)
    page.close()
    assert watch.problems == []
    assert not_blank(shot)


def test_a_report_is_linked_only_when_it_is_that_traces(runs, tmp_path):
    """`ctracer report TRACE` writes callgraph/<struct>/ by default: the diff links
    it for the trace it was rendered from, and not for the other."""
    r = ctracer(tmp_path, "callgraph", runs["plain1"], "--no-plots", "-q")
    assert r.returncode == 0, r.stderr
    result = diff_json(tmp_path, runs["plain1"], runs["note"], "-o", tmp_path / "d")
    assert result["before"][0]["report"] == str(tmp_path / "callgraph" / "session")
    assert result["after"][0]["report"] is None
    links = _links(tmp_path / "d" / "index.html")
    assert any(h.startswith("../callgraph/session/methods/index.html#fn-") for h in links)
    r = ctracer(tmp_path, "diff", runs["plain1"], runs["note"], "-o", tmp_path / "e",
                "--after-report", tmp_path / "callgraph" / "session")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "is not a report rendered from" in r.stderr
    r = ctracer(tmp_path, "diff", runs["plain1"], runs["note"], "--after-report", tmp_path)
    assert r.returncode == 2 and "is not a ctracer report" in r.stderr


def test_bad_input_is_one_line(runs, tmp_path):
    conn = tmp_path / "conn"
    compile_c(FIXTURES / "export" / "conn.c", conn, Build(opt=2))
    other = tmp_path / "conn.ctrace"
    assert run_trace(tmp_path, "trace", "conn", "--binary", conn, "-o", other, "--", conn,
                     "1", "1").returncode == 0
    text = tmp_path / "notes.txt"
    text.write_text("not a trace\n")
    for args, says in (((runs["plain1"], other), "a diff compares traces of one struct"),
                       ((runs["plain1"], text), "is not a ctracer trace file"),
                       ((tmp_path / "missing.ctrace", runs["plain1"]), "no trace file at"),
                       ((f"{runs['plain1']},", ""), "AFTER")):
        r = ctracer(tmp_path, "diff", *args)
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert says in r.stderr, r.stderr
        assert not (tmp_path / "diff").exists()  # nothing written for bad input
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep me")
    r = ctracer(tmp_path, "diff", runs["plain1"], runs["note"], "-o", tmp_path / "taken")
    assert r.returncode == 1 and "is not a ctracer diff" in r.stderr
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep me"


def test_an_unfinished_trace_is_refused_and_an_interrupted_one_diffs_with_a_warning(tmp_path):
    """A recording still running is refused in one line; once its recorder is killed
    the file (finished by its first reader) diffs, with the warning every reader gives."""
    import signal
    import time

    from support import groundtruth as gt
    from record.test_trace_bpf import _wait_for_line
    from record.test_trace_durability import _committed

    done = tmp_path / "done.ctrace"
    r = run_trace(tmp_path, "trace", "sock", "--binary", gt.SOCKDEMO, "-o", done, "--",
                  gt.SOCKDEMO, "--loops", "3")
    assert r.returncode == 0, r.stderr
    live = tmp_path / "live.ctrace"
    tracer = subprocess.Popen(
        ctracer_argv("trace", "sock", "--binary", gt.SOCKDEMO, "-o", str(live), "--",
                     gt.SOCKDEMO, "--loops", "1000000", "--delay-ms", "2"),
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True)
    try:
        _wait_for_line(tracer.stderr, "recording struct sock")
        deadline = time.monotonic() + 120
        while _committed(live) < 200:
            assert time.monotonic() < deadline and tracer.poll() is None
            time.sleep(0.05)
        r = ctracer(tmp_path, "diff", done, live)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "is unfinished: the recording is still running" in r.stderr
        os.killpg(tracer.pid, signal.SIGKILL)
        tracer.wait()
    finally:
        if tracer.poll() is None:
            os.killpg(tracer.pid, signal.SIGKILL)
        tracer.stderr.close()
    r = ctracer(tmp_path, "diff", done, live, "-o", tmp_path / "d")
    assert r.returncode == 0, r.stderr
    warning = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "incomplete: the recorder was killed" in warning[0]
    assert "incomplete: the recorder was killed" in (tmp_path / "d" / "index.html").read_text()
