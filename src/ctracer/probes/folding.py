"""C text of ``--calls changes``: a call that changed nothing is counted, not written.

With compact events (`ctracer.probes.ctext.send_function`) the kernel knows each
object's last snapshot on each CPU (its baseline).  A call's entry event whose snapshot
equals that baseline is not sent at once: it is kept as the thread's *deferred entry*
(one per thread, ``ctracer_deferred``).  Then:

* the call's exit has the same snapshot as the deferred entry: the call changed
  nothing, and it is *folded*: counted, with its duration, in ``ctracer_folds_<g>``
  under (object, function-table row, the row and object of the traced call it was made
  in); neither event is written;
* anything else the thread sends first (the exit of a call that changed the object, the
  entry of a call made inside this one, an exit that does not match) sends the deferred
  entry before it, with its original time: only calls with no traced call inside them
  are folded, so a call that is written keeps every traced call it made either written
  or counted on the edge from it, and the thread's events stay in their order.

A folded row also holds ``since_ns``, the time of its object's last written event
(``ctracer_written``): the reader places it on the lifetime of its address that event
is on (an address reused by a new object starts with a written event: its creation
changed it).

The fold maps are two (``g`` = 0, 1), chosen by ``ctracer_fold_gen``: the recorder
switches programs to the other map, waits a period, then reads and empties the idle one
(`ctracer.record.folds`), so no program adds to a row being read.  A fold that finds
its map full is not folded: its events are written (``ctracer_fold_refused`` counts).

Only the snapshot's words are compared (the words of the event from the snapshot's
first 8-byte word on; a word it shares with the command name's tail counts too).
"""

from __future__ import annotations

from ctracer.probes.ctext import BASELINE_CAPACITY
from ctracer.event import DELTA_FIXED, FLAG_NO_ENTRY, FLAG_READ_FAILED, PHASE_ENTRY, \
    PHASE_EXIT, Layout, mini_offset

#: the words `--calls` accepts: ``all`` writes every call's entry and exit; ``changes``
#: folds calls that changed nothing into counts
CALLS_MODES = ("all", "changes")

#: (object, function, caller) rows a fold map holds; a fold finding it full is written
FOLD_CAPACITY = 65536

#: threads whose deferred entry the kernel holds at once (an LRU: one pushed out is a
#: call whose exit is written with no entry)
DEFERRED_CAPACITY = 16384

#: how deep a thread's traced calls are remembered, for the caller of a folded call
FRAME_CAPACITY = 65536


def check_calls(mode: str) -> str:
    """``mode`` when `CALLS_MODES` has it; ValueError (one line) otherwise."""
    if mode not in CALLS_MODES:
        raise ValueError(f"--calls takes {' or '.join(CALLS_MODES)}, not {mode!r}")
    return mode


def fold_maps() -> list[str]:
    """The maps of folding (after ``struct ctracer_event`` and the compact maps)."""
    return ["struct ctracer_fold_key {",
            "\tu64 object;",
            "\tu64 caller_object;  /* the object of the traced call it was made in */",
            "\tu32 function_id;",
            "\tu32 caller_id;      /* that call's row (0: none) */",
            "\tu64 since_ns;       /* the time of the object's last written event */",
            "};",
            "struct ctracer_fold {",
            "\tu64 calls;",
            "\tu64 total_ns;",
            "\tu64 max_ns;",
            "\tu64 first_ns;  /* the first folded call's entry */",
            "\tu64 last_ns;   /* the last one's exit */",
            "};",
            "struct ctracer_frame_key {",
            "\tu32 tid;",
            "\tu32 depth;",
            "};",
            "struct ctracer_frame {",
            "\tu64 object;",
            "\tu64 object2;  /* a second method's object (sk_clone: the new and the old) */",
            "\tu32 function_id;",
            "\tu32 pad;",
            "};",
            f"BPF_HASH(ctracer_folds_0, struct ctracer_fold_key, struct ctracer_fold, "
            f"{FOLD_CAPACITY});",
            f"BPF_HASH(ctracer_folds_1, struct ctracer_fold_key, struct ctracer_fold, "
            f"{FOLD_CAPACITY});",
            "/* the fold's key and a new row, built here: the kernel functions' programs",
            "   have no stack left for them (512 bytes) */",
            "struct ctracer_fold_work {",
            "\tstruct ctracer_fold_key k;",
            "\tstruct ctracer_fold fresh;",
            "};",
            "BPF_PERCPU_ARRAY(ctracer_fold_work, struct ctracer_fold_work, 1);",
            "BPF_ARRAY(ctracer_fold_gen, u32, 1);",
            "BPF_PERCPU_ARRAY(ctracer_fold_refused, u64, 1);",
            f'BPF_TABLE("lru_hash", u64, u64, ctracer_written, {BASELINE_CAPACITY});',
            f'BPF_TABLE("lru_hash", u32, struct ctracer_event, ctracer_deferred, '
            f"{DEFERRED_CAPACITY});",
            f'BPF_TABLE("lru_hash", struct ctracer_frame_key, struct ctracer_frame, '
            f"ctracer_frames, {FRAME_CAPACITY});"]


def frame_statements(tid: str, depth: str, function_id: str, obj: str,
                     obj2: str = "0", in_buffer: str | None = None) -> list[str]:
    """C statements remembering the traced call at ``depth`` of thread ``tid`` (its
    first row and the objects of its first two methods), for the calls folded inside
    it; the key and the value built on the stack, or in ``in_buffer``'s ``fk`` and
    ``fr`` (a pointer to a per-CPU buffer: `ctracer.probes.kfunctions.uses_scratch`)."""
    if in_buffer:
        return [f"{in_buffer}->fk.tid = {tid};",
                f"{in_buffer}->fk.depth = {depth};",
                f"{in_buffer}->fr.object = {obj};",
                f"{in_buffer}->fr.object2 = {obj2};",
                f"{in_buffer}->fr.function_id = {function_id};",
                f"{in_buffer}->fr.pad = 0;",
                f"ctracer_frames.update(&{in_buffer}->fk, &{in_buffer}->fr);"]
    return ["{",
            f"\tstruct ctracer_frame_key fk = {{ .tid = {tid}, .depth = {depth} }};",
            f"\tstruct ctracer_frame fr = {{ .object = {obj}, .object2 = {obj2}, "
            f".function_id = {function_id} }};",
            "\tctracer_frames.update(&fk, &fr);",
            "}"]


_FOLD_INTO = """\
static __always_inline int ctracer_fold_into_%(g)d(struct ctracer_fold_work *fw, u64 began,
						 u64 ended)
{
	struct ctracer_fold *v = ctracer_folds_%(g)d.lookup(&fw->k);
	u64 took = ended - began;

	if (!v) {
		__builtin_memset(&fw->fresh, 0, sizeof(fw->fresh));
		fw->fresh.first_ns = began;
		ctracer_folds_%(g)d.insert(&fw->k, &fw->fresh);
		v = ctracer_folds_%(g)d.lookup(&fw->k);
		if (!v)
			return 0;  /* full */
	}
	__sync_fetch_and_add(&v->calls, 1);
	__sync_fetch_and_add(&v->total_ns, took);
	if (took > v->max_ns)
		v->max_ns = took;
	if (ended > v->last_ns)
		v->last_ns = ended;
	return 1;
}
"""

_FUNCTIONS = """\
#define CTRACER_SNAPSHOT_WORD %(snap_word)d  /* the event's first word holding snapshot bytes */

/* Whether words CTRACER_SNAPSHOT_WORD.. of event ev equal the same words of event other. */
static __always_inline int ctracer_same_snapshot(const u64 *ev, const u64 *other)
{
	u64 d = 0;

#pragma clang loop unroll(full)
	for (int i = CTRACER_SNAPSHOT_WORD; i < CTRACER_WORDS; i++)
		d |= ev[CTRACER_DELTA_FIXED / 8 + i] ^ other[CTRACER_DELTA_FIXED / 8 + i];
	return d == 0;
}

/* Whether the snapshot of event ev equals object's baseline on this CPU (the last event
   this CPU sent for it, still valid). */
static __always_inline int ctracer_as_baseline(const u64 *ev, u64 object)
{
	struct ctracer_baseline_key key = {.object = object,
					   .cpu = bpf_get_smp_processor_id()};
	struct ctracer_baseline *b = ctracer_baselines.lookup(&key);
	u64 d = 0;

	if (!b || !b->valid || !ctracer_baseline_ours(b, &key))
		return 0;
#pragma clang loop unroll(full)
	for (int i = CTRACER_SNAPSHOT_WORD; i < CTRACER_WORDS; i++)
		d |= ev[CTRACER_DELTA_FIXED / 8 + i] ^ b->w[i];
	return d == 0;
}

%(fold_into)s
/* Count the call whose entry was deferred (entry) and whose exit is exit in the fold map
   the recorder is not reading; 0 when that map is full (the call is then written). */
static __always_inline int ctracer_fold(struct ctracer_event *entry, struct ctracer_event *exit)
{
	u32 zero = 0;
	struct ctracer_fold_work *fw = ctracer_fold_work.lookup(&zero);
	u32 *gen = ctracer_fold_gen.lookup(&zero);
	u64 *since;
	int folded;

	if (!fw)
		return 0;
	__builtin_memset(&fw->k, 0, sizeof(fw->k));
	fw->k.object = exit->h.object;
	fw->k.function_id = exit->h.function_id;
	since = ctracer_written.lookup(&fw->k.object);
	if (since)
		fw->k.since_ns = *since;
	if (exit->h.depth) {
		struct ctracer_frame_key fk = { .tid = exit->h.tid, .depth = exit->h.depth - 1 };
		struct ctracer_frame *caller = ctracer_frames.lookup(&fk);

		if (caller) {
			fw->k.caller_id = caller->function_id;
			fw->k.caller_object = caller->object2 == fw->k.object ? caller->object2
									       : caller->object;
		}
	}
	if (gen && (*gen & 1))
		folded = ctracer_fold_into_1(fw, entry->h.ts_ns, exit->h.ts_ns);
	else
		folded = ctracer_fold_into_0(fw, entry->h.ts_ns, exit->h.ts_ns);
	if (!folded) {
		u64 *refused = ctracer_fold_refused.lookup(&zero);
		if (refused)
			(*refused)++;
	}
	return folded;
}

/* The object's event at time ts was written: folded calls after it are its lifetime's. */
static __always_inline void ctracer_written_at(u64 object, u64 ts)
{
	u64 *was = ctracer_written.lookup(&object);

	if (!was || *was < ts)
		ctracer_written.update(&object, &ts);
}

/* The event just built in w->e at the outermost level, with folding: 1 when it was
   deferred or folded (nothing to send now), 0 when the caller sends it.  A deferred
   entry of the thread that this event does not fold is sent first. */
static __always_inline int ctracer_defer_or_fold(struct ctracer_work *w, u32 tid)
{
	struct ctracer_event *e = &w->e;
	struct ctracer_event *pending = ctracer_deferred.lookup(&tid);

	if (pending) {
		if (e->h.phase == %(exit)d && pending->h.function_id == e->h.function_id &&
		    pending->h.depth == e->h.depth && pending->h.object == e->h.object &&
		    !(e->h.flags & (%(read_failed)d | %(no_entry)d)) &&
		    ctracer_same_snapshot((const u64 *)e, (const u64 *)pending) &&
		    ctracer_fold(pending, e)) {
			ctracer_deferred.delete(&tid);
			return 1;
		}
		ctracer_send_from(w, (const u64 *)pending, pending->h.object, 1);
		ctracer_written_at(pending->h.object, pending->h.ts_ns);
		ctracer_deferred.delete(&tid);
	}
	if (e->h.phase == %(entry)d && e->h.object && !(e->h.flags & %(read_failed)d) &&
	    ctracer_as_baseline((const u64 *)e, e->h.object) &&
	    ctracer_deferred.update(&tid, e) == 0)
		return 1;
	return 0;
}
"""


def snapshot_word(mini: Layout, nargs: int = 0) -> int:
    """The first delta word (counted after `DELTA_FIXED`) holding snapshot bytes."""
    return (mini_offset(mini, nargs) - DELTA_FIXED) // 8


def fold_functions(mini: Layout, nargs: int = 0) -> str:
    """``ctracer_defer_or_fold(w, tid)`` and what it needs (after `send_function` and
    `fold_maps`)."""
    return _FUNCTIONS % {
        "snap_word": snapshot_word(mini, nargs),
        "fold_into": "\n".join(_FOLD_INTO % {"g": g} for g in (0, 1)),
        "entry": PHASE_ENTRY, "exit": PHASE_EXIT,
        "read_failed": FLAG_READ_FAILED, "no_entry": FLAG_NO_ENTRY}
