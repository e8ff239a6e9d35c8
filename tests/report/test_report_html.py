"""The rendered report: which files exist, what the pages say, that names from a trace
are escaped and never become paths, that long timelines page correctly, and the CLI."""

from support.encoding import encode
import json
import os
import re
from collections import Counter
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from PIL import Image, ImageStat

from ctracer.event import PHASE_ENTRY, PHASE_EXIT, Field, Layout
from ctracer.report import html as report_html
from ctracer.report import pages as report_pages
import ctracer.report.pages.changes  # noqa: F401 (patched below)
from ctracer.report import render_report
from ctracer.tracefile import TraceWriter
from ctracer.event import FunctionRow
from support.timeline_rows import index_objects, page_rows
from support.synthetic_trace import write_synthetic_trace


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    trace = base / "sock.ctrace"
    truth = write_synthetic_trace(str(trace), threads=2, lifecycles=3, sends=4,
                                  lost_events=3, attach_failures=True)
    result = render_report(str(trace), str(base / "out"))
    return truth, result, base / "out"


def read(path):
    return path.read_text(encoding="utf-8")


def test_tree_mirrors_the_original_layout(report):
    truth, result, out = report
    assert result.objects_total == result.objects_rendered == len(truth.lifetimes)
    for page in ("index.html", "many_objects/index.html", "many_objects/changes.html",
                 "methods/index.html", "_static/report.css", "_static/report.js"):
        assert (out / page).is_file(), page
    dirs = sorted(p.name for p in out.iterdir() if p.name.startswith("0x"))
    expected = sorted(f"0x{a:x}" if n == 1 else f"0x{a:x}-{n}" for a, n in truth.lifetimes)
    assert dirs == expected
    for d in dirs:
        for page in ("index.html", "changes.html"):
            assert (out / d / page).is_file(), (d, page)
        assert '<svg xmlns="http://www.w3.org/2000/svg" class="callgraph"' in read(
            out / d / "index.html")


def test_a_plot_for_every_field_that_changed_often_and_no_other(report):
    """A PNG where a field changed at least MIN_CHANGES_TO_PLOT times (fewer read better
    as the table); the synthetic report has fewer objects than DEFAULT_PLOT_OBJECTS."""
    truth, _, out = report
    for (address, lifetime) in truth.lifetimes:
        d = out / (f"0x{address:x}" if lifetime == 1 else f"0x{address:x}-{lifetime}")
        counts = Counter(c.field for c in truth.changes
                         if (c.address, c.lifetime) == (address, lifetime))
        changed = {f for f, n in counts.items() if n >= report_html.MIN_CHANGES_TO_PLOT}
        assert changed, "the fixture should have often-changed fields"
        assert {p.name[:-4] for p in d.glob("*.png")} == changed
        for name in changed:
            with Image.open(d / f"{name}.png") as im:
                assert im.width >= 700 and im.height >= 200
                assert max(ImageStat.Stat(im.convert("L")).stddev) > 10  # not blank


def test_index_shows_the_summary_and_warnings(report):
    truth, _, out = report
    page = read(out / "index.html")
    assert "3 events lost." in page
    assert "tcp_poll</code>: entry: symbol not found" in page
    assert "/usr/local/bin/sockdemo" in page and "6.1.0-synthetic" in page
    assert "2023-11-14 22:13:20 UTC" in page
    assert "objects.js" in page  # the object list is drawn from it
    objects = index_objects(out)
    assert len(objects) == len(truth.lifetimes)
    again = [o for o in objects if re.fullmatch(r"0x55d0[0-9a-f]+-2", o["label"])]
    assert again and all((out / o["dir"] / "index.html").is_file() for o in again)
    # an object is named as its folder is, on every page that shows it
    assert all(o["label"] == o["dir"] for o in objects if o["dir"])
    for o in again[:3]:
        for page in ("index.html", "changes.html"):
            text = read(out / o["dir"] / page)
            assert f"{o['label']}" in text.split("</h1>")[0].split("<h1>")[1]
            assert not re.search(r"0x[0-9a-f]+ #\d", text)
    assert {o["began"] for o in objects} and all(o["events"] > 0 for o in objects)


def test_changes_page_lists_every_change_and_links_to_its_row(report):
    truth, _, out = report
    address, lifetime = next(k for k in truth.lifetimes if k[1] == 2)
    d = out / f"0x{address:x}-2"
    page = read(d / "changes.html")
    mine = [c for c in truth.changes if (c.address, c.lifetime) == (address, lifetime)]
    assert page.count('">timeline row</a>') == len(mine)
    assert "TCP_SYN_SENT → TCP_ESTABLISHED" in page
    assert "Unchanged" in page  # sk_err never changes in a second lifetime without an error
    ids = {row["id"] for row in page_rows(d / "index.html")}
    anchors = re.findall(r'href="index.html#([ec]\d+)"', page)
    assert anchors and set(anchors) <= ids


def test_timeline_marks_changes_with_old_and_new(report):
    truth, _, out = report
    address, _ = next(k for k in truth.lifetimes if k[1] == 1)
    rows = page_rows(out / f"0x{address:x}" / "index.html")
    changed = [r for r in rows if r["classes"] == {"exit", "changed"}]
    assert any(("sk_common.skc_state", "TCP_CLOSE", "TCP_SYN_SENT") in r["changes"]
               and r["why"] == "during inet_sk_set_state" for r in changed)
    alloc = [r["classes"] for r in rows if r["fn"] == "sk_alloc"]
    assert alloc == [{"entry"}, {"exit"}]


def test_methods_page_lists_each_function_row_by_its_route(report):
    """The probed functions' table names a row's route kind and route text in the
    glossary's words (docs/architecture.md), one row per functions-table row."""
    _, _, out = report
    page = read(out / "methods" / "index.html")
    table = page[page.index('id="functions"'):]
    table = table[:table.index("</table>")]
    assert re.findall(r"<th[^>]*>([^<]*)</th>", table) == [
        "function", "route kind", "route", "unit", "probes", "called"]
    assert re.search(r'<td class="fn">inet_bind</td><td>holder</td>'
                     r'<td class="mono">socket-&gt;sk</td>', table)


def test_call_graph_svg_names_the_methods_and_links_them(report):
    _, _, out = report
    page = read(next(out.glob("0x*/index.html")))
    svg = ET.fromstring(re.search(r"<svg .*?</svg>", page, re.S).group(0))
    ns = "{http://www.w3.org/2000/svg}"
    texts = {t.text for t in svg.iter(f"{ns}text")}
    assert {"tcp_set_state", "inet_sk_set_state", "sk_free"} <= texts
    links = [a.get("href") for a in svg.iter(f"{ns}a")]
    rows = [h for h in links if h.startswith("index.html#e")]
    assert len(rows) >= 10
    fn_of = {row["id"]: row["fn"] for row in page_rows(next(out.glob("0x*/index.html")))}
    for href in rows:  # each function's box leads to a row of that function
        assert href.split("#")[1] in fn_of
    assert any(h.startswith("../methods/index.html#fn-") for h in links)


def hostile_trace(path):
    """Names a trace may carry that must not become markup or paths."""
    mini = Layout.packed_in_order("ctracer__mini_x", [
        Field("state", "u8", 0, "enum", ((1, "<b>UP</b>"), (2, "A&B"))),
        Field("n", "s32", 0, "int")])
    w = TraceWriter(str(path))
    w.set_meta(struct_name="../../x<y>", struct_kind="struct", mini_layout=mini.to_json(),
               host="<i>host</i>", argv=["ctracer", "<script>alert(1)</script>"])
    w.add_functions([FunctionRow(1, "<img src=x onerror=alert(1)>", route_kind="direct",
                                 attached="entry,exit"),
                     FunctionRow(2, "../../../etc/passwd", route_kind="direct",
                                 attached="entry,exit")])
    # function 9 is not in the functions table (a damaged or hand-made trace)
    for ts, fid, phase, state in ((1, 1, PHASE_ENTRY, 1), (2, 1, PHASE_EXIT, 2),
                                  (3, 2, PHASE_ENTRY, 2), (4, 2, PHASE_EXIT, 1),
                                  (5, 9, PHASE_ENTRY, 1), (6, 9, PHASE_EXIT, 1)):
        w.add_event(ts_ns=ts * 1000, cpu=0, pid=1, tid=1, comm="<svg onload=x>",
                    function_id=fid, phase=phase, object=0x1000, retval=None, depth=0,
                    flags=0, snapshot=encode(mini, {"state": state, "n": 0}))
    w.close()


def test_names_from_the_trace_are_escaped_and_never_paths(tmp_path, monkeypatch):
    trace = tmp_path / "x.ctrace"
    hostile_trace(trace)
    monkeypatch.chdir(tmp_path)
    result = render_report(str(trace))
    out = tmp_path / result.out_dir
    # the struct name was not usable as a directory: a hashed stand-in under callgraph/
    assert out.parent == tmp_path / "callgraph" and out.name.startswith("struct-")
    written = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    assert all(p.startswith(str(tmp_path)) for p in written)
    assert not any("passwd" in p for p in written)
    for html in out.rglob("*.html"):
        text = read(html)
        for raw in ("<img src=x", "<script>alert", "<svg onload", "<b>UP</b>", "<i>host",
                    "<y>"):
            assert raw not in text, (html, raw)
    page = read(out / "0x1000" / "index.html")
    rows = page_rows(out / "0x1000" / "index.html")
    assert "function#9" in {r["fn"] for r in rows}
    # the rows' texts stay plain text in the data (report.js escapes them as it draws)
    assert (out / "methods" / "function-9.png").is_file()
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert {r["thread"] for r in rows} == {"<svg onload=x>/1"}
    assert ("state", "<b>UP</b>", "A&B") in {c for r in rows for c in r["changes"]}
    svg = re.search(r'<svg xmlns="http://www.w3.org/2000/svg" class="callgraph".*?</svg>',
                    page, re.S).group(0)
    assert "<img" not in svg and "&lt;img src=x onerror=alert(1)&gt;" in svg


def one_object_report(tmp_path, sends: int):
    """The report of one socket's lifecycle with ``sends`` sends (its directory)."""
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=1, sends=sends,
                          addresses_per_thread=1)
    out = tmp_path / "out"
    render_report(str(trace), str(out))
    return out


def test_long_timelines_are_paged_and_links_find_the_page(tmp_path, monkeypatch):
    for module in (report_pages.timeline, report_pages.graphs):
        monkeypatch.setattr(module, "PAGE_ROWS", 40)
    d = next(one_object_report(tmp_path, sends=30).glob("0x*"))
    pages = sorted(p.name for p in d.glob("timeline-*.html"))
    assert len(pages) >= 2
    ids = {p: [r["id"] for r in page_rows(d / p)] for p in ["index.html"] + pages}
    rows_per_page = [sum(1 for i in ids[p] if i.startswith("e")) for p in ids]
    assert all(n == 40 for n in rows_per_page[:-1]) and 0 < rows_per_page[-1] <= 40
    changes = read(d / "changes.html")
    links = re.findall(r'href="((?:index|timeline-\d+)\.html)#([ec]\d+)"', changes)
    assert {page for page, _ in links} - {"index.html"}  # some changes are on later pages
    for page, anchor in links:
        assert anchor in ids[page]


def test_a_long_lived_object_keeps_its_changes_page_small(tmp_path, monkeypatch):
    """Each field lists its first changes (the page shares CHANGE_ROWS_PER_PAGE among the
    fields that changed) and links to the timeline filtered by it for the rest; the
    interactive plot draws at most LIVE_POINTS points of a field, saying of how many."""
    monkeypatch.setattr(report_pages.changes, "CHANGE_ROWS_PER_PAGE", 100)
    monkeypatch.setattr(report_pages.changes, "LIVE_POINTS", 60)
    out = one_object_report(tmp_path, sends=200)
    for d in (next(out.glob("0x*")), out / "many_objects"):
        page = read(d / "changes.html")
        sections = re.findall(r'<section class="field" id="f-([\w.]+)">(.*?)</section>', page,
                              re.S)
        counts = {name: int(n) for name, n in
                  re.findall(r'<h2><code>([\w.]+)</code> <span class="meta">[^<]*· (\d+) '
                             r'change', page)}
        per_field = max(report_pages.site.MIN_CHANGE_ROWS_PER_FIELD, 100 // len(counts))
        capped = 0
        for name, body in sections:
            if name not in counts:
                continue
            rows = body.count('">timeline row</a>')
            assert rows == min(counts[name], per_field), name
            if counts[name] > per_field:
                capped += 1
                assert (f"The first {per_field} of {counts[name]} changes; "
                        f'<a href="index.html#field={name}&amp;changed=1">all '
                        f"{counts[name]} in the timeline</a>") in body
        assert capped >= 2
    series = json.loads(re.search(r'<script type="application/json" id="field-series">'
                                  r"(.*?)</script>", read(next(out.glob("0x*")) /
                                                          "changes.html"), re.S).group(1))
    sampled = {k: v for k, v in series.items() if v["of"]}
    assert sampled and all(len(v["t"]) <= 60 < v["of"] for v in sampled.values())
    assert all(len(v["t"]) == len(v["y"]) == len(v["label"]) for v in series.values())
    assert all(v["of"] == 0 and len(v["t"]) <= 60 for v in series.values() if not v["of"])


def test_max_objects_limits_object_pages(tmp_path):
    trace = tmp_path / "t.ctrace"
    truth = write_synthetic_trace(str(trace), threads=2, lifecycles=3, sends=2)
    out = tmp_path / "out"
    result = render_report(str(trace), str(out), max_objects=2)
    assert result.objects_rendered == 2 and result.objects_total == len(truth.lifetimes)
    assert len(list(out.glob("0x*"))) == 2
    index = read(out / "index.html")
    objects = index_objects(out)
    assert len(objects) == len(truth.lifetimes)
    assert sum(1 for o in objects if o["dir"]) == 2  # only rendered objects are links
    assert "busiest" in index


def test_output_directory_is_replaced_only_when_it_is_a_report(tmp_path):
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=1, sends=1)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(report_html.OutputDirError):
        render_report(str(trace), str(foreign))
    assert (foreign / "notes.txt").read_text() == "keep me"
    out = tmp_path / "out"
    render_report(str(trace), str(out))
    (out / "0xdead").mkdir()  # left over from an older trace
    render_report(str(trace), str(out))
    assert not (out / "0xdead").exists()


def ctracer(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ctracer", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_cli_renders_into_callgraph_struct_and_says_where(tmp_path):
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=2, sends=1)
    done = ctracer("callgraph", str(trace), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    index = tmp_path / "callgraph" / "sock" / "index.html"
    assert f"open file://{index}" in done.stdout
    assert index.is_file()


def test_cli_bad_input_is_one_line(tmp_path):
    done = ctracer("callgraph", str(tmp_path / "missing.ctrace"), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"ctracer: error: no trace file at {tmp_path / 'missing.ctrace'}"]
    junk = tmp_path / "junk.ctrace"
    junk.write_bytes(b"not sqlite at all" * 100)
    done = ctracer("callgraph", str(junk), cwd=tmp_path)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "not a ctracer trace file" in done.stderr


def test_without_plots_no_png_is_drawn_or_referenced(tmp_path):
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=2, sends=2)
    out = tmp_path / "out"
    render_report(str(trace), str(out), plots=False)
    assert list(out.rglob("*.png")) == []
    assert list(out.glob("0x*/changes.html"))
    for html in out.rglob("*.html"):
        assert ".png" not in read(html), html


def test_counts_agree_on_every_page_and_in_the_cli(tmp_path):
    """One set of counts: recorded = shown + repeats folded, lost and unreadable beside
    them; the same line on every page and from `ctracer report`; read failures listed."""
    from ctracer.event import FLAG_READ_FAILED

    mini = Layout.packed_in_order("ctracer__mini_c", [Field("n", "s32", 0, "int")])
    trace = tmp_path / "c.ctrace"
    w = TraceWriter(str(trace))
    w.set_meta(struct_name="c", struct_kind="struct", mini_layout=mini.to_json(),
               lost_events=4)
    w.add_functions([FunctionRow(1, "f", route_kind="direct", attached="entry,exit"),
                     FunctionRow(2, "f", route_kind="holder", attached="entry,exit")])
    events = [(1, 1, PHASE_ENTRY, 0), (2, 2, PHASE_ENTRY, 0),   # one call, two ways
              (3, 1, PHASE_EXIT, 0), (4, 2, PHASE_EXIT, 0),
              (5, 1, PHASE_ENTRY, FLAG_READ_FAILED), (6, 1, PHASE_EXIT, 0)]
    for ts, fid, phase, flags in events:
        w.add_event(ts_ns=ts * 1000, cpu=0, pid=1, tid=1, comm="t", function_id=fid,
                    phase=phase, object=0x1000, retval=None, depth=0, flags=flags,
                    snapshot=encode(mini, {"n": ts}))
    w.close()
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "ctracer", "callgraph", str(trace), "-o",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    line = "6 events recorded, 4 lost, 1 unreadable, 4 shown (2 repeats of one call shown once)"
    assert line in r.stdout
    pages = list(out.rglob("*.html"))
    assert len(pages) >= 5
    for page in pages:
        assert line in read(page), page
    index = read(out / "index.html")
    failures = re.search(r'<table class="data" id="read-failures">.*?</table>', index, re.S)
    assert failures and failures.group(0).count("<tr>") == 2  # the header and one row
    href = re.search(r'href="(0x1000/index.html#e\d+)"', failures.group(0)).group(1)
    page, anchor = href.split("#")
    assert anchor in {row["id"] for row in page_rows(out / page)}


def test_timeline_gives_a_callers_change_to_the_caller(report):
    """tcp_v4_connect stores skc_dport before calling tcp_set_state: the change shows on a
    row of tcp_v4_connect's (as changes.html says "in tcp_v4_connect, before it called
    tcp_set_state"), not on tcp_set_state's entry row."""
    truth, _, out = report
    address, _ = next(k for k in truth.lifetimes if k[1] == 1)
    rows = page_rows(out / f"0x{address:x}" / "index.html")
    ids = [r["id"] for r in rows]
    caller = next(r for r in rows if r["classes"] == {"by-caller", "changed"}
                  and r["fn"] == "tcp_v4_connect")
    assert "sk_common.skc_dport" in [f for f, _, _ in caller["changes"]]
    assert caller["tags"] == ["before calling tcp_set_state"]
    entry_id = "e" + caller["id"][1:]
    assert ids[ids.index(caller["id"]) + 1] == entry_id  # right before the callee
    entry = rows[ids.index(entry_id)]
    assert entry["fn"] == "tcp_set_state" and not entry["changes"]
    changes = read(out / f"0x{address:x}" / "changes.html")
    assert f'href="index.html#{caller["id"]}"' in changes
    assert "in tcp_v4_connect, before it called tcp_set_state" in changes


def test_png_plots_go_to_the_fields_that_changed_most(tmp_path):
    """A struct with many fields changing (a kernel sock changes dozens): each changes
    page draws MAX_PLOTS_PER_PAGE PNGs, of the fields that changed most, says so, and
    leaves every changed field in the interactive plot."""
    names = [f"f{i:02d}" for i in range(12)]
    mini = Layout.packed_in_order("ctracer__mini_w", [Field(n, "s32", 0, "int") for n in names])
    w = TraceWriter(str(tmp_path / "w.ctrace"))
    w.set_meta(struct_name="wide", struct_kind="struct", mini_layout=mini.to_json())
    w.add_functions([FunctionRow(1, "poke", route_kind="direct", attached="entry,exit")])
    for step in range(24):  # field i changes on every event up to step 10 + i
        values = {n: min(step, 10 + i) for i, n in enumerate(names)}
        w.add_event(ts_ns=1000 * (step + 1), cpu=0, pid=1, tid=1, comm="t", function_id=1,
                    phase=PHASE_ENTRY if step % 2 == 0 else PHASE_EXIT, object=0x1000,
                    retval=None, depth=0, flags=0, snapshot=encode(mini, values))
    w.close()
    out = tmp_path / "out"
    render_report(str(tmp_path / "w.ctrace"), str(out))
    drawn = {p.name[:-4] for p in (out / "0x1000").glob("*.png")}
    assert len(drawn) == report_html.MAX_PLOTS_PER_PAGE
    assert drawn == set(names[-report_html.MAX_PLOTS_PER_PAGE:])  # the most changes
    page = read(out / "0x1000" / "changes.html")
    assert f"PNG plots are drawn for the {len(drawn)} fields that changed most" in page
    live = re.search(r'<script type="application/json" id="field-series">(.*?)</script>',
                     page, re.S).group(1)
    assert all(f'"{n}"' in live for n in names)
    assert len(list((out / "many_objects").glob("*.png"))) == report_html.MAX_PLOTS_PER_PAGE
    render_report(str(tmp_path / "w.ctrace"), str(out), plots=False)  # --no-plots
    assert not list(out.rglob("*.png"))
    assert "PNG plots are drawn" not in read(out / "0x1000" / "changes.html")


def test_paged_timeline_index_says_what_each_page_holds(tmp_path, monkeypatch):
    """pages.js (what the page script uses to search every page) lists, per page, the
    functions, threads and fields changed its rows show, and its time span."""
    import json

    for module in (report_pages.timeline, report_pages.graphs):
        monkeypatch.setattr(module, "PAGE_ROWS", 40)
    trace = tmp_path / "t.ctrace"
    write_synthetic_trace(str(trace), threads=2, lifecycles=3, sends=4)
    out = tmp_path / "out"
    render_report(str(trace), str(out))
    d = out / "many_objects"
    text = (d / "pages.js").read_text(encoding="utf-8")
    index = json.loads(text[text.index("=") + 1:].rstrip().rstrip(";"))
    assert len(index["pages"]) > 3
    assert index["pages"][0]["page"] == "index.html"
    for page in index["pages"]:
        rows = page_rows(d / page["page"])
        assert page["rows"] in (d / page["page"]).read_text(encoding="utf-8")
        assert {index["functions"][i] for i in page["fn"]} == {r["fn"] for r in rows}
        assert {index["threads"][i] for i in page["th"]} == {r["thread"] for r in rows}
        assert {index["fields"][i] for i in page["field"]} == {
            f for r in rows for f, _, _ in r["changes"]}
        assert page["t"] == [rows[0]["t"], rows[-1]["t"]]
    # a timeline of one page needs no index; every longer one has it
    objects = list(out.glob("0x*"))
    assert {o for o in objects if (o / "pages.js").is_file()} == {
        o for o in objects if (o / "timeline-2.html").is_file()}
