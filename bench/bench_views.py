#!/usr/bin/env python3
"""The report at every-method scale, in Chromium: how big its pages are, how long each
takes to open, and how long the busiest object's interactive call graph takes to zoom,
find a function and unfold every family, as ratios to an anchor measured in the same
browser in the same run (opening a plain page of text of the same size as the biggest
page, no script).  Run under the bench lock, with the project's venv:

    .venv/bin/python bench/kernel_rounds_trace.py k.ctrace /tmp/k1m.ctrace   # 1M events, ~10k objects
    flock /work/locks/bench.lock .venv/bin/python bench/bench_views.py --trace /tmp/k1m.ctrace
    flock /work/locks/bench.lock .venv/bin/python bench/bench_views.py --trace T --out /tmp/k1m-rep
    flock /work/locks/bench.lock .venv/bin/python bench/bench_views.py --report /tmp/k1m-rep  # reuse

The goal (issue 35): no page over 2 MB, each opens in under 2 s, the busiest object's
graph stays interactive.  "Opens" is from navigation to the page's load event; each view
is drawn when it is scrolled to ("and its views drawn": scrolled to at once, until the
graph is laid out and the flame view drawn).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

ISLAND = re.compile(r'<script type="application/json" id="views-data">(.*?)</script>', re.S)
LIMIT = 2 * 1024 * 1024


def biggest_files(report: Path, n: int = 5) -> list[tuple[int, Path]]:
    sizes = [(p.stat().st_size, p) for p in report.rglob("*") if p.is_file()
             and p.suffix in (".html", ".js") and p.parent.name != "_static"]
    return sorted(sizes, reverse=True)[:n]


def busiest_page(report: Path) -> tuple[Path, int]:
    """The object page whose call graph has most functions."""
    best, most = None, -1
    for page in report.glob("*/index.html"):
        if page.parent.name == "many_objects":
            continue
        m = ISLAND.search(page.read_text(encoding="utf-8"))
        if not m:
            continue
        nodes = len(json.loads(m.group(1)).get("graph", {}).get("nodes", []))
        if nodes > most:
            best, most = page, nodes
    return best, most


def open_seconds(context, path: Path, views: bool) -> float:
    """From navigation to the load event; with ``views``, on to both views drawn (each
    is drawn when scrolled to: both are scrolled to at once)."""
    page = context.new_page()
    start = time.perf_counter()
    page.goto(path.as_uri(), wait_until="load")
    if views:
        page.evaluate("document.getElementById('graph-view').scrollIntoView()")
        page.wait_for_selector("#graph-view[data-ready]", state="attached", timeout=60000)
        page.evaluate("document.getElementById('flame-view').scrollIntoView()")
        page.wait_for_selector("#flame-view[data-ready]", state="attached", timeout=60000)
    took = time.perf_counter() - start
    page.close()
    return took


def graph_timings(context, path: Path) -> dict[str, float]:
    page = context.new_page()
    page.goto(path.as_uri(), wait_until="load")
    page.evaluate("document.getElementById('graph-view').scrollIntoView()")
    page.wait_for_selector("#graph-view[data-ready]", state="attached", timeout=60000)
    out = {"layout when first shown": int(page.get_attribute("#graph-view", "data-layout-ms")) / 1000}
    # a zoom: the call and the frame the browser draws after it
    zooms = []
    for _ in range(5):
        zooms.append(page.evaluate("""() => new Promise(done => {
            const cy = window.ctracerGraph, t0 = performance.now();
            cy.zoom({level: cy.zoom() * 1.5, renderedPosition: {x: 400, y: 300}});
            requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - t0)));
        })""") / 1000)
    out["zoom (median of 5)"] = statistics.median(zooms)
    # a search of a function inside a folded family: unfolds it and lays the graph out
    names = page.evaluate("Array.from(document.querySelectorAll('#graph-names option'))"
                          ".map(o => o.value)")
    want = "tcp_v4_connect" if "tcp_v4_connect" in names else names[len(names) // 2]
    start = time.perf_counter()
    page.fill("[data-graph=search]", want)
    page.press("[data-graph=search]", "Enter")
    page.wait_for_selector("#graph-view[data-found]", state="attached", timeout=60000)
    out[f"search {want}"] = time.perf_counter() - start
    start = time.perf_counter()
    page.click("[data-graph=unfold-all]")
    total = page.evaluate("window.ctracerGraph.nodes().length")
    page.wait_for_function("document.querySelector('[data-graph=status]').textContent"
                           ".indexOf('folded') < 0", timeout=60000)
    out[f"unfold all ({total} boxes)"] = time.perf_counter() - start
    page.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="render this trace (kernel_rounds_trace.py makes one)")
    ap.add_argument("--report", help="measure this report instead of rendering one")
    ap.add_argument("--out", help="render into this directory and keep it")
    args = ap.parse_args()
    if not args.trace and not args.report:
        ap.error("give --trace or --report")
    from support.browser_pages import CHROMIUM, FLAGS
    from playwright.sync_api import sync_playwright

    work = tempfile.mkdtemp(prefix="ctracer-views-")
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if args.report:
            report = Path(args.report)
        else:
            from ctracer.report import render_report

            report = Path(args.out) if args.out else Path(work) / "report"
            result = render_report(args.trace, str(report))
            s = result.seconds
            print(f"{result.events} events, {result.objects_total} objects; rendered in "
                  f"{s['total']:.1f} s (model {s.get('model', 0):.1f}, graphs and stacks "
                  f"{s.get('graphs', 0):.1f}, pages {s.get('html', 0):.1f})")
        big = biggest_files(report)
        print("largest files: " + ", ".join(f"{p.relative_to(report)} {size / 1e6:.2f} MB"
                                            for size, p in big))
        over = [p for size, p in big if size > LIMIT]
        print(f"files over 2 MB: {len(over)}")
        busiest, nodes = busiest_page(report)
        print(f"busiest object's graph: {busiest.parent.name}, {nodes} functions")
        anchor_page = Path(work) / "anchor.html"
        size = big[0][0] if big else 1_000_000
        anchor_page.write_text("<!DOCTYPE html><title>anchor</title><pre>"
                               + ("x" * 99 + "\n") * (size // 100) + "</pre>")
        profile = tempfile.mkdtemp(prefix="ctracer-chromium-", dir=work)
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
                viewport={"width": 1300, "height": 900}, offline=True)
            open_seconds(context, anchor_page, False)  # warm the browser
            anchor = statistics.median(open_seconds(context, anchor_page, False) for _ in range(3))
            print(f"anchor (a plain {size / 1e6:.2f} MB page of text): {anchor:.3f} s")
            pages = [("index", report / "index.html", False),
                     ("busiest object", busiest, True),
                     ("all objects", report / "many_objects" / "index.html", True),
                     ("all objects' changes", report / "many_objects" / "changes.html", False),
                     ("methods", report / "methods" / "index.html", False)]
            for label, path, views in pages:
                took = statistics.median(open_seconds(context, path, False) for _ in range(3))
                print(f"  open {label:22s} {took:6.3f} s = {took / anchor:5.2f} x anchor "
                      f"({path.stat().st_size / 1e6:.2f} MB)")
                if views:
                    took = statistics.median(open_seconds(context, path, True) for _ in range(3))
                    print(f"    and its views drawn     {took:6.3f} s = {took / anchor:5.2f} x anchor")
            for what, took in graph_timings(context, busiest).items():
                print(f"  {what:30s} {took:6.3f} s = {took / anchor:5.2f} x anchor")
            context.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
