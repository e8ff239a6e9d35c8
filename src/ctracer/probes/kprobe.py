"""kprobe and kretprobe programs for kernel functions: generated C, from a probe plan.

`build_kprobe_program(probes, mini)` turns the kprobe/kretprobe entries of a
`ctracer.plan.attach.ProbePlan` into a `KprobeProgram`: one small entry program and one
small exit program per function, plus one shared emitter program.  These are the programs
a kernel with kprobes would attach (one program per function, through kprobe.multi links
or one kprobe each); `ctracer plan --verify` loads every one of them through the verifier
without attaching, which is all a kernel without kprobes allows.

Thousands of functions share one emitter, so the code that snapshots the object is
compiled and verified once, not once per probe: each probe writes what it found (the
objects its methods reach, their function-table ids, the return value) into a per-CPU
``ctracer_pending`` slot and tail-calls ``ctracer_kemit`` through the ``ctracer_emitters``
program array (bcc cannot link BPF-to-BPF calls across its per-function sections).  The
emitter pairs entry and exit per (thread, depth), as the uprobe programs of
`ctracer.probes.program` do with their stack pointer, reads the object's mini fields with
``bpf_probe_read_kernel`` at the offsets of the type source (the running kernel's BTF), and
writes one event per method to the ring buffer, counting what it cannot write.

The object of a method at exit is the one its entry found (the argument registers are
gone by then); a ``returns`` method's object is the return value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from ctracer.collectors.base import KERNEL
from ctracer.collectors.snapshot import collectors_for, read_span
from ctracer.event import FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY, PHASE_EXIT, Layout, \
    c_event_definition, event_size
from ctracer.debuginfo.model import FunctionInfo
from ctracer.plan.attach import PlannedProbe
from ctracer.plan.discovery import Method
from ctracer.probes import ctext
from ctracer.probes.program import Arch, argument_expr, host_arch, return_ctype

#: the shared program every probe tail-calls
EMITTER = "ctracer_kemit"
#: most methods one function's probes handle (a function reaching more is probed for these)
MAX_SLOTS = 32
#: default ring buffer size (bytes)
RING_BYTES = 16 << 20

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class KprobeSlot:
    """One method of a probed function: its function-table id and argument (None: the
    return value)."""

    id: int
    method: Method
    arg: Optional[str]


@dataclass(frozen=True)
class KprobeFunction:
    """A kernel function with an entry (kprobe) and an exit (kretprobe) program."""

    index: int
    key: str
    name: str
    slots: tuple[KprobeSlot, ...]
    return_ctype: Optional[str]

    @property
    def entry_probe(self) -> str:
        return f"ctracer_kentry_{self.index}"

    @property
    def exit_probe(self) -> str:
        return f"ctracer_kexit_{self.index}"


@dataclass(frozen=True)
class KprobeProgram:
    """The generated C, its functions, and the functions it could not probe (key → why)."""

    text: str
    mini: Layout
    functions: tuple[KprobeFunction, ...]
    skipped: dict[str, str]

    @property
    def program_names(self) -> list[str]:
        """Every program of the text: the emitter first, then entry and exit of each
        function."""
        return [EMITTER] + [n for f in self.functions for n in (f.entry_probe, f.exit_probe)]


def _comment(name: str) -> str:
    return name if _IDENT.match(name) else "?"


def _snapshot(mini: Layout) -> list[str]:
    collectors = collectors_for(mini)
    start, end = read_span(collectors)
    out = [f"/* Copies the mini fields of the kernel object at addr: bytes [{start}, {end}). */"]
    if end <= start:
        return out + [f"static __always_inline int ctracer_snapshot(struct {mini.name} *m, u64 addr)",
                      "{", "\treturn 0;", "}"]
    out += ["struct ctracer_object_bytes {", f"\tu8 b[{end - start}];",
            "} __attribute__((aligned(8)));",
            "BPF_PERCPU_ARRAY(ctracer_scratch, struct ctracer_object_bytes, 1);", "",
            f"static __always_inline int ctracer_snapshot(struct {mini.name} *m, u64 addr)",
            "{", "\tu32 zero = 0;",
            "\tstruct ctracer_object_bytes *buf = ctracer_scratch.lookup(&zero);", "",
            f"\tif (!buf || {KERNEL.helper}(buf->b, {end - start}, (void *)(addr + {start})))",
            "\t\treturn -1;"]
    for c in collectors:
        out += ["\t" + s for s in c.c_statements("(*m)", "buf->b", start, "addr")]
    return out + ["\treturn 0;", "}"]


_HELPERS = """\
static __always_inline u64 ctracer_deref(u64 addr, u64 offset)
{
	u64 value = 0;

	if (!addr || bpf_probe_read_kernel(&value, sizeof(value), (void *)(addr + offset)))
		return 0;
	return value;
}

static __always_inline u64 ctracer_stack_arg(struct pt_regs *ctx, u64 offset)
{
	u64 value = 0;

	bpf_probe_read_kernel(&value, sizeof(value), (void *)(PT_REGS_SP(ctx) + offset));
	return value;
}

/* What a probe hands the emitter, reset by each probe before it fills it. */
static __always_inline struct ctracer_pending *ctracer_begin(u32 function, u8 phase)
{
	u32 zero = 0;
	struct ctracer_pending *p = ctracer_pending.lookup(&zero);

	if (p) {
		p->function = function;
		p->phase = phase;
		p->count = 0;
		p->retval = 0;
	}
	return p;
}
"""

_EMITTER = """\
/* The shared emitter: pairs exits with entries per (thread, depth), then writes one event
 * per method with the object's snapshot. */
int %(emitter)s(struct pt_regs *ctx)
{
	u32 zero = 0;
	struct ctracer_pending *p = ctracer_pending.lookup(&zero);
	struct ctracer_kcall *call = ctracer_kcall_scratch.lookup(&zero);
	u64 pid_tgid = bpf_get_current_pid_tgid();
	struct ctracer_kcall_key key = { .tid = (u32)pid_tgid };
	struct ctracer_kcall *saved;
	u32 *counter, depth, count;
	u8 flags = 0;

	if (!p || !call)
		return 0;
	__builtin_memset(call, 0, sizeof(*call));
	counter = ctracer_depth.lookup_or_try_init(&key.tid, &zero);
	depth = counter ? *counter : 0;
	if (p->phase == %(entry)d) {
		if (counter)
			*counter = depth + 1;
		key.depth = depth;
		call->function = p->function;
		__builtin_memcpy(call->object, p->object, sizeof(call->object));
		ctracer_kcalls.update(&key, call);
		__builtin_memset(call->object, 0, sizeof(call->object));
	} else {
		depth = depth ? depth - 1 : 0;
		if (counter)
			*counter = depth;
		key.depth = depth;
		saved = ctracer_kcalls.lookup(&key);
		if (saved && saved->function == p->function) {
			__builtin_memcpy(call->object, saved->object, sizeof(call->object));
			ctracer_kcalls.delete(&key);
		} else {
			flags = %(no_entry)d;
		}
	}
	count = p->count;
	for (u32 i = 0; i < CTRACER_SLOTS; i++) {
		u64 object;

		if (i >= count)
			break;
		object = p->object[i] ? p->object[i] : call->object[i];
		ctracer_emit(p->function_id[i], p->phase, object, p->retval, depth, flags, pid_tgid);
	}
	return 0;
}
"""



def _probe(f: KprobeFunction, exit_: bool) -> list[str]:
    name = f.exit_probe if exit_ else f.entry_probe
    out = [f"/* {_comment(f.name)}: {'exit' if exit_ else 'entry'} */",
           f"int {name}(struct pt_regs *ctx)", "{",
           f"\tstruct ctracer_pending *p = ctracer_begin({f.index}, "
           f"{PHASE_EXIT if exit_ else PHASE_ENTRY});", "",
           "\tif (!p)", "\t\treturn 0;"]
    if exit_ and f.return_ctype:
        out.append(f"\tp->retval = (s64)({f.return_ctype})PT_REGS_RC(ctx);")
    for i, s in enumerate(f.slots):
        if s.arg is None:
            value = "PT_REGS_RC(ctx)" if exit_ else "0"
            out.append(f"\tp->object[{i}] = {value};")
        elif exit_:
            out.append(f"\tp->object[{i}] = 0;")
        else:
            out += ["\t{", f"\t\tu64 obj = {s.arg};"]
            out += ["\t\t" + line for line in ctext.path_statements(s.method, "obj")]
            out += [f"\t\tp->object[{i}] = obj;", "\t}"]
        out.append(f"\tp->function_id[{i}] = {s.id};")
    out += [f"\tp->count = {len(f.slots)};",
            "\tctracer_emitters.call(ctx, 0);",
            "\treturn 0;", "}"]
    return out


def build_kprobe_program(probes: Sequence[PlannedProbe], mini: Layout, *,
                         arch: Optional[Arch] = None,
                         ring_bytes: int = RING_BYTES) -> KprobeProgram:
    """Entry and exit programs for the functions of the kprobe entries among ``probes``
    (kretprobe entries name the same functions), sharing one emitter."""
    arch = arch or host_arch()
    functions: list[KprobeFunction] = []
    skipped: dict[str, str] = {}
    next_id = 1
    for p in probes:
        if p.kind != "kprobe":
            continue
        slots: list[KprobeSlot] = []
        why = ""
        ordered = sorted(p.methods, key=lambda m: (m.param_index is None, m.param_index or 0))
        for m in ordered[:MAX_SLOTS]:
            f = m.function
            if not isinstance(f, FunctionInfo):
                why = "not a function"
                break
            arg: Optional[str] = None
            if m.param_index is not None:
                arg, why = argument_expr(f, m.param_index, arch)
                if arg is None:
                    break
            slots.append(KprobeSlot(next_id + len(slots), m, arg))
        if why or not slots:
            skipped[p.function] = why or "no method"
            continue
        next_id += len(slots)
        f = ordered[0].function
        functions.append(KprobeFunction(len(functions), p.function, p.target, tuple(slots),
                                        return_ctype(f.returns)))
    lines = [f"/* Generated by ctracer: kprobe and kretprobe programs snapshotting "
             f"struct {_comment(mini.name)} in kernel functions. */",
             "#include <uapi/linux/ptrace.h>", "",
             f"#define CTRACER_FLAG_READ_FAILED {FLAG_READ_FAILED}",
             f"#define CTRACER_SLOTS {max((len(f.slots) for f in functions), default=1)}", ""]
    lines += c_event_definition(mini).rstrip("\n").split("\n")
    lines += ["",
              "struct ctracer_pending {",
              "\tu64 object[CTRACER_SLOTS];",
              "\tu32 function_id[CTRACER_SLOTS];",
              "\ts64 retval;",
              "\tu32 function;",
              "\tu32 count;",
              "\tu8 phase;",
              "};", "",
              "struct ctracer_kcall_key {", "\tu32 tid;", "\tu32 depth;", "};", "",
              "struct ctracer_kcall {", "\tu64 object[CTRACER_SLOTS];", "\tu32 function;", "};",
              "",
              "BPF_PERCPU_ARRAY(ctracer_pending, struct ctracer_pending, 1);",
              "BPF_PERCPU_ARRAY(ctracer_kcall_scratch, struct ctracer_kcall, 1);",
              "BPF_PROG_ARRAY(ctracer_emitters, 1);",
              'BPF_TABLE("lru_hash", struct ctracer_kcall_key, struct ctracer_kcall, '
              'ctracer_kcalls, 65536);',
              'BPF_TABLE("lru_hash", u32, u32, ctracer_depth, 65536);',
              *ctext.ring_buffer_maps(ring_bytes), ""]
    lines += _snapshot(mini)
    lines += [""] + _HELPERS.rstrip("\n").split("\n")
    lines += [""] + ctext.submit_function(ring_bytes, event_size(mini)).rstrip("\n").split("\n")
    lines += [""] + ctext.emit_function(stop_check=False).rstrip("\n").split("\n")
    lines += [""] + (_EMITTER % {"emitter": EMITTER, "entry": PHASE_ENTRY,
                                 "no_entry": FLAG_NO_ENTRY}).rstrip("\n").split("\n")
    for f in functions:
        lines += [""] + _probe(f, exit_=False) + [""] + _probe(f, exit_=True)
    return KprobeProgram("\n".join(lines) + "\n", mini, tuple(functions), skipped)
