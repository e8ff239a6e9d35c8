"""`ctracer trace --tail` on kernel functions, in the guests: every event recorded has its
line as it arrives, and each line names its object as the report and the exports do
(``0x…-2`` for an address's second lifetime), now that lifetimes end at functions'
exits (``kfree_skbmem``'s for sk_buff, ``sk_destruct``'s for sock) and an exit belongs
to its entry's lifetime; line by line, in time order, as the export lists the events.  An entry whose object is known only at its exit (a creation
function's, ``__alloc_skb``) shows ``0x0`` in the tail, as in the user-space case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from support import groundtruth as gt
from ctracer.decode import object_name
from ctracer.tracefile import Trace

pytestmark = pytest.mark.vm

CTRACER = [sys.executable, "-m", "ctracer"]
TCPLOOP = os.path.join(gt.ROOT, "samples", "tcp", "build", "tcploop")
#: per struct: functions that match on both kernels, creation and freeing ones included
FUNCTIONS = {
    "sk_buff": ("__alloc_skb", "consume_skb", "*kfree_skb*", "tcp_v4_rcv", "ip_rcv"),
    "sock": ("sk_alloc", "sk_destruct", "tcp_set_state", "tcp_sendmsg", "tcp_recvmsg",
             "tcp_close", "tcp_v4_do_rcv"),
}


@pytest.mark.parametrize("struct", sorted(FUNCTIONS))
def test_tail_names_method_objects_as_the_report_does(vm_kernel, tmp_path, struct):
    out = tmp_path / "t.ctrace"
    r = subprocess.run(CTRACER + ["trace", "struct", struct, "--functions", *FUNCTIONS[struct],
                                  "--fields", "len" if struct == "sk_buff" else "skc_state",
                                  "--tail", "-o", str(out), "--", TCPLOOP, "--connections", "4",
                                  "--messages", "3"],
                       capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln.split() for ln in r.stdout.splitlines()]
    tail = [(ln[1], ln[2], ln[3]) for ln in lines if len(ln) > 3 and ln[1].startswith("0x")]
    assert len(tail) == Trace(str(out)).event_count()   # a line per event recorded
    assert {how for _, _, how in tail} >= {"entry", "exit"}
    done = subprocess.run(CTRACER + ["export", str(out)], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    report = Counter(object_name(int(e["object"], 16), e["lifetime"]) if e["object"]
                     else "0x0" for e in events)
    named = Counter(name for name, _, _ in tail)
    # every line but a creation function's entry names its object as the export does
    assert all(how == "entry" for name, _, how in tail if name == "0x0")
    assert set(named) - {"0x0"} == set(report) - {"0x0"}
    assert all(named[name] <= report[name] for name in report if name != "0x0")
    assert sum(named.values()) == sum(report.values())
    # line by line: the tail prints in time order (each event waits, then the earliest
    # goes first) as the export lists events, so each line naming an object names the
    # export's object of the same event
    exported = [object_name(int(e["object"], 16), e["lifetime"]) if e["object"] else "0x0"
                for e in events]
    differ = [(i, line, x) for i, (line, x) in enumerate(zip(tail, exported))
              if line[0] != "0x0" and line[0] != x]
    assert not differ, differ[:10]
    if struct == "sk_buff":
        assert any(name.endswith("-2") for name in report)   # buffers freed, addresses reused
