"""The one BPF program that traces a kernel struct: raw tracepoint probes
(`ctracer.probes.tracepoint`) and entry/exit probes of kernel functions
(`ctracer.probes.kfunctions`), sharing one event layout, one ring buffer, one set of
followed objects and one emitter (``ctracer_hit``), compiled by bcc in one piece.

`build_kernel_program` plans both (function-table rows: the tracepoints' first, then the
functions'), writes the C and returns a `KernelProgram` that `ctracer.record` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ctracer.debuginfo.catalog import Catalog
from ctracer.event import Layout
from ctracer.plan.discovery import Method
from ctracer.plan.heads import HeadRead
from ctracer.plan.lifetime_rules import LifetimeRule
from ctracer.probes import ctext, folding, kfunctions, tracepoint
from ctracer.probes.arguments import Argument
from ctracer.probes.kfunctions import KernelFunction
from ctracer.probes.uprobe import Arch, host_arch
from ctracer.probes.tracepoint import Admission, ProbedTracepoint
from ctracer.event import FunctionRow

#: default ring buffer size (bytes)


@dataclass(frozen=True)
class KernelProgram:
    """The generated C and what it probes (the kernel counterpart of
    `ctracer.probes.uprobe.UprobeProgram`)."""

    text: str
    mini: Layout
    tracepoints: tuple[ProbedTracepoint, ...]
    rows: tuple[FunctionRow, ...]
    admission: Admission
    ring_bytes: int
    nargs: int
    rules: tuple[LifetimeRule, ...] = ()
    #: objects that may be only their head (`ctracer.plan.heads`), None: always whole
    head: Optional[HeadRead] = None
    #: kernel functions probed on entry and exit, and the entry kind ("fentry.multi",
    #: "fentry" or "kprobe"; its exit kind is `kfunctions.KINDS`'s)
    kfunctions: tuple[KernelFunction, ...] = ()
    entry_kind: Optional[str] = None
    #: the kind tried on the functions the kernel refuses ``entry_kind`` on, once the
    #: others are attached (`ctracer.record.kattach`); its programs are not in ``text``:
    #: `fallback_text` writes them for the functions refused; None: none
    fallback_kind: Optional[str] = None
    #: raw tracepoints probed to know the CPU's context (`tracepoint.CONTEXT_PROBES`)
    context_probes: tuple[tracepoint.ContextProbe, ...] = ()
    #: the functions' programs keep each thread's depth and saved calls in task storage,
    #: with an LRU-hash variant of each beside them (else only the LRU-hash ones:
    #: `kfunctions.programs_c`)
    task_storage: bool = True
    #: events carry only the snapshot words that changed (`ctracer.event`'s compact
    #: events); False: every event carries the whole snapshot
    compact: bool = False
    #: ``--calls``: "all" writes every call; "changes" folds calls that changed nothing
    #: into counts (`ctracer.probes.folding`; compact events only)
    calls: str = "all"
    #: no uprobes (the recorder and runtime handle both kinds of program)
    functions: tuple = field(default=(), init=False)

    @property
    def filtered(self) -> bool:
        return self.admission.processes

    def rows_with_return_value(self) -> frozenset[int]:
        """The function rows whose exits record a return value."""
        return frozenset(row for f in self.kfunctions if f.returns for row in f.row_ids)

    def return_kinds(self) -> dict[int, str]:
        """How each function row's return value reads ("pointer", "int", ...)."""
        return {row: f.return_kind for f in self.kfunctions if f.return_kind for row in f.row_ids}

    def args_by_row(self) -> dict[int, tuple[Argument, ...]]:
        """The tracepoint arguments recorded, per function row."""
        out = {row: tp.args for tp in self.tracepoints for row in tp.row_ids}
        out.update({row: f.args for f in self.kfunctions for row in f.row_ids if f.args})
        return out

    def descriptors_text(self) -> str:
        """What the generic programs are told of each tracepoint, as a C comment (the
        rows ctracer writes into ``ctracer_tps`` before attaching), for ``--print-bpf``."""
        if not self.tracepoints:
            return ""
        lines = ["/* Rows written into ctracer_tps before attaching (each tracepoint's",
                 " * program is loaded with its row's index in place of CTRACER_TP_SELF):"]
        lines += [f" * {tracepoint.describe(tp)}" for tp in self.tracepoints]
        return "\n".join(lines) + "\n */\n"

    def program_names(self, task_storage: Optional[bool] = None) -> list[str]:
        """The entry and exit programs the functions use: of the variant keeping the
        thread state in task storage where the text has it, else (or when
        ``task_storage`` is false) of the LRU-hash one."""
        if not self.entry_kind:
            return []
        storage = self.task_storage if task_storage is None else task_storage and self.task_storage
        return sorted({f.program(k, storage) for f in self.kfunctions
                       for k in self.kinds_of(f)})

    def kinds_of(self, f: KernelFunction) -> tuple[str, ...]:
        """The kinds whose programs of ``text`` ``f`` runs (`kinds_of`)."""
        return kinds_of(f, self.entry_kind)

    def fallback_text(self, functions: Sequence[KernelFunction]) -> str:
        """The C of `fallback_kind`'s programs for ``functions`` (some of `kfunctions`, which
        the kernel refused ``entry_kind`` on), with the maps, emitter and definitions of
        ``text``: compiled apart, only when the kernel refused functions, its programs
        sharing the recording's maps (`ctracer.probes.map_refs`).  No tracepoint program."""
        if not self.fallback_kind or not functions:
            raise ValueError("the fallback's programs need a fallback kind and functions")
        fold = self.calls == "changes"
        routes = {self.fallback_kind: sorted({f.route_count for f in functions})}
        return tracepoint.emit_tracepoint_c(
            (), self.mini, self.admission, self.nargs, self.ring_bytes, self.head,
            _functions_c(len(self.kfunctions), routes, self.nargs, self.task_storage, fold),
            self.compact, fold)

    @property
    def entry_kinds(self) -> dict[str, int]:
        """Functions per entry kind planned, the program's own kind first."""
        out: dict[str, int] = {}
        for f in sorted(self.kfunctions, key=lambda f: (f.kind or self.entry_kind) != self.entry_kind):
            kind = f.kind or self.entry_kind or ""
            out[kind] = out.get(kind, 0) + 1
        return out


def build_kernel_program(methods: Sequence[Method], mini: Layout, catalog: Catalog, *,
                         function_methods: Sequence[Method] = (),
                         entry_kind: Optional[str] = None,
                         admission: Admission = Admission(),
                         rules: Sequence[LifetimeRule] = (),
                         ring_bytes: int = ctext.RING_BYTES,
                         head: Optional[HeadRead] = None,
                         arch: Optional[Arch] = None,
                         format_fields: Optional[tracepoint.FormatFields] = None,
                         task_storage: bool = True,
                         compact: bool = False,
                         calls: str = "all",
                         function_kinds: Mapping[str, str] = {},
                         fallback_kind: Optional[str] = None
                         ) -> KernelProgram:
    """Raw tracepoint probes for the tracepoint ``methods`` and ``entry_kind`` probes
    (fentry.multi/fexit.multi, fentry/fexit or kprobe/kretprobe) for ``function_methods``, recording ``mini``;
    ``task_storage``: the functions' per-thread state in task storage (what the
    running kernel takes for the kind: `ctracer.host.features.task_storage_works`),
    else in LRU hashes.  ``function_kinds``: the entry kind of the functions (by method
    key) not on ``entry_kind`` (kprobes beside a trampoline kind); ``fallback_kind``: a
    kind tried on the functions the kernel refuses ``entry_kind`` on (those it can read:
    `KernelFunction.kprobe_ready`), whose programs `KernelProgram.fallback_text` writes
    once the kernel has refused some."""
    ctext.check_ring_bytes(ring_bytes)
    folding.check_calls(calls)
    fold = calls == "changes"
    if fold and not (compact and mini.size > 0):
        raise ValueError("--calls changes needs compact events (not --full-snapshots)")
    if admission.comm is not None:
        tracepoint.validate_comm(admission.comm)
    rows, tracepoints = tracepoint.plan_tracepoints(methods, catalog, rules, format_fields)
    functions: tuple[KernelFunction, ...] = ()
    if function_methods:
        if entry_kind not in kfunctions.KINDS:
            raise ValueError(f"kernel functions need an entry kind, not {entry_kind!r}")
        arch = arch or host_arch()
        for other in set(function_kinds.values()) | {fallback_kind} - {None}:
            if other not in kfunctions.KINDS:
                raise ValueError(f"kernel functions need an entry kind, not {other!r}")
        frows, functions = kfunctions.plan_kernel_functions(
            function_methods, arch, first_row=len(rows) + 1,
            max_regs=12 if kfunctions.reads_like_fentry(entry_kind)
            else arch.register_args,
            ending={r.function for r in rules if r.probe == "function" and r.effect == "ends"},
            kinds=function_kinds, kind=entry_kind, struct_size=_struct_size(catalog))
        rows = rows + frows
    nargs = max((len(tp.args) for tp in tracepoints), default=0)
    functions_c = ("", "")
    if functions:
        nargs = max(nargs, kfunctions.NARGS)
        counts: dict[str, set[int]] = {}
        for f in functions:
            counts.setdefault(f.kind or entry_kind, set()).add(f.route_count)
        functions_c = _functions_c(len(functions), {k: sorted(v) for k, v in counts.items()},
                                   nargs, task_storage, fold)
    compact = compact and mini.size > 0
    text = tracepoint.emit_tracepoint_c(tracepoints, mini, admission, nargs, ring_bytes, head,
                                        functions_c, compact, fold)
    return KernelProgram(text, mini, tracepoints, rows, admission, ring_bytes, nargs,
                         tuple(rules), head, functions, entry_kind if functions else None,
                         fallback_kind if functions else None,
                         tracepoint.CONTEXT_PROBES if tracepoint.needs_context(admission)
                         else (), task_storage=bool(functions and task_storage),
                         compact=compact, calls=calls)


def _functions_c(functions: int, routes_by_kind: Mapping[str, Sequence[int]], nargs: int,
                 task_storage: bool, fold: bool) -> tuple[str, str]:
    """The maps and definitions of ``functions`` kernel functions, and the programs of
    each kind for its route counts (`kfunctions.programs_c`)."""
    return (kfunctions.struct_definitions(functions, task_storage),
            kfunctions.programs_c(list(routes_by_kind), (), nargs, task_storage, fold,
                                  routes_by_kind=dict(routes_by_kind)))


def kinds_of(f: KernelFunction, entry_kind: Optional[str]) -> tuple[str, ...]:
    """The kinds whose programs ``f`` runs: its entry kind's (``entry_kind`` unless it
    has one: `KernelFunction.kind`) and its exit kind's unless it is a session kind
    (`kfunctions.probe_kinds`)."""
    return kfunctions.probe_kinds(f.kind or entry_kind)


def _struct_size(catalog: Optional[Catalog]):
    """A returned struct's or union's bytes from the catalog (None when not known)."""
    def size(shape) -> Optional[int]:
        found = catalog.struct(shape.name, shape.kind) if catalog is not None and shape.name \
            else None
        return found.size if found is not None else None
    return size
