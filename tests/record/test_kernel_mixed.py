"""One recording on two function-probe kinds, on this host's struct sock (its BTF): the
functions a BPF trampoline cannot take (more than 12 arguments, a struct returned by
value, variable arguments) planned on kprobes beside fentry.multi, their descriptors
read by kprobe programs, one text holding both kinds' programs that bcc compiles and
whose kprobe programs this kernel's verifier takes, and the fallback's kprobe programs
for the functions the kernel refuses the trampoline on, compiled apart on the
recording's maps.  The load and attach of both kinds
is proven in the 7.2 guest (tests/vm/test_mixed_kinds.py)."""

from __future__ import annotations

import os

import pytest

from ctracer.host.facts import Mechanism

YES = Mechanism(True, "tried: works")


@pytest.fixture(scope="module")
def sock():
    from ctracer.debuginfo.btf import reader as btf
    from ctracer.debuginfo.catalog import ShapeKind
    from ctracer.plan import discovery, mini
    model = btf.open_btf("/sys/kernel/btf/vmlinux")
    catalog = model.catalog()
    found = discovery.discover(catalog, "sock")
    layout = mini.build_mini(model.find_struct("sock", ShapeKind.STRUCT)).layout
    return found.methods, layout, catalog


def _mixed_plan(methods):
    """The plan of a kernel taking tracing_multi links and kprobe.multi ones, for this
    kernel's functions."""
    from ctracer.host.facts import KernelFacts
    from ctracer.plan.attach import plan_probes
    facts = KernelFacts(fentry=YES, kprobes=YES, kprobe_multi=YES, tracing_multi=YES,
                        raw_tracepoints=YES)
    return plan_probes(methods, facts)


def _program(methods, layout, catalog, task_storage=True):
    from ctracer.plan.attach import mixed_in
    from ctracer.probes.kernel_program import build_kernel_program
    plan = _mixed_plan(methods)
    entries = plan.of_kind("fentry.multi", "kprobe")
    kinds = {m.key: p.kind for p in entries if mixed_in(p) for m in p.methods}
    program = build_kernel_program((), layout, catalog,
                                   function_methods=[m for p in entries for m in p.methods],
                                   entry_kind="fentry.multi", function_kinds=kinds,
                                   fallback_kind="kprobe", task_storage=task_storage)
    return plan, kinds, program


@pytest.mark.kernel
def test_the_trampolines_refusals_go_on_kprobes_with_registers_kprobes_read(sock):
    methods, layout, catalog = sock
    plan, kinds, program = _program(methods, layout, catalog)
    by_key = {f.key: f for f in program.kfunctions}
    assert kinds, "this kernel's sock has methods a trampoline cannot take"
    assert set(kinds.values()) == {"kprobe"}
    for key in kinds:
        f = by_key.get(key)
        if f is None:   # skipped, with its reason in the functions table
            rows = [r for r in program.rows if r.name == key.split("@")[0]]
            assert rows and all(r.attached.startswith("skipped: ") for r in rows), key
            continue
        assert f.kind == "kprobe" and f.kprobe_ready
        assert program.kinds_of(f) == ("kprobe", "kretprobe")
    # the others run fentry.multi's programs only: the text holds the kprobe programs of
    # the functions planned on kprobes, not the fallback's (`fallback_text`)
    others = [f for f in program.kfunctions if f.key not in kinds]
    assert others and all(f.kind == "fentry.multi" for f in others)
    assert all(program.kinds_of(f) == ("fentry.multi", "fexit.multi") for f in others)
    assert program.entry_kinds == {"fentry.multi": len(others),
                                   "kprobe": len(program.kfunctions) - len(others)}
    names = program.program_names()
    assert any(n.startswith("ctracer_fentry_r") for n in names)
    planned = {f.program(k) for f in program.kfunctions if f.kind == "kprobe"
               for k in ("kprobe", "kretprobe")}
    assert planned and {n for n in names if n.startswith("ctracer_k")} == planned
    assert all(f"{n}(" in program.text for n in names)


@pytest.mark.kernel
def test_the_fallbacks_text_holds_the_kprobe_programs_of_the_refused_functions_only(sock):
    """`fallback_text`: kprobe and kretprobe programs for the route counts of the
    functions given, with the text's maps, and no tracepoint or trampoline program;
    the recording's text holds none of those the planned kprobes do not use."""
    import re
    methods, layout, catalog = sock
    _, kinds, program = _program(methods, layout, catalog)
    ready = [f for f in program.kfunctions if f.key not in kinds and f.kprobe_ready]
    widest = max(ready, key=lambda f: f.route_count)
    text = program.fallback_text([widest])
    defined = set(re.findall(r"^int (ctracer_\w+)\(", text, re.M))
    assert defined == {widest.program(k, storage) for k in ("kprobe", "kretprobe")
                       for storage in (True, False)}, defined
    maps = set(re.findall(r"^BPF_\w+\((?:\"\w+\", [^,]+, [^,]+, )?(ctracer_\w+)", program.text,
                          re.M))
    assert maps and maps == set(re.findall(
        r"^BPF_\w+\((?:\"\w+\", [^,]+, [^,]+, )?(ctracer_\w+)", text, re.M))
    planned = {f.route_count for f in program.kfunctions if f.kind == "kprobe"}
    if widest.route_count not in planned:
        assert f"{widest.program('kprobe')}(" not in program.text


@pytest.mark.kernel
def test_tcp_v6_send_response_on_kprobes_reads_its_socket_and_skb_in_registers(sock):
    """14 arguments: no trampoline takes it; its socket (argument 1) and its skb's
    owner (argument 2, skb->sk) are in the first two registers, which a kprobe reads."""
    methods, layout, catalog = sock
    if not any(m.name == "tcp_v6_send_response" for m in methods):
        pytest.skip("this kernel's BTF has no tcp_v6_send_response")
    plan, kinds, program = _program(methods, layout, catalog)
    entry = plan.by_function()["tcp_v6_send_response"][0]
    assert entry.kind == "kprobe" and "14 arguments" in entry.reason
    (f,) = [f for f in program.kfunctions if f.name == "tcp_v6_send_response"]
    assert f.kind == "kprobe" and sorted(s.reg for s in f.routes) == [0, 1]
    assert len(f.args) == 6   # the first six arguments recorded, from the registers


@pytest.mark.kernel
@pytest.mark.bpf
def test_both_kinds_compile_in_one_text_and_the_kprobe_ones_pass_the_verifier(bpf, sock):
    """bcc compiles the text holding fentry.multi's and kprobe's programs once; every
    kprobe and kretprobe program of it (task storage and LRU-hash variants) passes this
    kernel's verifier (fentry programs are refused here: EPERM)."""
    from ctracer.host import features
    from ctracer.record import bpf_runtime
    support = features.probe_support()
    if not support.kprobe_programs.works:
        pytest.skip(f"kprobe-type programs do not load here: {support.kprobe_programs.why}")
    methods, layout, catalog = sock
    _, _, program = _program(methods, layout, catalog)
    names = sorted(set(program.program_names() + program.program_names(task_storage=False)))
    kprobe_names = [n for n in names if n.startswith(("ctracer_kprobe", "ctracer_kretprobe"))]
    assert kprobe_names and len(kprobe_names) < len(names)
    results = bpf_runtime.verify_programs(program.text, kprobe_names)
    assert results and all(v == "" for v in results.values()), results


@pytest.mark.kernel
def test_the_probes_line_names_each_kind_and_why(sock):
    """What ``ctracer trace`` says before recording: the trampoline kind with the plan's
    reason, the kprobe functions with the trampoline's limits and their names, and the
    fallback tried on what the kernel refuses."""
    from ctracer.plan.selection import KernelChoice
    from ctracer.record.request import _kinds_line
    methods, layout, catalog = sock
    _, kinds, program = _program(methods, layout, catalog)
    choice = KernelChoice([], [], "fentry.multi", {"reason": "tracing_multi links work here",
                                                   "function_probes": "auto"})
    line = _kinds_line(program, choice, 7)
    n = program.entry_kinds
    assert line.startswith(f"fentry.multi/fexit.multi on {n['fentry.multi']} functions "
                           "(tracing_multi links work here); kprobe/kretprobe on "
                           f"{n['kprobe']} function")
    assert "(fentry.multi cannot take them: more than 12 arguments" in line
    assert line.endswith("; kprobe tried on any the kernel refuses fentry.multi on; raw "
                         "tracepoints on 7")
    shown = [f.name for f in program.kfunctions if f.kind == "kprobe"][:3]
    assert all(name in line for name in shown)


@pytest.mark.kernel
@pytest.mark.bpf
def test_the_fallbacks_programs_compile_apart_on_the_recordings_maps(bpf, sock):
    """What a recording compiles once the kernel has refused functions
    (`ProbeSession.fallback_instructions`): a second, small bcc compile whose programs
    refer only to the session's own maps (the ring buffer, the functions' table...), whose
    time counts as compile time, and whose kprobe programs this kernel's verifier takes
    as they will be loaded."""
    from ctracer.host import features
    from ctracer.probes import map_refs
    from ctracer.record import bpf_runtime
    from ctracer.record.kattach import load_program
    methods, layout, catalog = sock
    _, kinds, program = _program(methods, layout, catalog)
    ready = [f for f in program.kfunctions if f.key not in kinds and f.kprobe_ready]
    refused = [max(ready, key=lambda f: f.route_count), min(ready, key=lambda f: f.route_count)]
    session = bpf_runtime.ProbeSession(program, None, lambda *a, **k: None)
    session.compile()
    try:
        before = session.compile_seconds
        code = session.fallback_instructions(refused)
        assert session.compile_seconds > before
        assert set(code) == {f.program(k, s) for f in refused for k in ("kprobe", "kretprobe")
                             for s in (True, False)}
        ours = {bpf_runtime._table_fd(session.bpf, n): n
                for n in bpf_runtime._table_names(session.bpf)}
        used = {ours.get(fd, fd) for insns in code.values() for _, fd in map_refs.map_fds(insns)}
        assert {"ctracer_events", "ctracer_kfns", "ctracer_stopped"} <= used <= set(ours.values())
        if not features.probe_support().kprobe_programs.works:
            pytest.skip("kprobe-type programs do not load here")
        for name, insns in sorted(code.items()):
            fd, why = load_program(insns, 2, name=name.encode())
            assert fd >= 0, (name, why)
            os.close(fd)
    finally:
        session.close()
