"""The BPF program that traces a struct: generated C, from structured data only.

`build_program(methods, mini)` turns the methods `ctracer.plan.discovery` found and the mini
layout `ctracer.plan.mini` built into a `UprobeProgram`: the bcc C text, the functions to attach
(one entry probe and one exit probe per function, attached by address so that static
functions sharing a name stay distinct) and the rows of the trace file's function table
(one per method, i.e. per way a function reaches an object; its id is the event's
``function_id``).

What each probe does:

* **entry** (uprobe): for each method of the function, in parameter order with the
  return value last, compute the object's address from the argument (follow the
  method's `Step` path: ``socket->sk``, ``*pprev``), snapshot it and emit an entry event;
  then save the arguments and objects for the exit probe;
* **exit** (uretprobe): find what the entry saved, emit one exit event per method with
  the return value.  The object is the one seen at entry; when that was NULL (a holder
  filled in by the call, like ``inet_create`` setting ``sock->sk``) the path is followed
  again from the saved argument; a ``returns`` method's object is the return value.

Snapshots: the span of the object that the mini fields cover is copied once into a
per-CPU scratch buffer with ``bpf_probe_read_user`` (or ``_kernel``: the collectors'
`ObjectReader`), then `ctracer.collectors` move each field into the event.  A NULL or
unreadable object gives an event flagged `FLAG_READ_FAILED` with a zeroed snapshot:
the entry event of a ``returns`` method, and of a holder whose member is still NULL,
has object 0 (there is no object yet), so that every exit still has its entry.

Pairing entry and exit: the saved state is keyed by (thread id, nesting depth, stack
pointer at entry).  The stack pointer alone cannot tell a function from one it
tail-calls (both are entered with the same stack pointer); the depth alone goes wrong
forever once an exit is missed (longjmp, a thread killed inside a call).  With both,
the exit probe looks the key up with the stack pointer it sees (on x86_64 the return
has popped the return address: entry SP = exit SP - 8) and the current depth - 1,
then - 2 ... up to `MAX_SKIPPED_EXITS` levels deeper, and resets the thread's depth to
the level it found, so a missed exit costs a few lookups and heals itself.  An exit
with no saved entry is still emitted, flagged `FLAG_NO_ENTRY`.

Events leave through a BPF ring buffer (``BPF_RINGBUF_OUTPUT``) rather than per-CPU perf
buffers: one buffer shared by all CPUs keeps the events in the order they were
reserved, so the trace needs no cross-CPU merge, and a reservation either succeeds or
fails on the spot; every failure increments the per-CPU counter ``ctracer_lost``, which
the recorder sums: lost events are counted, never silent.

Process filter: when tracing one process tree (``-p PID`` or a command), its process ids
live in ``ctracer_pids`` and a ``sched_process_fork`` tracepoint adds children, so the
uprobes (attached for every process mapping the binary) record only that tree.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Optional, Sequence

from ctracer.collectors.base import USER, ObjectReader
from ctracer.probes import ctext, folding
from ctracer.plan.discovery import Method
from ctracer.event import (FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY, PHASE_EXIT,
                           Layout, c_compact_definition, c_event_definition, event_size)
from ctracer.debuginfo.catalog import FunctionInfo, ShapeKind, TypeShape
from ctracer.event import FunctionRow

#: exits searched below the expected depth before an exit counts as unmatched
MAX_SKIPPED_EXITS = 4

_FLOAT_WORDS = {"float", "double", "_Float32", "_Float64", "_Float128", "_Complex"}


@dataclass(frozen=True)
class Arch:
    """Calling-convention facts the probes depend on."""

    name: str
    #: integer/pointer arguments passed in registers (bcc's PT_REGS_PARM1..N)
    register_args: int
    #: stack pointer at the return probe minus the one at entry
    return_sp_delta: int
    #: where the first stack-passed argument is, from the stack pointer at entry
    stack_args_at: int


ARCHES = {
    "x86_64": Arch("x86_64", register_args=6, return_sp_delta=8, stack_args_at=8),
}


def host_arch() -> Arch:
    """This machine's architecture's calling convention; a `BPFUnavailable` on one not
    supported."""
    machine = platform.machine()
    if machine not in ARCHES:
        from ctracer.errors import BPFUnavailable
        raise BPFUnavailable(f"probes for {machine} are not supported yet "
                             f"(supported: {', '.join(ARCHES)})")
    return ARCHES[machine]


@dataclass(frozen=True)
class UprobeRoute:
    """One method of a probed function: one function-table row, one event per hit."""

    id: int
    method: Method
    #: C expression for the argument the path starts from (None for ``returns``)
    arg: Optional[str]


@dataclass(frozen=True)
class ProbedFunction:
    """A function that gets an entry and an exit probe."""

    index: int
    key: str
    name: str
    unit: str
    address: int
    routes: tuple[UprobeRoute, ...]
    #: C type the return value is read as, None when it is not an integer register
    return_ctype: Optional[str]

    @property
    def entry_probe(self) -> str:
        """The name of the function's entry program."""
        return f"ctracer_entry_{self.index}"

    @property
    def exit_probe(self) -> str:
        """The name of the function's exit program."""
        return f"ctracer_exit_{self.index}"

    @property
    def row_ids(self) -> tuple[int, ...]:
        """The function rows of the function, one per way it reaches the object."""
        return tuple(s.id for s in self.routes)


@dataclass(frozen=True)
class UprobeProgram:
    """The generated C and what it probes."""

    text: str
    mini: Layout
    functions: tuple[ProbedFunction, ...]
    #: every method given, probed or not (``attached`` says why not)
    rows: tuple[FunctionRow, ...]
    filtered: bool
    ring_bytes: int
    #: events carry only the snapshot words that changed (`ctracer.event`'s compact
    #: events); False: every event carries the whole snapshot
    compact: bool = False
    #: ``--calls``: "all" writes every call; "changes" folds calls that changed nothing
    #: into counts (`ctracer.probes.folding`; compact events only)
    calls: str = "all"
    #: u64 argument slots in each event (tracepoint arguments; none for uprobes)
    nargs = 0

    def rows_with_return_value(self) -> frozenset[int]:
        """Function-table rows whose exit events carry a return value."""
        return frozenset(s.id for f in self.functions if f.return_ctype for s in f.routes)

    def args_by_row(self) -> dict:
        """Arguments recorded per row: none (entry/exit events carry no argument slots)."""
        return {}


# ------------------------------------------------------------------ C types of values


def _base_int(name: str) -> Optional[tuple[int, bool]]:
    """(size, signed) of a C integer base type name on LP64, None for anything else."""
    words = name.split()
    if not words or _FLOAT_WORDS & set(words) or "__int128" in name:
        return None
    if name in ("_Bool", "bool"):
        return 1, False
    signed = "unsigned" not in words
    if "char" in words:
        return 1, signed
    if "short" in words:
        return 2, signed
    if "long" in words:
        return 8, signed
    if "int" in words or words in (["signed"], ["unsigned"]):
        return 4, signed
    return None


def return_ctype(shape: TypeShape) -> Optional[str]:
    """How to read a function's return value from the return register, or None."""
    if shape.pointers:
        return "u64"
    if shape.kind == ShapeKind.ENUM:
        return "u32"
    if shape.kind == ShapeKind.BASE and shape.name:
        found = _base_int(shape.name)
        if found:
            size, signed = found
            return f"{'s' if signed else 'u'}{size * 8}"
    return None


def _integer_registers(shape: TypeShape) -> Optional[int]:
    """How many integer argument registers a parameter of this shape uses (None when
    that depends on more than the shape says: structs passed by value)."""
    if shape.pointers or shape.kind in (ShapeKind.ENUM, ShapeKind.ARRAY, ShapeKind.FUNCTION):
        return 1
    if shape.kind == ShapeKind.BASE and shape.name:
        words = set(shape.name.split())
        if words & _FLOAT_WORDS:
            return 0
        return 2 if "__int128" in shape.name else 1
    return None


def register_index(function: FunctionInfo, index: int) -> tuple[Optional[int], str]:
    """The integer argument register (counting stack slots on) that parameter ``index``
    is passed in, or (None, why it cannot be told)."""
    reg = 0
    for p in function.params[:index]:
        n = _integer_registers(p.shape)
        if n is None:
            return None, f"cannot locate parameter {index + 1}: an earlier one is passed by value"
        reg += n
    return reg, ""


def argument_expr(function: FunctionInfo, index: int, arch: Arch) -> tuple[Optional[str], str]:
    """C expression reading parameter ``index`` at entry, or (None, why not)."""
    reg, why = register_index(function, index)
    if reg is None:
        return None, why
    if reg < arch.register_args:
        return f"PT_REGS_PARM{reg + 1}(ctx)", ""
    route = reg - arch.register_args
    return f"ctracer_stack_arg(ctx, {arch.stack_args_at + 8 * route})", ""


# ------------------------------------------------------------------ program text


def _route_order(m: Method) -> tuple:
    return (m.param_index is None, m.param_index or 0)


_COMMON = """\
static __always_inline int ctracer_wanted(u32 tgid)
{
#if CTRACER_FILTER
	return ctracer_pids.lookup(&tgid) != 0;
#else
	return 1;
#endif
}

""" + ctext.deref_function("CTRACER_READ") + """
static __always_inline u64 ctracer_stack_arg(struct pt_regs *ctx, u64 offset)
{
	u64 value = 0;

	CTRACER_READ(&value, sizeof(value), (void *)(PT_REGS_SP(ctx) + offset));
	return value;
}

/* Depth of the next traced call on this thread, counting it in. */
static __always_inline u32 ctracer_enter(u32 tid)
{
	u32 zero = 0, depth;
	u32 *counter = ctracer_depth.lookup_or_try_init(&tid, &zero);

	if (!counter)
		return 0;
	depth = *counter;
	*counter = depth + 1;
	return depth;
}
"""


def _leave_function(max_skipped: int) -> str:
    """``ctracer_leave``: finds (and removes) what the entry probe saved for the call
    returning now, trying the expected depth first, then deeper ones (see the module
    docstring).  Written out in straight lines: the verifier must not see a loop."""
    t = ctext.Text()
    t("static __always_inline int ctracer_take(struct ctracer_call_key *key, u32 depth,",
      "\t\t\t\t\tstruct ctracer_call *out)",
      "{",
      "\tstruct ctracer_call *saved;",
      "",
      "\tkey->depth = depth;",
      "\tsaved = ctracer_calls.lookup(key);",
      "\tif (!saved)",
      "\t\treturn 0;",
      "\t__builtin_memcpy(out, saved, sizeof(*out));",
      "\tctracer_calls.delete(key);",
      "\treturn 1;",
      "}",
      "",
      "static __always_inline int ctracer_leave(u32 tid, u64 entry_sp, struct ctracer_call *out,",
      "\t\t\t\t\t u32 *depth)",
      "{",
      "\tstruct ctracer_call_key key = { .tid = tid, .sp = entry_sp };",
      "\tu32 *counter = ctracer_depth.lookup(&tid);",
      "\tu32 top = counter ? *counter : 0;",
      "")
    for i in range(1, max_skipped + 1):
        t(f"\tif (top >= {i} && ctracer_take(&key, top - {i}, out))",
          "\t\tgoto found;")
    t("\t*depth = top ? top - 1 : 0;",
      "\tif (counter && top)",
      "\t\t*counter = top - 1;",
      "\treturn 0;",
      "found:",
      "\t*depth = key.depth;",
      "\tif (counter)",
      "\t\t*counter = key.depth;",
      "\treturn 1;",
      "}")
    return str(t)


def _entry_probe(f: ProbedFunction, fold: bool = False) -> str:
    t = ctext.Text()
    t(f"/* {ctext.comment_name(f.name)}: entry */",
      f"int {f.entry_probe}(struct pt_regs *ctx)",
      "{",
      "\tu64 pid_tgid = bpf_get_current_pid_tgid();",
      "\tstruct ctracer_call call = {};",
      "\tu32 depth;",
      "",
      "\tif (!ctracer_wanted(pid_tgid >> 32))",
      "\t\treturn 0;",
      "\tdepth = ctracer_enter((u32)pid_tgid);")
    for i, s in enumerate(f.routes):
        if s.arg is None:
            t(f"\tctracer_emit({s.id}, {PHASE_ENTRY}, 0, 0, depth, 0, pid_tgid);")
            continue
        t("\t{",
          f"\t\tu64 obj = {s.arg};",
          f"\t\tcall.arg[{i}] = obj;")
        t(*("\t\t" + line for line in ctext.path_statements(s.method, "obj")))
        t(f"\t\tcall.object[{i}] = obj;",
          f"\t\tctracer_emit({s.id}, {PHASE_ENTRY}, obj, 0, depth, 0, pid_tgid);",
          "\t}")
    if fold:
        objects = [f"call.object[{i}]" if s.arg is not None else "0"
                   for i, s in enumerate(f.routes[:2])]
        t(*("\t" + line for line in folding.frame_statements(
            "(u32)pid_tgid", "depth", str(f.routes[0].id), *objects)))
    t("\t{",
      "\t\tstruct ctracer_call_key key = {",
      "\t\t\t.tid = (u32)pid_tgid, .depth = depth, .sp = PT_REGS_SP(ctx) };",
      "\t\tctracer_calls.update(&key, &call);",
      "\t}",
      "\treturn 0;",
      "}")
    return str(t)


def _exit_probe(f: ProbedFunction, arch: Arch) -> str:
    t = ctext.Text()
    ret = f"(s64)({f.return_ctype})PT_REGS_RC(ctx)" if f.return_ctype else "0"
    t(f"/* {ctext.comment_name(f.name)}: exit */",
      f"int {f.exit_probe}(struct pt_regs *ctx)",
      "{",
      "\tu64 pid_tgid = bpf_get_current_pid_tgid();",
      "\tstruct ctracer_call call = {};",
      f"\ts64 ret = {ret};",
      "\tu32 depth = 0;",
      "\tu8 flags = 0;",
      "",
      "\tif (!ctracer_wanted(pid_tgid >> 32))",
      "\t\treturn 0;",
      f"\tif (!ctracer_leave((u32)pid_tgid, PT_REGS_SP(ctx) - {arch.return_sp_delta}, "
      "&call, &depth))",
      f"\t\tflags = {FLAG_NO_ENTRY};")
    for i, s in enumerate(f.routes):
        if s.arg is None:
            t(f"\tctracer_emit({s.id}, {PHASE_EXIT}, PT_REGS_RC(ctx), ret, depth, flags, "
              "pid_tgid);")
            continue
        t("\t{",
          f"\t\tu64 obj = call.object[{i}];",
          "",
          f"\t\tif (!obj && call.arg[{i}]) {{",
          f"\t\t\tobj = call.arg[{i}];")
        t(*("\t\t\t" + line for line in ctext.path_statements(s.method, "obj")))
        t("\t\t}",
          f"\t\tctracer_emit({s.id}, {PHASE_EXIT}, obj, ret, depth, flags, pid_tgid);",
          "\t}")
    t("\treturn 0;", "}")
    return str(t)


@dataclass(frozen=True)
class UprobePlan:
    """What to probe, decided before any C is written: one function-table row per
    method (``attached`` says why a row is not probed) and the functions that get an
    entry and an exit probe."""

    rows: tuple[FunctionRow, ...]
    functions: tuple[ProbedFunction, ...]


def plan_uprobes(methods: Sequence[Method], arch: Arch) -> UprobePlan:
    """Rows in (function key, route) order and the probed functions with their routes."""
    ordered = sorted(methods, key=lambda m: (m.key, _route_order(m)))
    rows: list[FunctionRow] = []
    by_function: dict[str, list[tuple[Method, int, Optional[str]]]] = {}
    for m in ordered:
        row_id = len(rows) + 1
        f = m.function
        unit = getattr(f, "unit", "") or ""
        address = getattr(f, "address", None)
        why = ""
        arg: Optional[str] = None
        if m.is_tracepoint:
            why = "skipped: tracepoints are traced on the kernel only"
        elif not m.probeable:
            why = f"skipped: {m.not_probeable}"
        elif address is None:
            why = "skipped: no address"
        elif m.param_index is not None:
            arg, why = argument_expr(f, m.param_index, arch)
            if arg is None:
                why = f"skipped: {why}"
        rows.append(FunctionRow(row_id, m.name, unit, m.route_kind, m.route_text, address, why))
        if not why:
            by_function.setdefault(m.key, []).append((m, row_id, arg))

    functions = []
    for index, (key, routes) in enumerate(sorted(by_function.items())):
        f = routes[0][0].function
        assert isinstance(f, FunctionInfo) and f.address is not None
        functions.append(ProbedFunction(
            index, key, f.name, f.unit or "", f.address,
            tuple(UprobeRoute(row_id, m, arg) for m, row_id, arg in routes),
            return_ctype(f.returns)))
    return UprobePlan(tuple(rows), tuple(functions))


def emit_uprobe_c(plan: UprobePlan, mini: Layout, *, filtered: bool, reader: ObjectReader,
                  arch: Arch, ring_bytes: int, compact: bool = False,
                  fold: bool = False) -> str:
    """The BPF C text of a planned uprobe program (``fold``: ``--calls changes``, with
    ``compact``)."""
    functions = plan.functions
    max_routes = max((len(f.routes) for f in functions), default=1)
    t = ctext.Text()
    t("/* Generated by ctracer: entry and exit probes snapshotting "
      f"struct {ctext.comment_name(mini.name)}. */",
      "#include <uapi/linux/ptrace.h>",
      "",
      f"#define CTRACER_FILTER {1 if filtered else 0}",
      f"#define CTRACER_FLAG_READ_FAILED {FLAG_READ_FAILED}",
      f"#define CTRACER_READ {reader.helper}",
      "")
    t.block(c_event_definition(mini))
    if compact:
        t.block(c_compact_definition(mini))
    t("",
      "struct ctracer_call_key {",
      "\tu32 tid;",
      "\tu32 depth;",
      "\tu64 sp;",
      "};",
      "",
      "/* What an entry probe leaves for the exit probe, per method route. */",
      "struct ctracer_call {",
      f"\tu64 arg[{max_routes}];",
      f"\tu64 object[{max_routes}];",
      "};",
      "",
      'BPF_TABLE("lru_hash", struct ctracer_call_key, struct ctracer_call, ctracer_calls, 65536);',
      'BPF_TABLE("lru_hash", u32, u32, ctracer_depth, 65536);',
      "BPF_HASH(ctracer_pids, u32, u8, 65536);",
      "BPF_ARRAY(ctracer_stopped, u8, 1);",
      *ctext.ring_buffer_maps(ring_bytes),
      *(ctext.compact_maps() if compact else ()),
      *(folding.fold_maps() if fold else ()),
      "")
    t.block(ctext.snapshot_function(mini, reader))
    t("")
    t.block(_COMMON)
    t("")
    t.block(ctext.submit_function(ring_bytes, event_size(mini)))
    t("")
    if compact:
        t.block(ctext.send_function())
        t("")
        if fold:
            t.block(folding.fold_functions(mini))
            t("")
        t.block(ctext.compact_emit_function(stop_check=True, fold=fold))
    else:
        t.block(ctext.emit_function(stop_check=True))
    t("")
    t.block(_leave_function(MAX_SKIPPED_EXITS))
    for f in functions:
        t("")
        t.block(_entry_probe(f, fold))
        t("")
        t.block(_exit_probe(f, arch))
    if filtered:
        t("")
        t.block(ctext.FOLLOW_FORKS)
    return str(t)


def build_program(methods: Sequence[Method], mini: Layout, *, filtered: bool = False,
                  reader: ObjectReader = USER, arch: Optional[Arch] = None,
                  ring_bytes: int = ctext.RING_BYTES, compact: bool = False,
                  calls: str = "all") -> UprobeProgram:
    """The probes for ``methods`` recording ``mini``: `plan_uprobes`, then
    `emit_uprobe_c`.

    ``filtered``: record only the process ids put in ``ctracer_pids`` (and their
    children) instead of every process that runs the probed code.
    """
    arch = arch or host_arch()
    ctext.check_ring_bytes(ring_bytes)
    plan = plan_uprobes(methods, arch)
    compact = compact and mini.size > 0
    folding.check_calls(calls)
    if calls == "changes" and not compact:
        raise ValueError("--calls changes needs compact events (not --full-snapshots "
                         "or --tail)")
    text = emit_uprobe_c(plan, mini, filtered=filtered, reader=reader, arch=arch,
                         ring_bytes=ring_bytes, compact=compact, fold=calls == "changes")
    return UprobeProgram(text, mini, plan.functions, plan.rows, filtered, ring_bytes, compact,
                         calls)
