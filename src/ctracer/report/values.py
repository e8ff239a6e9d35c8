"""How recorded field values are shown: enum names, hex pointers, chars, text.

The mini layout stored in the trace (`ctracer.event.Field.kind`) says what each value is;
`ValueFormatter` turns raw decoded values into short display strings and, for plots,
into numbers plus the tick labels that make the axis readable.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ctracer.event import Field, Layout

#: numeric fields taking at most this many values are plotted as labelled levels
FEW_VALUES = 5

#: the y axis of a plot: numeric positions and, for categorical kinds, their labels
AxisTicks = Optional[list[tuple[float, str]]]


def format_duration(ns: Optional[int]) -> str:
    """``850 ns``, ``12.4 µs``, ``3.21 ms``, ``1.500 s``."""
    if ns is None:
        return ""
    if ns < 1_000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.3f} s"


def format_offset(ns: int) -> str:
    """A time offset from the start in ms with ns resolution (the column says ms)."""
    return f"{ns / 1e6:.6f}"


def _char(v: int) -> str:
    c = v & 0xFF
    if 0x20 <= c < 0x7F:
        return repr(chr(c))
    return f"'\\x{c:02x}'"


class ValueFormatter:
    """Display and plot helpers for the fields of one mini layout."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.fields: dict[str, Field] = {f.name: f for f in layout.fields}
        self._enum_names = {f.name: dict(f.enumerators) for f in layout.fields
                            if f.kind == "enum"}

    def show(self, field: str, value: Any) -> str:
        if value is None:
            return "?"
        f = self.fields.get(field)
        kind = f.kind if f else "int"
        if kind == "enum":
            name = self._enum_names[field].get(value)
            return name if name is not None else str(value)
        if kind == "pointer":
            return "NULL" if value == 0 else f"0x{value:x}"
        if kind == "bool":
            return "true" if value else "false"
        if kind == "char":
            return _char(value)
        if kind == "text":
            return repr(value) if isinstance(value, str) else str(value)
        if kind == "float":
            return f"{value:g}"
        if kind == "uint" and value >= 1 << 32:
            return f"0x{value:x}"  # address pairs, masks, cookies: hex reads better
        return str(value)

    def plot_axis(self, field: str, values: Sequence[Any]) -> tuple[list[float], AxisTicks]:
        """Numbers to plot for ``values`` and the y ticks to label them with (None: let
        the plotting library choose numeric ticks)."""
        f = self.fields.get(field)
        kind = f.kind if f else "int"
        if kind == "bool":
            return [1.0 if v else 0.0 for v in values], [(0.0, "false"), (1.0, "true")]
        if kind == "enum":
            names = self._enum_names[field]
            # only the values taken, in enum order: compact and cheap to draw
            shown = sorted({v for v in values if v is not None})
            pos = {v: float(i) for i, v in enumerate(shown)}
            return ([pos[v] for v in values],
                    [(pos[v], names.get(v, str(v))) for v in shown])
        if kind in ("pointer", "text"):
            order: dict[Any, float] = {}
            for v in sorted({v for v in values}, key=lambda v: (isinstance(v, str), v)):
                order[v] = float(len(order))
            return ([order[v] for v in values],
                    [(p, _shorten(self.show(field, v))) for v, p in order.items()])
        distinct = sorted(set(values))
        if len(distinct) <= FEW_VALUES or (kind == "char" and len(distinct) <= 16):
            # a field that takes a handful of values reads best as labelled levels
            pos = {v: float(i) for i, v in enumerate(distinct)}
            return [pos[v] for v in values], [(pos[v], _shorten(self.show(field, v)))
                                              for v in distinct]
        return [float(v) for v in values], None


def _shorten(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
