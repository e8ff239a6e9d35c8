"""Compare two runs: what the code did differently to one struct's objects between a
BEFORE and an AFTER trace (functions called in one run only, calls and durations per
function, which functions change each field and the values fields end with, call-graph
edges, lifetimes), ranked by size and counted per object lifetime.  Repeated runs given
as A1,A2 mark the differences within their run-to-run spread as noise.  Writes
DIR/index.html, linked to each trace's report where one is found, and prints a summary."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any, Optional

EPILOG = """\
examples:
  ctracer diff before.ctrace after.ctrace              # → diff/index.html, a summary here
  ctracer diff b1.ctrace,b2.ctrace a1.ctrace,a2.ctrace # repeated runs: noise marked
  ctracer diff before.ctrace after.ctrace --per conn_open    # per workload iteration
  ctracer diff before.ctrace after.ctrace --render -o cmp    # both reports too, linked
  ctracer diff before.ctrace after.ctrace --json | jq '.differences[0].text'
"""

#: rows the terminal shows unless --limit says otherwise
DEFAULT_LIMIT = 25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ctracer diff``."""
    parser.add_argument("before", metavar="BEFORE",
                        help="the trace of the run before (or several, comma-separated: "
                             "repeated runs, whose spread is the noise)")
    parser.add_argument("after", metavar="AFTER", help="the trace(s) of the run after")
    parser.add_argument("-o", "--output", metavar="DIR", default=None,
                        help="where to write the page (default: diff/ under the current "
                             "directory; with --json, no page unless -o is given)")
    parser.add_argument("--json", action="store_true",
                        help="print the differences as one JSON document (for scripts)")
    parser.add_argument("--per", metavar="FUNCTION", default="",
                        help="count per call of FUNCTION (one iteration of the workload) "
                             "instead of per object lifetime")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                        help=f"differences printed on the terminal (default {DEFAULT_LIMIT}; "
                             "0 for all; the page and --json have all)")
    parser.add_argument("--render", action="store_true",
                        help="also render the first trace of each side as a report, in "
                             "DIR/before and DIR/after, and link the page's rows to them")
    parser.add_argument("--before-report", metavar="REPORT", default=None,
                        help="the report of BEFORE's (first) trace to link to (default: "
                             "found where `ctracer report` writes it)")
    parser.add_argument("--after-report", metavar="REPORT", default=None,
                        help="the report of AFTER's (first) trace to link to")


def run(args: argparse.Namespace) -> int:
    """``ctracer diff``: compare the traces before and after, print the ranked differences
    and write the page."""
    from ctracer.analysis.diff import check_structs, compare
    from ctracer.errors import UsageError

    before, after = _paths(args.before, "BEFORE"), _paths(args.after, "AFTER")
    if args.limit < 0:
        raise UsageError("--limit needs a number of rows, or 0 for all")
    if args.render and (args.before_report or args.after_report):
        raise UsageError("--render renders the reports it links to: --before-report and "
                         "--after-report would be ignored (give one or the other)")
    for path in before + after:
        if not os.path.exists(path):
            raise UsageError(f"no trace file at {path}")
    for given in (args.before_report, args.after_report):
        if given and not os.path.isfile(os.path.join(given, "index.html")):
            raise UsageError(f"{given} is not a ctracer report (no index.html in it)")
    check_structs(before, after)
    out_dir = args.output or ("diff" if not args.json else None)
    if out_dir is not None:
        from ctracer.report.diff_page import check_output
        check_output(out_dir)
    profiles = _read(before + after)
    warnings = [f"{p.path}: {p.incomplete}" for p in profiles if p.incomplete] + [
        f"{p.path}: {p.lost} events lost while recording: its counts are short"
        for p in profiles if p.lost]
    for w in warnings:
        print(f"ctracer: warning: {w}", file=sys.stderr)
    diff = compare(profiles[:len(before)], profiles[len(before):], args.per)

    reports: dict[str, Optional[str]] = {"before": None, "after": None}
    page = None
    if out_dir is not None:
        from ctracer.report.diff_page import prepare, write_page
        prepare(out_dir)
        reports = _reports(args, diff, out_dir)
        page = os.path.abspath(write_page(diff, out_dir, reports, warnings))
    if args.json:
        json.dump(_as_json(diff, reports, warnings, page), sys.stdout, indent=1)
        print()
    else:
        _print_text(diff, args.limit, page)
    return 0


def _paths(text: str, name: str) -> list[str]:
    from ctracer.errors import UsageError

    paths = [p for p in text.split(",") if p]
    if not paths:
        raise UsageError(f"{name} names no trace file")
    return paths


def _read(paths: list[str]) -> list:
    """Every trace's profile; Ctrl-C, SIGTERM or a helper dying end it in one line."""
    from ctracer.report.profiles import read_profiles
    from ctracer.errors import CtracerError, Interrupted
    from ctracer.report.helpers import HelpersStopped

    terminated = []

    def on_sigterm(signum, frame) -> None:  # stopped like Ctrl-C, said as SIGTERM
        terminated.append(signum)
        raise KeyboardInterrupt

    def say(message: str) -> None:
        if sys.stderr.isatty():
            print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return read_profiles(paths, say)
    except HelpersStopped as stopped:
        if stopped.signal_number:
            raise Interrupted("the traces were not all read: no diff written",
                              terminated[0] if terminated else stopped.signal_number) from None
        raise CtracerError(f"{stopped.why}: no diff written") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        if sys.stderr.isatty():
            print("\r\033[K", end="", file=sys.stderr)


def _reports(args: argparse.Namespace, diff, out_dir: str) -> dict[str, Optional[str]]:
    """Each side's report to link to: rendered now (--render), given, or found."""
    from ctracer.analysis.diff import DiffError
    from ctracer.report.diff_page import default_report_places, find_report

    out: dict[str, Optional[str]] = {}
    for side, profiles, given in (("before", diff.before, args.before_report),
                                  ("after", diff.after, args.after_report)):
        first = profiles[0]
        if args.render:
            from ctracer.report import render_report
            target = os.path.join(out_dir, side)  # where the page looks for it
            print(f"ctracer: rendering {first.path} into {target}", file=sys.stderr)
            out[side] = render_report(first.path, target).out_dir
        elif given:
            found = find_report(first, [given])
            if found is None:
                raise DiffError(f"{given} is not a report rendered from {first.path} "
                                f"(ctracer report {first.path} -o DIR renders one)")
            out[side] = found
        else:
            out[side] = find_report(first, default_report_places(first, side, out_dir))
    return out


def _print_text(diff, limit: int, page: Optional[str]) -> None:
    from ctracer.report.diff_page import change, describe, verdict

    def side(profiles) -> str:
        return " + ".join(f"{p.path} ({p.events} events, {p.lifetimes} lifetimes)"
                          for p in profiles)

    print(f"{diff.struct}: before {side(diff.before)}")
    print(f"{' ' * len(diff.struct)}  after  {side(diff.after)}")
    counts = diff.counts()
    noise = ("noise: the spread of the repeated runs" if diff.noise_measured else
             "one trace a side: noise unknown (give repeated runs as BEFORE1,BEFORE2)")
    print(f"counted {diff.unit}; {noise}")
    for f in diff.layout:
        print(f"layout: {f.field}: {f.before or 'not recorded'} → {f.after or 'not recorded'}")
    _print_kernels(diff)
    summary = f"{counts['differences']} difference{'s' if counts['differences'] != 1 else ''}"
    if diff.noise_measured:
        summary += " beyond noise"
    if counts["noise_unknown"]:
        summary += f", {counts['noise_unknown']} in timings and values (noise unknown)"
    if counts["within_noise"]:
        summary += f", {counts['within_noise']} within noise"
    print(summary + (":" if diff.differences else ""))
    shown = diff.differences if not limit else diff.differences[:limit]
    for rank, d in enumerate(shown, 1):
        tags = ", ".join(t for t in (change(d), verdict(d)) if t)
        print(f"{rank:4}. {describe(d, diff.unit)}  [{tags}]")
    if len(shown) < len(diff.differences):
        print(f"      ... {len(diff.differences) - len(shown)} more (--limit 0 prints all)")
    if page:
        print(f"open file://{page}")


def _print_kernels(diff) -> None:
    """Across kernels: the headlines, renamed functions, functions of one kernel only,
    members whose place, type or presence differ."""
    from ctracer.report.diff_page import describe
    if diff.across_kernels:
        before, after = diff.kernels
        print(f"kernels: Linux {before} → {after}")
        for title, found in diff.headlines().items():
            shown = "; ".join(describe(d, diff.unit) for d in found[:4])
            more = f"; ... {len(found) - 4} more" if len(found) > 4 else ""
            print(f"  {title}: {len(found)}{': ' + shown + more if found else ''}")
    for m in diff.matches:
        print(f"renamed: {m.before} → {m.after} ({'; '.join(m.evidence)})")
    for side, names in (("before", diff.presence.before_only),
                        ("after", diff.presence.after_only)):
        if names:
            print(f"functions of the {side} kernel only: {len(names)}: "
                  f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''}")
    for m in diff.members:
        if m.what != "moved" or m.recorded:
            def place(p):
                return f"{p[1]} @ {p[0]}" if p else "absent"
            print(f"member {m.name}: {m.what} ({place(m.before)} → {place(m.after)})")


def _as_json(diff, reports: dict[str, Optional[str]], warnings: list[str],
             page: Optional[str]) -> dict[str, Any]:
    from ctracer.report.diff_page import change, describe, verdict

    def run_of(p, report: Optional[str]) -> dict[str, Any]:
        return {"path": p.path, "trace_id": p.trace_id, "host": p.host, "kernel": p.kernel,
                "command": p.command, "events": p.events, "lost": p.lost,
                "lifetimes": p.lifetimes, "incomplete": p.incomplete or None,
                "report": os.path.abspath(report) if report else None}

    return {
        "struct": diff.struct, "per": diff.per or None, "unit": diff.unit,
        "noise_measured": diff.noise_measured,
        "before": [run_of(p, reports["before"] if i == 0 else None)
                   for i, p in enumerate(diff.before)],
        "after": [run_of(p, reports["after"] if i == 0 else None)
                  for i, p in enumerate(diff.after)],
        "layout": [{"field": f.field, "before": f.before, "after": f.after}
                   for f in diff.layout],
        "counts": diff.counts(),
        "kernels": list(diff.kernels), "across_kernels": diff.across_kernels,
        "functions_before_only": diff.presence.before_only,
        "functions_after_only": diff.presence.after_only,
        "renamed": [{"before": m.before, "after": m.after, "evidence": m.evidence}
                    for m in diff.matches],
        "members": [{"member": m.name, "what": m.what, "recorded": m.recorded,
                     "before": ({"offset": m.before[0], "ctype": m.before[1]}
                                if m.before else None),
                     "after": ({"offset": m.after[0], "ctype": m.after[1]}
                               if m.after else None)} for m in diff.members],
        "differences": [{
            "rank": rank, "kind": d.kind, "subject": d.subject, "detail": d.detail,
            "text": describe(d, diff.unit), "before": d.before, "after": d.after,
            "before_runs": d.before_runs, "after_runs": d.after_runs, "unit": d.unit,
            "change": change(d), "size": d.size, "noise": d.noise, "spread": d.spread,
            "verdict": verdict(d) or None, "function": d.function or None,
            "field": d.field or None, "exists_only": d.exists_only or None,
            "renamed_to": d.renamed_to or None, "shares_before": d.shares_before,
            "shares_after": d.shares_after}
            for rank, d in enumerate(diff.differences, 1)],
        "warnings": warnings, "page": page}
