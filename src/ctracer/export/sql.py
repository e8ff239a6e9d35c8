"""SQL over traces and exports, run by DuckDB (embedded): `ctracer sql`.

Every input becomes part of one view, ``events``, in the export schema
(`ctracer.export.schema`, the columns and types of a Parquet export):

* a trace file is read into its event table (the report stage's lifetimes, depths and
  change attribution included), in that schema;
* a Parquet file is read as it is; a directory is every ``*.parquet`` below it, read with
  Hive partitioning (``host=…/struct=…/``, both read as text), and every trace file
  below it.  Each Parquet file is checked first (`schema.check_file`): one of a newer
  schema, or filed under another struct's partition, is refused in one line.

Inputs are combined by column name, so hosts on different kernels and traces of
different structs (different field columns) query together; a column an input lacks
reads as null.  A header column an older export schema named otherwise
(`schema.OLD_NAMES`: schema 2's ``probe``) is read under its current name, so old and
new exports merge into one column.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from ctracer.errors import CtracerError, InputFileError, UsageError
from ctracer.export.schema import OLD_NAMES, PARTITIONS, check_file, export_table
from ctracer.export.text import sql_string

_SQLITE_MAGIC = b"SQLite format 3\0"
_PARQUET_MAGIC = b"PAR1"
#: partition values are names (a host called 1234 stays text)
_TEXT_PARTITIONS = "{" + ", ".join(f"'{p}': 'VARCHAR'" for p in PARTITIONS) + "}"


@dataclass
class Result:
    """A query's result: the column names and the rows."""

    columns: list[str]
    rows: list[tuple]


def _kind(path: str) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise InputFileError(f"cannot read {path}: {e.strerror or e}") from None
    if head.startswith(_SQLITE_MAGIC):
        return "trace"
    if head.startswith(_PARQUET_MAGIC):
        return "parquet"
    raise InputFileError(f"{path} is neither a ctracer trace file nor a Parquet file")


def _inputs(paths: Sequence[str]) -> tuple[list[str], list[str], list[str]]:
    """(trace files, parquet files, hive directories) named by ``paths``."""
    traces, parquets, dirs = [], [], []
    for path in paths:
        if os.path.isdir(path):
            found = False
            for root, _, files in os.walk(path):
                for name in sorted(files):
                    full = os.path.join(root, name)
                    if name.endswith(".parquet"):
                        check_file(full)
                        found = True
                    elif name.endswith(".ctrace"):
                        traces.append(full)
            if found:
                dirs.append(path)
            elif not any(t.startswith(os.path.join(path, "")) for t in traces):
                raise InputFileError(f"{path} holds no trace file (*.ctrace) and no "
                                     "Parquet file (*.parquet)")
        elif not os.path.exists(path):
            raise InputFileError(f"no such file: {path}")
        elif _kind(path) == "trace":
            traces.append(path)
        else:
            check_file(path)
            parquets.append(path)
    return traces, parquets, dirs


def connect(paths: Sequence[str]):
    """A DuckDB connection with the view ``events`` over ``paths``."""
    import duckdb

    from ctracer import analysis
    from ctracer.export.table import event_table

    if not paths:
        raise UsageError("give at least one trace file, Parquet file or directory")
    traces, parquets, dirs = _inputs(paths)
    con = duckdb.connect()
    parts = []
    for i, path in enumerate(traces):
        table = export_table(event_table(analysis.load(path, snapshots=True)))
        con.register(f"trace_{i}", table)
        parts.append(f"SELECT * FROM trace_{i}")
    for path in parquets:
        parts.append(f"SELECT * FROM read_parquet({sql_string(path)})")
    for path in dirs:
        pattern = os.path.join(path, "**", "*.parquet")
        parts.append(f"SELECT * FROM read_parquet({sql_string(pattern)}, "
                     f"hive_partitioning = true, hive_types = {_TEXT_PARTITIONS}, "
                     "union_by_name = true)")
    con.execute("CREATE VIEW inputs AS " + " UNION ALL BY NAME ".join(parts))
    columns = [row[0] for row in con.execute("DESCRIBE inputs").fetchall()]
    con.execute(f"CREATE VIEW events AS SELECT {_current_names(columns)} FROM inputs")
    return con


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _current_names(columns: list[str]) -> str:
    """The select list reading ``columns`` (the inputs' union) with every column of an
    older schema under its current name: one column, from whichever input has it, where
    the first of the two names stands."""
    picks, done = [], set()
    for name in columns:
        now = next((n for n, was in OLD_NAMES.items() if name in (n, was)), None)
        if now is None:
            picks.append(_quoted(name))
        elif now not in done:
            done.add(now)
            present = [_quoted(n) for n in (now, OLD_NAMES[now]) if n in columns]
            value = present[0] if len(present) == 1 else f"coalesce({', '.join(present)})"
            picks.append(f"{value} AS {_quoted(now)}")
    return ", ".join(picks)


def run_sql(query: str, paths: Sequence[str]) -> Result:
    """Run ``query`` over the ``events`` view of ``paths``."""
    import duckdb

    con = connect(paths)
    try:
        cursor = con.execute(query)
        columns = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchall() if columns else []
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CtracerError(f"SQL: {first}") from None
    finally:
        con.close()
    return Result(columns, rows)


def format_table(result: Result) -> str:
    """Aligned text columns with a header, numbers right-aligned."""
    def cell(v: Any) -> str:
        return "NULL" if v is None else str(v)

    cells = [[cell(v) for v in row] for row in result.rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(result.columns)]
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in result.rows)
               for i in range(len(result.columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(result.columns), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out) + "\n"
