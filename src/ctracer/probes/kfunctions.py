"""Entry and exit probes on kernel functions: a handful of generic programs, not one per
function.

Every function the probe plan places (`ctracer.plan.attach`: fentry/fexit where the kernel
loads them, else kprobe/kretprobe) is described by data, not by code: a row of the array
map ``ctracer_kfns`` (index = the function's number, handed to the program as the link's
BPF cookie) says which integer registers hold the arguments the objects are reached from,
the steps from each argument to its object (``socket->sk``: a read at an offset), which
function-table row each way is, how wide and signed the return value and the recorded
arguments are, and whether the call starts or ends an object's life.  So the C text holds
one entry and one exit program per probe kind and per route count (1, 2, 4, 8 ways to the
object; a function reaching it three ways uses the program for four), compiled once by
bcc whatever the number of functions, and the loaded instructions are attached to every
function: fentry/fexit programs are loaded once per target (a tracing program is bound
to its function's BTF id when loaded; the verifier checks each clone), kprobe programs
are loaded once and linked to many functions (one kprobe.multi link, or one perf kprobe
each).

What the programs do per call, for each way to the object (each function-table row):

* entry: the thread's call depth is counted up, the object's address computed, the
  object snapshotted and an entry event written through ``ctracer_hit`` (the same
  admission, following and lifetime rules as the tracepoint probes:
  `ctracer.probes.tracepoint`), with the call's first `NARGS` register arguments in the
  event's argument slots; what the exit needs (objects, arguments) is saved by depth;
* exit: the depth is counted down, the entry's saved state taken (its objects and
  arguments: a kretprobe no longer has the arguments, and fexit need not read them
  again; an exit with no saved entry is flagged `FLAG_NO_ENTRY` and written only for
  a ``returns`` method, whose object is the return value), the return value read
  and normalised to its C type, and an exit event written for each way its entry wrote
  one (a ``returns`` method's object is the return value; a holder still NULL at entry,
  like an incoming skb's ``->sk``, gives neither), so every exit has its entry.

The depth and the saved calls live in the thread's task storage (one
``bpf_task_storage_get`` a probe, no hashing, no locks, freed with the task; the
entries of the `THREAD_CALLS` shallowest levels; a deeper call's in an LRU hash, as
before), where the running kernel lets the
kind's programs use it (`ctracer.host.features.task_storage_works`, tried); else in two
LRU hashes keyed by thread id, as before (a lookup-or-insert and a write at entry, a
lookup and a delete at exit; measured in the 6.12 guest: see bench/RESULTS.md's
bench_kmethods rows).  A text with task storage holds each program's LRU-hash variant
too (named with `HASHED_SUFFIX`): a verifier may refuse the task-storage programs
(none known today; 6.1's refused the entry programs of 8 routes in both variants, E2BIG,
until `_entry_program` hid from it which objects were NULL) and the recorder
then loads the LRU-hash variants of every program of the kind instead
(`ctracer.record.kattach.KernelLinks`: every function's depth in one place).

A ``ctracer_stopped`` flag ends every probe at one instant (detaching thousands of links
takes a while).  Recursion is avoided by construction: the probed functions take the
traced struct and the programs call none of them; what the kernel refuses to run
(fentry recursion, kretprobe instances exhausted) is counted by the kernel and read by
the recorder (`ctracer.record.kattach`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Optional, Sequence

from ctracer.debuginfo.catalog import FunctionInfo, ShapeKind, TypeShape
from ctracer.event import FLAG_NO_ENTRY, PHASE_ENTRY, PHASE_EXIT
from ctracer.plan.discovery import Method
from ctracer.plan.lifetime_rules import creates_objects
from ctracer.probes import ctext, folding, kfunc_calls
from ctracer.probes.arguments import Argument, argument_of
from ctracer.probes.uprobe import Arch, register_index
from ctracer.event import FunctionRow

#: route counts the programs come in (a function uses the smallest that holds its ways)
ROUTE_COUNTS = (1, 2, 4, 8)
MAX_ROUTES = ROUTE_COUNTS[-1]
#: steps from an argument to its object (``a->b.c->d`` is three)
MAX_STEPS = ctext.MAX_STEPS
#: register arguments each event records
NARGS = 6
#: the integer argument registers a kprobe program reads (x86-64's six: later
#: arguments are on the stack, which the programs do not read)
KPROBE_REGS = 6
#: the largest struct or union a function returns in registers (x86-64: larger ones
#: through a hidden pointer the caller passes as the first argument)
RETURNED_IN_REGISTERS = 16
#: entry kinds and the exit kind each goes with
KINDS = {"fsession.multi": "fsession.multi", "fentry.multi": "fexit.multi",
         "fentry": "fexit", "kprobe": "kretprobe"}
#: the kinds whose one program runs at both entry and exit (a session program: the
#: entry's body where ``bpf_session_is_return`` says entry, the exit's at return)
SESSION_KINDS = ("fsession.multi",)
#: the kinds whose programs are another kind's: fentry.multi and fexit.multi run the
#: fentry and fexit programs (arguments and return value through bpf_get_func_arg and
#: bpf_get_func_ret, the function by the link's cookie), only loaded and linked
#: differently (`ctracer.record.kattach`)
_SAME_PROGRAMS = {"fentry.multi": "fentry", "fexit.multi": "fexit",
                  "fsession.multi": "fsession"}


def program_kind(kind: str) -> str:
    """The kind whose C program probes as ``kind`` (``fentry.multi``: ``fentry``)."""
    return _SAME_PROGRAMS.get(kind, kind)


def reads_like_fentry(kind: str) -> bool:
    """Whether ``kind``'s programs read arguments and return values the fentry way
    (``bpf_get_func_arg``/``bpf_get_func_ret``, up to 12 arguments)."""
    return program_kind(kind) in ("fentry", "fexit", "fsession")


def probe_kinds(entry_kind: str) -> tuple[str, ...]:
    """The kinds a function probed with ``entry_kind`` is attached as: its entry kind and
    its exit kind, or the session kind alone."""
    return tuple(dict.fromkeys((entry_kind, KINDS[entry_kind])))

_FLAG_STARTS, _FLAG_ENDS = 1, 2
#: calls deep a thread's task storage keeps entries for (a power of two; 32 saved calls
#: and the depth are 3,848 bytes, one 4 KiB allocation per thread with the kernel's header)
THREAD_CALLS = 32
_OP = ctext.PATH_OPS


@dataclass(frozen=True)
class KernelRoute:
    """One way a probed function reaches the object: one function-table row."""

    row: int
    method: Method
    #: the integer register holding the argument (-1: the object is the return value)
    reg: int
    starts: bool = False
    ends: bool = False


@dataclass(frozen=True)
class KernelFunction:
    """A kernel function with entry and exit probes; ``index`` is its ``ctracer_kfns``
    row and its links' cookie."""

    index: int
    key: str
    name: str
    routes: tuple[KernelRoute, ...]
    #: (bits, signed) of the return value, None when it is not an integer register
    returns: Optional[tuple[int, bool]]
    #: the register arguments each event records, in register order
    args: tuple[Argument, ...]
    #: (bits, signed) per recorded argument, for normalising the raw register
    arg_widths: tuple[tuple[int, bool], ...]
    #: how the return value reads: "pointer", "int", "uint", "bool", "enum" ("" none)
    return_kind: str = ""
    #: the entry kind it is planned on ("": the program's `KernelProgram.entry_kind`);
    #: one recording may mix two (`ctracer.plan.attach.mixed_in`)
    kind: str = ""

    @property
    def kprobe_ready(self) -> bool:
        """Whether kprobe programs can read what it needs: every way's argument is in a
        kprobe's register arguments (or is the return value).  A function planned for a
        trampoline kind (its routes counted on up to 12 registers) falls back to kprobes
        only then (`ctracer.record.kattach`)."""
        return all(s.reg < KPROBE_REGS for s in self.routes)

    @property
    def route_count(self) -> int:
        """The ways the program it runs holds (the smallest of `ROUTE_COUNTS` holding its
        rows)."""
        return next(n for n in ROUTE_COUNTS if n >= len(self.routes))

    def program(self, kind: str, task_storage: bool = True) -> str:
        """The name of the program that probes this function as ``kind``, keeping the
        thread's state in task storage or (``task_storage`` false) in the LRU hashes."""
        return program_name(kind, self.route_count, task_storage)

    @property
    def row_ids(self) -> tuple[int, ...]:
        """The function rows of the function, one per way it reaches the object."""
        return tuple(s.row for s in self.routes)


#: the name ending of the programs keeping the thread state in the LRU hashes
HASHED_SUFFIX = "_lru"


def program_name(kind: str, routes: int, task_storage: bool = True) -> str:
    """``ctracer_kprobe_r4``; the LRU-hash variant ``ctracer_kprobe_r4_lru`` (the
    fentry.multi kind's are the fentry ones: `program_kind`)."""
    return f"ctracer_{program_kind(kind)}_r{routes}{'' if task_storage else HASHED_SUFFIX}"


def _width(shape: TypeShape) -> Optional[tuple[int, bool]]:
    """(bits, signed) of an integer, enum, bool or pointer value in a register."""
    if shape.pointers or shape.kind in (ShapeKind.ARRAY, ShapeKind.FUNCTION):
        return 64, False
    if shape.kind == ShapeKind.ENUM:
        return 32, False
    if shape.kind == ShapeKind.BASE and shape.name:
        words = shape.name.split()
        if shape.name in ("_Bool", "bool"):
            return 8, False
        if {"float", "double"} & set(words) or "__int128" in shape.name:
            return None
        signed = "unsigned" not in words and not shape.name.startswith("u")
        if "char" in words or shape.name in ("s8", "u8", "__s8", "__u8"):
            return 8, signed
        if "short" in words or shape.name.endswith("16"):
            return 16, signed
        if "long" in words or shape.name.endswith("64"):
            return 64, signed
        return 32, signed
    return None


def _return_kind(shape: TypeShape) -> str:
    if _width(shape) is None:
        return ""
    if shape.pointers or shape.kind in (ShapeKind.ARRAY, ShapeKind.FUNCTION):
        return "pointer"
    if shape.kind == ShapeKind.ENUM:
        return "enum"
    if shape.name in ("_Bool", "bool"):
        return "bool"
    return "int" if _width(shape)[1] else "uint"  # type: ignore[index]


def _lifetime_flags(m: Method, ending: Collection[str]) -> tuple[bool, bool]:
    """(starts, ends): a creation function's return starts an object's life (the
    address may be a reused one; functions named like lookups return existing objects);
    the exit of a function a lifetime rule names (``ending``: `ctracer.plan.lifetime_rules`,
    ``kfree_skbmem``) ends it.  The report splits lifetimes by the same rules
    (`ctracer.analysis.passes`)."""
    direct = not m.path and not m.holder
    starts = creates_objects(m.route_kind, m.name)
    ends = direct and m.param_index is not None and m.name in ending
    return starts, ends


def _hidden_return_pointer(f: FunctionInfo,
                           struct_size: Callable[[TypeShape], Optional[int]]
                           ) -> tuple[int, str]:
    """(registers the caller's hidden return pointer takes before the arguments, or -1
    when that cannot be told, and why): a struct or union returned by value and larger
    than `RETURNED_IN_REGISTERS` bytes is written through a pointer passed as the first
    integer argument (x86-64), so every argument moves one register on.  Only kprobes
    meet such functions (BPF trampolines refuse them)."""
    r = f.returns
    if r.pointers or r.kind not in (ShapeKind.STRUCT, ShapeKind.UNION):
        return 0, ""
    size = struct_size(r)
    if size is None:
        return -1, (f"cannot locate the arguments: it returns {r.kind.value} {r.name} by "
                    "value, of a size the debug info does not give")
    return int(size > RETURNED_IN_REGISTERS), ""


def plan_kernel_functions(methods: Sequence[Method], arch: Arch, *, first_row: int = 1,
                          max_regs: int = 6, ending: Collection[str] = (),
                          kinds: Mapping[str, str] = {}, kind: str = "",
                          struct_size: Callable[[TypeShape], Optional[int]] = lambda s: None
                          ) -> tuple[tuple[FunctionRow, ...], tuple[KernelFunction, ...]]:
    """Function-table rows (ids from ``first_row``, one per method, ``attached`` saying
    why one is not probed) and the functions to probe, in key order.  ``max_regs``: the
    registers the argument can be in for ``kind`` (6 for kprobes; fentry programs read
    more); ``kinds``: the entry kind of the functions (by method key) not on ``kind``
    (kprobes beside a trampoline kind: `ctracer.plan.attach.mixed_in`), whose arguments
    are then found in `KPROBE_REGS` registers, after the hidden return pointer of a large
    struct returned by value (``struct_size`` gives a returned struct's bytes, None when
    unknown); ``ending``: the functions whose exit ends the object's life (lifetime
    rules)."""
    ordered = sorted(methods, key=lambda m: (m.key, m.param_index is None, m.param_index or 0))
    rows: list[FunctionRow] = []
    grouped: dict[str, list[KernelRoute]] = {}
    infos: dict[str, FunctionInfo] = {}
    for m in ordered:
        row_id = first_row + len(rows)
        f = m.function
        why, reg = "", -1
        own = kinds.get(m.key, kind)
        on_kprobes = program_kind(own) == "kprobe" if own else max_regs <= KPROBE_REGS
        regs = min(max_regs, KPROBE_REGS) if on_kprobes and own != kind else max_regs
        if m.is_tracepoint or not isinstance(f, FunctionInfo):
            why = "skipped: not a kernel function"
        elif not m.probeable:
            why = f"skipped: {m.not_probeable}"
        elif len(m.path) > MAX_STEPS:
            why = f"skipped: the object is more than {MAX_STEPS} steps from the argument"
        elif m.param_index is not None:
            found, reason = register_index(f, m.param_index)
            hidden, hidden_why = (_hidden_return_pointer(f, struct_size) if on_kprobes
                                  else (0, ""))
            if found is None:
                why = f"skipped: {reason}"
            elif hidden < 0:
                why = f"skipped: {hidden_why}"
            elif found + hidden >= regs:
                why = (f"skipped: the argument is not in the first {regs} registers"
                       + (" (later ones are on the stack, which kprobe programs do not "
                          "read)" if on_kprobes else ""))
            else:
                reg = found + hidden
        if not why and len(grouped.get(m.key, ())) >= MAX_ROUTES:
            why = f"skipped: the function reaches the object more than {MAX_ROUTES} ways"
        rows.append(FunctionRow(row_id, m.name, getattr(f, "unit", "") or "", m.route_kind,
                                m.route_text, None, why))
        if why:
            continue
        starts, ends = _lifetime_flags(m, ending)
        grouped.setdefault(m.key, []).append(KernelRoute(row_id, m, reg, starts, ends))
        infos[m.key] = f  # type: ignore[assignment]
    functions = []
    for index, key in enumerate(sorted(grouped)):
        f = infos[key]
        args, widths = [], []
        names = [p.name for p in f.params]
        own = kinds.get(key, kind)
        on_kprobes = program_kind(own) == "kprobe" if own else max_regs <= KPROBE_REGS
        # behind a hidden return pointer the arguments are one register on: none recorded
        reg = NARGS if on_kprobes and _hidden_return_pointer(f, struct_size)[0] else 0
        for i, p in enumerate(f.params):
            width = _width(p.shape)
            if width is None or reg >= NARGS:
                break   # the registers after a float or a struct by value are not known
            args.append(argument_of(p, i, names))
            widths.append(width)
            reg += 1
        functions.append(KernelFunction(index, key, f.name, tuple(grouped[key]),
                                        _width(f.returns), tuple(args), tuple(widths),
                                        _return_kind(f.returns), kinds.get(key, kind)))
    return tuple(rows), tuple(functions)


def descriptor(f: KernelFunction) -> dict:
    """The ``ctracer_kfns`` row of a function, as plain values (the runtime packs them
    with `descriptor_bytes`)."""
    return {"nroutes": len(f.routes), "nargs": len(f.args),
            "ret_bits": f.returns[0] if f.returns else 0,
            "ret_signed": int(bool(f.returns and f.returns[1])),
            "arg_bits": [w[0] for w in f.arg_widths], "arg_signed": [int(w[1]) for w in f.arg_widths],
            "routes": [{"row": s.row, "reg": s.reg,
                       "flags": (_FLAG_STARTS if s.starts else 0) | (_FLAG_ENDS if s.ends else 0),
                       "steps": [(_OP[st.op], int(st.offset)) for st in s.method.path]}
                      for s in f.routes]}


def descriptor_bytes(f: KernelFunction) -> bytes:
    """The packed ``struct ctracer_kfn`` of a function (see `struct_definitions`)."""
    import struct
    d = descriptor(f)
    head = struct.pack("<BBBB", d["nroutes"], d["nargs"], d["ret_bits"], d["ret_signed"])
    head += bytes(d["arg_bits"] + [0] * (NARGS - d["nargs"]))
    head += bytes(d["arg_signed"] + [0] * (NARGS - d["nargs"]))
    head += b"\0" * (_kfn_routes_offset() - len(head))
    out = [head]
    for s in d["routes"] + [None] * (MAX_ROUTES - len(d["routes"])):
        if s is None:
            out.append(b"\0" * _route_size())
            continue
        ops = [op for op, _ in s["steps"]] + [0] * (MAX_STEPS - len(s["steps"]))
        offs = [off for _, off in s["steps"]] + [0] * (MAX_STEPS - len(s["steps"]))
        out.append(struct.pack(f"<IBBBB{MAX_STEPS}B{MAX_STEPS}i", s["row"], s["reg"] & 0xFF,
                               len(s["steps"]), s["flags"], 0, *ops, *offs))
    return b"".join(out)


def _route_size() -> int:
    return 4 + 4 + MAX_STEPS + 4 * MAX_STEPS


def _kfn_routes_offset() -> int:
    return (4 + 2 * NARGS + 3) // 4 * 4


def kfn_size() -> int:
    """Bytes of one function's entry in the kernel programs' function table."""
    return _kfn_routes_offset() + MAX_ROUTES * _route_size()


def struct_definitions(functions: int, task_storage: bool = True) -> str:
    """The descriptor structs and the maps of the method programs: two LRU hashes keyed
    by thread id (each thread's depth; its saved calls by depth), and with
    ``task_storage`` one task-local storage map too, for the programs that keep the depth
    and the `THREAD_CALLS` shallowest saved calls there (deeper calls in the LRU hash of
    calls).  Only one variant's programs are loaded (`programs_c`)."""
    hashed = """\
struct ctracer_kcall_key {
	u32 tid;
	u32 depth;
};

BPF_TABLE("lru_hash", struct ctracer_kcall_key, struct ctracer_kcall, ctracer_kcalls, 65536);
"""
    if task_storage:
        state = hashed + f"""\

/* The LRU-hash variant's thread depths (its programs are loaded where a verifier
 * refuses the task storage ones). */
BPF_TABLE("lru_hash", u32, u32, ctracer_depth, 65536);

/* A thread's call depth and what each entry leaves for its exit, by depth; a call deeper
 * than CTRACER_KSTACK leaves it in ctracer_kcalls, as every call did before. */
#define CTRACER_KSTACK {THREAD_CALLS}
struct ctracer_kthread {{
	u32 depth;
	u32 pad;
	struct ctracer_kcall call[CTRACER_KSTACK];
}};

BPF_TASK_STORAGE(ctracer_kthreads, struct ctracer_kthread);
"""
    else:
        state = hashed + """\
BPF_TABLE("lru_hash", u32, u32, ctracer_depth, 65536);
"""
    return f"""\
#define CTRACER_MAX_ROUTES {MAX_ROUTES}
#define CTRACER_NARGS {NARGS}

struct ctracer_kroute {{
	u32 row;
	u8 reg;		/* integer register of the argument; 255: the return value */
	u8 nsteps;
	u8 flags;	/* {_FLAG_STARTS}: starts a lifetime, {_FLAG_ENDS}: ends one */
	u8 unknown_zero;	/* always 0, which the verifier cannot know (_entry_program) */
	u8 op[CTRACER_MAX_STEPS];	/* 1: read the pointer at +off, 2: add off */
	s32 off[CTRACER_MAX_STEPS];
}};
_Static_assert(sizeof(struct ctracer_kroute) == {_route_size()}, "kroute size");

struct ctracer_kfn {{
	u8 nroutes;
	u8 nargs;
	u8 ret_bits;
	u8 ret_signed;
	u8 arg_bits[CTRACER_NARGS];
	u8 arg_signed[CTRACER_NARGS];
	struct ctracer_kroute route[CTRACER_MAX_ROUTES];
}};
_Static_assert(sizeof(struct ctracer_kfn) == {kfn_size()}, "kfn size");
_Static_assert(__builtin_offsetof(struct ctracer_kfn, route) == {_kfn_routes_offset()}, "kfn routes");

/* What an entry leaves for its exit. */
struct ctracer_kcall {{
	u32 fn;
	u32 depth;	/* the depth it was saved at, plus one (0: none, or taken by its exit) */
	u64 object[CTRACER_MAX_ROUTES];
	u64 args[CTRACER_NARGS];
}};

BPF_ARRAY(ctracer_kfns, struct ctracer_kfn, {max(1, functions)});
{state}"""


_HELPERS = """\
/* v as a C value of `bits` bits (8, 16, 32, 64; 0: none, read as 0), sign-extended when
 * is_signed, computed without a branch: 6.1's verifier walks each branch of each
 * argument apart, and a switch per argument took the programs of more ways past its
 * million instructions (E2BIG). */
static __always_inline u64 ctracer_normalise(u64 v, u8 bits, u8 is_signed)
{
	u64 keep = -(((u64)bits + 63) >> 6);		/* all ones unless bits is 0 */
	u64 shift = (64 - (u64)bits) & 63;
	u64 low = (v << shift) >> shift;
	u64 extended = (u64)((s64)(v << shift) >> shift);
	u64 sign = -((u64)is_signed & 1);

	return ((extended & sign) | (low & ~sign)) & keep;
}

static __always_inline u64 ctracer_follow(u64 obj, struct ctracer_kroute *s)
{
	return ctracer_follow_steps(obj, s->nsteps, s->op, s->off);
}

/* A kprobe's argument registers, read at constant offsets of ctx (the verifier refuses
 * a read through a computed ctx pointer), then chosen by index. */
static __always_inline void ctracer_kprobe_regs(struct pt_regs *ctx, u64 *regs)
{
	regs[0] = PT_REGS_PARM1(ctx);
	regs[1] = PT_REGS_PARM2(ctx);
	regs[2] = PT_REGS_PARM3(ctx);
	regs[3] = PT_REGS_PARM4(ctx);
	regs[4] = PT_REGS_PARM5(ctx);
	regs[5] = PT_REGS_PARM6(ctx);
}

static __always_inline u64 ctracer_fentry_reg(void *ctx, int reg)
{
	u64 v = 0;

	bpf_get_func_arg(ctx, reg, &v);
	return v;
}

/* The call's recorded arguments (``regs``: a kprobe's registers, NULL for fentry),
 * normalised to their C types. */
static __always_inline void ctracer_kargs(void *ctx, const u64 *regs, struct ctracer_kfn *fn,
					  u64 *out)
{
	/* every route read, none skipped by a branch: the ones past the function's
	 * arguments have no width (0) and read as 0 */
#pragma clang loop unroll(full)
	for (int i = 0; i < CTRACER_NARGS; i++) {
		u64 v = regs ? regs[i] : ctracer_fentry_reg(ctx, i);

		out[i] = ctracer_normalise(v, fn->arg_bits[i], fn->arg_signed[i]);
	}
}
"""


#: the opening every program shares: stop when the recording has ended, find the
#: function's descriptor by the link's cookie
_OPENING = """\
	if (stopped && *stopped)
		return 0;
	fi = (u32)bpf_get_attach_cookie(ctx);
	fn = ctracer_kfns.lookup(&fi);
	if (!fn)
		return 0;"""


_GET_THREAD = """\
	t = ctracer_kthreads.task_storage_get(bpf_get_current_task_btf(), 0, %s);"""


def uses_scratch(kind: str, fold: bool) -> bool:
    """Whether ``kind``'s programs keep their call state in this CPU's
    ``ctracer_kprobe_work`` instead of on the stack: the kprobe ones with the fold,
    whose inlined folding and sending take the rest of BPF's 512 bytes of stack (the
    kernel runs no kprobe-type program inside another on the same CPU, so one buffer
    per CPU is never shared; fentry programs can nest and keep theirs on the stack)."""
    return fold and program_kind(kind) in ("kprobe", "kretprobe")


def scratch_definition(nargs: int) -> str:
    """The per-CPU buffer of the kprobe programs' call state (`uses_scratch`), after
    `struct_definitions` and the fold's maps."""
    return f"""\
/* A kprobe or kretprobe program's call state, off the stack (see uses_scratch). */
struct ctracer_kprobe_work {{
	struct ctracer_kcall call;
	u64 args[{max(nargs, 1)}];
	u64 regs[8];
	struct ctracer_frame_key fk;
	struct ctracer_frame fr;
}};

BPF_PERCPU_ARRAY(ctracer_kprobe_work, struct ctracer_kprobe_work, 1);
"""


#: C taking this CPU's kprobe work buffer (`uses_scratch`), all zero
_TAKE_SCRATCH = """\
	kw = ctracer_kprobe_work.lookup(&zero);
	if (!kw)
		return 0;
	__builtin_memset(kw, 0, sizeof(*kw));"""


@dataclass(frozen=True)
class _CallState:
    """Where a program's C keeps the call's state: locals on the stack, or this CPU's
    ``ctracer_kprobe_work`` (``scratch``, `uses_scratch`)."""

    scratch: bool
    nargs: int

    def name(self, local: str) -> str:
        """The C of the state's member ``local`` (``call``, ``args``, ``regs``)."""
        return f"kw->{local}" if self.scratch else local

    @property
    def declaration(self) -> str:
        """The declaration of the call: the buffer's pointer, or the call itself."""
        return ("\tstruct ctracer_kprobe_work *kw;" if self.scratch else
                "\tstruct ctracer_kcall call = {};")

    def arrays(self, regs: bool) -> str:
        """The declarations of the arguments (and the registers) kept on the stack."""
        if self.scratch:
            return ""
        return f"\tu64 args[{max(self.nargs, 1)}] = {{}};\n" + \
            ("\tu64 regs[8] = {};\n" if regs else "")

    @property
    def opening(self) -> str:
        """`_OPENING`, and with the buffer, the buffer taken."""
        return _OPENING + "\n" + _TAKE_SCRATCH if self.scratch else _OPENING


def _entry_program(kind: str, routes: int, nargs: int, task_storage: bool = True,
                   fold: bool = False, inline_as: str = "") -> str:
    """An entry program's C; with ``inline_as``, an inline function of that name for a
    session program (`_session_program`)."""
    fentry = int(kind == "fentry")
    state_of_call = _CallState(uses_scratch(kind, fold), nargs)
    ctx = "void *ctx" if fentry else "struct pt_regs *ctx"
    call, args, regs = (state_of_call.name(n) for n in ("call", "args", "regs"))
    reg = "ctracer_fentry_reg(ctx, s->reg)" if fentry else f"{regs}[s->reg & 7]"
    if task_storage:
        # NULL when the kernel cannot give it now (task storage busy on this CPU,
        # no memory): depth 0 and nothing saved, as when the maps were full
        state = "\tstruct ctracer_kthread *t;"
        count = _GET_THREAD % "BPF_LOCAL_STORAGE_GET_F_CREATE" + """
	if (t) {
		depth = t->depth;
		t->depth = depth + 1;
	}"""
        save = """\
	if (t && depth < CTRACER_KSTACK) {
		__builtin_memcpy(&t->call[depth & (CTRACER_KSTACK - 1)], &%(call)s, sizeof(%(call)s));
	} else if (t) {
		/* deeper than the task storage keeps */
		struct ctracer_kcall_key key = {};

		key.tid = (u32)pid_tgid;
		key.depth = depth;
		ctracer_kcalls.update(&key, &%(call)s);
	}""" % {"call": call}
    else:
        state = "\tstruct ctracer_kcall_key key = {};\n\tu32 *counter, tid;"
        count = """\
	tid = (u32)pid_tgid;
	counter = ctracer_depth.lookup_or_try_init(&tid, &zero);
	depth = counter ? *counter : 0;
	if (counter)
		*counter = depth + 1;"""
        save = """\
	key.tid = tid;
	key.depth = depth;
	ctracer_kcalls.update(&key, &%s);""" % call
    # the call's first row and first two objects, for the calls folded inside it
    frame = "\n".join("\t" + line for line in folding.frame_statements(
        "(u32)pid_tgid", "depth", "fn->route[0].row", f"{call}.object[0]",
        f"{call}.object[1 & (CTRACER_MAX_ROUTES - 1)]",
        in_buffer="kw" if state_of_call.scratch else None)) if fold else ""
    return f"""\
{_header(kind, routes, task_storage, ctx, inline_as)}
{{
	u32 zero = 0, fi, depth = 0;
	u8 *stopped = ctracer_stopped.lookup(&zero);
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct ctracer_kfn *fn;
{state_of_call.declaration}
{state}
{state_of_call.arrays(regs=True)}
{state_of_call.opening}
	{"" if fentry else f"ctracer_kprobe_regs(ctx, {regs});"}
{count}
	{call}.fn = fi;
	{call}.depth = depth + 1;
	ctracer_kargs(ctx, {"0" if fentry else regs}, fn, {args});
#pragma clang loop unroll(full)
	for (int a = 0; a < CTRACER_NARGS && a < {max(nargs, 1)}; a++)
		{call}.args[a] = {args}[a];
#pragma clang loop unroll(disable)
	for (int i = 0; i < {routes}; i++) {{
		struct ctracer_kroute *s;
		u64 obj = 0;

		if (i >= fn->nroutes)
			break;
		s = &fn->route[i & (CTRACER_MAX_ROUTES - 1)];
		if (s->reg != 255)
			obj = ctracer_follow({reg}, s);
		/* the same value, which the verifier no longer knows (the descriptor's
		 * unknown_zero is 0): a NULL it knew from ctracer_follow decided the branch
		 * below, which made the saved objects precise, so the states of each way
		 * multiplied (6.1: 12,814, 32,948 and 134,257 instructions processed for 1,
		 * 2 and 4 ways, past its million for 8, E2BIG) */
		obj ^= s->unknown_zero;
		{call}.object[i & (CTRACER_MAX_ROUTES - 1)] = obj;
		if (obj || s->reg == 255)
			ctracer_hit(s->row, {PHASE_ENTRY}, obj, 0, depth, 0, {args}, pid_tgid, 0, 0, 0);
	}}
{frame}
{save}
	return 0;
}}
"""


def _take_hashed(tid: str, indent: str, call: str = "call") -> str:
    """C taking the entry saved for this exit from the LRU hash of calls (thread
    ``tid`` at ``depth``) into ``call``, indented by ``indent``."""
    lines = [f"key.tid = {tid};", "key.depth = depth;", "saved = ctracer_kcalls.lookup(&key);",
             "if (saved && saved->fn == fi) {",
             f"\t__builtin_memcpy(&{call}, saved, sizeof({call}));",
             "\tctracer_kcalls.delete(&key);", "\thave = 1;", "}"]
    return "\n".join(indent + line for line in lines)


def _exit_program(kind: str, routes: int, nargs: int, task_storage: bool = True,
                  fold: bool = False, inline_as: str = "") -> str:
    """An exit program's C; with ``inline_as``, an inline function of that name for a
    session program (`_session_program`)."""
    fexit = int(kind == "fexit")
    state_of_call = _CallState(uses_scratch(kind, fold), nargs)
    call, args = state_of_call.name("call"), state_of_call.name("args")
    ctx = "void *ctx" if fexit else "struct pt_regs *ctx"
    ret = "bpf_get_func_ret(ctx, &raw);" if fexit else "raw = PT_REGS_RC(ctx);"
    # an exit is written for what its entry wrote: the object the entry saw (a holder
    # still NULL at entry, like an incoming skb's ->sk, gives no entry and no exit), or
    # the return value, with the arguments the entry saved.  With no saved entry (the
    # call began before the probes) fexit, like kretprobe, writes only what its return
    # value gives: finding the object and normalising the arguments again from the
    # registers on that path took 6.1's verifier past its million instructions
    # (fexit of 4 ways on a function of two arguments: 664,804 processed, against
    # 39,094 without it)
    saved_args = ("#pragma clang loop unroll(full)\n"
                  f"\tfor (int a = 0; a < CTRACER_NARGS && a < {max(nargs, 1)}; a++)\n"
                  f"\t\t{args}[a] = {call}.args[a];")
    if task_storage:
        state = "\tstruct ctracer_kthread *t;"
        take = _GET_THREAD % "0" + """
	if (t) {
		depth = t->depth ? t->depth - 1 : 0;
		t->depth = depth;
		if (depth < CTRACER_KSTACK) {
			saved = &t->call[depth & (CTRACER_KSTACK - 1)];
			if (saved->fn == fi && saved->depth == depth + 1) {
				__builtin_memcpy(&%(call)s, saved, sizeof(%(call)s));
				saved->depth = 0;
				have = 1;
			}
		} else {
			struct ctracer_kcall_key key = {};

""" % {"call": call} + _take_hashed("(u32)pid_tgid", "\t\t\t", call) + """
		}
	}"""
    else:
        state = "\tstruct ctracer_kcall_key key = {};\n\tu32 *counter, tid;"
        take = """\
	tid = (u32)pid_tgid;
	counter = ctracer_depth.lookup(&tid);
	depth = counter && *counter ? *counter - 1 : 0;
	if (counter)
		*counter = depth;
""" + _take_hashed("tid", "\t", call)
    return f"""\
{_header(kind, routes, task_storage, ctx, inline_as)}
{{
	u32 zero = 0, fi, depth = 0;
	u8 *stopped = ctracer_stopped.lookup(&zero);
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct ctracer_kfn *fn;
{state_of_call.declaration}
	struct ctracer_kcall *saved;
{state}
{state_of_call.arrays(regs=False)}	u64 raw = 0;
	s64 ret;
	u8 flags = 0;
	int have = 0;

{state_of_call.opening}
{take}
	if (!have)
		flags = {FLAG_NO_ENTRY};
	{ret}
	ret = fn->ret_bits ? (s64)ctracer_normalise(raw, fn->ret_bits, fn->ret_signed) : 0;
	{saved_args}
#pragma clang loop unroll(disable)
	for (int i = 0; i < {routes}; i++) {{
		struct ctracer_kroute *s;
		u64 obj;

		if (i >= fn->nroutes)
			break;
		s = &fn->route[i & (CTRACER_MAX_ROUTES - 1)];
		obj = s->reg == 255 ? raw : {call}.object[i & (CTRACER_MAX_ROUTES - 1)];
		if (obj)
			ctracer_hit(s->row, {PHASE_EXIT}, obj, ret, depth, flags, {args}, pid_tgid,
				    s->reg == 255 && (s->flags & {_FLAG_STARTS}), s->flags & {_FLAG_ENDS}, 0);
	}}
	return 0;
}}
"""


def _header(kind: str, routes: int, task_storage: bool, ctx: str, inline_as: str) -> str:
    if inline_as:
        return f"static __always_inline int {inline_as}({ctx})"
    return f"int {program_name(kind, routes, task_storage)}({ctx})"


def _session_program(routes: int, nargs: int, task_storage: bool = True,
                     fold: bool = False) -> str:
    """One program for a function's entry and exit (fsession): the fentry program's body
    where ``bpf_session_is_return`` says entry, the fexit program's at the return; the
    thread's task storage (or LRU hashes) hands the entry's state to the exit as with a
    pair of programs."""
    name = program_name("fsession.multi", routes, task_storage)
    entry, exit_ = f"{name}_entry", f"{name}_exit"
    is_return = kfunc_calls.C_NAMES["bpf_session_is_return"]
    return "\n".join([
        _entry_program("fentry", routes, nargs, task_storage, fold, inline_as=entry),
        _exit_program("fexit", routes, nargs, task_storage, fold, inline_as=exit_),
        f"""\
int {name}(void *ctx)
{{
	if ({is_return}(ctx))
		return {exit_}(ctx);
	return {entry}(ctx);
}}
"""])


def variants(task_storage: bool) -> tuple[bool, ...]:
    """The thread-state variants a text holds (True: task storage, False: the LRU
    hashes): with task storage, the LRU-hash one too, loaded where a verifier refuses
    the first."""
    return (True, False) if task_storage else (False,)


def programs_c(kinds: Sequence[str], route_counts: Sequence[int], nargs: int,
               task_storage: bool = True, fold: bool = False,
               routes_by_kind: Optional[Mapping[str, Sequence[int]]] = None) -> str:
    """The C of the entry and exit programs of each entry kind (``fentry``, ``kprobe``),
    or of the session program (``fsession.multi``: `_session_program`), for each route
    count (``routes_by_kind``: each kind's own), in each of the `variants`: with
    ``task_storage`` each thread's depth and saved calls in task storage
    (`struct_definitions`) and, as a fallback, in the LRU hashes; else in the LRU hashes
    only."""
    t = ctext.Text()
    t.block(_HELPERS)
    if any(uses_scratch(kind, fold) for kind in kinds):
        t("")
        t.block(scratch_definition(nargs))
    if any(kind in SESSION_KINDS for kind in kinds):
        t("")
        t.block(kfunc_calls.declarations())
    counts: dict[str, set[int]] = {}
    for kind in kinds:
        counts.setdefault(program_kind(kind), set()).update(
            routes_by_kind[kind] if routes_by_kind is not None else route_counts)
    for kind, kind_counts in counts.items():
        for storage in variants(task_storage):
            for n in sorted(kind_counts):
                t("")
                if kind == "fsession":
                    t.block(_session_program(n, nargs, storage, fold))
                    continue
                t.block(_entry_program(kind, n, nargs, storage, fold))
                t("")
                t.block(_exit_program(KINDS[kind], n, nargs, storage, fold))
    return str(t)
