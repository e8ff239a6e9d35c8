"""Parquet exports: one row per event, the snapshot's fields as columns, in the export
schema (`ctracer.export.schema`: every column's type, the companions of enums and flag
words, the schema version; documented in docs/exports-and-fleet.md, "The export schema").

Written with pyarrow's ParquetWriter from the table's Arrow columns, zstd compressed,
batch by batch (`ctracer.export.table.event_tables`: a row group or more each), so an
export's memory does not grow with the trace beyond the analysis.  ``-o
FILE.parquet`` writes one file; ``-o DIR`` writes Hive-partitioned files,
``DIR/host=H/struct=S/TRACE_ID.parquet`` (host and struct then come from the path, as
Hive, DuckDB, Spark and Trino expect), so the exports of many hosts dropped into one
directory read as one table.  Such a directory is checked first: ``-o`` inside one of
its partition folders, or a dataset holding a newer schema's files, is refused in one
line.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator, Union

from ctracer.export.schema import PARTITIONS, check_output_directory, export_table, file_metadata
from ctracer.export.table import EventTable
from ctracer.files import make_private_dir, safe_name, staged_output


def is_single_file(output: str) -> bool:
    """``-o`` names one Parquet file (ends in .parquet and is not a directory)."""
    return output.endswith(".parquet") and not os.path.isdir(output)


def _write(tables: Iterator, et: EventTable, path: str, drop: tuple[str, ...] = ()) -> None:
    """Write the export tables of ``et`` and of the ones ``tables`` gives after it, a
    row group or more each, as one file; a batch is let go of before the next is made
    (under a memory limit two batches at once may not fit)."""
    import pyarrow.parquet as pq
    metadata = file_metadata(et)
    with staged_output(path) as staged:
        table = export_table(et).drop_columns(list(drop))
        et = None  # type: ignore[assignment]
        # no ARROW:schema: every engine, pyarrow too, sees the Parquet types themselves
        with pq.ParquetWriter(staged, table.schema, compression="zstd",
                              store_schema=False) as writer:
            while table is not None:
                writer.write_table(table)
                table = None
                more = next(tables, None)
                if more is not None:
                    table = export_table(more).drop_columns(list(drop))
                    more = None
            writer.add_key_value_metadata(metadata)


def write_parquet(tables: Union[EventTable, Iterable[EventTable]], output: str) -> str:
    """Write the event table (or the batches of one, `ctracer.export.table.event_tables`,
    written as they come) to ``output`` (a file or a Hive-partitioned directory); the
    path of the file written."""
    batches = iter([tables] if isinstance(tables, EventTable) else tables)
    first = [next(batches)]  # handed over, so that `_write` can let go of it
    if is_single_file(output):
        _write(batches, first.pop(), output)
        return output
    check_output_directory(output, first[0].struct_name)
    values = first[0].trace_columns
    directory = make_private_dir(output)
    for column in PARTITIONS:
        directory = make_private_dir(os.path.join(
            directory, f"{column}={safe_name(values[column] or 'unknown', column)}"))
    path = os.path.join(directory, f"{safe_name(values['trace_id'], 'trace')}.parquet")
    _write(batches, first.pop(), path, PARTITIONS)
    return path
