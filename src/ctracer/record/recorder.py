"""Recording: runs a probe program and writes what it sees into a trace file.

`record` compiles and attaches the probes (`ctracer.record.bpf_runtime`), starts the command
(held at a gate until the probes are in place, so its first call is seen) or follows a
running process, and polls the ring buffer until the command exits, the process goes
away, the duration ends or the user presses Ctrl-C (or sends SIGTERM).  While
recording, the raw events are committed to the trace file every `EventSink.COMMIT_S`
seconds (so a SIGKILL loses nothing committed), as the ring buffer delivered them: the
trace file keeps them raw and its readers decode them (`ctracer.tracefile`), so the
consumer is as fast as the ring buffer can deliver; the meta table gets everything the report needs, so that the
trace renders on any machine.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from ctracer.deltas import RecordShape, offsets
from ctracer.errors import CommandNotFound, InputFileError
from ctracer.event import (FLAG_READ_FAILED, HEADER, RING_HEADER_BYTES, FunctionRow,
                           compact_size, delta_words, event_size)
from ctracer.probes import ProbeProgram
from ctracer.host import netdevs
from ctracer.tracefile import TraceWriter
from ctracer.tracefile.format import now_iso
from ctracer.record.folds import FoldDrain
from ctracer.record.priority import REFUSED as priority_refused, ReaderPriority

if TYPE_CHECKING:
    from ctracer.plan.watch import WatchPlan
    from ctracer.record.tail import Tail


@dataclass
class ProgressCounts:
    """What the progress line and the summary show."""

    events: int = 0
    lost: int = 0
    objects: set = field(default_factory=set)


@dataclass
class RecordResult:
    """What a recording did: the trace written, its counts, the probes attached and
    failed, and the times it took."""

    path: str
    events: int
    objects: int
    lost: int
    attached: int
    failed: int
    skipped: int
    compile_seconds: float
    attach_seconds: float
    seconds: float
    stopped_by: str
    command_status: Optional[int] = None
    failures: list[str] = field(default_factory=list)
    kept_old: Optional[str] = None  # where a file already at the output path was moved
    #: what the user should know about the recording (nothing recorded and why, ...)
    warnings: list[str] = field(default_factory=list)
    #: events taken from the ring buffer but never written (the disk was full)
    unwritten: int = 0
    detach_seconds: float = 0.0
    #: calls the kernel did not run a probe for (`ctracer.record.kattach.KernelLinks.missed`)
    misses: dict = field(default_factory=dict)
    #: where the functions' programs kept each thread's state when the kernel refused
    #: the task-storage ones (`ctracer.record.kattach.KernelLinks.thread_state`), else ""
    thread_state_fallback: str = ""
    #: what ``--watch`` did (`ctracer.record.watcher.Watcher.summary`), None without it
    watch: Optional[dict] = None
    #: ``--calls`` ("all" or "changes"), the calls folded into counts (never events)
    #: and those that found the fold map full (written)
    calls: str = "all"
    folded: int = 0
    folds_refused: int = 0
    #: what the reading thread ran with (`ctracer.record.priority.ReaderPriority`)
    reader_priority: str = ""
    #: the kinds the kernel functions were probed as ("fsession.multi",
    #: "fentry.multi/fexit.multi", ...; "" without kernel functions)
    kernel_kinds: str = ""
    #: functions attached per entry kind (`attached_kinds`), said when there are several
    kinds: dict = field(default_factory=dict)
    #: (function, why the kernel refused the trampoline kind) of each function then put
    #: on kprobes (`ctracer.record.kattach.KernelLinks.fell_back_from`)
    fell_back: list = field(default_factory=list)


#: `RecordResult.stopped_by` when writing the trace file failed for lack of space
DISK_FULL = "disk full"


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` says the file system (or the quota) is full: ENOSPC/EDQUOT, or
    SQLite's SQLITE_FULL."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return getattr(e, "sqlite_errorcode", None) == 13  # SQLITE_FULL


#: how long the recorder waits for the ring buffer between its other duties: the probes
#: wake it only once per batch of events, so this bounds how late an event is seen
#: (``--tail``) and how long a poll takes when a stop is requested
POLL_MS = 50


class EventSink:
    """Takes the raw events from the ring buffer and hands them to the trace file: while
    recording, its work is only to keep the bytes and count them (so the consumer keeps
    up with busy programs and loses less); every `COMMIT_S` seconds they are committed
    as they are (the trace file keeps them raw: its readers decode them).

    Compact events from the mapped ring are copied straight into the spool row being
    filled (`space`, then `taken`): the records are copied once from the ring, and a
    full row waits for the commit beside the next one, each a buffer of
    `TraceWriter.SPOOL_ROW_BYTES` made once and reused (no memory freshly touched per
    take once the recording's pace is reached); each row goes to SQLite as it is,
    without finding its records again.  Committing every `COMMIT_S`, not each row as
    it fills, leaves SQLite's log time to be folded into the file between commits, so
    it starts over instead of growing as long as the recording.  Events given as bytes
    (`__call__`: libbpf's per-event callback, whole events) are gathered and counted a
    batch at a time."""

    BATCH = 4096
    COMMIT_S = 0.25          # at most this much of what was delivered is lost on SIGKILL
    #: compact rows waiting beyond which they are committed at once (bounds the memory)
    MAX_WAITING_ROWS = 64

    def __init__(self, program: ProbeProgram, writer: TraceWriter, counts: ProgressCounts,
                 tail: Optional["Tail"] = None, watcher=None, folds=None):
        self.writer = writer
        #: ``--calls changes``' `ctracer.record.folds.FoldDrain`: its rows are
        #: committed at each commit of the events
        self.folds = folds
        #: ``--watch``'s `ctracer.record.watcher.Watcher`: sees each batch, and its
        #: writes are committed with the events
        self.watcher = watcher
        self.counts = counts
        self.tail = tail
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        #: where each record of ``pending`` starts (compact events), while known
        self.pending_starts: list[np.ndarray] = []
        self.starts_known = True
        #: counted, not yet committed, in order: batches of whole events (bytes, None,
        #: None, False), or compact records with the events they hold, where each
        #: starts when known, and whether they fill one of the sink's rows (row, bytes
        #: used, events, None, True)
        self.waiting: list[tuple] = []
        self.last_commit = time.monotonic()
        self.size = event_size(program.mini, program.nargs)
        #: compact events come as the ring's records (any length, 8-byte aligned)
        self.compact = bool(getattr(program, "compact", False))
        self.shape = RecordShape(program.mini, program.nargs) if self.compact else None
        obj, flags = HEADER.field("object"), HEADER.field("flags")
        # object address and flags of each event of a batch, unpacked in one C loop
        self._brief = struct.Struct(f"<{obj.offset}xQ{flags.offset - obj.offset - 8}xB"
                                    f"{self.size - flags.offset - 1}x")
        self._object_at = RING_HEADER_BYTES + obj.offset
        self._flags_at = RING_HEADER_BYTES + flags.offset
        #: the objects counted so far, sorted (compact events: `_count`)
        self._known_objects = np.zeros(0, np.uint64)
        if self.compact:
            #: the spool row being filled with compact ring records, its bytes used
            #: and the events in them; rows committed, to be filled again
            self.row = np.empty(writer.SPOOL_ROW_BYTES, np.uint8)
            self.row_used = 0
            self.row_events = 0
            self.spare_rows: list[np.ndarray] = []
            #: the most bytes one ring record takes (a compact event carrying every word)
            self.max_record = (RING_HEADER_BYTES + compact_size(
                program.mini, program.nargs, delta_words(program.mini, program.nargs))
                + 7) & ~7

    def __call__(self, raw: bytes, starts=None) -> None:
        """Take one or more whole events, back to back (a batch of the ring buffer, or
        one event from libbpf's per-event callback); ``starts``: where each ring record
        of a compact batch starts, when the ring already found them."""
        if starts is None:
            self.starts_known = False
        elif self.starts_known:
            self.pending_starts.append(starts + self.pending_bytes)
        self.pending.append(raw)
        self.pending_bytes += len(raw)
        if self.tail is not None:
            for at in range(0, len(raw), self.size):
                self.tail(raw[at:at + self.size])
        if self.pending_bytes >= self.BATCH * self.size:
            self._take()

    def space(self) -> np.ndarray:
        """Where the mapped ring copies the next compact records (then `taken`): the
        free part of the row being filled (a fresh row once a record might not fit);
        empty while events given as bytes wait, or while `MAX_WAITING_ROWS` wait
        (`flush` then commits them)."""
        if len(self.row) - self.row_used < self.max_record:
            if self.pending or len(self.waiting) >= self.MAX_WAITING_ROWS:
                return self.row[:0]
            self._next_row()
        return self.row[:0] if self.pending else self.row[self.row_used:]

    def taken(self, nbytes: int, starts: np.ndarray,
              objects: Optional[np.ndarray] = None) -> None:
        """``nbytes`` of whole ring records were copied to the start of `space`, each
        submitted one starting (its ring header) at ``starts`` from there; ``objects``:
        their object addresses where the ring already read them (one a run of records
        of the same object, those whose snapshot read failed left out)."""
        if objects is not None:
            self._add_objects(objects)
            self.counts.events += len(starts)
            events = len(starts)
        else:
            events = self._count(self.row[self.row_used:self.row_used + nbytes], starts)
        self.row_used += nbytes
        self.row_events += events

    def _next_row(self) -> None:
        """The row being filled waits for the commit; an empty one is filled next."""
        if self.row_used:
            self.waiting.append((self.row, self.row_used, self.row_events, None, True))
            self.row = self.spare_rows.pop() if self.spare_rows \
                else np.empty(len(self.row), np.uint8)
        self.row_used = self.row_events = 0

    def _count(self, records: np.ndarray, starts: Optional[np.ndarray]) -> int:
        """Count compact ring records (uint8, whole records; ``starts``: where each
        one's ring header is, None: found here) and their objects; how many."""
        if starts is None:
            starts, kept = offsets(records, self.shape)
            starts = starts[kept] - RING_HEADER_BYTES
        if not len(starts):
            return 0
        read = (records[starts + self._flags_at] & FLAG_READ_FAILED) == 0
        if self._object_at % 8 == 0:
            # ring records are 8-byte aligned, and so is the object's address in them:
            # one gather of words, not of eight bytes each
            objects = records.view("<u8")[(starts + self._object_at) >> 3]
        else:
            objects = records[(starts + self._object_at)[:, None] + np.arange(8)] \
                .view("<u8").ravel()
        if not read.all():
            objects = objects[read]
        if len(objects):
            # the few objects of a batch come in runs: the runs' first ones
            first = np.empty(len(objects), bool)
            first[0] = True
            np.not_equal(objects[1:], objects[:-1], out=first[1:])
            self._add_objects(objects[first])
        self.counts.events += len(starts)
        return len(starts)

    def _add_objects(self, objects: np.ndarray) -> None:
        """Count the object addresses among ``objects`` (u64) not seen before."""
        if len(objects):
            # most were seen before: looked up among those (sorted), the new ones added
            known = self._known_objects
            if len(known):
                at = np.searchsorted(known, objects)
                np.minimum(at, len(known) - 1, out=at)
                objects = objects[known[at] != objects]
            if len(objects):
                objects = np.unique(objects)
                self.counts.objects.update(objects.tolist())
                self._known_objects = np.union1d(known, objects)

    def _take(self) -> None:
        if self.pending and self.compact:
            batch, self.pending, self.pending_bytes = b"".join(self.pending), [], 0
            starts = np.concatenate(self.pending_starts) \
                if self.starts_known and self.pending_starts else None
            self.pending_starts, self.starts_known = [], True
            if len(batch) > len(self.row) - self.row_used:
                self._next_row()
            if len(batch) > len(self.row):   # more than a row: kept as it came
                records = np.frombuffer(batch, np.uint8)
                self.waiting.append((batch, len(batch), self._count(records, starts),
                                     starts, False))
            else:
                self.row[self.row_used:self.row_used + len(batch)] = \
                    np.frombuffer(batch, np.uint8)
                self.taken(len(batch), starts)
        elif self.pending:
            batch, self.pending, self.pending_bytes = b"".join(self.pending), [], 0
            if len(batch) % self.size:
                raise RuntimeError("an event of unexpected size came out of the ring buffer")
            self.waiting.append((batch, len(batch), None, None, False))
            if self.watcher is not None:
                self.watcher.events(batch, self.size)
            objects = self.counts.objects
            for obj, flags in self._brief.iter_unpack(batch):
                if not flags & FLAG_READ_FAILED:
                    objects.add(obj)
            self.counts.events += len(batch) // self.size

    def flush(self, commit: bool = False, delivered_before_ns: Optional[int] = None) -> None:
        """Count what arrived; commit it when `COMMIT_S` has passed, `MAX_WAITING_ROWS`
        wait, or ``commit``, outside the ring buffer's callback.  Between commits, each
        call writes one full compact row into the transaction the next commit ends, so
        that a commit has little left to write: the reading thread then never spends
        long away from the ring (at 2M records/s a quarter of a second of rows took
        ~40 ms to write at once, while the ring filled half-way).
        ``delivered_before_ns``: every event stamped until then has arrived
        (`ProbeSession.delivered_before_ns`), so the tail may print those."""
        self._take()
        if self.tail is not None:
            self.tail.release(final=commit, delivered_before_ns=delivered_before_ns)
        now = time.monotonic()
        if commit or len(self.waiting) >= self.MAX_WAITING_ROWS \
                or now - self.last_commit >= self.COMMIT_S:
            self.last_commit = now
            if self.watcher is not None:
                self.watcher.flush(self.writer.db)
            if self.compact:
                self._next_row()
            waiting, self.waiting = self.waiting, []
            if not self.compact:
                self.writer.add_raw(b"".join(w[0] for w in waiting), commit=False)
            for entry in waiting if self.compact else ():
                self._write(entry)
            self.writer.commit()
            # SQLite's log folded into the file now, before the next commit (it then
            # starts over from its beginning)
            self.writer.checkpoint_soon()
            if self.folds is not None:
                self.folds.flush(self.writer.db, final=commit)
        elif self.compact and self.waiting:
            self._write(self.waiting.pop(0))

    def _write(self, entry: tuple) -> None:
        """One waiting entry of compact records into the trace file's open transaction
        (committed by the next commit); a row of the sink's is then filled again."""
        records, used, events, starts, reused = entry
        if reused:
            self.writer.add_raw(memoryview(records)[:used], events, commit=False)
            self.spare_rows.append(records)
        else:
            self.writer.add_raw(records, events, starts, commit=False)


class Progress:
    """One live line on stderr: redrawn in place on a terminal, an occasional line
    otherwise."""

    def __init__(self, stream=None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.every = 0.25 if self.tty else 5.0
        self.last = 0.0
        self.started = time.monotonic()

    def start(self) -> None:
        """The recording begins: the clock shown starts now."""
        self.started = time.monotonic()

    def show(self, counts: ProgressCounts, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < self.every):
            return
        self.last = now
        line = (f"recording: {counts.events} events, {len(counts.objects)} object addresses, "
                f"{counts.lost} lost, {now - self.started:.0f} s")
        if self.tty:
            self.stream.write(f"\r\033[K{line}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def check_command(argv: Sequence[str]) -> None:
    """Refuse, with exit status 127 as a shell does, a command that cannot be run: not on
    PATH, no such file, not executable, a directory.  Checked before the probes are
    compiled (seconds), so a typo costs nothing."""
    program = argv[0] if argv else ""
    if not program:
        raise CommandNotFound("cannot run an empty command")
    if os.sep not in program:
        if shutil.which(program) is None:
            raise CommandNotFound(f"cannot run {program}: command not found")
        return
    if os.path.isdir(program):
        raise CommandNotFound(f"cannot run {program}: is a directory")
    if not os.access(program, os.X_OK):
        raise CommandNotFound(f"cannot run {program}: "
                              f"{'not executable' if os.path.exists(program) else 'no such file'}")


class GatedCommand:
    """A command forked and held at a gate (a pipe read before exec), so its process id
    is known and the probes are in place before it runs a single instruction of its own.
    (subprocess.Popen cannot do this: it waits for the exec.)"""

    def __init__(self, argv: Sequence[str]):
        argv = list(argv)
        program = argv[0]
        check_command(argv)
        read_end, self._gate = os.pipe()
        self.returncode: Optional[int] = None
        self.pid = os.fork()
        if self.pid == 0:  # the child: wait at the gate, then become the command
            try:
                os.close(self._gate)
                if os.read(read_end, 1) != b"g":  # ctracer gave up: do not run it
                    os._exit(125)
                os.close(read_end)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                os.execvp(program, argv)
            except BaseException as e:
                os.write(2, f"ctracer: cannot run {program}: {e}\n".encode())
            os._exit(127)
        os.close(read_end)

    def release(self) -> None:
        if self._gate >= 0:
            os.write(self._gate, b"g")
            os.close(self._gate)
            self._gate = -1

    def poll(self) -> Optional[int]:
        """The command's exit status (None while it runs)."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def stop(self, grace: float = 2.0) -> Optional[int]:
        """End the command if still running (SIGTERM, SIGKILL after ``grace`` seconds);
        its exit status (negative: killed by that signal)."""
        if self._gate >= 0:  # never released: closing the gate makes the child exit
            os.close(self._gate)
            self._gate = -1
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.poll() is None:
                os.kill(self.pid, signal.SIGKILL)
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _stop_like_ctrl_c(signum, frame) -> None:
    raise KeyboardInterrupt


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM while recording: remembered, never raised.  An
    exception would surface inside the ring buffer callback, where ctypes swallows it;
    the flag also makes the poll in progress return (`ProbeSession.interrupted`)."""

    def __init__(self, session) -> None:
        self.session = session
        self.reason: Optional[str] = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        self.reason = "ctrl-c" if signum == signal.SIGINT else "terminated"
        self.session.interrupted = True

    def __enter__(self) -> "StopRequest":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie has exited already
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def record(program: ProbeProgram, binary: Optional[str], output: str, *, meta: dict,
           command: Optional[Sequence[str]] = None, pid: Optional[int] = None,
           duration: Optional[float] = None, progress: Optional[Progress] = None,
           on_attached: Optional[Callable[[], None]] = None,
           tail: Optional["Tail"] = None, watch_plan: Optional["WatchPlan"] = None,
           vmlinux: Optional[str] = None, reader_priority: str = "realtime") -> RecordResult:
    """Record until the command exits / the process goes away / ``duration`` seconds /
    Ctrl-C, and write the trace file at ``output``.  While recording, the calling thread
    reads the ring buffer at ``reader_priority`` (`ctracer.record.priority`)."""
    from ctracer.record import bpf_runtime

    if pid is not None and not _process_alive(pid):
        raise InputFileError(f"no process with id {pid}")
    progress = progress or Progress(enabled=False)
    counts = ProgressCounts()
    session = bpf_runtime.ProbeSession(program, binary, lambda raw: None)
    kernel = meta.get("traced") == "kernel"
    watcher = _compile(session, program, watch_plan, kernel)
    writer = TraceWriter(output)
    sink = EventSink(program, writer, counts, tail, watcher, FoldDrain.of(program, session))
    session.on_event = sink
    gated: Optional[GatedCommand] = None
    watch = MappingWatch(session, binary, followed=bool(command) or pid is not None)
    stopped_by = "ctrl-c"
    started = time.monotonic()
    recording = False
    priority = ReaderPriority(reader_priority)
    previous_term = signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    devices = netdevs.read() if kernel else None  # named again at the end (netdevs)
    try:
        writer.set_meta(**meta, return_value_functions=sorted(program.rows_with_return_value()),
                        start_time=now_iso(),
                        start_monotonic_ns=time.monotonic_ns(),
                        host=socket.gethostname(), kernel_release=os.uname().release,
                        command=list(command) if command else None, pid=pid,
                        **({"net_devices": devices} if kernel else {}),
                        **({"watch_plan": watch_plan.to_json()} if watch_plan is not None
                           else {}))
        writer.expect_raw()
        writer.checkpoint_in_background()
        if command:
            gated = GatedCommand(command)
            session.follow(gated.pid)
        elif pid is not None:
            session.follow(pid)
        _write_attached(session, program, writer, session.attach())
        recording = True
        with StopRequest(session) as stop:
            if on_attached:
                on_attached()
            started = time.monotonic()
            progress.start()
            priority.begin()   # the command (forked already) and new threads: normal
            if gated:
                gated.release()
            stopped_by = _poll_until_done(session, counts, progress, gated, pid, duration,
                                          started, stop, watch)
    except KeyboardInterrupt:
        if not recording:
            raise
        stopped_by = "ctrl-c"
    finally:
        seconds = time.monotonic() - started
        end_time, end_ns = now_iso(), time.monotonic_ns()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish writing first
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            detaching = time.monotonic()
            if recording:
                stopped_by = _stop_and_drain(session, sink, counts, watch, stopped_by, priority)
            misses, fullest = (session.misses() if recording else {}), session.ring_fullest()
            watched = _finish_watch(session, watcher, writer, kernel, seconds, vmlinux) \
                if recording and stopped_by != DISK_FULL else None
            status = gated.stop() if gated else None
            session.close()
            detach_seconds = time.monotonic() - detaching
            if recording and stopped_by == DISK_FULL:
                progress.done()
                _finish_on_full_disk(writer, counts, end_time=end_time, end_ns=end_ns)
            elif recording:
                progress.done()
                _finish_meta(writer, meta, devices, end_time=end_time, end_monotonic_ns=end_ns,
                             lost_events=counts.lost, stopped_by=stopped_by,
                             warnings=watch.warnings(counts.events, command, pid),
                             probe_misses=misses, detach_seconds=round(detach_seconds, 3),
                             reader_priority=priority.description,
                             ring_bytes=program.ring_bytes, ring_fullest_bytes=fullest)
            if stopped_by != DISK_FULL:
                writer.close()
            if not recording:
                os.unlink(output)
        finally:
            signal.signal(signal.SIGINT, previous)
            signal.signal(signal.SIGTERM, previous_term)
            progress.done()
    kept = writer.events_written + writer.events_spooled
    return _result(output, program, session, counts, kept, seconds, stopped_by, status,
                   writer.kept_old, watch.warnings(counts.events, command, pid),
                   detach_seconds, misses, watched, sink.folds, priority.description)


def _compile(session, program: ProbeProgram, plan, kernel: bool):
    """Compile the probes (with the write breakpoints' program when ``plan``, a
    `ctracer.plan.watch.WatchPlan`); then load that program, open its ring buffer, time
    BPF programs and return the `ctracer.record.watcher.Watcher` (None without plan)."""
    if plan is None:
        session.compile()
        return None
    from ctracer.probes import watch as watch_probes
    from ctracer.record.watcher import Watcher
    session.extra_text = watch_probes.c_text(kernel)
    session.compile()
    watcher = Watcher(plan, program, session.write_program_fd(), kernel=kernel)
    session.open_writes(watcher.on_write)
    session.enable_program_stats()
    return watcher


def _finish_watch(session, watcher, writer: TraceWriter, kernel: bool, seconds: float,
                  vmlinux: Optional[str]) -> Optional[dict]:
    """Disarmed already; the last writes and armings into the file, where their code
    is (``watch_sites``) and what the watch did and cost (the meta ``watch``); None
    without a watch."""
    if watcher is None:
        return None
    from ctracer.tracefile import writes
    from ctracer.record import write_sites
    watcher.flush(writer.db)
    rows = writes.read_writes(writer.db)
    writes.add_sites(writer.db, write_sites.resolve(rows, kernel=kernel, maps=watcher.maps,
                                                    vmlinux=vmlinux))
    summary = watcher.summary(seconds, session.writes_lost(),
                              session.program_stats(b"ctracer_on_write"))
    writer.set_meta(watch=summary)
    writer.db.commit()
    return summary


def _write_attached(session, program: ProbeProgram, writer: TraceWriter, results) -> None:
    """The functions table, each row with what its probes attached, and where the
    kernel functions' programs keep each thread's depth (what was loaded, where the
    plan's ``thread_state`` is what the kind may use)."""
    from ctracer.record import bpf_runtime

    links = getattr(session, "kernel_links", None)
    if links is not None and links.thread_state:
        writer.set_meta(thread_state=links.thread_state)
    if links is not None and links.functions:
        writer.set_meta(attached_kinds=attached_kinds(results, links.entry_kind),
                        kprobes_after_refusal=[list(p) for p in links.fell_back_from])
    attached_text = bpf_runtime.row_attachments(program, results)
    writer.add_functions(FunctionRow(r.id, r.name, r.unit, r.route_kind, r.route_text, r.address,
                                     attached_text[r.id]) for r in program.rows)


def _result(output: str, program: ProbeProgram, session, counts: ProgressCounts, kept: int,
            seconds: float, stopped_by: str, status, kept_old, warnings: list[str],
            detach_seconds: float, misses: dict, watched: Optional[dict] = None,
            folds: Optional[FoldDrain] = None, reader_priority: str = "") -> RecordResult:
    from ctracer.record import bpf_runtime

    results = session.results
    ok, failed = bpf_runtime.attach_summary(results)
    return RecordResult(
        output, kept, len(counts.objects), counts.lost, ok, failed,
        sum(1 for r in program.rows if r.attached),
        session.compile_seconds, session.attach_seconds, seconds, stopped_by, status,
        [f"{r.function.name}: {r.attached}" for r in results if not r.complete],
        kept_old, warnings, max(0, counts.events - kept), detach_seconds, misses,
        _thread_state_fallback(session), watched,
        *(("changes", folds.calls, folds.refused) if folds is not None else ()),
        reader_priority=reader_priority, kernel_kinds=_kernel_kinds(session),
        kinds=attached_kinds(results, getattr(getattr(session, "kernel_links", None),
                                              "entry_kind", None)),
        fell_back=list(getattr(getattr(session, "kernel_links", None), "fell_back_from", [])))


def _kernel_kinds(session) -> str:
    """The kinds the kernel functions were probed as ("" without any)."""
    from ctracer.probes.kfunctions import probe_kinds
    links = getattr(session, "kernel_links", None)
    if links is None or not links.functions or not links.entry_kind:
        return ""
    return "/".join(probe_kinds(links.entry_kind))


def attached_kinds(results, first: Optional[str] = None) -> dict[str, int]:
    """Kernel functions whose entry attached, per entry kind (``fentry.multi``,
    ``kprobe``...; one recording may mix two: `ctracer.plan.attach.mixed_in`), the
    recording's own kind (``first``) first."""
    out: dict[str, int] = {first: 0} if first else {}
    for r in results:
        kind = r.kind.split(",")[0]
        if r.ok and kind not in ("raw_tracepoint", "entry"):
            out[kind] = out.get(kind, 0) + 1
    return {k: n for k, n in out.items() if n}


def _thread_state_fallback(session) -> str:
    """Where the kernel functions' programs kept each thread's state, when the kernel
    refused the task-storage ones; "" otherwise."""
    links = getattr(session, "kernel_links", None)
    return links.thread_state if links is not None and links.fell_back else ""


def _stop_and_drain(session, sink: "EventSink", counts: ProgressCounts, watch: "MappingWatch",
                    stopped_by: str, priority: ReaderPriority) -> str:
    """Stop every probe at once, take what the ring buffer holds and commit it while the
    probes are being detached, then what the last probes in flight left; why the
    recording stopped (a full disk met only now included).  The reading thread then
    leaves its ``priority``: finishing the file is no race with the probes."""
    try:
        if sink.watcher is not None:
            sink.watcher.close()
        closing = session.begin_stop()
        try:
            session.drain()
            session.take_writes()
            stopped_by = _commit(sink, stopped_by)
        finally:
            closing.join()
        session.drain()
        session.take_writes()
        stopped_by = _commit(sink, stopped_by)
    finally:
        priority.end()
    counts.lost = session.lost()
    if sink.folds is not None and stopped_by != DISK_FULL:
        sink.writer.set_meta(folded_calls=sink.folds.calls, folds_refused=sink.folds.refused)
    watch.check()
    return stopped_by


def _finish_meta(writer: TraceWriter, meta: dict, devices, **entries) -> None:
    """The meta ``entries`` of a recording that stopped, then its events counted, the
    kernel's code addresses named and its network devices (``devices``: those read when
    it started; None: not a kernel trace) named again."""
    writer.set_meta(**entries)
    writer.flush()
    writer.set_meta(events=writer.events_written + writer.events_spooled)
    _name_kernel_text(writer, meta)
    if devices is not None:
        writer.set_meta(net_devices=netdevs.merged(devices, netdevs.read()))


def _name_kernel_text(writer: TraceWriter, meta: dict) -> None:
    """A kernel trace's code addresses in tracepoint arguments (``location``) as
    ``symbol+off`` in the meta ``kernel_symbols``: only this host can say (see
    `ctracer.host.kallsyms`)."""
    from ctracer.host import kallsyms
    if meta.get("traced") != "kernel":
        return
    args = meta.get("tracepoint_args")
    names = kallsyms.text_arguments(args if isinstance(args, dict) else None)
    if names:
        found = kallsyms.Kallsyms().names(writer.argument_values(names))
        writer.set_meta(kernel_symbols=found)


def _commit(sink: "EventSink", stopped_by: str) -> str:
    """Commit what the sink holds, unless the disk is full (met now or before); why the
    recording stopped."""
    if stopped_by == DISK_FULL:
        if sink.tail is not None:
            sink.tail.release(final=True)
        return stopped_by
    try:
        sink.flush(commit=True)
    except Exception as e:
        if not is_disk_full(e):
            raise
        return DISK_FULL
    return stopped_by


def _finish_on_full_disk(writer: TraceWriter, counts: ProgressCounts, *, end_time: str,
                         end_ns: int) -> None:
    """The disk filled up: what was committed stays in the file (raw, as every event
    is); what was being written is rolled back, so no event
    is in the file twice; the meta says why the recording stopped, if it still fits."""
    written = writer.events_written + writer.events_spooled
    writer.release_reserve()
    try:
        writer.rollback()
        writer.set_meta(end_time=end_time, end_monotonic_ns=end_ns, lost_events=counts.lost,
                        stopped_by=DISK_FULL, unwritten_events=counts.events - written)
    except Exception as e:
        if not is_disk_full(e):
            raise
    try:
        writer.close()  # finishes the file when there is room
    except Exception as e:
        if not is_disk_full(e):
            raise


class MappingWatch:
    """Whether a followed process has mapped the traced binary, checked now and then
    while nothing has been seen yet, so that an empty trace can say why it is empty
    (``-- /bin/true --binary prog`` records nothing: prog never runs)."""

    def __init__(self, session, binary: Optional[str], followed: bool):
        self.session = session
        self.binary = os.path.realpath(binary) if binary else None
        self.followed = followed
        self.seen = False
        self.exe: Optional[str] = None  # what the first followed process runs

    def check(self) -> None:
        if self.seen or not self.binary or not self.followed:
            return
        for pid in self.session.followed():
            try:
                if self.exe is None:
                    self.exe = os.readlink(f"/proc/{pid}/exe")
                with open(f"/proc/{pid}/maps") as f:
                    if any(line.rstrip("\n").endswith(self.binary) for line in f):
                        self.seen = True
                        return
            except OSError:
                continue

    def warnings(self, events: int, command: Optional[Sequence[str]],
                 pid: Optional[int]) -> list[str]:
        if events or not self.binary:
            return []
        if not self.followed:
            return [f"nothing recorded: no process ran a probed function of {self.binary}"]
        who = "the command" if command else f"process {pid}"
        if self.seen:
            return [f"nothing recorded: {who} mapped {self.binary} but never called a "
                    "probed function"]
        runs = self.exe
        if runs is None and command:
            found = shutil.which(command[0])
            runs = os.path.realpath(found) if found else None
        ran = f" (it runs {runs})" if runs and runs != self.binary else ""
        return [f"nothing recorded: {who} never mapped {self.binary}{ran}; --binary must "
                "name the program that runs, or a library it loads"]


def _poll_until_done(session, counts: ProgressCounts, progress: Progress,
                     gated: Optional[GatedCommand], pid: Optional[int],
                     duration: Optional[float], started: float, stop: StopRequest,
                     watch: MappingWatch) -> str:
    next_check = 0.0
    watcher = session.on_event.watcher
    while True:
        session.poll(POLL_MS)
        if watcher is not None:
            session.take_writes()
            watcher.service()
        try:
            session.on_event.flush(delivered_before_ns=session.delivered_before_ns)
        except Exception as e:
            if not is_disk_full(e):
                raise
            return DISK_FULL
        if stop.reason:
            return stop.reason
        now = time.monotonic()
        if now >= next_check:
            counts.lost = session.lost()
            watch.check()
            next_check = now + 0.25
        progress.show(counts)
        if duration is not None and now - started >= duration:
            return "duration"
        if gated is not None and gated.poll() is not None:
            return "command exited"
        if gated is None and pid is not None and not _process_alive(pid):
            return "process exited"


def trace_meta(*, struct_kind: str, struct_name: str, mini_json: str, mini_text: str,
               full_layout: str, binary: Optional[str], argv: Sequence[str],
               fields: Sequence[str], functions: Sequence[str], bpf_text: str,
               **extra) -> dict:
    """The meta entries known before recording starts (``binary`` None: the running
    kernel; ``extra``: further entries, e.g. ``tracepoint_args``)."""
    return dict(struct_name=struct_name, struct_kind=struct_kind, mini_layout=mini_json,
                mini_layout_text=mini_text, full_layout=full_layout,
                binary=os.path.abspath(binary) if binary else None,
                argv=json.dumps(list(argv)),
                field_patterns=list(fields), function_patterns=list(functions),
                bpf_program=bpf_text, **extra)


def describe_status(status: int) -> str:
    """A command's exit status as a shell user reads it."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}"
    return f"exit status {status}"


#: functions failing to attach beyond which a recording's last line says so
FEW_FAILED = 3


def summary_lines(result: RecordResult) -> list[str]:
    """What a recording did, in a few lines (events, objects, losses, probes, file)."""
    how = {"command exited": "the command exited", "process exited": "the process exited",
           "duration": "the duration ended", "ctrl-c": "Ctrl-C",
           "terminated": "SIGTERM", DISK_FULL: "the disk is full"}.get(result.stopped_by,
                                                                   result.stopped_by)
    status = f", {describe_status(result.command_status)}" if result.command_status else ""
    took = f"{result.seconds:.1f} s" if result.seconds >= 1 else f"{result.seconds * 1000:.0f} ms"
    lines = [f"{result.events} events, {result.objects} object addresses, "
             f"{result.lost} lost in {took} (stopped: {how}{status})"]
    if result.calls == "changes":
        refused = (f"; {result.folds_refused} more found the fold map full and were written"
                   if result.folds_refused else "")
        lines.append(f"calls: changes: {result.folded} calls changed nothing and were "
                     f"counted, not written{refused}")
    else:
        lines.append("calls: all: every call's entry and exit written")
    skipped = f", {result.skipped} not probeable" if result.skipped else ""
    kinds = f" ({result.kernel_kinds})" if result.kernel_kinds else ""
    if len(result.kinds) > 1:   # one recording on several kinds: the functions of each
        kinds = (" (kernel functions: " + ", ".join(f"{n} on {k}"
                                                    for k, n in result.kinds.items()) + ")")
    lines.append(f"probes on {result.attached} functions{kinds}, {result.failed} failed{skipped} "
                 f"(bcc compile {result.compile_seconds:.1f} s, attach "
                 f"{result.attach_seconds:.1f} s, detach {result.detach_seconds:.1f} s)")
    for name, why in result.fell_back[:5]:
        lines.append(f"  {name}: on kprobes, as the kernel refused the trampoline: "
                     f"{why.removeprefix('failed: ')}")
    if len(result.fell_back) > 5:
        lines.append(f"  ... and {len(result.fell_back) - 5} more on kprobes (the trace's "
                     "meta kprobes_after_refusal)")
    missed = {k: v for k, v in result.misses.items() if v}
    if missed:
        lines.append("warning: the kernel skipped probes on some calls ("
                     + ", ".join(f"{v} {k}" for k, v in missed.items())
                     + "): those calls are not in the trace")
    if result.thread_state_fallback:
        lines.append(f"note: each thread's call depth and saved entries in "
                     f"{result.thread_state_fallback}")
    lines += [f"  {failure}" for failure in result.failures[:5]]
    if len(result.failures) > 5:
        lines.append(f"  ... and {len(result.failures) - 5} more (see the trace's "
                     "functions table)")
    if result.watch is not None:
        from ctracer.record.watcher import summary_line
        lines.append(summary_line(result.watch))
    if result.lost:
        slow = (f" (the reader ran at {result.reader_priority})"
                if result.reader_priority.startswith(priority_refused) else "")
        lines.append(f"warning: {result.lost} events were lost (ring buffer full{slow}); "
                     "a larger --buffer-mb or fewer --functions helps")
    if result.stopped_by == DISK_FULL:
        lines.append(f"warning: the disk filled up, so the recording stopped: the trace "
                     f"keeps the {result.events} events written before that"
                     f"{f'; {result.unwritten} more were not written' if result.unwritten else ''}")
    lines += [f"warning: {w}" for w in result.warnings]
    lines.append(f"wrote {result.path}; next: ctracer report {result.path}")
    if result.failed > FEW_FAILED:
        # said last too: a long recording's first lines have scrolled away
        lines.append(f"warning: {result.failed} of {result.attached + result.failed} "
                     "functions could not be probed: their calls are not in the trace "
                     "(the kernel's reasons above and in the trace's functions table)")
    return lines
