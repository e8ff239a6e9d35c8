"""Attaching the compiled kernel-function programs (`ctracer.probes.kfunctions`) to many
functions with bpf(2) itself: bcc compiles them once and creates their maps; this module
loads the instructions bcc produced and links them.

* fentry/fexit: a tracing program is bound to one function's BTF id when it is loaded,
  so the same instructions are loaded once per target (the verifier checks each clone)
  and linked with ``BPF_LINK_CREATE``, the function's index as the link's cookie (what
  the program reads with ``bpf_get_attach_cookie``); functions of modules name their
  module's BTF object.  Loads and links run from a few threads at once.
* fentry.multi/fexit.multi: the same fentry and fexit programs, each loaded once per BTF
  object its functions are in (no function named at load: the link names them) and
  linked to all of them with one tracing_multi link, the BTF ids of the functions and
  their indexes as cookies.  The kernel takes such a link whole or not at all: where it
  refuses one, the functions are split in halves and each half linked apart, down to
  the single functions it refuses (named with its reason: a link carries no verifier
  log, so an empty plain fentry/fexit is loaded on such a function to read the kernel's
  words, e.g. "The function tcp_v6_send_response has 14 arguments. Too many."); each
  function's entry and exit are both attached or neither.
* fsession.multi: one session program per route count running a function's entry and
  exit (`ctracer.probes.kfunctions`), its ``bpf_session_is_return`` placeholder call
  rewritten into the kfunc's call (`ctracer.probes.kfunc_calls`), loaded once per BTF
  object and linked like fentry.multi: one link per (program, BTF object), split where
  the kernel refuses a function (asked as an fexit for its words).  A detach closes one
  link per function instead of an entry link and an exit link, each of which rebuilds
  the function's trampoline.
* kprobe/kretprobe: each program is loaded once; with kprobe.multi one link per
  program carries every function's symbol and cookie; without it, one perf kprobe per
  function (``perf_event_open`` on the kprobe PMU) linked with its cookie.
* two kinds in one recording: once the trampoline kind's links are up, the functions
  planned on kprobes beside it (more than 12 arguments, a struct returned by value,
  variable arguments) and those the kernel refused the trampoline kind on (where
  kprobes are the fallback kind and a kprobe program can read the function:
  `KernelFunction.kprobe_ready`) are attached with the kprobe programs, as above
  (`KernelLinks._attach_functions`); the first refusal is kept (`fell_back_from`).
  The text holds the kprobe programs of the functions planned on kprobes only: those of
  the refused functions are compiled then, apart, and only if the kernel refused any
  (`KernelLinks.fallback_code`).

Where the text keeps the thread state in task storage (`ctracer.probes.kfunctions`), each
task-storage program the functions use is loaded once first, nothing attached: if the
kernel refuses one whose LRU-hash variant it takes (6.1's verifier finds the kretprobe
programs of more routes too complex, E2BIG), every function of the kind gets its LRU-hash
variant, so one place counts each thread's depth (`KernelLinks.thread_state` says which
and why).

Every function that cannot be loaded or attached is kept with the kernel's reason;
nothing is dropped silently.  `KernelLinks.close` closes the links from parallel threads
(each close waits for a grace period; closes at the same time share one; the kernel
takes tracing_multi links one at a time whatever the order, and an order of its own
measured no gain on 7.2: docs/kernel-measurements.md).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ctracer.errors import CtracerError
from ctracer.probes import kfunc_calls
from ctracer.probes.kfunctions import SESSION_KINDS, KernelFunction, probe_kinds
from ctracer.host.bpf_calls import (BPF_LINK_CREATE, MULTI_ATTACH_BTF_ID, RETURN_ZERO,
                                    TRACE_FENTRY_MULTI, TRACE_FEXIT_MULTI,
                                    TRACE_FSESSION_MULTI, TRACE_KPROBE_MULTI, bpf_syscall,
                                    errno_text, kprobe_multi_link, tracing_multi_link)

_BPF_PROG_LOAD = 5
_BPF_OBJ_GET_INFO_BY_FD = 15
_BPF_BTF_GET_FD_BY_ID = 19
_BPF_BTF_GET_NEXT_ID = 23
_PROG_TYPE_KPROBE = 2
_PROG_TYPE_TRACING = 26
_PROG_TYPE_RAW_TRACEPOINT = 17
_BPF_RAW_TRACEPOINT_OPEN = 17
_TRACE_FENTRY, _TRACE_FEXIT = 24, 25
_PERF_EVENT = 41
_ATTACH_TYPE = {"fentry": _TRACE_FENTRY, "fexit": _TRACE_FEXIT,
                "fentry.multi": TRACE_FENTRY_MULTI, "fexit.multi": TRACE_FEXIT_MULTI,
                "fsession.multi": TRACE_FSESSION_MULTI}
_MULTI_KINDS = ("fentry.multi", "fexit.multi", "fsession.multi")
_NR_PERF_EVENT_OPEN = 298  # x86_64
_PMU_DIR = "/sys/bus/event_source/devices/kprobe"
#: threads loading and linking fentry clones at once
LOADERS = 4
#: fentry/fexit functions a task-storage program is tried on before attaching
TRIAL_TARGETS = 3


@dataclass
class AttachResult:
    """How one probed function (or tracepoint) went: "" for attached, else why not."""

    function: object   # anything with ``name`` and ``row_ids``
    entry: str = ""
    exit: str = ""
    #: what an attached function got: "entry,exit" (uprobes), "raw_tracepoint",
    #: "fsession.multi", "fentry.multi,fexit.multi", "fentry,fexit", "kprobe,kretprobe"
    kind: str = "entry,exit"

    @property
    def complete(self) -> bool:
        """Whether every entry and exit program attached."""
        return not self.entry and not self.exit

    @property
    def attached(self) -> str:
        if not self.entry and not self.exit:
            return self.kind
        if self.entry:
            return f"failed: {self.entry}"
        return f"entry only; exit failed: {self.exit}"

    @property
    def ok(self) -> bool:
        """Whether the entry programs attached."""
        return not self.entry


def load_program(insns: bytes, prog_type: int, attach_type: int = 0, btf_id: int = 0,
                 btf_obj_fd: int = 0, name: bytes = b"ctracer") -> tuple[int, str]:
    """BPF_PROG_LOAD of ``insns``; (fd, "") or (-1, why, with the verifier's last
    line when it refused)."""
    code = ctypes.create_string_buffer(insns, len(insns))
    license_ = ctypes.create_string_buffer(b"GPL")
    for log_size in (0, 1 << 20):
        log = ctypes.create_string_buffer(log_size) if log_size else None
        attr = ctypes.create_string_buffer(144)
        ctypes.c_uint32.from_buffer(attr, 0).value = prog_type
        ctypes.c_uint32.from_buffer(attr, 4).value = len(insns) // 8
        ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(code)
        ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(license_)
        if log is not None:
            ctypes.c_uint32.from_buffer(attr, 24).value = 1
            ctypes.c_uint32.from_buffer(attr, 28).value = log_size
            ctypes.c_uint64.from_buffer(attr, 32).value = ctypes.addressof(log)
        attr[48:48 + min(15, len(name))] = name[:15]
        ctypes.c_uint32.from_buffer(attr, 68).value = attach_type
        ctypes.c_uint32.from_buffer(attr, 108).value = btf_id
        ctypes.c_uint32.from_buffer(attr, 112).value = btf_obj_fd
        fd, err = bpf_syscall(_BPF_PROG_LOAD, attr)
        if fd >= 0:
            return fd, ""
        if log is None and err in (errno.EACCES, errno.EINVAL):
            continue  # load again with the verifier's log, to say why
        lines = [l for l in (log.value.decode("utf-8", "replace").splitlines() if log else [])
                 if l.strip() and not l.startswith(("processed ", "verification time"))]
        why = f"the kernel refused to load it ({errno_text(err)})"
        return -1, f"{why}: {lines[-1][:200]}" if lines else why
    return -1, "unreachable"


def load_per_function(kind: str, insns: bytes, name: str,
                      target: Optional[tuple[int, int]] = None) -> tuple[int, str]:
    """`load_program` of a kprobe or kretprobe program (``target`` None), or of an
    fentry or fexit program bound to ``target`` (its BTF object's fd, the function's BTF
    id: `btf_targets`)."""
    if target is None:
        return load_program(insns, _PROG_TYPE_KPROBE, name=name.encode())
    return load_program(insns, _PROG_TYPE_TRACING, _ATTACH_TYPE[kind], target[1], target[0],
                        name.encode())


def _link(prog_fd: int, attach_type: int, target_fd: int = 0, *,
          cookie: Optional[int] = None, cookie_at: int = 24) -> tuple[int, int]:
    attr = ctypes.create_string_buffer(64)
    ctypes.c_uint32.from_buffer(attr, 0).value = prog_fd
    ctypes.c_uint32.from_buffer(attr, 4).value = target_fd
    ctypes.c_uint32.from_buffer(attr, 8).value = attach_type
    if cookie is not None:
        ctypes.c_uint64.from_buffer(attr, cookie_at).value = cookie
    return bpf_syscall(BPF_LINK_CREATE, attr)


# ------------------------------------------------------------------ BTF objects

def module_btf_fds() -> dict[str, int]:
    """An fd of every loaded kernel BTF object by name (``vmlinux``, module names)."""
    out: dict[str, int] = {}
    next_id = 0
    while True:
        attr = ctypes.create_string_buffer(16)
        ctypes.c_uint32.from_buffer(attr, 0).value = next_id
        ret, err = bpf_syscall(_BPF_BTF_GET_NEXT_ID, attr)
        if ret < 0:
            return out
        next_id = ctypes.c_uint32.from_buffer(attr, 4).value
        fattr = ctypes.create_string_buffer(16)
        ctypes.c_uint32.from_buffer(fattr, 0).value = next_id
        fd, _ = bpf_syscall(_BPF_BTF_GET_FD_BY_ID, fattr)
        if fd < 0:
            continue
        name = ctypes.create_string_buffer(64)
        info = ctypes.create_string_buffer(32)
        ctypes.c_uint64.from_buffer(info, 16).value = ctypes.addressof(name)
        ctypes.c_uint32.from_buffer(info, 24).value = 64
        got = _object_info(fd, 32, info)
        kernel_btf = ctypes.c_uint32.from_buffer(info, 28).value
        label = name.value.decode("utf-8", "replace")
        if got is None or not kernel_btf or not label or label in out:
            os.close(fd)
            continue
        out[label] = fd


def _object_info(fd: int, size: int, info: Optional[ctypes.Array] = None) -> Optional[ctypes.Array]:
    """BPF_OBJ_GET_INFO_BY_FD of a program, link or BTF object into ``size`` bytes (of
    ``info``, when it carries pointers the kernel fills in)."""
    info = info if info is not None else ctypes.create_string_buffer(size)
    attr = ctypes.create_string_buffer(16)
    ctypes.c_uint32.from_buffer(attr, 0).value = fd
    ctypes.c_uint32.from_buffer(attr, 4).value = size
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(info)
    ret, _ = bpf_syscall(_BPF_OBJ_GET_INFO_BY_FD, attr)
    return info if ret >= 0 else None


def prog_recursion_misses(fd: int) -> int:
    """``bpf_prog_info.recursion_misses`` of a loaded program (0 when unknown)."""
    info = _object_info(fd, 232)
    return int(ctypes.c_uint64.from_buffer(info, 208).value) if info is not None else 0


def prog_run_stats(fd: int) -> tuple[int, int]:
    """``bpf_prog_info.run_time_ns`` and ``run_cnt`` of a loaded program (counted while
    ``kernel.bpf_stats_enabled`` is set; (0, 0) when unknown)."""
    info = _object_info(fd, 216)
    if info is None:
        return 0, 0
    return (int(ctypes.c_uint64.from_buffer(info, 192).value),
            int(ctypes.c_uint64.from_buffer(info, 200).value))


def link_missed(fd: int) -> int:
    """``bpf_link_info.kprobe_multi.missed`` (kernels 6.7+; 0 when unknown)."""
    info = _object_info(fd, 64)
    return int(ctypes.c_uint64.from_buffer(info, 32).value) if info is not None else 0


#: bpf_link_info.perf_event.type of a kprobe or kretprobe (BPF_PERF_EVENT_KPROBE, _KRETPROBE)
_PERF_KPROBE_TYPES = (3, 4)   # after UNSPEC 0, UPROBE 1, URETPROBE 2


def perf_link_missed(fd: int) -> int:
    """``bpf_link_info.perf_event.kprobe.missed`` of a perf kprobe's link: the calls its
    kprobe or kretprobe did not run for (a kretprobe's are those beyond its maxactive
    instances in flight); kernels 6.7+, 0 when unknown."""
    name = ctypes.create_string_buffer(256)
    info = ctypes.create_string_buffer(72)
    # perf_event at 16: type @16; kprobe: func_name @24, name_len @32, ..., missed @48
    ctypes.c_uint64.from_buffer(info, 24).value = ctypes.addressof(name)
    ctypes.c_uint32.from_buffer(info, 32).value = len(name)
    if _object_info(fd, len(info), info) is None:
        return 0
    if ctypes.c_uint32.from_buffer(info, 16).value not in _PERF_KPROBE_TYPES:
        return 0
    return int(ctypes.c_uint64.from_buffer(info, 48).value)


# ------------------------------------------------------------------ fentry targets

def btf_targets(functions) -> Callable[[object], Optional[tuple[int, int]]]:
    """For fentry/fexit loads: a function's (BTF object fd, BTF FUNC id) in the running
    kernel — vmlinux's (fd 0) or its module's (the module BTF object's fd, the id in
    its split BTF); None when BTF has no FUNC of that name.  The BTF objects stay open
    for the recording's life (the loads name them)."""
    from ctracer.debuginfo.btf import KERNEL_BTF, MODULE_BTF_DIR
    from ctracer.debuginfo.btf import format as btf_format
    from ctracer.debuginfo.btf import reader as btf
    from ctracer.errors import CtracerError
    from ctracer.host.kallsyms import kernel_symbols

    symbols = kernel_symbols()
    wanted: dict[Optional[str], set[str]] = {}
    for f in functions:
        module = symbols.module_of(f.name) if symbols is not None else None
        wanted.setdefault(module, set()).add(f.name)
    ids: dict[tuple[Optional[str], str], int] = {}
    fds = module_btf_fds() if any(m for m in wanted) else {}
    for module, names in wanted.items():
        path = KERNEL_BTF if module is None else os.path.join(MODULE_BTF_DIR, module)
        try:
            model = btf.open_btf(path)
        except CtracerError:
            continue
        data = model.btf
        first = data.first_id if module is not None else 1  # a module's own, not vmlinux's
        for tid in data.ids_of_kind(btf_format.FUNC):
            if tid < first:
                continue
            name = data.name(tid)
            if name in names:
                ids.setdefault((module, name), tid)

    def target(f) -> Optional[tuple[int, int]]:
        module = symbols.module_of(f.name) if symbols is not None else None
        tid = ids.get((module, f.name))
        if tid is None:
            return None
        if module is None:
            return 0, tid
        fd = fds.get(module)
        return (fd, tid) if fd is not None else None

    return target


# ------------------------------------------------------------------ perf kprobes

def _perf_kprobe(symbol: str, retprobe: bool) -> tuple[int, str]:
    """A perf event on the kprobe PMU at ``symbol``'s entry (or return)."""
    try:
        with open(os.path.join(_PMU_DIR, "type")) as f:
            pmu = int(f.read())
        bit = 0
        with open(os.path.join(_PMU_DIR, "format", "retprobe")) as f:
            bit = int(f.read().strip().split(":")[1])
    except (OSError, ValueError, IndexError) as e:
        return -1, f"no kprobe PMU ({e})"
    name = ctypes.create_string_buffer(symbol.encode())
    attr = ctypes.create_string_buffer(128)
    ctypes.c_uint32.from_buffer(attr, 0).value = pmu
    ctypes.c_uint32.from_buffer(attr, 4).value = 128
    ctypes.c_uint64.from_buffer(attr, 8).value = (1 << bit) if retprobe else 0
    ctypes.c_uint64.from_buffer(attr, 56).value = ctypes.addressof(name)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(_NR_PERF_EVENT_OPEN), attr, ctypes.c_int(-1),
                      ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_ulong(8))
    if fd < 0:
        return -1, f"perf_event_open refused the kprobe ({errno_text(ctypes.get_errno())})"
    return int(fd), ""


def raise_open_files(wanted: int) -> int:
    """Raise this process's open-file limit to ``wanted`` (each probed function holds
    two programs and two links open): the hard limit too where that is allowed (root:
    up to ``fs.nr_open``), else as far as the hard limit goes; the soft limit now."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    if hard != resource.RLIM_INFINITY and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
        except (ValueError, OSError):
            pass  # not allowed to raise the hard limit: as far as it goes
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def _pair(entry_kind: str) -> str:
    """What a function attached on ``entry_kind`` got: ``kprobe,kretprobe``
    (``fsession.multi`` alone: `probe_kinds`)."""
    return ",".join(probe_kinds(entry_kind))


def _kprobe_multi_link(prog_fd: int, kind: str, results: Sequence[AttachResult]) -> tuple[int, int]:
    """One kprobe.multi link of the program on the functions' symbols, each with its
    index as cookie; (fd, 0) or (-1, errno)."""
    return kprobe_multi_link(prog_fd, [r.function.name for r in results], kind == "kretprobe",
                             [r.function.index for r in results])


def _untried(function: KernelFunction, entry_kind: str) -> AttachResult:
    return AttachResult(function, "not tried", "not tried", _pair(entry_kind))


def _both_refusals(retried: Sequence[AttachResult], first: Sequence[str]) -> None:
    """Each function tried on kprobes after a refusal (``first``: that refusal, in the
    same order) that kprobes did not take either says both: the trampoline kind's
    refusal, then the kprobes'."""
    for r, refused in zip(retried, first):
        if not r.complete:
            r.entry = (f"{refused.removeprefix('failed: ')}; then on kprobes: "
                       f"{r.entry or 'entry attached, exit refused: ' + r.exit}")


# ------------------------------------------------------------------ the links

@dataclass
class KernelLinks:
    """The loaded programs and links of one recording's kernel functions and raw
    tracepoints."""

    entry_kind: Optional[str]
    functions: Sequence[KernelFunction]
    #: the compiled instructions of a program by name (from bcc)
    instructions: Callable[[str], bytes]
    #: (fd or 0, BTF type id) of a function's BTF FUNC, None when not found
    btf_target: Callable[[KernelFunction], Optional[tuple[int, int]]] = lambda f: None
    results: list[AttachResult] = field(default_factory=list)
    prog_fds: list[int] = field(default_factory=list)
    link_fds: list[int] = field(default_factory=list)
    multi_fds: list[int] = field(default_factory=list)
    perf_fds: list[int] = field(default_factory=list)   # perf kprobes' links (also in link_fds)
    how: str = ""
    seconds: float = 0.0
    #: raw tracepoints (`ctracer.probes.tracepoint.ProbedTracepoint`), attached first
    tracepoints: Sequence = ()
    #: raw tracepoints telling the CPU's context (`ctracer.probes.tracepoint.ContextProbe`),
    #: attached before anything; only their failures are in `results`
    context_probes: Sequence = ()
    #: the text has programs keeping the thread state in task storage, each beside its
    #: LRU-hash variant (`kfunctions.variants`); False: the LRU-hash ones only
    task_storage: bool = False
    #: where the attached programs keep each thread's depth and saved calls, and why
    thread_state: str = ""
    #: the attached programs are the task-storage ones (`_choose_thread_state`)
    _storage: bool = False
    #: the tracing_multi links of entry programs: (link fd, its functions, program fd)
    _multi_entry_links: list = field(default_factory=list)
    #: the running kernel's BTF ids of the kfuncs the session programs call (found once)
    _kfunc_ids: Optional[dict] = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: the links' misses (`missed`) read as they were closed; None while they are open
    _link_misses: Optional[dict] = None
    #: the kind tried on the functions the kernel refused ``entry_kind`` on, once the
    #: others are attached (`ctracer.probes.kernel_program.KernelProgram.fallback_kind`)
    fallback_kind: Optional[str] = None
    #: (function, why the kernel refused ``entry_kind`` on it) of each function then
    #: tried on ``fallback_kind`` (its result says how that went)
    fell_back_from: list = field(default_factory=list)
    #: the fallback kind's programs for the functions given (those the kernel refused
    #: ``entry_kind`` on), by name, compiled when it has refused some (bcc: the session's
    #: `ctracer.record.bpf_runtime.ProbeSession.fallback_instructions`); None: the
    #: instructions of ``instructions`` serve
    fallback_code: Optional[Callable[[Sequence[KernelFunction]], dict]] = None

    def attach(self, use_multi: Optional[bool] = None) -> list[AttachResult]:
        """Attach every function's entry and exit; ``use_multi`` for kprobes: kprobe.multi
        links (None: try them, fall back to perf kprobes).  The functions planned on
        another kind than ``entry_kind`` (kprobes beside a trampoline kind), and those the
        kernel refused ``entry_kind`` on where ``fallback_kind`` can take them, are
        attached after the others (`_attach_functions`)."""
        start = time.monotonic()
        raise_open_files(4 * len(self.functions) + 2 * len(self.tracepoints) + 1024)
        points = self._attach_context_probes()
        points += [self._attach_tracepoint(tp) for tp in self.tracepoints]
        functions: list[AttachResult] = []
        if self.functions:
            self._storage = self._choose_thread_state()
            functions = self._attach_functions(use_multi)
        self.results = points + functions
        self.seconds = time.monotonic() - start
        return self.results

    def _kind(self, f: KernelFunction) -> str:
        """The entry kind ``f`` is planned on."""
        return f.kind or self.entry_kind  # type: ignore[return-value]

    def _attach_functions(self, use_multi: Optional[bool]) -> list[AttachResult]:
        """Every function's result, in `functions`' order: ``entry_kind``'s first; then,
        together, the functions planned on kprobes and those the kernel refused
        ``entry_kind`` on that kprobes can read (`_refused_to_retry`; their programs
        compiled only now: `_kprobe_code`), both refusals named where the kprobes are
        refused too (`_both_refusals`).  Sets `how` and `fell_back_from`."""
        planned: dict[str, list[AttachResult]] = {}
        for f in self.functions:
            planned.setdefault(self._kind(f), []).append(_untried(f, self._kind(f)))
        own = planned.pop(self.entry_kind, [])  # type: ignore[arg-type]
        hows = [self._attach_own_kind(own, use_multi)] if own else []
        refused = self._refused_to_retry(own)
        self.fell_back_from = [(r.function.name, r.attached) for r in refused]
        retried = [_untried(r.function, "kprobe") for r in refused]
        code, failed = self._kprobe_code(retried)
        if failed:
            for r in retried:
                r.entry = r.exit = failed
        kprobes = planned.pop("kprobe", []) + ([] if failed else retried)
        if kprobes:
            how = self._attach_kprobes(kprobes, use_multi, code)
            hows.append(f"{how} ({sum(1 for r in kprobes if r.ok)} of {len(kprobes)} "
                        "functions)")
        _both_refusals(retried, [why for _, why in self.fell_back_from])
        for kind, members in planned.items():
            for r in members:
                r.entry = r.exit = f"{kind} cannot be attached beside {self.entry_kind}"
        self.how = "; ".join(hows)
        results = {id(r.function): r
                   for r in own + kprobes + [r for m in planned.values() for r in m]}
        # a refused function's retry on kprobes (or why it could not be made) replaces
        # its refusal on entry_kind
        results.update((id(r.function), r) for r in retried)
        return [results[id(f)] for f in self.functions]

    def _attach_own_kind(self, results: list[AttachResult], use_multi: Optional[bool]) -> str:
        """``results``' functions attached on ``entry_kind``; how."""
        if self.entry_kind == "fsession.multi":
            return self._attach_fsession_multi(results)
        if self.entry_kind == "fentry.multi":
            return self._attach_tracing_multi(results)
        if self.entry_kind == "fentry":
            return self._attach_fentry(results)
        return self._attach_kprobes(results, use_multi, self.instructions)

    def _refused_to_retry(self, results: list[AttachResult]) -> list[AttachResult]:
        """The functions the kernel refused ``entry_kind`` on that are tried on kprobes:
        where kprobes are the ``fallback_kind`` and a kprobe program can read what the
        function is probed for (`KernelFunction.kprobe_ready`)."""
        if self.fallback_kind != "kprobe" or self.entry_kind == "kprobe":
            return []
        return [r for r in results if not r.complete and r.function.kprobe_ready]

    def _kprobe_code(self, retried: list[AttachResult]
                     ) -> tuple[Callable[[str], bytes], str]:
        """Where the kprobe programs' instructions come from: the text's (the functions
        planned on kprobes) and, for ``retried``, the fallback's, compiled now
        (``fallback_code``; not at all when the kernel refused nothing); and why that
        compile failed ("" when it did not)."""
        if not retried or self.fallback_code is None:
            return self.instructions, ""
        try:
            compiled = self.fallback_code([r.function for r in retried])
        except CtracerError as e:
            return self.instructions, str(e)
        return (lambda name: compiled[name] if name in compiled else self.instructions(name)), ""

    # -- thread state -----------------------------------------------------------

    @property
    def fell_back(self) -> bool:
        """The text's task-storage programs were refused: the LRU-hash ones attached."""
        return bool(self.functions) and self.task_storage and not self._storage

    def _program(self, f: KernelFunction, kind: str) -> str:
        """The program probing ``f`` as ``kind``, of the chosen thread-state variant."""
        return f.program(kind, self._storage)

    def _choose_thread_state(self) -> bool:
        """Whether the programs attached keep the thread state in task storage: where the
        text has them and the kernel loads each that the functions use (else the
        LRU-hash variants of them all: `_storage_refused`); said in `thread_state`."""
        if not self.task_storage:
            self.thread_state = "LRU hashes (the kind's programs cannot use task storage here)"
            return False
        why = self._storage_refused()
        self.thread_state = f"LRU hashes, as {why}" if why else "task storage"
        return not why

    def _storage_refused(self) -> str:
        """Why the kernel refuses a task-storage program the functions use while it
        loads that program's LRU-hash variant ("" when it refuses none that way): each
        loaded once, nothing attached (fentry and fexit on their first functions with a
        BTF target, a refusal of that target by both variants being the function's
        own).  The fallback's programs, compiled only once the kernel has refused
        functions, are not tried: they get the variant chosen here."""
        for kind, users in self._programs_in_use().items():
            for name, functions in sorted(users.items()):
                why = self._refused_with_storage_only(kind, name, functions)
                if why:
                    return f"the kernel refused {name}: {why}"
        return ""

    def _programs_in_use(self) -> dict[str, dict[str, list[KernelFunction]]]:
        """The task-storage programs of the text the functions run, per kind (in the
        order the functions first use them) and name, with the functions running each."""
        from ctracer.probes.kernel_program import kinds_of
        out: dict[str, dict[str, list[KernelFunction]]] = {}
        for f in self.functions:
            for kind in kinds_of(f, self.entry_kind):
                out.setdefault(kind, {}).setdefault(f.program(kind), []).append(f)
        return out

    def _refused_with_storage_only(self, kind: str, name: str,
                                   functions: Sequence[KernelFunction]) -> str:
        """Why the kernel refuses program ``name`` (task storage) where it loads its
        LRU-hash variant, on one of a few of ``functions``' targets ("" when it does
        not: refused by both, the refusal is the target's own)."""
        for target in self._trial_targets(kind, functions):
            refused = self._trial_load(kind, name, target)
            if not refused:
                return ""
            if not self._trial_load(kind, functions[0].program(kind, False), target):
                return refused
        return ""

    def _trial_targets(self, kind: str, functions: Sequence[KernelFunction]) -> list:
        """What a trial load of ``kind`` names: nothing for kprobes; a few of the
        functions' BTF targets for fentry/fexit."""
        if kind in ("kprobe", "kretprobe") or kind in _MULTI_KINDS:
            return [None]
        targets = [t for t in map(self.btf_target, functions[:TRIAL_TARGETS * 4]) if t]
        return targets[:TRIAL_TARGETS]

    def _trial_load(self, kind: str, name: str, target: Optional[tuple[int, int]]) -> str:
        """Why the kernel refuses to load program ``name`` as ``kind`` ("" when it
        loads: closed again at once)."""
        if kind in _MULTI_KINDS:
            code, why = self._code(kind, name)
            fd, why = load_program(code, _PROG_TYPE_TRACING, _ATTACH_TYPE[kind],
                                   MULTI_ATTACH_BTF_ID, 0, name.encode()) if code else (-1, why)
        else:
            fd, why = load_per_function(kind, self.instructions(name), name, target)
        if fd >= 0:
            os.close(fd)
        return why

    # -- raw tracepoints --------------------------------------------------------

    def _attach_tracepoint(self, tp) -> AttachResult:
        """A raw tracepoint's program (shared by tracepoints with as many routes) loaded
        with its index written in (`ctracer.probes.tracepoint.with_index`), opened on
        the tracepoint."""
        from ctracer.probes.tracepoint import with_index
        return self._open_raw_tracepoint(AttachResult(tp, kind="raw_tracepoint"), tp.name,
                                         tp.probe, with_index(self.instructions(tp.probe),
                                                              tp.index))

    def _attach_context_probes(self) -> list[AttachResult]:
        """The context probes, a group (an entry and its exit) all or none; the failed
        ones that are not optional."""
        failed: list[AttachResult] = []
        groups: dict[str, list] = {}
        for p in self.context_probes:
            groups.setdefault(p.group or p.name, []).append(p)
        for members in groups.values():
            progs, links = len(self.prog_fds), len(self.link_fds)
            results = [self._open_raw_tracepoint(AttachResult(p, kind="raw_tracepoint"),
                                                 p.name, p.program,
                                                 self.instructions(p.program))
                       for p in members]
            if all(r.ok for r in results):
                continue
            close_in_parallel(self.link_fds[links:] + self.prog_fds[progs:])
            del self.link_fds[links:], self.prog_fds[progs:]
            failed += [r for r in results if not r.function.optional]
        return failed

    def _open_raw_tracepoint(self, result: AttachResult, tracepoint: str, program: str,
                             insns: bytes) -> AttachResult:
        """``insns`` (the program called ``program``) loaded and opened on the raw
        tracepoint ``tracepoint``; ``result`` says how it went."""
        fd, why = load_program(insns, _PROG_TYPE_RAW_TRACEPOINT, name=program.encode())
        if fd < 0:
            result.entry = why
            return result
        name = ctypes.create_string_buffer(tracepoint.encode())
        attr = ctypes.create_string_buffer(16)
        ctypes.c_uint64.from_buffer(attr, 0).value = ctypes.addressof(name)
        ctypes.c_uint32.from_buffer(attr, 8).value = fd
        link, err = bpf_syscall(_BPF_RAW_TRACEPOINT_OPEN, attr)
        if link < 0:
            os.close(fd)
            result.entry = f"the kernel refused to attach it ({errno_text(err)})"
            return result
        self.prog_fds.append(fd)
        self.link_fds.append(link)
        return result

    # -- fentry -----------------------------------------------------------------

    def _attach_fentry(self, results: list[AttachResult]) -> str:
        """Each of ``results``' functions on its own fentry and fexit clones; how."""
        # the programs of the functions on fentry only: one planned on kprobes beside
        # them may have a route count no fentry program was compiled for
        code = {name: self.instructions(name) for name in
                {self._program(r.function, k) for r in results
                 for k in ("fentry", "fexit")}}

        def one(r: AttachResult) -> None:
            f = r.function
            target = self.btf_target(f)
            if target is None:
                r.entry = r.exit = "no BTF FUNC of that name in the kernel's BTF"
                return
            obj_fd, btf_id = target
            made: list[int] = []
            for kind in ("fentry", "fexit"):
                name = self._program(f, kind)
                fd, why = load_program(code[name], _PROG_TYPE_TRACING,
                                       _ATTACH_TYPE[kind], btf_id, obj_fd, name.encode())
                if fd >= 0:
                    made.append(fd)
                    link, err = _link(fd, _ATTACH_TYPE[kind], cookie=f.index, cookie_at=24)
                    if link < 0:
                        why = f"the kernel refused to attach it ({errno_text(err)})"
                    else:
                        made.append(link)
                if why:
                    # both or neither: an entry without its exit would skew every
                    # depth on the thread
                    close_in_parallel(made)
                    r.entry = why if kind == "fentry" else f"its fexit failed: {why}"
                    r.exit = why if kind == "fexit" else "entry failed"
                    return
            r.entry = r.exit = ""
            with self._lock:
                self.prog_fds.extend(made[0::2])
                self.link_fds.extend(made[1::2])

        with ThreadPoolExecutor(LOADERS) as pool:
            list(pool.map(one, results))
        return "fentry/fexit: one loaded clone per function, linked with its cookie"

    # -- tracing_multi ----------------------------------------------------------

    def _code(self, kind: str, name: str) -> tuple[bytes, str]:
        """The instructions of program ``name`` to load as ``kind``: a session
        program's with its kfunc calls written in (`ctracer.probes.kfunc_calls`), every
        other as bcc compiled it; (b"", why) when they cannot be."""
        insns = self.instructions(name)
        if kind not in SESSION_KINDS:
            return insns, ""
        if self._kfunc_ids is None:
            from ctracer.host.fsession import kernel_func_ids
            self._kfunc_ids = kernel_func_ids(tuple(kfunc_calls.PLACEHOLDERS))
        try:
            return kfunc_calls.patch(insns, self._kfunc_ids), ""
        except CtracerError as e:
            return b"", f"its kfunc calls cannot be written in: {e}"

    def _named_in_btf(self, results: list[AttachResult]) -> list[AttachResult]:
        """Those of ``results`` a tracing_multi link can name (a BTF FUNC); the others
        are marked failed, with why."""
        ready = []
        for r in results:
            if self.btf_target(r.function) is None:
                r.entry = r.exit = "no BTF FUNC of that name in the kernel's BTF"
            else:
                ready.append(r)
        return ready

    def _attach_fsession_multi(self, results: list[AttachResult]) -> str:
        """Each of ``results``' functions' session program on tracing_multi links: one
        link per (program, BTF object), split where the kernel refuses a function; a
        function's entry and exit are one program on one link, attached together or not
        at all.  How."""
        ready = self._named_in_btf(results)
        for _, members in self._link_tracing_multi("fsession.multi", ready):
            for r in members:
                r.entry = r.exit = ""
        return ("fsession.multi: one session program (entry and exit) on one "
                "tracing_multi link per program and BTF object (split where the "
                "kernel refused a function)")

    def _attach_tracing_multi(self, results: list[AttachResult]) -> str:
        """Each of ``results``' functions' fentry and fexit program on tracing_multi
        links: the entries, then the exits of the functions whose entry linked; then the
        entry links holding a function whose exit the kernel refused linked again
        without it.  How."""
        ready = self._named_in_btf(results)
        entries = self._link_tracing_multi("fentry.multi", ready)
        linked = {id(r) for _, members in entries for r in members}
        exits = self._link_tracing_multi("fexit.multi", [r for r in ready if id(r) in linked])
        with_exit = {id(r) for _, members in exits for r in members}
        for r in ready:
            if id(r) not in linked:
                r.exit = "entry failed"
            elif id(r) in with_exit:
                r.entry = r.exit = ""
            else:
                r.entry = f"its fexit failed: {r.exit}"
        # an entry without its exit would skew every depth on the thread: the entry
        # links holding such a function are made again without it
        for link_fd, members, prog_fd in list(self._multi_entry_links):
            if all(id(r) in with_exit for r in members):
                continue
            os.close(link_fd)
            self.link_fds.remove(link_fd)
            again = [r for r in members if id(r) in with_exit]
            if again:
                self._bisect_link(prog_fd, "fentry.multi", again)
        self._multi_entry_links = []
        return ("fentry.multi/fexit.multi: one tracing_multi link per program and BTF "
                "object (split where the kernel refused a function)")

    def _link_tracing_multi(self, kind: str, results: list[AttachResult]
                            ) -> list[tuple[int, list[AttachResult]]]:
        """``kind``'s programs loaded once per (program, BTF object) and linked to their
        functions; the links made, each with its functions (the others get the
        kernel's reason in their ``entry`` or ``exit``)."""
        groups: dict[tuple[str, int], list[AttachResult]] = {}
        for r in results:
            obj_fd = self.btf_target(r.function)[0]  # type: ignore[index]
            groups.setdefault((self._program(r.function, kind), obj_fd), []).append(r)
        made: list[tuple[int, list[AttachResult]]] = []
        for (name, obj_fd), members in sorted(groups.items(), key=lambda g: g[0]):
            code, why = self._code(kind, name)
            fd, why = load_program(code, _PROG_TYPE_TRACING, _ATTACH_TYPE[kind],
                                   MULTI_ATTACH_BTF_ID, obj_fd, name.encode()) \
                if code else (-1, why)
            if fd < 0:
                for r in members:
                    self._set_multi(r, kind, why)
                continue
            self.prog_fds.append(fd)
            links = self._bisect_link(fd, kind, members)
            made += [(link, linked) for link, linked in links]
        return made

    def _bisect_link(self, prog_fd: int, kind: str, members: list[AttachResult]
                     ) -> list[tuple[int, list[AttachResult]]]:
        """One tracing_multi link of ``prog_fd`` on ``members``, or, where the kernel
        refuses it, links on each half, down to the functions it refuses alone (their
        reason set)."""
        ids = [self.btf_target(r.function)[1] for r in members]  # type: ignore[index]
        link, err = tracing_multi_link(prog_fd, _ATTACH_TYPE[kind], ids,
                                       [r.function.index for r in members])
        if link >= 0:
            self.link_fds.append(link)
            if kind == "fentry.multi":
                self._multi_entry_links.append((link, members, prog_fd))
            return [(link, members)]
        if len(members) == 1:
            self._set_multi(members[0], kind,
                            f"the kernel refused it on a tracing_multi link ({errno_text(err)})"
                            + self._single_refusal(kind, members[0].function))
            return []
        half = len(members) // 2
        return (self._bisect_link(prog_fd, kind, members[:half]) +
                self._bisect_link(prog_fd, kind, members[half:]))

    def _single_refusal(self, kind: str, function: KernelFunction) -> str:
        """The kernel's words for refusing ``function`` on a tracing_multi link: a link
        carries no verifier log, so an empty program is loaded as a plain fentry or fexit
        on the function, whose load runs the same check of the target (its BTF
        prototype: at most 12 arguments, no struct returned by value) and logs why
        (": <the verifier's line>"; "" when that load passes).  A session program runs
        at the return too: asked as an fexit."""
        obj_fd, btf_id = self.btf_target(function)  # type: ignore[misc]
        single = _TRACE_FENTRY if kind == "fentry.multi" else _TRACE_FEXIT
        fd, why = load_program(RETURN_ZERO, _PROG_TYPE_TRACING, single, btf_id, obj_fd,
                               b"ctracer_why")
        if fd >= 0:
            os.close(fd)
            return ""
        return ": " + why.split("): ", 1)[1] if "): " in why else ""

    def _set_multi(self, r: AttachResult, kind: str, why: str) -> None:
        if kind in SESSION_KINDS:
            r.entry = r.exit = why
        elif kind == "fentry.multi":
            r.entry = why
        else:
            r.exit = why

    # -- kprobes ----------------------------------------------------------------

    def _attach_kprobes(self, results: list[AttachResult], use_multi: Optional[bool],
                        code: Callable[[str], bytes]) -> str:
        """Each of ``results``' functions on kprobe and kretprobe programs (their
        instructions from ``code``): one kprobe.multi link per program, or one perf
        kprobe per function (`attach`'s ``use_multi``).  How."""
        by_program: dict[tuple[str, str], list[AttachResult]] = {}
        for r in results:
            for kind in ("kprobe", "kretprobe"):
                by_program.setdefault((kind, self._program(r.function, kind)), []).append(r)
        multi = use_multi is not False
        for (kind, name), members in sorted(by_program.items()):
            insns = code(name)
            if multi:
                done = self._link_multi(kind, name, insns, members)
                if done or use_multi:
                    continue
                multi = False
            self._link_perf(kind, name, insns, members)
        return ("kprobe/kretprobe: one kprobe.multi link per program" if multi else
                "kprobe/kretprobe: one perf kprobe per function")

    def _set(self, r: AttachResult, kind: str, why: str) -> None:
        if kind == "kprobe":
            r.entry = why
        else:
            r.exit = why

    def _link_multi(self, kind: str, name: str, insns: bytes,
                    results: list[AttachResult]) -> bool:
        """One kprobe.multi link for ``results``; False when the kernel has none."""
        fd, why = load_program(insns, _PROG_TYPE_KPROBE, TRACE_KPROBE_MULTI,
                               name=name.encode())
        if fd < 0:
            return False
        self.prog_fds.append(fd)
        link, err = _kprobe_multi_link(fd, kind, results)
        if link >= 0:
            self.multi_fds.append(link)
            self.link_fds.append(link)
            for r in results:
                self._set(r, kind, "")
            return True
        if err in (errno.EOPNOTSUPP, 524):  # 524: the kernel's ENOTSUPP
            return False
        # one bad symbol fails the whole link: find the functions that link, one by one
        for r in results:
            link, err = _kprobe_multi_link(fd, kind, [r])
            if link >= 0:
                self.multi_fds.append(link)
                self.link_fds.append(link)
            self._set(r, kind, "" if link >= 0 else
                      f"the kernel refused the kprobe.multi link ({errno_text(err)})")
        return True

    def _link_perf(self, kind: str, name: str, insns: bytes,
                   results: list[AttachResult]) -> None:
        fd, why = load_program(insns, _PROG_TYPE_KPROBE, name=name.encode())
        if fd < 0:
            for r in results:
                self._set(r, kind, why)
            return
        self.prog_fds.append(fd)
        for r in results:
            event, why = _perf_kprobe(r.function.name, kind == "kretprobe")
            if event >= 0:
                link, err = _link(fd, _PERF_EVENT, event, cookie=r.function.index, cookie_at=16)
                os.close(event)  # the link holds the event
                if link >= 0:
                    self.link_fds.append(link)
                    self.perf_fds.append(link)
                else:
                    why = f"the kernel refused to link the kprobe ({errno_text(err)})"
            self._set(r, kind, why)

    # -- reading and closing ----------------------------------------------------

    def missed(self) -> dict[str, int]:
        """What the kernel did not run: fentry/fexit and raw tracepoint recursion (program
        stats),
        kprobe.multi misses and perf kprobes' (kretprobe maxactive) misses (link info,
        read as the links closed once `close_links` has run)."""
        links = self._link_misses if self._link_misses is not None else self._read_link_misses()
        return {"recursion": sum(prog_recursion_misses(fd) for fd in self.prog_fds), **links}

    def _read_link_misses(self) -> dict[str, int]:
        return {"kprobe_multi": sum(link_missed(fd) for fd in self.multi_fds),
                "kprobe": sum(perf_link_missed(fd) for fd in self.perf_fds)}

    def close_links(self) -> None:
        """Detach: close every link (once: the programs stay loaded), from parallel
        threads.  The links' misses are read first: they live in the links, and a
        closed link's number may soon be another file's."""
        if self.link_fds:
            self._link_misses = self._read_link_misses()
        self.multi_fds, self.perf_fds = [], []
        links, self.link_fds = self.link_fds, []
        close_in_parallel(links)

    def close(self) -> None:
        """Detach (`close_links`, where not done yet), then unload the programs."""
        self.close_links()
        progs, self.prog_fds = self.prog_fds, []
        close_in_parallel(progs)


#: threads closing probe fds at once (each close waits for an RCU grace period; waiters
#: at the same time share one)
CLOSERS = 128


def close_in_parallel(fds: Sequence[int]) -> None:
    """Close ``fds`` from up to `CLOSERS` threads and return when all are closed."""
    if len(fds) <= 1:
        for fd in fds:
            os.close(fd)
        return
    pending = list(fds)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not pending:
                    return
                fd = pending.pop()
            try:
                os.close(fd)
            except OSError:
                pass

    threads = [threading.Thread(target=work, daemon=True)
               for _ in range(min(CLOSERS, len(fds)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
