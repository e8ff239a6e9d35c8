"""The raw DIE scanner against the pyelftools walk, unit by unit.

Both fill the same unit tables, so on every fixture variant (gcc/clang, DWARF 2/4/5,
-O0/-O2), on a relocatable object and on a many-unit program scanned by several
processes, their summaries must be identical; pyelftools is the reference.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ctracer.debuginfo import elf
from ctracer.debuginfo.dwarf import dies
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.debuginfo.dwarf import sections
from ctracer.errors import InputFileError
from ctracer.debuginfo.dwarf import scan as ds
from ctracer.debuginfo.dwarf import units as du
from ctracer.debuginfo.typegraph import iter_members_flat
from support.cbuild import Build, compile_c, need
from test_dwarf import SOURCES, binary, build_dir  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="session")
def scan_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dwarf-scan")


@pytest.fixture
def variant(binary) -> Path:
    """Each fixture variant, built once for the session by test_dwarf's fixture."""
    return binary


def scanned(path: Path, workers: int = 1) -> list:
    headers = elf.read_elf_headers(str(path))
    secs = sections.dwarf_sections(headers)
    return ds.scan_units(secs, ds.list_units(secs), workers)


def walked(path: Path) -> list:
    model = dwarf.DwarfTypes(str(path), elf.read_elf_headers(str(path)), use_cache=False)
    known, seen_inline = set(), set()
    return [du.summarize_unit(tables, known, seen_inline)
            for tables in dies.walk_units(model.dwarfinfo(), model.headers.big_endian)]


def assert_same_summaries(fast: list, reference: list) -> None:
    assert len(fast) == len(reference)
    for a, b in zip(fast, reference):
        for field in ("unit", "functions", "orphans", "structs", "tracepoints",
                      "declarations"):
            assert getattr(a, field) == getattr(b, field), (a.unit, field)


def test_scanner_matches_pyelftools(variant):
    assert_same_summaries(scanned(variant), walked(variant))


def test_relocatable_object_is_relocated(scan_dir):
    """In a .o (like a kernel module) string offsets and references in .debug_info are
    relocations: the scanner applies them as pyelftools does."""
    obj = scan_dir / "layouts.o"
    compile_c(SOURCES[0], obj, Build(opt=2), flags=["-c"])
    assert elf.read_elf_headers(str(obj)).type == elf.ET_REL
    fast = scanned(obj)
    assert_same_summaries(fast, walked(obj))
    assert "bits" in {row.name for row in fast[0].structs}


def _relocatable_module(scan_dir: Path, compiler: str = "gcc", extra=()) -> Path:
    """Like a kernel module: several units linked with ``ld -r``, so that abbreviation,
    string and line offsets in every unit header are relocations."""
    objects = []
    for source in SOURCES:
        obj = scan_dir / f"{source.stem}-{compiler}{''.join(extra)}.o"
        compile_c(source, obj, Build(compiler, opt=2, flags=tuple(extra)), flags=["-c"])
        objects.append(str(obj))
    module = scan_dir / f"module-{compiler}{''.join(extra)}.ko"
    subprocess.run(["ld", "-r", "-o", str(module), *objects], check=True)
    return module


def _graphs_relocated_by_pyelftools(path: Path) -> dict:
    from elftools.elf.elffile import ELFFile

    model = dwarf.open_elf_types(str(path), use_cache=False)
    names = model.struct_names()
    with open(path, "rb") as f:
        info = ELFFile(f).get_dwarf_info(relocate_dwarf_sections=True)
        return {name: dies.GraphBuilder(info, False).build(model.struct_location(name))
                for name in names}


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_relocatable_module_types_are_relocated_without_pyelftools(scan_dir, compiler,
                                                                   monkeypatch):
    """find_struct on a relocatable file reads what pyelftools reads once it has applied
    the relocations, but ctracer applies them itself: pyelftools takes ~100 µs each
    (nfs.ko, 228,000 in .debug_info: half a minute before the first struct)."""
    need(compiler)
    need("ld")
    module = _relocatable_module(scan_dir, compiler)
    assert len(ds.list_units(sections.dwarf_sections(elf.read_elf_headers(str(module))))) > 1
    reference = _graphs_relocated_by_pyelftools(module)
    assert "bits" in reference and "with_anon" in reference
    from elftools.elf.relocation import RelocationHandler

    def refuse(*_args):
        raise AssertionError("pyelftools applied relocations")

    monkeypatch.setattr(RelocationHandler, "apply_section_relocations", refuse)
    model = dwarf.open_elf_types(str(module), use_cache=False)
    for name, graph in reference.items():
        assert model.find_struct(name) == graph, name


def test_parallel_scan_matches_serial(scan_dir):
    """Units split across forked workers come back complete and in unit order."""
    sources = []
    for i in range(10):
        src = scan_dir / f"unit{i}.c"
        src.write_text(f"struct shared {{ int a; long b; }};\n"
                       f"struct own{i} {{ struct shared *s; char tag[{i + 1}]; }};\n"
                       f"int fn{i}(struct own{i} *o, struct shared *s) {{ return o->tag[0] + s->a; }}\n"
                       + ("int main(void) { return 0; }\n" if i == 0 else ""))
        sources.append(str(src))
    out = scan_dir / "many_units"
    compile_c(sources, out, Build(opt=1))
    serial, parallel = scanned(out, 1), scanned(out, 2)
    # each worker keeps its own first definitions; merged, the first unit's wins
    assert [s.unit for s in parallel] == [s.unit for s in serial]
    merged, reference = du.assemble_rows(parallel), du.assemble_rows(serial)
    assert merged.functions == reference.functions
    assert merged.structs == reference.structs
    assert [r.name for r in merged.structs].count("shared") == 1
    assert sorted(r.name for r in merged.functions) == sorted(
        ["main"] + [f"fn{i}" for i in range(10)])


def test_unsupported_dwarf_falls_back_to_pyelftools(variant, monkeypatch):
    fast = dwarf.open_elf_types(str(variant), use_cache=False).catalog()

    def refuse(_sections):
        raise ds.UnsupportedDwarf("pretend")

    monkeypatch.setattr(ds, "list_units", refuse)
    slow = dwarf.open_elf_types(str(variant), use_cache=False).catalog()
    assert list(slow.functions()) == list(fast.functions())
    for name in fast.struct_names():
        assert slow.struct(name) == fast.struct(name)
    assert slow.notes == fast.notes


def test_member_bit_offsets_follow_both_conventions():
    # DWARF 5 / clang: data_bit_offset is the answer
    assert du.member_bit_offset(None, 75, None, None, 4, 0, False) == 75
    # GCC DWARF 4: 4-byte unit at byte 8, bit_offset 30 counted from the MSB, 2 bits wide
    assert du.member_bit_offset(8, None, 30, 4, 2, 0, False) == 64 + 32 - 30 - 2
    # clang DWARF 4 straddling a packed unit: negative bit_offset
    assert du.member_bit_offset(0, None, -8, 4, 20, 0, False) == 20
    # big-endian targets count from the MSB already
    assert du.member_bit_offset(8, None, 30, 4, 2, 0, True) == 64 + 30


def test_dwz_compressed_file_reads_like_the_original(scan_dir):
    """dwz (as distributions run on their debug files) moves shared DIEs into partial
    units that the others reference with DW_FORM_ref_addr: the catalog must not change."""
    need("dwz")
    original = scan_dir / "before-dwz"
    compile_c(SOURCES, original, Build(opt=2))
    compressed = scan_dir / "after-dwz"
    compressed.write_bytes(original.read_bytes())
    done = subprocess.run(["dwz", str(compressed)], capture_output=True, text=True)
    if done.returncode != 0 or compressed.read_bytes() == original.read_bytes():
        pytest.skip(f"dwz left the file as it was: {done.stderr.strip()}")
    assert len(ds.list_units(sections.dwarf_sections(elf.read_elf_headers(str(compressed))))) > \
        len(ds.list_units(sections.dwarf_sections(elf.read_elf_headers(str(original)))))
    assert_same_summaries(scanned(compressed), walked(compressed))

    def described(path):
        catalog = dwarf.open_elf_types(str(path), use_cache=False).catalog()
        functions = sorted((f.name, f.unit, f.address, f.returns, f.params)
                           for f in catalog.functions())
        structs = {n: catalog.struct(n) for n in catalog.struct_names()}
        return functions, structs

    assert described(compressed) == described(original)

    def layout(path, name):  # type ids are DIE offsets and differ; the layout must not
        graph = dwarf.open_elf_types(str(path), use_cache=False).find_struct(name)
        return [(p, bits, m.bit_size, graph.size_of(m.type))
                for p, m, bits in iter_members_flat(graph, graph.root)]

    for name in ("with_anon", "bits", "callbacks", "flex"):
        assert layout(compressed, name) == layout(original, name)


def test_dwz_supplementary_file_is_refused_in_one_line(scan_dir):
    need("dwz")
    first, second = scan_dir / "multi1", scan_dir / "multi2"
    for out in (first, second):
        compile_c(SOURCES, out, Build(opt=0))
    done = subprocess.run(["dwz", "-m", str(scan_dir / "common.debug"), str(first), str(second)],
                          capture_output=True, text=True)
    if done.returncode != 0 or elf.read_elf_headers(str(first)).section(
            ".gnu_debugaltlink") is None:
        pytest.skip(f"dwz -m made no supplementary file: {done.stderr.strip()}")
    with pytest.raises(InputFileError, match="supplementary file .*common.debug"):
        dwarf.open_elf_types(str(first))


@pytest.mark.parametrize("version", [4, 5])
def test_type_units_are_refused_in_one_line(scan_dir, version):
    out = scan_dir / f"type-units-dwarf{version}"
    compile_c(SOURCES, out, Build(dwarf=version), flags=["-fdebug-types-section"])
    with pytest.raises(InputFileError, match="type units"):
        dwarf.open_elf_types(str(out), use_cache=False).catalog()


@pytest.mark.parametrize("version", [4, 5])
def test_split_dwarf_is_refused_in_one_line(scan_dir, version):
    out = scan_dir / f"split-dwarf{version}"
    compile_c(SOURCES, out, Build(dwarf=version), flags=["-gsplit-dwarf"], cwd=scan_dir)
    with pytest.raises(InputFileError, match="split DWARF"):
        dwarf.open_elf_types(str(out), use_cache=False).catalog()


def test_damaged_dwarf_is_one_line(scan_dir):
    out = scan_dir / "damaged"
    compile_c(SOURCES, out, Build(opt=0))
    info = elf.read_elf_headers(str(out)).section(".debug_info")
    data = bytearray(out.read_bytes())
    for at in range(info.offset + 40, info.offset + info.size, 7):
        data[at] = 0xFF  # abbreviation codes and sizes that make no sense
    out.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match="DWARF cannot be read"):
        dwarf.open_elf_types(str(out), use_cache=False).catalog()


@pytest.mark.parametrize("relocatable", [False, True], ids=["program", "module"])
def test_compressed_debug_sections_read_like_plain_ones(scan_dir, relocatable):
    """``-gz`` (SHF_COMPRESSED, zlib) sections are decompressed, then relocated in a
    relocatable file: the catalog and the layouts are those of the plain build."""

    def build(extra):  # (ld -r writes its output uncompressed: one object then)
        out = scan_dir / f"{'object' if relocatable else 'program'}{''.join(extra)}"
        sources = SOURCES[:1] if relocatable else SOURCES
        compile_c(sources, out, Build(opt=2, flags=extra), flags=["-c"] if relocatable else [])
        return out

    plain, compressed = build(()), build(("-gz",))
    info = elf.read_elf_headers(str(compressed)).section(".debug_info")
    if not info.flags & elf.SHF_COMPRESSED:
        pytest.skip("this toolchain wrote no compressed .debug_info with -gz")
    assert_same_summaries(scanned(compressed), scanned(plain))

    def described(path):
        model = dwarf.open_elf_types(str(path), use_cache=False)
        catalog = model.catalog()
        graphs = {}
        for name in catalog.struct_names():
            graph = model.find_struct(name)
            graphs[name] = [(p, bits, m.bit_size, graph.size_of(m.type))
                            for p, m, bits in iter_members_flat(graph, graph.root)]
        return sorted((f.name, f.returns, f.params) for f in catalog.functions()), graphs

    assert described(compressed) == described(plain)
