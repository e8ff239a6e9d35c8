"""What names an object in the index, by the kind of struct: summary columns.

An address and a lifetime number do not tell sockets apart; a kernel engineer names a
socket by its family, local and remote address:port, states and role, and an sk_buff by
its length, protocol and the device it came in on (``skb_iif``, named by the recording
host's devices: the trace's meta ``net_devices``).  `columns_for` gives, for a struct,
the columns and how each is computed from what was seen of an object (`Seen`: its field
series — its first value and every change, so the first, last and every value it took —
and its commands); values are shown as the pages show them
(`ctracer.report.values.ValueFormatter`).  A project file adds columns of its own for
any struct (``[objects] summary_fields``, kept in the trace's meta ``summary_fields``):
each the values its field took, in order.  A column whose fields the trace did not
record is left out.  The index searches these texts too (``index.html#q=:8080``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ctracer.analysis import Analysis
from ctracer.decode import FAMILIES, ipv4, port
from ctracer.report.values import ValueFormatter

#: EtherType values an sk_buff's ``protocol`` (``__be16``) commonly holds
ETHER_TYPES = {0x0800: "ETH_P_IP", 0x86DD: "ETH_P_IPV6", 0x0806: "ETH_P_ARP",
               0x8100: "ETH_P_8021Q", 0x0003: "ETH_P_ALL"}


@dataclass
class Seen:
    """What the summary columns read of one object."""

    series: dict[str, tuple[list[int], list[Any]]]  # `Analysis.series`
    comms: list[tuple[str, int]]   # commands of its events and how often, first seen first
    calls: int

    @classmethod
    def of(cls, analysis: Analysis, i: int, calls: int) -> "Seen":
        """Object ``i`` as the columns read it (a field's series made when one reads it)."""
        import numpy as np

        ev = analysis.events
        comm = ev.comm[analysis.objects.events(i)]
        uniques, first, counts = np.unique(comm, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        return cls(_Series(analysis, i),
                   [(ev.comms[c], n) for c, n in zip(uniques[order].tolist(),
                                                      counts[order].tolist())],
                   calls)


class _Series(dict):
    """An object's field series, each made when first read (`Analysis.series`)."""

    def __init__(self, analysis: Analysis, i: int):
        super().__init__()
        self.analysis, self.i = analysis, i

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self:
            found = self.analysis.series(self.i, [name])
            self[name] = found.get(name, default)
        return self[name]


@dataclass(frozen=True)
class Column:
    """A column of the index's object list: its name, the fields it needs and how its
    text is made from an object."""

    name: str
    fields: tuple[str, ...]   # what it needs recorded (any one of them for `any_field`)
    text: Callable[[Seen, ValueFormatter], str]
    any_field: bool = False


def _values(obj: Seen, name: str) -> list[Any]:
    return [v for v in obj.series.get(name, ((), ()))[1] if v is not None]


def _last_set(obj: Seen, name: str) -> Optional[Any]:
    """The last non-zero value the field took (ports and addresses go back to 0 when a
    socket closes)."""
    values = [v for v in _values(obj, name) if v]
    return values[-1] if values else None


def _states(obj: Seen, fmt: ValueFormatter) -> list[str]:
    return [fmt.show("__sk_common.skc_state", v) for v in _values(obj, "__sk_common.skc_state")]


def _family(obj: Seen, fmt: ValueFormatter) -> str:
    v = _last_set(obj, "__sk_common.skc_family")
    return "" if v is None else FAMILIES.get(v, str(v))


def _endpoint(obj: Seen, v4: str, v6: str, port_text: str) -> str:
    """``address:port`` ("" when neither was ever set: a listener's remote end)."""
    six = _last_set(obj, v6)
    raw = _last_set(obj, v4)
    if _family_value(obj) == 10 and six and six != "::":
        address = f"[{six}]"
    else:
        address = ipv4(raw) if raw is not None else ""
    if not address and not port_text:
        return ""
    return f"{address or '?'}:{port_text or '?'}"


def _family_value(obj: Seen) -> Optional[int]:
    return _last_set(obj, "__sk_common.skc_family")


def _local(obj: Seen, fmt: ValueFormatter) -> str:
    num = _last_set(obj, "__sk_common.skc_num")
    return _endpoint(obj, "__sk_common.skc_rcv_saddr", "__sk_common.skc_v6_rcv_saddr",
                     str(num) if num is not None else "")


def _remote(obj: Seen, fmt: ValueFormatter) -> str:
    dport = _last_set(obj, "__sk_common.skc_dport")
    return _endpoint(obj, "__sk_common.skc_daddr", "__sk_common.skc_v6_daddr",
                     str(port(dport)) if dport is not None else "")


#: states a path lists before it elides the middle
PATH_STATES = 6


def _path(states: list[str]) -> str:
    """The states taken, in order (first to last, the middle elided past
    `PATH_STATES`): ``TCP_CLOSE → TCP_LISTEN → TCP_CLOSE``."""
    if len(states) > PATH_STATES:
        states = states[:PATH_STATES - 2] + ["…"] + states[-1:]
    return " → ".join(states)


def _role(obj: Seen, fmt: ValueFormatter) -> str:
    """listener, client (it connected), accepted (a listener's child), time-wait or
    request socket, from the states the object went through."""
    seen = set(_states(obj, fmt))
    if "TCP_SYN_SENT" in seen:
        return "client"
    if "TCP_SYN_RECV" in seen:
        return "accepted"
    if "TCP_LISTEN" in seen:
        return "listener"
    if "TCP_TIME_WAIT" in seen:
        return "time-wait"
    if "TCP_NEW_SYN_RECV" in seen:
        return "request"
    return ""


def _comm(obj: Seen, fmt: ValueFormatter) -> str:
    """The command that touched the object most, softirq's idle task aside."""
    counts = Counter({c: n for c, n in obj.comms if c and not c.startswith("swapper")})
    return counts.most_common(1)[0][0] if counts else (obj.comms[0][0] if obj.comms else "")


def _first(name: str, show: Callable[[Any], str]) -> Callable[[Seen, ValueFormatter], str]:
    def text(obj: Seen, fmt: ValueFormatter) -> str:
        values = _values(obj, name)
        return show(values[0]) if values else ""
    return text


def _devices(obj: Seen, fmt: ValueFormatter) -> str:
    """The devices the buffer came in on (``skb_iif``: 0 until a device receives it),
    by the recording host's names, in the order seen: ``lo``, ``veth0 → br0``."""
    seen: list[int] = []
    for v in _values(obj, "skb_iif"):
        if v and v not in seen:
            seen.append(v)
    return " → ".join(fmt.device(v) for v in seen)


def _ether_type(value: int) -> str:
    host = port(value)
    return ETHER_TYPES.get(host, f"0x{host:04x}")


COLUMNS = {
    "sock": (
        Column("family", ("__sk_common.skc_family",), _family),
        Column("local", ("__sk_common.skc_num",), _local),
        Column("remote", ("__sk_common.skc_dport",), _remote),
        Column("states", ("__sk_common.skc_state",), lambda o, f: _path(_states(o, f))),
        Column("role", ("__sk_common.skc_state",), _role),
        Column("comm", (), _comm),
    ),
    "sk_buff": (
        Column("len", ("len",), _first("len", str)),
        Column("protocol", ("protocol",), _first("protocol", _ether_type)),
        Column("device", ("skb_iif",), _devices),
        Column("comm", (), _comm),
    ),
}


def _taken(name: str) -> Callable[[Seen, ValueFormatter], str]:
    """A field a project file names: the values it took, in order, as pages show them
    (``0 → 2896 → … → 0``; one value when it never changed)."""
    def text(obj: Seen, fmt: ValueFormatter) -> str:
        shown: list[str] = []
        for v in _values(obj, name):
            s = fmt.show(name, v)
            if not shown or shown[-1] != s:
                shown.append(s)
        return _path(shown)
    return text


def named_columns(fields: Sequence[str]) -> tuple[Column, ...]:
    """A column per field a project file names (``[objects] summary_fields``, the
    trace's meta ``summary_fields``), headed by the field's last name (its path where
    two would read alike)."""
    last = Counter(f.rsplit(".", 1)[-1] for f in fields)
    return tuple(Column(f.rsplit(".", 1)[-1] if last[f.rsplit(".", 1)[-1]] == 1 else f,
                        (f,), _taken(f)) for f in dict.fromkeys(fields))


def columns_for(struct: str, recorded: Sequence[str],
                named: Sequence[str] = ()) -> tuple[Column, ...]:
    """The summary columns of ``struct`` whose fields the trace recorded, then one per
    field of ``named`` (a project file's) it recorded."""
    have = set(recorded)
    return tuple(c for c in COLUMNS.get(struct, ()) + named_columns(named)
                 if (any if c.any_field else all)(f in have for f in c.fields))


def summary(obj: Seen, columns: Sequence[Column], fmt: ValueFormatter) -> list[str]:
    """An object's texts, one per column."""
    return [c.text(obj, fmt) for c in columns]
