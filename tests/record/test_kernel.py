"""Facts of the running kernel (ctracer.host) against what the kernel itself shows.

Oracles: /proc/self/mounts (tracefs), /proc/kallsyms and available_filter_functions read
here with a different parser, ``uname -r``, the tracefs and PMU files each probe type
needs, and the kernel accepting or refusing BPF programs (raw tracepoints, fentry).
Checks that need root or a mounted tracefs skip with the reason when those are missing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from ctracer.host import features, kallsyms, tracefs
from ctracer.errors import CtracerError
from ctracer.debuginfo.catalog import FunctionInfo, ShapeKind, TypeShape

#: saved symbol lists go to a directory of each test's own
pytestmark = [pytest.mark.kernel, pytest.mark.usefixtures("private_cache")]


def tracefs_or_skip() -> str:
    try:
        return tracefs.ensure_tracefs()
    except CtracerError as e:
        pytest.skip(f"no tracefs: {e}")


def test_ensure_tracefs_finds_a_mounted_tracefs():
    path = tracefs_or_skip()
    assert os.path.isdir(os.path.join(path, "events"))
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    assert any(fs == "tracefs" and point == path for _, point, fs, *_ in mounts) \
        or path == tracefs.DEBUGFS_TRACING
    assert tracefs.find_tracefs() == path  # the second call finds what the first mounted


def text_symbols_from_kallsyms() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in Path("/proc/kallsyms").read_text().splitlines():
        fields = line.split()
        if len(fields) < 3 or fields[1] not in ("t", "T", "w", "W"):
            continue
        if fields[2].startswith("__pfx_"):
            continue
        module = fields[3].strip("[]") if len(fields) > 3 else None
        if module != "bpf":  # loaded BPF programs (other tests', other tools') are no functions
            out.setdefault(fields[2], module)
    return out


def test_kernel_symbols_match_the_kernels_lists():
    symbols = kallsyms.kernel_symbols()
    if symbols is None:
        pytest.skip("neither available_filter_functions nor /proc/kallsyms is readable")
    if symbols.source == "available_filter_functions":
        path = os.path.join(tracefs.find_tracefs(), "available_filter_functions")
        expect = {line.split()[0] for line in Path(path).read_text().splitlines()
                  if line.strip() and not line.startswith("__ftrace_invalid_address__")}
        assert symbols.names() == expect
    else:
        expect = text_symbols_from_kallsyms()
        assert symbols.modules == expect
    print(f"\n{len(symbols)} attachable functions from {symbols.source}")
    # the saved copy (second call) and a fresh read agree
    assert kallsyms.kernel_symbols() == symbols == kallsyms.kernel_symbols(use_cache=False)
    assert list(Path(os.environ["XDG_CACHE_HOME"]).rglob("kernel-symbols-*"))


def test_available_filter_functions_preferred_when_readable():
    tracefs = tracefs_or_skip()
    path = os.path.join(tracefs, "available_filter_functions")
    try:
        with open(path) as f:
            readable = bool(f.read(1))
    except OSError as e:
        readable = False
        print(f"\n{path} unreadable here ({e.strerror}): kallsyms is the fallback")
    assert (kallsyms.kernel_symbols().source == "available_filter_functions") == readable


def test_kallsyms_modules_and_filter_functions_parsing():
    # the formats, as the kernel writes them (module symbols last, tab before [module])
    text = ("ffffffff81000000 T _stext\n"
            "ffffffff81000010 t __pfx_tcp_v4_rcv\n"
            "ffffffff81000020 t tcp_v4_rcv\n"
            "ffffffff81000030 D some_data\n"
            "ffffffff81000040 t helper.isra.0\n"
            "ffffffffc0001000 t nfs_fh_fn\t[nfs]\n"
            "ffffffffc0001010 T helper\t[mod_a]\n")
    parsed = kallsyms._parse_kallsyms(text)
    assert parsed == {"_stext": None, "tcp_v4_rcv": None, "helper.isra.0": None,
                      "nfs_fh_fn": "nfs", "helper": "mod_a"}
    filters = kallsyms._parse_filter_functions(
        "tcp_v4_rcv\nnfs_fh_fn [nfs]\n__ftrace_invalid_address___64\n")
    assert filters == {"tcp_v4_rcv": None, "nfs_fh_fn": "nfs"}


def function(name: str) -> FunctionInfo:
    return FunctionInfo(name, (), TypeShape(ShapeKind.VOID, None))


def attach_status(function, symbols) -> str:
    """``yes``, ``no``, ``clone:<symbol>`` when only a compiler specialised copy exists,
    or ``unknown`` (no symbols)."""
    if symbols is None:
        return "unknown"
    name = function if isinstance(function, str) else function.name
    if name in symbols:
        return "yes"
    clones = symbols.clones(name) if symbols else ()
    return f"clone:{clones[0]}" if clones else "no"


def test_attach_status():
    symbols = kallsyms.KernelSymbols("test", {"a": None, "b.isra.0": None, "c.constprop.0": "m",
                                            "c.constprop.1": "m"})
    assert attach_status(function("a"), symbols) == "yes"
    assert attach_status("b", symbols) == "clone:b.isra.0"
    assert attach_status("c", symbols) == "clone:c.constprop.0"
    assert attach_status("d", symbols) == "no"
    assert attach_status("a", None) == "unknown"
    assert symbols.module_of("c.constprop.1") == "m"


def test_sock_methods_attachable_on_this_kernel():
    """Most functions BTF says take a struct sock exist under their own name here."""
    from ctracer.debuginfo.btf import reader as btf
    if not os.path.exists(btf.KERNEL_BTF):
        pytest.skip("no kernel BTF")
    symbols = kallsyms.kernel_symbols()
    if symbols is None:
        pytest.skip("no kernel symbol list readable")
    functions = btf.open_btf(btf.KERNEL_BTF).catalog().functions_referencing(
        ShapeKind.STRUCT, "sock")
    status = [attach_status(f, symbols) for f in functions]
    yes = status.count("yes")
    clones = sum(s.startswith("clone:") for s in status)
    print(f"\n{len(functions)} functions: {yes} attachable, {clones} only as clones, "
          f"{status.count('no')} absent ({symbols.source})")
    # BTF lists functions of this very kernel: each is a symbol, or was specialised into
    # a clone, or was inlined everywhere after BTF was made
    assert yes > len(functions) // 2
    assert all(s in ("yes", "no") or s.startswith("clone:") for s in status)


def test_symbols_loader_gives_the_same_symbols():
    loader = kallsyms.SymbolsLoader()
    assert loader.result() == kallsyms.kernel_symbols()


def test_kernel_release():
    assert features.kernel_release() == subprocess.run(
        ["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()


def test_probe_support_matches_what_the_kernel_offers():
    support = features.probe_support()
    print("\n" + support.summary())
    for name in ("kprobes", "fentry", "uprobes", "tracepoints", "raw_tracepoints"):
        print(f"  {name}: {getattr(support, name).why}")
    mount = tracefs.find_tracefs()
    devices = Path(features.EVENT_SOURCE_DEVICES)

    def offered(file: str, pmu: str) -> bool:
        return bool(mount and os.path.exists(os.path.join(mount, file))) \
            or (devices / pmu).exists()
    assert support.kprobes.works == offered("kprobe_events", "kprobe")
    assert support.uprobes.works == offered("uprobe_events", "uprobe")
    assert support.tracepoints.works == offered("available_events", "tracepoint")
    if os.geteuid() != 0:
        assert support.raw_tracepoints.works is None and support.fentry.works is None
    else:
        # what bpf(2) said, and the reason is given either way
        assert support.raw_tracepoints.works in (True, False)
        assert support.fentry.works in (True, False, None)
        assert support.fentry.why and support.raw_tracepoints.why
        seen = bpftrace_features()
        if seen is None:
            print("  (bpftrace is not installed: fentry and raw tracepoints unchecked)")
        else:  # bpftrace probes the same kernel by loading programs of its own
            assert support.fentry.works == (seen["kfunc"] == "yes"), seen
            assert support.raw_tracepoints.works == (seen["raw_tp_special"] == "yes")


def bpftrace_features() -> Optional[dict[str, str]]:
    """What ``bpftrace --info`` found the kernel accepts (``kfunc: yes``...), or None
    without bpftrace."""
    import shutil

    if shutil.which("bpftrace") is None:
        return None
    done = subprocess.run(["bpftrace", "--info"], capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr  # (bpftrace 0.17 prints it on stderr)
    found = {}
    for line in out.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep and value.strip() in ("yes", "no"):
            found[name.strip()] = value.strip()
    assert "kfunc" in found and "raw_tp_special" in found, out[-2000:]
    return found


@pytest.mark.bpf
def test_raw_tracepoints_attachable_names_real_and_missing():
    if os.geteuid() != 0:
        pytest.skip("loading a BPF program needs root")
    names = sorted(tracefs.tracepoint_names() or [])
    if not names:
        pytest.skip("no tracepoints listed in tracefs")
    real = names[0].split(":", 1)[1]
    result = features.raw_tracepoints_attachable([real, "ctracer_no_such_tracepoint"])
    if result is None:
        pytest.skip("the kernel refuses BPF programs here")
    assert result == {real: True, "ctracer_no_such_tracepoint": False}


def test_file_symbols_of_a_relocatable_file_include_its_first_function(tmp_path):
    """A .ko's (or .o's) symbol values are section offsets: the first function of a
    section is at 0 and still a function (nm is the oracle)."""
    src = tmp_path / "m.c"
    src.write_text("int first(int a) { return a + 1; }\n"
                   "static int __attribute__((noinline)) helper(int a) { return a * 3; }\n"
                   "int second(int a) { return helper(a) + 2; }\n")
    obj = tmp_path / "m.o"
    subprocess.run(["gcc", "-O1", "-c", "-o", str(obj), str(src)], check=True)
    nm = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True,
                        check=True).stdout.split("\n")
    expect = {line.split()[2] for line in nm if len(line.split()) == 3
              and line.split()[1] in "tTwW"}
    symbols = kallsyms.file_symbols(str(obj))
    assert symbols is not None and symbols.names() == expect
    assert "first" in symbols and symbols.source == "the symbol table of m.o"
    assert kallsyms.file_symbols(str(src)) is None     # not an ELF file
