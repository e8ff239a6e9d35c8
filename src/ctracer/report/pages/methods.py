"""The methods page: per-method call counts and durations, a plot per method.
"""

from __future__ import annotations

import os
from ctracer.report import plots as plotting
from ctracer.report.pages.site import METHODS_DIR, ReportSite


def write_methods(site: ReportSite) -> None:
    """The methods page: per method its calls and times, with duration plots and the calls
    bar chart."""
    rows = site.method_rows(site.data.methods)
    for stats in site.data.methods.values() if site.plots else ():
        if len(stats.durations):
            site.plot_jobs.append(plotting.DurationPlot(
                os.path.join(site.out_dir, METHODS_DIR,
                             f"{site.function_stem[stats.function_id]}.png"),
                f"{stats.name}: {len(stats.durations)} timed calls",
                stats.call_times, stats.durations))
    bars = [(r["name"], r["calls"]) for r in rows if r["calls"]][:40] if site.plots else []
    if bars:
        site.plot_jobs.append(plotting.CallCountPlot(
            os.path.join(site.out_dir, METHODS_DIR, "calls.png"),
            " and ".join(site.count_words) + " per method"
            + (" (40 busiest)" if len(rows) > 40 else ""), bars,
            " / ".join(site.count_words)))
    called = {s.function_id for s in site.data.methods.values() if s.calls}
    canonical = site.data.canonical
    functions = [{"name": site.names.get(f.id, f.name), "route_kind": f.route_kind,
                  "route_text": f.route_text,
                  "unit": f.unit, "attached": f.attached,
                  "called": canonical.get(f.id, f.id) in called}
                 for f in site.data.summary.functions]
    site.write(f"{METHODS_DIR}/index.html", "methods.html", title="methods",
               heading=f"{site.struct_title}: methods", methods=rows,
               functions=functions, has_bars=bool(bars),
               calls_cover=site.calls_cover(site.data.methods))
