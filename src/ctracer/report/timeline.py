"""Timeline rows as data for the browser: the one hot loop of the report.

A report holds every event twice (on its object's page and under many_objects), so a
big trace means millions of rows.  Rows are not written as HTML: each timeline page is a
small shell whose script (``_static/report.js``) draws the rows from a data file beside
it, ``rows-N.js``, loaded with a ``<script src>`` (pages open from file://, where
``fetch`` is refused).  The data file is columnar JSON assigned to ``CTRACER_ROWS``: one
list per column (sequence number, time, thread, function, phase, depth, duration,
return value, object), sparse tables for the rows that changed fields or carry tags, and
the value of every field at the page's first row.  Columns are built with C-speed
``map`` over the rows; only changed rows reach Python code of their own.

Every text in the data is plain text, made into DOM text by the page (never markup).
"""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any, Callable, Optional

from ctracer.event import FLAG_HEAD_ONLY, PHASE_ENTRY, PHASE_TRACEPOINT
from ctracer.report.data import CAUSE_CALLER, Change, Row, parse_arguments
from ctracer.report.values import TextMemo, ValueFormatter, format_duration

#: the variable a data file assigns (report.js reads it)
DATA_VARIABLE = "CTRACER_ROWS"
#: the variable of a paged timeline's index of pages (what each page holds)
PAGES_VARIABLE = "CTRACER_PAGES"
#: the file of that index, beside the pages
PAGES_FILE = "pages.js"

_SEQ, _TS, _TID, _FN, _PHASE = (attrgetter(n) for n in ("seq", "ts_ns", "tid", "function_id",
                                                         "phase"))
_DEPTH, _OBJECT_DEPTH = attrgetter("depth"), attrgetter("object_depth")


class TimelineData:
    """Makes the data files of one report's timelines; caches what repeats (values as
    shown, causes, return values, durations)."""

    def __init__(self, names: dict[int, str], fmt: ValueFormatter, start_ns: int,
                 fields: list[str], retval: Callable[[Row], str],
                 cause: Callable[[Change], str], head_member: str = "",
                 arg_kinds: Optional[dict[int, dict[str, str]]] = None):
        self.names, self.fmt, self.start_ns, self.fields = names, fmt, start_ns, fields
        #: per functions-table row, each tracepoint argument's kind (pointers in hex)
        self.arg_kinds = arg_kinds or {}
        #: the tag of a row that read only the object's head (`FLAG_HEAD_ONLY`)
        self.head_tag = ["head-only", f"only {head_member or 'the head'} read"]
        self.retval, self.cause = retval, cause
        self.field_index = {name: i for i, name in enumerate(fields)}
        self._values = TextMemo()
        self._causes: dict[tuple, int] = {}
        self._cause_list: list[list] = []
        self._durations = TextMemo()
        self._retvals = TextMemo()
        self._args = TextMemo()

    def value(self, field: str, value: Any) -> str:
        key = (field, value)
        text = self._values.get(key)
        if text is None:
            text = self._values.remember(key, self.fmt.show(field, value))
        return text

    def _cause_index(self, c: Change, tracepoint: bool) -> int:
        key = (c.cause, c.function_id, c.seen_at, tracepoint)
        k = self._causes.get(key)
        if k is None:
            k = self._causes[key] = len(self._cause_list)
            caller = c.cause == CAUSE_CALLER
            tag = ""
            if caller:
                tag = f"seen at {c.seen_at}" if tracepoint else f"before calling {c.seen_at}"
            self._cause_list.append([1 if caller else 0, self.cause(c),
                                     self.names.get(c.function_id, c.function or ""), tag])
        return k

    def _changes(self, row: Row) -> list:
        """``[cause, field, old, new, field, old, new...]`` (one cause per row: every
        change a row shows was made by the same code)."""
        changes = row.changes
        out: list[Any] = [self._cause_index(changes[0], row.phase == PHASE_TRACEPOINT)]
        index, value = self.field_index, self.value
        for c in changes:
            out += (index.get(c.field, -1), value(c.field, c.old), value(c.field, c.new))
        return out

    def _duration(self, ns: Optional[int]) -> str:
        if ns is None:
            return ""
        text = self._durations.get(ns)
        if text is None:
            text = self._durations.remember(ns, format_duration(ns))
        return text

    def _args_text(self, slot: int, args: str) -> str:
        """``(name value, ...)`` of a tracepoint hit's arguments ("" when they do not
        read); the same arguments recur (a socket's address, its state, a message size),
        so each text is made once."""
        key = (slot, args)
        text = self._args.get(key)
        if text is None:
            values = parse_arguments(args)
            kinds = self.arg_kinds.get(slot, {})
            text = self._args.remember(key, "" if values is None else "(" + ", ".join(
                f"{k} {self.fmt.show_arg(k, v, kinds.get(k), slot)}" for k, v in values.items())
                + ")")
        return text

    def _retval(self, row: Row) -> str:
        if row.phase == PHASE_ENTRY or row.retval is None:
            return ""
        key = (row.function_id, row.retval)
        text = self._retvals.get(key)
        if text is None:
            text = self._retvals.remember(key, self.retval(row))
        return text

    def page(self, rows: list[Row], *, use_object_depth: bool,
             objects: Optional[Callable[[Row], tuple[str, str]]],
             state: dict[str, dict[str, str]]) -> dict[str, Any]:
        """The data of one timeline page: ``objects`` gives each row's object (label,
        link) on all-objects pages; ``state`` every field's value, per object label, at
        the page's first row."""
        start = self.start_ns
        threads: dict[tuple[str, int], int] = {}
        thread_of = [threads.setdefault((r.comm, r.tid), len(threads)) for r in rows]
        functions = sorted(set(map(_FN, rows)))
        data: dict[str, Any] = {
            "fields": self.fields, "entry": PHASE_ENTRY, "point": PHASE_TRACEPOINT,
            "functions": {str(f): self.names.get(f, f"function#{f}") for f in functions},
            "threads": [thread_label(comm, tid) for comm, tid in threads],
            "seq": list(map(_SEQ, rows)),
            "t": [t - start for t in map(_TS, rows)],
            "th": thread_of, "fn": list(map(_FN, rows)), "ph": list(map(_PHASE, rows)),
            "d": list(map(_OBJECT_DEPTH if use_object_depth else _DEPTH, rows)),
            "dur": [self._duration(r.duration_ns) for r in rows],
            "ret": [self._retval(r) for r in rows],
            "state": state,
        }
        if objects is not None:
            labels: dict[tuple[str, str], int] = {}
            data["o"] = [labels.setdefault(objects(r), len(labels)) for r in rows]
            data["objects"] = list(labels)
        changes, tags = {}, {}
        for i, r in enumerate(rows):
            if r.changes:
                changes[i] = self._changes(r)
            if (not r.matched or r.unreadable or r.flags & FLAG_HEAD_ONLY
                    or (r.args and r.phase == PHASE_TRACEPOINT)):
                tags[i] = self._tags(r)
        data["changes"], data["tags"], data["causes"] = changes, tags, self._cause_list
        return data

    def page_summary(self, rows: list[Row]) -> dict[str, Any]:
        """What one page holds, for finding rows across pages without loading them: its
        functions (callers that made changes included, as their rows show them),
        threads and fields changed, and its time span."""
        functions = {self.names.get(f, f"function#{f}") for f in set(map(_FN, rows))}
        fields: set[str] = set()
        for r in rows:
            if r.changes:
                for c in r.changes:
                    fields.add(c.field)
                    if c.cause == CAUSE_CALLER:
                        functions.add(self.names.get(c.function_id, c.function or ""))
        threads = {thread_label(comm, tid) for comm, tid in {(r.comm, r.tid) for r in rows}}
        start = self.start_ns
        return {"fn": functions, "th": threads, "field": fields, "n": len(rows),
                "t": [rows[0].ts_ns - start, rows[-1].ts_ns - start] if rows else [0, 0]}

    def _tags(self, row: Row) -> list[list[str]]:
        """[kind, text] each: ``args`` (a tracepoint's arguments), or a kind that also
        marks the row (``unmatched``, ``unreadable``, ``head-only``)."""
        tags = []
        if row.phase == PHASE_TRACEPOINT and row.args:
            text = self._args_text(row.slot, row.args)
            if text:
                tags.append(["args", text])
        if not row.matched:
            tags.append(["unmatched",
                         "no exit seen" if row.phase == PHASE_ENTRY else "no entry seen"])
        if row.unreadable:
            tags.append(["unreadable", "unreadable"])
        elif row.flags & FLAG_HEAD_ONLY:
            tags.append(self.head_tag)
        return tags


def thread_label(comm: str, tid: int) -> str:
    """A thread as rows show it: ``comm/tid``, or the tid alone."""
    return f"{comm}/{tid}" if comm else str(tid)


def pages_file_text(pages: list[dict[str, Any]]) -> str:
    """The index of a paged timeline: every function, thread and field changed over all
    pages (sorted), and per page its files, rows, time span (ns from the trace's start)
    and which of those it holds (indexes), from `TimelineData.page_summary` dicts with
    ``page`` and ``rows`` (the files) added."""
    everywhere = {key: sorted(set().union(*(p[key] for p in pages)))
                  for key in ("fn", "th", "field")}
    where = {key: {v: i for i, v in enumerate(values)} for key, values in everywhere.items()}
    out = {"functions": everywhere["fn"], "threads": everywhere["th"],
           "fields": everywhere["field"],
           "pages": [{"page": p["page"], "rows": p["rows"], "n": p["n"], "t": p["t"],
                      **{key: sorted(where[key][v] for v in p[key]) for key in where}}
                     for p in pages]}
    return (f"/* ctracer timeline pages, read by report.js */\n{PAGES_VARIABLE} = "
            + json.dumps(out, separators=(",", ":"), ensure_ascii=False) + ";\n")


def data_file_text(data: dict[str, Any]) -> str:
    """The data file: a script assigning the page's data (JSON is a JavaScript literal)."""
    return (f"/* ctracer timeline rows, drawn by report.js */\n{DATA_VARIABLE} = "
            + json.dumps(data, separators=(",", ":"), ensure_ascii=False) + ";\n")


def read_data_file(text: str) -> dict[str, Any]:
    """The data a data file assigns (for tests and tools)."""
    return json.loads(text[text.index("=") + 1:].rstrip().rstrip(";"))
