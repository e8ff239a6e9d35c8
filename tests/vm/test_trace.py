"""A tracepoint trace of `struct sock` over the loopback workload, in the guests: the
same run as tests/record/test_kernel_trace.py makes on this machine's kernel (its
helpers, tests/support/kernelrun.py), bpftrace the independent observer.  Per socket, the
``inet_sock_set_state`` transitions ctracer recorded equal bpftrace's, and each hit's
snapshot has ``skc_state`` equal to the tracepoint's ``oldstate``.

ctracer records system-wide here with ``--where`` on the workload's port, which is how
bpftrace chooses the sockets, not by following tcploop's processes (``-- COMMAND``) as
the host test does: under TCG the loopback's softirq often runs in ksoftirqd, so an
accepted socket's first transitions (TCP_LISTEN → TCP_SYN_RECV → TCP_ESTABLISHED) happen
before tcploop's process ever touches it, and process-following admits it only from
accept() on (seen on 6.1: two transitions fewer than bpftrace for one socket).  Only tracepoints
(``--functions 'tp:*'``), whatever else the kernel would take: this proves the
tracepoint path on Debian's kernels, not the kernel-methods one.

The trace file is written under pytest's tmp_path, on the guest's /tmp (a tmpfs
overlay: SQLite on the 9p root says "database is locked")."""

from __future__ import annotations

import os

import pytest

from support import kernelrun as kr

pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def sock_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sock")
    port = kr.free_port()
    # the workload's sockets, chosen as bpftrace chooses them: by port, in any context
    where = f"skc_num == {port} || skc_dport == {port}"   # both in host order, as shown
    trace, stdout, seen = kr.trace_with_observer(
        tmp, "sock", port, kr.sock_states_script(port),
        options=("--functions", "tp:*", "--where", where), system_wide=True,
        timeout=900, start_timeout=300)  # bpftrace can take minutes to start under TCG
    return trace, stdout, seen, port


def _filesystem(path) -> str:
    best, kind = "", "?"
    with open("/proc/mounts") as f:
        for line in f:
            _, point, fstype, *_ = line.split()
            if (str(path) + "/").startswith(point.rstrip("/") + "/") and len(point) > len(best):
                best, kind = point, fstype
    return kind


def test_transitions_per_socket_equal_bpftrace(vm_kernel, sock_run):
    trace, _, seen, port = sock_run
    # recorded on the kernel the guest booted
    assert trace.meta["kernel_release"] == os.uname().release
    assert os.uname().release.startswith(vm_kernel + "."), os.uname().release
    expected, recorded = kr.sock_transitions(trace, seen)
    assert len(expected) >= 3  # listener, clients, accepted sockets (addresses reused)
    assert sum(map(len, expected.values())) >= 6 * 6
    assert {a: recorded.get(a) for a in expected} == expected
    assert set(recorded) == set(expected)
    assert _filesystem(trace.path) in ("tmpfs", "overlay"), trace.path


def test_snapshot_state_is_the_tracepoints_oldstate(vm_kernel, sock_run):
    trace, _, _, _ = sock_run
    fid = next(fid for fid, f in trace.functions.items() if f.name == "inet_sock_set_state")
    hits = 0
    for e in trace.events():
        if e.function_id == fid:
            v = trace.values(e)
            assert v["__sk_common.skc_state"] == e.args["oldstate"]
            assert e.args["sk"] == e.object
            hits += 1
    assert hits >= 6 * 6


def test_every_tracepoint_carrying_sock_attached(vm_kernel, sock_run):
    """All of the kernel's tracepoints carrying the struct were probed and attached (the
    trace's functions table says how each was attached, or why not)."""
    trace, _, _, _ = sock_run
    functions = list(trace.functions.values())
    assert len(functions) > 20
    assert {(f.route_kind, f.attached) for f in functions} == {("tracepoint", "raw_tracepoint")}, \
        sorted((f.name, f.attached) for f in functions if f.attached != "raw_tracepoint")
    print(f"{vm_kernel}: {len(functions)} tracepoints attached")


def test_export_shared_for_the_fleet(vm_kernel, sock_run, vm_share, tmp_path):
    """This kernel's trace exported to Parquet (``--host guest-KERNEL``) for the host's
    check that Spark reads two kernels' exports as one table
    (tests/export/test_spark_kernels.py), with what the trace itself holds: the hits per
    function, and the members of this kernel's struct sock."""
    import json
    import subprocess
    import sys
    from ctracer.event import PHASE_ENTRY
    trace = sock_run[0]
    host = f"guest-{vm_kernel}"
    out = vm_share / "fleet"
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(trace.path),
                        "--format", "parquet", "--host", host, "-o", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    names = {fid: f"tp:{f.name}" if f.route_kind == "tracepoint" else f.name
             for fid, f in trace.functions.items()}
    calls: dict[str, int] = {}
    for e in trace.events():
        if e.phase != PHASE_ENTRY:  # exits and tracepoint hits, as the fleet question counts
            calls[names[e.function_id]] = calls.get(names[e.function_id], 0) + 1
    facts = {"host": host, "kernel": trace.meta["kernel_release"], "calls": calls,
             "fields": [f.name for f in trace.mini.fields]}
    (vm_share / f"fleet-{vm_kernel}.json").write_text(json.dumps(facts))
    assert sum(calls.values()) >= 6 * 6 and list((out / f"host={host}").rglob("*.parquet"))
