"""Proof by the verifier: every program a probe plan could use, loaded and never attached.

For kernel functions the plan's kprobe/kretprobe entries become the programs of
`ctracer.probes.kfunctions` (an entry and an exit program per route count, shared by
every function: what a recording attaches);
for a user-space binary its uprobe/uretprobe entries become the programs of
`ctracer.probes.uprobe`.  Both are kprobe-type programs, which a kernel loads (runs
through its verifier) even when it cannot attach kprobes, so a plan this kernel cannot
place is still checked program by program, each rejection with the verifier's message.

Kernel functions share a handful of programs, compiled once whatever their number.  What
a verdict proves: the program that function would run passes the verifier (the program
reads what it needs of the function from a map, so one verdict holds for all of them).
A kprobe-type program is not bound to a function when it is loaded, so it does not prove
that the function could be attached; `ctracer.plan.attach` says that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ctracer.plan.attach import PlannedProbe, ProbePlan



@dataclass
class Verdicts:
    """(verified, error) per planned probe; ``note`` says what was and was not tried."""

    by_probe: dict[tuple[str, str], tuple[Optional[bool], str]] = field(default_factory=dict)
    untried: str = "not tried"
    note: str = ""
    programs: int = 0
    compile_seconds: float = 0.0
    load_seconds: float = 0.0

    def get(self, probe: PlannedProbe) -> tuple[Optional[bool], str]:
        """The verifier's verdict on ``probe`` (True, False, None: not tried) and why."""
        return self.by_probe.get((probe.function, probe.kind or ""), (None, self.untried))

    def counts(self) -> dict[str, int]:
        """How many probes the verifier accepted and rejected."""
        out = {"accepted": 0, "rejected": 0}
        for ok, _ in self.by_probe.values():
            if ok is True:
                out["accepted"] += 1
            elif ok is False:
                out["rejected"] += 1
        return out


def verify_plan(plan: ProbePlan, graph, *, binary: Optional[str] = None, catalog=None,
                progress: Optional[Callable[[str], None]] = None,
                cachelines: Sequence[int] = (), max_bytes: Optional[int] = None) -> Verdicts:
    """Load the plan's kprobe/kretprobe and raw tracepoint (kernel; the tracepoints'
    parameter names come from ``catalog``) or uprobe/uretprobe (``binary``) programs
    through the verifier; ``graph`` is the struct's type graph (its mini struct, with the
    collectors of complex members and the selection ``cachelines`` and ``max_bytes``, is
    what the programs snapshot)."""
    from ctracer.collectors import registry
    from ctracer.errors import BPFUnavailable
    from ctracer.plan import mini
    from ctracer.record import bpf_runtime

    try:
        bpf_runtime.check_privileges()
    except BPFUnavailable:
        raise BPFUnavailable("--verify loads BPF programs through the kernel's verifier, "
                             "which needs root (or CAP_BPF and CAP_PERFMON): run it as root, "
                             "e.g. with sudo") from None
    verdicts = Verdicts(untried="not tried: ctracer plan --verify loads kprobe, kretprobe, "
                                "raw tracepoint, uprobe and uretprobe programs, not fentry "
                                "or fexit ones")
    facts = plan.facts
    if facts.kprobe_programs.works is False:
        verdicts.untried = f"cannot be tried here: {facts.kprobe_programs.why}"
        return verdicts
    layout = mini.build_mini(graph, cachelines=cachelines, max_bytes=max_bytes,
                             kinds=registry.claim).layout
    if plan.space == "user":
        _verify_user(plan, layout, binary, verdicts)
    else:
        _verify_kernel(plan, layout, verdicts, progress, catalog)
        if catalog is not None and plan.facts.raw_tracepoints.works is not False:
            _verify_tracepoints(plan, layout, catalog, verdicts)
    c = verdicts.counts()
    verdicts.note = (f"{verdicts.programs} programs loaded in {verdicts.load_seconds:.1f} s "
                     f"after {verdicts.compile_seconds:.1f} s of compiling; "
                     f"{c['accepted']} accepted, {c['rejected']} rejected")
    return verdicts


def _verify_kernel(plan: ProbePlan, layout, verdicts: Verdicts,
                   progress: Optional[Callable[[str], None]], catalog=None) -> None:
    """The kprobe and kretprobe programs a recording would attach
    (`ctracer.probes.kfunctions`: one per route count, shared by every function), loaded
    through the verifier; a function's verdict is that of the programs it would use."""
    from ctracer.probes.kernel_program import build_kernel_program
    from ctracer.record import bpf_runtime

    entries = plan.of_kind("kprobe")
    if not entries:
        return
    from ctracer.host.features import task_storage_works
    # the catalog gives the size of a struct returned by value (a large one moves the
    # arguments a register on: `ctracer.probes.kfunctions.plan_kernel_functions`)
    program = build_kernel_program((), layout, catalog, entry_kind="kprobe",
                                   function_methods=[m for p in entries for m in p.methods],
                                   task_storage=task_storage_works("kprobe").works is not False)
    began = time.monotonic()
    names = program.program_names() + (program.program_names(task_storage=False)
                                       if program.task_storage else [])
    results = bpf_runtime.verify_programs(program.text, names, timing=verdicts)
    verdicts.programs += len(results)
    storage = program.task_storage and not _storage_refused(program, results)
    by_key = {f.key: f for f in program.kfunctions}
    skipped = {r.name: r.attached for r in program.rows if r.attached}
    for p in entries:
        f = by_key.get(p.function)
        for kind in ("kprobe", "kretprobe"):
            if f is None:
                why = skipped.get(p.target, "no program generated")
                verdicts.by_probe[(p.function, kind)] = (None, f"no program generated: {why}")
            else:
                error = results.get(f.program(kind, storage), "not loaded")
                verdicts.by_probe[(p.function, kind)] = (not error, error)
    if progress:
        progress(f"verified the {len(results)} kprobe programs of {len(by_key)} functions "
                 f"({time.monotonic() - began:.0f} s)")


def _storage_refused(program, results: dict[str, str]) -> bool:
    """Whether the verifier refused a task-storage program whose LRU-hash variant it
    took: a recording then loads the LRU-hash variants of every program of the kind
    (`ctracer.record.kattach.KernelLinks`), so those are the ones verified."""
    from ctracer.probes.kfunctions import HASHED_SUFFIX
    return any(results.get(name) and results.get(name + HASHED_SUFFIX) == ""
               for name in program.program_names())


def _verify_tracepoints(plan: ProbePlan, layout, catalog, verdicts: Verdicts) -> None:
    """The raw tracepoint programs a recording loads (`ctracer.probes.tracepoint`, with no
    filter): one per route count, shared by the tracepoints (each loads it with its index
    written in: the verifier's verdict holds for all of them)."""
    from ctracer.probes.kernel_program import build_kernel_program
    from ctracer.record import bpf_runtime

    entries = plan.of_kind("raw_tracepoint")
    if not entries:
        return
    program = build_kernel_program([m for p in entries for m in p.methods], layout, catalog)
    results = bpf_runtime.verify_programs(program.text,
                                          sorted({t.probe for t in program.tracepoints}),
                                          program_type="raw_tracepoint", timing=verdicts)
    verdicts.programs += len(results)
    by_name = {t.name: t for t in program.tracepoints}
    skipped = {r.name: r.attached for r in program.rows if r.attached}
    for p in entries:
        t = by_name.get(p.target)
        if t is None:
            why = skipped.get(p.target, "no program generated")
            verdicts.by_probe[(p.function, "raw_tracepoint")] = (None, why)
        else:
            error = results.get(t.probe, "not loaded")
            verdicts.by_probe[(p.function, "raw_tracepoint")] = (not error, error)


def _verify_user(plan: ProbePlan, layout, binary: Optional[str], verdicts: Verdicts) -> None:
    from ctracer.probes import uprobe
    from ctracer.record import bpf_runtime

    entries = plan.of_kind("uprobe")
    methods = [m for p in entries for m in p.methods]
    program = uprobe.build_program(methods, layout)
    by_key = {f.key: f for f in program.functions}
    results = bpf_runtime.verify_programs(
        program.text, [n for f in program.functions for n in (f.entry_probe, f.exit_probe)],
        timing=verdicts)
    verdicts.programs += len(results)
    skipped = {r.name: r.attached for r in program.rows if r.attached}
    for p in entries:
        f = by_key.get(p.function)
        for kind, name in (("uprobe", f and f.entry_probe), ("uretprobe", f and f.exit_probe)):
            if f is None:
                why = skipped.get(p.target, "no program generated")
                verdicts.by_probe[(p.function, kind)] = (None, f"no program generated: {why}")
            else:
                error = results.get(name, "not loaded")
                verdicts.by_probe[(p.function, kind)] = (not error, error)
