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
        FunctionRow(1, "inet_sock_set_state", reach="tracepoint", attached="raw_tracepoint"),
        FunctionRow(2, "tcp_close", attached="entry,exit"),
        FunctionRow(3, "tcp_v4_connect", attached="entry only; exit failed: EINVAL"),
        FunctionRow(4, "tcp_done", attached="failed: ENOENT")])
    w.close()
    summary = view_of(Trace(str(path))).summary
    assert [f.name for f in summary.failed_probes] == ["tcp_done", "tcp_v4_connect"]
    assert summary.target == ""
