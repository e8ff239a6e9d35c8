"""JSON Lines and CSV exports, written by DuckDB from the event table, batch by batch
(`ctracer.export.table.event_tables`), so an export's memory does not grow with the
trace beyond the analysis.

JSON Lines: one event per line with exactly the keys scripts rely on — ``time_ns``,
``cpu``, ``pid``, ``tid``, ``comm``, ``function``, ``phase``, ``object``, ``lifetime``,
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
from typing import BinaryIO, Iterable, Optional, Union

from ctracer.analysis.memory import memory_limit
from ctracer.export.schema import pointers_as_hex
from ctracer.export.table import EVENT_COLUMNS, EventTable
from ctracer.files import let_go, private_umask, staged_output


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


def _copy_batch(con, et: EventTable, fmt: str, path: str, header: bool) -> None:
    """Write one batch of rows to ``path`` with DuckDB's COPY."""
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
        options = f"FORMAT CSV, HEADER {'true' if header else 'false'}"
    con.execute(f"COPY (SELECT {select} FROM events) TO {sql_string(path)} ({options})")
    con.unregister("events")


def _copy_to(tables: Iterable[EventTable], fmt: str, out: BinaryIO) -> None:
    """Write every batch to ``out``, one after the other (a batch is written by DuckDB
    to a scratch file, then appended: lines never span batches, and the CSV header
    comes once)."""
    import duckdb

    with private_umask():
        scratch = tempfile.mkdtemp(prefix="ctracer-export-")
    con = duckdb.connect()
    limit = memory_limit()
    if limit:  # DuckDB's own default is most of the machine's memory
        con.execute(f"SET memory_limit = '{max(limit // 4, 32 << 20) >> 20}MB'")
    try:
        part = os.path.join(scratch, "part")
        for number, et in enumerate(tables):
            _copy_batch(con, et, fmt, part, header=number == 0)
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
            os.unlink(part)
            let_go(out)  # under a memory limit, written pages count until on disk
    finally:
        con.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _write(tables: Union[EventTable, Iterable[EventTable]], fmt: str,
           output: Optional[str]) -> None:
    batches = [tables] if isinstance(tables, EventTable) else tables
    if output is not None:
        with staged_output(output) as staged, open(staged, "wb") as out:
            _copy_to(batches, fmt, out)
        return
    _copy_to(batches, fmt, sys.stdout.buffer)
    sys.stdout.buffer.flush()


def write_jsonl(tables: Union[EventTable, Iterable[EventTable]], output: Optional[str]) -> None:
    """One event per line to ``output`` (stdout when None), from the event table or the
    batches of one (`ctracer.export.table.event_tables`, written as they come)."""
    _write(tables, "jsonl", output)


def write_csv(tables: Union[EventTable, Iterable[EventTable]], output: Optional[str]) -> None:
    """The flat table as CSV with a header line to ``output`` (stdout when None), from
    the event table or the batches of one."""
    _write(tables, "csv", output)
