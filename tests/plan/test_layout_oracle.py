"""`ctracer struct` against pahole 1.24, text for text.

* DWARF: the fixtures under tests/fixtures/layout/ are built with gcc and clang, DWARF 4
  and 5, -O0 and -O2, and for every struct and union they define, the output of
  ``ctracer struct NAME --binary FILE`` must equal ``pahole -C NAME FILE``.
* BTF: the same builds get a .BTF section from ``pahole -J``; ``ctracer struct NAME --btf
  FILE`` must equal ``pahole -F btf -C NAME FILE``.
* The running kernel: ``ctracer struct sock`` (and others) must equal
  ``pahole -C sock /sys/kernel/btf/vmlinux``, and `layout.render` must equal pahole's
  full dump for every struct and union of the kernel's BTF.

One pahole quirk is normalised away, not reproduced: clang writes the definitions of
anonymous (and nested) struct/union/enum types inside the DIE of the struct that uses
them, and pahole 1.24 prints those definitions a second time, as stand-alone blocks
(``struct { ... };`` with offsets relative to themselves and their own summary) between
the members.  They repeat what the member already shows and are not part of the layout;
the type model, which does not say where a type was declared, cannot reproduce them.
`drop_nested_definitions` removes exactly those blocks from pahole's text.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c, need
from corpus.pahole_blocks import pahole_blocks

from ctracer.debuginfo.btf import reader as btf
from ctracer import cli
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.plan import pahole as layout
from ctracer.debuginfo.catalog import ShapeKind

FIXTURES = Path(__file__).parents[1] / "fixtures" / "layout"
SOURCES = sorted(FIXTURES.glob("*.c"))
KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")

VARIANTS = {f"{cc}-dwarf{v}-O{o}": Build(cc, v, o)
            for cc in ("gcc", "clang") for v in (4, 5) for o in (0, 2)}

#: structs whose text differs because of a known limitation elsewhere, with the reason
KNOWN_DWARF_GAPS: dict[str, str] = {}


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


_OPEN = re.compile(r"^(\t+)(?:struct|union|enum)(?: \w+)? \{$")
_CLOSE = re.compile(r"^(\t+)\}(?: __attribute__\(\(__\w+__(?:\(\d+\))?\)\))*;$")


def drop_nested_definitions(text: str) -> str:
    """pahole's text without the stand-alone definitions of types declared inside a
    struct (see the module docstring): an indented ``struct|union|enum [name] {`` whose
    matching close is a bare ``};`` (no offset comment, as a member's would have),
    followed by the blank line pahole prints after it."""
    lines = text.split("\n")
    removed = True
    while removed:
        removed = False
        for end, line in enumerate(lines):
            close = _CLOSE.match(line)
            if not close or end + 1 >= len(lines) or lines[end + 1] != "":
                continue
            for start in range(end - 1, -1, -1):
                opening = _OPEN.match(lines[start])
                if opening and opening.group(1) == close.group(1):
                    del lines[start:end + 2]
                    removed = True
                    break
            if removed:
                break
    return "\n".join(lines)


def test_drop_nested_definitions_keeps_members():
    member = ("struct a {\n\tunion {\n\t\tint x;\t/*  0  4 */\n\t};\t/*  0  4 */\n"
              "\n\t/* size: 4 */\n};\n")
    nested = ("struct a {\n\tunion {\n\t\tint x;\t/*  0  4 */\n\t};\t/*  0  4 */\n"
              "\tunion {\n\t\tint x;\t/*  0  4 */\n\t};\n\n\n\t/* size: 4 */\n};\n")
    assert drop_nested_definitions(member) == member
    assert drop_nested_definitions(nested) == member


def ctracer_struct(capsys, *argv: str) -> str:
    status = cli.main(["struct", *argv])
    out, err = capsys.readouterr()
    assert status == 0, err
    return out


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("layout-fixtures")


def _build(build_dir: Path, variant: str, source: Path) -> Path:
    out = build_dir / f"{source.stem}-{variant}.so"
    if not out.exists():
        compile_c(source, out, VARIANTS[variant], flags=["-shared", "-fPIC"])
    return out


def _names(model) -> list[tuple[str, str]]:
    return [(kind.value, name) for kind in (ShapeKind.STRUCT, ShapeKind.UNION)
            for name in model.struct_names(kind)]


def _compare_all(capsys, path: Path, model, source_args: list[str], pahole_args: list[str],
                 gaps: dict) -> tuple[int, list]:
    """(identical count, [(name, pahole, ctracer)] for the rest) over every struct/union."""
    identical, differ = 0, []
    names = _names(model)
    assert names, f"no structs found in {path}"
    for kind, name in names:
        expected = drop_nested_definitions(run("pahole", *pahole_args, "-C", name, str(path)))
        words = [name] if kind == "struct" else ["union", name]
        got = ctracer_struct(capsys, *words, *source_args, str(path), "--no-cache")
        if got == expected:
            identical += 1
            assert name not in gaps, f"{name} now matches: drop it from the known gaps"
        elif name not in gaps:
            differ.append((name, expected, got))
    return identical, differ


def _report(differ: list) -> str:
    import difflib
    parts = []
    for name, expected, got in differ[:3]:
        parts.append(f"--- {name}\n" + "".join(difflib.unified_diff(
            expected.splitlines(True), got.splitlines(True), "pahole", "ctracer")))
    return f"{len(differ)} structs differ from pahole:\n" + "\n".join(parts)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_dwarf_layouts_equal_pahole(capsys, build_dir, variant, source):
    need("pahole")
    path = _build(build_dir, variant, source)
    model = dwarf.open_elf_types(str(path), use_cache=False)
    identical, differ = _compare_all(capsys, path, model, ["--binary"], [],
                                     KNOWN_DWARF_GAPS)
    print(f"{path.name}: {identical} structs identical to pahole -C")
    assert not differ, _report(differ)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_btf_layouts_equal_pahole(capsys, build_dir, variant, source):
    need("pahole")
    built = _build(build_dir, variant, source)
    path = build_dir / f"{built.stem}.btf.so"
    shutil.copyfile(built, path)
    subprocess.run(["pahole", "-J", str(path)], check=True, capture_output=True)
    model = btf.open_btf(str(path), use_cache=False)
    identical, differ = _compare_all(capsys, path, model, ["--btf"], ["-F", "btf"], {})
    print(f"{path.name}: {identical} structs identical to pahole -F btf -C")
    assert not differ, _report(differ)


# ------------------------------------------------------------------ the bundled sample

SAMPLE_DIR = Path(__file__).parents[2] / "samples" / "sock"


@pytest.mark.parametrize("program", ["sockdemo", "sockdemo-O2"])
def test_sample_structs_equal_pahole(capsys, program):
    need("pahole")
    need("make")
    subprocess.run(["make", "-s", "-C", str(SAMPLE_DIR)], check=True)
    path = SAMPLE_DIR / "build" / program
    model = dwarf.open_elf_types(str(path), use_cache=False)
    identical, differ = _compare_all(capsys, path, model, ["--binary"], [], {})
    assert identical >= 4  # sock_common, sock, inet_sock, socket at least
    assert not differ, _report(differ)


# ------------------------------------------------------------------ the running kernel


def need_kernel_btf() -> None:
    need("pahole")
    if not KERNEL_BTF.exists():
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")


@pytest.mark.kernel
@pytest.mark.parametrize("words", [["sock"], ["sk_buff"], ["task_struct"], ["inode"],
                                   ["net_device"], ["mm_struct"], ["union", "bpf_attr"]])
def test_kernel_struct_equals_pahole(capsys, words):
    need_kernel_btf()
    expected = run("pahole", "-C", words[-1], str(KERNEL_BTF))
    assert ctracer_struct(capsys, *words) == expected


def split_pahole_dump(text: str) -> dict[tuple[str, str], str]:
    """pahole's dump of every type, cut into ``(kind, name) -> text`` (first of a name)."""
    blocks: dict[tuple[str, str], str] = {}
    for kind, name, block in pahole_blocks(text):
        blocks.setdefault((kind, name), block)
    return blocks


@pytest.mark.kernel
def test_every_kernel_struct_equals_pahole():
    need_kernel_btf()
    dump = subprocess.run(["pahole", str(KERNEL_BTF)], check=True, capture_output=True,
                          text=True).stdout
    blocks = split_pahole_dump(dump)
    assert len(blocks) > 1000
    model = btf.open_btf(str(KERNEL_BTF), use_cache=False)
    differ = []
    for (kind, name), expected in blocks.items():
        got = layout.render(model.find_struct(name, ShapeKind(kind)), source_format="btf")
        if got != expected:
            differ.append((name, expected, got))
    print(f"{len(blocks) - len(differ)} of {len(blocks)} kernel structs/unions identical")
    assert not differ, _report(differ)
