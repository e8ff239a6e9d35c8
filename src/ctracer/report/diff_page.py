"""How a diff of two runs reads: one sentence per difference (`describe`, shared by the
terminal, the page and ``--json``) and the page ``diff/index.html`` (Jinja2,
autoescaped, in the report's style), whose rows link to each side's rendered report
when there is one (`find_report`).

The diff directory holds ``index.html``, ``_static/`` and a marker; reports rendered
with ``ctracer diff --render`` go beside them, in ``before/`` and ``after/``.  A report
is linked only when its marker names the trace it was rendered from
(`ctracer.report.html.report_trace_id`).
"""

from __future__ import annotations

import os
import time
from typing import Optional
from urllib.parse import quote, urlencode

from ctracer import __version__
from ctracer.analysis.diff import (CALLS, CHANGES, EDGE, ENDED, EVENTS, FINAL, FUNCTION,
                                   LIFETIMES, STARTED, TIMING, Difference, TraceDiff)
from ctracer.analysis.profile import TraceProfile
from ctracer.files import check_marked_dir, private_files, write_marker
from ctracer.report.html import copy_static, report_trace_id
from ctracer.report.pages.site import ALL_DIR, METHODS_DIR, template_environment
from ctracer.report.names import safe_component
from ctracer.report.values import format_duration

#: the file that says a directory holds a diff we wrote (and may write again)
MARKER = ".ctracer-diff"
#: values a final-values row names per side, the most common first
SHOWN_VALUES = 3

_KIND_WORDS = {FUNCTION: "function", CALLS: "calls", TIMING: "timing", CHANGES: "changes",
               FINAL: "final values", EDGE: "call edge", STARTED: "lifetimes",
               ENDED: "lifetimes", EVENTS: "events", LIFETIMES: "lifetimes"}


def number(x: Optional[float]) -> str:
    """A normalised count as read: ``4``, ``1.33``, ``0.0417``."""
    if x is None:
        return "—"
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"


def _share(x: float) -> str:
    return f"{x * 100:.0f}%" if abs(x * 100 - round(x * 100)) < 1e-9 or x >= 0.1 \
        else f"{x * 100:.2g}%"


def _values(shares: dict[str, float]) -> str:
    if not shares:
        return "none"
    top = sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{v} ({_share(s)})" for v, s in top[:SHOWN_VALUES])
    return text + (f" and {len(top) - SHOWN_VALUES} more" if len(top) > SHOWN_VALUES else "")


def shown(d: Difference, side: str) -> str:
    """One side's value of a difference, as the page's before/after columns show it."""
    value = d.before if side == "before" else d.after
    if d.kind == FINAL and not d.detail:
        return _values(d.shares_before if side == "before" else d.shares_after)
    if d.kind == TIMING:
        return format_duration(int(round(value))) if value is not None else "—"
    if d.kind in (STARTED, ENDED) and d.unit == "share of lifetimes" and value is not None:
        return _share(value)
    return number(value)


def change(d: Difference) -> str:
    """How much: ``+67%``, ``new``, ``gone``; final values: how far the shares moved."""
    if d.kind == FINAL and not d.detail:
        return f"{d.size * 100:.0f}% moved"
    if d.only == "after":
        return "new"
    if d.only == "before":
        return "gone"
    assert d.before is not None and d.after is not None
    return f"{(d.after - d.before) / abs(d.before) * 100:+.0f}%" if d.before else "new"


def describe(d: Difference, unit: str) -> str:
    """The difference in one sentence (the runs' values: `shown`), with the after
    kernel's name of a function matched to a renamed one."""
    text = _describe(d, unit)
    if d.renamed_to:
        text += f" [after: {d.renamed_to}]"
    elif d.exists_only and d.kind not in (FUNCTION,):
        text += f" [{d.exists_only} kernel only]"
    return text


def _describe(d: Difference, unit: str) -> str:
    b, a = shown(d, "before"), shown(d, "after")

    def by_presence(new: str, gone: str, same: str) -> str:
        return new if d.only == "after" else gone if d.only == "before" else same

    if d.kind == FUNCTION:
        verb = "hit" if d.subject.startswith("tp:") else "called"
        if d.exists_only == "after":
            return f"{d.subject}: exists in the after kernel only ({verb} {a} {unit})"
        if d.exists_only == "before":
            return f"{d.subject}: exists in the before kernel only (was {verb} {b} {unit})"
        return by_presence(f"{d.subject}: now {verb} ({a} {unit}; never before)",
                           f"{d.subject}: no longer {verb} (was {b} {unit})", "")
    if d.kind == CALLS:
        return f"{d.subject}: {b} → {a} calls {unit}"
    if d.kind == TIMING:
        return f"{d.subject}: {d.detail} duration {b} → {a}"
    if d.kind == CHANGES:
        before_was = ("" if d.others_before else "; unchanged before" if d.recorded_before
                      else "; not recorded before")
        now = ("" if d.others_after else "; unchanged now" if d.recorded_after
               else "; not recorded now")
        if d.only == "before" and not d.recorded_after and d.in_layout_after is False:
            return (f"{d.field}: not in the after side's layout (was changed by "
                    f"{d.function} {b} {unit})")
        if d.only == "after" and not d.recorded_before and d.in_layout_before is False:
            return (f"{d.field}: not in the before side's layout (changed by {d.function} "
                    f"{a} {unit})")
        return by_presence(
            f"{d.field}: now {'also ' if d.others_before else ''}changed by {d.function} "
            f"({a} {unit}{before_was})",
            f"{d.field}: no longer changed by {d.function} (was {b} {unit}{now})",
            f"{d.field}: changed by {d.function} {b} → {a} times {unit}")
    if d.kind == FINAL:
        return (f"{d.field}: median final value {b} → {a}" if d.detail == "median" else
                f"{d.field}: final values per lifetime {b} → {a}")
    if d.kind == EDGE:
        return by_presence(f"{d.subject}: a new call edge ({a} calls {unit})",
                           f"{d.subject}: the call edge vanished (was {b} calls {unit})",
                           f"{d.subject}: {b} → {a} calls {unit}")
    if d.kind in (STARTED, ENDED):
        how = "of lifetimes" if d.unit == "share of lifetimes" else unit
        return f"lifetimes {'begun' if d.kind == STARTED else 'ended'} ({d.subject}): " \
               f"{b} → {a} {how}"
    if d.kind == EVENTS:
        return f"events per lifetime: {b} → {a} (mean)"
    return f"lifetimes: {b} → {a} {unit}"


def verdict(d: Difference) -> str:
    """``within noise``, ``beyond noise``, ``noise unknown`` (timings and values without
    repeats), or "" (a count without repeats: exact)."""
    if d.noise is True:
        return "within noise"
    if d.noise is False:
        return "beyond noise"
    return "noise unknown" if d.varies else ""


def find_report(profile: TraceProfile, candidates: list[str]) -> Optional[str]:
    """The first of ``candidates`` holding a report rendered from ``profile``'s trace."""
    for directory in candidates:
        if (report_trace_id(directory) == profile.trace_id
                and os.path.isfile(os.path.join(directory, "index.html"))):
            return directory
    return None


def default_report_places(profile: TraceProfile, side: str, out_dir: str) -> list[str]:
    """Where a side's report may be: ``--render``'s place in the diff directory (named
    ``before`` or ``after``), then where ``ctracer report TRACE`` writes by default,
    run here or beside the trace."""
    default = os.path.join("callgraph", safe_component(profile.struct_name, "struct"))
    return [os.path.join(out_dir, side), default,
            os.path.join(os.path.dirname(os.path.abspath(profile.path)), default)]


def _link(d: Difference, profile: TraceProfile, report: str) -> str:
    """The page of ``report`` (a path relative to the diff page) showing ``d`` in
    ``profile``'s trace; "" where that trace has nothing to show (a function it never
    called, a field it does not record)."""
    if d.kind in (FUNCTION, CALLS, TIMING):
        stem = profile.function_stems.get(d.function)
        return f"{report}/{METHODS_DIR}/index.html#fn-{stem}" if d.function in profile.calls \
            and stem else ""
    if d.kind in (CHANGES, FINAL):
        stem = profile.field_stems.get(d.field)
        return f"{report}/{ALL_DIR}/changes.html#f-{stem}" if stem else ""
    if d.kind == EDGE:
        return (f"{report}/{ALL_DIR}/index.html#" + urlencode({"fn": d.function}, quote_via=quote)
                if d.function in profile.calls else "")
    return f"{report}/index.html"


@private_files  # the page holds addresses, commands and traced values: 0600, 0700
def write_page(diff: TraceDiff, out_dir: str, reports: dict[str, Optional[str]],
               warnings: list[str]) -> str:
    """Write ``out_dir/index.html`` (and its static files); ``reports`` is each side's
    report directory, or None.  Returns the page's path."""
    prepare(out_dir)
    relative = {side: (os.path.relpath(path, out_dir).replace(os.sep, "/") if path else None)
                for side, path in reports.items()}
    unit = diff.unit
    rows = []
    for rank, d in enumerate(diff.differences, 1):
        links = {}
        for side, profiles in (("before", diff.before), ("after", diff.after)):
            report = relative.get(side)
            links[side] = _link(d, profiles[0], report) if report else ""
        rows.append({"rank": rank, "kind": _KIND_WORDS[d.kind], "text": describe(d, unit),
                     "before": shown(d, "before"), "after": shown(d, "after"),
                     "change": change(d), "size": f"{d.size:.2f}", "verdict": verdict(d),
                     "noise": bool(d.noise), "links": links})
    counts = diff.counts()
    ranks = {id(d): n for n, d in enumerate(diff.differences, 1)}
    headlines = [(title, [{"rank": ranks[id(d)], "text": describe(d, unit)} for d in found])
                 for title, found in diff.headlines().items()] if diff.across_kernels else []
    members = [{"name": m.name, "what": m.what, "recorded": m.recorded,
                "before": f"{m.before[1]} @ {m.before[0]}" if m.before else "—",
                "after": f"{m.after[1]} @ {m.after[0]}" if m.after else "—"}
               for m in sorted(diff.members, key=lambda m: (m.what == "moved", not m.recorded))]
    env = template_environment()
    text = env.get_template("diff.html").render(
        diff=diff, rows=rows, counts=counts, unit=unit, warnings=warnings,
        headlines=headlines, members=members, kernels=diff.kernels,
        reports={side: (f"{path}/index.html" if path else "") for side, path in relative.items()},
        version=__version__, generated=time.strftime("%Y-%m-%d %H:%M:%S"),
        static="_static/", sides=(("before", diff.before), ("after", diff.after)))
    path = os.path.join(out_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    copy_static(out_dir)
    return path


def check_output(out_dir: str) -> None:
    """Refuse, before any work, an ``out_dir`` that is a file or a directory holding
    something other than a diff we wrote."""
    check_marked_dir(out_dir, MARKER, "ctracer diff")


@private_files
def prepare(out_dir: str) -> None:
    """Make ``out_dir`` a diff directory: new, empty, or one we wrote before (its page
    is replaced, the reports beside it kept)."""
    check_output(out_dir)
    write_marker(out_dir, MARKER, [f"written by ctracer {__version__}; its index.html is "
                                   "replaced by the next diff written here"])
