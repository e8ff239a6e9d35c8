"""The index's object list as data for the browser.

A trace of ten thousand objects made ``index.html`` a table of ~4 MB.  The index is now
a small page whose script (``_static/report.js``) draws the object table a page at a
time from ``objects.js`` beside it, loaded with a ``<script src>`` (file:// refuses
``fetch``): the filter box searches every object, a click on a header sorts all of them.

The data file assigns ``CTRACER_OBJECTS``: ``columns`` names the fields of each row,
``rows`` holds one list per object, ``why`` the texts of how lifetimes began (they
repeat, so a row holds an index into it), ``summary_columns`` the names of the
texts in each row's ``summary`` (local and remote address:port, states...: what
names the object, searched by the filter too; a text that repeats across objects is
an index into ``texts``) and ``counts`` the counts shown (``calls``, ``hits``: those
the trace's probe kinds fill).  A row's ``dir`` is `SAME_AS_LABEL` when the object's
directory has its label's name.  (At 14,000 objects these two made the file 2.15 MB,
over the 2 MB a page may take; 1.5 MB without them.)  Every text is plain text,
made into DOM text by the page (never markup).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ctracer.report.jsontext import compact_json

#: the variable the data file assigns (report.js reads it)
OBJECTS_VARIABLE = "CTRACER_OBJECTS"
#: the data file, beside index.html
OBJECTS_FILE = "objects.js"
#: the fields of a row, in order
COLUMNS = ["label", "dir", "lifetime", "began", "first", "last", "events", "calls",
           "hits", "changes", "fields", "summary"]
#: a row's ``dir`` when the object's directory is named as its label (most are)
SAME_AS_LABEL = 1
#: the counts an object may have: function calls, tracepoint hits
COUNTS = ("calls", "hits")


def objects_data(objects: list[dict[str, Any]], summary_columns: Sequence[str] = (),
                 counts: Sequence[str] = ("calls",)) -> dict[str, Any]:
    """The data of the object list: ``objects`` are dicts keyed by `COLUMNS`, ``began``
    a text, ``dir`` the object's directory ("" when it has no pages), ``summary``
    the texts of ``summary_columns`` (`ctracer.report.summaries`); ``counts``: which
    of `COUNTS` the list shows (those the trace's probe kinds fill)."""
    why: dict[str, int] = {}
    seen: dict[str, int] = {}
    for o in objects:
        for t in o.get("summary", []):
            seen[t] = seen.get(t, 0) + 1
    texts: dict[str, int] = {}
    at = {name: k for k, name in enumerate(COLUMNS)}
    rows = []
    for o in objects:
        row = [o.get(name, []) if name == "summary" else
               o.get(name, 0) if name in COUNTS else o[name] for name in COLUMNS]
        row[at["began"]] = why.setdefault(str(o["began"]), len(why))
        if row[at["dir"]] and row[at["dir"]] == row[at["label"]]:
            row[at["dir"]] = SAME_AS_LABEL
        row[at["summary"]] = [texts.setdefault(t, len(texts)) if seen[t] > 1 else t
                              for t in row[at["summary"]]]
        rows.append(row)
    return {"columns": COLUMNS, "why": list(why), "rows": rows,
            "summary_columns": list(summary_columns), "texts": list(texts),
            "counts": [c for c in counts if c in COUNTS]}


def objects_file_text(data: dict[str, Any]) -> str:
    """The data file: a script assigning the data (JSON is a JavaScript literal)."""
    return (f"/* ctracer object list, drawn by report.js */\n{OBJECTS_VARIABLE} = "
            + compact_json(data) + ";\n")


def read_objects_file(text: str) -> list[dict[str, Any]]:
    """The objects a data file lists, one dict each keyed by `COLUMNS` (for tests and
    tools)."""
    data = json.loads(text[text.index("=") + 1:].rstrip().rstrip(";"))
    out = []
    for row in data["rows"]:
        o = dict(zip(data["columns"], row))
        o["began"] = data["why"][o["began"]]
        if o["dir"] == SAME_AS_LABEL:
            o["dir"] = o["label"]
        o["summary"] = [data["texts"][t] if isinstance(t, int) else t for t in o["summary"]]
        out.append(o)
    return out
