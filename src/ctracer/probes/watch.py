"""The BPF program a write breakpoint runs (``--watch``): one record per trapped write.

The program is of type perf_event; the recorder attaches it to every breakpoint it arms
(`ctracer.record.breakpoints`).  At a trap the write has happened, so it reads the value
now at the armed address (``ctx->addr``), the instruction pointer (just after the
writing instruction) and the call stack, and puts a `ctracer.write_event.WRITE` record
into its own ring buffer, ``ctracer_writes``; a full ring counts in
``ctracer_writes_lost``.  Built from constants only, no user text.
"""

from __future__ import annotations

from ctracer import write_event

#: bytes of the writes' ring buffer (a power of two pages)
WRITES_RING_BYTES = 1 << 20


def c_text(kernel: bool) -> str:
    """The program's C: ``kernel``: the watched addresses are the kernel's (values read
    with bpf_probe_read_kernel, kernel stacks), else a process's."""
    read = "bpf_probe_read_kernel" if kernel else "bpf_probe_read_user"
    stack_flags = "0" if kernel else "BPF_F_USER_STACK"
    return f"""
#include <uapi/linux/bpf_perf_event.h>
{write_event.c_definition()}
BPF_RINGBUF_OUTPUT(ctracer_writes, {WRITES_RING_BYTES // 4096});
BPF_PERCPU_ARRAY(ctracer_writes_lost, u64, 1);

int ctracer_on_write(struct bpf_perf_event_data *ctx)
{{
	struct ctracer_write_record *r;
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 zero = 0;
	long n;

	r = ctracer_writes.ringbuf_reserve(sizeof(*r));
	if (!r) {{
		u64 *lost = ctracer_writes_lost.lookup(&zero);
		if (lost)
			(*lost)++;
		return 0;
	}}
	r->w.ts_ns = bpf_ktime_get_ns();
	r->w.addr = ctx->addr;
	r->w.ip = PT_REGS_IP(&ctx->regs);
	r->w.value = 0;
	r->w.flags = 0;
	if ({read}(&r->w.value, sizeof(r->w.value), (void *)ctx->addr))
		r->w.flags |= {write_event.WRITE_READ_FAILED};
	r->w.cpu = bpf_get_smp_processor_id();
	r->w.pid = pid_tgid >> 32;
	r->w.tid = (u32)pid_tgid;
	n = bpf_get_stack(ctx, r->stack, sizeof(r->stack), {stack_flags});
	r->w.frames = n > 0 ? (u64)n >> 3 : 0;
	ctracer_writes.ringbuf_submit(r, BPF_RB_NO_WAKEUP);  /* the recorder polls */
	return 0;
}}
"""
