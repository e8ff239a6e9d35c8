"""The bpftrace side of tests/vm/guest/method_counts.py (run in the guests against
ctracer's kprobe.multi and fentry.multi): each way a function reaches the object becomes
bpftrace's own expression of the object's address, from the register argument and each
step; functions sharing their ways are counted by one wildcard probe."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "vm" / "guest" / "method_counts.py"


def _module():
    spec = importlib.util.spec_from_file_location("method_counts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _way(function, reach, index, *steps):
    return {"function": function, "reach": reach, "param_index": index,
            "path": [{"op": op, "offset": off} for op, off in steps]}


METHODS = [
    _way("tcp_sendmsg", "direct", 0),
    _way("sock_sendmsg", "holder", 0, ("deref", 24)),            # socket->sk
    _way("skb_thing", "holder", 1, ("offset", 16), ("deref", 24)),
    _way("sk_alloc", "returns", None),
    _way("inet_csk_clone", "direct", 0), _way("inet_csk_clone", "returns", None),
    _way("far_away", "direct", 6),                                 # seventh argument
    _way("not_wanted", "direct", 0),
]


def test_each_way_is_bpftraces_own_address_expression():
    mc = _module()
    names = {m["function"] for m in METHODS} - {"not_wanted"}
    ways = mc.ways_of(METHODS, names)
    assert ways == {
        "tcp_sendmsg": ["(uint64)arg0"],
        "sock_sendmsg": ["(uint64)*(uint64 *)((uint64)arg0 + 24)"],
        "skb_thing": ["(uint64)*(uint64 *)(((uint64)arg1 + 16) + 24)"],
        "sk_alloc": ["ret"],
        "inet_csk_clone": ["(uint64)arg0", "ret"],
    }


def test_functions_sharing_their_ways_are_one_wildcard_probe_and_the_small_groups_another():
    """A big group is one bpftrace process whose ``kprobe:*`` the group's names match
    (one kprobe.multi link, one map update a call); a function reached also through its
    return value is counted at entry, one reached only so at return, in a process of its
    own whatever their number; the other small groups share one process whose wildcard
    counts every way of theirs under its number (no perf kprobe a function: those took
    longer to attach than a guest's 40 minutes)."""
    mc = _module()
    ways = {f"big{i}": ["(uint64)arg0"] for i in range(5)}
    ways.update({"c": ["(uint64)arg1", "ret"], "d": ["ret"], "e": ["ret"],
                 "f": ["(uint64)arg0", "(uint64)arg1"]})
    groups = mc.groups_of(ways)
    assert groups[("(uint64)arg0",)] == [f"big{i}" for i in range(5)]
    assert groups[("(uint64)arg1",)] == ["c"] and groups[("ret",)] == ["d", "e"]
    scripts = mc.bpftrace_scripts(groups, multi_group=5)
    assert len(scripts) == 3
    (big, names), (returns, return_names), (small, small_names) = scripts
    assert names == [f"big{i}" for i in range(5)] and small_names == ["c", "f"]
    # an entry keyed by func (with probe bpftrace makes a perf kprobe of each function the
    # wildcard matches, no kprobe.multi link), a return by probe (a kretprobe's func names
    # the caller returned into): so the kretprobe's wildcard matches the returning
    # functions only
    assert "kprobe:* { $o0 = (uint64)arg0; if ($o0 != 0) { @c[func, $o0] = count(); } }" in big
    assert return_names == ["d", "e"]
    assert "kretprobe:* { if (retval != 0) { @c[probe, (uint64)retval] = count(); } }" in returns
    assert "kretprobe" not in big + small and "probe," not in big + small
    assert "@c[func, 0, $o0]" in small and "@c[func, 1, $o1]" in small
    assert ":c" not in small and "printf(\"e " not in big + small   # no named probe, no line a call
    for script in (big, returns, small):
        assert f"args->pid == {mc.CLEAR_PID}/ {{ clear(@c)" in script
        assert f"args->pid == {mc.PRINT_PID}/ {{ printf(\"counts\\n\"); print(@c)" in script
        assert "END { clear(@c); }" in script   # no map printed at exit (it took minutes)
    assert mc.kept_ways(groups, multi_group=5) == {"c": {1}, "f": {0, 1}}


def test_bpftraces_printed_map_is_read_from_its_last_print_keeping_each_functions_ways():
    mc = _module()
    # keyed by the probe's name: in a kretprobe bpftrace 0.17's ``func`` names the caller
    # returned into (6.12 guest, 2026-12-05: sk_prot_alloc's returns came as sk_alloc's)
    text = ("ready\ncleared\ncounts\n@c[tcp_close, 1]: 9\nprinted\ncounts\n"
            "@c[kprobe:tcp_sendmsg, -131391342524416]: 3\n"
            "@c[tcp_sendmsg, -131391342524416]: 1\n"
            "@c[kretprobe:sk_alloc, 5]: 2\n@c[kretprobe:c, 1, 77]: 3\n@c[kprobe:c, 0, 77]: 5\n"
            "\nprinted\n")
    # bpftrace 0.17 prints a u64 key signed (this host, 2026-12-05): a kernel address < 0
    assert mc.parse_counts(text, {"c": {1}}) == {("tcp_sendmsg", 0xFFFF888011B3C800): 4,
                                                 ("sk_alloc", 5): 2, ("c", 77): 3}
    assert mc.parse_counts("ready\n", {}) == {}


def test_ctracer_calls_count_entries_with_objects_and_returning_functions_exits():
    """A null object (the entry of a way through the return value) is none; the 7.2 run
    of 2026-12-05 ended on one before comparing."""
    import numpy as np
    from ctracer.event import FunctionRow
    mc = _module()
    functions = {0: FunctionRow(0, "tcp_sendmsg"), 1: FunctionRow(1, "sk_alloc", route_kind="returns"),
                 2: FunctionRow(2, "inet_csk_clone", route_kind="returns"),
                 3: FunctionRow(3, "inet_csk_clone"), 4: FunctionRow(4, "not_compared")}
    rows = [(0, 0, 0xFF01, 10), (0, 1, 0xFF01, 11), (1, 0, 0, 12), (1, 1, 0xFF02, 13),
            (2, 0, 0, 14), (3, 0, 0xFF03, 14), (2, 1, 0xFF04, 15), (0, 0, 0xFF01, 99),
            (4, 0, 0xFF05, 12), (0, 0, 0xFF01, 20)]
    columns = {"function_id": np.array([r[0] for r in rows], np.int32),
               "phase": np.array([r[1] for r in rows], np.uint8),
               "object": np.array([r[2] for r in rows], np.uint64),
               "ts_ns": np.array([r[3] for r in rows], np.int64)}
    ours, events = mc.ctracer_calls(columns, functions,
                                    {"tcp_sendmsg", "sk_alloc", "inet_csk_clone"},
                                    {"sk_alloc"}, (0, 50))
    assert events == len(rows)
    assert ours == {("tcp_sendmsg", 0xFF01): 2, ("sk_alloc", 0xFF02): 1,
                    ("inet_csk_clone", 0xFF03): 1}


def test_each_ways_counts_and_the_printed_keys_are_read_from_the_last_print():
    """The shared process's counts per way (kept for a differing pair's evidence), and
    how many keys the last print had (a map that full may have refused updates)."""
    mc = _module()
    text = ("counts\n@c[c, 1, 77]: 9\nprinted\ncounts\n@c[c, 1, 77]: 3\n"
            "@c[kretprobe:c, 0, -8]: 5\n@c[tcp_ack, 77]: 2\nprinted\n")
    assert mc.parse_way_counts(text) == {("c", 1, 77): 3, ("c", 0, (1 << 64) - 8): 5}
    assert mc.printed_keys(text) == 3 and mc.printed_keys("ready\n") == 0


def test_folded_calls_count_inside_the_window_and_crossing_rows_apart():
    """``--calls changes``: a row's calls count when its first and last call are inside
    the window; a row crossing a bound is counted apart, read from neither side; a
    function reaching the object by its return value and by an argument counts the
    argument's calls only (as bpftrace counts it), a returns-only function its
    returned objects."""
    import sqlite3
    from ctracer.event import FunctionRow
    from ctracer.tracefile import folds
    mc = _module()
    db = sqlite3.connect(":memory:")
    folds.create(db)
    functions = {1: FunctionRow(1, "tcp_sendmsg"), 2: FunctionRow(2, "sk_alloc", route_kind="returns"),
                 3: FunctionRow(3, "clone", route_kind="returns"), 4: FunctionRow(4, "clone"),
                 5: FunctionRow(5, "other")}
    #      object, function, caller, caller object, calls, total, max, first, last, since
    folds.add(db, [(0xFF01, 1, 0, 0, 4, 0, 0, 100, 200, 0),
                   (0xFF01, 1, 0, 0, 2, 0, 0, 300, 900, 0),     # inside
                   (0xFF01, 1, 0, 0, 7, 0, 0, 50, 150, 0),      # crosses the start
                   (0xFF02, 2, 0, 0, 1, 0, 0, 120, 120, 0),
                   (0xFF03, 3, 0, 0, 5, 0, 0, 120, 120, 0),     # clone's return value
                   (0xFF04, 4, 0, 0, 6, 0, 0, 120, 120, 0),
                   (0xFF05, 5, 0, 0, 8, 0, 0, 120, 120, 0),     # not compared
                   (0xFF01, 1, 0, 0, 9, 0, 0, 2000, 3000, 0)])  # after
    inside, crossing = mc.folded_calls(folds.read(db), functions, {"tcp_sendmsg", "sk_alloc", "clone"},
                                       {"sk_alloc"}, (100, 1000))
    assert inside == {("tcp_sendmsg", 0xFF01): 6, ("sk_alloc", 0xFF02): 1, ("clone", 0xFF04): 6}
    assert crossing == 7
