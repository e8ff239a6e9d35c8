"""The type graph: full types, loaded on demand for one struct and everything it reaches
(layouts, mini structs, collectors); the second layer of the type model
(`ctracer.debuginfo.catalog` holds the first, the catalog).

Readers (``dwarf`` for DWARF, ``btf`` for BTF) build these frozen dataclasses with
`TypeModel.find_struct`; nothing downstream knows which format the types came from.
Type ids (`TypeId`) are opaque integers meaningful only inside one model (DWARF: a
.debug_info offset; BTF: a type id).  ``None`` stands for ``void``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Union

TypeId = int


class Encoding(enum.Enum):
    """How a base type's bits are read."""

    SIGNED = "signed"
    UNSIGNED = "unsigned"
    SIGNED_CHAR = "signed_char"
    UNSIGNED_CHAR = "unsigned_char"
    BOOL = "bool"
    FLOAT = "float"
    COMPLEX_FLOAT = "complex_float"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class BaseType:
    """A C base type (int, char, _Bool, double...): name, size and encoding."""

    name: str
    size: int
    encoding: Encoding


@dataclass(frozen=True, slots=True)
class PointerType:
    """A pointer to ``target`` (None: void)."""

    target: Optional[TypeId]
    size: int


@dataclass(frozen=True, slots=True)
class QualifiedType:
    """const / volatile / restrict / atomic, or a BTF type tag (``qualifier='type_tag'``)."""

    qualifier: str
    target: Optional[TypeId]
    tag: Optional[str] = None


@dataclass(frozen=True, slots=True)
class Typedef:
    """A typedef: a name for ``target``."""

    name: str
    target: Optional[TypeId]


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a struct or union.

    ``bit_offset`` is absolute from the start of the enclosing struct, for bitfields and
    ordinary members alike; ``bit_size`` is 0 for a member that is not a bitfield.
    ``name`` is None for an anonymous struct/union member.
    """

    name: Optional[str]
    type: Optional[TypeId]
    bit_offset: int
    bit_size: int = 0
    alignment: int = 0  # explicit __aligned__(N) on the member, 0 when none

    @property
    def offset(self) -> int:
        """Byte offset of the member (of the first byte holding it, for a bitfield)."""
        return self.bit_offset // 8

    @property
    def is_bitfield(self) -> bool:
        """Whether the member is a bitfield."""
        return self.bit_size != 0


@dataclass(frozen=True, slots=True)
class CompositeType:
    """A struct or a union (``kind`` says which)."""

    kind: str
    name: Optional[str]
    size: int
    members: tuple[Member, ...] = ()
    declaration: bool = False
    alignment: int = 0  # explicit __aligned__(N) on the type, 0 when none


@dataclass(frozen=True, slots=True)
class EnumType:
    """An enum: its enumerators (name, value), size and signedness."""

    name: Optional[str]
    size: int
    enumerators: tuple[tuple[str, int], ...] = ()
    signed: bool = False
    declaration: bool = False


@dataclass(frozen=True, slots=True)
class ArrayType:
    """``dims`` are element counts, outermost first; None for a flexible/unknown bound."""

    element: Optional[TypeId]
    dims: tuple[Optional[int], ...]


@dataclass(frozen=True, slots=True)
class FunctionType:
    """A function type (what a function pointer points at): return and parameter types."""

    returns: Optional[TypeId]
    params: tuple[Optional[TypeId], ...]
    variadic: bool = False


Type = Union[BaseType, PointerType, QualifiedType, Typedef, CompositeType, EnumType,
             ArrayType, FunctionType]


@dataclass(frozen=True)
class TypeGraph:
    """Full types reachable from a root, keyed by id."""

    types: Mapping[TypeId, Type]
    root: TypeId

    def __getitem__(self, tid: TypeId) -> Type:
        return self.types[tid]

    def strip(self, tid: Optional[TypeId]) -> Optional[TypeId]:
        """Follow typedefs and qualifiers down to the type that has a layout."""
        seen = 0
        while tid is not None:
            t = self.types[tid]
            if isinstance(t, (Typedef, QualifiedType)):
                tid = t.target
                seen += 1
                if seen > 64:
                    raise ValueError(f"typedef/qualifier cycle at type {tid}")
                continue
            return tid
        return None

    def size_of(self, tid: Optional[TypeId]) -> int:
        """Byte size of a type (0 for void, functions and flexible arrays)."""
        tid = self.strip(tid)
        if tid is None:
            return 0
        t = self.types[tid]
        if isinstance(t, (BaseType, PointerType, CompositeType, EnumType)):
            return t.size
        if isinstance(t, ArrayType):
            count = 1
            for d in t.dims:
                if d is None:
                    return 0
                count *= d
            return count * self.size_of(t.element)
        return 0


def iter_members_flat(graph: TypeGraph, tid: TypeId, prefix: str = "",
                      base_bits: int = 0) -> Iterator[tuple[str, Member, int]]:
    """Yield (dotted path, member, absolute bit offset) for a struct's members,
    descending into anonymous structs/unions (their step in the path is empty)."""
    t = graph[graph.strip(tid)]
    if not isinstance(t, CompositeType):
        return
    for m in t.members:
        path = f"{prefix}{m.name or ''}"
        inner = graph.strip(m.type)
        if m.name is None and inner is not None and isinstance(graph[inner], CompositeType):
            yield from iter_members_flat(graph, inner, path + ".", base_bits + m.bit_offset)
        else:
            yield path, m, base_bits + m.bit_offset
