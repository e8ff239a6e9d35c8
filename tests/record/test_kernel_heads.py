"""Time-wait and request sockets traced as ``struct sock``: only their head is read.

Tracepoints hand ``tcp_send_reset``, ``net_dev_queue`` (through ``skb->sk``) and
``kfree_skb`` a ``struct inet_timewait_sock`` or a ``struct request_sock`` where a
``struct sock *`` is expected; both share only ``struct sock_common`` with it.  A
workload (workloads/twreset.py) makes the server's side of each connection a time-wait
socket and sends it data, so that it answers with a RST.  bpftrace, the independent
observer, prints each RST a time-wait socket of the workload's port sends (the
tracepoint's own ``state`` and ``skaddr``).  The trace must hold the same resets, every
event of an object in TCP_TIME_WAIT or TCP_NEW_SYN_RECV flagged as read only in its
``__sk_common``, the other fields not read (None, null) rather than zero or changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from support import kernelrun as kr
from ctracer.event import FLAG_HEAD_ONLY
from ctracer.report import render_report
from support.analysis_view import view_of
from ctracer.tracefile import Trace
from support.timeline_rows import page_rows

WORKLOAD = os.path.join(os.path.dirname(__file__), "workloads", "twreset.py")
CONNECTIONS = 3


@pytest.fixture(scope="module")
def tw_run(tmp_path_factory):
    kr.bpf_or_skip()
    tmp = tmp_path_factory.mktemp("heads")
    port = kr.free_port()
    script = ("tracepoint:tcp:tcp_send_reset /args->state == 6 && "
              f"((struct sock_common *)args->skaddr)->skc_num == {port}/ "
              '{ printf("E %lx %d %d\\n", args->skaddr, args->state, '
              "((struct sock_common *)args->skaddr)->skc_state); }")
    observer = kr.Observer(script, tmp / "resets.bpftrace")
    out = tmp / "tw.ctrace"
    try:
        r = subprocess.run(
            [sys.executable, "-m", "ctracer", "trace", "struct", "sock", "-q", "-o", str(out),
             "--", sys.executable, WORKLOAD, str(port), str(CONNECTIONS)],
            capture_output=True, text=True, timeout=600, cwd=tmp)
    finally:
        seen = observer.stop()
    assert r.returncode == 0, r.stderr
    assert " 0 lost" in r.stderr, r.stderr
    return Trace(str(out)), seen, port, tmp


def _name(trace: Trace, e) -> str:
    return trace.functions[e.function_id].name


@pytest.mark.bpf
def test_resets_of_time_wait_sockets_equal_bpftrace(tw_run):
    trace, seen, port, _ = tw_run
    expected = Counter(int(line.split()[1], 16) for line in seen)
    assert sum(expected.values()) == CONNECTIONS
    assert all(line.split()[2:] == ["6", "6"] for line in seen)  # TCP_TIME_WAIT, twice
    recorded = Counter()
    for e in trace.events():
        if _name(trace, e) == "tcp_send_reset" and e.object in expected:
            v = trace.values(e)
            assert v["__sk_common.skc_state"] == 6 and v["__sk_common.skc_num"] == port
            recorded[e.object] += 1
    assert recorded == expected


@pytest.mark.bpf
def test_only_sock_common_is_read_in_time_wait_and_request_sockets(tw_run):
    trace, seen, _, _ = tw_run
    head = trace.meta_json("head_read")
    assert head["member"] == "__sk_common"
    assert head["states"] == [[6, "TCP_TIME_WAIT"], [12, "TCP_NEW_SYN_RECV"]]
    from ctracer.debuginfo.sources import TypeSource, open_type_source
    sock_common = open_type_source(TypeSource(use_cache=False)).find_struct("sock_common")
    assert head["bytes"] == [0, sock_common[sock_common.root].size]
    inside = trace.head_fields
    assert "__sk_common.skc_tw_rcv_nxt" in inside and "sk_rcvbuf" not in inside
    assert all(f.startswith("__sk_common.") for f in inside)
    states = Counter()
    for e in trace.events():
        v = trace.values(e)
        state = v["__sk_common.skc_state"]
        partial = bool(e.flags & FLAG_HEAD_ONLY)
        assert partial == (state in (6, 12)), (_name(trace, e), state, e.flags)
        if partial:
            states[state] += 1
            assert all(v[k] is None for k in v if k not in inside)
            assert all(v[k] is not None for k in inside)
        else:
            assert all(x is not None for x in v.values())
    # the resets, the RSTs' skbs and the freed data: three events per time-wait socket;
    # the handshakes' SYN-ACKs come from request sockets
    assert states[6] >= 3 * CONNECTIONS and states[12] >= CONNECTIONS
    tw = {int(line.split()[1], 16) for line in seen}
    assert {_name(trace, e) for e in trace.events() if e.object in tw} >= \
        {"tcp_send_reset", "net_dev_queue", "kfree_skb"}


@pytest.mark.bpf
def test_report_and_export_say_not_read(tw_run):
    trace, seen, _, tmp = tw_run
    tw = {int(line.split()[1], 16) for line in seen}
    inside = trace.head_fields
    data = view_of(trace)
    partial_objects = [o for o in data.objects if o.head_only]
    assert {o.key.address for o in partial_objects} >= tw
    for obj in partial_objects:
        assert obj.head_only == len(obj.rows)
        assert all(c.field in inside for c in obj.changes)
        assert all(points[0][1] is None for name, points in obj.series.items()
                   if name not in inside)
    # one time-wait socket per connection, even where they share an address: another
    # connection's ports at the same address start another object
    resets = [o for o in partial_objects
              if any(data.function_names.get(r.function_id) == "tp:tcp_send_reset"
                     for r in o.rows)]
    assert len(resets) == CONNECTIONS
    ports = set()
    for o in resets:
        pairs = {trace.values(e)["__sk_common.skc_portpair"] for e in trace.events(o.key.address)
                 if o.rows[0].seq <= e.seq <= o.rows[-1].seq}
        assert len(pairs) == 1
        ports |= pairs
        if o.key.lifetime > 1 and o.started_by.startswith("a time-wait"):
            assert "other addresses or ports at the same address" in o.started_by
    assert len(ports) == CONNECTIONS
    if any(o.key.lifetime > 1 for o in resets):
        assert "time-wait or request socket with other addresses" in data.lifetime_rule
    render_report(trace.path, str(tmp / "report"))
    obj = next(o for o in partial_objects if o.key.address in tw)
    page = (tmp / "report" / obj.dirname / "index.html").read_text()
    rows = page_rows(tmp / "report" / obj.dirname / "index.html")
    assert "read in part" in page
    assert any("only __sk_common read" in r["tags"] and "head-only" in r["classes"]
               for r in rows)
    changes = (tmp / "report" / obj.dirname / "changes.html").read_text()
    assert "not read" in changes and "TCP_TIME_WAIT" in changes
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", trace.path],
                       capture_output=True, text=True, timeout=300, cwd=tmp)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    tw_lines = [e for e in lines if int(e["object"], 16) in tw]
    assert tw_lines
    for e in tw_lines:
        assert e["fields"]["sk_rcvbuf"] is None and e["fields"]["sk_receive_queue.qlen"] is None
        assert e["fields"]["__sk_common.skc_state"] == 6
