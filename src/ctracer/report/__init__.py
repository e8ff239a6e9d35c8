"""The report stage: turns a trace file into HTML call graphs, change pages and plots.

It reads only the analysis of the trace (`ctracer.analysis.load`: objects and their
lifetimes, timelines of paired calls, field changes, method statistics, as columns), so
a trace recorded on one machine renders on another.  Its modules:

* `values` — how a field value is shown (enum names, hex pointers, chars);
* `timeline` — the timeline pages' rows as data files for the browser;
* `summaries`, `index_data` — what names each object in the index, and its list;
* `callgraph_svg` — call graphs (networkx) laid out to SVG by graphviz;
* `plots` — matplotlib PNGs of fields over time and of method durations;
* `html` — Jinja2 templates (autoescaped) and static files, written under
  ``callgraph/<struct>/``.

Use `render_report`; heavy libraries are imported only when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    from ctracer.report.html import RenderResult


def render_report(trace_path: str, out_dir: Optional[str] = None, *,
                  max_objects: Optional[int] = None, plots: bool = True,
                  plot_objects: Optional[int] = 10,
                  progress: Optional[Callable[[str], None]] = None) -> "RenderResult":
    """Render the trace at ``trace_path`` into ``out_dir`` (default
    ``callgraph/<struct>`` under the current directory) and say what was written."""
    from ctracer.report.html import render

    return render(trace_path, out_dir, max_objects=max_objects, plots=plots,
                  plot_objects=plot_objects, progress=progress)
