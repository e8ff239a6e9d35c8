"""atomic_t, atomic64_t, atomic_long_t: the counter, under the member's own name."""

from __future__ import annotations

from typing import Union

from ctracer.plan.mini import Derived

NAME = "atomic"
TYPES = ("atomic_t", "atomic64_t", "atomic_long_t")


def counter(member, path: str) -> Union[tuple[Derived, ...], str]:
    """The integer at ``path`` inside the member (an atomic's counter), or why there is none."""
    word = member.find(path)
    if word is None:
        return f"no '{path}' in its layout"
    return (Derived("", word.ctype, "int", word.source["byte_offset"], word.source["size"],
                    signed=bool(word.source.get("signed"))),)


def values(member) -> Union[tuple[Derived, ...], str]:
    """The atomic's counter, under the member's own name."""
    return counter(member, "counter")
