"""Faults while tracing, with real BPF: the traced command exiting with an error, dying of
a signal or never starting (its status becomes ctracer's, as with strace), a command
that never maps the traced binary (said so), and no probe left behind when ctracer ends.

Skipped, with the reason, only when not root or when the kernel or bcc cannot run a
trivial uprobe program here."""

from __future__ import annotations

from support import bpfcheck
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from support import groundtruth as gt
from ctracer.tracefile import Trace

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module", autouse=True)
def bpf_available(tmp_path_factory):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    try:
        reason = ""
        if os.geteuid() != 0:
            reason = "not root: loading BPF programs and uprobes needs root"
        else:
            from ctracer.errors import CtracerError
            from ctracer.record import bpf_runtime
            try:
                bpfcheck.uprobe_self_test(str(gt.SOCKDEMO), "main")
            except CtracerError as e:
                reason = str(e)
        if reason:
            print(f"skipping real BPF tests: {reason}", file=sys.stderr)
            pytest.skip(reason)
        yield
    finally:
        if saved is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = saved


def trace(tmp_path, *command, extra=(), timeout=300):
    out = tmp_path / "t.ctrace"
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "sock", "--binary",
                        gt.SOCKDEMO, "-o", str(out), *extra, "--", *command],
                       capture_output=True, text=True, cwd=tmp_path, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r, out


def test_the_commands_exit_status_is_ctracers(tmp_path):
    r, out = trace(tmp_path, "sh", "-c", f"{gt.SOCKDEMO} --loops 1 >/dev/null; exit 3")
    assert r.returncode == 3, r.stderr
    assert "exit status 3" in r.stderr
    assert Trace(str(out)).event_count() > 0  # the trace is kept all the same


def test_a_command_killed_by_a_signal_gives_128_plus_the_signal(tmp_path):
    r, out = trace(tmp_path, "sh", "-c", f"{gt.SOCKDEMO} --loops 1 >/dev/null; kill -SEGV $$")
    assert r.returncode == 128 + signal.SIGSEGV, r.stderr
    assert "killed by SIGSEGV" in r.stderr
    assert Trace(str(out)).event_count() > 0


def test_a_command_that_cannot_be_executed(tmp_path):
    """Executable but not a program the kernel can run: the child cannot exec; ctracer
    says so and exits 127 as a shell does."""
    script = tmp_path / "garbage"
    script.write_bytes(b"\x7fELF garbage")
    script.chmod(0o755)
    r, _ = trace(tmp_path, str(script))
    assert r.returncode == 127, r.stderr
    assert f"cannot run {script}" in r.stderr


# -- no probe outlives ctracer ---------------------------------------------------------------

def _held_bpf_ids(pid: int) -> tuple[set[int], set[int]]:
    """The BPF (program ids, link ids) process ``pid`` holds, from its fdinfo."""
    progs, links = set(), set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        progs.add(int(line.split()[1]))
                    elif line.startswith("link_id:"):
                        links.add(int(line.split()[1]))
        except OSError:
            continue
    return progs, links


def _bpftool_ids(what: str) -> set[int]:
    import json
    r = subprocess.run(["bpftool", "-j", what, "show"], capture_output=True, text=True,
                       check=True)
    return {p["id"] for p in json.loads(r.stdout or "[]")}


def _gone_soon(ids: set[int], what: str, wait: float = 30.0) -> set[int]:
    """``ids`` still listed by bpftool after up to ``wait`` seconds (a program detached
    from a link is put after an RCU grace period, asynchronously)."""
    deadline = time.monotonic() + wait
    left = ids & _bpftool_ids(what)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = ids & _bpftool_ids(what)
    return left


def _wait_for(stream, needle: str) -> None:
    seen = []
    for line in stream:
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"never saw {needle!r}: {''.join(seen)}")


def _descendants(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid] + _descendants(kid)
    return out


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "duration", "command exits",
                                 "SIGKILL"])
def test_no_probe_of_ctracer_stays_attached_once_it_has_exited(tmp_path, how):
    """The BPF links ctracer held while recording (read from its fdinfo) are gone from
    ``bpftool link show`` as soon as ctracer has been reaped, whatever ended it, and its
    programs are unloaded (a link puts its program after an RCU grace period, so that
    is waited for); after SIGKILL the kernel releases them as the process dies."""
    if not shutil.which("bpftool"):
        pytest.skip("bpftool is not installed")
    loops = {"command exits": "300"}.get(how, "1000000")
    extra = ["-d", "2"] if how == "duration" else []
    tracer = subprocess.Popen([sys.executable, "-m", "ctracer", "trace", "sock", "--binary",
                               gt.SOCKDEMO, "-o", str(tmp_path / "t.ctrace"), *extra, "--",
                               gt.SOCKDEMO, "--loops", loops, "--delay-ms", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path)
    sample = []
    try:
        _wait_for(tracer.stderr, "recording struct sock")
        held, links = _held_bpf_ids(tracer.pid)
        sample = _descendants(tracer.pid)
        assert len(held) >= 2, held  # at least an entry and an exit probe
        if how.startswith("SIG"):
            tracer.send_signal(getattr(signal, how))
        tracer.wait(timeout=120)
        # links are unregistered before close returns: none may be listed once reaped
        links_left = links & _bpftool_ids("link")
        left = _gone_soon(held, "prog")
    finally:
        tracer.kill()
        for pid in sample:  # after SIGKILL the command is still running (and holds stderr)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    rest = tracer.stderr.read()
    assert not links_left, f"{len(links_left)} of {len(links)} links outlived ctracer"
    assert not left, f"{len(left)} of {len(held)} programs still loaded after ctracer exited"
    assert "Traceback" not in rest
    if how == "SIGKILL":
        assert tracer.returncode == -signal.SIGKILL
    elif how.startswith("SIG"):  # 128 + N, as a shell says: 130 after Ctrl-C, 143
        assert tracer.returncode == 128 + getattr(signal, how), rest
    else:
        assert tracer.returncode == 0, rest


# -- the binary never mapped, the disk full --------------------------------------------------

def test_a_command_that_never_maps_the_binary_is_said_so(tmp_path):
    r, out = trace(tmp_path, "/bin/true")
    assert r.returncode == 0, r.stderr
    warning = [ln for ln in r.stderr.splitlines() if "nothing recorded" in ln]
    assert warning and "never mapped" in warning[0] and "/bin/true" in warning[0] \
        or "/usr/bin/true" in warning[0], r.stderr
    assert Trace(str(out)).meta_json("warnings") == [warning[0].split("warning: ", 1)[1]]


def test_a_full_disk_stops_the_recording_and_keeps_what_was_written(tmp_path):
    """The trace goes to a 4 MB tmpfs that the sample's events fill up: ctracer stops,
    says so, exits 1, and the file holds the events committed before (read from a copy,
    since finishing it needs room)."""
    small = tmp_path / "small"
    small.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    copy = tmp_path / "copy"
    copy.mkdir()
    try:
        out = small / "t.ctrace"
        r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "sock", "--binary",
                            gt.SOCKDEMO, "-o", str(out), "--", gt.SOCKDEMO, "--loops",
                            "1000000"], capture_output=True, text=True, cwd=tmp_path,
                           timeout=300)
        for f in small.iterdir():
            shutil.copy(f, copy / f.name)
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr
    assert "stopped: the disk is full" in r.stderr
    assert "the disk filled up, so the recording stopped" in r.stderr
    trace = Trace(str(copy / "t.ctrace"))
    assert trace.event_count() > 1000
    assert trace.meta["stopped_by"] == "disk full"
    assert trace.incomplete.startswith("incomplete: the disk filled up")


def test_a_probe_the_verifier_rejects_is_listed_and_the_others_go_on():
    """One entry probe made to read past its context: the verifier refuses it, its
    function is recorded as failed with the kernel's reason, every other probe attaches."""
    import dataclasses

    from ctracer.debuginfo.dwarf import reader as dwarf
    from ctracer.plan import discovery, mini
    from ctracer.probes import uprobe
    from ctracer.record import bpf_runtime

    types = dwarf.open_elf_types(gt.SOCKDEMO)
    found = discovery.discover(types.catalog(), "sock")
    program = uprobe.build_program(found.methods,
                                   mini.build_mini(types.find_struct("sock")).layout)
    victim = program.functions[0]
    head = f"int {victim.entry_probe}(struct pt_regs *ctx)\n{{\n"
    assert head in program.text
    bad = program.text.replace(
        head, head + "\tif (*(volatile u64 *)((char *)ctx + 4096))\n\t\treturn 1;\n", 1)
    program = dataclasses.replace(program, text=bad)
    session = bpf_runtime.ProbeSession(program, gt.SOCKDEMO, lambda raw: None)
    try:
        session.compile()
        results = session.attach()
    finally:
        session.close()
    assert not results[0].ok
    assert "Permission denied" in results[0].attached or "invalid" in results[0].attached, \
        results[0].attached
    assert all(r.ok for r in results[1:])
    attached = bpf_runtime.row_attachments(program, results)
    assert all(attached[i].startswith("failed: ") for i in victim.row_ids)
