"""The collector of values computed from a member by the op its kind chose (see
`ctracer.plan.mini`): ``nonzero`` (a lock held, a mutex owned), ``zero`` (an hlist node
not hashed) and ``is_own_address`` (a list head pointing to itself: empty)."""

from __future__ import annotations

from ctracer.collectors.base import LOAD_TYPES, Collector, source_span


class ValueCollector(Collector):
    """Loads the word a value is computed from and stores the 0/1 answer."""

    def c_statements(self, dst: str, buf: str, base: int, addr: str = "addr") -> list[str]:
        out = []
        for f in self.fields:
            offset, size = source_span(f)
            load = LOAD_TYPES.get(size)
            if load is None:
                raise ValueError(f"field {f.name}: cannot load {size} bytes as one word")
            op = f.source["op"]
            if op == "nonzero":
                mask = int(f.source.get("mask") or 0)
                test = f"(raw & {mask:#x}ULL) != 0" if mask else "raw != 0"
            elif op == "zero":
                test = "raw == 0"
            elif op == "is_own_address":
                test = f"raw == ({addr}) + {int(f.source['address_offset'])}"
            else:
                raise ValueError(f"field {f.name}: unknown op {op!r}")
            out.append(f"{{ {load} raw; __builtin_memcpy(&raw, {buf} + {offset - base}, "
                       f"{size}); {dst}.{f.c_name} = ({f.ctype})({test}); }}")
        return out
