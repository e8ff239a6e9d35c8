"""Where the life of a kernel object starts and ends, as rules a user can read.

An address handed out again is a new object.  Where a creation function's return is
probed that return says so; the rules below say it otherwise.  A rule names a
tracepoint or a kernel function (``probe``), the parameter carrying the object and,
for a tracepoint, optionally a condition on one scalar argument; its ``effect`` is
``starts`` (this hit is the first of a new lifetime) or ``ends`` (this hit is the
last).  A function's rule takes effect at its exit: the function that frees the
object (``kfree_skbmem`` for an ``sk_buff``, ``sk_destruct`` for a ``sock``) ends its
life there, whichever path called it, and once the traced calls it ran inside have
returned, the address is another object's.  Function names are never guessed from
words such as *free* (``tcp_stream_memory_free`` frees nothing): only the functions
listed here, or given with ``--lifetime-rule``, end a life.

The probes use them to keep the set of followed objects right (a new life at an address
must be admitted afresh; the ended life's last hits through a holder are not a new
life: `ctracer.probes.tracepoint`); the trace file's meta carries
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
from typing import Callable, Iterable, Optional, Sequence

from ctracer.errors import UsageError

#: what a function's name says of its objects, where the functions table gives no
#: structural signal: frees one, creates one, or (typed as a creator) returns one that
#: already exists
FREE_LIKE = re.compile(r"(^|_)(free|destroy|destruct|dealloc|kfree)(_|$)")
ALLOC_LIKE = re.compile(r"(^|_)(alloc|new|create|clone)(_|$)")
LOOKUP_LIKE = re.compile(r"(^|_)(lookup|find|get|peek|search|next|prev|first|last)(_|$)")


def creates_objects(route_kind: str, name: str) -> bool:
    """A function whose return starts an object's life: it returns the object and is not
    named like a lookup (those return existing objects)."""
    return route_kind == "returns" and not LOOKUP_LIKE.search(name)


@dataclass(frozen=True)
class RowRoles:
    """What the lifetime rules need of a trace's function rows, computed once for the
    probes, ``--tail`` (`ctracer.record.live_objects`) and the report
    (`ctracer.analysis.functions`): the rows whose return creates an object, the
    tracepoint rows reaching it through a holder (``skb->sk``), the rows named like a
    free or an allocation, and whether any row returns the object."""

    creators: frozenset[int]
    held: frozenset[int]
    free_like: frozenset[int]
    alloc_like: frozenset[int]
    returns_any: bool

    def use_names(self, has_rules: bool) -> bool:
        """No creation function nor rule: lifetimes end and start by function names."""
        return not self.returns_any and not has_rules


def row_roles(rows: Iterable) -> RowRoles:
    """The `RowRoles` of function rows (anything with ``id``, ``name``, ``route_kind`` and
    ``route_text``: `ctracer.event.FunctionRow`)."""
    rows = list(rows)
    return RowRoles(
        creators=frozenset(r.id for r in rows if creates_objects(r.route_kind, r.name)),
        held=frozenset(r.id for r in rows
                       if r.route_kind == "tracepoint"
                       and "->" in (getattr(r, "route_text", "") or "")),
        free_like=frozenset(r.id for r in rows if FREE_LIKE.search(r.name)),
        alloc_like=frozenset(r.id for r in rows if ALLOC_LIKE.search(r.name)),
        returns_any=any(r.route_kind == "returns" for r in rows))

#: the values TCP_CLOSE and TCP_SYN_RECV have where the debug info cannot say
#: (include/net/tcp_states.h); a rule's condition names the enumerator, looked up in the
#: kernel's BTF when traced
TCP_CLOSE = 7
TCP_SYN_RECV = 3


@dataclass(frozen=True)
class LifetimeRule:
    """A rule that starts or ends an object's lifetime: a tracepoint or function taking the
    object, optionally only when an argument equals a value."""

    struct: str
    #: the tracepoint's or the function's name
    function: str
    #: index of the parameter that is the object (direct, not a holder)
    param_index: int
    effect: str  # "starts" | "ends"
    #: the argument (by name) the condition reads, and the value it must equal
    arg: Optional[str] = None
    equals: Optional[int] = None
    why: str = ""
    #: the value as the user or the default wrote it (an enumerator's name), for display
    equals_text: Optional[str] = None
    #: "tracepoint" (the rule acts at a hit) or "function" (at the function's exit);
    #: "" until `place` finds which a rule the user wrote names
    probe: str = "tracepoint"
    #: a default that only stands in for this function's rule: dropped where that
    #: function is traced (`defaults`)
    stands_in_for: str = ""

    def to_json(self) -> dict:
        return {"struct": self.struct, "function": self.function, "probe": self.probe,
                "param_index": self.param_index, "effect": self.effect, "arg": self.arg,
                "equals": self.equals, "rule": self.why}

    def applies(self, args: dict) -> bool:
        """Whether the rule holds for a hit with these arguments."""
        return self.arg is None or args.get(self.arg) == self.equals

    @property
    def text(self) -> str:
        """The rule as ``--lifetime-rule`` takes it."""
        cond = "" if self.arg is None else \
            f":{self.arg}={self.equals_text or self.equals}"
        return f"{self.effect}:{self.function}{cond}"


RULES = (
    LifetimeRule("sock", "inet_sock_set_state", 0, "starts", "oldstate", TCP_CLOSE,
                 "sock: a transition out of TCP_CLOSE starts a new lifetime",
                 equals_text="TCP_CLOSE"),
    # an accepted socket is a copy of its listener (inet_csk_clone_lock), whose first
    # transition is TCP_LISTEN -> TCP_SYN_RECV: never out of TCP_CLOSE.  One condition a
    # rule: newstate, as oldstate=TCP_LISTEN would split a listener at its close too (a
    # simultaneous open, TCP_SYN_SENT -> TCP_SYN_RECV, is split: rare, and admitted
    # again by the same condition)
    LifetimeRule("sock", "inet_sock_set_state", 0, "starts", "newstate", TCP_SYN_RECV,
                 "sock: an accepted socket's life starts at its clone, into TCP_SYN_RECV",
                 equals_text="TCP_SYN_RECV"),
    LifetimeRule("sock", "tcp_destroy_sock", 0, "ends",
                 why="sock: tcp_destroy_sock ends its lifetime (the socket is freed once "
                     "its last reference goes; an address seen again is a new socket)",
                 stands_in_for="sk_destruct"),
    LifetimeRule("sk_buff", "kfree_skb", 0, "ends", why="sk_buff: kfree_skb ends its lifetime"),
    LifetimeRule("sk_buff", "consume_skb", 0, "ends",
                 why="sk_buff: consume_skb ends its lifetime"),
) + tuple(
    # where the memory goes back: every path that frees a buffer ends in one of these
    # (TCP's receive queue frees through __kfree_skb, coalescing through
    # kfree_skb_partial, NAPI's cache through __napi_kfree_skb): no tracepoint fires there
    LifetimeRule("sk_buff", name, 0, "ends", probe="function",
                 why=f"sk_buff: {name} frees it (its exit ends the lifetime)")
    for name in ("kfree_skbmem", "__kfree_skb", "kfree_skb_partial", "__napi_kfree_skb",
                 "napi_skb_free_stolen_head", "napi_skb_cache_put")
) + (
    LifetimeRule("sock", "sk_destruct", 0, "ends", probe="function",
                 why="sock: sk_destruct frees it, or hands it to RCU to free (its exit ends the lifetime)"),
)


class LifetimeRuleError(UsageError):
    """A lifetime rule refused: ``rule`` is its text as written, ``reason`` why."""

    def __init__(self, rule: str, reason: str, option: str = "--lifetime-rule"):
        super().__init__(f"{option} {rule!r}: {reason}")
        self.rule, self.reason = rule, reason


def rules_for(struct: str) -> tuple[LifetimeRule, ...]:
    """The lifetime rules written for ``struct``."""
    return tuple(r for r in RULES if r.struct == struct)


def without_stand_ins(placed: Sequence[LifetimeRule]) -> tuple[LifetimeRule, ...]:
    """The placed defaults less those standing in for a function's rule that is placed
    too (``tcp_destroy_sock`` comes long before ``sk_destruct`` frees the socket:
    where the free is traced, it is the end)."""
    functions = {r.function for r in placed if r.probe == "function"}
    return tuple(r for r in placed if r.stands_in_for not in functions)


_RULE = re.compile(r"(starts|ends):([A-Za-z_][A-Za-z0-9_]*)"
                   r"(?::([A-Za-z_][A-Za-z0-9_]*)=(-?(?:0[xX][0-9a-fA-F]+|\d+)|[A-Za-z_]\w*))?\Z")


def parse_rule(text: str, struct: str,
               enumerator_value: Callable[[str], Optional[int]] = lambda _n: None
               ) -> LifetimeRule:
    """A ``--lifetime-rule`` (``starts:inet_sock_set_state:oldstate=TCP_CLOSE``,
    ``ends:tcp_destroy_sock``, ``ends:kfree_skbmem``): the effect, the tracepoint or
    function, optionally a condition on one of a tracepoint's arguments; a value may be
    an enumerator's name, which ``enumerator_value`` looks up (in the traced kernel's
    BTF).  Whether the name is a tracepoint or a function, and the parameter carrying
    the object, are set by `place`."""
    m = _RULE.match(text.strip())
    if not m:
        raise LifetimeRuleError(text, "expected starts|ends:TRACEPOINT[:ARGUMENT=VALUE] or "
                                      "ends:FUNCTION, e.g. "
                                      "starts:inet_sock_set_state:oldstate=TCP_CLOSE")
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
                        equals_text=value, probe="")


def place(rules: Sequence[LifetimeRule], methods: Sequence) -> tuple[LifetimeRule, ...]:
    """The rules with the parameter that is the object, from the traced methods (the
    struct itself, not reached through a holder): a traced tracepoint of the rule's
    name, else (a rule that ends a life, without a condition) a traced function of that
    name; UsageError for a rule naming neither."""
    placed = []
    for rule in rules:
        def direct(tracepoint: bool) -> list:
            return [m for m in methods if m.is_tracepoint == tracepoint
                    and m.name == rule.function and not m.path and not m.holder
                    and m.param_index is not None]
        points = [] if rule.probe == "function" else direct(True)
        if points:
            placed.append(dataclasses.replace(rule, param_index=points[0].param_index,
                                              probe="tracepoint"))
            continue
        may_be_function = (rule.probe != "tracepoint" and rule.effect == "ends"
                           and rule.arg is None)
        calls = direct(False) if may_be_function else []
        if calls:
            placed.append(dataclasses.replace(rule, param_index=calls[0].param_index,
                                              probe="function"))
            continue
        known = sorted({m.name for m in methods if m.is_tracepoint
                        and not m.path and not m.holder})
        these = f"(these do: {', '.join(known[:8])}{', ...' if len(known) > 8 else ''})"
        raise LifetimeRuleError(
            rule.text, f"{rule.function} is neither a traced tracepoint handing "
                       f"{rule.struct} itself {these} nor a traced function taking it"
            if may_be_function else f"{rule.function} is not a traced tracepoint handing "
                                    f"{rule.struct} itself {these}", option="lifetime rule")
    return tuple(placed)


def check_arguments(rules: Sequence[LifetimeRule], arguments: dict[str, Sequence[str]]) -> None:
    """UsageError for a rule whose condition names an argument its tracepoint lacks
    (``arguments``: the traced tracepoints' argument names)."""
    for rule in rules:
        names = arguments.get(rule.function, ())
        if rule.arg is not None and rule.arg not in names:
            raise LifetimeRuleError(rule.text, f"{rule.function} has no argument {rule.arg} "
                                               f"(it has {', '.join(names) or 'none'})",
                                    option="lifetime rule")


#: the rules one tracepoint's probe evaluates (`ctracer.probes.tracepoint`'s descriptor)
MAX_STARTS, MAX_ENDS = 2, 1


def check_counts(rules: Sequence[LifetimeRule]) -> None:
    """UsageError for more rules on one tracepoint than its probe evaluates (`MAX_STARTS`
    starting a life, `MAX_ENDS` ending one), rather than some silently not applied."""
    for effect, most in (("starts", MAX_STARTS), ("ends", MAX_ENDS)):
        seen: dict[str, list[LifetimeRule]] = {}
        for rule in rules:
            if rule.probe == "tracepoint" and rule.effect == effect:
                seen.setdefault(rule.function, []).append(rule)
        for function, these in seen.items():
            if len(these) > most:
                raise LifetimeRuleError(
                    these[most].text, f"{function} takes at most {most} {effect} "
                                      f"rule{'s' if most > 1 else ''}", option="lifetime rule")
