"""The rows a timeline page shows, read from its data files as the page's script reads
them (`ctracer.report.timeline`), for tests that check rows without a browser: one dict
per table row, caller rows (``c<seq>``) before the row that showed their changes; and
the objects the index lists (`ctracer.report.index_data`)."""

from __future__ import annotations

import re
from pathlib import Path

from ctracer.report.index_data import OBJECTS_FILE, read_objects_file
from ctracer.report.timeline import read_data_file


def data_files(page: Path) -> list[Path]:
    """The rows-N.js files a page loads."""
    html = page.read_text(encoding="utf-8")
    return [page.parent / m for m in re.findall(r'<script src="(rows-\d+\.js)"', html)]


def page_data(page: Path) -> list[dict]:
    """The timeline data a page draws: from the data files it loads, or from its own
    script (a short timeline of one page carries its rows)."""
    html = page.read_text(encoding="utf-8")
    inline = re.findall(r"<script>(/\* ctracer timeline rows.*?)</script>", html, re.S)
    return ([read_data_file(text) for text in inline]
            + [read_data_file(path.read_text(encoding="utf-8")) for path in data_files(page)])


def timeline_data(directory: Path) -> list[dict]:
    """The data of every page of the timeline in ``directory`` (its pages in order)."""
    pages = [directory / "index.html"] + sorted(
        directory.glob("timeline-*.html"), key=lambda p: int(p.stem.split("-")[1]))
    return [d for page in pages if page.exists() for d in page_data(page)]


def page_rows(page: Path) -> list[dict]:
    rows = []
    for data in page_data(page):
        rows += rows_of(data)
    return rows


def rows_of(d: dict) -> list[dict]:
    out = []
    for i, seq in enumerate(d["seq"]):
        ph = d["ph"][i]
        kind = "entry" if ph == d["entry"] else "tracepoint" if ph == d["point"] else "exit"
        obj = d["objects"][d["o"][i]] if "o" in d else None
        base = {"seq": seq, "t": d["t"][i], "thread": d["threads"][d["th"][i]],
                "object": obj[0] if obj else "", "href": obj[1] if obj else "",
                "depth": d["d"][i]}
        chg = d["changes"].get(str(i))
        changes, why = [], ""
        if chg:
            cause = d["causes"][chg[0]]
            listed = [(d["fields"][chg[k]], chg[k + 1], chg[k + 2])
                      for k in range(1, len(chg), 3)]
            if cause[0]:
                out.append(dict(base, id=f"c{seq}", classes={"by-caller", "changed"},
                                fn=cause[2], tags=[cause[3]], changes=listed, why=cause[1],
                                depth=max(0, base["depth"] - 1), dur="", ret=""))
            else:
                changes, why = listed, cause[1]
                kind += " changed"
        tags = d["tags"].get(str(i), [])
        kinds = {k for k, _ in tags if k != "args"}
        out.append(dict(base, id=f"e{seq}", classes=set(kind.split()) | kinds,
                        fn=d["functions"][str(d["fn"][i])], tags=[t for _, t in tags],
                        changes=changes,
                        why=why, dur=d["dur"][i], ret=d["ret"][i]))
    return out


def row_text(row: dict) -> str:
    """The row's text as the page shows it (cells joined by spaces)."""
    parts = [f"{row['t'] / 1e6:.6f}", row["thread"], row["object"], row["fn"], *row["tags"],
             row["dur"], row["ret"]]
    parts += [f"{f} {o} → {n}" for f, o, n in row["changes"]]
    return " ".join(p for p in parts if p)


def index_objects(report: Path) -> list[dict]:
    """The objects the report's index lists (from its data file, as its script draws
    them): dicts with ``label``, ``dir`` ("" when the object has no pages), counts."""
    return read_objects_file((report / OBJECTS_FILE).read_text(encoding="utf-8"))
