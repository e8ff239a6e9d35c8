"""Parquet exports: one row per event, the snapshot's fields as columns, in the export
schema (`ctracer.export.schema`: every column's type, the companions of enums and flag
words, the schema version; documented in README.md, "The export schema").

Written with pyarrow from the table's Arrow columns, zstd compressed.  ``-o
FILE.parquet`` writes one file; ``-o DIR`` writes Hive-partitioned files,
``DIR/host=H/struct=S/TRACE_ID.parquet`` (host and struct then come from the path, as
Hive, DuckDB, Spark and Trino expect), so the exports of many hosts dropped into one
directory read as one table.  Such a directory is checked first: ``-o`` inside one of
its partition folders, or a dataset holding a newer schema's files, is refused in one
line.
"""

from __future__ import annotations

import os

from ctracer.export.schema import PARTITIONS, check_output_directory, export_table, file_metadata
from ctracer.export.table import EventTable
from ctracer.files import make_private_dir, safe_name, staged_output


def is_single_file(output: str) -> bool:
    """``-o`` names one Parquet file (ends in .parquet and is not a directory)."""
    return output.endswith(".parquet") and not os.path.isdir(output)


def _write(table, et: EventTable, path: str) -> None:
    import pyarrow.parquet as pq
    with staged_output(path) as staged:
        # no ARROW:schema: every engine, pyarrow too, sees the Parquet types themselves
        with pq.ParquetWriter(staged, table.schema, compression="zstd",
                              store_schema=False) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata(file_metadata(et))


def write_parquet(et: EventTable, output: str) -> str:
    """Write ``et`` to ``output`` (a file or a Hive-partitioned directory); the path of
    the file written."""
    table = export_table(et)
    if is_single_file(output):
        _write(table, et, output)
        return output
    check_output_directory(output, et.struct_name)
    values = et.trace_columns
    directory = make_private_dir(output)
    for column in PARTITIONS:
        directory = make_private_dir(os.path.join(
            directory, f"{column}={safe_name(values[column] or 'unknown', column)}"))
    path = os.path.join(directory, f"{safe_name(values['trace_id'], 'trace')}.parquet")
    _write(table.drop_columns(list(PARTITIONS)), et, path)
    return path
