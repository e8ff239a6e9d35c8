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

The defaults (`RULES`) are what ``ctracer trace`` uses unless ``--lifetime-rule`` is
given (then only those given, or none with ``--lifetime-rule none``); the recording
prints the rules in use, the report says which one started each lifetime.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ctracer.errors import UsageError

#: what a function's name says of its objects, where the functions table gives no
#: structural signal: frees one, creates one, or (typed as a creator) returns one that
#: already exists
FREE_LIKE = re.compile(r"(^|_)(free|destroy|destruct|dealloc|kfree)(_|$)")
ALLOC_LIKE = re.compile(r"(^|_)(alloc|new|create|clone)(_|$)")
LOOKUP_LIKE = re.compile(r"(^|_)(lookup|find|get|peek|search|next|prev|first|last)(_|$)")

#: the value TCP_CLOSE has where the debug info cannot say (include/net/tcp_states.h);
#: a rule's condition names the enumerator, looked up in the kernel's BTF when traced
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
    #: the value as the user or the default wrote it (an enumerator's name), for display
    equals_text: Optional[str] = None

    def to_json(self) -> dict:
        return {"struct": self.struct, "function": self.tracepoint, "probe": "tracepoint",
                "param_index": self.param_index, "effect": self.effect, "arg": self.arg,
                "equals": self.equals, "rule": self.why}

    def applies(self, args: dict) -> bool:
        return self.arg is None or args.get(self.arg) == self.equals

    @property
    def text(self) -> str:
        """The rule as ``--lifetime-rule`` takes it."""
        cond = "" if self.arg is None else \
            f":{self.arg}={self.equals_text or self.equals}"
        return f"{self.effect}:{self.tracepoint}{cond}"


RULES = (
    LifetimeRule("sock", "inet_sock_set_state", 0, "starts", "oldstate", TCP_CLOSE,
                 "sock: a transition out of TCP_CLOSE starts a new lifetime",
                 equals_text="TCP_CLOSE"),
    LifetimeRule("sock", "tcp_destroy_sock", 0, "ends",
                 why="sock: tcp_destroy_sock ends its lifetime (the socket is freed once "
                     "its last reference goes; an address seen again is a new socket)"),
    LifetimeRule("sk_buff", "kfree_skb", 0, "ends", why="sk_buff: kfree_skb ends its lifetime"),
    LifetimeRule("sk_buff", "consume_skb", 0, "ends",
                 why="sk_buff: consume_skb ends its lifetime"),
)


class LifetimeRuleError(UsageError):
    """A lifetime rule refused: ``rule`` is its text as written, ``reason`` why."""

    def __init__(self, rule: str, reason: str, option: str = "--lifetime-rule"):
        super().__init__(f"{option} {rule!r}: {reason}")
        self.rule, self.reason = rule, reason


def rules_for(struct: str) -> tuple[LifetimeRule, ...]:
    return tuple(r for r in RULES if r.struct == struct)


_RULE = re.compile(r"(starts|ends):([A-Za-z_][A-Za-z0-9_]*)"
                   r"(?::([A-Za-z_][A-Za-z0-9_]*)=(-?(?:0[xX][0-9a-fA-F]+|\d+)|[A-Za-z_]\w*))?\Z")


def parse_rule(text: str, struct: str,
               enumerator_value: Callable[[str], Optional[int]] = lambda _n: None
               ) -> LifetimeRule:
    """A ``--lifetime-rule`` (``starts:inet_sock_set_state:oldstate=TCP_CLOSE``,
    ``ends:tcp_destroy_sock``): the effect, the tracepoint, optionally a condition on one
    of its arguments; a value may be an enumerator's name, which ``enumerator_value``
    looks up (in the traced kernel's BTF).  The parameter carrying the object is set by
    `place`."""
    m = _RULE.match(text.strip())
    if not m:
        raise LifetimeRuleError(text, "expected starts|ends:TRACEPOINT[:ARGUMENT=VALUE], "
                                      "e.g. starts:inet_sock_set_state:oldstate=TCP_CLOSE")
    effect, tracepoint, arg, value = m.groups()
    equals = None
    if value is not None:
        if value[0].isalpha() or value[0] == "_":
            equals = enumerator_value(value)
            if equals is None:
                raise LifetimeRuleError(text, f"no enumerator {value} in the kernel's "
                                              "debug info")
        else:
            equals = int(value, 0)
    cond = f" when {arg} is {value}" if arg else ""
    return LifetimeRule(struct, tracepoint, 0, effect, arg, equals,
                        f"{struct}: {tracepoint}{cond} {effect} a lifetime (--lifetime-rule)",
                        equals_text=value)


def place(rules: Sequence[LifetimeRule], methods: Sequence) -> tuple[LifetimeRule, ...]:
    """The rules with the parameter that is the object, from the traced tracepoint
    methods (the struct itself, not reached through a holder); UsageError for a rule
    naming a tracepoint that is not traced or does not hand the object directly."""
    placed = []
    for rule in rules:
        direct = [m for m in methods if m.is_tracepoint and m.name == rule.tracepoint
                  and not m.path and not m.holder and m.param_index is not None]
        if not direct:
            known = sorted({m.name for m in methods if m.is_tracepoint
                            and not m.path and not m.holder})
            raise LifetimeRuleError(
                rule.text, f"{rule.tracepoint} is not a traced tracepoint handing "
                           f"{rule.struct} itself (these do: {', '.join(known[:8])}"
                           f"{', ...' if len(known) > 8 else ''})", option="lifetime rule")
        placed.append(dataclasses.replace(rule, param_index=direct[0].param_index))
    return tuple(placed)


def check_arguments(rules: Sequence[LifetimeRule], arguments: dict[str, Sequence[str]]) -> None:
    """UsageError for a rule whose condition names an argument its tracepoint lacks
    (``arguments``: the traced tracepoints' argument names)."""
    for rule in rules:
        names = arguments.get(rule.tracepoint, ())
        if rule.arg is not None and rule.arg not in names:
            raise LifetimeRuleError(rule.text, f"{rule.tracepoint} has no argument {rule.arg} "
                                               f"(it has {', '.join(names) or 'none'})",
                                    option="lifetime rule")
