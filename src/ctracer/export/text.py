"""JSON Lines and CSV exports, written by DuckDB from the event table.

JSON Lines: one event per line with exactly the keys scripts rely on — ``time_ns``,
``cpu``, ``pid``, ``tid``, ``comm``, ``function``, ``probe``, ``object``, ``lifetime``,
``depth``, ``ret``, ``args`` (an object, or null) and ``fields`` (the snapshot as an
object keyed by dotted member path, raw values; null when the object could not be read
or the event has none).  CSV: the flat table (`ctracer.export.table`), fields as
columns, ``changed`` as JSON text.  In both, pointers (in ``args`` and pointer fields,
``--pointers``) are hex strings, ``"0xffff…"``, as in Parquet: a 64-bit address as a
JSON number loses digits in jq and JavaScript.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Optional

from ctracer.export.schema import pointers_as_hex
from ctracer.export.table import EVENT_COLUMNS, EventTable
from ctracer.files import private_umask, staged_output


def quote(name: str) -> str:
    """A column name as an SQL identifier (field paths have dots)."""
    return '"' + name.replace('"', '""') + '"'


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _pointer_fields(et: EventTable, t):
    """``t`` with each pointer field's column as hex strings (`pointers_as_hex`)."""
    layout = {f.name: f for f in et.layout.fields} if et.layout is not None else {}
    for field, column in et.fields.items():
        f = layout.get(field)
        if f is not None and f.kind == "pointer":
            i = t.column_names.index(column)
            t = t.set_column(i, column, pointers_as_hex(f, t.column(column).combine_chunks()))
    return t


def _jsonl_table(et: EventTable):
    import pyarrow as pa
    import pyarrow.compute as pc

    t = _pointer_fields(et, et.table)
    if et.fields:
        arrays = [t.column(column).combine_chunks() for column in et.fields.values()]
        valid = arrays[0].is_valid()
        for a in arrays[1:]:
            valid = pc.or_(valid, a.is_valid())
        fields = pa.StructArray.from_arrays(arrays, names=list(et.fields),
                                            mask=pc.invert(valid))
    else:
        fields = pa.nulls(t.num_rows, pa.struct([]))
    return t.select(list(EVENT_COLUMNS)).append_column("fields", fields)


def _copy_to(et: EventTable, fmt: str, path: str) -> None:
    import duckdb

    con = duckdb.connect()
    if fmt == "jsonl":
        con.register("events", _jsonl_table(et))
        select = ", ".join("args::JSON AS args" if c == "args" else quote(c)
                           for c in EVENT_COLUMNS) + ", fields"
        options = "FORMAT JSON"
    else:
        table = _pointer_fields(et, et.table)
        con.register("events", table)
        select = ", ".join("to_json(changed) AS changed" if c == "changed" else quote(c)
                           for c in table.column_names)
        options = "FORMAT CSV, HEADER"
    con.execute(f"COPY (SELECT {select} FROM events) TO {sql_string(path)} ({options})")
    con.close()


def _write(et: EventTable, fmt: str, output: Optional[str]) -> None:
    if output is not None:
        with staged_output(output) as staged:
            _copy_to(et, fmt, staged)
        return
    with private_umask():
        scratch = tempfile.mkdtemp(prefix="ctracer-export-")
    try:
        staged = os.path.join(scratch, "out")
        _copy_to(et, fmt, staged)
        with open(staged, "rb") as f:
            shutil.copyfileobj(f, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_jsonl(et: EventTable, output: Optional[str]) -> None:
    """One event per line to ``output`` (stdout when None)."""
    _write(et, "jsonl", output)


def write_csv(et: EventTable, output: Optional[str]) -> None:
    """The flat table as CSV with a header line to ``output`` (stdout when None)."""
    _write(et, "csv", output)
