"""One meaning per field (`ctracer.decode`): for each kind of field, a ``--where``
written with the text the report shows selects exactly the values shown so, and a
condition written back (`where.to_text`) reads as the pages do and parses to the same
tree."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from ctracer import decode
from ctracer.errors import UsageError
from ctracer.event import Field, Layout
from ctracer.plan import where
from ctracer.report.values import ValueFormatter

STATES = ((1, "TCP_ESTABLISHED"), (7, "TCP_CLOSE"), (10, "TCP_LISTEN"))
LAYOUT = Layout.packed_in_order("ctracer__mini_t", [
    Field("c.skc_dport", "u16", 0, "uint", source={"ctype": "__be16"}),
    Field("c.skc_daddr", "u32", 0, "uint", source={"ctype": "__be32"}),
    Field("c.skc_v6_daddr", "char[16]", 0, "ipv6"),
    Field("c.skc_state", "u8", 0, "enum", STATES),
    Field("c.skc_flags", "u64", 0, "uint",
          source={"ctype": "unsigned long", "bits": [[0, "SOCK_DEAD"], [1, "SOCK_DONE"]]}),
    Field("sk_err", "s32", 0, "int", source={"ctype": "int"}),
    Field("c.skc_num", "u16", 0, "uint", source={"ctype": "__u16"}),
    Field("c.skc_portpair", "u32", 0, "uint", source={"ctype": "__portpair"}),
])
FMT = ValueFormatter(LAYOUT)


def _be16(port: int) -> int:  # what the probe reads from a __be16 holding ``port``
    return int.from_bytes(socket.htons(port).to_bytes(2, "little"), "little")


def _be32(text: str) -> int:
    return int.from_bytes(socket.inet_aton(text), "little")


VALUES = {
    "c.skc_dport": [_be16(p) for p in (8080, 36895, 22, 0, 65535)],
    "c.skc_daddr": [_be32(a) for a in ("127.0.0.1", "1.0.0.127", "10.1.2.3", "0.0.0.0")],
    "c.skc_v6_daddr": ["::1", "::ffff:127.0.0.1", "fe80::1", "::"],
    "c.skc_state": [1, 7, 10],
    "c.skc_flags": [0, 1, 2, 3],
    "sk_err": [0, 104, -11, 5],
    "c.skc_num": [8080, 36895, 0],
    "c.skc_portpair": [0x1F90901F, 0x12345678],
}


def _shown(field: str, value) -> str:
    return FMT.show(field, value).split(" (")[0]


@pytest.mark.parametrize("field", [f for f in VALUES if f != "c.skc_portpair"])
def test_a_filter_written_as_the_report_shows_selects_what_it_shows(field):
    base = field.rsplit(".", 1)[-1]
    for value in VALUES[field]:
        text = _shown(field, value)
        if field == "c.skc_flags" and "|" in text:
            continue  # several bits: a filter names one bit (&) at a time
        op = "&" if field == "c.skc_flags" and value else "=="
        cond = where.parse(f"{base} {op} {text}", LAYOUT)
        chosen = [v for v in VALUES[field] if where.evaluate(cond, {field: v})]
        expected = ([v for v in VALUES[field] if v & value] if op == "&" else
                    [v for v in VALUES[field] if _shown(field, v) == text])
        assert chosen == expected == ([value] if op == "==" else expected), (text, chosen)
        assert where.parse(where.to_text(cond), LAYOUT) == cond


def test_network_order_fields_are_compared_raw_in_the_kernel():
    cond = where.parse("skc_dport == 8080 && skc_daddr == 127.0.0.1", LAYOUT)
    assert cond.left.value == _be16(8080) == 0x901F
    assert cond.right.value == _be32("127.0.0.1") == 0x0100007F
    assert where.to_text(cond) == "(c.skc_dport == 8080 && c.skc_daddr == 127.0.0.1)"
    v6 = where.parse("skc_v6_daddr == ::ffff:127.0.0.1", LAYOUT)
    assert v6.value == int(ipaddress.IPv6Address("::ffff:127.0.0.1"))


def test_pairs_show_both_halves_and_filter_by_the_raw_word():
    assert FMT.show("c.skc_portpair", 0x1F90901F) == "dport 8080, num 8080 (0x1f90901f)"
    pair = Field("c.skc_addrpair", "u64", 0, "uint", source={"ctype": "__addrpair"})
    shown = ValueFormatter(Layout.packed_in_order("m", [pair])).show(
        "c.skc_addrpair", _be32("10.0.0.2") << 32 | _be32("127.0.0.1"))
    assert shown.startswith("daddr 127.0.0.1, rcv_saddr 10.0.0.2 (0x")
    assert where.parse("skc_portpair == 0x1f90901f", LAYOUT).value == 0x1F90901F


@pytest.mark.parametrize("text, words", [
    ("skc_daddr == 8080", ["IPv4 address", "dotted quad"]),
    ("skc_daddr == 127.0.0.1.5", ["IPv4 address"]),
    ("skc_daddr < 127.0.0.1", ["compare it with == or !="]),
    ("skc_v6_daddr == 127.0.0.1", ["IPv6 address"]),
    ("skc_dport == 70000", ["0 to 65535", "host order"]),
    ("skc_state == LISTEN", ["TCP_ESTABLISHED", "or a number"]),
    ("sk_err == EWHAT", ["errno name"]),
    ("skc_num == 127.0.0.1", ["needs a number"]),
])
def test_values_a_field_cannot_hold_are_refused_with_the_form_it_takes(text, words):
    with pytest.raises(UsageError) as e:
        where.parse(text, LAYOUT)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_errno_names_both_ways():
    assert decode.errno_value("ECONNRESET") == 104 and decode.errno_value("-EAGAIN") == -11
    assert decode.errno_value("EOF") is None and decode.errno_value("SOCK_DEAD") is None
    assert decode.errno_name(decode.errno_value("-EPIPE")) == "-EPIPE"


def test_device_indexes_read_by_the_recording_hosts_device_names():
    """``skb_iif`` shows the device the recording host named (the trace's meta
    ``net_devices``), its index beside it; a filter names a device as this host knows it
    (the loopback device, whatever its index here: ip link's oracle is the kernel's own
    /sys/class/net/lo/ifindex)."""
    from pathlib import Path
    iif = Field("skb_iif", "s32", 0, "int", source={"ctype": "int"})
    layout = Layout.packed_in_order("ctracer__mini_sk_buff", [iif])
    assert decode.display_of(iif) == "ifindex"
    fmt = ValueFormatter(layout, devices={"1": "lo", "4": "eth0"})
    assert [fmt.show("skb_iif", v) for v in (1, 4, 7, 0)] == ["lo (1)", "eth0 (4)", "7", "0"]
    assert ValueFormatter(layout).show("skb_iif", 1) == "1"  # a trace without the map
    lo = int(Path("/sys/class/net/lo/ifindex").read_text())
    cond = where.parse("skb_iif == lo", layout)
    assert cond.value == lo and where.evaluate(cond, {"skb_iif": lo})
    assert where.parse("skb_iif == 3", layout).value == 3
    with pytest.raises(UsageError, match="no device named 'nosuchdev0' here"):
        where.parse("skb_iif == nosuchdev0", layout)
