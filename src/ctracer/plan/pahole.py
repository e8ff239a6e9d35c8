"""A struct's or union's layout printed exactly as ``pahole -C NAME`` (pahole 1.24) prints it.

`render(graph)` takes the `TypeGraph` of one struct/union (from DWARF or BTF, the model
does not say which) and returns pahole's text: members with their offsets and sizes,
bitfield offsets, byte and bit holes, cacheline boundaries, anonymous structs/unions
expanded inline, alignment attributes and the closing summary comment.

pahole's output is a de-facto standard that kernel engineers read every day, quirks
included (``const char  *`` with two spaces, arrays of function pointers spelled
``void (*handlers)(int)[4]``, the inferred ``__packed__``), so this module reproduces its
rules rather than "fixing" them; `ctracer.debuginfo.cdecl` is where correct C declarators live.

The rules were learnt by running pahole 1.24 on the fixtures under tests/fixtures/layout/
and on kernel structs, and from reading how dwarves' printer works (reimplemented here,
not copied).  What pahole computes per member (storage-unit offset of a bitfield, holes,
inferred packing) is worked out in `ctracer.plan.pahole_layout`; this module prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, EnumType, FunctionType,
                                     PointerType, QualifiedType, TypeGraph, TypeId, Typedef)
from ctracer.plan.pahole_layout import HoleSearch, MemberPlace, StructHoles, TypeFacts

CACHELINE_SIZE = 64
#: pahole's column widths: a member's type is padded to TYPE_SPACING, its name then ends
#: where the offset comment starts (NAME_SPACING further; 21 at the top of a union).
TYPE_SPACING = 26
NAME_SPACING = 23
UNION_NAME_SPACING = 21

_TABS = "\t" * 16  # pahole never indents deeper than this


def render(graph: TypeGraph, tid: Optional[TypeId] = None, *, source_format: str = "dwarf",
           cacheline_size: int = CACHELINE_SIZE, pointer_size: int = 8) -> str:
    """pahole's text for the struct/union ``tid`` (default: the graph's root), ending in
    ``};\\n`` like ``pahole -C``.

    ``source_format`` is the model's origin ("dwarf" or "btf", `TypeModel.format`): pahole
    prints a few things differently for BTF, which records no alignment (no "Force
    padding" section) and whose enumerator values pahole 1.24 prints unsigned.
    """
    if source_format not in ("dwarf", "btf"):
        raise ValueError(f"unknown type source format {source_format!r}")
    tid = graph.root if tid is None else tid
    facts = TypeFacts(graph, cacheline_size, pointer_size)
    printer = _Printer(facts, HoleSearch(facts, btf=source_format == "btf"))
    return printer.print_top(tid) + ";\n"



def hole_comment(size: int, unit: str) -> str:
    """pahole's comment on a hole of ``size`` bytes or bits (``unit``)."""
    return f"/* XXX {size} {unit}{_plural(size)} hole, try to pack */"

class _CommentRun:
    """pahole's comment runs between members: a blank line opens a run of ``XXX``
    comments, and another closes it before the next member is printed."""

    def __init__(self, out: list[str]):
        self.out = out
        self.open = False

    def add(self, text: str) -> None:
        if not self.open:
            self.out.append("\n")
            self.open = True
        self.out.append(text)

    def close(self) -> None:
        if self.open:
            self.out.append("\n")
            self.open = False


@dataclass
class _Conf:
    """The printing context pahole threads through its recursion (a value, copied on
    the way down); ``cacheline`` is shared by everything printed inside one top type."""

    indent: int = 0
    type_spacing: int = TYPE_SPACING
    name_spacing: int = NAME_SPACING
    base_offset: int = 0
    rel_offset: bool = False
    suffix: Optional[str] = None
    emit_stats: bool = True
    suppress_offset_comment: bool = False
    union_member: bool = False
    first_member: bool = False
    last_member: bool = False
    cacheline: Optional[list[int]] = field(default=None)  # last boundary printed


def _plural(n: int) -> str:
    return "s" if n != 1 else ""


def _left(text: str, width: int) -> str:
    """C's ``printf("%-*s", width, text)`` (a negative width also left-justifies)."""
    return text.ljust(abs(width))


def _pad_field(width: int) -> str:
    """C's ``printf("%*s", width, " ")``: at least one space, |width| when wider."""
    return " " * max(abs(width), 1)


class _TypeNames:
    """pahole's names of types as written before a member's name or in a parameter list
    (``const char *``, ``void (*)(int)``)."""

    def __init__(self, graph: TypeGraph):
        self.g = graph

    def _type(self, tid: Optional[TypeId]):
        return None if tid is None else self.g[tid]

    def tag_name(self, tid: Optional[TypeId]) -> str:
        """pahole's name of a type as used before a member name or in a parameter list."""
        t = self._type(tid)
        if t is None:
            return "void"
        if isinstance(t, BaseType):
            return t.name or "nameless base type!"
        if isinstance(t, PointerType):
            return self._ptr_name(t, "*")
        if isinstance(t, QualifiedType):
            if t.qualifier == "type_tag":
                return self.tag_name(t.target)
            inner = self.tag_name(t.target)
            prefix = {"const": "const ", "volatile": "volatile ", "atomic": "_Atomic "}.get(
                t.qualifier, "")
            suffix = " restrict" if t.qualifier == "restrict" else ""
            return f"{prefix}{inner}{suffix} "
        if isinstance(t, ArrayType):
            return self.tag_name(t.element)
        if isinstance(t, FunctionType):
            return self.ftype(t, None, inlined=False, is_pointer=False, type_spacing=0)
        if isinstance(t, Typedef):
            return t.name
        if isinstance(t, CompositeType):
            return f"{t.kind} {t.name or ''}"
        if isinstance(t, EnumType):
            return f"enum {t.name or ''}"
        return ""

    def _ptr_name(self, t: PointerType, suffix: str) -> str:
        if t.target is None:
            return f"void {suffix}"
        target = t.target
        const_pointer = ""
        tt = self.g[target]
        if isinstance(tt, QualifiedType) and tt.qualifier == "const" and tt.target is not None \
                and isinstance(self.g[tt.target], PointerType):
            const_pointer = "const "
            target = tt.target
        return f"{self.tag_name(target)} {const_pointer}{suffix}"

    def ftype(self, f: FunctionType, name: Optional[str], *, inlined: bool, is_pointer: bool,
              type_spacing: int) -> str:
        """pahole's ``ret (*name)(params)`` for a function type."""
        ret = self.tag_name(f.returns)
        head = f"{'inline ' if inlined else ''}{_left(ret, type_spacing)} " \
               f"({'*' if is_pointer else ''}{name or ''})"
        return head + self._params(f)

    def _params(self, f: FunctionType) -> str:
        parts = []
        for p in f.params:
            pt = self._type(p)
            if isinstance(pt, PointerType) and pt.target is not None and \
                    isinstance(self.g[pt.target], FunctionType):
                parts.append(self.ftype(self.g[pt.target], None, inlined=False,
                                        is_pointer=True, type_spacing=0))
            elif isinstance(pt, FunctionType):
                parts.append(self.ftype(pt, None, inlined=True, is_pointer=False,
                                        type_spacing=0))
            else:
                parts.append(self.tag_name(p))
        if not parts:
            return "(void)"
        return "(" + ", ".join(parts) + (", ...)" if f.variadic else ")")


class _Printer:
    """pahole's printer: a member's type and name (anonymous types expanded inline), its
    offset comment, a struct with its holes and summary, a union; the names of types come
    from `_TypeNames`, the layout from `TypeFacts` and `HoleSearch`."""

    def __init__(self, facts: TypeFacts, holes: HoleSearch):
        self.facts = facts
        self.g = facts.g
        self.holes = holes
        self.names = _TypeNames(facts.g)

    # ---------------------------------------------------------------- printing types

    def type_text(self, tid: Optional[TypeId], name: Optional[str], conf: _Conf) -> str:
        """A member's type and name (pahole's type__fprintf), anonymous types expanded."""
        tconf = replace(conf)
        t = self.facts.type_of(tid)
        if isinstance(t, (CompositeType, EnumType)):
            self._inner_conf(tconf, name)
        prefix = ""  # modifiers already printed, each narrowing the type column
        while True:
            if t is None:
                return prefix + f"{_left('void', tconf.type_spacing)} {name or ''}"
            if isinstance(t, PointerType):
                target = self._skip_type_tags(t.target)
                pt = self.facts.type_of(target)
                if isinstance(pt, FunctionType):
                    return prefix + self.names.ftype(pt, name, inlined=False, is_pointer=True,
                                                     type_spacing=tconf.type_spacing)
                if isinstance(pt, (CompositeType, EnumType)) and pt.name is None:
                    name = f"* {name}"
                    tconf.rel_offset = True
                    tconf.type_spacing -= 8
                    self._inner_conf(tconf, name)
                    tid, t = target, pt
                    continue
                return prefix + self._named(tid, name, tconf)
            if isinstance(t, FunctionType):
                return prefix + self.names.ftype(t, name, inlined=False, is_pointer=False,
                                                 type_spacing=tconf.type_spacing)
            if isinstance(t, QualifiedType) and t.qualifier in ("const", "atomic"):
                modifier = "const " if t.qualifier == "const" else "_Atomic "
                prefix += modifier
                tconf.type_spacing -= len(modifier)
                if t.target is None:
                    return prefix + self._named(tid, name, tconf)
                tid, t = t.target, self.g[t.target]
                continue
            if isinstance(t, QualifiedType) and t.qualifier == "type_tag":
                if t.target is None:
                    return prefix + f"{_left('<ERROR', tconf.type_spacing)}> {name or ''}"
                tid, t = t.target, self.g[t.target]
                continue
            if isinstance(t, ArrayType):
                return prefix + self._array_text(t, name, tconf)
            if isinstance(t, CompositeType):
                if t.name is not None:
                    width = tconf.type_spacing - len(t.kind) - 1
                    return prefix + f"{t.kind} {_left(t.name, width)} {name or ''}"
                tconf.type_spacing -= 8
                if t.kind == "struct":
                    return prefix + self.class_text(tid, tconf)
                return prefix + self.union_text(tid, tconf)
            if isinstance(t, EnumType):
                if t.name is not None:
                    return prefix + f"enum {_left(t.name, tconf.type_spacing - 5)} {name or ''}"
                return prefix + self.enum_text(t, tconf)
            return prefix + self._named(tid, name, tconf)

    def _named(self, tid: Optional[TypeId], name: Optional[str], conf: _Conf) -> str:
        """A type's name padded to the type column, then ``name``."""
        return f"{_left(self.names.tag_name(tid), conf.type_spacing)} {name or ''}"

    @staticmethod
    def _inner_conf(tconf: _Conf, name: Optional[str]) -> None:
        tconf.suffix = name
        tconf.emit_stats = False

    def _skip_type_tags(self, tid: Optional[TypeId]) -> Optional[TypeId]:
        while tid is not None:
            t = self.g[tid]
            if isinstance(t, QualifiedType) and t.qualifier == "type_tag" and t.target != tid:
                tid = t.target
                continue
            break
        return tid

    def _array_text(self, t: ArrayType, name: Optional[str], conf: _Conf) -> str:
        element = t.element
        dims = [d or 0 for d in t.dims]
        et = self.facts.type_of(element)
        if dims and dims[0] == 0 and isinstance(et, QualifiedType) and et.qualifier == "const":
            element = et.target
        text = self.type_text(element, name, conf)
        single_member = conf.last_member and conf.first_member
        for d in dims:
            if d != 0 or not conf.last_member or single_member or conf.union_member:
                text += f"[{d}]"
            else:
                text += "[]"
        return text

    def enum_text(self, t: EnumType, conf: _Conf) -> str:
        indent = _TABS[:conf.indent]
        text = "enum" + (f" {t.name}" if t.name else "")
        if not t.enumerators:
            return text
        text += " {\n"
        width = max(len(n) for n, _ in t.enumerators)
        for n, v in t.enumerators:
            value = v
            if self.holes.btf and v < 0:
                value = v & (0xFFFFFFFF if t.size <= 4 else 0xFFFFFFFFFFFFFFFF)
            text += f"{indent}\t{n:<{width}} = {value},\n"
        text += f"{indent}}}"
        if t.size != 4:
            text += " __attribute__((__packed__))"
        if conf.suffix:
            text += f" {conf.suffix}"
        return text

    # ---------------------------------------------------------------- members

    def _cacheline_marker(self, conf: _Conf, offset: int) -> str:
        line = offset // self.facts.cacheline_size
        if line <= conf.cacheline[0]:
            return ""
        pos = offset % self.facts.cacheline_size
        start = offset - pos
        if pos == 0:
            text = f"/* --- cacheline {line} boundary ({start} bytes) --- */\n"
        else:
            text = (f"/* --- cacheline {line} boundary ({start} bytes) was {pos} "
                    f"byte{'s' if pos > 1 else ''} ago --- */\n")
        conf.cacheline[0] = line
        return text + _TABS[:conf.indent]

    def member_text(self, place: MemberPlace, union_member: bool, conf: _Conf) -> str:
        """One member with its offset comment (pahole's class_member__fprintf)."""
        m = place.member
        sconf = replace(conf)
        offset = place.byte_offset
        if not sconf.rel_offset:
            offset += sconf.base_offset
            if not union_member:
                sconf.base_offset = offset
        marker = self._cacheline_marker(conf, offset)
        tid = m.type
        t = self.facts.type_of(tid)
        is_tagged = isinstance(t, (CompositeType, EnumType))
        if is_tagged:
            text = self.type_text(tid, None, sconf)
            if m.name:
                if t.name is None:
                    text += " "
                text += m.name
        else:
            text = self.type_text(tid, m.name, sconf)
        if place.bitfield_size:
            text += f":{place.bitfield_size}"
        align_text = ""
        if place.alignment:
            align_text = f" __attribute__((__aligned__({place.alignment})))"
            text += align_text
        text += ";"
        if is_tagged and t.name is None:
            if not sconf.suppress_offset_comment:
                slen = len(align_text) + (len(m.name) if m.name else -1)
                if self.facts.is_struct(tid) and self.holes.infer_packed(tid):
                    # pahole counts the attribute with its C string terminator
                    slen += len("__attribute__((__packed__))") + 1
                width = sconf.type_spacing + sconf.name_spacing - slen - 3
                text += _pad_field(width) + self._offset_comment(place, offset)
        else:
            if not sconf.suppress_offset_comment:
                width = sconf.type_spacing + sconf.name_spacing - len(text)
                text += _pad_field(max(width, 0)) + self._offset_comment(place, offset)
        return marker + text

    @staticmethod
    def _offset_comment(place: MemberPlace, offset: int) -> str:
        if place.bitfield_size:
            return f"/* {offset:5d}:{place.bitfield_offset:2d} {place.byte_size:2d} */"
        return f"/* {offset:5d} {place.byte_size:5d} */"

    # ---------------------------------------------------------------- structs

    def print_top(self, tid: TypeId) -> str:
        t = self.g[tid]
        if not isinstance(t, CompositeType):
            raise TypeError(f"type {tid} is not a struct or union")
        if t.kind == "union":
            return self.union_text(tid, _Conf(name_spacing=UNION_NAME_SPACING))
        self.holes.of(tid)
        return self.class_text(tid, _Conf())

    def class_text(self, tid: TypeId, conf: _Conf) -> str:
        """A struct, its members and (at the top) pahole's summary comment."""
        t: CompositeType = self.g[tid]
        out = ["struct" + (f" {t.name}" if t.name else "") + " {\n"]
        indent = min(conf.indent, len(_TABS))
        cconf = replace(conf, indent=indent + 1)
        if cconf.cacheline is None:
            cconf.cacheline = [0]
        tabs = _TABS[:cconf.indent]
        is_packed = self.holes.infer_packed(tid)
        info = self.holes.of(tid)
        notes = _CommentRun(out)
        sum_bytes = sum_bits = sum_holes = sum_bit_holes = 0
        nr_paddings = sum_paddings = 0
        nr_forced = nr_forced_holes = sum_forced_holes = 0
        if info.pre_bit_hole > 0:
            notes.add(f"{tabs}{hole_comment(info.pre_bit_hole, 'bit')}\n")
            sum_bit_holes += info.pre_bit_hole
        if info.pre_hole > 0:
            notes.add(f"{tabs}{hole_comment(info.pre_hole, 'byte')}\n")
            sum_holes += info.pre_hole
        last: Optional[MemberPlace] = None
        last_size = 0
        for i, pos in enumerate(info.places):
            m = pos.member
            if pos.alignment:
                forced_hole = last.hole if last is not None else info.pre_hole
                if forced_hole:
                    nr_forced_holes += 1
                    sum_forced_holes += forced_hole
                nr_forced += 1
            if last is not None and last_size != 0:
                if last.bit_hole != 0 and pos.bitfield_size:
                    filler = last.bit_hole
                    if last.byte_offset != pos.byte_offset:
                        out.append(f"\n{tabs}/* Force alignment to the next boundary: */\n")
                        filler = 0
                    out.append(tabs + self.type_text(m.type, "", cconf) + f":{filler};\n")
                if pos.byte_offset < last.byte_offset or (
                        pos.byte_offset == last.byte_offset and last.bitfield_size == 0
                        and pos.bitfield_size != 0):
                    notes.add(f"{tabs}/* Bitfield combined with previous fields */\n")
                else:
                    step = pos.byte_offset - last.byte_offset
                    if 0 < step < last_size:
                        notes.add(f"{tabs}/* Bitfield combined with next fields */\n")
            notes.close()
            cconf.last_member = i == len(info.places) - 1
            cconf.first_member = last is None
            out.append(tabs + self.member_text(pos, False, cconf))
            if self.facts.is_struct(m.type):
                self.holes.infer_packed(m.type)
                padding = self.holes.of(m.type).padding
                if padding > 0:
                    nr_paddings += 1
                    sum_paddings += padding
                    notes.add(f"\n{tabs}/* XXX last struct has {padding} "
                              f"byte{_plural(padding)} of padding */")
            if pos.bit_hole != 0:
                notes.add(f"\n{tabs}{hole_comment(pos.bit_hole, 'bit')}")
                sum_bit_holes += pos.bit_hole
            if pos.hole > 0:
                notes.add(f"\n{tabs}{hole_comment(pos.hole, 'byte')}")
                sum_holes += pos.hole
            out.append("\n")
            if pos.bitfield_size:
                sum_bits += pos.bitfield_size
            else:
                sum_bytes += pos.byte_size
            if last is None or last_size == 0 or last.byte_offset != pos.byte_offset:
                last_size = pos.byte_size
            elif last.bitfield_size == 0 and pos.bitfield_size != 0:
                last_size = pos.byte_size
            last = pos

        if info.padding != 0 and info.alignment == 0 and not self.holes.btf and last is not None:
            size = self.facts.size(last.member.type)
            if size and size & (size - 1) == 0 and info.padding > self.facts.pointer_size:
                out.append(f"\n{tabs}/* Force padding: */\n")
                filler = tabs + self.type_text(last.member.type, "", cconf) + f":{size * 8};\n"
                out.extend(filler for _ in range(0, info.padding, size))

        if cconf.emit_stats:
            out.append(self._stats(t, info, cconf, sum_bytes, sum_bits, sum_holes,
                                   sum_bit_holes, nr_paddings, sum_paddings, nr_forced,
                                   nr_forced_holes, sum_forced_holes))
        out.append(_TABS[:indent] + "}")
        if is_packed:
            out.append(" __attribute__((__packed__))")
        if cconf.suffix:
            out.append(f" {cconf.suffix}")
        if info.alignment and not is_packed:
            out.append(f" __attribute__((__aligned__({info.alignment})))")
        return "".join(out)

    def _stats(self, t: CompositeType, info: StructHoles, cconf: _Conf, sum_bytes: int,
               sum_bits: int, sum_holes: int, sum_bit_holes: int, nr_paddings: int,
               sum_paddings: int, nr_forced: int, nr_forced_holes: int,
               sum_forced_holes: int) -> str:
        tabs = _TABS[:cconf.indent]
        cachelines = (t.size + self.facts.cacheline_size - 1) // self.facts.cacheline_size
        out = [f"\n{tabs}/* size: {t.size}, cachelines: {cachelines}, "
               f"members: {len(t.members)} */\n"]
        if sum_holes > 0 or sum_bit_holes > 0:
            if sum_bytes > 0:
                line = f"{tabs}/* sum members: {sum_bytes}"
                if sum_holes > 0:
                    line += f", holes: {info.nr_holes}, sum holes: {sum_holes}"
                out.append(line + " */\n")
            if sum_bits > 0:
                line = f"{tabs}/* sum bitfield members: {sum_bits} bits"
                if sum_bit_holes > 0:
                    line += (f", bit holes: {info.nr_bit_holes}, "
                             f"sum bit holes: {sum_bit_holes} bits")
                else:
                    line += f" ({sum_bits // 8} bytes)"
                out.append(line + " */\n")
        if info.padding > 0:
            out.append(f"{tabs}/* padding: {info.padding} */\n")
        if nr_paddings > 0:
            out.append(f"{tabs}/* paddings: {nr_paddings}, sum paddings: {sum_paddings} */\n")
        if info.bit_padding > 0:
            out.append(f"{tabs}/* bit_padding: {info.bit_padding} bits */\n")
        if nr_forced:
            line = f"{tabs}/* forced alignments: {nr_forced}"
            if nr_forced_holes:
                line += (f", forced holes: {nr_forced_holes}, "
                         f"sum forced holes: {sum_forced_holes}")
            out.append(line + " */\n")
        last_line = (cconf.base_offset + t.size) % self.facts.cacheline_size
        if last_line:
            out.append(f"{tabs}/* last cacheline: {last_line} bytes */\n")
        diff = t.size * 8 - (sum_bytes * 8 + sum_bits + sum_holes * 8 + sum_bit_holes
                             + info.padding * 8 + info.bit_padding)
        if diff and t.members:
            out.append(f"\n{tabs}/* BRAIN FART ALERT! {t.size} bytes != {sum_bytes} "
                       f"(member bytes) + {sum_bits} (member bits) + {sum_holes} (byte holes)"
                       f" + {sum_bit_holes} (bit holes), diff = {diff} bits */\n")
        return "".join(out)

    def union_text(self, tid: TypeId, conf: _Conf) -> str:
        """A union and its members (pahole prints no summary for unions)."""
        t: CompositeType = self.g[tid]
        indent = min(conf.indent, len(_TABS))
        out = ["union" + (f" {t.name}" if t.name else "") + " {\n"]
        uconf = replace(conf, indent=indent + 1)
        self.holes.infer_union_packed(tid)
        if uconf.cacheline is None:
            uconf.cacheline = [0]
        initial = uconf.cacheline[0]
        for place in self.holes.of(tid).places:
            uconf.union_member = True
            out.append(_TABS[:uconf.indent] + self.member_text(place, True, uconf) + "\n")
            uconf.cacheline[0] = initial
        out.append(_TABS[:indent] + "}" + (f" {conf.suffix}" if conf.suffix else ""))
        return "".join(out)