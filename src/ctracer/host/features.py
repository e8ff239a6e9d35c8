"""What the running kernel accepts, found by trying rather than by version: which probe
mechanisms work (kprobes, kprobe.multi links, fentry, tracing_multi links, uprobes,
tracepoints, raw
tracepoints, kprobe-type program loads, task storage), the release, and the bare
``bpf(2)`` system call the recorder's attach code shares.  `kernel_facts` gathers them
with the kernel's symbols (`ctracer.host.kallsyms`) as the `ctracer.host.facts.KernelFacts`
the probe plan is made from.

The BPF checks use ``bpf(2)`` through ctypes with two-instruction programs
(``r0 = 0; exit``); bcc stays in ``ctracer.record.bpf_runtime``."""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from typing import Iterable, Optional

from ctracer.debuginfo.btf import KERNEL_BTF
from ctracer.errors import CtracerError
from ctracer.host.bpf_calls import (MULTI_ATTACH_BTF_ID, RETURN_ZERO,
                                    TRACE_FENTRY_MULTI, TRACE_FSESSION_MULTI,
                                    TRACE_KPROBE_MULTI, bpf_syscall, errno_text,
                                    kprobe_multi_link, tracing_multi_link)
from ctracer.host.facts import KernelFacts, Mechanism
from ctracer.host.fsession import try_fsession_multi
from ctracer.host.kallsyms import KernelSymbols, kernel_symbols, notrace_names
from ctracer.host.tracefs import ensure_tracefs, tracepoint_names


EVENT_SOURCE_DEVICES = "/sys/bus/event_source/devices"


def kernel_release() -> str:
    """The running kernel's release (``uname -r``)."""
    return os.uname().release


@dataclass(frozen=True)
class ProbeSupport:
    """Which probe mechanisms this machine offers, each found by trying it."""

    kprobes: Mechanism
    fentry: Mechanism
    uprobes: Mechanism
    tracepoints: Mechanism
    raw_tracepoints: Mechanism
    #: a kprobe.multi link (one program on many functions in one system call)
    kprobe_multi: Mechanism = Mechanism(None, "not tried")
    #: whether BPF_PROG_TYPE_KPROBE programs load (the verifier can check kprobe and
    #: uprobe programs even where kprobes cannot be attached)
    kprobe_programs: Mechanism = Mechanism(None, "not tried")
    #: a tracing_multi link (one fentry or fexit program on many functions in one call)
    tracing_multi: Mechanism = Mechanism(None, "not tried")
    #: an fsession.multi program (entry and exit in one program) on a tracing_multi link
    fsession_multi: Mechanism = Mechanism(None, "not tried")

    def summary(self) -> str:
        """One line: each mechanism with yes, no or unknown."""
        def word(s: Mechanism) -> str:
            return {True: "yes", False: "no", None: "unknown"}[s.works]
        return ", ".join(f"{name}: {word(getattr(self, name))}" for name in
                         ("kprobes", "kprobe_multi", "fentry", "tracing_multi",
                          "fsession_multi", "uprobes",
                          "tracepoints", "raw_tracepoints", "kprobe_programs"))


# bpf(2) numbers, from include/uapi/linux/bpf.h
_BPF_PROG_LOAD = 5


_BPF_RAW_TRACEPOINT_OPEN = 17


_PROG_TYPE_KPROBE = 2


_PROG_TYPE_RAW_TRACEPOINT = 17


_PROG_TYPE_TRACING = 26


_TRACE_FENTRY = 24


def load_trial_program(prog_type: int, attach_type: int = 0, attach_btf_id: int = 0,
                       code: bytes = RETURN_ZERO) -> tuple[int, int]:
    """Load a trial program, ``code`` (``r0 = 0; exit``), to see what the kernel
    accepts; (fd, 0) or (-1, errno).  The checks here and
    `ctracer.record.breakpoints.refusal` (a perf_event program on a test breakpoint)
    load with it; the recorder's own programs load through
    `ctracer.record.kattach.load_program`, which also reads the verifier's log."""
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = ctypes.create_string_buffer(128)
    # union bpf_attr, BPF_PROG_LOAD: prog_type @0, insn_cnt @4, insns @8, license @16,
    # prog_name @48, expected_attach_type @68, attach_btf_id @108
    ctypes.c_uint32.from_buffer(attr, 0).value = prog_type
    ctypes.c_uint32.from_buffer(attr, 4).value = len(code) // 8
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(insns)
    ctypes.c_uint64.from_buffer(attr, 16).value = ctypes.addressof(license_)
    attr[48:48 + len(b"ctracer_probe")] = b"ctracer_probe"
    ctypes.c_uint32.from_buffer(attr, 68).value = attach_type
    ctypes.c_uint32.from_buffer(attr, 108).value = attach_btf_id
    return bpf_syscall(_BPF_PROG_LOAD, attr)


def _raw_tracepoint_open(prog_fd: int, name: Optional[bytes]) -> tuple[int, int]:
    attr = ctypes.create_string_buffer(128)
    name_buf = ctypes.create_string_buffer(name) if name else None
    if name_buf is not None:
        ctypes.c_uint64.from_buffer(attr, 0).value = ctypes.addressof(name_buf)
    ctypes.c_uint32.from_buffer(attr, 8).value = prog_fd
    return bpf_syscall(_BPF_RAW_TRACEPOINT_OPEN, attr)


def _try_attach(prog_type: int, what: str, name: Optional[bytes], attach_type: int = 0,
                attach_btf_id: int = 0) -> Mechanism:
    fd, err = load_trial_program(prog_type, attach_type, attach_btf_id)
    if fd < 0:
        return Mechanism(False, f"the kernel refused to load a {what} program "
                              f"({errno_text(err)})")
    try:
        link, err = _raw_tracepoint_open(fd, name)
        if link < 0:
            return Mechanism(False, f"a {what} program loaded but attaching was refused "
                                  f"({errno_text(err)})")
        os.close(link)
        return Mechanism(True, f"a {what} program loaded and attached")
    finally:
        os.close(fd)


def _try_kprobe_multi(symbol: str) -> Mechanism:
    """Load a kprobe.multi program and link it to ``symbol`` (then close both)."""
    fd, err = load_trial_program(_PROG_TYPE_KPROBE, TRACE_KPROBE_MULTI)
    if fd < 0:
        return Mechanism(False, f"the kernel refused to load a kprobe.multi program "
                                f"({errno_text(err)})")
    try:
        link, err = kprobe_multi_link(fd, [symbol])
        if link < 0:
            return Mechanism(False, f"a kprobe.multi program loaded but linking it to "
                                    f"{symbol} was refused "
                                    f"({errno_text(err)})")
        os.close(link)
        return Mechanism(True, f"a kprobe.multi program loaded and linked to {symbol}")
    finally:
        os.close(fd)


def _try_tracing_multi(target: tuple[str, int]) -> Mechanism:
    """Load an fentry.multi program and link it to the function ``target`` names (its
    name, its vmlinux BTF id) through a tracing_multi link (then close both)."""
    name, btf_id = target
    fd, err = load_trial_program(_PROG_TYPE_TRACING, TRACE_FENTRY_MULTI, MULTI_ATTACH_BTF_ID)
    if fd < 0:
        return Mechanism(False, f"the kernel refused to load an fentry.multi program "
                                f"({errno_text(err)})")
    try:
        link, err = tracing_multi_link(fd, TRACE_FENTRY_MULTI, [btf_id], [0])
        if link < 0:
            return Mechanism(False, f"an fentry.multi program loaded but a tracing_multi "
                                    f"link to {name} was refused ({errno_text(err)})")
        os.close(link)
        return Mechanism(True, f"an fentry.multi program loaded and linked to {name} "
                               "through a tracing_multi link")
    finally:
        os.close(fd)


def _try_load(prog_type: int, what: str) -> Mechanism:
    fd, err = load_trial_program(prog_type)
    if fd < 0:
        return Mechanism(False, f"the kernel refused to load a {what} program "
                                f"({errno_text(err)})")
    os.close(fd)
    return Mechanism(True, f"a {what} program loads (not attached)")


_BPF_MAP_CREATE = 0


_BPF_BTF_LOAD = 18


_MAP_TYPE_TASK_STORAGE = 29


_F_NO_PREALLOC = 1


_HELPER_GET_CURRENT_TASK_BTF = 158


_HELPER_TASK_STORAGE_GET = 156


def _int_btf() -> bytes:
    """A BTF blob of one type, ``int`` (id 1): what a task storage map's key and value
    are described by in the trial (the kernel wants BTF for local storage maps)."""
    import struct
    strings = b"\0int\0"
    types = struct.pack("<IIII", 1, 1 << 24, 4, (1 << 24) | 32)  # INT, 4 bytes, signed, 32 bits
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def _task_storage_map() -> tuple[int, str]:
    """A task storage map of int values; (fd, "") or (-1, why)."""
    blob = ctypes.create_string_buffer(_int_btf(), len(_int_btf()))
    attr = ctypes.create_string_buffer(32)
    # btf @0, btf_log_buf @8, btf_size @16, btf_log_size @20, btf_log_level @24
    ctypes.c_uint64.from_buffer(attr, 0).value = ctypes.addressof(blob)
    ctypes.c_uint32.from_buffer(attr, 16).value = len(blob)
    btf_fd, err = bpf_syscall(_BPF_BTF_LOAD, attr)
    if btf_fd < 0:
        return -1, f"the kernel refused a BTF object ({errno.errorcode.get(err, err)})"
    try:
        attr = ctypes.create_string_buffer(72)
        # map_type @0, key_size @4, value_size @8, max_entries @12, map_flags @16,
        # btf_fd @48, btf_key_type_id @52, btf_value_type_id @56
        for at, value in ((0, _MAP_TYPE_TASK_STORAGE), (4, 4), (8, 4), (16, _F_NO_PREALLOC),
                          (48, btf_fd), (52, 1), (56, 1)):
            ctypes.c_uint32.from_buffer(attr, at).value = value
        fd, err = bpf_syscall(_BPF_MAP_CREATE, attr)
        if fd < 0:
            return -1, (f"the kernel refused a task storage map "
                        f"({errno_text(err)})")
        return fd, ""
    finally:
        os.close(btf_fd)


def _task_storage_program(map_fd: int) -> bytes:
    """``bpf_task_storage_get(map, bpf_get_current_task_btf(), 0, F_CREATE); return 0``."""
    import struct

    def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
        return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)
    return b"".join([
        insn(0x85, imm=_HELPER_GET_CURRENT_TASK_BTF),   # call bpf_get_current_task_btf
        insn(0xBF, dst=2, src=0),                        # r2 = r0
        insn(0x18, dst=1, src=1, imm=map_fd), insn(0),   # r1 = the map (ld_imm64)
        insn(0xB7, dst=3, imm=0),                        # r3 = NULL
        insn(0xB7, dst=4, imm=1),                        # r4 = BPF_LOCAL_STORAGE_GET_F_CREATE
        insn(0x85, imm=_HELPER_TASK_STORAGE_GET),        # call bpf_task_storage_get
        insn(0xB7, dst=0, imm=0), insn(0x95)])           # return 0


_TASK_STORAGE_TRIED: dict[str, Mechanism] = {}


def task_storage_works(kind: str) -> Mechanism:
    """Whether ``kind``'s programs ("kprobe", "fentry", "fentry.multi" or
    "fsession.multi") may keep a thread's state in task storage (`ctracer.probes.kfunctions`): a task storage map
    created and a program of that kind calling ``bpf_task_storage_get`` on the current
    task loaded (fentry on a vmlinux function; fentry.multi on none), nothing attached.
    Tried once per process."""
    if kind in _TASK_STORAGE_TRIED:
        return _TASK_STORAGE_TRIED[kind]
    if os.geteuid() != 0:
        return Mechanism(None, "loading BPF programs to find out needs root")
    map_fd, why = _task_storage_map()
    if map_fd < 0:
        found = Mechanism(False, why)
    else:
        try:
            btf_id, attach = 0, 0
            if kind == "fentry":
                target = _fentry_target()
                btf_id, attach = (target[1] if target else 0), _TRACE_FENTRY
            elif kind == "fentry.multi":
                btf_id, attach = MULTI_ATTACH_BTF_ID, TRACE_FENTRY_MULTI
            elif kind == "fsession.multi":
                btf_id, attach = MULTI_ATTACH_BTF_ID, TRACE_FSESSION_MULTI
            tracing = kind in ("fentry", "fentry.multi", "fsession.multi")
            found = _load_insns(_task_storage_program(map_fd),
                                _PROG_TYPE_TRACING if tracing else _PROG_TYPE_KPROBE,
                                attach, btf_id, f"{kind} program using task storage")
        finally:
            os.close(map_fd)
    _TASK_STORAGE_TRIED[kind] = found
    return found


def _load_insns(code: bytes, prog_type: int, attach_type: int, attach_btf_id: int,
                what: str) -> Mechanism:
    fd, err = load_trial_program(prog_type, attach_type, attach_btf_id, code)
    if fd < 0:
        return Mechanism(False, f"the kernel refused to load a {what} "
                                f"({errno_text(err)})")
    os.close(fd)
    return Mechanism(True, f"a {what} loads")


def raw_tracepoints_attachable(names: Iterable[str]) -> Optional[dict[str, bool]]:
    """Whether the kernel accepts a raw tracepoint program on each named tracepoint
    (bare tracepoints, which have no trace event in tracefs, included); None when BPF
    programs cannot be loaded here (not root, or BPF refused)."""
    if os.geteuid() != 0:
        return None
    fd, _ = load_trial_program(_PROG_TYPE_RAW_TRACEPOINT)
    if fd < 0:
        return None
    out = {}
    try:
        for name in names:
            link, _ = _raw_tracepoint_open(fd, name.encode())
            out[name] = link >= 0
            if link >= 0:
                os.close(link)
    finally:
        os.close(fd)
    return out


def _fentry_target() -> Optional[tuple[str, int]]:
    """The name and BTF id of a vmlinux function to try fentry (and kprobe.multi) on."""
    try:
        from ctracer.debuginfo.btf import reader as btf
        from ctracer.debuginfo.btf import format as btf_format
        model = btf.open_btf(KERNEL_BTF)
    except CtracerError:
        return None
    d = model.btf
    wanted = {"vfs_read", "do_sys_openat2", "schedule", "ksys_read"}
    for tid in d.ids_of_kind(btf_format.FUNC):
        if d.name(tid) in wanted:
            return d.name(tid), tid
    return None


def _exists(*paths: str) -> Optional[str]:
    for p in paths:
        if p and os.path.exists(p):
            return p
    return None


def probe_support() -> ProbeSupport:
    """Try each probe mechanism in its cheapest telling way."""
    try:
        tracefs: Optional[str] = ensure_tracefs()
    except CtracerError:
        tracefs = None
    at = (lambda name: os.path.join(tracefs, name)) if tracefs else (lambda name: "")

    found = _exists(at("kprobe_events"), os.path.join(EVENT_SOURCE_DEVICES, "kprobe"))
    kprobes = Mechanism(True, f"{found} exists") if found else Mechanism(
        False, "no kprobe_events in tracefs and no kprobe PMU (kernel built without kprobes)")
    found = _exists(at("uprobe_events"), os.path.join(EVENT_SOURCE_DEVICES, "uprobe"))
    uprobes = Mechanism(True, f"{found} exists") if found else Mechanism(
        False, "no uprobe_events in tracefs and no uprobe PMU")
    found = _exists(at("available_events"), os.path.join(EVENT_SOURCE_DEVICES, "tracepoint"))
    tracepoints = Mechanism(True, f"{found} exists") if found else Mechanism(
        False, "no tracepoint events in tracefs and no tracepoint PMU")

    if os.geteuid() != 0:
        raw = fentry = multi = programs = tracing = session = Mechanism(
            None, "loading BPF programs to find out needs root")
    else:
        raw = _try_attach(_PROG_TYPE_RAW_TRACEPOINT, "raw tracepoint", b"sys_enter")
        target = _fentry_target()
        fentry = Mechanism(None, "no kernel BTF to name an fentry target") if target is None \
            else _try_attach(_PROG_TYPE_TRACING, "fentry", None, _TRACE_FENTRY, target[1])
        programs = _try_load(_PROG_TYPE_KPROBE, "kprobe-type")
        multi = Mechanism(None, "no kernel BTF to name a function to link") if target is None \
            else _try_kprobe_multi(target[0])
        tracing = Mechanism(None, "no kernel BTF to name a function to link") \
            if target is None else _try_tracing_multi(target)
        session = Mechanism(False, f"no tracing_multi links ({tracing.why})") \
            if not tracing.works else try_fsession_multi()
    return ProbeSupport(kprobes, fentry, uprobes, tracepoints, raw, multi, programs, tracing,
                        session)


def tracepoints_attachable(names: Iterable[str]) -> Optional[dict[str, bool]]:
    """Whether a raw tracepoint program attaches to each named tracepoint: those with a
    trace event in tracefs do; the kernel itself is asked (a raw tracepoint attach, ~10 ms
    each) only about the others, the bare tracepoints.  None when it cannot be told."""
    names = sorted(set(names))
    if not names:
        return {}
    events = tracepoint_names()
    listed = set() if events is None else {e.split(":", 1)[1] for e in events}
    out = {n: True for n in names if n in listed}
    others = [n for n in names if n not in listed]
    raw = raw_tracepoints_attachable(others) if others else {}
    if raw is None and events is None:
        return None
    out.update(raw if raw is not None else {n: False for n in others})
    return out


def kernel_facts(functions: Iterable[str] = (), tracepoints: Iterable[str] = (), *,
                 symbols: Optional[KernelSymbols] = None,
                 support: Optional[ProbeSupport] = None,
                 running_kernel: bool = True) -> KernelFacts:
    """What the running kernel accepts, for planning probes on the named functions and
    tracepoints (`ctracer.plan.attach.plan_probes`): every mechanism tried, the traceable
    function list, compiler clones and notrace functions among ``functions``, and which
    of ``tracepoints`` a raw tracepoint program attaches to.  With ``running_kernel``
    false (types of another kernel: a vmlinux or .ko file) the mechanisms are the running
    kernel's, ``symbols`` (e.g. `file_symbols`) those of that file, and tracepoints are
    not asked about."""
    support = support or probe_support()
    if running_kernel and symbols is None:
        symbols = kernel_symbols()
    functions = list(functions)
    names = symbols.names() if symbols is not None else None
    clones = {} if symbols is None else {
        n: symbols.clones(n) for n in functions if n not in symbols and symbols.clones(n)}
    return KernelFacts(
        fentry=support.fentry, kprobes=support.kprobes, kprobe_multi=support.kprobe_multi,
        raw_tracepoints=support.raw_tracepoints, uprobes=support.uprobes,
        kprobe_programs=support.kprobe_programs, tracing_multi=support.tracing_multi,
        fsession_multi=support.fsession_multi,
        symbols=frozenset(names) if names is not None else None,
        symbols_source=symbols.source if symbols is not None else "",
        notrace=notrace_names(symbols, functions) if symbols is not None else frozenset(),
        clones=clones, running_kernel=running_kernel,
        tracepoints=tracepoints_attachable(tracepoints) if running_kernel else None)
