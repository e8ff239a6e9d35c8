"""C declarator text for types of the model: ``char name[16]``,
``void (*fn)(struct sock *, int)``, ``const struct foo *const *p``, ``void (*handlers[4])(int)``.

Used wherever ctracer shows a type to a person (`TypeShape.text`, listings) or writes C
(mini structs, probe code).  The text is valid C: unlike pahole's printer (see
`ctracer.plan.pahole`), qualifiers of a pointer follow its ``*``, arrays of pointers to
functions nest their declarators, and anonymous structs/unions/enums are spelled out
inline.  Every name pasted into the text comes from debug info and is checked to be a C
identifier first; anything else raises `UnsafeName`.
"""

from __future__ import annotations

import re
from typing import Optional

from ctracer.debuginfo.model import (ArrayType, BaseType, CompositeType, Encoding, EnumType, FunctionType,
                           Member, PointerType, QualifiedType, TypeGraph, TypeId, Typedef)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: qualifiers in the order C programmers usually write them
_QUALIFIER_ORDER = ("const", "volatile", "restrict", "atomic")
_QUALIFIER_TEXT = {"const": "const", "volatile": "volatile", "restrict": "restrict",
                   "atomic": "_Atomic"}


class UnsafeName(ValueError):
    """A name from debug info that is not a C identifier (it is never pasted into C)."""


def identifier(name: str) -> str:
    """``name`` itself when it is a C identifier; raises `UnsafeName` otherwise."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise UnsafeName(f"{name!r} is not a C identifier")
    return name


def type_name(graph: TypeGraph, tid: Optional[TypeId]) -> str:
    """The abstract declarator of a type: ``struct sock *``, ``int (*)(void)``, ``char [16]``."""
    return _CDecl(graph).declarator(tid, "")


def declaration(graph: TypeGraph, tid: Optional[TypeId], name: str) -> str:
    """``type name`` as C declares it: ``char comm[16]``, ``void (*fn)(int)``."""
    return _CDecl(graph).declarator(tid, identifier(name))


def member_declaration(graph: TypeGraph, member: Member) -> str:
    """One struct member as C declares it, with its bit width and explicit alignment:
    ``unsigned int flags:3``, ``long hot __attribute__((aligned(64)))``; an anonymous
    struct/union member is spelled out inline."""
    c = _CDecl(graph)
    text = c.declarator(member.type, identifier(member.name) if member.name else "")
    if member.bit_size:
        text += f":{member.bit_size}" if member.name else f" :{member.bit_size}"
    if member.alignment:
        text += f" __attribute__((aligned({member.alignment})))"
    return text


class _CDecl:
    def __init__(self, graph: TypeGraph):
        self.g = graph

    def declarator(self, tid: Optional[TypeId], inner: str,
                   quals: tuple[str, ...] = ()) -> str:
        """The declaration of ``inner`` (a name or a partial declarator) as ``tid``;
        ``quals`` are qualifiers met on the way that apply to ``tid``."""
        depth = 0
        while tid is not None and isinstance(self.g[tid], QualifiedType):
            q: QualifiedType = self.g[tid]
            if q.qualifier in _QUALIFIER_TEXT and q.qualifier not in quals:
                quals = quals + (q.qualifier,)
            tid = q.target
            depth += 1
            if depth > 64:
                raise ValueError(f"qualifier cycle at type {tid}")
        t = None if tid is None else self.g[tid]
        if isinstance(t, PointerType):
            star = "*" + " ".join(_QUALIFIER_TEXT[q] for q in _ordered(quals))
            if quals and inner:
                star += " "
            inner = star + inner
            if isinstance(self._unqualified(t.target), (ArrayType, FunctionType)):
                inner = f"({inner})"
            return self.declarator(t.target, inner)
        if isinstance(t, ArrayType):
            inner += "".join(f"[{d}]" if d is not None else "[]" for d in t.dims)
            return self.declarator(t.element, inner, quals)
        if isinstance(t, FunctionType):
            return self.declarator(t.returns, f"{inner}({self._params(t)})")
        spec = self.specifier(t)
        if quals:
            spec = " ".join(_QUALIFIER_TEXT[q] for q in _ordered(quals)) + " " + spec
        if not inner:
            return spec
        return f"{spec} {inner}"

    def _unqualified(self, tid: Optional[TypeId]):
        while tid is not None and isinstance(self.g[tid], QualifiedType):
            tid = self.g[tid].target
        return None if tid is None else self.g[tid]

    def _params(self, f: FunctionType) -> str:
        params = [self.declarator(p, "") for p in f.params]
        if f.variadic:
            params.append("...")
        return ", ".join(params) if params else "void"

    def specifier(self, t) -> str:
        """The type specifier: a base type, ``struct name``, a typedef name, or an
        anonymous struct/union/enum written out."""
        if t is None:
            return "void"
        if isinstance(t, BaseType):
            return _base_name(t)
        if isinstance(t, Typedef):
            return identifier(t.name)
        if isinstance(t, CompositeType):
            if t.name:
                return f"{t.kind} {identifier(t.name)}"
            body = " ".join(member_declaration(self.g, m) + ";" for m in t.members)
            return f"{t.kind} {{ {body} }}" if body else f"{t.kind} {{ }}"
        if isinstance(t, EnumType):
            if t.name:
                return f"enum {identifier(t.name)}"
            body = ", ".join(f"{identifier(n)} = {v}" for n, v in t.enumerators)
            return f"enum {{ {body} }}"
        raise ValueError(f"no C specifier for {t!r}")


def _ordered(quals: tuple[str, ...]) -> list[str]:
    return [q for q in _QUALIFIER_ORDER if q in quals]


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
