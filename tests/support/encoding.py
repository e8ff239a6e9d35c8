"""Event bytes as a probe would write them, for tests and synthetic traces: the inverse
of `ctracer.event.Layout.decode`."""

from __future__ import annotations

import ipaddress
from typing import Any

from ctracer.event import Layout


def encode(layout: Layout, values: dict[str, Any]) -> bytes:
    """``values`` by field name (missing ones 0) packed as ``layout`` places them."""
    ordered = []
    for f in layout.ordered_fields:
        v = values.get(f.name, 0)
        if f.ctype.startswith("char[") and f.kind == "ipv6" and isinstance(v, str):
            v = ipaddress.IPv6Address(v).packed
        elif f.ctype.startswith("char["):
            v = v.encode() if isinstance(v, str) else bytes(v or b"")
        ordered.append(v)
    return layout._struct().pack(*ordered)
