"""DWARF (and ELF) reading: the only module of ctracer that imports pyelftools.

`open_elf_types(path)` gives the `TypeModel` of an ELF file: from its DWARF, or from its
``.BTF`` section (through `ctracer.debuginfo.btf.reader`) when it has no DWARF.  Two levels, as in
`ctracer.debuginfo.model`:

* the catalog (every function, struct summary and tracepoint) comes from a walk of every
  compile unit that keeps only top-level DIEs, struct members and function parameters:
  `ctracer.debuginfo.dwarf.scan` reads raw bytes, fast, in forked workers; `ElftoolsUnitWalker`
  here does the same with pyelftools (the reference in tests, and the fallback for DWARF
  the scanner does not read).  `ctracer.debuginfo.dwarf.units` merges the units into rows, and
  `ctracer.debuginfo.dwarf.cache` keeps them, keyed by build-id, for the next query;
* `find_struct` reads one struct definition and what it reaches, on demand, by the DIE
  offset the catalog remembered, with pyelftools (given, for a relocatable file such as
  a kernel module, sections this module relocated: pyelftools' own relocation of
  nfs.ko's 228,000 takes half a minute).

Debug sections compressed with zlib (SHF_COMPRESSED, ``-gz``) are decompressed first.

ELF helpers other parts need live here too (`build_id`, `uprobe_offset`,
`function_symbols`), with a small section-header reader that needs no pyelftools, so
that a cached query never imports it.  pyelftools is imported inside functions only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
from dataclasses import dataclass
from typing import Optional

from ctracer.debuginfo.elf import (ElfHeaders, SectionHeader, build_id, cstring,  # noqa: F401
                                   function_symbols, read_elf_headers, uprobe_offset)
from ctracer.debuginfo.gcpause import collector_paused
from ctracer.errors import InputFileError, UnknownType
from ctracer.debuginfo.model import (ArrayType, BaseType, Catalog, CompositeType, Encoding, EnumType,
                           FunctionType, Member, PointerType, QualifiedType, ShapeKind,
                           TypeGraph, TypeId, Typedef)



class _DwarfUnits:
    """`ctracer.debuginfo.dwarf.units`, imported on first use (a cached query never needs it:
    3 ms of start-up); the first use puts the module itself in its place."""

    def __getattr__(self, name: str):
        from ctracer.debuginfo.dwarf import units as dwarf_units

        globals()["du"] = dwarf_units
        return getattr(dwarf_units, name)


du = _DwarfUnits()

# ------------------------------------------------------------------ raw sections

ET_REL = 1
#: relocation types that write S + A into debug sections: (machine, type) → width
_ABS_RELOCATIONS = {(62, 1): 8, (62, 10): 4, (62, 11): 4,      # x86-64: 64, 32, 32S
                    (183, 257): 8, (183, 258): 4}               # AArch64: ABS64, ABS32
_SCANNED_SECTIONS = {"info": ".debug_info", "abbrev": ".debug_abbrev", "str": ".debug_str",
                     "line_str": ".debug_line_str", "str_offsets": ".debug_str_offsets",
                     "addr": ".debug_addr", "line": ".debug_line",
                     "rnglists": ".debug_rnglists", "ranges": ".debug_ranges"}


def dwarf_sections(headers: ElfHeaders) -> "ds.Sections":
    """The DWARF sections the raw scanner reads: views into the mapped file, or copies
    where the file's bytes are not the section's (compressed, or relocatable with
    relocations to apply)."""
    from ctracer.debuginfo.dwarf import scan as ds

    mapped = _mapped(headers.path)
    parts = {}
    for field, name in _SCANNED_SECTIONS.items():
        section = headers.section(name)
        if section is None or section.type == 8:
            continue
        data = section_data(headers, mapped, section)
        parts[field] = (data, 0) if data is not None else (mapped, section.offset)
    if "info" not in parts or "abbrev" not in parts:
        raise InputFileError(f"{headers.path} has .debug_info but no .debug_abbrev")
    info, base = parts["info"]
    info_size = len(info) if base == 0 and info is not mapped \
        else headers.section(".debug_info").size
    return ds.Sections(**parts, info_size=info_size, big_endian=headers.big_endian)


def _mapped(path: str):
    import mmap

    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


SHF_COMPRESSED = 0x800
ELFCOMPRESS_ZLIB = 1


def section_data(headers: ElfHeaders, mapped, section: SectionHeader,
                 relocate: bool = True) -> Optional[bytes]:
    """A section's bytes when they are not the file's as they stand: decompressed
    (SHF_COMPRESSED, ``-gz``), with the relocations of a relocatable file (.o, .ko)
    applied; None when the mapped file can be read in place.
    `dwarf_scan.UnsupportedDwarf` for what is not written here (zstd, SHT_REL, 32-bit
    or unknown relocations): the caller then lets pyelftools read the file."""
    data = None
    if section.flags & SHF_COMPRESSED:
        data = _decompressed(headers, mapped, section)
    rela = _relocations_of(headers, section) if relocate else None
    if rela is not None:
        if data is None:
            data = bytearray(mapped[section.offset:section.offset + section.size])
        _apply_relocations(headers, mapped, rela, data)
    return bytes(data) if data is not None else None  # hashable slices, as mmap's


def _decompressed(headers: ElfHeaders, mapped, section: SectionHeader) -> bytearray:
    import zlib

    from ctracer.debuginfo.dwarf import scan as ds

    e = ">" if headers.big_endian else "<"
    raw = mapped[section.offset:section.offset + section.size]
    if headers.is64:
        kind, _reserved, size, _align = struct.unpack_from(e + "IIQQ", raw)
        header = 24
    else:
        kind, size, _align = struct.unpack_from(e + "III", raw)
        header = 12
    if kind != ELFCOMPRESS_ZLIB:
        raise ds.UnsupportedDwarf(f"{section.name} compressed with type {kind}")
    data = bytearray(zlib.decompress(raw[header:]))
    if len(data) != size:
        raise InputFileError(f"{headers.path}: {section.name} decompresses to "
                             f"{len(data)} bytes, not {size}")
    return data


def _relocations_of(headers: ElfHeaders, section: SectionHeader
                    ) -> Optional[SectionHeader]:
    """The relocation section to apply to a debug section (relocatable files only)."""
    from ctracer.debuginfo.dwarf import scan as ds

    if headers.type != ET_REL:
        return None  # a vmlinux's .rela.debug_* are applied already
    if headers.section(".rel" + section.name) is not None:
        raise ds.UnsupportedDwarf(f"SHT_REL relocations of {section.name}")
    rela = headers.section(".rela" + section.name)
    if rela is not None and not headers.is64:
        raise ds.UnsupportedDwarf("relocations of a 32-bit ELF")
    return rela


def _apply_relocations(headers: ElfHeaders, mapped, rela: SectionHeader,
                       data: bytearray) -> None:
    """Write S + A at each relocation's offset (the absolute types debug sections use)."""
    from ctracer.debuginfo.dwarf import scan as ds

    e = ">" if headers.big_endian else "<"
    widths = {kind: width for (machine, kind), width in _ABS_RELOCATIONS.items()
              if machine == headers.machine}
    pack = {8: struct.Struct(e + "Q").pack_into, 4: struct.Struct(e + "I").pack_into}
    masks = {8: (1 << 64) - 1, 4: (1 << 32) - 1}
    symtab = headers.sections[rela.link]
    values = [v for _n, _i, _o, _s, v, _z in struct.iter_unpack(
        e + "IBBHQQ", mapped[symtab.offset:symtab.offset + symtab.size])]
    for offset, info, addend in struct.iter_unpack(
            e + "QQq", mapped[rela.offset:rela.offset + rela.size]):
        width = widths.get(info & 0xFFFFFFFF)
        if width is None:
            if info & 0xFFFFFFFF == 0:  # R_*_NONE
                continue
            raise ds.UnsupportedDwarf(f"relocation type {info & 0xFFFFFFFF}")
        pack[width](data, offset, (values[info >> 32] + addend) & masks[width])


#: .debug_info sizes from which a file counts as big (a kernel: 163 MB; nfs.ko: 3.6 MB)
BIG_DEBUG_INFO = 8 << 20


def scan_workers(info_size: int) -> int:
    """Processes for the raw scan: forking pays off only on big inputs."""
    if info_size < BIG_DEBUG_INFO:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 4))


# ------------------------------------------------------------------ opening


def open_elf_types(path: str, use_cache: bool = True):
    """The type model of an ELF file: its DWARF, else its .BTF section.

    Raises `InputFileError` (one line) for a file that is not ELF or has no debug info.
    """
    headers = read_elf_headers(path)
    info = headers.section(".debug_info")
    if info is not None and info.size > 0 and info.type != 8:  # 8: SHT_NOBITS (stripped)
        _refuse_supplementary_dwarf(headers)
        return DwarfTypes(path, headers, use_cache)
    btf_section = headers.section(".BTF")
    if btf_section is not None and btf_section.size > 0:
        with open(path, "rb") as f:
            f.seek(btf_section.offset)
            data = f.read(btf_section.size)
        from ctracer.debuginfo.btf import reader as btf
        return btf.model_from_bytes(data, f"BTF of {path}")
    raise InputFileError(f"{path} has no debug info (DWARF or BTF); rebuild with -g")


@contextlib.contextmanager
def _reading_dwarf(path: str):
    """DWARF that does not parse (a damaged or truncated file) is the user's problem to
    hear about in one line, not a traceback."""
    try:
        yield
    except (KeyError, IndexError, ValueError, struct.error, UnicodeDecodeError) as err:
        raise InputFileError(f"{path}: its DWARF cannot be read ({type(err).__name__}: "
                             f"{err}); is the file damaged?") from None
    except Exception as err:  # pyelftools' own exceptions, imported only when used
        if not type(err).__module__.startswith("elftools"):
            raise
        raise InputFileError(f"{path}: its DWARF cannot be read ({err}); "
                             "is the file damaged?") from None


#: the reader's version in cache files: bump when the catalog it writes changes
CACHE_PRODUCER = "dwarf-8"


def _refuse_type_units(headers: ElfHeaders, units: list) -> None:
    """Types moved into type units (-fdebug-types-section) are not read: say so rather
    than list functions whose parameters are all '?'."""
    if headers.section(".debug_types") is not None or any(u.unit_type in (2, 6)
                                                          for u in units):
        raise InputFileError(f"{headers.path} keeps its types in DWARF type units "
                             "(-fdebug-types-section), which ctracer cannot read yet; "
                             "rebuild without that option")


def _refuse_empty_catalog(headers: ElfHeaders, units: list, summaries: list) -> None:
    """Split DWARF (-gsplit-dwarf) leaves only skeleton units here, the types being in
    .dwo files: an empty catalog would look like a program without functions."""
    if any(s.functions or s.structs or s.declarations for s in summaries):
        return
    if any(u.unit_type in (4, 5) for u in units) or not units:
        raise InputFileError(f"{headers.path} has split DWARF (-gsplit-dwarf: the types are "
                             "in .dwo files), which ctracer cannot read yet; rebuild without it")
    raise InputFileError(f"{headers.path} has DWARF but no function or struct in it "
                         "(split DWARF? -gsplit-dwarf is not read yet)")


def _refuse_supplementary_dwarf(headers: ElfHeaders) -> None:
    """DWARF split with ``dwz -m`` keeps shared types and names in another file, which
    ctracer does not read: say so rather than list a catalog with holes."""
    for name in (".gnu_debugaltlink", ".debug_sup"):
        section = headers.section(name)
        if section is not None and section.size:
            with open(headers.path, "rb") as f:
                f.seek(section.offset)
                target = f.read(section.size).split(b"\0", 1)[0].decode("utf-8", "replace")
            raise InputFileError(
                f"{headers.path} keeps part of its DWARF in a supplementary file "
                f"({target or name}, made by dwz -m), which ctracer cannot read yet")


class DwarfTypes:
    """The `TypeModel` of an ELF file's DWARF."""

    format = "dwarf"

    def __init__(self, path: str, headers: ElfHeaders, use_cache: bool = True):
        self.path = path
        self.description = f"DWARF of {path}"
        self.headers = headers
        self.use_cache = use_cache
        self._catalog: Optional[Catalog] = None
        self._locations: dict = {}
        self._dwarf = None
        self._file = None

    # -- catalog

    def catalog(self) -> Catalog:
        """From the cache when it holds this file, else built (and cached)."""
        if self._catalog is None:
            if self.use_cache:
                self._catalog = self._cached()
                if self._catalog is None:
                    with collector_paused():
                        self._catalog = self._build_cached()
            if self._catalog is None:
                with collector_paused():
                    rows = self.catalog_rows()
                    self._catalog = du.catalog_from_rows(rows)
                    self._locations = {(k, n): off for k, n, _s, _m, off in rows.structs}
        return self._catalog

    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> list[str]:
        return self.catalog().struct_names(kind)

    def _cache_identity(self):
        from ctracer.debuginfo.dwarf import cache

        bid = build_id(self.path)
        return cache.source_key(self.path, bid), cache.source_identity(self.path, bid)

    def _cached(self):
        from ctracer.debuginfo.dwarf import cache

        key, identity = self._cache_identity()
        return cache.open_cached(key, "dwarf", CACHE_PRODUCER, identity)

    def _build_cached(self):
        """Build the catalog into the cache; None when the cache cannot be written (the
        caller then keeps the catalog in memory)."""
        import sqlite3

        from ctracer.debuginfo.dwarf import cache

        rows = self.catalog_rows()
        key, identity = self._cache_identity()
        try:
            with cache.CatalogWriter(key, "dwarf", CACHE_PRODUCER, identity,
                                     self.description) as writer:
                du.store_rows(rows, writer)
            return cache.SqliteCatalog(cache.cache_path(key, "dwarf"))
        except (OSError, sqlite3.Error):
            self._locations = {(k, n): off for k, n, _s, _m, off in rows.structs}
            return du.catalog_from_rows(rows)

    def catalog_rows(self) -> "du.CatalogRows":
        """Every unit summarized and merged, each function with its chosen address."""
        with _reading_dwarf(self.path):
            summaries, declared_rows = self.unit_summaries()
            rows = du.assemble_rows(summaries, declared_rows)
        self.resolve_addresses(rows)
        return rows

    def resolve_addresses(self, rows) -> None:
        """One address per function: its own entry among its out-of-line copies (the
        others being compiler clones), else that of its ELF symbol."""
        ambiguous = {a for f in rows.functions if len(f[2]) > 1 for a in f[2]}
        symbols = function_symbols(self.headers, ambiguous) if ambiguous else {}
        rows.functions = [f[:2] + (du.choose_address(f[0], f[6], f[2], symbols),) + f[3:]
                          for f in rows.functions]
        self._addresses_from_symbols(rows)

    def _addresses_from_symbols(self, rows) -> None:
        """Functions whose DWARF gives no entry although they are not inline — aliases
        made by identical-code folding, functions written in assembly — take the address
        of the one function symbol of that name, when there is exactly one."""
        wanted = {f[0] for f in rows.functions if f[2] is None and f[4] in _NOT_INLINE}
        if not wanted:
            return
        by_name: dict = {}
        for address, names in function_symbols(self.headers, names=wanted).items():
            for name in names & wanted:
                by_name.setdefault(name, set()).add(address)
        found = 0
        for i, f in enumerate(rows.functions):
            addresses = by_name.get(f[0]) if f[2] is None and f[4] in _NOT_INLINE else None
            if addresses is not None and len(addresses) == 1:
                rows.functions[i] = f[:2] + (next(iter(addresses)),) + f[3:]
                found += 1
        if found:
            rows.notes.append(f"{found} functions without an entry address in the DWARF "
                              "(aliases, assembly) take that of their ELF symbol")

    def unit_summaries(self):
        """Every unit summarized, and a function giving the rows of declared functions
        by offset: by the raw scanner, or by pyelftools for DWARF the scanner does not
        read."""
        from ctracer.debuginfo.dwarf import scan as ds

        try:
            sections = dwarf_sections(self.headers)
            units = ds.list_units(sections)
            _refuse_type_units(self.headers, units)
            state = ds.ScanState(units=units)
            summaries = ds.scan_units(sections, units, scan_workers(sections.info_size),
                                      state)
            _refuse_empty_catalog(self.headers, units, summaries)
            return summaries, lambda offsets: ds.declared_function_rows(sections, units,
                                                                        offsets, state)
        except ds.UnsupportedDwarf:
            known_structs: set = set()
            seen_inline: set = set()
            summaries = [du.summarize_unit(tables, known_structs, seen_inline)
                         for tables in self._walk_units()]
            return summaries, self._declared_rows_elftools

    def _declared_rows_elftools(self, offsets: list) -> list:
        wanted = set(offsets)
        rows = []
        for tables in self._walk_units():
            for sp in tables.subprograms:
                if sp.offset in wanted:
                    rows.append(du.function_row(tables, du.ShapeResolver(tables.types), sp))
        return rows

    def _walk_units(self) -> list:
        """Every unit's tables by pyelftools, their types and struct definitions shared
        so that references from one unit into another (DW_FORM_ref_addr) resolve."""
        import collections

        dwarf = self.dwarfinfo()
        walker = ElftoolsUnitWalker(dwarf, self.headers.big_endian)
        units = [walker.walk(cu) for cu in dwarf.iter_CUs()]
        all_types = collections.ChainMap(*(t.types for t in units))
        all_composites = collections.ChainMap(*(t.composites for t in units))
        for tables in units:
            tables.types = collections.ChainMap(tables.types, all_types)
            tables.load_composite = all_composites.get
        return units

    # -- full types

    def struct_location(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[int]:
        """The .debug_info offset of a struct's definition, None when there is none."""
        catalog = self.catalog()
        location = getattr(catalog, "location", None)
        if location is not None:
            return location(name, kind)
        return self._locations.get((ShapeKind(kind).value, name))

    def find_struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> TypeGraph:
        kind = ShapeKind(kind)
        offset = self.struct_location(name, kind)
        if offset is None:
            raise UnknownType(kind.value, name, self.struct_names(kind), self.description)
        # pyelftools keeps every DIE it parsed (a kernel struct: thousands) for the next
        # query: out of the collector's sight, they no longer slow later collections
        with _reading_dwarf(self.path), collector_paused(freeze=self._big()):
            return GraphBuilder(self.dwarfinfo(), self.headers.big_endian).build(offset)

    def _big(self) -> bool:
        info = self.headers.section(".debug_info")
        return info is not None and info.size >= BIG_DEBUG_INFO

    # -- pyelftools access

    def dwarfinfo(self):
        if self._dwarf is None:
            from elftools.common.exceptions import ELFError
            from elftools.elf.elffile import ELFFile

            self._file = open(self.path, "rb")
            try:
                if self.headers.type == ET_REL:
                    elf = ELFFile(self._file)
                    # only relocatable files (.o, .ko) need their .rela.debug_* (a
                    # vmlinux's are applied already), applied here: pyelftools takes
                    # ~100 µs a relocation (nfs.ko: 228,000 in .debug_info alone)
                    self._dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
                    if not self._relocate(self._dwarf):
                        self._dwarf = elf.get_dwarf_info(relocate_dwarf_sections=True)
                else:
                    elf = _elffile_reading_in_place(ELFFile)(self._file)
                    self._dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False)
            except (ELFError, ValueError) as err:
                raise InputFileError(f"{self.path}: cannot read DWARF ({err})") from None
        return self._dwarf

    def _relocate(self, dwarf) -> bool:
        """Apply the relocations of a relocatable file's .debug_* sections to
        pyelftools' copies of them; False when some are not ours to apply."""
        from ctracer.debuginfo.dwarf import scan as ds

        mapped = _mapped(self.path)
        try:
            for descriptor in vars(dwarf).values():
                if not (isinstance(descriptor, tuple) and hasattr(descriptor, "stream")):
                    continue  # not a DebugSectionDescriptor
                section = self.headers.section(descriptor.name)
                # .eh_frame (pc-relative relocations) is left as it is: types never
                # read it
                if section is None or section.type == 8 \
                        or not section.name.startswith(".debug_") \
                        or _relocations_of(self.headers, section) is None:
                    continue
                descriptor.stream.seek(0)
                descriptor.stream.write(section_data(self.headers, mapped, section))
        except ds.UnsupportedDwarf:
            return False
        finally:
            mapped.close()
        return True


def _elffile_reading_in_place(elffile_class):
    """pyelftools' ELFFile, but debug sections stored as they are (neither compressed
    nor to relocate) are read in place, through a `SectionFile` each, instead of being
    copied into memory first (a vmlinux: 0.3 s and 300 MB before its first struct)."""
    from elftools.dwarf.dwarfinfo import DebugSectionDescriptor

    class InPlace(elffile_class):
        def _read_dwarf_section(self, section, relocate_dwarf_sections):
            if section["sh_flags"] & SHF_COMPRESSED or section.name.startswith(".z") \
                    or section["sh_type"] == "SHT_NOBITS" or self.has_phantom_bytes():
                return super()._read_dwarf_section(section, relocate_dwarf_sections)
            return DebugSectionDescriptor(
                stream=SectionFile(self.stream.name, section["sh_offset"],
                                   section["sh_size"]),
                name=section.name, global_offset=section["sh_offset"],
                size=section["sh_size"], address=section["sh_addr"])

    return InPlace


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
        if whence == 1:
            return self.file.seek(position, 1) - self.offset
        base = self.offset + (self.size if whence == 2 else 0)
        return self.file.seek(base + position) - self.offset

    def tell(self) -> int:
        return self.file.tell() - self.offset

    def close(self) -> None:
        if "file" in self.__dict__:
            self.file.close()


_NOT_INLINE = ("none", "not_inlined", "declared_not_inlined")


# ------------------------------------------------------------------ pyelftools unit walk

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



def _prototype(die) -> tuple[list, bool]:
    """A subprogram's or subroutine type's parameter types, and whether it is variadic."""
    params, variadic = [], False
    for child in die.iter_children():
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
    a = die.attributes.get(name)
    if a is None:
        return None
    v = a.value
    if isinstance(v, list):  # DWARF 2/3 location expression: DW_OP_plus_uconst N
        return _plus_uconst(v)
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


def _plus_uconst(expr: list) -> Optional[int]:
    if not expr or expr[0] != 0x23:
        return None
    value, shift = 0, 0
    for byte in expr[1:]:
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value
    return None


def array_dims(die) -> tuple:
    dims = []
    for sub in die.iter_children():
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
        dirs = [d.decode("utf-8", "replace") if isinstance(d, bytes) else str(d)
                for d in header["include_directory"]]
        version = header["version"]
        if version < 5:
            dirs.insert(0, attr_str(cu.get_top_DIE(), "DW_AT_comp_dir") or "")
        base = 0 if version >= 5 else 1
        names = {}
        for i, entry in enumerate(header["file_entry"]):
            name = entry.name.decode("utf-8", "replace")
            d = entry.dir_index
            if not name.startswith("/") and 0 <= d < len(dirs) and dirs[d]:
                name = f"{dirs[d]}/{name}"
            names[i + base] = name
        return names

    def _children(self, parent, tables: du.UnitTables) -> None:
        for die in parent.iter_children():
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
        for child in die.iter_children():
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
            for child in die.iter_children():
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
        for child in die.iter_children():
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
        for child in die.iter_children():
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
