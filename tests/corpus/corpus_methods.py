"""Method sets held against the oracles.

* ctracer's methods of a struct against ``pfunct --class``: every name pfunct lists must
  be one of ctracer's direct, probeable ``struct X *`` methods, and every name ctracer
  adds must be explained by the rule that keeps pfunct from listing it;
* the methods found in DWARF against those found in BTF, compared by (function name,
  kind): every pair only one side has must be explained.

pfunct (pahole 1.24) lists a function under ``--class=X`` when, in a compile unit that
defines ``struct X``, a DIE of it that is not an abstract inline instance (no
DW_AT_inline) has a parameter spelled exactly ``struct X *``; declarations and
definitions without code count too.  So an extra name is explained when each of its
methods misses one of those criteria, tested in that order; the name is counted under
the furthest any of its methods got.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

from corpus_oracles import Symbols, UnitFacts
from corpus_report import Findings, plural

from ctracer.plan.discovery import ROUTE_KINDS, Discovery, Method

#: static-call trampolines (DEFINE_STATIC_CALL): declarations with no body, which pfunct
#: may list but nothing can probe
TRAMPOLINE_PREFIX = "__SCT__"

#: reason ranks, in the order pfunct's criteria are tested
_INLINE, _KIND, _SPELLING, _UNIT = range(4)


def unit_reason(struct: str) -> str:
    return f"its compile unit only declares struct {struct}"


def pfunct_miss(m: Method, struct: str) -> tuple[int, Optional[str]]:
    """(rank, why pfunct leaves this method out); the reason is None when pfunct's first
    three criteria hold and only the compile-unit test remains."""
    if getattr(m.function, "inlined_only", False):
        return _INLINE, "inline only (pfunct skips abstract inline instances)"
    if m.route_kind != "direct":
        return _KIND, f"reached as {m.route_kind}"
    if m.param_type != f"struct {struct} *":
        return _SPELLING, "qualified or typedef'd parameter"
    return _UNIT, None


@dataclass
class PfunctComparison:
    struct: str
    source: str
    oracle: set[str]
    pfunct_seconds: float
    by_name: dict[str, list[Method]]
    tracepoints: int
    #: extra name -> (rank, reason or None while the compile-unit test is pending)
    extras: dict[str, list[tuple[int, Optional[str]]]] = field(default_factory=dict)

    def unit_candidates(self) -> list[Method]:
        """Methods of extra names whose only possible reason is the compile unit."""
        return [m for name, misses in self.extras.items()
                for m, (rank, why) in zip(self.by_name[name], misses) if why is None]

    def settle_units(self, facts: Optional[UnitFacts]) -> None:
        """Give the compile-unit reason to the methods llvm-dwarfdump confirms: the
        function is defined in its unit and that unit does not define the struct."""
        if facts is None:
            return
        defining_struct = facts.units_defining_struct(self.struct)
        for name, misses in self.extras.items():
            for i, (m, (rank, why)) in enumerate(zip(self.by_name[name], misses)):
                unit = getattr(m.function, "unit", "")
                if (why is None and unit in facts.units_defining_function(name)
                        and unit not in defining_struct):
                    misses[i] = (rank, unit_reason(self.struct))


def compare_with_pfunct(found: Discovery, oracle: set[str], source: str,
                        pfunct_seconds: float) -> PfunctComparison:
    by_name: dict[str, list[Method]] = defaultdict(list)
    for m in found.methods:
        if not m.is_tracepoint:
            by_name[m.name].append(m)
    tracepoints = len({m.name for m in found.methods if m.is_tracepoint})
    cmp = PfunctComparison(found.name, source, oracle, pfunct_seconds, dict(by_name),
                           tracepoints)
    for name, methods in by_name.items():
        if name not in oracle:
            cmp.extras[name] = [pfunct_miss(m, found.name) for m in methods]
    return cmp


def pfunct_findings(cmp: PfunctComparison, symbols: Symbols) -> Findings:
    f = Findings("", f"struct {cmp.struct} ({cmp.source})")
    names = set(cmp.by_name)
    f.say(f"pfunct --class={cmp.struct}: {plural(len(cmp.oracle), 'name')} "
          f"({cmp.pfunct_seconds:.1f} s); ctracer: {plural(len(names), 'function')} "
          f"and {plural(cmp.tracepoints, 'tracepoint')}")
    for name in sorted(cmp.oracle - names):
        f.fail(f"pfunct lists {name}, ctracer finds no method of struct {cmp.struct} in it")
    listed = sorted(cmp.oracle & names)
    for name in listed:
        misses = [pfunct_miss(m, cmp.struct) for m in cmp.by_name[name]]
        if all(why is not None for _rank, why in misses):
            f.fail(f"pfunct lists {name}; ctracer says: "
                   + "; ".join(sorted({why for _r, why in misses})))
    f.say(f"{len(listed)} of {len(cmp.oracle)} pfunct names are ctracer direct methods "
          f"(parameter struct {cmp.struct} *, not inline only)")
    _probeability_note(f, cmp, listed, symbols)
    reasons: Counter = Counter()
    unexplained = []
    for name, misses in sorted(cmp.extras.items()):
        if any(why is None for _rank, why in misses):
            unexplained.append(name)
        else:
            reasons[max(misses)[1]] += 1
    f.say(f"{plural(len(cmp.extras), 'extra name')} beyond pfunct, each explained "
          "(counted under the furthest any of its methods got):")
    for why, n in reasons.most_common():
        f.say(f"  {n:6}  {why}")
    if cmp.tracepoints:
        f.say(f"  plus {plural(cmp.tracepoints, 'tracepoint')} (pfunct lists functions only)")
    for name in unexplained:
        units = sorted({getattr(m.function, 'unit', '') for m in cmp.by_name[name]})
        f.fail(f"{name} ({', '.join(units)}): a struct {cmp.struct} * parameter, yet pfunct "
               "does not list it and llvm-dwarfdump does not show its unit lacking the struct")
    return f


def _probeability_note(f: Findings, cmp: PfunctComparison, listed: list[str],
                       symbols: Symbols) -> None:
    """pfunct names ctracer calls not probeable although the symbol table has a function
    of that name: static-call trampolines (declared in C, defined in assembly) are
    expected; any other is a definition without code ranges in DWARF whose code exists
    under its name (identical code folded into another function's), a disagreement
    worth knowing, though not a failure of this check."""
    trampolines, disputed = [], []
    for name in listed:
        ms = cmp.by_name[name]
        if all(not m.probeable for m in ms) and name in symbols.by_name:
            (trampolines if name.startswith(TRAMPOLINE_PREFIX) else disputed).append(
                f"{name} ({ms[0].not_probeable})")
    if trampolines:
        f.say(f"{plural(len(trampolines), 'static-call trampoline')} ({TRAMPOLINE_PREFIX}*): "
              "declarations in DWARF, not probeable; pfunct lists declarations too")
    if disputed:
        f.say(f"NOTE: ctracer marks {plural(len(disputed), 'pfunct name')} not probeable "
              "although nm lists a function symbol of that name: " + ", ".join(disputed[:6])
              + (" ..." if len(disputed) > 6 else ""))


# ------------------------------------------------------------------ DWARF against BTF


def _pairs(found: Discovery) -> dict[tuple[str, str], list[Method]]:
    pairs: dict[tuple[str, str], list[Method]] = defaultdict(list)
    for m in found.methods:
        pairs[(m.name, m.route_kind)].append(m)
    return pairs


TRAMPOLINE_ONLY = ("a static-call trampoline (__SCT__*): declared in C, defined in assembly, "
                   "so it has a symbol but no DWARF definition, and pahole encodes BTF only "
                   "for functions DWARF defines")
CLONE_ONLY = ("its code has only a compiler clone's symbol (name.constprop.0, .isra.0, "
              ".part.0): pahole puts functions in BTF under their exact symbol name")


def btf_miss(m: Method, symbols: Symbols) -> Optional[str]:
    """Why BTF lacks a method DWARF has, or None when it should have it."""
    if not m.probeable:
        return f"not probeable ({m.not_probeable}): BTF describes functions with code only"
    if m.name.startswith(TRAMPOLINE_PREFIX) and m.name in symbols.by_name:
        return TRAMPOLINE_ONLY
    address = getattr(m.function, "address", None)
    clones = symbols.clones_at(m.name, address)
    if m.name not in symbols.by_name and clones:
        return CLONE_ONLY
    return None


def compare_dwarf_btf(dwarf_found: Discovery, btf_found: Discovery, symbols: Symbols,
                      title: str) -> Findings:
    f = Findings("", title)
    d, b = _pairs(dwarf_found), _pairs(btf_found)
    common = set(d) & set(b)
    kd, kb = Counter(k for _n, k in d), Counter(k for _n, k in b)
    kc = Counter(k for _n, k in common)
    f.say(f"(function, kind) pairs: DWARF {len(d)}, BTF {len(b)}, both {len(common)}")
    f.say("  kind              DWARF    BTF   both")
    for k in ROUTE_KINDS:
        if kd[k] or kb[k]:
            f.say(f"  {k:<15} {kd[k]:7} {kb[k]:6} {kc[k]:6}")
    reasons: Counter = Counter()
    clones: list[str] = []
    for pair in sorted(set(d) - common):
        whys = [btf_miss(m, symbols) for m in d[pair]]
        if any(w is None for w in whys):
            m = d[pair][whys.index(None)]
            f.fail(f"DWARF only: {pair[0]} as {pair[1]} ({m.key}, {m.route_text}): probeable, "
                   "with a symbol of its own, yet not in BTF")
        else:
            reasons[CLONE_ONLY if CLONE_ONLY in whys else whys[0]] += 1
            if CLONE_ONLY in whys:
                clones.append(pair[0])
    if reasons:
        f.say(f"{plural(sum(reasons.values()), 'pair')} only in DWARF, each explained:")
        for why, n in reasons.most_common():
            f.say(f"  {n:6}  {why}")
        if clones:
            shown = sorted(set(clones))
            f.say(f"          clones: {', '.join(shown[:6])}{' ...' if len(shown) > 6 else ''}")
    for pair in sorted(set(b) - common):
        f.fail(f"BTF only: {pair[0]} as {pair[1]} ({b[pair][0].route_text})")
    keys: dict[str, set[str]] = defaultdict(set)
    for ms in d.values():
        for m in ms:
            if not m.is_tracepoint:
                keys[m.name].add(m.key)
    several = sum(1 for k in keys.values() if len(k) > 1)
    if several:
        f.say(f"{plural(several, 'function name')} with static definitions in several "
              "compile units (kept apart in DWARF; BTF has no units: names compared)")
    return f

