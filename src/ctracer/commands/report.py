"""Render a trace file as HTML: per object a call graph, the nested call timeline,
which function changed which field (old → new), and a plot of every field that changed;
plus all objects together and per-method call statistics.  Pages open from disk."""

from __future__ import annotations

import argparse
import os
import signal
import sys

#: PNG plots cost tens of ms each: by default they are drawn for the objects with most
#: changes only (every changes page also plots its fields in the browser)
DEFAULT_PLOT_OBJECTS = 10

EPILOG = """\
examples:
  ctracer report sock.ctrace                      # → callgraph/sock/index.html
  ctracer report sock.ctrace -o /tmp/report       # somewhere else
  ctracer report skb.ctrace --plot-objects 0      # PNG plots for every object, however many
  ctracer report skb.ctrace --max-objects 100     # pages for the 100 busiest objects only

`ctracer callgraph` is the same command under its old name.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer report``."""
    parser.add_argument("trace", metavar="TRACE", help="a trace file written by `ctracer trace`")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="where to write the report (default: callgraph/<struct>/ "
                             "under the current directory); a previous report there is replaced")
    parser.add_argument("--max-objects", type=int, default=0, metavar="N",
                        help="write per-object pages (timeline, changes) only for the N "
                             "objects with the most events (default 0: every object); every "
                             "object is still listed in the index and shown in many_objects/")
    parser.add_argument("--plot-objects", type=int, default=None, metavar="N",
                        help="draw PNG plots of fields for the N objects with most changes "
                             f"(default {DEFAULT_PLOT_OBJECTS}; 0 for all)")
    parser.add_argument("--no-plots", action="store_true",
                        help="draw no PNG plots (the slowest part on big traces); pages still "
                             "list every change")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only where to look")


def run(args: argparse.Namespace) -> int:
    """``ctracer report``: render the trace's HTML report, in a child process whose OOM
    kill is reported in one line."""
    from ctracer.errors import UsageError

    if args.no_plots and args.plot_objects is not None:
        raise UsageError("--no-plots draws no PNG plots: --plot-objects would be ignored "
                         "(give one of them)")
    if args.plot_objects is None:
        args.plot_objects = DEFAULT_PLOT_OBJECTS
    if args.plot_objects < 0:
        raise UsageError("--plot-objects needs a number of objects, or 0 for all")
    if args.max_objects < 0:
        raise UsageError("--max-objects needs a number of objects, or 0 for all")

    def show_progress(message: str) -> None:
        print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)

    from ctracer.tracefile import Trace, decoding_progress
    # a killed recording, or raw events a stopped one left, are finished here
    trace = Trace(args.trace, progress=decoding_progress())
    incomplete = trace.incomplete
    struct_name = trace.struct_name
    trace.close()
    if incomplete:
        print(f"ctracer: warning: {args.trace}: {incomplete}", file=sys.stderr)
    progress = show_progress if not args.quiet and sys.stderr.isatty() else None
    if args.output is None:
        from ctracer.report.names import safe_component

        args.output = os.path.join("callgraph", safe_component(struct_name, "struct"))

    def on_killed(why: str, out_of_memory: bool) -> str:
        from ctracer.report.html import mark_killed

        if progress:
            print("\r\033[K", end="", file=sys.stderr)
        try:
            mark_killed(args.output, why)
            left = f"; the report in {args.output} is incomplete (its index.html says so)"
        except OSError:
            left = ""
        if not out_of_memory:
            return f"{why}{left}"
        return (f"{why}{left}; try --max-objects N (pages for the N busiest objects only), "
                "--no-plots, or more memory")

    from ctracer.commands.supervised import run_supervised

    return run_supervised(lambda: _render(args, progress), "the render", on_killed)


def _render(args: argparse.Namespace, progress) -> int:
    from ctracer.errors import CtracerError
    from ctracer.report import render_report

    terminated = []

    def on_sigterm(signum, frame) -> None:  # stopped like Ctrl-C, said as SIGTERM
        terminated.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        result = render_report(args.trace, args.output, max_objects=args.max_objects or None,
                               plots=not args.no_plots, plot_objects=args.plot_objects or None,
                               progress=progress)
    except CtracerError as e:
        if terminated and e.exit_status == 128 + signal.SIGINT:
            e.exit_status = 128 + signal.SIGTERM
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if progress:
            print("\r\033[K", end="", file=sys.stderr)
    index = os.path.abspath(result.index)
    if not args.quiet:
        objects = f"{result.objects_total} objects"
        if result.objects_rendered < result.objects_total:
            objects += f" ({result.objects_rendered} with pages)"
        print(f"{result.counts}; {objects} in {result.seconds['total']:.1f} s")
        for note in result.notes:
            print(f"note: {note}")
    print(f"open file://{index}")
    return 0
