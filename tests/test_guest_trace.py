"""`ctracer trace --kernel`: bad input refused in one line before anything boots (an
unknown kernel, a path that does not exist, a file that is no kernel image), and, in real
guests booted from this host (marked ``guest``: minutes each under TCG), a trace landing
with its meta saying where it was recorded, a command failing in the guest (its status,
one line, the trace kept), a kernel that cannot boot (one line, exit 125) — and no QEMU
left running after any of them."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from support import vmguest
from test_vm_run import processes_naming

ROOT = Path(__file__).resolve().parents[1]
SOCKDEMO = ROOT / "samples" / "sock" / "build" / "sockdemo"


def ctracer(*args: str, cwd=None, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "ctracer", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def no_qemu_left(r) -> None:
    """No QEMU or vng left naming the guest's shared directory (said on the first line)."""
    first = r.stderr.splitlines()[0] if r.stderr else ""
    assert "writable: " in first, r.stderr
    shared = first.split("writable: ", 1)[1].strip()
    assert not processes_naming(shared), "QEMU or vng still running"


def one_error(r) -> str:
    lines = [l for l in r.stderr.splitlines() if l.startswith("ctracer: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("kernel, says", [
    ("5.10", "not a kernel this knows (6.1, 6.12, 7.2)"),
    ("/nonexistent/vmlinuz", "no such kernel image"),
    ("/etc/hostname", "not a bootable x86 kernel image"),
])
def test_a_kernel_that_is_not_one_is_refused_before_anything_boots(kernel, says, tmp_path):
    r = ctracer("trace", "struct", "sock", "--kernel", kernel, "-o",
                str(tmp_path / "t.ctrace"), "--", "true")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and says in one_error(r), r.stderr
    assert not list(tmp_path.iterdir())


def test_repeat_without_a_kernel_and_a_pid_with_one_are_refused(tmp_path):
    r = ctracer("trace", "struct", "sock", "--repeat", "3", "--", "true")
    assert r.returncode == 2 and "--kernel" in one_error(r)
    r = ctracer("trace", "struct", "sock", "--kernel", "6.12", "-p", "1")
    assert r.returncode == 2 and "-p PID" in one_error(r)
    r = ctracer("trace", "struct", "sock", "--kernel", "6.12", "--", "no-such-command-here")
    assert r.returncode == 127 and "command not found" in one_error(r)


def _guest_or_skip() -> None:
    why = vmguest.qemu_unavailable()
    if why:
        pytest.skip(f"no guest can start here: {why}")


def _meta(path: Path) -> dict:
    db = sqlite3.connect(path)
    try:
        return {k: v for k, v in db.execute("SELECT key, value FROM meta")}
    finally:
        db.close()


@pytest.mark.guest
def test_a_trace_recorded_in_a_guest_lands_here_saying_so(tmp_path):
    """Two runs of the sample program in one 6.12 boot: two traces, each naming the
    guest's kernel; the program's own sockets recorded with uprobes."""
    _guest_or_skip()
    out = tmp_path / "sock.ctrace"
    r = ctracer("trace", "sock", "--binary", str(SOCKDEMO), "--kernel", "6.12", "--repeat",
                "2", "-o", str(out), "--", str(SOCKDEMO), "--loops", "2", cwd=tmp_path,
                timeout=3000)
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("ctracer: Linux 6.12.") and " under " in first, r.stderr
    if " under TCG " in first:
        assert "slower" in first   # what emulation costs, said
    landed = sorted(tmp_path.glob("sock-*.ctrace"))
    assert [p.name for p in landed] == ["sock-1.ctrace", "sock-2.ctrace"], r.stderr
    for i, path in enumerate(landed, 1):
        meta = _meta(path)
        guest = json.loads(meta["guest"])
        assert meta["recorded_in"] == "guest" and guest["run"] == i and guest["runs"] == 2
        assert meta["kernel_release"].strip('"').startswith("6.12.")
        assert guest["kernel"] == "6.12" and guest["accel"] in ("kvm", "tcg")
        assert int(json.loads(meta["events"])) > 0
    no_qemu_left(r)


@pytest.mark.guest
def test_a_command_failing_in_the_guest_gives_its_status_and_keeps_its_trace(tmp_path):
    _guest_or_skip()
    out = tmp_path / "fail.ctrace"
    r = ctracer("trace", "sock", "--binary", str(SOCKDEMO), "--kernel", "6.12", "--repeat",
                "2", "-o", str(out), "--", "sh", "-c", f"{SOCKDEMO} --loops 1; exit 3",
                cwd=tmp_path, timeout=3000)
    assert r.returncode == 3, r.stderr
    line = one_error(r)
    assert "exited 3 (run 1 of 2)" in line and "1 trace landed" in line, r.stderr
    assert [p.name for p in tmp_path.glob("fail-*.ctrace")] == ["fail-1.ctrace"]
    no_qemu_left(r)


@pytest.mark.guest
def test_a_kernel_that_cannot_boot_is_one_line_and_nothing_is_left(tmp_path):
    """Debian's 6.12 image alone, without its modules: the guest cannot mount its root
    (9p is a module there): it dies while booting or waits until stopped."""
    _guest_or_skip()
    from ctracer.guest.kernels import cached_kernels
    trees = cached_kernels("6.12")
    if not trees:
        pytest.skip("no 6.12 kernel in the cache (scripts/setup.sh fetches it)")
    image = next(Path(trees[-1], "boot").glob("vmlinuz-*"))
    lonely = tmp_path / "kernel"
    lonely.mkdir()
    shutil.copy(image, lonely / "vmlinuz")
    r = ctracer("trace", "sock", "--binary", str(SOCKDEMO), "--kernel",
                str(lonely / "vmlinuz"), "--guest-timeout", "400", "-o",
                str(tmp_path / "t.ctrace"), "--", str(SOCKDEMO), "--loops", "1",
                cwd=tmp_path, timeout=1800)
    # dead at boot (125) or, waiting for a root it cannot mount, stopped (124)
    assert r.returncode in (124, 125), r.stderr
    line = one_error(r)
    assert ("the guest died while booting" in line if r.returncode == 125 else
            "did not finish within 400 s" in line), r.stderr
    assert not list(tmp_path.glob("*.ctrace"))
    no_qemu_left(r)


def test_landing_keeps_finished_runs_and_says_where_they_were_recorded(tmp_path):
    """What the host does with the shared directory, also after a guest was stopped:
    a run whose copy finished (its status written) lands with the guest in its meta; a
    run still being copied does not."""
    from ctracer.commands.guest_trace import _land, outputs
    from support.synthetic_trace import write_synthetic_trace
    shared = tmp_path / "shared"
    shared.mkdir()
    for i in (1, 2):
        write_synthetic_trace(str(shared / f"run-{i}.ctrace"), lifecycles=1, seed=i,
                              kernel="7.2.13+deb14-amd64")
    (shared / "run-1.status").write_text("0\n")
    said = []
    targets = outputs(str(tmp_path / "sock.ctrace"), 3)
    assert [os.path.basename(t) for t in targets] == ["sock-1.ctrace", "sock-2.ctrace",
                                                      "sock-3.ctrace"]
    landed = _land(str(shared), targets, "7.2", "/k/vmlinuz", "tcg", said.append)
    assert landed == [targets[0]] and os.path.exists(targets[0])
    assert not os.path.exists(targets[1])
    meta = _meta(Path(targets[0]))
    assert meta["recorded_in"] == "guest"
    assert json.loads(meta["guest"]) == {"kernel_release": "7.2.13+deb14-amd64",
                                         "kernel": "7.2", "image": "/k/vmlinuz",
                                         "accel": "tcg", "run": 1, "runs": 3}
    assert said == [f"trace of run 1 landed in {targets[0]} (recorded in a guest, Linux "
                    "7.2.13+deb14-amd64)"]
