"""The arguments a kernel probe records with each event: a tracepoint's, or a kernel
function's register arguments, each as a raw u64 slot of the event, described by
`Argument` (name, how the slot reads, kind, C type) in the trace's meta so that any
machine decodes and shows them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from ctracer.debuginfo.catalog import Parameter, ShapeKind

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: suffixes the kernel puts on a tracepoint parameter's name for the BPF verifier
#: (``skb__nullable``: the argument may be NULL); the argument is shown without them
_ANNOTATIONS = ("__nullable",)


@dataclass(frozen=True)
class Argument:
    """One recorded argument as the trace file describes it."""

    name: str
    ctype: str        # "s64" or "u64": how the raw slot is read
    kind: str         # "int", "uint", "enum", "pointer", "bool"
    type_text: str    # the C type, for display
    enum: Optional[str] = None

    def to_json(self) -> dict:
        return {"name": self.name, "ctype": self.ctype, "kind": self.kind,
                "type": self.type_text, "enum": self.enum}

    def value(self, raw: int) -> int:
        """The raw u64 slot as this argument's value (sign-extended where signed)."""
        if self.ctype == "s64" and raw >= 1 << 63:
            return raw - (1 << 64)
        return raw


def argument_of(p: Parameter, index: int, names: Sequence[Optional[str]]) -> Argument:
    """Parameter ``index`` as a recorded argument, named from ``names`` (``argN`` where
    the debug info gives no usable name)."""
    name = names[index] if index < len(names) and names[index] else f"arg{index + 1}"
    for suffix in _ANNOTATIONS:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
    if not _IDENT.match(name):
        name = f"arg{index + 1}"
    s = p.shape
    text = s.text or (s.name or "?")
    if s.pointers or s.kind in (ShapeKind.STRUCT, ShapeKind.UNION, ShapeKind.FUNCTION,
                                ShapeKind.ARRAY):
        return Argument(name, "u64", "pointer", text)
    if s.kind == ShapeKind.ENUM:
        return Argument(name, "u64", "enum", text, s.name)
    if s.kind == ShapeKind.BASE and s.name:
        words = s.name.split()
        if s.name in ("_Bool", "bool"):
            return Argument(name, "u64", "bool", text)
        signed = "unsigned" not in words and not s.name.startswith("u")
        return Argument(name, "s64" if signed else "u64", "int" if signed else "uint", text)
    return Argument(name, "u64", "uint", text)
