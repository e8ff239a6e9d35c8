"""``--where``: a condition on the traced struct's fields, parsed into a small tree.

The text ``skc_num == 8080 && (skc_state == 1 || skc_state == 10)`` becomes a tree of
`Compare`, `Not`, `And` and `Or` nodes whose field paths are checked against the mini
layout the trace records, before any C exists; the probe generator turns the tree into C
from its parts (field identifiers from the layout, integer literals), so the user's text
is never pasted into the program.

Grammar (C operators, plus the words ``and``, ``or``, ``not``)::

    expr    := or
    or      := and (("||" | "or") and)*
    and     := unary (("&&" | "and") unary)*
    unary   := ("!" | "not") unary | "(" expr ")" | compare
    compare := FIELD OP VALUE | FIELD              (a bare field means FIELD != 0)
    OP      := == != < <= > >= &                    (a & b: any of the bits of b set;
                                                     a single = is read as ==)

A FIELD is a member path as ``ctracer struct --mini`` prints it
(``__sk_common.skc_num``) or any unambiguous dotted suffix of one (``skc_num``).
A VALUE is written as the report and ``--tail`` show the field (`ctracer.decode`):
a port in host order (``skc_dport == 8080``), an address as a dotted quad or IPv6
text (``skc_daddr == 127.0.0.1``, ``skc_v6_daddr == ::1``; addresses take == and !=
only), an enumerator (``skc_state == TCP_LISTEN``), a flag bit as its mask
(``skc_flags & SOCK_DEAD``), an errno name (``sk_err == ECONNRESET``); else a decimal,
hex (0x...) or negative number, the raw value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from ctracer import decode
from ctracer.errors import UsageError
from ctracer.event import Field, Layout

OPERATORS = ("==", "!=", "<=", ">=", "<", ">", "&")

_IPV4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_TOKEN = re.compile(r"\s*(?:(?P<addr>\d+(?:\.\d+)+(?![\w.])|(?:[0-9A-Fa-f]{0,4}:){2,7}(?:"
                    + _IPV4 + r"|[0-9A-Fa-f]{1,4})?(?![\w:.]))"
                    r"|(?P<num>-?0[xX][0-9a-fA-F]+|-?\d+)|(?P<name>-?[A-Za-z_][A-Za-z0-9_.]*)"
                    r"|(?P<op>==|!=|<=|>=|&&|\|\||[<>!&()=]))")


@dataclass(frozen=True)
class Compare:
    """``field OP value`` in ``--where``, the value raw as the probe compares it."""

    field: Field
    op: str
    value: int        # the raw value the probe compares


@dataclass(frozen=True)
class Not:
    """``!condition`` in ``--where``."""

    operand: "Condition"


@dataclass(frozen=True)
class And:
    """``left && right`` in ``--where``."""

    left: "Condition"
    right: "Condition"


@dataclass(frozen=True)
class Or:
    """``left || right`` in ``--where``."""

    left: "Condition"
    right: "Condition"


Condition = Union[Compare, Not, And, Or]


def _tokens(text: str) -> list[tuple[str, str]]:
    out, at = [], 0
    text = text.rstrip()
    while at < len(text):
        m = _TOKEN.match(text, at)
        if not m or m.end() == at:
            raise UsageError(f"--where: cannot read {text[at:].strip()[:20]!r}")
        kind = m.lastgroup or ""
        value = m.group(kind)
        if kind == "name" and value in ("and", "or", "not"):
            kind, value = "op", {"and": "&&", "or": "||", "not": "!"}[value]
        if (kind, value) == ("op", "="):  # as SQL and shells write it: ==
            value = "=="
        out.append((kind, value))
        at = m.end()
    return out


def resolve_field(layout: Layout, path: str) -> Field:
    """The layout field a user's path names: exact, or a unique dotted suffix."""
    names = [f.name for f in layout.fields]
    if path in names:
        return layout.field(path)
    matches = [n for n in names if n.endswith("." + path)]
    if len(matches) == 1:
        return layout.field(matches[0])
    if matches:
        raise UsageError(f"--where: {path!r} is ambiguous: {', '.join(sorted(matches)[:5])}")
    import difflib
    close = difflib.get_close_matches(path, names + [n.rsplit(".", 1)[-1] for n in names],
                                      n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"--where: the recorded fields of {layout.name} have no {path!r}{hint}")


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], layout: Layout):
        self.tokens, self.at, self.layout = tokens, 0, layout

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        self.at += 1
        return token

    def expect(self, value: str) -> None:
        kind, got = self.take()
        if got != value:
            raise UsageError(f"--where: expected {value!r}, got {got or 'the end'!r}")

    def parse_or(self) -> Condition:
        node = self.parse_and()
        while self.peek() == ("op", "||"):
            self.take()
            node = Or(node, self.parse_and())
        return node

    def parse_and(self) -> Condition:
        node = self.parse_unary()
        while self.peek() == ("op", "&&"):
            self.take()
            node = And(node, self.parse_unary())
        return node

    def parse_unary(self) -> Condition:
        kind, value = self.peek()
        if (kind, value) == ("op", "!"):
            self.take()
            return Not(self.parse_unary())
        if (kind, value) == ("op", "("):
            self.take()
            node = self.parse_or()
            self.expect(")")
            return node
        if kind != "name" or value.startswith("-"):
            raise UsageError(f"--where: expected a field name, got {value or 'the end'!r}")
        self.take()
        field = resolve_field(self.layout, value)
        address = field.kind == "ipv6" or decode.display_of(field) == "ipv4"
        if field.kind != "ipv6" and (field.ctype.startswith("char[")
                                     or field.ctype in ("float", "double")):
            raise UsageError(f"--where: {field.name} ({field.ctype}) is not an integer field")
        kind, op = self.peek()
        if kind != "op" or op not in OPERATORS:
            return Compare(field, "!=", 0)
        self.take()
        if address and op not in ("==", "!="):
            raise UsageError(f"--where: {field.name} holds an address: compare it with == "
                             f"or != (e.g. {field.name.rsplit('.', 1)[-1]} == "
                             f"{decode.example_of(field)})")
        kind, text = self.take()
        if kind not in ("num", "name", "addr"):
            raise UsageError(f"--where: {field.name} {op} needs a value, e.g. "
                             f"{decode.example_of(field)}; got {text or 'the end'!r}")
        try:
            return Compare(field, op, decode.parse_value(field, text))
        except ValueError as e:
            raise UsageError(f"--where: {e}") from None


def parse(text: str, layout: Layout) -> Condition:
    """The condition tree, every field resolved in ``layout``; UsageError when the text
    is not a condition or names a field the layout does not record."""
    tokens = _tokens(text)
    if not tokens:
        raise UsageError("--where needs a condition, e.g. 'skc_num == 8080'")
    parser = _Parser(tokens, layout)
    node = parser.parse_or()
    if parser.peek()[0] != "end":
        raise UsageError(f"--where: unexpected {parser.peek()[1]!r}")
    return node


def evaluate(node: Condition, values: dict) -> bool:
    """The condition on decoded field values (what the kernel computes, for tests and
    for checking a trace afterwards)."""
    if isinstance(node, Compare):
        v = values[node.field.name]
        if node.field.kind == "ipv6" and isinstance(v, str):
            v = decode.ipv6_raw(v)
        return {"==": v == node.value, "!=": v != node.value, "<": v < node.value,
                "<=": v <= node.value, ">": v > node.value, ">=": v >= node.value,
                "&": bool(v & node.value)}[node.op]
    if isinstance(node, Not):
        return not evaluate(node.operand, values)
    if isinstance(node, And):
        return evaluate(node.left, values) and evaluate(node.right, values)
    return evaluate(node.left, values) or evaluate(node.right, values)


def fields_of(node: Condition) -> set[str]:
    """The names of the fields a condition reads."""
    if isinstance(node, Compare):
        return {node.field.name}
    if isinstance(node, Not):
        return fields_of(node.operand)
    return fields_of(node.left) | fields_of(node.right)


def to_text(node: Condition) -> str:
    """The condition written back canonically, values in the units pages show (for the
    trace's meta and the C comment; it parses back to the same tree)."""
    if isinstance(node, Compare):
        return f"{node.field.name} {node.op} {decode.filter_text(node.field, node.value)}"
    if isinstance(node, Not):
        return f"!({to_text(node.operand)})"
    op = "&&" if isinstance(node, And) else "||"
    return f"({to_text(node.left)} {op} {to_text(node.right)})"
