"""Run SQL (DuckDB, embedded) over trace files and their exports: every input is one view,
`events` (one row per event; the columns and types of `ctracer export --format parquet`,
the export schema of docs/exports-and-fleet.md, fields as columns named by their dotted path — quote
them: "__sk_common.skc_state")."""

from __future__ import annotations

import argparse
import csv
import json
import sys

FORMATS = ("table", "csv", "json")

EPILOG = """\
examples:
  ctracer sql "SELECT function, count(*) AS calls FROM events GROUP BY 1 ORDER BY 2 DESC" sock.ctrace
  # calls per function, per host and kernel, over many hosts' exports
  ctracer sql "SELECT host, kernel, function, count(*) AS calls FROM events
               WHERE phase <> 'entry' GROUP BY ALL ORDER BY host, calls DESC" dataset/
  # field changes per host and function (docs/exports-and-fleet.md: which function changes each most)
  ctracer sql "SELECT host, field, changed_by, count(*) AS changes
               FROM (SELECT host, changed_by, unnest(changed) AS field FROM events)
               GROUP BY ALL ORDER BY changes DESC" dataset/
  ctracer sql --format csv "SELECT * FROM events WHERE object = '0xffff8880123c0000'" a.ctrace b.parquet
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer sql``."""
    parser.add_argument("query", metavar="SQL", help="a query over the view `events`")
    parser.add_argument("inputs", metavar="TRACE_OR_DIR", nargs="+",
                        help="trace files, Parquet files, or directories of them (Hive "
                             "partitions host=…/struct=…/ become columns)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--format", "-f", choices=FORMATS, default="table",
                     help="table: aligned columns (default); csv: CSV with a header line; "
                          "json: one JSON object per row")
    # the spellings of releases before 2026-12, as `--format csv|json`
    how.add_argument("--csv", dest="format", action="store_const", const="csv",
                     help=argparse.SUPPRESS)
    how.add_argument("--json", dest="format", action="store_const", const="json",
                     help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """``ctracer sql``: run the query over the traces' or Parquet files' events and print
    the rows as a table, CSV or JSON lines."""
    from ctracer.export.sql import format_table, run_sql

    result = run_sql(args.query, args.inputs)
    if args.format == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(result.columns)
        w.writerows(result.rows)
    elif args.format == "json":
        for row in result.rows:
            print(json.dumps(dict(zip(result.columns, row)), default=str))
    else:
        sys.stdout.write(format_table(result))
    return 0
