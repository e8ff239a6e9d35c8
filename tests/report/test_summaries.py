"""The index names objects as a kernel engineer does (`ctracer.report.summaries`): per
socket its family, local and remote address:port, the states it went through, its role
and the command that used it; the object list carries those texts and its filter
searches them (``#q=:8080`` finds the sockets of port 8080)."""

import contextlib

from support.encoding import encode
import socket

from ctracer.event import PHASE_TRACEPOINT, Field, Layout
from ctracer.report import render_report
from ctracer.report.index_data import read_objects_file
from ctracer.tracefile import TraceWriter
from ctracer.event import FunctionRow

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
    w.add_functions([FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint",
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
                    snapshot=encode(MINI, {
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


@contextlib.contextmanager
def index_page(tmp_path, fragment: str):
    """The rendered index (tmp_path/out) open in headless Chromium at ``#fragment``."""
    from support.browser_pages import CHROMIUM, FLAGS, playwright
    with playwright()() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=FLAGS,
            offline=True)
        try:
            page = context.new_page()
            page.goto((tmp_path / "out" / "index.html").as_uri() + fragment)
            page.wait_for_load_state("networkidle")
            yield page
        finally:
            context.close()


def test_the_index_filter_finds_sockets_by_port(tmp_path):
    write(tmp_path / "t.ctrace")
    render_report(str(tmp_path / "t.ctrace"), str(tmp_path / "out"), plots=False)
    with index_page(tmp_path, "#q=:40000") as page:
        shown = page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                              ".map(r => r.cells[0].innerText.split(/\\s/)[0])")
        assert sorted(shown) == sorted([f"0x{CLIENT:x}", f"0x{CHILD:x}"])
        page.fill("input[data-objects=filter]", "listener")
        shown = page.evaluate("Array.from(document.querySelectorAll('#objects tbody tr'))"
                              ".map(r => r.cells[0].innerText.split(/\\s/)[0])")
        assert shown == [f"0x{LISTENER:x}"]


SKB_MINI = Layout.packed_in_order("ctracer__mini_sk_buff", [
    Field("len", "u32", 0, "uint", source={"ctype": "unsigned int"}),
    Field("protocol", "u16", 0, "uint", source={"ctype": "__be16"}),
    Field("skb_iif", "s32", 0, "int", source={"ctype": "int"}),
    Field("mark", "u32", 0, "uint", source={"ctype": "__u32"}),
])
SKB1, SKB2, SKB3 = 0xFFFF_8881_0000_1000, 0xFFFF_8881_0000_2000, 0xFFFF_8881_0000_3000


def write_skbs(path, summary_fields=None):
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sk_buff", struct_kind="struct", mini_layout=SKB_MINI.to_json(),
               traced="kernel", net_devices={"1": "lo", "2": "veth0", "3": "br0"},
               **({"summary_fields": summary_fields} if summary_fields else {}))
    w.add_functions([FunctionRow(1, "net_dev_queue", route_kind="tracepoint",
                                 attached="tracepoint")])
    ip = _be16(0x0800)
    hits = [(SKB1, 74, 0, 0), (SKB1, 74, 1, 0),            # looped back: came in on lo
            (SKB2, 1500, 0, 0),                             # sent only: no input device
            (SKB3, 98, 2, 5), (SKB3, 98, 3, 5), (SKB3, 98, 3, 9), (SKB3, 98, 7, 9)]
    for ts, (obj, length, iif, mark) in enumerate(hits, 1):
        w.add_event(ts_ns=ts * 1000, cpu=0, pid=1, tid=1, comm="ping", function_id=1,
                    phase=PHASE_TRACEPOINT, object=obj, retval=None, depth=0, flags=0,
                    snapshot=encode(SKB_MINI, {"len": length, "protocol": ip,
                                              "skb_iif": iif, "mark": mark}),
                    args={"skb": obj})
    w.close()


def test_sk_buffs_are_named_by_the_devices_they_came_in_on(tmp_path):
    """skb_iif by the recording host's device names (meta net_devices), in the order
    the buffer met them; an index the host did not name says so."""
    write_skbs(tmp_path / "s.ctrace")
    render_report(str(tmp_path / "s.ctrace"), str(tmp_path / "out"), plots=False)
    text = (tmp_path / "out" / "objects.js").read_text()
    assert '"summary_columns":["len","protocol","device","comm"]' in text
    by = {o["label"]: o["summary"] for o in read_objects_file(text)}
    assert by[f"0x{SKB1:x}"] == ["74", "ETH_P_IP", "lo", "ping"]
    assert by[f"0x{SKB2:x}"] == ["1500", "ETH_P_IP", "", "ping"]
    assert by[f"0x{SKB3:x}"] == ["98", "ETH_P_IP", "veth0 → br0 → ifindex 7", "ping"]
    changes = (tmp_path / "out" / f"0x{SKB3:x}" / "changes.html").read_text()
    assert "veth0 (2)" in changes and "br0 (3)" in changes  # the values, as the list names them


def test_a_project_file_names_summary_columns_of_any_struct(tmp_path):
    """The fields a project file names (meta summary_fields) are columns too, each the
    values the field took in order, as the pages show them, searched and sorted by the
    index like the struct's own."""
    write_skbs(tmp_path / "s.ctrace", summary_fields=["mark", "skb_iif"])
    render_report(str(tmp_path / "s.ctrace"), str(tmp_path / "out"), plots=False)
    text = (tmp_path / "out" / "objects.js").read_text()
    assert ('"summary_columns":["len","protocol","device","comm","mark","skb_iif"]'
            in text)
    by = {o["label"]: o["summary"][4:] for o in read_objects_file(text)}
    assert by == {f"0x{SKB1:x}": ["0", "0 → lo (1)"], f"0x{SKB2:x}": ["0", "0"],
                  f"0x{SKB3:x}": ["5 → 9", "veth0 (2) → br0 (3) → 7"]}
    index = (tmp_path / "out" / "index.html").read_text()
    assert "<th>mark</th><th>skb_iif</th>" in index
    rows = "Array.from(document.querySelectorAll('#objects tbody tr'))"
    with index_page(tmp_path, "#q=5 → 9") as page:
        assert page.evaluate(rows + ".map(r => r.cells[0].innerText)") == [f"0x{SKB3:x}"]
        page.fill("input[data-objects=filter]", "br0")
        assert page.evaluate(rows + ".map(r => r.cells[0].innerText)") == [f"0x{SKB3:x}"]
        page.fill("input[data-objects=filter]", "")
        page.click("#objects th:text-is('len')")  # numbers sort by value, not as text
        assert page.evaluate(rows + ".map(r => r.cells[1].innerText)") == ["74", "98", "1500"]
