"""The analysis stage: call pairing, durations, lifetimes of reused addresses, field
changes and who made them — checked against a simulation's own record of what it did,
and against small hand-written traces whose answers are worked out in the comments."""

from support.encoding import encode
import pytest

from ctracer.event import FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY, PHASE_EXIT, Field, Layout
from support.analysis_view import view_of
from ctracer.analysis.model import CAUSE_CALLER, CAUSE_DURING, CAUSE_OUTSIDE, ObjectKey
from support.synthetic_trace import write_synthetic_trace
from ctracer.report.values import ValueFormatter
from ctracer.tracefile import Trace, TraceWriter
from ctracer.event import FunctionRow

MINI = Layout.packed_in_order("ctracer__mini_t", [
    Field("state", "u8", 0, "enum", ((1, "UP"), (2, "DOWN"))),
    Field("count", "s32", 0, "int"),
])
A, B = 0x7F00_1000, 0x7F00_2000


def write_trace(path, functions, events, mini=MINI):
    """functions: (id, name, reach); events: (ts, tid, function id, "in"/"out", object,
    values or None, retval, flags) — seq follows the list order."""
    w = TraceWriter(str(path))
    w.set_meta(struct_name="t", struct_kind="struct", mini_layout=mini.to_json())
    w.add_functions([FunctionRow(fid, name, route_kind=reach, attached="entry,exit")
                     for fid, name, reach in functions])
    for ts, tid, fid, phase, obj, values, *rest in events:
        retval = rest[0] if rest else None
        flags = rest[1] if len(rest) > 1 else 0
        w.add_event(ts_ns=ts, cpu=0, pid=1, tid=tid, comm="t", function_id=fid,
                    phase=PHASE_ENTRY if phase == "in" else PHASE_EXIT, object=obj,
                    retval=retval, depth=0, flags=flags,
                    snapshot=None if values is None else encode(mini, values))
    w.close()
    return view_of(Trace(str(path)))


def up(count=0):
    return {"state": 1, "count": count}


# ----------------------------------------------------------------- against a simulation

@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    path = tmp_path_factory.mktemp("sim") / "sim.ctrace"
    truth = write_synthetic_trace(str(path), threads=3, lifecycles=4, sends=6,
                                  addresses_per_thread=2, seed=7)
    return truth, view_of(Trace(str(path)))


def test_every_change_found_with_its_author(simulated):
    truth, report = simulated
    found = sorted((c.obj.address, c.obj.lifetime, c.field, str(c.old), str(c.new), c.function)
                   for o in report.objects for c in o.changes)
    expected = sorted((c.address, c.lifetime, c.field, str(c.old), str(c.new), c.function)
                      for c in truth.changes)
    assert len(expected) > 100
    assert found == expected


def test_each_reuse_of_an_address_is_a_new_object(simulated):
    truth, report = simulated
    assert {(o.key.address, o.key.lifetime) for o in report.objects} == set(truth.lifetimes)
    reused = [o for o in report.objects if o.key.lifetime > 1]
    assert reused and all(o.started_by == "returned by sk_alloc" for o in reused)
    assert all(o.dirname == f"0x{o.key.address:x}-{o.key.lifetime}" for o in reused)
    assert len({o.dirname for o in report.objects}) == len(report.objects)


def test_call_counts_and_durations(simulated):
    truth, report = simulated
    by_name = {m.name: m for m in report.methods.values()}
    assert {n: m.calls for n, m in by_name.items()} == truth.calls
    for name, durations in truth.durations.items():
        assert sorted(by_name[name].durations) == sorted(durations), name
    assert report.unmatched_exits == report.unfinished_calls == 0
    assert report.null_object_events == 0


def test_rows_are_in_time_order_and_objects_keep_their_threads(simulated):
    _, report = simulated
    times = [r.ts_ns for r in report.rows]
    assert times == sorted(times)
    for obj in report.objects:
        assert len(obj.threads) == 1  # the simulation gives each address to one thread


# ----------------------------------------------------------------- hand-written traces

def test_pairing_depths_and_durations(tmp_path):
    # f(A) { g(A) { h(B) } g(A) }: h works on another object, so on A's page g's calls sit
    # one level under f while the thread nesting puts h two levels down
    report = write_trace(tmp_path / "t", [(1, "f", "direct"), (2, "g", "direct"),
                                          (3, "h", "direct")], [
        (100, 5, 1, "in", A, up()),
        (110, 5, 2, "in", A, up()),
        (120, 5, 3, "in", B, up()),
        (150, 5, 3, "out", B, up()),
        (170, 5, 2, "out", A, up()),
        (180, 5, 2, "in", A, up()),
        (185, 5, 2, "out", A, up()),
        (200, 5, 1, "out", A, up()),
    ])
    rows = report.rows
    assert [r.depth for r in rows] == [0, 1, 2, 2, 1, 1, 1, 0]
    assert [r.object_depth for r in rows] == [0, 1, 0, 0, 1, 1, 1, 0]
    assert [r.duration_ns for r in rows if r.phase == PHASE_EXIT] == [30, 60, 5, 100]
    assert rows[2].caller_id == 2 and rows[0].caller_id == -1
    f = next(m for m in report.methods.values() if m.name == "f")
    g = next(m for m in report.methods.values() if m.name == "g")
    assert (f.calls, f.durations.tolist(), g.calls, sorted(g.durations.tolist())) == (1, [100], 2, [5, 60])


def test_lost_exit_and_exit_without_entry(tmp_path):
    # f { g { ...g's exit lost... } f's exit }, then an exit of g whose entry was not seen
    report = write_trace(tmp_path / "t", [(1, "f", "direct"), (2, "g", "direct")], [
        (100, 5, 1, "in", A, up()),
        (110, 5, 2, "in", A, up()),
        (150, 5, 1, "out", A, up()),
        (160, 5, 2, "out", 0, None, 0, FLAG_NO_ENTRY),
    ])
    rows = report.rows
    assert rows[1].matched is False            # g's entry: no exit seen
    assert rows[2].duration_ns == 50 and rows[2].depth == 0
    assert rows[3].matched is False and rows[3].duration_ns is None
    assert (report.unfinished_calls, report.unmatched_exits, report.null_object_events) == (1, 1, 1)
    g = next(m for m in report.methods.values() if m.name == "g")
    assert g.calls == 2 and g.durations.tolist() == []


def test_threads_are_paired_separately(tmp_path):
    # two threads interleave calls of the same function on different objects
    report = write_trace(tmp_path / "t", [(1, "f", "direct")], [
        (100, 1, 1, "in", A, up()),
        (105, 2, 1, "in", B, up()),
        (130, 1, 1, "out", A, up()),
        (190, 2, 1, "out", B, up()),
    ])
    assert [r.duration_ns for r in report.rows] == [None, None, 30, 85]
    assert [r.depth for r in report.rows] == [0, 0, 0, 0]


def test_recording_order_is_not_time_order(tmp_path):
    # per-CPU buffers are drained one after the other: seq order differs from time order
    report = write_trace(tmp_path / "t", [(1, "f", "direct")], [
        (130, 1, 1, "out", A, up(1)),
        (100, 1, 1, "in", A, up(0)),
    ])
    assert [r.ts_ns for r in report.rows] == [100, 130]
    assert report.rows[1].duration_ns == 30
    (change,) = report.objects[0].changes
    assert (change.field, change.old, change.new, change.function) == ("count", 0, 1, "f")


def test_who_changed_a_field(tmp_path):
    # f's exit shows its own change; g's entry shows what its caller f did before calling
    # it; h's entry with nothing traced running shows a change made outside traced code
    report = write_trace(tmp_path / "t", [(1, "f", "direct"), (2, "g", "direct"),
                                          (3, "h", "direct")], [
        (100, 5, 1, "in", A, up(0)),
        (110, 5, 2, "in", A, up(1)),       # f did count 0 -> 1 before calling g
        (120, 5, 2, "out", A, up(1)),
        (130, 5, 1, "out", A, {"state": 2, "count": 1}),   # f: UP -> DOWN
        (140, 5, 3, "in", A, {"state": 2, "count": 5}),    # outside: 1 -> 5
        (150, 5, 3, "out", A, {"state": 2, "count": 5}),
    ])
    got = [(c.field, c.old, c.new, c.function, c.cause, c.seen_at)
           for c in report.objects[0].changes]
    assert got == [("count", 0, 1, "f", CAUSE_CALLER, "g"),
                   ("state", 1, 2, "f", CAUSE_DURING, "f"),
                   ("count", 1, 5, None, CAUSE_OUTSIDE, "h")]
    rows = report.rows
    assert [bool(r.changes) for r in rows] == [False, True, False, True, True, False]
    assert report.objects[0].series["count"] == [(0, 0), (10, 1), (40, 5)]
    assert report.objects[0].changed_fields == ["state", "count"]
    f = next(m for m in report.methods.values() if m.name == "f")
    assert f.changed_fields == 2


def test_unreadable_snapshots_are_skipped_not_compared(tmp_path):
    report = write_trace(tmp_path / "t", [(1, "f", "direct")], [
        (100, 5, 1, "in", A, up(1)),
        (110, 5, 1, "out", A, up(0), 0, FLAG_READ_FAILED),
        (120, 5, 1, "in", A, up(2)),
        (130, 5, 1, "out", A, up(2)),
    ])
    obj = report.objects[0]
    assert obj.unreadable == 1 and report.rows[1].unreadable
    assert [(c.old, c.new, c.seen_at, c.cause) for c in obj.changes] == [(1, 2, "f", CAUSE_OUTSIDE)]


def test_creation_function_starts_a_new_lifetime(tmp_path):
    # alloc returns A (its entry has no object yet), A is used and freed; alloc hands out
    # A again: a second object.  A lookup returning A does not start a third one.
    fns = [(1, "obj_alloc", "returns"), (2, "obj_use", "direct"), (3, "obj_free", "direct"),
           (4, "obj_lookup", "returns")]
    report = write_trace(tmp_path / "t", fns, [
        (100, 5, 1, "in", 0, None),
        (110, 5, 1, "out", A, up(0), A),
        (120, 5, 2, "in", A, up(0)),
        (130, 5, 2, "out", A, up(3)),
        (140, 5, 3, "in", A, up(3)),
        (150, 5, 3, "out", A, up(3)),
        (200, 5, 1, "in", 0, None),
        (210, 5, 1, "out", A, up(3), A),
        (220, 5, 4, "in", 0, None),
        (230, 5, 4, "out", A, up(4), A),
        (240, 5, 2, "in", A, up(4)),
        (250, 5, 2, "out", A, up(4)),
    ])
    keys = [o.key for o in report.objects]
    assert keys == [ObjectKey(A, 1), ObjectKey(A, 2)]
    first, second = report.objects
    assert [r.ts_ns for r in first.rows] == [100, 110, 120, 130, 140, 150]
    assert [r.ts_ns for r in second.rows] == [200, 210, 220, 230, 240, 250]
    assert first.started_by == second.started_by == "returned by obj_alloc"
    # one name for an object, shown and as its folder
    assert (first.label, second.label) == (f"0x{A:x}", f"0x{A:x}-2")
    assert (first.dirname, second.dirname) == (f"0x{A:x}", f"0x{A:x}-2")
    # the second object starts from what it first showed: no change from the first one
    assert [(c.old, c.new) for c in second.changes] == [(3, 4)]
    assert report.rows[0].obj == ObjectKey(A, 1)  # the alloc entry belongs to its object


def test_nested_creation_functions_make_one_lifetime(tmp_path):
    # sk_alloc { sk_prot_alloc returns A; sock_init(A) } returns A — after A was freed
    fns = [(1, "sk_alloc", "returns"), (2, "sk_prot_alloc", "returns"),
           (3, "sock_init", "direct"), (4, "sk_free", "direct")]
    report = write_trace(tmp_path / "t", fns, [
        (10, 5, 4, "in", A, up()),
        (20, 5, 4, "out", A, up()),
        (100, 5, 1, "in", 0, None),
        (110, 5, 2, "in", 0, None),
        (120, 5, 2, "out", A, up(), A),
        (130, 5, 3, "in", A, up()),
        (140, 5, 3, "out", A, up(1)),
        (150, 5, 1, "out", A, up(1), A),
    ])
    assert [o.key.lifetime for o in report.objects] == [1, 2]
    second = report.objects[1]
    assert [r.ts_ns for r in second.rows] == [100, 110, 120, 130, 140, 150]
    assert [r.object_depth for r in second.rows] == [0, 1, 1, 1, 1, 0]
    assert second.started_by == "returned by sk_alloc"


def test_names_decide_lifetimes_when_no_creation_function_was_traced(tmp_path):
    fns = [(1, "foo_new", "direct"), (2, "foo_free", "direct"), (3, "foo_poke", "direct")]
    report = write_trace(tmp_path / "t", fns, [
        (100, 5, 1, "in", A, up()), (110, 5, 1, "out", A, up()),
        (120, 5, 2, "in", A, up()), (130, 5, 2, "out", A, up()),
        (140, 5, 3, "in", A, up()), (150, 5, 3, "out", A, up()),  # use after free: same
        (160, 5, 1, "in", A, up()), (170, 5, 1, "out", A, up()),
    ])
    assert [(o.key.lifetime, len(o.rows)) for o in report.objects] == [(1, 6), (2, 2)]
    assert "by name" in report.lifetime_rule
    assert report.objects[1].started_by == "foo_new after foo_free (by name)"


def test_one_call_reaching_objects_several_ways(tmp_path):
    # A function with several table rows (a holder and a direct parameter; two
    # parameters) emits one event per row, one after the other: that is one call.
    # f(A) { sock_init_data(sock whose sk is still NULL, A); sk_clone(B, A) }
    fns = [(1, "sock_init_data", "holder"), (2, "sock_init_data", "direct"),
           (3, "sk_clone", "direct"), (4, "sk_clone", "direct"), (5, "f", "direct")]
    report = write_trace(tmp_path / "t", fns, [
        (100, 5, 5, "in", A, up()),
        (110, 5, 1, "in", 0, None, None, FLAG_READ_FAILED),
        (111, 5, 2, "in", A, up()),
        (120, 5, 1, "out", A, up(1)),
        (121, 5, 2, "out", A, up(1)),
        (130, 5, 3, "in", B, up()),
        (131, 5, 4, "in", A, up(1)),
        (140, 5, 3, "out", B, up(2)),
        (141, 5, 4, "out", A, up(1)),
        (150, 5, 5, "out", A, up(1)),
    ])
    assert (report.unmatched_exits, report.unfinished_calls) == (0, 0)
    a, b = report.objects
    # on A's page each call shows once, by its readable event
    assert [(r.ts_ns, r.object_depth) for r in a.rows] == [
        (100, 0), (111, 1), (120, 1), (131, 1), (141, 1), (150, 0)]
    assert not any(r.unreadable for r in a.rows)
    assert [r.ts_ns for r in b.rows] == [130, 140]
    calls = {m.name: (m.calls, m.durations.tolist()) for m in report.methods.values()}
    assert calls == {"f": (1, [50]), "sock_init_data": (1, [10]), "sk_clone": (1, [10])}
    assert [(c.field, c.new, c.function) for c in a.changes] == [("count", 1, "sock_init_data")]
    assert [(c.field, c.new, c.function) for c in b.changes] == [("count", 2, "sk_clone")]


def test_recursion_is_not_mistaken_for_a_second_slot(tmp_path):
    report = write_trace(tmp_path / "t", [(1, "walk", "direct")], [
        (100, 5, 1, "in", A, up()),
        (110, 5, 1, "in", A, up()),
        (120, 5, 1, "out", A, up()),
        (150, 5, 1, "out", A, up()),
    ])
    assert [r.depth for r in report.rows] == [0, 1, 1, 0]
    assert [r.duration_ns for r in report.rows] == [None, None, 10, 50]
    assert report.methods[1].calls == 2


def test_error_pointers_are_not_objects(tmp_path):
    fns = [(1, "obj_alloc", "returns")]
    report = write_trace(tmp_path / "t", fns, [
        (100, 5, 1, "in", 0, None),
        (110, 5, 1, "out", 0, None, -12),  # ERR_PTR(-ENOMEM)
    ])
    assert report.objects == [] and report.null_object_events == 2


# ----------------------------------------------------------------- value display

def test_values_are_shown_by_kind():
    layout = Layout.packed_in_order("ctracer__mini_v", [
        Field("state", "u8", 0, "enum", ((1, "TCP_ESTABLISHED"), (7, "TCP_CLOSE"))),
        Field("ptr", "u64", 0, "pointer"), Field("flag", "u8", 0, "bool"),
        Field("c", "u8", 0, "char"), Field("name", "char[8]", 0, "text"),
        Field("n", "s32", 0, "int"), Field("x", "double", 0, "float")])
    fmt = ValueFormatter(layout)
    assert fmt.show("state", 7) == "TCP_CLOSE" and fmt.show("state", 3) == "3"
    assert fmt.show("ptr", 0) == "NULL" and fmt.show("ptr", 0xFFFF8880DEAD) == "0xffff8880dead"
    assert (fmt.show("flag", 1), fmt.show("flag", 0)) == ("true", "false")
    assert (fmt.show("c", 97), fmt.show("c", 0)) == ("'a'", "'\\x00'")
    assert fmt.show("name", "eth0") == "'eth0'"
    assert (fmt.show("n", -4), fmt.show("x", 0.5)) == ("-4", "0.5")
    numbers, ticks = fmt.plot_axis("state", [7, 1, 7])
    assert [dict(ticks)[n] for n in numbers] == ["TCP_CLOSE", "TCP_ESTABLISHED", "TCP_CLOSE"]
    numbers, ticks = fmt.plot_axis("ptr", [0, 0x1000, 0])
    assert [dict(ticks)[n] for n in numbers] == ["NULL", "0x1000", "NULL"]


def test_ports_and_addresses_climb_the_plot_as_their_shown_values_do():
    """__be16 ports and __be32 addresses are read little-endian (33119 is raw 0x5f81):
    placed by their host-order value, 33119 sits below 38934 (raw 0x1698 would put it
    above), and many ports get a numeric axis in host order."""
    layout = Layout.packed_in_order("ctracer__mini_n", [
        Field("dport", "u16", 0, "uint", source={"ctype": "__be16"}),
        Field("daddr", "u32", 0, "uint", source={"ctype": "__be32"})])
    fmt = ValueFormatter(layout)
    raw_33119, raw_38934 = 0x5F81, 0x1698
    numbers, ticks = fmt.plot_axis("dport", [raw_33119, raw_38934])
    assert numbers[0] < numbers[1]
    assert [dict(ticks)[n] for n in numbers] == ["33119 (0x5f81)", "38934 (0x1698)"]
    many = [int.from_bytes(p.to_bytes(2, "big"), "little") for p in range(1000, 1010)]
    numbers, ticks = fmt.plot_axis("dport", many)
    assert ticks is None and numbers == [float(p) for p in range(1000, 1010)]
    loopback, ten = 0x0100007F, 0x0100000A          # 127.0.0.1, 10.0.0.1 as read
    numbers, ticks = fmt.plot_axis("daddr", [loopback, ten])
    assert numbers[1] < numbers[0]
    assert [dict(ticks)[n] for n in numbers][1].startswith("10.0.0.1")


def test_unique_pairs_is_numpys_unique_of_rows():
    """The same pairs, order, first positions and counts as numpy's row-wise unique,
    callers of -1 (none) and large ids included."""
    import numpy as np

    from ctracer.analysis.model import unique_pairs

    rng = np.random.default_rng(7)
    high = rng.integers(-1, 40, 5000).astype(np.int32)
    low = rng.integers(0, 30, 5000).astype(np.int32)
    low[::97] = 2**31 - 1
    rows, first, counts = np.unique(np.stack([high, low], 1).astype(np.int64), axis=0,
                                    return_index=True, return_counts=True)
    got_high, got_low, got_first, got_counts = unique_pairs(high, low)
    assert got_high.tolist() == rows[:, 0].tolist()
    assert got_low.tolist() == rows[:, 1].tolist()
    assert got_first.tolist() == first.tolist()
    assert got_counts.tolist() == counts.tolist()
    empty = unique_pairs(high[:0], low[:0])
    assert [len(a) for a in empty] == [0, 0, 0, 0]


def test_method_percentiles_from_one_sort():
    import numpy as np
    from ctracer.analysis.model import MethodStats

    rng = np.random.default_rng(2)
    for n in (1, 2, 19, 20, 101):
        d = rng.integers(1, 10**6, n)
        stats = MethodStats(1, "f", durations=d)
        ordered = sorted(d.tolist())
        assert stats.percentiles(0, 50, 95, 100) == [
            ordered[0], ordered[n // 2], ordered[min(n - 1, int(0.95 * n))], ordered[-1]]
        assert stats.percentile(95) == ordered[min(n - 1, int(0.95 * n))]
    assert MethodStats(1, "f").percentiles(50, 95) == [None, None]
