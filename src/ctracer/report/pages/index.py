"""The report's index page: the trace summary and the object list its script draws.
"""

from __future__ import annotations

import os
import numpy as np

from ctracer.event import PHASE_ENTRY
from ctracer.report import summaries
from ctracer.report.index_data import OBJECTS_FILE, objects_data, objects_file_text
from ctracer.report.probe_failures import failed_functions
from ctracer.report.values import format_duration, format_offset
from ctracer.report.pages.site import MAX_LISTED, ReportSite


def write_index(site: ReportSite, objects_total: int, incomplete: str = "") -> None:
    """The index; ``incomplete`` says why the report lacks pages (Ctrl-C, a helper
    that died), shown first."""
    data, start = site.data, site.data.start_ns
    ev = data.events
    columns = summaries.columns_for(data.summary.struct_name,
                                    [f.name for f in site.layout.fields],
                                    site.summary_fields)
    counts, changes = data.objects.event_counts(), data.objects.change_counts()
    changed_fields = (data.series_lengths() > 1).sum(axis=1)
    calls = data.object_calls().tolist()
    objects = []
    for o in range(len(data.objects)):
        rows = data.objects.events(o)
        seen = summaries.Seen.of(data, o, calls[o])
        objects.append({
            "label": data.objects.labels[o],
            "dir": data.objects.dirnames[o] if o in site.rendered else "",
            "lifetime": data.objects.keys[o].lifetime, "began": data.objects.started_by[o],
            "first": format_offset(int(ev.ts_ns[rows[0]]) - start),
            "last": format_offset(int(ev.ts_ns[rows[-1]]) - start),
            "events": int(counts[o]),
            **site.calls_and_hits(data.object_methods(o)),
            "changes": int(changes[o]), "fields": int(changed_fields[o]),
            "summary": summaries.summary(seen, columns, site.fmt),
        })
    with open(os.path.join(site.out_dir, OBJECTS_FILE), "w", encoding="utf-8") as f:
        f.write(objects_file_text(objects_data(objects, [c.name for c in columns],
                                               site.count_words)))
    route_kind_counts: dict[str, int] = {}
    for f in data.summary.functions:
        route_kind_counts[f.route_kind] = route_kind_counts.get(f.route_kind, 0) + 1
    distinct = len({(f.name, f.unit, f.address) for f in data.summary.functions})
    duration = (int(ev.ts_ns[-1]) - start) if len(ev) else 0
    unreadable = []
    for at in np.flatnonzero(ev.unreadable)[:MAX_LISTED].tolist():
        o = int(ev.object[at])
        seq = int(ev.seq[at])
        unreadable.append({
            "time": format_offset(int(ev.ts_ns[at]) - start),
            "object": data.objects.labels[o] if o >= 0 else "",
            "function": data.function_name(int(ev.function[at])),
            "phase": "entry" if ev.phase[at] == PHASE_ENTRY else "exit",
            "href": (f"{data.objects.dirnames[o]}/{site.page_file.get(seq, 'index.html')}"
                     f"#e{seq}" if o in site.rendered else "")})
    watch = data.meta.watch
    site.write("index.html", "index.html", title=site.struct_title,
               watch_line=_watch_summary(watch) if isinstance(watch, dict) else "",
               unreadable=unreadable, max_listed=MAX_LISTED,
               heading=site.struct_title, objects_file=OBJECTS_FILE,
               rendered=len(site.rendered), objects_total=objects_total,
               route_kind_counts=sorted(route_kind_counts.items()), data=data,
               function_count=distinct,
               trace_span=format_duration(duration) or "0 ns",
               mini_fields=site.layout.fields, notes=site.notes,
               incomplete=incomplete, summary_columns=[c.name for c in columns],
               failed_functions=failed_functions(data.summary.failed_probes),
               trace_name=os.path.basename(data.summary.trace_path),
               calls_cover=site.calls_cover(data.methods))


def _watch_summary(watch: dict) -> str:
    """The recording's ``--watch`` line (`ctracer.record.watcher.summary_line`), less its
    leading word."""
    from ctracer.record.watcher import summary_line
    try:
        return summary_line(watch).split(": ", 1)[1]
    except (KeyError, TypeError, IndexError):
        return ""
