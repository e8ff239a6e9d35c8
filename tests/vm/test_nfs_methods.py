"""``struct nfs_fh`` traced through the NFS client's own functions, in the guests, over a
loopback NFSv3 and NFSv4.2 mount (`nfs_mount`, tests/vm/conftest.py), both in one
recording.

The struct is defined only in modules (nfs, nfsv3, nfsv4): ctracer finds it in their BTF
without ``--module`` and probes the methods of all of them.  While files are written,
listed and read back through the mount, bpftrace's kprobes see each call of a probed
function that takes the file handle as a parameter (non-NULL), in the same run; ctracer,
recording every object, must have the same calls per function in the same window of time
(both clocks are CLOCK_MONOTONIC).  ``-- COMMAND`` records the file
handles the command's own calls touch.

Where each runs: the whole comparison and the command on 6.1 and 6.12 (fentry/fexit, a
program per function); on 7.2 the focused comparison of six functions of three modules
on tracing_multi links (a whole comparison there costs a loaded guest 14 minutes).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from support.kernelrun import stop_bpftrace, wait_for_text

pytestmark = pytest.mark.vm

CTRACER = [sys.executable, "-m", "ctracer"]


def _unique_text_symbols() -> set[str]:
    """Function names kallsyms holds once: a kprobe by name refuses the others (EINVAL on
    6.12: lockd and nfsd both have ``svcxdr_decode_fhandle``)."""
    seen = collections.Counter()
    with open("/proc/kallsyms") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "tT":
                seen[parts[2]] += 1
    return {name for name, n in seen.items() if n == 1}


def _direct_methods() -> dict[str, int]:
    """Placed functions taking ``struct nfs_fh *`` directly, each with a name of its own
    in the kernel: name -> parameter index."""
    unique = _unique_text_symbols()
    r = subprocess.run(CTRACER + ["functions", "struct", "nfs_fh", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = {}
    for m in json.loads(r.stdout)["methods"]:
        if m["reach"] == "direct" and not m["tracepoint"] and m["param_index"] is not None \
                and m["param_index"] < 6 and str(m.get("attachable", "")).startswith("yes") \
                and m["key"] == m["function"] and m["function"] in unique:
            out.setdefault(m["function"], m["param_index"])
    return out


def _workload(point, tag: str) -> None:
    for i in range(3):
        path = point / f"{tag}-{i}"
        path.write_bytes(os.urandom(10_000 + i))
        os.stat(path)
    names = sorted(os.listdir(point))
    assert f"{tag}-0" in names
    for i in range(3):
        assert len((point / f"{tag}-{i}").read_bytes()) == 10_000 + i


def _module_of() -> dict[str, str]:
    """Function name -> the module kallsyms places it in (functions of vmlinux absent)."""
    out = {}
    with open("/proc/kallsyms") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and parts[1] in "tT" and parts[3].startswith("["):
                out.setdefault(parts[2], parts[3].strip("[]"))
    return out


def _attached_rows(trace) -> list[tuple[str, str]]:
    """(function, what its probes attached) of each function row of the trace."""
    import sqlite3
    db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    try:
        return [(name, attached or "") for name, attached in
                db.execute("SELECT name, attached FROM functions WHERE reach != 'tracepoint'")]
    finally:
        db.close()


def _record_against_bpftrace(nfs_mount, tmp: Path, direct: dict[str, Optional[int]],
                             functions: tuple[str, ...] = ()) -> dict:
    """bpftrace's kprobes printing each call of the ``direct`` functions (those with a
    parameter index: only calls where it is non-NULL), ctracer recording every nfs_fh
    (of ``functions`` only, when named), the workload over both mounts between; the calls
    per function of each side in the workload's window."""
    points = {version: nfs_mount(version)[0] for version in ("3", "4.2")}
    script = " ".join(f"kprobe:{f} {'' if i is None else f'/arg{i} != 0/ '}"
                      f"{{ printf(\"fh %llu %s\\n\", nsecs, func); }}"
                      for f, i in sorted(direct.items()))
    bt_out = tmp / "bpftrace.txt"
    bt = subprocess.Popen(["bpftrace", "-B", "line", "-e", script], stdout=open(bt_out, "w"),
                          stderr=subprocess.STDOUT,
                          env=dict(os.environ, BPFTRACE_MAX_PROBES="10000"))
    wait_for_text(bt_out, "Attaching", bt, 900)
    log, trace = tmp / "ctracer.log", tmp / "fh.ctrace"
    only = ["--functions", *functions] if functions else []
    ct = subprocess.Popen(CTRACER + ["trace", "struct", "nfs_fh", *only, "-d", "900",
                                     "-o", str(trace)],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for_text(log, "recording struct nfs_fh", ct)
    assert bt.poll() is None, f"bpftrace ended early: {bt_out.read_text()[-2000:]}"
    begin = time.monotonic_ns()   # CLOCK_MONOTONIC, the probes' bpf_ktime_get_ns too
    for version, point in points.items():
        _workload(point, f"v{version}")
    time.sleep(1)
    end = time.monotonic_ns()
    ct.send_signal(signal.SIGINT)
    assert ct.wait(300) == 130, log.read_text()  # 128 + SIGINT
    assert bt.poll() is None, f"bpftrace ended early: {bt_out.read_text()[-2000:]}"
    stop_bpftrace(bt, bt_out)
    # both sides within the same window (NFS goes on working after the workload)
    theirs = collections.Counter()
    for line in bt_out.read_text().splitlines():
        if line.startswith("fh "):
            _, ns, name = line.split()
            if begin <= int(ns) <= end:
                theirs[name] += 1
    text = log.read_text()
    jsonl = tmp / "fh.jsonl"
    r = subprocess.run(CTRACER + ["export", str(trace), "--format", "jsonl", "-o", str(jsonl)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ours = collections.Counter(e["function"] for e in map(json.loads, jsonl.read_text().splitlines())
                               if e["phase"] == "entry" and e["function"] in direct
                               and begin <= e["time_ns"] <= end)
    print(f"NFSv3 and v4.2: {text.splitlines()[-3:]}; bpftrace: {dict(theirs)}")
    assert theirs, f"bpftrace saw no call: {bt_out.read_text()[-2000:]}"
    return {"theirs": theirs, "ours": ours, "log": text, "trace": trace}


def _each_function_attached_or_named(trace, kind: str) -> collections.Counter:
    """Every function row of the trace attached as ``kind`` or holds the kernel's reason;
    the functions attached, counted by module."""
    rows = _attached_rows(trace)
    modules = _module_of()
    in_modules = collections.Counter(modules.get(name, "vmlinux") for name, how in rows
                                     if how == kind)
    failed = [(name, how) for name, how in rows if how != kind]
    print(f"attached {kind} by module: {dict(in_modules)}; not: {failed[:20]}")
    for name, how in failed:
        assert how.startswith(("failed: ", "entry only; exit failed: ")) \
            and len(how.split(": ", 1)[1]) > 10, (name, how)
    return in_modules


def test_nfs_fh_calls_per_function_equal_bpftrace(vm_kernel, nfs_mount, tmp_path):
    """One recording over both mounts (one bcc compile: the guest's TCG is slow)."""
    direct = _direct_methods()
    assert direct, "no function takes struct nfs_fh directly"
    r = _record_against_bpftrace(nfs_mount, tmp_path, direct)
    assert "probes: fentry/fexit on" in r["log"], r["log"]
    assert r["ours"] == r["theirs"]
    # the report of the trace renders
    out = tmp_path / "report"
    done = subprocess.run(CTRACER + ["callgraph", str(r["trace"]), "-o", str(out), "--no-plots",
                                     "--max-objects", "2"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert (out / "index.html").exists()


#: functions of three modules' BTF objects that the workload calls, each always with a
#: file handle (bpftrace counts every call of theirs)
MODULE_FUNCTIONS = {"nfs_fhget": "nfs", "decode_nfs_fh3": "nfsv3", "nfs3_proc_getattr": "nfsv3",
                    "encode_putfh": "nfsv4", "nfs4_proc_getattr": "nfsv4",
                    "decode_getfh": "nfsv4"}


@pytest.mark.vm(kernels=("7.2",))
def test_7_2_module_functions_on_tracing_multi_links(vm_kernel, nfs_mount, tmp_path):
    """On 7.2 the functions of the nfs, nfsv3 and nfsv4 modules are on tracing_multi
    links (their programs loaded once per module BTF object), each attached, and their
    calls per function are bpftrace's in the same run.  (The whole of nfs_fh's methods,
    as on 6.1 and 6.12 above, took 14 minutes of a loaded 7.2 guest: 120 functions, all
    attached, calls equal; this is its focused part.  Guest time on 2026-12-05: 10.5
    minutes with the NFS set-up, the guest sharing two cores with four others (load
    ~10), bcc's compile 57 s of it.)"""
    unique = _unique_text_symbols()
    modules = _module_of()
    assert {f: modules.get(f) for f in MODULE_FUNCTIONS if f in unique} == MODULE_FUNCTIONS
    r = _record_against_bpftrace(nfs_mount, tmp_path, dict.fromkeys(MODULE_FUNCTIONS),
                                 tuple(MODULE_FUNCTIONS))
    assert f"probes: fsession.multi on {len(MODULE_FUNCTIONS)} functions" in r["log"], \
        r["log"]
    assert " 0 failed" in r["log"], r["log"]
    in_modules = _each_function_attached_or_named(r["trace"], "fsession.multi")
    assert in_modules == collections.Counter(MODULE_FUNCTIONS.values()), in_modules
    assert set(r["theirs"]) == set(MODULE_FUNCTIONS), r["theirs"]
    assert r["ours"] == r["theirs"]


def test_a_command_records_the_file_handles_it_touches(vm_kernel, nfs_mount, tmp_path):
    point, _ = nfs_mount("4.2")
    trace = tmp_path / "cmd.ctrace"
    r = subprocess.run(CTRACER + ["trace", "struct", "nfs_fh", "-o", str(trace), "--",
                                  "sh", "-c", f"cat /etc/hostname > {point}/cmd-file && "
                                  f"cat {point}/cmd-file > /dev/null && ls -l {point} > /dev/null"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    summary = [line for line in r.stderr.splitlines() if line.startswith("ctracer: ")]
    events = int(next(line for line in summary if " events, " in line).split()[1])
    print(summary[-3:])
    assert events > 0
    jsonl = tmp_path / "cmd.jsonl"
    r = subprocess.run(CTRACER + ["export", str(trace), "--format", "jsonl", "-o", str(jsonl)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    # each handle first seen in the command's own processes (sh and the cat and ls it
    # runs; then followed everywhere, rpciod's workers too), through the client's
    # functions that take it: creating, looking up, getting attributes
    first_comm = {}
    for e in sorted(rows, key=lambda e: e["time_ns"]):
        first_comm.setdefault(e["object"], e["comm"])
    assert set(first_comm.values()) <= {"sh", "cat", "ls"}, first_comm
    called = {e["function"] for e in rows if e["phase"] == "entry"}
    assert called & set(_direct_methods()), called
