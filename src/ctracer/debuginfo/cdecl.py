"""The one C speller: how ctracer writes a type as C text, whatever it was read from.

Every reader hands the speller a *view*: a function from its own type ids to one `Node`
(a named type, a pointer, a qualifier, an array or a function).  `spell` composes the
declarator from those nodes, so BTF records (`ctracer.debuginfo.btf.reader`), DWARF unit
tables (`ctracer.debuginfo.dwarf.units`) and the type model (`graph_view`) are all
spelled by the same rules: ``const struct sock *``, ``int (*)(void *)``, ``char *const``,
``void (*handlers[4])(int)``; qualifiers stand before the type specifier in the order
const, volatile, restrict, _Atomic, and a pointer's own qualifiers follow its ``*``.

Two flavours of the model's view exist: the *display* text for people and listings
(`type_text`, `TypeShape.text`; an anonymous struct is ``struct {...}``), and valid C
(`type_name`, `declaration`, `member_declaration`; anonymous types are spelled out
inline, and every name pasted into the text must be a C identifier, else `UnsafeName`).

pahole's layout text (`ctracer.plan.pahole`) is not C: it reproduces pahole's quirks
(``const char  *``, ``void (*handlers)(int)[4]``) for a diff against pahole, and keeps
its own printer for that reason.
"""

from __future__ import annotations

import re
from typing import Callable, Hashable, NamedTuple, Optional, Union

from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, Encoding, EnumType,
                                     FunctionType, Member, PointerType, QualifiedType, TypeGraph,
                                     TypeId, Typedef)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: qualifiers in the order C programmers usually write them
QUALIFIER_ORDER = ("const", "volatile", "restrict", "_Atomic")
_MAX_CHAIN = 256


class Named(NamedTuple):
    """A type specifier spelled already: ``int``, ``u32``, ``struct sock``, ``struct {...}``."""

    text: str


class Pointer(NamedTuple):
    """A pointer declarator (or a C++ reference) to ``target``."""

    target: Optional[Hashable]
    star: str = "*"          # ``&`` or ``&&`` for C++ references


class Qualified(NamedTuple):
    """A qualifier on ``target``; an empty ``word`` is transparent (a BTF type tag)."""

    word: str
    target: Optional[Hashable]


class Array(NamedTuple):
    """An array declarator of ``element`` with its dimensions."""

    element: Optional[Hashable]
    dims: tuple                # Optional[int] per dimension, None for ``[]``


class Function(NamedTuple):
    """A function declarator: return type, parameters, whether variadic."""

    returns: Optional[Hashable]
    params: tuple
    variadic: bool = False


Node = Union[Named, Pointer, Qualified, Array, Function]
_VOID = Named("void")
#: a reader's view of its types; a None id is ``void``
View = Callable[[Hashable], Node]


class UnsafeName(ValueError):
    """A name from debug info that is not a C identifier (it is never pasted into C)."""


def identifier(name: str) -> str:
    """``name`` itself when it is a C identifier; raises `UnsafeName` otherwise."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise UnsafeName(f"{name!r} is not a C identifier")
    return name


def spell(view: View, tid: Optional[Hashable], inner: str = "") -> str:
    """The C text of type ``tid`` declaring ``inner`` (a name, or "" for the abstract
    declarator ``struct sock *``)."""
    quals: tuple[str, ...] = ()
    node = _VOID if tid is None else view(tid)
    for _ in range(_MAX_CHAIN):
        kind = type(node)
        if kind is Qualified:
            if node.word and node.word not in quals:
                quals += (node.word,)
            tid = node.target
        elif kind is Pointer:
            star = node.star + " ".join(_ordered(quals)) if quals else node.star
            inner = star + (" " if quals and inner else "") + inner
            quals = ()
            tid = node.target
            node = _VOID if tid is None else view(tid)
            if isinstance(_unqualified(view, node), (Array, Function)):
                inner = f"({inner})"
            continue
        elif kind is Array:
            inner += "".join("[]" if d is None else f"[{d}]" for d in node.dims)
            tid = node.element
        elif kind is Function:
            params = [spell(view, p) for p in node.params]
            if node.variadic:
                params.append("...")
            inner = f"{inner}({', '.join(params) or 'void'})"
            quals = ()
            tid = node.returns
        else:
            spec = " ".join(_ordered(quals) + [node.text]) if quals else node.text
            return f"{spec} {inner}" if inner else spec
        node = _VOID if tid is None else view(tid)
    raise ValueError(f"type chain longer than {_MAX_CHAIN} at {tid!r}")


def _unqualified(view: View, node: Node) -> Node:
    """The node under any qualifiers of ``node``."""
    for _ in range(_MAX_CHAIN):
        if type(node) is not Qualified:
            return node
        node = _VOID if node.target is None else view(node.target)
    raise ValueError(f"qualifier chain longer than {_MAX_CHAIN}")


def _ordered(quals: tuple[str, ...]) -> list[str]:
    return [q for q in QUALIFIER_ORDER if q in quals] + [q for q in quals
                                                          if q not in QUALIFIER_ORDER]


# ------------------------------------------------------------------ the type model


_MODEL_QUALIFIERS = {"const": "const", "volatile": "volatile", "restrict": "restrict",
                     "atomic": "_Atomic", "type_tag": ""}


def graph_view(graph: TypeGraph, *, valid_c: bool = False) -> View:
    """The view of a `TypeGraph`: for display, or (``valid_c``) with every name checked
    and anonymous structs, unions and enums written out."""
    def view(tid: TypeId) -> Node:
        t = graph.types.get(tid)
        if isinstance(t, PointerType):
            return Pointer(t.target)
        if isinstance(t, QualifiedType):
            return Qualified(_MODEL_QUALIFIERS.get(t.qualifier, ""), t.target)
        if isinstance(t, ArrayType):
            return Array(t.element, tuple(t.dims))
        if isinstance(t, FunctionType):
            return Function(t.returns, tuple(t.params), t.variadic)
        if valid_c:
            return Named(_specifier(graph, t))
        if isinstance(t, (BaseType, Typedef)):
            return Named(t.name or "?")
        if isinstance(t, CompositeType):
            return Named(f"{t.kind} {t.name}" if t.name else f"{t.kind} {{...}}")
        if isinstance(t, EnumType):
            return Named(f"enum {t.name}" if t.name else "enum {...}")
        return Named("?")
    return view


def type_text(graph: TypeGraph, tid: Optional[TypeId]) -> str:
    """A type as people read it: ``const struct sock *``, ``union {...}``."""
    return spell(graph_view(graph), tid)


def type_name(graph: TypeGraph, tid: Optional[TypeId]) -> str:
    """The abstract declarator of a type in valid C: ``struct sock *``, ``int (*)(void)``,
    ``char [16]``."""
    return spell(graph_view(graph, valid_c=True), tid)


def declaration(graph: TypeGraph, tid: Optional[TypeId], name: str) -> str:
    """``type name`` as C declares it: ``char comm[16]``, ``void (*fn)(int)``."""
    return spell(graph_view(graph, valid_c=True), tid, identifier(name))


def member_declaration(graph: TypeGraph, member: Member) -> str:
    """One struct member as C declares it, with its bit width and explicit alignment:
    ``unsigned int flags:3``, ``long hot __attribute__((aligned(64)))``; an anonymous
    struct/union member is spelled out inline."""
    text = spell(graph_view(graph, valid_c=True), member.type,
                 identifier(member.name) if member.name else "")
    if member.bit_size:
        text += f":{member.bit_size}" if member.name else f" :{member.bit_size}"
    if member.alignment:
        text += f" __attribute__((aligned({member.alignment})))"
    return text


def _specifier(graph: TypeGraph, t) -> str:
    """The type specifier in valid C: a base type, ``struct name``, a typedef name, or an
    anonymous struct/union/enum written out."""
    if t is None:
        raise ValueError("no C specifier for a type the graph does not hold")
    if isinstance(t, BaseType):
        return _base_name(t)
    if isinstance(t, Typedef):
        return identifier(t.name)
    if isinstance(t, CompositeType):
        if t.name:
            return f"{t.kind} {identifier(t.name)}"
        body = " ".join(member_declaration(graph, m) + ";" for m in t.members)
        return f"{t.kind} {{ {body} }}" if body else f"{t.kind} {{ }}"
    if isinstance(t, EnumType):
        if t.name:
            return f"enum {identifier(t.name)}"
        body = ", ".join(f"{identifier(n)} = {v}" for n, v in t.enumerators)
        return f"enum {{ {body} }}"
    raise ValueError(f"no C specifier for {t!r}")


_COMPLEX_PARTS = {8: ["float"], 16: ["double"], 32: ["long", "double"]}


def _base_name(t: BaseType) -> str:
    """A base type's name as C spells it: gcc's DWARF says ``complex float``, clang's just
    ``complex`` whatever the size; C says ``_Complex float``."""
    words = t.name.split() if t.name else []
    if not words:
        raise UnsafeName(f"nameless base type of {t.size} bytes")
    if t.encoding == Encoding.COMPLEX_FLOAT and words[0] == "complex":
        words = ["_Complex"] + (words[1:] or _COMPLEX_PARTS.get(t.size, []))
    for w in words:
        identifier(w)
    return " ".join(words)
