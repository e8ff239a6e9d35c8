"""A trace request, as plain data, turned into a probe program and the trace file's meta.

`TraceRequest` says what to trace (the struct, where its types come from, which
methods, which fields, which objects); `build` runs the stages below it in order —
types (`ctracer.debuginfo`), methods and the mini struct (`ctracer.plan`), the probe
program (`ctracer.probes`) — and returns a `BuiltTrace` that
`ctracer.record.recorder.record` runs.  `ctracer trace` and `ctracer demo` both call
it; nothing here knows about command-line parsing.

A user-space binary (``--binary``) is traced with a uprobe and a uretprobe per method.
A kernel (the running one by default, ``--module``, ``--btf``) is traced through the
probes `ctracer.plan.selection.choose_kernel_probes` picks from the probe plan of
``ctracer plan``: every function taking the struct on entry and exit, with the kind the
kernel accepts (fentry/fexit, else kprobe/kretprobe), plus the raw tracepoints whose arguments carry it; on a
kernel attaching neither fentry nor kprobes, the tracepoints alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from ctracer.event import ENCODING_COMPACT, ENCODING_FULL
from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.sources import TypeSource
from ctracer.errors import CtracerError, UsageError
from ctracer.plan.selection import (KernelChoice, check_placeable, choose_kernel_probes,
                                    open_struct, select_methods)
from ctracer.plan.watch import WatchPlan
from ctracer.probes import ProbeProgram


@dataclass(frozen=True)
class TraceRequest:
    """What to trace, as ``ctracer trace``'s options say it: the struct, its type source,
    the methods and fields to keep, the filters and limits."""

    kind: ShapeKind
    name: str
    source: TypeSource = field(default_factory=TypeSource)
    #: method globs to keep (all when empty) and to drop
    functions: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: field globs of the mini struct (all when empty) and to drop; only fields on these
    #: cachelines; at most this many bytes; pointer members too
    fields: tuple[str, ...] = ()
    exclude_fields: tuple[str, ...] = ()
    cachelines: tuple[int, ...] = ()
    max_bytes: Optional[int] = None
    pointers: bool = False
    #: the project file the selection came from (`ctracer.plan.project.Project`): its
    #: names are checked against the struct's methods and fields, errors naming its lines
    project: Optional[object] = None
    #: record only what a followed process tree touches (-p PID or a command)
    follow_processes: bool = False
    #: kernel object admission: process name, addresses, condition, how many
    comm: Optional[str] = None
    objects: tuple[int, ...] = ()
    where: Optional[str] = None
    max_objects: Optional[int] = None
    #: lifetime rules as ``--lifetime-rule`` writes them (None: the defaults of
    #: `ctracer.plan.lifetime_rules`; "none" alone: no rule)
    lifetime_rules: Optional[tuple[str, ...]] = None
    #: how kernel functions are probed: "auto" (the plan's choice), "fentry", "kprobe"
    #: or "none" (tracepoints only); and the most functions a trace may probe
    function_probes: str = "auto"
    max_functions: Optional[int] = None
    buffer_mb: int = 16
    #: every event carries the whole snapshot (else only the words that changed since
    #: the object's last event: `ctracer.event`'s compact events)
    full_snapshots: bool = False
    #: ``--calls``: "all" writes every call; "changes" counts the calls that changed
    #: nothing in the kernel (`ctracer.probes.folding`)
    calls: str = "all"
    #: the command line, stored in the trace
    argv: tuple[str, ...] = ()
    #: fields to arm write breakpoints on (``--watch``) and the writes an object gets
    #: before they move on (`ctracer.plan.watch`)
    watch: tuple[str, ...] = ()
    watch_budget: int = 1000


@dataclass(frozen=True)
class BuiltTrace:
    """A trace request made ready: the probe program, the trace file's meta, the binary
    probed (None: the kernel) and the watch plan."""

    program: ProbeProgram
    meta: dict
    #: the binary whose uprobes are attached; None for a kernel
    binary: Optional[str]
    #: the words ``--watch`` arms (`ctracer.plan.watch.WatchPlan`), None without it
    watch: Optional[WatchPlan] = None

    @property
    def is_kernel(self) -> bool:
        """Whether the trace is of the kernel."""
        return self.binary is None


def _task_storage(entry_kind: Optional[str], *others: Optional[str]):
    """Whether the running kernel lets ``entry_kind``'s programs (and those of the
    ``others`` kinds one recording mixes in: every function's depth in one place) keep
    each thread's call depth and saved entries in task storage (tried: `ctracer.host.
    task_storage_works`); where it cannot be tried (not root: ``--print-bpf``) the
    programs are written with it."""
    from ctracer.host.facts import Mechanism
    if entry_kind is None:
        return Mechanism(None, "no kernel function probed")
    from ctracer.host.features import task_storage_works
    found = [task_storage_works(k) for k in dict.fromkeys((entry_kind,) + others) if k]
    return next((m for m in found if m.works is False), found[0])


def _kinds_line(program, choice: KernelChoice, tracepoints: int) -> str:
    """Which probe kinds a kernel trace uses and why the others are not, in one line."""
    reason = choice.note["reason"]
    if program.kfunctions:
        from ctracer.probes.kfunctions import probe_kinds
        parts = []
        for kind, n in program.entry_kinds.items():
            why = reason if kind == program.entry_kind else _mixed_reason(program, kind)
            parts.append(f"{'/'.join(probe_kinds(kind))} on {n} "
                         f"function{'s' if n != 1 else ''} ({why})")
        line = "; ".join(parts)
        if program.fallback_kind and program.entry_kind in program.entry_kinds:
            line += (f"; {program.fallback_kind} tried on any the kernel refuses "
                     f"{program.entry_kind} on")
    elif choice.note["function_probes"] == "none":
        line = "no function probes (--function-probes none)"
    elif choice.functions:
        line = "no function probes (none selected)"
    else:
        line = f"no function probes ({reason})"
    return line + f"; raw tracepoints on {tracepoints}"


def _mixed_reason(program, kind: str) -> str:
    """Why functions are on ``kind`` beside the program's own kind: what the trampoline
    cannot take, with up to three of their names."""
    names = [f.name for f in program.kfunctions if f.kind == kind]
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (f"{program.entry_kind} cannot take them: more than 12 arguments, a struct "
            f"returned by value or variable arguments: {shown}")


def _ring_bytes(buffer_mb: int) -> int:
    from ctracer.probes import ctext
    try:
        return ctext.check_ring_bytes(buffer_mb << 20 if buffer_mb > 0 else 0)
    except ValueError:
        raise UsageError("--buffer-mb must be a power of two (1, 2, 4, ... MB)") from None


def _check_calls(request: TraceRequest) -> None:
    """``--calls``: a word it takes, and compact events when it folds."""
    from ctracer.probes.folding import check_calls
    try:
        check_calls(request.calls)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if request.calls == "changes" and request.full_snapshots:
        raise UsageError("--calls changes folds calls against the object's last event: "
                         "it needs compact events (not --full-snapshots, --tail or --watch)")


def _check_kernel_only(request: TraceRequest) -> None:
    used = [opt for opt, value in (("--comm", request.comm), ("--object", request.objects),
                                   ("--where", request.where),
                                   ("--max-followed", request.max_objects),
                                   ("--lifetime-rule", request.lifetime_rules)) if value]
    if used:
        raise UsageError(f"{', '.join(used)} select kernel objects: they go with a kernel "
                         "trace (no --binary)")


def _format_fields(source):
    """The running kernel's tracefs formats, which name tracepoint arguments BTF leaves
    unnamed; None for another kernel's debug info (--btf FILE: its tracepoints are not
    this kernel's)."""
    if getattr(source, "btf", None):
        return None
    from ctracer.host.tracefs import tracepoint_format_fields
    return tracepoint_format_fields


def _argument_names(arguments: dict, model) -> dict:
    """Tracepoint arguments with the names of their enums from the kernel's BTF."""
    from ctracer.plan import displays
    return displays.annotate_arguments(arguments, model)


def _admission(request: TraceRequest, layout):
    from ctracer.plan import where as where_clause
    from ctracer.probes.tracepoint import Admission
    if request.max_objects is not None and request.max_objects < 1:
        raise UsageError("--max-followed needs a positive number")
    if request.comm is not None:
        data = request.comm.encode("utf-8", "replace")
        if not data or len(data) > 15 or not all(32 < b < 127 for b in data):
            raise UsageError(f"--comm {request.comm!r}: a process name is 1 to 15 printable "
                             "characters without spaces")
    for o in request.objects:
        if not 0 < o < 1 << 64:
            raise UsageError(f"--object {o:#x} is not an address")
    condition = where_clause.parse(request.where, layout) if request.where else None
    return Admission(processes=request.follow_processes, comm=request.comm,
                     objects=tuple(request.objects), where=condition,
                     max_objects=request.max_objects)


def _lifetime_rules(request: TraceRequest, name: str, model, methods: Sequence) -> tuple:
    """The lifetime rules of a kernel trace: the defaults for the struct (those whose
    tracepoint or function is traced), or exactly the ``--lifetime-rule`` ones, each
    placed on the parameter that is the object; enumerator names looked up in BTF."""
    from ctracer.plan import lifetime_rules

    def enumerator_value(text: str) -> Optional[int]:
        found = model.find_enum(enumerator=text)
        return dict(found.enumerators).get(text) if found is not None else None

    if request.lifetime_rules is None:
        chosen = []
        for rule in lifetime_rules.rules_for(name):
            if rule.equals_text:
                value = enumerator_value(rule.equals_text)
                rule = dataclasses.replace(rule, equals=rule.equals if value is None else value)
            try:
                chosen.extend(lifetime_rules.place([rule], methods))
            except UsageError:
                continue  # a default whose tracepoint or function is not traced here
        return lifetime_rules.without_stand_ins(chosen)
    texts = [t for t in request.lifetime_rules if t != "none"]
    if len(texts) != len(request.lifetime_rules) and texts:
        raise UsageError("--lifetime-rule none goes alone (it drops every rule)")
    placed = lifetime_rules.place([lifetime_rules.parse_rule(t, name, enumerator_value)
                                   for t in texts], methods)
    lifetime_rules.check_counts(placed)
    return placed


@contextlib.contextmanager
def _project_rule_lines(request: TraceRequest):
    """A refused lifetime rule that the project file gave names the file's line."""
    from ctracer.plan.lifetime_rules import LifetimeRuleError
    try:
        yield
    except LifetimeRuleError as err:
        texts = getattr(request.project, "lifetime_rules", None)
        if not texts or tuple(request.lifetime_rules or ()) != tuple(texts) \
                or err.rule not in texts:
            raise
        raise request.project.error(f"[objects] lifetime_rules: {err.rule!r}: {err.reason}",
                                    "objects", err.rule) from None


def _mini_of(request: TraceRequest, graph, model):
    """The mini struct the options choose (kernel fields annotated with how they are
    shown); an error naming the options when they leave no field."""
    from ctracer.collectors import registry
    from ctracer.plan import mini

    kind, name, source = request.kind, request.name, request.source
    built = mini.build_mini(graph, include=list(request.fields),
                            exclude=list(request.exclude_fields), pointers=request.pointers,
                            cachelines=list(request.cachelines), max_bytes=request.max_bytes,
                            kinds=registry.claim)
    if not built.layout.fields:
        chosen = [o for o, given in (("--fields", request.fields),
                                     ("--exclude-fields", request.exclude_fields),
                                     ("--cachelines", request.cachelines),
                                     ("--max-bytes", request.max_bytes)) if given]
        if chosen:
            raise UsageError(f"no field of {kind.value} {name} is left after "
                             f"{', '.join(chosen)}: a snapshot needs at least "
                             "one (ctracer struct --mini --explain lists them)")
        raise CtracerError(f"{kind.value} {name} has no member a snapshot can record")
    if source.is_kernel:
        from ctracer.plan import displays
        built = dataclasses.replace(built, layout=displays.annotate(built.layout, name, model))
    return built


def _user_program(request: TraceRequest, found: list, layout, ring: int):
    """The uprobe program of the program's functions the options select."""
    from ctracer.probes import uprobe

    kind, name, source = request.kind, request.name, request.source
    methods = select_methods([m for m in found if not m.is_tracepoint],
                             request.functions, request.exclude)
    if not methods:
        if request.exclude or request.functions:
            raise UsageError(f"no function of {source.binary} taking {kind.value} "
                             f"{name} is left after --functions and --exclude: "
                             "nothing to probe")
        raise CtracerError(f"no function in {source.binary} takes {kind.value} {name} "
                           "(directly, through an alias or a holder): nothing to probe")
    return uprobe.build_program(methods, layout, filtered=request.follow_processes,
                                ring_bytes=ring, compact=not request.full_snapshots,
                                calls=request.calls)


def _check_project(request: TraceRequest, graph, found) -> None:
    """The project file's functions and fields exist in the struct's methods and fields."""
    from ctracer.collectors import registry
    from ctracer.plan import mini
    fields, _ = mini.candidate_fields(graph, pointers=request.pointers, kinds=registry.claim)
    request.project.check(sorted({n for m in found.methods for n in (m.name, m.key)}),
                          [f.name for f in fields])


def _full_layout(graph, model) -> str:
    """The struct's whole layout as pahole prints it, for the trace's meta."""
    try:
        from ctracer.plan import pahole
        return pahole.render(graph, source_format=model.format)
    except Exception as e:  # the layout printer is a nicety here; never lose a trace to it
        return f"/* layout unavailable: {e} */\n"


def _refuse_over_max_functions(request: TraceRequest, function_methods: list) -> None:
    """``--max-functions N``: more functions than N probed is a usage error."""
    probed = len({m.key for m in function_methods})
    if request.max_functions is not None and probed > request.max_functions:
        raise UsageError(f"{probed} functions would be probed, more than --max-functions "
                         f"{request.max_functions}: choose them with --functions or "
                         "--exclude, or raise the limit")


def build(request: TraceRequest) -> BuiltTrace:
    """Types, methods, mini struct, probes and meta for the request; every option is
    checked against the struct before any C is generated."""
    from ctracer.plan import mini
    from ctracer.record import recorder

    kind, name, source = request.kind, request.name, request.source
    ring = _ring_bytes(request.buffer_mb)
    _check_calls(request)
    if not source.is_kernel:
        _check_kernel_only(request)
    model, graph, found = open_struct(source, name, kind)
    catalog = model.catalog()
    if request.project is not None:
        _check_project(request, graph, found)
    watch = None
    if request.watch:
        from ctracer.plan.watch import plan_watch
        watch = plan_watch(graph, list(request.watch), request.watch_budget)
    built = _mini_of(request, graph, model)
    #: the project file's columns of the report's object list (`ctracer.report.summaries`)
    summary = (request.project.summary_paths([f.name for f in built.layout.fields])
               if request.project is not None else ())
    extra: dict = {}
    program: Union[object]
    if source.is_kernel:
        from ctracer.plan import heads
        from ctracer.plan import lifetime_rules
        from ctracer.plan import stores
        from ctracer.probes.kernel_program import build_kernel_program
        def selected(methods: list) -> int:
            try:
                kept = select_methods(methods, request.functions, request.exclude)
            except UsageError:
                return 0   # said below, with the kind the plan chose
            return len({m.key for m in kept if not m.is_tracepoint})

        choice = choose_kernel_probes(found.methods, function_probes=request.function_probes,
                                      selected=selected)
        note = choice.note
        check_placeable(request.functions, choice, found.methods)
        methods = select_methods(choice.tracepoints + choice.functions, request.functions,
                                 request.exclude)
        if not methods:
            raise CtracerError(f"no function or tracepoint of {source.describe()} taking "
                               f"{kind.value} {name} is left once --exclude has dropped "
                               "what it names: nothing to probe")
        function_methods = [m for m in methods if not m.is_tracepoint]
        _refuse_over_max_functions(request, function_methods)
        methods = [m for m in methods if m.is_tracepoint]
        admission = _admission(request, built.layout)
        with _project_rule_lines(request):
            rules = _lifetime_rules(request, name, model, methods + function_methods)
        head = heads.head_read_for(name, graph, built.layout, model)
        kinds = {m.key: choice.function_kinds[m.key] for m in function_methods
                 if m.key in choice.function_kinds}
        storage = _task_storage(choice.entry_kind if function_methods else None,
                                *set(kinds.values()), choice.fallback_kind)
        note = dict(note, thread_state=storage.to_json())
        program = build_kernel_program(methods, built.layout, catalog,
                                       function_methods=function_methods,
                                       entry_kind=choice.entry_kind,
                                       admission=admission, rules=rules,
                                       ring_bytes=ring, head=head,
                                       format_fields=_format_fields(source),
                                       task_storage=storage.works is not False,
                                       compact=not request.full_snapshots,
                                       calls=request.calls, function_kinds=kinds,
                                       fallback_kind=choice.fallback_kind)
        with _project_rule_lines(request):
            lifetime_rules.check_arguments(rules, {tp.name: [a.name for a in tp.args]
                                              for tp in program.tracepoints})
        note = dict(note, kinds=_kinds_line(program, choice, len(program.tracepoints)),
                    function_kinds=program.entry_kinds)
        extra = dict(
            traced="kernel", type_source=source.describe(), event_nargs=program.nargs,
            return_kinds={str(k): v for k, v in program.return_kinds().items()},
            tracepoint_args=_argument_names({str(row): [a.to_json() for a in args]
                                             for row, args in program.args_by_row().items()},
                                            model),
            lifetime_rules=[r.to_json() for r in rules], admission=admission.to_json(),
            announced_stores=[r.to_json() for r in stores.place(
                name, {tp.name: [a.name for a in tp.args] for tp in program.tracepoints},
                [f.name for f in built.layout.fields])],
            probe_plan=note, head_read=head.to_json() if head is not None else None)
    else:
        program = _user_program(request, found.methods, built.layout, ring)
        extra = dict(traced="user")
    full = _full_layout(graph, model)
    meta = recorder.trace_meta(
        struct_kind=kind.value, struct_name=name, mini_json=built.layout.to_json(),
        mini_text=mini.render_built(built, explain=True),
        full_layout=full, binary=source.binary, argv=request.argv, fields=request.fields,
        functions=request.functions, bpf_text=program.text,
        **({"summary_fields": list(summary)} if summary else {}),
        event_encoding=ENCODING_COMPACT if program.compact else ENCODING_FULL,
        calls=getattr(program, "calls", "all"), **extra)
    return BuiltTrace(program, meta, source.binary, watch)
