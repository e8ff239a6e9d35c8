"""The index's list of functions not fully probed, one entry a function: a function that
reaches the object several ways (``net->rtnl``, ``net->genl_sock``… one functions-table
row each) is named once, with its ways, and the reason once when every way says the
same."""

from __future__ import annotations

from typing import Iterable

from ctracer.event import FunctionRow


def failed_functions(rows: Iterable[FunctionRow]) -> list[dict]:
    """``[{"name", "why": [(reason, [ways...]), ...]}]`` in the order functions first
    appear; a function of the same name in another compile unit is another entry."""
    out: dict[tuple[str, str], dict[str, list[str]]] = {}
    for f in rows:
        reasons = out.setdefault((f.name, f.unit or ""), {})
        ways = reasons.setdefault(f.attached, [])
        if f.route_text and f.route_text not in ways:
            ways.append(f.route_text)
    units: dict[str, int] = {}
    for name, _ in out:
        units[name] = units.get(name, 0) + 1
    # the compile unit only tells apart functions of one name
    return [{"name": name, "unit": unit if units[name] > 1 else "", "why": list(reasons.items())}
            for (name, unit), reasons in out.items()]
