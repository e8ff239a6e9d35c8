"""`ctracer trace --tail` names each event's object as the report, its folders and the
exports do: ``0x…`` for an address's first lifetime, ``0x…-2`` for its second
(`ctracer.record.live_objects` counts lifetimes by the report's rules as events
arrive).  Real recordings: the kernel's sock and sk_buff over tcploop (tracepoint
rules, announced stores, time-wait heads), and the user-space sample (creation
functions, one nested in another).  Each tail line's name is compared with the export
of the same trace, per name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from support import groundtruth as gt
from support import kernelrun as kr
from ctracer.decode import object_name
from ctracer.report import render_report
from ctracer.tracefile import Trace


def _record(tmp_path, argv):
    out = tmp_path / "t.ctrace"
    r = subprocess.run([sys.executable, "-m", "ctracer", "trace", *argv[0], "--tail", "-o",
                        str(out), "--", *argv[1]], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln.split() for ln in r.stdout.splitlines()]
    tail = [(ln[1], ln[2], ln[3]) for ln in lines if len(ln) > 3 and ln[1].startswith("0x")]
    r = subprocess.run([sys.executable, "-m", "ctracer", "export", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    report = Counter(object_name(int(e["object"], 16), e["lifetime"]) if e["object"]
                     else "0x0" for e in events)
    assert len(tail) == Trace(str(out)).event_count()  # a line per event recorded
    render_report(str(out), str(tmp_path / "report"), plots=False)
    folders = {p.name for p in (tmp_path / "report").glob("0x*")}
    assert folders == set(report) - {"0x0"}  # an object's name is its pages' folder
    return tail, report


@pytest.mark.bpf
@pytest.mark.parametrize("struct", ["sock", "sk_buff"])
def test_tail_names_kernel_objects_as_the_report_does(tmp_path, struct):
    kr.bpf_or_skip()
    workload = kr.workload_copy(tmp_path)
    tail, report = _record(tmp_path, (["struct", struct], [
        workload, "--connections", "6", "--port", str(kr.free_port())]))
    assert Counter(name for name, _, _ in tail) == report  # tracepoints: no exit to wait for
    assert any(name.endswith("-2") for name in report)  # addresses reused in the run


@pytest.mark.bpf
def test_tail_names_program_objects_as_the_report_does(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("not root: uprobes need root")
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    tail, report = _record(tmp_path, (["struct", "sock", "--binary", gt.SOCKDEMO],
                                      [gt.SOCKDEMO]))
    # an entry whose object is known only at its exit (a creation function's) has
    # none yet in the tail, which shows 0x0; the report gives it the object its exit
    # returned, or folds it as a repeat of the call's other way to its object; every
    # other line is named as the report names it
    named = Counter(name for name, _, _ in tail)
    assert named["0x0"] > report["0x0"]
    assert all(how == "entry" for name, _, how in tail if name == "0x0")
    assert set(named) - {"0x0"} == set(report) - {"0x0"}
    assert all(report[name] >= named[name] for name in report if name != "0x0")
    assert any(name.endswith("-2") for name in report)
