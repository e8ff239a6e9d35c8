"""Timeline rows as HTML: the one hot loop of the report.

A report holds every event twice (on its object's page and under many_objects), so a
big trace means hundreds of thousands of rows; a Jinja2 loop (or `Markup.format`) spends
most of its time on small pieces.  Rows are therefore built here with plain format
strings whose every text argument is passed through `markupsafe.escape` — the escaping
Jinja2's autoescape applies — and the templates place the finished rows.
"""

from __future__ import annotations

from typing import Callable, Optional

from markupsafe import Markup, escape

from ctracer.event import PHASE_ENTRY
from ctracer.report.data import Change, Row
from ctracer.report.values import ValueFormatter, format_duration, format_offset

# Plain format strings: every argument placed in them goes through `escape` first (or is
# an int), which is what Markup.format would do, at a fraction of its cost.
# Cells carry no classes: the stylesheet styles timeline columns by position, which keeps
# a row near 250 bytes (reports of big traces run to hundreds of megabytes otherwise).
_ROW = ('<tr id="e{seq}" class="{classes}"{title}>'
        '<td><a href="#e{seq}">{time}</a></td><td>{thread}</td>{object}'
        '<td style="--depth:{depth}"><i>{arrow}</i> {function}{tags}</td>'
        '<td>{duration}</td><td>{retval}</td><td>{changes}</td></tr>\n')
_TITLE = ' title="{}"'
_CHANGE = '<span class="chg"><b>{}</b> {} → {}</span>'
_OBJECT = '<td><a href="{}">{}</a></td>'
_OBJECT_PLAIN = '<td>{}</td>'
_TAG = ' <span class="tag">{}</span>'


class RowFormatter:
    """Renders rows of one report; caches what repeats (function names, threads)."""

    def __init__(self, names: dict[int, str], fmt: ValueFormatter, start_ns: int,
                 retval: Callable[[Row], str], cause: Callable[[Change], str]):
        self.names, self.fmt, self.start_ns = names, fmt, start_ns
        self.retval, self.cause = retval, cause
        self._functions: dict[int, Markup] = {}
        self._threads: dict[tuple[str, int], Markup] = {}

    def function(self, fid: int) -> Markup:
        m = self._functions.get(fid)
        if m is None:
            m = self._functions[fid] = escape(self.names.get(fid, f"function#{fid}"))
        return m

    def thread(self, comm: str, tid: int) -> Markup:
        m = self._threads.get((comm, tid))
        if m is None:
            m = self._threads[(comm, tid)] = escape(f"{comm}/{tid}" if comm else str(tid))
        return m

    def row(self, row: Row, depth: int, object_cell: Optional[tuple[str, str]]) -> Markup:
        """One ``<tr>``; ``object_cell`` is (label, href or "") on all-objects pages."""
        entry = row.phase == PHASE_ENTRY
        classes = "entry" if entry else "exit"
        title = changes = ""
        if row.changes:
            classes += " changed"
            show = self.fmt.show
            parts = [(escape(c.field), escape(show(c.field, c.old)),
                      escape(show(c.field, c.new)), escape(self.cause(c)))
                     for c in row.changes]
            title = _TITLE.format("\n".join(f"{f}: {o} → {n} ({why})"
                                            for f, o, n, why in parts))
            changes = "".join(_CHANGE.format(f, o, n) for f, o, n, _ in parts)
        tags = ""
        if not row.matched:
            classes += " unmatched"
            tags = _TAG.format("no exit seen" if entry else "no entry seen")
        if row.unreadable:
            classes += " unreadable"
            tags += _TAG.format("unreadable")
        obj = ""
        if object_cell is not None:
            label, href = object_cell
            obj = (_OBJECT.format(escape(href), escape(label)) if href
                   else _OBJECT_PLAIN.format(escape(label)))
        return Markup(_ROW.format(
            seq=int(row.seq), classes=classes, title=title,
            time=format_offset(row.ts_ns - self.start_ns),
            thread=self.thread(row.comm, row.tid), object=obj, depth=int(depth),
            arrow="→" if entry else "←", function=self.function(row.function_id), tags=tags,
            # both made by us from integers: nothing to escape
            duration=format_duration(row.duration_ns), retval=self.retval(row),
            changes=changes))
