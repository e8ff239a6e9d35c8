"""Changes pages: every field of an object (or all objects), unchanged or each change
old → new, the fields' plots (PNG jobs and the browser's plot data) and ``--watch``
writes.
"""

from __future__ import annotations

import os
from dataclasses import field
from typing import Any, Optional
from urllib.parse import urlencode

from markupsafe import Markup, escape

import numpy as np

from ctracer.analysis.writes import field_writers as watched_writers
from ctracer.analysis.model import CAUSE_CALLER, CAUSES
from ctracer.report import plots as plotting
from ctracer.report.pages.site import (CHANGE_ROWS_PER_PAGE, LIVE_POINTS, MAX_PLOTS_PER_PAGE,
                                       MIN_CHANGE_ROWS_PER_FIELD, ReportSite, json_island)
from ctracer.report.pages.timeline import PageOf


def fields_to_draw(series: dict[str, list[Any]], by_field: dict[str, Any]) -> set[str]:
    """The fields a changes page draws PNGs of: those with something to plot, most
    objects first (all-objects pages), then most changes, at most MAX_PLOTS_PER_PAGE."""
    candidates = [name for name in series if len(by_field.get(name, ()))]
    candidates.sort(key=lambda name: (-plotting.objects_in(series[name]),
                                      -len(by_field[name])))
    return set(candidates[:MAX_PLOTS_PER_PAGE])


# change rows as plain format strings, every argument escaped (as timeline rows are)


#: time, object cell, old, new, cause, then the timeline row's page, anchor letter, seq
#: writes a watched field's section lists (the rest are in the exports)


WRITE_ROWS_PER_FIELD = 200


_CHANGE_ROW = ('<tr><td class="num">{}</td>{}<td class="mono value">{} → {}'
               '</td><td>{}</td><td><a href="{}#{}{}">timeline row</a></td></tr>\n')


_CHANGE_OBJECT = '<td class="mono object"><a href="{}">{}</a></td>'


_CHANGE_OBJECT_PLAIN = '<td class="mono object">{}</td>'


def changes_page(site: ReportSite, directory: str, title: str, heading: str,
                 changes: np.ndarray, page_of: PageOf,
                 series: dict[str, list[plotting.Series]], show_object: bool,
                 plot_title: Optional[str] = None,
                 values: Optional[dict[str, str]] = None,
                 live: Optional[int] = None,
                 live_series: Optional[dict[str, tuple[list, list]]] = None,
                 writes_of: Optional[list[int]] = None) -> None:
    """The changes page of the changes at ``changes`` (in the order listed);
    ``values`` shows what unchanged fields hold, ``live`` is the object whose fields
    get the interactive plot (``live_series``: its series)."""
    fields_of = site.data.changes.field[changes]
    present, first = np.unique(fields_of, return_index=True)
    by_field = {site.layout.fields[j].name: changes[fields_of == j]
                for j in present[np.argsort(first, kind="stable")].tolist()}
    drawn = fields_to_draw(series, by_field) if site.plots else set()
    live_data = live_plot_data(site, live, live_series or {}) if live is not None else {}
    per_field = max(MIN_CHANGE_ROWS_PER_FIELD,
                    CHANGE_ROWS_PER_PAGE // max(1, len(by_field)))
    empty = changes[:0]
    found_of = [by_field.get(f.name, empty) for f in site.layout.fields]
    rows_of = _change_rows(site, found_of, per_field, page_of, show_object)
    fields = []
    for j, f in enumerate(site.layout.fields):
        found = found_of[j]
        shown = min(len(found), per_field)
        stem = site.field_stem[f.name]
        has_plot = f.name in drawn
        if has_plot:
            kind = plotting.StripPlot if show_object else plotting.FieldPlot
            site.plot_jobs.append(kind(
                os.path.join(site.out_dir, directory, f"{stem}.png"), f.name,
                f"{f.name} — {plot_title or title}", series[f.name]))
        fields.append({"name": f.name, "ctype": f.ctype, "kind": f.kind,
                       "count": len(found), "rows_html": Markup(rows_of[j]),
                       "stem": stem,
                       "has_plot": has_plot, "shown": shown,
                       "omitted": len(found) - shown,
                       "in_timeline": _in_timeline(site, f.name),
                       "value": (values or {}).get(f.name, ""),
                       "live": stem in live_data,
                       "live_of": live_data.get(stem, {}).get("of", 0),
                       **_watched_field(site, f.name, writes_of, show_object)})
    series_json = json_island(live_data) if live is not None else ""
    site.write(f"{directory}/changes.html", "changes.html", title=title, heading=heading,
               series_json=series_json,
               fields=fields, show_object=show_object,
               watched=site.writes.fields if site.writes is not None else [],
               changed=sum(1 for f in fields if f["count"]), drawn=len(drawn),
               left_out=(len(set(series) & set(by_field)) - len(drawn)) if site.plots else 0)


def _watched_field(site: ReportSite, name: str, writes_of: Optional[list[int]],
                   show_object: bool) -> dict:
    """A watched field's writers and first writes, for its changes page section."""
    view = site.writes
    if view is None or name not in view.fields:
        return {"watched": False}
    chosen = [i for i in (range(len(view.writes)) if writes_of is None else writes_of)
              if view.writes[i].field == name]
    writers = [{"label": w.label, "writes": w.writes, "changed": w.changed,
                "unchanged": w.unchanged, "stack": " → ".join(
                    reversed(view.callers(w.example)))}
               for w in watched_writers(view, name, chosen)]
    start, labels = site.data.start_ns, site.data.objects.labels
    rows = []
    for i in chosen[:WRITE_ROWS_PER_FIELD]:
        w, o = view.writes[i], view.object_of[i]
        rows.append({"ms": f"{(w.ts_ns - start) / 1e6:.6f}",
                     "object": labels[o] if show_object and o >= 0 else "",
                     "old": "?" if w.old is None else site.timeline.value(name, w.old),
                     "new": "?" if w.value is None else site.timeline.value(name, w.value),
                     "unchanged": w.unchanged, "writer": view.writer_label(i),
                     "stack": " → ".join(reversed(view.callers(i))),
                     "cpu": w.cpu, "tid": w.tid})
    return {"watched": True, "writers": writers, "writes": rows,
            "write_count": len(chosen),
            "unchanged_count": sum(1 for i in chosen if view.writes[i].unchanged)}


def _change_rows(site: ReportSite, found_of: list[np.ndarray], per_field: int, page_of: PageOf,
                 show_object: bool) -> list[str]:
    """Per field, the HTML rows of its first ``per_field`` changes of ``found_of``
    (the columns gathered once for the page, not per field)."""
    a = site.data
    ch, ev = a.changes, a.events
    shown = [found[:per_field] for found in found_of]
    ends = np.cumsum([len(k) for k in shown]).tolist()
    picked = np.concatenate(shown) if shown else np.zeros(0, np.int64)
    at = ch.event[picked]
    caller = CAUSES.index(CAUSE_CALLER)
    rendered, labels, dirnames = site.rendered, a.objects.labels, a.objects.dirnames
    times = ((ev.ts_ns[at] - a.start_ns) / 1e6).tolist()  # as `format_offset` has it
    items: list[str] = []
    row, shown_html, cause_html = _CHANGE_ROW.format, site.shown_html, site.cause_html
    j, end = 0, ends[0] if ends else 0
    for n, (k, page, seq, ms, o, old, new, cause, fid, seen) in enumerate(zip(
            picked.tolist(), page_of.pages(at), ev.seq[at].tolist(), times,
            ev.object[at].tolist(), ch.old[picked].tolist(), ch.new[picked].tolist(),
            ch.cause[picked].tolist(), ch.function[picked].tolist(),
            ev.function[at].tolist())):
        while n >= end:
            j += 1
            end = ends[j]
        cell = ""
        if show_object:
            label = labels[o]
            stem = site.field_stem[site.layout.fields[j].name]
            href = f"../{dirnames[o]}/changes.html#f-{stem}" if o in rendered else ""
            cell = (_CHANGE_OBJECT.format(escape(href), escape(label)) if href
                    else _CHANGE_OBJECT_PLAIN.format(escape(label)))
        # the link is made of our own file names and numbers: nothing to escape
        items.append(row(f"{ms:.6f}", cell, shown_html(j, old), shown_html(j, new),
                         cause_html(k, cause, fid, seen), page,
                         "c" if cause == caller else "e", seq))
    out, at_row = [], 0
    for end in ends:
        out.append("".join(items[at_row:end]))
        at_row = end
    return out


def _in_timeline(site: ReportSite, field: str) -> str:
    """The link to a timeline filtered to rows changing ``field``."""
    link = site._timeline_links.get(field)
    if link is None:
        link = site._timeline_links[field] = "index.html#" + urlencode(
            {"field": field, "changed": "1"})
    return link


def live_plot_data(site: ReportSite, o: int,
                   series: dict[str, tuple[list, list]]) -> dict[str, dict]:
    """Each changed field of object ``o`` for the browser's plot: times (ms), numbers
    to plot, the values as shown, and tick labels where the values are categories."""
    a = site.data
    start = a.start_ns
    last_ns = int(a.events.ts_ns[a.objects.events(o)[-1]])
    out = {}
    for name, (times, raw) in series.items():
        if len(times) < 2:
            continue
        numbers, ticks = site.fmt.plot_axis(name, raw)
        total = len(times)
        if total > LIVE_POINTS:
            picks = plotting.envelope(numbers, LIVE_POINTS)
            times = [times[i] for i in picks]
            raw = [raw[i] for i in picks]
            numbers, ticks = site.fmt.plot_axis(name, raw)
        out[site.field_stem[name]] = {
            "of": total if total > len(times) else 0,
            "t": [round(t / 1e6, 6) for t in times], "y": numbers,
            "label": [site.timeline.value(name, v) for v in raw],
            "ticks": [[p, label] for p, label in ticks] if ticks else None,
            "end": round((last_ns - start) / 1e6, 6)}
    return out
