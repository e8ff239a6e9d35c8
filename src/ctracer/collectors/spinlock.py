"""spinlock_t and raw_spinlock_t: held or not (``<member>.held``).

The kernel's qspinlock keeps a ``locked`` byte (``rlock.raw_lock.locked``); a lock word
named ``locked`` at the places a spinlock keeps it is what this kind reads, nonzero
meaning held.  The pending bit, the queue tail and the lock-debugging fields are not
recorded.
"""

from __future__ import annotations

from typing import Optional, Union

from ctracer.plan.mini import Derived

NAME = "spinlock"
TYPES = ("spinlock_t", "raw_spinlock_t", "struct spinlock", "struct raw_spinlock")

_LOCKED = ("rlock.raw_lock.locked", "raw_lock.locked", "locked")


def held(member, prefix: str = "", suffix: str = ".held") -> Optional[Derived]:
    """The ``held`` value of a spinlock found at ``prefix`` inside ``member``."""
    word = member.find(*(prefix + p for p in _LOCKED))
    if word is None:
        return None
    return Derived(suffix, "u8", "bool", word.source["byte_offset"], word.source["size"],
                   "nonzero")


def values(member) -> Union[tuple[Derived, ...], str]:
    """Whether the spinlock is held."""
    found = held(member)
    return (found,) if found else "no 'locked' word in its layout"
