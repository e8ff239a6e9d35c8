"""socket_lock_t: owned by a process (``<member>.owned``, the kernel's counter) and its
spinlock held (``<member>.slock.held``).  The wait queue is not recorded."""

from __future__ import annotations

from typing import Union

from ctracer.collectors.spinlock import held
from ctracer.plan.mini import Derived

NAME = "socket_lock"
TYPES = ("socket_lock_t",)


def values(member) -> Union[tuple[Derived, ...], str]:
    """The socket lock's ``owned`` and whether its spinlock ``slock`` is held."""
    owned = member.find("owned")
    slock = held(member, "slock.", ".slock.held")
    if owned is None or slock is None:
        return "no 'owned' member or no spinlock 'slock' in its layout"
    return (Derived(".owned", owned.ctype, "int", owned.source["byte_offset"],
                    owned.source["size"], signed=bool(owned.source.get("signed"))),
            slock)
