"""struct sk_buff_head: the queue length (``<member>.qlen``); its list pointers and
spinlock are not recorded."""

from __future__ import annotations

from typing import Union

from ctracer.plan.mini import Derived

NAME = "sk_buff_head"
TYPES = ("struct sk_buff_head",)


def values(member) -> Union[tuple[Derived, ...], str]:
    """The queue's length (``qlen``)."""
    qlen = member.find("qlen")
    if qlen is None:
        return "no 'qlen' in its layout"
    return (Derived(".qlen", qlen.ctype, "uint", qlen.source["byte_offset"],
                    qlen.source["size"]),)
