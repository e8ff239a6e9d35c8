"""Display hints (`ctracer.plan.displays`): the running kernel's own enums name the values
of struct sock's plain-integer members, as the mini layout a trace carries says."""

from pathlib import Path

import pytest

from ctracer.debuginfo.model import ShapeKind
from ctracer.debuginfo.graph import EnumType
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
