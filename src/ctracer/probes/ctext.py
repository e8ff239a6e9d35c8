"""C text shared by the probe programs (`ctracer.probes.uprobe` for user space,
`ctracer.probes.tracepoint` for the kernel): a line collector, the object-path steps,
the snapshot function that copies the mini fields out of an object, and the fork
following that keeps a process filter on a process tree.  Every piece is built from
structured data (offsets, ids, identifiers checked by `ctracer.event`), never from
user text.
"""

from __future__ import annotations

import os
import re
from typing import Optional

from ctracer.collectors.base import ObjectReader
from ctracer.collectors.snapshot import collectors_for, read_span
from ctracer.event import Layout
from ctracer.plan.discovery import Method
from ctracer.plan.heads import HeadRead

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def comment_name(name: str) -> str:
    """A name fit for a C comment (debug-info names are identifiers; anything else is
    shown as ``?``)."""
    return name if _IDENT.match(name) else "?"


_EMIT_HEAD = """\
static __always_inline void ctracer_emit(u32 function_id, u8 phase, u64 object, s64 retval,
					 u32 depth, u8 flags, u64 pid_tgid)
{
	u32 zero = 0;
"""

_EMIT_STOP_CHECK = """\
	u8 *stopped = ctracer_stopped.lookup(&zero);
	struct ctracer_event *e;

	if (stopped && *stopped)  /* the recording ended: nothing more, on every probe at once */
		return;
	e = ctracer_events.ringbuf_reserve(sizeof(struct ctracer_event));
"""

_EMIT_BODY = """\

	if (!e) {
		u64 *lost = ctracer_lost.lookup(&zero);
		if (lost)
			(*lost)++;
		return;
	}
	e->h.ts_ns = bpf_ktime_get_ns();
	e->h.object = object;
	e->h.retval = retval;
	e->h.cpu = bpf_get_smp_processor_id();
	e->h.pid = pid_tgid >> 32;
	e->h.tid = (u32)pid_tgid;
	e->h.function_id = function_id;
	e->h.depth = depth > 0xffff ? 0xffff : depth;
	e->h.phase = phase;
	bpf_get_current_comm(&e->h.comm, sizeof(e->h.comm));
	__builtin_memset(&e->m, 0, sizeof(e->m));
	if (!object || ctracer_snapshot(&e->m, object))
		flags |= CTRACER_FLAG_READ_FAILED;
	e->h.flags = flags;
	ctracer_submit(e);
}
"""


#: the most events a CPU submits between two wake-ups of the reader
MAX_WAKE_EVERY = 1024


def wake_every(ring_bytes: int, event_bytes: int, cpus: int) -> int:
    """Events a CPU submits before it wakes the reader: a quarter of the ring shared by
    every CPU (so a burst wakes the reader well before the ring is full), at most
    `MAX_WAKE_EVERY`."""
    record = (event_bytes + 8 + 7) // 8 * 8   # the ring's 8-byte record header, aligned
    return max(1, min(MAX_WAKE_EVERY, ring_bytes // record // (4 * max(1, cpus))))


_SUBMIT = """\
/* Submit an event without waking the reader (the wake-up is a self-IPI and a context
   switch: it cost more than the rest of a probe when done for every event).  The
   reader takes what the ring holds every few tens of milliseconds on its own; a CPU
   wakes it after every CTRACER_WAKE_EVERY events, so a burst is taken before the ring
   is full. */
#define CTRACER_WAKE_EVERY %(every)d
#define CTRACER_RB_NO_WAKEUP 1     /* BPF_RB_NO_WAKEUP of the kernel's ABI */
#define CTRACER_RB_FORCE_WAKEUP 2  /* BPF_RB_FORCE_WAKEUP */

static __always_inline u64 ctracer_wake_flags(void)
{
	u32 zero = 0;
	u32 *unwoken = ctracer_unwoken.lookup(&zero);

	if (!unwoken || ++*unwoken >= CTRACER_WAKE_EVERY) {
		if (unwoken)
			*unwoken = 0;
		return CTRACER_RB_FORCE_WAKEUP;
	}
	return CTRACER_RB_NO_WAKEUP;
}

static __always_inline void ctracer_submit(struct ctracer_event *e)
{
	ctracer_events.ringbuf_submit(e, ctracer_wake_flags());
}

/* The same for an event built outside the ring buffer (`ctracer_event_scratch`): copied
   in whole, counted as lost when the ring buffer is full. */
static __always_inline void ctracer_output(struct ctracer_event *e)
{
	u32 zero = 0;

	if (ctracer_events.ringbuf_output(e, sizeof(*e), ctracer_wake_flags())) {
		u64 *lost = ctracer_lost.lookup(&zero);
		if (lost)
			(*lost)++;
	}
}
"""


def event_scratch_maps() -> list[str]:
    """The per-CPU events the kernel probes build before copying them into the ring
    buffer (one per nesting level, `SCRATCH_LEVELS`) and the level in use: declared
    with the other maps, after ``struct ctracer_event``."""
    return [f"BPF_PERCPU_ARRAY(ctracer_events_scratch, struct ctracer_event, {SCRATCH_LEVELS});",
            "BPF_PERCPU_ARRAY(ctracer_events_nest, u32, 1);"]


_EVENT_SCRATCH = """\
/* This CPU's event of the current nesting level (a probe interrupting another one on the
   same CPU takes the next), NULL when every level is in use; ctracer_event_done gives it
   back.  Building the event here and copying it into the ring buffer whole
   (ctracer_output) keeps no ring buffer reservation open across the snapshot's and the
   admission's branches: 6.1's verifier prunes no state holding one and refused the
   kernel-function programs as too complex (E2BIG, a million instructions walked). */
static __always_inline struct ctracer_event *ctracer_event_scratch(void)
{
	u32 zero = 0, level;
	u32 *nest = ctracer_events_nest.lookup(&zero);
	struct ctracer_event *e;

	if (!nest || *nest >= %(levels)d) {
		u64 *lost = ctracer_lost.lookup(&zero);
		if (lost)
			(*lost)++;
		return 0;
	}
	level = *nest;
	e = ctracer_events_scratch.lookup(&level);
	if (e)
		*nest = level + 1;
	return e;
}

static __always_inline void ctracer_event_done(void)
{
	u32 zero = 0;
	u32 *nest = ctracer_events_nest.lookup(&zero);

	if (nest && *nest)
		*nest = *nest - 1;
}
"""


def event_scratch_functions() -> str:
    """``ctracer_event_scratch()`` and ``ctracer_event_done()`` (see `event_scratch_maps`),
    after `submit_function`."""
    return _EVENT_SCRATCH % {"levels": SCRATCH_LEVELS}


#: default ring buffer size (bytes, a power of two multiple of the page size)
RING_BYTES = 16 << 20


def check_ring_bytes(ring_bytes: int) -> int:
    """``ring_bytes`` when the kernel takes it as a ring buffer's size (a power of two of
    at least a page); ValueError otherwise."""
    if ring_bytes < 4096 or ring_bytes & (ring_bytes - 1):
        raise ValueError("the ring buffer size must be a power of two of at least 4096")
    return ring_bytes


_DEREF = """\
static __always_inline u64 ctracer_deref(u64 addr, u64 offset)
{
	u64 value = 0;

	if (!addr || %s(&value, sizeof(value), (void *)(addr + offset)))
		return 0;
	return value;
}
"""


#: steps from an argument to its object (``a->b.c->d`` is three), as the kernel
#: programs' descriptors carry them: an op (`PATH_OPS`) and an offset each
MAX_STEPS = 4
PATH_OPS = {"deref": 1, "offset": 2}

#: the C constant the descriptors' step arrays are sized with (before the structs)
PATH_DEFINE = f"#define CTRACER_MAX_STEPS {MAX_STEPS}"

_FOLLOW = f"""\
/* The object reached from an argument by a descriptor's steps: {PATH_OPS['deref']}: read the
 * pointer at +off, {PATH_OPS['offset']}: add off. */
static __always_inline u64 ctracer_follow_steps(u64 obj, u8 nsteps, const u8 *op,
						const s32 *off)
{{
#pragma clang loop unroll(full)
	for (int j = 0; j < CTRACER_MAX_STEPS; j++) {{
		if (j >= nsteps || !obj)
			break;
		if (op[j] == {PATH_OPS['deref']})
			obj = ctracer_deref(obj, off[j]);
		else
			obj = obj + off[j];
	}}
	return obj;
}}
"""


def follow_function() -> str:
    """``ctracer_follow_steps``: the steps of a descriptor (a kernel function's or a
    tracepoint's way to the object, `PATH_OPS`) from an argument to its object; after
    `deref_function`."""
    return _FOLLOW


def deref_function(read: str) -> str:
    """``ctracer_deref(addr, offset)``: the u64 at ``addr + offset``, 0 when ``addr`` is
    NULL or the read (with the helper or macro ``read``) fails; the step from a holder
    to the object (``socket->sk``)."""
    return _DEREF % read


def ring_buffer_maps(ring_bytes: int) -> list[str]:
    """The maps events leave through, declared with the program's other maps (bcc
    crashed compiling a map declared after a function when the kernel headers were
    missing): the ring buffer, the per-CPU lost counter, and the per-CPU count of
    events submitted since the reader was last woken (`submit_function`)."""
    return ["BPF_PERCPU_ARRAY(ctracer_lost, u64, 1);",
            "BPF_PERCPU_ARRAY(ctracer_unwoken, u32, 1);",
            f"BPF_RINGBUF_OUTPUT(ctracer_events, {ring_bytes // 4096});"]


def submit_function(ring_bytes: int, event_bytes: int, cpus: Optional[int] = None) -> str:
    """``ctracer_submit(e)``: submit a reserved event, waking the reader only once per
    `wake_every` events of a CPU (``cpus``: how many may submit at once, this
    machine's by default)."""
    return _SUBMIT % {"every": wake_every(ring_bytes, event_bytes, cpus or os.cpu_count() or 1)}


def emit_function(stop_check: bool) -> str:
    """``ctracer_emit``: reserve an event in the ring buffer (counting a failure as
    lost), fill its header, snapshot the object, submit it (`submit_function` defines
    ``ctracer_submit``, which must come first).  With ``stop_check`` it first reads the
    ``ctracer_stopped`` flag, so a recording ends on every probe at one instant."""
    reserve = _EMIT_STOP_CHECK if stop_check else \
        "\tstruct ctracer_event *e = ctracer_events.ringbuf_reserve(sizeof(struct ctracer_event));\n"
    return _EMIT_HEAD + reserve + _EMIT_BODY


def path_statements(method: Method, var: str) -> list[str]:
    """C statements turning the argument value in ``var`` into the object's address
    along the method's structured path (``socket->sk``: a read at an offset)."""
    out = []
    for step in method.path:
        if step.op == "deref":
            out.append(f"{var} = ctracer_deref({var}, {int(step.offset)});")
        elif step.op == "offset":
            out.append(f"{var} = {var} ? {var} + {int(step.offset)} : 0;")
        else:
            raise ValueError(f"unknown path step {step.op!r}")
    return out


class Text:
    """Lines of C collected in order; calling it appends lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, *lines: str) -> None:
        self.lines.extend(lines)

    def block(self, text: str) -> None:
        """Append ``text``'s lines."""
        self.lines.extend(text.rstrip("\n").split("\n"))

    def __str__(self) -> str:
        return "\n".join(self.lines) + "\n"


def _head_snapshot(t: Text, mini: Layout, reader: ObjectReader, head: HeadRead,
                   collectors: list) -> None:
    """The body of ``ctracer_snapshot`` for an object that may be only its head
    (`ctracer.plan.heads`): the bytes up to the head's end first and the collectors
    inside it; when the state read there says only the head exists, ``return 1``; else
    the rest of the span and the other collectors."""
    start, end = read_span(collectors) if collectors else (head.state_offset, head.state_offset)
    start = min(start, head.state_offset - head.state_offset % 8)
    end = max(end, head.state_offset + head.state_size)
    split = min(head.end, end)
    inside = [c for c in collectors if head.start <= c.span()[0] and c.span()[1] <= head.end]
    states = " || ".join(f"state == {int(v)}" for v, _ in head.states)
    t(f"/* Copies the mini fields of the object at addr: object bytes [{start}, {end}); "
      f"only [{start}, {split}) when the state says only "
      f"{comment_name(head.member)} exists. */")
    _scratch_and_opening(t, mini, end - start, "\tu32 state = 0;")
    t(f"\tif ({reader.helper}(buf->b, {split - start}, (void *)(addr + {start})))",
      "\t\treturn -1;",
      f"\t__builtin_memcpy(&state, buf->b + {head.state_offset - start}, "
      f"{int(head.state_size)});",
      )
    _collect(t, inside, start)
    t(f"\tif ({states})", "\t\treturn 1;")
    if end > split:
        t(f"\tif ({reader.helper}(buf->b + {split - start}, {end - split}, "
          f"(void *)(addr + {split})))",
          "\t\treturn -1;")
    _collect(t, [c for c in collectors if c not in inside], start)
    t("\treturn 0;", "}")


def _collect(t: Text, collectors: list, start: int) -> None:
    """The ``collectors``' statements moving their fields from the scratch buffer (object
    bytes from ``start`` on) into the event's mini snapshot."""
    for c in collectors:
        for stmt in c.c_statements("(*m)", "buf->b", start, "addr"):
            t("\t" + stmt)


#: nesting levels a CPU snapshots at once (task, softirq, hardirq, NMI): a probe that
#: interrupts another one's snapshot on the same CPU takes the next scratch buffer
SCRATCH_LEVELS = 4


def _scratch_and_opening(t: Text, mini: Layout, size: int, *locals_: str) -> None:
    """The per-CPU scratch buffers of ``size`` object bytes (one per nesting level),
    ``ctracer_snapshot`` taking the level's buffer for ``ctracer_snapshot_in``, and the
    opening of ``ctracer_snapshot_in`` (``locals_``: more declarations)."""
    t("struct ctracer_object_bytes {",
      f"\tu8 b[{size}];",
      "} __attribute__((aligned(8)));",
      f"BPF_PERCPU_ARRAY(ctracer_scratch, struct ctracer_object_bytes, {SCRATCH_LEVELS});",
      "BPF_PERCPU_ARRAY(ctracer_nest, u32, 1);",
      "",
      f"static __always_inline int ctracer_snapshot_in(struct {mini.name} *m, u64 addr,",
      "\t\t\t\t\t       struct ctracer_object_bytes *buf);",
      "",
      "/* The object's mini fields into m, through this nesting level's scratch buffer. */",
      f"static __always_inline int ctracer_snapshot(struct {mini.name} *m, u64 addr)",
      "{",
      "\tu32 zero = 0, level;",
      "\tu32 *nest = ctracer_nest.lookup(&zero);",
      "\tstruct ctracer_object_bytes *buf;",
      "\tint read;",
      "",
      f"\tif (!nest || *nest >= {SCRATCH_LEVELS})",
      "\t\treturn -1;",
      "\tlevel = *nest;",
      "\t*nest = level + 1;",
      "\tbuf = ctracer_scratch.lookup(&level);",
      "\tread = buf ? ctracer_snapshot_in(m, addr, buf) : -1;",
      "\t*nest = level;",
      "\treturn read;",
      "}",
      "",
      f"static __always_inline int ctracer_snapshot_in(struct {mini.name} *m, u64 addr,",
      "\t\t\t\t\t       struct ctracer_object_bytes *buf)",
      "{",
      *locals_,
      "")


def snapshot_function(mini: Layout, reader: ObjectReader,
                      head: Optional[HeadRead] = None) -> str:
    """``ctracer_snapshot(m, addr)``: one read of the span of the object the mini fields
    cover, then the collectors move each field into the event; -1 when the object
    cannot be read.  With ``head``, two reads (`_head_snapshot`) and 1 when only the
    head was read."""
    collectors = collectors_for(mini)
    t = Text()
    if head is not None:
        _head_snapshot(t, mini, reader, head, collectors)
        return str(t)
    start, end = read_span(collectors)
    t(f"/* Copies the mini fields of the object at addr: object bytes [{start}, {end}). */")
    if end <= start:
        t(f"static __always_inline int ctracer_snapshot(struct {mini.name} *m, u64 addr)",
          "{", "\treturn 0;", "}")
        return str(t)
    _scratch_and_opening(t, mini, end - start)
    t(f"\tif ({reader.helper}(buf->b, {end - start}, (void *)(addr + {start})))",
      "\t\treturn -1;")
    _collect(t, collectors, start)
    t("\treturn 0;", "}")
    return str(t)


FOLLOW_FORKS = """\
TRACEPOINT_PROBE(sched, sched_process_fork)
{
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	u32 child = args->child_pid;
	u8 yes = 1;

	if (ctracer_pids.lookup(&parent))
		ctracer_pids.update(&child, &yes);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();

	ctracer_pids.delete(&tid);
	return 0;
}
"""


# -- compact events ---------------------------------------------------------------------

#: objects whose last snapshot the kernel keeps for compact events (an LRU map: an
#: object pushed out gets a whole snapshot in its next event)
BASELINE_CAPACITY = 32768

#: the work buffers of the compact emitter, one per nesting level a CPU runs at once
WORK_LEVELS = SCRATCH_LEVELS


def compact_maps(capacity: int = BASELINE_CAPACITY) -> list[str]:
    """The maps of compact events (after `c_compact_definition` and the ring buffer
    maps): each object's last snapshot as each CPU sent it, and per CPU the buffers an
    event is built in."""
    return ["struct ctracer_baseline_key {",
            "\tu64 object;",
            "\tu32 cpu;",
            "\tu32 pad;",
            "};",
            "struct ctracer_baseline {",
            "\tstruct ctracer_baseline_key key;  /* whose it is (checked: an LRU map",
            "\t\t\t\t\t      reuses what it pushes out) */",
            "\tu32 version;  /* events chained on it since its first */",
            "\tu32 valid;    /* 0: the last event was lost; the next one carries all */",
            "\tu64 w[CTRACER_WORDS];",
            "};",
            "struct ctracer_work {",
            "\tstruct ctracer_event e;",
            "\tstruct ctracer_compact c;",
            "\tstruct ctracer_baseline fresh;",
            "};",
            f'BPF_TABLE("lru_hash", struct ctracer_baseline_key, struct ctracer_baseline, '
            f"ctracer_baselines, {int(capacity)});",
            f"BPF_PERCPU_ARRAY(ctracer_work, struct ctracer_work, {WORK_LEVELS});",
            "BPF_PERCPU_ARRAY(ctracer_level, u32, 1);"]


_SEND = """\
static __always_inline int ctracer_baseline_ours(struct ctracer_baseline *b,
						 struct ctracer_baseline_key *key)
{
	return b->key.object == key->object && b->key.cpu == key->cpu;
}

/* The event w->e as a compact event w->c (its fixed bytes, then the words after them
   that changed), and w->c into the ring buffer.  ``chain``: this
   event may compare against (and update) the object's last snapshot this CPU sent: it
   is the only program of its CPU building an event (the outermost nesting level), and
   the snapshot was read.  Baselines are per CPU, so no other program touches one while
   it is compared, and the ring holds a CPU's chained events in their order; a version
   in each lets the reader check every link.  When the ring is full the baseline is
   marked invalid: the next event carries every word.  Branch-free per word (a mask, not
   an if), so the verifier walks one path. */
static __always_inline void ctracer_send_from(struct ctracer_work *w, const u64 *ev,
					     u64 object, int chain)
{
	struct ctracer_baseline_key key = {.object = object,
					   .cpu = bpf_get_smp_processor_id()};
	struct ctracer_baseline *b = 0;
	u32 n = 0, zero = 0;
	int inserted = 0;

	if (chain) {
		b = ctracer_baselines.lookup(&key);
		if (b && !ctracer_baseline_ours(b, &key))
			b = 0, chain = 0;
	}
#pragma clang loop unroll(full)
	for (int k = 0; k < CTRACER_BITMAP_WORDS; k++)
		w->c.changed[k] = 0;
#pragma clang loop unroll(full)
	for (int k = 0; k < CTRACER_DELTA_FIXED / 8; k++)
		w->c.fixed[k] = ev[k];
	w->c.d.base = 0;
	w->c.d.pad = 0;
	if (b && b->valid) {
		w->c.d.kind = CTRACER_DELTA_CHANGED;
		w->c.d.base = b->version;
#pragma clang loop unroll(full)
		for (int i = 0; i < CTRACER_WORDS; i++) {
			u64 v = ev[CTRACER_DELTA_FIXED / 8 + i];
			u64 d = v ^ b->w[i];

			d |= -d;
			asm volatile("" : "+r"(d));  /* keep it a shift, not a branch */
			d >>= 63;
			w->c.w[n] = v;
			n += d;
			w->c.changed[i / 64] |= d << (i % 64);
			b->w[i] = v;
		}
		b->version++;
	} else {
#pragma clang loop unroll(full)
		for (int i = 0; i < CTRACER_WORDS; i++)
			w->c.w[i] = ev[CTRACER_DELTA_FIXED / 8 + i];
#pragma clang loop unroll(full)
		for (int i = 0; i < CTRACER_WORDS; i++)
			w->c.changed[i / 64] |= 1ULL << (i % 64);
		n = CTRACER_WORDS;
		w->c.d.kind = CTRACER_DELTA_ALONE;
		if (b) {
			__builtin_memcpy(b->w, ev + CTRACER_DELTA_FIXED / 8, sizeof(b->w));
			b->version = 0;
			b->valid = 1;
			w->c.d.kind = CTRACER_DELTA_FIRST;
		} else if (chain) {
			w->fresh.key = key;
			w->fresh.version = 0;
			w->fresh.valid = 1;
			__builtin_memcpy(w->fresh.w, ev + CTRACER_DELTA_FIXED / 8, sizeof(w->fresh.w));
			if (ctracer_baselines.update(&key, &w->fresh) == 0) {
				inserted = 1;
				w->c.d.kind = CTRACER_DELTA_FIRST;
			}
		}
	}
	w->c.d.words = n;
	if (n > CTRACER_WORDS)  /* never: tells the verifier */
		n = CTRACER_WORDS;
	if (b && !ctracer_baseline_ours(b, &key)) {
		/* pushed out and reused while compared: this event cannot chain, and the
		   baseline's new owner must start again */
		b->valid = 0;
		b = 0;
		inserted = 0;
		w->c.d.kind = CTRACER_DELTA_ALONE;
		w->c.d.base = 0;
#pragma clang loop unroll(full)
		for (int i = 0; i < CTRACER_WORDS; i++)
			w->c.w[i] = ev[CTRACER_DELTA_FIXED / 8 + i];
#pragma clang loop unroll(full)
		for (int i = 0; i < CTRACER_WORDS; i++)
			w->c.changed[i / 64] |= 1ULL << (i % 64);
		n = CTRACER_WORDS;
		w->c.d.words = n;
	}
	if (ctracer_events.ringbuf_output(&w->c, __builtin_offsetof(struct ctracer_compact, w)
					  + n * sizeof(u64), ctracer_wake_flags())) {
		u64 *lost = ctracer_lost.lookup(&zero);

		if (lost)
			(*lost)++;
		if (inserted)
			b = ctracer_baselines.lookup(&key);
		if (b && ctracer_baseline_ours(b, &key))
			b->valid = 0;
	}
}

static __always_inline void ctracer_send(struct ctracer_work *w, u64 object, int chain)
{
	ctracer_send_from(w, (const u64 *)&w->e, object, chain);
}
"""


def send_function() -> str:
    """``ctracer_send(w, object, chain)``: a compact event from the work buffer
    into the ring (``ctracer_send_from(w, ev, object, chain)``: from the whole event at
    ``ev`` instead, built through the work buffer's compact part) (after `compact_maps`, `submit_function` and the ring buffer maps)."""
    return _SEND


def nesting_enter() -> list[str]:
    """C statements taking this CPU's next work buffer into ``w`` (``level``: how many
    programs of this CPU build an event under this one), or returning when every level
    is taken (counted as lost)."""
    return ["u32 zero = 0, level;",
            "u32 *nest = ctracer_level.lookup(&zero);",
            "struct ctracer_work *w;",
            "",
            f"if (!nest || *nest >= {WORK_LEVELS}) {{",
            "\tu64 *lost = ctracer_lost.lookup(&zero);",
            "\tif (lost)",
            "\t\t(*lost)++;",
            "\treturn;",
            "}",
            "level = *nest;",
            "*nest = level + 1;",
            "w = ctracer_work.lookup(&level);"]


def compact_emit_function(stop_check: bool, fold: bool = False) -> str:
    """``ctracer_emit`` for compact events: the event built in this CPU's work buffer of
    its nesting level (as `emit_function` builds it in the ring), then sent as a delta
    by `send_function` (chained on the object's last event at the outermost level).
    With ``fold`` (``--calls changes``), an outermost event goes through
    ``ctracer_defer_or_fold`` first (`ctracer.probes.folding`)."""
    t = Text()
    t.block(_EMIT_HEAD.replace("\tu32 zero = 0;\n", ""))
    for line in nesting_enter():
        t("\t" + line if line else "")
    struct = "\tstruct ctracer_event *e;"
    if stop_check:
        t("\tu8 *stopped = ctracer_stopped.lookup(&zero);")
    t(struct, "",
      "\tif (!w)" if not stop_check else "\tif (!w || (stopped && *stopped))",
      "\t\tgoto out;",
      "\te = &w->e;")
    body = _EMIT_BODY[_EMIT_BODY.index("\te->h.ts_ns"):_EMIT_BODY.index("\tctracer_submit(e);")]
    t.block(body)
    if fold:
        t("\tif (level == 0 && ctracer_defer_or_fold(w, (u32)pid_tgid))",
          "\t\tgoto out;")
    t("\tctracer_send(w, object, level == 0);")
    if fold:
        t("\tctracer_written_at(object, e->h.ts_ns);")
    t("out:",
      "\t*nest = level;",
      "}")
    return str(t)
