"""Timeline rows as HTML: the one hot loop of the report.

A report holds every event twice (on its object's page and under many_objects), so a
big trace means hundreds of thousands of rows; a Jinja2 loop (or `Markup.format`) spends
most of its time on small pieces.  Rows are therefore built here with plain format
strings whose every text argument is passed through `markupsafe.escape` — the escaping
Jinja2's autoescape applies — and the templates place the finished rows.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from markupsafe import Markup, escape

from ctracer.event import FLAG_HEAD_ONLY, PHASE_ENTRY, PHASE_TRACEPOINT
from ctracer.report.data import CAUSE_CALLER, Change, Row
from ctracer.report.values import ValueFormatter, format_duration, format_offset

# Plain format strings: every argument placed in them goes through `escape` first (or is
# an int), which is what Markup.format would do, at a fraction of its cost.
# Cells carry no classes: the stylesheet styles timeline columns by position, which keeps
# a row near 250 bytes (reports of big traces run to hundreds of megabytes otherwise).
_ROW = ('<tr id="{prefix}{seq}" class="{classes}"{title} data-fn="{function}"{data_o}>'
        '<td><a href="#{prefix}{seq}">{time}</a></td><td>{thread}</td>{object}'
        '<td style="--depth:{depth}"><i>{arrow}</i> {function}{tags}</td>'
        '<td>{duration}</td><td>{retval}</td><td>{changes}</td></tr>\n')
_DATA_O = ' data-o="{}"'
_TITLE = ' title="{}"'
_CHANGE = '<span class="chg"><b>{}</b> {} → {}</span>'
_OBJECT = '<td><a href="{}">{}</a></td>'
_OBJECT_PLAIN = '<td>{}</td>'
_TAG = ' <span class="tag">{}</span>'
_ARGS = ' <span class="args">({})</span>'


class RowFormatter:
    """Renders rows of one report; caches what repeats (function names, threads)."""

    def __init__(self, names: dict[int, str], fmt: ValueFormatter, start_ns: int,
                 retval: Callable[[Row], str], cause: Callable[[Change], str],
                 head_member: str = ""):
        self.names, self.fmt, self.start_ns = names, fmt, start_ns
        #: the tag of a row that read only the object's head (`FLAG_HEAD_ONLY`)
        self.head_tag = _TAG.format(escape(f"only {head_member or 'the head'} read"))
        self.retval, self.cause = retval, cause
        self._functions: dict[int, Markup] = {}
        self._objects: dict[tuple[str, str], tuple[str, str]] = {}
        self._threads: dict[tuple[str, int], Markup] = {}
        self._values: dict[tuple[str, Any], str] = {}
        self._causes: dict[tuple, str] = {}
        self._fields: dict[str, str] = {}

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

    def _value(self, field: str, value: Any) -> str:
        """A value as shown, escaped; values repeat (states, small counts), so they are
        formatted once."""
        key = (field, value)
        text = self._values.get(key)
        if text is None:
            if len(self._values) > 200_000:
                self._values.clear()
            text = self._values[key] = str(escape(self.fmt.show(field, value)))
        return text

    def _cause(self, c: Change) -> str:
        key = (c.cause, c.function_id, c.seen_at)
        text = self._causes.get(key)
        if text is None:
            text = self._causes[key] = str(escape(self.cause(c)))
        return text

    def _changes(self, changes: list[Change]) -> tuple[str, str]:
        value = self._value
        parts = [(self._field(c.field), value(c.field, c.old), value(c.field, c.new),
                  self._cause(c)) for c in changes]
        title = _TITLE.format("\n".join(f"{f}: {o} → {n} ({why})"
                                        for f, o, n, why in parts))
        return title, "".join(_CHANGE.format(f, o, n) for f, o, n, _ in parts)

    def _field(self, name: str) -> str:
        text = self._fields.get(name)
        if text is None:
            text = self._fields[name] = str(escape(name))
        return text

    def row(self, row: Row, depth: int, object_cell: Optional[tuple[str, str]]) -> Markup:
        """One ``<tr>`` (two when a caller's changes precede the row: see
        `caller_row`); ``object_cell`` is (label, href or "") on all-objects pages."""
        entry = row.phase == PHASE_ENTRY
        point = row.phase == PHASE_TRACEPOINT
        classes = "entry" if entry else "tracepoint" if point else "exit"
        title = changes = before = ""
        if row.changes:
            if row.changes[0].cause == CAUSE_CALLER:
                before = self.caller_row(row, depth, object_cell)
            else:
                classes += " changed"
                title, changes = self._changes(row.changes)
        tags = ""
        if point and row.args:
            tags = _ARGS.format(escape(", ".join(
                f"{k} {self.fmt.show_arg(k, v)}" for k, v in row.args.items())))
        if not row.matched:
            classes += " unmatched"
            tags = _TAG.format("no exit seen" if entry else "no entry seen")
        if row.unreadable:
            classes += " unreadable"
            tags += _TAG.format("unreadable")
        elif row.flags & FLAG_HEAD_ONLY:
            classes += " head-only"
            tags += self.head_tag
        obj, data_o = self._object(object_cell) if object_cell is not None else ("", "")
        return Markup(before + _ROW.format(
            prefix="e", seq=int(row.seq), classes=classes, title=title, data_o=data_o,
            time=format_offset(row.ts_ns - self.start_ns),
            thread=self.thread(row.comm, row.tid), object=obj, depth=int(depth),
            arrow="→" if entry else "•" if point else "←",
            function=self.function(row.function_id), tags=tags,
            # both made by us from integers: nothing to escape
            duration=format_duration(row.duration_ns), retval=self.retval(row),
            changes=changes))

    def _object(self, object_cell: Optional[tuple[str, str]]) -> tuple[str, str]:
        if object_cell is None:
            return "", ""
        done = self._objects.get(object_cell)
        if done is None:
            label, href = object_cell
            cell = (_OBJECT.format(escape(href), escape(label)) if href
                    else _OBJECT_PLAIN.format(escape(label)))
            done = self._objects[object_cell] = (cell, _DATA_O.format(escape(label)))
        return done

    def caller_row(self, row: Row, depth: int, object_cell: Optional[tuple[str, str]]) -> str:
        """Changes the traced caller made before calling ``row``'s function, on a row of
        the caller's own (id ``c<seq>``), one level up: the timeline says who made each
        change, as the changes page does, not the callee whose entry showed it."""
        c = row.changes[0]
        title, changes = self._changes(row.changes)
        obj, data_o = self._object(object_cell)
        return _ROW.format(
            prefix="c", seq=int(row.seq), classes="by-caller changed", title=title,
            data_o=data_o, time=format_offset(row.ts_ns - self.start_ns),
            thread=self.thread(row.comm, row.tid), object=obj, depth=max(0, int(depth) - 1),
            arrow="⋯", function=self.function(c.function_id),
            tags=_TAG.format(f"seen at {escape(c.seen_at)}" if row.phase == PHASE_TRACEPOINT
                             else f"before calling {escape(c.seen_at)}"),
            duration="", retval="", changes=changes)
