"""The bundled sample (samples/sock): it builds, its DWARF has the shapes ctracer must
handle (checked with pahole), its ground-truth log is consistent, and the functions
that log are exactly the methods discovery finds."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections import Counter

import pytest

from support import groundtruth as gt
from ctracer.plan import discovery
from ctracer.debuginfo.dwarf import reader as dwarf

SAMPLES = os.path.join(gt.ROOT, "samples")
BINARIES = [gt.SOCKDEMO, gt.SOCKDEMO_O2]


@pytest.fixture(scope="module", autouse=True)
def built():
    r = subprocess.run(["make", "-s", "-C", SAMPLES], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for b in BINARIES:
        assert os.access(b, os.X_OK), b


def pahole(binary: str, name: str) -> list[str]:
    if shutil.which("pahole") is None:
        pytest.skip("pahole is not installed (apt-get install pahole)")
    r = subprocess.run(["pahole", "-C", name, binary], capture_output=True, text=True,
                       check=True)
    assert r.stdout.strip(), f"pahole knows no {name} in {binary}"
    return r.stdout.splitlines()


def member(lines: list[str], pattern: str) -> tuple[int, int]:
    """(offset, size) of the member line matching ``pattern`` (a regex on the
    declaration part), from pahole's ``/* offset size */`` comment."""
    for line in lines:
        decl, _, comment = line.partition("/*")
        if re.search(pattern, decl):
            m = re.match(r"\s*(\d+)(?::\s*\d+)?\s+(\d+)\s*\*/", comment)
            assert m, line
            return int(m.group(1)), int(m.group(2))
    raise AssertionError(f"no member matching {pattern!r} in:\n" + "\n".join(lines))


@pytest.mark.parametrize("binary", BINARIES, ids=os.path.basename)
def test_dwarf_has_the_socket_layer_shapes(binary):
    sock = pahole(binary, "sock")
    assert member(sock, r"struct sock_common\s+__sk_common;")[0] == 0
    assert member(sock, r"socket_lock_t\s+sk_lock;")[1] == 12          # lock-like
    assert member(sock, r"union sk_mark_u\s+sk_u;")[1] == 4             # a union
    assert member(sock, r"char\s+sk_name\[16\];")[1] == 16              # char array
    assert member(sock, r"struct sock_stats\s+sk_stats;")[1] == 32      # nested stats
    bitfields = [ln for ln in sock if re.search(r"\w+:\d+;", ln)]
    assert len(bitfields) >= 6, "bitfields"
    assert any(re.search(r"\bint\s+sk_pacing_delta:5;", ln) for ln in sock), "signed bitfield"
    common = pahole(binary, "sock_common")
    assert member(common, r"enum sk_tcp_state\s+skc_state;")[1] == 4   # enum state
    assert member(common, r"refcount_t\s+skc_refcnt;")[1] == 4         # refcount-like
    assert any(re.search(r"volatile unsigned char\s+skc_reuse:4;", ln) for ln in common)
    assert any(ln.strip() == "union {" for ln in common), "anonymous union"
    inet = pahole(binary, "inet_sock")
    assert member(inet, r"struct sock\s+sk;")[0] == 0                  # alias
    tcp = pahole(binary, "tcp_sock")
    assert member(tcp, r"struct inet_sock\s+inet;")[0] == 0            # alias of an alias
    socket = pahole(binary, "socket")
    assert member(socket, r"struct sock \*\s+sk;")[1] == 8            # pointer holder


def run_sample(tmp_path, *args, binary=gt.SOCKDEMO) -> list[gt.Call]:
    log = tmp_path / "truth.log"
    r = subprocess.run([binary, *args], env={**os.environ, gt.LOG_ENV: str(log)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return gt.parse_log(str(log))


def grouped(seq: list[gt.Call]) -> list[tuple]:
    """Consecutive lines of one call's objects (slots 0, 1, ...) as one
    (function, unit, phase, depth, number of slots)."""
    out: list[tuple] = []
    for c in seq:
        if c.slot:
            assert out and out[-1][:4] == (c.function, c.unit, c.phase, c.depth), c.brief()
            assert out[-1][4] == c.slot, c.brief()
            out[-1] = out[-1][:4] + (c.slot + 1,)
        else:
            out.append((c.function, c.unit, c.phase, c.depth, 1))
    return out


def test_log_nests_entries_and_exits_per_thread(tmp_path):
    calls = run_sample(tmp_path, "--loops", "7", "--threads", "3")
    threads = gt.by_thread(calls)
    assert len(threads) == 3
    for tid, seq in threads.items():
        stack: list[tuple] = []
        for function, unit, phase, depth, slots in grouped(seq):
            if phase == "entry":
                assert depth == len(stack), (function, depth, stack)
                stack.append((function, unit, slots))
            else:
                assert stack and stack[-1] == (function, unit, slots), (function, stack)
                stack.pop()
                assert depth == len(stack), (function, depth, stack)
        assert not stack, f"thread {tid} ends inside {stack}"


def test_log_sees_lifecycles_with_reused_addresses(tmp_path):
    calls = run_sample(tmp_path, "--loops", "6")
    allocated = [c.object for c in calls if c.function == "sk_alloc" and c.phase == "exit"]
    assert len(allocated) == 8  # 6 lifecycles, 2 of them servers accepting a connection
    assert len(set(allocated)) < len(allocated), "no address was reused"
    states = {dict(c.fields)["__sk_common.skc_state"] for c in calls if c.fields}
    assert {"1", "2", "4", "7", "10"} <= states  # established, syn-sent, fin-wait1, close, listen
    errors = {int(dict(c.fields)["sk_err"]) for c in calls if c.fields}
    assert -11 in errors  # a send that hit the buffer limit
    fields = {name for c in calls for name, _ in c.fields}
    assert {"sk_u.halves.hi", "__sk_common.skc_daddr", "sk_stats.tx_bytes", "sk_name",
            "sk_lock.slock.locked", "__sk_common.skc_refcnt.refs.counter"} <= fields


def test_log_is_off_without_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != gt.LOG_ENV}
    r = subprocess.run([gt.SOCKDEMO, "--loops", "2"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "1 thread(s) x 2 lifecycles done" in r.stdout
    assert os.listdir(tmp_path) == []


def test_wait_signal_holds_the_workload_until_sigusr1(tmp_path):
    log = tmp_path / "truth.log"
    p = subprocess.Popen([gt.SOCKDEMO, "--wait-signal", "--loops", "2"], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, gt.LOG_ENV: str(log)})
    try:
        ready = p.stdout.readline().split()
        assert ready == ["ready", str(p.pid)]
        assert log.read_text() == ""
        p.send_signal(signal.SIGUSR1)
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
    assert len(gt.parse_log(str(log))) > 0


def test_bad_arguments_are_refused():
    r = subprocess.run([gt.SOCKDEMO, "--loops", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr


def methods_of(binary: str):
    types = dwarf.open_elf_types(binary, use_cache=False)
    return discovery.discover(types.catalog(), "sock").methods


def test_logging_functions_are_the_discovered_methods(tmp_path):
    """Every method the analyzer finds logs ground truth, with one slot per way it
    reaches a struct sock, and nothing else logs: the BPF tests depend on it."""
    logged = Counter()
    for c in run_sample(tmp_path, "--loops", "6"):
        if c.phase == "entry":
            logged[(c.function, c.unit, c.slot)] += 1
    slots = Counter()
    for m in methods_of(gt.SOCKDEMO):
        assert m.probeable, m.key
        slots[(m.name, os.path.basename(m.function.unit))] += 1
    expected = {(name, unit, i) for (name, unit), n in slots.items() for i in range(n)}
    assert set(logged) == expected


def test_optimized_build_inlines_one_method():
    by_key = {m.key: m for m in methods_of(gt.SOCKDEMO_O2)}
    listener = [m for k, m in by_key.items() if k.startswith("sk_is_listener")]
    assert listener and not listener[0].probeable
    assert all(m.probeable for k, m in by_key.items() if not k.startswith("sk_is_listener"))
