"""JSON Lines and CSV exports, written by DuckDB from the event table, batch by batch
(`ctracer.export.table.event_tables`), so an export's memory does not grow with the
trace beyond the analysis.

JSON Lines: one event per line with exactly the keys scripts rely on — ``time_ns``,
``cpu``, ``pid``, ``tid``, ``comm``, ``function``, ``phase``, ``object``, ``lifetime``,
``depth``, ``ret``, ``args`` (an object, or null) and ``fields`` (the snapshot as an
object keyed by dotted member path; null when the object could not be read or the event
has none).  CSV: the flat table (`ctracer.export.table`), fields as columns,
``changed`` as JSON text.  In both, values are as recorded except a network-order port
or address, written as the pages and ``--where`` spell it (port 47123 in host order,
``10.0.0.1``) with the recorded value beside it as ``PATH:raw``, and an enum's
enumerator name beside its value as ``PATH:name`` (``TCP_LISTEN``), as in Parquet.  In both, pointers (in ``args`` and pointer fields,
``--pointers``) are hex strings, ``"0xffff…"``, as in Parquet: a 64-bit address as a
JSON number loses digits in jq and JavaScript.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from typing import BinaryIO, Iterable, Optional, Union

from ctracer.analysis.memory import memory_limit
from ctracer.errors import CtracerError
from ctracer.export.schema import ENUM_NAME, RAW, as_shown, enum_names, pointers_as_hex
from ctracer.export.table import EVENT_COLUMNS, EventTable
from ctracer.files import let_go, private_temp_dir, staged_output


def quote(name: str) -> str:
    """A column name as an SQL identifier (field paths have dots)."""
    return '"' + name.replace('"', '""') + '"'


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def _fields_as_written(et: EventTable):
    """``et``'s table with each field written as in Parquet: pointers as hex strings
    (`pointers_as_hex`), an enum's names in a ``:name`` column after it, a network-order port or address as shown, its recorded value
    in a ``:raw`` column right after it (`as_shown`); and the field columns as
    (key in ``fields``, column) pairs, in order."""
    import pyarrow as pa
    layout = {f.name: f for f in et.layout.fields} if et.layout is not None else {}
    t = et.table
    keyed = []
    for field, column in et.fields.items():
        f = layout.get(field)
        data = t.column(column).combine_chunks()
        shown = as_shown(f, column, data)
        if shown is None:
            i = t.column_names.index(column)
            if f is not None and f.kind == "pointer":
                t = t.set_column(i, column, pointers_as_hex(f, data))
            keyed.append((field, column))
            named = enum_names(f, data)
            if named is not None:
                t = t.add_column(i + 1, pa.field(column + ENUM_NAME, named.type), named)
                keyed.append((field + ENUM_NAME, column + ENUM_NAME))
            continue
        i = t.column_names.index(column)
        (_, value), (raw_column, raw) = shown
        t = t.set_column(i, column, value)
        t = t.add_column(i + 1, pa.field(raw_column, raw.type), raw)
        keyed += [(field, column), (field + RAW, raw_column)]
    return t, keyed


def _jsonl_table(et: EventTable):
    import pyarrow as pa
    import pyarrow.compute as pc

    t, keyed = _fields_as_written(et)
    if keyed:
        arrays = [t.column(column).combine_chunks() for _, column in keyed]
        valid = arrays[0].is_valid()
        for a in arrays[1:]:
            valid = pc.or_(valid, a.is_valid())
        fields = pa.StructArray.from_arrays(arrays, names=[key for key, _ in keyed],
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
        table, _ = _fields_as_written(et)
        con.register("events", table)
        select = ", ".join("to_json(changed) AS changed" if c == "changed" else quote(c)
                           for c in table.column_names)
        options = f"FORMAT CSV, HEADER {'true' if header else 'false'}"
    con.execute(f"COPY (SELECT {select} FROM events) TO {sql_string(path)} ({options})")
    con.unregister("events")


class DuckDBOutOfMemory(CtracerError):
    """DuckDB, which writes JSON Lines and CSV, ran out of the memory it may use."""


def _connect(scratch: str):
    """A DuckDB connection for the COPYs.  Under a memory limit DuckDB may use a quarter
    of it (`duckdb_limit`; its own default is most of the machine's memory) and one
    thread (each thread holds its own buffers of the text it writes: at 256 MB, 100,000
    rows of 150 fields failed asking 512 MB with the default two threads and were
    written with one), and spills to ``scratch``."""
    import duckdb

    con = duckdb.connect()
    limit = memory_limit()
    if limit:
        con.execute(f"SET memory_limit = '{duckdb_limit(limit) >> 20}MB'")
        con.execute("SET threads = 1")
        con.execute(f"SET temp_directory = {sql_string(os.path.join(scratch, 'spill'))}")
    return con


#: what DuckDB needs to write JSON of a wide struct whatever the batch: it makes the
#: text 2,048 rows at a time, and the rows of every field of struct sock (~130 keys)
#: took 51 MB of its memory and asked 16 MB more
DUCKDB_LEAST = 128 << 20


def duckdb_limit(limit: int) -> int:
    """The memory DuckDB may use under a memory limit of ``limit`` bytes: a quarter of
    it, `DUCKDB_LEAST` if that is more and no more than half of it, 32 MB at least."""
    return max(limit // 4, min(limit // 2, DUCKDB_LEAST), 32 << 20)


def _out_of_memory(fmt: str, e: Exception) -> DuckDBOutOfMemory:
    limit = memory_limit()
    held = (f"the {duckdb_limit(limit) >> 20} MB it may use (under the memory limit of "
            f"{limit >> 20} MB)") if limit else "memory"
    said = str(e).strip().splitlines()[0] if str(e).strip() else ""
    said = re.sub(r"^Out of Memory Error:\s*|\s*\([^)]*used\)$", "", said)
    return DuckDBOutOfMemory(
        f"out of memory: DuckDB, which writes the {fmt} export, ran out of {held}"
        f"{': ' + said if said else ''}; the output was not written; try more memory, "
        "or --format parquet (written without DuckDB)")


def _copy_to(tables: Iterable[EventTable], fmt: str, out: BinaryIO) -> None:
    """Write every batch to ``out``, one after the other (a batch is written by DuckDB
    to a scratch file, then appended: lines never span batches, and the CSV header
    comes once).  A batch is let go of before the next is made."""
    import duckdb

    scratch = private_temp_dir("ctracer-export-")
    try:
        con = _connect(scratch)
        try:
            part = os.path.join(scratch, "part")
            batches = iter(tables)
            et = next(batches, None)
            number = 0
            while et is not None:
                try:
                    _copy_batch(con, et, fmt, part, header=number == 0)
                except duckdb.OutOfMemoryException as e:
                    raise _out_of_memory(fmt, e) from None
                et = None
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
                os.unlink(part)
                let_go(out)  # under a memory limit, written pages count until on disk
                number += 1
                et = next(batches, None)
        finally:
            con.close()
    finally:
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
