"""Timeline pages: an object's (or all objects') events, PAGE_ROWS rows a page, each
page's rows in a data file beside it, and where each row is for links to it.
"""

from __future__ import annotations

import os

from markupsafe import Markup

import numpy as np

from ctracer.files import let_go
from ctracer.report.jsontext import script_safe
from ctracer.report.timeline import PAGES_FILE, _changes_of, data_file_text, pages_file_text
from ctracer.report.pages.site import (INLINE_ROWS_CHARS, PAGE_ROWS, ReportSite, page_file_of,
                                       rows_file_of)
from ctracer.report.pages.graphs import graph_for, views_for


class RunningState:
    """Every field's value (as shown) per object as a timeline is written, so each page
    carries the state at its first row (the browser replays the page's changes)."""

    def __init__(self, site: ReportSite, show_object: bool):
        self.site, self.show_object = site, show_object
        self.values: dict[int, dict[str, str]] = {}

    def _initial(self, i: int) -> dict[str, str]:
        show = self.site.timeline.value
        return {name: show(name, value) for name, value in self.site.data.first_values(i).items()}

    def page_start(self, rows: np.ndarray, advance: bool = True) -> dict[str, dict[str, str]]:
        """Every field's value at the first of ``rows``, per object label ("" on an
        object's own pages); then, with ``advance`` (a page follows), the state moves
        past ``rows``."""
        a = self.site.data
        objects: dict[str, dict[str, str]] = {}
        present = a.events.object[rows]
        present = present[present >= 0]
        uniques, first = np.unique(present, return_index=True)
        for o in uniques[np.argsort(first, kind="stable")].tolist():
            label = a.objects.labels[o] if self.show_object else ""
            if o not in self.values:
                self.values[o] = self._initial(o)
            if label not in objects:
                objects[label] = dict(self.values[o])
        if not advance:
            return objects
        timeline = self.site.timeline
        picks = _changes_of(timeline.change_start[rows], timeline.change_end[rows])
        ch = a.changes
        fields, changed = timeline.fields, ch.field[picks]
        for o, j, text in zip(a.events.object[ch.event[picks]].tolist(), changed.tolist(),
                              timeline.codes_text(changed, ch.new[picks])):
            self.values[o][fields[j]] = text
        return objects


# ---------------------------------------------------------------- timelines


def write_timeline(site: ReportSite, directory: str, rows: np.ndarray, *, title: str, heading: str,
                   use_object_depth: bool, show_object: bool,
                   facts: list[tuple[str, str]], methods: list[dict],
                   calls_cover: str = "") -> PageOf:
    """Write the timeline of the events at ``rows`` (positions, in time order),
    PAGE_ROWS rows a page: a small HTML page each, the call graph on the first, and
    the page's rows as a data file beside it (`ctracer.report.timeline`); return
    where each row is, for links to it."""
    count = max(1, -(-len(rows) // PAGE_ROWS))
    files = [page_file_of(i) for i in range(count)]
    page_of = PageOf(site, rows, files)
    graph_svg, graph_note = graph_for(site, directory, rows, files)
    views = views_for(site, directory, rows, files)
    states = RunningState(site, show_object)
    objects = site.object_cell if show_object else None
    os.makedirs(os.path.join(site.out_dir, directory), exist_ok=True)
    index_file = write_pages_index(site, directory, rows, files) if count > 1 else ""
    for number in range(count):
        chunk = rows[number * PAGE_ROWS:(number + 1) * PAGE_ROWS]
        data = site.timeline.page(chunk, use_object_depth=use_object_depth,
                                  objects=objects,
                                  state=states.page_start(chunk, number + 1 < count))
        rows_file, text = rows_file_of(number), data_file_text(data)
        rows_inline = script_safe(text) if count == 1 else None
        if rows_inline is not None and len(rows_inline) > INLINE_ROWS_CHARS:
            rows_inline = None
        if rows_inline is None:
            with open(os.path.join(site.out_dir, directory, rows_file), "w",
                      encoding="utf-8") as f:
                f.write(text)
                let_go(f)
        site.write(f"{directory}/{files[number]}", "timeline.html", title=title,
                   heading=heading, rows_file=rows_file,
                   rows_inline=Markup(rows_inline) if rows_inline else None,
                   page_number=number + 1,
                   page_files=files, first_page=number == 0, show_object=show_object,
                   graph_svg=graph_svg, graph_note=graph_note, views=views,
                   facts=facts, methods=methods, calls_cover=calls_cover,
                   total_rows=len(rows),
                   page_rows=PAGE_ROWS, page_count=len(chunk), index_file=index_file)
    return page_of


def write_pages_index(site: ReportSite, directory: str, rows: np.ndarray, files: list[str]) -> str:
    """Write the index of a paged timeline's pages (what each holds: the page script
    finds rows on every page with it); return its file name."""
    pages = []
    for number, page in enumerate(files):
        summary = site.timeline.page_summary(rows[number * PAGE_ROWS:(number + 1) * PAGE_ROWS])
        pages.append(dict(summary, page=page, rows=rows_file_of(number)))
    with open(os.path.join(site.out_dir, directory, PAGES_FILE), "w", encoding="utf-8") as f:
        f.write(pages_file_text(pages))
        let_go(f)
    return PAGES_FILE


def note_unreadable_pages(site: ReportSite, objects: list[int]) -> None:
    """Where each unreadable row of these objects' timelines is (the index links
    them), known before the pages are written, possibly by another process."""
    ev = site.data.events
    for o in objects:
        rows = site.data.objects.events(o)
        for i in np.flatnonzero(ev.unreadable[rows]).tolist():
            site.page_file[int(ev.seq[rows[i]])] = page_file_of(i // PAGE_ROWS)


class PageOf:
    """Which page of a timeline an event is on, for links to its row: a row something
    links to (it changed fields, or could not be read) by its page file, any other
    'index.html'.  Looked up per link: a dict of every linked row of ten million
    events would be hundreds of megabytes."""

    def __init__(self, site: ReportSite, rows: np.ndarray, files: list[str]):
        self.site, self.rows, self.files = site, rows, files

    def pages(self, events: np.ndarray) -> list[str]:
        """The page file of each event at positions ``events``."""
        rows = self.rows
        if not len(rows) or not len(events):
            return ["index.html"] * len(events)
        i = np.searchsorted(rows, events)
        found = rows[np.minimum(i, len(rows) - 1)] == events
        tl, ev = self.site.timeline, self.site.data.events
        linked = found & ((tl.change_end[events] > tl.change_start[events])
                          | ev.unreadable[events])
        files = self.files + ["index.html"]
        return [files[k] for k in np.where(linked, i // PAGE_ROWS, len(self.files)).tolist()]
