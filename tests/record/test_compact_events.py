"""Compact events (`ctracer.event`'s deltas, rebuilt by `ctracer.deltas`) against whole
snapshots, on real probes:

* user space: the sample run twice, deterministically (one thread, no address
  randomisation), once recorded compact and once with ``--full-snapshots``: the events
  and the JSON Lines export are the same but for times, process ids and CPUs;
* the kernel (this host's tracepoints): two recordings of the same loopback workload at
  once, one compact and one whole: every event of the time both cover is in both, with
  the same arguments and (but for fields another CPU changed between the two programs'
  reads of the same hit) the same snapshot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np
import pytest

from support import groundtruth as gt
from ctracer.event import FLAG_SNAPSHOT_LOST
from ctracer.tracefile import Trace, read_meta

pytestmark = [pytest.mark.bpf]

TCPLOOP = os.path.join(gt.ROOT, "samples", "tcp", "build", "tcploop")


def _record_sample(work, *extra):
    out = work / ("full.ctrace" if extra else "compact.ctrace")
    r = subprocess.run(["setarch", "-R", sys.executable, "-m", "ctracer", "trace", "struct",
                        "sock", "--binary", gt.SOCKDEMO, "-q", "-o", str(out), *extra, "--",
                        gt.SOCKDEMO, "--loops", "40", "--threads", "1"],
                       capture_output=True, text=True, cwd=work, timeout=600)
    assert r.returncode == 0, r.stderr
    return out


_SAME = ("function_id", "phase", "object", "retval", "has_retval", "depth", "flags",
         "has_snapshot", "snapshots", "args")


#: a field of the sample's sock holding the time
_CLOCK = "sk_stamp"


def _drop(value, name):
    """``name`` removed from every mapping nested in ``value``."""
    if isinstance(value, dict):
        value.pop(name, None)
        for v in value.values():
            _drop(v, name)
    elif isinstance(value, list):
        for v in value:
            _drop(v, name)


def _export(path) -> list[dict]:
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(path)],
                       capture_output=True, text=True, timeout=300, check=True)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    for row in rows:
        for volatile in ("ts_ns", "time_ns", "time", "pid", "tid", "cpu", "seq", "t_ns", "wall_time",
                         "trace_id"):
            row.pop(volatile, None)
    return rows


def test_compact_sample_recording_equals_the_full_one(bpf, tmp_path):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    compact, full = _record_sample(tmp_path), _record_sample(tmp_path, "--full-snapshots")
    assert read_meta(str(compact))["event_encoding"] == "compact"
    assert read_meta(str(full))["event_encoding"] == "full"
    a, b = Trace(str(compact)).event_columns(), Trace(str(full)).event_columns()
    assert len(a["seq"]) == len(b["seq"]) > 1000
    stamp = Trace(str(full)).mini.field(_CLOCK)   # the sample's clock: not deterministic
    for c in (a, b):
        c["snapshots"][:, stamp.offset:stamp.offset + stamp.size] = 0
    for name in _SAME:
        assert np.array_equal(a[name], b[name]), name
    assert a["args_texts"] == b["args_texts"]
    assert not (a["flags"] & FLAG_SNAPSHOT_LOST).any()
    ea, eb = _export(compact), _export(full)
    for row in ea + eb:
        _drop(row, _CLOCK)
    assert ea == eb
    # the point of it: far fewer bytes of events
    assert _event_bytes(compact) * 2 < _event_bytes(full)


def _event_bytes(path) -> int:
    import sqlite3
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT sum(length(raw)) FROM spool").fetchone()[0]
    finally:
        db.close()


def _start(work, name, *extra):
    out = work / f"{name}.ctrace"
    p = subprocess.Popen([sys.executable, "-m", "ctracer", "trace", "struct", "sock",
                          "-d", "120", "-o", str(out), *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=work)
    return p, out


def _wait_recording(p, deadline):
    line = ""
    while "recording:" not in line:
        assert time.monotonic() < deadline, "the recorder never started recording"
        line = p.stderr.readline()
        assert line or p.poll() is None, p.stderr.read()


def test_compact_kernel_events_equal_whole_ones_recorded_at_once(bpf, tmp_path):
    if not os.access(TCPLOOP, os.X_OK):
        pytest.skip("samples/tcp is not built (scripts/setup.sh builds it)")
    (pc, compact), (pf, full) = _start(tmp_path, "compact"), \
        _start(tmp_path, "full", "--full-snapshots")
    try:
        deadline = time.monotonic() + 300
        _wait_recording(pc, deadline)
        _wait_recording(pf, deadline)
        subprocess.run([TCPLOOP, "--connections", "3", "--messages", "300"],
                       capture_output=True, check=True, timeout=120)
        time.sleep(0.5)
    finally:
        for p in (pc, pf):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in (pc, pf):
            p.communicate(timeout=300)
    for p in (pc, pf):
        assert p.returncode in (0, 130)   # 130: stopped by Ctrl-C (SIGINT), as a shell says
    a, b = Trace(str(compact)).event_columns(), Trace(str(full)).event_columns()
    assert read_meta(str(compact))["event_encoding"] == "compact"
    assert not (a["flags"] & FLAG_SNAPSHOT_LOST).any()
    # the time both recorded (each program stamps its own time: a hit is matched by
    # CPU, function, phase and object, and the nearest time)
    low = max(a["ts_ns"].min(), b["ts_ns"].min()) + 10**6
    high = min(a["ts_ns"].max(), b["ts_ns"].max()) - 10**6
    ina = np.flatnonzero((a["ts_ns"] >= low) & (a["ts_ns"] <= high))
    inb = np.flatnonzero((b["ts_ns"] >= low) & (b["ts_ns"] <= high))
    assert len(ina) > 3000
    assert abs(len(ina) - len(inb)) <= 2   # a hit at an edge of the window may fall out
    hits = defaultdict(list)
    for j in range(len(b["seq"])):
        hits[(int(b["cpu"][j]), int(b["function_id"][j]), int(b["phase"][j]),
              int(b["object"][j]))].append(j)
    same_snapshot = same_args = 0
    for i in ina.tolist():
        key = (int(a["cpu"][i]), int(a["function_id"][i]), int(a["phase"][i]),
               int(a["object"][i]))
        candidates = np.array(hits[key])
        assert len(candidates), key
        j = candidates[np.argmin(np.abs(b["ts_ns"][candidates] - a["ts_ns"][i]))]
        assert abs(int(b["ts_ns"][j]) - int(a["ts_ns"][i])) < 10**6
        same_snapshot += bool(a["has_snapshot"][i] == b["has_snapshot"][j]
                              and np.array_equal(a["snapshots"][i], b["snapshots"][j]))
        ta = a["args_texts"][a["args"][i]] if a["args"][i] >= 0 else None
        tb = b["args_texts"][b["args"][j]] if b["args"][j] >= 0 else None
        same_args += ta == tb
    # a field another CPU changes between the two programs' reads of one hit differs
    # (sk_wmem_alloc, a queue's length: 23 of 19,461 in a trial); a snapshot rebuilt
    # wrong would stay wrong until its words change again
    assert same_snapshot >= 0.99 * len(ina)
    assert same_args >= 0.99 * len(ina)
