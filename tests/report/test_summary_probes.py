"""The index's list of functions not fully probed: a tracepoint has one program and no exit,
so an attached tracepoint is complete; a function needs its entry and its exit."""

from ctracer.event import Field, Layout
from ctracer.tracefile import Trace, TraceWriter
from ctracer.event import FunctionRow
from support.analysis_view import view_of

MINI = Layout.packed_in_order("ctracer__mini_sock", [Field("state", "u8", 0, "uint")])


def test_attached_tracepoints_are_complete_and_a_null_binary_is_not_shown(tmp_path):
    path = tmp_path / "k.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               binary=None, argv=["ctracer", "trace", "struct", "sock"])
    w.add_functions([
        FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint", attached="raw_tracepoint"),
        FunctionRow(2, "tcp_close", attached="entry,exit"),
        FunctionRow(3, "tcp_v4_connect", attached="entry only; exit failed: EINVAL"),
        FunctionRow(4, "tcp_done", attached="failed: ENOENT")])
    w.close()
    summary = view_of(Trace(str(path))).summary
    assert [f.name for f in summary.failed_probes] == ["tcp_done", "tcp_v4_connect"]
    assert summary.target == ""


def test_the_index_names_each_function_not_fully_probed_once_with_its_ways(tmp_path):
    import re

    from ctracer.report import render_report

    path = tmp_path / "k.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               argv=["ctracer", "trace", "struct", "sock"])
    skipped = "skipped: the argument is not in the first 6 registers"
    w.add_functions([
        FunctionRow(1, "genl_family_rcv_msg_doit", route_text="net->rtnl (param 7 net)", attached=skipped),
        FunctionRow(2, "genl_family_rcv_msg_doit", route_text="net->genl_sock (param 7 net)", attached=skipped),
        FunctionRow(3, "genl_family_rcv_msg_doit", route_text="net->diag_nlsk (param 7 net)", attached=skipped),
        FunctionRow(4, "tcp_v4_connect", route_text="param 1 sk", attached="entry only; exit failed: EINVAL"),
        FunctionRow(5, "tcp_v4_connect", route_text="sk_buff->sk (param 2 skb)", attached="failed: ENOENT"),
        FunctionRow(6, "tcp_close", attached="entry,exit")])
    w.close()
    out = tmp_path / "report"
    render_report(str(path), str(out))
    page = (out / "index.html").read_text()
    box = page[page.index("not fully probed") - 100:]
    box = box[:box.index("</ul>")]
    items = re.findall(r"<li>(.*?)</li>", box, re.S)
    assert "2 functions not fully probed" in box
    assert len(items) == 2
    doit = next(i for i in items if "genl_family_rcv_msg_doit" in i)
    assert doit.count(skipped) == 1
    assert "3 ways" in doit and "net-&gt;rtnl" in doit and "net-&gt;diag_nlsk" in doit
    connect = next(i for i in items if "tcp_v4_connect" in i)
    assert "EINVAL" in connect and "ENOENT" in connect and "sk_buff-&gt;sk" in connect
