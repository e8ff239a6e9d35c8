"""A snapshot's collectors: one per field of the mini layout, and the span of the object
a probe copies once before they run.

A probe first copies the byte span of the traced object that the fields cover into a
per-CPU scratch buffer (one read, with the helper `ctracer.collectors.base.ObjectReader`
names), then each collector moves its fields from that copy into the event.
"""

from __future__ import annotations

from typing import Sequence

from ctracer.collectors.base import Collector
from ctracer.collectors.plain import BitfieldCollector, CopyCollector
from ctracer.collectors.derived import ValueCollector
from ctracer.event import Layout


def collectors_for(layout: Layout) -> list[Collector]:
    """One collector per field of the layout (in offset order of the object): a value
    computed by a kind's op, a bitfield, or a plain copy."""
    out: list[Collector] = []
    for f in sorted(layout.fields, key=lambda f: (f.source.get("byte_offset", 0), f.offset)):
        if f.source.get("op"):
            out.append(ValueCollector([f]))
        elif f.source.get("bit_size"):
            out.append(BitfieldCollector([f]))
        else:
            out.append(CopyCollector([f]))
    return out


def read_span(collectors: Sequence[Collector], align: int = 8) -> tuple[int, int]:
    """The [start, end) byte range of the object to copy, start rounded down to
    ``align`` so that aligned members stay aligned in the scratch buffer."""
    if not collectors:
        return 0, 0
    start = min(c.span()[0] for c in collectors)
    end = max(c.span()[1] for c in collectors)
    return start - start % align, end
