"""Facts about the running kernel, found by trying rather than by version: where tracefs
is (mounting it when root and absent), which functions can be probed, the release, and
which probe mechanisms work (kprobes, kprobe.multi links, fentry, uprobes, tracepoints,
raw tracepoints, kprobe-type program loads).  `kernel_facts` gathers them as the
`ctracer.plan.attach.KernelFacts` the probe plan is made from; `file_symbols` lists the
functions of another kernel's vmlinux or module for the same purpose.

The BPF checks use the bare ``bpf(2)`` system call through ctypes with two-instruction
programs (``r0 = 0; exit``); bcc stays in ``ctracer.record.bpf_runtime``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ctracer.debuginfo.btf import KERNEL_BTF
from ctracer.errors import CtracerError
from ctracer.plan.attach import KernelFacts, Mechanism

TRACEFS_DEFAULT = "/sys/kernel/tracing"
DEBUGFS_TRACING = "/sys/kernel/debug/tracing"
KALLSYMS = "/proc/kallsyms"
EVENT_SOURCE_DEVICES = "/sys/bus/event_source/devices"

# suffixes the compiler gives to specialised or split copies of a function
_CLONE_SUFFIX = re.compile(r"\.(isra|constprop|part|cold|llvm|lto_priv|specialized)(\.|$)")


# ------------------------------------------------------------------ tracefs


def errno_text(err: int) -> str:
    """An errno as the kernel's refusals are quoted: ``E2BIG: Argument list too long``."""
    return f"{errno.errorcode.get(err, err)}: {os.strerror(err)}"


def _mount_table() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount, in /proc/self/mounts order."""
    try:
        with open("/proc/self/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])
            out.append((point, parts[2]))
    return out


def find_tracefs() -> Optional[str]:
    """The path of a mounted tracefs (the canonical one first), None when there is none."""
    mounts = _mount_table()
    points = [p for p, fs in mounts if fs == "tracefs"]
    if TRACEFS_DEFAULT in points:
        return TRACEFS_DEFAULT
    if points:
        return points[0]
    # old kernels expose tracing under debugfs without a tracefs mount of their own
    if any(fs == "debugfs" for _, fs in mounts) and \
            os.path.exists(os.path.join(DEBUGFS_TRACING, "available_events")):
        return DEBUGFS_TRACING
    return None


def tracepoint_format_fields(name: str) -> list[tuple[str, str]]:
    """The fields of tracepoint ``name``'s record as its tracefs ``format`` file lists
    them: (C type, name), the ``common_*`` ones left out; [] when tracefs or the file is
    not there."""
    import glob
    root = find_tracefs()
    if root is None or not re.fullmatch(r"[A-Za-z0-9_]+", name):
        return []
    out = []
    for path in glob.glob(os.path.join(root, "events", "*", name, "format"))[:1]:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            return []
        for m in re.finditer(r"field:([^;]*?)\s*([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?;", text):
            if not m.group(2).startswith("common_"):
                out.append((m.group(1).strip(), m.group(2)))
    return out


def _kernel_has_filesystem(name: str) -> bool:
    try:
        with open("/proc/filesystems") as f:
            return any(line.split()[-1] == name for line in f if line.strip())
    except OSError:
        return True  # cannot tell: let mount say


def ensure_tracefs() -> str:
    """The tracefs path, mounting tracefs at /sys/kernel/tracing when root and absent."""
    found = find_tracefs()
    if found:
        return found
    if not _kernel_has_filesystem("tracefs"):
        raise CtracerError("this kernel has no tracefs (built without tracing support)")
    if os.geteuid() != 0:
        raise CtracerError(f"tracefs is not mounted and mounting it needs root: run as root "
                           f"or 'mount -t tracefs nodev {TRACEFS_DEFAULT}'")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                           ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"nodev", TRACEFS_DEFAULT.encode(), b"tracefs", 0, None) != 0:
        err = ctypes.get_errno()
        if err == errno.EBUSY and find_tracefs():  # mounted meanwhile
            return find_tracefs()  # type: ignore[return-value]
        raise CtracerError(f"cannot mount tracefs at {TRACEFS_DEFAULT}: {os.strerror(err)}")
    return TRACEFS_DEFAULT


# ------------------------------------------------------------------ symbols

@dataclass(frozen=True)
class KernelSymbols:
    """The functions of the running kernel that probes can name.

    ``source`` says where they came from: ``available_filter_functions`` (what ftrace,
    hence fentry and kprobes, can attach to) or ``/proc/kallsyms`` (every text symbol, a
    superset that includes notrace functions).  ``modules`` maps a name to its module, or
    to None for vmlinux."""

    source: str
    modules: dict[str, Optional[str]]
    _clones: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __contains__(self, name: object) -> bool:
        return name in self.modules

    def __len__(self) -> int:
        return len(self.modules)

    def names(self) -> set[str]:
        return set(self.modules)

    def module_of(self, name: str) -> Optional[str]:
        return self.modules.get(name)

    def clones(self, name: str) -> tuple[str, ...]:
        """Compiler-made copies of a function (``name.isra.0``, ``name.constprop.0``, …):
        symbols that exist when the function itself was specialised away."""
        if not self._clones and self.modules:
            table: dict[str, list[str]] = {}
            search = _CLONE_SUFFIX.search
            for sym in [s for s in self.modules if "." in s]:
                m = search(sym)
                if m:
                    table.setdefault(sym[:m.start()], []).append(sym)
            self._clones.update({k: tuple(sorted(v)) for k, v in table.items()})
            self._clones.setdefault("", ())  # built, even when there are none
        return self._clones.get(name, ())


def _parse_filter_functions(text: str) -> dict[str, Optional[str]]:
    out: dict[str, Optional[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("__ftrace_invalid_address__"):
            continue
        module = parts[1][1:-1] if len(parts) > 1 and parts[1].startswith("[") else None
        out.setdefault(parts[0], module)
    return out


# text symbols ("t", "T", and weak "w"/"W"), not the __pfx_ padding before each function
_KALLSYMS_TEXT = re.compile(r" [tTwW] (?!__pfx_)(\S+)$", re.M)
_KALLSYMS_MODULE_TEXT = re.compile(r" [tTwW] (?!__pfx_)(\S+)\t\[(\S+)\]$", re.M)


def _parse_kallsyms(text: str) -> dict[str, Optional[str]]:
    # vmlinux symbols come first, module symbols (with "\t[module]") after them
    split = text.find("\t[")
    split = len(text) if split < 0 else text.rfind("\n", 0, split) + 1
    out: dict[str, Optional[str]] = dict.fromkeys(_KALLSYMS_TEXT.findall(text, 0, split))
    for name, module in _KALLSYMS_MODULE_TEXT.findall(text, split):
        if module != "bpf":  # JIT-ed BPF programs come and go: not kernel functions
            out.setdefault(name, module)
    for name in _KALLSYMS_TEXT.findall(text, split):  # module part without "[module]"
        out.setdefault(name, None)
    return out


def kernel_symbols(tracefs: Optional[str] = None,
                   use_cache: bool = True) -> Optional[KernelSymbols]:
    """The probe-able functions: available_filter_functions when readable, else the text
    symbols of /proc/kallsyms; None when neither can be read.

    Reading and parsing those lists takes ~0.1 s, so the names are kept in ctracer's
    cache directory, keyed by the boot id, the loaded modules (name and size) and which
    list was readable: loading a module, or a reboot, gives a new key."""
    tracefs = tracefs or find_tracefs()
    filters = os.path.join(tracefs, "available_filter_functions") if tracefs else None
    filters_readable = _openable(filters)
    key = _symbols_key(filters_readable) if use_cache else None
    if key:
        cached = _load_symbols(key)
        if cached is not None:
            return cached
    symbols = None
    if filters_readable:
        try:
            with open(filters) as f:  # type: ignore[arg-type]
                text = f.read()
            if text.strip():
                symbols = KernelSymbols("available_filter_functions",
                                        _parse_filter_functions(text))
        except OSError:
            pass
    if symbols is None:
        try:
            with open(KALLSYMS) as f:
                text = f.read()
        except OSError:
            return None
        parsed = _parse_kallsyms(text)
        symbols = KernelSymbols(KALLSYMS, parsed) if parsed else None
    if key and symbols is not None:
        _save_symbols(key, symbols)
    return symbols


def file_symbols(path: str) -> Optional[KernelSymbols]:
    """The function symbols of a kernel file (a vmlinux or a .ko), as the running kernel's
    would be listed once it is booted or loaded; None when it is no ELF file or has none."""
    from ctracer.debuginfo import elf
    try:
        headers = elf.read_elf_headers(path)
    except CtracerError:
        return None
    names = {n for found in elf.function_symbols(headers, offset_zero=headers.type == 1).values() for n in found
             if not n.startswith("__pfx_")}
    return KernelSymbols(f"the symbol table of {os.path.basename(path)}",
                         dict.fromkeys(names)) if names else None


def _openable(path: Optional[str]) -> bool:
    if not path:
        return False
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def _symbols_key(filters_readable: bool) -> Optional[str]:
    import hashlib
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    try:
        with open("/proc/modules") as f:
            modules = "\n".join(" ".join(line.split()[:2]) for line in f)
    except FileNotFoundError:
        modules = ""  # a kernel without module support
    except OSError:
        return None
    ident = f"{boot}\0{filters_readable}\0{os.uname().release}\0{modules}"
    return hashlib.sha256(ident.encode()).hexdigest()[:40]


_SYMBOLS_VERSION = 2


def _symbols_path(key: str) -> str:
    from ctracer.debuginfo.cachedir import cache_dir
    return os.path.join(cache_dir(), f"kernel-symbols-{key}.marshal")


def _load_symbols(key: str) -> Optional[KernelSymbols]:
    import marshal
    try:
        with open(_symbols_path(key), "rb") as f:
            saved = marshal.load(f)
        if saved.get("version") != _SYMBOLS_VERSION or saved.get("key") != key:
            return None
        names = saved["vmlinux"].split("\n") if saved["vmlinux"] else []
        modules: dict[str, Optional[str]] = dict.fromkeys(names)
        modules.update(saved["modules"])
        return KernelSymbols(saved["source"], modules)
    except (OSError, EOFError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _save_symbols(key: str, symbols: KernelSymbols) -> None:
    import marshal
    import tempfile
    path = _symbols_path(key)
    saved = {"version": _SYMBOLS_VERSION, "key": key, "source": symbols.source,
             "vmlinux": "\n".join(n for n, m in symbols.modules.items() if m is None),
             "modules": {n: m for n, m in symbols.modules.items() if m is not None}}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-symbols-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as f:
                marshal.dump(saved, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass  # no cache is no error


class SymbolsLoader:
    """`kernel_symbols` read in a background thread: reading /proc/kallsyms is mostly
    kernel time, which overlaps with parsing BTF.  ``result()`` waits for it."""

    def __init__(self, tracefs: Optional[str] = None, use_cache: bool = True):
        import threading
        self._value: Optional[KernelSymbols] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._load, args=(tracefs, use_cache),
                                        daemon=True, name="ctracer-kernel-symbols")
        self._thread.start()

    def _load(self, tracefs: Optional[str], use_cache: bool) -> None:
        try:
            self._value = kernel_symbols(tracefs, use_cache)
        except BaseException as e:  # handed to the caller of result()
            self._error = e

    def result(self) -> Optional[KernelSymbols]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def attachable_functions(tracefs: Optional[str] = None) -> Optional[set[str]]:
    """Names of the functions probes can attach to on the running kernel, None if unknown."""
    symbols = kernel_symbols(tracefs)
    return None if symbols is None else symbols.names()


def is_attachable(function, symbols: Optional[KernelSymbols]) -> Optional[bool]:
    """Whether a `ctracer.debuginfo.catalog.FunctionInfo` (or a plain name) exists under its own name
    on the running kernel; None when the kernel's symbols cannot be read."""
    if symbols is None:
        return None
    name = function if isinstance(function, str) else function.name
    return name in symbols


def kernel_release() -> str:
    return os.uname().release


# ------------------------------------------------------------------ probe support

@dataclass(frozen=True)
class ProbeSupport:
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

    def summary(self) -> str:
        def word(s: Mechanism) -> str:
            return {True: "yes", False: "no", None: "unknown"}[s.works]
        return ", ".join(f"{name}: {word(getattr(self, name))}" for name in
                         ("kprobes", "kprobe_multi", "fentry", "uprobes", "tracepoints",
                          "raw_tracepoints", "kprobe_programs"))


# bpf(2) numbers, from include/uapi/linux/bpf.h (BPF_LINK_CREATE for the runtime too)
_BPF_PROG_LOAD = 5
_BPF_RAW_TRACEPOINT_OPEN = 17
BPF_LINK_CREATE = 28
_PROG_TYPE_KPROBE = 2
_PROG_TYPE_RAW_TRACEPOINT = 17
_TRACE_KPROBE_MULTI = 42
_PROG_TYPE_TRACING = 26
_TRACE_FENTRY = 24
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "ppc64": 361,
                "s390x": 351, "i686": 357, "i386": 357, "armv7l": 386, "loongarch64": 280}
# r0 = 0; exit
_RETURN_ZERO = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


def bpf_syscall(cmd: int, attr: ctypes.Array) -> tuple[int, int]:
    """bpf(2) without bcc: (its result, 0) or (-1, errno); the runtime links uprobe.multi
    programs with it too (`ctracer.record.bpf_runtime`)."""
    nr = _BPF_SYSCALL.get(platform.machine())
    if nr is None:
        return -1, errno.ENOSYS
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr,
                       ctypes.c_uint(len(attr)))
    return int(ret), (ctypes.get_errno() if ret < 0 else 0)


def _load_program(prog_type: int, attach_type: int = 0, attach_btf_id: int = 0,
                  code: bytes = _RETURN_ZERO) -> tuple[int, int]:
    """Load ``code`` (``r0 = 0; exit``); (fd, 0) or (-1, errno)."""
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
    fd, err = _load_program(prog_type, attach_type, attach_btf_id)
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
    fd, err = _load_program(_PROG_TYPE_KPROBE, _TRACE_KPROBE_MULTI)
    if fd < 0:
        return Mechanism(False, f"the kernel refused to load a kprobe.multi program "
                                f"({errno_text(err)})")
    try:
        name = ctypes.create_string_buffer(symbol.encode())
        syms = (ctypes.c_uint64 * 1)(ctypes.addressof(name))
        attr = ctypes.create_string_buffer(128)
        # link_create: prog_fd @0, target_fd @4, attach_type @8, flags @12,
        # kprobe_multi: flags @16, cnt @20, syms @24, addrs @32, cookies @40
        ctypes.c_uint32.from_buffer(attr, 0).value = fd
        ctypes.c_uint32.from_buffer(attr, 8).value = _TRACE_KPROBE_MULTI
        ctypes.c_uint32.from_buffer(attr, 20).value = 1
        ctypes.c_uint64.from_buffer(attr, 24).value = ctypes.addressof(syms)
        link, err = bpf_syscall(BPF_LINK_CREATE, attr)
        if link < 0:
            return Mechanism(False, f"a kprobe.multi program loaded but linking it to "
                                    f"{symbol} was refused "
                                    f"({errno_text(err)})")
        os.close(link)
        return Mechanism(True, f"a kprobe.multi program loaded and linked to {symbol}")
    finally:
        os.close(fd)


def _try_load(prog_type: int, what: str) -> Mechanism:
    fd, err = _load_program(prog_type)
    if fd < 0:
        return Mechanism(False, f"the kernel refused to load a {what} program "
                                f"({errno_text(err)})")
    os.close(fd)
    return Mechanism(True, f"a {what} program loads (not attached)")


# ------------------------------------------------------------------ task storage

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
    """Whether ``kind``'s programs ("kprobe" or "fentry") may keep a thread's state in
    task storage (`ctracer.probes.kfunctions`): a task storage map created and a program
    of that kind calling ``bpf_task_storage_get`` on the current task loaded (fentry on
    a vmlinux function), nothing attached.  Tried once per process."""
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
            found = _load_insns(_task_storage_program(map_fd),
                                _PROG_TYPE_TRACING if kind == "fentry" else _PROG_TYPE_KPROBE,
                                attach, btf_id, f"{kind} program using task storage")
        finally:
            os.close(map_fd)
    _TASK_STORAGE_TRIED[kind] = found
    return found


def _load_insns(code: bytes, prog_type: int, attach_type: int, attach_btf_id: int,
                what: str) -> Mechanism:
    fd, err = _load_program(prog_type, attach_type, attach_btf_id, code)
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
    fd, _ = _load_program(_PROG_TYPE_RAW_TRACEPOINT)
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
        raw = fentry = multi = programs = Mechanism(
            None, "loading BPF programs to find out needs root")
    else:
        raw = _try_attach(_PROG_TYPE_RAW_TRACEPOINT, "raw tracepoint", b"sys_enter")
        target = _fentry_target()
        fentry = Mechanism(None, "no kernel BTF to name an fentry target") if target is None \
            else _try_attach(_PROG_TYPE_TRACING, "fentry", None, _TRACE_FENTRY, target[1])
        programs = _try_load(_PROG_TYPE_KPROBE, "kprobe-type")
        multi = Mechanism(None, "no kernel BTF to name a function to link") if target is None \
            else _try_kprobe_multi(target[0])
    return ProbeSupport(kprobes, fentry, uprobes, tracepoints, raw, multi, programs)


def tracepoint_names(tracefs: Optional[str] = None) -> Optional[set[str]]:
    """``category:name`` of every tracepoint (available_events), None when unreadable."""
    tracefs = tracefs or find_tracefs()
    if not tracefs:
        return None
    try:
        with open(os.path.join(tracefs, "available_events")) as f:
            return {line.strip() for line in f if ":" in line}
    except OSError:
        return None


def _notrace(symbols: KernelSymbols, names: Iterable[str]) -> frozenset[str]:
    """Of ``names``, those the kernel has as text symbols but does not offer for tracing
    (known only when ``symbols`` is available_filter_functions and kallsyms is readable)."""
    if symbols.source != "available_filter_functions":
        return frozenset()
    try:
        with open(KALLSYMS) as f:
            text = _parse_kallsyms(f.read())
    except OSError:
        return frozenset()
    return frozenset(n for n in names if n in text and n not in symbols)


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
        kprobe_programs=support.kprobe_programs,
        symbols=frozenset(names) if names is not None else None,
        symbols_source=symbols.source if symbols is not None else "",
        notrace=_notrace(symbols, functions) if symbols is not None else frozenset(),
        clones=clones, running_kernel=running_kernel,
        tracepoints=tracepoints_attachable(tracepoints) if running_kernel else None)
