"""Each pass of `ctracer.analysis` on its own, on small hand-written traces whose
answers are worked out in the comments."""

from encoding import encode
from ctracer import analysis
from ctracer.analysis import passes
from ctracer.analysis.functions import function_table
from ctracer.analysis.model import NO_DURATION, ObjectKey
from ctracer.event import FLAG_READ_FAILED, PHASE_ENTRY, PHASE_EXIT, Field, Layout
from ctracer.tracefile import FunctionRow, Trace, TraceWriter

MINI = Layout.packed_in_order("ctracer__mini_t", [Field("count", "s32", 0, "int")])
A = 0x7F00_1000


def trace_of(path, functions, events):
    """functions: (id, name, reach); events: (seq order) (ts, tid, fid, "in"/"out",
    object, count or None, retval, flags)."""
    w = TraceWriter(str(path))
    w.set_meta(struct_name="t", struct_kind="struct", mini_layout=MINI.to_json())
    w.add_functions([FunctionRow(fid, name, reach=reach, attached="entry,exit")
                     for fid, name, reach in functions])
    for ts, tid, fid, phase, obj, count, *rest in events:
        w.add_event(ts_ns=ts, cpu=0, pid=1, tid=tid, comm="t", function_id=fid,
                    phase=PHASE_ENTRY if phase == "in" else PHASE_EXIT, object=obj,
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
    assert pairing.lifetime_at == {0: 1}
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
