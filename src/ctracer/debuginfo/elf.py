"""ELF reading both debug-info readers share, without pyelftools: section headers,
the GNU build-id note, program headers (for uprobe file offsets) and function symbols.

The DWARF reader takes its sections from here; the BTF reader finds an ELF file's
``.BTF`` section here; the DWARF cache is keyed by the build-id; the BPF runtime turns a
function's address into the file offset a uprobe.multi link takes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Optional

from ctracer.errors import InputFileError

ELF_MAGIC = b"\x7fELF"
ET_REL = 1             # e_type of a relocatable file (.o, .ko)
SHT_NOTE = 7
SHT_NOBITS = 8         # a section with no bytes in the file (stripped debug info)
SHF_COMPRESSED = 0x800
NT_GNU_BUILD_ID = 3


@dataclass(frozen=True)
class SectionHeader:
    """The fields of an ELF section header that the readers use."""

    name: str
    type: int
    offset: int
    size: int
    link: int = 0
    info: int = 0
    flags: int = 0


@dataclass(frozen=True)
class ElfHeaders:
    """What the ELF header and section headers say, read without pyelftools."""

    path: str
    is64: bool
    big_endian: bool
    sections: tuple[SectionHeader, ...]
    type: int = 0      # e_type: 1 relocatable (.o, .ko), 2 executable, 3 shared/PIE
    machine: int = 0   # e_machine: 62 x86-64, 183 AArch64, ...

    def section(self, name: str) -> Optional[SectionHeader]:
        """The section named ``name`` (None: none)."""
        for s in self.sections:
            if s.name == name:
                return s
        return None


def read_elf_headers(path: str) -> ElfHeaders:
    """Section headers of an ELF file; `InputFileError` when it is not one."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 52 or ident[:4] != ELF_MAGIC or ident[4] not in (1, 2):
                raise InputFileError(f"{path} is not an ELF file")
            is64, big = ident[4] == 2, ident[5] == 2
            e = ">" if big else "<"
            etype, machine = struct.unpack_from(e + "HH", ident, 16)
            if is64:
                shoff, = struct.unpack_from(e + "Q", ident, 0x28)
                shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", ident, 0x3A)
            else:
                shoff, = struct.unpack_from(e + "I", ident, 0x20)
                shentsize, shnum, shstrndx = struct.unpack_from(e + "HHH", ident, 0x2E)
            file_size = os.fstat(f.fileno()).st_size
            if shnum and (shentsize < (64 if is64 else 40)
                          or shoff + shentsize * shnum > file_size):
                raise InputFileError(f"{path} is a truncated or damaged ELF file (its "
                                     "section header table runs past its end)")
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            raw = [_section_fields(table, i * shentsize, is64, e) for i in range(shnum)]
            for _name, stype, _flags, off, size, _link, _info in raw:
                if stype != SHT_NOBITS and off + size > file_size:
                    raise InputFileError(f"{path} is a truncated or damaged ELF file (a "
                                         "section runs past its end)")
            names = b""
            if 0 < shstrndx < shnum:
                f.seek(raw[shstrndx][3])
                names = f.read(raw[shstrndx][4])
    except OSError as err:
        raise InputFileError(f"cannot read {path}: {err.strerror}") from None
    sections = tuple(SectionHeader(cstring(names, name), stype, off, size, link, info, flags)
                     for name, stype, flags, off, size, link, info in raw)
    return ElfHeaders(path, is64, big, sections, etype, machine)


def _section_fields(table: bytes, at: int, is64: bool, e: str) -> tuple:
    if is64:
        name, stype, flags, _addr, off, size, link, info = struct.unpack_from(
            e + "IIQQQQII", table, at)
    else:
        name, stype, flags, _addr, off, size, link, info = struct.unpack_from(
            e + "IIIIIIII", table, at)
    return name, stype, flags, off, size, link, info


def cstring(blob: bytes, at: int) -> str:
    """The NUL-terminated string at ``at`` in ``blob`` (undecodable bytes replaced)."""
    end = blob.find(b"\0", at)
    return blob[at:end if end >= 0 else len(blob)].decode("utf-8", "replace")


def build_id(path: str) -> Optional[str]:
    """The GNU build-id (hex) of an ELF file, None when it has none."""
    headers = read_elf_headers(path)
    e = ">" if headers.big_endian else "<"
    with open(path, "rb") as f:
        for s in headers.sections:
            if s.type != SHT_NOTE or s.size > 1 << 20:
                continue
            f.seek(s.offset)
            found = _find_build_id(f.read(s.size), e)
            if found:
                return found
    return None


def notes_build_id(notes: bytes, e: str = "<") -> Optional[str]:
    """The GNU build-id (hex) in a blob of ELF notes (a note section, or the running
    kernel's /sys/kernel/notes), None when none is there."""
    return _find_build_id(notes, e)


def _find_build_id(notes: bytes, e: str) -> Optional[str]:
    at = 0
    while at + 12 <= len(notes):
        namesz, descsz, ntype = struct.unpack_from(e + "III", notes, at)
        name_at = at + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if ntype == NT_GNU_BUILD_ID and notes[name_at:name_at + namesz].rstrip(b"\0") == b"GNU":
            return notes[desc_at:desc_at + descsz].hex()
        at = desc_at + (descsz + 3) // 4 * 4
    return None


def uprobe_offset(path: str, address: int) -> int:
    """The file offset of a virtual address (e.g. a function's entry), as uprobes want it,
    from the loadable segment (PT_LOAD) containing it."""
    for vaddr, filesz, offset in _loadable_segments(path):
        if vaddr <= address < vaddr + filesz:
            return address - vaddr + offset
    raise InputFileError(f"address {address:#x} is in no loadable segment of {path}")


PT_LOAD = 1


def _loadable_segments(path: str) -> list[tuple[int, int, int]]:
    """(p_vaddr, p_filesz, p_offset) of each PT_LOAD program header."""
    headers = read_elf_headers(path)
    e = ">" if headers.big_endian else "<"
    with open(path, "rb") as f:
        ident = f.read(64)
        if headers.is64:
            phoff, = struct.unpack_from(e + "Q", ident, 0x20)
            phentsize, phnum = struct.unpack_from(e + "HH", ident, 0x36)
            entry = struct.Struct(e + "IIQQQQQQ")
        else:
            phoff, = struct.unpack_from(e + "I", ident, 0x1C)
            phentsize, phnum = struct.unpack_from(e + "HH", ident, 0x2A)
            entry = struct.Struct(e + "IIIIIIII")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    if phentsize < entry.size or len(table) < phentsize * phnum:
        raise InputFileError(f"{path} has a truncated program header table")
    segments = []
    for i in range(phnum):
        fields = entry.unpack_from(table, i * phentsize)
        if headers.is64:
            ptype, _flags, offset, vaddr, _paddr, filesz = fields[:6]
        else:
            ptype, offset, vaddr, _paddr, filesz = fields[:5]
        if ptype == PT_LOAD:
            segments.append((vaddr, filesz, offset))
    return segments


def function_symbols(headers: ElfHeaders, addresses: Optional[set] = None,
                     names: Optional[set] = None, offset_zero: bool = False) -> dict[int, set]:
    """Function symbols (.symtab and .dynsym) by address, read without pyelftools; only
    at ``addresses`` (names decoded for those only) or of ``names`` when given.  Symbols
    of value 0 are skipped unless ``offset_zero`` (in a relocatable file, .o or .ko,
    values are section offsets and 0 is the first function of its section)."""
    e = ">" if headers.big_endian else "<"
    layout = struct.Struct(e + ("IBBHQQ" if headers.is64 else "IIIBBH"))
    found: dict[int, set] = {}
    with open(headers.path, "rb") as f:
        for section in headers.sections:
            if section.type not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
                continue
            if not 0 < section.link < len(headers.sections):
                raise InputFileError(f"{headers.path}: {section.name} links to no string "
                                     "table; is the file damaged?")
            strtab = headers.sections[section.link]
            f.seek(strtab.offset)
            strings = f.read(strtab.size)
            f.seek(section.offset)
            table = f.read(section.size // layout.size * layout.size)
            for entry in layout.iter_unpack(table):
                if headers.is64:
                    name, info, _other, shndx, value, _size = entry
                else:
                    name, value, _size, info, _other, shndx = entry
                if info & 0xF != 2 or (not shndx if offset_zero else not value) \
                        or (addresses is not None and value not in addresses):
                    continue
                text = cstring(strings, name)
                if names is None or text in names:
                    found.setdefault(value, set()).add(text)
    return found
