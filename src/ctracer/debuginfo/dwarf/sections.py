"""Raw DWARF sections: a debug section's bytes as the readers need them.

Most sections are read in place from the mapped file.  A section whose bytes in the file
are not its contents is copied first: decompressed when it is SHF_COMPRESSED (``-gz``,
zlib), and, in a relocatable file (.o, .ko), with its ``.rela`` relocations applied
(the absolute ones debug sections use).  `dwarf_sections` gives the raw scanner
(`ctracer.debuginfo.dwarf.scan`) every section it reads; `section_data` gives pyelftools
(`ctracer.debuginfo.dwarf.dies`) its relocated copies.  What is not written here (zstd,
SHT_REL, 32-bit or unknown relocations) raises `UnsupportedDwarf`: the caller then lets
pyelftools read the file.  No pyelftools here.
"""

from __future__ import annotations

import struct
from typing import Optional

from ctracer.debuginfo.dwarf.scan import Sections, UnsupportedDwarf
from ctracer.debuginfo.elf import ET_REL, SHF_COMPRESSED, SHT_NOBITS, ElfHeaders, SectionHeader
from ctracer.errors import InputFileError

ELFCOMPRESS_ZLIB = 1
#: relocation types that write S + A into debug sections: (machine, type) → width
_ABS_RELOCATIONS = {(62, 1): 8, (62, 10): 4, (62, 11): 4,      # x86-64: 64, 32, 32S
                    (183, 257): 8, (183, 258): 4}               # AArch64: ABS64, ABS32
#: `Sections` field → the section the raw scanner reads into it
_SCANNED_SECTIONS = {"info": ".debug_info", "abbrev": ".debug_abbrev", "str": ".debug_str",
                     "line_str": ".debug_line_str", "str_offsets": ".debug_str_offsets",
                     "addr": ".debug_addr", "line": ".debug_line",
                     "rnglists": ".debug_rnglists", "ranges": ".debug_ranges"}


def dwarf_sections(headers: ElfHeaders) -> Sections:
    """The DWARF sections the raw scanner reads: views into the mapped file, or copies
    where the file's bytes are not the section's (compressed, or relocatable with
    relocations to apply)."""
    mapped = mapped_file(headers.path)
    parts = {}
    for field, name in _SCANNED_SECTIONS.items():
        section = headers.section(name)
        if section is None or section.type == SHT_NOBITS:
            continue
        data = section_data(headers, mapped, section)
        parts[field] = (data, 0) if data is not None else (mapped, section.offset)
    if "info" not in parts or "abbrev" not in parts:
        raise InputFileError(f"{headers.path} has .debug_info but no .debug_abbrev")
    info, base = parts["info"]
    info_size = len(info) if base == 0 and info is not mapped \
        else headers.section(".debug_info").size
    return Sections(**parts, info_size=info_size, big_endian=headers.big_endian)


def mapped_file(path: str):
    """The whole file mapped read-only."""
    import mmap

    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def section_data(headers: ElfHeaders, mapped, section: SectionHeader) -> Optional[bytes]:
    """A section's bytes when they are not the file's as they stand: decompressed
    (SHF_COMPRESSED), with the relocations of a relocatable file applied; None when
    the mapped file can be read in place."""
    _check_bounds(headers, mapped, section)
    data = None
    if section.flags & SHF_COMPRESSED:
        data = _decompressed(headers, mapped, section)
    rela = relocations_of(headers, section)
    if rela is not None:
        if data is None:
            data = bytearray(mapped[section.offset:section.offset + section.size])
        _apply_relocations(headers, mapped, rela, data)
    return bytes(data) if data is not None else None  # hashable slices, as mmap's


def _check_bounds(headers: ElfHeaders, mapped, section: SectionHeader) -> None:
    if section.offset + section.size > len(mapped):
        raise InputFileError(f"{headers.path}: {section.name} runs past the end of the "
                             "file; is it truncated?")


def _decompressed(headers: ElfHeaders, mapped, section: SectionHeader) -> bytearray:
    import zlib

    e = ">" if headers.big_endian else "<"
    raw = mapped[section.offset:section.offset + section.size]
    try:
        if headers.is64:
            kind, _reserved, size, _align = struct.unpack_from(e + "IIQQ", raw)
            header = 24
        else:
            kind, size, _align = struct.unpack_from(e + "III", raw)
            header = 12
        if kind != ELFCOMPRESS_ZLIB:
            raise UnsupportedDwarf(f"{section.name} compressed with type {kind}")
        data = bytearray(zlib.decompress(raw[header:]))
    except (struct.error, zlib.error) as err:
        raise InputFileError(f"{headers.path}: {section.name} cannot be decompressed "
                             f"({err}); is the file damaged?") from None
    if len(data) != size:
        raise InputFileError(f"{headers.path}: {section.name} decompresses to "
                             f"{len(data)} bytes, not {size}")
    return data


def relocations_of(headers: ElfHeaders, section: SectionHeader) -> Optional[SectionHeader]:
    """The relocation section to apply to a debug section (relocatable files only)."""
    if headers.type != ET_REL:
        return None  # a vmlinux's .rela.debug_* are applied already
    if headers.section(".rel" + section.name) is not None:
        raise UnsupportedDwarf(f"SHT_REL relocations of {section.name}")
    rela = headers.section(".rela" + section.name)
    if rela is not None and not headers.is64:
        raise UnsupportedDwarf("relocations of a 32-bit ELF")
    return rela


def _apply_relocations(headers: ElfHeaders, mapped, rela: SectionHeader,
                       data: bytearray) -> None:
    """Write S + A at each relocation's offset (the absolute types debug sections use)."""
    e = ">" if headers.big_endian else "<"
    widths = {kind: width for (machine, kind), width in _ABS_RELOCATIONS.items()
              if machine == headers.machine}
    pack = {8: struct.Struct(e + "Q").pack_into, 4: struct.Struct(e + "I").pack_into}
    masks = {8: (1 << 64) - 1, 4: (1 << 32) - 1}
    if not 0 <= rela.link < len(headers.sections):
        raise InputFileError(f"{headers.path}: {rela.name} links to no symbol table")
    symtab = headers.sections[rela.link]
    _check_bounds(headers, mapped, symtab)
    _check_bounds(headers, mapped, rela)
    values = [v for _n, _i, _o, _s, v, _z in struct.iter_unpack(
        e + "IBBHQQ", mapped[symtab.offset:symtab.offset + symtab.size // 24 * 24])]
    try:
        for offset, info, addend in struct.iter_unpack(
                e + "QQq", mapped[rela.offset:rela.offset + rela.size // 24 * 24]):
            width = widths.get(info & 0xFFFFFFFF)
            if width is None:
                if info & 0xFFFFFFFF == 0:  # R_*_NONE
                    continue
                raise UnsupportedDwarf(f"relocation type {info & 0xFFFFFFFF}")
            pack[width](data, offset, (values[info >> 32] + addend) & masks[width])
    except (IndexError, struct.error) as err:
        raise InputFileError(f"{headers.path}: a relocation of {rela.name} points outside "
                             f"its section or symbol table ({err}); is the file damaged?") \
            from None
