"""Which methods a trace probes, decided before anything is generated: the struct opened
from its type source with its methods (`open_struct`: for the running kernel, with the
methods every loaded module's BTF adds), the methods ``--functions``/``--exclude`` keep
(`select_methods`), and, for a kernel, the probes chosen from the probe plan
(`choose_kernel_probes`, with what the host accepts: `ctracer.host.features.kernel_facts`).
`ctracer plan`, `ctracer functions` and the trace request (`ctracer.record.request`) all
read it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.sources import TypeSource
from ctracer.errors import CtracerError, UnknownType, UsageError


class _Globs:
    """Globs matched against names; the plain names among them (no ``*?[``) by a set
    lookup, so thousands of exact names (a script's list) cost no more than a few globs."""

    def __init__(self, patterns: Sequence[str]):
        self.plain = {p for p in patterns if not any(c in p for c in "*?[")}
        self.globs = [p for p in patterns if p not in self.plain]

    def matches(self, names: Sequence[str]) -> bool:
        return any(n in self.plain or any(fnmatch.fnmatchcase(n, p) for p in self.globs)
                   for n in names)


def select_methods(methods: Sequence, patterns: Sequence[str],
                   exclude: Sequence[str] = ()) -> list:
    """The methods whose function name (or name@unit, or tp:name) matches a glob (all
    when none), minus those matching an ``exclude`` glob."""
    import difflib

    def names_of(m) -> tuple[str, ...]:
        return (m.name, m.key)

    every = sorted({n for m in methods for n in names_of(m)})
    known = set(every)
    for option, globs in (("--functions", patterns), ("--exclude", exclude)):
        for pat in globs:
            if pat not in known and not any(fnmatch.fnmatchcase(n, pat) for n in every):
                close = difflib.get_close_matches(pat, every, n=5, cutoff=0.5)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(f"{option} {pat!r} matches no method{hint}")
    keep, drop = _Globs(patterns), _Globs(exclude)
    kept = [m for m in methods if not patterns or keep.matches(names_of(m))]
    return [m for m in kept if not drop.matches(names_of(m))]


@dataclass(frozen=True)
class KernelChoice:
    """What a kernel trace probes: the tracepoint methods, the function methods and the
    entry kind of the functions (None without functions), and the plan's note for the
    trace's meta (``probe_plan``), whose ``kinds`` line says which kinds were used and
    why the others were not."""

    tracepoints: list
    functions: list
    entry_kind: Optional[str]
    note: dict
    #: each function's entry kind by method key, where it is not ``entry_kind``: the
    #: functions the trampoline kind cannot take, on kprobes (`ctracer.plan.attach.mixed_in`)
    function_kinds: dict = field(default_factory=dict)
    #: the kind tried, after the others are attached, on the functions the kernel
    #: refuses ``entry_kind`` for (kprobe under ``auto`` with a trampoline kind, where
    #: kprobes attach); None: none
    fallback_kind: Optional[str] = None
    #: why each function left out is (by name; the note keeps the first 200 only)
    left_out: dict = field(default_factory=dict)


FUNCTION_PROBES = ("auto", "fsession.multi", "fentry.multi", "fentry", "kprobe", "none")


#: above this many functions, ``auto`` takes kprobe.multi links over fentry where the
#: kernel has them: two links attach and detach every function at once, while fentry
#: loads a program per function and detaches them one by one (each waits for the
#: kernel's text patching and an RCU-tasks grace period: minutes for thousands)
FENTRY_AUTO_MAX = 256

#: above this many functions, ``auto`` takes one perf kprobe and kretprobe a function
#: over fentry where the kernel has no kprobe.multi link (6.1): the kprobes' programs
#: are shared by the functions' routes, and attach + detach took 0.31-0.41x fentry's
#: time at 50 and 200 functions in the 6.1 guest (docs/kernel-measurements.md); below
#: it fentry stays, as on 6.12
FENTRY_AUTO_MAX_PERF_KPROBES = FENTRY_AUTO_MAX


def auto_kprobes_instead(many: int, facts) -> Optional[str]:
    """Why ``auto`` probes ``many`` functions with kprobes rather than per-function
    fentry on a kernel of these facts (`ctracer.host.facts.KernelFacts`), or None where
    it keeps fentry: kprobe.multi links above `FENTRY_AUTO_MAX` functions, else perf
    kprobes above `FENTRY_AUTO_MAX_PERF_KPROBES`, where kprobes attach."""
    if not facts.kprobes.works:
        return None
    if facts.kprobe_multi.works:
        if many <= FENTRY_AUTO_MAX:
            return None
        return (f"{many} functions: kprobe.multi links attach and detach them all at "
                f"once, where fentry loads a program per function and detaches them "
                f"one by one (--function-probes fentry for fentry)")
    if many <= FENTRY_AUTO_MAX_PERF_KPROBES:
        return None
    return (f"{many} functions: one perf kprobe each (no kprobe.multi link here) attaches "
            f"and detaches them faster than fentry, which loads and attaches a program per "
            f"function (--function-probes fentry for fentry)")


def choose_kernel_probes(methods: Sequence, space: str = "kernel",
                         function_probes: str = "auto",
                         selected: Callable[[list], int] = lambda ms: len(
                             {m.key for m in ms if not m.is_tracepoint})) -> KernelChoice:
    """The methods a kernel trace probes, from the probe plan (`ctracer.plan.attach`,
    with what the running kernel was seen to accept): the tracepoints the plan gives a
    raw tracepoint probe that the kernel accepts, and the functions it places (their
    kind: the plan's, or the one ``function_probes`` forces where the kernel takes it;
    "none": no function; "auto": fsession.multi where tracing_multi links run session
    programs, else fentry.multi where tracing_multi links work, whatever the count, else
    fentry, unless so many functions — ``selected`` counts those the trace keeps of the
    methods placed — would be probed that kprobes attach them faster:
    `auto_kprobes_instead`).  Under "auto" with a trampoline kind, the functions the plan
    put on kprobes beside it (`ctracer.plan.attach.mixed_in`) keep that kind
    (`KernelChoice.function_kinds`), and beside tracing_multi kinds kprobes are the
    `KernelChoice.fallback_kind` tried on what the kernel refuses at attach, where
    kprobes attach.  Probes that could
    not be tried (without root, for ``--print-bpf``) are kept."""
    from ctracer.plan.attach import KERNEL_ENTRY_KINDS, TRAMPOLINE_KINDS, mixed_in, plan_probes
    from ctracer.host.features import kernel_facts
    if function_probes not in FUNCTION_PROBES:
        raise UsageError(f"--function-probes {function_probes!r}: one of "
                         f"{', '.join(FUNCTION_PROBES)}")
    tracepoints = sorted({m.name for m in methods if m.is_tracepoint})
    functions = sorted({m.name for m in methods if not m.is_tracepoint})
    facts = kernel_facts(functions, tracepoints)
    plan = plan_probes(methods, facts, space=space,
                       prefer=None if function_probes in ("auto", "none") else function_probes)
    chosen: list = []
    refused: list[str] = []
    for p in plan.of_kind("raw_tracepoint"):
        if p.attachable is False:
            refused.append(f"{p.target}: {p.reason}")
        else:
            chosen.extend(p.methods)
    entries = plan.of_kind(*KERNEL_ENTRY_KINDS)
    usable = [p for p in entries if p.attachable is not False]
    kind = _main_kind(usable)
    picked = [m for p in usable for m in p.methods] if function_probes != "none" else []
    many = selected(chosen + picked) if function_probes == "auto" and kind == "fentry" else 0
    instead = auto_kprobes_instead(many, facts) if many else None
    if instead:
        plan = plan_probes(methods, facts, space=space, prefer="kprobe")
        entries = [dataclasses.replace(p, reason=instead)
                   for p in plan.of_kind(*KERNEL_ENTRY_KINDS)]
        usable = [p for p in entries if p.attachable is not False]
        kind = _main_kind(usable)
        picked = [m for p in usable for m in p.methods]
    if not chosen and not picked:
        why = refused[0] if refused else (entries[0].reason if entries else
                                          "no tracepoint or function to probe")
        raise CtracerError(f"nothing can be traced here ({why})")
    mixed = [p for p in usable if mixed_in(p)] if picked else []
    main_reason = next((p.reason for p in entries if p.kind == kind and not mixed_in(p)),
                       entries[0].reason if entries else "no function takes the struct")
    # only beside tracing_multi links, which the kernel refuses whole for one function:
    # per-function fentry loads refuse one function at a time (the fallback's programs
    # are compiled only once the kernel has refused functions: `ctracer.record.kattach`)
    fallback = ("kprobe" if picked and function_probes == "auto" and
                kind in TRAMPOLINE_KINDS and kind != "fentry" and facts.kprobes.works
                else None)
    note = {"counts": plan.counts(), "kernel": facts.to_json(),
            "tracepoints_refused": refused,
            "functions_planned": len({p.function for p in entries}),
            "functions_left_out": [[p.function, p.reason] for p in plan.left_out()][:200],
            "entry_kind": kind if picked else None,
            "reason": main_reason,
            "function_probes": function_probes,
            "mixed": [[p.function, p.kind, p.reason] for p in mixed][:200],
            "fallback_kind": fallback}
    return KernelChoice(chosen, picked, kind if picked else None, note,
                        {m.key: p.kind for p in mixed for m in p.methods}, fallback,
                        {p.function.split("@")[0]: p.reason for p in plan.left_out()})


def _main_kind(usable: Sequence) -> Optional[str]:
    """The entry kind of a plan's functions: the kind of those not placed on kprobes
    beside a trampoline kind (`ctracer.plan.attach.mixed_in`), else of the first."""
    from ctracer.plan.attach import mixed_in
    return next((p.kind for p in usable if not mixed_in(p)),
                usable[0].kind if usable else None)


def check_placeable(patterns: Sequence[str], choice: KernelChoice, methods: Sequence) -> None:
    """A ``--functions`` glob naming only methods this kernel cannot probe says so
    (rather than that it matches no method)."""
    placed = {n for m in choice.tracepoints + choice.functions for n in (m.name, m.key)}
    for pat in patterns:
        if pat in placed or any(fnmatch.fnmatchcase(n, pat) for n in placed):
            continue
        known = sorted({m.name for m in methods
                        if fnmatch.fnmatchcase(m.name, pat) or fnmatch.fnmatchcase(m.key, pat)})
        if known:
            shown = ", ".join(known[:3]) + (", ..." if len(known) > 3 else "")
            why = choice.left_out.get(known[0], choice.note["reason"])
            raise CtracerError(f"--functions {pat!r}: {shown} cannot be probed here "
                               f"({why}; `ctracer plan` says why)")


def _module_methods(name: str, kind: ShapeKind, use_cache: bool, found=None,
                    **options):
    """(the first module defining the struct or None, discovery) with the methods every loaded module's BTF adds to
    ``found`` (vmlinux's; None when vmlinux does not define the struct, e.g. NFS's
    ``nfs_fh`` on a kernel built without NFS: the layout is then the first defining
    module's); None when neither vmlinux nor a module defines it.  Each module's
    functions are attached through its own BTF."""
    import dataclasses as dc

    from ctracer.debuginfo import sources
    from ctracer.plan import discovery
    models = sources.module_models(use_cache)
    defining = [m for m in models if m.struct_id(name, kind) is not None]
    if found is None and not defining:
        return None
    base = found
    if base is None:
        base = discovery.discover(defining[0].catalog(), name, kind, **options)
    methods: dict[tuple, object] = {}
    for m in base.methods:
        methods.setdefault((m.key, m.route_kind, m.param_index, m.route_form), m)
    for model in models:
        for m in discovery.discover(model.catalog(), name, kind, **options).methods:
            methods.setdefault((m.key, m.route_kind, m.param_index, m.route_form), m)
    merged = dc.replace(base, methods=tuple(methods.values()))
    return (defining[0] if found is None else None), merged


def open_struct(source: TypeSource, name: str, kind: ShapeKind, **options):
    """(type model, type graph, discovery) of the struct from the type source; for the
    running kernel with the methods of every loaded module too, and, when vmlinux does
    not define the struct, its layout from the first module that does
    (`_module_methods`); UnknownType (with close names) when none defines it.
    ``options``: `ctracer.plan.discovery.discover`'s."""
    from ctracer.debuginfo import sources
    from ctracer.plan import discovery
    model = sources.open_type_source(source)
    running = source.is_kernel and not (source.btf or source.module)
    try:
        graph = model.find_struct(name, kind)
    except UnknownType:
        if running:
            found = _module_methods(name, kind, source.use_cache, **options)
            if found is not None:
                defining, merged = found
                return defining, defining.find_struct(name, kind), merged
        raise
    found = discovery.discover(model.catalog(), name, kind, **options)
    if running:
        _, found = _module_methods(name, kind, source.use_cache, found, **options)
    return model, graph, found
