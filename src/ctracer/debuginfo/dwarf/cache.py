"""The type cache: catalogs stored in SQLite so that a second query starts in milliseconds.

One file per type source in ctracer's cache directory (`ctracer.debuginfo.cachedir`),
named by a key the reader chooses: the GNU build-id of an ELF file when it has one,
else a hash of its path, size and modification time (`source_key`).  A file holds:

* ``meta``: schema version, the reader's own version, what the source was (path, size,
  build-id), its description and notes;
* ``functions`` / ``structs`` / ``tracepoints``: one row each, the details (parameters,
  members) packed with `marshal` (fastest to load; the Python version is part of the
  cache's identity, so a file written by another Python is simply rebuilt);
* ``shapes``: every distinct `TypeShape` once, as one marshal blob (a kernel has ~6,500
  for 80,000 functions), that rows refer to by index: a row then unpacks to a few
  integers and names, and each shape object is built once, when first used;
* ``function_refs`` / ``member_refs`` / ``tracepoint_refs``: (kind, name) → row, indexed,
  so that `SqliteCatalog` answers each `ctracer.debuginfo.catalog.Catalog` lookup with one query and
  builds objects only for the answer;
* per struct, a ``location`` (a DWARF DIE offset, a BTF type id) so that the reader can
  fetch the full definition without rescanning.

A cache whose schema or reader version differs, whose source changed size, or which
SQLite cannot read is rebuilt, silently: a cache is never a reason to fail.  Files are
written under a temporary name and renamed into place, so readers never see half a file.
"""

from __future__ import annotations

import json
import marshal
import os
import sqlite3
import sys
from typing import Iterable, Optional

from ctracer.debuginfo.cachedir import cache_dir
from ctracer.debuginfo.gcpause import collector_paused
from ctracer.debuginfo.catalog import (Catalog, FunctionInfo, Inline, MemberInfo, Parameter, ShapeKind,
                           StructInfo, TracepointInfo, TypeShape)

SCHEMA_VERSION = 5  # 5: type texts by the one speller (debuginfo.cdecl)
#: what else must match for a cache file to be read: the packing of its blobs
PACKING = f"marshal-{marshal.version}-py{sys.version_info[0]}.{sys.version_info[1]}"

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE functions (id INTEGER PRIMARY KEY, name TEXT NOT NULL, data BLOB NOT NULL);
CREATE TABLE function_refs (kind TEXT, name TEXT, function INTEGER,
                            PRIMARY KEY (kind, name, function)) WITHOUT ROWID;
CREATE TABLE structs (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, name TEXT NOT NULL, size INTEGER,
    location INTEGER, members BLOB NOT NULL);
CREATE TABLE member_refs (kind TEXT, name TEXT, struct INTEGER,
                          PRIMARY KEY (kind, name, struct)) WITHOUT ROWID;
CREATE TABLE tracepoints (id INTEGER PRIMARY KEY, name TEXT NOT NULL, params BLOB NOT NULL);
CREATE TABLE tracepoint_refs (kind TEXT, name TEXT, tracepoint INTEGER,
                              PRIMARY KEY (kind, name, tracepoint)) WITHOUT ROWID;
CREATE TABLE shapes (data BLOB NOT NULL);
"""

INDEXES = """
CREATE UNIQUE INDEX structs_by_name ON structs (kind, name);
"""

#: a TypeShape as plain data: (kind, name, pointers, const, text)
ShapeTuple = tuple
#: enum members by value (a dict: calling the enum costs 0.3 µs a row)
_INLINE = {i.value: i for i in Inline}
_SHAPE_KINDS = {k.value: k for k in ShapeKind}


def source_key(path: str, build_id: Optional[str] = None) -> str:
    """The cache key of a file: its build-id, else a hash of where and what it is."""
    if build_id:
        return f"buildid-{build_id}"
    import hashlib

    st = os.stat(path)
    ident = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
    return "file-" + hashlib.sha256(ident.encode()).hexdigest()[:32]


def cache_path(key: str, kind: str) -> str:
    """The cache file of ``kind`` for ``key``, its name reduced to safe characters."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{kind}-{key}")
    return os.path.join(cache_dir(), safe + ".sqlite")


def source_identity(path: str, build_id: Optional[str] = None) -> dict:
    """What identifies a debug-info file for the cache: real path, size, build id."""
    st = os.stat(path)
    return {"path": os.path.realpath(path), "size": st.st_size, "build_id": build_id or ""}


# ------------------------------------------------------------------ reading


def open_cached(key: str, kind: str, producer: str, identity: dict) -> Optional["SqliteCatalog"]:
    """The cached catalog for ``key``, or None when absent, stale or unreadable (a
    stale or broken file is removed so that the next write replaces it)."""
    path = cache_path(key, kind)
    if not os.path.exists(path):
        return None
    try:
        catalog = SqliteCatalog(path)
        meta = catalog.meta
        fresh = (meta.get("schema") == str(SCHEMA_VERSION) and meta.get("producer") == producer
                 and meta.get("packing") == PACKING and meta.get("complete") == "1"
                 and meta.get("size") == str(identity.get("size"))
                 and meta.get("build_id", "") == identity.get("build_id", ""))
        if fresh:
            return catalog
        catalog.close()
    except sqlite3.Error:
        pass
    _remove(path)
    return None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class SqliteCatalog(Catalog):
    """A `Catalog` answered from a cache file, one indexed query per lookup; objects are
    built only for the answer, and shared between answers."""

    def __init__(self, path: str):
        self.path = path
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self.meta = dict(self.db.execute("SELECT key, value FROM meta"))
        self.notes = tuple(json.loads(self.meta.get("notes", "[]")))
        self._shape_rows: list = []  # shape tuples by index, read when first needed
        self._shapes: list = []      # their TypeShape objects, each built when first used
        self._params: dict = {}
        self._param_lists: dict = {}  # packed parameter list → its Parameter tuple
        self._functions: dict = {}
        self._structs: dict = {}

    def close(self) -> None:
        """Close the cache database."""
        self.db.close()

    def _shape(self, index: int) -> TypeShape:
        shapes = self._shapes or self._load_shapes()
        found = shapes[index]
        if found is None:
            kind, name, pointers, const, text = self._shape_rows[index]
            found = shapes[index] = TypeShape(_SHAPE_KINDS[kind], name, pointers, const, text)
        return found

    def _load_shapes(self) -> list:
        row = self.db.execute("SELECT data FROM shapes").fetchone()
        self._shape_rows = marshal.loads(row[0]) if row else []
        self._shapes = [None] * len(self._shape_rows)
        return self._shapes

    def _param(self, p: tuple) -> Parameter:
        """A parameter from its (name, shape index)."""
        found = self._params.get(p)
        if found is None:
            name, shape = p
            found = self._params[p] = Parameter(name, self._shape(shape))
        return found

    # -- functions

    def _decoded(self, rows) -> list[FunctionInfo]:
        """Functions of (id, data) rows, each decoded once for the catalog's life."""
        known, param, shape = self._functions, self._param, self._shape
        param_lists = self._param_lists
        out = []
        with collector_paused():
            for fid, data in rows:
                found = known.get(fid)
                if found is None:
                    (name, unit, address, external, inline, inlined_only, variadic, linkage,
                     decl_file, decl_line, returns, params) = marshal.loads(data)
                    plist = param_lists.get(params)  # (a kernel's: 40% distinct)
                    if plist is None:
                        plist = param_lists[params] = tuple([param(p) for p in params])
                    found = known[fid] = FunctionInfo(
                        name, plist, shape(returns), unit, address, external, _INLINE[inline],
                        inlined_only, variadic, linkage, decl_file, decl_line)
                out.append(found)
        return out

    def functions(self) -> Iterable[FunctionInfo]:
        rows = self.db.execute("SELECT id, data FROM functions ORDER BY id")
        while True:
            batch = rows.fetchmany(1024)
            if not batch:
                return
            yield from self._decoded(batch)

    def function_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM functions").fetchone()[0]

    def functions_referencing(self, kind: ShapeKind, name: str) -> list[FunctionInfo]:
        rows = self.db.execute(
            "SELECT f.id, f.data FROM function_refs r JOIN functions f ON f.id = r.function "
            "WHERE r.kind = ? AND r.name = ? ORDER BY f.id", (ShapeKind(kind).value, name))
        return self._decoded(rows)

    # -- structs

    def _struct(self, row) -> StructInfo:
        """The struct of an (id, kind, name, size, members) row, decoded once (discovery
        meets the same structs again and again: 455 lookups, 172 structs for sock)."""
        sid, kind, name, size, members = row
        found = self._structs.get(sid)
        if found is None:
            shape = self._shape
            found = self._structs[sid] = StructInfo(
                _SHAPE_KINDS[kind], name, size,
                tuple([MemberInfo(path, shape(s), bits)
                       for path, s, bits in marshal.loads(members)]))
        return found

    def struct(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[StructInfo]:
        row = self.db.execute("SELECT id, kind, name, size, members FROM structs "
                              "WHERE kind = ? AND name = ?",
                              (ShapeKind(kind).value, name)).fetchone()
        return self._struct(row) if row else None

    def location(self, name: str, kind: ShapeKind = ShapeKind.STRUCT) -> Optional[int]:
        """Where the reader finds the full definition (DIE offset, BTF type id)."""
        row = self.db.execute("SELECT location FROM structs WHERE kind = ? AND name = ?",
                              (ShapeKind(kind).value, name)).fetchone()
        return row[0] if row else None

    def structs_with_member_of(self, kind: ShapeKind, name: str) -> list[StructInfo]:
        rows = self.db.execute(
            "SELECT s.id, s.kind, s.name, s.size, s.members FROM member_refs r "
            "JOIN structs s ON s.id = r.struct WHERE r.kind = ? AND r.name = ? ORDER BY s.id",
            (ShapeKind(kind).value, name))
        return [self._struct(row) for row in rows]

    def struct_names(self, kind: ShapeKind = ShapeKind.STRUCT) -> list[str]:
        return [r[0] for r in self.db.execute(
            "SELECT name FROM structs WHERE kind = ? ORDER BY name", (ShapeKind(kind).value,))]

    # -- tracepoints

    def _tracepoint(self, row) -> TracepointInfo:
        name, params = row
        return TracepointInfo(name, tuple(self._param(p) for p in marshal.loads(params)))

    def tracepoints(self) -> Iterable[TracepointInfo]:
        return [self._tracepoint(r) for r in
                self.db.execute("SELECT name, params FROM tracepoints ORDER BY id")]

    def tracepoints_referencing(self, kind: ShapeKind, name: str) -> list[TracepointInfo]:
        rows = self.db.execute(
            "SELECT t.name, t.params FROM tracepoint_refs r JOIN tracepoints t "
            "ON t.id = r.tracepoint WHERE r.kind = ? AND r.name = ? ORDER BY t.id",
            (ShapeKind(kind).value, name))
        return [self._tracepoint(r) for r in rows]


# ------------------------------------------------------------------ writing


class CatalogWriter:
    """Builds a cache file from plain rows.

    Use as a context manager: the file appears under its final name only when the
    block ends without an error."""

    def __init__(self, key: str, kind: str, producer: str, identity: dict,
                 description: str = ""):
        import tempfile

        self.final = cache_path(key, kind)
        os.makedirs(os.path.dirname(self.final), exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".sqlite",
                                        dir=os.path.dirname(self.final))
        os.close(fd)
        self.db = sqlite3.connect(self.tmp)
        self.db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + SCHEMA)
        self.meta = {"schema": str(SCHEMA_VERSION), "producer": producer, "kind": kind,
                     "packing": PACKING,
                     "description": description, "complete": "0",
                     **{k: str(v) for k, v in identity.items()}}
        self.notes: list[str] = []
        self._functions: list = []
        self._function_refs: list = []
        self._structs: list = []
        self._member_refs: list = []
        self._tracepoints: list = []
        self._tracepoint_refs: list = []
        self._shape_index: dict = {}  # shape tuple → its index in the shapes blob

    def _sid(self, shape: ShapeTuple) -> int:
        shape = tuple(shape)
        found = self._shape_index.get(shape)
        if found is None:
            found = self._shape_index[shape] = len(self._shape_index)
        return found

    def __enter__(self) -> "CatalogWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            if os.path.exists(self.tmp):
                self.db.close()
                _remove(self.tmp)

    def add_function(self, name: str, unit: str, address: Optional[int], external: bool,
                     inline: str, inlined_only: bool, variadic: bool,
                     linkage_name: Optional[str], decl_file: Optional[str],
                     decl_line: Optional[int], params, returns: ShapeTuple) -> None:
        """``params``: (name, shape tuple) pairs."""
        fid = len(self._functions) + 1
        params = tuple(params)
        self._functions.append((fid, name, marshal.dumps((
            name, unit or "", address, bool(external), inline, bool(inlined_only),
            bool(variadic), linkage_name, decl_file, decl_line, self._sid(returns),
            tuple((p, self._sid(s)) for p, s in params)))))
        refs = {_shape_ref(s) for _p, s in params}
        refs.add(_shape_ref(returns))
        self._function_refs.extend((k, n, fid) for k, n in refs if n is not None)

    def add_struct(self, kind: str, name: str, size: int, members,
                   location: Optional[int] = None) -> None:
        """``members``: (dotted path, shape tuple, bit offset) triples."""
        sid = len(self._structs) + 1
        members = tuple(members)
        self._structs.append((sid, kind, name, size, location, marshal.dumps(
            tuple((p, self._sid(s), b) for p, s, b in members))))
        refs = {_shape_ref(s) for _p, s, _b in members}
        self._member_refs.extend((k, n, sid) for k, n in refs if n is not None)

    def add_tracepoint(self, name: str, params) -> None:
        tid = len(self._tracepoints) + 1
        params = tuple(params)
        self._tracepoints.append((tid, name, marshal.dumps(
            tuple((p, self._sid(s)) for p, s in params))))
        refs = {_shape_ref(s) for _p, s in params}
        self._tracepoint_refs.extend((k, n, tid) for k, n in refs if n is not None)

    def finish(self) -> str:
        db = self.db
        db.executemany("INSERT INTO functions VALUES (?,?,?)", self._functions)
        db.executemany("INSERT INTO function_refs VALUES (?,?,?)", sorted(self._function_refs))
        db.executemany("INSERT INTO structs VALUES (?,?,?,?,?,?)", self._structs)
        db.executemany("INSERT INTO member_refs VALUES (?,?,?)", sorted(self._member_refs))
        db.executemany("INSERT INTO tracepoints VALUES (?,?,?)", self._tracepoints)
        db.executemany("INSERT INTO tracepoint_refs VALUES (?,?,?)",
                       sorted(self._tracepoint_refs))
        db.execute("INSERT INTO shapes VALUES (?)", (marshal.dumps(list(self._shape_index)),))
        db.executescript(INDEXES)
        self.meta["notes"] = json.dumps(self.notes)
        self.meta["complete"] = "1"
        db.executemany("INSERT INTO meta VALUES (?, ?)", sorted(self.meta.items()))
        db.commit()
        db.close()
        os.replace(self.tmp, self.final)
        return self.final


def _shape_ref(shape: ShapeTuple) -> tuple:
    """(kind, name) of a shape tuple: what the ``*_refs`` tables index."""
    kind, name, _pointers, _const, _text = shape
    return kind, name


def shape_tuple(s: TypeShape) -> ShapeTuple:
    """A `TypeShape` as the tuple the cache stores (`shape_from_tuple` reads it back)."""
    return (s.kind.value, s.name, s.pointers, s.const, s.text)
