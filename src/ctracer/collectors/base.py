"""Collectors for plain fields: whole scalar members, char arrays and bitfields.

A probe first copies the byte span of the traced object that its fields cover into a
per-CPU scratch buffer (one read, with the helper `ObjectReader` names: user or kernel
memory), then each collector emits the C statements that move its fields from the
scratch copy into the event's mini snapshot.  What a field's bytes are comes from
``Field.source`` as `ctracer.plan.mini` documents it (byte_offset, size, bit_size, shift,
signed).

`collectors_for` gives each field of a mini layout to the first factory in `FACTORIES`
that claims it; collectors for lock or refcount members (which may want to read more
than one scalar, or follow a pointer) can be added in front of the plain ones.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ctracer.event import Field, Layout

#: C types for the raw load of a bitfield's storage window, by byte size
_LOAD_TYPES = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}


@dataclass(frozen=True)
class ObjectReader:
    """Which BPF helper reads the traced program's memory."""

    space: str  # "user" or "kernel"

    def __post_init__(self) -> None:
        if self.space not in ("user", "kernel"):
            raise ValueError(f"unknown address space {self.space!r}")

    @property
    def helper(self) -> str:
        return f"bpf_probe_read_{self.space}"


USER = ObjectReader("user")
KERNEL = ObjectReader("kernel")


class Collector(abc.ABC):
    """Copies some mini fields out of the scratch copy of an object."""

    def __init__(self, fields: Sequence[Field]):
        self.fields = tuple(fields)

    def span(self) -> tuple[int, int]:
        """Bytes [start, end) of the traced object this collector reads."""
        return (min(f.source["byte_offset"] for f in self.fields),
                max(f.source["byte_offset"] + f.source["size"] for f in self.fields))

    @abc.abstractmethod
    def c_statements(self, dst: str, buf: str, base: int) -> list[str]:
        """C statements filling ``dst.<field>`` from ``buf``, which holds the object's
        bytes starting at object offset ``base``."""


def _src(f: Field) -> tuple[int, int]:
    s = f.source
    try:
        offset, size = int(s["byte_offset"]), int(s["size"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"field {f.name} does not say where it comes from") from None
    if offset < 0 or size <= 0:
        raise ValueError(f"field {f.name} has a bad source {s}")
    return offset, size


class CopyCollector(Collector):
    """A whole member (integer, enum, bool, float, pointer or char array): a byte copy."""

    def c_statements(self, dst: str, buf: str, base: int) -> list[str]:
        out = []
        for f in self.fields:
            offset, size = _src(f)
            if size != f.size:
                raise ValueError(f"field {f.name}: {size} source bytes for a {f.ctype}")
            out.append(f"__builtin_memcpy(&{dst}.{f.c_name}, {buf} + {offset - base}, {size});")
        return out


class BitfieldCollector(Collector):
    """A bitfield: load its storage window, shift, mask, sign-extend when signed."""

    def c_statements(self, dst: str, buf: str, base: int) -> list[str]:
        out = []
        for f in self.fields:
            offset, size = _src(f)
            bits, shift = int(f.source["bit_size"]), int(f.source.get("shift", 0))
            load = _LOAD_TYPES.get(size)
            if load is None or not 0 < bits <= 64 or shift + bits > size * 8:
                raise ValueError(f"bitfield {f.name} has a bad source {f.source}")
            mask = (1 << bits) - 1
            value = f"(({load})(raw >> {shift}) & {mask:#x}ULL)" if shift else \
                f"(raw & {mask:#x}ULL)"
            if f.source.get("signed"):
                value = f"(s64)((u64){value} << {64 - bits}) >> {64 - bits}"
            out.append(f"{{ {load} raw; __builtin_memcpy(&raw, {buf} + {offset - base}, "
                       f"{size}); {dst}.{f.c_name} = ({f.ctype})({value}); }}")
        return out


def _copy(f: Field) -> Optional[Collector]:
    return None if f.source.get("bit_size") else CopyCollector([f])


def _bitfield(f: Field) -> Optional[Collector]:
    return BitfieldCollector([f]) if f.source.get("bit_size") else None


#: tried in order for each field; the first that returns a collector owns the field
FACTORIES: list[Callable[[Field], Optional[Collector]]] = [_bitfield, _copy]


def collectors_for(layout: Layout) -> list[Collector]:
    """One collector per field of the layout (in offset order of the object)."""
    out = []
    for f in sorted(layout.fields, key=lambda f: (f.source.get("byte_offset", 0), f.offset)):
        for factory in FACTORIES:
            c = factory(f)
            if c is not None:
                out.append(c)
                break
        else:
            raise ValueError(f"no collector for field {f.name}")
    return out


def read_span(collectors: Sequence[Collector], align: int = 8) -> tuple[int, int]:
    """The [start, end) byte range of the object to copy, start rounded down to
    ``align`` so that aligned members stay aligned in the scratch buffer."""
    if not collectors:
        return 0, 0
    start = min(c.span()[0] for c in collectors)
    end = max(c.span()[1] for c in collectors)
    return start - start % align, end
