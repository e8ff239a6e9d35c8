"""What pahole works out about a struct or union before printing it (`ctracer.plan.pahole`).

Two parts, each one pass over the `TypeGraph`:

* the walk (`TypeFacts`): the size pahole gives each type, the natural alignment it
  guesses from the members, and each member's place (`MemberPlace`: a bitfield sits at
  the offset of its storage unit);
* the hole search (`HoleSearch`): per member the byte and bit hole after it, the
  struct's padding and bit padding (`StructHoles`), the ``__aligned__`` attributes pahole
  guesses for BTF (which records no alignment) and the ``__packed__`` it infers.

Reimplemented from how dwarves' printer works (not copied); tests/corpus checks the
printed text against pahole 1.24's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, EnumType, Member,
                                     PointerType, TypeGraph, TypeId)


@dataclass
class MemberPlace:
    """One member as pahole sees it: a bitfield's offset is that of its storage unit."""

    member: Member
    byte_offset: int
    byte_size: int
    bitfield_offset: int
    bitfield_size: int
    alignment: int = 0  # explicit (DWARF) or inferred (BTF) __aligned__ of the member
    hole: int = 0
    bit_hole: int = 0

    @property
    def bit_size(self) -> int:
        """Bits of the member's storage unit."""
        return self.byte_size * 8


@dataclass
class StructHoles:
    """Holes and padding of one struct, and whether pahole thinks it is packed."""

    places: list[MemberPlace]
    pre_hole: int = 0
    pre_bit_hole: int = 0
    nr_holes: int = 0
    nr_bit_holes: int = 0
    padding: int = 0
    bit_padding: int = 0
    alignment: int = 0  # of the type itself, explicit (DWARF) or inferred (BTF)
    is_packed: bool = False
    packed_inferred: bool = False




class TypeFacts:
    """The walk over the types: sizes, natural alignments and members' places."""

    def __init__(self, graph: TypeGraph, cacheline_size: int, pointer_size: int):
        self.g = graph
        self.cacheline_size = cacheline_size
        self.pointer_size = pointer_size
        self._natural: dict[TypeId, int] = {}

    def type_of(self, tid: Optional[TypeId]):
        """The type ``tid`` names (None for void)."""
        return None if tid is None else self.g[tid]

    def strip(self, tid: Optional[TypeId]) -> Optional[TypeId]:
        """``tid`` without its typedefs and qualifiers."""
        return self.g.strip(tid)

    def size(self, tid: Optional[TypeId]) -> int:
        """Bytes of a type as pahole counts them (a pointer without a size: the target's)."""
        tid = self.strip(tid)
        if tid is None:
            return 0
        t = self.g[tid]
        if isinstance(t, PointerType):
            return t.size or self.pointer_size
        if isinstance(t, ArrayType):
            n = 1
            for d in t.dims:
                n *= d or 0
            return n * self.size(t.element)
        if isinstance(t, (BaseType, CompositeType, EnumType)):
            return t.size
        return 0

    def is_struct(self, tid: Optional[TypeId]) -> bool:
        """Whether ``tid`` is a struct (not a union)."""
        t = self.type_of(tid)
        return isinstance(t, CompositeType) and t.kind == "struct"

    def natural_alignment(self, tid: Optional[TypeId]) -> int:
        """pahole's guess at a type's alignment from its members (never below 1)."""
        t = self.type_of(tid)
        if isinstance(t, PointerType):
            align = self.pointer_size
        elif isinstance(t, (BaseType, EnumType)):
            align = t.size
        elif isinstance(t, CompositeType):
            align = self._composite_natural_alignment(tid)
        elif isinstance(t, ArrayType):
            align = self.natural_alignment(self.strip(t.element))
        else:
            align = 1
        return align or 1

    def _composite_natural_alignment(self, tid: TypeId) -> int:
        if tid in self._natural:
            return self._natural[tid]
        self._natural[tid] = 0  # a self-reference through members cannot happen in C
        best = 0
        for m in self.g[tid].members:
            best = max(best, self.natural_alignment(self.strip(m.type)))
        self._natural[tid] = best
        return best

    # ---------------------------------------------------------------- holes

    def member_places(self, t: CompositeType) -> list[MemberPlace]:
        """Each member's place, a bitfield at the offset of its storage unit."""
        places = []
        for m in t.members:
            if m.bit_size:
                byte_size = self.size(m.type)
                bit_size = byte_size * 8
                if bit_size:
                    byte_offset = m.bit_offset // bit_size * bit_size // 8
                else:
                    byte_offset = m.bit_offset // 8
                places.append(MemberPlace(m, byte_offset, byte_size,
                                          m.bit_offset - byte_offset * 8, m.bit_size,
                                          m.alignment))
            else:
                places.append(MemberPlace(m, m.bit_offset // 8, self.size(m.type), 0, 0,
                                          m.alignment))
        return places


class HoleSearch:
    """pahole's hole search and packing inference, once per struct (cached)."""

    def __init__(self, facts: TypeFacts, btf: bool):
        self.facts = facts
        self.btf = btf
        self._holes: dict[TypeId, StructHoles] = {}
        self._union_packed_done: set[TypeId] = set()

    def of(self, tid: TypeId) -> StructHoles:
        """pahole's hole search: per-member byte and bit holes, padding, bit padding."""
        found = self._holes.get(tid)
        if found is not None:
            return found
        t = self.facts.g[tid]
        info = StructHoles(self.facts.member_places(t), alignment=t.alignment)
        self._holes[tid] = info
        if self.btf:
            self._infer_btf_alignments(tid, info)
        if t.kind != "struct":
            return info
        cur_bitfield_end = t.size * 8
        cur_bitfield_size = 0
        last_seen_bit = 0
        in_bitfield = False
        last: Optional[MemberPlace] = None
        for pos in info.places:
            bit_start = pos.member.bit_offset
            if pos.bitfield_size:
                bit_end = bit_start + pos.bitfield_size
            else:
                bit_end = bit_start + pos.byte_size * 8
            bit_holes = 0
            byte_holes = 0
            if in_bitfield:
                bitfield_end = min(bit_start, cur_bitfield_end)
                bit_holes = bitfield_end - last_seen_bit
                last_seen_bit = bitfield_end
            if pos.bitfield_size:
                aligned_start = pos.byte_offset * 8
                if last_seen_bit < aligned_start <= bit_start:
                    byte_holes = pos.byte_offset - last_seen_bit // 8
                    last_seen_bit = aligned_start
                bit_holes += bit_start - last_seen_bit
            else:
                byte_holes = bit_start // 8 - last_seen_bit // 8
            last_seen_bit = bit_end
            if pos.bitfield_size:
                in_bitfield = True
                if bit_end > cur_bitfield_end or pos.bit_size > cur_bitfield_size:
                    cur_bitfield_size = pos.bit_size
                    cur_bitfield_end = pos.byte_offset * 8 + cur_bitfield_size
                    if bit_end > cur_bitfield_end:
                        cur_bitfield_end += cur_bitfield_size
            else:
                in_bitfield = False
                cur_bitfield_size = 0
                cur_bitfield_end = bit_end
            if last is not None:
                last.hole = byte_holes
                last.bit_hole = bit_holes
            else:
                info.pre_hole = byte_holes
                info.pre_bit_hole = bit_holes
            if bit_holes:
                info.nr_bit_holes += 1
            if byte_holes:
                info.nr_holes += 1
            last = pos
        if in_bitfield:
            bitfield_end = min(t.size * 8, cur_bitfield_end)
            info.bit_padding = bitfield_end - last_seen_bit
            last_seen_bit = bitfield_end
        info.padding = t.size - last_seen_bit // 8
        return info

    def _mark_packed(self, tid: TypeId) -> None:
        info = self.of(tid)
        info.is_packed = True
        info.packed_inferred = True

    def _check_structs_at_unnatural_alignments(self, info: StructHoles) -> None:
        for pos in info.places:
            mtid = self.facts.strip(pos.member.type)
            if not self.facts.is_struct(mtid):
                continue
            if pos.byte_offset % self.facts.natural_alignment(mtid) != 0:
                self._mark_packed(mtid)

    def infer_packed(self, tid: TypeId) -> bool:
        """Whether pahole prints ``__attribute__((__packed__))`` after this struct."""
        t = self.facts.g[tid]
        if t.kind != "struct":
            return False
        info = self.of(tid)
        if info.packed_inferred:
            return info.is_packed
        info.packed_inferred = True
        if info.padding != 0 or info.nr_holes != 0:
            self._check_structs_at_unnatural_alignments(info)
            info.is_packed = False
            return False
        max_natural = 1
        for pos in info.places:
            natural = self.facts.natural_alignment(self.facts.strip(pos.member.type))
            if natural == 1:
                continue
            max_natural = max(max_natural, natural)
            if pos.byte_offset % natural != 0:
                info.is_packed = True
                return True
        if (max_natural != 1 and info.alignment == 1) or t.size % max_natural != 0:
            info.is_packed = True
        return info.is_packed

    def infer_union_packed(self, tid: TypeId) -> None:
        """Mark packed the structs in union ``tid`` whose alignment its size does not
        divide (pahole's rule for unions)."""
        if tid in self._union_packed_done:
            return
        self._union_packed_done.add(tid)
        size = self.facts.g[tid].size
        for m in self.facts.g[tid].members:
            mtid = self.facts.strip(m.type)
            if self.facts.is_struct(mtid) and size % self.facts.natural_alignment(mtid) != 0:
                self._mark_packed(mtid)

    # ---------------------------------------------------------------- type names

    def _infer_btf_alignments(self, tid: TypeId, info: StructHoles) -> None:
        """BTF records no alignment; pahole guesses ``__aligned__`` attributes from gaps
        that natural alignment does not explain (its BTF loader does this for every
        struct and union).  Explicit values in the model, if any, are ignored, as pahole
        never sees them in BTF."""
        smallest = 0
        for pos in info.places:
            pos.alignment = 0
            if pos.member.type is None or pos.byte_size == 0:
                continue
            natural = self.facts.natural_alignment(self.facts.strip(pos.member.type))
            pos.alignment = self._guess_alignment(pos.byte_offset, natural, smallest)
            smallest = pos.byte_offset + pos.byte_size
        natural = self.facts.natural_alignment(tid)
        info.alignment = self._guess_alignment(self.facts.g[tid].size, natural, smallest)

    def _guess_alignment(self, byte_offset: int, natural: int, smallest: int) -> int:
        delta = (byte_offset - smallest) & 0xFFFFFFFF
        alignment = 0
        if delta and byte_offset % 2 == 0:
            # the power of two above delta; a shift by 32 wraps to 1 on x86
            alignment = 1 << (delta.bit_length() & 31)
        if alignment <= natural or alignment == 1:
            return 0
        line = self.facts.cacheline_size
        if alignment < line and line % alignment == 0 and byte_offset % line == 0:
            return line
        return alignment
