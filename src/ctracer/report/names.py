"""Safe file and directory names for report pages.

Names in a trace (struct, function and field names) come from debug info or from a file
someone handed us; they become part of a path only when they match a conservative
pattern, otherwise a stable hash stands in for them.  Nothing here touches the disk.
"""

from __future__ import annotations

from typing import Iterable, Mapping

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


def field_stems(names: Iterable[str]) -> dict[str, str]:
    """Each field's stem in a report (its PNG plot, its ``#f-STEM`` anchor on a changes
    page), the fields given in layout order."""
    fields = StemAllocator("field")
    return {name: fields.stem(name, name) for name in names}


def function_stems(functions: Mapping[int, str], canonical: Mapping[int, int],
                   others: Iterable[int] = ()) -> dict[int, str]:
    """Each function's stem in a report (its duration plot, its ``#fn-STEM`` row on the
    methods page), by the id standing for it: ``functions`` is the functions table's
    name by id, ``canonical`` which id stands for each row (`build.function_table`),
    ``others`` ids of functions the table lacks."""
    allocator = StemAllocator("function")
    stems = {fid: allocator.stem(fid, name) for fid, name in sorted(functions.items())
             if canonical.get(fid, fid) == fid}
    for fid in sorted(set(others) - set(stems)):
        stems[fid] = allocator.stem(fid, f"function-{fid}")
    return stems
