"""What a recorded value means, both ways: raw → the text an engineer reads, and the text
an engineer writes (a ``--where`` filter) → the raw value the probe compares.

One module for both, so that a field name means one thing everywhere: ``skc_dport``
shows ``8080`` (a ``__be16`` in host order) on every page and in ``--tail``, and
``--where 'skc_dport == 8080'`` selects exactly those sockets.  What a field is comes
from the mini layout the trace carries (`ctracer.event.Field`): its kind (enum,
pointer, ipv6...), ``source["ctype"]`` as written in C (``__be32`` addresses and
``__be16`` ports are network order; ``__addrpair``/``__portpair`` the two of them in
one word), ``source["bits"]`` (flag bits an enum names) or ``source["display"]``.

Per display (`display_of`), shown → raw:

* ``ipv4``: ``127.0.0.1`` ↔ the ``__be32`` read as a little-endian u32;
* ``port``: ``8080`` (host order) ↔ the ``__be16`` read as a little-endian u16;
* ``addrpair``/``portpair``: shown as both halves (daddr, rcv_saddr / dport, num);
  filtered by the raw word (shown beside them);
* ``errno``: ``ECONNRESET`` / ``-EAGAIN`` ↔ 104 / -11;
* ``ifindex``: ``lo (1)``, the device's name from the recording host (the trace's meta
  ``net_devices``, `ctracer.host.netdevs`) ↔ its index; a filter names the device as
  this host knows it (``skb_iif == lo``);
* ``flags``: ``SOCK_DEAD|SOCK_DONE`` ↔ their bits; a filter names one bit as its mask;
* kind ``enum``: ``TCP_LISTEN`` ↔ its value; kind ``ipv6``: IPv6 text ↔ the 16 bytes.

Numbers written for any other field are the raw value.

An object (one lifetime of an address) has one name, `object_name`: on every page, in
the index, in ``--tail``, in Perfetto's tracks, and as its pages' folder.
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import socket
from typing import Optional, Sequence

from ctracer.event import Field

#: the ways a field may be shown besides its kind (``Field.source["display"]``)
DISPLAYS = ("ipv4", "port", "errno", "flags", "addrpair", "portpair", "ifindex")
#: members holding a network device's ifindex, by their last name
IFINDEX_FIELDS = ("skb_iif", "ifindex", "iif", "skc_bound_dev_if", "sk_bound_dev_if",
                  "sk_rx_dst_ifindex")

#: values of tracepoint arguments commonly met in the kernel's networking tracepoints
FAMILIES = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK", 17: "AF_PACKET"}
PROTOCOLS = {1: "IPPROTO_ICMP", 6: "IPPROTO_TCP", 17: "IPPROTO_UDP", 58: "IPPROTO_ICMPV6",
             132: "IPPROTO_SCTP", 262: "IPPROTO_MPTCP"}


def object_name(address: int, lifetime: int = 1) -> str:
    """``0x55d0c0a0`` for an address's first lifetime, ``0x55d0c0a0-2`` for the second
    (the address handed out again), ``-3``..."""
    base = f"0x{address:x}"
    return base if lifetime <= 1 else f"{base}-{lifetime}"


def ipv4(value: int) -> str:
    """A ``__be32`` read as a little-endian u32, as dotted quad."""
    return ".".join(str(b) for b in (value & 0xFFFFFFFF).to_bytes(4, "little"))


def ipv4_raw(text: str) -> int:
    """``127.0.0.1`` as the probe reads a ``__be32`` holding it (ValueError if not an
    IPv4 address)."""
    return int.from_bytes(ipaddress.IPv4Address(text).packed, "little")


def port(value: int) -> int:
    """A ``__be16`` read as a little-endian u16, in host order."""
    return int.from_bytes((value & 0xFFFF).to_bytes(2, "little"), "big")


def port_raw(host: int) -> int:
    """Port ``host`` (host order) as the probe reads a ``__be16`` holding it."""
    if not 0 <= host <= 0xFFFF:
        raise ValueError(f"{host} is not a port (0 to 65535)")
    return int.from_bytes(host.to_bytes(2, "big"), "little")


def ipv6_raw(text: str) -> int:
    """An IPv6 address as the 16 recorded bytes, read big-endian (ValueError if not)."""
    return int.from_bytes(ipaddress.IPv6Address(text).packed, "big")


def addrpair(value: int) -> str:
    """``__addrpair``: skc_daddr in the low half, skc_rcv_saddr in the high one."""
    return f"daddr {ipv4(value)}, rcv_saddr {ipv4(value >> 32)}"


def portpair(value: int) -> str:
    """``__portpair``: skc_dport (``__be16``) in the low half, skc_num (host) high."""
    return f"dport {port(value)}, num {(value >> 16) & 0xFFFF}"


def errno_name(value: int) -> Optional[str]:
    """``-EAGAIN`` for -11, ``ECONNRESET`` for 104; None when not an errno value."""
    name = _errno.errorcode.get(abs(value)) if 0 < abs(value) < 4096 else None
    if name is None:
        return None
    return f"-{name}" if value < 0 else name


def errno_value(name: str) -> Optional[int]:
    """104 for ``ECONNRESET``, -11 for ``-EAGAIN``; None for another word."""
    negative = name.startswith("-")
    number = getattr(_errno, name.lstrip("-"), None)
    if not isinstance(number, int) or not name.lstrip("-").startswith("E"):
        return None
    return -number if negative else number


def flag_names(value: int, bits: Sequence[tuple[int, str]]) -> str:
    """``value``'s set bits by name (``bits``: (bit, name) pairs), bits without a name in
    hex, joined by ``|``; ``0`` when none is set."""
    names = [n for b, n in bits if value >> b & 1]
    rest = value & ~sum(1 << b for b, _ in bits)
    if rest:
        names.append(f"0x{rest:x}")
    return "|".join(names) if names else "0"


def display_of(f: Field) -> str:
    """How ``f`` is shown beyond its kind: one of `DISPLAYS`, or ""."""
    explicit = f.source.get("display")
    if explicit in DISPLAYS:
        return explicit
    if f.source.get("bits"):
        return "flags"
    ctext = str(f.source.get("ctype", "")).replace("const ", "").strip()
    if ctext == "__be32":
        return "ipv4"
    if ctext == "__be16":
        return "port"
    if ctext == "__addrpair" and f.size == 8:
        return "addrpair"
    if ctext == "__portpair" and f.size == 4:
        return "portpair"
    base = f.name.rsplit(".", 1)[-1]
    if f.kind in ("int", "uint") and base in IFINDEX_FIELDS:
        return "ifindex"
    if f.kind == "int" and (base.endswith("_err") or base.endswith("_err_soft")
                            or base in ("err", "error")):
        return "errno"
    return ""


def value_names(f: Field) -> dict[str, int]:
    """The names a filter on ``f`` may use instead of a number: its enum's enumerators
    (``TCP_LISTEN``), or its flag bits' names as masks (``SOCK_DEAD``)."""
    if f.kind == "enum":
        return {name: value for value, name in f.enumerators}
    return {str(name): 1 << int(bit) for bit, name in f.source.get("bits", ())}


def example_of(f: Field) -> str:
    """A value of ``f`` written as a filter takes it, for hints."""
    display = display_of(f)
    names = list(value_names(f))
    if f.kind == "ipv6":
        return "::1"
    return {"ipv4": "127.0.0.1", "port": "8080", "errno": "ECONNRESET"}.get(
        display, names[0] if names else "42")


def filter_text(f: Field, raw: int) -> str:
    """``raw`` written as a filter on ``f`` takes it (`parse_value` reads it back to
    ``raw``): a name where ``f`` names it, an address, a port in host order, else the
    number."""
    for name, value in value_names(f).items():
        if value == raw:
            return name
    display = display_of(f)
    if f.kind == "ipv6":
        return str(ipaddress.IPv6Address(raw % (1 << 128)))
    if display == "ipv4":
        return ipv4(raw)
    if display == "port":
        return str(port(raw))
    return str(raw)


def parse_value(f: Field, text: str) -> int:
    """The raw value the probe compares for ``text`` written as ``f`` is shown
    (`display_of`); ValueError with the reason when ``text`` is not such a value."""
    display = display_of(f)
    names = value_names(f)
    if text in names:
        return names[text]
    if f.kind == "ipv6":
        try:
            return ipv6_raw(text)
        except ValueError:
            raise ValueError(f"{f.name} holds an IPv6 address (e.g. ::1, "
                             f"::ffff:127.0.0.1), not {text!r}") from None
    if display == "ipv4":
        try:
            return ipv4_raw(text)
        except ValueError:
            raise ValueError(f"{f.name} holds an IPv4 address: give it as a dotted quad "
                             f"(e.g. 127.0.0.1), not {text!r}") from None
    if display == "errno":
        number = errno_value(text)
        if number is not None:
            return number
    if display == "ifindex" and text and not text.lstrip("-").isdigit():
        try:
            return socket.if_nametoindex(text)
        except OSError:
            raise ValueError(f"{f.name} holds a network device's index: no device named "
                             f"{text!r} here (ip link lists them), nor is it a "
                             "number") from None
    try:
        number = int(text, 0)
    except ValueError:
        known = ", ".join(list(names)[:4])
        what = (f"a name ({known}, ...) or a number" if known else
                "an errno name (ECONNRESET, -EAGAIN) or a number" if display == "errno"
                else "a number")
        raise ValueError(f"{f.name} needs {what}, not {text!r}") from None
    if display == "port":
        if not 0 <= number <= 0xFFFF:
            raise ValueError(f"{f.name} holds a port (0 to 65535, in host order as shown), "
                             f"not {text}")
        return port_raw(number)
    if not -(1 << 63) <= number < (1 << 64):
        raise ValueError(f"{text} does not fit in 64 bits")
    return number
