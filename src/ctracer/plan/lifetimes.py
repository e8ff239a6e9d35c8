"""Where the life of a kernel object starts and ends, as rules a user can read.

An address handed out again is a new object.  Where a creation function's return is
probed that return says so; on a kernel traced through tracepoints only, the rules
below say it instead.  A rule names a tracepoint, the parameter carrying the object
and, optionally, a condition on one scalar argument; its ``effect`` is ``starts`` (this
hit is the first of a new lifetime) or ``ends`` (this hit is the last).

The probes use them to keep the set of followed objects right (an object whose life
ended is forgotten, so the address is admitted afresh); the trace file's meta carries
them (``lifetime_rules``, the JSON of `LifetimeRule.to_json`), so the report splits
lifetimes by the same rules and can say which one split an address.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: include/net/tcp_states.h
TCP_CLOSE = 7


@dataclass(frozen=True)
class LifetimeRule:
    struct: str
    tracepoint: str
    #: index of the tracepoint parameter that is the object (direct, not a holder)
    param_index: int
    effect: str  # "starts" | "ends"
    #: the argument (by name) the condition reads, and the value it must equal
    arg: Optional[str] = None
    equals: Optional[int] = None
    why: str = ""

    def to_json(self) -> dict:
        return {"struct": self.struct, "function": self.tracepoint, "probe": "tracepoint",
                "param_index": self.param_index, "effect": self.effect, "arg": self.arg,
                "equals": self.equals, "rule": self.why}

    def applies(self, args: dict) -> bool:
        return self.arg is None or args.get(self.arg) == self.equals


RULES = (
    LifetimeRule("sock", "inet_sock_set_state", 0, "starts", "oldstate", TCP_CLOSE,
                 "sock: a transition out of TCP_CLOSE starts a new lifetime"),
    LifetimeRule("sk_buff", "kfree_skb", 0, "ends", why="sk_buff: kfree_skb ends its lifetime"),
    LifetimeRule("sk_buff", "consume_skb", 0, "ends",
                 why="sk_buff: consume_skb ends its lifetime"),
)


def rules_for(struct: str) -> tuple[LifetimeRule, ...]:
    return tuple(r for r in RULES if r.struct == struct)
