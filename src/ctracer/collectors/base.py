"""What every collector shares: the reader of the traced memory and the `Collector` class.

A probe first copies the byte span of the traced object that its fields cover into a
per-CPU scratch buffer (one read, with the helper `ObjectReader` names: user or kernel
memory), then each collector emits the C statements that move its fields from the
scratch copy into the event's mini snapshot.  What a field's bytes are comes from
``Field.source`` as `ctracer.plan.mini` documents it.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence

from ctracer.event import Field

#: C types for a raw little-endian load, by byte size
LOAD_TYPES = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}


@dataclass(frozen=True)
class ObjectReader:
    """Which BPF helper reads the traced program's memory."""

    space: str  # "user" or "kernel"

    def __post_init__(self) -> None:
        if self.space not in ("user", "kernel"):
            raise ValueError(f"unknown address space {self.space!r}")

    @property
    def helper(self) -> str:
        """The BPF helper reading the object's memory (``bpf_probe_read_kernel``/``_user``)."""
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
    def c_statements(self, dst: str, buf: str, base: int, addr: str = "addr") -> list[str]:
        """C statements filling ``dst.<field>`` from ``buf``, which holds the object's
        bytes starting at object offset ``base``; ``addr`` is the C expression of the
        object's address."""


def source_span(f: Field) -> tuple[int, int]:
    """(byte offset, size) of the bytes a field is read from, checked."""
    s = f.source
    try:
        offset, size = int(s["byte_offset"]), int(s["size"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"field {f.name} does not say where it comes from") from None
    if offset < 0 or size <= 0:
        raise ValueError(f"field {f.name} has a bad source {s}")
    return offset, size
