"""The index names objects as a kernel engineer does (`ctracer.report.summaries`): per
socket its family, local and remote address:port, the states it went through, its role
and the command that used it; the object list carries those texts and its filter
searches them (``#q=:8080`` finds the sockets of port 8080)."""

import socket

from ctracer.event import PHASE_TRACEPOINT, Field, Layout
from ctracer.report import render_report
from ctracer.report.index_data import read_objects_file
from ctracer.tracefile import FunctionRow, TraceWriter

STATES = ((1, "TCP_ESTABLISHED"), (2, "TCP_SYN_SENT"), (3, "TCP_SYN_RECV"),
          (7, "TCP_CLOSE"), (10, "TCP_LISTEN"))
MINI = Layout.packed_in_order("ctracer__mini_sock", [
    Field("__sk_common.skc_state", "u8", 0, "enum", STATES),
    Field("__sk_common.skc_family", "u16", 0, "uint", source={"ctype": "short unsigned int"}),
    Field("__sk_common.skc_daddr", "u32", 0, "uint", source={"ctype": "__be32"}),
    Field("__sk_common.skc_rcv_saddr", "u32", 0, "uint", source={"ctype": "__be32"}),
    Field("__sk_common.skc_dport", "u16", 0, "uint", source={"ctype": "__be16"}),
    Field("__sk_common.skc_num", "u16", 0, "uint", source={"ctype": "__u16"}),
])
LOOPBACK = int.from_bytes(socket.inet_aton("127.0.0.1"), "little")
LISTENER, CLIENT, CHILD = 0xFFFF_8880_0000_1000, 0xFFFF_8880_0000_2000, 0xFFFF_8880_0000_3000


def _be16(p):
    return int.from_bytes(p.to_bytes(2, "big"), "little")


def write(path):
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               traced="kernel")
    w.add_functions([FunctionRow(1, "inet_sock_set_state", reach="tracepoint",
                                 attached="tracepoint")])
    hits = [  # (object, state, family, local port, remote port, comm)
        (LISTENER, 7, 2, 8080, 0, "server"), (LISTENER, 10, 2, 8080, 0, "server"),
        (CLIENT, 7, 2, 0, 8080, "client"), (CLIENT, 2, 2, 40000, 8080, "client"),
        (CLIENT, 1, 2, 40000, 8080, "swapper/1"),
        (CHILD, 10, 2, 8080, 40000, "swapper/0"), (CHILD, 3, 2, 8080, 40000, "swapper/0"),
        (CHILD, 1, 2, 8080, 40000, "server"), (CHILD, 7, 2, 0, 40000, "server"),
    ]
    for ts, (obj, state, family, local, remote, comm) in enumerate(hits, 1):
        w.add_event(ts_ns=ts * 1000, cpu=0, pid=1, tid=1, comm=comm, function_id=1,
                    phase=PHASE_TRACEPOINT, object=obj, retval=None, depth=0, flags=0,
                    snapshot=MINI.encode({
                        "__sk_common.skc_state": state, "__sk_common.skc_family": family,
                        "__sk_common.skc_daddr": LOOPBACK if remote else 0,
                        "__sk_common.skc_rcv_saddr": LOOPBACK,
                        "__sk_common.skc_dport": _be16(remote), "__sk_common.skc_num": local}),
                    args={"sk": obj})
    w.close()


def test_sockets_are_named_by_endpoints_states_role_and_comm(tmp_path):
    write(tmp_path / "t.ctrace")
    render_report(str(tmp_path / "t.ctrace"), str(tmp_path / "out"), plots=False)
    objects = read_objects_file((tmp_path / "out" / "objects.js").read_text())
    text = (tmp_path / "out" / "objects.js").read_text()
    assert '"summary_columns":["family","local","remote","states","role","comm"]' in text
    by = {o["label"].split()[0]: o["summary"] for o in objects}
    assert by[f"0x{LISTENER:x}"] == ["AF_INET", "127.0.0.1:8080", "",
                                     "TCP_CLOSE → TCP_LISTEN", "listener", "server"]
    assert by[f"0x{CLIENT:x}"] == ["AF_INET", "127.0.0.1:40000", "127.0.0.1:8080",
                                   "TCP_CLOSE → TCP_SYN_SENT → TCP_ESTABLISHED", "client",
                                   "client"]
    assert by[f"0x{CHILD:x}"] == ["AF_INET", "127.0.0.1:8080", "127.0.0.1:40000",
                                  "TCP_LISTEN → TCP_SYN_RECV → TCP_ESTABLISHED → TCP_CLOSE",
                                  "accepted", "server"]
    index = (tmp_path / "out" / "index.html").read_text()
    assert "<th>local</th><th>remote</th><th>states</th><th>role</th>" in index


def test_the_index_filter_finds_sockets_by_port(tmp_path):
    from browser_pages import CHROMIUM, FLAGS, playwright
    write(tmp_path / "t.ctrace")
    render_report(str(tmp_path / "t.ctrace"), str(tmp_path / "out"), plots=False)
    with playwright()() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=FLAGS,
            offline=True)
        try:
            page = context.new_page()
            page.goto((tmp_path / "out" / "index.html").as_uri() + "#q=:40000")
            page.wait_for_load_state("networkidle")
            shown = page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                                  ".map(r => r.cells[0].innerText.split(/\\s/)[0])")
            assert sorted(shown) == sorted([f"0x{CLIENT:x}", f"0x{CHILD:x}"])
            page.fill("input[data-objects=filter]", "listener")
            shown = page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                                  ".map(r => r.cells[0].innerText.split(/\\s/)[0])")
            assert shown == [f"0x{LISTENER:x}"]
        finally:
            context.close()
