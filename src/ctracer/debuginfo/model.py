"""The read-only type model every other stage works on.

Readers (``dwarf`` for DWARF, ``btf`` for BTF) translate debug info into these frozen
dataclasses; nothing downstream knows which format the types came from.

Two layers, because a kernel has far more types than any query needs:

* the **catalog** (`Catalog`): every function, struct summary and tracepoint, reduced to
  `TypeShape`s (what a type is once typedefs and qualifiers are stripped).  It is cheap to
  build, cheap to cache, and is all that method discovery needs;
* the **type graph** (`TypeGraph`): full types, loaded on demand for one struct and
  everything it reaches, for layouts, mini structs and collectors.

Type ids (`TypeId`) are opaque integers meaningful only inside one model (DWARF: a
.debug_info offset; BTF: a type id).  ``None`` stands for ``void``.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Optional, Protocol, Sequence, Union

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
    name: str
    size: int
    encoding: Encoding


@dataclass(frozen=True, slots=True)
class PointerType:
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


# ---------------------------------------------------------------- catalog


class ShapeKind(str, enum.Enum):
    STRUCT = "struct"
    UNION = "union"
    ENUM = "enum"
    BASE = "base"
    VOID = "void"
    FUNCTION = "function"
    ARRAY = "array"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class TypeShape:
    """What a declared type reduces to once typedefs and qualifiers are stripped.

    ``const struct sock *`` and ``typedef struct sock *sock_ptr`` both have shape
    ``(STRUCT, "sock", pointers=1)``; ``struct sock **`` has ``pointers=2``.
    ``text`` is the type as spelled in the source, for display only.
    """

    kind: ShapeKind
    name: Optional[str]
    pointers: int = 0
    const: bool = False
    text: str = ""


@dataclass(frozen=True, slots=True)
class Parameter:
    name: Optional[str]
    shape: TypeShape


class Inline(str, enum.Enum):
    """DW_AT_inline, plus NONE when absent (BTF knows nothing of inlining)."""

    NONE = "none"
    NOT_INLINED = "not_inlined"
    INLINED = "inlined"
    DECLARED_NOT_INLINED = "declared_not_inlined"
    DECLARED_INLINED = "declared_inlined"


@dataclass(frozen=True, slots=True)
class FunctionInfo:
    """One function as the debug info describes it.

    ``address`` is the entry of an out-of-line copy (None when the function exists only
    inlined, or when the source, like BTF, does not say).  ``unit`` is the compile unit,
    which keeps static functions of the same name apart.
    """

    name: str
    params: tuple[Parameter, ...]
    returns: TypeShape
    unit: str = ""
    address: Optional[int] = None
    external: bool = True
    inline: Inline = Inline.NONE
    inlined_only: bool = False
    variadic: bool = False
    linkage_name: Optional[str] = None
    decl_file: Optional[str] = None
    decl_line: Optional[int] = None
    #: a name unique within a catalog: statics carry their compile unit (``name@unit``);
    #: computed once, as discovery and every listing ask for it many times
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.name if self.external or not self.unit
                           else f"{self.name}@{self.unit}")


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """A member reduced to its shape; members of anonymous structs/unions are flattened
    with dotted paths whose anonymous steps are empty (``".sk"``)."""

    name: str
    shape: TypeShape
    bit_offset: int


@dataclass(frozen=True, slots=True)
class StructInfo:
    kind: ShapeKind  # STRUCT or UNION
    name: str
    size: int
    members: tuple[MemberInfo, ...]


@dataclass(frozen=True, slots=True)
class TracepointInfo:
    """A tracepoint and the arguments its probes receive (the context pointer dropped)."""

    name: str
    params: tuple[Parameter, ...]

    @property
    def key(self) -> str:
        """A name unique among functions and tracepoints: ``tp:NAME``."""
        return f"tp:{self.name}"


class Catalog(abc.ABC):
    """Every function, struct summary and tracepoint of a type source, with the lookups
    method discovery needs.  `MemoryCatalog` holds one in memory; a cache may answer the
    same questions from disk without loading everything."""

    #: reader remarks worth showing a user (e.g. "412 functions exist only inlined")
    notes: tuple[str, ...] = ()

    @abc.abstractmethod
    def functions(self) -> Iterable[FunctionInfo]:
        """All functions (may be slow on a kernel: prefer the lookups below)."""

    @abc.abstractmethod
    def function_count(self) -> int: ...

    @abc.abstractmethod
    def functions_referencing(self, kind: ShapeKind, name: str) -> list[FunctionInfo]:
        """Functions with a parameter or return type whose shape is (kind, name), at any
        pointer depth (0 = by value)."""

    @abc.abstractmethod
    def struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[StructInfo]: ...

    @abc.abstractmethod
    def structs_with_member_of(self, kind: ShapeKind, name: str) -> list[StructInfo]:
        """Structs/unions having a (flattened) member whose shape is (kind, name), at any
        pointer depth."""

    @abc.abstractmethod
    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> list[str]: ...

    @abc.abstractmethod
    def tracepoints(self) -> Iterable[TracepointInfo]: ...

    @abc.abstractmethod
    def tracepoints_referencing(self, kind: ShapeKind, name: str) -> list[TracepointInfo]: ...


class MemoryCatalog(Catalog):
    """A catalog held in memory, indexed on construction."""

    def __init__(self, functions: Iterable[FunctionInfo], structs: Iterable[StructInfo],
                 tracepoints: Iterable[TracepointInfo] = (), notes: Iterable[str] = ()):
        self._functions = tuple(functions)
        self._tracepoints = tuple(tracepoints)
        self.notes = tuple(notes)
        self._structs: dict[tuple[ShapeKind, str], StructInfo] = {}
        for s in structs:
            self._structs.setdefault((s.kind, s.name), s)
        self._fn_index: dict[tuple[ShapeKind, str], list[FunctionInfo]] = {}
        for f in self._functions:
            for key in {(p.shape.kind, p.shape.name) for p in f.params} | {
                    (f.returns.kind, f.returns.name)}:
                self._fn_index.setdefault(key, []).append(f)
        self._member_index: dict[tuple[ShapeKind, str], list[StructInfo]] = {}
        for s in self._structs.values():
            for key in {(m.shape.kind, m.shape.name) for m in s.members}:
                self._member_index.setdefault(key, []).append(s)
        self._tp_index: dict[tuple[ShapeKind, str], list[TracepointInfo]] = {}
        for t in self._tracepoints:
            for key in {(p.shape.kind, p.shape.name) for p in t.params}:
                self._tp_index.setdefault(key, []).append(t)

    def functions(self) -> Iterable[FunctionInfo]:
        return self._functions

    def function_count(self) -> int:
        return len(self._functions)

    def functions_referencing(self, kind: ShapeKind, name: str) -> list[FunctionInfo]:
        return list(self._fn_index.get((kind, name), ()))

    def struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[StructInfo]:
        return self._structs.get((kind, name))

    def structs_with_member_of(self, kind: ShapeKind, name: str) -> list[StructInfo]:
        return list(self._member_index.get((kind, name), ()))

    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> list[str]:
        return sorted(n for k, n in self._structs if k == kind)

    def tracepoints(self) -> Iterable[TracepointInfo]:
        return self._tracepoints

    def tracepoints_referencing(self, kind: ShapeKind, name: str) -> list[TracepointInfo]:
        return list(self._tp_index.get((kind, name), ()))


class TypeModel(Protocol):
    """What a reader gives the rest of ctracer."""

    #: human description of where the types come from, e.g. "DWARF of ./sockdemo"
    description: str
    #: "dwarf" or "btf"
    format: str

    def catalog(self) -> Catalog: ...

    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> Sequence[str]: ...

    def find_struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> TypeGraph:
        """The full definition of a named struct/union and every type it reaches.

        Raises `ctracer.errors.UnknownType` (with close names) when there is none."""
        ...


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
