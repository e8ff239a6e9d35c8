"""The kernel collectors, proven: the verifier accepts those of the default selection
and of one cacheline (``--cachelines 1``) of struct sock and struct sk_buff in the kprobe
programs `ctracer plan --verify` loads (kprobes cannot be attached here, but kprobe-type
programs load), and `ctracer plan --verify --cachelines N` takes the selection; a traced
loopback workload shows the socket lock owned and held and the refcount moving.  Needs
root; skips, saying why, when BPF programs cannot be loaded here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ctracer.collectors import registry
from ctracer.plan import attach, discovery, mini
from ctracer.host import features

pytestmark = pytest.mark.kernel
KERNEL_BTF = "/sys/kernel/btf/vmlinux"
#: functions per struct whose programs are loaded here (ctracer plan --verify, run by
#: tests/record/test_verify.py, loads every one with the default selection)
SAMPLE = 24


@pytest.fixture(scope="module")
def support():
    if os.geteuid() != 0:
        pytest.skip("loading BPF programs needs root")
    if not os.path.exists(KERNEL_BTF):
        pytest.skip(f"this kernel has no BTF at {KERNEL_BTF}")
    s = features.probe_support()
    if not s.kprobe_programs.works:
        pytest.skip(f"kprobe-type programs do not load here: {s.kprobe_programs.why}")
    return s


@pytest.mark.bpf
@pytest.mark.parametrize("name", ["sock", "sk_buff"])
@pytest.mark.parametrize("cachelines", [(), (1,)], ids=["default", "cacheline-1"])
def test_collectors_pass_the_verifier(support, name, cachelines):
    from ctracer.debuginfo.btf import reader as btf
    from ctracer.probes.kernel_program import build_kernel_program
    from ctracer.record import bpf_runtime
    model = btf.open_btf(KERNEL_BTF)
    found = discovery.discover(model.catalog(), name)
    facts = features.kernel_facts([m.name for m in found.methods if not m.is_tracepoint],
                                [m.name for m in found.methods if m.is_tracepoint],
                                support=support)
    plan = attach.plan_probes(found.methods, facts)
    built = mini.build_mini(model.find_struct(name), cachelines=cachelines,
                            kinds=registry.claim)
    layout = built.layout
    if not cachelines:
        assert any(f.source.get("op") for f in layout.fields)    # collectors' values
    assert layout.fields and built.collected
    entries = plan.of_kind("kprobe")[:SAMPLE]
    program = build_kernel_program((), layout, None, entry_kind="kprobe",
                                   function_methods=[m for p in entries for m in p.methods])
    assert program.kfunctions
    results = bpf_runtime.verify_programs(program.text, program.program_names())
    rejected = {n: e for n, e in results.items() if e}
    assert not rejected, rejected
    assert len(results) == len(program.program_names()) >= 2


@pytest.mark.bpf
def test_plan_verify_with_one_cacheline(support):
    """The option reaches the programs: the sample's uprobe programs, snapshotting its
    cacheline 3 (its atomics, ktime_t and queue), load."""
    from support import groundtruth as gt
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    r = subprocess.run([sys.executable, "-m", "ctracer", "plan", "struct", "sock", "--binary",
                        gt.SOCKDEMO, "--verify", "--cachelines", "3", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    verdicts = [p["verified"] for p in doc["probes"] if p["kind"]]
    assert verdicts and all(v is True for v in verdicts), r.stdout[:2000]


@pytest.mark.bpf
def test_loopback_workload_shows_the_lock_owned_and_held_and_the_refcount_moving(
        support, tmp_path):
    """``ctracer trace struct sock`` around samples/tcp's loopback workload: the socket
    lock is seen owned by a process and its spinlock held (softirq receive), both also
    free, and the reference count takes several values on one socket."""
    from support import groundtruth as gt
    from ctracer.tracefile import Trace
    tcp = os.path.join(gt.ROOT, "samples", "tcp")
    subprocess.run(["make", "-s", "-C", tcp], check=True)
    out = tmp_path / "sock.ctrace"
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock", "-o",
                        str(out), "--", os.path.join(tcp, "build", "tcploop"),
                        "--connections", "4"], capture_output=True, text=True, timeout=900,
                       cwd=tmp_path)
    if r.returncode and "Traceback" not in r.stderr and "BPF" in r.stderr:
        pytest.skip(f"the kernel trace cannot run here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    trace = Trace(str(out))
    seen: dict = {}
    refcounts: dict = {}
    for e in trace.events():
        values = trace.values(e)
        if values is None:
            continue
        for name in ("sk_lock.owned", "sk_lock.slock.held"):
            if values[name] is not None:  # None: a request socket, only its head read
                seen.setdefault(name, set()).add(values[name])
        refcounts.setdefault(e.object, set()).add(values["__sk_common.skc_refcnt"])
    assert seen == {"sk_lock.owned": {0, 1}, "sk_lock.slock.held": {0, 1}}, seen
    assert max(len(v) for v in refcounts.values()) >= 3, refcounts


IPV6_WORKLOAD = """
import socket
server = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
server.bind(("::1", 0)); server.listen()
client = socket.create_connection(("::1", server.getsockname()[1]))
accepted, _ = server.accept()
client.sendall(b"hi"); accepted.recv(2)
for s in (client, accepted, server): s.close()
"""


@pytest.mark.bpf
def test_ipv6_addresses_of_a_loopback_connection_read_as_text(support, tmp_path):
    """struct in6_addr members are one value each, shown as IPv6 text: the sockets of a
    connection over ::1 read ``::1`` at both ends once connected; the listener's peer
    address is ``::``."""
    from ctracer.tracefile import Trace
    if not socket_has_ipv6_loopback():
        pytest.skip("no IPv6 on the loopback interface here")
    out = tmp_path / "v6.ctrace"
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock", "--fields",
                        "*v6*", "*skc_family", "*skc_state", "-o", str(out), "--",
                        sys.executable, "-c", IPV6_WORKLOAD], capture_output=True, text=True,
                       timeout=900, cwd=tmp_path)
    if r.returncode and "Traceback" not in r.stderr and "BPF" in r.stderr:
        pytest.skip(f"the kernel trace cannot run here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    trace = Trace(str(out))
    pairs = set()
    for e in trace.events():
        values = trace.values(e)
        if values and values["__sk_common.skc_family"] == 10:   # AF_INET6
            pairs.add((values["__sk_common.skc_state"], values["__sk_common.skc_v6_daddr"],
                       values["__sk_common.skc_v6_rcv_saddr"]))
    assert (1, "::1", "::1") in pairs, pairs                    # TCP_ESTABLISHED
    assert (10, "::", "::1") in pairs, pairs                    # TCP_LISTEN


def socket_has_ipv6_loopback() -> bool:
    import socket
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False
