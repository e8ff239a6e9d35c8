"""A kernel trace as the report shows it: tracepoint hits with their arguments by name,
lifetimes split by the rules recorded with the trace (and the report says which rule),
and values read as a kernel engineer reads them, the raw value kept."""

from support.encoding import encode
import re

from ctracer.event import PHASE_ENTRY, PHASE_EXIT, PHASE_TRACEPOINT, Field, Layout
from ctracer.report import render_report
from support.analysis_view import view_of
from ctracer.decode import errno_name, ipv4, port
from ctracer.report.values import ValueFormatter
from ctracer.tracefile import Trace, TraceWriter
from ctracer.event import FunctionRow
from support.timeline_rows import page_rows

STATES = ((1, "TCP_ESTABLISHED"), (2, "TCP_SYN_SENT"), (7, "TCP_CLOSE"))
MINI = Layout.packed_in_order("ctracer__mini_sock", [
    Field("__sk_common.skc_state", "u8", 0, "enum", STATES),
    Field("__sk_common.skc_daddr", "u32", 0, "uint", source={"ctype": "__be32"}),
    Field("__sk_common.skc_dport", "u16", 0, "uint", source={"ctype": "__be16"}),
    Field("sk_err", "s32", 0, "int", source={"ctype": "int"}),
    Field("sk_flags", "u64", 0, "uint",
          source={"ctype": "unsigned long", "bits": [[0, "SOCK_DEAD"], [1, "SOCK_DONE"]]}),
])
RULE = {"struct": "sock", "function": "inet_sock_set_state", "probe": "tracepoint",
        "param_index": 0, "effect": "starts", "arg": "oldstate", "equals": 7,
        "rule": "sock: a transition out of TCP_CLOSE starts a new lifetime"}
SK = 0xFFFF_8880_1234_5600
LOOPBACK = int.from_bytes(bytes([127, 0, 0, 1]), "little")  # __be32 as memory holds it
PORT_8080 = int.from_bytes((8080).to_bytes(2, "big"), "little")


def kernel_trace(path):
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               lifetime_rules=[RULE], traced="kernel")
    w.add_functions([FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint",
                                 attached="tracepoint"),
                     FunctionRow(2, "tcp_close", route_kind="direct", attached="entry,exit")])

    def snap(state, err=0, flags=0):
        return encode(MINI, {"__sk_common.skc_state": state,
                            "__sk_common.skc_daddr": LOOPBACK,
                            "__sk_common.skc_dport": PORT_8080, "sk_err": err,
                            "sk_flags": flags})
    events = [  # (ts, function, phase, snapshot, args, retval)
        (10, 1, PHASE_TRACEPOINT, snap(7), {"oldstate": 7, "newstate": 2}, None),
        (20, 1, PHASE_TRACEPOINT, snap(2), {"oldstate": 2, "newstate": 1}, None),
        (30, 2, PHASE_ENTRY, snap(1), None, None),
        (40, 2, PHASE_EXIT, snap(7, 104, 3), None, -11),
        # the same address connects again: out of TCP_CLOSE, a new lifetime
        (50, 1, PHASE_TRACEPOINT, snap(7), {"oldstate": 7, "newstate": 2}, None),
    ]
    for ts, fid, phase, snapshot, args, ret in events:
        w.add_event(ts_ns=ts * 1000, cpu=0, pid=0, tid=0, comm="swapper/0", function_id=fid,
                    phase=phase, object=SK, retval=ret, depth=0, flags=0,
                    snapshot=snapshot, args=args)
    w.close()


def test_rules_split_lifetimes_and_say_so(tmp_path):
    kernel_trace(tmp_path / "k.ctrace")
    data = view_of(Trace(str(tmp_path / "k.ctrace")))
    assert [(o.key.lifetime, len(o.rows)) for o in data.objects] == [(1, 4), (2, 1)]
    assert [o.started_by for o in data.objects] == [RULE["rule"]] * 2
    assert data.lifetime_rule == "rules recorded with the trace: " + RULE["rule"]
    hits = data.methods[1]
    assert hits.name == "tp:inet_sock_set_state" and hits.calls == 3
    assert data.unmatched_exits == 0  # a tracepoint hit is not an exit


def test_timeline_shows_tracepoint_arguments_and_values_by_name(tmp_path):
    kernel_trace(tmp_path / "k.ctrace")
    out = tmp_path / "out"
    render_report(str(tmp_path / "k.ctrace"), str(out))
    rows = page_rows(out / f"0x{SK:x}" / "index.html")
    points = [r for r in rows if r["fn"] == "tp:inet_sock_set_state"]
    assert points[0]["classes"] >= {"tracepoint"}
    assert "(oldstate TCP_CLOSE, newstate TCP_SYN_SENT)" in points[0]["tags"]
    assert "-EAGAIN (-11)" in {r["ret"] for r in rows}  # tcp_close's return value
    changes = {c for r in rows for c in r["changes"]}
    assert ("sk_err", "0", "ECONNRESET (104)") in changes
    assert ("sk_flags", "0 (0x0)", "SOCK_DEAD|SOCK_DONE (0x3)") in changes
    changes = (out / f"0x{SK:x}" / "changes.html").read_text()
    # unchanged fields show their value, read as an engineer reads it, raw kept
    assert "127.0.0.1 (0x100007f)" in changes and "8080 (0x901f)" in changes
    index = (out / "index.html").read_text()
    assert RULE["rule"] in index


def test_value_helpers():
    assert ipv4(LOOPBACK) == "127.0.0.1" and port(PORT_8080) == 8080
    assert errno_name(-11) == "-EAGAIN" and errno_name(104) == "ECONNRESET"
    assert errno_name(0) is None and errno_name(-5000) is None
    fmt = ValueFormatter(MINI)
    assert fmt.show("sk_flags", 1 | 8) == "SOCK_DEAD|0x8 (0x9)"
    assert fmt.show_retval(-4) == "-EINTR (-4)" and fmt.show_retval(5) == "5"
    assert fmt.show_arg("newstate", 1) == "TCP_ESTABLISHED"
    assert fmt.show_arg("family", 2) == "AF_INET" and fmt.show_arg("protocol", 6) == "IPPROTO_TCP"
