"""Where ctracer keeps what it can rebuild: ``$XDG_CACHE_HOME/ctracer``, else
``~/.cache/ctracer``.  The DWARF catalog cache, the BTF index cache and the kernel's symbol
lists all live there."""

from __future__ import annotations

import os


def cache_dir() -> str:
    """ctracer's cache directory (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ctracer")
