"""Pointer arguments leave as hex strings: a 64-bit kernel address as a JSON number is
rounded by jq and JavaScript (``18446612686548099808`` read back as ``…8100000``)."""

from support.encoding import encode
import json
import subprocess
import sys

from ctracer.event import PHASE_TRACEPOINT, Field, Layout
from ctracer.tracefile import TraceWriter
from ctracer.event import FunctionRow

MINI = Layout.packed_in_order("ctracer__mini_sock", [
    Field("__sk_common.skc_state", "u8", 0, "uint")])
SK = 0xFFFF_8880_1234_5600

SKB = 0xFFFF_8881_181A_ECE0
LOCATION = 0xFFFF_FFFF_81E9_BFA7


def test_pointer_arguments_are_hex_strings_in_jsonl(tmp_path):
    path = tmp_path / "k.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               traced="kernel", tracepoint_args={"1": [
                   {"name": "skb", "ctype": "u64", "kind": "pointer", "type": "struct sk_buff *"},
                   {"name": "location", "ctype": "u64", "kind": "pointer", "type": "void *"},
                   {"name": "reason", "ctype": "u64", "kind": "enum",
                    "type": "enum skb_drop_reason", "enum": "skb_drop_reason"}]})
    w.add_functions([FunctionRow(1, "kfree_skb", route_kind="tracepoint", attached="tracepoint")])
    w.add_event(ts_ns=1000, cpu=0, pid=1, tid=1, comm="tcploop", function_id=1,
                phase=PHASE_TRACEPOINT, object=SK, retval=None, depth=0, flags=0,
                snapshot=encode(MINI, {"__sk_common.skc_state": 7}),
                args={"skb": SKB, "location": LOCATION, "reason": 104})
    w.close()
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(path), "--format",
                        "jsonl"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (event,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert event["args"] == {"skb": f"0x{SKB:x}", "location": f"0x{LOCATION:x}",
                             "reason": 104}
    assert int(event["args"]["skb"], 16) == SKB


def test_pointer_fields_are_hex_strings_in_jsonl_and_csv(tmp_path):
    """A pointer member recorded with --pointers (a kernel address above 2**63) leaves as
    the hex string Parquet holds, in JSON Lines (which jq reads back exact) and CSV."""
    import csv
    import io
    import shutil
    mini = Layout.packed_in_order("ctracer__mini_sock", [
        Field("__sk_common.skc_state", "u8", 0, "uint"),
        Field("sk_socket", "u64", 0, "pointer"),
        Field("sk_rcvbuf", "s32", 0, "int")])
    path = tmp_path / "p.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=mini.to_json(),
               traced="kernel")
    w.add_functions([FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint",
                                 attached="tracepoint")])
    for ts, socket in ((1000, SKB), (2000, 0)):
        w.add_event(ts_ns=ts, cpu=0, pid=1, tid=1, comm="tcploop", function_id=1,
                    phase=PHASE_TRACEPOINT, object=SK, retval=None, depth=0, flags=0,
                    snapshot=encode(mini, {"__sk_common.skc_state": 7, "sk_socket": socket,
                                          "sk_rcvbuf": 131072}), args={"sk": SK})
    w.close()

    def export(fmt):
        r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(path), "--format",
                            fmt], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout
    events = [json.loads(line) for line in export("jsonl").splitlines()]
    assert [e["fields"]["sk_socket"] for e in events] == [f"0x{SKB:x}", "0x0"]
    assert events[0]["fields"]["sk_rcvbuf"] == 131072  # numbers stay numbers
    if shutil.which("jq"):
        out = subprocess.run(["jq", "-r", ".fields.sk_socket"], input=export("jsonl"),
                             capture_output=True, text=True, check=True).stdout.split()
        assert int(out[0], 16) == SKB
    rows = list(csv.DictReader(io.StringIO(export("csv"))))
    assert [r["sk_socket"] for r in rows] == [f"0x{SKB:x}", "0x0"]
