"""The index's object list as data for the browser.

A trace of ten thousand objects made ``index.html`` a table of ~4 MB.  The index is now
a small page whose script (``_static/report.js``) draws the object table a page at a
time from ``objects.js`` beside it, loaded with a ``<script src>`` (file:// refuses
``fetch``): the filter box searches every object, a click on a header sorts all of them.

The data file assigns ``CTRACER_OBJECTS``: ``columns`` names the fields of each row,
``rows`` holds one list per object, ``why`` the texts of how lifetimes began (they
repeat, so a row holds an index into it), ``summary_columns`` the names of the
texts in each row's ``summary`` (local and remote address:port, states...: what
names the object, searched by the filter too) and ``counts`` the counts shown
(``calls``, ``hits``: those the trace's probe kinds fill).  Every text is plain text,
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
#: the counts an object may have: function calls, tracepoint hits
COUNTS = ("calls", "hits")


def objects_data(objects: list[dict[str, Any]], summary_columns: Sequence[str] = (),
                 counts: Sequence[str] = ("calls",)) -> dict[str, Any]:
    """The data of the object list: ``objects`` are dicts keyed by `COLUMNS`, ``began``
    a text, ``dir`` the object's directory ("" when it has no pages), ``summary``
    the texts of ``summary_columns`` (`ctracer.report.summaries`); ``counts``: which
    of `COUNTS` the list shows (those the trace's probe kinds fill)."""
    why: dict[str, int] = {}
    rows = []
    for o in objects:
        row = [o.get(name, []) if name == "summary" else
               o.get(name, 0) if name in COUNTS else o[name] for name in COLUMNS]
        row[3] = why.setdefault(str(o["began"]), len(why))
        rows.append(row)
    return {"columns": COLUMNS, "why": list(why), "rows": rows,
            "summary_columns": list(summary_columns),
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
        out.append(o)
    return out
