"""A trace request, as plain data, turned into a probe program and the trace file's meta.

`TraceRequest` says what to trace (the struct, where its types come from, which
methods, which fields, which objects); `build` runs the stages below it in order —
types (`ctracer.debuginfo`), methods and the mini struct (`ctracer.plan`), the probe
program (`ctracer.probes`) — and returns a `BuiltTrace` that
`ctracer.record.recorder.record` runs.  `ctracer trace` and `ctracer demo` both call
it; nothing here knows about command-line parsing.

A user-space binary (``--binary``) is traced with a uprobe and a uretprobe per method.
A kernel (the running one by default, ``--module``, ``--btf``) is traced through the
probes `choose_kernel_probes` picks from the probe plan of ``ctracer plan``: every
function taking the struct on entry and exit, with the kind the kernel accepts (fentry/
fexit, else kprobe/kretprobe), plus the raw tracepoints whose arguments carry it; on a
kernel attaching neither fentry nor kprobes, the tracepoints alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

from ctracer.probes import ProbeProgram
from ctracer.debuginfo.catalog import ShapeKind
from ctracer.debuginfo.sources import TypeSource
from ctracer.errors import CtracerError, UnknownType, UsageError


@dataclass(frozen=True)
class TraceRequest:
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
    #: the command line, stored in the trace
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuiltTrace:
    program: ProbeProgram
    meta: dict
    #: the binary whose uprobes are attached; None for a kernel
    binary: Optional[str]

    @property
    def is_kernel(self) -> bool:
        return self.binary is None


def select_methods(methods: Sequence, patterns: Sequence[str],
                   exclude: Sequence[str] = ()) -> list:
    """The methods whose function name (or name@unit, or tp:name) matches a glob (all
    when none), minus those matching an ``exclude`` glob."""
    import difflib

    def names_of(m) -> tuple[str, ...]:
        return (m.name, m.key)

    every = sorted({n for m in methods for n in names_of(m)})
    for option, globs in (("--functions", patterns), ("--exclude", exclude)):
        for pat in globs:
            if not any(fnmatch.fnmatchcase(n, pat) for n in every):
                close = difflib.get_close_matches(pat, every, n=5, cutoff=0.5)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise UsageError(f"{option} {pat!r} matches no method{hint}")
    kept = [m for m in methods
            if not patterns or any(fnmatch.fnmatchcase(n, p) for n in names_of(m)
                                   for p in patterns)]
    return [m for m in kept
            if not any(fnmatch.fnmatchcase(n, p) for n in names_of(m) for p in exclude)]


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


FUNCTION_PROBES = ("auto", "fentry", "kprobe", "none")
#: above this many functions, ``auto`` takes kprobe.multi links over fentry where the
#: kernel has them: two links attach and detach every function at once, while fentry
#: loads a program per function and detaches them one by one (each waits for the
#: kernel's text patching and an RCU-tasks grace period: minutes for thousands)
FENTRY_AUTO_MAX = 256


def choose_kernel_probes(methods: Sequence, space: str = "kernel",
                         function_probes: str = "auto",
                         selected: Callable[[list], int] = lambda ms: len(
                             {m.key for m in ms if not m.is_tracepoint})) -> KernelChoice:
    """The methods a kernel trace probes, from the probe plan (`ctracer.plan.attach`,
    with what the running kernel was seen to accept): the tracepoints the plan gives a
    raw tracepoint probe that the kernel accepts, and the functions it places (their
    kind: the plan's, or the one ``function_probes`` forces where the kernel takes it;
    "none": no function; "auto": fentry, unless more than `FENTRY_AUTO_MAX` functions
    — ``selected`` counts those the trace keeps of the methods placed — would be probed
    and kprobe.multi links work).  Probes that could not be tried (without root, for
    ``--print-bpf``) are kept."""
    from ctracer.plan.attach import plan_probes
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
    entries = plan.of_kind("fentry", "kprobe")
    usable = [p for p in entries if p.attachable is not False]
    kind = usable[0].kind if usable else None
    picked = [m for p in usable for m in p.methods] if function_probes != "none" else []
    many = selected(chosen + picked) if function_probes == "auto" and kind == "fentry" else 0
    if many > FENTRY_AUTO_MAX and facts.kprobe_multi.works and facts.kprobes.works:
        plan = plan_probes(methods, facts, space=space, prefer="kprobe")
        entries = [dataclasses.replace(
            p, reason=f"{many} functions: kprobe.multi links attach and detach them all at "
                      f"once, where fentry loads a program per function and detaches them "
                      f"one by one (--function-probes fentry for fentry)")
            for p in plan.of_kind("fentry", "kprobe")]
        usable = [p for p in entries if p.attachable is not False]
        kind = usable[0].kind if usable else None
        picked = [m for p in usable for m in p.methods]
    if not chosen and not picked:
        why = refused[0] if refused else (entries[0].reason if entries else
                                          "no tracepoint or function to probe")
        raise CtracerError(f"nothing can be traced here ({why})")
    note = {"counts": plan.counts(), "kernel": facts.to_json(),
            "tracepoints_refused": refused,
            "functions_planned": len({p.function for p in entries}),
            "functions_left_out": [[p.function, p.reason] for p in plan.left_out()][:200],
            "entry_kind": kind if picked else None,
            "reason": entries[0].reason if entries else "no function takes the struct",
            "function_probes": function_probes}
    return KernelChoice(chosen, picked, kind if picked else None, note)


def _task_storage(entry_kind: Optional[str]):
    """Whether the running kernel lets ``entry_kind``'s programs keep each thread's call
    depth and saved entries in task storage (tried: `ctracer.host.
    task_storage_works`); where it cannot be tried (not root: ``--print-bpf``) the
    programs are written with it."""
    from ctracer.host.facts import Mechanism
    if entry_kind is None:
        return Mechanism(None, "no kernel function probed")
    from ctracer.host.features import task_storage_works
    return task_storage_works(entry_kind)


def _check_placeable(patterns: Sequence[str], choice: KernelChoice, methods: Sequence) -> None:
    """A ``--functions`` glob naming only methods this kernel cannot probe says so
    (rather than that it matches no method)."""
    placed = {n for m in choice.tracepoints + choice.functions for n in (m.name, m.key)}
    for pat in patterns:
        if any(fnmatch.fnmatchcase(n, pat) for n in placed):
            continue
        known = sorted({m.name for m in methods
                        if fnmatch.fnmatchcase(m.name, pat) or fnmatch.fnmatchcase(m.key, pat)})
        if known:
            shown = ", ".join(known[:3]) + (", ..." if len(known) > 3 else "")
            raise CtracerError(f"--functions {pat!r}: {shown} cannot be probed here "
                               f"({choice.note['reason']}; `ctracer plan` says why)")


def _kinds_line(program, choice: KernelChoice, tracepoints: int) -> str:
    """Which probe kinds a kernel trace uses and why the others are not, in one line."""
    reason = choice.note["reason"]
    if program.kfunctions:
        kind = program.entry_kind
        line = (f"{kind}/{'fexit' if kind == 'fentry' else 'kretprobe'} on "
                f"{len(program.kfunctions)} functions ({reason})")
    elif choice.note["function_probes"] == "none":
        line = "no function probes (--function-probes none)"
    elif choice.functions:
        line = "no function probes (none selected)"
    else:
        line = f"no function probes ({reason})"
    return line + f"; raw tracepoints on {tracepoints}"


def _ring_bytes(buffer_mb: int) -> int:
    from ctracer.probes import ctext
    try:
        return ctext.check_ring_bytes(buffer_mb << 20 if buffer_mb > 0 else 0)
    except ValueError:
        raise UsageError("--buffer-mb must be a power of two (1, 2, 4, ... MB)") from None


def _check_kernel_only(request: TraceRequest) -> None:
    used = [opt for opt, value in (("--comm", request.comm), ("--object", request.objects),
                                   ("--where", request.where),
                                   ("--max-objects", request.max_objects),
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
        raise UsageError("--max-objects needs a positive number")
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
    return lifetime_rules.place([lifetime_rules.parse_rule(t, name, enumerator_value) for t in texts],
                           methods)


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
        methods.setdefault((m.key, m.reach, m.param_index, m.route), m)
    for model in models:
        for m in discovery.discover(model.catalog(), name, kind, **options).methods:
            methods.setdefault((m.key, m.reach, m.param_index, m.route), m)
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
                                ring_bytes=ring)

def build(request: TraceRequest) -> BuiltTrace:
    """Types, methods, mini struct, probes and meta for the request; every option is
    checked against the struct before any C is generated."""
    from ctracer.collectors import registry
    from ctracer.plan import mini
    from ctracer.record import recorder

    kind, name, source = request.kind, request.name, request.source
    ring = _ring_bytes(request.buffer_mb)
    if not source.is_kernel:
        _check_kernel_only(request)
    model, graph, found = open_struct(source, name, kind)
    catalog = model.catalog()
    if request.project is not None:
        fields, _ = mini.candidate_fields(graph, pointers=request.pointers,
                                          kinds=registry.claim)
        request.project.check(sorted({n for m in found.methods for n in (m.name, m.key)}),
                              [f.name for f in fields])
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
        _check_placeable(request.functions, choice, found.methods)
        methods = select_methods(choice.tracepoints + choice.functions, request.functions,
                                 request.exclude)
        if not methods:
            raise CtracerError(f"no function or tracepoint of {source.describe()} taking "
                               f"{kind.value} {name} is left once --exclude has dropped "
                               "what it names: nothing to probe")
        function_methods = [m for m in methods if not m.is_tracepoint]
        probed = len({m.key for m in function_methods})
        if request.max_functions is not None and probed > request.max_functions:
            raise UsageError(f"{probed} functions would be probed, more than --max-functions "
                             f"{request.max_functions}: choose them with --functions or "
                             "--exclude, or raise the limit")
        methods = [m for m in methods if m.is_tracepoint]
        admission = _admission(request, built.layout)
        with _project_rule_lines(request):
            rules = _lifetime_rules(request, name, model, methods + function_methods)
        head = heads.head_read_for(name, graph, built.layout, model)
        storage = _task_storage(choice.entry_kind if function_methods else None)
        note = dict(note, thread_state=storage.to_json())
        program = build_kernel_program(methods, built.layout, catalog,
                                       function_methods=function_methods,
                                       entry_kind=choice.entry_kind,
                                       admission=admission, rules=rules,
                                       ring_bytes=ring, head=head,
                                       format_fields=_format_fields(source),
                                       task_storage=storage.works is not False)
        with _project_rule_lines(request):
            lifetime_rules.check_arguments(rules, {tp.name: [a.name for a in tp.args]
                                              for tp in program.tracepoints})
        note = dict(note, kinds=_kinds_line(program, choice, len(program.tracepoints)))
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
    try:
        from ctracer.plan import pahole
        full = pahole.render(graph, source_format=model.format)
    except Exception as e:  # the layout printer is a nicety here; never lose a trace to it
        full = f"/* layout unavailable: {e} */\n"
    meta = recorder.trace_meta(
        struct_kind=kind.value, struct_name=name, mini_json=built.layout.to_json(),
        mini_text=mini.render_built(built, explain=True),
        full_layout=full, binary=source.binary, argv=request.argv, fields=request.fields,
        functions=request.functions, bpf_text=program.text,
        **({"summary_fields": list(summary)} if summary else {}), **extra)
    return BuiltTrace(program, meta, source.binary)
