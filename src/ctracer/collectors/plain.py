"""Collectors for plain fields: whole scalar members, char arrays and bitfields."""

from __future__ import annotations

from ctracer.collectors.base import LOAD_TYPES, Collector, source_span


class CopyCollector(Collector):
    """A whole member (integer, enum, bool, float, pointer or char array): a byte copy."""

    def c_statements(self, dst: str, buf: str, base: int, addr: str = "addr") -> list[str]:
        out = []
        for f in self.fields:
            offset, size = source_span(f)
            if size != f.size:
                raise ValueError(f"field {f.name}: {size} source bytes for a {f.ctype}")
            out.append(f"__builtin_memcpy(&{dst}.{f.c_name}, {buf} + {offset - base}, {size});")
        return out


class BitfieldCollector(Collector):
    """A bitfield: load its storage window, shift, mask, sign-extend when signed."""

    def c_statements(self, dst: str, buf: str, base: int, addr: str = "addr") -> list[str]:
        out = []
        for f in self.fields:
            offset, size = source_span(f)
            bits, shift = int(f.source["bit_size"]), int(f.source.get("shift", 0))
            load = LOAD_TYPES.get(size)
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
