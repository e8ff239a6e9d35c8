"""The mini struct on real DWARF: every recorded field's origin agrees with pahole and
with the C compiler (a C program fills a struct sock and prints each field; the Python
reference collector `extract_field` must read the same values from the raw bytes), the
reorganized layout compiles, is never larger and prints exactly like pahole prints it."""

import re
import subprocess
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.event import Layout
from ctracer.plan.mini import build_mini, extract_field, render_mini

FIXTURES = Path(__file__).parents[1] / "fixtures" / "discovery"

TYPEDEFS = """typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32;
typedef unsigned long long u64; typedef signed char s8; typedef short s16;
typedef int s32; typedef long long s64;
"""


def _compile(tmp_path, name, source, cc="gcc", extra=()):
    c_file = tmp_path / f"{name}.c"
    c_file.write_text(source)
    out = tmp_path / name
    compile_c(c_file, out, Build(cc, opt=0), flags=["-I", str(FIXTURES), *extra])
    return out


@pytest.fixture(scope="module", params=["gcc", "clang"])
def built(request, tmp_path_factory):
    cc = request.param
    out = tmp_path_factory.mktemp("mini") / f"net-{cc}"
    compile_c([FIXTURES / "net.c", FIXTURES / "net2.c"], out, Build(cc, opt=0))
    return cc, out, dwarf.open_elf_types(str(out), use_cache=False)


# ------------------------------------------------------------------ pahole -E parser


_LEAF = re.compile(r"^(?P<decl>.*?);\s*/\*\s*(?P<off>\d+)(?::\s*(?P<bit>\d+))?\s+(?P<size>\d+)\s*\*/")
_CLOSE = re.compile(r"^}\s*(?P<name>\w*)\s*;")


def pahole_leaves(binary, struct):
    """{dotted member path: (byte offset, bit offset in unit or None, size, bit width,
    declaration)} from ``pahole -E``, anonymous structs/unions adding no step."""
    text = subprocess.run(["pahole", "-E", "-C", struct, str(binary)], check=True,
                          capture_output=True, text=True).stdout
    stack = [[]]
    for raw in text.splitlines()[1:]:
        line = re.sub(r"/\* typedef \w+ \*/\s*", "", raw.strip())
        if not line or line.startswith("/*"):
            continue
        if line.endswith("{"):
            stack.append([])
            continue
        close = _CLOSE.match(line)
        if close:
            if len(stack) == 1:
                break
            children = stack.pop()
            prefix = f"{close.group('name')}." if close.group("name") else ""
            stack[-1].extend((prefix + n, v) for n, v in children)
            continue
        m = _LEAF.match(line)
        assert m, raw
        decl = m.group("decl")
        fp = re.search(r"\(\*\s*(\w+)\)", decl)
        name_m = fp or re.search(r"(\w+)\s*(?:\[[^\]]*\])*\s*(?::\s*(\d+))?$", decl)
        width = int(name_m.group(2)) if not fp and name_m.group(2) else 0
        bit = int(m.group("bit")) if m.group("bit") is not None else None
        stack[-1].append((name_m.group(1), (int(m.group("off")), bit, int(m.group("size")),
                                            width, decl)))
    return dict(stack[0])


# ------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def gcc_build(tmp_path_factory):
    """The fixture built by gcc: pahole -E prints clang's anonymous unions twice, so
    gcc's DWARF (same x86-64 ABI, same layout) is what pahole is asked about."""
    out = tmp_path_factory.mktemp("mini-oracle") / "net-gcc"
    compile_c([FIXTURES / "net.c", FIXTURES / "net2.c"], out, Build(opt=0))
    return out


def test_fields_match_pahole_offsets_and_bitfields(built, gcc_build):
    _, _, model = built
    mini = build_mini(model.find_struct("sock"), pointers=True)
    leaves = pahole_leaves(gcc_build, "sock")
    recorded = {f.name for f in mini.layout.fields}
    skipped = {s.name for s in mini.skipped}
    assert recorded | skipped == set(leaves)
    assert not recorded & skipped
    for f in mini.layout.fields:
        off, bit, size, width, decl = leaves[f.name]
        src = f.source
        if width:
            assert (src["bit_offset"], src["bit_size"]) == (off * 8 + bit, width), f.name
            assert 8 * src["size"] >= src["shift"] + width
        else:
            assert (src["byte_offset"], src["size"]) == (off, size), f.name
            assert src["bit_offset"] == off * 8
    for name in ("sk_addr", "__sk_common.skc_u16hashes"):
        assert name in skipped and "[" in leaves[name][4]


def test_kinds_enums_and_skips(built):
    _, _, model = built
    mini = build_mini(model.find_struct("sock"))
    f = {x.name: x for x in mini.layout.fields}
    assert f["__sk_common.skc_state"].ctype == "u8"
    assert f["__sk_common.skc_reuse"].ctype == "u8" and f["sk_delta"].ctype == "s8"
    assert f["sk_state2"].kind == "enum" and (7, "SS_CLOSE") in f["sk_state2"].enumerators
    assert f["sk_small"].kind == "enum" and f["sk_small"].ctype == "s8"
    assert dict(f["sk_small"].enumerators) == {-1: "SMALL_A", 100: "SMALL_B"}
    assert f["sk_dead"].kind == "bool"
    assert f["sk_pacing_ratio"].ctype == "float" and f["sk_weight"].ctype == "double"
    assert f["sk_name"].ctype == "char[16]" and f["sk_name"].kind == "text"
    assert f["__sk_common.skc_refcnt.refs.counter"].ctype == "s32"
    assert f["__sk_common.skc_daddr"].source["union"] is True
    reasons = {s.name: s.reason for s in mini.skipped}
    assert "pointer" in reasons["sk_next"] and "pointer" in reasons["sk_data_ready"]
    assert not any(x.kind == "pointer" for x in mini.layout.fields)
    with_ptrs = build_mini(model.find_struct("sock"), pointers=True, char_arrays=False)
    ptr = with_ptrs.layout.field("sk_socket")
    assert (ptr.kind, ptr.ctype) == ("pointer", "u64")
    assert "sk_name" not in {x.name for x in with_ptrs.layout.fields}
    frag = build_mini(model.find_struct("sk_frag"))
    assert {s.name: s.reason for s in frag.skipped}["data"] == "flexible array"
    assert frag.layout.field("last").source["byte_offset"] + frag.layout.field("last").source["size"] <= 8


def _checker_source(struct, fields):
    """C that fills a struct with pseudo-random bytes, sets the fields whose every bit
    pattern is not a valid value, writes the raw object to argv[1] and prints each field
    as C reads it."""
    sets, prints = [], []
    for i, f in enumerate(fields):
        n = f.name
        if f.kind == "float":
            sets.insert(0, f"obj.{n} = {i}.25;")
            prints.append(f'printf("{n} %a\\n", (double)obj.{n});')
        elif f.kind == "text":
            sets.insert(0, f'strcpy(obj.{n}, "t{i}");')
            prints.append(f'printf("{n} %s\\n", obj.{n});')
        else:
            if f.kind == "bool":
                sets.append(f"obj.{n} = {i % 2};")
            if f.ctype == "u64" or f.kind == "pointer":
                prints.append(f'printf("{n} %llu\\n", (unsigned long long)obj.{n});')
            else:
                prints.append(f'printf("{n} %lld\\n", (long long)obj.{n});')
    return ("#include <stdio.h>\n#include <string.h>\n#include \"net_types.h\"\n"
            f"static struct {struct} obj;\n"
            "int main(int argc, char **argv) {\n"
            "\tunsigned char *p = (unsigned char *)&obj; unsigned x = 2463534242u;\n"
            "\tfor (size_t i = 0; i < sizeof obj; i++) { x ^= x << 13; x ^= x >> 17; x ^= x << 5; p[i] = (unsigned char)x; }\n"
            + "".join(f"\t{s}\n" for s in sets)
            + "\tFILE *out = fopen(argv[1], \"wb\"); fwrite(&obj, sizeof obj, 1, out); fclose(out);\n"
            + "".join(f"\t{s}\n" for s in prints) + "\t(void)argc; return 0;\n}\n")


@pytest.mark.parametrize("struct", ["sock", "sk_frag", "tcp_sock"])
def test_extract_field_reads_what_c_reads(built, tmp_path, struct):
    _, _, model = built
    mini = build_mini(model.find_struct(struct), pointers=True)
    fields = list(mini.layout.fields)
    exe = _compile(tmp_path, "checker", _checker_source(struct, fields))
    raw_file = tmp_path / "raw.bin"
    out = subprocess.run([str(exe), str(raw_file)], check=True, capture_output=True,
                         text=True).stdout
    raw = raw_file.read_bytes()
    assert len(raw) == mini.struct_size
    expected = dict(line.split(" ", 1) for line in out.splitlines())
    assert set(expected) == {f.name for f in fields}
    for f in fields:
        got = extract_field(raw, f)
        want = expected[f.name]
        if f.kind == "float":
            assert got == float.fromhex(want), f.name
        elif f.kind == "text":
            assert got == want, f.name
        else:
            assert got == int(want), f.name


def test_reorganized_layout_compiles_and_is_never_larger(built, tmp_path):
    _, _, model = built
    for struct in ("sock", "sock_common", "tcp_sock", "socket", "sk_buff", "sk_frag"):
        mini = build_mini(model.find_struct(struct), pointers=True)
        plain = build_mini(model.find_struct(struct), pointers=True, reorganize_fields=False)
        assert mini.layout.size <= plain.layout.size == mini.unreorganized_size
        assert sorted(f.name for f in mini.layout.fields) == sorted(f.name for f in plain.layout.fields)
        for f in mini.layout.fields:
            assert f.offset % (1 if f.ctype.startswith("char[") else f.size) == 0
        assert mini.layout.name == f"ctracer__mini_{struct}"
        _compile(tmp_path, "mini_" + struct, TYPEDEFS + mini.layout.c_definition()
                 + "int main(void) { return 0; }\n")


def _natural_c(layout):
    """The layout as an ordinary C struct (members in offset order, no packing)."""
    body = []
    for f in sorted(layout.fields, key=lambda f: f.offset):
        if f.ctype.startswith("char["):
            body.append(f"\tchar {f.c_name}{f.ctype[4:]};")
        else:
            body.append(f"\t{f.ctype} {f.c_name};")
    return TYPEDEFS + f"struct {layout.name} {{\n" + "\n".join(body) + "\n} v;\n"


def _pahole(binary, struct, *flags):
    return subprocess.run(["pahole", *flags, "-C", struct, str(binary)], check=True,
                          capture_output=True, text=True).stdout


def test_render_is_what_pahole_prints_for_the_same_struct(built, tmp_path):
    _, _, model = built
    for struct in ("sock", "sk_stats", "socket"):
        mini = build_mini(model.find_struct(struct))
        obj = tmp_path / f"{struct}.o"
        (tmp_path / f"{struct}.c").write_text(_natural_c(mini.layout))
        compile_c(tmp_path / f"{struct}.c", obj, flags=["-c"])
        assert render_mini(mini.layout, sources=False) == _pahole(obj, mini.layout.name)
        with_sources = render_mini(mini.layout, skipped=mini.skipped, struct_size=mini.struct_size)
        for f in mini.layout.fields:
            assert f"/* {f.name}: {f.source['ctype']}" in with_sources


def test_reorganize_is_as_good_as_paholes_on_the_mini(built, tmp_path):
    _, _, model = built
    for struct in ("sock", "tcp_sock", "sk_buff"):
        plain = build_mini(model.find_struct(struct), pointers=True, reorganize_fields=False)
        obj = tmp_path / f"{struct}.o"
        (tmp_path / f"{struct}.c").write_text(_natural_c(plain.layout))
        compile_c(tmp_path / f"{struct}.c", obj, flags=["-c"])
        pahole_size = int(re.search(r"size: (\d+)", _pahole(obj, plain.layout.name, "-R")).group(1))
        mini = build_mini(model.find_struct(struct), pointers=True)
        assert mini.layout.size <= pahole_size


def test_selection_by_name_and_cacheline(built):
    _, _, model = built
    graph = model.find_struct("sock")
    common = build_mini(graph, include=["__sk_common"])
    assert common.layout.fields and all(f.name.startswith("__sk_common.") for f in common.layout.fields)
    no_common = build_mini(graph, exclude=["__sk_common", "sk_stats.*"])
    names = {f.name for f in no_common.layout.fields}
    assert not any(n.startswith(("__sk_common.", "sk_stats.")) for n in names) and "sk_rcvbuf" in names
    second = build_mini(graph, cachelines=[1])
    assert second.layout.fields
    for f in second.layout.fields:
        start, size = f.source["byte_offset"], f.source["size"]
        assert start // 64 <= 1 <= (start + size - 1) // 64
    # a member of the kernel's two-underscore wrapper struct goes by its own name too
    state = build_mini(graph, include=["skc_state", "sk_rcvbuf"])
    assert {f.name for f in state.layout.fields} == {"__sk_common.skc_state", "sk_rcvbuf"}
    both = build_mini(graph, include=["sk_*"], cachelines=[0])
    assert {f.name for f in both.layout.fields} == {
        f.name for f in build_mini(graph, cachelines=[0]).layout.fields if f.name.startswith("sk_")}
    assert Layout.from_json(both.layout.to_json()) == both.layout
