"""A store a tracepoint announces before it happens (`ctracer.plan.stores`:
``inet_sock_set_state`` fires before ``sk_state`` is written) is shown on the
announcing row, in the report, the exports and ``--tail`` alike; the next snapshot
showing the stored value changes nothing; and changes are credited (``changed_by``) to
the tracepoint when no traced call ran."""

from support.encoding import encode
from ctracer.event import PHASE_TRACEPOINT
from ctracer.plan import stores
from support.analysis_view import view_of
from ctracer.analysis.model import CAUSE_ANNOUNCED
from ctracer.tracefile import Trace, TraceWriter
from ctracer.event import FunctionRow
from test_kernel_values import MINI, RULE, SK, LOOPBACK, PORT_8080

ANNOUNCED = [r.to_json() for r in stores.RULES if r.tracepoint == "inet_sock_set_state"]


def _trace(path, announced=True):
    """A listener and what the kernel shows of it: each inet_sock_set_state hit still
    holds the old state, the next hit (tcp_probe here) the new one."""
    w = TraceWriter(str(path))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               lifetime_rules=[RULE], traced="kernel",
               **({"announced_stores": ANNOUNCED} if announced else {}))
    w.add_functions([FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint",
                                 attached="tracepoint"),
                     FunctionRow(2, "tcp_probe", route_kind="tracepoint", attached="tracepoint")])

    def snap(state, err=0):
        return encode(MINI, {"__sk_common.skc_state": state, "__sk_common.skc_daddr": LOOPBACK,
                            "__sk_common.skc_dport": PORT_8080, "sk_err": err, "sk_flags": 0})
    events = [  # (ts, function, snapshot state, err, args)
        (10, 1, 7, 0, {"oldstate": 7, "newstate": 2}),   # CLOSE → SYN_SENT announced
        (20, 2, 2, 0, None),                              # the store seen: no change here
        (30, 1, 2, 0, {"oldstate": 2, "newstate": 1}),   # SYN_SENT → ESTABLISHED announced
        (40, 2, 7, 104, None),                            # moved on: ESTABLISHED → CLOSE
    ]
    for ts, fid, state, err, args in events:
        w.add_event(ts_ns=ts * 1000, cpu=0, pid=0, tid=0, comm="swapper/0", function_id=fid,
                    phase=PHASE_TRACEPOINT, object=SK, retval=None, depth=0, flags=0,
                    snapshot=snap(state, err), args=args)
    w.close()


def _state_changes(obj):
    return [(c.seq, c.old, c.new, c.cause, c.seen_at) for c in obj.changes
            if c.field == "__sk_common.skc_state"]


def test_an_announced_store_is_shown_on_the_announcing_row(tmp_path):
    _trace(tmp_path / "a.ctrace")
    data = view_of(Trace(str(tmp_path / "a.ctrace")))
    (obj,) = data.objects
    rows = {r.ts_ns // 1000: r for r in obj.rows}
    assert _state_changes(obj) == [
        (rows[10].seq, 7, 2, CAUSE_ANNOUNCED, "tp:inet_sock_set_state"),
        (rows[30].seq, 2, 1, CAUSE_ANNOUNCED, "tp:inet_sock_set_state"),
        (rows[40].seq, 1, 7, "outside", "tp:tcp_probe")]   # from the announced value
    assert rows[20].changes is None  # the delayed copy of the first store is gone
    assert [v for _, v in obj.series["__sk_common.skc_state"]] == [7, 2, 1, 7]


def test_without_the_rule_changes_are_where_snapshots_show_them(tmp_path):
    _trace(tmp_path / "b.ctrace", announced=False)
    (obj,) = view_of(Trace(str(tmp_path / "b.ctrace"))).objects
    assert [(c[1], c[2], c[4]) for c in _state_changes(obj)] == [
        (7, 2, "tp:tcp_probe"), (2, 7, "tp:tcp_probe")]


def test_exports_credit_the_tracepoint(tmp_path):
    import subprocess
    import sys
    _trace(tmp_path / "c.ctrace")
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(tmp_path / "c.ctrace"),
                        "--format", "csv"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import csv
    import io
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["changed_by"] for row in rows] == ["tp:inet_sock_set_state", "",
                                                   "tp:inet_sock_set_state", "tp:tcp_probe"]


def _raw_event(fid, state, args, nargs=3):
    import struct
    from ctracer.event import HEADER, args_offset, mini_offset
    start = mini_offset(MINI, nargs)
    raw = bytearray(start + MINI.size)
    raw[:HEADER.size] = encode(HEADER, {"ts_ns": 1000, "object": SK, "retval": 0, "cpu": 0,
                                       "pid": 1, "tid": 1, "function_id": fid, "depth": 0,
                                       "phase": PHASE_TRACEPOINT, "flags": 0,
                                       "comm": "tcploop"})
    struct.pack_into(f"<{nargs}Q", raw, args_offset(), *(list(args) + [0] * nargs)[:nargs])
    raw[start:] = encode(MINI, {"__sk_common.skc_state": state,
                               "__sk_common.skc_daddr": LOOPBACK,
                               "__sk_common.skc_dport": PORT_8080, "sk_err": 0, "sk_flags": 0})
    return bytes(raw)


class _Arg:
    def __init__(self, name):
        self.name, self.kind = name, "int"

    def value(self, v):
        return v


class _Program:
    """What `Tail` reads of a kernel probe program: the rows, arguments and rules."""

    mini, nargs = MINI, 3
    rows = [FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint"),
            FunctionRow(2, "tcp_probe", route_kind="tracepoint"),
            FunctionRow(3, "tcp_destroy_sock", route_kind="tracepoint")]

    def __init__(self):
        from ctracer.plan.lifetime_rules import rules_for
        self.rules = rules_for("sock")

    def args_by_row(self):
        return {1: (_Arg("sk"), _Arg("oldstate"), _Arg("newstate")), 2: (_Arg("sk"),),
                3: (_Arg("sk"),)}


def test_tail_shows_the_announced_store_and_never_diffs_across_lifetimes():
    from ctracer.record.tail import Tail
    from ctracer.report.values import ValueFormatter
    tail = Tail(_Program(), formatter=ValueFormatter(MINI),
                announced=stores.rules_by_tracepoint(ANNOUNCED))
    lines = [tail.line(_raw_event(fid, state, args)) for fid, state, args in [
        (1, 7, (SK, 7, 2)),   # CLOSE → SYN_SENT, announced
        (2, 2, (SK,)),        # the store seen: nothing to say
        (3, 1, (SK,)),        # tcp_destroy_sock: SYN_SENT → ESTABLISHED seen; life ends
        (2, 7, (SK,)),        # the next socket at the address: not diffed with the last
        (1, 10, (SK, 10, 3)), # LISTEN → SYN_RECV on an address last seen CLOSE: a clone
    ]]
    assert lines[0].endswith("| __sk_common.skc_state: TCP_CLOSE → TCP_SYN_SENT (announced)")
    assert "|" not in lines[1]
    assert lines[2].endswith("| __sk_common.skc_state: TCP_SYN_SENT → TCP_ESTABLISHED")
    assert "|" not in lines[3]
    # each line names the object as the report does: the socket after the end is the
    # address's second, the clone (its oldstate is not what the address last stored) the
    # third
    assert [ln.split()[1] for ln in lines] == [f"0x{SK:x}"] * 3 + [f"0x{SK:x}-2", f"0x{SK:x}-3"]
    assert lines[4].endswith("| __sk_common.skc_state: 10 → 3 (announced)")


def test_lifetimes_split_where_the_kernel_says_and_stale_hits_stay_behind(tmp_path):
    """Two rules of the sock: a hit through a holder (kfree_skb's skb->sk) after
    tcp_destroy_sock ended a socket is still that socket's (the buffer outlived it); an
    inet_sock_set_state whose oldstate is not the state last stored at the address is
    another socket (an accepted one, cloned from the listener: LISTEN → SYN_RECV)."""
    ends = {"struct": "sock", "function": "tcp_destroy_sock", "probe": "tracepoint",
            "param_index": 0, "effect": "ends", "arg": None, "equals": None,
            "rule": "sock: tcp_destroy_sock ends its lifetime"}
    w = TraceWriter(str(tmp_path / "l.ctrace"))
    w.set_meta(struct_name="sock", struct_kind="struct", mini_layout=MINI.to_json(),
               lifetime_rules=[RULE, ends], traced="kernel", announced_stores=ANNOUNCED)
    w.add_functions([
        FunctionRow(1, "inet_sock_set_state", route_kind="tracepoint", route_text="struct sock (param 1)",
                    attached="tracepoint"),
        FunctionRow(2, "tcp_destroy_sock", route_kind="tracepoint", route_text="struct sock (param 1)",
                    attached="tracepoint"),
        FunctionRow(3, "kfree_skb", route_kind="tracepoint", route_text="sk_buff->sk (param 1)",
                    attached="tracepoint")])
    hits = [(1, 7, {"oldstate": 7, "newstate": 2}), (1, 2, {"oldstate": 2, "newstate": 7}),
            (2, 7, {}), (3, 7, {}),                             # ended; a stale buffer
            (1, 10, {"oldstate": 10, "newstate": 3}),           # an accepted socket here
            (1, 3, {"oldstate": 3, "newstate": 7}),
            (1, 10, {"oldstate": 10, "newstate": 3})]           # and another, no end seen
    for ts, (fid, state, args) in enumerate(hits, 1):
        w.add_event(ts_ns=ts * 1000, cpu=0, pid=1, tid=1, comm="t", function_id=fid,
                    phase=PHASE_TRACEPOINT, object=SK, retval=None, depth=0, flags=0,
                    snapshot=encode(MINI, {"__sk_common.skc_state": state,
                                          "__sk_common.skc_daddr": 0,
                                          "__sk_common.skc_dport": 0, "sk_err": 0,
                                          "sk_flags": 0}), args={"sk": SK, **args})
    w.close()
    data = view_of(Trace(str(tmp_path / "l.ctrace")))
    names = {1: "tp:inet_sock_set_state", 2: "tp:tcp_destroy_sock", 3: "tp:kfree_skb"}
    lives = [[names[r.function_id] for r in o.rows] for o in data.objects]
    assert lives == [
        ["tp:inet_sock_set_state", "tp:inet_sock_set_state", "tp:tcp_destroy_sock",
         "tp:kfree_skb"],
        ["tp:inet_sock_set_state", "tp:inet_sock_set_state"],
        ["tp:inet_sock_set_state"]]
    assert data.objects[2].started_by.startswith(
        "sock: an inet_sock_set_state hit whose oldstate is not the state")
