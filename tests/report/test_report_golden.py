"""Golden files of the report's HTML structure: the tags, ids and classes of each kind of
page (text, numbers, addresses and times scrubbed), compared with files kept under
tests/report/golden/.  A change to the structure shows as a diff; after checking it is
meant, regenerate with ``CTRACER_GOLDEN=update pytest tests/report/test_report_golden.py``."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ctracer.report import render_report
from support.synthetic_trace import write_synthetic_trace

GOLDEN = Path(__file__).parent / "golden"
PAGES = {"index": "index.html", "object": "{obj}/index.html", "changes": "{obj}/changes.html",
         "many_objects": "many_objects/index.html", "methods": "methods/index.html"}
#: attribute values that vary from run to run or with the data, scrubbed to a token
_VOLATILE = re.compile(r"0x[0-9a-f]+|\d+")


class _Skeleton(HTMLParser):
    """One line per element: depth, tag, id and classes (numbers scrubbed); repeated
    sibling rows of a table body are kept once."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.depth = 0
        self.last_row = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        parts = [tag]
        if a.get("id"):
            parts.append("#" + _VOLATILE.sub("N", a["id"]))
        if a.get("class"):
            parts.append("." + ".".join(sorted(a["class"].split())))
        line = "  " * self.depth + " ".join(parts)
        if not (tag == "tr" and line == self.last_row):
            self.lines.append(line)
        if tag == "tr":
            self.last_row = line
        if tag not in ("meta", "link", "input", "br", "img", "col", "path", "rect",
                       "circle", "ellipse", "line"):
            self.depth += 1

    def handle_endtag(self, tag):
        if tag not in ("meta", "link", "input", "br", "img", "col", "path", "rect",
                       "circle", "ellipse", "line"):
            self.depth -= 1


def skeleton(html: str) -> str:
    p = _Skeleton()
    # table bodies and inline graphs vary with the data: their first rows stand for all
    html = re.sub(r"(<tbody>)(.*?)(</tbody>)",
                  lambda m: m.group(1) + "".join(re.findall(r"<tr.*?</tr>", m.group(2),
                                                            re.S)[:2]) + m.group(3),
                  html, flags=re.S)
    html = re.sub(r"<svg xmlns[^>]*class=\"callgraph\".*?</svg>", "<svg class=\"callgraph\"></svg>",
                  html, flags=re.S)
    html = re.sub(r"<script type=\"application/json\"[^>]*>.*?</script>", "", html, flags=re.S)
    p.feed(html)
    return "\n".join(p.lines) + "\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("golden")
    trace = base / "sock.ctrace"
    write_synthetic_trace(str(trace), threads=1, lifecycles=2, sends=2, lost_events=1,
                          attach_failures=True, seed=3)
    return Path(render_report(str(trace), str(base / "out")).out_dir)


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_page_structure_matches_its_golden_file(report, kind):
    obj = sorted(p.name for p in report.glob("0x*"))[0]
    got = skeleton((report / PAGES[kind].format(obj=obj)).read_text(encoding="utf-8"))
    golden = GOLDEN / f"{kind}.txt"
    if os.environ.get("CTRACER_GOLDEN") == "update":
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(got, encoding="utf-8")
    assert golden.is_file(), f"no golden file {golden}: run with CTRACER_GOLDEN=update"
    assert got == golden.read_text(encoding="utf-8")
