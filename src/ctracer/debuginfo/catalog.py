"""The read-only type model every other stage works on: its first layer, the catalog.

Readers (``dwarf`` for DWARF, ``btf`` for BTF) translate debug info into these frozen
dataclasses; nothing downstream knows which format the types came from.

Two layers, because a kernel has far more types than any query needs:

* the **catalog** (`Catalog`, here): every function, struct summary and tracepoint,
  reduced to `TypeShape`s (what a type is once typedefs and qualifiers are stripped).  It
  is cheap to build, cheap to cache, and is all that method discovery needs;
* the **type graph** (`ctracer.debuginfo.typegraph.TypeGraph`): full types, loaded on demand
  for one struct and everything it reaches, for layouts, mini structs and collectors.
  Its own module, so that a query answered from the catalog (``ctracer functions``) does
  not define its ten dataclasses at start-up.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Optional, Protocol, Sequence

if TYPE_CHECKING:
    from ctracer.debuginfo.typegraph import EnumType, TypeGraph


# ---------------------------------------------------------------- catalog


class ShapeKind(str, enum.Enum):
    """What a type is at its core, once typedefs and qualifiers are looked through."""

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
    """One parameter of a function: its name (None when unnamed) and type."""

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
    """A struct or union as the catalog lists it: kind, name, size and members."""

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
    def function_count(self) -> int:
        """How many functions there are."""

    @abc.abstractmethod
    def functions_referencing(self, kind: ShapeKind, name: str) -> list[FunctionInfo]:
        """Functions with a parameter or return type whose shape is (kind, name), at any
        pointer depth (0 = by value)."""

    @abc.abstractmethod
    def struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[StructInfo]:
        """The summary of the struct (or union) ``name`` (None: no such type)."""

    @abc.abstractmethod
    def structs_with_member_of(self, kind: ShapeKind, name: str) -> list[StructInfo]:
        """Structs/unions having a (flattened) member whose shape is (kind, name), at any
        pointer depth."""

    @abc.abstractmethod
    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> list[str]:
        """The names of every struct (or union) of ``kind``."""

    @abc.abstractmethod
    def tracepoints(self) -> Iterable[TracepointInfo]:
        """Every tracepoint the type source describes (a kernel's ``btf_trace_*``)."""

    @abc.abstractmethod
    def tracepoints_referencing(self, kind: ShapeKind, name: str) -> list[TracepointInfo]:
        """Tracepoints with an argument whose shape is (kind, name), at any pointer depth."""


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

    def catalog(self) -> Catalog:
        """The catalog of the source's functions, structs and tracepoints."""

    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> Sequence[str]:
        """The names of every struct (or union) of ``kind`` the source defines."""

    def find_struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> TypeGraph:
        """The full definition of a named struct/union and every type it reaches.

        Raises `ctracer.errors.UnknownType` (with close names) when there is none."""
        ...

    def find_enum(self, name: Optional[str] = None,
                  enumerator: Optional[str] = None) -> Optional[EnumType]:
        """The first complete enum named ``name`` (C's ``enum name``), or declaring
        ``enumerator``; None when there is none, or the source does not look enums up
        (DWARF: only the kernel's BTF names values by enum)."""
        ...
