"""Running generated probes with bcc: the only module of ctracer that imports bcc.

`ProbeSession` compiles a `ctracer.probes.uprobe.UprobeProgram`, attaches its entry and exit
probes to a binary (one function at a time: a function that fails, or whose probe the
verifier rejects, is recorded and the others go on), follows process ids, hands the
events to a callback (a batch at a time, back to back, read from the ring buffer's
memory map by `ctracer.record.ringbuf`), reports the lost count and detaches cleanly.

Probes are attached as uprobe.multi BPF links where the kernel has them (6.6+; found by
trying, per session): closing a link detaches its uprobes after one RCU grace period, and
links closed from parallel threads share it, so the 68 probes of the sample go in about
0.1 s instead of the 3.5-7.6 s that closing perf-event uprobes one by one takes here (each
waits for its own grace period under the kernel's event mutex).  Detaching is therefore
done before ctracer exits, never left to a background process: when ctracer has exited
(for any reason but SIGKILL) no probe of it is attached; after SIGKILL the kernel closes
the links as the process dies.  Kernels without uprobe.multi get bcc's perf-event
uprobes, closed in parallel too (slower, still before exit).

Before bcc is imported, `prepare` makes sure bcc will work here: root (or CAP_BPF +
CAP_PERFMON), kernel headers (`ctracer.host.headers` builds a merged tree when the
running kernel has none) and tracefs mounted
(`ctracer.host.tracefs.ensure_tracefs`; bcc's uprobe cleanup writes to it).  Every failure
a user can meet becomes a one-line `ctracer.errors.BPFUnavailable`.

bcc and clang print diagnostics on file descriptors 1 and 2; they are captured while
compiling and attaching and quoted in the error.  (An LLVM fatal error, which only a
generator bug can cause, still exits the process from inside clang.)
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import io
import os
import re
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence, Union

from ctracer.debuginfo.elf import uprobe_offset
from ctracer.errors import BPFUnavailable, CtracerError
from ctracer.deltas import RecordShape
from ctracer.event import event_size
from ctracer.probes import ProbeProgram, map_refs
from ctracer.probes.uprobe import ProbedFunction, UprobeProgram
from ctracer.record import ringbuf
from ctracer.record.kattach import AttachResult, KernelLinks, close_in_parallel
from ctracer.host.bpf_calls import BPF_LINK_CREATE, bpf_syscall

_CAP_SYS_ADMIN, _CAP_PERFMON, _CAP_BPF = 21, 38, 39
_PERF_EVENT_IOC_DISABLE = 0x2401
#: bpf(2) commands and struct bpf_prog_info offsets for the program statistics
_BPF_OBJ_GET_INFO_BY_FD, _BPF_ENABLE_STATS = 15, 32
_INFO_RUN_TIME_NS, _INFO_RUN_CNT = 192, 200
#: include/uapi/linux/bpf.h: enum bpf_attach_type, BPF_F_UPROBE_MULTI_RETURN
_TRACE_UPROBE_MULTI = 48
_UPROBE_MULTI_RETURN = 1
#: a kprobe-type program (bcc's BPF.KPROBE), which uprobes run
_PROG_TYPE_KPROBE = 2


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def check_privileges() -> None:
    """Refuse in one line unless the process may load BPF (root, CAP_SYS_ADMIN, or
    CAP_BPF with CAP_PERFMON)."""
    if os.geteuid() == 0:
        return
    caps = _effective_caps()
    if caps >> _CAP_SYS_ADMIN & 1 or (caps >> _CAP_BPF & 1 and caps >> _CAP_PERFMON & 1):
        return
    raise BPFUnavailable("tracing needs root (BPF programs and uprobes): run ctracer trace "
                         "as root, e.g. with sudo")


def prepare() -> None:
    """Everything bcc needs before it is imported and compiles anything."""
    check_privileges()
    from ctracer.host.headers import kernel_source_for_bcc
    source = kernel_source_for_bcc()
    if source:
        os.environ["BCC_KERNEL_SOURCE"] = source
    from ctracer.host.tracefs import ensure_tracefs  # bcc picks its tracefs path on import
    ensure_tracefs()


def _import_bcc():
    try:
        import bcc
    except ImportError:
        raise BPFUnavailable("bcc's Python module is missing: apt-get install python3-bpfcc "
                             "and run ctracer from a Python that sees it (scripts/setup.sh "
                             "makes one)") from None
    return bcc



def _verifier_message(text: str, failure: str) -> str:
    """The verifier's reason in one line: the last line of its log before the
    ``processed N insns`` summary, after what bcc said."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = next((ln for ln in lines if ln.startswith("bpf: Failed to load program")), failure)
    log = [ln for ln in lines if not ln.startswith(("bpf: Failed", "processed ", "HINT:"))
           and not ln.startswith("Failed to load")]
    return f"{first}: {log[-1]}" if log else first


#: program types `verify_programs` loads, by the name the probe plan gives them
_PROGRAM_TYPES = {"kprobe": "KPROBE", "raw_tracepoint": "RAW_TRACEPOINT"}


def verify_programs(text: str, names: Sequence[str], *,
                    tail_call: Optional[tuple[str, str]] = None,
                    timing=None, program_type: str = "kprobe") -> dict[str, str]:
    """Compile ``text`` once and load each program of ``names`` through the kernel's
    verifier, attaching none: name → "" when accepted, else the verifier's message.
    ``program_type`` ``kprobe`` is the type of kprobes, kretprobes, uprobes and
    uretprobes; ``raw_tracepoint`` that of raw tracepoint programs.

    ``tail_call`` = (program array, program): that program is loaded first and put at
    index 0 of the array, as the programs that tail-call it expect.  Each other
    program's descriptor is closed once loaded, so thousands fit under the open-file
    limit.  A text bcc cannot compile raises `BPFUnavailable`.  ``timing``, when given,
    has its ``compile_seconds`` and ``load_seconds`` increased by the time spent."""
    if program_type not in _PROGRAM_TYPES:
        raise ValueError(f"unknown program type {program_type!r}")
    prepare()
    bcc = _import_bcc()
    kind = getattr(bcc.BPF, _PROGRAM_TYPES[program_type])
    began = time.monotonic()
    b = _compile(bcc, text, _verify_flags(text), "bcc could not compile the programs to verify")
    compiled = time.monotonic()
    out: dict[str, str] = {}
    try:
        if tail_call is not None:
            table, program = tail_call
            out[program] = _load_one(b, kind, program, keep=True)
            if not out[program]:
                b[table.encode()][ctypes.c_int(0)] = ctypes.c_int(b.funcs[program.encode()].fd)
        for name in names:
            if name not in out:
                out[name] = _load_one(b, kind, name, keep=False)
        if timing is not None:
            timing.compile_seconds += compiled - began
            timing.load_seconds += time.monotonic() - compiled
    finally:
        _free(b)
    return out


def _verify_flags(text: str) -> list[str]:
    """bcc's flags for a text compiled to be loaded, not recorded with: without debug
    info (BTF line info), half the compile time, the same bytecode; a task storage map
    needs the BTF of its types, so a text declaring one keeps it."""
    return [] if "BPF_TASK_STORAGE(" in text else ["-g0"]


@contextmanager
def compiled(text: str) -> Iterator[Callable[[str], bytes]]:
    """``text`` compiled once by bcc, loading nothing: yields a function giving the
    map-relocated instructions of each program of it by name (for loads of another
    type than bcc's, like fentry programs bound to a function); the maps bcc made are
    freed on leaving.  A text bcc cannot compile raises `BPFUnavailable`."""
    prepare()
    b = _compile(_import_bcc(), text, _verify_flags(text), "bcc could not compile the programs")
    try:
        yield lambda name: _instructions(b, name)
    finally:
        _free(b)


def _free(b) -> None:
    """A bcc module's maps and programs freed; what bcc prints or raises while freeing
    is not the user's concern (the recording is over or never began)."""
    with _captured_output():
        try:
            b.cleanup()
        except Exception:
            pass


def _load_one(b, kind: int, name: str, keep: bool) -> str:
    with _captured_output() as diagnostics:
        try:
            fn = b.load_func(name.encode(), kind)
        except Exception as e:
            failure = str(e).splitlines()[0] if str(e) else type(e).__name__
        else:
            failure = ""
    if failure:
        return _verifier_message(diagnostics.getvalue(), failure)
    if not keep:
        os.close(fn.fd)
        del b.funcs[name.encode()]
    return ""


@contextmanager
def _captured_output(fatal: Optional[str] = None) -> Iterator[io.StringIO]:
    """bcc and clang print diagnostics straight to file descriptors 1 and 2: keep them
    so an error can quote them in one line instead of spilling a page on the terminal.

    ``fatal``: what is being done, for a compile.  LLVM ends the process itself on some
    errors (``exit(1)`` from its error handler: "BPF stack limit ... exceeded"), and the
    words it printed would die with the file they were kept in; so a watcher process,
    forked first (it holds the real stderr and the file), waits for the end of the work:
    told it is over, it says nothing; finding the process gone instead, it prints one
    line, ``fatal`` and the compiler's error, on the real stderr (`_report_if_fatal`)."""
    out = io.StringIO()
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        watcher = _fork_watcher(tmp.fileno(), fatal) if fatal else None
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        for fd in saved:
            os.dup2(tmp.fileno(), fd)
        try:
            yield out
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            if watcher is not None:
                _dismiss_watcher(*watcher)
            tmp.seek(0)
            out.write(tmp.read().decode("utf-8", "replace"))


#: what the process tells its watcher when the work ended without LLVM ending it
_WORK_DONE = b"done"


def _fork_watcher(captured: int, fatal: str) -> Optional[tuple[int, int]]:
    """(pid, the pipe's write end) of a process watching this one through a pipe (see
    `_captured_output`); None where it cannot be forked (the work goes on unwatched)."""
    try:
        r, w = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return None
    if pid == 0:   # the watcher: a few system calls, then _exit
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C is the process's
            os.close(w)
            _report_if_fatal(r, captured, fatal)
        finally:
            os._exit(0)
    os.close(r)
    return pid, w


def _report_if_fatal(pipe: int, captured: int, fatal: str) -> None:
    """In the watcher: read the pipe to its end; without `_WORK_DONE` the process died
    in the work: print the compiler's error (an error line of the captured output;
    nothing when there is none: killed, say) as ctracer's one line."""
    told = b""
    while True:
        chunk = os.read(pipe, 64)
        if not chunk:
            break
        told += chunk
    if _WORK_DONE in told:
        return
    size = os.fstat(captured).st_size
    text = os.pread(captured, size, 0).decode("utf-8", "replace") if size else ""
    if not any("error" in line.lower() for line in text.splitlines()):
        return
    os.write(2, f"ctracer: error: {fatal}: {_first_error(text)}\n".encode())


def _dismiss_watcher(pid: int, pipe: int) -> None:
    try:
        os.write(pipe, _WORK_DONE)
    except OSError:
        pass   # it is gone already
    os.close(pipe)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _compile(bcc, text: str, cflags: list[str], failing: str):
    """``bcc.BPF`` of the C ``text``; what it cannot compile is `BPFUnavailable`,
    ``failing`` followed by the compiler's first error."""
    with _captured_output(fatal=failing) as diagnostics:
        try:
            return bcc.BPF(text=text.encode(), cflags=cflags)
        except Exception as e:  # bcc raises plain Exception
            failure = str(e)
    detail = _first_error(diagnostics.getvalue()) or failure.splitlines()[0]
    raise BPFUnavailable(f"{failing}: {detail}")


#: LLVM's words for a backend error in one program: "/virtual/main.c:0:0: in function
#: NAME TYPE: MESSAGE" (the program's name, then clang's message)
_IN_FUNCTION = re.compile(r"^(?:\S+:\d+:\d+: )?in function (\w+) [^:]*: (.*)$")


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if "error:" in line:
            error = line.split("error:", 1)[1].strip()
            named = _IN_FUNCTION.match(error)
            return f"in program {named.group(1)}: {named.group(2)}" if named else error
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class ProbeSession:
    """One compiled program and its attachments; use as a context manager."""

    def __init__(self, program: ProbeProgram, binary: Optional[str],
                 on_event: Callable[..., None]):
        """``on_event`` receives one or more whole events, back to back, and with
        ``starts=`` where each ring record starts in them when that is known."""
        self.program = program
        self.binary = os.path.realpath(binary) if binary else None
        self.on_event = on_event
        self.bpf = None
        self.results: list[AttachResult] = []
        self.compile_seconds = 0.0
        self.attach_seconds = 0.0
        #: of `compile_seconds`: the fallback's compile, made while attaching
        self._fallback_seconds = 0.0
        self._callback = None
        #: events delivered since the current poll began, and when a poll must yield
        self._delivered = 0
        self._budget = 0
        #: the last poll stopped at its budget with events left in the ring buffer
        self._backlog = False
        #: the ring buffer read through its memory map (`ctracer.record.ringbuf`);
        #: None where libbpf's consumer calls `on_event` once per event instead
        self._ring: Optional[ringbuf.MappedRing] = None
        #: every event stamped at or before this time (the monotonic clock's ns, the
        #: one the probes stamp with) has been delivered; None: not known (libbpf's
        #: consumer).  A probe stamps its event after reserving it, so once a take has
        #: found no record reserved before it left in the ring, every event stamped
        #: before the take began was delivered.
        self.delivered_before_ns: Optional[int] = None
        #: set (e.g. from a signal handler) to make the current poll return at once
        self.interrupted = False
        #: uprobe.multi link fds, one per attached probe
        self._links: list[int] = []
        #: whether this kernel takes uprobe.multi links (None: not tried yet)
        self._multi: Optional[bool] = None
        #: the kernel functions' programs and links (`ctracer.record.kattach`)
        self.kernel_links: Optional[KernelLinks] = None
        #: C compiled with the probes: the write breakpoints' program (``--watch``,
        #: `ctracer.probes.watch`), "" without
        self.extra_text = ""
        self._writes_open = False
        self._write_callback = None
        self._stats_fd = -1

    # -- set-up ---------------------------------------------------------------

    def compile(self) -> None:
        prepare()
        bcc = _import_bcc()
        start = time.monotonic()
        self.bpf = _compile(bcc, self.program.text + self.extra_text, [],
                            "bcc could not compile or load the probes")
        self.compile_seconds = time.monotonic() - start

        def deliver(_ctx, data, size):
            self.on_event(ctypes.string_at(data, size))
            self._delivered += 1
            # A negative return makes libbpf stop consuming (this event is consumed):
            # without it, a poll keeps going as long as producers keep up with us.
            if self.interrupted or (self._budget and self._delivered >= self._budget):
                return -1
            return 0

        self._callback = deliver
        self._describe_kernel_functions()
        events = self.bpf[b"ctracer_events"]
        if ringbuf.supported():
            self._ring = ringbuf.MappedRing(events.map_fd, self.program.ring_bytes,
                                            event_size(self.program.mini, self.program.nargs),
                                            whole=getattr(self.program, "compact", False),
                                            shape=RecordShape(self.program.mini,
                                                              self.program.nargs))
        elif getattr(self.program, "compact", False):
            events.open_ring_buffer(_as_ring_record(deliver))
        else:
            events.open_ring_buffer(deliver)

    def _describe_kernel_functions(self) -> None:
        """Each probed kernel function's row of ``ctracer_kfns`` (its index is its
        links' cookie) and each raw tracepoint's row of ``ctracer_tps`` (its index is
        written into its program): what the generic programs read to know them."""
        from ctracer.probes import kfunctions, tracepoint
        for name, rows in ((b"ctracer_kfns", [(f.index, kfunctions.descriptor_bytes(f))
                                               for f in getattr(self.program, "kfunctions", ())]),
                           (b"ctracer_tps", [(t.index, tracepoint.descriptor_bytes(t))
                                             for t in getattr(self.program, "tracepoints", ())])):
            if not rows:
                continue
            table = self.bpf[name]
            for index, data in rows:
                table[table.Key(index)] = table.Leaf.from_buffer_copy(data)

    def instructions(self, name: str) -> bytes:
        """The compiled, map-relocated instructions of one program of the text."""
        return _instructions(self.bpf, name)

    def fallback_instructions(self, functions: Sequence) -> dict[str, bytes]:
        """The fallback kind's programs for the kernel ``functions`` the kernel refused
        the recording's kind on (`ctracer.probes.kernel_program.KernelProgram.
        fallback_text`), by name: compiled now, apart, their map references pointed at
        this session's maps (`ctracer.probes.map_refs`), the maps that compile made
        freed at once.  The compile's time counts in `compile_seconds` (and not in
        `attach_seconds`)."""
        start = time.monotonic()
        extra = _compile(_import_bcc(), self.program.fallback_text(functions), [],
                         "bcc could not compile the fallback's programs")
        try:
            ours = {name: _table_fd(self.bpf, name) for name in _table_names(extra)}
            fds = {_table_fd(extra, name): fd for name, fd in ours.items() if fd >= 0}
            code = {name: map_refs.repoint(_instructions(extra, name), fds)
                    for name in _function_names(extra)}
        finally:
            extra.cleanup()
            spent = time.monotonic() - start
            self.compile_seconds += spent
            self._fallback_seconds += spent
        return code

    # -- write breakpoints (--watch) -------------------------------------------

    def write_program_fd(self) -> int:
        """Load the write breakpoints' program (type perf_event) and return its fd, for
        `ctracer.record.breakpoints.Breakpoint`."""
        bcc = _import_bcc()
        with _captured_output() as diagnostics:
            try:
                fn = self.bpf.load_func(b"ctracer_on_write", bcc.BPF.PERF_EVENT)
            except Exception as e:
                detail = _first_error(diagnostics.getvalue())
                raise BPFUnavailable(f"the kernel refused the write breakpoints' program: "
                                     f"{e}{': ' + detail if detail else ''}") from None
        return fn.fd

    def open_writes(self, callback: Callable[[bytes], None]) -> None:
        """Hand each record of the writes' ring buffer to ``callback`` (at every poll)."""
        def deliver(_ctx, data, size):
            callback(ctypes.string_at(data, size))
            return 0

        self._write_callback = deliver
        self.bpf[b"ctracer_writes"].open_ring_buffer(deliver)
        self._writes_open = True

    def take_writes(self) -> None:
        if self._writes_open and self.bpf is not None:
            self.bpf.ring_buffer_consume()

    def writes_lost(self) -> int:
        if not self._writes_open or self.bpf is None:
            return 0
        return int(sum(self.bpf[b"ctracer_writes_lost"][ctypes.c_int(0)]))

    def enable_program_stats(self) -> None:
        """Have the kernel time every BPF program while this session lives
        (BPF_ENABLE_STATS; off again when the fd closes)."""
        attr = ctypes.create_string_buffer(16)   # enable_stats.type = BPF_STATS_RUN_TIME (0)
        fd, _err = bpf_syscall(_BPF_ENABLE_STATS, attr)
        self._stats_fd = fd

    def program_stats(self, name: bytes) -> Optional[tuple[int, int]]:
        """(run time ns, runs) of a loaded program, when the stats are on."""
        if self.bpf is None or self._stats_fd < 0 or name not in self.bpf.funcs:
            return None
        info = ctypes.create_string_buffer(256)
        attr = ctypes.create_string_buffer(16)
        ctypes.c_uint32.from_buffer(attr, 0).value = self.bpf.funcs[name].fd
        ctypes.c_uint32.from_buffer(attr, 4).value = len(info)
        ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(info)
        fd, _err = bpf_syscall(_BPF_OBJ_GET_INFO_BY_FD, attr)
        if fd < 0:
            return None
        return (ctypes.c_uint64.from_buffer(info, _INFO_RUN_TIME_NS).value,
                ctypes.c_uint64.from_buffer(info, _INFO_RUN_CNT).value)

    def follow(self, pid: int) -> None:
        """Record process ``pid`` (and the children it forks from now on)."""
        if not self.program.filtered:
            raise ValueError("the program was built without a process filter")
        self.bpf[b"ctracer_pids"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def attach(self) -> list[AttachResult]:
        """Entry then exit probe of every function; failures are kept, not raised,
        unless nothing at all could be attached."""
        start = time.monotonic()
        self.results = []
        # a kernel program's probes stay silent until the last one is attached, so the
        # recording starts at one instant on every function and tracepoint (attaching
        # thousands of fentry programs takes minutes on a slow machine)
        self._set_stopped(True)
        functions = getattr(self.program, "kfunctions", ())
        tracepoints = getattr(self.program, "tracepoints", ())
        if functions or tracepoints:
            from ctracer.record.kattach import btf_targets
            self.kernel_links = KernelLinks(self.program.entry_kind, functions,
                                            self.instructions,
                                            btf_targets(functions) if functions else
                                            (lambda f: None), tracepoints=tracepoints,
                                            context_probes=getattr(self.program,
                                                                   "context_probes", ()),
                                            task_storage=getattr(self.program,
                                                                 "task_storage", False),
                                            fallback_kind=getattr(self.program,
                                                                  "fallback_kind", None),
                                            fallback_code=self.fallback_instructions)
            self.results.extend(self.kernel_links.attach())
        for f in self.program.functions:
            r = AttachResult(f)
            r.entry = self._attach_one(f, f.entry_probe, retprobe=False)
            if not r.entry:
                r.exit = self._attach_one(f, f.exit_probe, retprobe=True)
            self.results.append(r)
        self.attach_seconds = time.monotonic() - start - self._fallback_seconds
        self._set_stopped(False)
        if self.results and not any(r.ok for r in self.results):
            first = self.results[0]
            raise BPFUnavailable(f"no probe could be attached (e.g. {first.function.name}: "
                                 f"{first.entry})")
        return self.results

    def _attach_one(self, f: ProbedFunction, probe: str, retprobe: bool) -> str:
        """Attach one probe; "" when done, else why not (a refused load quotes the
        verifier)."""
        if self._multi is not False:
            failure = self._link_one(f, probe, retprobe)
            if not failure or self._multi:
                return failure
            # the kernel may lack uprobe.multi: try bcc's perf-event uprobe; if that
            # works, this kernel gets perf-event uprobes from now on
            self._forget_program(probe)
        attach = self.bpf.attach_uretprobe if retprobe else self.bpf.attach_uprobe
        with _captured_output() as diagnostics:
            try:
                attach(name=self.binary.encode(), addr=f.address, fn_name=probe.encode())
            except Exception as e:
                failure = str(e).splitlines()[0] if str(e) else type(e).__name__
            else:
                failure = ""
        if failure:
            detail = _first_error(diagnostics.getvalue())
            return f"{failure}{': ' + detail if detail else ''}"
        if self._multi is None:
            self._multi = False
        return ""

    def _link_one(self, f: ProbedFunction, probe: str, retprobe: bool) -> str:
        """Load ``probe`` for uprobe.multi and link it to ``f``'s entry (or return)."""
        with _captured_output() as diagnostics:
            try:
                fn = self.bpf.load_func(probe.encode(), _PROG_TYPE_KPROBE,
                                        attach_type=_TRACE_UPROBE_MULTI)
            except Exception as e:  # bcc raises plain Exception; the log went to fd 2
                failure = str(e).splitlines()[0] if str(e) else type(e).__name__
            else:
                failure = ""
        if failure:
            detail = _first_error(diagnostics.getvalue())
            return f"{failure}{': ' + detail if detail else ''}"
        try:
            offset = uprobe_offset(self.binary, f.address)
        except CtracerError as e:
            return str(e)
        fd, err = _link_uprobe_multi(fn.fd, self.binary, offset, retprobe)
        if fd < 0:
            return f"the kernel refused the uprobe link ({errno.errorcode.get(err, err)}: " \
                   f"{os.strerror(err)})"
        self._links.append(fd)
        self._multi = True
        return ""

    def _forget_program(self, probe: str) -> None:
        """Unload a probe loaded for uprobe.multi, so bcc loads it afresh for perf."""
        fn = self.bpf.funcs.pop(probe.encode(), None)
        if fn is not None:
            os.close(fn.fd)

    # -- running --------------------------------------------------------------

    def poll(self, timeout_ms: int = 50, budget: int = 20000) -> int:
        """Wait up to ``timeout_ms`` (less when a CPU of the probes wakes us: they do
        once per batch, see `ctracer.probes.ctext.submit_function`), then deliver what
        the ring buffer holds, at most about ``budget`` events; the number delivered.
        The timeout is thus how late an event may be delivered (``--tail``)."""
        if self._backlog:  # the last call left events behind: no wake-up may come
            timeout_ms = 0
        self.take_writes()
        if self._ring is not None:
            if timeout_ms:
                self._ring.wait(timeout_ms / 1000)
            self._delivered = self._take(budget)
            self._backlog = self._delivered >= budget
            return self._delivered
        self._delivered, self._budget = 0, budget
        self.bpf.ring_buffer_poll(timeout_ms)
        if not self.interrupted and self._delivered < budget:
            # the probes submit without waking us: take what they left since
            self.bpf.ring_buffer_consume()
        self._backlog = self._delivered >= budget
        return self._delivered

    def begin_stop(self) -> threading.Thread:
        """Stop every probe, now: the ``ctracer_stopped`` flag ends emission at once (the
        uprobe programs read it); a thread then detaches every probe at the same time
        (uprobe.multi links, raw tracepoints, the fork-following tracepoints: each close
        waits for a grace period, and closes at the same time share one; the kernel
        functions' links through `KernelLinks.close_links`), while the
        caller takes what the ring buffer holds.  Perf-event uprobes are disabled
        (`close` detaches them).  Join the thread returned: once it has ended no probe
        runs, so nothing more reaches the ring buffer."""
        self._stop_emitting()
        fds, self._links = self._links, []
        if self.bpf is not None:
            for attached in (self.bpf.raw_tracepoint_fds, self.bpf.tracepoint_fds):
                fds += attached.values()  # closed here: bcc's cleanup must not again
                attached.clear()
            for fd in self.bpf.uprobe_fds.values():
                try:
                    fcntl.ioctl(fd, _PERF_EVENT_IOC_DISABLE, 0)
                except OSError:
                    pass
        kernel_links = self.kernel_links

        def detach() -> None:
            if kernel_links is None:
                close_in_parallel(fds)
                return
            # the kernel functions' links (`KernelLinks.close_links`)
            # while the rest close beside them
            rest = threading.Thread(target=close_in_parallel, args=(fds,), daemon=True)
            rest.start()
            kernel_links.close_links()
            rest.join()

        closing = threading.Thread(target=detach, name="ctracer-detach", daemon=True)
        closing.start()
        return closing

    def stop_probes(self) -> None:
        """Stop every probe from firing and return once they are all detached."""
        self.begin_stop().join()

    def drain(self) -> None:
        """Deliver every event in the buffer (stop the probes first, or this runs as
        long as they keep producing)."""
        self.interrupted = False
        if self._ring is not None:
            while self._take(0):
                pass
            return
        self._delivered, self._budget = 0, 0
        self.bpf.ring_buffer_consume()

    def _take(self, limit: int) -> int:
        """Hand what the mapped ring holds (at most ``limit`` records) to `on_event`
        (`ctracer.record.ringbuf.MappedRing.deliver`); the number of records taken."""
        began = time.monotonic_ns()
        taken = self._ring.deliver(self.on_event, limit)
        if self._ring.drained:
            self.delivered_before_ns = began
        return taken

    def _stop_emitting(self) -> None:
        """Make every probe stop emitting at one instant (the programs read the
        ``ctracer_stopped`` flag), so the trace ends cleanly although the links go one
        by one: no call is missing from its middle.  Programs without the flag (the
        kernel's tracepoints, detached at once) are left alone."""
        self._set_stopped(True)

    def _set_stopped(self, stopped: bool) -> None:
        """Set the ``ctracer_stopped`` flag the programs read (where they have one)."""
        if self.bpf is None:
            return
        try:
            table = self.bpf[b"ctracer_stopped"]
        except KeyError:
            return
        table[ctypes.c_int(0)] = ctypes.c_uint8(int(stopped))

    def followed(self) -> list[int]:
        """The process ids the program records now (those given to `follow` and the
        children they forked since, while alive); empty when it records every process."""
        if self.bpf is None or not self.program.filtered:
            return []
        return [int(k.value) for k in self.bpf[b"ctracer_pids"].keys()]

    def misses(self) -> dict[str, int]:
        """Calls the kernel ran no probe for: fentry/fexit recursion, kprobe.multi
        misses (`ctracer.record.kattach.KernelLinks.missed`); {} without functions."""
        return self.kernel_links.missed() if self.kernel_links is not None else {}

    def ring_fullest(self) -> Optional[int]:
        """The most bytes the reader found waiting in the ring buffer at a take
        (`ctracer.record.ringbuf.MappedRing.fullest`); None where libbpf's consumer reads
        it."""
        return self._ring.fullest if self._ring is not None else None

    def lost(self) -> int:
        """Events the programs could not write to the ring buffer (their ``ctracer_lost``
        counter)."""
        table = self.bpf[b"ctracer_lost"]
        return int(sum(table[ctypes.c_int(0)]))

    # -- ``--calls changes`` (`ctracer.probes.folding`, `ctracer.record.folds`)

    def fold_generation(self, generation: Optional[int] = None) -> int:
        """The fold map the programs add to (0 or 1); set it first when given."""
        table = self.bpf[b"ctracer_fold_gen"]
        if generation is not None:
            table[ctypes.c_int(0)] = ctypes.c_uint32(generation)
        return int(table[ctypes.c_int(0)].value)

    def take_folds(self, generation: int) -> list[tuple[int, ...]]:
        """Every row of fold map ``generation``, emptied (no program may be adding to
        it): (object, function_id, caller_id, caller_object, calls, total_ns, max_ns,
        first_ns, last_ns, since_ns)."""
        table = self.bpf[f"ctracer_folds_{int(generation)}".encode()]
        try:
            # one system call a few thousand rows: a lookup and a delete a row from
            # Python took the reader past a quarter second a commit with every method of
            # sock folding (6.12 guest: 117,115 events lost, none with --calls all)
            pairs = list(table.items_lookup_and_delete_batch())
        except Exception:   # bcc says only "...BATCH has failed" (a kernel before 5.6)
            pairs = None
        if pairs is None:
            pairs = []
            for key, value in table.items():
                pairs.append((key, value))
                try:
                    del table[key]
                except KeyError:
                    pass
        return [(key.object, key.function_id, key.caller_id, key.caller_object,
                 value.calls, value.total_ns, value.max_ns, value.first_ns,
                 value.last_ns, key.since_ns) for key, value in pairs]

    def folds_refused(self) -> int:
        """Calls that would have been folded but found their fold map full (written)."""
        return int(sum(self.bpf[b"ctracer_fold_refused"][ctypes.c_int(0)]))

    def close(self) -> None:
        """Detach everything and unload the programs, before returning (see the module
        docstring for why this is quick)."""
        if self.bpf is None:
            return
        self.stop_probes()
        if self._stats_fd >= 0:
            os.close(self._stats_fd)
            self._stats_fd = -1
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        bpf, self.bpf = self.bpf, None
        if self.kernel_links is not None:
            self.kernel_links.close()
        close_in_parallel(list(bpf.uprobe_fds.values()))
        bpf.uprobe_fds.clear()
        _free(bpf)

    def __enter__(self) -> "ProbeSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _instructions(bpf, name: str) -> bytes:
    """The compiled, map-relocated instructions of program ``name`` of a bcc module."""
    lib = _import_bcc().libbcc.lib
    start = lib.bpf_function_start(bpf.module, name.encode())
    if not start:
        raise CtracerError(f"the compiled probes have no program {name}")
    return ctypes.string_at(start, lib.bpf_function_size(bpf.module, name.encode()))


def _table_names(bpf) -> list[str]:
    """The names of a bcc module's maps (libbcc's calls for them, which bcc's Python
    module does not type)."""
    lib = _import_bcc().libbcc.lib
    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return [lib.bpf_table_name(bpf.module, i).decode()
            for i in range(lib.bpf_num_tables(bpf.module))]


def _function_names(bpf) -> list[str]:
    """The names of a bcc module's programs."""
    lib = _import_bcc().libbcc.lib
    return [lib.bpf_function_name(bpf.module, i).decode()
            for i in range(lib.bpf_num_functions(bpf.module))]


def _table_fd(bpf, name: str) -> int:
    """The fd of a bcc module's map ``name`` (-1 when it has none)."""
    return _import_bcc().libbcc.lib.bpf_table_fd(bpf.module, name.encode())


def _link_uprobe_multi(prog_fd: int, path: str, offset: int,
                       retprobe: bool) -> tuple[int, int]:
    """BPF_LINK_CREATE of a uprobe.multi link on one file offset of ``path``, for every
    process (the program filters processes itself); (fd, 0) or (-1, errno)."""
    path_buf = ctypes.create_string_buffer(os.fsencode(path))
    offsets = (ctypes.c_uint64 * 1)(offset)
    attr = ctypes.create_string_buffer(128)
    # link_create: prog_fd @0, target_fd @4, attach_type @8, flags @12; uprobe_multi:
    # path @16, offsets @24, ref_ctr_offsets @32, cookies @40, cnt @48, flags @52, pid @56
    ctypes.c_uint32.from_buffer(attr, 0).value = prog_fd
    ctypes.c_uint32.from_buffer(attr, 8).value = _TRACE_UPROBE_MULTI
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(path_buf)
    ctypes.c_uint64.from_buffer(attr, 24).value = ctypes.addressof(offsets)
    ctypes.c_uint32.from_buffer(attr, 48).value = 1
    ctypes.c_uint32.from_buffer(attr, 52).value = _UPROBE_MULTI_RETURN if retprobe else 0
    return bpf_syscall(BPF_LINK_CREATE, attr)


def attach_summary(results: Sequence[AttachResult]) -> tuple[int, int]:
    """(functions attached, functions that failed)."""
    ok = sum(1 for r in results if r.ok)
    return ok, len(results) - ok


def row_attachments(program: UprobeProgram,
                    results: Sequence[AttachResult]) -> dict[int, str]:
    """The ``attached`` text for every function-table row id."""
    out = {row.id: row.attached for row in program.rows}
    for r in results:
        for row_id in r.function.row_ids:
            out[row_id] = r.attached
    return out



def _as_ring_record(deliver):
    """A libbpf callback (one event's payload) handing on the event as the mapped ring
    would (`ctracer.record.ringbuf.MappedRing`'s whole records): compact events are kept
    with their ring header."""
    import struct

    def callback(ctx, data, size):
        payload = ctypes.string_at(data, size)
        record = struct.pack("<II", size, 0) + payload + bytes(-size % 8)
        return deliver(ctx, ctypes.cast(ctypes.c_char_p(record), ctypes.c_void_p), len(record))
    return callback
