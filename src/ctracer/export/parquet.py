"""Parquet exports: one row per event, the snapshot's fields as columns.

Schema (one file per trace; the same columns as `ctracer.export.table`):

==================  ==============  ====================================================
column              type            meaning
==================  ==============  ====================================================
time_ns             int64           probe time, CLOCK_MONOTONIC of the traced host
cpu, pid, tid       uint32          where the probe fired
comm                string          the thread's command name
function            string          the probed function (tracepoints as ``tp:NAME``)
probe               string          ``entry``, ``exit`` or ``tracepoint``
object              string          hex address of the object (null: none)
lifetime            int32           1, 2, … for successive objects at one address; 0 none
depth               int32           open traced calls of the thread around the event
ret                 int64           return value (exits of functions returning one)
args                string          tracepoint arguments by name, as a JSON object
changed             list<string>    fields that differ from the object's previous event
changed_by          string          the function the report credits with those changes
unreadable          bool            the probe could not read the object
<field path>        per C type      one column per mini-struct field, named by its dotted
                                    member path (``__sk_common.skc_state``; ``fields.X``
                                    where X is one of these names); char arrays as text
host                string          host name of the recording
kernel              string          kernel release of the recording
struct              string          the traced struct
trace_id            string          the recording's id (one per trace file)
==================  ==============  ====================================================

Written from the table's Arrow columns (numpy arrays underneath) with pyarrow, zstd
compressed.  ``-o FILE.parquet`` writes one file; ``-o DIR`` writes Hive-partitioned
files, ``DIR/host=H/struct=S/TRACE_ID.parquet`` (host and struct then come from the
path, as Hive, DuckDB, Spark and Trino expect), so the exports of many hosts dropped
into one directory read as one table.
"""

from __future__ import annotations

import os

from ctracer.export.table import EventTable
from ctracer.files import make_private_dir, safe_name, staged_output

PARTITION_COLUMNS = ("host", "struct")


def is_single_file(output: str) -> bool:
    """``-o`` names one Parquet file (ends in .parquet and is not a directory)."""
    return output.endswith(".parquet") and not os.path.isdir(output)


def write_parquet(et: EventTable, output: str) -> str:
    """Write ``et`` to ``output`` (a file or a Hive-partitioned directory); the path of
    the file written."""
    import pyarrow.parquet as pq

    if is_single_file(output):
        with staged_output(output) as staged:
            pq.write_table(et.table, staged, compression="zstd")
        return output
    values = et.trace_columns
    directory = make_private_dir(output)
    for column in PARTITION_COLUMNS:
        directory = make_private_dir(os.path.join(
            directory, f"{column}={safe_name(values[column] or 'unknown', column)}"))
    path = os.path.join(directory, f"{safe_name(values['trace_id'], 'trace')}.parquet")
    table = et.table.drop_columns(list(PARTITION_COLUMNS))
    with staged_output(path) as staged:
        pq.write_table(table, staged, compression="zstd")
    return path
