"""Safe file and directory names for report pages.

Names in a trace (struct, function and field names) come from debug info or from a file
someone handed us; they become part of a path only when they match a conservative
pattern, otherwise a stable hash stands in for them.  Nothing here touches the disk.
"""

from __future__ import annotations

# an object's one name, also its pages' folder, is `ctracer.decode`'s (``--tail`` names
# objects too); re-exported here
from ctracer.decode import object_name  # noqa: F401
from ctracer.files import safe_name

#: names Windows and some tools treat specially; we never produce them
_RESERVED = {"index", "changes", "methods", "many_objects", "static", "_static"}


def safe_component(name: str, prefix: str = "x") -> str:
    """``name`` itself when it is a harmless single path component, else a hashed stand-in
    (`ctracer.files.safe_name`, never one of the report's own page names)."""
    return safe_name(name, prefix, _RESERVED)




class StemAllocator:
    """Hands out distinct file stems for names that may repeat (static functions of the
    same name in several compile units) or may not be safe."""

    def __init__(self, prefix: str = "x"):
        self.prefix = prefix
        self._used: dict[str, object] = {}

    def stem(self, key: object, name: str) -> str:
        base = safe_component(name, self.prefix)
        stem, n = base, 2
        while stem in self._used and self._used[stem] != key:
            stem = f"{base}-{n}"
            n += 1
        self._used[stem] = key
        return stem
