"""`ctracer trace --tail` and the analysis name the objects of the same events alike, on
hand-written kernel-function traces whose races a guest only sometimes produces: the
tail counts lifetimes as records arrive (`ctracer.record.live_objects`), the report
once the recording is over (`ctracer.analysis.passes`)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from encoding import encode
from ctracer import analysis
from ctracer.decode import object_name
from ctracer.event import HEADER, PHASE_ENTRY, PHASE_EXIT, Field, FunctionRow, Layout
from ctracer.plan.lifetimes import LifetimeRule
from ctracer.record.tail import Tail
from ctracer.tracefile import Trace, TraceWriter

MINI = Layout.packed_in_order("ctracer__mini_t", [Field("len", "u32", 0, "uint")])
A = 0xFFFF_8880_0A35_EE00
RET_A = A - (1 << 64)   # the address as the header's signed return value carries it
ROWS = [FunctionRow(1, "rcv", reach="direct", via="param 1 skb"),
        FunctionRow(2, "consume", reach="direct", via="param 1 skb"),
        FunctionRow(3, "kfree_mem", reach="direct", via="param 1 skb"),
        FunctionRow(4, "alloc", reach="returns", via="return value")]
RULES = [LifetimeRule("t", "kfree_mem", 0, "ends", probe="function", why="kfree_mem frees it")]


def _tail_names(events) -> Counter:
    program = SimpleNamespace(mini=MINI, nargs=0, rows=ROWS, rules=RULES, head=None,
                              args_by_row=lambda: {})
    lines = []
    tail = Tail(program, out=SimpleNamespace(write=lines.append, flush=lambda: None))
    for ts, tid, fid, phase, obj, length, retval, depth in events:
        tail(HEADER._struct().pack(ts, obj, retval, 0, 1, tid, fid, depth,
                                   PHASE_ENTRY if phase == "in" else PHASE_EXIT, 0, b"t")
             + encode(MINI, {"len": length}))
    return Counter(line.split()[1] for line in lines)


def _report_names(path, events) -> Counter:
    w = TraceWriter(str(path))
    w.set_meta(struct_name="t", struct_kind="struct", mini_layout=MINI.to_json(),
               lifetime_rules=[r.to_json() for r in RULES])
    w.add_functions(ROWS)
    for ts, tid, fid, phase, obj, length, retval, depth in events:
        w.add_event(ts_ns=ts, cpu=0, pid=1, tid=tid, comm="t", function_id=fid,
                    phase=PHASE_ENTRY if phase == "in" else PHASE_EXIT, object=obj,
                    retval=retval, depth=depth, flags=0, snapshot=encode(MINI, {"len": length}))
    w.close()
    a = analysis.load(Trace(str(path)))
    names = Counter()
    for o, key in enumerate(a.objects.keys):
        names[object_name(key.address, key.lifetime)] += len(a.objects.events(o))
    return names


# (ts, tid, function, in/out, object, len, retval, depth as the probe counts it) and the
# events per lifetime
RACES = {
    # thread 1 frees A; before kfree_mem's exit is recorded, thread 2's alloc hands A out
    # again: the exit ends nothing, thread 2's rcv is the new buffer's, until thread 2
    # frees it; thread 1's next rcv is a third
    "allocated-again-before-the-free-returns": ([
        (10, 1, 2, "in", A, 1, 0, 0), (20, 1, 3, "in", A, 1, 0, 1),
        (30, 2, 4, "in", 0, 0, 0, 0), (40, 2, 4, "out", 0, 0, RET_A, 0),
        (50, 1, 3, "out", A, 1, 0, 1), (60, 1, 2, "out", A, 1, 0, 0),
        (70, 2, 1, "in", A, 2, 0, 0), (80, 2, 1, "out", A, 2, 0, 0),
        (90, 2, 3, "in", A, 2, 0, 0), (95, 2, 3, "out", A, 2, 0, 0),
        (99, 1, 1, "in", A, 3, 0, 0), (100, 1, 1, "out", A, 3, 0, 0)], (4, 6, 2)),
    # consume( kfree_mem(), rcv( kfree_mem() ), rcv() ): the first end is inside consume,
    # so is everything up to consume's exit, the second (deeper) end included; the next
    # rcv outside is another buffer
    "ends-inside-a-running-call": ([
        (10, 1, 2, "in", A, 1, 0, 0), (20, 1, 3, "in", A, 1, 0, 1),
        (30, 1, 3, "out", A, 1, 0, 1), (40, 1, 1, "in", A, 1, 0, 1),
        (50, 1, 3, "in", A, 1, 0, 2), (60, 1, 3, "out", A, 1, 0, 2),
        (70, 1, 1, "out", A, 1, 0, 1), (80, 1, 1, "in", A, 1, 0, 1),
        (90, 1, 1, "out", A, 1, 0, 1), (100, 1, 2, "out", A, 1, 0, 0),
        (110, 1, 1, "in", A, 5, 0, 0), (120, 1, 1, "out", A, 5, 0, 0)], (10, 2)),
}


@pytest.mark.parametrize("race", sorted(RACES))
def test_tail_and_report_name_raced_lifetimes_alike(tmp_path, race):
    events, lifetimes = RACES[race]
    report = _report_names(tmp_path / "t.ctrace", events)
    assert report == {object_name(A, n + 1): count for n, count in enumerate(lifetimes)}
    tail = _tail_names(events)
    assert set(tail) - {"0x0"} == set(report)
    assert all(tail[name] <= report[name] for name in report)  # an alloc's entry is 0x0
    assert sum(tail.values()) == len(events)
