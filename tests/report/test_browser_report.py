"""The report in a real headless Chromium (Debian's /usr/bin/chromium driven by
Playwright, which must not download a browser of its own): pages load from file:// with
no console error, no failed request and no network, look like something (screenshots
are not blank), the page scripts work, and every local link and image in the whole
report resolves, anchors included."""

import os
import shutil
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from ctracer.report import render_report
from synthetic_trace import write_synthetic_trace

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CTRACER_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync"]


def _playwright():
    if not shutil.which(CHROMIUM) and not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian package chromium; scripts/setup.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is missing (pip install -e '.[test]')")
    return sync_playwright


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("browser")
    trace = base / "sock.ctrace"
    write_synthetic_trace(str(trace), threads=2, lifecycles=3, sends=4, lost_events=2)
    result = render_report(str(trace), str(base / "callgraph" / "sock"))
    return Path(result.out_dir)


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _playwright()
    profile = tempfile.mkdtemp(prefix="ctracer-chromium-")
    with sync_playwright() as p:
        # a persistent context is the only way to hand Chromium a fresh --user-data-dir
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1300, "height": 900}, offline=True)
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


class PageProblems:
    """Console errors, uncaught exceptions, failed and non-file requests of one page."""

    def __init__(self, page):
        self.problems = []
        page.on("console", lambda m: m.type in ("error", "warning") and self.problems.append(
            f"console {m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(
            f"request failed: {r.url} {r.failure}"))
        page.on("request", lambda r: not r.url.startswith(("file:", "data:")) and
                self.problems.append(f"network request: {r.url}"))


def open_page(browser, path):
    page = browser.new_page()
    watch = PageProblems(page)
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_load_state("networkidle")
    return page, watch


def not_blank(png_path):
    from PIL import Image, ImageStat

    with Image.open(png_path) as im:
        gray = im.convert("L")
        stat = ImageStat.Stat(gray)
        # a blank or single-colour page has (almost) no variance and few distinct shades
        return stat.stddev[0] > 12 and len(gray.getcolors(256) or []) > 20


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
    page.fill("input[data-filter=objects]", first.split()[0])
    visible = page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                            ".filter(r => !r.hidden).map(r => r.cells[0].innerText)")
    assert visible and all(v.startswith(first.split()[0]) for v in visible)
    assert page.locator(".alert-bad").inner_text().startswith("2 events lost.")
    page.close()
    assert watch.problems == []


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.links.append((tag, a[key]))


def test_every_local_link_and_image_resolves(report):
    parsed = {}
    for html in report.rglob("*.html"):
        p = _Links()
        p.feed(html.read_text(encoding="utf-8"))
        parsed[html.resolve()] = p
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
