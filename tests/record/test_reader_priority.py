"""The reading thread's priority while recording (`ctracer.record.priority`).

Unit: `ReaderPriority` raises only the calling thread to SCHED_FIFO 1 with
SCHED_RESET_ON_FORK (a thread it starts and a process it forks run at normal priority),
gives the previous policy back, leaves it alone with ``normal``, and says why when the
kernel refuses.  Real: under ``ctracer trace struct sock``, the traced command reads
the scheduling policy of ctracer's threads and its own from /proc (an outside view,
not the recorder's word): ctracer's reading thread runs SCHED_FIFO 1, its other threads
and the command SCHED_OTHER; with ``--reader-priority normal`` none is realtime.  The
trace's meta says how the reader ran and the most it found waiting in the ring.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from support import kernelrun as kr
from ctracer.record import priority
from ctracer.record.priority import ReaderPriority

FIFO_RESET = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK


def _can_realtime() -> bool:
    """Whether this process may take the realtime policy (tried in a thread)."""
    seen = []

    def attempt():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            seen.append(True)
        except OSError:
            seen.append(False)

    t = threading.Thread(target=attempt)
    t.start()
    t.join()
    return seen[0]


def _in_a_thread(fn):
    """``fn()``'s result, run in a thread of its own (the policies it sets stay there)."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as e:   # re-raised in the test's thread
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _policy_of_a_new_thread() -> tuple[int, int]:
    seen = []
    t = threading.Thread(target=lambda: seen.append(
        (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)))
    t.start()
    t.join()
    return seen[0]


def _policy_of_a_child() -> int:
    code = "import os; print(os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(not _can_realtime(), reason="this process may not take SCHED_FIFO")
def test_realtime_for_the_calling_thread_only_and_given_back():
    def scenario():
        before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
        reader = ReaderPriority("realtime")
        reader.begin()
        during = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
        thread, child = _policy_of_a_new_thread(), _policy_of_a_child()
        realtime = reader.realtime
        reader.end()
        after = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
        return before, during, thread, child, realtime, after, reader.description

    before, during, thread, child, realtime, after, description = _in_a_thread(scenario)
    assert before == (os.SCHED_OTHER, 0)
    assert during == (FIFO_RESET, priority.REALTIME_PRIORITY) and realtime
    assert thread == (os.SCHED_OTHER, 0), "a thread the reader starts must not be realtime"
    assert child == (os.SCHED_OTHER, 0), "the command the reader forks must not be realtime"
    assert after == before
    assert description == "realtime (SCHED_FIFO 1)"


def test_normal_leaves_the_thread_alone():
    def scenario():
        reader = ReaderPriority("normal")
        reader.begin()
        during = os.sched_getscheduler(0)
        reader.end()
        return during, reader.realtime, reader.description

    during, realtime, description = _in_a_thread(scenario)
    assert during == os.SCHED_OTHER and not realtime
    assert description == "normal (--reader-priority normal)"
    with pytest.raises(ValueError):
        ReaderPriority("fast")


def test_a_refusal_is_said_and_nothing_is_given_back(monkeypatch):
    calls = []

    def refuse(pid, policy, param):
        calls.append(policy)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    reader = ReaderPriority()
    reader.begin()
    reader.end()
    assert calls == [FIFO_RESET]   # end() did not try to give anything back
    assert not reader.realtime
    assert reader.description == "normal (the kernel refused realtime: Operation not permitted)"


# -- under ctracer trace, seen from the traced command -------------------------

#: the command: each thread of ctracer (its parent) with its policy and priority, then
#: its own, then a short run of the loopback workload (events for the ring)
SEEN_FROM_THE_COMMAND = r"""
import os, subprocess, sys
parent = os.getppid()
for tid in sorted(os.listdir(f"/proc/{parent}/task"), key=int):
    with open(f"/proc/{parent}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # stat's 40th and 41st fields (rt_priority, policy); fields[0] is the 3rd
    print("ctracer", tid, fields[39 - 1], fields[38 - 1], "main" if int(tid) == parent else "")
print("command", os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)
subprocess.run([sys.argv[1], "--connections", "1", "--messages", "200"], check=True,
               stdout=subprocess.DEVNULL)
"""


def _trace(tmp_path, *options):
    kr.bpf_or_skip()
    workload = kr.workload_copy(tmp_path)
    out = tmp_path / "t.ctrace"
    if out.exists():
        out.unlink()
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock", "-q",
                        "-o", str(out), *options, "--", sys.executable, "-c",
                        SEEN_FROM_THE_COMMAND, workload],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    threads = {}
    command = None
    for line in r.stdout.splitlines():
        words = line.split()
        if words[0] == "ctracer":
            threads[int(words[1])] = (int(words[2]), int(words[3]), len(words) > 4)
        elif words[0] == "command":
            command = (int(words[1]), int(words[2]))
    db = sqlite3.connect(out)
    meta = {k: json.loads(v) if k != "reader_priority" else v for k, v in db.execute(
        "SELECT key, value FROM meta WHERE key IN "
        "('reader_priority', 'ring_bytes', 'ring_fullest_bytes', 'events')")}
    db.close()
    return threads, command, meta


@pytest.mark.bpf
def test_the_reading_thread_alone_is_realtime_while_recording(tmp_path):
    threads, command, meta = _trace(tmp_path)
    main = [policy for policy, _, is_main in threads.values() if is_main]
    others = {(policy, prio) for policy, prio, is_main in threads.values() if not is_main}
    assert main == [os.SCHED_FIFO], threads    # /proc's policy has no reset-on-fork bit
    assert [prio for _, prio, is_main in threads.values() if is_main] == [1]
    assert others <= {(os.SCHED_OTHER, 0)}, threads
    assert command == (os.SCHED_OTHER, 0)
    assert meta["reader_priority"] == "realtime (SCHED_FIFO 1)"
    # the reader saw records waiting: at least one, never more than the ring holds
    assert meta["events"] > 0
    assert 0 < meta["ring_fullest_bytes"] <= meta["ring_bytes"] == 16 << 20


@pytest.mark.bpf
def test_normal_priority_on_request(tmp_path):
    threads, command, meta = _trace(tmp_path, "--reader-priority", "normal")
    assert {policy for policy, _, _ in threads.values()} == {os.SCHED_OTHER}, threads
    assert command == (os.SCHED_OTHER, 0)
    assert meta["reader_priority"] == "normal (--reader-priority normal)"
