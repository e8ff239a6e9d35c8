"""What differs between two kernels (or two builds of a program) underneath two sides of a
diff, told from what each trace keeps of its own: its function table (every function
the plan found taking the struct, probed or not, and how it reaches the object) and its
struct layout (`ctracer.analysis.profile.TraceProfile.members`).

* `presence`: where each function exists: in both tables, or in one side's only (a
  function missing from a kernel is not "no longer called");
* `match_renames`: a function found in one side only, matched to one found in the
  other side only when the evidence is clear: the same name once a compiler clone's
  suffix (``.isra.0``, ``.constprop.0``, ``.part.0``, ``.cold``) is dropped; or a
  similar name (`NAME_SIMILARITY`) reaching the object the same way (the same
  parameter: the part of its BTF prototype the trace keeps) and either sharing callers
  or callees in the call graph or being called as often;
* `layout_changes`: members whose offset or C type differ, or that one layout lacks.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ctracer.analysis.profile import NO_CALLER, TraceProfile

#: a compiler-made copy of a function: GCC's .isra/.constprop/.part/.cold, LLVM's .llvm
CLONE_SUFFIX = re.compile(r"(\.(isra|constprop|part|cold|llvm|lto_priv)(\.\d+)?)+\Z")
#: difflib's ratio two names must reach to be taken as one function renamed
NAME_SIMILARITY = 0.6
#: calls per lifetime within this share of each other count as "called as often"
SAME_RATE = 0.25


def base_name(name: str) -> str:
    """A function's name without a compiler clone's suffix."""
    return CLONE_SUFFIX.sub("", name)


@dataclass
class Presence:
    """Functions that exist in one side's kernel only (from the function tables)."""

    before_only: list[str] = field(default_factory=list)
    after_only: list[str] = field(default_factory=list)
    #: the function tables were there to tell (a trace from before tables: empty)
    known: bool = True

    def exists(self, name: str, side: str) -> bool:
        return name not in (self.after_only if side == "before" else self.before_only)


@dataclass
class Match:
    """A function of the before side taken as the same as one of the after side."""

    before: str
    after: str
    evidence: list[str]


@dataclass
class MemberChange:
    """A member of the struct whose place, type or presence differs between layouts."""

    name: str
    before: Optional[tuple[int, str]]   # (offset, C type); None: not in that layout
    after: Optional[tuple[int, str]]
    recorded: bool                      # a field either side records

    @property
    def what(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        if self.before[1] != self.after[1]:
            return "type changed" + (", moved" if self.before[0] != self.after[0] else "")
        return "moved"


def _union(side: Sequence[TraceProfile], attr: str) -> dict:
    out: dict = {}
    for p in side:
        for k, v in getattr(p, attr).items():
            out.setdefault(k, v)
    return out


def presence(before: Sequence[TraceProfile], after: Sequence[TraceProfile]) -> Presence:
    """The functions one side's traces know and the other side's do not (unknown when a
    side records no function list)."""
    b, a = _union(before, "known_functions"), _union(after, "known_functions")
    if not b or not a:
        return Presence(known=False)
    return Presence(sorted(set(b) - set(a)), sorted(set(a) - set(b)))


def _neighbours(side: Sequence[TraceProfile], name: str) -> tuple[set[str], set[str]]:
    callers: set[str] = set()
    callees: set[str] = set()
    for p in side:
        for (caller, callee) in p.edges:
            if callee == name and caller != NO_CALLER:
                callers.add(caller)
            if caller == name:
                callees.add(callee)
    return callers, callees


def _rate(side: Sequence[TraceProfile], name: str) -> float:
    rates = [p.calls.get(name, 0) / p.lifetimes for p in side if p.lifetimes]
    return sum(rates) / len(rates) if rates else 0.0


def match_renames(before: Sequence[TraceProfile], after: Sequence[TraceProfile],
                  found: Presence) -> list[Match]:
    """Pairs of a before-only and an after-only function with clear evidence of being
    one function (see the module docstring), best first, each function in one pair."""
    route_b, route_a = _union(before, "route_texts"), _union(after, "route_texts")
    candidates: list[tuple[float, Match]] = []
    for old in found.before_only:
        for new in found.after_only:
            if base_name(old) == base_name(new):
                candidates.append((2.0, Match(old, new, [
                    f"the same function once the compiler clone's suffix is dropped "
                    f"({base_name(old)})"])))
                continue
            similarity = difflib.SequenceMatcher(None, old, new).ratio()
            if similarity < NAME_SIMILARITY or route_b.get(old) != route_a.get(new):
                continue
            evidence = [f"names {similarity:.0%} alike",
                        f"the object reaches both the same way ({route_b.get(old) or 'direct'})"]
            callers_b, callees_b = _neighbours(before, old)
            callers_a, callees_a = _neighbours(after, new)
            shared = sorted((callers_b & callers_a) | (callees_b & callees_a))
            rate_b, rate_a = _rate(before, old), _rate(after, new)
            as_often = rate_b > 0 and rate_a > 0 and \
                abs(rate_a - rate_b) <= SAME_RATE * max(rate_a, rate_b)
            if shared:
                evidence.append(f"the same callers or callees ({', '.join(shared[:3])}"
                                f"{', ...' if len(shared) > 3 else ''})")
            if as_often:
                evidence.append(f"called as often ({rate_b:.3g} and {rate_a:.3g} per lifetime)")
            if shared or as_often:
                candidates.append((similarity + 0.1 * len(evidence), Match(old, new, evidence)))
    out: list[Match] = []
    taken: set[str] = set()
    for _score, m in sorted(candidates, key=lambda c: (-c[0], c[1].before, c[1].after)):
        if m.before in taken or m.after in taken:
            continue
        taken |= {m.before, m.after}
        out.append(m)
    return out


def layout_changes(before: Sequence[TraceProfile],
                   after: Sequence[TraceProfile]) -> list[MemberChange]:
    """Members whose offset or type differ between the sides' layouts, or that one side's
    layout lacks, in the before layout's order (then the after's new ones)."""
    b, a = _union(before, "members"), _union(after, "members")
    if not b or not a:
        return []
    recorded = {n for p in [*before, *after] for n in p.fields}
    order = list(b) + [n for n in a if n not in b]
    return [MemberChange(n, b.get(n), a.get(n), n in recorded) for n in order
            if b.get(n) != a.get(n)]
