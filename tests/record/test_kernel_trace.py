"""`ctracer trace struct sock -- tcploop` on the running kernel, checked against bpftrace.

The bundled loopback workload (samples/tcp/tcploop: several connections, orderly
closes from each side, an abort through SO_LINGER 0) runs under `ctracer trace` while
bpftrace — an independent observer — prints the same tracepoints.  Per socket, the
``inet_sock_set_state`` transitions ctracer recorded equal those bpftrace saw; the
snapshot's ``skc_state`` equals the tracepoint's ``oldstate`` (the tracepoint fires
before the store); the ports decode to what the workload bound and printed.  For
``struct sk_buff`` on the same workload, the objects and their lengths equal what
bpftrace reads from ``net:net_dev_queue``.

Needs root and a kernel that takes raw tracepoint programs; skipped (saying why) only
when BPF is unavailable.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from support import groundtruth as gt
from support import kernelrun as kr
from ctracer.tracefile import Trace

TCPLOOP = kr.TCPLOOP
_bpf_or_skip = kr.bpf_or_skip
_free_port = kr.free_port
_workload = kr.workload_copy
Observer = kr.Observer


_trace = kr.trace_with_observer

pytestmark = pytest.mark.bpf  # every test traces the kernel (kernelrun)


def _by_name(trace: Trace) -> dict[str, int]:
    return {f.name: fid for fid, f in trace.functions.items()}


@pytest.fixture(scope="module")
def sock_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sock")
    port = _free_port()
    return (*_trace(tmp, "sock", port, kr.sock_states_script(port)), port)


def test_transitions_per_socket_equal_bpftrace(sock_run):
    trace, _, seen, port = sock_run
    expected, recorded = kr.sock_transitions(trace, seen)
    assert len(expected) >= 3  # listener, clients, accepted sockets (addresses reused)
    assert sum(map(len, expected.values())) >= 6 * 6
    assert {a: recorded.get(a) for a in expected} == expected
    # nothing recorded beyond the workload's sockets
    assert set(recorded) == set(expected)


def test_snapshot_state_is_oldstate_and_ports_decode(sock_run):
    trace, stdout, _, port = sock_run
    fid = _by_name(trace)["inet_sock_set_state"]
    pairs = set()
    hits = 0
    for e in trace.events():
        if e.function_id != fid:
            continue
        hits += 1
        v = trace.values(e)
        assert v is not None
        assert v["__sk_common.skc_state"] == e.args["oldstate"]
        assert e.args["sk"] == e.object
        pairs.add((v["__sk_common.skc_num"], socket.ntohs(v["__sk_common.skc_dport"])))
    assert hits
    lines = stdout.splitlines()
    assert lines[0] == f"listen {port}"
    conns = [ln.split() for ln in lines[1:] if ln.startswith("conn ")]
    assert len(conns) == 6
    assert {c[-1] for c in conns} == {"client", "server", "abort"}
    assert (port, 0) in pairs  # the listener
    for c in conns:
        client, server = int(c[3]), int(c[5])
        assert server == port
        assert (client, server) in pairs, (client, pairs)   # the client's socket
        assert (server, client) in pairs, (client, pairs)   # the accepted one


def test_tracepoint_arguments_are_named_in_the_meta(sock_run):
    trace, _, _, _ = sock_run
    fid = _by_name(trace)["inet_sock_set_state"]
    args = trace.meta_json("tracepoint_args")[str(fid)]
    assert [a["name"] for a in args] == ["sk", "oldstate", "newstate"]
    assert [a["kind"] for a in args] == ["pointer", "int", "int"]
    rules = trace.meta_json("lifetime_rules")
    assert any(r["function"] == "inet_sock_set_state" and r["effect"] == "starts"
               and r["equals"] == 7 for r in rules)
    assert trace.meta_json("admission")["processes"] is True


def test_export_jsonl_of_the_kernel_run(sock_run, tmp_path):
    """`ctracer export` (issue 7 §8) on the real run: every tracepoint hit one line,
    ``tp:NAME``, its arguments by name, the snapshot by dotted member path, lifetimes
    split by the sock rule (a transition out of TCP_CLOSE starts a new object)."""
    import json
    trace, _, _, _ = sock_run
    fid = _by_name(trace)["inet_sock_set_state"]
    hits = [e for e in trace.events() if e.function_id == fid]
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", trace.path],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    tp = [e for e in lines if e["function"] == "tp:inet_sock_set_state"]
    assert len(tp) == len(hits) and all(e["phase"] == "tracepoint" for e in tp)
    assert sorted((e["time_ns"], e["args"]["oldstate"], e["args"]["newstate"]) for e in tp) == \
        sorted((h.ts_ns, h.args["oldstate"], h.args["newstate"]) for h in hits)
    for e in tp:
        assert e["object"] == e["args"]["sk"]  # pointers as hex strings
        assert e["fields"]["__sk_common.skc_state"] == e["args"]["oldstate"]
    # per address, a new lifetime exactly where the rules say: a transition leaving
    # TCP_CLOSE (7), or the first event after tcp_destroy_sock (an accepted socket at a
    # reused address starts from TCP_LISTEN's state, 10, and only that rule splits it)
    by_address = defaultdict(list)
    for e in lines:
        if e["function"] in ("tp:inet_sock_set_state", "tp:tcp_destroy_sock") \
                and e["phase"] == "tracepoint":
            by_address[e["object"]].append(e)
    for events in by_address.values():
        assert events[0]["lifetime"] >= 1
        for before, e in zip(events, events[1:]):
            new = before["function"] == "tp:tcp_destroy_sock" or (
                e["function"] == "tp:inet_sock_set_state" and e["args"]["oldstate"] == 7)
            assert e["lifetime"] == before["lifetime"] + new, (before, e)
    assert any(e["lifetime"] > 1 for e in tp)  # tcploop's client sockets are reborn


def test_sk_buff_objects_and_lengths_equal_bpftrace(tmp_path):
    port = _free_port()
    _bpf_or_skip()
    workload = _workload(tmp_path)
    comm = os.path.basename(workload)
    script = (f'tracepoint:net:net_dev_queue /comm == "{comm}"/ '
              '{ printf("E %lx %u\\n", args->skbaddr, args->len); }')
    trace, _, seen = _trace(tmp_path, "sk_buff", port, script, workload)
    expected = Counter((int(a, 16), int(n)) for _, a, n in (ln.split() for ln in seen))
    fid = _by_name(trace)["net_dev_queue"]
    recorded: Counter = Counter()
    for e in trace.events():
        if e.function_id == fid and e.comm == comm:
            v = trace.values(e)
            assert v is not None
            recorded[(e.object, v["len"])] += 1
    # every packet of six connections: handshakes, data both ways, FINs or a RST
    assert sum(expected.values()) >= 6 * 8
    assert recorded == expected


def _run_with(tmp_path, *options):
    _bpf_or_skip()
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    port = _free_port()
    out = tmp_path / "t.ctrace"
    r = subprocess.run(
        [sys.executable, "-m", "ctracer", "trace", "struct", "sock", "-q", "-o", str(out),
         "--functions", "inet_sock_set_state", *[o.replace("PORT", str(port)) for o in options],
         "--", TCPLOOP, "--connections", "6", "--port", str(port)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return Trace(str(out)), port, r.stdout


def test_where_is_evaluated_in_the_kernel(tmp_path):
    trace, port, stdout = _run_with(tmp_path, "--where", "skc_num == PORT")
    clients = {int(ln.split()[3]) for ln in stdout.splitlines() if ln.startswith("conn ")}
    first: dict[int, dict] = {}
    states = []
    for e in trace.events():
        v = trace.values(e)
        first.setdefault(e.object, v)
        states.append(v["__sk_common.skc_num"])
    assert first
    # each object was admitted at a hit where the condition held; no client socket was
    assert all(v["__sk_common.skc_num"] == port for v in first.values())
    assert not clients & set(states)
    assert trace.meta_json("admission")["where"] == "__sk_common.skc_num == %d" % port


def test_max_objects_is_enforced_in_the_kernel(tmp_path):
    trace, port, _ = _run_with(tmp_path, "--max-objects", "1")
    objects = {e.object for e in trace.events()}
    assert len(objects) == 1
    first = next(trace.events())
    assert (first.args["oldstate"], first.args["newstate"]) == (7, 10)  # the listener


def test_tail_prints_each_event_as_it_arrives(tmp_path):
    trace, port, stdout = _run_with(tmp_path, "--tail")
    lines = [ln for ln in stdout.splitlines() if " tp:inet_sock_set_state " in ln]
    assert len(lines) == trace.event_count()
    assert any("(sk=0x" in ln and "oldstate=TCP_CLOSE, newstate=TCP_LISTEN)" in ln
               for ln in lines)  # listen
    # the tracepoint fires before the store: each transition shows the state it stores
    # on its own line (announced, from newstate), never on the next hit's
    for ln in lines:
        old, new = ln.split("oldstate=")[1].split(")")[0].split(", newstate=")
        assert f"__sk_common.skc_state: {old} → {new} (announced)" in ln or old == new, ln
    assert any("oldstate=TCP_SYN_SENT, newstate=TCP_ESTABLISHED" in ln for ln in lines)
    # the next hit's snapshot shows the stored state: no second change of it there
    assert sum(ln.count("__sk_common.skc_state:") for ln in lines) == \
        sum(1 for ln in lines if "(announced)" in ln)


def test_report_of_the_kernel_run_shows_values_by_name(sock_run, tmp_path):
    """The report of the real run: tracepoint arguments with pointers in hex and states by
    name; skc_state by TCP state name and sk_flags by the bits of enum sock_flags on the
    changes pages (display hints from the kernel's BTF), plot labels included."""
    from ctracer.report import render_report
    from support.timeline_rows import timeline_data
    trace, _, _, _ = sock_run
    out = tmp_path / "report"
    render_report(trace.path, str(out), plots=False)
    fid = _by_name(trace)["inet_sock_set_state"]
    listener = next(e.object for e in trace.events()
                    if e.function_id == fid and e.args["newstate"] == 10)
    page = out / f"0x{listener:x}"
    rows = timeline_data(page)[0]
    args = [text for tags in rows["tags"].values() for kind, text in tags if kind == "args"]
    assert f"(sk 0x{listener:x}, oldstate TCP_CLOSE, newstate TCP_LISTEN)" in args, args
    changes = (page / "changes.html").read_text()
    assert "TCP_CLOSE → TCP_LISTEN" in changes
    assert "SOCK_" in changes  # sk_flags by its bits, e.g. SOCK_ZAPPED|SOCK_USE_WRITE_QUEUE
    everything = (out / "many_objects" / "changes.html").read_text()
    assert "TCP_ESTABLISHED" in everything and "TCP_FIN_WAIT1" in everything


def test_arguments_read_by_their_names(sock_run, tmp_path):
    """kfree_skb's drop reason by its name in enum skb_drop_reason (BTF), its location
    as symbol+offset (kallsyms, resolved when the recording ended: the meta carries it),
    tcp_cong_state_set's ca_state as TCP_CA_*; the raw value beside each; in exports
    the pointers are hex strings."""
    import json
    from ctracer.report import render_report
    from support.timeline_rows import timeline_data
    trace, _, _, _ = sock_run
    out = tmp_path / "report"
    render_report(trace.path, str(out), plots=False)
    args = [text for data in timeline_data(out / "many_objects")
            for tags in data["tags"].values()
            for kind, text in tags if kind == "args"]
    frees = [a for a in args if "location " in a and "reason " in a]
    assert frees, "the workload's abort frees buffers: kfree_skb hits expected"
    assert all(re.search(r"location [A-Za-z_][\w.]*\+0x[0-9a-f]+ \(0xffffffff[0-9a-f]+\)", a)
               for a in frees), frees[:3]
    assert all(re.search(r"reason SKB_[A-Z_]+ \(\d+\)", a) for a in frees), frees[:3]
    symbols = trace.meta_json("kernel_symbols")
    assert symbols and all(k.startswith("0xffffffff") for k in symbols)
    cong = [a for a in args if "ca_state " in a]
    assert cong and all(re.search(r"ca_state TCP_CA_\w+ \(\d+\)", a) for a in cong), cong[:3]
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", trace.path, "--format",
                        "jsonl"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    skb = [e["args"]["skb"] for e in lines if e["function"] == "tp:kfree_skb"]
    assert skb and all(isinstance(s, str) and s.startswith("0x") for s in skb)

