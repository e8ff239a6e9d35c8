"""Render a trace file as HTML: per object a call graph, the nested call timeline,
which function changed which field (old → new), and a plot of every field that changed;
plus all objects together and per-method call statistics.  Pages open from disk."""

from __future__ import annotations

import argparse
import os
import sys

EPILOG = """\
examples:
  ctracer callgraph sock.ctrace                   # → callgraph/sock/index.html
  ctracer callgraph sock.ctrace -o /tmp/report    # somewhere else
  ctracer callgraph skb.ctrace --max-objects 200  # pages for the 200 busiest objects only
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="a trace file written by `ctracer trace`")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="where to write the report (default: callgraph/<struct>/ "
                             "under the current directory); a previous report there is replaced")
    parser.add_argument("--max-objects", type=int, default=None, metavar="N",
                        help="write per-object pages only for the N objects with the most "
                             "events (all objects still appear in the index and many_objects/)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only where to look")


def run(args: argparse.Namespace) -> int:
    from ctracer.errors import UsageError
    from ctracer.report import render_report

    if args.max_objects is not None and args.max_objects < 1:
        raise UsageError("--max-objects needs a positive number")
    progress = None
    if not args.quiet and sys.stderr.isatty():
        def progress(message: str) -> None:
            print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)
    result = render_report(args.trace, args.output, max_objects=args.max_objects,
                           progress=progress)
    if progress:
        print("\r\033[K", end="", file=sys.stderr)
    index = os.path.abspath(result.index)
    if not args.quiet:
        objects = f"{result.objects_total} objects"
        if result.objects_rendered < result.objects_total:
            objects += f" ({result.objects_rendered} with pages)"
        print(f"{result.events} events, {objects} in {result.seconds['total']:.1f} s")
        for note in result.notes:
            print(f"note: {note}")
    print(f"open file://{index}")
    return 0
