"""The BPF program that traces a kernel struct through raw tracepoints.

On a kernel where neither kprobes nor fentry can be used, the ways into a struct that
remain are the tracepoints whose arguments carry it (`ctracer.plan.discovery` finds
them in BTF: ``btf_trace_<name>`` typedefs; the ``__bpf_trace_<name>`` functions, or
those of the event's class, name the parameters).  `plan_tracepoints` decides what to
probe (one function-table row per method, one raw tracepoint program per tracepoint);
`emit_tracepoint_c` writes the C, with the probes of kernel functions when there are
any; `ctracer.probes.kernel.build_kernel_program` builds the whole program.

What a probe does on each hit, per method of its tracepoint:

* compute the object's address from ``ctx->args[i]`` (following the method's path:
  ``sk_buff->sk`` reads the member with ``bpf_probe_read_kernel``); no object, no event;
* a lifetime rule (`ctracer.plan.lifetimes`) that *starts* a lifetime forgets the
  address first, so it is admitted afresh;
* an object already followed is recorded; else it is admitted when the process filter
  (``-p``/``-- COMMAND``: the current process is in ``ctracer_pids``), ``--comm``,
  ``--object``, ``--where`` (evaluated on the snapshot, in the kernel) and
  ``--max-objects`` (an atomic counter of admissions) all agree, and from then on it is
  followed in every context (softirq, timers, kernel threads) through the hash
  ``ctracer_objects``; without any of these every object is recorded.  An object read
  only in its head (a time-wait or request socket: no tracepoint marks its end, and
  its address soon carries another process's) is admitted hit by hit, never followed;
* the event is one ring buffer record: the header (phase `PHASE_TRACEPOINT`), every
  argument of the tracepoint as a raw u64 slot, and the mini snapshot read with
  ``bpf_probe_read_kernel`` at the offsets of the kernel's BTF (only its head, flagged
  `FLAG_HEAD_ONLY`, where `ctracer.plan.heads` says the object is no more than that:
  a time-wait or request socket handed over as a ``struct sock *``);
* a rule that *ends* a lifetime forgets the address after recording.

Lost events (ring buffer full) are counted in ``ctracer_lost`` as in the uprobe program.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ctracer.collectors.base import KERNEL
from ctracer.debuginfo.model import Catalog, Parameter, ShapeKind, TracepointInfo
from ctracer.event import (FLAG_HEAD_ONLY, FLAG_READ_FAILED, PHASE_TRACEPOINT, Layout,
                           c_event_definition, event_size)
from ctracer.plan import where as where_clause
from ctracer.plan.discovery import Method
from ctracer.plan.heads import HeadRead
from ctracer.plan.lifetimes import LifetimeRule
from ctracer.probes import ctext
from ctracer.probes.arguments import Argument, argument_of
from ctracer.event import FunctionRow

#: followed objects when no --max-objects bounds them
OBJECT_CAPACITY = 65536
#: the number of raw tracepoint arguments bcc reads from ``ctx->args``
MAX_ARGS = 12

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_COMM_LEN = 16


@dataclass(frozen=True)
class TracepointSlot:
    """One method of a probed tracepoint: one function-table row."""

    id: int
    method: Method
    starts: Optional[LifetimeRule] = None
    ends: Optional[LifetimeRule] = None


@dataclass(frozen=True)
class ProbedTracepoint:
    index: int
    name: str
    args: tuple[Argument, ...]
    slots: tuple[TracepointSlot, ...]

    @property
    def probe(self) -> str:
        return f"ctracer_tp_{self.index}"

    @property
    def row_ids(self) -> tuple[int, ...]:
        return tuple(s.id for s in self.slots)


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
                     key=lambda m: (m.name, m.param_index or 0, m.route))
    rows: list[FunctionRow] = []
    by_tp: dict[str, list[TracepointSlot]] = {}
    infos: dict[str, TracepointInfo] = {}
    for m in ordered:
        row_id = len(rows) + 1
        why = "" if m.probeable else f"skipped: {m.not_probeable}"
        if not why and (m.param_index is None or m.param_index >= MAX_ARGS):
            why = "skipped: the object is not among the first 12 arguments"
        rows.append(FunctionRow(row_id, m.name, "", m.reach, m.via, None, why))
        if why:
            continue
        direct = not m.path and not m.holder  # the argument is the object itself
        mine = [r for r in rules if direct and r.probe == "tracepoint"
                and r.function == m.name and r.param_index == m.param_index]
        starts = next((r for r in mine if r.effect == "starts"), None)
        ends = next((r for r in mine if r.effect == "ends"), None)
        by_tp.setdefault(m.name, []).append(TracepointSlot(row_id, m, starts, ends))
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


def _admit_function(admission: Admission, mini: Layout,
                    head: Optional[HeadRead] = None) -> str:
    t = ctext.Text()
    t("/* Whether a not yet followed object starts being followed at this hit. */",
      f"static __always_inline int ctracer_admit(u64 object, struct {mini.name} *m, "
      "u64 pid_tgid, u8 flags)",
      "{",
      "\tu32 zero = 0;",
      "\tu8 yes = 1;",
      "")
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


def _hit_function(admission: Admission, nargs: int, mini: Layout) -> str:
    """``ctracer_hit``: one event of a followed or newly admitted object, for a
    tracepoint hit and for a kernel function's entry or exit alike (`ctracer.probes.
    kfunctions`).  Object 0 is a creation function's entry (there is no object yet):
    written only for a followed process, never admitted."""
    t = ctext.Text()
    t("static __always_inline void ctracer_hit(u32 function_id, u8 phase, u64 object,",
      "\t\t\t\t\ts64 retval, u32 depth, u8 flags, const u64 *args,",
      "\t\t\t\t\tu64 pid_tgid, int starts, int ends)",
      "{",
      "\tu32 zero = 0;",
      "\tint read;",
      "\tstruct ctracer_event *e;",
      "\tu8 *stopped = ctracer_stopped.lookup(&zero);",
      "",
      "\tif (stopped && *stopped)  /* not every probe attached yet, or the recording ended */",
      "\t\treturn;")
    if admission.selective:
        t("\tint followed = 0;",
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
          "\t\tif (starts)",
          "\t\t\tctracer_objects.delete(&object);",
          "\t\tfollowed = ctracer_objects.lookup(&object) != 0;",
          "\t}")
        if admission.processes:
            t("\tif (!followed) {",
              "\t\tu32 tgid = pid_tgid >> 32;",
              "",
              "\t\tif (!ctracer_pids.lookup(&tgid))",
              "\t\t\treturn;",
              "\t}")
    t("\te = ctracer_events.ringbuf_reserve(sizeof(struct ctracer_event));",
      "\tif (!e) {",
      "\t\tu64 *lost = ctracer_lost.lookup(&zero);",
      "\t\tif (lost)",
      "\t\t\t(*lost)++;",
      "\t\treturn;",
      "\t}",
      "\t__builtin_memset(&e->m, 0, sizeof(e->m));",
      "\tread = object ? ctracer_snapshot(&e->m, object) : -1;",
      "\tif (read < 0)",
      f"\t\tflags |= {FLAG_READ_FAILED};",
      "\telse if (read > 0)  /* only the object's head exists: the rest was not read */",
      f"\t\tflags |= {FLAG_HEAD_ONLY};")
    if admission.selective:
        t("\tif (object && !followed && !ctracer_admit(object, &e->m, pid_tgid, flags)) {",
          "\t\tctracer_events.ringbuf_discard(e, CTRACER_RB_NO_WAKEUP);",
          "\t\treturn;",
          "\t}",
          "\tif (ends)",
          "\t\tctracer_objects.delete(&object);")
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
    t("\tctracer_submit(e);",
      "}")
    return str(t)


def _probe(tp: ProbedTracepoint, nargs: int) -> str:
    t = ctext.Text()
    t(f"/* tracepoint {ctext.comment_name(tp.name)} */",
      f"int {tp.probe}(struct bpf_raw_tracepoint_args *ctx)",
      "{",
      "\tu64 pid_tgid = bpf_get_current_pid_tgid();",
      f"\tu64 args[{max(nargs, 1)}] = {{}};",
      "")
    for i in range(len(tp.args)):
        t(f"\targs[{i}] = ctx->args[{i}];")
    for s in tp.slots:
        starts = ends = "0"
        if s.starts is not None:
            starts = _rule_c(s.starts, tp)
        if s.ends is not None:
            ends = _rule_c(s.ends, tp)
        t("\t{",
          f"\t\tu64 obj = args[{s.method.param_index}];")
        t(*("\t\t" + line for line in ctext.path_statements(s.method, "obj")))
        t("\t\tif (obj)",
          f"\t\t\tctracer_hit({s.id}, {PHASE_TRACEPOINT}, obj, 0, 0, 0, args, pid_tgid, "
          f"{starts}, {ends});",
          "\t}")
    t("\treturn 0;", "}")
    return str(t)


def _rule_c(rule: LifetimeRule, tp: ProbedTracepoint) -> str:
    if rule.arg is None:
        return "1"
    for i, a in enumerate(tp.args):
        if a.name == rule.arg:
            return f"((s64)args[{i}] == {int(rule.equals or 0)})"
    return "0"




def emit_tracepoint_c(tracepoints: Sequence[ProbedTracepoint], mini: Layout,
                      admission: Admission, nargs: int, ring_bytes: int,
                      head: Optional[HeadRead] = None,
                      functions_c: tuple[str, str] = ("", "")) -> str:
    """The C of the tracepoint probes; ``functions_c``: the maps and the programs of
    kernel functions' probes (`ctracer.probes.kfunctions`) sharing the same event,
    admission and emitter."""
    capacity = admission.max_objects or OBJECT_CAPACITY
    t = ctext.Text()
    t("/* Generated by ctracer: raw tracepoint probes snapshotting "
      f"struct {ctext.comment_name(mini.name)} in the kernel. */",
      "#include <uapi/linux/ptrace.h>",
      "")
    t.block(c_event_definition(mini, nargs))
    t("",
      "BPF_HASH(ctracer_pids, u32, u8, 65536);",
      f"BPF_HASH(ctracer_objects, u64, u8, {int(capacity)});",
      "BPF_ARRAY(ctracer_admitted, u64, 1);",
      "BPF_ARRAY(ctracer_stopped, u8, 1);  /* set until every probe is attached, and "
      "once the recording ends */",
      *ctext.ring_buffer_maps(ring_bytes),
      "")
    if functions_c[0]:
        t.block(functions_c[0])
        t("")
    t.block(ctext.snapshot_function(mini, KERNEL, head))
    t("")
    t.block(ctext.deref_function("bpf_probe_read_kernel"))
    if admission.selective:
        t("")
        t.block(_admit_function(admission, mini, head))
    t("")
    t.block(ctext.submit_function(ring_bytes, event_size(mini, nargs)))
    t("")
    t.block(_hit_function(admission, nargs, mini))
    for tp in tracepoints:
        t("")
        t.block(_probe(tp, nargs))
    if functions_c[1]:
        t("")
        t.block(functions_c[1])
    if admission.processes:
        t("")
        t.block(ctext.FOLLOW_FORKS)
    return str(t)
