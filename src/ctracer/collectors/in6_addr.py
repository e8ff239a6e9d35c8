"""struct in6_addr: an IPv6 address, its 16 bytes under the member's own name, shown as
IPv6 text (``::1``, ``::ffff:127.0.0.1``); the three array views of its union
(``in6_u.u6_addr8/16/32``) are not recorded one by one."""

from __future__ import annotations

from typing import Union

from ctracer.plan.mini import Derived

NAME = "in6_addr"
TYPES = ("struct in6_addr",)


def values(member) -> Union[tuple[Derived, ...], str]:
    """The member's 16 bytes, shown as an IPv6 address."""
    if member.size != 16:
        return f"a struct in6_addr of {member.size} bytes"
    return (Derived("", "char[16]", "ipv6", 0, 16),)
