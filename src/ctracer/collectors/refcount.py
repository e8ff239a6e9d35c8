"""refcount_t: the reference count, under the member's own name."""

from __future__ import annotations

from typing import Union

from ctracer.collectors.atomic import counter
from ctracer.plan.mini import Derived

NAME = "refcount"
TYPES = ("refcount_t", "struct refcount_struct")


def values(member) -> Union[tuple[Derived, ...], str]:
    """The refcount_t's count."""
    return counter(member, "refs.counter")
