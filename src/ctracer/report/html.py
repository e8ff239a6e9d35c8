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
from typing import Any, Callable, Iterable, Optional
from urllib.parse import urlencode

from markupsafe import Markup, escape

import numpy as np

from ctracer import __version__
from ctracer import analysis
from ctracer.analysis import Analysis
from ctracer.analysis.callgraph import CallGraphCounts, call_counts, grouped_call_counts
from ctracer.analysis.memory import helpers_within_limit, release_free_memory
from ctracer.analysis.writes import field_writers as watched_writers
from ctracer.analysis.model import (CAUSE_ANNOUNCED, CAUSE_CALLER, CAUSE_DURING, CAUSES,
                                    MethodStats, counts_per_group)
from ctracer.errors import CtracerError, OutputError
from ctracer.event import PHASE_ENTRY, PHASE_EXIT, PHASE_TRACEPOINT
from ctracer.files import (check_marked_dir, let_go, marker_lines, private_files,
                           write_marker)
from ctracer.report import callgraph_svg as graphs
from ctracer.report import views as interactive_views
from ctracer.report import plots as plotting
from ctracer.report import summaries
from ctracer.report.helpers import HelpersStopped, run_in_helpers
from ctracer.report.jsontext import compact_json, script_safe
from ctracer.report.index_data import OBJECTS_FILE, objects_data, objects_file_text
from ctracer.report.probe_failures import failed_functions
from ctracer.report.names import field_stems, function_stems, safe_component
from ctracer.report.timeline import (PAGES_FILE, TimelineData, _changes_of, data_file_text,
                                     pages_file_text)
from ctracer.report.values import TextMemo, ValueFormatter, format_duration, format_offset

#: rows per timeline page (its data file; the page draws them in screenfuls)
PAGE_ROWS = 20_000
#: a timeline of one page up to this size carries its rows in the page itself (one
#: file fewer per object: creating files is much of a big report's time); bigger ones,
#: and every page of a paged timeline (a search loads the others'), have a data file
INLINE_ROWS_CHARS = 256 * 1024
#: change rows a changes page lists in all, shared among the fields that changed (each
#: lists at least MIN_CHANGE_ROWS_PER_FIELD); the rest of a field's changes are one click
#: away in the timeline filtered by that field, so a page stays well under 2 MB however
#: long the trace or however many objects changed the field
CHANGE_ROWS_PER_PAGE = 4000
MIN_CHANGE_ROWS_PER_FIELD = 20
#: points of a field's interactive plot: past this, each stretch of changes keeps its
#: first, last, lowest and highest value (the step plot's envelope)
LIVE_POINTS = 2000
#: a field gets a PNG plot on an object's page when it changed at least this often
#: (the original ostra-cg's rule); fewer changes read better in the table
MIN_CHANGES_TO_PLOT = 4
#: PNG plots a changes page draws at most: of the fields that changed most (on the
#: all-objects page, in most objects); the others are in the interactive plot and the
#: tables (a struct of 250 fields changes dozens of them: each PNG costs ~80 ms)
MAX_PLOTS_PER_PAGE = 8
#: by default PNG plots are drawn for this many objects, those with most changes; every
#: object's changes page has the interactive plot, drawn by the browser from the page
DEFAULT_PLOT_OBJECTS = 10
#: rows listed where a page lists problems (read failures)
MAX_LISTED = 500
#: the file that says a directory holds a report we wrote (and may replace)
MARKER = ".ctracer-report"
ALL_DIR = "many_objects"
METHODS_DIR = "methods"
STATIC_DIR = "_static"


class OutputDirError(OutputError):
    """The output directory exists and holds something other than a ctracer report."""


@dataclass
class RenderResult:
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


_DICT_METHODS = frozenset(dir(dict))


def template_environment() -> Any:
    """The Jinja2 environment of the report's templates (autoescaped, shipped as
    package data)."""
    import jinja2

    class Environment(jinja2.Environment):
        """Reads ``row.name`` of a dict as its key at once (what Jinja finds too, after
        the AttributeError each dict row raised: ~5% of an object's pages); a name
        dicts have as a method (``items``) still means the method."""

        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and attribute in obj and attribute not in _DICT_METHODS:
                return obj[attribute]
            return super().getattr(obj, attribute)

    env = Environment(
        loader=jinja2.PackageLoader("ctracer.report", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        auto_reload=False)  # package data: no stat of three templates per page
    env.filters["duration"] = format_duration
    env.filters["ms"] = format_offset
    return env


def copy_static(out_dir: str) -> None:
    """The report's CSS and JS into ``out_dir/_static/`` (no network needed)."""
    from importlib import resources

    target = os.path.join(out_dir, STATIC_DIR)
    os.makedirs(target, exist_ok=True)
    for entry in resources.files("ctracer.report").joinpath("static").iterdir():
        if entry.is_file():
            with open(os.path.join(target, entry.name), "wb") as f:
                f.write(entry.read_bytes())


def _page_name(number: int) -> str:
    """The file of timeline page ``number`` (from 0)."""
    return "index.html" if number == 0 else f"timeline-{number + 1}.html"


def _fields_to_draw(series: dict[str, list[Any]], by_field: dict[str, Any]) -> set[str]:
    """The fields a changes page draws PNGs of: those with something to plot, most
    objects first (all-objects pages), then most changes, at most MAX_PLOTS_PER_PAGE."""
    candidates = [name for name in series if len(by_field.get(name, ()))]
    candidates.sort(key=lambda name: (-plotting.objects_in(series[name]),
                                      -len(by_field[name])))
    return set(candidates[:MAX_PLOTS_PER_PAGE])


def _rows_file(number: int) -> str:
    """The data file of timeline page ``number`` (from 0)."""
    return f"rows-{number + 1}.js"


def _json_island(value: Any) -> Markup:
    """JSON to sit inside ``<script type="application/json">``: every ``<``, ``>`` and
    ``&`` escaped, so no string from the trace can close the element."""
    return Markup(script_safe(compact_json(value)))


# change rows as plain format strings, every argument escaped (as timeline rows are)
#: time, object cell, old, new, cause, then the timeline row's page, anchor letter, seq
#: writes a watched field's section lists (the rest are in the exports)
WRITE_ROWS_PER_FIELD = 200

_CHANGE_ROW = ('<tr><td class="num">{}</td>{}<td class="mono value">{} → {}'
               '</td><td>{}</td><td><a href="{}#{}{}">timeline row</a></td></tr>\n')
_CHANGE_OBJECT = '<td class="mono object"><a href="{}">{}</a></td>'
_CHANGE_OBJECT_PLAIN = '<td class="mono object">{}</td>'


class _RunningState:
    """Every field's value (as shown) per object as a timeline is written, so each page
    carries the state at its first row (the browser replays the page's changes)."""

    def __init__(self, site: "_Site", show_object: bool):
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


def _mapping(value: Any) -> dict:
    """A meta entry that should be a JSON object, else nothing (a damaged trace)."""
    return value if isinstance(value, dict) else {}


def _arg_kinds(data: Analysis) -> dict[int, dict[str, str]]:
    """Per functions-table row, each tracepoint argument's kind (meta ``tracepoint_args``)."""
    found = data.meta.tracepoint_args
    out: dict[int, dict[str, str]] = {}
    if isinstance(found, dict):
        for row, args in found.items():
            if str(row).isdigit() and isinstance(args, list):
                out[int(row)] = {str(a.get("name")): str(a.get("kind"))
                                 for a in args if isinstance(a, dict)}
    return out


class _Site:
    """Turns the analysis into files; one instance per render."""

    def __init__(self, data: Analysis, out_dir: str, plots: bool = True):
        self.data, self.out_dir, self.plots = data, out_dir, plots
        self.env = template_environment()
        #: which probe kinds filled the trace: pages leave out what the others would fill
        phases = set(np.unique(data.events.phase).tolist())
        self.has_calls = bool(phases & {PHASE_ENTRY, PHASE_EXIT})
        self.has_tracepoints = PHASE_TRACEPOINT in phases
        self.announced = bool(data.meta.announced_stores)
        self.fmt = ValueFormatter(data.layout, data.meta.tracepoint_args,
                                  data.meta.kernel_symbols,
                                  _mapping(data.meta.net_devices))
        self.layout = data.layout
        self.names = data.function_names
        self.reach = data.reach
        kinds = data.meta.return_kinds
        #: function row -> how its return value reads (kernel functions: from BTF)
        self.return_kinds = {int(k): str(v) for k, v in kinds.items() if str(k).isdigit()} \
            if isinstance(kinds, dict) else {}
        self.field_stem = field_stems(f.name for f in data.layout.fields)
        self.function_stem = function_stems(
            {f.id: f.name for f in data.summary.functions}, data.canonical,
            data.methods)  # a method the table lacks too
        self.rendered: set[int] = set()   # objects with pages
        self.plotted: set[int] = set()    # objects whose fields get PNG plots
        self.page_file: dict[int, str] = {}  # seq -> page of its object's timeline
        #: directory -> its call graph's counts, root label, changes by function and
        #: shape (a networkx graph is made again when its page is written: tens of KB
        #: each, held for tens of thousands of objects, they were a gigabyte)
        self.graphs: dict[str, tuple] = {}
        self.shape_graphs: dict[tuple, Any] = {}  # shape -> one graph of it, until laid out
        self._shapes: dict[tuple, tuple] = {}  # each shape, the one tuple every graph shares
        self.placed: dict[tuple, graphs.DotLayout] = {}  # shape -> layout
        #: directory -> its stack tree (the flame view's), counted with the graphs
        self.stacks: dict[str, Any] = {}
        self.plot_jobs: list[Any] = []
        self._cells: dict[int, tuple[str, str]] = {}
        self._shown_html = TextMemo()
        self._cause_html: dict[tuple, str] = {}
        self._timeline_links: dict[str, str] = {}
        self.notes: list[str] = []
        self.dot = graphs.dot_available()
        if not self.dot:
            self.notes.append("graphviz's dot is not installed: call graphs are left out")
        self.generated = time.strftime("%Y-%m-%d %H:%M:%S")
        head = data.meta.head_read
        #: objects that may be only their head (`ctracer.plan.heads`): its member and why
        self.head = head if isinstance(head, dict) else {}
        named = data.meta.summary_fields
        #: the fields a project file named as columns of the object list
        self.summary_fields = [str(f) for f in named] if isinstance(named, list) else []
        from ctracer.analysis import writes as watched
        #: the writes ``--watch`` recorded, joined to objects and changes (None without)
        self.writes = watched.load(data)
        self.timeline = TimelineData(data, self.fmt, self.retval, self.cause_text,
                                     str(self.head.get("member") or ""),
                                     arg_kinds=_arg_kinds(data))

    # ---------------------------------------------------------------- helpers

    def write(self, relpath: str, template: str, **context: Any) -> None:
        depth = relpath.count("/")
        context.setdefault("root", "../" * depth)
        context.setdefault("has_calls", self.has_calls)
        context.setdefault("has_tracepoints", self.has_tracepoints)
        context.setdefault("announced", self.announced)
        context.setdefault("count_words", self.count_words)
        context.update(summary=self.data.summary, version=__version__, counts=self.data.counts,
                       generated=self.generated, static=context["root"] + STATIC_DIR + "/")
        path = os.path.join(self.out_dir, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        text = self.env.get_template(template).render(**context)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
            let_go(f)

    @property
    def count_words(self) -> list[str]:
        """What the trace's probe kinds count: ``calls`` (function entries and exits),
        ``hits`` (tracepoints), or both."""
        words = (["calls"] if self.has_calls else []) + (["hits"] if self.has_tracepoints
                                                         else [])
        return words or ["calls"]

    def calls_and_hits(self, methods: dict[int, MethodStats]) -> dict[str, int]:
        """Per word of `count_words`, how many of ``methods``' counts are calls and how
        many tracepoint hits."""
        out = dict.fromkeys(self.count_words, 0)
        for fid, stats in methods.items():
            word = "hits" if self.reach.get(fid) == "tracepoint" else "calls"
            out[word] = out.get(word, 0) + stats.calls
        return out

    def retval(self, at: int) -> str:
        """The return value of the event at ``at``, as shown ("" on entries)."""
        ev = self.data.events
        if ev.phase[at] == PHASE_ENTRY or not ev.has_retval[at]:
            return ""
        v, fid = int(ev.retval[at]), int(ev.function[at])
        kind = self.return_kinds.get(int(ev.slot[at])) or self.return_kinds.get(fid)
        if kind == "pointer" or (kind is None and (self.reach.get(fid) == "returns"
                                                   or abs(v) >= 1 << 32)):
            return self.fmt.show_pointer(v)
        if kind in ("uint", "enum"):
            return str(v)
        if kind == "bool":
            return "true" if v else "false"
        return self.fmt.show_retval(v)

    def shown_html(self, j: int, code: int) -> str:
        """A value as shown, escaped, a flag word breakable at its bits (values repeat:
        each is formatted once)."""
        key = (j, code)
        text = self._shown_html.get(key)
        if text is None:
            # a flag word's bits may break after each "|" (NETIF_F_SG|NETIF_F_HW_CSUM|…)
            text = self._shown_html.remember(key, str(escape(
                self.timeline.code_text(j, code))).replace("|", "|<wbr>"))
        return text

    def _cause_parts(self, k: int) -> tuple[str, Optional[str], str]:
        a = self.data
        fid = int(a.changes.function[k])
        return (a.cause(k), a.function_name(fid) if fid >= 0 else None,
                a.function_name(int(a.events.function[a.changes.event[k]])))

    def cause_html(self, k: int, cause: int, fid: int, seen_fid: int) -> str:
        """Change ``k``'s cause as shown, escaped (``cause``, made by ``fid``, seen at
        an event of ``seen_fid``: what decides the text)."""
        if self.writes is not None and k in self.writes.writer_of:
            return str(escape(self.cause_text(k)))
        key = (cause, fid, seen_fid)
        text = self._cause_html.get(key)
        if text is None:
            text = self._cause_html[key] = str(escape(self.cause_text(k)))
        return text

    def cause_text(self, k: int) -> str:
        text = self._snapshot_cause_text(k)
        writer = self.writes.writer_of.get(k) if self.writes is not None else None
        if writer is not None:
            more = f" (the last of {writer.writes} writes)" if writer.writes > 1 else ""
            text += f"; written at {self.writes.described(writer.write)}{more}"
        return text

    def _snapshot_cause_text(self, k: int) -> str:
        cause, function, seen_at = self._cause_parts(k)
        tracepoint = seen_at.startswith("tp:")
        if cause == CAUSE_ANNOUNCED:
            return (f"announced by tracepoint {seen_at[3:]} (its argument; the store "
                    "follows the hit)")
        if cause == CAUSE_DURING:
            return f"during {function}"
        if cause == CAUSE_CALLER:
            if tracepoint:
                return f"in {function}, seen at tracepoint {seen_at[3:]}"
            return f"in {function}, before it called {seen_at}"
        if tracepoint:
            return f"outside traced calls, seen at tracepoint {seen_at[3:]}"
        return f"outside traced calls, seen on entry to {seen_at}"

    def object_href(self, o: int, from_root: str) -> str:
        return f"{from_root}{self.data.objects.dirnames[o]}/index.html" \
            if o in self.rendered else ""

    # ---------------------------------------------------------------- timelines

    def write_timeline(self, directory: str, rows: np.ndarray, *, title: str, heading: str,
                       use_object_depth: bool, show_object: bool,
                       facts: list[tuple[str, str]], methods: list[dict]) -> "_PageOf":
        """Write the timeline of the events at ``rows`` (positions, in time order),
        PAGE_ROWS rows a page: a small HTML page each, the call graph on the first, and
        the page's rows as a data file beside it (`ctracer.report.timeline`); return
        where each row is, for links to it."""
        count = max(1, -(-len(rows) // PAGE_ROWS))
        files = [_page_name(i) for i in range(count)]
        page_of = _PageOf(self, rows, files)
        graph_svg, graph_note = self.graph_for(directory, rows, files)
        views = self.views_for(directory, rows, files)
        states = _RunningState(self, show_object)
        objects = self._object_cell if show_object else None
        os.makedirs(os.path.join(self.out_dir, directory), exist_ok=True)
        index_file = self.write_pages_index(directory, rows, files) if count > 1 else ""
        for number in range(count):
            chunk = rows[number * PAGE_ROWS:(number + 1) * PAGE_ROWS]
            data = self.timeline.page(chunk, use_object_depth=use_object_depth,
                                      objects=objects,
                                      state=states.page_start(chunk, number + 1 < count))
            rows_file, text = _rows_file(number), data_file_text(data)
            rows_inline = script_safe(text) if count == 1 else None
            if rows_inline is not None and len(rows_inline) > INLINE_ROWS_CHARS:
                rows_inline = None
            if rows_inline is None:
                with open(os.path.join(self.out_dir, directory, rows_file), "w",
                          encoding="utf-8") as f:
                    f.write(text)
                    let_go(f)
            self.write(f"{directory}/{files[number]}", "timeline.html", title=title,
                       heading=heading, rows_file=rows_file,
                       rows_inline=Markup(rows_inline) if rows_inline else None,
                       page_number=number + 1,
                       page_files=files, first_page=number == 0, show_object=show_object,
                       graph_svg=graph_svg, graph_note=graph_note, views=views,
                       facts=facts, methods=methods, total_rows=len(rows),
                       page_rows=PAGE_ROWS, page_count=len(chunk), index_file=index_file)
        return page_of

    def write_pages_index(self, directory: str, rows: np.ndarray, files: list[str]) -> str:
        """Write the index of a paged timeline's pages (what each holds: the page script
        finds rows on every page with it); return its file name."""
        pages = []
        for number, page in enumerate(files):
            summary = self.timeline.page_summary(rows[number * PAGE_ROWS:(number + 1) * PAGE_ROWS])
            pages.append(dict(summary, page=page, rows=_rows_file(number)))
        with open(os.path.join(self.out_dir, directory, PAGES_FILE), "w", encoding="utf-8") as f:
            f.write(pages_file_text(pages))
            let_go(f)
        return PAGES_FILE

    def _object_cell(self, o: int) -> tuple[str, str]:
        """An all-objects row's object: its label and the link to its page."""
        cell = self._cells.get(o)
        if cell is None:
            cell = self._cells[o] = ((self.data.objects.labels[o], self.object_href(o, "../"))
                                     if o >= 0 else ("", ""))
        return cell

    # ---------------------------------------------------------------- pages

    def method_rows(self, table: dict[int, MethodStats]) -> list[dict]:
        out = []
        for stats in sorted(table.values(), key=lambda s: (-s.calls, s.name)):
            timed = len(stats.durations)
            lowest, median, p95, highest = stats.percentiles(0, 50, 95, 100)
            out.append({
                "name": stats.name, "stem": self.function_stem.get(stats.function_id, ""),
                "calls": stats.calls, "timed": timed,
                "total": format_duration(stats.total_ns) if timed else "",
                "mean": format_duration(int(stats.mean_ns)) if timed else "",
                "median": format_duration(median), "p95": format_duration(p95),
                "min": format_duration(lowest) if timed else "",
                "max": format_duration(highest) if timed else "",
                "changes": stats.changed_fields,
                "has_plot": self.plots and timed > 0,
            })
        return out

    def prepare_graphs(self, chosen: list[int]) -> None:
        """Count the call graphs of the pages of the objects ``chosen`` and of the
        all-objects page (laid out later, by shape)."""
        data, ev = self.data, self.data.events
        rows = data.objects
        self.stacks = interactive_views.stack_trees(data, chosen, ALL_DIR)
        if len(ev) and not self.stacks:
            self.notes.append("the flame views were left out: counting their stacks would "
                              "not fit the memory limit ctracer runs under")
        positions, offsets = rows.event_groups(chosen)
        counted = grouped_call_counts(ev, positions, offsets, ev.object_caller)
        positions, offsets = rows.change_groups(chosen)
        made = counts_per_group(data.changes.function[positions], offsets)
        for o, counts, changed_by in zip(chosen, counted, made):
            self._prepare_graph(rows.dirnames[o], counts, rows.labels[o], changed_by)
        if len(ev):
            made_all = counts_per_group(data.changes.function, np.array([0, len(data.changes)]))
            self._prepare_graph(ALL_DIR, call_counts(ev, np.arange(len(ev)), ev.thread_caller),
                                f"{len(rows)} objects", made_all[0])

    def _prepare_graph(self, directory: str, counts: CallGraphCounts, root_label: str,
                       changed_by: dict[int, int]) -> None:
        if not counts.functions:
            return
        key = graphs.shape_key(counts, self.names)
        shape = self._shapes.setdefault(key, key)  # one tuple a shape, however many graphs
        nodes = graphs.node_count(counts)
        if self.dot and nodes <= graphs.MAX_NODES and shape not in self.shape_graphs:
            self.shape_graphs[shape] = graphs.call_graph(counts, self.names, root_label,
                                                         changed_by)
        self.graphs[directory] = (counts, root_label, changed_by, shape, nodes)

    def layout_graphs(self) -> None:
        self.placed, notes = graphs.layout_shapes(self.shape_graphs)
        self.shape_graphs = {}
        self.notes.extend(notes)

    def graph_for(self, directory: str, rows: np.ndarray, files: list[str]) -> tuple[Any, str]:
        """The inline SVG of ``directory``'s call graph, or why there is none."""
        if not self.dot:
            return None, "graphviz's dot is not installed, so the call graph was not drawn."
        made = self.graphs.get(directory)
        if made is None:
            return None, "No calls were recorded."
        counts, root_label, changed_by, shape, nodes = made
        if nodes > graphs.MAX_NODES:
            return None, f"{nodes - 1} functions: too many to draw; see the methods table."
        placed = self.placed.get(shape)
        if placed is None:
            return None, "dot could not lay out this call graph."
        ev = self.data.events
        fids, first = np.unique(ev.function[rows], return_index=True)
        at = {f: (i, s) for f, i, s in zip(fids.tolist(), first.tolist(),
                                          ev.seq[rows[first]].tolist())}
        root = "../" * (directory.count("/") + 1)

        def links(fid: int) -> tuple[str, str]:
            found = at.get(fid)
            rows_href = f"{files[found[0] // PAGE_ROWS]}#e{found[1]}" if found else "#timeline"
            stem = self.function_stem.get(fid, "")
            return rows_href, f"{root}{METHODS_DIR}/index.html#fn-{stem}"

        return graphs.svg(counts, self.names, root_label, changed_by, placed, links), ""

    def views_for(self, directory: str, rows: np.ndarray, files: list[str]) -> Any:
        """The interactive call graph's and the flame view's data (a JSON island) of
        ``directory``'s page, or None when it has no calls."""
        made = self.graphs.get(directory)
        tree = self.stacks.get(directory)
        if made is None and tree is None:
            return None
        counts, root_label, changed_by = made[:3] if made else (None, "", {})
        data = interactive_views.views_data(
            self.data, rows, counts, root_label, changed_by, tree, files, PAGE_ROWS,
            self.function_stem, root="../" * (directory.count("/") + 1),
            methods_dir=METHODS_DIR)
        return _json_island(data)

    def changes_page(self, directory: str, title: str, heading: str,
                     changes: np.ndarray, page_of: "_PageOf",
                     series: dict[str, list[plotting.Series]], show_object: bool,
                     plot_title: Optional[str] = None,
                     values: Optional[dict[str, str]] = None,
                     live: Optional[int] = None,
                     live_series: Optional[dict[str, tuple[list, list]]] = None,
                     writes_of: Optional[list[int]] = None) -> None:
        """The changes page of the changes at ``changes`` (in the order listed);
        ``values`` shows what unchanged fields hold, ``live`` is the object whose fields
        get the interactive plot (``live_series``: its series)."""
        fields_of = self.data.changes.field[changes]
        present, first = np.unique(fields_of, return_index=True)
        by_field = {self.layout.fields[j].name: changes[fields_of == j]
                    for j in present[np.argsort(first, kind="stable")].tolist()}
        drawn = _fields_to_draw(series, by_field) if self.plots else set()
        live_data = self.live_series(live, live_series or {}) if live is not None else {}
        per_field = max(MIN_CHANGE_ROWS_PER_FIELD,
                        CHANGE_ROWS_PER_PAGE // max(1, len(by_field)))
        empty = changes[:0]
        found_of = [by_field.get(f.name, empty) for f in self.layout.fields]
        rows_of = self._change_rows(found_of, per_field, page_of, show_object)
        fields = []
        for j, f in enumerate(self.layout.fields):
            found = found_of[j]
            shown = min(len(found), per_field)
            stem = self.field_stem[f.name]
            has_plot = f.name in drawn
            if has_plot:
                kind = plotting.StripPlot if show_object else plotting.FieldPlot
                self.plot_jobs.append(kind(
                    os.path.join(self.out_dir, directory, f"{stem}.png"), f.name,
                    f"{f.name} — {plot_title or title}", series[f.name]))
            fields.append({"name": f.name, "ctype": f.ctype, "kind": f.kind,
                           "count": len(found), "rows_html": Markup(rows_of[j]),
                           "stem": stem,
                           "has_plot": has_plot, "shown": shown,
                           "omitted": len(found) - shown,
                           "in_timeline": self._in_timeline(f.name),
                           "value": (values or {}).get(f.name, ""),
                           "live": stem in live_data,
                           "live_of": live_data.get(stem, {}).get("of", 0),
                           **self._watched_field(f.name, writes_of, show_object)})
        series_json = _json_island(live_data) if live is not None else ""
        self.write(f"{directory}/changes.html", "changes.html", title=title, heading=heading,
                   series_json=series_json,
                   fields=fields, show_object=show_object,
                   watched=self.writes.fields if self.writes is not None else [],
                   changed=sum(1 for f in fields if f["count"]), drawn=len(drawn),
                   left_out=(len(set(series) & set(by_field)) - len(drawn)) if self.plots else 0)

    def _watched_field(self, name: str, writes_of: Optional[list[int]],
                       show_object: bool) -> dict:
        """A watched field's writers and first writes, for its changes page section."""
        view = self.writes
        if view is None or name not in view.fields:
            return {"watched": False}
        chosen = [i for i in (range(len(view.writes)) if writes_of is None else writes_of)
                  if view.writes[i].field == name]
        writers = [{"label": w.label, "writes": w.writes, "changed": w.changed,
                    "unchanged": w.unchanged, "stack": " → ".join(
                        reversed(view.callers(w.example)))}
                   for w in watched_writers(view, name, chosen)]
        start, labels = self.data.start_ns, self.data.objects.labels
        rows = []
        for i in chosen[:WRITE_ROWS_PER_FIELD]:
            w, o = view.writes[i], view.object_of[i]
            rows.append({"ms": f"{(w.ts_ns - start) / 1e6:.6f}",
                         "object": labels[o] if show_object and o >= 0 else "",
                         "old": "?" if w.old is None else self.timeline.value(name, w.old),
                         "new": "?" if w.value is None else self.timeline.value(name, w.value),
                         "unchanged": w.unchanged, "writer": view.writer_label(i),
                         "stack": " → ".join(reversed(view.callers(i))),
                         "cpu": w.cpu, "tid": w.tid})
        return {"watched": True, "writers": writers, "writes": rows,
                "write_count": len(chosen),
                "unchanged_count": sum(1 for i in chosen if view.writes[i].unchanged)}

    def _change_rows(self, found_of: list[np.ndarray], per_field: int, page_of: "_PageOf",
                     show_object: bool) -> list[str]:
        """Per field, the HTML rows of its first ``per_field`` changes of ``found_of``
        (the columns gathered once for the page, not per field)."""
        a = self.data
        ch, ev = a.changes, a.events
        shown = [found[:per_field] for found in found_of]
        ends = np.cumsum([len(k) for k in shown]).tolist()
        picked = np.concatenate(shown) if shown else np.zeros(0, np.int64)
        at = ch.event[picked]
        caller = CAUSES.index(CAUSE_CALLER)
        rendered, labels, dirnames = self.rendered, a.objects.labels, a.objects.dirnames
        times = ((ev.ts_ns[at] - a.start_ns) / 1e6).tolist()  # as `format_offset` has it
        items: list[str] = []
        row, shown_html, cause_html = _CHANGE_ROW.format, self.shown_html, self.cause_html
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
                stem = self.field_stem[self.layout.fields[j].name]
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

    def _in_timeline(self, field: str) -> str:
        """The link to a timeline filtered to rows changing ``field``."""
        link = self._timeline_links.get(field)
        if link is None:
            link = self._timeline_links[field] = "index.html#" + urlencode(
                {"field": field, "changed": "1"})
        return link

    def note_unreadable_pages(self, objects: list[int]) -> None:
        """Where each unreadable row of these objects' timelines is (the index links
        them), known before the pages are written, possibly by another process."""
        ev = self.data.events
        for o in objects:
            rows = self.data.objects.events(o)
            for i in np.flatnonzero(ev.unreadable[rows]).tolist():
                self.page_file[int(ev.seq[rows[i]])] = _page_name(i // PAGE_ROWS)

    def live_series(self, o: int, series: dict[str, tuple[list, list]]) -> dict[str, dict]:
        """Each changed field of object ``o`` for the browser's plot: times (ms), numbers
        to plot, the values as shown, and tick labels where the values are categories."""
        a = self.data
        start = a.start_ns
        last_ns = int(a.events.ts_ns[a.objects.events(o)[-1]])
        out = {}
        for name, (times, raw) in series.items():
            if len(times) < 2:
                continue
            numbers, ticks = self.fmt.plot_axis(name, raw)
            total = len(times)
            if total > LIVE_POINTS:
                picks = plotting.envelope(numbers, LIVE_POINTS)
                times = [times[i] for i in picks]
                raw = [raw[i] for i in picks]
                numbers, ticks = self.fmt.plot_axis(name, raw)
            out[self.field_stem[name]] = {
                "of": total if total > len(times) else 0,
                "t": [round(t / 1e6, 6) for t in times], "y": numbers,
                "label": [self.timeline.value(name, v) for v in raw],
                "ticks": [[p, label] for p, label in ticks] if ticks else None,
                "end": round((last_ns - start) / 1e6, 6)}
        return out

    def object_pages(self, o: int) -> None:
        a = self.data
        d, label = a.objects.dirnames[o], a.objects.labels[o]
        start = a.start_ns
        rows = a.objects.events(o)
        first_ns, last_ns = int(a.events.ts_ns[rows[0]]), int(a.events.ts_ns[rows[-1]])
        series = a.series(o)
        changed = [name for name, (times, _) in series.items() if len(times) > 1]
        methods = a.object_methods(o)
        changes = a.objects.changes(o)
        facts = [
            ("lifetime", a.objects.started_by[o]),
            ("first seen", f"{format_offset(first_ns - start)} ms"),
            ("last seen", f"{format_offset(last_ns - start)} ms"),
            ("observed for", format_duration(last_ns - first_ns) or "0 ns"),
            ("events", str(len(rows))),
            *((word, str(n)) for word, n in self.calls_and_hits(methods).items()),
            ("field changes", f"{len(changes)} in {len(changed)} fields"),
            ("thread ids", ", ".join(str(t) for t in a.threads(o))),
        ]
        if a.objects.unreadable[o]:
            facts.append(("unreadable snapshots", str(int(a.objects.unreadable[o]))))
        if a.objects.head_only[o]:
            facts.append(("read in part", f"{int(a.objects.head_only[o])} events read only "
                          f"{self.head.get('member') or 'the head'}, the other fields not "
                          f"read: {self.head.get('rule') or ''}"))
        page_of = self.write_timeline(
            d, rows, title=label, heading=f"{self.struct_title} {label}",
            use_object_depth=True, show_object=False,
            facts=facts, methods=self.method_rows(methods))
        plots = {}
        if o in self.plotted:
            plots = {name: [plotting.Series(label, points[0], points[1], last_ns - start)]
                     for name, points in series.items() if len(points[0]) > MIN_CHANGES_TO_PLOT}
        values = {name: self.timeline.value(name, points[1][0])
                  for name, points in series.items() if points[0]}
        self.changes_page(d, label, f"{self.struct_title} {label}", changes,
                          page_of, plots, show_object=False, values=values,
                          live=o, live_series=series,
                          writes_of=self.writes.of_object(o) if self.writes is not None
                          else None)

    def all_objects_pages(self) -> None:
        a = self.data
        changes = a.changes_by_seq()
        n_objects = len(a.objects)
        facts = [("objects", str(n_objects)), ("events", str(len(a.events))),
                 ("field changes", str(len(changes)))]
        page_of = self.write_timeline(
            ALL_DIR, np.arange(len(a.events)), title="all objects",
            heading=f"{self.struct_title}: all objects", use_object_depth=False,
            show_object=True, facts=facts, methods=self.method_rows(a.methods))
        series, values = self._strips()
        plotted = f"{n_objects} objects, one strip each"
        self.changes_page(ALL_DIR, "all objects", f"{self.struct_title}: all objects",
                          changes, page_of, series, show_object=True,
                          plot_title=plotted, values=values)

    def _strips(self) -> tuple[dict[str, plotting.Strips], dict[str, str]]:
        """The all-objects strip plots' series, one strip per object whose field
        changed, on time since the object was first seen (readable at thousands of
        objects, where lines over absolute time are not), only every n-th object's
        beyond `plotting.MAX_STRIPS`; and what each field held first across objects."""
        a = self.data
        fields = [f.name for f in self.layout.fields]
        lengths = a.series_lengths()
        found: list[tuple[int, int, np.ndarray]] = []  # (first object, field, objects)
        for j in range(len(fields)):
            changed = np.flatnonzero(lengths[:, j] > 1) if len(lengths) else []
            if len(changed):
                found.append((int(changed[0]), j, changed))
        series: dict[str, plotting.Strips] = {}  # fields in order of first appearance
        wanted: dict[int, list[str]] = {}
        for _, j, changed in sorted(found, key=lambda f: f[:2]):
            series[fields[j]] = plotting.Strips(len(changed))
            for o in changed[::plotting.Strips.sampling(len(changed))].tolist():
                wanted.setdefault(o, []).append(fields[j])
        ts = a.events.ts_ns
        for o in sorted(wanted):
            rows = a.objects.events(o)
            first_ns, last_ns = int(ts[rows[0]]), int(ts[rows[-1]])
            first = first_ns - a.start_ns
            for name, (times, vals) in a.series(o, wanted[o]).items():
                series[name].append(plotting.Series(
                    a.objects.labels[o], np.asarray(times, np.int64) - first, vals,
                    last_ns - first_ns))
        firsts: dict[str, set[str]] = {name: set() for name in fields}
        for o in range(len(a.objects)):
            for name, value in a.first_values(o).items():
                firsts[name].add(self.timeline.value(name, value))
        values = {name: (next(iter(seen)) if len(seen) == 1 else
                         f"{len(seen)} values across objects" if seen else "")
                  for name, seen in firsts.items()}
        return series, values

    def methods_page(self) -> None:
        rows = self.method_rows(self.data.methods)
        for stats in self.data.methods.values() if self.plots else ():
            if len(stats.durations):
                self.plot_jobs.append(plotting.DurationPlot(
                    os.path.join(self.out_dir, METHODS_DIR,
                                 f"{self.function_stem[stats.function_id]}.png"),
                    f"{stats.name}: {len(stats.durations)} timed calls",
                    stats.call_times, stats.durations))
        bars = [(r["name"], r["calls"]) for r in rows if r["calls"]][:40] if self.plots else []
        if bars:
            self.plot_jobs.append(plotting.CallCountPlot(
                os.path.join(self.out_dir, METHODS_DIR, "calls.png"),
                " and ".join(self.count_words) + " per method"
                + (" (40 busiest)" if len(rows) > 40 else ""), bars,
                " / ".join(self.count_words)))
        called = {s.function_id for s in self.data.methods.values() if s.calls}
        canonical = self.data.canonical
        functions = [{"name": self.names.get(f.id, f.name), "reach": f.reach, "via": f.via,
                      "unit": f.unit, "attached": f.attached,
                      "called": canonical.get(f.id, f.id) in called}
                     for f in self.data.summary.functions]
        self.write(f"{METHODS_DIR}/index.html", "methods.html", title="methods",
                   heading=f"{self.struct_title}: methods", methods=rows,
                   functions=functions, has_bars=bool(bars))

    def index_page(self, objects_total: int, incomplete: str = "") -> None:
        """The index; ``incomplete`` says why the report lacks pages (Ctrl-C, a helper
        that died), shown first."""
        data, start = self.data, self.data.start_ns
        ev = data.events
        columns = summaries.columns_for(data.summary.struct_name,
                                        [f.name for f in self.layout.fields],
                                        self.summary_fields)
        counts, changes = data.objects.event_counts(), data.objects.change_counts()
        changed_fields = (data.series_lengths() > 1).sum(axis=1)
        calls = data.object_calls().tolist()
        objects = []
        for o in range(len(data.objects)):
            rows = data.objects.events(o)
            seen = summaries.Seen.of(data, o, calls[o])
            objects.append({
                "label": data.objects.labels[o],
                "dir": data.objects.dirnames[o] if o in self.rendered else "",
                "lifetime": data.objects.keys[o].lifetime, "began": data.objects.started_by[o],
                "first": format_offset(int(ev.ts_ns[rows[0]]) - start),
                "last": format_offset(int(ev.ts_ns[rows[-1]]) - start),
                "events": int(counts[o]),
                **self.calls_and_hits(data.object_methods(o)),
                "changes": int(changes[o]), "fields": int(changed_fields[o]),
                "summary": summaries.summary(seen, columns, self.fmt),
            })
        with open(os.path.join(self.out_dir, OBJECTS_FILE), "w", encoding="utf-8") as f:
            f.write(objects_file_text(objects_data(objects, [c.name for c in columns],
                                                   self.count_words)))
        reach_counts: dict[str, int] = {}
        for f in data.summary.functions:
            reach_counts[f.reach] = reach_counts.get(f.reach, 0) + 1
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
                "href": (f"{data.objects.dirnames[o]}/{self.page_file.get(seq, 'index.html')}"
                         f"#e{seq}" if o in self.rendered else "")})
        watch = data.meta.watch
        self.write("index.html", "index.html", title=self.struct_title,
                   watch_line=_watch_summary(watch) if isinstance(watch, dict) else "",
                   unreadable=unreadable, max_listed=MAX_LISTED,
                   heading=self.struct_title, objects_file=OBJECTS_FILE,
                   rendered=len(self.rendered), objects_total=objects_total,
                   reach_counts=sorted(reach_counts.items()), data=data,
                   function_count=distinct,
                   trace_span=format_duration(duration) or "0 ns",
                   mini_fields=self.layout.fields, notes=self.notes,
                   incomplete=incomplete, summary_columns=[c.name for c in columns],
                   failed_functions=failed_functions(data.summary.failed_probes),
                   trace_name=os.path.basename(data.summary.trace_path))

    @property
    def struct_title(self) -> str:
        s = self.data.summary
        return f"{s.struct_kind} {s.struct_name}"


#: below this many objects helper processes cost more than they save
HELPER_MIN_OBJECTS = 200
#: ...or this many PNG plots
HELPER_MIN_PLOTS = 40
#: objects a helper takes at a time (small enough that the two finish together)
OBJECTS_PER_TASK = 25

def _watch_summary(watch: dict) -> str:
    """The recording's ``--watch`` line (`ctracer.record.watcher.summary_line`), less its
    leading word."""
    from ctracer.record.watcher import summary_line
    try:
        return summary_line(watch).split(": ", 1)[1]
    except (KeyError, TypeError, IndexError):
        return ""


class _PageOf:
    """Which page of a timeline an event is on, for links to its row: a row something
    links to (it changed fields, or could not be read) by its page file, any other
    'index.html'.  Looked up per link: a dict of every linked row of ten million
    events would be hundreds of megabytes."""

    def __init__(self, site: "_Site", rows: np.ndarray, files: list[str]):
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


#: the site a forked helper works on (inherited from the parent, never copied)
_helper_site: Optional["_Site"] = None


def _run_task(task: tuple) -> float:
    """Write one part of the report and draw its plots (in a helper or here); return the
    seconds spent drawing plots."""
    site = _helper_site
    assert site is not None
    kind = task[0]
    if kind == "all":
        site.all_objects_pages()
        release_free_memory()  # its every-event temporaries, before the objects' tasks
    elif kind == "methods":
        site.methods_page()
    else:
        for obj in task[1]:
            site.object_pages(obj)
    mark = time.perf_counter()
    jobs, site.plot_jobs = site.plot_jobs, []
    plotting.draw_here(jobs, site.layout)
    return time.perf_counter() - mark


def _write_pages(site: "_Site", chosen: list[int], workers: int,
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


def _expected_plots(site: "_Site") -> int:
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
    site: Optional[_Site] = None
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

            site = _Site(data, out_dir, plots)
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
            site.prepare_graphs(chosen)
            say(f"laying out {len(site.graphs)} call graphs")
            site.layout_graphs()
            seconds["graphs"] = time.perf_counter() - mark
            mark, cpu = time.perf_counter(), _cpu_seconds()
            site.note_unreadable_pages(chosen)
            # under a memory limit, only as many helpers as it has room for
            workers = helpers_within_limit(min(os.cpu_count() or 1, 2))
            seconds["plots"] = _write_pages(site, chosen, workers, say)
        except KeyboardInterrupt:
            raise _incomplete(out_dir, site, HelpersStopped("interrupted", 0, 0, 2)) from None
        except HelpersStopped as stopped:
            raise _incomplete(out_dir, site, stopped) from None
        site.index_page(n)
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


def _incomplete(out_dir: str, site: Optional["_Site"], stopped: HelpersStopped) -> RenderIncomplete:
    """Mark the report in ``out_dir`` incomplete (its index.html says why and how far it
    got; the full index when the report's data was built) and the one-line error."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the page is written first
    try:
        how = "Ctrl-C or SIGTERM" if stopped.signal_number else stopped.why
        parts = f" after {stopped.done} of {stopped.total} parts of its pages" if stopped.total else ""
        why = (f"This report is incomplete: rendering was stopped ({how}){parts}, so "
               "pages linked from here may be missing. Render the trace again for all of them.")
        if site is not None:
            site.index_page(len(site.data.objects), incomplete=why)
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
