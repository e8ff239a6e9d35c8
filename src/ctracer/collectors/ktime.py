"""ktime_t: a time in nanoseconds (a signed 64-bit count), under the member's own name."""

from __future__ import annotations

from typing import Union

from ctracer.plan.mini import Derived

NAME = "ktime"
TYPES = ("ktime_t",)


def values(member) -> Union[tuple[Derived, ...], str]:
    """The ktime_t as a signed 64-bit count of nanoseconds."""
    if member.size != 8:
        return f"a ktime_t of {member.size} bytes"
    return (Derived("", "s64", "int", 0, 8, signed=True),)
