"""Lifetimes of kernel sockets whose addresses are handed out again, on real tracepoints.

workloads/reuse.py aborts connected sockets and then makes sockets that never leave
TCP_CLOSE (never bound nor connected), pinned to one CPU so that the slab allocator
hands the freed addresses out again.  With the default rules, ``tcp_destroy_sock`` ends
a socket's lifetime, so each never-connected socket at a reused address is an object
of its own and the report says which rule split it; with the rules changed on the
command line (``--lifetime-rule``: only "out of TCP_CLOSE starts one", the rule alone
that missed them) those sockets fold into the connected socket before them.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support import kernelrun as kr
from support.analysis_view import view_of
from ctracer.tracefile import Trace

WORKLOAD = os.path.join(os.path.dirname(__file__), "workloads", "reuse.py")
ROUNDS = 8


def _run(tmp_path, *options) -> tuple[Trace, str]:
    kr.bpf_or_skip()
    port = kr.free_port()
    out = tmp_path / "reuse.ctrace"
    r = subprocess.run(
        [sys.executable, "-m", "ctracer", "trace", "struct", "sock", "-o", str(out), *options,
         "--", sys.executable, WORKLOAD, str(port), str(ROUNDS)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert " 0 lost" in r.stderr, r.stderr
    return Trace(str(out)), r.stderr


def _never_connected(data, trace: Trace, obj) -> bool:
    """Only tcp_destroy_sock hits: a socket that was never connected."""
    names = {data.function_names.get(r.function_id) for r in obj.rows}
    return names == {"tp:tcp_destroy_sock"}


@pytest.mark.bpf
@pytest.mark.parametrize("rules", ["default", "changed"])
def test_a_reused_address_that_never_leaves_tcp_close_is_a_new_object(tmp_path, rules):
    options = [] if rules == "default" else \
        ["--lifetime-rule", "starts:inet_sock_set_state:oldstate=TCP_CLOSE"]
    trace, stderr = _run(tmp_path, *options)
    data = view_of(trace)
    connected = {o.key.address for o in data.objects
                 if any(data.function_names.get(r.function_id) == "tp:inet_sock_set_state"
                        for r in o.rows)}
    alone = [o for o in data.objects if _never_connected(data, trace, o)
             and o.key.address in connected and o.key.lifetime > 1]
    for obj in alone:
        for e in trace.events(obj.key.address):
            if obj.rows[0].seq <= e.seq <= obj.rows[-1].seq:
                v = trace.values(e)
                assert v["__sk_common.skc_state"] == 7 and v["__sk_common.skc_num"] == 0
    if rules == "default":
        assert "lifetime rules: starts:inet_sock_set_state:oldstate=TCP_CLOSE, " \
               "starts:inet_sock_set_state:newstate=TCP_SYN_RECV, " \
               "ends:tcp_destroy_sock" in stderr
        # most rounds reuse a freed address for a socket that never connects
        assert len(alone) >= ROUNDS // 2, [(o.label, o.started_by) for o in data.objects]
        assert all(o.started_by.startswith("after sock: tcp_destroy_sock ends its lifetime")
                   for o in alone)
        assert "tcp_destroy_sock ends its lifetime" in data.lifetime_rule
    else:
        assert "lifetime rules: starts:inet_sock_set_state:oldstate=TCP_CLOSE (change" in stderr
        assert [r["function"] for r in trace.meta_json("lifetime_rules")] == \
            ["inet_sock_set_state"]
        # the rule that would split them is gone: they fold into the socket before them
        assert alone == []
        assert any(data.function_names.get(o.rows[-1].function_id) == "tp:tcp_destroy_sock"
                   and sum(data.function_names.get(r.function_id) == "tp:tcp_destroy_sock"
                           for r in o.rows) > 1 for o in data.objects)
