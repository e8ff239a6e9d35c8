"""Synthetic socket-like traces with a known truth, for tests and benchmarks.

`write_synthetic_trace` simulates threads running socket lifecycles (allocate, bind,
connect, send/receive, close, free) on a small pool of addresses that get reused, and
writes what probes would have recorded with `ctracer.tracefile.TraceWriter`.  It also
returns `SyntheticTruth`: every field change as the simulation made it (which
function's code wrote it), every lifetime and every call, so tests can check the report
stage against facts it did not compute itself.
"""

from __future__ import annotations

from support.encoding import encode
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ctracer.event import (FLAG_READ_FAILED, HEADER, PHASE_ENTRY, PHASE_EXIT, Field, Layout,
                           event_size, mini_offset)
from ctracer.tracefile import TraceWriter
from ctracer.event import FunctionRow

TCP_STATES = ((1, "TCP_ESTABLISHED"), (2, "TCP_SYN_SENT"), (3, "TCP_SYN_RECV"),
              (4, "TCP_FIN_WAIT1"), (5, "TCP_FIN_WAIT2"), (6, "TCP_TIME_WAIT"),
              (7, "TCP_CLOSE"), (8, "TCP_CLOSE_WAIT"), (9, "TCP_LAST_ACK"),
              (10, "TCP_LISTEN"), (11, "TCP_CLOSING"))

MINI = Layout.packed_in_order("ctracer__mini_sock", [
    Field("sk_common.skc_state", "u8", 0, "enum", TCP_STATES),
    Field("sk_common.skc_reuse", "u8", 0, "bool"),
    Field("sk_common.skc_family", "u16", 0, "uint"),
    Field("sk_common.skc_dport", "u16", 0, "uint"),
    Field("sk_refcnt", "s32", 0, "int"),
    Field("sk_err", "s32", 0, "int"),
    Field("sk_sndbuf", "s32", 0, "int"),
    Field("sk_wmem_queued", "s32", 0, "int"),
    Field("sk_shutdown", "u8", 0, "uint", source={"bit_size": 2}),
    Field("sk_prio_class", "u8", 0, "char"),
    Field("sk_stats.rx_packets", "u64", 0, "uint"),
    Field("sk_stats.tx_bytes", "u64", 0, "uint"),
    Field("sk_user_data", "u64", 0, "pointer"),
    Field("sk_name", "char[12]", 0, "text"),
])

#: (id, name, route kind, route text)
FUNCTIONS = (
    (1, "sk_alloc", "returns", "return value"),
    (2, "sock_init_data", "direct", "param 2 sk"),
    (3, "inet_bind", "holder", "socket->sk"),
    (4, "tcp_v4_connect", "direct", "param 1 sk"),
    (5, "tcp_set_state", "direct", "param 1 sk"),
    (6, "tcp_sendmsg", "direct", "param 1 sk"),
    (7, "tcp_recvmsg", "direct", "param 1 sk"),
    (8, "sock_hold", "direct", "param 1 sk"),
    (9, "sock_put", "direct", "param 1 sk"),
    (10, "tcp_close", "direct", "param 1 sk"),
    (11, "sk_free", "direct", "param 1 sk"),
    (12, "inet_sk_set_state", "alias", "struct inet_sock"),
    (13, "sk_lookup_established", "returns", "return value"),
    (14, "tcp_poll", "direct", "param 2 sk"),
)
ID = {name: fid for fid, name, _, _ in FUNCTIONS}


@dataclass(frozen=True)
class TrueChange:
    address: int
    lifetime: int
    field: str
    old: Any
    new: Any
    function: Optional[str]  # whose code wrote it; None for code outside traced calls


@dataclass
class SyntheticTruth:
    changes: list[TrueChange] = field(default_factory=list)
    #: (address, lifetime) -> number of events
    lifetimes: dict[tuple[int, int], int] = field(default_factory=dict)
    #: function name -> number of calls
    calls: dict[str, int] = field(default_factory=dict)
    #: function name -> every duration in ns
    durations: dict[str, list[int]] = field(default_factory=dict)
    events: int = 0


class _Thread:
    """One simulated thread: its clock, its call stack, the events it emitted."""

    def __init__(self, sim: "_Simulation", tid: int, start_ns: int):
        self.sim, self.tid, self.now = sim, tid, start_ns
        self.events: list[dict] = []
        self.depth = 0
        self.running: list[str] = []

    def tick(self) -> None:
        self.now += self.sim.rng.randint(200, 5_000)

    def emit(self, fname: str, phase: int, address: int, retval: Optional[int]) -> None:
        self.tick()
        snapshot = None
        if address:
            snapshot = self.sim.snapshot(address)
            self.sim.observed(address)
        self.events.append(dict(
            ts_ns=self.now, cpu=self.tid % 2, pid=1000, tid=self.tid,
            comm=f"worker-{self.tid}", function_id=ID[fname], phase=phase, object=address,
            retval=retval, depth=self.depth, flags=0, snapshot=snapshot))

    def call(self, fname: str, address: int, body: Optional[Callable[[], Any]] = None,
             returns_object: bool = False) -> Any:
        truth = self.sim.truth
        truth.calls[fname] = truth.calls.get(fname, 0) + 1
        self.emit(fname, PHASE_ENTRY, 0 if returns_object else address, None)
        start = self.now
        self.depth += 1
        self.running.append(fname)
        result = body() if body else 0
        self.running.pop()
        self.depth -= 1
        if returns_object:
            address = result
        self.emit(fname, PHASE_EXIT, address, result)
        truth.durations.setdefault(fname, []).append(self.now - start)
        return result

    def write(self, address: int, name: str, value: Any) -> None:
        """The code now running (innermost traced call, or none) stores a field."""
        self.tick()
        self.sim.write(address, name, value, self.running[-1] if self.running else None)


class _Simulation:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.truth = SyntheticTruth()
        self.memory: dict[int, dict[str, Any]] = {}   # what the object bytes hold now
        self.shown: dict[int, dict[str, Any]] = {}    # what the last event of it showed
        self.lifetime: dict[int, int] = {}
        self.writers: dict[int, dict[str, Optional[str]]] = {}

    def snapshot(self, address: int) -> bytes:
        return encode(MINI, self.memory[address])

    def write(self, address: int, name: str, value: Any, by: Optional[str]) -> None:
        self.memory[address][name] = value
        self.writers.setdefault(address, {})[name] = by

    def observed(self, address: int) -> None:
        """An event shows the object: what differs from the last event is a change."""
        now = dict(self.memory[address])
        key = (address, self.lifetime[address])
        self.truth.lifetimes[key] = self.truth.lifetimes.get(key, 0) + 1
        before = self.shown.get(address)
        if before is not None:
            for name, value in now.items():
                if before[name] != value:
                    self.truth.changes.append(TrueChange(
                        address, key[1], name, before[name], value,
                        self.writers.get(address, {}).get(name)))
        self.shown[address] = now

    def allocate(self, address: int) -> None:
        """Memory handed out again: whatever the last owner left is there."""
        self.lifetime[address] = self.lifetime.get(address, 0) + 1
        self.shown.pop(address, None)
        self.writers.pop(address, None)
        if address not in self.memory:
            self.memory[address] = {f.name: (0 if f.kind != "text" else "") for f in MINI.fields}


def _lifecycle(t: _Thread, sim: _Simulation, pool: list[int], sends: int) -> None:
    rng = sim.rng

    def alloc_body() -> int:
        address = pool.pop()
        sim.allocate(address)

        def init() -> None:
            t.write(address, "sk_common.skc_state", 7)
            t.write(address, "sk_common.skc_family", 2)
            t.write(address, "sk_refcnt", 1)
            t.write(address, "sk_err", 0)
            t.write(address, "sk_sndbuf", 16384)
            t.write(address, "sk_wmem_queued", 0)
            t.write(address, "sk_shutdown", 0)
            t.write(address, "sk_stats.rx_packets", 0)
            t.write(address, "sk_stats.tx_bytes", 0)
            t.write(address, "sk_user_data", 0)
            t.write(address, "sk_prio_class", ord("b"))
            t.write(address, "sk_name", f"sk{address & 0xfff:x}")
        t.call("sock_init_data", address, init)
        return address

    sk = t.call("sk_alloc", 0, alloc_body, returns_object=True)
    mem = sim.memory[sk]

    def set_state(state: int) -> None:
        def body() -> None:
            t.call("inet_sk_set_state", sk, lambda: t.write(sk, "sk_common.skc_state", state))
        t.call("tcp_set_state", sk, body)

    t.call("inet_bind", sk, lambda: t.write(sk, "sk_common.skc_reuse", 1))
    t.call("sock_hold", sk, lambda: t.write(sk, "sk_refcnt", mem["sk_refcnt"] + 1))

    def connect() -> None:
        t.write(sk, "sk_common.skc_dport", rng.choice((80, 443, 8080)))
        set_state(2)
        set_state(1)
    t.call("tcp_v4_connect", sk, connect)
    if rng.random() < 0.3:  # user code outside any traced function pokes the socket
        t.write(sk, "sk_user_data", 0x7F0000001000 + (sk & 0xFF0))
    for _ in range(sends):
        def send() -> None:
            size = rng.choice((64, 512, 1460, 4096))
            t.write(sk, "sk_wmem_queued", mem["sk_wmem_queued"] + size)
            t.write(sk, "sk_stats.tx_bytes", mem["sk_stats.tx_bytes"] + size)
            t.tick()
            t.write(sk, "sk_wmem_queued", 0)
        t.call("tcp_sendmsg", sk, send)
        t.call("tcp_poll", sk)
        if rng.random() < 0.5:
            t.call("tcp_recvmsg", sk,
                   lambda: t.write(sk, "sk_stats.rx_packets", mem["sk_stats.rx_packets"] + 1))
        if rng.random() < 0.05:
            t.call("sk_lookup_established", 0, lambda: sk, returns_object=True)

    def close() -> None:
        t.write(sk, "sk_shutdown", 3)
        set_state(4)
        set_state(6)
        set_state(7)
        if rng.random() < 0.2:
            t.write(sk, "sk_err", -104)
    t.call("tcp_close", sk, close)
    t.call("sock_put", sk, lambda: t.write(sk, "sk_refcnt", mem["sk_refcnt"] - 1))

    def free() -> None:
        t.write(sk, "sk_refcnt", 0)
        t.write(sk, "sk_prio_class", ord("x"))
    t.call("sk_free", sk, free)
    pool.insert(0, sk)


def _record(e: dict) -> bytes:
    """One event as the probe writes it (`ctracer.event.c_event_definition`)."""
    snapshot = e["snapshot"]
    header = encode(HEADER, dict(e, retval=e["retval"] or 0,
                                 flags=e["flags"] | (FLAG_READ_FAILED if snapshot is None else 0)))
    header += bytes(mini_offset(MINI) - len(header))
    body = header + (snapshot if snapshot is not None else bytes(MINI.size))
    return body + bytes(event_size(MINI) - len(body))


def write_synthetic_trace(path: str, *, threads: int = 2, lifecycles: int = 6,
                          sends: int = 5, addresses_per_thread: int = 2, seed: int = 1,
                          lost_events: int = 0, attach_failures: bool = False,
                          base_address: int = 0x55D0C0A0,
                          host: str = "synthetic-host",
                          kernel: str = "6.1.0-synthetic", raw: bool = False,
                          renamed: Optional[dict[str, str]] = None,
                          layout: Optional[Layout] = None,
                          full_layout: Optional[str] = None) -> SyntheticTruth:
    """Write a trace of ``threads`` threads each running ``lifecycles`` socket lifecycles
    on its own pool of ``addresses_per_thread`` reused addresses; return the truth.
    With ``raw`` the events are written as a recorder writes them (raw records, a
    snapshot-less event flagged unreadable), else as rows.  Another kernel: ``renamed``
    names functions of the table otherwise (their calls go with the new name),
    ``layout`` (the simulation's fields first, at their places) and ``full_layout``
    give the struct another layout."""
    sim = _Simulation(seed)
    per_thread = []
    for n in range(threads):
        t = _Thread(sim, 2000 + n, 1_000_000_000 + n * 700)
        pool = [base_address + 0x1000 * (n * addresses_per_thread + i)
                for i in range(addresses_per_thread)]
        for _ in range(lifecycles):
            _lifecycle(t, sim, pool, sends)
            t.now += sim.rng.randint(10_000, 50_000)
        per_thread.append(t.events)
    merged = sorted((e for events in per_thread for e in events), key=lambda e: e["ts_ns"])
    sim.truth.events = len(merged)

    w = TraceWriter(path, batch=20_000)
    w.set_meta(struct_name="sock", struct_kind="struct",
               mini_layout=(layout or MINI).to_json(),
               full_layout=full_layout or ("struct sock {\n\tstruct sock_common sk_common; "
                                           "/* 0 136 */\n\t/* ... synthetic ... */\n};"),
               target="/usr/local/bin/sockdemo", host=host,
               kernel_release=kernel, argv=["ctracer", "trace", "struct", "sock"],
               command=["sockdemo", "--run"], started_at=1_700_000_000.0,
               ended_at=1_700_000_003.5, lost_events=lost_events, events=len(merged),
               return_value_functions=[fid for fid, _, _, _ in FUNCTIONS])
    rows = []
    for fid, name, route_kind, route_text in FUNCTIONS:
        attached = "entry,exit"
        if attach_failures and name == "tcp_poll":
            attached = "entry: symbol not found"
        name = (renamed or {}).get(name, name)
        rows.append(FunctionRow(fid, name, "sock.c", route_kind, route_text, 0x1000 + fid * 0x40, attached))
    w.add_functions(rows)
    if raw:
        records = [_record(e) for e in merged]
        for at in range(0, len(records), 65536):
            w.add_raw(b"".join(records[at:at + 65536]))
    else:
        for e in merged:
            w.add_event(**e)
    w.close()
    return sim.truth
