"""``trace --calls changes``: calls that changed nothing are counted in the kernel, not
written (`ctracer.probes.folding`, `ctracer.record.folds`, `ctracer.analysis.folds`).

* real uprobes: the sample recorded twice deterministically (one thread, no address
  randomisation), with ``--calls all`` and ``--calls changes``: per (object, function)
  the call counts and every call-graph edge are the same, with fewer events, and the
  report says the mode and how many calls were folded;
* a recording killed with SIGKILL keeps the folded counts committed before the kill;
* the analysis places folded rows on the right lifetime of a reused address and adds
  them to call graphs on the edge from their caller (no BPF);
* bad input: an unknown word, or folding without compact events: one line, non-zero.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

from support import groundtruth as gt


def _record(work, calls, *extra):
    out = work / f"{calls}.ctrace"
    r = subprocess.run(["setarch", "-R", sys.executable, "-m", "ctracer", "trace", "struct",
                        "sock", "--binary", gt.SOCKDEMO, "-o", str(out), "--calls", calls,
                        *extra, "--", gt.SOCKDEMO, "--loops", "30", "--threads", "1"],
                       capture_output=True, text=True, cwd=work, timeout=900)
    assert r.returncode == 0, r.stderr
    return out, r.stderr


def _counts(path):
    """Per (object index, function): calls; per (object index or "all", caller, callee):
    call-graph edge counts; and the analysis."""
    from ctracer import analysis
    from ctracer.analysis.callgraph import call_counts, with_folded

    a = analysis.load(str(path))
    calls, edges = {}, {}
    ev = a.events
    for i in range(len(a.objects)):
        for fid, stats in a.object_methods(i).items():
            calls[(i, a.function_name(fid))] = stats.calls
        graph = with_folded(a, call_counts(ev, a.objects.events(i), ev.object_caller), i)
        for (caller, callee), n in zip(graph.edges, graph.edge_calls):
            edges[(i, caller, callee)] = n
    graph = with_folded(a, call_counts(ev, np.arange(len(ev)), ev.thread_caller))
    for (caller, callee), n in zip(graph.edges, graph.edge_calls):
        edges[("all", caller, callee)] = n
    return a, calls, edges


@pytest.mark.bpf
def test_folded_counts_equal_every_call_written(bpf, tmp_path):
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    every, _ = _record(tmp_path, "all")
    changes, said = _record(tmp_path, "changes")
    assert "calls: changes: " in said and "counted, not written" in said
    a, calls_all, edges_all = _counts(every)
    b, calls_changes, edges_changes = _counts(changes)
    assert (a.calls_mode, b.calls_mode) == ("all", "changes")
    assert b.folded.total_calls > 0 and b.folded.unplaced == 0
    # the folded calls are missing as events, two each, and nothing else is
    assert b.counts.recorded == a.counts.recorded - 2 * b.folded.total_calls
    assert calls_changes == calls_all
    assert edges_changes == edges_all
    assert sum(s.folded for s in b.methods.values()) == b.folded.total_calls
    # the report says the mode and what its counts cover
    r = subprocess.run([sys.executable, "-m", "ctracer", "report", str(changes), "-o",
                        str(tmp_path / "report"), "--no-plots"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    total = sum(s.calls for s in b.methods.values())
    cover = f"{total:,} calls, {b.folded.total_calls:,} of them folded: changed nothing"
    assert "--calls changes" in (tmp_path / "report" / "index.html").read_text()
    assert cover in (tmp_path / "report" / "methods" / "index.html").read_text()
    # the export carries them beside the events
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(changes), "-o",
                        str(tmp_path / "changes.jsonl")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    import json
    rows = [json.loads(line) for line in
            (tmp_path / "changes.folded-calls.jsonl").read_text().splitlines()]
    assert sum(row["calls"] for row in rows) == b.folded.total_calls
    assert {(row["object"], row["function"]) for row in rows} <= \
        {(b.objects.labels[i], f) for i, f in calls_changes}


def _folded_rows(path) -> int:
    if not os.path.exists(path):
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT coalesce(sum(calls), 0) FROM folded_calls").fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        db.close()


@pytest.mark.bpf
def test_sigkill_keeps_the_folded_counts_committed(bpf, tmp_path):
    out = tmp_path / "killed.ctrace"
    tracer = subprocess.Popen(
        [sys.executable, "-m", "ctracer", "trace", "sock", "--binary", gt.SOCKDEMO, "-o",
         str(out), "--calls", "changes", "--", gt.SOCKDEMO, "--loops", "1000000",
         "--delay-ms", "5"],
        stderr=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while _folded_rows(out) < 50:
            assert time.monotonic() < deadline, "no folded call was ever committed"
            assert tracer.poll() is None
            time.sleep(0.1)
        seen = _folded_rows(out)
        os.killpg(tracer.pid, signal.SIGKILL)
        tracer.wait()
    finally:
        if tracer.poll() is None:
            os.killpg(tracer.pid, signal.SIGKILL)
    from ctracer import analysis
    a = analysis.load(str(out))
    assert a.incomplete and a.calls_mode == "changes"
    assert a.folded.total_calls + a.folded.unplaced >= seen


def test_folded_rows_go_to_the_lifetime_of_their_last_written_event():
    from ctracer.analysis import folds

    # address 0x10: object 0 until t=100, object 2 from t=100 on; 0x20: object 1
    address = np.array([0x10, 0x20, 0x10, 0x10], np.uint64)
    ts = np.array([10, 20, 100, 150], np.int64)
    obj = np.array([0, 1, 2, 2], np.int64)
    table = {"object": np.array([0x10, 0x10, 0x20, 0x30], np.uint64),
             "function_id": np.array([5, 5, 6, 6], np.int32),
             "caller_id": np.array([0, 7, 7, 0], np.int32),
             "caller_object": np.array([0, 0x10, 0x10, 0], np.uint64),
             "calls": np.array([3, 4, 5, 6], np.int64),
             "total_ns": np.array([30, 40, 50, 60], np.int64),
             "max_ns": np.array([11, 12, 13, 14], np.int64),
             "first_ns": np.array([12, 120, 30, 1], np.int64),
             "last_ns": np.array([50, 140, 40, 2], np.int64),
             "since_ns": np.array([10, 100, 20, 0], np.int64)}
    placed = folds.place(table, address, ts, obj, {7: 8})
    assert placed.object.tolist() == [0, 2, 1]
    assert placed.caller.tolist() == [-1, 8, 8]           # row 7 stands for function 8
    assert placed.same_object.tolist() == [False, True, False]
    assert placed.unplaced == 6                             # 0x30 has no written event
    assert placed.per_function(np.arange(3)) == {5: (7, 70, 12), 6: (5, 50, 13)}


def test_folded_calls_hang_from_their_caller_in_call_graphs():
    from ctracer.analysis.callgraph import ROOT, CallGraphCounts, add_folded

    counts = CallGraphCounts([1, 2], [1, 2], [100, 20], [(ROOT, 1), (1, 2)], [1, 2])
    out = add_folded(counts, np.array([2, 3]), np.array([1, ROOT]), np.array([10, 4]),
                     np.array([50, 8]))
    assert dict(zip(out.functions, out.calls)) == {1: 1, 2: 12, 3: 4}
    assert dict(zip(out.functions, out.total_ns)) == {1: 100, 2: 70, 3: 8}
    assert dict(zip(out.edges, out.edge_calls)) == {(ROOT, 1): 1, (1, 2): 12, (ROOT, 3): 4}


@pytest.mark.parametrize("args, says", [
    (["--calls", "some"], "argument --calls: invalid choice: 'some'"),
    (["--calls", "changes", "--full-snapshots"], "--calls changes folds calls against"),
])
def test_bad_calls_is_one_line(tmp_path, args, says):
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock",
                        "--binary", gt.SOCKDEMO, "--print-bpf", *args],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr


def test_the_probes_fold_only_when_asked():
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock",
                        "--binary", gt.SOCKDEMO, "--print-bpf", "--calls", "changes"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ctracer_defer_or_fold(w, (u32)pid_tgid)" in r.stdout
    assert "ctracer_frames.update(&fk, &fr);" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", "struct", "sock",
                        "--binary", gt.SOCKDEMO, "--print-bpf"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ctracer_defer_or_fold" not in r.stdout


@pytest.mark.kernel
@pytest.mark.bpf
@pytest.mark.parametrize("storage", [True, False])
def test_kprobe_programs_fold_within_the_stack_and_pass_the_verifier(bpf, storage):
    """With the fold, the kprobe and kretprobe programs keep their call state in a
    per-CPU buffer, not on BPF's 512-byte stack (clang refused them before): every
    program of every route count of struct sock's methods compiles and passes this
    kernel's verifier (kprobes cannot attach here, kprobe-type programs load).  The
    same programs run on kprobe.multi links and perf kprobes."""
    from ctracer.debuginfo.btf import reader as btf
    from ctracer.debuginfo.catalog import ShapeKind
    from ctracer.host import features
    from ctracer.plan import attach, discovery, mini
    from ctracer.probes.kernel_program import build_kernel_program
    from ctracer.record import bpf_runtime
    support = features.probe_support()
    if not support.kprobe_programs.works:
        pytest.skip(f"kprobe-type programs do not load here: {support.kprobe_programs.why}")
    model = btf.open_btf("/sys/kernel/btf/vmlinux")
    catalog = model.catalog()
    found = discovery.discover(catalog, "sock")
    facts = features.kernel_facts([m.name for m in found.methods if not m.is_tracepoint],
                                  [m.name for m in found.methods if m.is_tracepoint],
                                  support=support)
    plan = attach.plan_probes(found.methods, facts)
    functions = [m for p in plan.of_kind("kprobe") for m in p.methods]
    tracepoints = [m for p in plan.of_kind("raw_tracepoint") for m in p.methods]
    layout = mini.build_mini(model.find_struct("sock", ShapeKind.STRUCT)).layout
    program = build_kernel_program(tracepoints, layout, catalog, function_methods=functions,
                                   entry_kind="kprobe", task_storage=storage, compact=True,
                                   calls="changes")
    assert "ctracer_defer_or_fold" in program.text
    assert "struct ctracer_kprobe_work *kw;" in program.text
    names = sorted(set(program.program_names() + program.program_names(task_storage=False)))
    assert {n.split("_r")[-1].split("_")[0] for n in names} == {"1", "2", "4", "8"}
    results = bpf_runtime.verify_programs(program.text, names)
    assert results and all(v == "" for v in results.values()), results
