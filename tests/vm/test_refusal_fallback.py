"""A function the kernel refuses on a tracing_multi link, recorded by kprobes in the same
recording (the refusal fallback: `ctracer.record.kattach`), in the 7.2 guest.

``__x64_sys_exit_group`` takes ``struct pt_regs`` and nothing in its BTF prototype stops a
trampoline (the plan puts it on fsession.multi, 7.2's kind), but it never returns, and the
kernel refuses to attach an exit or a session program to a function on its
``noreturn_deny`` list: the session link holding it is refused, so ctracer links the
others without it and tries it on kprobes, compiling their programs only then (a second,
small bcc compile on the recording's maps).  Beside it, ``__x64_sys_close`` stays on the
session link.  The workload's processes all have one name (a copy of ``true``), each
calling exit_group once; bpftrace's kprobe counts the calls per pt_regs of that name in
the same run.  Checked: the plan, the summary and the trace's meta name the refusal and
the kinds attached, the calls per object are bpftrace's, and nothing stays attached.

7.2 only: 6.1 and 6.12 attach per-function fentry, where a refusal stays refused (no
fallback: docs/tracing-the-kernel.md)."""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys

import pytest

from support.kernelrun import stop_bpftrace, wait_for_text

pytestmark = pytest.mark.vm(kernels=("7.2",))

CTRACER = [sys.executable, "-m", "ctracer"]
REFUSED, KEPT = "__x64_sys_exit_group", "__x64_sys_close"
#: the workload's processes' name (a copy of true): bpftrace counts that name's calls
NAME = "ctrfallbk"
PROCESSES = 4


@pytest.fixture(scope="module")
def refusal_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refusal")
    program = tmp / NAME
    shutil.copy(shutil.which("true"), program)
    plan = subprocess.run(CTRACER + ["plan", "struct", "pt_regs", "--json", "--functions",
                                     REFUSED, KEPT], capture_output=True, text=True,
                          timeout=900)
    assert plan.returncode == 0, plan.stderr
    bt_out = tmp / "bpftrace.txt"
    bt = subprocess.Popen(["bpftrace", "-B", "line", "-e",
                           f'kprobe:{REFUSED} /comm == "{NAME}"/ '
                           '{ printf("call %llu\\n", (uint64)arg0); }'],
                          stdout=open(bt_out, "w"), stderr=subprocess.STDOUT)
    wait_for_text(bt_out, "Attaching", bt, 900)
    trace, log = tmp / "regs.ctrace", tmp / "ctracer.log"
    # the last one by exec: the shell's own exit_group is under the name too
    script = "; ".join([str(program)] * (PROCESSES - 1) + [f"exec {program}"])
    done = subprocess.run(CTRACER + ["trace", "struct", "pt_regs", "--functions", REFUSED,
                                     KEPT, "-o", str(trace), "--", "sh", "-c", script],
                          stdout=open(log, "w"), stderr=subprocess.STDOUT, timeout=1800)
    stop_bpftrace(bt, bt_out)
    print(log.read_text())
    assert done.returncode == 0, log.read_text()
    calls = collections.Counter(int(line.split()[1]) for line in bt_out.read_text().splitlines()
                                if line.startswith("call "))
    jsonl = tmp / "regs.jsonl"
    export = subprocess.run(CTRACER + ["export", str(trace), "--format", "jsonl", "-o",
                                       str(jsonl)], capture_output=True, text=True, timeout=600)
    assert export.returncode == 0, export.stderr
    from ctracer.tracefile import Trace
    t = Trace(str(trace))
    meta = {name: t.meta_json(name) for name in ("attached_kinds", "kprobes_after_refusal")}
    t.close()
    return {"plan": json.loads(plan.stdout), "log": log.read_text(), "calls": calls,
            "events": [json.loads(line) for line in jsonl.read_text().splitlines()],
            "meta": meta}


def test_the_plan_puts_both_on_the_session_link_and_the_kernel_refuses_one(vm_kernel,
                                                                           refusal_run):
    kinds: dict = {}
    for p in refusal_run["plan"]["probes"]:
        kinds.setdefault(p["function"], p["kind"])
    assert kinds == {REFUSED: "fsession.multi", KEPT: "fsession.multi"}, kinds
    assert not refusal_run["plan"]["kernel"]["mixed"]
    log = refusal_run["log"]
    assert "probes: fsession.multi on 2 functions (" in log, log
    assert "; kprobe tried on any the kernel refuses fsession.multi on" in log, log
    assert "(kernel functions: 1 on fsession.multi, 1 on kprobe), 0 failed" in log, log
    assert f"{REFUSED}: on kprobes, as the kernel refused the trampoline: " in log, log
    refusals = refusal_run["meta"]["kprobes_after_refusal"]
    assert [name for name, _ in refusals] == [REFUSED], refusals
    why = refusals[0][1]
    assert why.startswith("failed: the kernel refused it on a tracing_multi link"), why
    assert REFUSED in why, why   # the kernel's own line, read from a plain fexit load
    assert refusal_run["meta"]["attached_kinds"] == {"fsession.multi": 1, "kprobe": 1}


def test_its_calls_are_recorded_by_kprobes_as_bpftrace_counts_them(vm_kernel, refusal_run):
    theirs = refusal_run["calls"]
    assert sum(theirs.values()) == PROCESSES, theirs
    events = refusal_run["events"]
    ours = collections.Counter(int(e["object"], 16) for e in events
                               if e["function"] == REFUSED and e["phase"] == "entry")
    assert ours == theirs
    # it never returns: no exit recorded; the function kept on the session link records both
    assert not any(e["function"] == REFUSED and e["phase"] == "exit" for e in events)
    kept = collections.Counter(e["phase"] for e in events if e["function"] == KEPT)
    assert kept["entry"] >= PROCESSES and kept["exit"] == kept["entry"], kept
    out = subprocess.run(["bpftool", "prog", "show"], capture_output=True, text=True).stdout
    assert [line for line in out.splitlines() if "ctracer_" in line] == []
