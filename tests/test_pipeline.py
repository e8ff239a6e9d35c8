"""ctracer.record.request: a trace request as plain data becomes a probe program and the trace
meta, for a program (uprobes) and for the kernel (raw tracepoints), with no argparse in
sight; options are checked before any C is generated."""

from __future__ import annotations

import os
import subprocess

import pytest

from support import groundtruth as gt
from ctracer.plan import selection
from ctracer.record import request as trace_request
from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.sources import TypeSource
from ctracer.errors import UsageError
from ctracer.probes.uprobe import UprobeProgram
from ctracer.probes.kernel_program import KernelProgram


@pytest.fixture(scope="module")
def sockdemo():
    subprocess.run(["make", "-s", "-C", os.path.join(gt.ROOT, "samples")], check=True)
    return gt.SOCKDEMO


def test_a_program_gets_uprobes(sockdemo):
    built = trace_request.build(trace_request.TraceRequest(
        ShapeKind.STRUCT, "sock", TypeSource(binary=sockdemo), functions=("tcp_*",),
        exclude=("tcp_accept",), follow_processes=True, argv=("ctracer", "x")))
    assert isinstance(built.program, UprobeProgram) and not built.is_kernel
    names = {f.name for f in built.program.functions}
    assert names and all(n.startswith("tcp_") for n in names) and "tcp_accept" not in names
    assert built.meta["traced"] == "user" and built.meta["binary"] == os.path.abspath(sockdemo)
    assert built.program.filtered


def test_kernel_only_options_are_refused_for_a_program(sockdemo):
    for extra in ({"where": "sk_state == 1"}, {"comm": "x"}, {"max_objects": 3},
                  {"objects": (0x1000,)}):
        with pytest.raises(UsageError):
            trace_request.build(trace_request.TraceRequest(ShapeKind.STRUCT, "sock",
                                                 TypeSource(binary=sockdemo), **extra))


@pytest.mark.kernel
def test_the_kernel_gets_raw_tracepoints():
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        pytest.skip("this kernel has no BTF")
    built = trace_request.build(trace_request.TraceRequest(
        ShapeKind.STRUCT, "sock", functions=("inet_sock_set_state", "tcp_*"),
        exclude=("tcp_probe",), where="skc_state == 1"))
    assert isinstance(built.program, KernelProgram) and built.is_kernel
    names = {t.name for t in built.program.tracepoints}
    assert "inet_sock_set_state" in names and "tcp_probe" not in names
    assert built.meta["traced"] == "kernel" and built.meta["binary"] is None
    assert built.meta["admission"]["where"] == "__sk_common.skc_state == TCP_ESTABLISHED"
    assert built.meta["probe_plan"]["counts"]["raw_tracepoint"]
    plan = built.meta["probe_plan"]
    assert plan["functions_planned"] > 1000
    if plan["entry_kind"] is None:   # this kernel attaches neither fentry nor kprobes
        assert not built.program.kfunctions
        assert plan["kinds"].startswith("no function probes (")
    else:
        assert {f.name for f in built.program.kfunctions} and \
            all(f.name.startswith("tcp_") for f in built.program.kfunctions)
    with pytest.raises(UsageError):
        trace_request.build(trace_request.TraceRequest(ShapeKind.STRUCT, "sock", buffer_mb=3))


@pytest.mark.kernel
def test_a_function_this_kernel_cannot_probe_is_said_so():
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        pytest.skip("this kernel has no BTF")
    from ctracer.errors import CtracerError
    request = trace_request.TraceRequest(ShapeKind.STRUCT, "sock", functions=("tcp_sendmsg",))
    try:
        built = trace_request.build(request)
    except CtracerError as e:   # a kernel attaching neither fentry nor kprobes (this one)
        assert "tcp_sendmsg cannot be probed here (" in str(e)
        assert "matches no method" not in str(e)
    else:
        assert [f.name for f in built.program.kfunctions] == ["tcp_sendmsg"]


@pytest.mark.parametrize("multi, functions, probes, expected, tracing", [
    (True, (), "auto", "kprobe", False),            # thousands: kprobe.multi's two links
    (True, ("tcp_send*",), "auto", "fentry", False),  # a few: fentry's cheaper calls
    (False, (), "auto", "kprobe", False),           # no kprobe.multi (6.1): perf kprobes
    (False, ("tcp_send*",), "auto", "fentry", False),  # a few there: fentry still
    (True, (), "fentry", "fentry", False),          # asked for
    # tracing_multi links: fentry's programs on two links, whatever the count
    (True, (), "auto", "fentry.multi", True),
    (True, ("tcp_send*",), "auto", "fentry.multi", True),
    (True, (), "kprobe", "kprobe", True),           # asked for
])
@pytest.mark.kernel
def test_auto_takes_kprobe_multi_for_thousands_of_functions(monkeypatch, multi, functions,
                                                            probes, expected, tracing):
    """The kind ``auto`` gives, on a kernel said (by a stand-in for the trial) to take
    fentry, kprobes and, or not, kprobe.multi links, and, or not, tracing_multi links."""
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        pytest.skip("this kernel has no BTF")
    from ctracer.host.facts import KernelFacts, Mechanism
    from ctracer.host import features
    works = Mechanism(True, "tried here (a stand-in)")
    facts = KernelFacts(fentry=works, kprobes=works, raw_tracepoints=works,
                        kprobe_multi=works if multi else Mechanism(False, "no fprobe"),
                        tracing_multi=works if tracing else Mechanism(False, "EINVAL"))
    monkeypatch.setattr(features, "kernel_facts", lambda *a, **k: facts)
    built = trace_request.build(trace_request.TraceRequest(
        ShapeKind.STRUCT, "sock", functions=functions, function_probes=probes))
    assert built.program.entry_kind == expected
    count = len(built.program.kfunctions)
    assert (count > selection.FENTRY_AUTO_MAX) == (not functions)
    kinds = built.meta["probe_plan"]["kinds"]
    assert ("kprobe.multi links attach and detach them all at once" in kinds) == \
        (expected == "kprobe" and probes == "auto" and multi), kinds
    assert ("functions: one perf kprobe each (no kprobe.multi link here) attaches" in kinds) \
        == (expected == "kprobe" and probes == "auto" and not multi), kinds
    assert kinds.startswith(f"{expected}/")
    if expected == "fentry.multi":
        assert "fentry.multi/fexit.multi on" in kinds and "tracing_multi links" in kinds
        assert "ctracer_fentry_r1" in built.program.text   # fentry's own programs
