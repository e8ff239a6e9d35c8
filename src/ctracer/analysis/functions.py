"""The functions table as the analysis reads it: which function rows are one function,
the names to show, and which rows create, free or allocate objects, start or end
lifetimes (the trace's lifetime rules) or announce stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from ctracer.analysis.model import function_label
from ctracer.event import FunctionRow, canonical_ids
from ctracer.plan.lifetime_rules import row_roles


def attached_fully(attached: str) -> bool:
    """Every probe the function needs attached: entry and exit of a function (or its one
    session program, which runs at both), or the one program of a tracepoint (which has
    no exit)."""
    parts = {p.strip() for p in attached.split(",")}
    return any(pair <= parts for pair in ({"entry", "exit"}, {"fentry", "fexit"},
                                          {"fentry.multi", "fexit.multi"},
                                          {"kprobe", "kretprobe"})) or \
        parts in ({"raw_tracepoint"}, {"fsession.multi"})


def _display_names(functions: dict[int, FunctionRow], canon: dict[int, int]) -> dict[int, str]:
    """Names to show, telling apart different functions of the same name (statics of
    several compile units): ``sk_check (tcp.c)``."""
    by_name: dict[str, set[int]] = {}
    for fid, c in canon.items():
        if functions[fid].route_kind != "tracepoint":   # tp:NAME is told apart by its prefix
            by_name.setdefault(functions[fid].name, set()).add(c)
    out = {}
    for fid, c in canon.items():
        f = functions[c]
        if f.route_kind == "tracepoint":
            out[fid] = f"tp:{f.name}"
        elif len(by_name[f.name]) == 1:
            out[fid] = f.name
        elif f.unit and len({functions[o].unit for o in by_name[f.name]}) == len(by_name[f.name]):
            out[fid] = f"{f.name} ({f.unit})"
        else:
            out[fid] = f"{f.name} @0x{f.address or 0:x}" if f.address else f"{f.name} #{c}"
    return out


@dataclass
class FunctionTable:
    """What the functions table tells the passes: which function rows are one
    function, the names to show, and which rows create, free or allocate objects."""

    canon: dict[int, int]        # row -> the id standing for its function
    names: dict[int, str]        # row or function id -> display name
    creators: set[int]           # rows returning a new object (route kind returns, not lookups)
    use_names: bool              # no creation function traced: lifetimes found by names
    free_like: set[int]
    alloc_like: set[int]
    #: tracepoint row -> the lifetime rules (meta ``lifetime_rules``) naming it
    rules: dict[int, list[dict]] = field(default_factory=dict)
    #: function row -> the rule whose function's exit ends the object's life (its text)
    ending: dict[int, str] = field(default_factory=dict)
    #: tracepoint rows reaching the object through a holder (``skb->sk``)
    held: set[int] = field(default_factory=set)
    #: tracepoint row -> the store it announces (meta ``announced_stores``)
    announced: dict[int, Any] = field(default_factory=dict)

    def name(self, fid: int) -> str:
        """The name shown for function id ``fid`` (made once, then remembered)."""
        n = self.names.get(fid)
        if n is None:
            n = self.names[fid] = function_label(self.names, fid)
        return n


def function_table(functions: dict[int, FunctionRow],
                   lifetime_rules: Iterable[dict] = (),
                   announced_stores: Optional[Sequence[dict]] = None) -> FunctionTable:
    """The passes' view of the functions table; ``lifetime_rules`` and
    ``announced_stores`` are the trace's (`ctracer.plan.lifetime_rules`,
    `ctracer.plan.stores`, as its meta carries them)."""
    from ctracer.plan import stores
    by_tp = stores.rules_by_tracepoint(announced_stores)
    canon = canonical_ids(functions.values())
    rules: dict[int, list[dict]] = {}
    ending: dict[int, str] = {}
    for rule in lifetime_rules:
        on_function = rule.get("probe") == "function"
        for fid, f in functions.items():
            if f.name != rule.get("function"):
                continue
            if not on_function and f.route_kind == "tracepoint":
                rules.setdefault(fid, []).append(rule)
            elif on_function and f.route_kind == "direct" and rule.get("effect") == "ends":
                ending[fid] = rule.get("rule") or f"{f.name} ends a lifetime"
    roles = row_roles(functions.values())
    return FunctionTable(
        canon=canon, names=_display_names(functions, canon),
        creators=set(roles.creators), use_names=roles.use_names(bool(rules or ending)),
        ending=ending, free_like=set(roles.free_like), alloc_like=set(roles.alloc_like),
        rules=rules, held=set(roles.held),
        announced={fid: by_tp[f.name] for fid, f in functions.items()
                   if f.route_kind == "tracepoint" and f.name in by_tp
                   and not "->" in (f.route_text or "")})


def lifetime_rule(fns: FunctionTable) -> str:
    """One line saying what starts and ends an object's lifetime in this trace (its
    lifetime rules, the creation functions, or reuse by name)."""
    if fns.rules or fns.ending:
        texts = sorted({r.get("rule") or f"{r.get('function')} {r.get('effect')} a lifetime"
                        for rules in fns.rules.values() for r in rules}
                       | set(fns.ending.values()))
        creators = sorted({fns.name(fns.canon.get(f, f)) for f in fns.creators})
        if creators:
            texts.append("a new lifetime starts where a creation function returns the "
                         "address (" + ", ".join(creators[:6])
                         + (", ..." if len(creators) > 6 else "") + ")")
        return "rules recorded with the trace: " + "; ".join(texts)
    if fns.creators:
        return "structural: a new lifetime starts when a creation function returns the address"
    if fns.use_names:
        return ("by name: no creation function was traced, so an allocator-looking call "
                "after a free-looking one starts a new lifetime")
    return "none: the traced creation functions all look like lookups"
