"""BTF into ctracer's type model: the live kernel (/sys/kernel/btf/vmlinux, the default
type source), a module's split BTF on top of it, raw BTF files and ELF ``.BTF`` sections.

Kernel BTF holds ~150k types, and a query such as "functions taking struct sock" needs a
small part of them, so nothing is decoded up front: `ctracer.debuginfo.btf.format.BtfData` indexes
where each record starts in one pass, and this module decodes what a question touches:

* `BtfModel.find_struct` returns a `TypeGraph` whose mapping decodes types on access;
* `BtfCatalog` answers the catalog lookups from indexes of type ids (functions by the
  shapes of their parameters, structs by the shapes of their members), built on first use,
  and materialises `FunctionInfo`/`StructInfo` only for the answers.  For a module (split
  BTF) the functions and tracepoints are the module's own; structs include its base's;
* with ``use_cache`` those integer indexes are saved (`ctracer.debuginfo.btf.cache`), so the next
  run of the same BTF loads them instead of passing over every record again.

BTF specifics, as the model sees them: type tags become ``QualifiedType("type_tag",
tag=...)``; BTF knows no inlining, compile units or addresses (``address`` is None, every
function ``Inline.NONE``); FUNC linkage static/global gives ``external``; tracepoints come
from the ``btf_trace_<name>`` typedefs (a pointer to a prototype whose first parameter, the
``void *`` context, is dropped).
"""

from __future__ import annotations

import functools
import os
import struct
from bisect import bisect_left, bisect_right
from functools import partial
from collections.abc import Mapping
from typing import Iterable, Iterator, Optional, Union

from ctracer.debuginfo import cdecl
from ctracer.debuginfo.btf import KERNEL_BTF, MODULE_BTF_DIR
from ctracer.debuginfo.btf import format as bf
from ctracer.debuginfo.btf.format import BtfData
from ctracer.errors import InputFileError, UnknownType
from ctracer.debuginfo.catalog import (Catalog, FunctionInfo, MemberInfo, Parameter, ShapeKind,
                                     StructInfo, TracepointInfo, TypeShape)
from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, Encoding, EnumType,
                                     FunctionType, Member, PointerType, QualifiedType, Type,
                                     TypeGraph, Typedef)

#: what reading a damaged blob raises from inside the reader (an id or offset that a
#: record points past the end with, a count that makes no sense)
_DAMAGE = (IndexError, ValueError, OverflowError, UnicodeDecodeError, RecursionError,
           struct.error)


def _damage_is_one_line(method):
    """A public reader method, with damage found in the BTF turned into one line
    (`InputFileError`) instead of a traceback."""
    @functools.wraps(method)
    def read(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except _DAMAGE as err:
            raise InputFileError(f"{self.btf.description}: its BTF cannot be read "
                                 f"({type(err).__name__}: {err}); is it damaged?") from None
    return read


#: the methods the rest of ctracer calls (`TypeModel` and `Catalog`)
_ENTRY_POINTS = ("catalog", "struct_names", "find_struct", "type_of", "functions",
                 "function_count", "functions_referencing", "struct",
                 "structs_with_member_of", "tracepoints", "tracepoints_referencing")


def _reading_damaged(cls):
    """Wrap the entry points a reader class defines with `_damage_is_one_line`."""
    for name in _ENTRY_POINTS:
        if name in vars(cls):
            setattr(cls, name, _damage_is_one_line(vars(cls)[name]))
    return cls


TRACEPOINT_TYPEDEF_PREFIX = "btf_trace_"

# kinds that only refine another type: followed when reducing a type to its shape
_QUALIFIERS = {bf.CONST: "const", bf.VOLATILE: "volatile", bf.RESTRICT: "restrict"}
_TRANSPARENT = (bf.TYPEDEF, bf.VOLATILE, bf.RESTRICT, bf.TYPE_TAG, bf.CONST)
_MAX_CHAIN = 256


@_reading_damaged
class BtfModel:
    """The `ctracer.debuginfo.catalog.TypeModel` of one BTF source."""

    format = "btf"

    def __init__(self, data: BtfData, description: str, cache_key: Optional[str] = None,
                 use_cache: bool = True, saved: Optional[dict] = None):
        self.btf = data
        self.description = description
        #: SHA-256 of the BTF bytes (and the base's), naming the saved indexes
        self.cache_key = cache_key
        self.use_cache = use_cache and cache_key is not None
        self.saved = saved  # indexes loaded from ctracer.debuginfo.btf.cache, if any
        self._types: dict[int, Type] = {}
        self._composites: Optional[dict[tuple[ShapeKind, str], int]] = None
        self._catalog: Optional[Catalog] = None
        self._pointer_size: Optional[int] = None

    # -------------------------------------------------------------- TypeModel

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = BtfCatalog(self)
        return self._catalog

    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> list[str]:
        return sorted(n for k, n in self.composites() if k == kind)

    def find_struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> TypeGraph:
        tid = self.struct_id(name, kind)
        if tid is None:
            raise UnknownType(kind.value, name, self.struct_names(kind), self.description)
        return TypeGraph(LazyTypes(self, tid), tid)

    # -------------------------------------------------------------- lookups

    def composites(self) -> dict[tuple[ShapeKind, str], int]:
        """(kind, name) → id of the first complete definition of each named struct/union."""
        if self._composites is None:
            found: dict[tuple[ShapeKind, str], int] = {}
            d = self.btf
            for k, shape in ((bf.STRUCT, ShapeKind.STRUCT), (bf.UNION, ShapeKind.UNION)):
                for tid in d.ids_of_kind(k):
                    name = d.name(tid)
                    if name:
                        found.setdefault((shape, name), tid)
            self._composites = found
        return self._composites

    def struct_id(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[int]:
        """The type id of the struct (or union) ``name`` (None: none)."""
        return self.composites().get((kind, name))

    def find_enum(self, name: Optional[str] = None,
                  enumerator: Optional[str] = None) -> Optional[EnumType]:
        """The first complete enum named ``name`` (C's ``enum name``), or declaring
        ``enumerator`` (the kernel's TCP states are an anonymous enum: its
        ``TCP_ESTABLISHED`` finds it); None when the BTF has none."""
        d = self.btf
        for k in (bf.ENUM, bf.ENUM64):
            for tid in d.ids_of_kind(k):
                if name is not None and d.name(tid) != name:
                    continue
                t = self.type_of(tid)
                if not isinstance(t, EnumType) or t.declaration:
                    continue
                if enumerator is None or any(n == enumerator for n, _ in t.enumerators):
                    return t
        return None

    def pointer_size(self) -> int:
        """BTF does not record it: the size of ``long`` says it (8 when absent)."""
        if self._pointer_size is None:
            size = 8
            d = self.btf
            for tid in d.ids_of_kind(bf.INT):
                if d.name(tid) in ("long int", "long unsigned int", "unsigned long", "long"):
                    size = d.ref(tid)
                    break
            self._pointer_size = size
        return self._pointer_size

    # -------------------------------------------------------------- decoding

    def type_of(self, tid: int) -> Type:
        """The model type of a BTF type id (FUNC gives its prototype's FunctionType).

        VAR, DATASEC and DECL_TAG records describe no C type: asking for one raises
        KeyError (no struct reaches them)."""
        t = self._types.get(tid)
        if t is None:
            t = self._decode(tid)
            self._types[tid] = t
        return t

    def _decode(self, tid: int) -> Type:
        d = self.btf
        r = d.record(tid)
        k = r.kind
        if k == bf.INT:
            encoding, _, _ = r.fixed
            return BaseType(r.name or "int", r.ref, _int_encoding(r.name or "", encoding))
        if k == bf.FLOAT:
            return BaseType(r.name or "float", r.ref, Encoding.FLOAT)
        if k == bf.PTR:
            return PointerType(r.ref or None, self.pointer_size())
        if k in _QUALIFIERS:
            return QualifiedType(_QUALIFIERS[k], r.ref or None)
        if k == bf.TYPE_TAG:
            return QualifiedType("type_tag", r.ref or None, tag=r.name)
        if k == bf.TYPEDEF:
            return Typedef(r.name or "", r.ref or None)
        if k in (bf.STRUCT, bf.UNION):
            return CompositeType("struct" if k == bf.STRUCT else "union", r.name, r.ref,
                                 tuple(self._member(m, r.kind_flag) for m in r.items))
        if k == bf.FWD:
            return CompositeType("union" if r.kind_flag else "struct", r.name, 0, (),
                                 declaration=True)
        if k in (bf.ENUM, bf.ENUM64):
            return EnumType(r.name, r.ref, r.items, signed=r.kind_flag,
                            declaration=r.vlen == 0)
        if k == bf.ARRAY:
            element, _, count = r.fixed
            dims = [count]
            # C's int a[2][3] is an ARRAY of ARRAY in BTF and one array of two dims in DWARF
            while element and d.kinds[element] == bf.ARRAY:
                element, _, count = d.record(element).fixed
                dims.append(count)
            return ArrayType(element or None, tuple(dims))
        if k == bf.FUNC_PROTO:
            return self._function_type(r)
        if k == bf.FUNC:
            return self.type_of(r.ref)
        raise KeyError(f"BTF type {tid} is a {r.kind_name}, which is not a C type")

    def _function_type(self, r: bf.BtfRecord) -> FunctionType:
        params = [t for _, t in r.items]
        variadic = bool(r.items) and r.items[-1] == (None, 0)
        if variadic:
            params.pop()
        return FunctionType(r.ref or None, tuple(p or None for p in params), variadic)

    def _member(self, m: tuple, kind_flag: bool) -> Member:
        name, mtype, bit_offset, bit_size = m
        if not kind_flag and mtype:
            # Old encoding: a bitfield's width and extra offset sit in its INT type.
            base = self._strip_to_int(mtype)
            if base is not None:
                encoding, int_offset, bits = self.btf.record(base).fixed
                if int_offset or bits != self.btf.ref(base) * 8:
                    bit_offset += int_offset
                    bit_size = bits
        return Member(name, mtype or None, bit_offset, bit_size)

    def _strip_to_int(self, tid: int) -> Optional[int]:
        d = self.btf
        for _ in range(_MAX_CHAIN):
            d.check_id(tid)
            k = d.kinds[tid]
            if k == bf.INT:
                return tid
            if k not in (bf.TYPEDEF, bf.CONST, bf.VOLATILE, bf.RESTRICT, bf.TYPE_TAG):
                return None
            tid = d.ref(tid)
            if not tid:
                return None
        return None

    def references(self, tid: int) -> Iterator[int]:
        """The type ids one type refers to (for walking a graph)."""
        t = self.type_of(tid)
        if isinstance(t, (PointerType, QualifiedType, Typedef)):
            refs: Iterable[Optional[int]] = (t.target,)
        elif isinstance(t, CompositeType):
            refs = (m.type for m in t.members)
        elif isinstance(t, ArrayType):
            refs = (t.element,)
        elif isinstance(t, FunctionType):
            refs = (t.returns, *t.params)
        else:
            refs = ()
        return (r for r in refs if r)


class LazyTypes(Mapping):
    """The types reachable from a root, decoded on access.

    Iterating (or ``len``/``in``) walks the whole closure once; indexing decodes only the
    type asked for, which is all most users of a `TypeGraph` do.  Indexing any other id of
    the same BTF also works, which the closure does not forbid."""

    def __init__(self, model: BtfModel, root: int):
        self._model = model
        self._root = root
        self._closure: Optional[list[int]] = None
        self._members: Optional[set[int]] = None

    def __getitem__(self, tid: int) -> Type:
        if not isinstance(tid, int) or not 0 < tid < self._model.btf.count:
            raise KeyError(tid)
        return self._model.type_of(tid)

    def _ids(self) -> list[int]:
        if self._closure is None:
            seen = {self._root}
            order = [self._root]
            i = 0
            while i < len(order):
                for r in self._model.references(order[i]):
                    if r not in seen:
                        seen.add(r)
                        order.append(r)
                i += 1
            self._closure = order
        return self._closure

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids())

    def __len__(self) -> int:
        return len(self._ids())

    def __contains__(self, tid: object) -> bool:
        if self._members is None:
            self._members = set(self._ids())
        return tid in self._members


def _int_encoding(name: str, encoding: int) -> Encoding:
    if encoding & bf.INT_BOOL:
        return Encoding.BOOL
    unsigned_name = "unsigned" in name
    if encoding & bf.INT_CHAR or name in ("char", "signed char", "unsigned char"):
        return Encoding.SIGNED_CHAR if (encoding & bf.INT_SIGNED) and not unsigned_name \
            else Encoding.UNSIGNED_CHAR
    return Encoding.SIGNED if encoding & bf.INT_SIGNED else Encoding.UNSIGNED


# ---------------------------------------------------------------- catalog

_ShapeKey = tuple  # (ShapeKind, name)


@_reading_damaged
class BtfCatalog(Catalog):
    """The catalog of a BTF model, answered from id indexes built on first use."""

    def __init__(self, model: BtfModel):
        self.model = model
        self.btf = model.btf
        self.notes = ("BTF records no inlining and no addresses: every function is "
                      "listed as BTF names it",)
        self._strip_memo: dict[int, tuple[int, int, bool]] = {}
        self._key_memo: dict[int, _ShapeKey] = {}
        self._reducing: dict[tuple, set[int]] = {}
        self._ref_index: Optional[_Inverse] = None
        self._by_name: dict[ShapeKind, _NameTable] = {}
        self._named_structs: Optional[set[int]] = None
        self._members: Optional[_Inverse] = None
        self._member_names: list[int] = []
        self._member_owner: list[int] = []
        self._member_types: list[int] = []
        self._shape_memo: dict[int, TypeShape] = {}
        self._proto_memo: dict[int, tuple] = {}
        self._tp_index: Optional[dict[_ShapeKey, list[TracepointInfo]]] = None
        self._functions: dict[int, FunctionInfo] = {}
        self._structs: dict[int, StructInfo] = {}
        self._fn_index: Optional[tuple[_Inverse, _Inverse]] = None
        self._tracepoints: Optional[list[TracepointInfo]] = None
        self._func_ids: Optional[list[int]] = None
        if model.saved is not None and "fn_types" in model.saved:
            self._restore(model.saved)
        elif model.use_cache:
            self._save()

    # ---------------------------------------------------------- saved indexes

    def _save(self) -> None:
        """Build every index now and keep them for the next run (`ctracer.debuginfo.btf.cache`)."""
        from ctracer.debuginfo.btf import cache as bc
        d = self.btf
        refs = self._refs()
        by_type, by_proto = self._function_index()
        members = self._member_index()
        for kind in _SHAPE_KINDS:
            self._roots(kind, "")
        bc.save(self.model.cache_key, {
            "offsets": bc.pack(d.offsets), "kinds": bytes(d.kinds),
            "refs": refs.packed(), "fn_types": by_type.packed(), "fn_protos": by_proto.packed(),
            "members": members.packed(), "member_names": bc.pack(self._member_names),
            "member_owner": bc.pack(self._member_owner),
            "member_types": bc.pack(self._member_types),
            "func_ids": bc.pack(self._all_func_ids()),
            "composites": _pack_composites(self.model.composites()),
            "names": {k.value: table.packed() for k, table in self._by_name.items()}})

    def _restore(self, saved: dict) -> None:
        from ctracer.debuginfo.btf import cache as bc
        self._ref_index = _Inverse.unpacked(saved["refs"])
        self._fn_index = (_Inverse.unpacked(saved["fn_types"]),
                          _Inverse.unpacked(saved["fn_protos"]))
        self._members = _Inverse.unpacked(saved["members"])
        self._member_names = bc.unpack(saved["member_names"])
        self._member_owner = bc.unpack(saved["member_owner"])
        self._member_types = bc.unpack(saved["member_types"])
        self._func_ids = bc.unpack(saved["func_ids"])
        self._by_name = {ShapeKind(k): _NameTable.unpacked(t) for k, t in saved["names"].items()}
        if self.model._composites is None:
            self.model._composites = _unpack_composites(saved["composites"])

    # ---------------------------------------------------------- shapes

    def _strip(self, tid: int) -> tuple[int, int, bool]:
        """(type id with a layout, pointer depth, const) of a declared type; const
        qualifies what the innermost pointer points to (``const struct sock *``)."""
        r = self._strip_memo.get(tid)
        if r is None:
            d = self.btf
            w, offs, kinds = d.words, d.offsets, d.kinds
            pointers, const, t = 0, False, tid
            try:
                for _ in range(_MAX_CHAIN):
                    if not t:
                        break
                    k = kinds[t]
                    if k == bf.PTR:
                        pointers += 1
                        const = False  # const now refers to what this pointer points to
                    elif k == bf.CONST:
                        const = True
                    elif k not in _TRANSPARENT:
                        break
                    t = w[offs[t] + 2]
                else:
                    raise InputFileError(f"{d.description}: type chain too long at {tid}")
            except IndexError:
                d.check_id(t)
                raise
            r = (t, pointers, const)
            self._strip_memo[tid] = r
        return r

    def _key(self, root: int) -> _ShapeKey:
        """(ShapeKind, name) of a stripped type id."""
        key = self._key_memo.get(root)
        if key is None:
            d = self.btf
            if not root:
                key = (ShapeKind.VOID, None)
            else:
                k = d.kinds[root]
                if k in (bf.INT, bf.FLOAT):
                    key = (ShapeKind.BASE, d.name(root))
                elif k == bf.STRUCT:
                    key = (ShapeKind.STRUCT, d.name(root))
                elif k == bf.UNION:
                    key = (ShapeKind.UNION, d.name(root))
                elif k == bf.FWD:
                    key = (ShapeKind.UNION if d.info(root) >> 31 else ShapeKind.STRUCT,
                           d.name(root))
                elif k in (bf.ENUM, bf.ENUM64):
                    key = (ShapeKind.ENUM, d.name(root))
                elif k == bf.FUNC_PROTO:
                    key = (ShapeKind.FUNCTION, None)
                elif k == bf.ARRAY:
                    key = (ShapeKind.ARRAY, None)
                else:
                    key = (ShapeKind.UNKNOWN, d.name(root))
            self._key_memo[root] = key
        return key

    def shape(self, tid: int) -> TypeShape:
        s = self._shape_memo.get(tid)
        if s is None:
            root, pointers, const = self._strip(tid)
            kind, name = self._key(root)
            s = TypeShape(kind, name, pointers, const, c_type_text(self.btf, tid))
            self._shape_memo[tid] = s
        return s

    def _parameters(self, proto: int) -> tuple[tuple[Parameter, ...], TypeShape, bool]:
        """(parameters, return shape, variadic) of a FUNC_PROTO, memoized."""
        found = self._proto_memo.get(proto)
        if found is None:
            d = self.btf
            d.check_id(proto)
            w = d.words
            at = d.offsets[proto]
            n = w[at + 1] & 0xFFFF
            pairs = [(w[p], w[p + 1]) for p in range(at + 3, at + 3 + 2 * n, 2)]
            variadic = bool(pairs) and pairs[-1] == (0, 0)
            if variadic:
                pairs.pop()
            string, shape = d.string, self.shape
            params = tuple(Parameter(string(name) if name else None, shape(t))
                           for name, t in pairs)
            found = self._proto_memo[proto] = (params, shape(w[at + 2]), variadic)
        return found

    # ---------------------------------------------------------- functions

    def _all_func_ids(self) -> list[int]:
        if self._func_ids is None:
            ids = self.btf.ids_of_kind(bf.FUNC)
            first = self.btf.first_id  # a module's own functions, not its base's
            self._func_ids = ids if first == 1 else [i for i in ids if i >= first]
        return self._func_ids

    def _function(self, fid: int) -> FunctionInfo:
        f = self._functions.get(fid)
        if f is None:
            d = self.btf
            w = d.words
            at = d.offsets[fid]
            params, returns, variadic = self._parameters(w[at + 2])
            f = FunctionInfo(
                name=d.string(w[at]),
                params=params,
                returns=returns,
                external=(w[at + 1] & 0xFFFF) != 0,  # linkage: 0 static, 1 global, 2 extern
                variadic=variadic)
            self._functions[fid] = f
        return f

    def functions(self) -> list[FunctionInfo]:
        return [self._function(fid) for fid in self._all_func_ids()]

    def function_count(self) -> int:
        return len(self._all_func_ids())

    def _types_reducing_to(self, kind: ShapeKind, name: Optional[str]) -> set[int]:
        """Every type id whose shape is (kind, name): the types that have that layout and
        every pointer, typedef, qualifier or type tag leading to them (memoized)."""
        key = (kind, name)
        found = self._reducing.get(key)
        if found is None:
            refs = self._refs()
            found = set(self._roots(kind, name))
            todo = list(found)
            while todo:
                for t in refs.get(todo.pop()):
                    if t not in found:
                        found.add(t)
                        todo.append(t)
            self._reducing[key] = found
        return found

    def _refs(self) -> "_Inverse":
        """target id → ids of the pointers, typedefs, qualifiers and tags naming it."""
        if self._ref_index is None:
            d = self.btf
            w, offs = d.words, d.offsets
            ids: list[int] = []
            for k in (bf.PTR, bf.TYPEDEF, bf.CONST, bf.VOLATILE, bf.RESTRICT, bf.TYPE_TAG):
                ids += d.ids_of_kind(k)
            self._ref_index = _Inverse([w[offs[t] + 2] for t in ids], ids)
        return self._ref_index

    def _roots(self, kind: ShapeKind, name: Optional[str]) -> list[int]:
        """Ids of the types with a layout whose shape is (kind, name)."""
        if kind == ShapeKind.VOID:
            return [0]
        d = self.btf
        if kind in (ShapeKind.FUNCTION, ShapeKind.ARRAY):
            return d.ids_of_kind(bf.FUNC_PROTO if kind == ShapeKind.FUNCTION else bf.ARRAY) \
                if name is None else []
        group = _SHAPE_KINDS.get(kind)
        if group is None:
            return []
        table = self._by_name.get(kind)
        if table is None:
            by_offset: dict[int, list[int]] = {}
            for k in group:
                for tid in d.ids_of_kind(k):
                    by_offset.setdefault(d.words[d.offsets[tid]], []).append(tid)
            by_name: dict[Optional[str], list[int]] = {}
            for off, ids in by_offset.items():
                by_name.setdefault(d.string(off) if off else None, []).extend(ids)
            table = self._by_name[kind] = _NameTable.built(by_name)
        return [t for t in table.get(name) if self._key(t) == (kind, name)]

    def _function_index(self) -> tuple["_Inverse", "_Inverse"]:
        """(declared type → prototypes using it as a parameter or return type,
        prototype → functions having it)."""
        if self._fn_index is None:
            d = self.btf
            w, offs = d.words, d.offsets
            fids = self._all_func_ids()
            protos_of = [w[offs[f] + 2] for f in fids]
            types: list[int] = []
            owners: list[int] = []
            for proto in set(protos_of):
                d.check_id(proto)
                at = offs[proto]
                n = w[at + 1] & 0xFFFF
                if n and not w[at + 1 + 2 * n] and not w[at + 2 + 2 * n]:
                    n -= 1  # the "..." of a variadic function is no void parameter
                types.append(w[at + 2])
                types += w[at + 4:at + 3 + 2 * n:2]
                owners += [proto] * (n + 1)
            self._fn_index = (_Inverse(types, owners), _Inverse(protos_of, fids))
        return self._fn_index

    def functions_referencing(self, kind: ShapeKind, name: str) -> list[FunctionInfo]:
        by_type, by_proto = self._function_index()
        protos = {p for t in self._types_reducing_to(kind, name) for p in by_type.get(t)}
        fids = sorted({f for p in protos for f in by_proto.get(p)})
        return [self._function(fid) for fid in fids]

    # ---------------------------------------------------------- structs

    def _flat_members(self, tid: int, prefix: str, base_bits: int,
                      out: list, names: bool) -> None:
        """Append (path, member type id, absolute bit offset) of a struct's members,
        descending into anonymous structs/unions; paths only when ``names``."""
        d = self.btf
        w, offs = d.words, d.offsets
        at = offs[tid]
        info = w[at + 1]
        kind_flag = info >> 31
        p = at + 3
        for _ in range(info & 0xFFFF):
            name_off, mtype, moff = w[p], w[p + 1], w[p + 2]
            p += 3
            bits = base_bits + (moff & 0xFFFFFF if kind_flag else moff)
            if not name_off and mtype and self._is_flattened(mtype):
                self._flat_members(self._strip_layout(mtype), prefix + "." if names else "",
                                   bits, out, names)
                continue
            if names:
                out.append((prefix + (d.string(name_off) if name_off else ""), mtype, bits))
            else:
                out.append(mtype)

    def _strip_layout(self, tid: int) -> int:
        """Follow typedefs and qualifiers only (not pointers)."""
        d = self.btf
        for _ in range(_MAX_CHAIN):
            if not tid or d.kinds[tid] not in _TRANSPARENT:
                return tid
            tid = d.ref(tid)
        return tid

    def _struct_info(self, tid: int) -> StructInfo:
        s = self._structs.get(tid)
        if s is None:
            d = self.btf
            flat: list = []
            self._flat_members(tid, "", 0, flat, names=True)
            s = StructInfo(ShapeKind.STRUCT if d.kinds[tid] == bf.STRUCT else ShapeKind.UNION,
                           d.name(tid) or "", d.ref(tid),
                           tuple(MemberInfo(path, self.shape(mt), bits)
                                 for path, mt, bits in flat))
            self._structs[tid] = s
        return s

    def struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[StructInfo]:
        tid = self.model.struct_id(name, kind)
        return None if tid is None else self._struct_info(tid)

    def _member_index(self) -> "_Inverse":
        """member type → positions in ``_member_names``/``_member_owner`` (all structs and
        unions, anonymous ones included)."""
        if self._members is None:
            d = self.btf
            w, offs = d.words, d.offsets
            types: list[int] = []
            names: list[int] = []
            owners: list[int] = []
            for k in (bf.STRUCT, bf.UNION):
                for tid in d.ids_of_kind(k):
                    at = offs[tid]
                    end = at + 3 + 3 * (w[at + 1] & 0xFFFF)
                    types += w[at + 4:end:3]
                    names += w[at + 3:end:3]
                    owners += [tid] * ((end - at - 3) // 3)
            self._member_names, self._member_owner = names, owners
            self._member_types = types
            self._members = _Inverse(types, list(range(len(types))))
        return self._members

    def structs_with_member_of(self, kind: ShapeKind, name: str) -> list[StructInfo]:
        index = self._member_index()
        names, owners = self._member_names, self._member_owner
        if self._named_structs is None:
            self._named_structs = set(self.model.composites().values())
        named = self._named_structs
        found: set[int] = set()
        seen: set[int] = set()
        types = self._member_types
        todo = [pos for t in self._types_reducing_to(kind, name) for pos in index.get(t)
                if names[pos] or not self._is_flattened(types[pos])]
        while todo:
            owner = owners[todo.pop()]
            if owner in seen:
                continue
            seen.add(owner)
            if owner in named:
                found.add(owner)
            # members of a struct/union held as an unnamed member (an anonymous struct,
            # directly or through typedefs) count as members of the holder
            for t in self._types_reaching_layout(owner):
                todo.extend(pos for pos in index.get(t) if not names[pos])
        return [self._struct_info(t) for t in sorted(found)]

    def _is_flattened(self, tid: int) -> bool:
        """Whether an unnamed member of this type is flattened into its holder."""
        inner = self._strip_layout(tid)
        return bool(inner) and self.btf.kinds[inner] in (bf.STRUCT, bf.UNION)

    def _types_reaching_layout(self, tid: int) -> list[int]:
        """``tid`` and the typedefs/qualifiers (not pointers) naming it."""
        refs, d = self._refs(), self.btf
        out, todo = [tid], [tid]
        while todo:
            for t in refs.get(todo.pop()):
                if d.kinds[t] != bf.PTR:
                    out.append(t)
                    todo.append(t)
        return out

    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> list[str]:
        return self.model.struct_names(kind)

    # ---------------------------------------------------------- tracepoints

    def tracepoints(self) -> list[TracepointInfo]:
        if self._tracepoints is None:
            d = self.btf
            found = []
            for tid in d.ids_of_kind(bf.TYPEDEF):
                if tid < d.first_id:
                    continue
                name = d.name(tid)
                if not name or not name.startswith(TRACEPOINT_TYPEDEF_PREFIX):
                    continue
                ptr = d.ref(tid)
                if not ptr or d.kinds[ptr] != bf.PTR:
                    continue
                proto = d.ref(ptr)
                if not proto or d.kinds[proto] != bf.FUNC_PROTO:
                    continue
                params = self._parameters(proto)[0]
                first = params[0].shape if params else None
                if first and (first.kind, first.pointers) == (ShapeKind.VOID, 1):  # void *ctx
                    params = params[1:]
                found.append(TracepointInfo(name[len(TRACEPOINT_TYPEDEF_PREFIX):], params))
            self._tracepoints = found
        return self._tracepoints

    def tracepoints_referencing(self, kind: ShapeKind, name: str) -> list[TracepointInfo]:
        if self._tp_index is None:
            index: dict[_ShapeKey, list[TracepointInfo]] = {}
            for t in self.tracepoints():
                for key in {(p.shape.kind, p.shape.name) for p in t.params}:
                    index.setdefault(key, []).append(t)
            self._tp_index = index
        return list(self._tp_index.get((kind, name), ()))


# the BTF kinds whose types have each (named) shape kind
_SHAPE_KINDS = {ShapeKind.STRUCT: (bf.STRUCT, bf.FWD), ShapeKind.UNION: (bf.UNION, bf.FWD),
                ShapeKind.BASE: (bf.INT, bf.FLOAT), ShapeKind.ENUM: (bf.ENUM, bf.ENUM64)}


class _Inverse:
    """key → values for parallel lists, answered by binary search over one C-speed sort
    (building a dict of lists in Python costs several times more on kernel BTF)."""

    def __init__(self, keys: list[int], values: list[int]):
        order = sorted(range(len(keys)), key=keys.__getitem__)
        self._keys = [keys[i] for i in order]
        self._values = [values[i] for i in order]

    def packed(self) -> tuple[bytes, bytes]:
        from ctracer.debuginfo.btf.cache import pack
        return pack(self._keys), pack(self._values)

    @classmethod
    def unpacked(cls, saved: tuple[bytes, bytes]) -> "_Inverse":
        from ctracer.debuginfo.btf.cache import unpack
        inverse = cls.__new__(cls)
        inverse._keys, inverse._values = unpack(saved[0]), unpack(saved[1])
        return inverse

    def get(self, key: int) -> list[int]:
        lo = bisect_left(self._keys, key)
        hi = bisect_right(self._keys, key, lo)
        return self._values[lo:hi]


class _NameTable:
    """name (None: anonymous) → type ids, kept as positions into one packed id array so
    that it saves and loads as three flat values."""

    def __init__(self, names: list[str], starts, ids):
        self._where = dict(zip(names, range(len(names))))  # "" stands for anonymous
        self._names, self._starts, self._ids = names, starts, ids

    @classmethod
    def built(cls, table: dict) -> "_NameTable":
        names, starts, ids = [], [0], []
        for name, found in table.items():
            names.append(name or "")
            ids += found
            starts.append(len(ids))
        return cls(names, starts, ids)

    def get(self, name: Optional[str]) -> list[int]:
        i = self._where.get(name or "")
        return [] if i is None else list(self._ids[self._starts[i]:self._starts[i + 1]])

    def packed(self) -> tuple:
        from ctracer.debuginfo.btf.cache import pack
        return "\0".join(self._names), pack(self._starts), pack(self._ids)

    @classmethod
    def unpacked(cls, saved: tuple) -> "_NameTable":
        from ctracer.debuginfo.btf.cache import unpack
        joined, starts, ids = saved
        names = joined.split("\0") if joined or len(unpack(starts)) > 1 else []
        return cls(names, unpack(starts), unpack(ids))


def _pack_composites(composites: dict) -> dict:
    from ctracer.debuginfo.btf.cache import pack
    out = {}
    for kind in (ShapeKind.STRUCT, ShapeKind.UNION):
        items = [(n, t) for (k, n), t in composites.items() if k == kind]
        out[kind.value] = ("\0".join(n for n, _ in items), pack(t for _, t in items))
    return out


def _unpack_composites(saved: dict) -> dict:
    from ctracer.debuginfo.btf.cache import unpack
    out: dict = {}
    for kind, (joined, tids) in saved.items():
        k = ShapeKind(kind)
        names = joined.split("\0") if joined else []
        out.update(zip(((k, n) for n in names), unpack(tids)))
    return out


# ---------------------------------------------------------------- C spelling

def c_type_text(d: BtfData, tid: int) -> str:
    """How C spells a type (``const struct sock *``, ``int (*)(void *)``), by the one
    speller (`ctracer.debuginfo.cdecl`), as DWARF types are spelled: type tags (which
    DWARF lacks) are left out."""
    try:
        return cdecl.spell(partial(_c_node, d), tid or None)
    except ValueError:
        raise InputFileError(f"{d.description}: type chain too long at {tid}") from None


def _c_node(d: BtfData, tid: int) -> cdecl.Node:
    """One BTF type as the speller sees it (type 0, void, is None)."""
    if not 0 < tid < d.count:
        d.check_id(tid)
    k = d.kinds[tid]
    if k == bf.PTR:
        return cdecl.Pointer(d.ref(tid) or None)
    word = _QUALIFIER_WORDS.get(k)
    if word is not None:
        return cdecl.Qualified(word, d.ref(tid) or None)
    if k == bf.ARRAY:
        element, _, count = d.record(tid).fixed
        return cdecl.Array(element or None, (count,))   # [0], as the model reads it
    if k == bf.FUNC_PROTO or k == bf.FUNC:
        r = d.record(d.ref(tid) if k == bf.FUNC else tid)
        params = tuple(ptype or None for pname, ptype in r.items if (pname, ptype) != (None, 0))
        return cdecl.Function(r.ref or None, params, len(params) < len(r.items))
    name = d.name(tid)
    keyword = _KEYWORDS.get(k)
    if keyword is not None:
        if k == bf.FWD:
            keyword = "union" if d.info(tid) >> 31 else "struct"
        name = f"{keyword} {name}" if name else f"{keyword} {{...}}"
    return cdecl.Named(name or "?")


#: what the speller writes for a BTF qualifier ("" for a type tag: left out)
_QUALIFIER_WORDS = {**_QUALIFIERS, bf.TYPE_TAG: ""}
_KEYWORDS = {bf.STRUCT: "struct", bf.UNION: "union", bf.ENUM: "enum", bf.ENUM64: "enum",
             bf.FWD: "struct"}


def model_from_bytes(data: bytes, description: str,
                     base: Union[None, str, BtfModel] = None,
                     use_cache: bool = False) -> BtfModel:
    """A model of BTF held in memory (raw BTF, e.g. an ELF file's .BTF section).

    With ``use_cache`` the reader's indexes are saved for the next run and reused when
    saved before (`ctracer.debuginfo.btf.cache`, keyed by a hash of the bytes)."""
    base_model = _open_base(base, use_cache)
    key = saved = known = None
    if use_cache and (base_model is None or base_model.cache_key):
        from ctracer.debuginfo.btf import cache as btf_cache
        key = btf_cache.digest(data, base_model.cache_key if base_model else None)
        saved = btf_cache.load(key)
        if saved is not None:
            known = (btf_cache.unpack(saved["offsets"]), saved["kinds"])
    try:
        d = BtfData(data, description, base_model.btf if base_model else None, known)
    except _DAMAGE as err:
        raise InputFileError(f"{description}: its BTF cannot be read "
                             f"({type(err).__name__}: {err}); is it damaged?") from None
    return BtfModel(d, description, cache_key=key, use_cache=use_cache, saved=saved)


def _open_base(base: Union[None, str, BtfModel], use_cache: bool) -> Optional[BtfModel]:
    if base is None or isinstance(base, BtfModel):
        return base
    return open_btf(base, use_cache=use_cache)


def read_btf_bytes(path: str) -> bytes:
    """The BTF bytes of a file: the file itself, or its ELF .BTF section."""
    try:
        with open(path, "rb") as f:
            data = f.read(4)
            is_elf = data == b"\x7fELF"
            if not is_elf:
                data += f.read()
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path} is a directory") from None
    except PermissionError:
        raise InputFileError(f"{path}: permission denied") from None
    except OSError as e:
        raise InputFileError(f"{path}: {e.strerror or e}") from None
    if not is_elf:
        return data
    section = _elf_btf_section(path)
    if section is None:
        raise InputFileError(f"{path} has no .BTF section")
    return section


def _elf_btf_section(path: str) -> Optional[bytes]:
    # ctracer.debuginfo.dwarf.reader reads ELF section headers without importing pyelftools
    from ctracer.debuginfo.elf import read_elf_headers
    section = read_elf_headers(path).section(".BTF")
    if section is None or section.type == 8:  # absent, or SHT_NOBITS
        return None
    with open(path, "rb") as f:
        f.seek(section.offset)
        data = f.read(section.size)
    if len(data) != section.size:
        raise InputFileError(f"{path}: .BTF section runs past the end of the file")
    return data


def open_btf(path: str, base: Union[None, str, BtfModel] = None,
             use_cache: bool = True) -> BtfModel:
    """Open BTF: /sys/kernel/btf/vmlinux, /sys/kernel/btf/<module> (split on vmlinux,
    found automatically), a raw BTF file, or an ELF file's .BTF section (split module
    BTF needs ``base``: a path or an opened model)."""
    if base is None and os.path.dirname(os.path.abspath(path)) == MODULE_BTF_DIR \
            and os.path.basename(path) != "vmlinux":
        base = KERNEL_BTF
    base_model = _open_base(base, use_cache)
    data = read_btf_bytes(path)
    description = f"BTF of {path}"
    if base_model is not None:
        description += f" (split on {base_model.description[len('BTF of '):]})"
    return model_from_bytes(data, description, base_model, use_cache)
