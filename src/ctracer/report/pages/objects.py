"""The pages of one object (timeline, changes) and of all objects together.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ctracer.report import plots as plotting
from ctracer.report.values import format_duration, format_offset
from ctracer.report.pages.site import ALL_DIR, MIN_CHANGES_TO_PLOT, ReportSite
from ctracer.report.pages.timeline import write_timeline
from ctracer.report.pages.changes import changes_page


def write_object(site: ReportSite, o: int) -> None:
    """The pages of object ``o``: its timeline, its changes and its plots."""
    a = site.data
    d, label = a.objects.dirnames[o], a.objects.labels[o]
    start = a.start_ns
    rows = a.objects.events(o)
    first_ns, last_ns = int(a.events.ts_ns[rows[0]]), int(a.events.ts_ns[rows[-1]])
    series = _ObjectSeries(a, o)
    changed = [name for name, n in series.lengths.items() if n > 1]
    methods = a.object_methods(o)
    changes = a.objects.changes(o)
    facts = [
        ("lifetime", a.objects.started_by[o]),
        ("first seen", f"{format_offset(first_ns - start)} ms"),
        ("last seen", f"{format_offset(last_ns - start)} ms"),
        ("observed for", format_duration(last_ns - first_ns) or "0 ns"),
        ("events", str(len(rows))),
        *((word, str(n)) for word, n in site.calls_and_hits(methods).items()),
        ("field changes", f"{len(changes)} in {len(changed)} fields"),
        ("thread ids", ", ".join(str(t) for t in a.threads(o))),
    ]
    if a.objects.unreadable[o]:
        facts.append(("unreadable snapshots", str(int(a.objects.unreadable[o]))))
    if a.objects.head_only[o]:
        facts.append(("read in part", f"{int(a.objects.head_only[o])} events read only "
                      f"{site.head.get('member') or 'the head'}, the other fields not "
                      f"read: {site.head.get('rule') or ''}"))
    page_of = write_timeline(site, 
        d, rows, title=label, heading=f"{site.struct_title} {label}",
        use_object_depth=True, show_object=False,
        facts=facts, methods=site.method_rows(methods), calls_cover=site.calls_cover(methods))
    plots = {}
    if o in site.plotted:
        plots = {name: plotting.DrawnLater(1, series.plotted(name, label, last_ns - start))
                 for name, n in series.lengths.items() if n > MIN_CHANGES_TO_PLOT}
    values = {name: site.timeline.value(name, value)
              for name, value in a.first_values(o).items()}
    changes_page(site, d, label, f"{site.struct_title} {label}", changes,
                      page_of, plots, show_object=False, values=values,
                      live=o, live_series=series,
                      writes_of=site.writes.of_object(o) if site.writes is not None
                      else None)


class _ObjectSeries:
    """Object ``o``'s field series (`Analysis.series`) by field name, each made when
    read and not kept: an object of a kernel trace has millions of changes, and every
    field's series at once as Python values was gigabytes.  ``lengths``: each field's
    number of points, known without making them."""

    def __init__(self, a, o: int):
        self.a, self.o = a, o
        nf = len(a.layout.fields)
        self.lengths: dict[str, int] = {}
        if a.objects.first_snapshot[o] < 0:
            return
        counts = np.bincount(a.changes.field[a.objects.changes(o)], minlength=nf)[:nf]
        known = a.objects.initial_known[o]
        for j, f in enumerate(a.layout.fields):
            n = int(counts[j])
            self.lengths[f.name] = 1 + n if known[j] else max(n, 1)

    def items(self):
        for name in self.lengths:
            yield name, self.a.series(self.o, [name])[name]

    def plotted(self, name: str, label: str, end_ns: int) -> Callable[[list], None]:
        """What makes the field's plot series when it is drawn."""
        def made(series: list) -> None:
            times, values = self.a.series(self.o, [name])[name]
            series.append(plotting.Series(label, times, values, end_ns))
        return made


def write_all_objects(site: ReportSite) -> None:
    """The timeline of all objects together."""
    a = site.data
    changes = a.changes_by_seq()
    n_objects = len(a.objects)
    facts = [("objects", str(n_objects)), ("events", str(len(a.events))),
             ("field changes", str(len(changes)))]
    page_of = write_timeline(site, 
        ALL_DIR, np.arange(len(a.events)), title="all objects",
        heading=f"{site.struct_title}: all objects", use_object_depth=False,
        show_object=True, facts=facts, methods=site.method_rows(a.methods),
        calls_cover=site.calls_cover(a.methods))
    series, values = strips(site)
    plotted = f"{n_objects} objects, one strip each"
    changes_page(site, ALL_DIR, "all objects", f"{site.struct_title}: all objects",
                      changes, page_of, series, show_object=True,
                      plot_title=plotted, values=values)


def strips(site: ReportSite) -> tuple[dict[str, plotting.Strips], dict[str, str]]:
    """The all-objects strip plots' series, one strip per object whose field
    changed, on time since the object was first seen (readable at thousands of
    objects, where lines over absolute time are not), only every n-th object's
    beyond `plotting.MAX_STRIPS`; and what each field held first across objects."""
    a = site.data
    fields = [f.name for f in site.layout.fields]
    lengths = a.series_lengths()
    found: list[tuple[int, int, np.ndarray]] = []  # (first object, field, objects)
    for j in range(len(fields)):
        changed = np.flatnonzero(lengths[:, j] > 1) if len(lengths) else []
        if len(changed):
            found.append((int(changed[0]), j, changed))
    series: dict[str, plotting.Strips] = {}  # fields in order of first appearance
    ts = a.events.ts_ns

    def fill(name: str, drawn: list[int]) -> Callable[[plotting.Strips], None]:
        def made(strips: plotting.Strips) -> None:  # when drawn: one field at a time
            for o in drawn:
                rows = a.objects.events(o)
                first_ns, last_ns = int(ts[rows[0]]), int(ts[rows[-1]])
                first = first_ns - a.start_ns
                found = a.series(o, [name]).get(name)
                if found is None:
                    continue
                times, vals = found
                strips.append(plotting.Series(
                    a.objects.labels[o], np.asarray(times, np.int64) - first, vals,
                    last_ns - first_ns))
        return made

    for _, j, changed in sorted(found, key=lambda f: f[:2]):
        drawn = changed[::plotting.Strips.sampling(len(changed))].tolist()
        series[fields[j]] = plotting.Strips(len(changed), fill(fields[j], drawn))
    firsts: dict[str, set[str]] = {name: set() for name in fields}
    for o in range(len(a.objects)):
        for name, value in a.first_values(o).items():
            firsts[name].add(site.timeline.value(name, value))
    values = {name: (next(iter(seen)) if len(seen) == 1 else
                     f"{len(seen)} values across objects" if seen else "")
              for name, seen in firsts.items()}
    return series, values
