"""A value has one spelling in every export: a network-order port or address is written
as the pages and ``--where`` spell it (port 47123 in host order, ``10.0.0.1``), with the
value as recorded beside it as ``PATH:raw``, in JSON Lines, CSV and Parquet alike."""

from support.encoding import encode
import csv
import io
import json
import shutil
import subprocess
import sys

from ctracer import decode
from ctracer.event import PHASE_TRACEPOINT, Field, FunctionRow, Layout
from ctracer.plan import where
from ctracer.tracefile import TraceWriter

MINI = Layout.packed_in_order("ctracer__mini_sock", [
    Field("__sk_common.skc_daddr", "u32", 0, "uint", source={"ctype": "__be32"}),
    Field("__sk_common.skc_dport", "u16", 0, "uint", source={"ctype": "__be16"}),
    Field("__sk_common.skc_num", "u16", 0, "uint", source={"ctype": "__u16"}),
    Field("__sk_common.skc_state", "u8", 0, "enum",
          enumerators=((1, "TCP_ESTABLISHED"), (7, "TCP_CLOSE")))])
SK = 0xFFFF_8880_1234_5600
#: (time, port in host order, address): 47123 is recorded as the __be16 5048
CONNECTIONS = ((1000, 47123, "10.0.0.1"), (2000, 8080, "127.0.0.1"), (3000, 47123, "192.168.1.9"))


def _snapshots():
    return [{"__sk_common.skc_daddr": decode.ipv4_raw(address),
             "__sk_common.skc_dport": decode.port_raw(port),
             "__sk_common.skc_num": 5000, "__sk_common.skc_state": 1}
            for _, port, address in CONNECTIONS]


def _trace(tmp_path):
    path = tmp_path / "v.ctrace"
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               traced="kernel")
    w.add_functions([FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint",
                                 attached="tracepoint")])
    for (ts, _, _), values in zip(CONNECTIONS, _snapshots()):
        w.add_event(ts_ns=ts, cpu=0, pid=1, tid=1, comm="tcploop", function_id=1,
                    phase=PHASE_TRACEPOINT, object=SK, retval=None, depth=0, flags=0,
                    snapshot=encode(MINI, values), args={"sk": SK})
    w.close()
    return path


def _export(path, *args):
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(path), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_ports_and_addresses_are_spelled_as_where_spells_them(tmp_path):
    path = _trace(tmp_path)
    assert decode.port_raw(47123) == 5048
    raws = _snapshots()
    matched = [where.evaluate(where.parse("skc_dport == 47123", MINI), values)
               for values in raws]
    assert matched == [True, False, True]

    events = [json.loads(line) for line in _export(path, "--format", "jsonl").splitlines()]
    ports = [e["fields"]["__sk_common.skc_dport"] for e in events]
    assert ports == [decode.port(v["__sk_common.skc_dport"]) for v in raws]
    assert [p == 47123 for p in ports] == matched
    assert [e["fields"]["__sk_common.skc_dport:raw"] for e in events] == \
        [v["__sk_common.skc_dport"] for v in raws]
    assert [e["fields"]["__sk_common.skc_daddr"] for e in events] == \
        [address for _, _, address in CONNECTIONS]
    assert events[0]["fields"]["__sk_common.skc_daddr:raw"] == decode.ipv4_raw("10.0.0.1")
    assert events[0]["fields"]["__sk_common.skc_num"] == 5000  # a host-order u16 as is
    assert "__sk_common.skc_num:raw" not in events[0]["fields"]
    assert events[0]["fields"]["__sk_common.skc_state:name"] == "TCP_ESTABLISHED"
    if shutil.which("jq"):
        found = subprocess.run(
            ["jq", "-c", 'select(.fields."__sk_common.skc_dport" == 47123) | .time_ns'],
            input=_export(path, "--format", "jsonl"), capture_output=True, text=True,
            check=True).stdout.split()
        assert found == ["1000", "3000"]

    rows = list(csv.DictReader(io.StringIO(_export(path, "--format", "csv"))))
    assert [int(r["__sk_common.skc_dport"]) for r in rows] == ports
    assert [int(r["__sk_common.skc_dport:raw"]) for r in rows] == \
        [v["__sk_common.skc_dport"] for v in raws]
    assert rows[2]["__sk_common.skc_daddr"] == "192.168.1.9"
    assert rows[0]["__sk_common.skc_state:name"] == "TCP_ESTABLISHED"
    header = list(rows[0])
    assert header.index("__sk_common.skc_dport:raw") == \
        header.index("__sk_common.skc_dport") + 1


def test_parquet_carries_the_same_spelling(tmp_path):
    import pyarrow.parquet as pq
    path = _trace(tmp_path)
    out = tmp_path / "v.parquet"
    _export(path, "--format", "parquet", "-o", str(out))
    t = pq.read_table(str(out))
    assert t.column("__sk_common.skc_dport").to_pylist() == [47123, 8080, 47123]
    assert t.column("__sk_common.skc_dport:raw").to_pylist() == \
        [v["__sk_common.skc_dport"] for v in _snapshots()]
    assert t.column("__sk_common.skc_daddr").to_pylist() == \
        [address for _, _, address in CONNECTIONS]
    assert str(t.schema.field("__sk_common.skc_dport").type) == "int64"
