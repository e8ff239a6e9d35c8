"""The BTF reader's indexes kept on disk, so that a second query of the same BTF skips the
pass over every record and the index building (about 0.2 s of CPU on kernel BTF).

What is kept is not a catalog but the reader's own integer tables (where each record
starts, its kind, and the sorted inverses `ctracer.debuginfo.btf.reader` answers lookups from), stored as
raw 32-bit arrays in one marshal file: writing it costs milliseconds, loading it a few
more.  A catalog cache (`ctracer.debuginfo.dwarf.cache`) would have to write every function and struct
of the kernel as rows first (seconds and ~30 MB for vmlinux), which is why BTF does not
use one.  The file lives in ctracer's cache directory, named by a SHA-256 of the BTF
bytes (the base's too for split BTF), so a different kernel or module never matches;
a file of another version, or one that cannot be read, is ignored and rewritten.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import tempfile
from array import array
from typing import Optional

from ctracer.debuginfo.cachedir import cache_dir

#: bump when the layout of the saved tables or their meaning changes
INDEX_VERSION = 1


def digest(data: bytes, base_digest: Optional[str] = None) -> str:
    """The cache key of a BTF blob (with the digest of the base BTF a split one builds on)."""
    h = hashlib.sha256()
    if base_digest:
        h.update(base_digest.encode())
    h.update(data)
    return h.hexdigest()


def index_path(key: str) -> str:
    """The cache file of the BTF index under ``key``."""
    return os.path.join(cache_dir(), f"btf-index-{key[:40]}.marshal")


def pack(values) -> bytes:
    """A sequence of unsigned 32-bit integers as bytes."""
    return array("I", values).tobytes()


def unpack(blob: bytes) -> array:
    """Bytes of `pack` as an array (a copy of the bytes, no integer objects made)."""
    a = array("I")
    a.frombytes(blob)
    return a


def load(key: str) -> Optional[dict]:
    """The saved tables for ``key``, None when absent, of another version or unreadable."""
    try:
        with open(index_path(key), "rb") as f:
            tables = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(tables, dict) or tables.get("version") != INDEX_VERSION \
            or tables.get("key") != key:
        return None
    return tables


def save(key: str, tables: dict) -> None:
    """Write the tables under a temporary name and rename it into place; a cache that
    cannot be written is no error (the next run rebuilds the tables)."""
    tables = dict(tables, version=INDEX_VERSION, key=key)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-btf-", dir=cache_dir())
        try:
            with os.fdopen(fd, "wb") as f:
                marshal.dump(tables, f)
            os.replace(tmp, index_path(key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
