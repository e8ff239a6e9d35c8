"""Linked-list members: ``struct list_head`` empty or not (``<member>.empty``: its
``next`` points to itself, as list_empty() asks), ``struct hlist_head`` empty or not
(``first`` is NULL), ``struct hlist_node`` and ``hlist_nulls_node`` on a list or not (``<member>.unhashed``:
``pprev`` is NULL, as hlist_unhashed() asks).  The pointers themselves are not recorded."""

from __future__ import annotations

from typing import Union

from ctracer.plan.mini import Derived

NAME = "lists"
TYPES = ("struct list_head", "struct hlist_head", "struct hlist_node", "struct hlist_nulls_node")


def values(member) -> Union[tuple[Derived, ...], str]:
    """Whether the list is empty (a list head pointing at itself, a NULL first) or an
    hlist node unhashed (a NULL pprev), as a bool."""
    if "next" in member.fields and "prev" in member.fields:
        word, op, suffix = member.fields["next"], "is_own_address", ".empty"
    elif "pprev" in member.fields:
        word, op, suffix = member.fields["pprev"], "zero", ".unhashed"
    elif "first" in member.fields:
        word, op, suffix = member.fields["first"], "zero", ".empty"
    else:
        return "no list pointers in its layout"
    return (Derived(suffix, "u8", "bool", word.source["byte_offset"], word.source["size"],
                    op),)
