"""Where a code address of a program is: function + offset, source file:line, the
inlined function it is in, and which instruction ends there.

`CodeMap` answers for one ELF file (a program or shared library with DWARF, or a
vmlinux with DWARF): the function symbol holding an address (from ``.symtab``, read on
first use: 200,000 symbols of a vmlinux take 15 s), the line table row covering it
(DWARF line programs, read with pyelftools through
`ctracer.debuginfo.dwarf.dies.open_elffile`: the row of the
greatest address not past it within its sequence), the innermost inlined subroutine
whose ranges hold it (``DW_TAG_inlined_subroutine``, read only inside the functions of
the compile units holding the asked addresses), and, for an address just after an
instruction, that instruction's start (`instruction_before`: a linear sweep of the
function with capstone, the well-kept disassembler, since x86 instructions have no
fixed length).

Where the file has ``.debug_aranges`` (a vmlinux: ~3,000 compile units, a 20 MB line
table) only the compile units holding the asked addresses are decoded, found through
it; else (a small program) the whole line table once.

Used for the writes of ``--watch``: a data breakpoint traps after the writing
instruction, so the writer is the instruction ending at the trap's ip.
"""

from __future__ import annotations

import bisect
import posixpath
from dataclasses import dataclass
from typing import Iterable, Optional

from ctracer.debuginfo.dwarf.dies import open_dwarfinfo, open_elffile
from ctracer.debuginfo.elf import read_elf_headers


@dataclass(frozen=True)
class Location:
    """Where an address is: ``function`` + ``offset`` (None when no symbol holds it),
    the source ``file``:``line`` (None without a line table row), ``inlined``: the
    innermost inlined function around it, "" when none, and ``inlined_from``: where
    that one was inlined, and each outer one, innermost first (``tcp_input.c:3531 in
    tcp_clean_rtx_queue, tcp_input.c:4081 in tcp_ack``: DWARF's call lines)."""

    address: int
    function: Optional[str]
    offset: int
    file: Optional[str]
    line: Optional[int]
    inlined: str = ""
    inlined_from: str = ""

    @property
    def where(self) -> str:
        """``function+offset``, else the address in hex."""
        return f"{self.function}+{self.offset:#x}" if self.function else f"{self.address:#x}"

    @property
    def source(self) -> str:
        """``file:line`` ("" when unknown)."""
        return f"{self.file}:{self.line}" if self.file and self.line else ""


class CodeMap:
    """Symbols, line table and inlined functions of one ELF file."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "rb")
        self.elf = open_elffile(self._file)
        self._symbols: Optional[list[tuple[int, int, str]]] = None
        # through the prepared sections: an executable's .rela.debug_* (6.1's vmlinux
        # has 270 MB of them) are applied already, and pyelftools would apply them again
        self._dwarf = open_dwarfinfo(read_elf_headers(path), self._file) \
            if self.elf.has_dwarf_info() else None
        self._aranges = self._dwarf.get_aranges() if self._dwarf is not None else None
        self._rows: Optional[list[tuple[int, int, str, int, bool]]] = None
        self._unit_rows: dict[int, tuple[list, list[int]]] = {}   # CU offset -> rows
        self._inlined: list[tuple[int, int, int, str, str]] = []
        self._inlined_read: set[tuple[int, int]] = set()   # (CU, DIE) offsets read

    def close(self) -> None:
        """Close the ELF file."""
        self._file.close()

    # -- symbols ----------------------------------------------------------------

    def _load_symbols(self) -> list[tuple[int, int, str]]:
        if self._symbols is None:
            symbols = []
            # .symtab, else (a stripped library) the exported functions of .dynsym
            symtab = self.elf.get_section_by_name(".symtab") or \
                self.elf.get_section_by_name(".dynsym")
            if symtab is not None:
                for sym in symtab.iter_symbols():
                    if sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC") \
                            and sym["st_value"]:
                        symbols.append((sym["st_value"], sym["st_size"], sym.name))
            self._symbols = sorted(symbols)
            self._starts = [s[0] for s in self._symbols]
        return self._symbols

    def section_address(self, name: str) -> Optional[int]:
        """Where section ``name`` (e.g. ``.text``) is linked, None when absent."""
        section = self.elf.get_section_by_name(name)
        return section["sh_addr"] if section is not None else None

    def symbol(self, address: int) -> Optional[tuple[int, int, str]]:
        self._load_symbols()
        at = bisect.bisect_right(self._starts, address) - 1
        if at < 0:
            return None
        while at > 0 and self._symbols[at - 1][0] == self._symbols[at][0]:
            at -= 1   # aliases: the first name listed at that address
        start, size, name = self._symbols[at]
        return self._symbols[at] if address < start + max(size, 1) else None

    # -- line table ---------------------------------------------------------------

    def _unit_at(self, address: int) -> Optional[int]:
        """The offset of the compile unit holding ``address`` by ``.debug_aranges``."""
        if self._aranges is None:
            return None
        return self._aranges.cu_offset_at_addr(address)

    def _line_rows(self, units=None) -> tuple[list[tuple[int, int, str, int, bool]],
                                              list[int]]:
        """(address, sequence number, file, line, end of sequence) by address, and their
        addresses: of the compile units ``units`` (the offsets of some), else of all."""
        rows: list[tuple[int, int, str, int, bool]] = []
        seq = 0
        if self._dwarf is not None:
            cus = self._dwarf.iter_CUs() if units is None else \
                (self._dwarf.get_CU_at(offset) for offset in units)
            for cu in cus:
                program = self._dwarf.line_program_for_CU(cu)
                if program is None:
                    continue
                names = _file_names(program, _comp_dir(cu))
                for entry in program.get_entries():
                    state = entry.state
                    if state is None:
                        continue
                    rows.append((state.address, seq, names.get(state.file, "?"), state.line,
                                 state.end_sequence))
                    if state.end_sequence:
                        seq += 1
        rows.sort(key=lambda r: (r[0], r[4] is False))   # an end before a start at one address
        return rows, [r[0] for r in rows]

    def line(self, address: int) -> tuple[Optional[str], Optional[int]]:
        unit = self._unit_at(address)
        if unit is not None:
            if unit not in self._unit_rows:
                self._unit_rows[unit] = self._line_rows([unit])
            rows, addresses = self._unit_rows[unit]
        else:
            if self._rows is None:
                self._rows, self._row_addresses = self._line_rows()
            rows, addresses = self._rows, self._row_addresses
        at = bisect.bisect_right(addresses, address) - 1
        if at < 0 or rows[at][4]:   # before every row, or past a sequence's end
            return None, None
        return rows[at][2], rows[at][3]

    # -- inlined functions ------------------------------------------------------------

    def _inlined_ranges(self, addresses: Iterable[int]) -> list[tuple[int, int, int, str, str]]:
        """(low, high, depth, name) of the inlined subroutines of the functions (of the
        compile units) that hold any of ``addresses``, added to those read before."""
        if self._dwarf is None:
            return self._inlined
        wanted = sorted(set(addresses))
        out = self._inlined
        units = {self._unit_at(a) for a in wanted}
        if None in units:   # no .debug_aranges entry: ask every unit's own ranges
            cus = self._dwarf.iter_CUs()
        else:
            cus = (self._dwarf.get_CU_at(offset) for offset in sorted(units))
        for cu in cus:
            top = cu.get_top_DIE()
            spans = _ranges(self._dwarf, cu, top)
            if spans and not any(lo <= a < hi for lo, hi in spans for a in wanted):
                continue
            for child in top.iter_children():
                if (cu.cu_offset, child.offset) in self._inlined_read:
                    continue
                if child.tag == "DW_TAG_subprogram":
                    spans = _ranges(self._dwarf, cu, child)
                    if not any(lo <= a < hi for lo, hi in spans for a in wanted):
                        continue   # a function holding none (or an abstract one)
                self._inlined_read.add((cu.cu_offset, child.offset))
                files = None
                if child.tag == "DW_TAG_subprogram":
                    program = self._dwarf.line_program_for_CU(cu)
                    files = _file_names(program, _comp_dir(cu)) if program is not None else {}
                self._inlined_below(cu, child, 1, out, _origin_name(child), files or {})
        return out

    def _inlined_below(self, cu, die, depth: int, out: list, caller: str,
                       files: dict[int, str]) -> None:
        """The inlined subroutines at and under ``die`` (at ``depth``, inside the
        function named ``caller``) into ``out``: (low, high, depth, name, where it was
        inlined: ``file:line in caller``)."""
        if die.tag == "DW_TAG_inlined_subroutine":
            name = _origin_name(die)
            attrs = die.attributes
            call_file = files.get(attrs["DW_AT_call_file"].value) \
                if "DW_AT_call_file" in attrs else None
            call_line = attrs["DW_AT_call_line"].value if "DW_AT_call_line" in attrs else None
            site = f"{call_file}:{call_line} in {caller}" if call_file and call_line \
                else f"in {caller}"
            for lo, hi in _ranges(self._dwarf, cu, die):
                out.append((lo, hi, depth, name, site))
            caller = name
        if die.has_children:
            for child in die.iter_children():
                self._inlined_below(cu, child, depth + 1, out, caller, files)

    def _inlined_around(self, address: int) -> list[tuple[int, int, int, str, str]]:
        """The inlined subroutines holding ``address``, innermost first."""
        return sorted((r for r in self._inlined if r[0] <= address < r[1]),
                      key=lambda r: -r[2])

    def inlined_at(self, address: int) -> str:
        around = self._inlined_around(address)
        return around[0][3] if around else ""

    def inlined_from(self, address: int) -> str:
        """The functions inlined at ``address``, innermost first, comma-separated."""
        return ", ".join(r[4] for r in self._inlined_around(address))

    # -- instructions -------------------------------------------------------------------

    def _bytes_at(self, address: int, size: int) -> Optional[bytes]:
        for seg in self.elf.iter_segments():
            if seg["p_type"] != "PT_LOAD":
                continue
            start = seg["p_vaddr"]
            if start <= address and address + size <= start + seg["p_filesz"]:
                self._file.seek(seg["p_offset"] + address - start)
                return self._file.read(size)
        return None

    def instruction_before(self, address: int) -> Optional[int]:
        """The start of the instruction ending at ``address`` (None when the sweep of
        its function does not land on it: not code, or data inside the function)."""
        from capstone import CS_ARCH_X86, CS_MODE_64, Cs

        sym = self.symbol(address - 1)
        if sym is None:
            return None
        start, size, _ = sym
        code = self._bytes_at(start, address - start)
        if code is None:
            return None
        last = None
        for insn_address, insn_size, _m, _o in Cs(CS_ARCH_X86, CS_MODE_64).disasm_lite(code, start):
            if insn_address + insn_size == address:
                last = insn_address
        return last

    def locate(self, address: int, *, named: bool = True) -> Location:
        """Where ``address`` is; ``named=False``: no function (its symbol not looked up,
        e.g. for a kernel, whose running symbols name it)."""
        sym = self.symbol(address) if named else None
        file, line = self.line(address)
        return Location(address, sym[2] if sym else None, address - sym[0] if sym else 0,
                        file, line, self.inlined_at(address), self.inlined_from(address))

    def writers(self, after: Iterable[int]) -> dict[int, Location]:
        """For each trap address (just after a writing instruction), the writing
        instruction's location (its start, when the sweep finds it; else the byte
        before the trap address, which lies inside it: the same line)."""
        after = set(after)
        starts = {a: self.instruction_before(a) or a - 1 for a in after}
        self._inlined_ranges(starts.values())
        return {a: self.locate(s) for a, s in starts.items()}

    def lines(self, addresses: Iterable[int]) -> dict[int, Location]:
        """Each address's file:line and inlined function (no function name, no
        instruction sweep): the byte before a trap or return address lies in its
        instruction, so its line is that instruction's."""
        addresses = set(addresses)
        self._inlined_ranges(addresses)
        return {a: self.locate(a, named=False) for a in addresses}

    def callers(self, returns: Iterable[int]) -> dict[int, Location]:
        """For each return address of a stack, the call's location (the byte before a
        return address is inside the call instruction)."""
        returns = set(returns)
        self._inlined_ranges(r - 1 for r in returns)
        out = {}
        for r in returns:
            loc = self.locate(r - 1)
            out[r] = Location(r, loc.function, loc.offset + 1, loc.file, loc.line, loc.inlined,
                              loc.inlined_from)
        return out


def _file_names(program, comp_dir: str = "") -> dict[int, str]:
    """File index -> the file's path as its compile unit names it, relative to the unit's
    compile directory when it lies below it (``include/net/sock.h`` in a kernel,
    ``watchdemo.c`` in a program; ``/usr/include/stdio.h`` stays whole), for DWARF 4
    (files and directories 1-based, directory 0 the compile directory) and 5 (0-based)."""
    header = program.header
    version = header.get("version", 4)
    dirs = [_text(d) for d in header.get("include_directory", [])]
    if version < 5:
        dirs = [comp_dir] + dirs
    root = posixpath.normpath(comp_dir) if comp_dir else ""
    out = {}
    for i, entry in enumerate(header.get("file_entry", [])):
        index = getattr(entry, "dir_index", 0) or 0
        directory = dirs[index] if 0 <= index < len(dirs) else ""
        path = posixpath.normpath(posixpath.join(comp_dir, directory, _text(entry.name)))
        if root and path.startswith(root + "/"):
            path = path[len(root) + 1:]
        out[i if version >= 5 else i + 1] = path
    return out


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _comp_dir(cu) -> str:
    attr = cu.get_top_DIE().attributes.get("DW_AT_comp_dir")
    return _text(attr.value) if attr is not None else ""


def _ranges(dwarf, cu, die) -> list[tuple[int, int]]:
    attrs = die.attributes
    if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
        lo = attrs["DW_AT_low_pc"].value
        hi = attrs["DW_AT_high_pc"]
        return [(lo, hi.value if hi.form == "DW_FORM_addr" else lo + hi.value)]
    if "DW_AT_ranges" in attrs:
        try:
            ranges = dwarf.range_lists()
            if ranges is None:
                return []
            base = cu.get_top_DIE().attributes.get("DW_AT_low_pc").value \
                if "DW_AT_low_pc" in cu.get_top_DIE().attributes else 0
            out = []
            for entry in ranges.get_range_list_at_offset(attrs["DW_AT_ranges"].value, cu=cu):
                if hasattr(entry, "begin_offset"):
                    if getattr(entry, "is_absolute", False):
                        out.append((entry.begin_offset, entry.end_offset))
                    else:
                        out.append((base + entry.begin_offset, base + entry.end_offset))
                elif hasattr(entry, "base_address"):
                    base = entry.base_address
            return out
        except Exception:  # an unreadable range list hides one inlined name, no more
            return []
    return []


def _origin_name(die) -> str:
    for _ in range(4):
        name = die.attributes.get("DW_AT_name")
        if name is not None:
            return name.value.decode() if isinstance(name.value, bytes) else str(name.value)
        origin = die.attributes.get("DW_AT_abstract_origin") or \
            die.attributes.get("DW_AT_specification")
        if origin is None:
            return "?"
        die = die.get_DIE_from_attribute("DW_AT_abstract_origin"
                                         if "DW_AT_abstract_origin" in die.attributes
                                         else "DW_AT_specification")
    return "?"
