"""The interactive call graph and the flame view in a real headless Chromium, on a real
kernel trace (every method of struct sock, recorded in the 6.12 guest under tcploop:
`tests/fixtures/kernel/`): zoom, search, focus, fold/unfold, the threshold and a click in
the flame view do what they say, each checked against the page's own data read here in
Python; nodes and frames land on their timeline rows.  Screenshots go to the test's
temporary directory (``CTRACER_SHOTS=DIR`` keeps them there)."""

import json
import os
import re
from pathlib import Path

import pytest

from ctracer.report import render_report
from support.browser_pages import PageProblems, browser, not_blank, open_page  # noqa: F401

pytestmark = pytest.mark.browser

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kernel" / "sock-every-method-6.12.ctrace.xz"


def kernel_trace(directory: Path) -> Path:
    """The fixture's trace file, decompressed into ``directory``."""
    import lzma

    path = directory / "sock.ctrace"
    path.write_bytes(lzma.decompress(FIXTURE.read_bytes()))
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("views")
    out = base / "report"
    render_report(str(kernel_trace(base)), str(out), plots=False)
    return out


def views_of(page_path):
    text = page_path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="views-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1)) if m else None


@pytest.fixture(scope="module")
def busiest(report):
    """The object page whose call graph has most functions, and its data."""
    best = None
    for page in report.glob("0x*/index.html"):
        data = views_of(page)
        if data and "graph" in data and (best is None or len(data["graph"]["nodes"]) >
                                         len(best[1]["graph"]["nodes"])):
            best = (page, data)
    assert best is not None and len(best[1]["graph"]["nodes"]) > 60
    return best


def shots(tmp_path):
    where = Path(os.environ.get("CTRACER_SHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


def ready(browser, path):
    """The page with both views drawn (each is drawn when scrolled to)."""
    page, watch = open_page(browser, path)
    for view in ("#flame-view", "#graph-view"):
        page.locator(view).scroll_into_view_if_needed()
        page.wait_for_selector(f"{view}[data-ready]", timeout=20000)
    return page, watch


def test_views_wait_until_scrolled_to(busiest, browser):
    path, _ = busiest
    page = browser.new_page()
    watch = PageProblems(page)
    page.set_viewport_size({"width": 1300, "height": 200})  # the views well below it
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("document.getElementById('graph-view').getBoundingClientRect().top") > 600
    assert page.evaluate("typeof window.cytoscape") == "undefined"
    assert page.get_attribute("#graph-view", "data-ready") is None
    page.locator("#graph-view").scroll_into_view_if_needed()
    page.wait_for_selector("#graph-view[data-ready]", timeout=20000)
    assert page.evaluate("typeof window.cytoscape") == "function"
    page.close()
    assert watch.problems == []


def shown_ids(page, selector="node"):
    return page.evaluate(f"window.ctracerGraph.elements('{selector}').map(n => n.id())")


def click_node(page, node_id):
    """A real mouse click where the node is drawn on the canvas."""
    page.evaluate(f"window.ctracerGraph.getElementById({json.dumps(node_id)})"
                  ".select().scrollIntoView ? 0 : 0")
    page.locator("#graph-canvas").scroll_into_view_if_needed()
    box = page.locator("#graph-canvas").bounding_box()
    pos = page.evaluate(f"window.ctracerGraph.getElementById({json.dumps(node_id)})"
                        ".renderedPosition()")
    page.mouse.click(box["x"] + pos["x"], box["y"] + pos["y"])


def test_zoom_and_fold_and_unfold_on_click(busiest, browser, tmp_path):
    path, data = busiest
    g = data["graph"]
    col = {name: k for k, name in enumerate(g["node_columns"])}
    page, watch = ready(browser, path)
    page.locator("#graph-view").screenshot(path=str(shots(tmp_path) / "graph-folded.png"))
    assert not_blank(shots(tmp_path) / "graph-folded.png")
    # big graphs open with their families folded: fewer boxes than functions
    families = {}
    for i, row in enumerate(g["nodes"]):
        if row[col["family"]]:
            families.setdefault(row[col["family"]], []).append(i)
    ids = shown_ids(page)
    assert page.is_checked("[data-graph=fold]")
    assert sorted(i for i in ids if i.startswith("fam:")) == sorted("fam:" + f for f in families)
    assert len(ids) == 1 + len(g["nodes"]) - sum(len(m) for m in families.values()) + len(families)
    # zoom: the + button zooms in by 1.5, the - button back
    before = page.evaluate("window.ctracerGraph.zoom()")
    page.click("[data-graph=zoom-in]")
    assert page.evaluate("window.ctracerGraph.zoom()") == pytest.approx(before * 1.5, rel=1e-3)
    page.click("[data-graph=zoom-out]")
    assert page.evaluate("window.ctracerGraph.zoom()") == pytest.approx(before, rel=1e-3)
    # a click on a family unfolds it: its functions appear, the family box goes
    family = max(families, key=lambda f: len(families[f]))
    page.click("[data-graph=fit]")
    click_node(page, "fam:" + family)
    page.wait_for_function(f"window.ctracerGraph.getElementById({json.dumps('fam:' + family)})"
                           ".length === 0")
    ids = set(shown_ids(page))
    assert {f"f{i}" for i in families[family]} <= ids
    # each edge shown sums the calls of the edges it stands for
    page.locator("#graph-view").screenshot(path=str(shots(tmp_path) / f"graph-unfolded-{family}.png"))
    page.close()
    assert watch.problems == []


def test_search_finds_a_function_inside_a_folded_family_and_links_to_its_rows(busiest, browser,
                                                                            tmp_path):
    path, data = busiest
    g = data["graph"]
    col = {name: k for k, name in enumerate(g["node_columns"])}
    names = [row[col["name"]] for row in g["nodes"]]
    name = "tcp_v4_connect" if "tcp_v4_connect" in names else names[-1]
    page, watch = ready(browser, path)
    page.fill("[data-graph=search]", name)
    page.press("[data-graph=search]", "Enter")
    page.wait_for_selector("#graph-view[data-found]")
    found = page.evaluate("window.ctracerGraph.nodes('.found').map(n => n.data('name'))")
    expected = sorted(n for n in names if name.lower() in n.lower())
    assert sorted(found) == expected
    page.locator("#graph-view").screenshot(path=str(shots(tmp_path) / "graph-search.png"))
    # one match: its panel links to its first row; the row is that function's
    if len(expected) == 1:
        href = page.locator("[data-graph=panel] a", has_text="first call's row").get_attribute("href")
        page.click(f"[data-graph=panel] a[href='{href}']")
        page.wait_for_function("document.querySelector(':target') !== null")
        assert page.evaluate("document.querySelector(':target').getAttribute('data-fn')") == name
    page.close()
    assert watch.problems == []


def test_focus_fades_all_but_callers_and_callees_to_the_depth(busiest, browser, tmp_path):
    path, data = busiest
    g = data["graph"]
    col = {name: k for k, name in enumerate(g["node_columns"])}
    page, watch = ready(browser, path)
    page.click("[data-graph=unfold-all]")
    page.wait_for_function(f"window.ctracerGraph.nodes().length === {len(g['nodes']) + 1}")
    # the function with most callers and callees
    degree = {}
    for a, b, _ in g["edges"]:
        for x in (a, b):
            if x >= 0:
                degree[x] = degree.get(x, 0) + 1
    center = max(degree, key=degree.get)
    click_node(page, f"f{center}")
    page.wait_for_selector("[data-graph=panel]:not([hidden])")
    assert g["nodes"][center][col["name"]] in page.inner_text("[data-graph=panel]")
    page.select_option("[data-graph=depth]", "1")
    page.click("[data-graph=panel] button:text('focus')")
    ids = lambda i: "root" if i < 0 else f"f{i}"  # noqa: E731
    near = {ids(center)} | {ids(a) for a, b, _ in g["edges"] if b == center} \
        | {ids(b) for a, b, _ in g["edges"] if a == center}
    faded = set(page.evaluate("window.ctracerGraph.nodes('.faded').map(n => n.id())"))
    shown = set(shown_ids(page))
    assert shown - faded == near
    page.locator("#graph-view").screenshot(path=str(shots(tmp_path) / "graph-focus.png"))
    # depth 2 keeps the callers' callers and the callees' callees too
    page.select_option("[data-graph=depth]", "2")
    faded2 = set(page.evaluate("window.ctracerGraph.nodes('.faded').map(n => n.id())"))
    assert shown - faded2 > near
    page.click("[data-graph=unfocus]")
    assert page.evaluate("window.ctracerGraph.nodes('.faded').length") == 0
    # the threshold hides functions called fewer times
    page.evaluate("""() => { const s = document.querySelector('[data-graph=threshold]');
        s.value = String(Math.floor(+s.max / 2)); s.dispatchEvent(new Event('input')); }""")
    limit = int(page.inner_text("[data-graph=threshold-value]"))
    page.wait_for_function(f"window.ctracerGraph.nodes().length === "
                           f"{1 + sum(1 for r in g['nodes'] if r[col['calls']] >= limit)}")
    page.close()
    assert watch.problems == []


def test_flame_click_zooms_into_the_frame(busiest, browser, tmp_path):
    path, data = busiest
    flame = data["flame"]
    page, watch = ready(browser, path)
    page.locator("#flame-view").scroll_into_view_if_needed()
    page.locator("#flame-view").screenshot(path=str(shots(tmp_path) / "flame.png"))
    assert not_blank(shots(tmp_path) / "flame.png")
    width = page.evaluate("document.querySelector('[data-flame=chart]').clientWidth")
    # a frame with callees below it, drawn wide enough to click
    frames = page.locator("[data-flame=chart] .frame:not(.above)")
    target = None
    for k in range(frames.count()):
        node = int(frames.nth(k).get_attribute("data-node"))
        if node in flame["p"] and frames.nth(k).bounding_box()["width"] > 40:
            target = (k, node)
            break
    assert target is not None
    k, node = target
    name = flame["names"][flame["f"][node]]
    frames.nth(k).click()
    assert page.get_attribute("#flame-view", "data-zoomed") == name
    # the frame now fills the width, its callers above it, its callees below only
    top = page.locator(f"[data-flame=chart] .frame:not(.above)[data-node='{node}']")
    assert top.bounding_box()["width"] >= width - 2
    drawn = {int(v) for v in page.eval_on_selector_all(
        "[data-flame=chart] .frame:not(.above)", "els => els.map(e => e.dataset.node)")}

    def under(n):
        while n >= 0:
            if n == node:
                return True
            n = flame["p"][n]
        return False
    assert drawn and all(under(n) for n in drawn)
    above = page.eval_on_selector_all("[data-flame=chart] .frame.above",
                                      "els => els.map(e => e.dataset.node)")
    callers = []
    n = flame["p"][node]
    while n >= 0:
        callers.insert(0, str(n))
        n = flame["p"][n]
    assert above == ["-1"] + callers
    page.locator("#flame-view").screenshot(path=str(shots(tmp_path) / "flame-zoomed.png"))
    # the panel links the frame to its first call's row, which is that function's
    href = page.locator("[data-flame=panel] a", has_text="first call's row").get_attribute("href")
    page.click(f"[data-flame=panel] a[href='{href}']")
    page.wait_for_function("document.querySelector(':target') !== null")
    assert page.evaluate("document.querySelector(':target').getAttribute('data-fn')") == name
    # the top bar zooms back out
    page.locator("#flame-view").scroll_into_view_if_needed()
    page.click("[data-flame=chart] .frame.above[data-node='-1']")
    assert page.get_attribute("#flame-view", "data-zoomed") == ""
    page.close()
    assert watch.problems == []


def test_all_objects_views_load_cleanly(report, browser, tmp_path):
    page, watch = ready(browser, report / "many_objects" / "index.html")
    assert page.evaluate("window.ctracerGraph.nodes().length") > 5
    page.locator("#flame-view").screenshot(path=str(shots(tmp_path) / "all-flame.png"))
    page.close()
    assert watch.problems == []
