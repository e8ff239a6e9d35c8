"""The probe plan: for every method's function, which probe kind traces it, or why none.

Pure planning: `plan_probes` takes the methods `ctracer.plan.discovery` found and a
`KernelFacts` (what the running kernel was seen to accept: `ctracer.host.features.kernel_facts`
finds out by trying bpf(2), never by kernel version) and gives a `ProbePlan`, one
`PlannedProbe` per probe (an entry and an exit probe per function, one per tracepoint) or
per function left out.  The recorder consumes ``plan.placed()``; ``ctracer plan`` prints
the whole plan.

Kinds, in the order they are preferred for kernel functions:

``fsession.multi``          one session program on tracing_multi links running each
                            function's entry and exit (one probe per function), where
                            the kernel has the links and runs session programs on them;
``fentry.multi``/``fexit.multi``  the fentry/fexit programs on tracing_multi links (one
                            link per program carries every function), where the kernel
                            has the links but no session programs (or when asked for);
``fentry``/``fexit``        BPF trampolines, where the kernel loads them;
``kprobe``/``kretprobe``    else (one program attached to many functions through a
                            kprobe.multi link where the kernel has one);
``raw_tracepoint``          for tracepoints whose BTF prototype (``btf_trace_<name>``)
                            carries the struct;
``uprobe``/``uretprobe``    for functions of user-space programs.

One plan may mix two kinds: under the trampoline kinds, the functions a BPF trampoline
cannot take (more than 12 arguments, a struct returned by value, variable arguments: BTF
says so before anything is loaded) get kprobe/kretprobe where the kernel attaches kprobes
(`plan_probes`, `mixed_in`).

Where neither fentry nor kprobes work the functions still get kprobe/kretprobe entries
(the programs a kprobe kernel would load; ``ctracer plan --verify`` loads them through the
verifier) marked not attachable, with the reason.  Functions are left out (``kind`` None)
when they exist only inlined, are static-call trampolines (``__SCT__*``, assembly stubs),
are the BPF glue of a tracepoint (``__bpf_trace_*``, traced through the tracepoint
itself), are absent from the kernel's list of traceable functions (notrace, or compiled
away; a compiler clone ``name.isra.0`` is named), or no address is known for them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ctracer.debuginfo import elf
from ctracer.debuginfo.catalog import ShapeKind
from ctracer.host.facts import KernelFacts, Mechanism
from ctracer.plan.discovery import Method

PROBE_KINDS = ("fsession.multi", "fentry.multi", "fexit.multi", "fentry", "fexit", "kprobe",
               "kretprobe",
               "raw_tracepoint", "uprobe", "uretprobe")
#: the exit probe that goes with each entry kind (a session kind is its own exit: one
#: probe a function)
EXIT_KIND = {"fsession.multi": "fsession.multi", "fentry.multi": "fexit.multi",
             "fentry": "fexit", "kprobe": "kretprobe", "uprobe": "uretprobe"}
#: the entry kinds of kernel functions
KERNEL_ENTRY_KINDS = ("fsession.multi", "fentry.multi", "fentry", "kprobe")
#: the kernel-function kinds run by BPF trampolines (at most 12 arguments, no struct
#: returned by value, no variable arguments: `fentry_refuses`)
TRAMPOLINE_KINDS = ("fsession.multi", "fentry.multi", "fentry")

#: name prefixes of kernel functions that are never probed, and why
_LEFT_OUT_PREFIXES = (
    ("__SCT__", "static-call trampoline (__SCT__*: an assembly stub, not the function)"),
    ("__bpf_trace_", "tracepoint glue for BPF (__bpf_trace_*): traced through the "
                     "tracepoint itself"),
)


@dataclass(frozen=True)
class PlannedProbe:
    """One probe of the plan, or one function left out (``kind`` None).

    ``function`` is the method key (``name``, ``name@unit`` for statics, ``tp:NAME``),
    ``target`` what the probe attaches to (symbol or tracepoint name), ``reason`` why this
    kind was chosen, or why the function is left out or cannot attach here;
    ``attachable`` whether the kernel accepts this kind here (None: unknown)."""

    function: str
    target: str
    kind: Optional[str]
    reason: str
    attachable: Optional[bool]
    methods: tuple[Method, ...] = ()

    @property
    def placed(self) -> bool:
        """Whether the method gets a probe that attaches."""
        return self.kind is not None and self.attachable is True


@dataclass(frozen=True)
class ProbePlan:
    """Every probe the methods call for, in method-key order (entry before exit)."""

    space: str  # "kernel" or "user"
    facts: KernelFacts
    probes: tuple[PlannedProbe, ...]

    def placed(self) -> list[PlannedProbe]:
        """The probes the kernel accepts here: what a recording attaches."""
        return [p for p in self.probes if p.placed]

    def left_out(self) -> list[PlannedProbe]:
        """The probes that get no kind (not traced)."""
        return [p for p in self.probes if p.kind is None]

    def of_kind(self, *kinds: str) -> list[PlannedProbe]:
        """The probes of the ``kinds`` given."""
        return [p for p in self.probes if p.kind in kinds]

    def by_function(self) -> dict[str, list[PlannedProbe]]:
        """The probes grouped by function name."""
        out: dict[str, list[PlannedProbe]] = {}
        for p in self.probes:
            out.setdefault(p.function, []).append(p)
        return out

    def counts(self) -> dict[str, dict[str, int]]:
        """Per kind (``left out`` for None): probes the kernel accepts here, refuses, or
        that could not be told."""
        out: dict[str, dict[str, int]] = {}
        words = {True: "attachable", False: "not attachable", None: "unknown"}
        for p in self.probes:
            row = out.setdefault(p.kind or "left out",
                                 {"attachable": 0, "not attachable": 0, "unknown": 0})
            row[words[p.attachable if p.kind else False]] += 1
        order = {k: i for i, k in enumerate(PROBE_KINDS + ("left out",))}
        return dict(sorted(out.items(), key=lambda i: order[i[0]]))

    def left_out_reasons(self) -> list[tuple[str, int]]:
        """(reason, functions) for the functions left out, most common first."""
        c = Counter(_reason_class(p.reason) for p in self.left_out())
        return sorted(c.items(), key=lambda i: (-i[1], i[0]))


def _reason_class(reason: str) -> str:
    """A reason without the names in it (``only a compiler clone exists: x.isra.0`` →
    ``only a compiler clone exists``), for counting."""
    return reason.split(":", 1)[0] if reason.startswith("only a compiler clone") else reason


def _word(m: Mechanism) -> str:
    return {True: "works", False: "refused", None: "not known"}[m.works]


def _kernel_function_kind(facts: KernelFacts,
                          prefer: Optional[str] = None) -> tuple[str, Optional[bool], str]:
    """(entry kind, attachable, reason) for kernel functions on this kernel; ``prefer``
    ("fsession.multi", "fentry.multi", "fentry" or "kprobe") asks for that kind where the
    kernel takes it."""
    here = True if facts.running_kernel else None
    elsewhere = "" if facts.running_kernel else (
        "; not the running kernel's types: whether its functions attach is not known here")
    if prefer == "kprobe" and facts.kprobes.works:
        how = ("through kprobe.multi links" if facts.kprobe_multi.works
               else "one kprobe per function (no kprobe.multi link here)")
        return "kprobe", here, f"kprobes asked for; {how}" + elsewhere
    if prefer == "fentry" and not facts.fentry.works:
        return "fentry", False if facts.fentry.works is False else None, \
            f"fentry asked for, but {facts.fentry.why}"
    if prefer in ("fentry.multi", "fsession.multi") and not facts.tracing_multi.works:
        return prefer, False if facts.tracing_multi.works is False else None, \
            f"{prefer} asked for, but {facts.tracing_multi.why}"
    if prefer == "fsession.multi" and not facts.fsession_multi.works:
        return prefer, False if facts.fsession_multi.works is False else None, \
            f"fsession.multi asked for, but {facts.fsession_multi.why}"
    if prefer in (None, "fsession.multi") and facts.tracing_multi.works and \
            facts.fsession_multi.works:
        why = ("fsession.multi asked for" if prefer else
               "tracing_multi links and session programs work here: one program runs "
               "each function's entry and exit, one link per program and BTF object; a "
               "detach rebuilds each function's trampoline once, where an fentry and an "
               "fexit link rebuild it twice")
        return "fsession.multi", here, why + elsewhere
    if prefer in (None, "fentry.multi") and facts.tracing_multi.works:
        why = ("fentry.multi asked for" if prefer else
               "tracing_multi links work here: fentry/fexit programs attached to every "
               f"function at once (no session programs: {facts.fsession_multi.why})")
        return "fentry.multi", here, why + elsewhere
    if facts.fentry.works:
        return "fentry", here, "fentry programs load and attach here" + elsewhere
    if facts.kprobes.works:
        how = ("through a kprobe.multi link" if facts.kprobe_multi.works
               else "one kprobe per function (no kprobe.multi link here)")
        return "kprobe", here, f"fentry unusable ({facts.fentry.why}); kprobes {how}" + elsewhere
    if facts.kprobes.works is None or facts.fentry.works is None:
        return "kprobe", None, (f"unknown here: fentry {_word(facts.fentry)}, kprobes "
                                f"{_word(facts.kprobes)} (see kernel)")
    if not facts.running_kernel:
        return "kprobe", None, ("the running kernel attaches neither fentry nor kprobes; "
                                "not the running kernel's types anyway")
    return "kprobe", False, "this kernel attaches neither fentry nor kprobes"


#: functions not probed by default, and why: BPF's own code (the probes run on it; its
#: helpers take sockets) and what runs with the probes' locks held
DENIED = (
    (("bpf_", "__bpf_", "____bpf_", "sk_storage_", "bpf_sk_"),
     "deny list: BPF's own functions (the probes and their helpers run there)"),
)


def denied(name: str) -> str:
    """Why the default deny list leaves a kernel function out ("" when it does not)."""
    for prefixes, why in DENIED:
        if name.startswith(prefixes):
            return why
    return ""


def _left_out_kernel(name: str, methods: Sequence[Method], facts: KernelFacts) -> str:
    """Why a kernel function gets no probe ("" when it can have one)."""
    for prefix, why in _LEFT_OUT_PREFIXES:
        if name.startswith(prefix):
            return why
    why = denied(name)
    if why:
        return why
    if not all(m.probeable for m in methods):
        return next(m.not_probeable for m in methods if not m.probeable)
    if facts.symbols is None:
        return ""
    if name in facts.notrace:
        return "notrace: the kernel lists it but excludes it from tracing"
    if name not in facts.symbols:
        clones = facts.clones.get(name, ())
        if clones:
            return (f"only a compiler clone exists: {clones[0]} (its arguments may differ "
                    "from the prototype)")
        return f"not in {facts.symbols_source or 'the kernel symbol list'} (inlined or compiled away)"
    return ""


def _tracepoint_probe(key: str, name: str, methods: tuple[Method, ...],
                      facts: KernelFacts) -> PlannedProbe:
    if not facts.running_kernel:
        return PlannedProbe(key, name, "raw_tracepoint", "not the running kernel's types: "
                            "whether the tracepoint exists here is not known", None, methods)
    raw = facts.raw_tracepoints
    if raw.works is False:
        return PlannedProbe(key, name, "raw_tracepoint", f"raw tracepoints refused: {raw.why}",
                            False, methods)
    known = None if facts.tracepoints is None else facts.tracepoints.get(name)
    if known is False:
        return PlannedProbe(key, name, "raw_tracepoint",
                            "the kernel refused to attach a raw tracepoint program to it",
                            False, methods)
    if raw.works is None or known is None:
        return PlannedProbe(key, name, "raw_tracepoint", f"unknown: {raw.why}", None, methods)
    return PlannedProbe(key, name, "raw_tracepoint",
                        "its BTF prototype (btf_trace_*) carries the struct", True, methods)


#: the most arguments a BPF trampoline takes (the kernel's ``MAX_BPF_FUNC_ARGS``)
TRAMPOLINE_MAX_ARGS = 12


def fentry_refuses(function) -> str:
    """Why the kernel's BTF check refuses fentry/fexit on this function ("" when it does
    not): a struct or union returned by value (the verifier's "return type STRUCT is
    unsupported"), variable arguments ("with variable args is unsupported"), more than
    `TRAMPOLINE_MAX_ARGS` arguments ("has 14 arguments. Too many."); kprobes take such
    functions.  tracing_multi links run the same check."""
    if getattr(function, "variadic", False):
        return "fentry cannot take a function with variable arguments"
    params = len(getattr(function, "params", ()))
    if params > TRAMPOLINE_MAX_ARGS:
        return (f"fentry cannot take a function of {params} arguments (BPF trampolines take "
                f"at most {TRAMPOLINE_MAX_ARGS})")
    returns = getattr(function, "returns", None)
    if returns is not None and not returns.pointers and \
            returns.kind in (ShapeKind.STRUCT, ShapeKind.UNION):
        return f"fexit cannot take a function returning a {returns.kind.value} by value"
    return ""


#: the words a function placed on kprobes in a trampoline kind's plan carries in its
#: reason (`mixed_in`)
INSTEAD = "kprobes instead"


def _kprobes_instead(refused: str, facts: KernelFacts) -> Optional[tuple[Optional[bool], str]]:
    """(attachable, reason) of kprobe/kretprobe on a function the trampoline kind the
    plan chose cannot take (``refused``: `fentry_refuses`), where this kernel attaches
    kprobes; None where it does not (the function is then left out)."""
    if facts.kprobes.works is False:
        return None
    how = ("a kprobe.multi link" if facts.kprobe_multi.works
           else "one perf kprobe each (no kprobe.multi link here)")
    here = True if facts.running_kernel and facts.kprobes.works else None
    return here, f"{refused}: {INSTEAD}, through {how}"


def mixed_in(probe: "PlannedProbe") -> bool:
    """Whether ``probe`` is a kprobe the plan placed beside a trampoline kind, on a
    function that kind cannot take (`plan_probes` under ``auto``)."""
    return probe.kind in ("kprobe", "kretprobe") and INSTEAD in probe.reason


def plan_probes(methods: Iterable[Method], facts: KernelFacts, *,
                space: str = "kernel", prefer: Optional[str] = None) -> ProbePlan:
    """The plan for ``methods`` (see the module docstring); ``space`` is ``kernel`` for
    the running kernel, a vmlinux or a module, ``user`` for a program or library;
    ``prefer``: the kernel functions' kind asked for ("fsession.multi", "fentry.multi",
    "fentry", "kprobe").

    Where the kind chosen is a trampoline one (fsession.multi, fentry.multi, fentry) and
    nothing was asked for, a function it cannot take (`fentry_refuses`: more than 12
    arguments, a struct returned by value, variable arguments) goes on kprobe/kretprobe
    where the kernel attaches kprobes, its reason saying so (`mixed_in`): one recording
    then uses both kinds.  A kind asked for is kept to: such functions are left out, the
    reason saying that ``auto`` traces them."""
    if space not in ("kernel", "user"):
        raise ValueError(f"unknown address space {space!r}")
    grouped: dict[str, list[Method]] = {}
    for m in methods:
        grouped.setdefault(m.key, []).append(m)
    function_kind = _kernel_function_kind(facts, prefer) if space == "kernel" else (
        "uprobe", facts.uprobes.works, f"uprobes: {facts.uprobes.why}")
    probes: list[PlannedProbe] = []
    for key in sorted(grouped):
        ms = tuple(grouped[key])
        name = ms[0].name
        if ms[0].is_tracepoint:
            if space == "user":
                probes.append(PlannedProbe(key, name, None, "tracepoints are kernel probes",
                                           False, ms))
            else:
                probes.append(_tracepoint_probe(key, name, ms, facts))
            continue
        if space == "kernel":
            why_not = _left_out_kernel(name, ms, facts)
        else:
            why_not = next((m.not_probeable for m in ms if not m.probeable), "")
            if not why_not and getattr(ms[0].function, "address", None) is None:
                why_not = "no address: declaration only"
        if why_not:
            probes.append(PlannedProbe(key, name, None, why_not, False, ms))
            continue
        kind, ok, why = function_kind
        if kind in TRAMPOLINE_KINDS and ok is not False:
            refused = fentry_refuses(ms[0].function)
            instead = _kprobes_instead(refused, facts) if refused and prefer is None else None
            if refused and instead is None:
                probes.append(PlannedProbe(key, name, None, refused + (
                    f" (--function-probes {prefer} asked for it alone; auto traces it with "
                    "kprobes)" if prefer else f" (and kprobes are refused here: "
                    f"{facts.kprobes.why})"), False, ms))
                continue
            if instead is not None:
                kind, ok, why = ("kprobe",) + instead
        probes.append(PlannedProbe(key, name, kind, why, ok, ms))
        if EXIT_KIND[kind] != kind:
            probes.append(PlannedProbe(key, name, EXIT_KIND[kind], why, ok, ms))
    return ProbePlan(space, facts, tuple(probes))


def binary_space(path: str) -> str:
    """``kernel`` for a vmlinux or a kernel module (.ko), ``user`` for anything else."""
    headers = elf.read_elf_headers(path)
    if headers.section(".modinfo") or headers.section("__ksymtab_strings"):
        return "kernel"
    return "user"
