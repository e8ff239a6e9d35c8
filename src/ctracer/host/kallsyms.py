"""The running kernel's symbols, read once per use and cached: the functions probes can
name (`kernel_symbols`: available_filter_functions, else the text symbols of
/proc/kallsyms; `file_symbols` for another kernel's vmlinux or module), compiler clones
and notrace functions among them, and kernel text addresses as ``symbol+offset``
(`Kallsyms`) for the tracepoint arguments that hold one."""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ctracer.errors import CtracerError
from ctracer.host.tracefs import find_tracefs


KALLSYMS = "/proc/kallsyms"


# suffixes the compiler gives to specialised or split copies of a function
_CLONE_SUFFIX = re.compile(r"\.(isra|constprop|part|cold|llvm|lto_priv|specialized)(\.|$)")


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
        """Every function name kallsyms lists."""
        return set(self.modules)

    def module_of(self, name: str) -> Optional[str]:
        """The module defining ``name`` (None: built in, or not listed)."""
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
        """The symbols, once the loading thread is done (None: they could not be read)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def notrace_names(symbols: KernelSymbols, names: Iterable[str]) -> frozenset[str]:
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


# ------------------------------------------------------------------ text addresses
# A tracepoint argument such as ``kfree_skb``'s ``location`` (the caller's return address)
# reads as ``0xffffffff81e9dde7``; an engineer reads ``tcp_v4_rcv+0x1a7``.  Only the
# recording host can say that (its kernel, its KASLR offset), so the addresses a trace holds
# in such arguments are resolved when the recording ends and stored in the trace's meta
# (``kernel_symbols``: hex address → text), which the report and exports read on any
# machine; ``--tail`` resolves them as they arrive.

#: pointer arguments of tracepoints that hold a code address, by name
TEXT_ARGUMENTS = frozenset({"location", "ip", "caller", "call_site", "ret_ip", "func"})
def text_arguments(tracepoint_args: Optional[dict]) -> set[str]:
    """The names of the pointer arguments of ``tracepoint_args`` (the trace's meta) that
    hold code addresses."""
    names = set()
    for args in (tracepoint_args or {}).values():
        for a in args if isinstance(args, list) else ():
            if isinstance(a, dict) and a.get("kind") == "pointer" \
                    and a.get("name") in TEXT_ARGUMENTS:
                names.add(str(a["name"]))
    return names


class Kallsyms:
    """The kernel's text symbols, sorted by address (read once, on first use)."""

    def __init__(self, path: str = KALLSYMS):
        self.path = path
        self._starts: Optional[list[int]] = None
        self._names: list[tuple[str, str]] = []   # (symbol, " [module]" or "")

    def _load(self) -> None:
        starts, names = [], []
        try:
            with open(self.path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3 and parts[1] in ("t", "T"):
                        address = int(parts[0], 16)
                        if address:  # zeros: kptr_restrict hides the addresses
                            module = f" [{parts[3].strip('[]')}]" if len(parts) > 3 else ""
                            starts.append(address)
                            names.append((parts[2], module))
        except OSError:
            pass
        order = sorted(range(len(starts)), key=starts.__getitem__)
        self._starts = [starts[i] for i in order]
        self._names = [names[i] for i in order]

    def address(self, symbol: str) -> Optional[int]:
        """Where vmlinux's text symbol ``symbol`` is in the running kernel (None when
        unknown or hidden)."""
        if self._starts is None:
            self._load()
        for start, (name, module) in zip(self._starts or [], self._names):
            if name == symbol and not module:
                return start
        return None

    def name(self, address: int) -> Optional[str]:
        """``symbol+0xoff`` for a code address, None when it is in no known symbol (or
        past the last by more than a page: not text)."""
        if self._starts is None:
            self._load()
        starts = self._starts or []
        i = bisect.bisect_right(starts, address) - 1
        if i < 0 or address - starts[i] >= (1 << 16):
            return None
        offset = address - starts[i]
        name, module = self._names[i]
        return name + (f"+0x{offset:x}" if offset else "") + module

    def names(self, addresses: Iterable[int]) -> dict[str, str]:
        """The meta entry ``kernel_symbols`` for ``addresses``."""
        out = {}
        for a in addresses:
            text = self.name(a)
            if text:
                out[f"0x{a:x}"] = text
        return out
