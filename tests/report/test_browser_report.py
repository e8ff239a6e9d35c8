"""The report in a real headless Chromium (Debian's /usr/bin/chromium driven by
Playwright, which must not download a browser of its own): pages load from file:// with
no console error, no failed request and no network, look like something (screenshots
are not blank), the page scripts work, and every local link and image in the whole
report resolves, anchors included."""

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from ctracer.report import html as report_html
from ctracer.report import pages as report_pages
import ctracer.report.pages.changes  # noqa: F401 (patched below)
from ctracer.report import render_report
from support.synthetic_trace import write_synthetic_trace
from ctracer.report.timeline import read_data_file
from support.timeline_rows import index_objects, page_rows, rows_of
from support.browser_pages import Links, PageProblems, browser, not_blank, open_page  # noqa: F401

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("browser")
    trace = base / "sock.ctrace"
    write_synthetic_trace(str(trace), threads=2, lifecycles=3, sends=4, lost_events=2)
    result = render_report(str(trace), str(base / "callgraph" / "sock"))
    return Path(result.out_dir)


@pytest.mark.parametrize("which", ["index.html", "object", "object-changes",
                                   "many_objects/index.html", "methods/index.html"])
def test_pages_load_cleanly_and_are_not_blank(report, browser, which, tmp_path):
    if which == "object":
        path = next(report.glob("0x*-2")) / "index.html"
    elif which == "object-changes":
        path = next(report.glob("0x*-2")) / "changes.html"
    else:
        path = report / which
    page, watch = open_page(browser, path)
    shot = tmp_path / "shot.png"
    page.screenshot(path=str(shot), full_page=True)
    # every image on the page decoded (a broken <img> has naturalWidth 0)
    broken = page.evaluate(
        "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
        ".map(i => i.getAttribute('src'))")
    page.close()
    assert watch.problems == []
    assert broken == []
    assert not_blank(shot)


def test_object_page_scripts_and_targets(report, browser):
    page, watch = open_page(browser, next(report.glob("0x*-2")) / "index.html")
    rows = page.locator("#timeline tbody tr")
    total = rows.count()
    changed = page.locator("#timeline tbody tr.changed").count()
    assert 0 < changed < total
    page.check("input[data-only-changed]")
    visible = page.evaluate(
        "Array.from(document.querySelectorAll('#timeline tbody tr'))"
        ".filter(r => r.offsetParent !== null).length")
    assert visible == changed
    # the methods table sorts by calls when its header is clicked
    page.click("#methods thead th:nth-child(2)")
    calls = [int(t) for t in page.locator("#methods tbody td:nth-child(2)").all_inner_texts()]
    assert calls == sorted(calls) and len(set(calls)) > 1
    # a change's link lands on its highlighted row
    changes_page = page.context.new_page()
    PageProblems(changes_page)
    changes_page.goto((next(report.glob("0x*-2")) / "changes.html").as_uri())
    href = changes_page.locator("a", has_text="timeline row").first.get_attribute("href")
    changes_page.click(f"a[href='{href}']")
    changes_page.wait_for_url(f"**/{href}")
    changes_page.wait_for_load_state("load")
    target = changes_page.evaluate("document.querySelector(':target')?.id")
    assert target == href.split("#")[1]
    changes_page.close()
    page.close()
    assert watch.problems == []


def test_index_filter(report, browser):
    page, watch = open_page(browser, report / "index.html")
    first = page.locator("#objects tbody tr").first.locator("td").first.inner_text()
    page.fill("input[data-objects=filter]", first.split()[0])
    visible = page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                            ".filter(r => !r.hidden).map(r => r.cells[0].innerText)")
    assert visible and all(v.startswith(first.split()[0]) for v in visible)
    assert page.locator(".alert-bad").inner_text().startswith("2 events lost.")
    page.close()
    assert watch.problems == []


def test_every_local_link_and_image_resolves(report):
    parsed = {}
    for html in report.rglob("*.html"):
        p = Links()
        p.feed(html.read_text(encoding="utf-8"))
        # timeline rows are drawn by the page from its data files: their ids count
        p.ids.update(row["id"] for row in page_rows(html))
        parsed[html.resolve()] = p
    # the index's object links are drawn by its script from objects.js: they count
    index = parsed[(report / "index.html").resolve()]
    for o in index_objects(report):
        index.links += [("a", f"{o['dir']}/index.html"), ("a", f"{o['dir']}/changes.html")]
    checked, bad = 0, []
    for html, p in parsed.items():
        for tag, link in p.links:
            url = urlsplit(link)
            if url.scheme == "data":
                continue
            if url.scheme or url.netloc:
                bad.append(f"{html}: non-local {tag} {link}")
                continue
            target = (html.parent / unquote(url.path)).resolve() if url.path else html
            checked += 1
            if not str(target).startswith(str(report.resolve())):
                bad.append(f"{html}: {link} leaves the report")
            elif not target.is_file():
                bad.append(f"{html}: {link} does not exist")
            elif url.fragment and target.suffix == ".html" and \
                    url.fragment not in parsed[target].ids:
                bad.append(f"{html}: {link} has no such anchor")
    assert bad == []
    assert checked > 500


def test_call_graph_node_lands_on_its_rows(report, browser):
    page, watch = open_page(browser, next(report.glob("0x*-2")) / "index.html")
    nodes = page.locator("svg.callgraph g.node:not(.root)")
    assert nodes.count() >= 5
    for i in (0, nodes.count() - 1):
        node = nodes.nth(i)
        name = node.get_attribute("data-function")
        node.locator("a.to-rows").click()
        page.wait_for_function("document.querySelector(':target') !== null")
        target = page.evaluate("document.querySelector(':target').getAttribute('data-fn')")
        assert target == name
    page.close()
    assert watch.problems == []


def test_timeline_filters_brush_and_row_state(report, browser):
    page, watch = open_page(browser, next(report.glob("0x*-2")) / "index.html")
    visible = ("Array.from(document.querySelectorAll('#timeline tbody tr[id]'))"
               ".filter(r => !r.hidden && r.offsetParent !== null)")
    total = page.evaluate(visible + ".length")
    page.select_option("select[data-timeline=function]", "tcp_sendmsg")
    fns = page.evaluate(visible + ".map(r => r.getAttribute('data-fn'))")
    assert fns and set(fns) == {"tcp_sendmsg"} and len(fns) < total
    page.select_option("select[data-timeline=function]", "")
    page.select_option("select[data-timeline=field]", "sk_common.skc_state")
    rows = page.evaluate(visible + ".map(r => r.textContent)")
    assert rows and all("sk_common.skc_state" in r for r in rows)
    page.select_option("select[data-timeline=field]", "")
    # a time window: only rows inside it stay
    times = page.evaluate(visible + ".map(r => parseFloat(r.cells[0].textContent))")
    lo, hi = times[len(times) // 4], times[len(times) // 2]
    page.fill("input[data-timeline=from]", str(lo))
    page.fill("input[data-timeline=to]", str(hi))
    shown = page.evaluate(visible + ".map(r => parseFloat(r.cells[0].textContent))")
    assert shown and all(lo <= t <= hi for t in shown) and len(shown) < len(times)
    page.fill("input[data-timeline=from]", "")
    page.fill("input[data-timeline=to]", "")
    # dragging across the brush keeps a window too
    page.locator("#time-brush").scroll_into_view_if_needed()
    box = page.locator("#time-brush").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.1, box["y"] + 10)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 10)
    page.mouse.up()
    assert page.input_value("input[data-timeline=from]") != ""
    assert 0 < page.evaluate(visible + ".length") < total
    page.mouse.click(box["x"] + box["width"] * 0.9, box["y"] + 10)  # a click clears it
    assert page.evaluate(visible + ".length") == total
    # clicking a row that changed fields: every field's value at that moment
    fields = page.evaluate("CTRACER_ROWS.fields.length")
    row = page.locator("#timeline tbody tr.changed").nth(3)
    row.locator("td").nth(1).click()
    panel = page.locator("#row-state")
    assert panel.is_visible()
    assert panel.locator("tbody tr").count() == fields
    values = panel.locator("tbody tr td:nth-child(2)").all_inner_texts()
    assert "?" not in values
    changed = panel.locator("tbody tr.changed td:first-child").all_inner_texts()
    assert changed and all(name in row.inner_text() for name in changed)
    page.close()
    assert watch.problems == []


def test_changes_page_interactive_plot_zooms(report, browser):
    page, watch = open_page(browser, next(report.glob("0x*-2")) / "changes.html")
    plot = page.locator("svg.field-plot").first
    plot.evaluate("svg => svg.closest('details').open = true")
    plot.scroll_into_view_if_needed()
    assert plot.locator("path.series").count() == 1
    before = plot.locator("circle.point").count()
    box = plot.bounding_box()
    xs = sorted(float(x) for x in plot.locator("circle.point").evaluate_all(
        "cs => cs.map(c => c.getAttribute('cx'))"))
    assert len(xs) >= 3
    # drag from just before the second point to just after it (viewBox is 800 wide)
    a, b = (xs[1] - 4) / 800 * box["width"], (xs[1] + 4) / 800 * box["width"]
    page.mouse.move(box["x"] + a, box["y"] + 40)
    page.mouse.down()
    page.mouse.move(box["x"] + b, box["y"] + 40)
    page.mouse.up()
    assert 0 < plot.locator("circle.point").count() < before
    plot.dblclick()
    assert plot.locator("circle.point").count() == before
    unchanged = page.locator(".unchanged-table tbody tr td:nth-child(4)").all_inner_texts()
    assert unchanged and all(v.strip() for v in unchanged)  # unchanged fields show values
    page.close()
    assert watch.problems == []


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A report of a thousand objects: the index, pages and the all-objects views must
    stay usable and small."""
    base = tmp_path_factory.mktemp("many")
    trace = base / "many.ctrace"
    write_synthetic_trace(str(trace), threads=4, lifecycles=250, sends=1,
                          addresses_per_thread=4)
    result = render_report(str(trace), str(base / "callgraph" / "sock"))
    assert result.objects_total == result.objects_rendered == 1000
    return Path(result.out_dir)


@pytest.mark.parametrize("which", ["index.html", "object", "object-changes",
                                   "many_objects/index.html", "many_objects/changes.html",
                                   "methods/index.html"])
def test_many_objects_pages_load_cleanly(many, browser, which):
    if which.startswith("object"):
        d = sorted(many.glob("0x*"))[-1]
        path = d / ("changes.html" if which == "object-changes" else "index.html")
    else:
        path = many / which
    page, watch = open_page(browser, path)
    broken = page.evaluate(
        "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
        ".map(i => i.getAttribute('src'))")
    page.close()
    assert watch.problems == [] and broken == []
    biggest = max(p.stat().st_size for p in many.rglob("*.html"))
    assert biggest < 2_000_000


def test_index_filter_and_sort_reach_every_object(many, browser):
    """The index draws its objects a page at a time from objects.js: the filter searches
    all of them, a header sorts all of them, and an object past the first page opens."""
    objects = index_objects(many)
    target = objects[800]
    page, watch = open_page(browser, many / "index.html")
    drawn = ("Array.from(document.querySelectorAll('#objects tbody tr'))"
             ".map(r => r.cells[0].innerText)")
    first = page.evaluate(drawn)
    assert 0 < len(first) < len(objects) and target["label"] not in first
    assert page.is_visible("nav.pager[data-objects=pager]")
    page.fill("input[data-objects=filter]", target["label"])
    assert page.evaluate(drawn) == [target["label"]]
    # the summary texts the data file shares between objects are drawn as texts
    cells = page.evaluate("Array.from(document.querySelector('#objects tbody tr').cells)"
                          ".map(c => c.innerText)")
    summary = [c.replace("\u00a0", " ") for c in cells[1:1 + len(target["summary"])]]
    assert target["summary"] and summary == target["summary"]
    # sorting by events sorts every object, not the page shown
    page.fill("input[data-objects=filter]", "")
    # (the struct's summary columns come before it)
    n = page.evaluate("Array.from(document.querySelectorAll('#objects thead th'))"
                      ".findIndex(th => th.innerText.trim() === 'events') + 1")
    assert n > 0
    page.click(f"#objects thead th:nth-child({n})")
    events = [int(t) for t in page.locator(f"#objects tbody td:nth-child({n})").all_inner_texts()]
    assert events == sorted(events) and events[0] == min(o["events"] for o in objects)
    page.click(f"#objects thead th:nth-child({n})")
    events = [int(t) for t in page.locator(f"#objects tbody td:nth-child({n})").all_inner_texts()]
    assert events[0] == max(o["events"] for o in objects)
    page.fill("input[data-objects=filter]", target["label"])
    page.locator("#objects tbody a", has_text=target["label"]).click()
    page.wait_for_load_state("load")
    assert page.url.endswith(f"/{target['dir']}/index.html")
    assert page.locator("h1").inner_text().endswith(target["label"])
    page.close()
    assert watch.problems == []


def test_all_objects_search_finds_rows_on_later_pages(many, browser):
    """The all-objects timeline is paged (20,000 rows a page): a search loads the other
    pages' data files, lists the pages with matches, and their link lands on the rows."""
    d = many / "many_objects"
    pages = sorted(d.glob("rows-*.js"), key=lambda p: int(p.stem.split("-")[1]))
    assert len(pages) >= 3
    on_first = {r["object"] for r in rows_of(read_data_file(pages[0].read_text()))}
    last = rows_of(read_data_file(pages[-1].read_text()))
    target = next(r for r in last if r["object"] not in on_first)
    page, watch = open_page(browser, d / "index.html")
    page.fill("input[data-timeline=search]", target["object"])
    status = page.locator("[data-timeline=elsewhere]")
    page.wait_for_function("!document.querySelector('[data-timeline=elsewhere]')"
                           ".textContent.startsWith('Searching')", timeout=60_000)
    assert status.inner_text().startswith("Matches on other pages")
    assert page.evaluate("document.querySelectorAll('#timeline tbody tr[id]').length") == 0
    link = status.locator("a", has_text=f"page {len(pages)} (")
    link.click()
    page.wait_for_load_state("load")
    assert page.url.split("#")[0].endswith(f"timeline-{len(pages)}.html")
    assert page.input_value("input[data-timeline=search]") == target["object"]
    objects = page.evaluate("Array.from(document.querySelectorAll('#timeline tbody tr'))"
                            ".map(r => r.cells[2].textContent)")
    assert objects and set(objects) == {target["object"]}
    assert page.locator(f"#timeline tbody tr#{target['id']}").count() == 1
    # a function filter also looks through every page (the list offers every function)
    page.fill("input[data-timeline=search]", "")
    functions = page.evaluate("CTRACER_PAGES.functions.length")
    assert page.locator("select[data-timeline=function] option").count() == functions + 1
    page.close()
    assert watch.problems == []


def test_hostile_names_are_drawn_as_text(browser, tmp_path):
    """Rows come from data files: the page script must make their texts DOM text."""
    from test_report_html import hostile_trace

    hostile_trace(tmp_path / "x.ctrace")
    out = Path(render_report(str(tmp_path / "x.ctrace"), str(tmp_path / "out")).out_dir)
    page, watch = open_page(browser, out / "0x1000" / "index.html")
    injected = page.evaluate("document.querySelectorAll('#timeline tbody img, "
                             "#timeline tbody svg, #timeline tbody b:not(.chg b)').length")
    threads = page.evaluate("Array.from(document.querySelectorAll('#timeline tbody tr'))"
                            ".map(r => r.cells[1].textContent)")
    changes = page.locator("#timeline tbody .chg").all_inner_texts()
    page.close()
    assert watch.problems == [] and injected == 0
    assert threads and set(threads) == {"<svg onload=x>/1"}
    assert any("<b>UP</b> → A&B" in c for c in changes)
    # the index draws its objects from objects.js as text too
    page, watch = open_page(browser, out / "index.html")
    injected = page.evaluate("document.querySelectorAll('#objects tbody img, "
                             "#objects tbody svg, #objects tbody b').length")
    began = page.locator("#objects tbody td:nth-child(3)").all_inner_texts()
    page.close()
    assert watch.problems == [] and injected == 0
    assert began == [o["began"] for o in index_objects(out)]


def test_a_row_deep_in_a_long_page_is_drawn_with_its_neighbours(browser, tmp_path):
    """A page draws 2,000 rows at a time: a link to a row past them draws the rows
    around it (not every row before it), and the earlier ones come back on demand."""
    write_synthetic_trace(str(tmp_path / "long.ctrace"), threads=1, lifecycles=1,
                          sends=500, addresses_per_thread=1)
    out = Path(render_report(str(tmp_path / "long.ctrace"), str(tmp_path / "out")).out_dir)
    page_path = next(out.glob("0x*")) / "index.html"
    ids = [row["id"] for row in page_rows(page_path)]
    assert len(ids) > 2400
    target = ids[2300]
    page = browser.new_page()
    watch = PageProblems(page)
    page.goto(page_path.as_uri() + "#" + target, wait_until="load")
    assert page.evaluate("document.querySelector(':target')?.id") == target
    drawn = page.evaluate("Array.from(document.querySelectorAll('#timeline tbody tr'))"
                          ".map(r => r.id)")
    assert target in drawn and ids[0] not in drawn and len(drawn) <= 2000
    for _ in range(5):  # 2,000 more a click, until the first row is back
        if not page.is_visible("button[data-timeline=earlier]"):
            break
        page.click("button[data-timeline=earlier]")
    drawn = page.evaluate("Array.from(document.querySelectorAll('#timeline tbody tr'))"
                          ".map(r => r.id)")
    assert ids[0] in drawn and target in drawn
    page.close()
    assert watch.problems == []


def test_a_fields_other_changes_open_the_timeline_filtered_by_it(browser, tmp_path,
                                                                   monkeypatch):
    """A changes page lists a field's first changes; its link opens the timeline with
    the field filter set, and every row drawn changed that field."""
    from test_report_html import one_object_report

    monkeypatch.setattr(report_pages.changes, "CHANGE_ROWS_PER_PAGE", 100)
    out = one_object_report(tmp_path, sends=200)
    page, watch = open_page(browser, next(out.glob("0x*")) / "changes.html")
    link = page.locator('[id="f-sk_stats.tx_bytes"] p.more-changes a')
    total = int(re.search(r"all (\d+) in the timeline", link.text_content()).group(1))
    link.click()
    page.wait_for_load_state("load")
    assert page.url.endswith("index.html#field=sk_stats.tx_bytes&changed=1")
    assert page.eval_on_selector("[data-timeline=field]", "e => e.value") == \
        "sk_stats.tx_bytes"
    changes = page.evaluate("Array.from(document.querySelectorAll('#timeline tbody tr'))"
                            ".map(r => r.textContent)")
    assert len(changes) == total and all("sk_stats.tx_bytes" in c for c in changes)
    page.close()
    assert watch.problems == []


def test_index_filter_lives_in_the_address(report, browser):
    """#q=TEXT opens the index filtered; typing in the filter puts it in the address."""
    first = index_objects(report)[0]["label"].split()[0]
    page, watch = open_page(browser, report / "index.html")
    page.goto((report / "index.html").as_uri() + "#q=" + first, wait_until="load")
    page.reload(wait_until="load")  # a fresh load with the filter in the address
    assert page.input_value("input[data-objects=filter]") == first
    labels = page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                           ".map(r => r.cells[0].innerText)")
    total = len(index_objects(report))
    assert labels and len(labels) < total and all(v.startswith(first) for v in labels)
    page.fill("input[data-objects=filter]", "")
    assert page.evaluate("location.href").endswith("index.html")
    assert len(page.locator("#objects tbody tr").all()) == total
    # an address's second object, by the name its folder has
    second = next(o["label"] for o in index_objects(report) if o["label"].endswith("-2"))
    page.fill("input[data-objects=filter]", second)
    assert page.evaluate("location.href").endswith("index.html#q=" + second)
    assert page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                         ".map(r => r.cells[0].innerText)") == [second]
    page.close()
    assert watch.problems == []
