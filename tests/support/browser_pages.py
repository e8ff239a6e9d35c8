"""Headless Chromium for the tests that look at pages as a user would: Debian's
/usr/bin/chromium driven by Playwright (which must not download a browser of its own),
offline; what went wrong on a page (console errors, failed or non-file requests),
whether a screenshot shows something, and the links and ids of a page's HTML."""

import os
import shutil
import tempfile
from html.parser import HTMLParser

import pytest

CHROMIUM = os.environ.get("CTRACER_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync"]


def playwright():
    """Playwright's ``sync_playwright``, or the test skipped saying what is missing."""
    if not shutil.which(CHROMIUM) and not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian package chromium; scripts/setup.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is missing (pip install -e '.[test]')")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    """One offline Chromium for a module, with a fresh profile."""
    sync_playwright = playwright()
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


class Links(HTMLParser):
    """Every href and src of a page (tag, value), and its element ids."""

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
