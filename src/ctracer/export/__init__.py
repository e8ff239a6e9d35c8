"""The export stage: a trace file as data other tools read.

`table.event_table` turns a trace into one columnar table (a `pyarrow.Table`, one row per
event in time order), with lifetimes, call depths and field-change attribution computed
by the analysis stage (`ctracer.analysis.load`), which the report reads too, so an export
and a report never disagree.  The writers, each in its own module:

* `text` — JSON Lines (one event per line, the keys scripts rely on) and CSV, written
  by DuckDB from the table;
* `perfetto` — Chrome trace JSON that the Perfetto UI opens: a track per object, a
  slice per call, field changes as the slice's args;
* `schema` — the export schema: one column type per kind of member, whatever the
  kernel or build (so many hosts' exports merge), its version, and the checks of files;
* `parquet` — that schema written as one file or Hive-partitioned
  (``host=…/struct=…/``) for DuckDB, Spark or Trino;
* `folded` — folded stacks (``a;b;c N``) for flamegraph.pl, inferno and speedscope:
  the report's flame view as lines;
* `sql` — DuckDB (embedded) over trace files and exports together.

Heavy libraries (numpy, pyarrow, duckdb) are imported only when an export runs.
"""

from __future__ import annotations

FORMATS = ("jsonl", "csv", "perfetto", "parquet", "folded")
