"""Each pass of `ctracer.analysis` on its own, on small hand-written traces whose
answers are worked out in the comments."""

from support.encoding import encode
from ctracer import analysis
from ctracer.analysis import passes
from ctracer.analysis.functions import function_table
from ctracer.analysis.model import NO_DURATION, ObjectKey
from ctracer.event import (FLAG_READ_FAILED, PHASE_ENTRY, PHASE_EXIT, PHASE_TRACEPOINT, Field,
                           Layout)
from ctracer.tracefile import Trace, TraceWriter
from ctracer.event import FunctionRow

MINI = Layout.packed_in_order("ctracer__mini_t", [Field("count", "s32", 0, "int")])
A = 0x7F00_1000


PHASES = {"in": PHASE_ENTRY, "out": PHASE_EXIT, "tp": PHASE_TRACEPOINT}


def trace_of(path, functions, events, lifetime_rules=None):
    """functions: (id, name, reach); events: (seq order) (ts, tid, fid, "in"/"out"/"tp",
    object, count or None, retval, flags)."""
    w = TraceWriter(str(path))
    w.set_meta(struct_name="t", struct_kind="struct", mini_layout=MINI.to_json())
    if lifetime_rules is not None:
        w.set_meta(lifetime_rules=lifetime_rules)
    w.add_functions([FunctionRow(fid, name, route_kind=reach, attached="entry,exit")
                     for fid, name, reach in functions])
    for ts, tid, fid, phase, obj, count, *rest in events:
        w.add_event(ts_ns=ts, cpu=0, pid=1, tid=tid, comm="t", function_id=fid,
                    phase=PHASES[phase], object=obj,
                    retval=rest[0] if rest else None, depth=0,
                    flags=rest[1] if len(rest) > 1 else 0,
                    snapshot=None if count is None else encode(MINI, {"count": count}))
    w.close()
    return Trace(str(path))


FUNCS = [(1, "outer", "direct"), (2, "inner", "direct"), (3, "make", "returns"),
         (4, "outer", "holder")]


def test_function_table_joins_slots_and_spots_creators(tmp_path):
    t = trace_of(tmp_path / "t", FUNCS + [(5, "sk_lookup", "returns")], [])
    fns = function_table(t.functions)
    assert fns.canon[4] == 1 and fns.canon[2] == 2  # outer's holder row is outer
    assert fns.creators == {3}                      # a lookup returns what exists
    assert not fns.use_names
    assert fns.name(99) == "function#99"


def test_read_events_puts_rows_in_time_order(tmp_path):
    # recorded out of time order (two CPUs): seq 1 at ts 20, seq 2 at ts 10
    t = trace_of(tmp_path / "t", FUNCS, [(20, 1, 1, "in", A, 1), (10, 2, 2, "in", A, 2)])
    ev = passes.read_events(t, function_table(t.functions))
    assert ev.columns["ts_ns"].tolist() == [10, 20]
    assert ev.columns["seq"].tolist() == [2, 1]
    assert ev.columns["object"].tolist() == [A, A] and len(ev.columns["snapshots"]) == 2
    assert ev.columns["snapshots"][0].tobytes() == encode(MINI, {"count": 2})


def test_pair_calls_depths_callers_durations(tmp_path):
    # outer( inner() ) on one thread; an inner exit on thread 2 without its entry
    t = trace_of(tmp_path / "t", FUNCS, [
        (10, 1, 1, "in", A, 0), (20, 1, 2, "in", A, 0), (35, 1, 2, "out", A, 0),
        (50, 1, 1, "out", A, 0), (60, 2, 2, "out", A, 0)])
    fns = function_table(t.functions)
    pairing = passes.pair_calls(passes.read_events(t, fns), fns)
    assert pairing.depth.tolist() == [0, 1, 1, 0, 0]
    assert pairing.caller[1] == 1 and pairing.caller[0] == -1
    assert pairing.duration_ns.tolist() == [NO_DURATION, NO_DURATION, 15, 40, NO_DURATION]
    assert pairing.unmatched_exits == 1 and not pairing.matched[4]
    assert len(pairing.frame_function) == 2 and pairing.frame.tolist() == [0, 1, 1, 0, -1]


def test_pair_calls_resolves_an_object_known_at_exit(tmp_path):
    # make() returns A: its entry had no object, its exit's return value is the object
    t = trace_of(tmp_path / "t", FUNCS, [(10, 1, 3, "in", 0, None), (20, 1, 3, "out", 0, 5, A)])
    fns = function_table(t.functions)
    pairing = passes.pair_calls(passes.read_events(t, fns), fns)
    assert pairing.address.tolist() == [A, A]
    assert pairing.lifetime_at.tolist() == [1, -1]  # the entry takes its exit's lifetime
    assert pairing.lifetimes.first_reason[A] == "returned by make"


def test_count_calls_one_call_per_frame_and_drops_repeated_slots(tmp_path):
    # outer reaches A two ways (slots 1 and 4): one call, one row per phase kept;
    # the unreadable row is the one dropped
    t = trace_of(tmp_path / "t", FUNCS, [
        (10, 1, 1, "in", A, None, None, FLAG_READ_FAILED), (11, 1, 4, "in", A, 1),
        (20, 1, 1, "out", A, 1), (21, 1, 4, "out", A, 1), (30, 1, 2, "in", A, 1)])
    fns = function_table(t.functions)
    events = passes.read_events(t, fns)
    pairing = passes.pair_calls(events, fns)
    counts = passes.count_calls(events, pairing, fns)
    assert counts.methods[1].calls == 1 and counts.methods[1].durations.tolist() == [10]
    assert counts.duplicate.nonzero()[0].tolist() == [0, 3]
    assert counts.unfinished == 1 and not pairing.matched[4]  # inner never returned


def test_assign_objects_splits_lifetimes_at_creation(tmp_path):
    # A used, then make() hands A out again: two objects
    t = trace_of(tmp_path / "t", FUNCS, [
        (10, 1, 1, "in", A, 1), (20, 1, 1, "out", A, 2),
        (30, 1, 3, "in", 0, None), (40, 1, 3, "out", 0, 0, A), (50, 1, 2, "in", A, 0)])
    fns = function_table(t.functions)
    events = passes.read_events(t, fns)
    pairing = passes.pair_calls(events, fns)
    counts = passes.count_calls(events, pairing, fns)
    found = passes.assign_objects(pairing, counts.duplicate)
    assert found.keys == [ObjectKey(A, 1), ObjectKey(A, 2)]
    assert found.object.tolist() == [0, 0, 1, 1, 1]
    assert found.started_by[1] == "returned by make"
    assert found.null_events == 0


def test_find_changes_attributes_to_the_exiting_function_or_the_caller(tmp_path):
    # outer(count 0) changes count to 1 before calling inner (seen at inner's entry:
    # the caller did it), inner makes it 2 (seen at inner's exit: during inner)
    t = trace_of(tmp_path / "t", FUNCS, [
        (10, 1, 1, "in", A, 0), (20, 1, 2, "in", A, 1), (30, 1, 2, "out", A, 2),
        (40, 1, 1, "out", A, 2)])
    a = analysis.load(t)
    ch = a.changes
    assert [(a.values.decode_one(0, o), a.values.decode_one(0, n), a.function_name(f),
             a.cause(k)) for k, (o, n, f) in enumerate(zip(ch.old, ch.new, ch.function))] == [
        (0, 1, "outer", "caller"), (1, 2, "inner", "during")]
    assert a.series(0)["count"] == ([0, 10, 20], [0, 1, 2])
    assert a.methods[1].changed_fields == 1 and a.methods[2].changed_fields == 1


def test_a_tracepoint_is_not_the_function_of_its_name():
    """consume_skb is both a tracepoint and a function of the kernel: two functions of
    the report, each with its own name (once, the function's calls were shown as the
    tracepoint's)."""
    rows = {1: FunctionRow(1, "consume_skb", "", "tracepoint", "struct sk_buff (param 1)"),
            2: FunctionRow(2, "__kfree_skb", "", "direct", "param 1"),
            3: FunctionRow(3, "consume_skb", "", "direct", "param 1"),
            4: FunctionRow(4, "consume_skb", "", "holder", "x->skb (param 2)")}
    table = function_table(rows)
    assert table.canon == {1: 1, 2: 2, 3: 3, 4: 3}
    assert [table.name(i) for i in (1, 2, 3, 4)] == ["tp:consume_skb", "__kfree_skb",
                                                    "consume_skb", "consume_skb"]


def _lifetimes(t):
    """{lifetime: [event times]} of the one address, and each lifetime's start reason."""
    a = analysis.load(t)
    times, why = {}, {}
    for o, key in enumerate(a.objects.keys):
        times[key.lifetime] = a.events.ts_ns[a.objects.events(o)].tolist()
        why[key.lifetime] = a.objects.started_by[o]
    return times, why


FREES = [{"function": "kfree_mem", "probe": "function", "effect": "ends",
          "rule": "t: kfree_mem frees it"},
         {"function": "dropped", "probe": "tracepoint", "effect": "ends",
          "rule": "t: dropped ends it"}]
RCV = [(1, "rcv", "direct"), (2, "kfree_partial", "direct"), (3, "kfree_mem", "direct"),
       (4, "make", "returns"), (5, "release", "direct"), (6, "dropped", "tracepoint")]


def test_a_freeing_functions_exit_ends_the_life_once_its_callers_return(tmp_path):
    # rcv( kfree_partial( kfree_mem() ) ) frees A; the exits of the calls it ran inside
    # are still the freed buffer's; the next rcv taking A is another buffer
    t = trace_of(tmp_path / "t", RCV, [
        (10, 1, 1, "in", A, 1), (20, 1, 2, "in", A, 1), (30, 1, 3, "in", A, 1),
        (40, 1, 3, "out", A, 1), (50, 1, 2, "out", A, 1), (60, 1, 1, "out", A, 1),
        (70, 1, 1, "in", A, 5), (80, 1, 1, "out", A, 5)], FREES)
    times, why = _lifetimes(t)
    assert times == {1: [10, 20, 30, 40, 50, 60], 2: [70, 80]}
    assert why[2] == "after t: kfree_mem frees it"


def test_a_free_named_like_one_but_not_a_rule_ends_nothing(tmp_path):
    # the same calls without the rule: one buffer (tcp_stream_memory_free frees nothing)
    t = trace_of(tmp_path / "t", RCV, [
        (10, 1, 1, "in", A, 1), (20, 1, 3, "in", A, 1), (30, 1, 3, "out", A, 1),
        (40, 1, 1, "out", A, 1), (50, 1, 1, "in", A, 1), (60, 1, 1, "out", A, 1)], [])
    assert list(_lifetimes(t)[0]) == [1]


def test_a_tracepoint_end_keeps_the_rest_of_the_freeing_call(tmp_path):
    # rcv( dropped-tracepoint, release(), kfree_mem() ): release and kfree_mem run inside
    # the call the tracepoint fired in, so they are the ended buffer's; a call on another
    # thread after the end is a new buffer's
    t = trace_of(tmp_path / "t", RCV, [
        (10, 1, 1, "in", A, 1), (15, 1, 6, "tp", A, 1), (20, 1, 5, "in", A, 1),
        (25, 1, 5, "out", A, 1), (30, 1, 3, "in", A, 1), (35, 1, 3, "out", A, 1),
        (40, 1, 1, "out", A, 1), (50, 2, 1, "in", A, 7), (60, 2, 1, "out", A, 7)], FREES)
    times, _ = _lifetimes(t)
    assert times == {1: [10, 15, 20, 25, 30, 35, 40], 2: [50, 60]}


def test_an_address_allocated_again_while_the_free_returns_is_not_ended_twice(tmp_path):
    # thread 1 frees A in kfree_mem inside kfree_partial; before kfree_partial returns,
    # thread 2's make() hands A out again: that is one new buffer, whatever thread 1's
    # exits do after
    t = trace_of(tmp_path / "t", RCV, [
        (10, 1, 2, "in", A, 1), (20, 1, 3, "in", A, 1), (30, 1, 3, "out", A, 1),
        (35, 2, 4, "in", 0, None), (40, 2, 4, "out", 0, 0, A), (45, 1, 2, "out", A, 1),
        (50, 2, 1, "in", A, 2), (60, 2, 1, "out", A, 3)], FREES)
    times, _ = _lifetimes(t)
    assert sorted(times) == [1, 2]
    assert times[2] == [35, 40, 50, 60]
