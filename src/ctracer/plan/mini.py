"""The mini struct: the fields of a traced struct that a probe snapshots, packed small.

`build_mini` walks a struct's full definition (a `TypeGraph`) and keeps every member a
probe can copy as one scalar:

* integers, ``bool``, ``char``, floats, and typedefs of them;
* enums (kind ``"enum"``, with their enumerators);
* bitfields, widened to the smallest unsigned/signed integer that holds them;
* members of embedded structs and unions, with dotted names (``__sk_common.skc_state``).
  An anonymous struct/union adds no step, exactly as C spells the access, so every name
  is also the C expression that reads the member from the object;
* union members all become separate fields: they overlap in the traced struct, but each
  is read on its own, so any of them can be followed;
* optionally pointers (as ``u64`` addresses, kind ``"pointer"``; off by default, like the
  original ctracer, since most are noise and they make every snapshot bigger) and
  ``char`` arrays (kind ``"text"``, on by default, up to ``max_text`` bytes).

Other arrays, nested members that are themselves arrays of structs, ``long double``,
128-bit integers and flexible arrays are skipped; `MiniStruct.skipped` says which and why.

A member of a *complex type* (a lock, a refcount, a list head...) is not flattened when
``kinds`` is given: ``kinds(graph, type_id)`` (`ctracer.collectors.registry.claim`) may
claim it and say which values its collector computes instead of its internals (a
spinlock's ``held`` flag, a refcount's counter); each becomes one field whose source
carries an ``op`` (below).  A claim without values leaves the member out, with a reason.

The kept fields are then reordered with pahole's algorithm (`ctracer.plan.reorganize`) and
become a `ctracer.event.Layout` named ``ctracer__mini_<name>``.  Each `Field.source` says
where the value comes from in the traced object, for collectors::

    byte_offset, size   bytes to read from the object; for a bitfield a 1, 2, 4 or 8-byte
                        little-endian window holding its bits inside the object (only
                        in an object smaller than that, exactly the bytes holding them)
    bit_offset          absolute bit offset of the member in the object
    bit_size            width of a bitfield, 0 for a whole member
    shift               for a bitfield: value = (read_le(size) >> shift) & (2**bit_size-1)
    signed              sign-extend the bitfield value (or the integer read)
    ctype               the member's C type as declared
    cacheline           byte_offset // cacheline size (64)
    collector           for a claimed member: the kind that computes the value
    op                  how a claimed value comes from the bytes read (absent: a copy):
                        ``nonzero`` 1 when the bytes (the bits of ``mask``, when
                        given) are not all zero, ``zero`` 1 when
                        they are, ``is_own_address`` 1 when they hold the address of
                        the object plus ``address_offset`` (an empty list head)

`extract_field` is the reference implementation of that rule on raw object bytes.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field as dc_field
from typing import Callable, Iterable, Iterator, Optional, Sequence

from ctracer.errors import UsageError
from ctracer.event import Field, Layout, array_value, c_identifier, size_of_ctype
from ctracer.plan.pahole import hole_comment
from ctracer.debuginfo import cdecl
from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, Encoding, EnumType,
                                     PointerType, TypeGraph, TypeId)
from ctracer.plan.reorganize import Item, reorganize

CACHELINE = 64
_UNSIGNED = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
_SIGNED = {1: "s8", 2: "s16", 4: "s32", 8: "s64"}
_FLOATS = {4: "float", 8: "double"}


@dataclass(frozen=True)
class Skipped:
    """A member of the traced struct that the mini struct does not record, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Derived:
    """One value a collector computes from a member of its kind (see `Claim`)."""

    suffix: str           # appended to the member's path: "" (the member itself) or ".held"
    ctype: str            # the event field type (`ctracer.event.SCALARS`)
    kind: str             # the event field kind
    byte_offset: int      # bytes to read, relative to the member
    size: int
    op: str = "copy"      # copy, nonzero, zero, is_own_address
    signed: bool = False
    mask: int = 0         # for nonzero: only these bits count (0: all)


#: the ops a `Derived` value may use
OPS = ("copy", "nonzero", "zero", "is_own_address")


@dataclass(frozen=True)
class Claim:
    """What the collector of a complex type records for a member of that type: its
    ``values``, or nothing and the ``reason``."""

    collector: str
    type_name: str
    values: tuple[Derived, ...] = ()
    reason: str = ""


#: ``kinds(graph, member type id)``: the claim of the collector for the type, or None
Kinds = Callable[[TypeGraph, Optional[TypeId]], Optional[Claim]]


@dataclass(frozen=True)
class Collected:
    """A member recorded by the collector of its type instead of its internals."""

    name: str
    type_name: str
    collector: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class MiniStruct:
    """The mini struct of one traced struct, and what was left out of it."""

    layout: Layout
    struct_kind: str
    struct_name: str
    struct_size: int
    skipped: tuple[Skipped, ...] = ()
    #: size of the same fields in source order, before reorganizing
    unreorganized_size: int = 0
    #: members recorded by a collector of their type
    collected: tuple[Collected, ...] = ()
    #: recordable fields the selection left out, and why
    unselected: tuple[Skipped, ...] = ()

    @property
    def saved_bytes(self) -> int:
        """Bytes the reorganized layout saves over the same fields in source order."""
        return self.unreorganized_size - self.layout.size


@dataclass
class _Options:
    pointers: bool = False
    char_arrays: bool = True
    max_text: int = 64
    unions: bool = True
    kinds: Optional[Kinds] = None


@dataclass
class _Walk:
    graph: TypeGraph
    options: _Options
    object_size: int = 0
    fields: list[Field] = dc_field(default_factory=list)
    skipped: list[Skipped] = dc_field(default_factory=list)
    collected: list[Collected] = dc_field(default_factory=list)


# ------------------------------------------------------------------ the walk


def _int_ctype(size: int, signed: bool) -> Optional[str]:
    return (_SIGNED if signed else _UNSIGNED).get(size)


def _bitfield_window(bit_offset: int, bit_size: int, object_size: int
                     ) -> Optional[tuple[int, int, int]]:
    """(byte offset, bytes to read, shift) of the smallest 1, 2, 4 or 8-byte little-endian
    load that holds the bits and stays inside the object; exactly the bytes holding the
    bits when no such load exists (an object smaller than the load); None when the bits
    span more than 8 bytes (a packed 64-bit bitfield)."""
    first, last = bit_offset // 8, (bit_offset + bit_size - 1) // 8
    for load in (1, 2, 4, 8):
        start = min(first, object_size - load)
        if start >= 0 and start + load > last:
            return start, load, bit_offset - start * 8
    size = last - first + 1
    return (first, size, bit_offset - first * 8) if size <= 8 else None


def _scalar(graph: TypeGraph, tid: Optional[TypeId]) -> Optional[tuple[str, str, bool, tuple]]:
    """(event ctype, kind, signed, enumerators) for a scalar member type, else None."""
    stripped = graph.strip(tid)
    if stripped is None:
        return None
    t = graph[stripped]
    if isinstance(t, EnumType):
        ctype = _int_ctype(t.size, t.signed)
        if ctype is None:
            return None
        return ctype, "enum", t.signed, tuple(sorted((v, n) for n, v in t.enumerators))
    if not isinstance(t, BaseType):
        return None
    enc = t.encoding
    if enc == Encoding.BOOL:
        ctype = _UNSIGNED.get(t.size)
        return (ctype, "bool", False, ()) if ctype else None
    if enc == Encoding.FLOAT:
        ctype = _FLOATS.get(t.size)
        return (ctype, "float", True, ()) if ctype else None
    if enc in (Encoding.SIGNED, Encoding.SIGNED_CHAR, Encoding.UNSIGNED, Encoding.UNSIGNED_CHAR):
        signed = enc in (Encoding.SIGNED, Encoding.SIGNED_CHAR)
        ctype = _int_ctype(t.size, signed)
        if ctype is None:
            return None
        kind = "char" if t.name == "char" else ("int" if signed else "uint")
        return ctype, kind, signed, ()
    return None


def _is_text_array(graph: TypeGraph, t: ArrayType) -> bool:
    if len(t.dims) != 1 or not t.dims[0]:
        return False
    elem = graph.strip(t.element)
    e = graph[elem] if elem is not None else None
    return isinstance(e, BaseType) and e.size == 1 and e.name == "char"


def _add(walk: _Walk, name: str, ctype: str, kind: str, enumerators: tuple,
         source: dict) -> None:
    try:
        walk.fields.append(Field(name, ctype, 0, kind, enumerators, source))
    except ValueError:
        walk.skipped.append(Skipped(name, "name is not a C identifier"))


def _walk(walk: _Walk, tid: TypeId, prefix: str, base_bits: int, in_union: bool) -> None:
    graph, opts = walk.graph, walk.options
    comp = graph[tid]
    assert isinstance(comp, CompositeType)
    for m in comp.members:
        name = f"{prefix}{m.name}" if m.name else prefix.rstrip(".")
        display = name or "<anonymous>"
        bit_offset = base_bits + m.bit_offset
        inner = graph.strip(m.type)
        t = graph[inner] if inner is not None else None
        member_in_union = in_union or comp.kind == "union"
        claim = opts.kinds(graph, m.type) if opts.kinds and not m.is_bitfield else None
        if claim is not None:
            _add_claim(walk, claim, name, display, bit_offset // 8, member_in_union,
                       cdecl.type_text(graph, m.type))
            continue
        if isinstance(t, CompositeType) and not m.is_bitfield:
            if t.declaration:
                walk.skipped.append(Skipped(display, f"{t.kind} {t.name} is only declared"))
            elif t.kind == "union" and not opts.unions:
                walk.skipped.append(Skipped(display, "union (unions not recorded)"))
            else:
                _walk(walk, inner, f"{name}." if name else "", bit_offset,
                      member_in_union)
            continue
        ctype_text = cdecl.type_text(graph, m.type)
        source = {"byte_offset": bit_offset // 8, "bit_offset": bit_offset,
                  "bit_size": m.bit_size, "ctype": ctype_text,
                  "cacheline": (bit_offset // 8) // CACHELINE}
        if member_in_union:
            source["union"] = True
        scalar = _scalar(graph, m.type)
        if scalar is not None:
            ctype, kind, signed, enumerators = scalar
            source["signed"] = signed
            if m.is_bitfield:
                window = _bitfield_window(bit_offset, m.bit_size, walk.object_size)
                ctype = _int_ctype(_smallest(m.bit_size), signed) if kind != "float" else None
                if window is None or ctype is None:
                    walk.skipped.append(Skipped(display, "bitfield spans more than 8 bytes"))
                    continue
                source["byte_offset"], source["size"], source["shift"] = window
                source["cacheline"] = window[0] // CACHELINE
            else:
                source["size"] = size_of_ctype(ctype)
            _add(walk, name, ctype, kind, enumerators, source)
            continue
        if isinstance(t, PointerType):
            if opts.pointers and t.size in _UNSIGNED:
                source.update(size=t.size, signed=False)
                _add(walk, name, _UNSIGNED[t.size], "pointer", (), source)
            else:
                walk.skipped.append(Skipped(display, "pointer (pointers not recorded)"))
            continue
        if isinstance(t, ArrayType):
            size = graph.size_of(inner)
            if _is_text_array(graph, t) and opts.char_arrays and 0 < size <= opts.max_text:
                source.update(size=size, signed=False)
                _add(walk, name, f"char[{size}]", "text", (), source)
            elif _is_text_array(graph, t) and opts.char_arrays:
                walk.skipped.append(Skipped(display, f"char array longer than {opts.max_text}"))
            elif not size:
                walk.skipped.append(Skipped(display, "flexible array"))
            else:
                walk.skipped.append(Skipped(display, "array"))
            continue
        walk.skipped.append(Skipped(display, f"type {ctype_text} has no event field type"))


def _add_claim(walk: _Walk, claim: Claim, name: str, display: str, byte_offset: int,
               in_union: bool, ctype_text: str) -> None:
    """The fields of a member claimed by the collector of its type."""
    if not claim.values:
        walk.skipped.append(Skipped(display, claim.reason or f"{claim.type_name}: no values"))
        return
    names = []
    for d in claim.values:
        if d.op not in OPS:
            raise ValueError(f"collector {claim.collector}: unknown op {d.op!r}")
        at = byte_offset + d.byte_offset
        source = {"byte_offset": at, "bit_offset": at * 8, "bit_size": 0, "size": d.size,
                  "ctype": ctype_text, "cacheline": at // CACHELINE, "signed": d.signed,
                  "collector": claim.collector}
        if d.op != "copy":
            source["op"] = d.op
        if d.mask:
            source["mask"] = d.mask
        if d.op == "is_own_address":
            source["address_offset"] = byte_offset
        if in_union:
            source["union"] = True
        field_name = f"{name}{d.suffix}" if name else d.suffix.lstrip(".")
        _add(walk, field_name, d.ctype, d.kind, (), source)
        names.append(field_name)
    walk.collected.append(Collected(display, claim.type_name, claim.collector, tuple(names)))


def _smallest(bits: int) -> int:
    for size in (1, 2, 4, 8):
        if bits <= size * 8:
            return size
    return 16


# ------------------------------------------------------------------ selection


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """A pattern matches a field or any struct it is nested in (``__sk_common`` covers
    ``__sk_common.skc_state``), also without the leading wrapper structs the kernel names
    with two underscores (``skc_state`` is ``__sk_common.skc_state``, as ``--where``
    and the pages name it)."""
    return any(fnmatch.fnmatchcase(p, pat) for pat in patterns for p in _selectable(name))


def _selectable(name: str) -> list[str]:
    """The names a field pattern may give ``name`` by (see `_matches`)."""
    parts = name.split(".")
    names = [parts]
    while len(names[-1]) > 1 and names[-1][0].startswith("__"):
        names.append(names[-1][1:])
    return [".".join(p[:i]) for p in names for i in range(1, len(p) + 1)]


def select_fields(fields: Sequence[Field], include: Sequence[str] = (),
                  exclude: Sequence[str] = (), cachelines: Sequence[int] = (),
                  cacheline_size: int = CACHELINE) -> list[Field]:
    """Fields whose names match an ``include`` glob (all when none), that lie on one of
    ``cachelines`` (numbered from 0 like pahole's comments; all when none), and that match
    no ``exclude`` glob.  A glob naming nothing is a user error."""
    for pat in list(include) + list(exclude):
        if not any(_matches(f.name, [pat]) for f in fields):
            import difflib
            # suggested by every name a pattern may use: skc_nmu → skc_num
            names = sorted({p for f in fields for p in _selectable(f.name)})
            close = difflib.get_close_matches(pat, names, n=5, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"field pattern {pat!r} matches no recordable field{hint}")
    wanted_lines = set(cachelines)
    out = []
    for f in fields:
        if include and not _matches(f.name, include):
            continue
        if wanted_lines:
            start = f.source["byte_offset"]
            end = start + max(f.source["size"], 1) - 1
            if not wanted_lines & set(range(start // cacheline_size, end // cacheline_size + 1)):
                continue
        if exclude and _matches(f.name, exclude):
            continue
        out.append(f)
    return out


# ------------------------------------------------------------------ building


def candidate_fields(graph: TypeGraph, *, pointers: bool = False, char_arrays: bool = True,
                     max_text: int = 64, unions: bool = True, kinds: Optional[Kinds] = None
                     ) -> tuple[list[Field], list[Skipped]]:
    """Every recordable field of the graph's root struct in source order (offsets 0) and
    the members left out."""
    walk = _walk_root(graph, graph.root, _Options(pointers, char_arrays, max_text, unions,
                                                  kinds))
    return walk.fields, walk.skipped


def _walk_root(graph: TypeGraph, tid: Optional[TypeId], options: _Options) -> _Walk:
    root = graph.strip(tid)
    t = graph[root] if root is not None else None
    if not isinstance(t, CompositeType):
        raise ValueError("the type graph's root is not a struct or union")
    walk = _Walk(graph, options, t.size)
    _walk(walk, root, "", 0, False)
    walk.fields = _dedupe(walk.fields, walk.skipped)
    return walk


def member_fields(graph: TypeGraph, tid: Optional[TypeId]) -> dict[str, Field]:
    """Every scalar (and pointer) inside the struct or union ``tid``, flattened, by dotted
    path, with byte offsets relative to it: what a collector finds its values in."""
    walk = _walk_root(graph, tid, _Options(pointers=True, char_arrays=False))
    return {f.name: f for f in walk.fields}


def _dedupe(fields: list[Field], skipped: list[Skipped]) -> list[Field]:
    """Drop a field whose C name another already has (``a.b`` vs a member ``a__b``)."""
    seen, out = set(), []
    for f in fields:
        if f.c_name in seen:
            skipped.append(Skipped(f.name, f"C name {f.c_name} already used"))
            continue
        seen.add(f.c_name)
        out.append(f)
    return out


def mini_name(struct_name: str) -> str:
    """The C name of ``struct_name``'s mini struct (``ctracer__mini_NAME``)."""
    return c_identifier(f"ctracer__mini_{struct_name}")


def pack(name: str, fields: Sequence[Field], reorganize_fields: bool = True) -> Layout:
    """A layout of the fields, reordered with pahole's algorithm unless told not to."""
    if not reorganize_fields:
        return Layout.packed_in_order(name, fields)
    items = [Item(f.name, f.size, 1 if f.ctype.startswith("char[") else f.size) for f in fields]
    placed = reorganize(items)
    by_name = {f.name: f for f in fields}
    out = tuple(Field(i.name, by_name[i.name].ctype, off, by_name[i.name].kind,
                      by_name[i.name].enumerators, dict(by_name[i.name].source))
                for i, off in zip(placed.items, placed.offsets))
    return Layout(name, out, placed.size)


def limit_bytes(name: str, fields: Sequence[Field], max_bytes: int) -> list[Field]:
    """The fields, in order, as long as their packed snapshot stays within ``max_bytes``
    (reorganizing never makes it larger); a field that does not fit is left out, a later
    smaller one may still fit."""
    out: list[Field] = []
    for f in fields:
        if Layout.packed_in_order(name, out + [f]).size <= max_bytes:
            out.append(f)
    return out


def build_mini(graph: TypeGraph, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
               cachelines: Sequence[int] = (), cacheline_size: int = CACHELINE,
               max_bytes: Optional[int] = None, pointers: bool = False,
               char_arrays: bool = True, max_text: int = 64, unions: bool = True,
               reorganize_fields: bool = True, kinds: Optional[Kinds] = None) -> MiniStruct:
    """The mini struct of the graph's root struct (see the module docstring)."""
    root = graph[graph.strip(graph.root)]
    assert isinstance(root, CompositeType)
    walk = _walk_root(graph, graph.root, _Options(pointers, char_arrays, max_text, unions,
                                                   kinds))
    fields = walk.fields
    name = mini_name(root.name or "anonymous")
    chosen = select_fields(fields, include, exclude, cachelines, cacheline_size)
    if max_bytes is not None:
        if max_bytes < 1:
            raise UsageError("--max-bytes must be 1 or more")
        chosen = limit_bytes(name, chosen, max_bytes)
    layout = pack(name, chosen, reorganize_fields)
    before = Layout.packed_in_order(name, chosen).size
    return MiniStruct(layout, root.kind, root.name or "", root.size, tuple(walk.skipped),
                      before, tuple(walk.collected),
                      _unselected(fields, chosen, include, exclude, cachelines,
                                  cacheline_size, max_bytes))


def _unselected(fields: Sequence[Field], chosen: Sequence[Field], include: Sequence[str],
                exclude: Sequence[str], cachelines: Sequence[int], cacheline_size: int,
                max_bytes: Optional[int]) -> tuple[Skipped, ...]:
    """Why each recordable field not chosen was left out, the first reason that applies."""
    kept = {f.name for f in chosen}
    out = []
    for f in fields:
        if f.name in kept:
            continue
        if include and not _matches(f.name, include):
            why = "not named by the field selection"
        elif cachelines and not select_fields([f], cachelines=cachelines,
                                              cacheline_size=cacheline_size):
            why = f"not on cacheline {', '.join(map(str, sorted(set(cachelines))))}"
        elif exclude and _matches(f.name, exclude):
            why = "excluded"
        else:
            why = f"over the {max_bytes}-byte limit"
        out.append(Skipped(f.name, why))
    return tuple(out)


# ------------------------------------------------------------------ reading


def extract_field(raw: bytes, f: Field, address: int = 0) -> object:
    """The value of a mini field read from the raw bytes of a whole traced object (at
    ``address``), following ``f.source`` exactly as a collector must."""
    src = f.source
    start, size = src["byte_offset"], src["size"]
    chunk = bytes(raw[start:start + size])
    op = src.get("op")
    if op == "nonzero":
        return int(bool(int.from_bytes(chunk, "little") & (src.get("mask") or -1)))
    if op == "zero":
        return int(not any(chunk))
    if op == "is_own_address":
        return int(int.from_bytes(chunk, "little") == address + src["address_offset"])
    if f.kind in ("text", "ipv6"):
        return array_value(f.kind, chunk)
    if f.kind == "float":
        import struct as _struct
        return _struct.unpack("<f" if size == 4 else "<d", chunk)[0]
    value = int.from_bytes(chunk, "little")
    bits = src.get("bit_size", 0)
    if bits:
        value = (value >> src["shift"]) & ((1 << bits) - 1)
    else:
        bits = size * 8
    if src.get("signed") and value >> (bits - 1):
        value -= 1 << bits
    return value


# ------------------------------------------------------------------ display


def _comment_source(f: Field) -> str:
    """`` /* __sk_common.skc_state: volatile unsigned char, byte 14 */``"""
    src = f.source
    if not src:
        return ""
    if src.get("bit_size"):
        where = f"bits {src['bit_offset']}+{src['bit_size']}"
    else:
        where = f"byte {src.get('byte_offset', '?')}"
    union = " (in a union)" if src.get("union") else ""
    return f" /* {f.name}: {src.get('ctype', '?')}, {where}{union} */"


def render_mini(layout: Layout, *, sources: bool = True, skipped: Iterable[Skipped] = (),
                struct_size: Optional[int] = None) -> str:
    """The mini struct printed like ``pahole -C``: members with offset and size, holes,
    cacheline boundaries and the summary; each member's origin in the traced struct
    follows as a comment when ``sources``."""
    lines = [f"struct {layout.name} {{"]
    fields = layout.ordered_fields
    at, holes, hole_bytes, boundary = 0, 0, 0, CACHELINE
    for f in fields:
        if f.offset > at:
            lines.append("")
            lines.append(f"\t{hole_comment(f.offset - at, 'byte')}")
            lines.append("")
            holes += 1
            hole_bytes += f.offset - at
        while f.offset >= boundary:
            lines.append(f"\t/* --- cacheline {boundary // CACHELINE} boundary "
                         f"({boundary} bytes) --- */")
            boundary += CACHELINE
        decl = f"{_ctype_decl(f)}"
        name = f"{f.c_name}{_array_suffix(f)};"
        lines.append(f"\t{decl:<26} {name:<21} /* {f.offset:5} {f.size:5} */"
                     + (_comment_source(f) if sources else ""))
        at = f.offset + f.size
    padding = layout.size - at if fields else layout.size
    lines.append("")
    cachelines = (layout.size + CACHELINE - 1) // CACHELINE
    lines.append(f"\t/* size: {layout.size}, cachelines: {cachelines}, "
                 f"members: {len(fields)} */")
    if holes:
        lines.append(f"\t/* sum members: {sum(f.size for f in fields)}, holes: {holes}, "
                     f"sum holes: {hole_bytes} */")
    if padding:
        lines.append(f"\t/* padding: {padding} */")
    last = layout.size % CACHELINE
    if last:
        lines.append(f"\t/* last cacheline: {last} bytes */")
    lines.append("};")
    if struct_size is not None:
        lines.append(f"/* traced struct: {struct_size} bytes; snapshot: {layout.size} bytes */")
    skipped = list(skipped)
    if skipped:
        lines.append(f"/* not recorded: {len(skipped)} members */")
        for s in skipped:
            lines.append(f"/*   {s.name}: {s.reason} */")
    return "\n".join(lines) + "\n"


def render_built(built: MiniStruct, *, explain: bool = False) -> str:
    """`render_mini` of a built mini struct with what the reorganizing saved, what the
    collectors of complex members record, and, with ``explain``, every member or field
    left out and why (without it, how many)."""
    text = render_mini(built.layout, struct_size=built.struct_size)
    lines = []
    saved = built.saved_bytes
    lines.append(f"/* reorganized: {built.layout.size} bytes, {saved} saved over "
                 f"{built.unreorganized_size} in source order */")
    if built.collected:
        kept = {f.name for f in built.layout.fields}
        recorded = [c for c in built.collected if any(n in kept for n in c.fields)]
        dropped = len(built.collected) - len(recorded)
        lines.append(f"/* recorded by the collector of their type: {len(recorded)} "
                     f"member{'' if len(recorded) == 1 else 's'}"
                     + (f" ({dropped} more left out by the selection)" if dropped else "")
                     + " */")
        if explain:
            for c in recorded:
                values = [n for n in c.fields if n in kept]
                lines.append(f"/*   {c.name} ({c.type_name}, {c.collector}): "
                             f"{', '.join(values)} */")
    for title, items in (("not recorded", built.skipped),
                         ("left out by the selection", built.unselected)):
        if not items:
            continue
        lines.append(f"/* {title}: {len(items)} "
                     f"{'members' if title == 'not recorded' else 'fields'} */")
        if explain:
            lines.extend(f"/*   {s.name}: {s.reason} */" for s in items)
    if not explain and (built.skipped or built.unselected or built.collected):
        lines.append("/* --explain lists them */")
    return text + "\n".join(lines) + "\n"


def _ctype_decl(f: Field) -> str:
    return "char" if f.ctype.startswith("char[") else f.ctype


def _array_suffix(f: Field) -> str:
    return f.ctype[4:] if f.ctype.startswith("char[") else ""
