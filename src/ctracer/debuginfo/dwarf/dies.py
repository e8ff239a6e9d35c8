"""DWARF read with pyelftools: the only module of ctracer that imports it.

* `open_dwarfinfo` gives pyelftools' `DWARFInfo` of a file, built through its public
  constructor from sections this package prepares (`ctracer.debuginfo.dwarf.sections`):
  read in place through a `SectionFile` each when the file's bytes are the section's (a
  vmlinux: no 300 MB copy before its first struct), else decompressed and relocated here
  (pyelftools' own relocation of nfs.ko's 228,000 takes half a minute).  What this
  package does not prepare (zstd, SHT_REL, ``.zdebug``) is left to ``get_dwarf_info``;
* `ElftoolsUnitWalker` fills the same `ctracer.debuginfo.dwarf.units.UnitTables` as the raw
  scanner (`ctracer.debuginfo.dwarf.scan`): the reference in tests, and the fallback for
  DWARF the scanner does not read (`walk_units`, `declared_rows`);
* `GraphBuilder` reads one struct definition and every type it reaches into a
  `TypeGraph`, by the DIE offset the catalog remembered (`find_struct`);
* `open_elffile` gives pyelftools' `ELFFile` of an open file, whose symbols, segments,
  line programs and DIEs `ctracer.debuginfo.code` reads for ``--watch``'s writers.

pyelftools is imported inside functions only, so that a cached query never pays for it.
"""

from __future__ import annotations

import functools
from typing import Optional

from ctracer.debuginfo.dwarf import units as du
from ctracer.debuginfo.dwarf.units import plus_uconst
from ctracer.debuginfo.elf import SHT_NOBITS, ElfHeaders
from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, Encoding, EnumType,
                                     FunctionType, Member, PointerType, QualifiedType, TypeGraph,
                                     TypeId, Typedef)
from ctracer.errors import InputFileError

# ------------------------------------------------------------------ opening


def open_elffile(stream):
    """pyelftools' `ELFFile` of ``stream`` (an open binary file)."""
    from elftools.elf.elffile import ELFFile
    return ELFFile(stream)


def open_dwarfinfo(headers: ElfHeaders, stream):
    """pyelftools' `DWARFInfo` of the ELF file open as ``stream`` (kept open by the
    caller while the DWARFInfo is used)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    from ctracer.debuginfo.dwarf.scan import UnsupportedDwarf

    try:
        elf = ELFFile(stream)
        if elf.has_section(".zdebug_info") or elf.has_phantom_bytes():
            return elf.get_dwarf_info(relocate_dwarf_sections=True)
        try:
            return _prepared_dwarfinfo(headers, elf)
        except UnsupportedDwarf:
            return elf.get_dwarf_info(relocate_dwarf_sections=True)
    except (ELFError, ValueError) as err:
        raise InputFileError(f"{headers.path}: cannot read DWARF ({err})") from None


def _prepared_dwarfinfo(headers: ElfHeaders, elf):
    """A `DWARFInfo` made with pyelftools' public constructor, each of its sections a
    `DebugSectionDescriptor` of ours (`UnsupportedDwarf` for what we do not prepare)."""
    from elftools.dwarf.dwarfinfo import DWARFInfo, DwarfConfig

    from ctracer.debuginfo.dwarf import sections

    mapped = sections.mapped_file(headers.path)
    try:
        code = DWARFInfo.__init__.__code__
        wanted = [name for name in code.co_varnames[1:code.co_argcount] if name != "config"]
        descriptors = {name: _descriptor(headers, mapped, sections, section_name(name))
                       for name in wanted}
    finally:
        mapped.close()
    config = DwarfConfig(little_endian=not headers.big_endian,
                         default_address_size=8 if headers.is64 else 4,
                         machine_arch=elf.get_machine_arch())
    return DWARFInfo(config=config, **descriptors)


def section_name(parameter: str) -> str:
    """The ELF section a `DWARFInfo` constructor parameter takes: ``debug_info_sec`` is
    ``.debug_info``, ``eh_frame_sec`` is ``.eh_frame``."""
    return "." + parameter.removesuffix("_sec")


def _descriptor(headers: ElfHeaders, mapped, sections, name: str):
    """A section as pyelftools' `DebugSectionDescriptor`: read in place when the file
    holds its bytes as they are, else our decompressed or relocated copy."""
    import io

    from elftools.dwarf.dwarfinfo import DebugSectionDescriptor

    section = headers.section(name)
    if section is None or section.type == SHT_NOBITS or not name.startswith(".debug_"):
        return None  # .eh_frame, .gnu_debugaltlink: types never read them
    data = sections.section_data(headers, mapped, section)
    if data is None:
        stream, size = SectionFile(headers.path, section.offset, section.size), section.size
    else:
        stream, size = io.BytesIO(data), len(data)
    return DebugSectionDescriptor(stream=stream, name=name, global_offset=section.offset,
                                  size=size, address=0)


class SectionFile:
    """One section of a file as a stream of its own (seek, tell and read, as pyelftools
    reads DWARF), read in place: the file is opened on first use and ``read`` is then
    the file's own (a find_struct reads thousands of times)."""

    def __init__(self, path: str, offset: int, size: int):
        self.path, self.offset, self.size = path, offset, size

    def __getattr__(self, name: str):
        if name not in ("read", "file"):
            raise AttributeError(name)
        self.file = open(self.path, "rb")
        self.file.seek(self.offset)
        self.read = self.file.read
        return getattr(self, name)

    def seek(self, position: int, whence: int = 0) -> int:
        """Move within the section (``whence`` as for a file); the new position."""
        if whence == 1:
            return self.file.seek(position, 1) - self.offset
        base = self.offset + (self.size if whence == 2 else 0)
        return self.file.seek(base + position) - self.offset

    def tell(self) -> int:
        """The position in the section."""
        return self.file.tell() - self.offset

    def close(self) -> None:
        if "file" in self.__dict__:
            self.file.close()


# ------------------------------------------------------------------ unit walks


def walk_units(dwarf, big_endian: bool) -> list:
    """Every unit's tables by pyelftools, their types and struct definitions shared
    so that references from one unit into another (DW_FORM_ref_addr) resolve."""
    import collections

    walker = ElftoolsUnitWalker(dwarf, big_endian)
    units = [walker.walk(cu) for cu in dwarf.iter_CUs()]
    all_types = collections.ChainMap(*(t.types for t in units))
    all_composites = collections.ChainMap(*(t.composites for t in units))
    for tables in units:
        tables.types = collections.ChainMap(tables.types, all_types)
        tables.load_composite = all_composites.get
    return units


def declared_rows(dwarf, big_endian: bool, offsets: list) -> list:
    """Function rows of the subprogram DIEs at ``offsets`` (declarations included)."""
    wanted = set(offsets)
    rows = []
    for tables in walk_units(dwarf, big_endian):
        for sp in tables.subprograms:
            if sp.offset in wanted:
                rows.append(du.unit_function(tables, du.ShapeResolver(tables.types), sp))
    return rows


@functools.lru_cache(maxsize=None)
def _tag_numbers() -> dict:
    """pyelftools tag names → DWARF numbers, for the tags a unit walk keeps."""
    return {
        "DW_TAG_array_type": du.TAG_ARRAY, "DW_TAG_class_type": du.TAG_CLASS,
        "DW_TAG_enumeration_type": du.TAG_ENUMERATION, "DW_TAG_pointer_type": du.TAG_POINTER,
        "DW_TAG_reference_type": du.TAG_REFERENCE, "DW_TAG_structure_type": du.TAG_STRUCTURE,
        "DW_TAG_subroutine_type": du.TAG_SUBROUTINE_TYPE, "DW_TAG_typedef": du.TAG_TYPEDEF,
        "DW_TAG_union_type": du.TAG_UNION, "DW_TAG_ptr_to_member_type": du.TAG_PTR_TO_MEMBER,
        "DW_TAG_base_type": du.TAG_BASE, "DW_TAG_const_type": du.TAG_CONST,
        "DW_TAG_volatile_type": du.TAG_VOLATILE, "DW_TAG_restrict_type": du.TAG_RESTRICT,
        "DW_TAG_unspecified_type": du.TAG_UNSPECIFIED_TYPE,
        "DW_TAG_rvalue_reference_type": du.TAG_RVALUE_REFERENCE,
        "DW_TAG_atomic_type": du.TAG_ATOMIC, "DW_TAG_subprogram": du.TAG_SUBPROGRAM,
        "DW_TAG_namespace": du.TAG_NAMESPACE,
    }
_LOCAL_REF_FORMS = {"DW_FORM_ref1", "DW_FORM_ref2", "DW_FORM_ref4", "DW_FORM_ref8",
                    "DW_FORM_ref_udata"}



def children(die):
    """A DIE's children, as pyelftools' ``iter_children`` gives them, refusing damage it
    would loop on: each child must lie after the one before it and inside its unit (a
    damaged DW_AT_sibling can point back, and pyelftools would go round forever)."""
    end = die.cu.cu_offset + die.cu.size
    last = die.offset
    for child in die.iter_children():
        if not last < child.offset < end:
            raise ValueError(f"DIE at {child.offset:#x} is not after {last:#x} within its "
                             "unit (a damaged DW_AT_sibling?)")
        last = child.offset
        yield child


def _prototype(die) -> tuple[list, bool]:
    """A subprogram's or subroutine type's parameter types, and whether it is variadic."""
    params, variadic = [], False
    for child in children(die):
        if child.tag == "DW_TAG_formal_parameter":
            params.append(attr_ref(child, "DW_AT_type"))
        elif child.tag == "DW_TAG_unspecified_parameters":
            variadic = True
    return params, variadic

def attr_ref(die, name: str) -> Optional[int]:
    """The absolute .debug_info offset a reference attribute points to."""
    a = die.attributes.get(name)
    if a is None:
        return None
    if a.form in _LOCAL_REF_FORMS:
        return a.value + die.cu.cu_offset
    if a.form == "DW_FORM_ref_addr":
        return a.value
    return du.UNRESOLVED  # type units (ref_sig8), supplementary files (ref_alt)


def attr_str(die, name: str) -> Optional[str]:
    """A DIE's string attribute ``name``, decoded (None when absent or not a string)."""
    a = die.attributes.get(name)
    if a is None or a.value is None:
        return None
    v = a.value
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v if isinstance(v, str) else None  # e.g. a string in a missing alt file


def attr_flag(die, name: str) -> bool:
    """A flag attribute (DW_FORM_flag may say 0: absent and false alike)."""
    a = die.attributes.get(name)
    return a is not None and bool(a.value)


def attr_int(die, name: str) -> Optional[int]:
    """A DIE's integer attribute ``name`` (a DWARF 2/3 ``DW_OP_plus_uconst`` location
    read as its offset); None when absent."""
    a = die.attributes.get(name)
    if a is None:
        return None
    v = a.value
    if isinstance(v, list):  # DWARF 2/3 location expression: DW_OP_plus_uconst N
        return plus_uconst(v)
    return int(v) if isinstance(v, (int, bool)) else None


def attr_sint(die, name: str) -> Optional[int]:
    """A constant that may be negative even in a DW_FORM_dataN (e.g. clang's
    DW_AT_bit_offset of a bitfield straddling its storage unit)."""
    a = die.attributes.get(name)
    if a is None or not isinstance(a.value, int):
        return None
    return _sign_extend(a.value, a.form)


def _sign_extend(value: int, form: str) -> int:
    if form.startswith("DW_FORM_data") and form[12:].isdigit():
        bits = int(form[12:]) * 8
        if value >= 1 << (bits - 1):
            return value - (1 << bits)
    return value


def array_dims(die) -> tuple:
    """An array DIE's dimensions from its subranges (None for one without a bound)."""
    dims = []
    for sub in children(die):
        if sub.tag not in ("DW_TAG_subrange_type", "DW_TAG_enumeration_type"):
            continue
        count = attr_int(sub, "DW_AT_count")
        upper = sub.attributes.get("DW_AT_upper_bound")
        if count is None and upper is not None and isinstance(upper.value, int) \
                and upper.form not in ("DW_FORM_exprloc", "DW_FORM_block1"):
            lower = attr_int(sub, "DW_AT_lower_bound") or 0
            bound = upper.value
            if bound >= (1 << 63) or (upper.form == "DW_FORM_data4" and bound == 0xFFFFFFFF):
                count = 0  # GCC's "-1" upper bound of a zero-length array
            else:
                count = bound - lower + 1
        dims.append(count)
    return tuple(dims)


class ElftoolsUnitWalker:
    """Fills `dwarf_scan.UnitTables` for a compile unit using pyelftools DIEs (works for
    every DWARF version and form pyelftools knows; the raw scanner is faster)."""

    def __init__(self, dwarf, big_endian: bool):
        self.dwarf = dwarf
        self.big_endian = big_endian
        self.tags = _tag_numbers()

    def walk(self, cu) -> du.UnitTables:
        top = cu.get_top_DIE()
        tables = du.UnitTables(cu.cu_offset, attr_str(top, "DW_AT_name") or "")
        tables.files = self._file_names(cu)
        self._children(top, tables)
        return tables

    def _file_names(self, cu) -> dict:
        try:
            program = self.dwarf.line_program_for_CU(cu)
        except Exception:  # a broken line table must not hide the types
            return {}
        if program is None:
            return {}
        header = program.header
        dirs = [_text(d) for d in header["include_directory"]]
        version = header["version"]
        if version < 5:
            dirs.insert(0, attr_str(cu.get_top_DIE(), "DW_AT_comp_dir") or "")
        base = 0 if version >= 5 else 1
        names = {}
        for i, entry in enumerate(header["file_entry"]):
            name = _text(entry.name)
            d = entry.dir_index
            if not name.startswith("/") and 0 <= d < len(dirs) and dirs[d]:
                name = f"{dirs[d]}/{name}"
            names[i + base] = name
        return names

    def _children(self, parent, tables: du.UnitTables) -> None:
        for die in children(parent):
            tag = self.tags.get(die.tag)
            if tag is None:
                continue
            if tag == du.TAG_NAMESPACE:
                self._children(die, tables)
            elif tag == du.TAG_SUBPROGRAM:
                sp = self._subprogram(die)
                tables.subprograms.append(sp)
                if sp.declaration and sp.external and sp.name:
                    tables.declarations.append((sp.name, sp.offset))
            else:
                self._type(die, tag, tables)

    def _type(self, die, tag: int, tables: du.UnitTables) -> None:
        name = attr_str(die, "DW_AT_name")
        target = attr_ref(die, "DW_AT_type")
        aux = None
        if tag in du.COMPOSITE_TAGS:
            aux = attr_flag(die, "DW_AT_declaration")
            if not aux:
                members = self._members(die, tables)
                size = attr_int(die, "DW_AT_byte_size") or 0
                tables.composites[die.offset] = (tag, name, size, members)
        elif tag == du.TAG_ENUMERATION:
            aux = attr_flag(die, "DW_AT_declaration")
        elif tag == du.TAG_ARRAY:
            aux = array_dims(die)
        elif tag == du.TAG_SUBROUTINE_TYPE:
            params, variadic = _prototype(die)
            aux = (tuple(params), variadic)
        elif tag == du.TAG_TYPEDEF and name and name.startswith(du.TRACEPOINT_TYPEDEF_PREFIX):
            tables.tracepoint_typedefs.append((name, die.offset))
        tables.types[die.offset] = (tag, name, target, aux)

    def _members(self, die, tables: du.UnitTables) -> tuple:
        members = []
        for child in children(die):
            if child.tag == "DW_TAG_member":
                members.append((attr_str(child, "DW_AT_name"), attr_ref(child, "DW_AT_type"),
                                self.bit_offset(child)))
            elif child.tag in self.tags:  # nested type definitions (C++), kept like top-level
                tag = self.tags[child.tag]
                if tag != du.TAG_SUBPROGRAM and tag != du.TAG_NAMESPACE:
                    self._type(child, tag, tables)
        return tuple(members)

    def bit_offset(self, member) -> int:
        bit_size = attr_int(member, "DW_AT_bit_size") or 0
        be_bit_offset = attr_sint(member, "DW_AT_bit_offset")
        type_size = 0
        if be_bit_offset is not None and "DW_AT_byte_size" not in member.attributes:
            type_size = type_byte_size(self.dwarf, attr_ref(member, "DW_AT_type"))
        return du.member_bit_offset(attr_int(member, "DW_AT_data_member_location"),
                                    attr_int(member, "DW_AT_data_bit_offset"), be_bit_offset,
                                    attr_int(member, "DW_AT_byte_size"), bit_size, type_size,
                                    self.big_endian)

    def _subprogram(self, die) -> du.Subprogram:
        sp = du.Subprogram(
            die.offset, name=attr_str(die, "DW_AT_name"),
            linkage_name=attr_str(die, "DW_AT_linkage_name")
            or attr_str(die, "DW_AT_MIPS_linkage_name"),
            returns=attr_ref(die, "DW_AT_type"),
            external=attr_flag(die, "DW_AT_external"),
            inline=attr_int(die, "DW_AT_inline"),
            declaration=attr_flag(die, "DW_AT_declaration"),
            abstract_origin=attr_ref(die, "DW_AT_abstract_origin"),
            specification=attr_ref(die, "DW_AT_specification"),
            decl_file=attr_int(die, "DW_AT_decl_file"),
            decl_line=attr_int(die, "DW_AT_decl_line"))
        low = die.attributes.get("DW_AT_low_pc")
        if low is not None and isinstance(low.value, int):
            sp.low_pc = low.value
        elif "DW_AT_entry_pc" in die.attributes:
            sp.low_pc = attr_int(die, "DW_AT_entry_pc")
        elif "DW_AT_ranges" in die.attributes:
            sp.has_ranges = True
            sp.low_pc = self._first_range_start(die)
        if sp.abstract_origin is None:
            for child in children(die):
                if child.tag == "DW_TAG_formal_parameter":
                    sp.params.append((attr_str(child, "DW_AT_name"),
                                      attr_ref(child, "DW_AT_type")))
                elif child.tag == "DW_TAG_unspecified_parameters":
                    sp.variadic = True
        return sp

    def _first_range_start(self, die) -> Optional[int]:
        """Entry of a function split in several ranges (hot/cold): its first range."""
        try:
            ranges = self.dwarf.range_lists()
            if ranges is None:
                return None
            attr = die.attributes["DW_AT_ranges"]
            entries = ranges.get_range_list_at_offset(attr.value, cu=die.cu)
        except Exception:  # an unreadable range list costs the address, not the catalog
            return None
        base = die.cu.get_top_DIE().attributes.get("DW_AT_low_pc")
        base_address = base.value if base is not None else 0
        for entry in entries:
            if hasattr(entry, "begin_offset"):
                absolute = getattr(entry, "is_absolute", False)
                return entry.begin_offset + (0 if absolute else base_address)
            if hasattr(entry, "base_address"):
                base_address = entry.base_address
        return None


def _text(value) -> str:
    """A name from the line table: bytes, or a string, or None where a damaged table
    (or a string in a missing file) left none."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def type_byte_size(dwarf, offset: Optional[int]) -> int:
    """DW_AT_byte_size of a type, through typedefs and qualifiers."""
    for _ in range(64):
        if offset is None or offset == du.UNRESOLVED:
            return 0
        die = dwarf.get_DIE_from_refaddr(offset)
        size = attr_int(die, "DW_AT_byte_size")
        if size is not None:
            return size
        offset = attr_ref(die, "DW_AT_type")
    return 0


# ------------------------------------------------------------------ type graphs

_ENCODINGS = {0x01: Encoding.UNSIGNED, 0x02: Encoding.BOOL, 0x03: Encoding.COMPLEX_FLOAT,
              0x04: Encoding.FLOAT, 0x05: Encoding.SIGNED, 0x06: Encoding.SIGNED_CHAR,
              0x07: Encoding.UNSIGNED, 0x08: Encoding.UNSIGNED_CHAR, 0x10: Encoding.UNSIGNED}
_QUALIFIERS = {"DW_TAG_const_type": "const", "DW_TAG_volatile_type": "volatile",
               "DW_TAG_restrict_type": "restrict", "DW_TAG_atomic_type": "atomic"}
_POINTERS = ("DW_TAG_pointer_type", "DW_TAG_reference_type", "DW_TAG_rvalue_reference_type",
             "DW_TAG_ptr_to_member_type")


class GraphBuilder:
    """Reads a struct definition and every type it reaches into a `TypeGraph`.

    Types reached by value are read whole.  Behind a pointer only the pointee's identity
    is needed: a named struct/union reached only that way appears as a declaration (name
    and size, no members), which also keeps a kernel struct from pulling in half the
    kernel.  An anonymous one is read whole wherever it is reached, as pahole expands it.
    """

    def __init__(self, dwarf, big_endian: bool):
        self.dwarf = dwarf
        self.walker = ElftoolsUnitWalker(dwarf, big_endian)
        self.types: dict[TypeId, object] = {}
        self.whole: set[int] = set()

    def build(self, root: int) -> TypeGraph:
        pending = [(root, True)]
        while pending:
            offset, whole = pending.pop()
            if offset in self.whole or (not whole and offset in self.types):
                continue
            if offset == du.UNRESOLVED:
                self.types[offset] = BaseType("?", 0, Encoding.OTHER)  # see attr_ref
                continue
            die = self.dwarf.get_DIE_from_refaddr(offset)
            self.types[offset], reached = self._convert(die, whole)
            if whole:
                self.whole.add(offset)
            pending.extend((o, w) for o, w in reached if o is not None)
        return TypeGraph(self.types, root)

    def _convert(self, die, whole: bool):
        """(model type, [(offset, whole?) it reaches])"""
        tag = die.tag
        name = attr_str(die, "DW_AT_name")
        target = attr_ref(die, "DW_AT_type")
        if tag == "DW_TAG_base_type":
            encoding = _ENCODINGS.get(attr_int(die, "DW_AT_encoding") or 0, Encoding.OTHER)
            return BaseType(name or "?", attr_int(die, "DW_AT_byte_size") or 0, encoding), []
        if tag in _POINTERS:
            size = attr_int(die, "DW_AT_byte_size") or die.cu["address_size"]
            return PointerType(target, size), [(target, False)]
        if tag in _QUALIFIERS:
            return QualifiedType(_QUALIFIERS[tag], target), [(target, whole)]
        if tag == "DW_TAG_typedef":
            return Typedef(name or "?", target), [(target, whole)]
        if tag in ("DW_TAG_structure_type", "DW_TAG_union_type", "DW_TAG_class_type"):
            return self._composite(die, name, whole)
        if tag == "DW_TAG_enumeration_type":
            return self._enum(die, name, target), []
        if tag == "DW_TAG_array_type":
            return ArrayType(target, array_dims(die)), [(target, whole)]
        if tag == "DW_TAG_subroutine_type":
            return self._function(die, target)
        # DW_TAG_unspecified_type (C++ nullptr_t) and anything unexpected
        return BaseType(name or tag, attr_int(die, "DW_AT_byte_size") or 0, Encoding.OTHER), []

    def _composite(self, die, name: Optional[str], whole: bool):
        kind = "union" if die.tag == "DW_TAG_union_type" else "struct"
        size = attr_int(die, "DW_AT_byte_size") or 0
        declaration = attr_flag(die, "DW_AT_declaration")
        alignment = attr_int(die, "DW_AT_alignment") or 0
        # an anonymous one can be named by nothing else: it is printed inline even
        # behind a pointer (`struct { ... } * parts;`), so it is read whole too
        if declaration or (not whole and name is not None):
            return CompositeType(kind, name, size, (), True, alignment), []
        members, reached = [], []
        for child in children(die):
            if child.tag != "DW_TAG_member":
                continue
            mtype = attr_ref(child, "DW_AT_type")
            members.append(Member(attr_str(child, "DW_AT_name"), mtype,
                                  self.walker.bit_offset(child),
                                  attr_int(child, "DW_AT_bit_size") or 0,
                                  attr_int(child, "DW_AT_alignment") or 0))
            reached.append((mtype, True))
        return CompositeType(kind, name, size, tuple(members), False, alignment), reached

    def _enum(self, die, name: Optional[str], underlying: Optional[int]) -> EnumType:
        signed = None
        if underlying is not None:
            base = self.dwarf.get_DIE_from_refaddr(underlying)
            while base.tag == "DW_TAG_typedef" or base.tag in _QUALIFIERS:
                base = base.get_DIE_from_attribute("DW_AT_type")
            signed = attr_int(base, "DW_AT_encoding") in (0x05, 0x06)
        size = attr_int(die, "DW_AT_byte_size") or 0
        values = []
        for child in children(die):
            if child.tag == "DW_TAG_enumerator":
                a = child.attributes["DW_AT_const_value"]
                values.append((attr_str(child, "DW_AT_name") or "?", a.value, a.form))
        if signed is None:
            signed = any(v < 0 for _n, v, _f in values)
        enumerators = tuple((n, _enum_value(v, f, size, signed)) for n, v, f in values)
        return EnumType(name, size, enumerators, signed,
                        attr_flag(die, "DW_AT_declaration"))

    def _function(self, die, returns: Optional[int]):
        params, variadic = _prototype(die)
        reached = [(returns, False)] + [(p, False) for p in params]
        return FunctionType(returns, tuple(params), variadic), reached


def _enum_value(value: int, form: str, size: int, signed: bool) -> int:
    """Enumerators in DW_FORM_dataN are raw bits: sign-extend them for a signed enum."""
    return _sign_extend(value, form) if signed else value
