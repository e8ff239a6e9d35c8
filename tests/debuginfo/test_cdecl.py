"""C declarators (`ctracer.debuginfo.cdecl`): spelled as C requires, checked by the compiler.

The oracle is gcc itself: for every member of every fixture struct (types read back from
the DWARF of a gcc and a clang build), the declaration ctracer writes is compiled next to
the original source and ``__builtin_types_compatible_p`` must say it denotes the very type
of that member.  Hand-built graphs pin the spelling of the classic hard cases.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c, need
from ctracer.debuginfo import cdecl
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, Encoding, EnumType,
                                     FunctionType, Member, PointerType, QualifiedType, TypeGraph,
                                     Typedef, iter_members_flat)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "layout"

INT, CHAR, VOID_PTR, SOCK, SOCK_PTR, FN, FN_PTR, CONST_FOO = range(1, 9)


def graph(extra: dict, root: int = INT) -> TypeGraph:
    types = {
        INT: BaseType("int", 4, Encoding.SIGNED),
        CHAR: BaseType("char", 1, Encoding.SIGNED_CHAR),
        VOID_PTR: PointerType(None, 8),
        SOCK: CompositeType("struct", "sock", 0, declaration=True),
        SOCK_PTR: PointerType(SOCK, 8),
        FN: FunctionType(None, (SOCK_PTR, INT)),
        FN_PTR: PointerType(FN, 8),
        CONST_FOO: QualifiedType("const", 100),
        100: CompositeType("struct", "foo", 0, declaration=True),
    }
    types.update(extra)
    return TypeGraph(types, root)


def test_array_of_char():
    g = graph({20: ArrayType(CHAR, (16,))})
    assert cdecl.declaration(g, 20, "name") == "char name[16]"
    assert cdecl.type_name(g, 20) == "char [16]"


def test_function_pointer():
    g = graph({})
    assert cdecl.declaration(g, FN_PTR, "fn") == "void (*fn)(struct sock *, int)"
    assert cdecl.type_name(g, FN_PTR) == "void (*)(struct sock *, int)"


def test_const_pointer_chain():
    # const struct foo *const *p
    g = graph({21: PointerType(CONST_FOO, 8), 22: QualifiedType("const", 21),
               23: PointerType(22, 8)})
    assert cdecl.declaration(g, 23, "p") == "const struct foo *const *p"


def test_array_of_function_pointers_and_pointer_to_array():
    g = graph({24: ArrayType(FN_PTR, (4,)), 25: ArrayType(INT, (10,)),
               26: PointerType(25, 8), 27: ArrayType(INT, (2, 3))})
    assert cdecl.declaration(g, 24, "handlers") == "void (*handlers[4])(struct sock *, int)"
    assert cdecl.declaration(g, 26, "rows") == "int (*rows)[10]"
    assert cdecl.declaration(g, 27, "m") == "int m[2][3]"


def test_function_returning_function_pointer():
    # int (*(*factory)(void))(int)
    g = graph({30: FunctionType(INT, (INT,)), 31: PointerType(30, 8),
               32: FunctionType(31, ()), 33: PointerType(32, 8)})
    assert cdecl.declaration(g, 33, "factory") == "int (*(*factory)(void))(int)"


def test_variadic_and_flexible_and_qualified_pointer():
    g = graph({40: QualifiedType("const", CHAR), 41: PointerType(40, 8),
               42: FunctionType(INT, (41,), variadic=True), 43: PointerType(42, 8),
               44: ArrayType(CHAR, (None,)), 45: QualifiedType("volatile", INT),
               46: PointerType(45, 8), 47: QualifiedType("restrict", 46)})
    assert cdecl.declaration(g, 43, "open") == "int (*open)(const char *, ...)"
    assert cdecl.declaration(g, 44, "data") == "char data[]"
    assert cdecl.declaration(g, 47, "p") == "volatile int *restrict p"


def test_anonymous_struct_and_enum_are_spelled_out():
    g = graph({50: CompositeType("struct", None, 8, (Member("a", INT, 0),
                                                     Member("b", INT, 32, bit_size=3))),
               51: EnumType(None, 4, (("A", 1), ("B", -2)), signed=True),
               52: Typedef("sock_t", SOCK)})
    assert cdecl.declaration(g, 50, "inner") == "struct { int a; int b:3; } inner"
    assert cdecl.declaration(g, 51, "e") == "enum { A = 1, B = -2 } e"
    assert cdecl.declaration(g, 52, "s") == "sock_t s"


def test_member_declaration_bitfield_and_alignment():
    g = graph({})
    assert cdecl.member_declaration(g, Member("flags", INT, 0, bit_size=3)) == "int flags:3"
    assert cdecl.member_declaration(g, Member("hot", INT, 0, alignment=64)) == \
        "int hot __attribute__((aligned(64)))"


def test_complex_base_type_is_spelled_as_c():
    g = graph({60: BaseType("complex float", 8, Encoding.COMPLEX_FLOAT)})
    assert cdecl.declaration(g, 60, "z") == "_Complex float z"


@pytest.mark.parametrize("bad", ["a b", "x;y", "1st", "", "f()"])
def test_names_that_are_not_identifiers_are_refused(bad):
    g = graph({70: Typedef(bad, INT), 71: CompositeType("struct", bad, 4)})
    with pytest.raises(cdecl.UnsafeName):
        cdecl.declaration(g, INT, bad)
    if bad:
        with pytest.raises(cdecl.UnsafeName):
            cdecl.type_name(g, 70)
        with pytest.raises(cdecl.UnsafeName):
            cdecl.type_name(g, 71)


# ------------------------------------------------------------------ gcc as the oracle


def _mentions_anonymous(g: TypeGraph, tid, seen=None) -> bool:
    """Whether spelling this type writes out an anonymous struct/union/enum (which C
    makes a new, distinct type: it cannot be compared for identity)."""
    seen = set() if seen is None else seen
    if tid is None or tid in seen:
        return False
    seen.add(tid)
    t = g[tid]
    if isinstance(t, (CompositeType, EnumType)):
        return t.name is None
    if isinstance(t, FunctionType):
        return any(_mentions_anonymous(g, p, seen) for p in (t.returns, *t.params))
    target = getattr(t, "target", None) if not isinstance(t, ArrayType) else t.element
    return _mentions_anonymous(g, target, seen)


def _candidates(path: Path) -> list[tuple]:
    """(graph, member type, C access expression, label) for every named member that is
    not a bitfield in the model."""
    model = dwarf.open_elf_types(str(path), use_cache=False)
    found = []
    for kind in (ShapeKind.STRUCT, ShapeKind.UNION):
        for sname in model.struct_names(kind):
            g = model.find_struct(sname, kind)
            for path_, member, _bits in iter_members_flat(g, g.root):
                if member.bit_size or not member.name:
                    continue
                access = ".".join(p for p in path_.split(".") if p)
                expr = f"__typeof__(((({kind.value} {sname} *)0)->{access}))"
                found.append((g, member.type, expr, f"{sname}.{access}"))
    return found


def _compile(source_text: str, extra: list[str], where: Path) -> subprocess.CompletedProcess:
    where.write_text(source_text + "\n/* ctracer's declarations */\n" + "\n".join(extra) + "\n")
    return compile_c(where, None, debug=False, flags=["-std=gnu11", "-fsyntax-only"],
                     check=False)


def _typeof_able(source_text: str, candidates: list[tuple], where: Path) -> list[tuple]:
    """The candidates gcc can take ``__typeof__`` of: clang writes no bit size for a
    bitfield as wide as its type (``unsigned int whole:32``), so the model cannot tell
    those from plain members, and C refuses typeof on them."""
    probes = [f"typedef {expr} ctracer_probe_{i};" for i, (_, _, expr, _) in enumerate(candidates)]
    result = _compile(source_text, probes, where)
    first = source_text.count("\n") + 3  # line of probe 0
    refused = {int(line.split(":")[1]) - first for line in result.stderr.splitlines()
               if line.startswith(str(where)) and "bit-field" in line}
    return [c for i, c in enumerate(candidates) if i not in refused]


def _checks(candidates: list[tuple]) -> tuple[list[str], int]:
    lines, compared = [], 0
    for i, (g, tid, expr, label) in enumerate(candidates):
        alias = f"ctracer_check_{i}"
        if _mentions_anonymous(g, tid):
            # valid C is all that can be checked; a block scope lets an anonymous enum's
            # enumerators be declared again
            lines.append(f"void ctracer_scope_{i}(void) "
                         f"{{ typedef {cdecl.declaration(g, tid, alias)}; }}")
            continue
        lines.append(f"typedef {cdecl.declaration(g, tid, alias)};")
        lines.append(f"_Static_assert(__builtin_types_compatible_p({alias}, {expr}),"
                     f" \"declaration of {label}\");")
        lines.append(f"_Static_assert(__builtin_types_compatible_p({cdecl.type_name(g, tid)},"
                     f" {expr}), \"type name of {label}\");")
        compared += 1
    return lines, compared


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
@pytest.mark.parametrize("source", ["types.c", "anon.c", "bitfields.c", "packing.c", "edge.c",
                                    "big.c"])
def test_declarations_denote_the_member_types(tmp_path, compiler, source):
    need(compiler, "gcc")
    src = FIXTURES / source
    binary = tmp_path / "fixture.so"
    compile_c(src, binary, Build(compiler, opt=0), flags=["-shared", "-fPIC"])
    text = src.read_text()
    candidates = _typeof_able(text, _candidates(binary), tmp_path / "probe.c")
    lines, compared = _checks(candidates)
    assert compared > 0
    result = _compile(text, lines, tmp_path / "check.c")
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"{source} ({compiler}): {compared} member types checked by gcc")


@pytest.mark.kernel
def test_one_spelling_for_every_reader():
    """The display text of the model (`type_text`) and of the BTF records (`c_type_text`,
    which `TypeShape.text` holds) come from the same speller: the types every member of
    the running kernel's struct sock and sk_buff reaches are spelled alike."""
    from ctracer.debuginfo.btf import reader as btf
    from ctracer.debuginfo.sources import KERNEL_BTF
    if not Path(KERNEL_BTF).exists():
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    model = btf.open_btf(KERNEL_BTF)
    compared = 0
    for name in ("sock", "sk_buff"):
        g = model.find_struct(name)
        for _path, member, _bits in iter_members_flat(g, g.root):
            assert cdecl.type_text(g, member.type) == btf.c_type_text(model.btf, member.type)
            compared += 1
    assert compared > 100


def test_pointer_qualifiers_and_qualifier_order():
    g = graph({80: PointerType(CHAR, 8), 81: QualifiedType("const", 80),
               82: QualifiedType("volatile", 83), 83: QualifiedType("const", INT),
               84: CompositeType("union", None, 4, ()), 85: QualifiedType("type_tag", 84)})
    assert cdecl.type_text(g, 81) == "char *const"
    assert cdecl.type_text(g, 82) == "const volatile int"
    assert cdecl.type_text(g, 85) == "union {...}"
    assert cdecl.type_name(g, 85) == "union { }"
