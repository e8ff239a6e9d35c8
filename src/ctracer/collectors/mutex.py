"""struct mutex: locked or not (``<member>.locked``): its ``owner`` word holds the owning
task with three flag bits below it; locked is an owner set, whatever the flags."""

from __future__ import annotations

from typing import Union

from ctracer.plan.mini import Derived

NAME = "mutex"
TYPES = ("struct mutex",)

#: the owner word's low bits are flags (waiters, handoff, pickup), not an owner
_FLAG_BITS = 0x7


def values(member) -> Union[tuple[Derived, ...], str]:
    """Whether the mutex is held: its owner word, flag bits masked off, is not zero."""
    owner = member.find("owner.counter", "owner")
    if owner is None:
        return "no 'owner' word in its layout"
    size = owner.source["size"]
    mask = ((1 << (size * 8)) - 1) & ~_FLAG_BITS
    return (Derived(".locked", "u8", "bool", owner.source["byte_offset"], size, "nonzero",
                    mask=mask),)
