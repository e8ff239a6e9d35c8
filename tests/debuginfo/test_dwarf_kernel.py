"""The DWARF reader on a real kernel: Debian's 6.1 vmlinux and nfs.ko debug files.

Needs the 282 MB debug package (``apt-get download linux-image-6.1.0-50-cloud-amd64-dbg``
and ``dpkg-deb -x`` it); point CTRACER_KERNEL_DEBUG_ROOT at the extracted tree (default:
/work/corpus/x).  Skipped when absent; run with ``pytest -m corpus``.

Checks, with pfunct and pahole as oracles:

* the methods of sock and sk_buff (vmlinux) and nfs_fh (nfs.ko) — functions with a
  parameter pointing to the struct — include everything `pfunct --class` lists, and each
  extra name is explained: pfunct wants the parameter spelled exactly ``struct X *``
  (no const, no typedef), skips functions that exist only inlined, and matches the
  struct only in units that define it (a unit that merely declares ``struct X;`` is
  not searched);
* sampled struct layouts equal pahole's, member by member;
* the file's own .BTF section names no method that the DWARF lacks.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from ctracer.debuginfo import elf
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.debuginfo.dwarf import sections
from ctracer.debuginfo.dwarf import scan as ds
from ctracer.debuginfo.dwarf import units as du
from ctracer.debuginfo.catalog import ShapeKind
from support.cbuild import need
from test_dwarf import pahole_order, parse_pahole_struct

ROOT = Path(os.environ.get("CTRACER_KERNEL_DEBUG_ROOT", "/work/corpus/x"))
VMLINUX = ROOT / "usr/lib/debug/boot/vmlinux-6.1.0-50-cloud-amd64"
NFS_KO = ROOT / "usr/lib/debug/lib/modules/6.1.0-50-cloud-amd64/kernel/fs/nfs/nfs.ko"

pytestmark = pytest.mark.corpus


def corpus(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent: apt-get download linux-image-6.1.0-50-cloud-amd64-dbg"
                    " and extract it under CTRACER_KERNEL_DEBUG_ROOT")
    return path


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("kernel-cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home)
    yield home
    if old is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="module")
def models(cache_home):
    opened = {}

    def model(path: Path):
        if path not in opened:
            opened[path] = dwarf.open_elf_types(str(corpus(path)))
        return opened[path]
    return model


def units_defining(path: Path, unit_names: set, kind: str, name: str) -> dict:
    """For each named unit: does it define the struct (not only declare it)?"""
    headers = elf.read_elf_headers(str(path))
    secs = sections.dwarf_sections(headers)
    answer = {}
    for unit in ds.list_units(secs):
        scanner = ds.UnitScanner(ds.UnitReader(secs, unit, ds.read_abbrevs(secs, unit),
                                               {}), set())
        scanner.read_unit_die()
        if scanner.tables.name in unit_names:
            tables = scanner.scan()
            answer[tables.name] = any(c[1] == name and du.COMPOSITE_TAGS[c[0]] == kind
                                      for c in tables.composites.values())
    return answer


@pytest.mark.parametrize("path,name", [(VMLINUX, "sock"), (VMLINUX, "sk_buff"),
                                       (NFS_KO, "nfs_fh")])
def test_methods_cover_pfunct_and_extras_are_explained(models, path, name):
    need("pfunct")
    catalog = models(path).catalog()
    theirs = set(subprocess.run(["pfunct", f"--class={name}", str(path)], check=True,
                                capture_output=True, text=True).stdout.split())
    takes = {}
    for f in catalog.functions_referencing(ShapeKind.STRUCT, name):
        params = [p for p in f.params if p.shape.kind == ShapeKind.STRUCT
                  and p.shape.name == name and p.shape.pointers == 1]
        if params:
            takes.setdefault(f.name, []).append((f, params))
    assert theirs <= set(takes), sorted(theirs - set(takes))

    exact = f"struct {name} *"
    unexplained, undecided = [], {}
    for fname in sorted(set(takes) - theirs):
        copies = takes[fname]
        if all(f.inlined_only for f, _p in copies):
            continue  # pfunct skips functions that exist only inlined
        if all(all(p.shape.text != exact for p in params) for _f, params in copies):
            continue  # const-qualified or typedef'd parameter: not exactly `struct X *`
        undecided[fname] = {f.unit for f, _p in copies}
    if undecided:
        defines = units_defining(path, set().union(*undecided.values()), "struct", name)
        for fname, units in undecided.items():
            if any(defines.get(u, True) for u in units):
                unexplained.append((fname, sorted(units)))
    assert not unexplained, unexplained


def pahole_blocks(path: Path) -> dict:
    """Every named struct/union `pahole FILE` prints, by (kind, name).  (One run for all:
    pahole 1.24 gives up on a long ``-C a,b,c`` list at the first name it misplaces.)"""
    text = subprocess.run(["pahole", str(path)], check=True, capture_output=True,
                          text=True).stdout
    blocks, current, lines = {}, None, []
    for line in text.splitlines():
        if current is None:
            m = re.match(r"(struct|union) (\w+) \{$", line)
            if m:
                current, lines = (m.group(1), m.group(2)), [line]
            continue
        lines.append(line)
        if line.startswith("}"):
            blocks.setdefault(current, "\n".join(lines))
            current = None
    return blocks


def test_sampled_layouts_match_pahole(models):
    need("pahole")
    model = models(VMLINUX)
    blocks = pahole_blocks(VMLINUX)
    names = [(k, n) for k in ("struct", "union") for n in model.struct_names(ShapeKind(k))]
    sample = names[::max(1, len(names) // 600)]
    assert len(sample) >= 500
    missing, different = [], []
    for kind, name in sample:
        if (kind, name) not in blocks:
            missing.append(name)
            continue
        expected = parse_pahole_struct(blocks[(kind, name)])
        graph = model.find_struct(name, ShapeKind(kind))
        ours = list(pahole_order(graph, graph.root))
        size_differs = expected["size"] is not None and graph[graph.root].size != expected["size"]
        if size_differs or ours != expected["members"]:  # (no size line for unions)
            different.append(name)
    assert not different, different[:20]
    assert len(missing) <= len(sample) // 50, missing[:20]


def test_btf_section_names_no_method_the_dwarf_lacks(models):
    from ctracer.debuginfo.btf import reader as btf

    headers = elf.read_elf_headers(str(corpus(VMLINUX)))
    section = headers.section(".BTF")
    with open(VMLINUX, "rb") as f:
        f.seek(section.offset)
        data = f.read(section.size)
    from_btf = btf.model_from_bytes(data, "BTF section").catalog()
    from_dwarf = models(VMLINUX).catalog()
    for name in ("sock", "sk_buff"):
        b = {f.name for f in from_btf.functions_referencing(ShapeKind.STRUCT, name)}
        d = {f.name for f in from_dwarf.functions_referencing(ShapeKind.STRUCT, name)}
        assert len(b) > 1000, (name, len(b))  # the kernel's BTF names them by the thousand
        assert b <= d, sorted(b - d)[:20]
