"""Export a trace file for other tools: JSON Lines (one event per line, for scripts), CSV,
Perfetto (Chrome trace JSON: a track per object, a slice per call, field changes as
args), Parquet (one row per event, fields as columns; a directory gets
Hive-partitioned files host=…/struct=…/ that DuckDB, Spark and Trino read as one table),
or folded stacks (``a;b;c N``) for flamegraph.pl, inferno and speedscope."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Iterator, Optional

EPILOG = """\
examples:
  ctracer export sock.ctrace --format jsonl | jq .fields     # one event per line
  ctracer export sock.ctrace --format csv -o sock.csv
  ctracer export sock.ctrace --format perfetto -o sock.json  # open in ui.perfetto.dev
  ctracer export sock.ctrace --format parquet -o sock.parquet
  ctracer export sock.ctrace --format parquet -o dataset/    # dataset/host=…/struct=sock/…
  ctracer export sock.ctrace --format parquet --host web-1 -o dataset/   # host=web-1/…
  ctracer export sock.ctrace --format folded | flamegraph.pl > sock.svg  # ns per stack
  ctracer export sock.ctrace --format folded --weight calls --per-object -o sock.folded
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer export``."""
    from ctracer.export import FORMATS

    parser.add_argument("trace", metavar="TRACE", help="a trace file written by `ctracer trace`")
    parser.add_argument("--format", "-f", choices=FORMATS, default="jsonl",
                        help="jsonl (default), csv, perfetto, parquet or folded")
    parser.add_argument("-o", "--output", metavar="FILE|DIR",
                        help="where to write: jsonl and csv go to stdout by default; "
                             "perfetto to TRACE.perfetto.json; parquet to TRACE.parquet, or "
                             "with a directory, Hive-partitioned files under it. An existing "
                             "file is kept as FILE.old")
    parser.add_argument("--host", metavar="NAME",
                        help="the host column of csv and parquet exports (and parquet's "
                             "host=NAME/ folder): default the trace's host; give one when "
                             "machines named alike recorded traces (letters, digits, _.-)")


    parser.add_argument("--weight", choices=("time", "calls"), default=None,
                        help="folded: what a stack's number counts: time (default; ns in "
                             "that stack's calls, not in traced calls they made) or calls "
                             "(the calls at exactly that stack)")
    parser.add_argument("--per-object", action="store_true",
                        help="folded: each object's calls nested among its own, under a "
                             "first frame naming the object (default: the threads' stacks "
                             "over all objects)")


def default_output(trace: str, fmt: str):
    """Where a format writes without ``-o``: beside the trace for perfetto and parquet;
    None (stdout) for the others."""
    stem = trace[:-len(".ctrace")] if trace.endswith(".ctrace") else trace
    return {"perfetto": f"{stem}.perfetto.json", "parquet": f"{stem}.parquet"}.get(fmt)


def check_host(host, fmt: str) -> None:
    """``--host``: a name that is its own partition folder, for formats with a host."""
    from ctracer.errors import UsageError
    from ctracer.files import safe_name

    if host is None:
        return
    if fmt not in ("csv", "parquet"):
        raise UsageError(f"--host names the host column of csv and parquet exports; "
                         f"{fmt} has none")
    if not host or safe_name(host) != host:
        raise UsageError(f"--host {host!r}: a host name is letters, digits, '_', '.' "
                         "and '-' (it names the export's host=NAME/ folder)")


def check_folded_options(args: argparse.Namespace) -> None:
    """Refuse ``--weight`` and ``--per-object`` outside ``--format folded``."""
    from ctracer.errors import UsageError

    if args.format != "folded" and (args.weight is not None or args.per_object):
        raise UsageError("--weight and --per-object are options of --format folded")


def export_progress(args: argparse.Namespace) -> Optional[Callable[[str], None]]:
    """A line redrawn on stderr while a long export reads, analyses and writes, when
    stderr is a terminal (and the export does not go to that terminal); None
    otherwise: nothing is printed."""
    if not sys.stderr.isatty() or (args.output is None and args.format in ("jsonl", "csv")
                                   and sys.stdout.isatty()):
        return None

    def show(message: str) -> None:
        print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)
    return show


def run(args: argparse.Namespace) -> int:
    """``ctracer export``: write the trace in the format asked, in a child process whose
    OOM kill is reported in one line."""
    from ctracer.commands.supervised import run_supervised

    progress = export_progress(args)

    def on_killed(why: str, out_of_memory: bool) -> str:
        if progress:
            print("\r\033[K", end="", file=sys.stderr)
        return (f"{why}; the output was not written (an export is renamed into place "
                "only when complete)" + ("; try more memory" if out_of_memory else ""))

    def work() -> int:
        try:
            return _export(args, progress)
        finally:
            if progress:
                print("\r\033[K", end="", file=sys.stderr, flush=True)

    # in a child: when a memory limit's OOM killer ends it, this process says so
    return run_supervised(work, "the export", on_killed)


def _written(tables: Iterator, total: int, say: Callable[[str], None]) -> Iterator:
    """``tables`` (batches of rows), saying how many rows were handed to the writer."""
    done = 0
    for t in tables:
        done += t.table.num_rows
        say(f"writing events: {done} of {total} ({100 * done // max(total, 1)}%)")
        yield t


def _export(args: argparse.Namespace,
            progress: Optional[Callable[[str], None]] = None) -> int:
    from ctracer import analysis
    from ctracer.export import perfetto, parquet, text
    from ctracer.export.table import event_tables
    from ctracer.tracefile import Trace, decoding_progress

    check_host(args.host, args.format)
    check_folded_options(args)
    trace = Trace(args.trace, progress=decoding_progress())
    output = args.output or default_output(args.trace, args.format)
    if trace.incomplete:
        print(f"ctracer: warning: {args.trace}: {trace.incomplete}", file=sys.stderr)
    try:
        # a big trace's arrays go in unnamed files beside the output (`analysis.mapped`)
        beside = os.path.dirname(os.path.abspath(output)) if output else None  # None: stdout
        analysed = analysis.load(trace, progress,
                                 snapshots=args.format not in ("perfetto", "folded"),
                                 spill_dir=beside if beside and os.path.isdir(beside) else None)
    finally:
        trace.close()
    if args.format == "perfetto":
        perfetto.write_perfetto(analysed, output)
        written = output
    elif args.format == "folded":
        from ctracer.export import folded

        weight = args.weight or "time"
        lines = folded.folded_text(analysed, weight, args.per_object)
        if not lines:
            from ctracer.errors import UsageError

            raise UsageError("no call in this trace was timed (tracepoint hits only?): "
                             "use --weight calls" if weight == "time" and len(analysed.events)
                             else "no calls or hits to fold in this trace")
        folded.write_lines(lines, output)
        written = output
    else:
        # batch by batch, as they are written (`event_tables`), fewer rows a batch
        # under a memory limit
        from ctracer.export.table import rows_at_once

        table = event_tables(analysed, rows_at_once(analysed))
        if progress:
            table = _written(table, len(analysed.events), progress)
        if args.host is not None:
            table = (t.with_host(args.host) for t in table)
        if args.format == "jsonl":
            text.write_jsonl(table, output)
        elif args.format == "csv":
            text.write_csv(table, output)
        else:
            written = parquet.write_parquet(table, output)
        if args.format != "parquet":
            written = output
    if progress:
        progress("")  # the line cleared for what follows
    if written:
        print(f"ctracer: wrote {os.path.abspath(written)}", file=sys.stderr)
    if args.format != "perfetto":
        from ctracer.export.writes import write_writes
        from ctracer.report.values import ValueFormatter
        beside_events = write_writes(analysed, output, args.format,
                                     ValueFormatter(analysed.layout))
        if beside_events:
            print(f"ctracer: wrote {os.path.abspath(beside_events)} (the --watch writes)",
                  file=sys.stderr)
        from ctracer.export.folded_calls import write_folded_calls
        beside_events = write_folded_calls(analysed, output, args.format)
        if beside_events:
            print(f"ctracer: wrote {os.path.abspath(beside_events)} (the calls "
                  "--calls changes folded)", file=sys.stderr)
    return 0
