"""Opening an ELF file's debug info: DWARF, else its ``.BTF`` section.

`open_elf_types(path)` gives the `TypeModel` of an ELF file, or refuses in one line
(not ELF, no debug info, type units, split DWARF, dwz supplementary files, damaged
DWARF).  `DwarfTypes` is the model of a file's DWARF, at two levels as in
`ctracer.debuginfo.catalog`:

* the catalog (every function, struct summary and tracepoint), from the cache
  (`ctracer.debuginfo.dwarf.cache`, keyed by build-id) when it holds the file, else from a
  walk of every compile unit: the raw scanner (`ctracer.debuginfo.dwarf.scan`, fast, in
  forked workers) over the sections of `ctracer.debuginfo.dwarf.sections`, or pyelftools
  (`ctracer.debuginfo.dwarf.dies`) for DWARF the scanner does not read; the units merge
  into rows in `ctracer.debuginfo.dwarf.units`;
* `find_struct`: one struct definition and what it reaches, on demand, by the DIE offset
  the catalog remembered, read with pyelftools (`ctracer.debuginfo.dwarf.dies`).

A cached query imports none of the readers: only this module, the cache and the model.
"""

from __future__ import annotations

import contextlib
import os
import struct
from typing import TYPE_CHECKING, Optional

from ctracer.debuginfo.elf import (SHT_NOBITS, ElfHeaders, build_id, function_symbols,
                                   read_elf_headers)
from ctracer.debuginfo.gcpause import collector_paused
from ctracer.debuginfo.catalog import Catalog, ShapeKind
from ctracer.errors import InputFileError, UnknownType

if TYPE_CHECKING:  # (the type graph is defined only when a struct's full types are read)
    from ctracer.debuginfo.typegraph import TypeGraph


class _DwarfUnits:
    """`ctracer.debuginfo.dwarf.units`, imported on first use (a cached query never needs it:
    3 ms of start-up); the first use puts the module itself in its place."""

    def __getattr__(self, name: str):
        from ctracer.debuginfo.dwarf import units as dwarf_units

        globals()["du"] = dwarf_units
        return getattr(dwarf_units, name)


du = _DwarfUnits()

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
    if info is not None and info.size > 0 and info.type != SHT_NOBITS:
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
    except (TypeError, AttributeError, OverflowError, RecursionError) as err:
        # a damaged DIE gives values of the wrong kind (a number for a name, no type
        # where one must be): one line too, the cause kept for --debug
        raise InputFileError(f"{path}: its DWARF cannot be read ({type(err).__name__}: "
                             f"{err}); is the file damaged?") from err
    except Exception as err:  # pyelftools' own exceptions, or any raised inside it
        if not (type(err).__module__.startswith("elftools") or _raised_in_elftools(err)):
            raise
        raise InputFileError(f"{path}: its DWARF cannot be read ({type(err).__name__}: "
                             f"{err}); is the file damaged?") from None


def _raised_in_elftools(err: BaseException) -> bool:
    """Whether pyelftools raised it (its asserts and lookups meet damaged DWARF)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}elftools{os.sep}" in tb.tb_frame.f_code.co_filename


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

    def find_enum(self, name=None, enumerator=None):
        """None: enum values are named from the kernel's BTF only (`TypeModel.find_enum`)."""
        return None

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
                    self._locations = _struct_locations(rows)
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
            self._locations = _struct_locations(rows)
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
        ambiguous = {a for f in rows.functions if len(f.addresses) > 1 for a in f.addresses}
        symbols = function_symbols(self.headers, ambiguous) if ambiguous else {}
        rows.functions = [
            f._replace(address=du.choose_address(f.name, f.linkage_name, f.addresses, symbols))
            for f in rows.functions]
        self._addresses_from_symbols(rows)

    def _addresses_from_symbols(self, rows) -> None:
        """Functions whose DWARF gives no entry although they are not inline — aliases
        made by identical-code folding, functions written in assembly — take the address
        of the one function symbol of that name, when there is exactly one."""
        wanted = {f.name for f in rows.functions if _lacks_entry(f)}
        if not wanted:
            return
        by_name: dict = {}
        for address, names in function_symbols(self.headers, names=wanted).items():
            for name in names & wanted:
                by_name.setdefault(name, set()).add(address)
        found = 0
        for i, f in enumerate(rows.functions):
            addresses = by_name.get(f.name) if _lacks_entry(f) else None
            if addresses is not None and len(addresses) == 1:
                rows.functions[i] = f._replace(address=next(iter(addresses)))
                found += 1
        if found:
            rows.notes.append(f"{found} functions without an entry address in the DWARF "
                              "(aliases, assembly) take that of their ELF symbol")

    def unit_summaries(self):
        """Every unit summarized, and a function giving the rows of declared functions
        by offset: by the raw scanner, or by pyelftools for DWARF the scanner does not
        read."""
        from ctracer.debuginfo.dwarf import scan as ds
        from ctracer.debuginfo.dwarf.sections import dwarf_sections

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
            from ctracer.debuginfo.dwarf import dies

            known_structs: set = set()
            seen_inline: set = set()
            big_endian = self.headers.big_endian
            summaries = [du.summarize_unit(tables, known_structs, seen_inline)
                         for tables in dies.walk_units(self.dwarfinfo(), big_endian)]
            return summaries, lambda offsets: dies.declared_rows(self.dwarfinfo(),
                                                                 big_endian, offsets)

    # -- full types

    def struct_location(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[int]:
        """The .debug_info offset of a struct's definition, None when there is none."""
        catalog = self.catalog()
        location = getattr(catalog, "location", None)
        if location is not None:
            return location(name, kind)
        return self._locations.get((ShapeKind(kind).value, name))

    def find_struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> TypeGraph:
        from ctracer.debuginfo.dwarf.dies import GraphBuilder

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

    def dwarfinfo(self):
        """pyelftools' view of the file (`ctracer.debuginfo.dwarf.dies.open_dwarfinfo`)."""
        if self._dwarf is None:
            from ctracer.debuginfo.dwarf.dies import open_dwarfinfo

            self._file = open(self.path, "rb")
            self._dwarf = open_dwarfinfo(self.headers, self._file)
        return self._dwarf


_NOT_INLINE = ("none", "not_inlined", "declared_not_inlined")


def _lacks_entry(f) -> bool:
    """A function row without an address although the function is not inline-only."""
    return f.address is None and f.inline in _NOT_INLINE


def _struct_locations(rows) -> dict:
    """(kind, name) → DIE offset of each struct definition among catalog rows."""
    return {(s.kind, s.name): s.die_offset for s in rows.structs}
