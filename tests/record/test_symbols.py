"""Kernel text addresses as symbol+offset (`ctracer.host.kallsyms`) and tracepoint
arguments named by the kernel's enums (`ctracer.plan.displays.annotate_arguments`),
without a kernel: a kallsyms text and an enum source of our own."""

from ctracer.debuginfo.typegraph import EnumType
from ctracer.plan import displays
from ctracer.host import kallsyms
from ctracer.report.values import ValueFormatter
from ctracer.event import Field, Layout

KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81e9bf50 t sk_stream_kill_queues
ffffffff81e9c100 T tcp_v4_rcv
ffffffff81e9c100 D not_text
ffffffffc0a00000 t nfs_fh_hash\t[nfs]
0000000000000000 T hidden
"""


def test_addresses_read_as_symbol_plus_offset(tmp_path):
    path = tmp_path / "kallsyms"
    path.write_text(KALLSYMS)
    k = kallsyms.Kallsyms(str(path))
    assert k.name(0xFFFFFFFF81E9BFA7) == "sk_stream_kill_queues+0x57"
    assert k.name(0xFFFFFFFF81E9C100) == "tcp_v4_rcv"
    assert k.name(0xFFFFFFFFC0A00010) == "nfs_fh_hash+0x10 [nfs]"
    assert k.name(0xFFFF888102CE0000) is None and k.name(5) is None
    assert k.names([0xFFFFFFFF81E9BFA7, 7]) == {"0xffffffff81e9bfa7": "sk_stream_kill_queues+0x57"}
    assert kallsyms.Kallsyms(str(tmp_path / "none")).name(0xFFFFFFFF81E9BFA7) is None


class _Enums:
    def find_enum(self, name=None, enumerator=None):
        if name == "skb_drop_reason":
            return EnumType("skb_drop_reason", 4, (("SKB_DROP_REASON_NOT_SPECIFIED", 2),
                                                    ("SKB_DROP_REASON_QUEUE_PURGE", 104)))
        if enumerator == "TCP_CA_Open":
            return EnumType(None, 4, (("TCP_CA_Open", 0), ("TCP_CA_Loss", 4)))
        return None


def test_enum_arguments_are_named_from_the_debug_info():
    args = {"8": [{"name": "skb", "kind": "pointer", "type": "struct sk_buff *"},
                  {"name": "location", "kind": "pointer", "type": "void *"},
                  {"name": "reason", "kind": "enum", "enum": "skb_drop_reason"}],
            "35": [{"name": "ca_state", "kind": "uint", "type": "const u8"}],
            "36": [{"name": "reason", "kind": "enum", "enum": "sk_rst_reason"}]}
    named = displays.annotate_arguments(args, _Enums())
    assert named["8"][2]["names"] == [[2, "SKB_DROP_REASON_NOT_SPECIFIED"],
                                      [104, "SKB_DROP_REASON_QUEUE_PURGE"]]
    assert named["35"][0]["names"][0] == [0, "TCP_CA_Open"]
    assert "names" not in named["36"][0] and "names" not in named["8"][0]
    assert kallsyms.text_arguments(named) == {"location"}
    fmt = ValueFormatter(Layout.packed_in_order("m", [Field("a", "u8", 0, "uint")]), named,
                         {"0xffffffff81e9bfa7": "sk_stream_kill_queues+0x57"})
    assert fmt.show_arg("reason", 104, "enum", 8) == "SKB_DROP_REASON_QUEUE_PURGE (104)"
    assert fmt.show_arg("reason", 104, "enum", 36) == "104"  # another tracepoint's enum
    assert fmt.show_arg("ca_state", 4, "uint", 35) == "TCP_CA_Loss (4)"
    assert fmt.show_arg("location", 0xFFFFFFFF81E9BFA7, "pointer", 8) == \
        "sk_stream_kill_queues+0x57 (0xffffffff81e9bfa7)"
