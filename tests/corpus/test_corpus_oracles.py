"""The corpus check's own parts on a small program built here, so they are trusted
before they judge a kernel: the tool runners and parsers (pfunct, pahole, llvm-dwarfdump,
nm), the pfunct rules (a unit that only declares the struct, a const parameter), and
the DWARF/BTF layout comparison.  Runs in the default suite (no corpus needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import corpus_layouts as layouts
import corpus_methods as methods
import corpus_oracles as oracles
import pytest
from support.cbuild import Build, compile_c, need

from ctracer.debuginfo.btf import reader as btf
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.plan.discovery import discover

DEFINES = """\
struct s { int a; long b __attribute__((aligned(16))); int m[2][3]; };
struct t { char c; struct s *p; };
struct r { struct s x; char c; long d __attribute__((aligned(8))); };
typedef struct sh sh;  /* a typedef named like its struct, before the struct */
struct sh { int x; };
int f(struct s *x) { return x->a; }
int h(const struct s *x) { return x->a; }
int u(struct t *y) { return y->c; }
int v(struct r *z) { return z->c; }
int w(sh *p) { return p->x; }
int main(void) { return 0; }
"""
DECLARES = """\
struct s;
int g(struct s *x) { return x != 0; }
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("corpus-oracles")
    (where / "a.c").write_text(DEFINES)
    (where / "b.c").write_text(DECLARES)
    compile_c(["a.c", "b.c"], "prog", Build(opt=0), cwd=where)
    return where / "prog"


pytestmark = pytest.mark.usefixtures("private_cache")


def test_dwarfdump_finds_units_defining_names(program):
    if oracles.dwarfdump_command() is None:
        pytest.skip("llvm-dwarfdump is not installed (Debian package llvm)")
    facts = oracles.unit_facts(program, ["s", "f", "g"])
    assert facts.units_defining_struct("s") == {"a.c"}
    assert facts.units_defining_function("f") == {"a.c"}
    assert facts.units_defining_function("g") == {"b.c"}


def test_pfunct_rules_explain_what_pfunct_leaves_out(program):
    need("pfunct")
    if oracles.dwarfdump_command() is None:
        pytest.skip("llvm-dwarfdump is not installed (Debian package llvm)")
    pfunct = oracles.pfunct_class(program, "s")
    assert pfunct.names == {"f"}  # g: its unit only declares s; h: const
    found = discover(dwarf.open_elf_types(str(program)).catalog(), "s")
    cmp = methods.compare_with_pfunct(found, pfunct.names, "test", pfunct.seconds)
    assert {m.name for m in cmp.unit_candidates()} == {"g"}
    unsettled = methods.pfunct_findings(cmp, oracles.function_symbols(program))
    assert any("g (b.c)" in failure for failure in unsettled.failures)
    cmp.settle_units(oracles.unit_facts(program, ["s", "g"]))
    settled = methods.pfunct_findings(cmp, oracles.function_symbols(program))
    assert settled.ok, settled.failures
    text = "\n".join(settled.lines)
    assert methods.unit_reason("s") in text
    assert "qualified or typedef'd parameter" in text
    assert "reached as holder" in text  # u reaches s through t->p


def test_pahole_layouts_in_any_order_equal_single_runs(program):
    need("pahole")
    got = oracles.pahole_layouts(program, ["t", "s", "no_such_struct", "sh"], "dwarf")
    for name in ("s", "t"):
        alone = subprocess.run(["pahole", "-F", "dwarf", "-C", name, str(program)],
                               capture_output=True, text=True, check=True).stdout
        assert got.texts[name] == alone
    assert got.not_found == ["no_such_struct"]
    assert got.typedef_shadowed == ["sh"]  # pahole -C sh prints "typedef struct sh sh;"
    rendered = layouts.render_structs(dwarf.open_elf_types(str(program)), ["s", "t", "sh"])
    findings = layouts.compare_with_pahole(rendered, got, "test")
    assert findings.ok, findings.failures
    assert "2 of 2 identical to pahole" in findings.lines[0]


def test_dwarf_and_btf_texts_differ_only_where_pahole_prints_them_differently(
        program, tmp_path):
    """t prints the same from both; r differs only in alignment (DWARF records it, BTF
    does not); s also in a 2-D array, which pahole prints flattened from BTF.  The
    model facts are equal for all three."""
    need("pahole")
    with_btf = tmp_path / "prog.btf"
    shutil.copyfile(program, with_btf)
    subprocess.run(["pahole", "-J", str(with_btf)], check=True, capture_output=True)
    names = ["s", "t", "r"]
    d = layouts.render_structs(dwarf.open_elf_types(str(program)), names)
    b = layouts.render_structs(btf.open_btf(str(with_btf)), names)
    for name in names:  # the BTF side is pahole's, as the corpus check also verifies
        assert b[name].text == subprocess.run(
            ["pahole", "-F", "btf", "-C", name, str(with_btf)], capture_output=True,
            text=True, check=True).stdout
    assert "x __attribute__((__aligned__(16)))" in d["r"].text
    assert "__aligned__" not in b["r"].text
    findings = layouts.compare_formats(d, b)
    assert findings.ok, findings.failures
    assert "m[2][3];" in d["s"].text and "m[6];" in b["s"].text
    assert ("rendered text: 1 identical, 2 identical apart from what pahole prints "
            "differently from DWARF and BTF, none otherwise different") in findings.lines


def test_facts_differences_fail_unless_the_name_is_shared():
    d = layouts.Rendered("x", (8, (("a", 0, 0, 4), ("b", 32, 0, 4))), 0.0)
    b = layouts.Rendered("x", (8, (("a", 0, 0, 4), ("b", 40, 0, 4))), 0.0)
    findings = layouts.compare_formats({"x": d}, {"x": b})
    assert findings.failures == ["x: member b: DWARF (bit offset, bit size, size) "
                                 "(32, 0, 4), BTF (40, 0, 4)"]
    # BTF holding one struct x only: still a failure
    assert not layouts.compare_formats({"x": d}, {"x": b}, lambda name: [8]).ok
    # two structs named x, one of DWARF's size: the other is BTF's first
    bigger = layouts.Rendered("y", (16, (("c", 0, 0, 16),)), 0.0)
    shared = layouts.compare_formats({"x": d}, {"x": bigger}, lambda name: [16, 8])
    assert shared.ok, shared.failures
    assert any("x (8, 16)" in line for line in shared.lines)
    assert not layouts.compare_formats({"x": d}, {"x": bigger}, lambda name: [16, 12]).ok


def test_nm_symbols_and_clones(tmp_path):
    need("nm")
    (tmp_path / "c.c").write_text(
        "__attribute__((noinline)) static int k(int a, int b) { return a * b + 7; }\n"
        "int use(int x) { return k(x, 3) + k(x + 1, 3); }\n")
    compile_c("c.c", "c.o", Build(opt=2), debug=False, flags=["-c"], cwd=tmp_path)
    symbols = oracles.function_symbols(tmp_path / "c.o")
    assert "use" in symbols.by_name
    clones = [n for n in symbols.by_name if n.startswith("k.")]
    if not clones:
        pytest.skip("this gcc did not clone k (no k.constprop.N to look for)")
    address = next(iter(symbols.by_name[clones[0]]))
    assert symbols.clones_at("k", address) == [clones[0]]
    assert "k" not in symbols.by_name
