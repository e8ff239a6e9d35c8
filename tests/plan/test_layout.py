"""`ctracer struct` as a command (errors, unions, --mini) and `layout.render` as an API.

Text-for-text comparisons with pahole live in test_layout_oracle.py; here: what the
command does around the layout, and the renderer on graphs built by hand whose C twin is
compiled and printed by pahole.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c, need
from ctracer import cli
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.plan import pahole as layout
from ctracer.debuginfo.typegraph import (ArrayType, BaseType, CompositeType, Encoding, Member,
                                     PointerType, TypeGraph)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "layout"


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def fixture_so(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("layout-cmd") / "big.so"
    compile_c(FIXTURES / "big.c", out, Build(opt=0), flags=["-shared", "-fPIC"])
    return out


def ctracer(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_unknown_struct_is_one_line_with_suggestions(capsys, fixture_so):
    status, out, err = ctracer(capsys, "struct", "holy", "--binary", str(fixture_so))
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and "no struct holy" in err and "holey" in err


def test_explicit_kind_is_respected(capsys, fixture_so):
    status, _, err = ctracer(capsys, "struct", "union", "holey", "--binary", str(fixture_so))
    assert status == 1 and "no union holey" in err


def test_mini_options_need_mini(capsys, fixture_so):
    status, _, err = ctracer(capsys, "struct", "big_one", "--fields", "refs",
                             "--binary", str(fixture_so))
    assert status == 2 and "need --mini" in err


def test_mini_records_the_base_type_members(capsys, fixture_so):
    status, out, err = ctracer(capsys, "struct", "big_one", "--binary", str(fixture_so),
                               "--mini", "--no-cache")
    assert status == 0, err
    assert out.startswith("struct ctracer__mini_big_one {\n")
    recorded = set(re.findall(r"^\t\S+\s+(\w+)(?:\[\d+\])?;", out, re.M))
    # members of struct big_one that are plain integers, by the pahole layout
    status, full, _ = ctracer(capsys, "struct", "big_one", "--binary", str(fixture_so),
                              "--no-cache")
    assert status == 0
    for name in ("refs", "flag"):
        assert re.search(rf"^\t\w[\w ]*\s{name};", full, re.M)
        assert name in recorded
    assert "p1__l" in recorded and "bits" in recorded
    status, only, _ = ctracer(capsys, "struct", "big_one", "--binary", str(fixture_so),
                              "--mini", "--no-cache", "--fields", "refs", "flag")
    assert set(re.findall(r"^\t\S+\s+(\w+);", only, re.M)) == {"refs", "flag"}


def test_mini_field_is_the_hidden_former_spelling_of_fields(capsys, fixture_so):
    """`ctracer struct --field P` (one pattern a flag, the former spelling) still works,
    as argparse's abbreviation of `--fields P` (no hidden option of its own); only
    `--fields` shows in the help, as in `ctracer trace`."""
    base = ("struct", "big_one", "--binary", str(fixture_so), "--mini", "--no-cache")
    _, old, _ = ctracer(capsys, *base, "--field", "refs", "--field", "flag")
    _, new, _ = ctracer(capsys, *base, "--fields", "refs", "flag")
    _, mixed, _ = ctracer(capsys, *base, "--field", "refs", "--fields", "flag")
    assert old == new == mixed and set(re.findall(r"^\t\S+\s+(\w+);", new, re.M)) == {
        "refs", "flag"}
    with pytest.raises(SystemExit):
        ctracer(capsys, "struct", "--help")
    help_text = capsys.readouterr().out
    assert "--fields GLOB" in help_text and "--field " not in help_text


def test_mini_exclude_fields_spelled_as_in_trace(capsys, fixture_so):
    """Fields are left out with `--exclude-fields GLOB...` in `struct --mini` as in
    `trace` (`--exclude` leaves out functions there); `struct --exclude P` (the former
    spelling) still works as argparse's abbreviation of `--exclude-fields`, not shown."""
    base = ("struct", "big_one", "--binary", str(fixture_so), "--mini", "--no-cache")
    _, everything, _ = ctracer(capsys, *base)
    _, new, _ = ctracer(capsys, *base, "--exclude-fields", "refs", "flag")
    _, old, _ = ctracer(capsys, *base, "--exclude", "refs", "--exclude", "flag")
    names = set(re.findall(r"^\t\S+\s+(\w+)(?:\[\d+\])?;", everything, re.M))
    assert {"refs", "flag"} <= names
    assert old == new
    assert set(re.findall(r"^\t\S+\s+(\w+)(?:\[\d+\])?;", new, re.M)) == names - {
        "refs", "flag"}
    with pytest.raises(SystemExit):
        ctracer(capsys, "struct", "--help")
    help_text = capsys.readouterr().out
    assert "--exclude-fields GLOB" in help_text and "--exclude " not in help_text
    with pytest.raises(SystemExit):
        ctracer(capsys, "trace", "--help")
    assert "--exclude-fields GLOB" in capsys.readouterr().out


def test_render_refuses_what_is_not_a_struct():
    g = TypeGraph({1: BaseType("int", 4, Encoding.SIGNED)}, 1)
    with pytest.raises(TypeError):
        layout.render(g)
    with pytest.raises(ValueError):
        layout.render(g, source_format="stabs")


# ------------------------------------------------------------------ hand-built graphs


HAND_C = """
struct hand_inner { long l; char c; };
struct hand {
    char tag;
    struct hand_inner inner;
    unsigned int flags : 3;
    unsigned int mode : 9;
    char *names[4];
    char tail[70];
    long last;
};
struct hand g_hand;
"""


def hand_graph() -> TypeGraph:
    char = BaseType("char", 1, Encoding.SIGNED_CHAR)
    types = {
        1: char,
        2: BaseType("long int", 8, Encoding.SIGNED),
        3: BaseType("unsigned int", 4, Encoding.UNSIGNED),
        4: CompositeType("struct", "hand_inner", 16,
                         (Member("l", 2, 0), Member("c", 1, 64))),
        5: PointerType(1, 8),
        6: ArrayType(5, (4,)),
        7: ArrayType(1, (70,)),
        10: CompositeType("struct", "hand", 144, (
            Member("tag", 1, 0), Member("inner", 4, 64), Member("flags", 3, 192, 3),
            Member("mode", 3, 195, 9), Member("names", 6, 256), Member("tail", 7, 512),
            Member("last", 2, 1088))),
    }
    return TypeGraph(types, 10)


def test_hand_built_graph_prints_as_pahole_prints_its_c_twin(tmp_path):
    need("pahole")
    src = tmp_path / "hand.c"
    src.write_text(HAND_C)
    so = tmp_path / "hand.so"
    compile_c(src, so, flags=["-shared", "-fPIC"])
    expected = subprocess.run(["pahole", "-C", "hand", str(so)], check=True,
                              capture_output=True, text=True).stdout
    # the twin's DWARF gives the same graph as the hand-built one (same sizes and offsets)
    model = dwarf.open_elf_types(str(so), use_cache=False)
    twin, hand = model.find_struct("hand"), hand_graph()
    assert twin[twin.root].size == hand[hand.root].size
    assert layout.render(hand_graph()) == expected
    assert layout.render(model.find_struct("hand")) == expected
