"""Real eBPF: every field kind of the sample recorded and decoded to the value its own
ground-truth log holds — bitfields (signed and unsigned), union members, nested structs,
enums, bools, char arrays, and the collectors' values of complex members (a spinlock and
a raw spinlock held, a socket lock owned, a mutex locked, a refcount, atomic_t,
atomic64_t, atomic_long_t counters, an sk_buff_head's qlen, a list head empty, an hlist
node unhashed, a ktime_t) — and `ctracer trace` saying the snapshot's cost first.

Skipped, with the reason, only when not root or when the kernel or bcc cannot run a
trivial uprobe program here.
"""

from __future__ import annotations

from support import bpfcheck
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from support import groundtruth as gt
from ctracer.tracefile import Trace

pytestmark = pytest.mark.bpf

#: a field of each kind, as the sample names it
EXPECTED = {
    "__sk_common.skc_reuse": "unsigned bitfield",
    "sk_pacing_delta": "signed bitfield",
    "sk_u.halves.hi": "union member, nested",
    "sk_u.sk_mark": "union member",
    "__sk_common.skc_state": "enum",
    "sk_dead": "bool",
    "sk_name": "char array",
    "sk_lock.slock.held": "spinlock_t held",
    "sk_hash_lock.held": "raw_spinlock_t held",
    "sk_lock.owned": "socket_lock_t owned",
    "sk_mutex.locked": "struct mutex locked",
    "__sk_common.skc_refcnt": "refcount_t",
    "sk_drops": "atomic_t",
    "sk_bytes_sent": "atomic64_t",
    "sk_mem_pages": "atomic_long_t",
    "sk_receive_queue.qlen": "sk_buff_head qlen",
    "sk_accept_waiters.empty": "list_head empty",
    "sk_bind_node.unhashed": "hlist_node unhashed",
    "sk_stamp": "ktime_t",
}


@pytest.fixture(scope="module", autouse=True)
def bpf_available(tmp_path_factory):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    if os.geteuid() != 0:
        pytest.skip("not root: loading BPF programs and uprobes needs root")
    from ctracer.errors import CtracerError
    from ctracer.record import bpf_runtime
    try:
        bpfcheck.uprobe_self_test(str(gt.SOCKDEMO), "main")
    except CtracerError as e:
        print(f"skipping real BPF tests: {e}", file=sys.stderr)
        pytest.skip(str(e))


def test_every_field_kind_equals_the_ground_truth(tmp_path):
    out, log = tmp_path / "sock.ctrace", tmp_path / "truth.log"
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock", "--binary",
                        gt.SOCKDEMO, "-o", str(out), "--", gt.SOCKDEMO, "--loops", "6"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, gt.LOG_ENV: str(log)}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trace = Trace(str(out))
    names = {f.name for f in trace.mini.fields}
    assert set(EXPECTED) <= names, set(EXPECTED) - names
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"ctracer: snapshot of struct sock: {trace.mini.size} bytes per "
                            f"event (") and f"{len(names)} fields: " in first, first
    expected = gt.by_thread(gt.restrict_fields(gt.parse_log(str(log)), names))
    got = gt.by_thread(gt.trace_calls(trace))
    assert set(got) == set(expected)
    seen = defaultdict(set)
    for tid, calls in expected.items():
        problems = gt.differences(calls, got[tid])
        assert not problems, f"thread {tid}:\n" + "\n".join(problems)
        for c in calls:
            for name, value in c.fields:
                seen[name].add(value)
    # every kind took more than one value, so a wrong decoding could not pass unseen
    constant = {n: EXPECTED[n] for n in EXPECTED if len(seen[n]) < 2}
    assert not constant, constant
