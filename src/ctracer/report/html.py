"""Writes the report tree: HTML pages (Jinja2, autoescaped), SVG call graphs and PNG plots.

Layout under the output directory (``callgraph/<struct>/`` by default)::

    index.html                 the trace summary and every object, drawn by its script
    objects.js                 the object list index.html draws (`ctracer.report.index_data`)
    <object>/index.html        call graph and the first page of the call timeline
    <object>/timeline-N.html   further timeline pages (long timelines are split)
    <object>/rows-N.js         the rows of timeline page N, drawn by the page's script
                               (a short timeline of one page carries them itself)
    <object>/pages.js          what each page of a paged timeline holds (to search them all)
    <object>/changes.html      every field: unchanged, or each change old → new
    <object>/<field>.png       each field that changed, over time
    <object>/callgraph.svg
    many_objects/...           the same pages for all objects interleaved
    methods/index.html         per-method call counts and durations, a plot per method
    _static/                   CSS and JS (no network, pages open from file://)

Objects are named by address (``0x55d0c0a0``), plus ``-2``, ``-3``... for later lifetimes
of a reused address.  Every name read from the trace reaches pages only through Jinja2
autoescaping, and reaches file names only through `ctracer.report.names`.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ctracer import __version__
from ctracer import analysis
from ctracer.analysis.memory import helpers_within_limit, release_free_memory
from ctracer.errors import CtracerError, OutputError
from ctracer.files import check_marked_dir, marker_lines, private_files, write_marker
from ctracer.report import plots as plotting
from ctracer.report.helpers import HelpersStopped, run_in_helpers
from ctracer.report.names import safe_component
from ctracer.report.pages import graphs, index, methods, objects, timeline
from ctracer.report.pages.site import (
    DEFAULT_PLOT_OBJECTS, MARKER, MAX_PLOTS_PER_PAGE, MIN_CHANGES_TO_PLOT, STATIC_DIR,
    ReportSite, template_environment)


class OutputDirError(OutputError):
    """The output directory exists and holds something other than a ctracer report."""


@dataclass
class RenderResult:
    """What a render wrote: the report's directory and index page, the objects rendered
    of all, the events, the time of each step and notes for the user."""

    out_dir: str
    index: str
    objects_total: int
    objects_rendered: int
    events: int
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    counts: str = ""  # the counts line every page shows


def _prepare(out_dir: str, trace_id: str) -> None:
    """Make ``out_dir`` empty, replacing a previous report but nothing else; its marker
    says the report is being written (`_finish` names the trace once it is complete:
    a render killed half-way, out of memory, leaves no report `report_trace_id` finds)."""
    try:
        check_marked_dir(out_dir, MARKER, "ctracer report")
    except OutputError as e:
        raise OutputDirError(str(e)) from None
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        shutil.rmtree(out_dir)
    _write_marker(out_dir, f"{_MARKER_UNFINISHED}{trace_id}")


def _finish(out_dir: str, trace_id: str) -> None:
    """Mark the report in ``out_dir`` complete: its marker names its trace."""
    _write_marker(out_dir, f"{_MARKER_TRACE}{trace_id}")


def _write_marker(out_dir: str, line: str) -> None:
    """The marker, replaced whole (a reader never sees half of it)."""
    write_marker(out_dir, MARKER + ".new", [f"written by ctracer {__version__}; this "
                                           "directory is replaced on re-render", line])
    os.replace(os.path.join(out_dir, MARKER + ".new"), os.path.join(out_dir, MARKER))


def is_unfinished(out_dir: str) -> bool:
    """The report in ``out_dir`` was begun and never finished (its render was killed)."""
    return any(line.startswith(_MARKER_UNFINISHED)
               for line in marker_lines(out_dir, MARKER))


def mark_killed(out_dir: str, why: str) -> None:
    """Write an index.html that says the render of the unfinished report in ``out_dir``
    was killed (``why``), in place of whatever it had written."""
    if not is_unfinished(out_dir):
        return
    text = template_environment().get_template("stopped.html").render(
        why=f"This report is incomplete: {why}. Render the trace again.",
        version=__version__)
    staged = os.path.join(out_dir, "index.html.new")
    with open(staged, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(staged, os.path.join(out_dir, "index.html"))


#: the marker's line naming the trace a report was rendered from
_MARKER_TRACE = "trace_id "
#: the marker's line while the report is being written
_MARKER_UNFINISHED = "unfinished, rendering "


def report_trace_id(out_dir: str) -> Optional[str]:
    """The id of the trace (`Trace.trace_id`) the report in ``out_dir`` was rendered
    from; None where there is no report, or one that does not say."""
    return next((line[len(_MARKER_TRACE):].strip() for line in marker_lines(out_dir, MARKER)
                 if line.startswith(_MARKER_TRACE)), None) or None




def copy_static(out_dir: str) -> None:
    """The report's CSS and JS into ``out_dir/_static/`` (no network needed)."""
    from importlib import resources

    target = os.path.join(out_dir, STATIC_DIR)
    os.makedirs(target, exist_ok=True)
    for entry in resources.files("ctracer.report").joinpath("static").iterdir():
        if entry.is_file():
            with open(os.path.join(target, entry.name), "wb") as f:
                f.write(entry.read_bytes())









#: below this many objects helper processes cost more than they save
HELPER_MIN_OBJECTS = 200
#: ...or this many PNG plots
HELPER_MIN_PLOTS = 40
#: objects a helper takes at a time (small enough that the two finish together)
OBJECTS_PER_TASK = 25



#: the site a forked helper works on (inherited from the parent, never copied)
_helper_site: Optional[ReportSite] = None


def _run_task(task: tuple) -> float:
    """Write one part of the report and draw its plots (in a helper or here); return the
    seconds spent drawing plots."""
    site = _helper_site
    assert site is not None
    kind = task[0]
    if kind == "all":
        objects.write_all_objects(site)
        release_free_memory()  # its every-event temporaries, before the objects' tasks
    elif kind == "methods":
        methods.write_methods(site)
    else:
        for obj in task[1]:
            objects.write_object(site, obj)
    mark = time.perf_counter()
    jobs, site.plot_jobs = site.plot_jobs, []
    plotting.draw_here(jobs, site.layout)
    return time.perf_counter() - mark


def _write_pages(site: ReportSite, chosen: list[int], workers: int,
                 say: Callable[[str], None]) -> float:
    """Every page but the index, with its plots: the all-objects pages, the methods page
    and the object pages in tasks shared by ``workers`` forked helpers (they inherit the
    report data; the busiest task first); return the seconds spent on plots (summed over
    the helpers).  `HelpersStopped` when Ctrl-C or a helper's death ends it early."""
    global _helper_site
    tasks: list[tuple] = [("all",), ("methods",)]
    tasks += [("objects", chosen[i:i + OBJECTS_PER_TASK])
              for i in range(0, len(chosen), OBJECTS_PER_TASK)]
    _helper_site = site
    _tasks_of_helpers[:] = tasks
    try:
        small = len(chosen) < HELPER_MIN_OBJECTS and _expected_plots(site) < HELPER_MIN_PLOTS
        if workers < 2 or small or not hasattr(os, "fork"):
            plots = 0.0
            for done, task in enumerate(tasks):
                try:
                    plots += _run_task(task)
                except KeyboardInterrupt:
                    raise HelpersStopped("interrupted", done, len(tasks), 2) from None
                say(f"writing pages: {done + 1}/{len(tasks)} done")
            return plots
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        # tasks go by index: the helpers find them in the site they inherited
        return run_in_helpers(_run_indexed, len(tasks), workers, say)
    finally:
        _helper_site = None
        _tasks_of_helpers.clear()


_tasks_of_helpers: list[tuple] = []


def _expected_plots(site: ReportSite) -> int:
    """About how many PNG plots the report will draw (each costs tens of ms)."""
    if not site.plots:
        return 0
    count = sum(1 for m in site.data.methods.values() if len(m.durations))
    lengths = site.data.series_lengths()
    changed = (lengths > 1).any(axis=0).sum() if len(lengths) else 0
    for o in site.plotted:
        count += min(MAX_PLOTS_PER_PAGE, int((lengths[o] > MIN_CHANGES_TO_PLOT).sum()))
    return count + min(MAX_PLOTS_PER_PAGE, int(changed))


def _run_indexed(index: int) -> float:
    return _run_task(_tasks_of_helpers[index])


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its helpers that have ended."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@private_files  # the report holds addresses, argv and traced strings: 0600 files, 0700 dirs
def render(trace_path: str, out_dir: Optional[str] = None, *,
           max_objects: Optional[int] = None, plots: bool = True,
           plot_objects: Optional[int] = DEFAULT_PLOT_OBJECTS,
           progress: Optional[Callable[[str], None]] = None) -> RenderResult:
    """Render a trace file into a report directory (see the module docstring).  Every
    object gets its pages unless ``max_objects`` limits them to the busiest; PNG plots
    are drawn for the ``plot_objects`` objects with most changes (None or 0: all), and
    none without ``plots`` (pages then list changes and plot them in the browser)."""
    say = progress or (lambda _msg: None)
    clock, cpu = time.perf_counter(), _cpu_seconds()
    seconds: dict[str, float] = {}
    trace = analysis.open_trace(trace_path)
    site: Optional[ReportSite] = None
    try:
        if out_dir is None:
            out_dir = os.path.join("callgraph", safe_component(trace.struct_name, "struct"))
        trace_id = trace.trace_id
        _prepare(out_dir, trace_id)
        try:
            data = analysis.load(trace, say, spill_dir=out_dir)  # big arrays mapped there
            trace.close()
            seconds["model"] = time.perf_counter() - clock
            seconds["model_cpu"] = _cpu_seconds() - cpu

            site = ReportSite(data, out_dir, plots)
            n = len(data.objects)
            ts, rows = data.events.ts_ns, data.objects
            counts = rows.event_counts()
            first_ns = [int(ts[rows.events(o)[0]]) for o in range(n)]
            chosen = list(range(n))
            if max_objects is not None and 0 < max_objects < n:
                busiest = sorted(chosen, key=lambda o: (-counts[o], first_ns[o]))
                keep = set(busiest[:max_objects])
                chosen = [o for o in chosen if o in keep]
                site.notes.append(
                    f"pages were written for the {max_objects} busiest of {n} "
                    "objects (--max-objects); all of them are in many_objects/")
            site.rendered = set(chosen)
            changes = rows.change_counts()
            most_changed = sorted(chosen, key=lambda o: (-changes[o], first_ns[o]))
            site.plotted = set(most_changed if not plot_objects else most_changed[:plot_objects])
            if plots and len(site.plotted) < len(chosen):
                site.notes.append(
                    f"PNG plots were drawn for the {len(site.plotted)} objects with most "
                    "changes (--plot-objects); every object's changes page plots its fields "
                    "interactively")
            copy_static(out_dir)
            mark = time.perf_counter()
            ev = data.events
            graphs.prepare_graphs(site, chosen)
            say(f"laying out {len(site.graphs)} call graphs")
            graphs.layout_graphs(site)
            seconds["graphs"] = time.perf_counter() - mark
            mark, cpu = time.perf_counter(), _cpu_seconds()
            timeline.note_unreadable_pages(site, chosen)
            # under a memory limit, only as many helpers as it has room for
            most = int(counts[chosen].max()) if chosen else 0  # the busiest object's events
            workers = helpers_within_limit(min(os.cpu_count() or 1, 2), most, len(data.events))
            seconds["plots"] = _write_pages(site, chosen, workers, say)
        except KeyboardInterrupt:
            raise _incomplete(out_dir, site, HelpersStopped("interrupted", 0, 0, 2)) from None
        except HelpersStopped as stopped:
            raise _incomplete(out_dir, site, stopped) from None
        index.write_index(site, n)
        _finish(out_dir, trace_id)
        seconds["html"] = time.perf_counter() - mark
        seconds["html_cpu"] = _cpu_seconds() - cpu
    finally:
        trace.close()
    seconds["total"] = time.perf_counter() - clock
    return RenderResult(out_dir, os.path.join(out_dir, "index.html"), n,
                        len(chosen), len(data.events), seconds, site.notes,
                        data.counts.line() if data.counts else "")


class RenderIncomplete(CtracerError):
    """The report was left incomplete (its index says so): Ctrl-C (``prefix``
    "interrupted", exit 130) or a helper process that died (exit 1)."""

    def __init__(self, message: str, signal_number: Optional[int]):
        super().__init__(message)
        if signal_number:
            self.prefix, self.exit_status = "interrupted", 128 + signal_number


def _incomplete(out_dir: str, site: Optional[ReportSite], stopped: HelpersStopped) -> RenderIncomplete:
    """Mark the report in ``out_dir`` incomplete (its index.html says why and how far it
    got; the full index when the report's data was built) and the one-line error."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the page is written first
    try:
        how = "Ctrl-C or SIGTERM" if stopped.signal_number else stopped.why
        parts = f" after {stopped.done} of {stopped.total} parts of its pages" if stopped.total else ""
        why = (f"This report is incomplete: rendering was stopped ({how}){parts}, so "
               "pages linked from here may be missing. Render the trace again for all of them.")
        if site is not None:
            index.write_index(site, len(site.data.objects), incomplete=why)
        else:
            text = template_environment().get_template("stopped.html").render(
                why=why.replace(", so pages linked from here may be missing", ""),
                version=__version__)
            with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
                f.write(text)
    finally:
        signal.signal(signal.SIGINT, previous)
    written = (f"{stopped.done} of {stopped.total} parts of its pages written; "
               if stopped.total else "")
    hint = "" if stopped.signal_number else (
        "; if memory ran out, try --max-objects N (pages for the N busiest objects only), "
        "--no-plots, or more memory")
    return RenderIncomplete(f"{'' if stopped.signal_number else stopped.why + ': '}the "
                            f"report in {out_dir} is incomplete ({written}its index.html "
                            f"says so){hint}", stopped.signal_number)
