"""The SQLite type cache: same answers as the in-memory catalog, found by build-id,
rebuilt when stale or broken, and read without pyelftools."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ctracer.debuginfo.cachedir import cache_dir
from ctracer.debuginfo.dwarf import cache
from ctracer.debuginfo import elf
from ctracer.debuginfo.dwarf import reader as dwarf
from ctracer.debuginfo.catalog import (FunctionInfo, Inline, MemberInfo, MemoryCatalog, Parameter,
                           ShapeKind, StructInfo, TracepointInfo, TypeShape)
from support.cbuild import Build, compile_c
from test_dwarf import SOURCES


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def program(build_c) -> Path:
    return build_c(SOURCES, Build(opt=2), name="prog")


def cache_files() -> list[str]:
    d = cache_dir()
    return sorted(f for f in os.listdir(d) if f.endswith(".sqlite")) if os.path.isdir(d) else []


def every_shape(catalog) -> set:
    keys = set()
    for f in catalog.functions():
        keys |= {(p.shape.kind, p.shape.name) for p in f.params}
        keys.add((f.returns.kind, f.returns.name))
    for kind in (ShapeKind.STRUCT, ShapeKind.UNION):
        for name in catalog.struct_names(kind):
            keys |= {(m.shape.kind, m.shape.name) for m in catalog.struct(name, kind).members}
    return {k for k in keys if k[1] is not None}


def assert_same_catalog(cached, memory) -> None:
    assert list(cached.functions()) == list(memory.functions())
    assert cached.function_count() == memory.function_count()
    assert cached.notes == memory.notes
    for kind in (ShapeKind.STRUCT, ShapeKind.UNION):
        assert cached.struct_names(kind) == memory.struct_names(kind)
        for name in memory.struct_names(kind):
            assert cached.struct(name, kind) == memory.struct(name, kind)
    for kind, name in every_shape(memory):
        assert cached.functions_referencing(kind, name) == memory.functions_referencing(kind, name)
        assert cached.structs_with_member_of(kind, name) == \
            memory.structs_with_member_of(kind, name)
        assert cached.tracepoints_referencing(kind, name) == \
            memory.tracepoints_referencing(kind, name)
    assert list(cached.tracepoints()) == list(memory.tracepoints())


def test_cached_catalog_answers_like_the_memory_one(program):
    memory = dwarf.open_elf_types(str(program), use_cache=False).catalog()
    first = dwarf.open_elf_types(str(program)).catalog()
    assert isinstance(first, cache.SqliteCatalog)
    bid = elf.build_id(str(program))
    assert bid and cache_files() == [f"dwarf-buildid-{bid}.sqlite"]
    assert_same_catalog(first, memory)
    again = dwarf.open_elf_types(str(program)).catalog()
    assert_same_catalog(again, memory)


def test_find_struct_from_the_cache(program):
    memory = dwarf.open_elf_types(str(program), use_cache=False)
    dwarf.open_elf_types(str(program)).catalog()  # fills the cache
    warm = dwarf.open_elf_types(str(program))
    for name in memory.struct_names():
        assert warm.find_struct(name) == memory.find_struct(name)


def test_warm_query_imports_neither_pyelftools_nor_the_scanner(program):
    dwarf.open_elf_types(str(program)).catalog()
    # what the interpreter had before ctracer was imported does not count (a site's
    # .pth files may import tempfile at start-up)
    code = ("import sys; before = set(sys.modules);"
            "from ctracer.debuginfo.dwarf import reader as dwarf, cache;"
            f"c = dwarf.open_elf_types({str(program)!r}).catalog();"
            "assert isinstance(c, cache.SqliteCatalog);"
            "assert c.functions_referencing('struct', 'bits');"
            "print(*(m in sys.modules and m not in before for m in ('elftools',"
            " 'ctracer.debuginfo.dwarf.scan', 'ctracer.debuginfo.dwarf.units',"
            " 'ctracer.debuginfo.dwarf.sections', 'ctracer.debuginfo.dwarf.dies', 'hashlib',"
            " 'tempfile')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    # neither pyelftools nor the scanner nor the unit tables; nor what only writing a
    # cache or keying a file without build-id needs (start-up is most of a warm query)
    assert out.stdout.strip() == " ".join(["False"] * 7)


def test_each_shape_is_stored_once(program):
    """Rows refer to one table of distinct type shapes (a kernel: ~6,500 shapes for
    80,000 functions), so that each row unpacks to a few numbers and names."""
    memory = dwarf.open_elf_types(str(program), use_cache=False).catalog()
    cached = dwarf.open_elf_types(str(program)).catalog()
    distinct = {p.shape for f in memory.functions() for p in f.params}
    distinct |= {f.returns for f in memory.functions()}
    distinct |= {m.shape for k in (ShapeKind.STRUCT, ShapeKind.UNION)
                 for n in memory.struct_names(k) for m in memory.struct(n, k).members}
    distinct |= {p.shape for t in memory.tracepoints() for p in t.params}
    import marshal
    blob, = cached.db.execute("SELECT data FROM shapes").fetchone()
    stored = marshal.loads(blob)
    assert len(stored) == len(set(stored)) == len(distinct)
    assert {cache.shape_tuple(s) for s in distinct} == set(stored)
    shapes = {id(p.shape) for f in cached.functions() for p in f.params}
    assert len(shapes) <= len(distinct)  # one object per shape, shared


@pytest.mark.parametrize("key,value", [("schema", "0"), ("producer", "dwarf-0"),
                                       ("packing", "marshal-0"), ("complete", "0")])
def test_stale_cache_is_rebuilt(program, key, value):
    dwarf.open_elf_types(str(program)).catalog()
    path = os.path.join(cache_dir(), cache_files()[0])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))
    catalog = dwarf.open_elf_types(str(program)).catalog()
    assert catalog.meta[key] != value
    assert catalog.function_count() > 0


def test_same_build_id_but_changed_file_is_stale(program, tmp_path):
    copy = tmp_path / "copy"
    shutil.copy(program, copy)
    dwarf.open_elf_types(str(copy)).catalog()
    with open(copy, "ab") as f:  # same build-id, different file
        f.write(b"\0" * 16)
    catalog = dwarf.open_elf_types(str(copy)).catalog()
    assert catalog.meta["size"] == str(os.path.getsize(copy))


@pytest.mark.parametrize("garbage", [b"", b"not a database at all" * 100,
                                     b"SQLite format 3\0" + b"\xff" * 4000])
def test_corrupt_cache_is_rebuilt(program, garbage):
    dwarf.open_elf_types(str(program)).catalog()
    path = os.path.join(cache_dir(), cache_files()[0])
    Path(path).write_bytes(garbage)
    catalog = dwarf.open_elf_types(str(program)).catalog()
    assert catalog.functions_referencing(ShapeKind.STRUCT, "bits")
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM functions").fetchone()[0] > 0


def test_file_without_build_id_is_keyed_by_path_size_and_time(tmp_path):
    prog = tmp_path / "nobuildid"

    def build(extra: str) -> None:
        src = tmp_path / "one.c"
        src.write_text(f"struct thing {{ int a; {extra} }};\n"
                       "int use(struct thing *t) { return t->a; }\n"
                       "int main(void) { return 0; }\n")
        compile_c(src, prog, flags=["-Wl,--build-id=none"])

    build("")
    assert elf.build_id(str(prog)) is None
    assert dwarf.open_elf_types(str(prog)).catalog().struct("thing").size == 4
    build("long more[4];")
    catalog = dwarf.open_elf_types(str(prog)).catalog()
    assert catalog.struct("thing").size == 40  # the new file, not the old cache
    assert all(f.startswith("dwarf-file-") for f in cache_files())


def test_unwritable_cache_directory_keeps_the_catalog_in_memory(program, tmp_path,
                                                                monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    catalog = dwarf.open_elf_types(str(program)).catalog()
    assert isinstance(catalog, MemoryCatalog)
    assert catalog.functions_referencing(ShapeKind.STRUCT, "bits")


def test_any_catalog_round_trips(tmp_path):
    """What another reader (BTF) stores comes back equal, kernel addresses included."""
    sock = TypeShape(ShapeKind.STRUCT, "sock", 1, False, "struct sock *")
    csock = TypeShape(ShapeKind.STRUCT, "sock", 1, True, "const struct sock *")
    intshape = TypeShape(ShapeKind.BASE, "int", 0, False, "int")
    functions = [
        FunctionInfo("tcp_close", (Parameter("sk", sock), Parameter("timeout", intshape)),
                     TypeShape(ShapeKind.VOID, None, 0, False, "void"),
                     address=0xFFFFFFFF81A00000, unit="net/ipv4/tcp.c"),
        FunctionInfo("sk_peek", (Parameter("sk", csock),), intshape, external=False,
                     unit="a.c", inline=Inline.DECLARED_INLINED, inlined_only=True),
    ]
    structs = [StructInfo(ShapeKind.STRUCT, "socket", 48,
                          (MemberInfo("sk", sock, 192), MemberInfo(".state", intshape, 0)))]
    tracepoints = [TracepointInfo("sock_rcvqueue_full", (Parameter(None, sock),))]
    memory = MemoryCatalog(functions, structs, tracepoints, ["a note"])
    ident = {"path": str(tmp_path), "size": 1, "build_id": ""}
    stored = store_catalog(memory, "test-key", "btf", "btf-1", ident,
                                 locations={("struct", "socket"): 1234})
    assert_same_catalog(stored, memory)
    assert stored.location("socket") == 1234 and stored.location("nothing") is None
    reopened = cache.open_cached("test-key", "btf", "btf-1", ident)
    assert reopened is not None and list(reopened.functions()) == functions
    assert cache.open_cached("test-key", "btf", "btf-2", ident) is None  # other producer


def test_decoding_pauses_the_garbage_collector(program, monkeypatch):
    """Thousands of rows decoded for one query all survive: the collector is paused
    while they are built, and running again afterwards."""
    import gc

    dwarf.open_elf_types(str(program)).catalog()  # fills the cache
    cached = dwarf.open_elf_types(str(program)).catalog()
    seen = []

    def watched(*args):
        seen.append(gc.isenabled())
        return FunctionInfo(*args)

    monkeypatch.setattr(cache, "FunctionInfo", watched)
    assert cached.functions_referencing(ShapeKind.STRUCT, "bits")
    assert seen and not any(seen)
    assert gc.isenabled()


def test_structs_are_decoded_once(program):
    """Discovery asks for the same structs again and again (sock: 455 lookups, 172
    structs): each is built once and shared."""
    dwarf.open_elf_types(str(program)).catalog()  # fills the cache
    cached = dwarf.open_elf_types(str(program)).catalog()
    first = cached.struct("with_anon")
    assert cached.struct("with_anon") is first
    holders = cached.structs_with_member_of(ShapeKind.STRUCT, "nested_stats")
    assert first in holders and any(s is first for s in holders)


def store_catalog(catalog, key: str, kind: str, producer: str, identity: dict,
                  description: str = "", locations: "dict | None" = None) -> "cache.SqliteCatalog":
    """Write a whole catalog to the cache through `cache.CatalogWriter` and return the
    cached version (what a reader does row by row).  ``locations`` maps (kind, name) of a struct to where its reader finds it."""
    locations = locations or {}
    with cache.CatalogWriter(key, kind, producer, identity, description) as w:
        w.notes = list(catalog.notes)
        for f in catalog.functions():
            w.add_function(f.name, f.unit, f.address, f.external, f.inline.value,
                           f.inlined_only, f.variadic, f.linkage_name, f.decl_file,
                           f.decl_line, [(p.name, cache.shape_tuple(p.shape)) for p in f.params],
                           cache.shape_tuple(f.returns))
        for k in (ShapeKind.STRUCT, ShapeKind.UNION):
            for name in catalog.struct_names(k):
                s = catalog.struct(name, k)
                w.add_struct(k.value, name, s.size,
                             [(m.name, cache.shape_tuple(m.shape), m.bit_offset) for m in s.members],
                             locations.get((k.value, name)))
        for t in catalog.tracepoints():
            w.add_tracepoint(t.name, [(p.name, cache.shape_tuple(p.shape)) for p in t.params])
    return cache.SqliteCatalog(cache.cache_path(key, kind))
