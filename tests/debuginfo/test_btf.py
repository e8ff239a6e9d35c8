"""The BTF reader against independent decoders, on BTF made here and on the live kernel.

Sources: tests/fixtures/btf/kinds.c compiled by gcc with BTF encoded from its DWARF by
``pahole -J`` (kind_flag bitfields, enum64, floats), by clang for bpf in both byte orders
(compiler-made BTF with decl tags), split BTF made by ``pahole -J --btf_base``, and
/sys/kernel/btf (all kinds of a current kernel, type tags included).

Oracles: ``bpftool btf dump`` (libbpf's decoding; every record of every source is compared
field by field), ``pahole -C`` on the DWARF of the same object (member offsets, sizes and
bitfields), ``pfunct -F btf --class`` (functions taking exactly ``struct X *``), the DWARF
reader (`ctracer.debuginfo.dwarf.reader`) on the same object (same functions and parameter shapes), and,
for tracepoints, tracefs' available_events and the kernel accepting a raw tracepoint
attachment by name.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Optional

import pytest

from support.cbuild import Build, compile_c, need
from ctracer.debuginfo.btf import reader as btf
from ctracer.debuginfo.btf import format as bf
from ctracer.errors import InputFileError, UnknownType
from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.typegraph import (ArrayType, CompositeType, EnumType, FunctionType,
                                     QualifiedType, iter_members_flat)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "btf"
KINDS_C = FIXTURES / "kinds.c"
KERNEL_BTF = Path(btf.KERNEL_BTF)


def need_kernel_btf() -> None:
    if not KERNEL_BTF.exists():
        pytest.skip(f"this kernel has no {KERNEL_BTF} (CONFIG_DEBUG_INFO_BTF off)")


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


#: saved BTF indexes go to a directory of each test's own
pytestmark = pytest.mark.usefixtures("private_cache")


# ------------------------------------------------------------------ building BTF

@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("btf-fixtures")


@pytest.fixture(scope="module")
def gcc_obj(build) -> Path:
    """kinds.c by gcc, with a .BTF section that pahole encoded from its DWARF."""
    need("pahole")
    out = build / "kinds.gcc.o"
    compile_c(KINDS_C, out, Build(opt=0), flags=["-c"])
    plain = build / "kinds.nobtf.o"
    shutil.copy(out, plain)
    run("pahole", "-J", "--btf_gen_floats", str(out))
    return out


@pytest.fixture(scope="module")
def gcc_obj_without_btf(gcc_obj, build) -> Path:
    return build / "kinds.nobtf.o"


@pytest.fixture(scope="module", params=["bpfel", "bpfeb"])
def clang_obj(request, build) -> Path:
    """kinds.c by clang for BPF: the compiler emits .BTF itself (in the target's order)."""
    out = build / f"kinds.{request.param}.o"
    compile_c(KINDS_C, out, Build("clang", opt=2, flags=("-target", request.param)),
              flags=["-c"])
    return out


@pytest.fixture(scope="module")
def split_pair(build) -> tuple[Path, Path]:
    """A base object and a "module" whose BTF is split on top of the base's."""
    need("pahole")
    base_c, mod_c = build / "base.c", build / "mod.c"
    base_c.write_text(
        "struct thing { int kind; long value; };\n"
        "int thing_base(struct thing *t) { return t->kind; }\n")
    mod_c.write_text(
        "struct thing { int kind; long value; };\n"
        "struct mod_state { struct thing *obj; unsigned flags : 3, mode : 5; char name[8]; };\n"
        "int mod_use(struct mod_state *s, struct thing *t) { return s->mode + t->kind; }\n"
        "struct thing *mod_get(struct mod_state *s) { return s->obj; }\n")
    base_o, mod_o = build / "base.o", build / "mod.o"
    compile_c(base_c, base_o, Build(opt=0), flags=["-c"])
    compile_c(mod_c, mod_o, Build(opt=0), flags=["-c"])
    run("pahole", "-J", str(base_o))
    run("pahole", "-J", f"--btf_base={base_o}", str(mod_o))
    return base_o, mod_o


def first_module_btf() -> Optional[Path]:
    root = KERNEL_BTF.parent
    if not root.is_dir():
        return None
    mods = sorted(p for p in root.iterdir() if p.name != "vmlinux")
    return mods[0] if mods else None


# ------------------------------------------------------------------ bpftool's view

HEADER = re.compile(r"^\[(\d+)\] (\w+) '(.*?)'(.*)$")
ATTR = re.compile(r"(\w+)=(\S+?)(?:,|\s|$)")


def bpftool_dump(path: Path, base: Optional[Path] = None) -> dict[int, dict]:
    """``bpftool btf dump file`` parsed: id → {kind, name, attrs, items}."""
    cmd = ["bpftool"] + (["-B", str(base)] if base else []) + ["btf", "dump", "file", str(path)]
    types: dict[int, dict] = {}
    current = None
    for line in run(*cmd).splitlines():
        m = HEADER.match(line)
        if m:
            current = {"kind": m.group(2), "name": m.group(3),
                       "attrs": dict(ATTR.findall(m.group(4))), "items": []}
            types[int(m.group(1))] = current
        elif line.startswith("\t") and current is not None:
            item = line.strip()
            nm = re.match(r"'(.*?)'", item)
            current["items"].append((nm.group(1) if nm else None,
                                     dict(ATTR.findall(item[nm.end():] if nm else item))))
    return types


def _int(v: str) -> int:
    return int(v.rstrip("ULL").rstrip("LL") or "0") if v not in ("", None) else 0


def check_record(r: bf.BtfRecord, want: dict) -> None:
    """One of our records equals bpftool's decoding of it, field by field."""
    where = f"type {r.id} ({want['kind']} {want['name']})"
    assert r.kind_name == want["kind"], where
    assert (r.name or "(anon)") == want["name"], where
    a, items = want["attrs"], want["items"]
    k = r.kind
    if k == bf.INT:
        encoding, offset, bits = r.fixed
        enc = ("SIGNED" if encoding & 1 else "CHAR" if encoding & 2 else
               "BOOL" if encoding & 4 else "(none)")
        assert (r.ref, offset, bits, enc) == (int(a["size"]), int(a["bits_offset"]),
                                              int(a["nr_bits"]), a["encoding"]), where
    elif k in (bf.PTR, bf.TYPEDEF, bf.VOLATILE, bf.CONST, bf.RESTRICT, bf.TYPE_TAG):
        assert r.ref == int(a["type_id"]), where
    elif k == bf.ARRAY:
        assert r.fixed == (int(a["type_id"]), int(a["index_type_id"]), int(a["nr_elems"])), where
    elif k in (bf.STRUCT, bf.UNION):
        assert (r.ref, r.vlen) == (int(a["size"]), int(a["vlen"])), where
        got = [(n or "(anon)", t, off, size) for n, t, off, size in r.items]
        expect = [(n, int(x["type_id"]), int(x["bits_offset"]), int(x.get("bitfield_size", 0)))
                  for n, x in items]
        assert got == expect, where
    elif k in (bf.ENUM, bf.ENUM64):
        assert (r.ref, r.vlen) == (int(a["size"]), int(a["vlen"])), where
        assert a["encoding"] == ("SIGNED" if r.kind_flag else "UNSIGNED"), where
        assert [(n, v) for n, v in r.items] == [(n, _int(x["val"])) for n, x in items], where
    elif k == bf.FWD:
        assert a["fwd_kind"] == ("union" if r.kind_flag else "struct"), where
    elif k == bf.FUNC:
        assert r.ref == int(a["type_id"]), where
        assert bf.LINKAGE_NAMES[r.vlen] == a["linkage"], where
    elif k == bf.FUNC_PROTO:
        assert (r.ref, r.vlen) == (int(a["ret_type_id"]), int(a["vlen"])), where
        assert [(n or "(anon)", t) for n, t in r.items] == \
            [(n, int(x["type_id"])) for n, x in items], where
    elif k == bf.VAR:
        assert r.ref == int(a["type_id"]), where
        assert ("static", "global", "extern")[r.fixed[0]] == a["linkage"], where
    elif k == bf.DATASEC:
        assert (r.ref, r.vlen) == (int(a["size"]), int(a["vlen"])), where
        assert list(r.items) == [(int(x["type_id"]), int(x["offset"]), int(x["size"]))
                                 for _, x in items], where
    elif k == bf.FLOAT:
        assert r.ref == int(a["size"]), where
    elif k == bf.DECL_TAG:
        assert (r.ref, r.fixed[0]) == (int(a["type_id"]), int(a["component_idx"])), where
    else:
        raise AssertionError(f"{where}: kind not covered by the test")


def kind_counts(d: bf.BtfData) -> Counter:
    """Records per kind name, from the reader's kind index (the second count, beside the
    one decoding every record)."""
    return Counter({bf.kind_name(k): d.kinds.count(k, 1) for k in set(d.kinds[1:])})


def points_to_struct(shape, name: str) -> bool:
    """``struct NAME *`` (qualifiers and typedefs aside)."""
    return shape.kind == ShapeKind.STRUCT and shape.name == name and shape.pointers == 1


def check_against_bpftool(model: btf.BtfModel, path: Path, base: Optional[Path] = None) -> Counter:
    need("bpftool")
    want = bpftool_dump(path, base)
    d = model.btf
    own = range(d.first_id, d.count)
    assert sorted(want) == list(own)
    kinds: Counter = Counter()
    for tid in own:
        r = d.record(tid)
        check_record(r, want[tid])
        kinds[r.kind_name] += 1
    return kinds


# ------------------------------------------------------------------ pahole's layouts

COMMENT = re.compile(r"/\*\s*(\d+)(?::\s*(\d+))?\s+(\d+)\s*\*/\s*$")


def pahole_leaves(path: Path, name: str, fmt: str = "dwarf",
                  base: Optional[Path] = None) -> list[tuple[int, int]]:
    """(absolute bit offset, size) of each member line of ``pahole -C`` in print order,
    anonymous structs/unions expanded; pahole writes a bitfield as
    ``/* unit_offset: bit size */``, absolute bit = unit_offset * 8 + bit.  ``base``: the
    BTF a split BTF file is built on."""
    out = []
    split = [f"--btf_base={base}"] if base else []
    for line in run("pahole", "-F", fmt, *split, "-C", name, str(path)).splitlines()[1:-1]:
        m = COMMENT.search(line)
        if not m or line.strip().startswith("}"):
            continue
        off, bit, size = int(m.group(1)), m.group(2), int(m.group(3))
        out.append((off * 8 + int(bit or 0), size))
    return out


def our_leaves(model: btf.BtfModel, name: str) -> list[tuple[int, int]]:
    g = model.find_struct(name)
    return [(bits, g.size_of(m.type)) for _, m, bits in iter_members_flat(g, g.root)]


FIXTURE_STRUCTS = ["flags", "counters", "thing", "packed_hdr", "aligned_box", "message",
                   "holder", "embeds"]


# ------------------------------------------------------------------ fixture tests

def test_gcc_pahole_btf_records_match_bpftool(gcc_obj):
    model = btf.open_btf(str(gcc_obj))
    kinds = check_against_bpftool(model, gcc_obj)
    print("pahole -J BTF of kinds.c:", dict(sorted(kinds.items())))
    # what this fixture is for: kind_flag bitfields, 64-bit enums, floats, forwards
    assert {"ENUM64", "FLOAT", "FWD", "RESTRICT", "VOLATILE"} <= set(kinds)
    assert any(r.kind_flag for r in map(model.btf.record, range(1, model.btf.count))
               if r.kind == bf.STRUCT)


def test_clang_btf_records_match_bpftool(clang_obj):
    model = btf.open_btf(str(clang_obj))
    assert model.btf.big_endian == clang_obj.name.endswith("bpfeb.o")
    kinds = check_against_bpftool(model, clang_obj)
    assert {"DECL_TAG", "VAR", "DATASEC", "FLOAT"} <= set(kinds)


@pytest.mark.parametrize("name", FIXTURE_STRUCTS)
def test_layout_matches_pahole_on_dwarf(gcc_obj, name):
    """BTF made from gcc's DWARF gives the member offsets, sizes and bitfields pahole
    reads from that DWARF."""
    model = btf.open_btf(str(gcc_obj))
    assert our_leaves(model, name) == pahole_leaves(gcc_obj, name, "dwarf")


@pytest.mark.parametrize("name", FIXTURE_STRUCTS)
def test_layout_matches_pahole_on_clang_btf(clang_obj, name):
    model = btf.open_btf(str(clang_obj))
    assert our_leaves(model, name) == pahole_leaves(clang_obj, name, "btf")


def test_model_types(gcc_obj):
    model = btf.open_btf(str(gcc_obj))
    g = model.find_struct("thing")
    members = {m.name: m for m in g[g.root].members}
    matrix = g[members["matrix"].type]
    # pahole 1.24 encodes int[2][3][4] as one array of 24 (clang keeps the nesting)
    assert isinstance(matrix, ArrayType) and matrix.dims == (24,)
    assert g.size_of(members["matrix"].type) == 96
    assert isinstance(g[g.strip(members["mask"].type)], EnumType)
    assert g[g.strip(members["mask"].type)].size == 8
    assert g[g.strip(members["mode"].type)].signed
    assert dict(g[g.strip(members["mode"].type)].enumerators)["SM_LOW"] == -2
    cb = g[members["callback"].type]
    assert isinstance(g[cb.target], FunctionType) and len(g[cb.target].params) == 2
    cv = g[members["cv"].type]
    assert isinstance(cv, QualifiedType) and cv.qualifier in ("const", "volatile")
    opaque = g[g[g.strip(g[g.root].members[1].type)].members[0].type].target
    assert g[opaque] == CompositeType("struct", "opaque", 0, (), declaration=True)
    msg = model.find_struct("message")
    assert msg.size_of(msg[msg.root].members[1].type) == 0  # flexible array
    # the lazy mapping walks the whole closure when iterated
    assert g.root in g.types and len(list(g.types)) == len(g.types)
    assert all(m.type in g.types for m in g[g.root].members if m.type)


def test_nested_arrays_become_dims(clang_obj):
    """BTF nests int[2][3][4] as arrays of arrays; the model has one array, as DWARF."""
    g = btf.open_btf(str(clang_obj)).find_struct("thing")
    matrix = next(m for m in g[g.root].members if m.name == "matrix")
    assert g[matrix.type].dims == (2, 3, 4)
    assert g[g[matrix.type].element].name == "int"
    assert g.size_of(matrix.type) == 96


def test_catalog_matches_dwarf_reader(gcc_obj):
    """The functions and parameter shapes of the BTF section equal those the DWARF reader
    finds in the same object (linkage aside: pahole marks every function of a relocatable
    object static)."""
    from ctracer.debuginfo.dwarf import reader as dwarf
    ours = {f.name: f for f in btf.open_btf(str(gcc_obj)).catalog().functions()}
    theirs = {f.name: f for f in dwarf.open_elf_types(str(gcc_obj), use_cache=False)
              .catalog().functions()}
    assert set(ours) == set(theirs)
    for name, f in ours.items():
        g = theirs[name]
        assert [(p.name, p.shape) for p in f.params] == [(p.name, p.shape) for p in g.params], name
        assert f.returns == g.returns, name
        assert f.variadic == g.variadic, name


def test_catalog_lookups(gcc_obj):
    cat = btf.open_btf(str(gcc_obj)).catalog()
    source = KINDS_C.read_text()
    defined = set(re.findall(r"\b(\w+)\([^;{]*\)\s*\{", source))  # definitions
    assert {f.name for f in cat.functions()} == defined
    assert cat.function_count() == len(defined)
    takes = {f.name for f in cat.functions_referencing(ShapeKind.STRUCT, "thing")}
    mentions = {n for n in defined
                if re.search(rf"\b{n}\([^)]*(struct thing|thing_ptr|const_thing_ptr)", source)}
    assert mentions <= takes  # also the return-type users (thing_make)
    assert "thing_make" in takes
    by_shape = {f.name: f for f in cat.functions_referencing(ShapeKind.STRUCT, "thing")}
    assert [p.shape.pointers for p in by_shape["thing_swap"].params] == [2, 2]
    peek = by_shape["thing_peek"].params[0].shape
    assert (peek.const, peek.text) == (True, "const struct thing *")
    assert by_shape["thing_by_typedef"].params[0].shape.text == "thing_ptr"
    assert by_shape["thing_log"].variadic
    holders = {s.name for s in cat.structs_with_member_of(ShapeKind.STRUCT, "thing")}
    assert holders == {"holder", "embeds", "thing"}  # thing: next, slot, peer
    # struct summaries flatten anonymous members as the model's iter_members_flat does
    thing = cat.struct("thing")
    g = btf.open_btf(str(gcc_obj)).find_struct("thing")
    assert [(m.name, m.bit_offset) for m in thing.members] == \
        [(path, bits) for path, _, bits in iter_members_flat(g, g.root)]
    assert {".op", "..lo", ".flag"} <= {m.name for m in thing.members}
    assert thing.size == g[g.root].size
    assert cat.struct("nope") is None
    assert "flags" in cat.struct_names()


def test_unknown_struct_suggests_close_names(gcc_obj):
    model = btf.open_btf(str(gcc_obj))
    with pytest.raises(UnknownType) as e:
        model.find_struct("thingg")
    assert "thing" in e.value.suggestions


def test_split_btf(split_pair):
    base_o, mod_o = split_pair
    base = btf.open_btf(str(base_o))
    with pytest.raises(InputFileError, match="split BTF"):
        btf.open_btf(str(mod_o))
    mod = btf.open_btf(str(mod_o), base=str(base_o))
    assert mod.btf.first_id == base.btf.count  # ids continue from the base
    check_against_bpftool(mod, mod_o, base_o)
    assert our_leaves(mod, "mod_state") == pahole_leaves(mod_o, "mod_state", "dwarf")
    cat = mod.catalog()
    assert {f.name for f in cat.functions()} == {"mod_use", "mod_get"}  # the module's own
    assert {f.name for f in cat.functions_referencing(ShapeKind.STRUCT, "thing")} == \
        {"mod_use", "mod_get"}
    g = mod.find_struct("mod_state")
    obj = g[g[g.root].members[0].type]
    assert obj.target < mod.btf.first_id  # struct thing comes from the base
    assert g[obj.target].name == "thing"
    # an already opened base works as well as a path
    assert btf.open_btf(str(mod_o), base=base).btf.count == mod.btf.count


def test_bad_input(tmp_path, gcc_obj_without_btf, gcc_obj):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 10)
    with pytest.raises(InputFileError, match="not BTF"):
        btf.open_btf(str(text))
    with pytest.raises(InputFileError, match="no .BTF section"):
        btf.open_btf(str(gcc_obj_without_btf))
    with pytest.raises(InputFileError, match="no such file"):
        btf.open_btf(str(tmp_path / "missing"))
    raw = btf.read_btf_bytes(str(gcc_obj))
    cut = tmp_path / "cut.btf"
    cut.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(InputFileError):
        btf.open_btf(str(cut))
    # the DWARF reader's entry point hands BTF-only ELF files here
    assert btf.model_from_bytes(raw, "test").struct_names() == \
        btf.open_btf(str(gcc_obj)).struct_names()


# ------------------------------------------------------------------ the live kernel

@pytest.fixture(scope="module")
def kernel_model() -> btf.BtfModel:
    need_kernel_btf()
    return btf.open_btf(str(KERNEL_BTF), use_cache=False)


@pytest.mark.kernel
def test_kernel_btf_every_record_matches_bpftool(kernel_model):
    kinds = check_against_bpftool(kernel_model, KERNEL_BTF)
    print(f"\n{KERNEL_BTF}: {sum(kinds.values())} types")
    for name, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<11} {n}")
    assert kinds == kind_counts(kernel_model.btf)


@pytest.mark.kernel
def test_kernel_btf_every_type_decodes(kernel_model):
    d = kernel_model.btf
    seen: Counter = Counter()
    for tid in range(1, d.count):
        k = d.kinds[tid]
        if k in (bf.VAR, bf.DATASEC, bf.DECL_TAG):
            with pytest.raises(KeyError):
                kernel_model.type_of(tid)
            continue
        t = kernel_model.type_of(tid)
        seen[type(t).__name__] += 1
        if k == bf.TYPE_TAG:
            assert t == QualifiedType("type_tag", d.ref(tid) or None, tag=d.name(tid))
    print(dict(seen))


def resolve_pointer_to(types: dict, tid: int) -> tuple[int, Optional[dict]]:
    """Follow bpftool-decoded types: (pointer depth, the struct reached or None)."""
    depth = 0
    for _ in range(64):
        if tid == 0:
            return depth, None
        t = types[tid]
        if t["kind"] == "PTR":
            depth += 1
        elif t["kind"] not in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
            return depth, t
        tid = int(t["attrs"]["type_id"])
    raise AssertionError("type chain too long")


def bpftool_functions_taking(types: dict, struct: str, every: Optional[dict] = None) -> set[str]:
    """The FUNCs of `types` with a ``struct X *`` parameter; their types looked up in
    `every` (a split BTF's base and its own records) when given."""
    every = types if every is None else every
    out = set()
    for t in types.values():
        if t["kind"] != "FUNC":
            continue
        proto = every[int(t["attrs"]["type_id"])]
        for _, p in proto["items"]:
            depth, target = resolve_pointer_to(every, int(p["type_id"]))
            if depth == 1 and target and target["kind"] == "STRUCT" and target["name"] == struct:
                out.add(t["name"])
    return out


def bpftool_tracepoints_carrying(types: dict, struct: str) -> set[str]:
    out = set()
    for t in types.values():
        if t["kind"] != "TYPEDEF" or not t["name"].startswith("btf_trace_"):
            continue
        ptr = types[int(t["attrs"]["type_id"])]
        proto = types[int(ptr["attrs"]["type_id"])]
        for _, p in proto["items"][1:]:
            depth, target = resolve_pointer_to(types, int(p["type_id"]))
            if depth == 1 and target and target["kind"] == "STRUCT" and target["name"] == struct:
                out.add(t["name"][len("btf_trace_"):])
    return out


@pytest.fixture(scope="module")
def kernel_dump(kernel_model) -> dict:
    need("bpftool")
    return bpftool_dump(KERNEL_BTF)


@pytest.mark.kernel
@pytest.mark.parametrize("struct", ["sock", "sk_buff"])
def test_kernel_functions_taking_struct_pointer(kernel_model, kernel_dump, struct):
    cat = kernel_model.catalog()
    ours = {f.name for f in cat.functions_referencing(ShapeKind.STRUCT, struct)
            if any(points_to_struct(p.shape, struct) for p in f.params)}
    theirs = bpftool_functions_taking(kernel_dump, struct)
    print(f"\nfunctions with a struct {struct} * parameter: {len(ours)} (bpftool: {len(theirs)})")
    assert ours == theirs
    # pfunct's rule is narrower: a parameter spelled exactly `struct X *`
    need("pfunct")
    pf = set(run("pfunct", "-F", "btf", f"--class={struct}", str(KERNEL_BTF)).split())
    exact = {f.name for f in cat.functions_referencing(ShapeKind.STRUCT, struct)
             if any(p.shape.text == f"struct {struct} *" for p in f.params)}
    print(f"pfunct --class={struct}: {len(pf)}, ours spelled exactly: {len(exact)}")
    assert exact == pf


@pytest.mark.bpf
@pytest.mark.kernel
@pytest.mark.parametrize("struct", ["sock", "sk_buff"])
def test_kernel_tracepoints_carrying_struct(kernel_model, kernel_dump, struct):
    from ctracer.host import features, tracefs
    cat = kernel_model.catalog()
    tps = cat.tracepoints_referencing(ShapeKind.STRUCT, struct)
    ours = {t.name for t in tps if any(points_to_struct(p.shape, struct)
                                       for p in t.params)}
    assert ours == bpftool_tracepoints_carrying(kernel_dump, struct)
    print(f"\ntracepoints carrying struct {struct} *: {len(ours)}")
    # the running kernel knows them: as trace events, or (bare tracepoints without an
    # event) by accepting a raw tracepoint program attached by name
    events = tracefs.tracepoint_names() or set()
    with_event = {e.split(":", 1)[1] for e in events}
    bare = sorted(ours - with_event)
    print(f"  with a trace event: {len(ours & with_event)}; bare: {bare}")
    if bare:
        attach = features.raw_tracepoints_attachable(bare)
        if attach is None:
            pytest.skip("cannot load BPF here to confirm bare tracepoints: " + ", ".join(bare))
        assert all(attach.values()), attach


@pytest.mark.kernel
def test_kernel_module_btf():
    module = first_module_btf()
    if module is None:
        why = ("this kernel has no module support (no /proc/modules)"
               if not os.path.exists("/proc/modules") else "no module with BTF is loaded")
        pytest.skip(f"no module BTF under {KERNEL_BTF.parent}: {why}; split BTF is tested "
                    "with pahole --btf_base objects, on Debian's nfs.ko in the guests "
                    "(test_kernel_module_btf_of_nfs_in_a_guest) and in the corpus run")
    check_module_btf(module)


def check_module_btf(module: Path) -> btf.BtfModel:
    """A module's split BTF read on top of the kernel's, record by record as bpftool."""
    model = btf.open_btf(str(module))  # the kernel's BTF is found as its base
    assert model.btf.first_id > 1
    kinds = check_against_bpftool(model, module, KERNEL_BTF)
    # the module's own FUNC records, as bpftool counts them, not its base's
    assert model.catalog().function_count() == kinds[bf.kind_name(bf.FUNC)]
    return model


@pytest.mark.vm
def test_kernel_module_btf_of_nfs_in_a_guest(vm_kernel):
    """Where the running kernel has modules (Debian's, in the guests): nfs.ko's BTF, as
    the kernel exposes it once loaded, read and checked as above; struct nfs_fh's
    layout as pahole reads it from the same split BTF; methods of nfs_fh found in it."""
    subprocess.run(["modprobe", "nfs"], check=True, capture_output=True, timeout=120)
    module = KERNEL_BTF.parent / "nfs"
    assert module.exists(), sorted(p.name for p in KERNEL_BTF.parent.iterdir())
    model = check_module_btf(module)
    need("pahole")
    theirs = pahole_leaves(module, "nfs_fh", "btf", base=KERNEL_BTF)
    assert theirs and our_leaves(model, "nfs_fh") == theirs
    # the functions taking a struct nfs_fh *, as bpftool's records say: the module's own
    # FUNCs, their types found in the module or in the kernel's BTF below it (where
    # Debian's vmlinux already defines struct nfs_fh)
    dump = {**bpftool_dump(KERNEL_BTF), **bpftool_dump(module, KERNEL_BTF)}
    cat = model.catalog()
    ours = {f.name for f in cat.functions_referencing(ShapeKind.STRUCT, "nfs_fh")
            if any(points_to_struct(p.shape, "nfs_fh") for p in f.params)}
    print(f"\n{module}: {cat.function_count()} functions, {len(ours)} taking a "
          "struct nfs_fh *")
    own = {tid: t for tid, t in dump.items() if tid >= model.btf.first_id}
    assert ours and ours == bpftool_functions_taking(own, "nfs_fh", dump)


# ------------------------------------------------------------------ Debian's kernel

CORPUS = Path(os.environ.get("CTRACER_CORPUS", "/work/corpus/x"))
CORPUS_VMLINUX = CORPUS / "usr/lib/debug/boot/vmlinux-6.1.0-50-cloud-amd64"
CORPUS_NFS = CORPUS / "usr/lib/debug/lib/modules/6.1.0-50-cloud-amd64/kernel/fs/nfs/nfs.ko"


@pytest.mark.corpus
def test_corpus_vmlinux_and_nfs_split_btf():
    if not CORPUS_VMLINUX.exists() or not CORPUS_NFS.exists():
        pytest.skip(f"Debian's vmlinux debug files are not under {CORPUS}")
    vmlinux = btf.open_btf(str(CORPUS_VMLINUX))
    check_against_bpftool(vmlinux, CORPUS_VMLINUX)
    nfs = btf.open_btf(str(CORPUS_NFS), base=vmlinux)
    check_against_bpftool(nfs, CORPUS_NFS, CORPUS_VMLINUX)
    assert our_leaves(nfs, "nfs_fh") == pahole_leaves(CORPUS_NFS, "nfs_fh", "dwarf")
    assert nfs.catalog().functions_referencing(ShapeKind.STRUCT, "nfs_fh")


def assert_lookups_equal_full_scan(model: btf.BtfModel, keys) -> None:
    """The indexed lookups answer what a scan of every function and struct answers."""
    cat = model.catalog()
    functions = cat.functions()
    structs = [cat.struct(n, k) for k in (ShapeKind.STRUCT, ShapeKind.UNION)
               for n in cat.struct_names(k)]
    for key in keys:
        scan = sorted(f.name for f in functions
                      if key in {(p.shape.kind, p.shape.name) for p in f.params}
                      or (f.returns.kind, f.returns.name) == key)
        assert sorted(f.name for f in cat.functions_referencing(*key)) == scan, key
        scan = sorted((s.kind, s.name) for s in structs
                      if key in {(m.shape.kind, m.shape.name) for m in s.members})
        assert sorted((s.kind, s.name) for s in cat.structs_with_member_of(*key)) == scan, key


def test_lookups_equal_full_scan(gcc_obj):
    model = btf.open_btf(str(gcc_obj))
    shapes = {(p.shape.kind, p.shape.name) for f in model.catalog().functions()
              for p in f.params}
    shapes |= {(m.shape.kind, m.shape.name) for n in model.struct_names()
               for m in model.catalog().struct(n).members}
    assert_lookups_equal_full_scan(model, sorted(shapes, key=repr))


@pytest.mark.kernel
def test_kernel_lookups_equal_full_scan(kernel_model):
    assert_lookups_equal_full_scan(kernel_model, [
        (ShapeKind.STRUCT, "sock"), (ShapeKind.STRUCT, "sk_buff"), (ShapeKind.STRUCT, None),
        (ShapeKind.UNION, None), (ShapeKind.UNION, "bpf_attr"), (ShapeKind.ENUM, None),
        (ShapeKind.BASE, "char"), (ShapeKind.VOID, None), (ShapeKind.FUNCTION, None),
        (ShapeKind.ARRAY, None), (ShapeKind.STRUCT, "list_head")])


def test_saved_indexes_answer_like_a_fresh_parse(gcc_obj, tmp_path):
    from ctracer.debuginfo.btf import cache as btf_cache
    from ctracer.debuginfo.cachedir import cache_dir
    fresh = btf.open_btf(str(gcc_obj), use_cache=False)
    first = btf.open_btf(str(gcc_obj))
    assert first.saved is None and first.catalog()  # builds and saves
    files = list(Path(cache_dir()).glob("btf-index-*"))
    assert len(files) == 1
    second = btf.open_btf(str(gcc_obj))
    assert second.saved is not None  # loaded: no pass over the records
    assert list(second.btf.offsets) == list(fresh.btf.offsets)
    keys = sorted({(p.shape.kind, p.shape.name) for f in fresh.catalog().functions()
                   for p in f.params}, key=repr)
    for key in keys:
        assert second.catalog().functions_referencing(*key) == \
            fresh.catalog().functions_referencing(*key)
        assert second.catalog().structs_with_member_of(*key) == \
            fresh.catalog().structs_with_member_of(*key)
    assert second.struct_names() == fresh.struct_names()
    cached, built = second.find_struct("thing"), fresh.find_struct("thing")
    assert cached[cached.root] == built[built.root]
    # a damaged file is ignored (and replaced)
    files[0].write_bytes(b"not marshal data")
    third = btf.open_btf(str(gcc_obj))
    assert third.saved is None
    assert third.catalog().function_count() == fresh.catalog().function_count()
    # other bytes, other key
    raw = bytearray(btf.read_btf_bytes(str(gcc_obj)))
    assert btf_cache.digest(bytes(raw)) != btf_cache.digest(bytes(raw[:-1]) + b"x")


@pytest.mark.kernel
def test_kernel_saved_indexes_answer_like_a_fresh_parse(kernel_model):
    btf.open_btf(str(KERNEL_BTF)).catalog()  # builds and saves
    warm = btf.open_btf(str(KERNEL_BTF))
    assert warm.saved is not None
    for struct in ("sock", "sk_buff", "socket"):
        key = (ShapeKind.STRUCT, struct)
        assert warm.catalog().functions_referencing(*key) == \
            kernel_model.catalog().functions_referencing(*key)
        assert warm.catalog().structs_with_member_of(*key) == \
            kernel_model.catalog().structs_with_member_of(*key)


def canonical(g, tid, depth: int = 0) -> str:
    """A type as text, for comparing graphs of two readers.  Arrays are compared by
    element count: pahole 1.24 writes int[2][3][4] to BTF as one array of 24, and BTF
    has no way to tell a flexible array (DWARF: no bound) from a zero-length one."""
    from ctracer.debuginfo.typegraph import BaseType, PointerType, Typedef
    if tid is None:
        return "void"
    t = g[tid]
    if isinstance(t, QualifiedType):
        return f"{t.qualifier}({canonical(g, t.target, depth)})"
    if isinstance(t, Typedef):
        return f"typedef {t.name}"
    if isinstance(t, PointerType):
        inner = canonical(g, t.target, depth + 1) if depth < 2 else "..."
        return f"ptr{t.size}({inner})"
    if isinstance(t, BaseType):
        return f"base {t.name} {t.size} {t.encoding.value}"
    if isinstance(t, EnumType):
        return f"enum {t.name} {t.size} {t.signed} {t.enumerators}"
    if isinstance(t, ArrayType):
        count = 1
        for d in t.dims:
            count *= d or 0
        return f"array[{count}] of {canonical(g, t.element, depth)}"
    if isinstance(t, FunctionType):
        params = ", ".join(canonical(g, p, depth + 1) for p in t.params)
        return f"fn {canonical(g, t.returns, depth + 1)} ({params}) {t.variadic}"
    if isinstance(t, CompositeType):
        if depth > 0 and t.name:
            return f"{t.kind} {t.name}"
        members = "; ".join(f"{m.name}@{m.bit_offset}:{m.bit_size}="
                            f"{canonical(g, m.type, depth + 1)}" for m in t.members)
        return f"{t.kind} {t.name} {t.size} {t.declaration} [{members}]"
    raise AssertionError(f"unexpected type {t!r}")


@pytest.mark.parametrize("name", FIXTURE_STRUCTS)
def test_struct_graphs_match_dwarf_reader(gcc_obj, name):
    """find_struct from the .BTF section and from the DWARF of the same object describe
    the same types (names, sizes, encodings, offsets, bitfields, qualifiers, typedefs)."""
    from ctracer.debuginfo.dwarf import reader as dwarf
    ours = btf.open_btf(str(gcc_obj)).find_struct(name)
    theirs = dwarf.open_elf_types(str(gcc_obj), use_cache=False).find_struct(name)
    assert canonical(ours, ours.root) == canonical(theirs, theirs.root)
