"""What one compile unit contributes to a catalog, and how units merge into one.

Plain Python data only, so that it runs in forked worker processes and never imports
pyelftools:

* **unit tables** (`UnitTables`): what a walk of one compile unit keeps — its type DIEs
  reduced to ``(tag, name, target, aux)``, its struct/union definitions with their
  members, its subprograms.  `ctracer.debuginfo.dwarf.reader` fills them with pyelftools (the reference
  walk, for any DWARF); `ctracer.debuginfo.dwarf.scan` fills them from raw bytes, fast;
* **unit summaries** (`summarize_unit`): the tables reduced to compact tuples — functions
  with their parameter shapes, flattened struct summaries, tracepoints;
* **catalog rows** (`assemble_rows`): all summaries merged (cross-unit copies attached,
  header inlines folded, first struct definitions kept), then turned into a
  `MemoryCatalog` (`catalog_from_rows`) or written to the cache (`store_rows`).

Offsets are absolute ``.debug_info`` offsets; tags are the DWARF numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple, Optional

from ctracer.debuginfo import cdecl
from ctracer.debuginfo.catalog import (FunctionInfo, Inline, MemberInfo, MemoryCatalog, Parameter,
                           ShapeKind, StructInfo, TracepointInfo, TypeShape)

# ------------------------------------------------------------------ DWARF numbers

TAG_ARRAY = 0x01
TAG_CLASS = 0x02
TAG_ENUMERATION = 0x04
TAG_FORMAL_PARAMETER = 0x05
TAG_MEMBER = 0x0D
TAG_POINTER = 0x0F
TAG_REFERENCE = 0x10
TAG_COMPILE_UNIT = 0x11
TAG_STRUCTURE = 0x13
TAG_SUBROUTINE_TYPE = 0x15
TAG_TYPEDEF = 0x16
TAG_UNION = 0x17
TAG_UNSPECIFIED_PARAMETERS = 0x18
TAG_PTR_TO_MEMBER = 0x1F
TAG_SUBRANGE = 0x21
TAG_BASE = 0x24
TAG_CONST = 0x26
TAG_SUBPROGRAM = 0x2E
TAG_VOLATILE = 0x35
TAG_RESTRICT = 0x37
TAG_NAMESPACE = 0x39
TAG_UNSPECIFIED_TYPE = 0x3B
TAG_RVALUE_REFERENCE = 0x42
TAG_ATOMIC = 0x47

COMPOSITE_TAGS = {TAG_STRUCTURE: "struct", TAG_CLASS: "struct", TAG_UNION: "union"}
QUALIFIER_TAGS = {TAG_CONST: "const", TAG_VOLATILE: "volatile", TAG_RESTRICT: "restrict",
                  TAG_ATOMIC: "_Atomic"}
POINTER_TAGS = {TAG_POINTER: "*", TAG_REFERENCE: "&", TAG_RVALUE_REFERENCE: "&&",
                TAG_PTR_TO_MEMBER: "*"}
#: type DIEs a unit walk records in `UnitTables.types`
TYPE_TAGS = frozenset({TAG_ARRAY, TAG_CLASS, TAG_ENUMERATION, TAG_POINTER, TAG_REFERENCE,
                       TAG_STRUCTURE, TAG_SUBROUTINE_TYPE, TAG_TYPEDEF, TAG_UNION,
                       TAG_PTR_TO_MEMBER, TAG_BASE, TAG_CONST, TAG_VOLATILE, TAG_RESTRICT,
                       TAG_UNSPECIFIED_TYPE, TAG_RVALUE_REFERENCE, TAG_ATOMIC})

#: DW_AT_inline values, as `ctracer.debuginfo.catalog.Inline` values (index = DWARF code)
INLINE_NAMES = ("not_inlined", "inlined", "declared_not_inlined", "declared_inlined")

TRACEPOINT_TYPEDEF_PREFIX = "btf_trace_"

#: stands for a type reference that is not followed (a type unit's signature, a DIE in a
#: supplementary file): its shape is "unknown", never "void"
UNRESOLVED = -1
#: the name in the shape of such a type (no C type is named so)
UNRESOLVED_NAME = "?"


# ------------------------------------------------------------------ unit tables


@dataclass(slots=True)
class Subprogram:
    """One DW_TAG_subprogram as a unit walk found it (unset attributes stay None)."""

    offset: int
    name: Optional[str] = None
    linkage_name: Optional[str] = None
    returns: Optional[int] = None
    params: list = field(default_factory=list)  # (name, type offset) pairs
    variadic: bool = False
    low_pc: Optional[int] = None
    has_ranges: bool = False
    external: bool = False
    inline: Optional[int] = None
    declaration: bool = False
    abstract_origin: Optional[int] = None
    specification: Optional[int] = None
    decl_file: Optional[int] = None
    decl_line: Optional[int] = None
    #: where the parameters start, for walks that read them only when needed
    params_at: Optional[int] = None


@dataclass(slots=True)
class UnitTables:
    """What one compile unit contributes, before summarizing.

    ``types`` maps a type DIE offset to ``(tag, name, target, aux)`` where ``aux`` is:
    the declaration flag for struct/union/enum, the dims tuple for arrays,
    ``(param type offsets, variadic)`` for subroutine types, None otherwise.
    ``composites`` maps a struct/union *definition* offset to
    ``(tag, name, size, members)``, members being ``(name, type, bit_offset)``.
    """

    offset: int
    name: str = ""
    files: dict = field(default_factory=dict)  # decl_file index -> path
    types: object = field(default_factory=dict)  # a dict, or anything with get/in/[]
    composites: dict = field(default_factory=dict)
    subprograms: list = field(default_factory=list)
    tracepoint_typedefs: list = field(default_factory=list)  # (name, offset)
    #: external functions only declared here: (name, offset)
    declarations: list = field(default_factory=list)
    #: loads a struct/union definition missing from ``composites`` (e.g. an anonymous
    #: one), for walks that read members only on demand
    load_composite: Optional[object] = None
    #: reads the parameters of a `Subprogram` whose ``params_at`` is set
    load_params: Optional[object] = None

    def composite(self, offset: Optional[int]) -> Optional[tuple]:
        found = self.composites.get(offset)
        if found is None and offset is not None and self.load_composite is not None:
            found = self.load_composite(offset)
        return found


def plus_uconst(expr) -> Optional[int]:
    """N of a DWARF 2/3 member location ``DW_OP_plus_uconst N`` (bytes, or the list of
    byte values pyelftools gives); None for any other expression."""
    if not expr or expr[0] != 0x23:
        return None
    value, shift = 0, 0
    for byte in expr[1:]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value
    return None


def member_bit_offset(location: Optional[int], data_bit_offset: Optional[int],
                      be_bit_offset: Optional[int], storage_bytes: Optional[int],
                      bit_size: int, type_size: int, big_endian: bool) -> int:
    """Absolute bit offset of a member from the start of its struct.

    DWARF 5 (and clang's DWARF 4) give ``DW_AT_data_bit_offset`` directly.  GCC's DWARF 4
    bitfields give the storage unit's byte offset (``DW_AT_data_member_location``), its
    size (``DW_AT_byte_size``, else the member type's size) and ``DW_AT_bit_offset``,
    counted from the most significant bit of that unit.
    """
    if data_bit_offset is not None:
        return data_bit_offset
    base = (location or 0) * 8
    if be_bit_offset is None:
        return base
    if big_endian:
        return base + be_bit_offset
    unit_bits = (storage_bytes or type_size) * 8
    return base + unit_bits - be_bit_offset - bit_size


# ------------------------------------------------------------------ shapes

#: a TypeShape as a tuple: (kind, name, pointers, const, text)
VOID_SHAPE = ("void", None, 0, False, "void")


class ShapeResolver:
    """Shapes (`ctracer.debuginfo.catalog.TypeShape` as tuples) of the types of one unit, memoized."""

    def __init__(self, types: dict):
        self.types = types
        self._memo: dict = {}

    def shape(self, offset: Optional[int]) -> tuple:
        if offset is None:
            return VOID_SHAPE
        found = self._memo.get(offset)
        if found is None:
            found = self._memo[offset] = self._compute(offset)
        return found

    def _compute(self, offset: int) -> tuple:
        pointers, const = 0, False
        tid: Optional[int] = offset
        for _ in range(64):
            if tid is None:
                return ("void", None, pointers, const, self.text(offset))
            t = self.types.get(tid)
            if t is None:  # a reference not followed: its name says so (see UNRESOLVED)
                return ("unknown", UNRESOLVED_NAME, pointers, const, self.text(offset))
            tag, name, target, _aux = t
            if tag == TAG_TYPEDEF or tag in QUALIFIER_TAGS:
                const = const or tag == TAG_CONST
            elif tag in POINTER_TAGS:
                pointers += 1
                const = False  # const now refers to what this pointer points to
            else:
                return (_shape_kind(tag), name, pointers, const, self.text(offset))
            tid = target
        return ("unknown", None, pointers, const, self.text(offset))

    def text(self, offset: Optional[int]) -> str:
        """The C spelling of a type, by the one speller (`ctracer.debuginfo.cdecl`)."""
        return cdecl.spell(self._c_node, offset)

    def _c_node(self, offset: int) -> cdecl.Node:
        t = self.types.get(offset)
        if t is None:
            return cdecl.Named("?")
        tag, name, target, aux = t
        if tag in POINTER_TAGS:
            return cdecl.Pointer(target, POINTER_TAGS[tag])
        if tag in QUALIFIER_TAGS:
            return cdecl.Qualified(QUALIFIER_TAGS[tag], target)
        if tag == TAG_ARRAY:
            return cdecl.Array(target, tuple(aux or ()))
        if tag == TAG_SUBROUTINE_TYPE:
            params, variadic = aux
            return cdecl.Function(target, tuple(params), variadic)
        if tag in COMPOSITE_TAGS or tag == TAG_ENUMERATION:
            keyword = "enum" if tag == TAG_ENUMERATION else COMPOSITE_TAGS[tag]
            return cdecl.Named(f"{keyword} {name}" if name else f"{keyword} {{...}}")
        return cdecl.Named(name or "?")


def _tag(entry: tuple) -> int:
    """The tag of a ``(tag, name, target, aux)`` entry of `UnitTables.types`."""
    tag, _name, _target, _aux = entry
    return tag


def _shape_kind(tag: int) -> str:
    if tag in COMPOSITE_TAGS:
        return COMPOSITE_TAGS[tag]
    return {TAG_ENUMERATION: "enum", TAG_BASE: "base", TAG_SUBROUTINE_TYPE: "function",
            TAG_ARRAY: "array"}.get(tag, "unknown")


# ------------------------------------------------------------------ unit summaries


class UnitFunction(NamedTuple):
    """A function as a unit summary and the catalog rows carry it."""

    name: str
    unit: str
    #: the entry of every out-of-line copy (the function itself and its clones)
    addresses: tuple
    external: bool
    inline: str                 # an `ctracer.debuginfo.catalog.Inline` value
    variadic: bool
    linkage_name: Optional[str]
    decl_file: Optional[str]
    decl_line: Optional[int]
    params: tuple               # (name, shape tuple) pairs
    returns: tuple              # a shape tuple
    die_offset: int
    #: the one entry chosen among ``addresses`` (`DwarfTypes.resolve_addresses`)
    address: Optional[int] = None


class StructRow(NamedTuple):
    """A struct or union definition, its members flattened."""

    kind: str                   # "struct" or "union"
    name: str
    size: int
    members: tuple              # (dotted path, shape tuple, bit offset) triples
    die_offset: int


@dataclass(slots=True)
class UnitSummary:
    """A unit reduced to compact tuples (cheap to send between processes).

    ``functions``: `UnitFunction`s; ``structs``: `StructRow`s.
    ``orphans``: ``(abstract_origin, low_pc)`` of concrete copies whose abstract DIE
    lies in another unit.
    ``tracepoints``: ``(name, params)``.
    ``declarations``: ``(name, offset)`` of external functions this unit only declares.
    """

    unit: str
    functions: list
    orphans: list
    structs: list
    tracepoints: list
    declarations: list = field(default_factory=list)


def summarize_unit(tables: UnitTables, known_structs: set, seen_inline: set) -> UnitSummary:
    """Functions, struct summaries and tracepoints of one unit.

    ``known_structs`` holds ``(kind, name)`` already summarized by earlier units; this
    unit adds its own new ones to it and skips the rest (first definition wins).
    ``seen_inline`` does the same for static inline functions that exist only inlined
    (a header's inlines appear in every unit using them, identical): only the first
    copy becomes a row (see `fold_key`).
    """
    shapes = ShapeResolver(tables.types)
    functions, orphans = _summarize_functions(tables, shapes, seen_inline)
    structs = _summarize_structs(tables, shapes, known_structs)
    tracepoints = []
    for name, offset in tables.tracepoint_typedefs:
        params = _tracepoint_params(tables.types, offset, shapes)
        if params is not None:
            tracepoints.append((name[len(TRACEPOINT_TYPEDEF_PREFIX):], params))
    return UnitSummary(tables.name, functions, orphans, structs, tracepoints,
                       tables.declarations)


def _summarize_functions(tables: UnitTables, shapes: ShapeResolver,
                         seen_inline: set) -> tuple[list, list]:
    by_offset = {sp.offset: sp for sp in tables.subprograms}
    addresses: dict[int, list] = {}
    orphans = []
    completed: set = set()  # declarations completed by a DW_AT_specification definition
    for sp in tables.subprograms:
        if sp.abstract_origin is not None:
            if sp.low_pc is None:
                continue
            if sp.abstract_origin in by_offset:
                addresses.setdefault(sp.abstract_origin, []).append(sp.low_pc)
            else:
                orphans.append((sp.abstract_origin, sp.low_pc))
        elif sp.specification is not None and sp.specification in by_offset:
            completed.add(sp.specification)
    rows = []
    for sp in tables.subprograms:
        if sp.abstract_origin is not None or sp.offset in completed:
            continue
        if sp.declaration:
            continue
        decl = by_offset.get(sp.specification) if sp.specification is not None else None
        copies = addresses.get(sp.offset, ())
        if sp.low_pc is None and not copies and not sp.external and sp.inline in (1, 3) \
                and sp.name:
            key = fold_key(sp.name, tables.files.get(sp.decl_file), sp.decl_line)
            if key in seen_inline:
                continue
            seen_inline.add(key)
        row = unit_function(tables, shapes, sp, decl, copies)
        if row is not None:
            rows.append(row)
    return rows, orphans


def unit_function(tables: UnitTables, shapes: ShapeResolver, sp: Subprogram,
                  decl: Optional[Subprogram] = None, copies=()) -> Optional[UnitFunction]:
    """A subprogram as a `UnitFunction` of the catalog (its declaration filling in what the
    definition leaves out); None for one without a name."""
    name = sp.name or (decl.name if decl else None)
    if not name:
        return None
    if sp.params_at is not None and tables.load_params is not None:
        tables.load_params(sp)
    params = sp.params or (decl.params if decl else [])
    variadic = sp.variadic or (decl.variadic if decl else False)
    returns = sp.returns if sp.returns is not None or decl is None else decl.returns
    external = sp.external or (decl.external if decl else False)
    linkage = sp.linkage_name or (decl.linkage_name if decl else None)
    decl_file = sp.decl_file if sp.decl_file is not None else (decl.decl_file if decl else None)
    decl_line = sp.decl_line if sp.decl_line is not None else (decl.decl_line if decl else None)
    addrs = tuple(([sp.low_pc] if sp.low_pc is not None else []) + list(copies))
    inline = INLINE_NAMES[sp.inline] if sp.inline is not None and 0 <= sp.inline < 4 else "none"
    return UnitFunction(name, tables.name, addrs, external, inline, variadic, linkage,
                       tables.files.get(decl_file) if decl_file is not None else None,
                       decl_line, tuple((pname, shapes.shape(ptype)) for pname, ptype in params),
                       shapes.shape(returns), sp.offset)


def _summarize_structs(tables: UnitTables, shapes: ShapeResolver, known: set) -> list:
    rows = []
    for offset, (tag, name, size, _members) in list(tables.composites.items()):
        if not name:
            continue
        kind = COMPOSITE_TAGS[tag]
        if (kind, name) in known:
            continue
        known.add((kind, name))
        members = tuple(_flatten_members(tables, shapes, offset, "", 0, 0))
        rows.append(StructRow(kind, name, size, members, offset))
    return rows


def _flatten_members(tables: UnitTables, shapes: ShapeResolver, offset: int, prefix: str,
                     base_bits: int, depth: int):
    composite = tables.composite(offset)
    if composite is None or depth > 16:
        return
    _tag_, _name, _size, members = composite
    for name, mtype, bit_offset in members:
        inner = _strip(tables.types, mtype)
        if name is None and tables.composite(inner) is not None:
            yield from _flatten_members(tables, shapes, inner, prefix + ".",
                                        base_bits + bit_offset, depth + 1)
        else:
            yield (prefix + (name or ""), shapes.shape(mtype), base_bits + bit_offset)


def _strip(types: dict, offset: Optional[int]) -> Optional[int]:
    for _ in range(64):
        t = types.get(offset) if offset is not None else None
        if t is None:
            return offset
        tag, _name, target, _aux = t
        if not (tag == TAG_TYPEDEF or tag in QUALIFIER_TAGS):
            return offset
        offset = target
    return offset


def _tracepoint_params(types: dict, typedef_offset: int, shapes: ShapeResolver):
    """Params of ``typedef void (*btf_trace_X)(void *__data, args...)``, minus __data."""
    typedef = types.get(typedef_offset)
    if typedef is None:
        return None
    _tag_, _name, target, _aux = typedef
    pointer = types.get(target)
    if pointer is None or _tag(pointer) != TAG_POINTER:
        return None
    _tag_, _name, target, _aux = pointer
    func = types.get(target)
    if func is None or _tag(func) != TAG_SUBROUTINE_TYPE:
        return None
    _tag_, _name, _returns, (param_types, _variadic) = func
    return tuple((None, shapes.shape(p)) for p in param_types[1:])



# ------------------------------------------------------------------ catalog assembly


@dataclass
class CatalogRows:
    """All units' summaries merged: `UnitFunction`s, `StructRow`s, ``(name, params)`` of
    tracepoints, and notes for the user."""

    functions: list
    structs: list
    tracepoints: list
    notes: list


def assemble_rows(summaries: Iterable[UnitSummary],
                  declared_rows: Optional[Callable[[list], list]] = None) -> CatalogRows:
    """Merge unit summaries: attach cross-unit concrete copies to their abstract function,
    fold identical inline-only copies of header functions, keep the first definition of
    each struct name and of each tracepoint.  Functions that are declared but defined
    nowhere in the DWARF (assembly, static-call trampolines, other objects) are added
    from their declarations by ``declared_rows(offsets)``."""
    functions, orphans, structs, tracepoints, declared = [], [], [], {}, {}
    seen_structs = set()
    for s in summaries:
        functions.extend(s.functions)
        orphans.extend(s.orphans)
        for name, offset in s.declarations:
            declared.setdefault(name, offset)
        for row in s.structs:
            if (row.kind, row.name) not in seen_structs:
                seen_structs.add((row.kind, row.name))
                structs.append(row)
        for name, params in s.tracepoints:
            tracepoints.setdefault(name, params)
    if orphans:
        functions = _attach_orphans(functions, orphans)
    functions = _fold_inline_copies(functions)
    inlined_only = sum(1 for f in functions
                       if not f.addresses and f.inline in ("inlined", "declared_inlined"))
    notes = []
    defined = {f.name for f in functions}
    undefined = sorted(off for name, off in declared.items() if name not in defined)
    if undefined and declared_rows is not None:
        # (a damaged DIE may give a row without a name: None)
        functions.extend(row for row in declared_rows(undefined) if row is not None)
        notes.append(f"{len(undefined)} functions are only declared (defined in assembly or"
                     " outside this file's DWARF)")
    if inlined_only:
        notes.append(f"{inlined_only} functions exist only inlined and cannot be probed")
    unknown = sum(1 for f in functions if _unresolved(f.returns)
                  or any(_unresolved(shape) for _n, shape in f.params))
    if unknown:
        notes.append(f"{unknown} functions have parameter or return types that could not be"
                     " followed (type units, another file): shown as '?'")
    statics = {}
    for f in functions:
        if not f.external:
            statics[f.name] = statics.get(f.name, 0) + 1
    shared = sum(1 for n in statics.values() if n > 1)
    if shared:
        notes.append(f"{shared} static function names are defined in several compile units;"
                     " each copy is listed as name@unit")
    return CatalogRows(functions, structs, sorted(tracepoints.items()), notes)


def _unresolved(shape: tuple) -> bool:
    _kind, name, _pointers, _const, _text = shape
    return name == UNRESOLVED_NAME


def _attach_orphans(functions: list, orphans: list) -> list:
    by_offset = {f.die_offset: i for i, f in enumerate(functions)}
    functions = list(functions)
    for origin, address in orphans:
        i = by_offset.get(origin)
        if i is not None:
            f = functions[i]
            functions[i] = f._replace(addresses=f.addresses + (address,))
    return functions


def fold_key(name: str, decl_file: Optional[str], decl_line: Optional[int]) -> tuple:
    """What makes two inline-only copies of a static function the same function."""
    return (name, decl_file, decl_line)


def _fold_inline_copies(functions: list) -> list:
    """A static inline function of a header appears, inlined only, in every unit using it;
    those copies have no address and the same declaration: keep one."""
    kept, seen = [], set()
    for f in functions:
        if not f.addresses and not f.external and f.inline in ("inlined", "declared_inlined"):
            key = fold_key(f.name, f.decl_file, f.decl_line)
            if key in seen:
                continue
            seen.add(key)
        kept.append(f)
    return kept


def shape_from_tuple(t: tuple) -> TypeShape:
    """A `TypeShape` back from the cache's tuple (`shape_tuple`)."""
    kind, name, pointers, const, text = t
    return TypeShape(ShapeKind(kind), name, pointers, const, text)


def catalog_from_rows(rows: CatalogRows) -> MemoryCatalog:
    """A `MemoryCatalog` of assembled rows (functions carrying their chosen address)."""
    shapes: dict = {}

    def shape(t):
        s = shapes.get(t)
        if s is None:
            s = shapes[t] = shape_from_tuple(t)
        return s

    functions = []
    for f in rows.functions:
        functions.append(FunctionInfo(
            name=f.name, params=tuple(Parameter(p, shape(s)) for p, s in f.params),
            returns=shape(f.returns), unit=f.unit, address=f.address, external=f.external,
            inline=Inline(f.inline), inlined_only=_inlined_only(f.address, f.inline),
            variadic=f.variadic, linkage_name=f.linkage_name, decl_file=f.decl_file,
            decl_line=f.decl_line))
    structs = [StructInfo(ShapeKind(s.kind), s.name, s.size,
                          tuple(MemberInfo(path, shape(t), bits) for path, t, bits in s.members))
               for s in rows.structs]
    tracepoints = [TracepointInfo(name, tuple(Parameter(p, shape(s)) for p, s in params))
                   for name, params in rows.tracepoints]
    return MemoryCatalog(functions, structs, tracepoints, rows.notes)


def _inlined_only(address: Optional[int], inline: str) -> bool:
    return address is None and inline in ("inlined", "declared_inlined")


def store_rows(rows: CatalogRows, writer) -> None:
    """Feed assembled rows to a `ctracer.debuginfo.dwarf.cache.CatalogWriter`."""
    writer.notes = list(rows.notes)
    for f in rows.functions:
        writer.add_function(f.name, f.unit, f.address, f.external, f.inline,
                            _inlined_only(f.address, f.inline), f.variadic, f.linkage_name,
                            f.decl_file, f.decl_line, f.params, f.returns)
    for s in rows.structs:
        writer.add_struct(s.kind, s.name, s.size, s.members, s.die_offset)
    for name, params in rows.tracepoints:
        writer.add_tracepoint(name, params)


def choose_address(name: str, linkage: Optional[str], addrs: tuple,
                   symbols: dict) -> Optional[int]:
    """Among a function's out-of-line copies, the one whose symbol is the function's own
    name (the others are compiler clones such as ``name.isra.0``); None when there is
    no copy at all."""
    if len(addrs) < 2:
        return addrs[0] if addrs else None
    for a in addrs:
        found = symbols.get(a, ())
        if name in found or (linkage and linkage in found):
            return a
    return addrs[0]
