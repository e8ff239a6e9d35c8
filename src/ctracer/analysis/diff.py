"""What changed between two runs: the differences between the profiles of BEFORE and
AFTER traces of one struct (`compare`), ranked by size.

Every count is normalised per object lifetime (or, with ``per``, per call of a function
the user names: one iteration of the workload), so runs of different length compare.
A side may be several traces of repeated runs: each metric is then taken per run, the
side's value is the runs' mean, and a difference no larger than the run-to-run spread
(the largest max - min over the runs of either side) is *within noise*.  With one trace
a side noise is unknown: counts of what the code did are exact, but timings and the
values fields end with (ports, hashes, rates, timers) vary from run to run: those
differences are counted apart and ranked after the counts (`Difference.varies`).

What is compared (kinds, in the order the issue lists them):

* ``function``: a function called (or a tracepoint hit) in one side's runs only;
* ``calls``: calls of a function per lifetime;
* ``timing``: the median and p95 of a function's call durations (not normalised);
* ``changes``: changes of a field per lifetime by one function (who changes it);
* ``final``: the values fields end their lifetimes with: the share of lifetimes ending
  with each value (fields that end with at most `FEW_VALUES` values; the distance is
  the total variation between the shares), and the median of numeric fields' values;
* ``edge``: calls per lifetime from one function to another in the call graph (calls
  from no traced function only where the callee has other callers: otherwise the
  edge's numbers are its calls');
* ``started``, ``ended``: the share of lifetimes each rule began, each last function
  ended; ``events``: events per lifetime (mean); ``lifetimes``: lifetimes per iteration
  (only with ``per``).

A difference's size is ``|after - before| / max(|after|, |before|)`` (1 for something
present in one side only; the total variation for final values), between 0 and 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from ctracer.analysis.kernels import (Match, MemberChange, Presence, layout_changes,
                                     match_renames, presence)
from ctracer.analysis.profile import NO_CALLER, TraceProfile
from ctracer.errors import CtracerError, UsageError
from ctracer.tracefile import TraceMeta, read_meta

FUNCTION, CALLS, TIMING, CHANGES, FINAL, EDGE, STARTED, ENDED, EVENTS, LIFETIMES = (
    "function", "calls", "timing", "changes", "final", "edge", "started", "ended", "events",
    "lifetimes")
KINDS = (FUNCTION, CALLS, TIMING, CHANGES, FINAL, EDGE, STARTED, ENDED, EVENTS, LIFETIMES)
#: a field ending its lifetimes with more values than this compares by its median only
FEW_VALUES = 8
#: kinds that count something: absent from a run means none there
_COUNTS = (CALLS, CHANGES, EDGE, STARTED, ENDED, EVENTS, LIFETIMES)
#: what "the same" means for two normalised numbers (floating point sums)
_EPSILON = 1e-9


class DiffError(CtracerError):
    """Traces that cannot be compared (different structs)."""


@dataclass
class Difference:
    """One thing that differs between the sides."""

    kind: str               # one of KINDS
    subject: str            # the function, field, "caller → callee", rule or end
    detail: str             # timing: "p50"/"p95"; changes: the function; final: "median"
    before: Optional[float]  # the side's value (mean over its runs; 0 when absent;
    after: Optional[float]   # None for the final values' shares, which say more)
    before_runs: list[Optional[float]]
    after_runs: list[Optional[float]]
    size: float             # 0..1 (see the module docstring)
    noise: Optional[bool]   # within the run-to-run spread; None: no repeats to tell
    spread: Optional[float]  # that spread, when known
    unit: str               # what the values count
    #: final values: each value's share of lifetimes, per side
    shares_before: dict[str, float] = field(default_factory=dict)
    shares_after: dict[str, float] = field(default_factory=dict)
    #: the function and field a row is about, for links into the traces' reports
    function: str = ""
    field: str = ""
    #: changes: the field had other functions changing it, per side; whether the side
    #: records the field at all
    others_before: bool = False
    others_after: bool = False
    recorded_before: bool = True
    recorded_after: bool = True
    #: whether the field is in each side's layout of the struct at all (None: the
    #: traces do not say); a field recorded by one side only may be absent from the
    #: other's struct, or only left out of its recording
    in_layout_before: Optional[bool] = None
    in_layout_after: Optional[bool] = None
    #: the function exists in this side's kernel only ("before" or "after"), per the
    #: traces' function tables: absent from the other side, not "no longer called"
    exists_only: str = ""
    #: the after side's name of a function matched to a renamed one (`kernels.Match`)
    renamed_to: str = ""

    @property
    def varies(self) -> bool:
        """A timing or a final value: a measurement that varies from run to run, unlike
        the counts of what the code did."""
        return self.kind in (TIMING, FINAL)

    @property
    def only(self) -> str:
        """"before" or "after" for something present in one side only, else ""."""
        if self.before is None or self.after is None:
            return ""
        if abs(self.before) <= _EPSILON and abs(self.after) > _EPSILON:
            return "after"
        if abs(self.after) <= _EPSILON and abs(self.before) > _EPSILON:
            return "before"
        return ""


@dataclass
class LayoutDifference:
    """A recorded field in one side's layout only, or with another C type."""

    field: str
    before: Optional[str]   # its C type, None when the side does not record it
    after: Optional[str]


@dataclass
class TraceDiff:
    """Two sets of runs compared: their profiles, the layout's differences and the ranked
    differences of counts and times (what ``ctracer diff`` shows)."""

    struct: str
    per: str                           # "" (per object lifetime) or the function named
    before: list[TraceProfile]
    after: list[TraceProfile]
    layout: list[LayoutDifference]
    differences: list[Difference]      # ranked: see `rank`
    noise_measured: bool               # a side has repeated runs
    #: functions in one side's function table only, matches of renamed functions, and
    #: members whose place, type or presence differ (`ctracer.analysis.kernels`)
    presence: Presence = field(default_factory=Presence)
    matches: list[Match] = field(default_factory=list)
    members: list[MemberChange] = field(default_factory=list)

    @property
    def kernels(self) -> tuple[str, str]:
        """Each side's kernel release ("" when the sides' runs disagree or none says)."""
        def one(side: list[TraceProfile]) -> str:
            found = {p.kernel for p in side}
            return found.pop() if len(found) == 1 else ""
        return one(self.before), one(self.after)

    @property
    def across_kernels(self) -> bool:
        b, a = self.kernels
        return bool(b and a and b != a)

    def headlines(self) -> dict[str, list[Difference]]:
        """What a reader of a kernel-against-kernel diff needs first, beyond noise:
        functions new to the path, call edges gone, fields now changed by other
        functions, lifetimes that end elsewhere."""
        beyond = [d for d in self.differences if d.noise is not True]
        return {
            "functions new to the path": [d for d in beyond
                                          if d.kind == FUNCTION and d.only == "after"],
            "call edges gone": [d for d in beyond if d.kind == EDGE and d.only == "before"],
            "fields now changed by other functions": [
                d for d in beyond if d.kind == CHANGES and d.only == "after"
                and d.recorded_before],
            "lifetimes that end elsewhere": [d for d in beyond if d.kind == ENDED
                                             and d.only == "after"],
        }

    @property
    def unit(self) -> str:
        """What one count of the differences is per: ``per lifetime`` or ``per call of F``."""
        return f"per call of {self.per}" if self.per else "per lifetime"

    def counts(self) -> dict[str, int]:
        """Differences beyond noise (or, without repeats, in what the code did), in
        timings and values without repeats to tell noise, and within noise."""
        out = {"differences": 0, "noise_unknown": 0, "within_noise": 0}
        for d in self.differences:
            if d.noise:
                out["within_noise"] += 1
            elif d.noise is None and d.varies:
                out["noise_unknown"] += 1
            else:
                out["differences"] += 1
        return out


def check_structs(before: Sequence[str], after: Sequence[str]) -> None:
    """Refuse traces of different structs before any model is built (from their meta
    only; files that cannot be read are left to their readers' own messages)."""
    seen: list[tuple[str, str]] = []
    for path in [*before, *after]:
        meta = TraceMeta(read_meta(path), path)
        if "struct_name" in meta:
            seen.append((path, f"{meta.struct_kind} {meta.struct_name}"))
    _same_struct(seen)


def _same_struct(seen: Iterable[tuple[str, str]]) -> None:
    first: Optional[tuple[str, str]] = None
    for path, struct in seen:
        if first is None:
            first = (path, struct)
        elif struct != first[1]:
            raise DiffError(f"{first[0]} traces {first[1]} and {path} {struct}: a diff "
                            "compares traces of one struct")


def compare(before: Sequence[TraceProfile], after: Sequence[TraceProfile],
            per: str = "") -> TraceDiff:
    """The differences between the BEFORE and AFTER runs (see the module docstring);
    ``per`` normalises by the calls of that function instead of by lifetimes."""
    if not before or not after:
        raise UsageError("a diff needs at least one trace on each side")
    _same_struct((p.path, p.struct) for p in [*before, *after])
    for p in [*before, *after] if per else ():
        if not p.calls.get(per):
            called = ", ".join(sorted(p.calls)[:8]) or "none"
            raise UsageError(f"--per {per}: {p.path} has no call of it (called: {called})")
    found = presence(before, after)
    matches = match_renames(before, after, found)
    renamed = {m.after: m.before for m in matches}
    found = Presence([n for n in found.before_only if n not in {m.before for m in matches}],
                     [n for n in found.after_only if n not in renamed], found.known)
    runs_b = [_metrics(p, per) for p in before]
    runs_a = [_renamed(_metrics(p, per), renamed) for p in after]
    after_name = {m.before: m.after for m in matches}
    measured = len(before) > 1 or len(after) > 1
    out: list[Difference] = []
    keys = sorted({k for m in runs_b + runs_a for k in m})
    unit = f"per call of {per}" if per else "per lifetime"
    few = {name for name in {n for p in [*before, *after] for n in p.final}
           if len({v for p in [*before, *after] for v in
                   (p.final[name].shown if name in p.final else ())}) <= FEW_VALUES}
    changers_b, changers_a = _changers(runs_b), _changers(runs_a)
    for key in keys:
        kind, subject, detail = key
        if kind == FINAL and subject in few:
            continue  # its few values compare one by one (`_final_values`)
        if kind == EDGE and _only_path(key, runs_b + runs_a):
            continue
        d = _scalar(key, [m.get(key) for m in runs_b], [m.get(key) for m in runs_a],
                    kind in _COUNTS, measured)
        if d is None:
            continue
        d.unit = ("ns" if kind == TIMING else "share of lifetimes" if kind in (STARTED, ENDED)
                  and not per else "mean" if kind == EVENTS else unit)
        if kind == CALLS and d.only:
            d.kind = FUNCTION
        fns = ([subject] if kind in (CALLS, TIMING) else [detail] if kind == CHANGES
               else list(_edge_ends(subject)) if kind == EDGE else [])
        if found.known:
            for fn in fns:
                d.exists_only = d.exists_only or (
                    "before" if not found.exists(fn, "after") else
                    "after" if not found.exists(fn, "before") else "")
            d.renamed_to = after_name.get(fns[0], "") if len(fns) == 1 else ""
        if kind in (CALLS, TIMING, FUNCTION):
            d.function = subject
        elif kind == EDGE:
            d.function = _edge_ends(subject)[1]
        elif kind == CHANGES:
            d.field, d.function = subject, detail
            d.others_before = bool(changers_b.get(subject, set()) - {detail})
            d.others_after = bool(changers_a.get(subject, set()) - {detail})
            d.recorded_before = any(subject in p.fields for p in before)
            d.recorded_after = any(subject in p.fields for p in after)
            d.in_layout_before = _in_layout(subject, before)
            d.in_layout_after = _in_layout(subject, after)
        elif kind == FINAL:
            d.field = subject
        out.append(d)
    out.extend(_final_values(before, after, measured))
    return TraceDiff(before[0].struct, per, list(before), list(after),
                     _layout(before, after), rank(out), measured, found, matches,
                     layout_changes(before, after))


def _in_layout(name: str, side: Sequence[TraceProfile]) -> Optional[bool]:
    """Whether a member (a dotted path) is in the side's layout of the struct: itself or
    its top-level member there; None when the side's traces keep no layout."""
    members = {m for p in side for m in p.members}
    if not members:
        return None
    return name in members or name.split(".", 1)[0] in members


def _renamed(metrics: dict[Key, float], names: dict[str, str]) -> dict[Key, float]:
    """One run's metrics with the after side's renamed functions under their before
    names (so a matched function compares with itself)."""
    if not names:
        return metrics

    def name(fn: str) -> str:
        return names.get(fn, fn)

    out: dict[Key, float] = {}
    for (kind, subject, detail), v in metrics.items():
        if kind in (CALLS, TIMING):
            subject = name(subject)
        elif kind == CHANGES:
            detail = name(detail)
        elif kind == EDGE:
            caller, callee = _edge_ends(subject)
            subject = f"{name(caller)} → {name(callee)}"
        elif kind == ENDED and subject.startswith("last seen in "):
            subject = "last seen in " + name(subject[len("last seen in "):])
        out[kind, subject, detail] = out.get((kind, subject, detail), 0.0) + v
    return out


def rank(differences: list[Difference]) -> list[Difference]:
    """Largest first; timings and values whose noise is unknown after every other
    difference, and differences within noise last."""
    order = {k: i for i, k in enumerate(KINDS)}
    return sorted(differences, key=lambda d: (
        bool(d.noise), d.noise is None and d.varies, -round(d.size, 9), order[d.kind],
        d.subject, d.detail))


Key = tuple[str, str, str]


def _metrics(p: TraceProfile, per: str) -> dict[Key, float]:
    """One run's normalised numbers, by (kind, subject, detail)."""
    lifetimes = p.lifetimes
    denominator = p.calls[per] if per else lifetimes
    out: dict[Key, float] = {}

    def norm(n: float, by: float = denominator) -> float:
        return n / by if by else 0.0

    for fn, n in p.calls.items():
        out[CALLS, fn, ""] = norm(n)
    for fn, t in p.timings.items():
        out[TIMING, fn, "p50"] = float(t.p50_ns)
        out[TIMING, fn, "p95"] = float(t.p95_ns)
    for (name, fn), n in p.changes.items():
        out[CHANGES, name, fn] = norm(n)
    for (caller, callee), n in p.edges.items():
        out[EDGE, f"{caller} → {callee}", ""] = norm(n)
    for kind, table in ((STARTED, p.started), (ENDED, p.ended)):
        for why, n in table.items():
            out[kind, why, ""] = norm(n, denominator if per else lifetimes)
    if p.events_per_lifetime:
        out[EVENTS, "events per lifetime", ""] = (sum(p.events_per_lifetime)
                                                  / len(p.events_per_lifetime))
    if per:
        out[LIFETIMES, "lifetimes", ""] = norm(lifetimes)
    for name, final in p.final.items():
        if final.median is not None:
            out[FINAL, name, "median"] = float(final.median)
    return out


def _scalar(key: Key, b_runs: list[Optional[float]], a_runs: list[Optional[float]],
            absent_is_zero: bool, measured: bool) -> Optional[Difference]:
    """The difference of one metric, or None when the sides agree (or, for a metric
    that is not a count, when a side lacks it)."""
    if absent_is_zero:
        b_runs = [0.0 if v is None else v for v in b_runs]
        a_runs = [0.0 if v is None else v for v in a_runs]
    b_known = [v for v in b_runs if v is not None]
    a_known = [v for v in a_runs if v is not None]
    if not b_known or not a_known:
        return None  # a timing of a function one side never timed: its calls say it
    b, a = sum(b_known) / len(b_known), sum(a_known) / len(a_known)
    if abs(a - b) <= _EPSILON * max(1.0, abs(a), abs(b)):
        return None
    spread = max(_range(b_known), _range(a_known)) if measured else None
    return Difference(
        kind=key[0], subject=key[1], detail=key[2], before=b, after=a,
        before_runs=b_runs, after_runs=a_runs, size=abs(a - b) / max(abs(a), abs(b)),
        noise=(abs(a - b) <= spread + _EPSILON) if spread is not None else None,
        spread=spread, unit="")


def _edge_ends(subject: str) -> tuple[str, str]:
    """An edge row's caller and callee (`ctracer.analysis.profile.NO_CALLER` for calls
    no traced function made)."""
    caller, _, callee = subject.partition(" → ")
    return caller, callee


def _only_path(key: Key, runs: list[dict[Key, float]]) -> bool:
    """An edge from no traced caller that carries every call of its callee in every run:
    its numbers are the callee's calls, said by their own row."""
    caller, callee = _edge_ends(key[1])
    return caller == NO_CALLER and all(m.get(key, 0.0) == m.get((CALLS, callee, ""), 0.0)
                                       for m in runs)


def _range(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else 0.0


def _changers(runs: list[dict[Key, float]]) -> dict[str, set[str]]:
    """Per field, every function that changed it in one of ``runs``."""
    out: dict[str, set[str]] = {}
    for m in runs:
        for (kind, name, fn), v in m.items():
            if kind == CHANGES and v > 0:
                out.setdefault(name, set()).add(fn)
    return out


def _final_values(before: Sequence[TraceProfile], after: Sequence[TraceProfile],
                  measured: bool) -> list[Difference]:
    """Per field that ends its lifetimes with few values: how the shares of lifetimes
    ending with each value moved (total variation distance)."""
    out = []
    names = sorted({n for p in [*before, *after] for n in p.final})
    for name in names:
        b_runs = [_shares(p, name) for p in before]
        a_runs = [_shares(p, name) for p in after]
        values = {v for run in b_runs + a_runs for v in run}
        if len(values) > FEW_VALUES or not any(b_runs) or not any(a_runs):
            continue  # many values: the median compares them; a field one side lacks
        b, a = _mean_shares(b_runs), _mean_shares(a_runs)
        size = _distance(b, a)
        if size <= _EPSILON:
            continue
        spread = (max(_largest_distance(b_runs), _largest_distance(a_runs))
                  if measured else None)
        out.append(Difference(
            kind=FINAL, subject=name, detail="", before=None, after=None,
            before_runs=[], after_runs=[], size=size,
            noise=(size <= spread + _EPSILON) if spread is not None else None,
            spread=spread, unit="share of lifetimes", shares_before=b, shares_after=a,
            field=name))
    return out


def _shares(p: TraceProfile, name: str) -> dict[str, float]:
    final = p.final.get(name)
    if final is None:
        return {}
    total = sum(final.shown.values())
    return {v: n / total for v, n in final.shown.items()} if total else {}


def _mean_shares(runs: list[dict[str, float]]) -> dict[str, float]:
    runs = [r for r in runs if r]
    out: dict[str, float] = {}
    for run in runs:
        for v, s in run.items():
            out[v] = out.get(v, 0.0) + s / len(runs)
    return out


def _distance(a: dict[str, float], b: dict[str, float]) -> float:
    return 0.5 * sum(abs(a.get(v, 0.0) - b.get(v, 0.0)) for v in set(a) | set(b))


def _largest_distance(runs: list[dict[str, float]]) -> float:
    runs = [r for r in runs if r]
    return max((_distance(x, y) for i, x in enumerate(runs) for y in runs[i + 1:]),
               default=0.0)


def _layout(before: Sequence[TraceProfile], after: Sequence[TraceProfile]) -> list[LayoutDifference]:
    """Fields compared by member path: each side's C type of each field."""
    def types(side: Sequence[TraceProfile]) -> dict[str, str]:
        out: dict[str, str] = {}
        for p in side:
            for name, f in p.fields.items():
                out.setdefault(name, f.ctype)
        return out

    b, a = types(before), types(after)
    order = list(b) + [n for n in a if n not in b]
    return [LayoutDifference(n, b.get(n), a.get(n)) for n in order if b.get(n) != a.get(n)]
