"""Timeline rows as data for the browser: the one hot loop of the report.

A report holds every event twice (on its object's page and under many_objects), so a
big trace means millions of rows.  Rows are not written as HTML: each timeline page is a
small shell whose script (``_static/report.js``) draws the rows from a data file beside
it, ``rows-N.js``, loaded with a ``<script src>`` (pages open from file://, where
``fetch`` is refused), or, for a short timeline of one page, from the same script
inside the page (`ctracer.report.jsontext.script_safe`).  The data file is columnar JSON assigned to
``CTRACER_ROWS``: one list per column (sequence number, time, thread, function, phase,
depth, duration, return value, object), sparse tables for the rows that changed fields
or carry tags, and the value of every field at the page's first row.  Columns are built
with C-speed ``map`` over the rows; only changed rows reach Python code of their own.

Every text in the data is plain text, made into DOM text by the page (never markup).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

import numpy as np

from ctracer.analysis import Analysis, parse_arguments
from ctracer.analysis.model import CAUSE_CALLER, CAUSES, NO_DURATION, function_label
from ctracer.event import FLAG_HEAD_ONLY, PHASE_ENTRY, PHASE_TRACEPOINT
from ctracer.report.jsontext import compact_json
from ctracer.report.values import TextMemo, ValueFormatter, format_duration

#: the variable a data file assigns (report.js reads it)
DATA_VARIABLE = "CTRACER_ROWS"
#: the variable of a paged timeline's index of pages (what each page holds)
PAGES_VARIABLE = "CTRACER_PAGES"
#: the file of that index, beside the pages
PAGES_FILE = "pages.js"

_CALLER = CAUSES.index(CAUSE_CALLER)
#: up to this many values, looking each one up costs less than numpy's per-field passes
FEW_VALUES = 4096


class TimelineData:
    """Makes the data files of one report's timelines from the analysis' columns; caches
    what repeats (values as shown, causes, return values, durations)."""

    def __init__(self, analysis: Analysis, fmt: ValueFormatter,
                 retval: Callable[[int], str], cause: Callable[[int], str],
                 head_member: str = "", arg_kinds: Optional[dict[int, dict[str, str]]] = None):
        a = self.analysis = analysis
        self.names, self.fmt, self.start_ns = a.function_names, fmt, a.start_ns
        self.fields = [f.name for f in a.layout.fields]
        #: per functions-table row, each tracepoint argument's kind (pointers in hex)
        self.arg_kinds = arg_kinds or {}
        #: the tag of a row that read only the object's head (`FLAG_HEAD_ONLY`)
        self.head_tag = ["head-only", f"only {head_member or 'the head'} read"]
        self.retval, self.cause = retval, cause
        self._values = TextMemo()
        self._codes = TextMemo()
        self._causes: dict[tuple, int] = {}
        self._cause_list: list[list] = []
        self._durations = TextMemo()
        self._retvals = TextMemo()
        self._args = TextMemo()
        self.change_start, self.change_end = a.change_rows()

    def value(self, field: str, value: Any) -> str:
        key = (field, value)
        text = self._values.get(key)
        if text is None:
            text = self._values.remember(key, self.fmt.show(field, value))
        return text

    def code_text(self, j: int, code: int) -> str:
        """Field ``j``'s value of code ``code``, as shown."""
        key = (j, code)
        text = self._codes.get(key)
        if text is None:
            text = self._codes.remember(key, self.value(
                self.fields[j], self.analysis.values.decode_one(j, code)))
        return text

    def _cause_index(self, k: int, cause: int, fid: int, seen_fid: int,
                     tracepoint: bool) -> int:
        """The index in the causes table of change ``k``'s cause (``cause``, made by
        ``fid``, seen at an event of ``seen_fid``)."""
        a = self.analysis
        key = (cause, fid, seen_fid, tracepoint)
        i = self._causes.get(key)
        if i is None:
            seen = a.function_name(seen_fid)
            i = self._causes[key] = len(self._cause_list)
            caller = key[0] == _CALLER
            tag = ""
            if caller:
                tag = f"seen at {seen}" if tracepoint else f"before calling {seen}"
            function = a.function_name(fid) if fid >= 0 else None
            self._cause_list.append([1 if caller else 0, self.cause(k),
                                     self.names.get(fid, function or ""), tag])
        return i

    def _page_changes(self, rows: np.ndarray) -> dict[int, list]:
        """Per row (index in ``rows``) that changed fields, ``[cause, field, old, new,
        field, old, new...]`` (one cause per event: every change it shows was made by
        the same code)."""
        a = self.analysis
        ch, ev = a.changes, a.events
        start, end = self.change_start[rows], self.change_end[rows]
        changed = np.flatnonzero(end > start)
        if not len(changed):
            return {}
        picks = _changes_of(start[changed], end[changed])
        fields = ch.field[picks]
        texts = self.codes_text(np.concatenate([fields, fields]),
                                np.concatenate([ch.old[picks], ch.new[picks]]))
        n = len(picks)
        flat: list[Any] = [None] * (3 * n)
        flat[0::3], flat[1::3], flat[2::3] = fields.tolist(), texts[:n], texts[n:]
        stops = (np.cumsum(end[changed] - start[changed]) * 3).tolist()
        heads = start[changed]
        at = rows[changed]
        out: dict[int, list] = {}
        k = 0
        known = self._causes.get
        for i, stop, head, cause, fid, seen, phase in zip(
                changed.tolist(), stops, heads.tolist(), ch.cause[heads].tolist(),
                ch.function[heads].tolist(), ev.function[at].tolist(), ev.phase[at].tolist()):
            tracepoint = phase == PHASE_TRACEPOINT
            index = known((cause, fid, seen, tracepoint))
            if index is None:
                index = self._cause_index(head, cause, fid, seen, tracepoint)
            row: list[Any] = [index]
            row += flat[k:stop]
            out[i] = row
            k = stop
        return out

    def codes_text(self, fields: np.ndarray, codes: np.ndarray) -> list[str]:
        """Each value (``codes`` of ``fields``) as shown: each distinct one made once."""
        if len(codes) <= FEW_VALUES:
            text = self.code_text
            return [text(j, c) for j, c in zip(fields.tolist(), codes.tolist())]
        texts: list[str] = []
        ids = np.empty(len(codes), np.int64)
        memo = self._codes
        for j in np.unique(fields).tolist():
            mine = fields == j
            uniques, inverse = np.unique(codes[mine], return_inverse=True)
            ids[mine] = inverse.reshape(-1) + len(texts)
            listed = uniques.tolist()
            found = [memo.get((j, c)) for c in listed]
            missing = [i for i, text in enumerate(found) if text is None]
            if missing:  # decoded together: one at a time, decoding was most of the cost
                name = self.fields[j]
                for i, value in zip(missing, self.analysis.values.decode(j, uniques[missing])):
                    found[i] = memo.remember((j, listed[i]), self.value(name, value))
            texts += found
        return [texts[i] for i in ids.tolist()]

    def _durations_of(self, durations: np.ndarray) -> list[str]:
        uniques, inverse = np.unique(durations, return_inverse=True)
        texts = []
        for ns in uniques.tolist():
            if ns == NO_DURATION:
                texts.append("")
                continue
            text = self._durations.get(ns)
            if text is None:
                text = self._durations.remember(ns, format_duration(ns))
            texts.append(text)
        return [texts[k] for k in inverse.reshape(-1).tolist()]

    def _args_text(self, function_row: int, args: str) -> str:
        """``(name value, ...)`` of a tracepoint hit's arguments ("" when they do not
        read); the same arguments recur (a socket's address, its state, a message size),
        so each text is made once."""
        key = (function_row, args)
        text = self._args.get(key)
        if text is None:
            values = parse_arguments(args)
            kinds = self.arg_kinds.get(function_row, {})
            text = self._args.remember(key, "" if values is None else "(" + ", ".join(
                f"{k} {self.fmt.show_arg(k, v, kinds.get(k), function_row)}"
                for k, v in values.items()) + ")")
        return text

    def _retvals_of(self, rows: np.ndarray) -> list[str]:
        ev = self.analysis.events
        out = [""] * len(rows)
        shown = np.flatnonzero((ev.phase[rows] != PHASE_ENTRY) & ev.has_retval[rows])
        for i, fid, v in zip(shown.tolist(), ev.function[rows[shown]].tolist(),
                             ev.retval[rows[shown]].tolist()):
            key = (fid, v)
            text = self._retvals.get(key)
            if text is None:
                text = self._retvals.remember(key, self.retval(int(rows[i])))
            out[i] = text
        return out

    def page(self, rows: np.ndarray, *, use_object_depth: bool,
             objects: Optional[Callable[[int], tuple[str, str]]],
             state: dict[str, dict[str, str]]) -> dict[str, Any]:
        """The data of one timeline page, the events at ``rows``: ``objects`` gives an
        object's (label, link) on all-objects pages; ``state`` every field's value, per
        object label, at the page's first row."""
        ev = self.analysis.events
        start = self.start_ns
        comm, tid = ev.comm[rows], ev.tid[rows]
        thread_of, threads = _first_seen(comm.astype(np.int64) << 32 | tid.astype(np.int64))
        fn = ev.function[rows]
        phase = ev.phase[rows]
        data: dict[str, Any] = {
            "fields": self.fields, "entry": PHASE_ENTRY, "point": PHASE_TRACEPOINT,
            "functions": {str(f): function_label(self.names, f)
                          for f in np.unique(fn).tolist()},
            "threads": [thread_label(ev.comms[k >> 32], k & 0xFFFFFFFF) for k in threads],
            "seq": ev.seq[rows].tolist(),
            "t": (ev.ts_ns[rows] - start).tolist(),
            "th": thread_of, "fn": fn.tolist(), "ph": phase.tolist(),
            "d": (ev.object_depth if use_object_depth else ev.depth)[rows].tolist(),
            "dur": self._durations_of(ev.duration_ns[rows]),
            "ret": self._retvals_of(rows),
            "state": state,
        }
        if objects is not None:
            index_of, cells = _first_seen(ev.object[rows])
            data["o"] = index_of
            data["objects"] = [objects(o) for o in cells]
        changes = self._page_changes(rows)
        flagged = (~ev.matched[rows] | ev.unreadable[rows] | ((ev.flags[rows] & FLAG_HEAD_ONLY) != 0)
                   | ((ev.args[rows] >= 0) & (phase == PHASE_TRACEPOINT)))
        tags = {i: self._tags(int(rows[i])) for i in np.flatnonzero(flagged).tolist()}
        data["changes"], data["tags"], data["causes"] = changes, tags, self._cause_list
        return data

    def page_summary(self, rows: np.ndarray) -> dict[str, Any]:
        """What one page holds, for finding rows across pages without loading them: its
        functions (callers that made changes included, as their rows show them),
        threads and fields changed, and its time span."""
        a = self.analysis
        ev, ch = a.events, a.changes
        functions = {function_label(self.names, f) for f in np.unique(ev.function[rows]).tolist()}
        fields: set[str] = set()
        picks = _changes_of(self.change_start[rows], self.change_end[rows])
        for j in np.unique(ch.field[picks]).tolist():
            fields.add(self.fields[j])
        callers = picks[ch.cause[picks] == _CALLER]
        for fid in np.unique(ch.function[callers]).tolist():
            functions.add(self.names.get(fid, a.function_name(fid) if fid >= 0 else ""))
        pairs = np.unique(ev.comm[rows].astype(np.int64) << 32 | ev.tid[rows].astype(np.int64))
        threads = {thread_label(ev.comms[k >> 32], k & 0xFFFFFFFF) for k in pairs.tolist()}
        start = self.start_ns
        return {"fn": functions, "th": threads, "field": fields, "n": len(rows),
                "t": [int(ev.ts_ns[rows[0]]) - start, int(ev.ts_ns[rows[-1]]) - start]
                if len(rows) else [0, 0]}

    def _tags(self, at: int) -> list[list[str]]:
        """[kind, text] each: ``args`` (a tracepoint's arguments), or a kind that also
        marks the row (``unmatched``, ``unreadable``, ``head-only``)."""
        ev = self.analysis.events
        tags = []
        phase = int(ev.phase[at])
        args = ev.args_text(at)
        if phase == PHASE_TRACEPOINT and args:
            text = self._args_text(int(ev.function_row[at]), args)
            if text:
                tags.append(["args", text])
        if not ev.matched[at]:
            tags.append(["unmatched",
                         "no exit seen" if phase == PHASE_ENTRY else "no entry seen"])
        if ev.unreadable[at]:
            tags.append(["unreadable", "unreadable"])
        elif ev.flags[at] & FLAG_HEAD_ONLY:
            tags.append(self.head_tag)
        return tags


def _first_seen(keys: np.ndarray) -> tuple[list[int], list[int]]:
    """Each key's index in order of first appearance, and the keys in that order."""
    uniques, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniques), np.int64)
    rank[order] = np.arange(len(uniques))
    return rank[inverse.reshape(-1)].tolist(), uniques[order].tolist()


def _changes_of(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The change positions of events whose changes lie at [start, end)."""
    has = end > start
    if not has.any():
        return np.zeros(0, np.int64)
    s, e = start[has], end[has]
    lengths = e - s
    offsets = np.repeat(s - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    return np.arange(lengths.sum()) + offsets


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
            + compact_json(out) + ";\n")


def data_file_text(data: dict[str, Any]) -> str:
    """The data file: a script assigning the page's data (JSON is a JavaScript literal)."""
    return (f"/* ctracer timeline rows, drawn by report.js */\n{DATA_VARIABLE} = "
            + compact_json(data) + ";\n")


def read_data_file(text: str) -> dict[str, Any]:
    """The data a data file, or a page's inline data script, assigns (for tests and
    tools)."""
    return json.loads(text[text.index("=") + 1:].rstrip().rstrip(";"))
