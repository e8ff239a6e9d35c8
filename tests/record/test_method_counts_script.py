"""The bpftrace side of tests/vm/guest/method_counts.py (run in the 7.2 guest against
ctracer's fentry.multi): each way a function reaches the object becomes bpftrace's own
expression of the object's address, from the register argument and each step."""

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


def test_the_script_prints_entries_and_the_return_values_of_returning_functions():
    mc = _module()
    script = mc.bpftrace_script({"a": ["(uint64)arg0"], "b": ["(uint64)arg0"],
                                 "c": ["(uint64)arg1", "ret"], "d": ["ret"]})
    lines = script.splitlines()
    assert lines[0] == 'BEGIN { printf("ready\\n"); }'
    assert any(line.startswith("kprobe:a,kprobe:b {") for line in lines), script
    assert any(line.startswith("kprobe:c {") and "arg1" in line for line in lines), script
    assert any(line.startswith("kretprobe:c,kretprobe:d {") and "retval != 0" in line
               for line in lines), script
    assert "kprobe:d" not in script.replace("kretprobe:d", "")


def test_ctracer_calls_count_entries_with_objects_and_returning_functions_exits():
    """A null object (the entry of a way through the return value) is none; the 7.2 run
    of 2026-12-05 ended on one before comparing."""
    import json
    mc = _module()
    rows = [("tcp_sendmsg", "entry", "0xff01", 10), ("tcp_sendmsg", "exit", "0xff01", 11),
            ("sk_alloc", "entry", None, 12), ("sk_alloc", "exit", "0xff02", 13),
            ("inet_csk_clone", "entry", None, 14), ("inet_csk_clone", "entry", "0xff03", 14),
            ("inet_csk_clone", "exit", "0xff04", 15), ("tcp_sendmsg", "entry", "0xff01", 99),
            ("not_compared", "entry", "0xff05", 12)]
    lines = [json.dumps({"function": f, "phase": p, "object": o, "time_ns": t})
             for f, p, o, t in rows]
    ours, events = mc.ctracer_calls(lines, {"tcp_sendmsg", "sk_alloc", "inet_csk_clone"},
                                    {"sk_alloc"}, (0, 50))
    assert events == len(rows)
    assert ours == {("tcp_sendmsg", 0xFF01): 1, ("sk_alloc", 0xFF02): 1,
                    ("inet_csk_clone", 0xFF03): 1}
