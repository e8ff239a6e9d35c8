"""Tracepoints that fire just before the store they announce, as data.

``sock:inet_sock_set_state`` is called from ``inet_sk_state_store()`` and
``inet_sk_set_state()`` *before* ``sk->sk_state`` is written: the snapshot taken at the
hit still holds the old state (its ``oldstate``), and the new one (its ``newstate``) is
seen only at the object's next hit, whatever that is.  Diffing snapshots alone would
show the LISTEN→SYN_RECV change on the row of the next hit (``tcp_cong_state_set``).

An `Announced` rule says which tracepoint announces a store, into which field, with the
value of which argument.  The trace's meta carries the rules placed
(``announced_stores``), and the report and ``--tail`` show the change on the
announcing row, ``old → the argument's value``, marked "announced" (not seen in a
snapshot); the next snapshot that shows the same value then changes nothing.
`apply` is that step, shared by both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence


@dataclass(frozen=True)
class Announced:
    """A tracepoint that announces a store to a field: its argument holds the value the
    field takes, so the hit stands for the store."""

    struct: str
    tracepoint: str
    field: str       # the mini field's dotted path the store writes
    argument: str    # the tracepoint argument holding the value stored
    why: str = ""
    #: the argument holding the value the field had (``oldstate``): a hit whose value
    #: is not the one the address's last hit stored is another object's
    before: str = ""

    def to_json(self) -> dict:
        return {"struct": self.struct, "tracepoint": self.tracepoint, "field": self.field,
                "argument": self.argument, "rule": self.why, "before": self.before}

    @classmethod
    def from_json(cls, d: dict) -> "Announced":
        """The store back from `to_json`'s dict."""
        return cls(str(d["struct"]), str(d["tracepoint"]), str(d["field"]),
                   str(d["argument"]), str(d.get("rule") or ""), str(d.get("before") or ""))

    @property
    def continuity_text(self) -> str:
        """The rule in words, for the report: a hit whose old value is not the last one stored
        is another object."""
        return (f"{self.struct}: an {self.tracepoint} hit whose {self.before} is not the "
                f"state the address's last one stored is another {self.struct}")


RULES = (
    Announced("sock", "inet_sock_set_state", "__sk_common.skc_state", "newstate",
              why="inet_sock_set_state fires before inet_sk_state_store() writes "
                  "sk_state: the new state is its newstate argument", before="oldstate"),
)


def place(struct: str, tracepoints: dict[str, Sequence[str]],
          fields: Sequence[str]) -> tuple[Announced, ...]:
    """The rules of ``struct`` whose tracepoint is traced with the argument
    (``tracepoints``: name → argument names) and whose field is recorded."""
    return tuple(r for r in RULES if r.struct == struct and r.field in fields
                 and r.argument in tracepoints.get(r.tracepoint, ()))


def rules_by_tracepoint(meta_rules: Optional[Sequence[dict]]) -> dict[str, Announced]:
    """The trace's ``announced_stores`` by tracepoint name (malformed entries skipped)."""
    out = {}
    for d in meta_rules or ():
        try:
            rule = Announced.from_json(d)
        except (KeyError, TypeError):
            continue
        out[rule.tracepoint] = rule
    return out


def apply(rule: Optional[Announced], values: dict[str, Any],
          args: Optional[dict[str, Any]]) -> Optional[tuple[Any, Any]]:
    """At a hit of ``rule``'s tracepoint whose snapshot is ``values``: (old, new) of the
    store it announces, or None when it stores what the field holds already or the
    value is missing; ``values`` is updated to hold the new value (so the next hit's
    snapshot, showing it, changes nothing)."""
    if rule is None or not args or rule.argument not in args or rule.field not in values:
        return None
    old, new = values[rule.field], args[rule.argument]
    if old is None or not isinstance(new, int) or new == old:
        return None
    values[rule.field] = new
    return old, new
