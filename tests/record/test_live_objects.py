"""`ctracer trace --tail` and the analysis name the objects of the same events alike, on
hand-written kernel-function traces whose races a guest only sometimes produces: the
tail counts lifetimes as records arrive (`ctracer.record.live_objects`), the report
once the recording is over (`ctracer.analysis.passes`)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from support.encoding import encode
from ctracer import analysis
from ctracer.decode import object_name
from ctracer.event import HEADER, PHASE_ENTRY, PHASE_EXIT, Field, FunctionRow, Layout
from ctracer.plan.lifetime_rules import LifetimeRule
from ctracer.record.tail import Tail
from ctracer.tracefile import Trace, TraceWriter

MINI = Layout.packed_in_order("ctracer__mini_t", [Field("len", "u32", 0, "uint")])
A = 0xFFFF_8880_0A35_EE00
RET_A = A - (1 << 64)   # the address as the header's signed return value carries it
ROWS = [FunctionRow(1, "rcv", route_kind="direct", route_text="param 1 skb"),
        FunctionRow(2, "consume", route_kind="direct", route_text="param 1 skb"),
        FunctionRow(3, "kfree_mem", route_kind="direct", route_text="param 1 skb"),
        FunctionRow(4, "alloc", route_kind="returns", route_text="return value")]
RULES = [LifetimeRule("t", "kfree_mem", 0, "ends", probe="function", why="kfree_mem frees it")]


def _tail_names(events) -> list[str]:
    """The object each line of the tail names, in the order printed."""
    program = SimpleNamespace(mini=MINI, nargs=0, rows=ROWS, rules=RULES, head=None,
                              args_by_row=lambda: {})
    lines = []
    tail = Tail(program, out=SimpleNamespace(write=lines.append, flush=lambda: None))
    for ts, tid, fid, phase, obj, length, retval, depth in events:
        tail(HEADER._struct().pack(ts, obj, retval, 0, 1, tid, fid, depth,
                                   PHASE_ENTRY if phase == "in" else PHASE_EXIT, 0, b"t")
             + encode(MINI, {"len": length}))
    tail.release(final=True)
    return [line.split()[1] for line in "".join(lines).splitlines()]


def _report_names(path, events) -> list[str]:
    """The object the report names at each event, in time order."""
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
    names = [object_name(key.address, key.lifetime) for key in a.objects.keys]
    return [names[o] for o in a.events.object.tolist()]


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
    # the first race as the ring delivers it when thread 2's CPU stamped alloc's exit
    # before thread 1's CPU stamped kfree_mem's but reserved its record later: the
    # report orders events by time, and so does the tail before it prints them
    "arrives-out-of-time-order": ([
        (10, 1, 2, "in", A, 1, 0, 0), (20, 1, 3, "in", A, 1, 0, 1),
        (30, 2, 4, "in", 0, 0, 0, 0), (50, 1, 3, "out", A, 1, 0, 1),
        (40, 2, 4, "out", 0, 0, RET_A, 0), (60, 1, 2, "out", A, 1, 0, 0),
        (70, 2, 1, "in", A, 2, 0, 0), (80, 2, 1, "out", A, 2, 0, 0),
        (90, 2, 3, "in", A, 2, 0, 0), (95, 2, 3, "out", A, 2, 0, 0),
        (99, 1, 1, "in", A, 3, 0, 0), (100, 1, 1, "out", A, 3, 0, 0)], (4, 6, 2)),
}


# the same calls where the probes could not keep the thread's depth (task storage busy
# on the CPU: every event says depth 0): the tail pairs the calls itself, as the report
# does, so the second end is still inside consume
RACES["ends-inside-a-call-the-probe-gave-no-depth"] = (
    [event[:-1] + (0,) for event in RACES["ends-inside-a-running-call"][0]],
    RACES["ends-inside-a-running-call"][1])


@pytest.mark.parametrize("race", sorted(RACES))
def test_tail_and_report_name_raced_lifetimes_alike(tmp_path, race):
    events, lifetimes = RACES[race]
    report = _report_names(tmp_path / "t.ctrace", events)
    assert Counter(report) == {object_name(A, n + 1): count
                               for n, count in enumerate(lifetimes)}
    tail = _tail_names(events)
    assert len(tail) == len(events)
    # the events that carry their object, in time order: named alike (an alloc's entry
    # and exit are 0x0 on the tail, the report gives them the address it returned)
    carried = [n for n, (_ts, *_, obj, _len, _ret, _depth) in
               zip(report, sorted(events)) if obj]
    assert [n for n in tail if n != "0x0"] == carried


def test_tail_prints_in_time_order_what_the_reader_says_has_all_arrived():
    """An event arriving after one stamped later is printed first; events stamped after
    the time until which the reader has delivered everything wait for a later release
    (or `MAX_WAIT_NS`, or the last release), whatever the delay between them."""
    import time

    from ctracer.record import tail as tail_module

    program = SimpleNamespace(mini=MINI, nargs=0, rows=ROWS, rules=[], head=None,
                              args_by_row=lambda: {})
    lines = []
    tail = Tail(program, out=SimpleNamespace(write=lines.append, flush=lambda: None))

    def event(ts, length):
        return (HEADER._struct().pack(ts, A, 0, 0, 1, 1, 1, 0, PHASE_ENTRY, 0, b"t")
                + encode(MINI, {"len": length}))

    def printed():
        return "".join(lines).splitlines()
    ms = 1_000_000
    now = time.monotonic_ns()
    tail(event(now - 20 * ms, 2))
    tail(event(now - 30 * ms, 1))
    tail(event(now - 5 * ms, 3))
    tail.release(delivered_before_ns=now - 10 * ms)
    assert len(printed()) == 2 and "len: 1 → 2" in printed()[1]
    tail.release()   # nothing more is known to have arrived, nor has waited long enough
    assert len(printed()) == 2
    tail(event(now - 7 * ms, 4))   # stamped before the last one waiting, arrived after
    tail.release(delivered_before_ns=now)
    assert len(printed()) == 4 and "len: 2 → 4" in printed()[2] and "len: 4 → 3" in printed()[3]
    tail(event(now - 2 * tail_module.MAX_WAIT_NS, 0))
    tail(event(now, 5))
    tail.release()   # waited long enough: printed, however late it came
    assert len(printed()) == 5 and "len: 3 → 0" in printed()[4]
    tail.release(final=True)
    assert len(printed()) == 6 and "len: 0 → 5" in printed()[5]
