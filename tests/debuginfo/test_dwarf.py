"""The DWARF reader against pahole/pfunct and the C source, on fixtures compiled here.

Fixtures (tests/fixtures/dwarf/*.c) are built with gcc and clang, DWARF 2/4/5, -O0/-O2;
every struct's layout is compared member by member with `pahole -C`, enumerators with
pahole's enum output, the function set with `pfunct -P` and with the source's own
definitions, addresses with `nm`, and the ELF helpers with readelf/objdump.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c, need
from ctracer.debuginfo import elf
from ctracer.debuginfo.dwarf import dies
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.errors import InputFileError, UnknownType
from ctracer.debuginfo.catalog import Inline, ShapeKind
from ctracer.debuginfo.typegraph import (ArrayType, CompositeType, EnumType, FunctionType,
                                     QualifiedType, TypeGraph)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "dwarf"
SOURCES = sorted(FIXTURES.glob("*.c"))

VARIANTS = {
    "gcc-dwarf5-O0": Build("gcc", 5, 0),
    "gcc-dwarf5-O2": Build("gcc", 5, 2),
    "gcc-dwarf4-O0": Build("gcc", 4, 0),
    "gcc-dwarf4-O2": Build("gcc", 4, 2),
    "gcc-dwarf2-O0": Build("gcc", 2, 0),
    "clang-dwarf5-O0": Build("clang", 5, 0),
    "clang-dwarf5-O2": Build("clang", 5, 2),
    "clang-dwarf4-O2": Build("clang", 4, 2),
    # link-time optimization: out-of-line copies sit in their own unit and point to
    # their abstract function in another one (DW_FORM_ref_addr)
    "gcc-lto-O2": Build("gcc", None, 2, ("-flto",)),
}


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dwarf-fixtures")


@pytest.fixture(scope="session", params=sorted(VARIANTS))
def binary(request, build_dir) -> Path:
    out = build_dir / request.param
    compile_c(SOURCES, out, VARIANTS[request.param])
    return out


# ------------------------------------------------------------------ oracles

COMMENT = re.compile(r"/\*\s*(\d+)(?::\s*(\d+))?\s+(\d+)\s*\*/\s*$")


def pahole_layout(path: Path, name: str) -> dict:
    """Members of `pahole -C name` as (name, absolute bit offset, size), in print order,
    plus the struct's size and explicit alignments.

    pahole prints a bitfield as ``/* unit_offset: bit_in_unit unit_size */`` where the
    unit offset is the member's byte offset rounded down to its type's size (so bit can
    exceed the unit: ``0:20`` for a 20-bit field straddling a packed unit); the
    absolute bit offset is ``unit_offset * 8 + bit`` for DWARF 4 and 5 alike."""
    return parse_pahole_struct(run("pahole", "-C", name, str(path)))


def parse_pahole_struct(text: str) -> dict:
    """One struct/union as pahole prints it (see `pahole_layout`)."""
    members, size, alignment = [], None, 0
    lines = text.strip().splitlines()
    opened = []  # members-list lengths at each nested "{"
    for line in lines[1:-1]:
        m = COMMENT.search(line)
        if line.rstrip().endswith("{"):
            opened.append(len(members))
        elif line.strip().startswith("}") and not m:
            # a nested type definition pahole prints besides the member using it
            # (clang nests anonymous types inside the struct): not a member
            del members[opened.pop():]
        elif line.strip().startswith("}"):
            opened.pop()
        if m and not line.strip().startswith("/*"):
            offset, bit, msize = int(m.group(1)), int(m.group(2) or 0), int(m.group(3))
            decl = line[:m.start()].strip()
            members.append((_member_name(decl), offset * 8 + bit, msize,
                            _aligned(decl)))
        s = re.search(r"/\* size: (\d+)", line)
        if s:
            size = int(s.group(1))
    alignment = _aligned(lines[-1]) if lines[-1].startswith("}") else 0
    return {"members": members, "size": size, "alignment": alignment}


ATTRIBUTE = re.compile(r"__attribute__\(\(\w+(?:\(\d+\))?\)\)")


def _member_name(decl: str):
    if decl.startswith("}"):  # the closing line of a member defined in place
        m = re.match(r"\}\s*(\w+)", ATTRIBUTE.sub("", decl))
        return m.group(1) if m else None
    decl = ATTRIBUTE.sub("", decl).strip()
    func = re.search(r"\(\*\s*(\w+)\)", decl)
    if func:
        return func.group(1)
    m = re.search(r"(\w+)\s*(\[[^\]]*\])*\s*(:\s*\d+)?\s*;$", decl)
    return m.group(1) if m else decl


def _aligned(text: str) -> int:
    m = re.search(r"__aligned__\((\d+)\)", text)
    return int(m.group(1)) if m else 0


def pahole_enum(path: Path, name: str) -> list:
    text = run("pahole", "-C", name, str(path))
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"^\s+(\w+)\s*=\s*(-?\d+),", text, re.M)]


def source_structs() -> list[tuple[str, str]]:
    found = set()
    for src in SOURCES:
        for m in re.finditer(r"^(struct|union)\s+(?:__attribute__\(\(\w+\)\)\s+)?(\w+)\s*\{",
                             src.read_text(), re.M):
            found.add((m.group(1), m.group(2)))
    return sorted(found)


def source_enums() -> list[str]:
    names = set()
    for src in SOURCES:
        names |= set(re.findall(r"^enum\s+(\w+)\s*\{", src.read_text(), re.M))
    return sorted(names)


FUNC_DEF = re.compile(r"^((?:static\s+|inline\s+|__attribute__\(\(\w+\)\)\s+)*)"
                      r"([A-Za-z_][\w\s\*]*?)\s*\b(\w+)\(([^)]*)\)\s*\n\{", re.M)


EXTERN_DECL = re.compile(r"^extern\s+[A-Za-z_][\w\s\*]*?\b(\w+)\(([^)]*)\);", re.M)


def _params(text: str) -> list:
    params = []
    for p in text.split(","):
        p = p.strip()
        if p in ("void", ""):
            continue
        if p == "...":
            params.append(("...", "..."))
            continue
        pm = re.match(r"(.*?)(\w+)$", p)
        params.append((pm.group(2), " ".join(pm.group(1).split())))
    return params


def source_functions() -> list[dict]:
    """Functions of the fixture sources: name, file, static, declared (an extern
    declaration of a function no source defines, e.g. one written in assembly), params
    as (name, type text) — the sources keep one definition per line for this."""
    funcs = []
    for src in SOURCES:
        for m in FUNC_DEF.finditer(src.read_text()):
            funcs.append({"name": m.group(3), "file": src.name, "declared": False,
                          "static": "static" in m.group(1), "params": _params(m.group(4))})
    defined = {f["name"] for f in funcs}
    for src in SOURCES:
        for m in EXTERN_DECL.finditer(src.read_text()):
            if m.group(1) not in defined:
                funcs.append({"name": m.group(1), "file": src.name, "declared": True,
                              "static": False, "params": _params(m.group(2))})
    return funcs


def nm_functions(path: Path) -> dict[str, set[int]]:
    symbols: dict[str, set[int]] = {}
    for line in run("nm", "--defined-only", str(path)).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            symbols.setdefault(parts[2], set()).add(int(parts[0], 16))
    return symbols


# ------------------------------------------------------------------ layouts


def pahole_order(graph: TypeGraph, tid: int, base: int = 0):
    """Our members in pahole's print order.  pahole writes out the definition of a
    member whose type has no name (``union { ... };`` or ``struct { ... } flags;``)
    in place: its members first, then the member itself at the closing brace."""
    for m in graph[graph.strip(tid)].members:
        size = graph.size_of(m.type)
        inline = _unnamed_composite(graph, m.type)
        if inline is not None:
            yield from pahole_order(graph, inline, base + m.bit_offset)
        yield (m.name, base + m.bit_offset, size, m.alignment)


def _unnamed_composite(graph: TypeGraph, tid):
    """The struct/union a member is declared with, when it has no name (qualifiers
    pass through, a typedef does not: pahole prints the typedef's name)."""
    while tid is not None and isinstance(graph[tid], QualifiedType):
        tid = graph[tid].target
    t = graph[tid] if tid is not None else None
    return tid if isinstance(t, CompositeType) and t.name is None else None


@pytest.mark.parametrize("kind,name", source_structs())
def test_layout_matches_pahole(binary, kind, name):
    need("pahole")
    model = dwarf.open_elf_types(str(binary), use_cache=False)
    graph = model.find_struct(name, ShapeKind(kind))
    root = graph[graph.root]
    expected = pahole_layout(binary, name)
    assert root.size == expected["size"] or (kind == "union" and expected["size"] is None)
    assert root.alignment == expected["alignment"]
    assert list(pahole_order(graph, graph.root)) == expected["members"]


@pytest.mark.parametrize("name", source_enums())
def test_enums_match_pahole(binary, name):
    need("pahole")
    model = dwarf.open_elf_types(str(binary), use_cache=False)
    graph = model.find_struct("callbacks") if name != "small_state" else model.find_struct("bits")
    enums = {t.name: t for t in graph.types.values() if isinstance(t, EnumType)}
    assert list(enums[name].enumerators) == pahole_enum(binary, name)
    assert enums[name].signed == any(v < 0 for _n, v in enums[name].enumerators)


def test_enum_sizes_follow_the_source(binary):
    model = dwarf.open_elf_types(str(binary), use_cache=False)
    types = {**model.find_struct("bits").types, **model.find_struct("callbacks").types}
    sizes = {t.name: t.size for t in types.values() if isinstance(t, EnumType)}
    # packed enum → 1 byte; values beyond 32 bits → 8 bytes; plain → int
    assert sizes == {"small_state": 1, "neg_mode": 4, "wide_mask": 8}


def test_arrays_function_pointers_and_bitfields(binary):
    model = dwarf.open_elf_types(str(binary), use_cache=False)
    anon = model.find_struct("with_anon")
    matrix = {m.name: m for m in anon[anon.root].members}["matrix"]
    assert anon[matrix.type].dims == (2, 3, 4)
    flex = model.find_struct("flex")
    dims = {m.name: flex[flex.strip(m.type)].dims for m in flex[flex.root].members
            if isinstance(flex[flex.strip(m.type)], ArrayType)}
    assert dims["names"] == (0,)
    assert dims["data"] in ((None,), (0,))  # gcc: no bound; clang: count 0? both flexible
    cb = model.find_struct("callbacks")
    members = {m.name: m for m in cb[cb.root].members}
    open_fn = cb[cb[members["open"].type].target]
    assert isinstance(open_fn, FunctionType) and open_fn.variadic and len(open_fn.params) == 2
    handlers = cb[members["handlers"].type]
    assert isinstance(handlers, ArrayType) and handlers.dims == (4,)
    assert isinstance(cb[cb[handlers.element].target], FunctionType)
    graph = model.find_struct("bits")
    bits = graph[graph.root]
    assert [(m.name, m.bit_size) for m in bits.members if m.is_bitfield] == [
        ("a", 3), ("b", 5), ("c", 7), ("d", 1), ("e", 40), ("f", 9), ("g", 2), ("st", 4)]


def test_pointer_targets_are_present_as_declarations(binary):
    model = dwarf.open_elf_types(str(binary), use_cache=False)
    graph = model.find_struct("with_anon")
    op = [t for t in graph.types.values()
          if isinstance(t, CompositeType) and t.name == "opaque"]
    assert op and op[0].declaration
    for t in graph.types.values():  # every referenced id is in the graph
        for ref in _references(t):
            assert ref is None or ref in graph.types


def _references(t):
    for attr in ("target", "element", "returns"):
        if hasattr(t, attr):
            yield getattr(t, attr)
    if isinstance(t, CompositeType):
        yield from (m.type for m in t.members)
    if isinstance(t, FunctionType):
        yield from t.params


def test_unknown_struct_suggests_close_names(binary):
    model = dwarf.open_elf_types(str(binary), use_cache=False)
    with pytest.raises(UnknownType) as err:
        model.find_struct("bitz")
    assert "bits" in err.value.suggestions and "no struct bitz" in str(err.value)
    with pytest.raises(UnknownType):
        model.find_struct("opaque")  # declared, never defined
    with pytest.raises(UnknownType):
        model.find_struct("bits", ShapeKind.UNION)


# ------------------------------------------------------------------ catalog


def test_functions_match_the_source(binary):
    catalog = dwarf.open_elf_types(str(binary), use_cache=False).catalog()
    source = source_functions()
    declared = {f["name"] for f in source if f["declared"]}

    def param_name(function: str, name):  # declarations often leave parameters unnamed
        return None if function in declared else name

    ours = sorted((f.name, Path(f.unit).name, tuple(
        (param_name(f.name, p.name), p.shape.text) for p in f.params)
        + ((("...", "..."),) if f.variadic else ())) for f in catalog.functions())
    expected = sorted((f["name"], f["file"], tuple((param_name(f["name"], n), t)
                                                   for n, t in f["params"])) for f in source)
    assert set(ours) <= set(expected) and len(ours) == len(set(ours))
    # the optimizer may leave no trace of a static function (clang -O2 drops an inlined
    # static helper entirely), never of an external one; a function only declared
    # appears when the compiler describes the call (pfunct checks those)
    assert {(f["name"], f["file"], tuple(f["params"])) for f in source
            if not f["static"] and not f["declared"]} <= set(ours)


def test_functions_match_pfunct(binary):
    need("pfunct")
    catalog = dwarf.open_elf_types(str(binary), use_cache=False).catalog()
    theirs = sorted(re.match(r".*?(\w+)\(", line).group(1)
                    for line in run("pfunct", "-P", str(binary)).splitlines() if "(" in line)
    # pfunct prints an abstract function and each of its concrete copies separately,
    # so compare the sets of names, not the lists
    assert {f.name for f in catalog.functions()} == set(theirs)


def test_statics_of_the_same_name_stay_apart(binary):
    catalog = dwarf.open_elf_types(str(binary), use_cache=False).catalog()
    helpers = [f for f in catalog.functions() if f.name == "helper"]
    assert len(helpers) == 2 and len({f.key for f in helpers}) == 2
    assert {Path(f.unit).name for f in helpers} == {"layouts.c", "second_unit.c"}
    assert not any(f.external for f in helpers)
    assert any("several compile units" in n for n in catalog.notes)


def test_addresses_match_the_symbol_table(binary):
    catalog = dwarf.open_elf_types(str(binary), use_cache=False).catalog()
    symbols = nm_functions(binary)
    declared_only = {f["name"] for f in source_functions() if f["declared"]}
    for f in catalog.functions():
        if f.name in declared_only:  # written in assembly: the address of its symbol
            assert {f.address} == symbols[f.name]
            assert f.inline == Inline.NONE and not f.inlined_only
            assert any("only declared" in n for n in catalog.notes)
            assert any("ELF symbol" in n for n in catalog.notes)
        elif f.address is not None:
            # the compiler may rename a local copy (helper.lto_priv.0, f.isra.0)
            at_address = {n for n, addrs in symbols.items() if f.address in addrs}
            assert any(n == f.name or n.startswith(f.name + ".") for n in at_address), f.name
            assert not f.inlined_only
        elif f.name in symbols and len(symbols[f.name]) == 1 and f.external:
            pytest.fail(f"{f.name} has a symbol but no address")
    total = [f for f in catalog.functions() if f.name == "total"]
    assert total[0].address is None  # always_inline
    if total[0].inline != Inline.NONE:  # (gcc -flto records no DW_AT_inline at all)
        assert total[0].inlined_only
        assert total[0].inline in (Inline.INLINED, Inline.DECLARED_INLINED)
        assert any("only inlined" in n for n in catalog.notes)


def test_parameter_shapes(binary):
    catalog = dwarf.open_elf_types(str(binary), use_cache=False).catalog()
    funcs = {f.name: f for f in catalog.functions()}
    cb = {p.name: p.shape for p in funcs["use_callbacks"].params}
    assert (cb["bp"].kind, cb["bp"].name, cb["bp"].pointers, cb["bp"].const) == (
        ShapeKind.STRUCT, "bits", 1, True)
    assert cb["bp"].text == "const_bits_ptr"
    assert (cb["bpp"].name, cb["bpp"].pointers, cb["bpp"].const) == ("bits", 2, False)
    assert (cb["v"].kind, cb["v"].pointers) == (ShapeKind.UNION, 0)
    assert funcs["make_bits"].returns.text == "struct bits *"
    users = {f.name for f in catalog.functions_referencing(ShapeKind.STRUCT, "bits")}
    assert users == {"count_bits", "use_bits", "use_callbacks", "make_bits"}
    assert funcs["sum_ints"].variadic


def test_struct_summaries_flatten_anonymous_members(binary):
    catalog = dwarf.open_elf_types(str(binary), use_cache=False).catalog()
    graph = dwarf.open_elf_types(str(binary), use_cache=False).find_struct("with_anon")
    from ctracer.debuginfo.typegraph import iter_members_flat
    expected = [(path, bits) for path, _m, bits in iter_members_flat(graph, graph.root)]
    summary = catalog.struct("with_anon")
    assert [(m.name, m.bit_offset) for m in summary.members] == expected
    assert "..lo" in {m.name for m in summary.members}
    holders = {s.name for s in catalog.structs_with_member_of(ShapeKind.STRUCT, "opaque")}
    assert holders == {"with_anon", "callbacks"}
    assert catalog.struct_names(ShapeKind.UNION) == ["value_u"]
    assert set(catalog.struct_names()) >= {n for k, n in source_structs() if k == "struct"}


# ------------------------------------------------------------------ ELF helpers and errors


def test_build_id_matches_readelf(binary):
    m = re.search(r"Build ID: ([0-9a-f]+)", run("readelf", "-n", str(binary)))
    assert elf.build_id(str(binary)) == (m.group(1) if m else None)


def test_function_address_matches_objdump(build_dir):
    """The entry address uprobes are attached at (bcc turns it into a file offset)."""
    need("objdump")
    out = build_dir / "nopie"
    compile_c(SOURCES, out, flags=["-no-pie"])
    catalog = dwarf.open_elf_types(str(out), use_cache=False).catalog()
    main = [f for f in catalog.functions() if f.name == "main"][0]
    dump = run("objdump", "-d", "-F", "--disassemble=main", str(out))
    found = re.search(r"^([0-9a-f]+) <main> \(File Offset: (0x[0-9a-f]+)\)", dump, re.M)
    address, offset = int(found.group(1), 16), int(found.group(2), 16)
    assert main.address == address != offset  # non-PIE: addresses and offsets differ


def test_not_an_elf_file(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello\n" * 20)
    with pytest.raises(InputFileError, match="not an ELF file"):
        dwarf.open_elf_types(str(p))


def test_elf_without_debug_info(build_dir):
    out = build_dir / "nodebug"
    compile_c(SOURCES, out, Build(opt=0), debug=False)
    with pytest.raises(InputFileError, match="has no debug info .* rebuild with -g"):
        dwarf.open_elf_types(str(out))


def test_btf_only_elf_goes_to_the_btf_reader(build_dir):
    need("pahole")
    need("objcopy")
    out = build_dir / "btfonly"
    compile_c(SOURCES, out, Build(opt=0))
    subprocess.run(["pahole", "-J", str(out)], check=True, capture_output=True)
    subprocess.run(["objcopy", "--strip-debug", str(out)], check=True)
    model = dwarf.open_elf_types(str(out))  # (a missing BTF reader fails here, not skips)
    assert model.format == "btf"
    graph = model.find_struct("bits")
    assert graph[graph.root].size == pahole_layout(out, "bits")["size"]


def test_clones_do_not_take_the_address(build_dir):
    """With a compiler clone (scale.constprop.0) beside the function itself, the address
    is the function's own entry, found through the symbol table."""
    out = build_dir / "clone"
    compile_c(FIXTURES / "clones" / "clone.c", out, Build(opt=3))
    symbols = nm_functions(out)
    if not any(n.startswith("scale.") for n in symbols):
        pytest.skip("this gcc made no clone of scale()")
    scale = [f for f in dwarf.open_elf_types(str(out), use_cache=False).catalog().functions()
             if f.name == "scale"]
    assert len(scale) == 1 and {scale[0].address} == symbols["scale"]


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_anonymous_pointee_is_read_whole(build_dir, compiler):
    """An anonymous struct/union behind a pointer has no name to print, so pahole
    expands it inline (``struct { ... } * parts;``): it must come with its members,
    while a named pointee stays a declaration."""
    out = build_dir / f"anon-pointer-{compiler}"
    compile_c(FIXTURES / "pointers" / "anon_pointer.c", out, Build(compiler, opt=0))
    graph = dwarf.open_elf_types(str(out), use_cache=False).find_struct(
        "anon_pointer_holder")
    members = {m.name: m for m in graph[graph.root].members}

    def pointee(name):
        return graph[graph.strip(graph[members[name].type].target)]

    parts, view, named = pointee("parts"), pointee("view"), pointee("named")
    assert parts.name is None and not parts.declaration
    assert [m.name for m in parts.members] == ["from", "len", "owner"]
    assert view.kind == "union" and [m.name for m in view.members] == ["bytes", "word"]
    assert named.name == "named_target" and named.declaration
    owner = {m.name: m for m in parts.members}["owner"]
    assert graph[graph[owner.type].target].declaration  # named, behind a pointer


def test_folded_function_takes_its_symbol_address(build_dir):
    """A function folded into an identical one (gcc -fipa-icf) has a DWARF definition
    without code but a symbol of its own: it is probeable there."""
    out = build_dir / "folded"
    compile_c(FIXTURES / "clones" / "folded.c", out, Build(opt=2))
    model = dwarf.open_elf_types(str(out), use_cache=False)
    summaries, _declared = model.unit_summaries()
    without_code = {f.name for s in summaries for f in s.functions if not f.addresses}
    if "second" not in without_code:
        pytest.skip("this gcc did not fold second() into first()")
    symbols = nm_functions(out)
    second = [f for f in model.catalog().functions() if f.name == "second"]
    assert len(second) == 1 and {second[0].address} == symbols["second"]
    assert not second[0].inlined_only


def test_bulk_builds_pause_the_garbage_collector(binary, monkeypatch):
    """The catalog build and find_struct run with the cyclic collector paused (on a
    vmlinux its full collections cost seconds), and it is running again afterwards, also
    when the build fails; on a big file what find_struct left alive is frozen."""
    import gc

    from ctracer.debuginfo.dwarf import scan as ds

    seen = []
    scan, build = ds.scan_units, dies.GraphBuilder.build

    def scan_watched(*args, **kwargs):
        seen.append(("scan", gc.isenabled()))
        return scan(*args, **kwargs)

    def build_watched(self, root):
        seen.append(("build", gc.isenabled()))
        return build(self, root)

    monkeypatch.setattr(ds, "scan_units", scan_watched)
    monkeypatch.setattr(dies.GraphBuilder, "build", build_watched)
    assert gc.isenabled()
    model = dwarf.open_elf_types(str(binary), use_cache=False)
    model.catalog()
    frozen = gc.get_freeze_count()
    model.find_struct("bits")
    assert gc.get_freeze_count() == frozen  # a small file: nothing frozen
    monkeypatch.setattr(dwarf, "BIG_DEBUG_INFO", 0)
    try:
        model.find_struct("with_anon")
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
    assert seen == [("scan", False), ("build", False), ("build", False)]
    assert gc.isenabled()
    with pytest.raises(UnknownType):
        model.find_struct("opaque")
    monkeypatch.setattr(dies.GraphBuilder, "build", lambda self, root: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        model.find_struct("bits")
    assert gc.isenabled()


def test_section_file_is_a_stream_of_one_section(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"HEADER" + b"0123456789" + b"TRAILER")
    s = dies.SectionFile(str(path), 6, 10)
    assert s.tell() == 0 and s.read(4) == b"0123" and s.tell() == 4
    assert s.seek(2, 1) == 6 and s.read(2) == b"67"
    assert s.seek(0, 2) == 10 and s.tell() == 10
    assert s.seek(-3, 2) == 7 and s.read(3) == b"789"
    assert s.seek(1) == 1 and s.read(3) == b"123"
    s.close()


def test_types_are_read_in_place(binary):
    """pyelftools copies every debug section into memory before the first DIE (a
    vmlinux: 0.3 s and 300 MB); find_struct reads them in place instead, and reads the
    same types."""
    from elftools.elf.elffile import ELFFile

    model = dwarf.open_elf_types(str(binary), use_cache=False)
    with open(binary, "rb") as f:
        copied = ELFFile(f).get_dwarf_info(relocate_dwarf_sections=False)
        reference = {name: dies.GraphBuilder(copied, False).build(
            model.struct_location(name)) for name in model.struct_names()}
    for name, graph in reference.items():
        assert model.find_struct(name) == graph
    assert isinstance(model.dwarfinfo().debug_info_sec.stream, dies.SectionFile)


def test_dwarfinfo_holds_the_sections_pyelftools_would_read(binary):
    """`dies.open_dwarfinfo` builds pyelftools' DWARFInfo through its public constructor
    with sections of its own: every debug section pyelftools' ``get_dwarf_info`` would
    hand it is there, with the same bytes.  A pyelftools release that renames a section
    parameter or changes DebugSectionDescriptor fails here (pyproject.toml pins the
    versions this was tested with)."""
    from elftools.dwarf.dwarfinfo import DebugSectionDescriptor
    from elftools.elf.elffile import ELFFile

    ours = dwarf.open_elf_types(str(binary), use_cache=False).dwarfinfo()
    compared = 0
    with open(binary, "rb") as f:
        theirs = ELFFile(f).get_dwarf_info(relocate_dwarf_sections=False)
        for attribute, section in vars(theirs).items():
            if not (isinstance(section, DebugSectionDescriptor)
                    and section.name.startswith(".debug_")):
                continue
            mine = getattr(ours, attribute)
            assert isinstance(mine, DebugSectionDescriptor), attribute
            assert (mine.name, mine.size) == (section.name, section.size)
            mine.stream.seek(0)
            section.stream.seek(0)
            assert mine.stream.read(mine.size) == section.stream.read(section.size), attribute
            compared += 1
    assert compared >= 4  # info, abbrev, str, line at least
