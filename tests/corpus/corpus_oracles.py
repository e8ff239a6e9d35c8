"""The reference tools the corpus check holds ctracer against, run and parsed.

* ``pfunct -F dwarf --class=X``: out-of-line functions with a parameter ``struct X *``,
  in compile units that define ``struct X``;
* ``pahole -C A,B,...``: layouts from DWARF or BTF (``--btf_base`` for split BTF);
* ``llvm-dwarfdump --name``: which compile units define a struct or a function;
* ``nm``: the symbol table (which functions exist only as compiler clones, such as
  ``foo.constprop.0``);
* ``bpftool btf dump``: the sizes of every struct of a name in BTF (kernels reuse some
  struct names for different structs).

pahole 1.24 quirk: with several names, ``-C`` looks them up while it streams compile
units, in the order given, and stops at the first it cannot find among the units left
(``type 'X' not found``), so names must be given in the order of their first definition
in .debug_info.  `pahole_layouts` does that, and retries a refused name on its own.  And
where a typedef has the struct's name (``typedef struct bridge_id bridge_id;``), ``-C``
prints the typedef line, not the struct: such names are reported as shadowed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from pahole_blocks import pahole_blocks

#: one command-line argument may not exceed 128 KiB (MAX_ARG_STRLEN); stay below
_MAX_NAMES_ARG = 100_000
DWARFDUMP_NAMES = ("llvm-dwarfdump", "llvm-dwarfdump-14")


@dataclass
class ToolRun:
    argv: list[str]
    stdout: str
    stderr: str
    returncode: int
    seconds: float


def run_tool(argv: Sequence[str]) -> ToolRun:
    start = time.perf_counter()
    done = subprocess.run(list(argv), capture_output=True, text=True, errors="replace")
    return ToolRun(list(argv), done.stdout, done.stderr, done.returncode,
                   time.perf_counter() - start)


def _checked(run: ToolRun) -> ToolRun:
    if run.returncode != 0:
        tail = (run.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"{' '.join(run.argv[:4])} ... exited {run.returncode}: {tail}")
    return run


def dwarfdump_command() -> Optional[str]:
    for name in DWARFDUMP_NAMES:
        if shutil.which(name):
            return name
    return None


def missing_tools() -> list[str]:
    """Tools the checks need that are not installed."""
    missing = [t for t in ("pahole", "pfunct", "nm", "bpftool") if shutil.which(t) is None]
    if dwarfdump_command() is None:
        missing.append("llvm-dwarfdump (Debian package llvm)")
    return missing


# ------------------------------------------------------------------ pfunct


@dataclass
class PfunctResult:
    names: set[str]
    seconds: float


def pfunct_class(binary: Path, struct: str) -> PfunctResult:
    run = _checked(run_tool(["pfunct", "-F", "dwarf", f"--class={struct}", str(binary)]))
    return PfunctResult(set(run.stdout.split()), run.seconds)


# ------------------------------------------------------------------ pahole


_SAME_NAME_TYPEDEF = re.compile(r"^typedef (?:struct|union) (\w+) \1;$", re.M)


def split_layouts(text: str) -> dict[str, str]:
    """pahole's output cut into ``name -> text`` (the first block of a name wins, as
    with ``pahole -C NAME``)."""
    blocks: dict[str, str] = {}
    for _kind, name, block in pahole_blocks(text):
        blocks.setdefault(name, block)
    return blocks


@dataclass
class PaholeResult:
    texts: dict[str, str] = field(default_factory=dict)
    #: names pahole -C does not find even on their own
    not_found: list[str] = field(default_factory=list)
    #: names for which pahole -C prints a same-named typedef instead of the struct
    typedef_shadowed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    runs: int = 0


def _chunks(names: Sequence[str]) -> Iterable[list[str]]:
    chunk: list[str] = []
    size = 0
    for name in names:
        if chunk and size + len(name) + 1 > _MAX_NAMES_ARG:
            yield chunk
            chunk, size = [], 0
        chunk.append(name)
        size += len(name) + 1
    if chunk:
        yield chunk


def pahole_layouts(binary: Path, names: Sequence[str], fmt: str,
                   btf_base: Optional[Path] = None) -> PaholeResult:
    """``pahole -F fmt -C NAME`` for every name, in as few runs as pahole allows.

    ``names`` should come in .debug_info order of their first definition (see the
    module docstring); a name pahole refuses in a list is asked on its own."""
    prefix = ["pahole", "-F", fmt] + ([f"--btf_base={btf_base}"] if btf_base else [])
    out = PaholeResult()
    pending = list(names)
    while pending:
        chunk = next(iter(_chunks(pending)))
        run = run_tool(prefix + ["-C", ",".join(chunk), str(binary)])
        out.seconds += run.seconds
        out.runs += 1
        printed = split_layouts(run.stdout)
        out.texts.update((n, t) for n, t in printed.items() if n in chunk)
        shadowed = set(_SAME_NAME_TYPEDEF.findall(run.stdout)) & set(chunk) - set(printed)
        out.typedef_shadowed.extend(sorted(shadowed))
        refused = re.search(r"type '([^']+)' not found", run.stderr)
        if refused is None and run.returncode != 0:
            _checked(run)
        settled = set(printed) | shadowed
        if refused:
            name = refused.group(1)
            settled.add(name)
            alone = run_tool(prefix + ["-C", name, str(binary)])
            out.seconds += alone.seconds
            out.runs += 1
            text = split_layouts(alone.stdout).get(name)
            if text is not None:
                out.texts[name] = text
            elif name in _SAME_NAME_TYPEDEF.findall(alone.stdout):
                out.typedef_shadowed.append(name)
            else:
                out.not_found.append(name)
        elif not settled & set(chunk):
            out.not_found.extend(chunk)  # pahole printed nothing and said nothing
            settled.update(chunk)
        pending = [n for n in pending if n not in settled]
    return out


# ------------------------------------------------------------------ nm


@dataclass
class Symbols:
    """Function symbols (nm types T, t, W, w) of one file."""

    by_name: dict[str, set[int]]
    by_address: dict[int, set[str]]
    seconds: float = 0.0

    def clones_at(self, name: str, address: Optional[int]) -> list[str]:
        """Compiler clones of ``name`` (``name.constprop.0``...) at ``address``."""
        if address is None:
            return []
        return sorted(n for n in self.by_address.get(address, ())
                      if n.startswith(name + "."))


def function_symbols(binary: Path) -> Symbols:
    run = _checked(run_tool(["nm", "--defined-only", str(binary)]))
    by_name: dict[str, set[int]] = defaultdict(set)
    by_address: dict[int, set[str]] = defaultdict(set)
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in ("T", "t", "W", "w"):
            address = int(parts[0], 16)
            by_name[parts[2]].add(address)
            by_address[address].add(parts[2])
    return Symbols(dict(by_name), dict(by_address), run.seconds)


# ------------------------------------------------------------------ llvm-dwarfdump


@dataclass(frozen=True)
class Die:
    unit: str
    tag: str
    name: str
    declaration: bool


@dataclass
class UnitFacts:
    """What llvm-dwarfdump says about some names: the DIEs carrying them, by unit."""

    dies: list[Die]
    seconds: float = 0.0

    def _units(self, tag: str, name: str) -> set[str]:
        return {d.unit for d in self.dies
                if d.tag == tag and d.name == name and not d.declaration}

    def units_defining_struct(self, name: str) -> set[str]:
        return self._units("DW_TAG_structure_type", name)

    def units_defining_function(self, name: str) -> set[str]:
        return self._units("DW_TAG_subprogram", name)


_TAG = re.compile(r"^0x[0-9a-f]+:\s+(DW_TAG_\w+)")
_ATTR = re.compile(r"^\s+(DW_AT_\w+)\s+\((.*)\)$")


def parse_dwarfdump(text: str) -> list[Die]:
    """DIEs printed by ``llvm-dwarfdump --show-parents`` (each match comes with its
    parents, the compile unit first), with the unit each belongs to."""
    dies: list[Die] = []
    unit = ""
    tag: Optional[str] = None
    attrs: dict[str, str] = {}

    def close() -> None:
        if tag and tag != "DW_TAG_compile_unit" and "DW_AT_name" in attrs:
            dies.append(Die(unit, tag, attrs["DW_AT_name"].strip('"'),
                            attrs.get("DW_AT_declaration") == "true"))

    for line in text.splitlines():
        m = _TAG.match(line)
        if m:
            close()
            tag, attrs = m.group(1), {}
            continue
        a = _ATTR.match(line)
        if a and tag:
            attrs[a.group(1)] = a.group(2)
            if tag == "DW_TAG_compile_unit" and a.group(1) == "DW_AT_name":
                unit = a.group(2).strip('"')
    close()
    return dies


def unit_facts(binary: Path, names: Iterable[str]) -> UnitFacts:
    tool = dwarfdump_command()
    if tool is None:
        raise RuntimeError("llvm-dwarfdump is not installed (Debian package llvm)")
    wanted = sorted(set(names))
    run = _checked(run_tool([tool, "--debug-info", "--show-parents"]
                            + [f"--name={n}" for n in wanted] + [str(binary)]))
    return UnitFacts(parse_dwarfdump(run.stdout), run.seconds)


# ------------------------------------------------------------------ bpftool


_BTF_STRUCT = re.compile(r"^\[\d+\] (STRUCT|UNION) '([^']+)' size=(\d+)", re.M)


@dataclass
class BtfStructSizes:
    """The size of every struct (or union) record of each name in a BTF."""

    sizes: dict[str, list[int]]
    seconds: float = 0.0


def btf_struct_sizes(binary: Path, base: Optional[Path] = None) -> BtfStructSizes:
    argv = ["bpftool"] + (["-B", str(base)] if base else []) + [
        "btf", "dump", "file", str(binary)]
    run = _checked(run_tool(argv))
    sizes: dict[str, list[int]] = defaultdict(list)
    for kind, name, size in _BTF_STRUCT.findall(run.stdout):
        if kind == "STRUCT":
            sizes[name].append(int(size))
    return BtfStructSizes(dict(sizes), run.seconds)
