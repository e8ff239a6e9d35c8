#!/usr/bin/env python3
"""Whether ctracer's ring buffer reader keeps up with 2M compact events a second, and its
CPU time per event against a C consumer of the same ring (libbpf's), in one run.  Needs
root, gcc and libbpf's headers (Debian's libbpf-dev, `scripts/setup.sh`); run with the
project's venv, under the bench lock:

    flock LOCK .venv/bin/python bench/bench_reader.py [--rate 2000000] [--seconds 3]
        [--also-rates 1000000,500000] [--rounds 2] [--profile] [--numpy]
        [--reader-priority realtime|normal]

1. A template: ``ctracer trace struct sock`` of the bundled loopback workload
   (samples/tcp), whose spool holds compact ring records as the ring held them; a run of
   ``--templates`` consecutive records from its middle goes into a BPF array.
2. The producer: a BPF program on the ``syscalls:sys_enter_getppid`` tracepoint, hit by a
   small C program (built here with gcc) calling getppid() in a loop, pinned to one CPU,
   paced (the calls due each millisecond, then a sleep) or as fast as it can.  Each hit
   copies the next ``--per-hit`` template records into the ring with
   ``bpf_ringbuf_output``, waking the reader as ctracer's probes do (once every
   `ctracer.probes.ctext.wake_every` records), and counts in the kernel what it produced
   and what the full ring refused (lost).  Its own rate is measured first, into a ring
   big enough that nothing is lost and nobody reads: it must reach ``--rate`` records a
   second.
3. On a ring of ctracer's default size (16 MB), the producer paced at ``--rate`` (and at
   each of ``--also-rates``) for ``--seconds``, then let loose, read by
   * the C consumer (the anchor, built here with gcc against libbpf): ``ring_buffer__new``
     and ``ring_buffer__poll``, every record copied with its ring header into a buffer
     written to a file in 1 MB writes: the bytes ctracer's trace file keeps;
   * ctracer's reader: the recorder's own loop (`ctracer.record.recorder._poll_until_done`
     over a `ctracer.record.bpf_runtime.ProbeSession` whose ring is a
     `ctracer.record.ringbuf.MappedRing` of whole records found by the C walk where
     scripts/setup.sh built it (``--numpy``: with numpy and the template's
     `ctracer.deltas.RecordShape`, the fallback), copied straight into the rows of the recorder's
     `EventSink`, which counts events and objects), `TraceWriter.add_raw` committing
     them to a trace file with the template's meta.
   Both readers run as ctracer reads while recording: at realtime priority (SCHED_FIFO 1,
   `ctracer.record.priority`; ``--reader-priority normal``: both at normal priority).
   For each: records written, lost, events/s, the CPU time (user + system, the whole
   process: ctracer's includes the writer's checkpoint thread) per record, and how long
   its threads waited for a CPU (other work on the machine), for ctracer's the most it
   found waiting in the ring at a take; then ctracer's CPU per
   record against the C consumer's at the same rate (goal: at most 5x).  ``--profile``
   adds a paced run of ctracer's reader under cProfile, timed by the reading thread's
   CPU time.

Exits non-zero when the producer cannot reach ``--rate``, when a consumer's count differs
from what the kernel says it produced minus what it lost, when the C consumer loses
anything paced or ctracer's reader loses anything at ``--rate`` (the goal: 0 lost), or
when the two consumers wrote different bytes for the same records.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "src"))

from ctracer.deltas import RecordShape, offsets, record_end  # noqa: E402
from ctracer.event import RING_HEADER_BYTES, Layout, event_size  # noqa: E402
from ctracer.probes import ctext  # noqa: E402
from ctracer.record import bpf_runtime, recorder, ringbuf  # noqa: E402
from ctracer.record import priority  # noqa: E402
from ctracer.record.priority import ReaderPriority  # noqa: E402
from ctracer.tracefile import TraceWriter  # noqa: E402
from ctracer.tracefile.format import now_iso  # noqa: E402

TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")
CTRACER = [sys.executable, "-m", "ctracer"]
DEFAULT_RING_MB = 16
#: records the producer writes when measured alone (about 300 MB of ring)
ALONE_RECORDS = 3_000_000
#: `--numpy`: ctracer's reader finds the records with numpy, not the C walk
NUMPY_FINDER = False
#: `--reader-priority`: how both consumers' reading threads are scheduled
READER_PRIORITY = "realtime"
#: meta entries a recording writes for itself, not copied from the template
OWN_META = {"schema_version", "state", "recorder_pid", "trace_id", "events", "lost_events",
            "end_time", "end_monotonic_ns", "stopped_by", "detach_seconds", "start_time",
            "start_monotonic_ns", "pid", "command", "warnings", "probe_misses",
            "kernel_symbols"}

TRIGGER_C = r"""
/* Calls getppid() HITS times, at RATE calls a second (0: as fast as it can), and
   writes the seconds that took to the file OUT.  Paced, it makes the calls due every
   millisecond at once, then sleeps until the next one (no CPU spent waiting: the
   machine's other CPU is the reader's). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TICK_NS 1000000L

static double seconds(const struct timespec *t)
{
	return t->tv_sec + t->tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	struct timespec start, tick, end;

	if (argc != 4) {
		fprintf(stderr, "usage: trigger HITS RATE OUT\n");
		return 2;
	}
	long hits = atol(argv[1]);
	double rate = atof(argv[2]);

	clock_gettime(CLOCK_MONOTONIC, &start);
	tick = start;
	for (long done = 0, tick_no = 1; done < hits; tick_no++) {
		long due = rate > 0 ? (long)(rate * tick_no * (TICK_NS * 1e-9)) : hits;

		if (due > hits)
			due = hits;
		for (; done < due; done++)
			syscall(SYS_getppid);
		if (rate > 0) {
			tick.tv_nsec += TICK_NS;
			if (tick.tv_nsec >= 1000000000L) {
				tick.tv_nsec -= 1000000000L;
				tick.tv_sec++;
			}
			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &tick, NULL);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	FILE *out = fopen(argv[3], "w");

	if (!out || fprintf(out, "%.9f\n", seconds(&end) - seconds(&start)) < 0 || fclose(out))
		return 1;
	return 0;
}
"""

CONSUMER_C = r"""
/* The anchor: libbpf's consumer of the ring buffer map FD, writing every record as
   the ring holds it (its 8-byte header, the event, the padding) to the file OUT, in
   1 MB writes.  Prints "ready" once it reads; on SIGUSR1 it takes what is left and
   prints: records, bytes, user and system CPU seconds, seconds spent runnable but
   waiting for a CPU, minor page faults. */
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static volatile sig_atomic_t stopping;
static char buf[1 << 20];
static size_t used;
static int out;
static unsigned long long records, bytes;

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

static void flush_buf(void)
{
	size_t at = 0;

	while (at < used) {
		ssize_t n = write(out, buf + at, used - at);

		if (n < 0) {
			perror("consumer: write");
			exit(1);
		}
		at += n;
	}
	bytes += used;
	used = 0;
}

static int on_record(void *ctx, void *data, size_t size)
{
	size_t n = (size + 8 + 7) & ~(size_t)7;

	(void)ctx;
	if (used + n > sizeof(buf))
		flush_buf();
	memcpy(buf + used, (char *)data - 8, n);
	used += n;
	records++;
	return 0;
}

int main(int argc, char **argv)
{
	struct sigaction stop = { .sa_handler = on_stop };
	struct ring_buffer *rb;
	struct rusage ru;
	unsigned long long on_cpu = 0, waited = 0;
	FILE *sched;
	int err;

	if (argc != 3) {
		fprintf(stderr, "usage: consumer MAP_FD OUT\n");
		return 2;
	}
	out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (out < 0) {
		perror("consumer: open");
		return 1;
	}
	sigaction(SIGUSR1, &stop, NULL);
	rb = ring_buffer__new(atoi(argv[1]), on_record, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "consumer: ring_buffer__new: %s\n", strerror(errno));
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	while (!stopping) {
		err = ring_buffer__poll(rb, 50);
		if (err < 0 && err != -EINTR) {
			fprintf(stderr, "consumer: ring_buffer__poll: %s\n", strerror(-err));
			return 1;
		}
	}
	while ((err = ring_buffer__consume(rb)) > 0)
		;
	if (err < 0) {
		fprintf(stderr, "consumer: ring_buffer__consume: %s\n", strerror(-err));
		return 1;
	}
	flush_buf();
	getrusage(RUSAGE_SELF, &ru);
	sched = fopen("/proc/self/schedstat", "r");
	if (!sched || fscanf(sched, "%llu %llu", &on_cpu, &waited) != 2)
		waited = 0;
	if (sched)
		fclose(sched);
	printf("%llu %llu %.6f %.6f %.6f %ld\n", records, bytes,
	       ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6,
	       ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6, waited * 1e-9,
	       ru.ru_minflt);
	ring_buffer__free(rb);
	return close(out) ? 1 : 0;
}
"""

PRODUCER_BPF = r"""
#define TEMPLATES %(templates)d   /* a power of two */
#define MAX_EVENT %(max_event)d   /* a power of two above every template's length */
#define PER_HIT %(per_hit)d
#define WAKE_EVERY %(wake_every)d

struct template {
	u32 len;
	u32 pad;
	u8 data[MAX_EVENT];
};

BPF_RINGBUF_OUTPUT(ctracer_events, %(pages)d);
BPF_ARRAY(bench_templates, struct template, TEMPLATES);
BPF_ARRAY(bench_target, u32, 1);
BPF_PERCPU_ARRAY(bench_cursor, u32, 1);
BPF_PERCPU_ARRAY(bench_produced, u64, 1);
BPF_PERCPU_ARRAY(ctracer_lost, u64, 1);
BPF_PERCPU_ARRAY(ctracer_unwoken, u32, 1);

/* Each getppid() of the trigger (syscalls:sys_enter_getppid): the next PER_HIT
   template records into the ring, waking the reader once every WAKE_EVERY records as
   ctracer's probes do.  (&t->data[0]: bcc's rewriter fails on an array argument.) */
int bench_on_getppid(void *ctx)
{
	u32 zero = 0;
	u32 *target = bench_target.lookup(&zero);
	u32 *cursor = bench_cursor.lookup(&zero);
	u32 *unwoken = ctracer_unwoken.lookup(&zero);
	u64 *produced = bench_produced.lookup(&zero);
	u64 *lost = ctracer_lost.lookup(&zero);

	if (!target || !cursor || !unwoken || !produced || !lost)
		return 0;
	if (*target != bpf_get_current_pid_tgid() >> 32)
		return 0;
#pragma unroll
	for (int i = 0; i < PER_HIT; i++) {
		u32 k = (*cursor + i) & (TEMPLATES - 1);
		struct template *t = bench_templates.lookup(&k);
		u64 flags = BPF_RB_NO_WAKEUP;
		u32 len;

		if (!t)
			continue;
		len = t->len & (MAX_EVENT - 1);   /* MAX_EVENT: a power of two */
		if (++*unwoken >= WAKE_EVERY) {
			*unwoken = 0;
			flags = BPF_RB_FORCE_WAKEUP;
		}
		(*produced)++;
		if (ctracer_events.ringbuf_output(&t->data[0], len, flags))
			(*lost)++;
	}
	*cursor += PER_HIT;
	return 0;
}
"""


class BenchFailure(Exception):
    """What makes the bench exit non-zero, said in one line."""


@dataclass
class Template:
    meta: dict
    mini: Layout
    nargs: int
    events: list[bytes]       # each record's event, without its ring header or padding

    @property
    def ring_bytes_mean(self) -> float:
        return float(np.mean([ringbuf.record_bytes(len(e)) for e in self.events]))


def record_template(out: str, connections: int, messages: int) -> None:
    r = subprocess.run(CTRACER + ["trace", "struct", "sock", "-q", "-o", out, "--", TCPLOOP,
                                  "--connections", str(connections), "--messages",
                                  str(messages)],
                       capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise BenchFailure(f"recording the template failed: {r.stderr.strip()}")


def load_template(path: str, count: int) -> Template:
    """``count`` consecutive submitted records from the middle of a compact trace."""
    db = sqlite3.connect(path)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    if meta.get("event_encoding") != "compact":
        raise BenchFailure(f"the template {path} is not a compact trace")
    mini = Layout.from_json(meta["mini_layout"])
    nargs = int(meta.get("event_nargs") or 0)
    shape = RecordShape(mini, nargs)
    events = []
    for (raw,) in db.execute("SELECT raw FROM spool ORDER BY seq"):
        starts, kept = offsets(raw, shape)
        lengths = np.frombuffer(raw, "<u4")[(starts - RING_HEADER_BYTES) // 4] & 0x3fffffff
        events += [raw[s:s + n] for s, n, k in zip(starts.tolist(), lengths.tolist(),
                                                    kept.tolist()) if k]
    db.close()
    if len(events) < count:
        raise BenchFailure(f"the template holds {len(events)} records, fewer than {count}")
    middle = (len(events) - count) // 2
    return Template(meta, mini, nargs, events[middle:middle + count])


def build(c_text: str, out: str, libs: list[str]) -> None:
    source = out + ".c"
    with open(source, "w") as f:
        f.write(c_text)
    r = subprocess.run(["gcc", "-O2", "-Wall", "-o", out, source, *libs],
                       capture_output=True, text=True)
    if r.returncode:
        raise BenchFailure(f"gcc could not build {os.path.basename(out)}: "
                           f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")


class Producer:
    """The producer's BPF program on a ring of ``ring_bytes``, attached, its template
    array filled."""

    def __init__(self, template: Template, ring_bytes: int, per_hit: int):
        import bcc
        bpf_runtime.prepare()
        self.template = template
        self.ring_bytes = ring_bytes
        self.per_hit = per_hit
        full = event_size(template.mini, template.nargs)
        max_event = 1 << max(len(e) for e in template.events).bit_length()
        text = PRODUCER_BPF % dict(
            templates=len(template.events), max_event=max_event, per_hit=per_hit,
            wake_every=ctext.wake_every(ring_bytes, full, os.cpu_count() or 1),
            pages=ring_bytes // mmap.PAGESIZE)
        self.bpf = bcc.BPF(text=text.encode())
        self.bpf.attach_tracepoint(tp=b"syscalls:sys_enter_getppid", fn_name=b"bench_on_getppid")
        table = self.bpf[b"bench_templates"]
        for i, event in enumerate(template.events):
            leaf = table.Leaf()
            leaf.len = len(event)
            ctypes.memmove(leaf.data, event, len(event))
            table[ctypes.c_int(i)] = leaf
        self.map_fd = self.bpf[b"ctracer_events"].map_fd

    def reset(self) -> None:
        """Template cursor and counters back to 0: every run writes the same records."""
        for name in (b"bench_cursor", b"bench_produced", b"ctracer_lost", b"ctracer_unwoken"):
            table = self.bpf[name]
            table[ctypes.c_int(0)] = table.Leaf()

    def target(self, pid: int) -> None:
        self.bpf[b"bench_target"][ctypes.c_int(0)] = ctypes.c_uint32(pid)

    def counts(self) -> tuple[int, int]:
        """Records produced (tried) and lost (refused by the full ring), in the kernel."""
        produced = sum(self.bpf[b"bench_produced"][ctypes.c_int(0)])
        lost = sum(self.bpf[b"ctracer_lost"][ctypes.c_int(0)])
        return int(produced), int(lost)

    def discard(self) -> None:
        """Give every record in the ring back unread (the consumer position moved to the
        producer's)."""
        page = mmap.PAGESIZE
        consumer = mmap.mmap(self.map_fd, page, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        producer = mmap.mmap(self.map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        consumer[0:8] = producer[0:8]
        consumer.close()
        producer.close()

    def close(self) -> None:
        self.bpf.cleanup()


class Trigger:
    """The trigger program (``hits`` calls, ``hit_rate`` a second or 0: as fast as it
    can) started held at a gate, pinned to ``cpu``, so the producer can be told its
    process id before its first call."""

    def __init__(self, exe: str, hits: int, hit_rate: float, work: str, cpu: int):
        self.result = os.path.join(work, "trigger.out")
        if os.path.exists(self.result):
            os.unlink(self.result)
        self.gated = recorder.GatedCommand([exe, str(hits), repr(hit_rate), self.result])
        os.sched_setaffinity(self.gated.pid, {cpu})
        self.pid = self.gated.pid

    def wait(self) -> None:
        if self.gated.poll() is None:
            _, status = os.waitpid(self.pid, 0)
            self.gated.returncode = os.waitstatus_to_exitcode(status)

    def seconds(self) -> float:
        """The seconds its calls took, once it has exited."""
        self.wait()
        if self.gated.returncode:
            raise BenchFailure(f"the trigger failed ({self.gated.returncode})")
        with open(self.result) as f:
            return float(f.read())


@dataclass
class Run:
    who: str
    paced: bool
    produced: int
    lost: int
    written: int
    written_bytes: int
    trigger_s: float
    wall_s: float
    user_s: float
    sys_s: float
    #: seconds its threads were runnable but waited for a CPU (other work on the machine)
    waited_s: float
    #: minor page faults (memory the process touched for the first time)
    faults: int
    thread_cpu_s: Optional[float] = None
    #: the most the reader found waiting in the ring at a take, a fraction of the
    #: ring (ctracer's only)
    fullest: Optional[float] = None

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s

    @property
    def produced_rate(self) -> float:
        return self.produced / self.trigger_s

    @property
    def written_rate(self) -> float:
        return self.written / self.wall_s

    @property
    def cpu_ns(self) -> float:
        return self.cpu_s / max(self.written, 1) * 1e9

    def line(self) -> str:
        thread = (f" (the reading thread {self.thread_cpu_s / max(self.written, 1) * 1e9:.0f} "
                  f"ns)") if self.thread_cpu_s is not None else ""
        return (f"{self.who}, {'paced' if self.paced else 'flat out'}: produced "
                f"{self.produced:,} ({self.produced_rate:,.0f}/s), written {self.written:,} "
                f"({self.written_rate:,.0f}/s), lost {self.lost:,} "
                f"({100 * self.lost / max(self.produced, 1):.1f}%); CPU "
                f"{self.cpu_s:.2f} s (user {self.user_s:.2f}, system {self.sys_s:.2f}) = "
                f"{self.cpu_ns:.0f} ns a record{thread}; {self.faults:,} page faults; "
                f"waited for a CPU {self.waited_s:.2f} s in {self.wall_s:.2f} s"
                + (f"; the ring at its fullest {100 * self.fullest:.1f}%"
                   if self.fullest is not None else ""))


def _cpu(usage) -> float:
    return usage.ru_utime + usage.ru_stime


def _waited() -> float:
    """Seconds this process's threads have been runnable but waiting for a CPU."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total * 1e-9


def producer_alone(producer: Producer, trigger_exe: str, work: str, cpu: int,
                   records: int) -> tuple[int, int, float]:
    """The producer into a ring nobody reads, big enough for every record: produced,
    lost, the trigger's seconds."""
    producer.reset()
    hits = records // producer.per_hit
    trigger = Trigger(trigger_exe, hits, 0, work, cpu)
    producer.target(trigger.pid)
    trigger.gated.release()
    seconds = trigger.seconds()
    produced, lost = producer.counts()
    producer.discard()
    return produced, lost, seconds


def c_consumer_run(producer: Producer, consumer_exe: str, trigger_exe: str, work: str,
                   cpu: int, hits: int, hit_rate: float) -> tuple[Run, str]:
    out = os.path.join(work, "c-consumer.bin")
    proc = subprocess.Popen([consumer_exe, str(producer.map_fd), out],
                            pass_fds=[producer.map_fd], stdout=subprocess.PIPE, text=True)
    try:
        if READER_PRIORITY == "realtime":   # as ctracer's reading thread runs
            os.sched_setscheduler(proc.pid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                                  os.sched_param(priority.REALTIME_PRIORITY))
        if proc.stdout.readline().strip() != "ready":
            raise BenchFailure("the C consumer did not start")
        producer.reset()
        trigger = Trigger(trigger_exe, hits, hit_rate, work, cpu)
        producer.target(trigger.pid)
        start = time.perf_counter()
        trigger.gated.release()
        trigger.wait()
        proc.send_signal(signal.SIGUSR1)
        text, _ = proc.communicate(timeout=120)
        wall = time.perf_counter() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode:
        raise BenchFailure(f"the C consumer failed ({proc.returncode})")
    records, nbytes, user, system, waited, faults = text.split()
    produced, lost = producer.counts()
    run = Run("C consumer (libbpf)", hit_rate > 0, produced, lost, int(records), int(nbytes),
              trigger.seconds(), wall, float(user), float(system), float(waited),
              int(faults))
    return run, out


def ctracer_run(producer: Producer, trigger_exe: str, work: str, cpu: int, hits: int,
                hit_rate: float, profile: bool = False) -> tuple[Run, str]:
    """ctracer's reader as `ctracer.record.recorder.record` runs it, on the producer's
    ring."""
    template = producer.template
    out = os.path.join(work, "ctracer.ctrace")
    for stale in (out, out + ".old"):
        if os.path.exists(stale):
            os.unlink(stale)
    program = SimpleNamespace(mini=template.mini, nargs=template.nargs, compact=True,
                              ring_bytes=producer.ring_bytes, filtered=False)
    writer = TraceWriter(out)
    writer.set_meta(**{k: v for k, v in template.meta.items() if k not in OWN_META},
                    start_time=now_iso(), start_monotonic_ns=time.monotonic_ns())
    writer.expect_raw()
    writer.checkpoint_in_background()
    counts = recorder.ProgressCounts()
    sink = recorder.EventSink(program, writer, counts)
    session = bpf_runtime.ProbeSession(program, None, sink)
    # the producer's program stands for the probes: its ctracer_lost counts what the
    # ring refused, as the probes' does, and the session reads its ring
    session.bpf = producer.bpf
    session._ring = ringbuf.MappedRing(
        producer.map_fd, producer.ring_bytes, event_size(template.mini, template.nargs),
        whole=True, shape=RecordShape(template.mini, template.nargs))
    if NUMPY_FINDER:
        session._ring.native = None
    profiler = None
    if profile:
        import cProfile
        profiler = cProfile.Profile(time.thread_time)   # CPU time, not waits
    try:
        producer.reset()
        trigger = Trigger(trigger_exe, hits, hit_rate, work, cpu)
        producer.target(trigger.pid)
        watch = recorder.MappingWatch(session, None, followed=False)
        before = resource.getrusage(resource.RUSAGE_SELF)
        waited_before = _waited()
        thread_before = resource.getrusage(resource.RUSAGE_THREAD)
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        reading = ReaderPriority(READER_PRIORITY)   # as `recorder.record` reads
        reading.begin()
        try:
            with recorder.StopRequest(session) as stop:
                trigger.gated.release()
                stopped_by = recorder._poll_until_done(
                    session, counts, recorder.Progress(enabled=False), trigger.gated, None,
                    None, time.monotonic(), stop, watch)
            session.drain()
            stopped_by = recorder._commit(sink, stopped_by)
        finally:
            reading.end()
        fullest = session._ring.fullest / producer.ring_bytes
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - start
        thread_cpu = _cpu(resource.getrusage(resource.RUSAGE_THREAD)) - _cpu(thread_before)
        waited = _waited() - waited_before   # the checkpoint thread's waits in it
        after = resource.getrusage(resource.RUSAGE_SELF)
        produced, lost = producer.counts()
        writer.set_meta(end_time=now_iso(), end_monotonic_ns=time.monotonic_ns(),
                        lost_events=lost, stopped_by=stopped_by,
                        events=writer.events_written + writer.events_spooled)
        written = writer.events_spooled
    finally:
        writer.close()
        session._ring.close()
        session._ring = None
    if profiler:
        import pstats
        print("cProfile of ctracer's reader, the reading thread's CPU time (cumulative, then "
              "own time; top 30):")
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(30)
    db = sqlite3.connect(out)
    nbytes = db.execute("SELECT coalesce(sum(length(raw)), 0) FROM spool").fetchone()[0]
    db.close()
    if counts.events != written:
        raise BenchFailure(f"ctracer's sink counted {counts.events:,} events, the trace file "
                           f"holds {written:,}")
    return Run("ctracer reader", hit_rate > 0, produced, lost, written, nbytes, trigger.seconds(),
               wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime,
               waited, after.ru_minflt - before.ru_minflt, thread_cpu, fullest), out


def check_counts(run: Run, fatal_loss: bool) -> list[str]:
    """What is wrong with a run: a count that differs from the kernel's, and with
    ``fatal_loss`` any record lost."""
    problems = []
    if run.written != run.produced - run.lost:
        problems.append(f"{run.who}: wrote {run.written:,} records, the kernel produced "
                        f"{run.produced:,} and lost {run.lost:,}")
    if fatal_loss and run.lost:
        problems.append(f"{run.who}: lost {run.lost:,} of {run.produced:,} records at "
                        f"{run.produced_rate:,.0f} records/s")
    return problems


def masked_records(data: bytes, limit: int) -> bytes:
    """The whole ring records in the first ``limit`` bytes of ``data``, each header's
    page offset zeroed (it says where in the ring a record lay: it differs from run to
    run)."""
    limit = min(limit, len(data)) // 8 * 8
    words = np.frombuffer(data[:limit], "<u4").copy()
    at = 0
    while at < limit:
        end = at + record_end(int(words[at // 4]))
        if end > limit:
            break
        words[at // 4 + 1] = 0
        at = end
    return words[:at // 4].tobytes()


def same_bytes(c_out: str, ctracer_out: str, prefix: int = 1 << 20) -> bool:
    """Whether the C consumer's file and ctracer's spool begin with the same records
    (those whole in the first ``prefix`` bytes, page offsets aside)."""
    with open(c_out, "rb") as f:
        c_data = f.read(prefix)
    db = sqlite3.connect(ctracer_out)
    spool = b""
    for (raw,) in db.execute("SELECT raw FROM spool ORDER BY seq"):
        spool += raw
        if len(spool) >= prefix:
            break
    db.close()
    limit = min(len(c_data), len(spool))
    mine = masked_records(c_data, limit)
    return bool(mine) and mine == masked_records(spool, limit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2e6,
                        help="records a second the producer must reach and the paced "
                        "runs produce (default 2,000,000)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="length of a paced run (default 3)")
    parser.add_argument("--per-hit", type=int, default=16,
                        help="records the producer writes per tracepoint hit (default 16)")
    parser.add_argument("--templates", type=int, default=16384,
                        help="template records, a power of two (default 16384)")
    parser.add_argument("--template-messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2,
                        help="paced runs of each consumer, alternating (default 2)")
    parser.add_argument("--also-rates", default="1000000,500000",
                        help="more paced rates to run both consumers at, comma-separated "
                        "records/s (default 1000000,500000; '' for none)")
    parser.add_argument("--no-flat-out", action="store_true",
                        help="skip the runs with the producer let loose")
    parser.add_argument("--profile", action="store_true",
                        help="profile ctracer's reader in one more paced run (cProfile)")
    parser.add_argument("--numpy", action="store_true",
                        help="ctracer's reader finds the records with numpy even where "
                        "scripts/setup.sh built the C walk (ringwalk.c): the fallback's cost")
    parser.add_argument("--reader-priority", choices=priority.CHOICES,
                        default=priority.CHOICES[0],
                        help="how both consumers' reading threads are scheduled: realtime "
                        "(SCHED_FIFO 1, ctracer's default while recording) or normal")
    parser.add_argument("--dir", default=None, help="where the files are written "
                        "(default: the system's temporary directory)")
    args = parser.parse_args()
    try:
        args.also_rates = [float(r) for r in args.also_rates.split(",") if r.strip()]
    except ValueError:
        print("bench_reader: --also-rates takes numbers separated by commas", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("bench_reader: needs root", file=sys.stderr)
        return 1
    if args.templates & (args.templates - 1) or args.per_hit < 1:
        print("bench_reader: --templates must be a power of two, --per-hit at least 1",
              file=sys.stderr)
        return 1
    global NUMPY_FINDER, READER_PRIORITY
    NUMPY_FINDER = args.numpy
    READER_PRIORITY = args.reader_priority
    try:
        return run(args)
    except BenchFailure as e:
        print(f"bench_reader: {e}", file=sys.stderr)
        return 1


def run(args) -> int:
    cpus = sorted(os.sched_getaffinity(0))
    trigger_cpu = cpus[-1]
    subprocess.run(["make", "-s", "-C", os.path.join(ROOT, "samples")], check=True)
    problems: list[str] = []
    print("load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg())
          + f" ({len(cpus)} CPUs; the trigger on CPU {trigger_cpu}); both readers at "
          + ("realtime priority (SCHED_FIFO 1)" if READER_PRIORITY == "realtime"
             else "normal priority"))
    with tempfile.TemporaryDirectory(prefix="bench_reader.", dir=args.dir) as work:
        trigger_exe = os.path.join(work, "trigger")
        consumer_exe = os.path.join(work, "consumer")
        build(TRIGGER_C, trigger_exe, [])
        build(CONSUMER_C, consumer_exe, ["-lbpf"])
        template_path = os.path.join(work, "template.ctrace")
        record_template(template_path, 4, args.template_messages)
        template = load_template(template_path, args.templates)
        lengths = np.array([len(e) for e in template.events])
        print("ctracer's reader finds the records with "
              + ("numpy (--numpy)" if NUMPY_FINDER else
                 "the C walk (ringwalk.c)" if ringbuf.native_walk() else
                 "numpy (the C walk is not built: scripts/setup.sh)"))
        print(f"template: {len(template.events):,} compact records of `ctracer trace struct "
              f"sock -- tcploop --connections 4 --messages {args.template_messages}`: "
              f"events {lengths.min()}-{lengths.max()} bytes, mean {lengths.mean():.1f}; "
              f"{template.ring_bytes_mean:.1f} bytes a record in the ring")

        # 1. the producer alone, into a ring big enough for all it writes
        alone_records = ALONE_RECORDS // args.per_hit * args.per_hit
        big = 1 << max(20, int(np.ceil(np.log2(alone_records * template.ring_bytes_mean
                                                * 1.25))))
        producer = Producer(template, big, args.per_hit)
        try:
            rates = []
            for _ in range(2):
                produced, lost, seconds = producer_alone(producer, trigger_exe, work,
                                                         trigger_cpu, alone_records)
                rates.append(produced / seconds)
                print(f"producer alone ({big >> 20} MB ring, nobody reading): "
                      f"{produced:,} records in {seconds:.3f} s = {produced / seconds:,.0f} "
                      f"records/s, {lost} lost ({args.per_hit} a getppid() on CPU "
                      f"{trigger_cpu})")
                if lost:
                    problems.append(f"the producer alone lost {lost:,} in a ring meant to "
                                    "hold everything")
        finally:
            producer.close()
        if max(rates) < args.rate:
            raise BenchFailure(f"the producer reaches only {max(rates):,.0f} records/s, "
                               f"below the {args.rate:,.0f} the bench needs (raise --per-hit)")

        # 2. both consumers on a ring of ctracer's default size, at each rate
        producer = Producer(template, DEFAULT_RING_MB << 20, args.per_hit)
        runs: dict[float, list[tuple[Run, Run]]] = {}
        try:
            for rate in [args.rate] + args.also_rates:
                runs[rate] = []
                for _ in range(args.rounds):
                    pair = consumer_pair(producer, consumer_exe, trigger_exe, work,
                                         trigger_cpu, rate, args.seconds, problems,
                                         goal=rate == args.rate)
                    runs[rate].append(pair)
            if args.profile:
                r, path = ctracer_run(producer, trigger_exe, work, trigger_cpu,
                                      int(args.rate * args.seconds) // args.per_hit,
                                      args.rate / args.per_hit, profile=True)
                os.unlink(path)
                print(f"(profiled) {r.line()}")
                problems += check_counts(r, fatal_loss=False)
            if not args.no_flat_out:
                hits = int(args.rate * args.seconds) // args.per_hit
                for fn in (lambda: c_consumer_run(producer, consumer_exe, trigger_exe, work,
                                                  trigger_cpu, hits, 0),
                           lambda: ctracer_run(producer, trigger_exe, work, trigger_cpu,
                                               hits, 0)):
                    r, path = fn()
                    os.unlink(path)
                    print(r.line())
                    problems += check_counts(r, fatal_loss=False)
        finally:
            producer.close()

    for rate, pairs in runs.items():
        ratios = [py.cpu_ns / c.cpu_ns for c, py in pairs]
        goal = f" (goal <= 5x: {'met' if max(ratios) <= 5 else 'not met'})" \
            if rate == args.rate else ""
        print(f"at {rate:,.0f} records/s: ctracer reader / C consumer, CPU per record "
              + ", ".join(f"{py.cpu_ns:.0f} / {c.cpu_ns:.0f} ns = {r:.2f}x"
                          for (c, py), r in zip(pairs, ratios)) + goal
              + "; kept up (0 lost): ctracer "
              + ", ".join("yes" if not py.lost else f"no ({py.lost:,} lost)" for _, py in pairs)
              + "; C consumer "
              + ", ".join("yes" if not c.lost else f"no ({c.lost:,} lost)" for c, _ in pairs))
    if problems:
        for p in problems:
            print(f"bench_reader: {p}", file=sys.stderr)
        return 1
    return 0


def consumer_pair(producer: Producer, consumer_exe: str, trigger_exe: str, work: str,
                  cpu: int, rate: float, seconds: float, problems: list[str],
                  goal: bool) -> tuple[Run, Run]:
    """The C consumer, then ctracer's reader, each on the producer paced at ``rate``
    records a second for ``seconds``; what went wrong added to ``problems`` (ctracer's
    losses only at the ``goal`` rate)."""
    hits = int(rate * seconds) // producer.per_hit
    c_run, c_out = c_consumer_run(producer, consumer_exe, trigger_exe, work, cpu, hits,
                                  rate / producer.per_hit)
    print(c_run.line())
    py_run, py_out = ctracer_run(producer, trigger_exe, work, cpu, hits,
                                 rate / producer.per_hit)
    print(py_run.line())
    problems += check_counts(c_run, fatal_loss=True) + check_counts(py_run, fatal_loss=goal)
    for r in (c_run, py_run):
        if r.produced_rate < 0.95 * rate:
            problems.append(f"{r.who}'s run: the producer reached only "
                            f"{r.produced_rate:,.0f} of {rate:,.0f} records/s")
    if not c_run.lost and not py_run.lost:
        if c_run.written_bytes != py_run.written_bytes:
            problems.append(f"the C consumer wrote {c_run.written_bytes:,} bytes, ctracer "
                            f"{py_run.written_bytes:,}, for the same records")
        elif not same_bytes(c_out, py_out):
            problems.append("the C consumer's and ctracer's first records differ")
    for path in (c_out, py_out):
        os.unlink(path)
    return c_run, py_run


if __name__ == "__main__":
    sys.exit(main())
