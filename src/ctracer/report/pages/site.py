"""The state one render shares among its page writers: the analysis, value formatting,
the page files' names and constants, and the template environment (`ReportSite.write`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from markupsafe import Markup, escape

import numpy as np

from ctracer import __version__
from ctracer.analysis import Analysis
from ctracer.analysis.model import CAUSE_ANNOUNCED, CAUSE_CALLER, CAUSE_DURING, MethodStats
from ctracer.event import PHASE_ENTRY, PHASE_EXIT, PHASE_TRACEPOINT
from ctracer.files import let_go
from ctracer.report import callgraph_svg as graphs
from ctracer.report.jsontext import compact_json, script_safe
from ctracer.report.names import field_stems, function_stems
from ctracer.report.timeline import TimelineData
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


def page_file_of(number: int) -> str:
    """The file of timeline page ``number`` (from 0)."""
    return "index.html" if number == 0 else f"timeline-{number + 1}.html"


def rows_file_of(number: int) -> str:
    """The data file of timeline page ``number`` (from 0)."""
    return f"rows-{number + 1}.js"


def json_island(value: Any) -> Markup:
    """JSON to sit inside ``<script type="application/json">``: every ``<``, ``>`` and
    ``&`` escaped, so no string from the trace can close the element."""
    return Markup(script_safe(compact_json(value)))


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


class ReportSite:
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
        self.route_kind = data.route_kind
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
        context.setdefault("calls_mode", self.data.calls_mode)
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

    def calls_cover(self, methods: dict[int, MethodStats]) -> str:
        """What ``methods``' call counts and durations cover, in one line: with
        ``--calls changes``, how many of the calls were folded (changed nothing, never
        events); "" for a trace recorded with every call."""
        if self.data.calls_mode != "changes":
            return ""
        calls = sum(s.calls for fid, s in methods.items()
                    if self.route_kind.get(fid) != "tracepoint")
        folded = sum(s.folded for s in methods.values())
        return (f"{calls:,} calls, {folded:,} of them folded: changed nothing (recorded "
                f"with --calls changes: counted in the kernel with their summed and "
                f"longest duration, never events, so not on timelines; median, p95 and "
                f"min are of the written calls)")

    def calls_and_hits(self, methods: dict[int, MethodStats]) -> dict[str, int]:
        """Per word of `count_words`, how many of ``methods``' counts are calls and how
        many tracepoint hits."""
        out = dict.fromkeys(self.count_words, 0)
        for fid, stats in methods.items():
            word = "hits" if self.route_kind.get(fid) == "tracepoint" else "calls"
            out[word] = out.get(word, 0) + stats.calls
        return out

    def retval(self, at: int) -> str:
        """The return value of the event at ``at``, as shown ("" on entries)."""
        ev = self.data.events
        if ev.phase[at] == PHASE_ENTRY or not ev.has_retval[at]:
            return ""
        v, fid = int(ev.retval[at]), int(ev.function[at])
        kind = self.return_kinds.get(int(ev.function_row[at])) or self.return_kinds.get(fid)
        if kind == "pointer" or (kind is None and (self.route_kind.get(fid) == "returns"
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
        """The link to object ``o``'s page from a page ``from_root`` below the report's root."""
        return f"{from_root}{self.data.objects.dirnames[o]}/index.html" \
            if o in self.rendered else ""


    def object_cell(self, o: int) -> tuple[str, str]:
        """An all-objects row's object: its label and the link to its page."""
        cell = self._cells.get(o)
        if cell is None:
            cell = self._cells[o] = ((self.data.objects.labels[o], self.object_href(o, "../"))
                                     if o >= 0 else ("", ""))
        return cell

    def method_rows(self, table: dict[int, MethodStats]) -> list[dict]:
        out = []
        for stats in sorted(table.values(), key=lambda s: (-s.calls, s.name)):
            timed = stats.timed_calls
            lowest, median, p95, highest = stats.percentiles(0, 50, 95, 100)
            if stats.folded:
                highest = max(highest or 0, stats.folded_max_ns)
            out.append({
                "name": stats.name, "stem": self.function_stem.get(stats.function_id, ""),
                "calls": stats.calls, "timed": timed, "folded": stats.folded,
                "total": format_duration(stats.total_ns) if timed else "",
                "mean": format_duration(int(stats.mean_ns)) if timed else "",
                "median": format_duration(median), "p95": format_duration(p95),
                "min": format_duration(lowest) if timed else "",
                "max": format_duration(highest) if timed else "",
                "changes": stats.changed_fields,
                "has_plot": self.plots and len(stats.durations) > 0,
            })
        return out

    @property
    def struct_title(self) -> str:
        """The struct as the pages' headings name it."""
        s = self.data.summary
        return f"{s.struct_kind} {s.struct_name}"
