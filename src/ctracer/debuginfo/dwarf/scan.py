"""A fast DIE scanner over raw DWARF bytes (never imports pyelftools).

Per compile unit, each abbreviation is compiled once into a `Plan`: the attributes its
tag needs, grouped in runs of fixed-size attributes read with one `struct.unpack_from`,
separated by the variable-size ones (inline strings, LEB128s, blocks), plus where its
DW_AT_sibling and DW_AT_name sit.  Most DIEs then cost one table lookup and an add or an
unpack: subtrees that are not needed are jumped over with DW_AT_sibling (or walked, size
by size, when the producer left it out), and types are decoded only when a shape needs
them.  `UnitScanner` fills the same `ctracer.debuginfo.dwarf.units.UnitTables` as the pyelftools
walk in `ctracer.debuginfo.dwarf.reader`, and `scan_units` spreads the units over forked processes that
share the mapped file.
"""

from __future__ import annotations

import functools
import struct as _struct
from dataclasses import dataclass, field
from typing import Optional

from ctracer.debuginfo.dwarf.units import (COMPOSITE_TAGS, TAG_ARRAY, TAG_CLASS, TAG_COMPILE_UNIT,
                                 TAG_ENUMERATION, TAG_FORMAL_PARAMETER, TAG_MEMBER,
                                 TAG_NAMESPACE, TAG_STRUCTURE, TAG_SUBPROGRAM, TAG_SUBRANGE,
                                 TAG_SUBROUTINE_TYPE, TAG_TYPEDEF, TAG_UNION,
                                 TAG_UNSPECIFIED_PARAMETERS,
                                 TRACEPOINT_TYPEDEF_PREFIX, TYPE_TAGS, UNRESOLVED,
                                 ShapeResolver,
                                 Subprogram, UnitTables, unit_function, member_bit_offset,
                                 plus_uconst,
                                 summarize_unit)

AT_SIBLING = 0x01
AT_NAME = 0x03
AT_BYTE_SIZE = 0x0B
AT_BIT_OFFSET = 0x0C
AT_BIT_SIZE = 0x0D
AT_STMT_LIST = 0x10
AT_LOW_PC = 0x11
AT_COMP_DIR = 0x1B
AT_INLINE = 0x20
AT_LOWER_BOUND = 0x22
AT_UPPER_BOUND = 0x2F
AT_ABSTRACT_ORIGIN = 0x31
AT_COUNT = 0x37
AT_DATA_MEMBER_LOCATION = 0x38
AT_DECL_FILE = 0x3A
AT_DECL_LINE = 0x3B
AT_DECLARATION = 0x3C
AT_EXTERNAL = 0x3F
AT_SPECIFICATION = 0x47
AT_TYPE = 0x49
AT_ENTRY_PC = 0x52
AT_RANGES = 0x55
AT_DATA_BIT_OFFSET = 0x6B
AT_LINKAGE_NAME = 0x6E
AT_STR_OFFSETS_BASE = 0x72
AT_ADDR_BASE = 0x73
AT_MIPS_LINKAGE_NAME = 0x2007

_TYPE_ATTRS = frozenset({AT_SIBLING, AT_NAME, AT_TYPE, AT_BYTE_SIZE, AT_DECLARATION})
_SUBPROGRAM_ATTRS = frozenset({
    AT_SIBLING, AT_NAME, AT_LINKAGE_NAME, AT_MIPS_LINKAGE_NAME, AT_TYPE, AT_EXTERNAL,
    AT_INLINE, AT_DECLARATION, AT_ABSTRACT_ORIGIN, AT_SPECIFICATION, AT_LOW_PC,
    AT_ENTRY_PC, AT_RANGES, AT_DECL_FILE, AT_DECL_LINE})
#: attributes worth decoding, per tag; any other tag gets only DW_AT_sibling
WANTED = {
    TAG_COMPILE_UNIT: frozenset({AT_NAME, AT_COMP_DIR, AT_STMT_LIST, AT_LOW_PC,
                                 AT_STR_OFFSETS_BASE, AT_ADDR_BASE}),
    TAG_SUBPROGRAM: _SUBPROGRAM_ATTRS,
    TAG_FORMAL_PARAMETER: frozenset({AT_NAME, AT_TYPE}),
    TAG_MEMBER: frozenset({AT_NAME, AT_TYPE, AT_DATA_MEMBER_LOCATION, AT_DATA_BIT_OFFSET,
                           AT_BIT_OFFSET, AT_BIT_SIZE, AT_BYTE_SIZE}),
    TAG_SUBRANGE: frozenset({AT_COUNT, AT_UPPER_BOUND, AT_LOWER_BOUND, AT_TYPE}),
    **{tag: _TYPE_ATTRS for tag in TYPE_TAGS},
}
_SIBLING_ONLY = frozenset({AT_SIBLING})
#: attributes whose DW_FORM_dataN value is signed
_SIGNED_ATTRS = frozenset({AT_BIT_OFFSET})


class UnsupportedDwarf(Exception):
    """Something the raw scanner does not read (the caller falls back to pyelftools)."""


# value conversions applied after unpacking a fixed-size attribute
_RAW, _REF, _STRP, _LINE_STRP, _STRX, _ADDRX, _FLAG, _SIGNATURE = range(8)


@functools.lru_cache(maxsize=None)
def _form_table(offset_size: int, addr_size: int, version: int) -> dict:
    """Fixed-size forms → (struct code, conversion); "" is a form with no bytes in the
    DIE (flag_present).  Forms missing here are variable-size."""
    o = "I" if offset_size == 4 else "Q"
    a = {1: "B", 2: "H", 4: "I", 8: "Q"}[addr_size]
    return {
        0x01: (a, _RAW), 0x05: ("H", _RAW), 0x06: ("I", _RAW), 0x07: ("Q", _RAW),
        0x0B: ("B", _RAW), 0x0C: ("B", _FLAG), 0x0E: (o, _STRP),
        0x10: (o if version >= 3 else a, _RAW), 0x11: ("B", _REF), 0x12: ("H", _REF),
        0x13: ("I", _REF), 0x14: ("Q", _REF), 0x17: (o, _RAW), 0x19: ("", _FLAG),
        0x1E: ("16x", _RAW), 0x1F: (o, _LINE_STRP), 0x20: ("Q", _SIGNATURE),
        0x25: ("B", _STRX), 0x26: ("H", _STRX), 0x27: ("3s", _STRX), 0x28: ("I", _STRX),
        0x29: ("B", _ADDRX), 0x2A: ("H", _ADDRX), 0x2B: ("3s", _ADDRX), 0x2C: ("I", _ADDRX),
        # not here, so that the scanner declines them: references and strings in a
        # supplementary file (DW_FORM_ref_sup4/8, strp_sup, GNU_ref_alt, GNU_strp_alt)
    }


_VARIABLE_FORMS = {0x03, 0x04, 0x08, 0x09, 0x0A, 0x0D, 0x0F, 0x15, 0x18, 0x1A, 0x1B,
                   0x22, 0x23, 0x1F01, 0x1F02}
#: the forms a DW_AT_name may have: string, strp, strx, strp_sup, line_strp, strx1-4,
#: GNU_str_index, GNU_strp_alt
_STRING_FORMS = frozenset({0x08, 0x0E, 0x1A, 0x1D, 0x1F, 0x25, 0x26, 0x27, 0x28, 0x1F02,
                           0x1F21})
_PAD = {"B": "x", "H": "2x", "I": "4x", "Q": "8x", "3s": "3x", "16x": "16x"}


def backward_sibling(target: int, here: int) -> ValueError:
    """A DW_AT_sibling that does not lead forward: damage a walk would loop on."""
    return ValueError(f"DW_AT_sibling leads back (to {target:#x} from {here:#x})")


class Plan:
    """How to read one abbreviation's DIEs: its tag, whether it has children, a fixed
    total size when every form is fixed, and the runs that decode wanted attributes.

    A run is ``(Struct, attrs, conversions, variable)``: the Struct unpacks the wanted
    fixed-size attributes (others are padding) into ``attrs``; ``conversions`` lists
    ``(attr, how)`` for values that are not plain numbers (references, strings);
    ``variable`` is the variable-size ``(attr or None, form)`` ending the run."""

    __slots__ = ("tag", "children", "fixed_size", "runs", "consts", "skip_runs",
                 "sibling_at", "name_at", "has_name", "declaration", "step", "kind",
                 "sibling_ref", "name_strp")

    def __init__(self, tag: int, children: bool, attrs: tuple, fmt: tuple):
        self.tag = tag
        self.children = children
        wanted = WANTED.get(tag, _SIBLING_ONLY)
        table = _form_table(*fmt[:3])
        self.consts = tuple((at, True if form == 0x19 else value) for at, form, value in attrs
                            if at in wanted and (form == 0x21 or form == 0x19))
        self.runs = _compile_runs(attrs, wanted, table, fmt[3])
        self.skip_runs = _compile_runs(attrs, frozenset(), table, fmt[3])
        sizes = [r[0].size for r in self.skip_runs if r[3] is None]
        self.fixed_size = sum(sizes) if len(sizes) == len(self.skip_runs) else None
        self.sibling_at = _locate(attrs, table, fmt[3], AT_SIBLING)
        if self.sibling_at is not None and self.sibling_at[3] != _REF:
            self.sibling_at = None
        self.name_at = _locate(attrs, table, fmt[3], AT_NAME)
        self.has_name = any(at == AT_NAME for at, _f, _v in attrs)
        for at, form, _v in attrs:
            if at == AT_NAME and form not in _STRING_FORMS:
                raise ValueError(f"DW_AT_name of form {form:#x}, not a string: the "
                                 "abbreviation table is damaged")
        self.declaration = any(at == AT_DECLARATION and form == 0x19 for at, form, _v in attrs)
        #: bytes to the next DIE when that is all there is to know (fixed size, no children)
        self.step = self.fixed_size if not children else None
        #: what a unit's top level does with such a DIE: skip it, look at its name first
        #: (struct/union: summarized already? typedef: a tracepoint?), or decode it
        self.kind = _TOP_LEVEL.get(tag, _SKIP)
        #: the common cases of both, at a fixed position in the first run: (offset, Struct)
        self.sibling_ref = self.sibling_at[1:3] if self.sibling_at and not self.sibling_at[0] \
            else None
        self.name_strp = self.name_at[1:3] if self.name_at and not self.name_at[0] \
            and self.name_at[3] == _STRP else None


def _locate(attrs: tuple, table: dict, big_endian: bool, wanted: int):
    """Where an attribute sits, to read it without decoding the DIE:
    ``(runs before it, byte offset in its run, Struct or None, conversion or form)``
    — the Struct is None for an inline string; None when it cannot be located so."""
    runs, offset = 0, 0
    for at, form, _value in attrs:
        if form in (0x21, 0x19):  # no bytes in the DIE
            if at == wanted:
                return None
            continue
        fixed = table.get(form)
        if at == wanted:
            if fixed is None:
                return (runs, offset, None, form) if form == 0x08 else None
            code, conv = fixed
            if code in ("", "16x"):
                return None
            return (runs, offset, _struct_of((">" if big_endian else "<") + code), conv)
        if fixed is None:
            runs, offset = runs + 1, 0
        elif fixed[0]:
            offset += _struct_of("<" + fixed[0]).size
    return None


_SKIP, _COMPOSITE, _TYPEDEF, _DECODE = range(4)
_TOP_LEVEL = {TAG_STRUCTURE: _COMPOSITE, TAG_CLASS: _COMPOSITE, TAG_UNION: _COMPOSITE,
              TAG_TYPEDEF: _TYPEDEF, TAG_SUBPROGRAM: _DECODE, TAG_NAMESPACE: _DECODE}

_plan_cache: dict = {}


def plan_for(tag: int, children: bool, attrs: tuple, fmt: tuple) -> Plan:
    """Plans are shared by every unit whose abbreviation reads the same."""
    key = (tag, children, attrs, fmt)
    plan = _plan_cache.get(key)
    if plan is None:
        plan = _plan_cache[key] = Plan(tag, children, attrs, fmt)
    return plan


def _compile_runs(attrs: tuple, wanted, table: dict, big_endian: bool) -> tuple:
    runs, codes, ats, convs = [], [], [], []
    e = ">" if big_endian else "<"
    for at, form, _value in attrs:
        if form == 0x21 or form == 0x19:  # implicit_const, flag_present: no bytes
            continue
        fixed = table.get(form)
        if fixed is None:
            if form not in _VARIABLE_FORMS:
                raise UnsupportedDwarf(f"DW_FORM {form:#x}")
            runs.append((_struct_of(e + "".join(codes)), tuple(ats), tuple(convs),
                         (at if at in wanted else None, form)))
            codes, ats, convs = [], [], []
            continue
        code, conv = fixed
        if at not in wanted or code == "16x":
            codes.append(_PAD[code])
            continue
        if at in _SIGNED_ATTRS and conv == _RAW and code in "BHIQ":
            code = code.lower()
        codes.append(code)
        ats.append(at)
        if conv != _RAW:
            convs.append((at, conv))
    runs.append((_struct_of(e + "".join(codes)), tuple(ats), tuple(convs), None))
    return tuple(runs)


@functools.lru_cache(maxsize=None)
def _struct_of(fmt: str) -> _struct.Struct:
    return _struct.Struct(fmt)


@dataclass(slots=True)
class UnitFormat:
    """Where a unit sits in .debug_info and how it is encoded."""

    offset: int          # .debug_info offset of the unit header
    version: int
    offset_size: int
    addr_size: int
    abbrev_offset: int
    die_start: int       # .debug_info offset of the unit DIE
    end: int             # .debug_info offset just past the unit
    big_endian: bool
    unit_type: int = 1   # DW_UT_compile; 2 and 6 are type units


@dataclass
class Sections:
    """Raw DWARF section bytes: each as (buffer, base) so that a mapped whole file and
    relocated copies of single sections both work."""

    info: tuple
    abbrev: tuple
    str: tuple = (b"", 0)
    line_str: tuple = (b"", 0)
    str_offsets: tuple = (b"", 0)
    addr: tuple = (b"", 0)
    line: tuple = (b"", 0)
    rnglists: tuple = (b"", 0)
    ranges: tuple = (b"", 0)
    info_size: int = 0
    big_endian: bool = False


def read_uleb(buf, pos: int) -> tuple[int, int]:
    """The unsigned LEB128 at ``pos`` of ``buf`` and the position after it."""
    value = buf[pos]
    pos += 1
    if value < 0x80:
        return value, pos
    value &= 0x7F
    shift = 7
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def read_sleb(buf, pos: int) -> tuple[int, int]:
    """The signed LEB128 at ``pos`` of ``buf`` and the position after it."""
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            if byte & 0x40:
                value -= 1 << shift
            return value, pos


def list_units(sec: Sections) -> list[UnitFormat]:
    """Headers of every unit in .debug_info."""
    buf, base = sec.info
    e = ">" if sec.big_endian else "<"
    units, offset = [], 0
    while offset + 11 <= sec.info_size:
        at = base + offset
        length, = _struct.unpack_from(e + "I", buf, at)
        offset_size, at = (4, at + 4) if length < 0xFFFFFFF0 else (8, at + 12)
        if offset_size == 8:
            length, = _struct.unpack_from(e + "Q", buf, at - 8)
        end = (at - base) + length
        version, = _struct.unpack_from(e + "H", buf, at)
        o = "I" if offset_size == 4 else "Q"
        if version >= 5:
            unit_type, addr_size = buf[at + 2], buf[at + 3]
            abbrev, = _struct.unpack_from(e + o, buf, at + 4)
            die = at + 4 + offset_size
            if unit_type in (2, 6):     # type units: signature and type offset
                die += 8 + offset_size
            elif unit_type in (4, 5):   # skeleton / split units: dwo id
                die += 8
        else:
            abbrev, = _struct.unpack_from(e + o, buf, at + 2)
            addr_size = buf[at + 2 + offset_size]
            die = at + 3 + offset_size
        units.append(UnitFormat(offset, version, offset_size, addr_size, abbrev,
                                die - base, end, sec.big_endian,
                                unit_type if version >= 5 else 1))
        offset = end
    return units


def read_abbrevs(sec: Sections, unit: UnitFormat) -> dict[int, Plan]:
    """The unit's abbreviation table as plans, by code.

    A kernel has one table per unit, of hundreds of entries, nearly all of which other
    units declare byte for byte too: each entry is only measured (LEB128 values below
    128, nearly all, read inline) and looked up by its bytes; it is parsed into a plan
    the first time those bytes are seen."""
    buf, base = sec.abbrev
    pos = base + unit.abbrev_offset
    fmt = (unit.offset_size, unit.addr_size, unit.version, unit.big_endian)
    by_bytes = _plans_by_bytes.setdefault(fmt, {})
    plans = {}
    while True:
        code = buf[pos]
        if code < 0x80:
            pos += 1
        else:
            code, pos = read_uleb(buf, pos)
        if code == 0:
            return plans
        start = pos
        pos = _abbrev_end(buf, pos)
        key = buf[start:pos]
        plan = by_bytes.get(key)
        if plan is None:
            plan = by_bytes[key] = _parse_abbrev(buf, start, fmt)
        plans[code] = plan


_plans_by_bytes: dict = {}


def _abbrev_end(buf, pos: int) -> int:
    """Position after one abbreviation declaration (its code already read)."""
    while buf[pos] & 0x80:  # tag
        pos += 1
    pos += 2  # last tag byte, children flag
    while True:
        at = buf[pos]
        form = buf[pos + 1]
        if at < 0x80 and form < 0x80:
            pos += 2
            if at == 0 and form == 0:
                return pos
            if form == 0x21:  # implicit_const: a SLEB128 value follows
                while buf[pos] & 0x80:
                    pos += 1
                pos += 1
            continue
        at, pos = read_uleb(buf, pos)
        form, pos = read_uleb(buf, pos)
        if form == 0x21:
            _value, pos = read_sleb(buf, pos)


def _parse_abbrev(buf, pos: int, fmt: tuple) -> Plan:
    tag, pos = read_uleb(buf, pos)
    children = buf[pos] != 0
    pos += 1
    attrs = []
    while True:
        at, pos = read_uleb(buf, pos)
        form, pos = read_uleb(buf, pos)
        if at == 0 and form == 0:
            return plan_for(tag, children, tuple(attrs), fmt)
        value = None
        if form == 0x21:
            value, pos = read_sleb(buf, pos)
        attrs.append((at, form, value))


class UnitReader:
    """Decodes the DIEs of one unit from raw bytes with its compiled plans."""

    def __init__(self, sec: Sections, unit: UnitFormat, plans: dict, strings: dict):
        self.sec = sec
        self.unit = unit
        self.plans = plans
        self.strings = strings  # shared .debug_str offset → str memo
        self.buf, self.base = sec.info
        self.cu_pos = self.base + unit.offset  # buffer position of the unit header
        self.str_offsets_base = 8 if unit.version >= 5 else 0
        self.addr_base = 8 if unit.version >= 5 else 0

    # -- one DIE

    def decode(self, pos: int, plan: Plan) -> tuple[dict, int]:
        """(wanted attributes, position after the DIE's attributes)."""
        buf = self.buf
        values = dict(plan.consts) if plan.consts else {}
        for st, ats, convs, var in plan.runs:
            if ats:
                values.update(zip(ats, st.unpack_from(buf, pos)))
                for at, conv in convs:
                    values[at] = self._convert(conv, values[at])
            pos += st.size
            if var is not None:
                at, form = var
                if at is None:
                    pos = self._skip_variable(form, pos)
                else:
                    values[at], pos = self._variable(form, pos)
        return values, pos

    def skip(self, pos: int, plan: Plan) -> int:
        """Position after a DIE's attributes, decoding nothing."""
        if plan.fixed_size is not None:
            return pos + plan.fixed_size
        for st, _ats, _convs, var in plan.skip_runs:
            pos += st.size
            if var is not None:
                pos = self._skip_variable(var[1], pos)
        return pos

    def _convert(self, conv: int, v):
        if conv == _REF:
            return v + self.unit.offset
        if conv == _STRP:
            return self.string(v)
        if conv == _FLAG:
            return bool(v)
        if conv == _LINE_STRP:
            return _cstr(self.sec.line_str, v)
        if conv == _SIGNATURE:
            return UNRESOLVED  # a type in a type unit (-fdebug-types-section)
        if isinstance(v, bytes):  # 3-byte index
            v = int.from_bytes(v, "big" if self.unit.big_endian else "little")
        if conv == _STRX:
            return self._strx(v)
        if conv == _ADDRX:
            return self._addrx(v)
        return v

    def string(self, offset: int) -> str:
        s = self.strings.get(offset)
        if s is None:
            s = self.strings[offset] = _cstr(self.sec.str, offset)
        return s

    def _strx(self, index: int) -> str:
        buf, base = self.sec.str_offsets
        size = self.unit.offset_size
        at = base + self.str_offsets_base + index * size
        off = int.from_bytes(buf[at:at + size], "big" if self.unit.big_endian else "little")
        return self.string(off)

    def _addrx(self, index: int) -> int:
        buf, base = self.sec.addr
        size = self.unit.addr_size
        at = base + self.addr_base + index * size
        return int.from_bytes(buf[at:at + size], "big" if self.unit.big_endian else "little")

    def _variable(self, form: int, pos: int):
        buf = self.buf
        if form == 0x08:  # string
            end = buf.find(b"\0", pos)
            return bytes(buf[pos:end]).decode("utf-8", "replace"), end + 1
        if form in (0x0F, 0x1A, 0x1B, 0x22, 0x23, 0x1F01, 0x1F02):
            v, pos = read_uleb(buf, pos)
            if form in (0x1A, 0x1F02):
                return self._strx(v), pos
            if form in (0x1B, 0x1F01):
                return self._addrx(v), pos
            return v, pos
        if form == 0x15:  # ref_udata
            v, pos = read_uleb(buf, pos)
            return v + self.unit.offset, pos
        if form == 0x0D:
            return read_sleb(buf, pos)
        size, pos = self._block_size(form, pos)
        return bytes(buf[pos:pos + size]), pos + size

    def _skip_variable(self, form: int, pos: int) -> int:
        buf = self.buf
        if form == 0x08:
            return buf.find(b"\0", pos) + 1
        if form in (0x0D, 0x0F, 0x15, 0x1A, 0x1B, 0x22, 0x23, 0x1F01, 0x1F02):
            while buf[pos] & 0x80:
                pos += 1
            return pos + 1
        size, pos = self._block_size(form, pos)
        return pos + size

    def _block_size(self, form: int, pos: int) -> tuple[int, int]:
        buf = self.buf
        if form == 0x0A:
            return buf[pos], pos + 1
        if form == 0x03:
            return int.from_bytes(buf[pos:pos + 2], "big" if self.unit.big_endian else "little"), pos + 2
        if form == 0x04:
            return int.from_bytes(buf[pos:pos + 4], "big" if self.unit.big_endian else "little"), pos + 4
        return read_uleb(buf, pos)  # block, exprloc

    # -- trees

    def _advance(self, pos: int, plan: Plan, runs: int) -> int:
        """Position after the first ``runs`` runs of a DIE's attributes."""
        for st, _ats, _convs, var in plan.skip_runs[:runs]:
            pos = self._skip_variable(var[1], pos + st.size)
        return pos

    def jump(self, after: int, plan: Plan) -> int:
        """Position of the DIE after this one (attributes at ``after``) and its children,
        decoding as little as possible."""
        if not plan.children:
            return after + plan.fixed_size if plan.fixed_size is not None \
                else self.skip(after, plan)
        loc = plan.sibling_at
        if loc is not None:
            runs, offset, st, _conv = loc
            pos = self._advance(after, plan, runs) if runs else after
            sibling = self.cu_pos + st.unpack_from(self.buf, pos + offset)[0]
            if sibling <= after:
                raise backward_sibling(sibling, after)
            return sibling
        return self.skip_children(self.skip(after, plan))

    def peek_name(self, after: int, plan: Plan) -> Optional[str]:
        """DW_AT_name without decoding the DIE; None when it cannot be read so."""
        loc = plan.name_at
        if loc is None:
            return None
        runs, offset, st, conv = loc
        pos = (self._advance(after, plan, runs) if runs else after) + offset
        if st is None:  # inline string
            end = self.buf.find(b"\0", pos)
            return bytes(self.buf[pos:end]).decode("utf-8", "replace")
        if conv == _STRP:
            return self.string(st.unpack_from(self.buf, pos)[0])
        if conv in (_LINE_STRP, _STRX):
            return self._convert(conv, st.unpack_from(self.buf, pos)[0])
        return None

    def next_sibling(self, plan: Plan, values: dict, end: int) -> int:
        """Position of the DIE after this one and its children."""
        if not plan.children:
            return end
        sibling = values.get(AT_SIBLING)
        if sibling is not None:
            if self.base + sibling < end:
                raise backward_sibling(self.base + sibling, end)
            return self.base + sibling
        return self.skip_children(end)

    def skip_children(self, pos: int) -> int:
        """Walk a subtree DIE by DIE (no DW_AT_sibling to jump with)."""
        buf, plans = self.buf, self.plans
        depth = 1
        while depth:
            code = buf[pos]
            if code >= 0x80:
                code, pos = read_uleb(buf, pos)
            else:
                pos += 1
            if code == 0:
                depth -= 1
                continue
            plan = plans[code]
            pos = self.skip(pos, plan)
            if plan.children:
                depth += 1
        return pos

    def die_at(self, offset: int) -> tuple[Plan, dict, int]:
        """Decode the DIE at a .debug_info offset of this unit."""
        pos = self.base + offset
        code, pos = read_uleb(self.buf, pos)
        plan = self.plans[code]
        values, end = self.decode(pos, plan)
        return plan, values, end


def _cstr(section: tuple, offset: int) -> str:
    buf, base = section
    at = base + offset
    end = buf.find(b"\0", at)
    return bytes(buf[at:end]).decode("utf-8", "replace")


# ------------------------------------------------------------------ unit scan

TAG_PARTIAL_UNIT = 0x3C


class UnitScanner:
    """Fills `UnitTables` for one unit from raw bytes.

    The top level is walked DIE by DIE, but only subprograms (with their parameters),
    struct/union definitions not summarized by an earlier unit (with their members) and
    typedefs (for tracepoints) are decoded; every other DIE is jumped over.  Types are
    decoded later, on demand, when a shape or an anonymous member needs them
    (`ScannedTypes`): a unit references a small part of the types its headers declare."""

    def __init__(self, reader: UnitReader, known_structs: set, ranges=None, other=None):
        self.r = reader
        self.known = known_structs
        self.ranges = ranges  # callable(unit reader, DW_AT_ranges value, base) → entry
        #: callable(offset) → the `UnitScanner` of another unit holding that offset, for
        #: DW_FORM_ref_addr into it (partial units of dwz, link-time optimization)
        self.other = other
        self.tables = UnitTables(reader.unit.offset)
        self.tables.types = ScannedTypes(self)
        self.tables.load_composite = self.composite_at
        self.tables.load_params = self.load_params
        self.handlers = {TAG_SUBPROGRAM: self._subprogram, TAG_NAMESPACE: self._namespace,
                         TAG_STRUCTURE: self._composite, TAG_CLASS: self._composite,
                         TAG_UNION: self._composite, TAG_TYPEDEF: self._typedef}
        self.cu_low_pc = 0

    def scan(self) -> UnitTables:
        children = self.read_unit_die()
        if children is not None:
            self._children(children)
        return self.tables

    def read_unit_die(self) -> Optional[int]:
        """Read the unit DIE (name, bases, file names); the position of its children,
        None when it has none or is not a compile unit."""
        r = self.r
        pos = r.base + r.unit.die_start
        code, after = read_uleb(r.buf, pos)
        plan = r.plans.get(code)
        if plan is None or plan.tag not in (TAG_COMPILE_UNIT, TAG_PARTIAL_UNIT):
            return None  # type units and the like carry no functions
        values, end = r.decode(after, plan)
        if AT_STR_OFFSETS_BASE in values or AT_ADDR_BASE in values:
            r.str_offsets_base = values.get(AT_STR_OFFSETS_BASE, r.str_offsets_base)
            r.addr_base = values.get(AT_ADDR_BASE, r.addr_base)
            values, end = r.decode(after, plan)  # names given as strx need the base
        self.cu_low_pc = values.get(AT_LOW_PC) or 0
        self.tables.name = values.get(AT_NAME) or ""
        stmt_list = values.get(AT_STMT_LIST)
        if stmt_list is not None and r.sec.line[0]:
            self.tables.files = LineFiles(r.sec, stmt_list, r.unit, r.strings,
                                          values.get(AT_COMP_DIR) or "")
        return end if plan.children else None

    def subprogram_at(self, offset: int) -> Subprogram:
        """A subprogram DIE with its parameters, declaration or not."""
        plan, values, end = self.r.die_at(offset)
        values = dict(values)
        values.pop(AT_DECLARATION, None)
        self._subprogram(offset, plan, values, end)
        return self.tables.subprograms.pop()

    def _children(self, pos: int) -> int:
        """Handle the children starting at ``pos``; the position after their end.

        The hot loop of a kernel scan (millions of DIEs): most DIEs are skipped with a
        fixed step or their DW_AT_sibling; structs already summarized, declarations,
        anonymous ones (read on demand) and typedefs other than tracepoints are skipped
        after a look at their plan or name."""
        r, buf, plans, handlers = self.r, self.r.buf, self.r.plans, self.handlers
        known, strings, unit_pos = self.known, self.r.strings, self.r.cu_pos
        while True:
            code = buf[pos]
            if code >= 0x80:
                code, after = read_uleb(buf, pos)
            else:
                after = pos + 1
            if code == 0:
                return after
            plan = plans[code]
            kind = plan.kind
            if kind != _DECODE:
                if kind == _SKIP:
                    skip = True
                elif kind == _COMPOSITE and (not plan.has_name or plan.declaration):
                    skip = True
                else:
                    name_strp = plan.name_strp
                    if name_strp is not None:
                        offset = name_strp[1].unpack_from(buf, after + name_strp[0])[0]
                        name = strings.get(offset) or r.string(offset)
                    else:
                        name = r.peek_name(after, plan)
                    if name is None:
                        skip = False
                    elif kind == _COMPOSITE:
                        skip = (COMPOSITE_TAGS[plan.tag], name) in known
                    else:
                        skip = not name.startswith(TRACEPOINT_TYPEDEF_PREFIX)
                if skip:
                    step = plan.step
                    if step is not None:
                        pos = after + step
                    elif plan.sibling_ref is not None:
                        at, st = plan.sibling_ref
                        pos = unit_pos + st.unpack_from(buf, after + at)[0]
                        if pos <= after:
                            raise backward_sibling(pos, after)
                    else:
                        pos = r.jump(after, plan)
                    continue
            values, end = r.decode(after, plan)
            pos = handlers[plan.tag](pos - r.base, plan, values, end)
            if pos < end:
                raise backward_sibling(pos, end)

    def _namespace(self, offset, plan, values, end) -> int:
        return self._children(end) if plan.children else end

    # -- types

    def _typedef(self, offset: int, plan: Plan, values: dict, end: int) -> int:
        name = values.get(AT_NAME)
        if name and name.startswith(TRACEPOINT_TYPEDEF_PREFIX):
            self.tables.tracepoint_typedefs.append((name, offset))
        return self.r.next_sibling(plan, values, end)

    def _composite(self, offset: int, plan: Plan, values: dict, end: int) -> int:
        name = values.get(AT_NAME)
        if name is None or values.get(AT_DECLARATION) \
                or (COMPOSITE_TAGS[plan.tag], name) in self.known:
            return self.r.next_sibling(plan, values, end)
        members, nxt = self._members(end) if plan.children else ((), end)
        self.tables.composites[offset] = (plan.tag, name, values.get(AT_BYTE_SIZE) or 0,
                                          members)
        return nxt

    def composite_at(self, offset: int) -> Optional[tuple]:
        """A struct/union definition read on demand (anonymous members' types)."""
        if not self._in_unit(offset):
            other = self._owner_elsewhere(offset)
            return other.composite_at(offset) if other is not None else None
        plan, values, end = self.r.die_at(offset)
        if plan.tag not in COMPOSITE_TAGS or values.get(AT_DECLARATION):
            return None
        members = self._members(end)[0] if plan.children else ()
        found = (plan.tag, values.get(AT_NAME), values.get(AT_BYTE_SIZE) or 0, members)
        self.tables.composites[offset] = found
        return found

    def type_at(self, offset: int) -> Optional[tuple]:
        """``(tag, name, target, aux)`` of a type DIE, as `UnitTables.types` holds."""
        if not self._in_unit(offset):
            other = self._owner_elsewhere(offset)
            return other.type_at(offset) if other is not None else None
        plan, values, end = self.r.die_at(offset)
        tag = plan.tag
        if tag not in TYPE_TAGS:
            return None
        aux = None
        if tag in COMPOSITE_TAGS or tag == TAG_ENUMERATION:
            aux = bool(values.get(AT_DECLARATION))
        elif tag == TAG_ARRAY:
            aux = self._dims(end) if plan.children else ()
        elif tag == TAG_SUBROUTINE_TYPE:
            aux = self._prototype(end) if plan.children else ((), False)
        return (tag, values.get(AT_NAME), values.get(AT_TYPE), aux)

    def _members(self, pos: int) -> tuple[tuple, int]:
        r, buf, plans = self.r, self.r.buf, self.r.plans
        members = []
        while True:
            code, after = read_uleb(buf, pos)
            if code == 0:
                return tuple(members), after
            plan = plans[code]
            values, end = r.decode(after, plan)
            if plan.tag == TAG_MEMBER:
                members.append((values.get(AT_NAME), values.get(AT_TYPE),
                                self._bit_offset(values)))
            elif plan.tag in COMPOSITE_TAGS:  # a struct defined inside another one
                pos = self._composite(pos - r.base, plan, values, end)
                if pos < end:
                    raise backward_sibling(pos, end)
                continue
            pos = r.next_sibling(plan, values, end)

    def _bit_offset(self, values: dict) -> int:
        location = values.get(AT_DATA_MEMBER_LOCATION)
        if isinstance(location, bytes):
            location = plus_uconst(location)
        be_bit_offset = values.get(AT_BIT_OFFSET)
        storage = values.get(AT_BYTE_SIZE)
        type_size = 0
        if be_bit_offset is not None and storage is None:
            type_size = self._type_size(values.get(AT_TYPE))
        return member_bit_offset(location, values.get(AT_DATA_BIT_OFFSET), be_bit_offset,
                                 storage, values.get(AT_BIT_SIZE) or 0, type_size,
                                 self.r.unit.big_endian)

    def _type_size(self, offset: Optional[int]) -> int:
        for _ in range(64):
            if offset is None:
                return 0
            if not self._in_unit(offset):
                other = self._owner_elsewhere(offset)
                return other._type_size(offset) if other is not None else 0
            _plan, values, _end = self.r.die_at(offset)
            if values.get(AT_BYTE_SIZE) is not None:
                return values[AT_BYTE_SIZE]
            offset = values.get(AT_TYPE)
        return 0

    def _in_unit(self, offset: int) -> bool:
        return self.r.unit.die_start <= offset < self.r.unit.end

    def _owner_elsewhere(self, offset: int) -> Optional["UnitScanner"]:
        """The scanner of the other unit holding ``offset`` (None when unknown)."""
        return self.other(offset) if self.other is not None else None

    def _dims(self, pos: int) -> tuple:
        r, buf, plans = self.r, self.r.buf, self.r.plans
        dims = []
        while True:
            code, after = read_uleb(buf, pos)
            if code == 0:
                return tuple(dims)
            plan = plans[code]
            values, end = r.decode(after, plan)
            if plan.tag in (TAG_SUBRANGE, TAG_ENUMERATION):
                dims.append(_subrange_count(values))
            pos = r.next_sibling(plan, values, end)

    def _prototype(self, pos: int) -> tuple[tuple, bool]:
        r, buf, plans = self.r, self.r.buf, self.r.plans
        params, variadic = [], False
        while True:
            code, after = read_uleb(buf, pos)
            if code == 0:
                return tuple(params), variadic
            plan = plans[code]
            values, end = r.decode(after, plan)
            if plan.tag == TAG_FORMAL_PARAMETER:
                params.append(values.get(AT_TYPE))
            elif plan.tag == TAG_UNSPECIFIED_PARAMETERS:
                variadic = True
            pos = r.next_sibling(plan, values, end)

    # -- subprograms

    def _subprogram(self, offset: int, plan: Plan, values: dict, end: int) -> int:
        r = self.r
        if values.get(AT_DECLARATION):
            if values.get(AT_EXTERNAL) and AT_NAME in values:
                self.tables.declarations.append((values[AT_NAME], offset))
            return r.next_sibling(plan, values, end)
        sp = Subprogram(
            offset, name=values.get(AT_NAME),
            linkage_name=values.get(AT_LINKAGE_NAME) or values.get(AT_MIPS_LINKAGE_NAME),
            returns=values.get(AT_TYPE), external=bool(values.get(AT_EXTERNAL)),
            inline=values.get(AT_INLINE), abstract_origin=values.get(AT_ABSTRACT_ORIGIN),
            decl_file=values.get(AT_DECL_FILE), decl_line=values.get(AT_DECL_LINE))
        sp.low_pc = values.get(AT_LOW_PC)
        if sp.low_pc is None:
            sp.low_pc = values.get(AT_ENTRY_PC)
        if sp.low_pc is None and AT_RANGES in values:
            sp.has_ranges = True
            if self.ranges is not None:
                sp.low_pc = self.ranges(r, values[AT_RANGES], self.cu_low_pc)
        spec = values.get(AT_SPECIFICATION)
        if spec is not None and self._in_unit(spec):
            self._complete_from_declaration(sp, spec)
        self.tables.subprograms.append(sp)
        if not plan.children:
            return end
        if sp.abstract_origin is not None:  # a concrete copy: the abstract DIE has all
            return r.next_sibling(plan, values, end)
        if AT_SIBLING in values:  # read the parameters later, if the function is kept
            sp.params_at = end
            return r.base + values[AT_SIBLING]
        return self._parameters(sp, values, end)

    def load_params(self, sp: Subprogram) -> None:
        """The parameters of a function whose DIE was jumped over (GCC: they come first)."""
        self._parameters(sp, {AT_SIBLING: 0}, sp.params_at)
        sp.params_at = None

    def _complete_from_declaration(self, sp: Subprogram, spec: int) -> None:
        _plan, decl, _end = self.r.die_at(spec)
        sp.name = sp.name or decl.get(AT_NAME)
        sp.linkage_name = sp.linkage_name or decl.get(AT_LINKAGE_NAME) \
            or decl.get(AT_MIPS_LINKAGE_NAME)
        sp.external = sp.external or bool(decl.get(AT_EXTERNAL))
        if sp.returns is None:
            sp.returns = decl.get(AT_TYPE)
        if sp.decl_file is None:
            sp.decl_file, sp.decl_line = decl.get(AT_DECL_FILE), decl.get(AT_DECL_LINE)

    def _parameters(self, sp: Subprogram, sp_values: dict, pos: int) -> int:
        """Read the formal parameters, then jump past the body.

        GCC puts the parameters (and the ``...`` marker) first and gives the function a
        DW_AT_sibling, so the rest is jumped over.  Without DW_AT_sibling (clang) the body
        must be walked anyway, and clang may put the ``...`` marker after the locals:
        then every direct child is looked at."""
        r, buf, plans = self.r, self.r.buf, self.r.plans
        sibling = sp_values.get(AT_SIBLING)
        while True:
            code, after = read_uleb(buf, pos)
            if code == 0:
                return after
            plan = plans[code]
            if plan.tag == TAG_FORMAL_PARAMETER:
                values, end = r.decode(after, plan)
                sp.params.append((values.get(AT_NAME), values.get(AT_TYPE)))
            elif plan.tag == TAG_UNSPECIFIED_PARAMETERS:
                sp.variadic = True
                values, end = r.decode(after, plan)
            elif sibling is not None:
                return r.base + sibling
            else:
                end = r.skip(after, plan)
                pos = r.skip_children(end) if plan.children else end
                continue
            pos = r.next_sibling(plan, values, end)


class ScannedTypes:
    """`UnitTables.types` for the raw scanner: type DIEs decoded when first asked for."""

    __slots__ = ("scanner", "memo")

    def __init__(self, scanner: UnitScanner):
        self.scanner = scanner
        self.memo: dict = {}

    def get(self, offset, default=None):
        if offset is None:
            return default
        try:
            found = self.memo[offset]
        except KeyError:
            found = self.memo[offset] = self.scanner.type_at(offset)
        return default if found is None else found

    def __contains__(self, offset) -> bool:
        return self.get(offset) is not None

    def __getitem__(self, offset):
        found = self.get(offset)
        if found is None:
            raise KeyError(offset)
        return found


def _subrange_count(values: dict) -> Optional[int]:
    count = values.get(AT_COUNT)
    if isinstance(count, int):
        return count
    upper = values.get(AT_UPPER_BOUND)
    if not isinstance(upper, int):
        return None  # no bound (flexible array) or a computed one (VLA)
    if upper >= (1 << 63) or upper == 0xFFFFFFFF:
        return 0  # GCC's "-1" upper bound of a zero-length array
    return upper - (values.get(AT_LOWER_BOUND) or 0) + 1


# ------------------------------------------------------------------ line table files


class LineFiles:
    """decl_file index → path, from the header of a unit's line program, read when
    first asked and joined per file on demand (a unit declares hundreds of header files
    and its functions use a few).  ``memo`` keeps strings already decoded: units share
    most header paths."""

    def __init__(self, sec: Sections, stmt_list: int, unit: UnitFormat, memo: dict,
                 comp_dir: str):
        self.sec, self.stmt_list, self.unit, self.memo = sec, stmt_list, unit, memo
        self.comp_dir = comp_dir
        self.dirs: Optional[list] = None
        self.files: dict = {}   # index → (dir index, raw path)
        self.joined: dict = {}

    def get(self, index, default=None):
        found = self.joined.get(index)
        if found is not None:
            return found
        if self.dirs is None:
            try:
                self.dirs, self.files = self._read()
            except (IndexError, KeyError, ValueError, _struct.error):
                self.dirs, self.files = [], {}  # a damaged line table costs names only
        entry = self.files.get(index)
        if entry is None:
            return default
        d, raw = entry
        directory = self._text(self.dirs[d]) if 0 <= d < len(self.dirs) else ""
        name = self._text(raw)
        if directory and not name.startswith("/"):
            name = f"{directory}/{name}"
        found = self.joined[index] = name
        return found

    def _text(self, raw) -> str:
        if isinstance(raw, str):
            return raw
        found = self.memo.get(raw)
        if found is None:
            form, offset = raw
            found = self.memo[raw] = _cstr(self.sec.line_str if form == 0x1F else self.sec.str,
                                           offset)
        return found

    def _read(self) -> tuple[list, dict]:
        buf, base = self.sec.line
        e = ">" if self.unit.big_endian else "<"
        pos = base + self.stmt_list
        length, = _struct.unpack_from(e + "I", buf, pos)
        offset_size = 4
        pos += 4
        if length == 0xFFFFFFFF:
            offset_size, pos = 8, pos + 8
        version, = _struct.unpack_from(e + "H", buf, pos)
        pos += 2
        if version >= 5:
            pos += 2  # address_size, segment_selector_size
        pos += offset_size  # header_length
        pos += 4 if version >= 4 else 3  # min_inst_length, [max_ops], default_is_stmt, line_base
        pos += 1  # line_range
        pos += buf[pos]  # opcode_base itself, then standard_opcode_lengths
        if version >= 5:
            dirs, pos = _v5_entries(buf, pos, offset_size, e)
            files, pos = _v5_entries(buf, pos, offset_size, e)
            return [path for _d, path in dirs], dict(enumerate(files))
        return self._v4_entries(buf, pos)

    def _v4_entries(self, buf, pos: int) -> tuple[list, dict]:
        dirs = [self.comp_dir]
        while buf[pos]:
            end = buf.find(b"\0", pos)
            dirs.append(bytes(buf[pos:end]).decode("utf-8", "replace"))
            pos = end + 1
        pos += 1
        files, index = {}, 1
        while buf[pos]:
            end = buf.find(b"\0", pos)
            name = bytes(buf[pos:end]).decode("utf-8", "replace")
            pos = end + 1
            d, pos = read_uleb(buf, pos)
            _mtime, pos = read_uleb(buf, pos)
            _size, pos = read_uleb(buf, pos)
            files[index] = (d, name)
            index += 1
        return dirs, files


_LNCT_PATH, _LNCT_DIRECTORY_INDEX = 1, 2


def _v5_entries(buf, pos: int, offset_size: int, e: str) -> tuple[list, int]:
    """DWARF 5 directory or file entries as (directory index, raw path), where a raw
    path is a str (inline) or ``(form, offset)`` into a string section."""
    count = buf[pos]
    pos += 1
    formats = []
    for _ in range(count):
        content, pos = read_uleb(buf, pos)
        form, pos = read_uleb(buf, pos)
        formats.append((content, form))
    n, pos = read_uleb(buf, pos)
    entries = []
    offset_struct = _struct_of(e + ("I" if offset_size == 4 else "Q"))
    order = "big" if e == ">" else "little"
    for _ in range(n):
        path, directory = "", 0
        for content, form in formats:
            if form == 0x1F or form == 0x0E:   # line_strp, strp
                value = (form, offset_struct.unpack_from(buf, pos)[0])
                pos += offset_size
            elif form == 0x0F:                 # udata
                value = buf[pos]
                if value < 0x80:
                    pos += 1
                else:
                    value, pos = read_uleb(buf, pos)
            elif form == 0x08:                 # string
                end = buf.find(b"\0", pos)
                value, pos = bytes(buf[pos:end]).decode("utf-8", "replace"), end + 1
            elif form in _LINE_DATA_SIZES:     # data1/2/4/8/16
                size = _LINE_DATA_SIZES[form]
                value = int.from_bytes(buf[pos:pos + size], order)
                pos += size
            elif form == 0x09:                 # block
                size, pos = read_uleb(buf, pos)
                value, pos = None, pos + size
            else:
                raise ValueError(f"line table form {form:#x}")
            if content == _LNCT_PATH:
                path = value
            elif content == _LNCT_DIRECTORY_INDEX:
                directory = value
        entries.append((directory, path))
    return entries, pos


_LINE_DATA_SIZES = {0x0B: 1, 0x05: 2, 0x06: 4, 0x07: 8, 0x1E: 16}


# ------------------------------------------------------------------ address ranges


def first_range_start(r: UnitReader, value: int, cu_low_pc: int) -> Optional[int]:
    """Entry of a function split in several ranges (hot/cold parts): its first range."""
    if r.unit.version >= 5:
        return _first_rnglist_start(r, value, cu_low_pc)
    buf, base = r.sec.ranges
    if not buf:
        return None
    size = r.unit.addr_size
    order = "big" if r.unit.big_endian else "little"
    top = (1 << (8 * size)) - 1
    pos, base_address = base + value, cu_low_pc
    while True:
        begin = int.from_bytes(buf[pos:pos + size], order)
        end = int.from_bytes(buf[pos + size:pos + 2 * size], order)
        pos += 2 * size
        if begin == 0 and end == 0:
            return None
        if begin == top:
            base_address = end
            continue
        return base_address + begin


def _first_rnglist_start(r: UnitReader, value: int, cu_low_pc: int) -> Optional[int]:
    buf, base = r.sec.rnglists
    if not buf:
        return None
    size = r.unit.addr_size
    order = "big" if r.unit.big_endian else "little"
    pos, base_address = base + value, cu_low_pc
    while True:
        kind = buf[pos]
        pos += 1
        if kind == 0:        # end_of_list
            return None
        if kind == 1:        # base_addressx
            index, pos = read_uleb(buf, pos)
            base_address = r._addrx(index)
        elif kind in (2, 3):  # startx_endx, startx_length
            index, pos = read_uleb(buf, pos)
            return r._addrx(index)
        elif kind == 4:      # offset_pair
            start, pos = read_uleb(buf, pos)
            return base_address + start
        elif kind == 5:      # base_address
            base_address = int.from_bytes(buf[pos:pos + size], order)
            pos += size
        elif kind in (6, 7):  # start_end, start_length
            return int.from_bytes(buf[pos:pos + size], order)
        else:
            return None


# ------------------------------------------------------------------ all units

@dataclass
class ScanState:
    """What a scan learns as it goes and reuses: structs and inline functions already
    summarized, decoded strings, plans by abbreviation table."""

    known_structs: set = field(default_factory=set)
    seen_inline: set = field(default_factory=set)
    strings: dict = field(default_factory=dict)
    plans: dict = field(default_factory=dict)
    #: every unit, and scanners of units looked into from others (DW_FORM_ref_addr)
    units: list = field(default_factory=list)
    foreign: dict = field(default_factory=dict)
    starts: list = field(default_factory=list)

    def unit_plans(self, sec: Sections, unit: UnitFormat) -> dict:
        key = (unit.abbrev_offset, unit.version, unit.offset_size, unit.addr_size)
        plans = self.plans.get(key)
        if plans is None:
            plans = self.plans[key] = read_abbrevs(sec, unit)
        return plans

    def scanner_for(self, sec: Sections, offset: int) -> Optional["UnitScanner"]:
        """A scanner of the unit holding a .debug_info offset (kept for reuse)."""
        import bisect

        if len(self.starts) != len(self.units):
            self.starts = [u.offset for u in self.units]
        index = bisect.bisect_right(self.starts, offset) - 1
        if index < 0 or not self.units[index].die_start <= offset < self.units[index].end:
            return None
        scanner = self.foreign.get(index)
        if scanner is None:
            unit = self.units[index]
            reader = UnitReader(sec, unit, self.unit_plans(sec, unit), self.strings)
            scanner = UnitScanner(reader, set(), first_range_start,
                                  lambda off: self.scanner_for(sec, off))
            scanner.read_unit_die()
            self.foreign[index] = scanner
        return scanner


_SHARED: Optional[tuple] = None  # (sections, state), inherited by forked workers


def scan_units(sec: Sections, units: list, workers: int = 2,
               state: Optional[ScanState] = None) -> list:
    """Summaries of every unit, in unit order, scanned by ``workers`` processes (this
    one included; the others are forked and share the mapped file).  Each process
    keeps its own `ScanState`; merging keeps the first unit's struct definitions."""
    global _SHARED
    indexed = list(enumerate(units))
    state = state or ScanState(units=units)
    if workers <= 1 or len(units) < 2 * workers:
        return [s for _i, s in _scan_chunk(sec, indexed, state)]
    chunks = [indexed[i::workers] for i in range(workers)]
    results: list = []
    import multiprocessing

    _SHARED = (sec, state)
    try:
        with multiprocessing.get_context("fork").Pool(workers - 1) as pool:
            pending = pool.map_async(_scan_shared_chunk, chunks[1:])
            results.extend(_scan_chunk(sec, chunks[0], state))
            for part in pending.get():
                results.extend(part)
    finally:
        _SHARED = None
    results.sort(key=lambda pair: pair[0])
    return [s for _i, s in results]


def _scan_shared_chunk(chunk: list) -> list:
    sec, state = _SHARED
    return _scan_chunk(sec, chunk, state)


def _scan_chunk(sec: Sections, chunk: list, state: ScanState) -> list:
    out = []

    def other(offset: int) -> Optional[UnitScanner]:
        return state.scanner_for(sec, offset)

    for index, unit in chunk:
        reader = UnitReader(sec, unit, state.unit_plans(sec, unit), state.strings)
        tables = UnitScanner(reader, state.known_structs, first_range_start, other).scan()
        out.append((index, summarize_unit(tables, state.known_structs, state.seen_inline)))
    return out


def declared_function_rows(sec: Sections, units: list, offsets: list,
                           state: Optional[ScanState] = None) -> list:
    """Function rows (as `UnitSummary.functions`) for subprogram declarations, read on
    demand: functions a file declares but whose definition its DWARF lacks.  ``state``
    (that of the scan, for its plans and strings) saves reading them again."""
    import bisect

    starts = [u.offset for u in units]
    by_unit: dict = {}
    for offset in offsets:
        by_unit.setdefault(bisect.bisect_right(starts, offset) - 1, []).append(offset)
    rows = []
    state = ScanState(units=units, strings=state.strings, plans=state.plans) if state \
        else ScanState(units=units)
    for index, unit_offsets in sorted(by_unit.items()):
        scanner = state.scanner_for(sec, units[index].die_start)
        shapes = ShapeResolver(scanner.tables.types)
        for offset in unit_offsets:
            sp = scanner.subprogram_at(offset)
            rows.append(unit_function(scanner.tables, shapes, sp))
    return rows
