"""How recorded field values are shown: as a kernel engineer reads them.

The mini layout stored in the trace says what each value is: `ctracer.event.Field.kind`
(enum names, hex pointers, chars, text) and, in ``Field.source``, the member's C type
as written (``ctype``: ``__be32`` addresses and ``__be16`` ports are network order) and
optionally ``bits`` (``[[bit, "SOCK_DEAD"], ...]``: a flag word whose bits an enum
names) or ``display`` (one of `ctracer.decode.DISPLAYS`, to say it outright).  So a
trace renders the same on a machine that never saw the traced program or kernel.
Addresses show as dotted quads, ports in host order, errno values by name (``-EAGAIN``, ``ECONNRESET``), flag words
as ``SOCK_DEAD|SOCK_DONE``, device indexes by the recording host's device names
(``lo (1)``); each with its raw value after it (what each display means,
both ways, is `ctracer.decode`'s: ``--where`` reads values the same way).  `ValueFormatter` also
turns values into numbers plus tick labels for plots.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

# what a value means is `ctracer.decode`'s, shared with the filters
from ctracer.decode import (FAMILIES, PROTOCOLS, addrpair, display_of, errno_name,
                            flag_names, ipv4, port, portpair)
from ctracer.event import Layout

#: how a value the probe did not read is shown (a field outside the head of a time-wait
#: or request socket, `ctracer.plan.heads`)
NOT_READ = "not read"
#: numeric fields taking at most this many values are plotted as labelled levels
FEW_VALUES = 5

#: the y axis of a plot: numeric positions and, for categorical kinds, their labels
AxisTicks = Optional[list[tuple[float, str]]]


class TextMemo(dict):
    """Texts already made, by key: a trace's values, durations and arguments recur, so
    each is formatted once.  Past `CAP` keys it forgets them all (a million distinct
    values must not all stay).  Readers look up with ``get`` and `remember` a miss."""

    __slots__ = ()
    CAP = 200_000

    def remember(self, key: Any, text: str) -> str:
        """Keep ``text`` under ``key`` (everything forgotten once past `CAP`) and return it."""
        if len(self) > self.CAP:
            self.clear()
        self[key] = text
        return text


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

    def __init__(self, layout: Layout, arguments: Optional[dict] = None,
                 symbols: Optional[dict] = None, devices: Optional[dict] = None):
        """``arguments``: the trace's meta ``tracepoint_args`` (row → argument dicts),
        whose ``names`` name enum arguments (``reason``: ``SKB_DROP_REASON_...``);
        ``symbols``: its meta ``kernel_symbols`` (hex address → ``symbol+off``);
        ``devices``: its meta ``net_devices`` (ifindex → device name)."""
        self.layout = layout
        self._devices = {int(k): str(v) for k, v in (devices or {}).items()
                         if str(k).lstrip("-").isdigit()}
        self._symbols = {str(k): str(v) for k, v in (symbols or {}).items()}
        self._arg_names: dict[tuple[int, str], dict[int, str]] = {}
        for row, args in (arguments or {}).items():
            for a in args if str(row).isdigit() and isinstance(args, list) else ():
                names = a.get("names") if isinstance(a, dict) else None
                if isinstance(names, list):
                    self._arg_names[(int(row), str(a.get("name")))] = {
                        int(v): str(n) for v, n in names
                        if isinstance(v, int) and isinstance(n, str)}
        self.fields: dict[str, Field] = {f.name: f for f in layout.fields}
        self._enum_names = {f.name: dict(f.enumerators) for f in layout.fields
                            if f.kind == "enum"}
        self._display = {f.name: display_of(f) for f in layout.fields}
        self._bits = {f.name: [(int(b), str(n)) for b, n in f.source.get("bits", ())]
                      for f in layout.fields if f.source.get("bits")}
        #: tracepoint arguments named like a state take the names of the struct's state enum
        self._states = next((dict(f.enumerators) for f in layout.fields
                             if f.kind == "enum" and f.name.endswith("state")), {})

    def show(self, field: str, value: Any) -> str:
        if value is None:
            return NOT_READ
        f = self.fields.get(field)
        kind = f.kind if f else "int"
        display = self._display.get(field)
        if display and isinstance(value, int):
            return self._shown_as(display, field, value)
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
        if kind == "ipv6":
            return str(value)
        if kind == "float":
            return f"{value:g}"
        if kind == "uint" and value >= 1 << 32:
            return f"0x{value:x}"  # address pairs, masks, cookies: hex reads better
        return str(value)

    def _shown_as(self, display: str, field: str, value: int) -> str:
        if display == "ipv4":
            return f"{ipv4(value)} (0x{value & 0xFFFFFFFF:x})"
        if display == "port":
            return f"{port(value)} (0x{value & 0xFFFF:x})"
        if display == "errno":
            name = errno_name(value)
            return f"{name} ({value})" if name else str(value)
        if display == "addrpair":
            return f"{addrpair(value)} (0x{value:x})"
        if display == "portpair":
            return f"{portpair(value)} (0x{value:x})"
        if display == "ifindex":
            name = self._devices.get(value) if value > 0 else None
            return f"{name} ({value})" if name else str(value)
        return f"{flag_names(value, self._bits.get(field, ()))} (0x{value:x})"

    def device(self, ifindex: int) -> str:
        """The network device of ``ifindex`` on the recording host: ``lo``, or
        ``ifindex 7`` when the trace does not name it."""
        return self._devices.get(ifindex) or f"ifindex {ifindex}"

    def show_arg(self, name: str, value: Any, kind: Optional[str] = None,
                 row: Optional[int] = None) -> str:
        """A tracepoint argument (``oldstate``, ``newstate``, ``family``...) as read;
        ``kind`` is the argument's as the trace's meta ``tracepoint_args`` says
        (pointers in hex), ``row`` its functions-table row (for enum names)."""
        if not isinstance(value, int):
            return str(value)
        if kind == "pointer":
            if value == 0:
                return "NULL"
            text = f"0x{value & 0xFFFFFFFFFFFFFFFF:x}"
            symbol = self._symbols.get(text)
            return f"{symbol} ({text})" if symbol else text
        named = self._arg_names.get((row, name)) if row is not None else None
        if named and value in named:
            return f"{named[value]} ({value})"
        if name.endswith("state") and value in self._states:
            return self._states[value]
        if name == "family" and value in FAMILIES:
            return FAMILIES[value]
        if name == "protocol" and value in PROTOCOLS:
            return PROTOCOLS[value]
        if name in ("saddr", "daddr") and 0 <= value < 1 << 32:
            return ipv4(value)
        return str(value)

    def show_pointer(self, value: int) -> str:
        """A returned pointer: ``NULL``, ``ERR_PTR(-ENOMEM)`` for the kernel's error
        pointers (the last 4,095 addresses), else the address."""
        raw = value & (1 << 64) - 1
        if raw == 0:
            return "NULL"
        if raw >= (1 << 64) - 4095:
            code = raw - (1 << 64)
            return f"ERR_PTR({errno_name(code) or code})"
        return f"0x{raw:x}"

    def show_retval(self, value: int) -> str:
        """A function's int return value: a negative errno by name, with its number."""
        name = errno_name(value) if -4096 < value < 0 else None
        return f"{name} ({value})" if name else str(value)

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
        if kind in ("pointer", "text", "ipv6"):
            order: dict[Any, float] = {}
            for v in sorted({v for v in values}, key=lambda v: (isinstance(v, str), v)):
                order[v] = float(len(order))
            return ([order[v] for v in values],
                    [(p, _shorten(self.show(field, v))) for v, p in order.items()])
        display = self._display.get(field)
        if display in ("ipv4", "port") and all(isinstance(v, int) for v in values):
            return self._network_order_axis(field, display, values)
        distinct = sorted(set(values))
        if len(distinct) <= FEW_VALUES or (kind == "char" and len(distinct) <= 16):
            # a field that takes a handful of values reads best as labelled levels
            pos = {v: float(i) for i, v in enumerate(distinct)}
            return [pos[v] for v in values], [(pos[v], self._tick(field, display, v))
                                              for v in distinct]
        return [float(v) for v in values], None


    def _tick(self, field: str, display: Optional[str], value: Any) -> str:
        """A level's label: the value as shown, short; a flag word whose bits' names
        do not fit by its hex value (the names are in the tables and tooltips)."""
        text = self.show(field, value)
        if display == "flags" and len(text) > 24 and isinstance(value, int):
            return f"0x{value:x}"
        return _shorten(text)

    def _network_order_axis(self, field: str, display: str,
                            values: Sequence[int]) -> tuple[list[float], AxisTicks]:
        """Ports and IPv4 addresses (network order, read little-endian) placed by their
        host-order value, so the axis climbs as the numbers shown do; addresses are
        labelled levels, ports a numeric axis once they are many."""
        def host(v: int) -> int:
            if display == "port":
                return port(v)
            return int.from_bytes((v & 0xFFFFFFFF).to_bytes(4, "little"), "big")

        distinct = sorted(set(values), key=host)
        if display == "ipv4" or len(distinct) <= FEW_VALUES:
            pos = {v: float(i) for i, v in enumerate(distinct)}
            return [pos[v] for v in values], [(pos[v], _shorten(self.show(field, v)))
                                              for v in distinct]
        return [float(host(v)) for v in values], None


def _shorten(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
