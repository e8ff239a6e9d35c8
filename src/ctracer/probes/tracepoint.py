"""The BPF program that traces a kernel struct through raw tracepoints.

On a kernel where neither kprobes nor fentry can be used, the ways into a struct that
remain are the tracepoints whose arguments carry it (`ctracer.plan.discovery` finds
them in BTF: ``btf_trace_<name>`` typedefs; the ``__bpf_trace_<name>`` functions, or
those of the event's class, name the parameters).  `plan_tracepoints` decides what to
probe (one function-table row per method); `emit_tracepoint_c` writes the C, with the
probes of kernel functions when there are any; `ctracer.probes.kernel_program.build_kernel_program`
builds the whole program.

Not a program per tracepoint: one per route count (`ROUTE_COUNTS`: the ways a tracepoint
hands the object), compiled once whatever the number of tracepoints, told of each
tracepoint by its row of the array ``ctracer_tps`` (`descriptor_bytes`: the argument each
way starts from, the steps from it, the lifetime rules and their conditions).  Each
tracepoint loads its program with its row's index written in place of `SELF_INDEX`
(`with_index`; a raw tracepoint link has no cookie before Linux 6.10), and the program
reads the tracepoint's arguments as the kernel's array of u64 (as many as it has), so
one program serves tracepoints of any number of arguments.

What a probe does on each hit, per method of its tracepoint:

* compute the object's address from ``ctx->args[i]`` (following the method's path:
  ``sk_buff->sk`` reads the member with ``bpf_probe_read_kernel``); no object, no event;
* a lifetime rule (`ctracer.plan.lifetime_rules`) that *starts* a lifetime forgets the
  address first, so it is admitted afresh;
* an object already followed is recorded; else it is admitted when the process filter
  (``-p``/``-- COMMAND``: the current process is in ``ctracer_pids``), ``--comm``,
  ``--object``, ``--where`` (evaluated on the snapshot, in the kernel) and
  ``--max-followed`` (an atomic counter of admissions) all agree (a process or a name
  only in the task's own work, not in an interrupt that came in on it:
  `_context_functions`), and from then on it is
  followed in every context (softirq, timers, kernel threads) through the hash
  ``ctracer_objects``; without any of these every object is recorded.  An object read
  only in its head (a time-wait or request socket: no tracepoint marks its end, and
  its address soon carries another process's) is admitted hit by hit, never followed;
* the event is one ring buffer record: the header (phase `PHASE_TRACEPOINT`), every
  argument of the tracepoint as a raw u64 slot, and the mini snapshot read with
  ``bpf_probe_read_kernel`` at the offsets of the kernel's BTF (only its head, flagged
  `FLAG_HEAD_ONLY`, where `ctracer.plan.heads` says the object is no more than that:
  a time-wait or request socket handed over as a ``struct sock *``);
* a rule that *ends* a lifetime marks the address ended after recording (`OBJECT_ENDED`),
  as the report splits lifetimes (`ctracer.record.live_objects`): a later hit reaching
  it through a holder (``kfree_skb`` of the dead socket's last buffer, ``skb->sk``) or a
  call's exit is still the ended life's, recorded without admitting the address again
  (the dead object's memory may still match ``--where``); any other hit, or a rule
  *starting* a life, is a new life's, which must be admitted afresh.

Lost events (ring buffer full) are counted in ``ctracer_lost`` as in the uprobe program.
"""

from __future__ import annotations

import re
import struct as _struct
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ctracer.collectors.base import KERNEL
from ctracer.debuginfo.catalog import Catalog, Parameter, ShapeKind, TracepointInfo
from ctracer.event import (FLAG_HEAD_ONLY, FLAG_READ_FAILED, PHASE_EXIT, PHASE_TRACEPOINT,
                           Layout, c_compact_definition, c_event_definition, event_size)
from ctracer.plan import where as where_clause
from ctracer.plan.discovery import Method
from ctracer.plan.heads import HeadRead
from ctracer.plan.lifetime_rules import LifetimeRule
from ctracer.probes import ctext, folding
from ctracer.probes.arguments import Argument, argument_of
from ctracer.event import FunctionRow

#: followed objects when no --max-followed bounds them
OBJECT_CAPACITY = 65536
#: the value ``ctracer_objects`` holds for an address whose life a rule ended (1: followed):
#: kept rather than deleted, so the dead object's memory, still matching, is not admitted
#: again by the ended life's last hits (a ``kfree_skb`` of a destroyed socket's buffer,
#: through ``skb->sk``), which would follow the next object at the address unchecked; a
#: new life's hit deletes it and passes the admission again
OBJECT_ENDED = 2
#: the number of raw tracepoint arguments a probe reads
MAX_ARGS = 12
#: the route counts the tracepoint programs come in (methods of one tracepoint)
ROUTE_COUNTS = (1, 2, 4, 8)
#: the constant a tracepoint program is compiled with in place of its tracepoint's
#: index (its ``ctracer_tps`` row): each tracepoint loads the program with the constant
#: replaced (`with_index`); no other instruction holds it
SELF_INDEX = 0x7ACE1D00
_RULE_NONE, _RULE_ALWAYS, _RULE_WHEN = 0, 1, 2

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_COMM_LEN = 16


@dataclass(frozen=True)
class TracepointRoute:
    """One method of a probed tracepoint: one function-table row."""

    id: int
    method: Method
    starts: Optional[LifetimeRule] = None
    ends: Optional[LifetimeRule] = None
    #: a second rule starting a lifetime at this tracepoint (a socket's life starts
    #: out of TCP_CLOSE, an accepted one's at its clone, into TCP_SYN_RECV)
    starts_too: Optional[LifetimeRule] = None


@dataclass(frozen=True)
class ProbedTracepoint:
    """A tracepoint the programs probe: its index, arguments and the methods it reaches
    the object by."""

    index: int
    name: str
    args: tuple[Argument, ...]
    routes: tuple[TracepointRoute, ...]

    @property
    def route_count(self) -> int:
        """The routes of the program it runs (the smallest of `ROUTE_COUNTS` holding its
        methods)."""
        return next(n for n in ROUTE_COUNTS if n >= len(self.routes))

    @property
    def probe(self) -> str:
        """The program it runs: every tracepoint with as many routes runs the same one,
        loaded once for it with its index written in (`SELF_INDEX`)."""
        return program_name(self.route_count)

    @property
    def row_ids(self) -> tuple[int, ...]:
        """The function rows of the tracepoint, one per way it reaches the object."""
        return tuple(s.id for s in self.routes)


@dataclass(frozen=True)
class ContextProbe:
    """A raw tracepoint probed to know the CPU's context, not to record anything
    (`_context_functions`); ``optional``: the tracepoint exists on some architectures
    only (x86's interrupt vectors), and where it does not, nothing is missing.  Probes
    of one ``group`` (an entry and its exit) are attached all or none: an entry counted
    without its exit would leave the CPU in an interrupt for ever."""

    name: str
    program: str
    optional: bool = False
    group: str = ""
    row_ids: tuple[int, ...] = ()


#: the context probes, in the order they are attached: hard interrupts (device
#: handlers; x86's timer and IPI vectors, not irq_work's, whose exit BPF may not probe:
#: BPF itself uses irq_work), softirqs raised, softirq handlers run.  Each exit comes
#: before its entry: an exit seen without its entry is ignored, an entry seen without
#: its exit (attached a moment later) would count for ever.
CONTEXT_PROBES = (
    ContextProbe("irq_handler_exit", "ctracer_hardirq_exit", group="irq_handler"),
    ContextProbe("irq_handler_entry", "ctracer_hardirq_entry", group="irq_handler"),
    *(ContextProbe(f"{vector}_{end}", f"ctracer_hardirq_{end}", optional=True, group=vector)
      for vector in ("local_timer", "call_function", "call_function_single", "reschedule")
      for end in ("exit", "entry")),
    ContextProbe("softirq_raise", "ctracer_softirq_raise"),
    ContextProbe("softirq_exit", "ctracer_softirq_exit", group="softirq"),
    ContextProbe("softirq_entry", "ctracer_softirq_entry", group="softirq"))


def needs_context(admission: "Admission") -> bool:
    """Whether the programs follow the CPU's context (`CONTEXT_PROBES`): a process or
    a name chooses the objects."""
    return bool(admission.processes or admission.comm)


@dataclass(frozen=True)
class Admission:
    """Which objects are followed (see the module docstring); all empty: every one."""

    processes: bool = False
    comm: Optional[str] = None
    objects: tuple[int, ...] = ()
    where: Optional[where_clause.Condition] = None
    max_objects: Optional[int] = None

    @property
    def selective(self) -> bool:
        return bool(self.processes or self.comm or self.objects or self.where is not None
                    or self.max_objects)

    def to_json(self) -> dict:
        return {"processes": self.processes, "comm": self.comm,
                "objects": [hex(o) for o in self.objects],
                "where": where_clause.to_text(self.where) if self.where is not None else None,
                "max_objects": self.max_objects}


# ------------------------------------------------------------------ planning


def parameter_names(catalog: Catalog, tp: TracepointInfo) -> list[Optional[str]]:
    """The tracepoint's parameter names (the ``btf_trace_`` typedef's prototype has
    none): from its ``__bpf_trace_<name>`` function, or, for an event of a class (the
    kernel's DEFINE_EVENT: one such function per class, named after the class), from the
    ``__bpf_trace_`` functions whose parameters have the event's types, when they all
    name them alike (the event's own class is among them); [] when BTF does not say."""
    wanted = f"__bpf_trace_{tp.name}"
    alike: set[tuple[Optional[str], ...]] = set()
    for p in tp.params:
        if p.shape.kind in (ShapeKind.STRUCT, ShapeKind.UNION) and p.shape.name:
            for f in catalog.functions_referencing(p.shape.kind, p.shape.name):
                if f.name == wanted:
                    return [q.name for q in f.params[1:]]
                if f.name.startswith("__bpf_trace_") and _same_types(f.params[1:], tp.params):
                    alike.add(tuple(q.name for q in f.params[1:]))
    return list(alike.pop()) if len(alike) == 1 else []


#: a tracefs format's fields of one tracepoint: (C type, name), ``common_*`` left out
FormatFields = Callable[[str], Sequence[tuple[str, str]]]


def names_from_format(params: Sequence[Parameter],
                      fields: Sequence[tuple[str, str]]) -> list[Optional[str]]:
    """Parameter names from the tracepoint's tracefs format, where BTF has none: the
    record's fields are mostly the parameters under their names, with computed ones
    between (``sock_recv_length``: ``sk``, family, protocol, ``ret``, ``flags``).  Each
    parameter takes the next field of its type (a pointer a pointer field, an integer a
    field of the same C type); [] unless every parameter finds one."""
    names: list[Optional[str]] = []
    at = 0
    for p in params:
        s = p.shape
        pointer = bool(s.pointers) or s.kind in (ShapeKind.STRUCT, ShapeKind.UNION)
        while at < len(fields):
            ctype, name = fields[at]
            at += 1
            if ("*" in ctype) if pointer else (ctype.replace("const ", "").strip() == s.name):
                names.append(name)
                break
        else:
            return []
    return names


def _same_types(these: Sequence[Parameter], those: Sequence[Parameter]) -> bool:
    return len(these) == len(those) and all(
        (a.shape.kind, a.shape.name, a.shape.pointers) ==
        (b.shape.kind, b.shape.name, b.shape.pointers) for a, b in zip(these, those))


def plan_tracepoints(methods: Sequence[Method], catalog: Catalog,
                     rules: Sequence[LifetimeRule] = (),
                     format_fields: Optional[FormatFields] = None,
                     ) -> tuple[tuple[FunctionRow, ...], tuple[ProbedTracepoint, ...]]:
    """Function-table rows (one per tracepoint method) and the tracepoints to probe;
    ``format_fields`` (the running kernel's tracefs) names the arguments BTF leaves
    unnamed (`names_from_format`)."""
    ordered = sorted((m for m in methods if m.is_tracepoint),
                     key=lambda m: (m.name, m.param_index or 0, m.route_form))
    rows: list[FunctionRow] = []
    by_tp: dict[str, list[TracepointRoute]] = {}
    infos: dict[str, TracepointInfo] = {}
    for m in ordered:
        row_id = len(rows) + 1
        why = "" if m.probeable else f"skipped: {m.not_probeable}"
        if not why and (m.param_index is None or m.param_index >= MAX_ARGS):
            why = "skipped: the object is not among the first 12 arguments"
        rows.append(FunctionRow(row_id, m.name, "", m.route_kind, m.route_text, None, why))
        if why:
            continue
        direct = not m.path and not m.holder  # the argument is the object itself
        mine = [r for r in rules if direct and r.probe == "tracepoint"
                and r.function == m.name and r.param_index == m.param_index]
        starting = [r for r in mine if r.effect == "starts"]
        ends = next((r for r in mine if r.effect == "ends"), None)
        by_tp.setdefault(m.name, []).append(TracepointRoute(
            row_id, m, starting[0] if starting else None, ends,
            starting[1] if len(starting) > 1 else None))
        infos[m.name] = m.function  # type: ignore[assignment]
    tracepoints = []
    for index, name in enumerate(sorted(by_tp)):
        info = infos[name]
        names = parameter_names(catalog, info)
        if not names and format_fields is not None:
            names = names_from_format(info.params[:MAX_ARGS], format_fields(name))
        args = tuple(argument_of(p, i, names) for i, p in enumerate(info.params[:MAX_ARGS]))
        tracepoints.append(ProbedTracepoint(index, name, args, tuple(by_tp[name])))
    return tuple(rows), tuple(tracepoints)


# ------------------------------------------------------------------ C text


def where_c(node: where_clause.Condition, var: str) -> str:
    """C for a parsed ``--where`` condition on the snapshot ``var`` (a pointer to the
    mini struct): identifiers from the layout, integers as literals, nothing else."""
    if isinstance(node, where_clause.Compare) and node.field.kind == "ipv6":
        # 16 bytes, compared one by one as unsigned (== and != only, the parser says)
        data = (node.value % (1 << 128)).to_bytes(16, "big")
        same = " && ".join(f"(u8){var}->{node.field.c_name}[{i}] == {b:#x}"
                           for i, b in enumerate(data))
        return f"({same})" if node.op == "==" else f"(!({same}))"
    if isinstance(node, where_clause.Compare):
        signed = node.field.kind == "int" or node.field.ctype.startswith("s")
        cast = "s64" if signed else "u64"
        literal = f"{node.value}LL" if signed else f"{node.value % (1 << 64):#x}ULL"
        if node.op == "&":
            return f"((({cast}){var}->{node.field.c_name} & {literal}) != 0)"
        return f"(({cast}){var}->{node.field.c_name} {node.op} {literal})"
    if isinstance(node, where_clause.Not):
        return f"(!{where_c(node.operand, var)})"
    op = "&&" if isinstance(node, where_clause.And) else "||"
    return f"({where_c(node.left, var)} {op} {where_c(node.right, var)})"


def validate_comm(comm: str) -> None:
    """ValueError unless ``comm`` can be a process name (`_comm_c` compares it)."""
    _comm_c(comm)


def _comm_c(comm: str) -> list[str]:
    """A byte-by-byte comparison of the current task's comm with ``comm`` (numbers
    only in the C)."""
    data = comm.encode()
    if not data or len(data) >= _COMM_LEN or not all(32 < b < 127 for b in data):
        raise ValueError(f"not a process name: {comm!r}")
    want = list(data) + [0]
    checks = " || ".join(f"c[{i}] != {b}" for i, b in enumerate(want))
    return ["\tchar c[16] = {};",
            "",
            "\tbpf_get_current_comm(&c, sizeof(c));",
            f"\tif ({checks})",
            "\t\treturn 0;"]


def _context_functions() -> str:
    """The CPU's context as the context probes (`CONTEXT_PROBES`) count it, and
    ``ctracer_in_task``: whether a probe runs in the current task's own work.

    In an interrupt or a softirq, the current task is whatever task it came in on: a
    TCP timer of another process's socket, firing while the chosen process runs, would
    be taken for the chosen one's (CI saw exactly that).  But a softirq the task raised
    itself is its work: a loopback send hands the packet to NET_RX, which runs at once
    on the same task and gives the peer socket its SYN_RECV, its data, its RST.  So a
    softirq handler counts as the task's when its softirq was last raised outside any
    interrupt or softirq; a timer's (raised by the tick, a hard interrupt) and what a
    softirq raises do not.  (The kernel's preempt count cannot tell the two apart, and
    is a per-CPU variable a BPF program reaches only by an address a kernel without
    CONFIG_KALLSYMS_ALL does not give; nor does the stack: an interrupt from user space
    runs its softirqs on the task's stack, a task's own softirqs run on the CPU's.)"""
    t = ctext.Text()
    t("struct ctracer_context {",
      "\ts32 hardirqs;      /* hard interrupt handlers running */",
      "\ts32 softirqs;      /* softirq handlers running */",
      "\tu32 raised_by_task;  /* softirqs last raised outside interrupts and softirqs */",
      "\tu32 serving_task;    /* the running softirq was raised so */",
      "};",
      "BPF_PERCPU_ARRAY(ctracer_context, struct ctracer_context, 1);",
      "")
    bodies = {
        "ctracer_hardirq_entry": ["c->hardirqs++;"],
        "ctracer_hardirq_exit": ["if (c->hardirqs > 0)  /* not when it began before the probes */",
                                 "\tc->hardirqs--;"],
        "ctracer_softirq_raise": ["if (c->hardirqs <= 0 && c->softirqs <= 0)",
                                  "\tc->raised_by_task |= bit;",
                                  "else",
                                  "\tc->raised_by_task &= ~bit;"],
        "ctracer_softirq_entry": ["c->softirqs++;",
                                  "c->serving_task = (c->raised_by_task & bit) != 0;",
                                  "c->raised_by_task &= ~bit;"],
        "ctracer_softirq_exit": ["if (c->softirqs > 0)",
                                 "\tc->softirqs--;",
                                 "c->serving_task = 0;"],
    }
    for program, body in bodies.items():
        t(f"int {program}(struct bpf_raw_tracepoint_args *ctx)",
          "{",
          "\tu32 zero = 0;",
          "\tstruct ctracer_context *c = ctracer_context.lookup(&zero);",
          *(["\tu32 bit = 1U << (ctx->args[0] & 31);  /* the softirq's number */"]
            if "softirq" in program else []),
          "",
          "\tif (!c)",
          "\t\treturn 0;",
          *("\t" + line for line in body),
          "\treturn 0;",
          "}",
          "")
    t("static __always_inline int ctracer_in_task(void)",
      "{",
      "\tu32 zero = 0;",
      "\tstruct ctracer_context *c = ctracer_context.lookup(&zero);",
      "",
      "\treturn !c || (c->hardirqs <= 0 && (c->softirqs <= 0 || c->serving_task));",
      "}")
    return str(t)


def _admit_function(admission: Admission, mini: Layout,
                    head: Optional[HeadRead] = None) -> str:
    t = ctext.Text()
    if needs_context(admission):
        t.block(_context_functions())
        t("")
    t("/* Whether a not yet followed object starts being followed at this hit. */",
      f"static __always_inline int ctracer_admit(u64 object, struct {mini.name} *m, "
      "u64 pid_tgid, u8 flags)",
      "{",
      "\tu32 zero = 0;",
      "\tu8 yes = 1;",
      "")
    if needs_context(admission):
        t("\t/* a process or a name chooses the objects of its own work, not those of an",
          "\t * interrupt that came in while it ran */",
          "\tif (!ctracer_in_task())",
          "\t\treturn 0;")
    if admission.processes:
        t("\tu32 tgid = pid_tgid >> 32;",
          "",
          "\tif (!ctracer_pids.lookup(&tgid))",
          "\t\treturn 0;")
    if admission.comm:
        t("\t{")
        t(*("\t" + line for line in _comm_c(admission.comm)))
        t("\t}")
    if admission.objects:
        wanted = " && ".join(f"object != {o:#x}ULL" for o in admission.objects)
        t(f"\tif ({wanted})", "\t\treturn 0;")
    if admission.where is not None:
        if head is not None and not where_clause.fields_of(admission.where) <= set(head.fields):
            t("\t/* --where reads fields an object read only in its head has not: no */",
              f"\tif (flags & {FLAG_HEAD_ONLY})",
              "\t\treturn 0;")
        t("\t/* --where, on the snapshot just taken */",
          f"\tif (flags & {FLAG_READ_FAILED} || !{where_c(admission.where, 'm')})",
          "\t\treturn 0;")
    if admission.max_objects:
        t("\t{",
          "\t\tu64 *admitted = ctracer_admitted.lookup(&zero);",
          "",
          f"\t\tif (!admitted || __sync_fetch_and_add(admitted, 1) >= {int(admission.max_objects)})",
          "\t\t\treturn 0;",
          "\t}")
    t(f"\tif (!(flags & {FLAG_HEAD_ONLY}))  /* a time-wait or request socket dies unseen: "
      "admitted hit by hit */",
      "\t\tctracer_objects.update(&object, &yes);",
      "\treturn 1;",
      "}")
    return str(t)


def _hit_function(admission: Admission, nargs: int, mini: Layout,
                  compact: bool = False, fold: bool = False) -> str:
    """``ctracer_hit``: one event of a followed or newly admitted object, for a
    tracepoint hit and for a kernel function's entry or exit alike (`ctracer.probes.
    kfunctions`).  Object 0 is a creation function's entry (there is no object yet):
    written only for a followed process, never admitted."""
    t = ctext.Text()
    t("static __always_inline void ctracer_hit(u32 function_id, u8 phase, u64 object,",
      "\t\t\t\t\ts64 retval, u32 depth, u8 flags, const u64 *args,",
      "\t\t\t\t\tu64 pid_tgid, int starts, int ends, int held)",
      "{",
      "\tu32 zero = 0;",
      "\tint read;",
      "\tstruct ctracer_event *e;",
      "")
    if admission.selective:
        t(f"\tu8 ended = {OBJECT_ENDED};",
          "\tint followed = 0;",
          "",
          "\tif (!object) {")
        if admission.processes and not (admission.comm or admission.objects
                                        or admission.where is not None):
            t("\t\tu32 tgid = pid_tgid >> 32;",
              "",
              "\t\tif (!ctracer_pids.lookup(&tgid))",
              "\t\t\treturn;")
        else:
            t("\t\treturn;")
        t("\t} else {",
          "\t\tu8 *state;",
          "",
          "\t\tif (starts)",
          "\t\t\tctracer_objects.delete(&object);",
          "\t\tstate = ctracer_objects.lookup(&object);",
          "\t\t/* its life ended: a hit through a holder (the dead socket's last buffer) or",
          "\t\t * a call's exit is still that life's, recorded, the address not admitted;",
          "\t\t * any other hit is a new life's, admitted afresh */",
          f"\t\tif (state && *state == {OBJECT_ENDED} && !held && phase != {PHASE_EXIT}) {{",
          "\t\t\tctracer_objects.delete(&object);",
          "\t\t\tstate = 0;",
          "\t\t}",
          "\t\tfollowed = state != 0;",
          "\t}")
        if admission.processes:
            t("\tif (!followed) {",
              "\t\tu32 tgid = pid_tgid >> 32;",
              "",
              "\t\tif (!ctracer_pids.lookup(&tgid))",
              "\t\t\treturn;",
              "\t}")
    if compact:
        _compact_hit_tail(t, admission, nargs, fold)
        return str(t)
    # the event is built in this CPU's scratch and copied into the ring buffer whole:
    # holding a reservation across the snapshot's and the admission's branches made
    # 6.1's verifier walk every path apart (it compares a held reservation's id
    # exactly, so no state with one is ever pruned) past its million instructions
    t("\te = ctracer_event_scratch();",
      "\tif (!e)",
      "\t\treturn;",
      "\t__builtin_memset(&e->m, 0, sizeof(e->m));",
      "\tread = object ? ctracer_snapshot(&e->m, object) : -1;",
      "\tif (read < 0)",
      f"\t\tflags |= {FLAG_READ_FAILED};",
      "\telse if (read > 0)  /* only the object's head exists: the rest was not read */",
      f"\t\tflags |= {FLAG_HEAD_ONLY};")
    if admission.selective:
        t("\tif (object && !followed && !ctracer_admit(object, &e->m, pid_tgid, flags)) {",
          "\t\tctracer_event_done();",
          "\t\treturn;",
          "\t}",
          f"\tif (ends && !(flags & {FLAG_HEAD_ONLY}))",
          "\t\tctracer_objects.update(&object, &ended);")
    t("\te->h.ts_ns = bpf_ktime_get_ns();",
      "\te->h.object = object;",
      "\te->h.retval = retval;",
      "\te->h.cpu = bpf_get_smp_processor_id();",
      "\te->h.pid = pid_tgid >> 32;",
      "\te->h.tid = (u32)pid_tgid;",
      "\te->h.function_id = function_id;",
      "\te->h.depth = depth > 0xffff ? 0xffff : depth;",
      "\te->h.phase = phase;",
      "\te->h.flags = flags;",
      "\tbpf_get_current_comm(&e->h.comm, sizeof(e->h.comm));")
    for i in range(nargs):
        t(f"\te->args[{i}] = args[{i}];")
    t("\tctracer_output(e);",
      "\tctracer_event_done();",
      "}")
    return str(t)



def program_name(routes: int) -> str:
    """The name of the tracepoint program for ``routes`` methods."""
    return f"ctracer_tp_r{routes}"


def struct_definitions(tracepoints: int) -> str:
    """The tracepoints' descriptor structs and their map (a row per tracepoint)."""
    return f"""\
#define CTRACER_TP_SLOTS {ROUTE_COUNTS[-1]}
#define CTRACER_TP_ARGS {MAX_ARGS}
#define CTRACER_TP_SELF {SELF_INDEX:#x}

/* One way a tracepoint hands the object: the argument, the steps from it, the row. */
struct ctracer_tproute {{
	u32 row;
	u8 arg;
	u8 nsteps;
	u8 starts;	/* {_RULE_NONE}: no rule, {_RULE_ALWAYS}: always, {_RULE_WHEN}: when args[starts_arg] == starts_eq */
	u8 ends;	/* the same, for ends */
	u8 starts_arg;
	u8 ends_arg;
	u8 starts_too;	/* a second rule starting a lifetime, as starts */
	u8 starts_too_arg;
	u8 op[CTRACER_MAX_STEPS];
	s32 off[CTRACER_MAX_STEPS];
	s64 starts_eq;
	s64 ends_eq;
	s64 starts_too_eq;
}};
_Static_assert(sizeof(struct ctracer_tproute) == {_TPROUTE.size}, "tproute size");

struct ctracer_tp {{
	u8 nroutes;
	u8 nargs;
	u8 pad[6];
	struct ctracer_tproute route[CTRACER_TP_SLOTS];
}};
_Static_assert(sizeof(struct ctracer_tp) == {tp_size()}, "tp size");

BPF_ARRAY(ctracer_tps, struct ctracer_tp, {max(1, tracepoints)});
"""


#: the arguments' array of a tracepoint program: a power of two over `MAX_ARGS`, so an
#: argument's index from a descriptor is bounded by a mask (the verifier does not follow
#: a modulo)
_ARG_ARRAY = 16


def _program(routes: int, nargs: int) -> str:
    return f"""\
int {program_name(routes)}(struct bpf_raw_tracepoint_args *ctx)
{{
	u32 ti = CTRACER_TP_SELF, zero = 0;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u64 args[{_ARG_ARRAY}] = {{}};
	u8 *stopped = ctracer_stopped.lookup(&zero);
	struct ctracer_tp *tp = ctracer_tps.lookup(&ti);
	u32 n;

	if (stopped && *stopped)  /* not every probe attached yet, or the recording ended */
		return 0;
	if (!tp)
		return 0;
	/* the arguments are an array of u64 on the kernel's stack (what ctx points to):
	 * read as many as the tracepoint has, whatever their number */
	n = tp->nargs;
	if (n > {MAX_ARGS})
		n = {MAX_ARGS};
	if (n && bpf_probe_read_kernel(args, n * sizeof(u64), (void *)ctx))
		return 0;
#pragma clang loop unroll(disable)
	for (int i = 0; i < {routes}; i++) {{
		struct ctracer_tproute *s;
		u64 obj;
		int starts, ends;

		if (i >= tp->nroutes)
			break;
		s = &tp->route[i & (CTRACER_TP_SLOTS - 1)];
		obj = ctracer_follow_steps(args[s->arg & {_ARG_ARRAY - 1}], s->nsteps, s->op, s->off);
		if (!obj)
			continue;
		starts = s->starts == {_RULE_ALWAYS} || (s->starts == {_RULE_WHEN} &&
			(s64)args[s->starts_arg & {_ARG_ARRAY - 1}] == s->starts_eq) ||
			s->starts_too == {_RULE_ALWAYS} || (s->starts_too == {_RULE_WHEN} &&
			(s64)args[s->starts_too_arg & {_ARG_ARRAY - 1}] == s->starts_too_eq);
		ends = s->ends == {_RULE_ALWAYS} || (s->ends == {_RULE_WHEN} &&
			(s64)args[s->ends_arg & {_ARG_ARRAY - 1}] == s->ends_eq);
		/* reached through a holder (skb->sk): after an end, the ended life's own */
		ctracer_hit(s->row, {PHASE_TRACEPOINT}, obj, 0, 0, 0, args, pid_tgid, starts, ends,
			    s->nsteps != 0);
	}}
	return 0;
}}
"""


_TPROUTE = _struct.Struct(f"<IBBBBBBBB{ctext.MAX_STEPS}B{ctext.MAX_STEPS}iqqq")
_TP_HEAD = _struct.Struct("<BB6x")


def tp_size() -> int:
    """Bytes of one tracepoint's entry in the tracepoint programs' table."""
    return _TP_HEAD.size + ROUTE_COUNTS[-1] * _TPROUTE.size


def _rule(rule: Optional[LifetimeRule], tp: ProbedTracepoint) -> tuple[int, int, int]:
    """(kind, argument, value) of a lifetime rule in a descriptor."""
    if rule is None:
        return _RULE_NONE, 0, 0
    if rule.arg is None:
        return _RULE_ALWAYS, 0, 0
    for i, a in enumerate(tp.args):
        if a.name == rule.arg:
            return _RULE_WHEN, i, int(rule.equals or 0)
    return _RULE_NONE, 0, 0   # an argument it lacks (`check_arguments` says so first)


def describe(tp: ProbedTracepoint) -> str:
    """A tracepoint's ``ctracer_tps`` row in words (``--print-bpf`` prints them after
    the C): which argument each way starts from, its steps and its rules."""
    ways = []
    for s in tp.routes:
        i = int(s.method.param_index)
        arg = tp.args[i].name if i < len(tp.args) else f"arg{i}"
        text = f"row {s.id} from args[{i}] ({ctext.comment_name(arg)})"
        for st in s.method.path:
            text += f" {st.op} {int(st.offset):+d}"
        for word, rule in (("starts", s.starts), ("starts", s.starts_too), ("ends", s.ends)):
            kind, at, value = _rule(rule, tp)
            if kind == _RULE_ALWAYS:
                text += f"; {word} a lifetime"
            elif kind == _RULE_WHEN:
                text += (f"; {word} a lifetime when args[{at}] "
                         f"({ctext.comment_name(tp.args[at].name)}) == {value}")
        ways.append(text)
    return (f"ctracer_tps[{tp.index}] {ctext.comment_name(tp.name)} ({tp.probe}): "
            + "; ".join(ways))


def descriptor_bytes(tp: ProbedTracepoint) -> bytes:
    """The packed ``struct ctracer_tp`` of a tracepoint (see `struct_definitions`)."""
    out = [_TP_HEAD.pack(len(tp.routes), len(tp.args))]
    for s in tp.routes:
        steps = [(ctext.PATH_OPS[st.op], int(st.offset)) for st in s.method.path]
        steps += [(0, 0)] * (ctext.MAX_STEPS - len(steps))
        starts, ends, too = _rule(s.starts, tp), _rule(s.ends, tp), _rule(s.starts_too, tp)
        out.append(_TPROUTE.pack(s.id, int(s.method.param_index), len(s.method.path),
                                starts[0], ends[0], starts[1], ends[1], too[0], too[1],
                                *(op for op, _ in steps), *(off for _, off in steps),
                                starts[2], ends[2], too[2]))
    out.append(b"\0" * (_TPROUTE.size * (ROUTE_COUNTS[-1] - len(tp.routes))))
    return b"".join(out)


def with_index(insns: bytes, index: int) -> bytes:
    """A tracepoint program's instructions with its tracepoint's index in place of
    `SELF_INDEX` (the immediate of every instruction holding it; ValueError when none
    does: the compiler folded it away)."""
    code = bytearray(insns)
    magic = SELF_INDEX.to_bytes(4, "little")
    found = 0
    for at in range(0, len(code) - 7, 8):
        if code[at + 4:at + 8] == magic:
            code[at + 4:at + 8] = index.to_bytes(4, "little")
            found += 1
    if not found:
        raise ValueError("the tracepoint program does not hold its index constant")
    return bytes(code)


def emit_tracepoint_c(tracepoints: Sequence[ProbedTracepoint], mini: Layout,
                      admission: Admission, nargs: int, ring_bytes: int,
                      head: Optional[HeadRead] = None,
                      functions_c: tuple[str, str] = ("", ""), compact: bool = False,
                      fold: bool = False) -> str:
    """The C of the tracepoint probes; ``functions_c``: the maps and the programs of
    kernel functions' probes (`ctracer.probes.kfunctions`) sharing the same event,
    admission and emitter.  ``compact``: events carry only the snapshot words that
    changed (`ctracer.event.c_compact_definition`); ``fold`` (with it): calls that
    changed nothing are counted, not written (`ctracer.probes.folding`)."""
    capacity = admission.max_objects or OBJECT_CAPACITY
    t = ctext.Text()
    t("/* Generated by ctracer: raw tracepoint probes snapshotting "
      f"struct {ctext.comment_name(mini.name)} in the kernel. */",
      "#include <uapi/linux/ptrace.h>",
      "")
    t.block(c_event_definition(mini, nargs))
    if compact:
        t.block(c_compact_definition(mini, nargs))
    t("",
      "BPF_HASH(ctracer_pids, u32, u8, 65536);",
      f"BPF_HASH(ctracer_objects, u64, u8, {int(capacity)});",
      "BPF_ARRAY(ctracer_admitted, u64, 1);",
      "BPF_ARRAY(ctracer_stopped, u8, 1);  /* set until every probe is attached, and "
      "once the recording ends */",
      *ctext.ring_buffer_maps(ring_bytes),
      *ctext.event_scratch_maps(),
      *(ctext.compact_maps() if compact else ()),
      *(folding.fold_maps() if fold else ()),
      "")
    t(ctext.PATH_DEFINE)
    t.block(struct_definitions(len(tracepoints)))
    t("")
    if functions_c[0]:
        t.block(functions_c[0])
        t("")
    t.block(ctext.snapshot_function(mini, KERNEL, head))
    t("")
    t.block(ctext.deref_function("bpf_probe_read_kernel"))
    t("")
    t.block(ctext.follow_function())
    if admission.selective:
        t("")
        t.block(_admit_function(admission, mini, head))
    t("")
    t.block(ctext.submit_function(ring_bytes, event_size(mini, nargs)))
    t("")
    t.block(ctext.event_scratch_functions())
    t("")
    if compact:
        t.block(ctext.send_function())
        t("")
    if fold:
        t.block(folding.fold_functions(mini, nargs))
        t("")
    t.block(_hit_function(admission, nargs, mini, compact, fold))
    for routes in sorted({tp.route_count for tp in tracepoints}):
        t("")
        t.block(_program(routes, nargs))
    if functions_c[1]:
        t("")
        t.block(functions_c[1])
    if admission.processes:
        t("")
        t.block(ctext.FOLLOW_FORKS)
    return str(t)


def _compact_hit_tail(t: ctext.Text, admission: Admission, nargs: int,
                      fold: bool = False) -> None:
    """The rest of ``ctracer_hit`` for compact events: the event is built in this CPU's
    work buffer of its nesting level (as in the ring otherwise), admitted, and sent as a
    delta (`ctracer.probes.ctext.send_function`); only the outermost level chains on
    the object's last event."""
    t("\t{")
    for line in ctext.nesting_enter():
        t("\t\t" + line if line else "")
    t("\t\tif (!w)",
      "\t\t\tgoto out;",
      "\t\te = &w->e;",
      "\t\t__builtin_memset(&e->m, 0, sizeof(e->m));",
      "\t\tread = object ? ctracer_snapshot(&e->m, object) : -1;",
      "\t\tif (read < 0)",
      f"\t\t\tflags |= {FLAG_READ_FAILED};",
      "\t\telse if (read > 0)",
      f"\t\t\tflags |= {FLAG_HEAD_ONLY};")
    if admission.selective:
        t("\t\tif (object && !followed && !ctracer_admit(object, &e->m, pid_tgid, flags))",
          "\t\t\tgoto out;",
          f"\t\tif (ends && !(flags & {FLAG_HEAD_ONLY}))",
          "\t\t\tctracer_objects.update(&object, &ended);")
    t("\t\te->h.ts_ns = bpf_ktime_get_ns();",
      "\t\te->h.object = object;",
      "\t\te->h.retval = retval;",
      "\t\te->h.cpu = bpf_get_smp_processor_id();",
      "\t\te->h.pid = pid_tgid >> 32;",
      "\t\te->h.tid = (u32)pid_tgid;",
      "\t\te->h.function_id = function_id;",
      "\t\te->h.depth = depth > 0xffff ? 0xffff : depth;",
      "\t\te->h.phase = phase;",
      "\t\te->h.flags = flags;",
      "\t\tbpf_get_current_comm(&e->h.comm, sizeof(e->h.comm));")
    for i in range(nargs):
        t(f"\t\te->args[{i}] = args[{i}];")
    if fold:
        t("\t\tif (level == 0 && ctracer_defer_or_fold(w, (u32)pid_tgid))",
          "\t\t\tgoto out;")
    t("\t\tctracer_send(w, object, level == 0);")
    if fold:
        t("\t\tctracer_written_at(object, e->h.ts_ns);")
    t("out:",
      "\t\t*nest = level;",
      "\t}",
      "}")
