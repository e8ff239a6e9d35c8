"""Display hints (`ctracer.plan.displays`): the running kernel's own enums name the values
of struct sock's plain-integer members, as the mini layout a trace carries says."""

from pathlib import Path

import pytest

from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.typegraph import EnumType
from ctracer.debuginfo.sources import TypeSource, open_type_source
from ctracer.errors import UsageError
from ctracer.event import Field, Layout
from ctracer.plan import displays, where
from ctracer.plan.mini import build_mini
from ctracer.collectors import registry
from ctracer.report.values import ValueFormatter

KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def kernel_sock():
    if not KERNEL_BTF.exists():
        pytest.skip("this kernel has no BTF at /sys/kernel/btf/vmlinux")
    model = open_type_source(TypeSource(use_cache=False))
    built = build_mini(model.find_struct("sock", ShapeKind.STRUCT), kinds=registry.claim)
    return model, displays.annotate(built.layout, "sock", model)


@pytest.mark.kernel
def test_tcp_state_and_sock_flags_come_from_the_kernels_enums(kernel_sock):
    model, layout = kernel_sock
    state = layout.field("__sk_common.skc_state")
    names = dict(state.enumerators)
    # the anonymous enum of include/net/tcp_states.h, found by one of its enumerators
    assert names[1] == "TCP_ESTABLISHED" and names[6] == "TCP_TIME_WAIT"
    assert names[7] == "TCP_CLOSE" and names[12] == "TCP_NEW_SYN_RECV"
    assert state.kind == "enum" and state.ctype == "u8"  # the bytes read are unchanged
    flags = layout.field("__sk_common.skc_flags")
    bits = dict((b, n) for b, n in flags.source["bits"])
    sock_flags = dict((v, n) for n, v in model.find_enum("sock_flags").enumerators)
    assert bits == sock_flags and bits[0] == "SOCK_DEAD" and bits[1] == "SOCK_DONE"
    assert flags.source["display_hint"]["enum"] == "enum sock_flags"
    assert dict(layout.field("sk_type").enumerators)[1] == "SOCK_STREAM"
    assert dict(layout.field("sk_protocol").enumerators)[6] == "IPPROTO_TCP"
    fmt = ValueFormatter(Layout.from_json(layout.to_json()))  # as a trace file carries it
    assert fmt.show("__sk_common.skc_state", 10) == "TCP_LISTEN"
    assert fmt.show("__sk_common.skc_flags", 0b11 | 1 << 40) == \
        f"SOCK_DEAD|SOCK_DONE|0x{1 << 40:x} (0x{0b11 | 1 << 40:x})"
    assert fmt.show_arg("oldstate", 7) == "TCP_CLOSE"
    _, ticks = fmt.plot_axis("__sk_common.skc_state", [7, 2, 1])
    assert [label for _, label in ticks] == ["TCP_ESTABLISHED", "TCP_SYN_SENT", "TCP_CLOSE"]


@pytest.mark.kernel
def test_where_takes_the_names(kernel_sock):
    _, layout = kernel_sock
    cond = where.parse("skc_state == TCP_LISTEN && !(skc_flags & SOCK_DEAD)", layout)
    assert where.to_text(cond) == \
        "(__sk_common.skc_state == TCP_LISTEN && !(__sk_common.skc_flags & SOCK_DEAD))"
    assert cond.left.value == 10 and cond.right.operand.value == 1
    assert where.parse(where.to_text(cond), layout) == cond
    with pytest.raises(UsageError, match="TCP_ESTABLISHED"):
        where.parse("skc_state == TCP_NOT_A_STATE", layout)


class _NoEnums:
    def find_enum(self, name=None, enumerator=None):
        return None


class _OneEnum:
    def find_enum(self, name=None, enumerator=None):
        return EnumType("sock_flags", 4, (("SOCK_DEAD", 0), ("SOCK_HIGH", 70)))


def test_a_hint_without_its_enum_changes_nothing():
    layout = Layout.packed_in_order("ctracer__mini_sock", [
        Field("__sk_common.skc_state", "u8", 0, "uint"),
        Field("__sk_common.skc_flags", "u64", 0, "uint"),
        Field("sk_rcvbuf", "s32", 0, "int")])
    assert displays.annotate(layout, "sock", _NoEnums()) == layout
    assert displays.annotate(layout, "sk_buff", _OneEnum()) == layout  # no hint for it
    hinted = displays.annotate(layout, "sock", _OneEnum())
    # a bit number past the word's width is not a bit of it
    assert hinted.field("__sk_common.skc_flags").source["bits"] == [[0, "SOCK_DEAD"]]
    assert hinted.field("sk_rcvbuf") == layout.field("sk_rcvbuf")


def _bpftool_enum_with(enumerator: str) -> list[tuple[str, int]]:
    """The enumerators of the kernel's enum declaring ``enumerator``, as bpftool dumps
    the BTF (the oracle)."""
    import shutil
    import subprocess
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool is not installed")
    text = subprocess.run(["bpftool", "btf", "dump", "file", str(KERNEL_BTF)],
                          capture_output=True, text=True, check=True).stdout
    enums, current = [], None
    for line in text.splitlines():
        if line.startswith("["):
            current = [] if line.split("]")[1].split()[0] == "ENUM" else None
            if current is not None:
                enums.append(current)
        elif current is not None and line.startswith("\t'"):
            name, value = line.strip().split("' val=")
            current.append((name.strip("'"), int(value.rstrip("ULL") or 0)))
    (found,) = [e for e in enums if any(n == enumerator for n, _ in e)]
    return found


@pytest.mark.kernel
def test_netdev_features_words_read_by_the_kernels_feature_bits(kernel_sock):
    """sk_route_caps is a netdev_features_t: each bit is named by the kernel's
    NETIF_F_*_BIT enum (its _BIT dropped, as the NETIF_F_* masks are named), one name
    per bit, the _BIT name where an alias shares its value (NETIF_F_GSO_SHIFT)."""
    _, layout = kernel_sock
    caps = layout.field("sk_route_caps")
    assert caps.source["ctype"] == "netdev_features_t" and caps.kind == "uint"
    enum = _bpftool_enum_with("NETIF_F_SG_BIT")
    expected = {}
    for name, value in enum:
        if name.endswith("_BIT") and 0 <= value < 64:
            expected[value] = name[:-4]
    bits = dict((b, n) for b, n in caps.source["bits"])
    assert {b: n for b, n in bits.items() if b in expected} == expected
    assert all(not n.endswith("_BIT") for n in bits.values())
    shift = dict(enum)["NETIF_F_GSO_SHIFT"]
    assert bits[shift] == "NETIF_F_TSO"  # the alias sharing TSO's bit is not shown
    assert caps.source["display_hint"]["enum"] == "the enum of NETIF_F_SG_BIT"
    fmt = ValueFormatter(Layout.from_json(layout.to_json()))
    sg, tso = dict(enum)["NETIF_F_SG_BIT"], dict(enum)["NETIF_F_TSO_BIT"]
    value = 1 << sg | 1 << tso
    assert fmt.show("sk_route_caps", value) == f"NETIF_F_SG|NETIF_F_TSO (0x{value:x})"
    many = sum(1 << b for b in list(bits)[:12])
    _, ticks = fmt.plot_axis("sk_route_caps", [0, value, many])
    # a plot's level is labelled by the names when they fit, else by the raw word
    assert sorted(label for _, label in ticks) == sorted(["0 (0x0)", f"0x{value:x}",
                                                          f"0x{many:x}"])
    _, ticks = fmt.plot_axis("sk_route_caps", [0, 1 << sg])
    assert [label for _, label in ticks] == ["0 (0x0)", "NETIF_F_SG (0x1)"]
    # and --where takes the names, as masks
    cond = where.parse("sk_route_caps & NETIF_F_TSO", layout)
    assert (cond.op, cond.value) == ("&", 1 << tso)
