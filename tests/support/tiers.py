"""The test tiers: which tests need BPF, which read the running kernel, and a check at
collection that none of them goes unmarked.

Tiers (markers, declared in pyproject.toml):
- ``bpf``: loads BPF programs (needs root and a kernel that takes them);
- ``kernel``: reads the running kernel (its BTF, tracefs, kallsyms, probe support);
- ``vm``: runs inside a QEMU guest (`support.vmguest`).
``pytest -m "not bpf and not kernel and not vm"`` is the tier that runs anywhere, as any
user.

A test gets its marker from what it uses: the fixtures ``bpf`` and ``live_kernel``
(directly or through another fixture) add ``bpf`` and ``kernel``.  A test may also carry
the marker itself.  What a test uses is found in its source: the test function, the
fixtures it requests and the module-level functions and names they refer to (followed
within the module).  If that source shows one of the signals below (a call into the BPF
runtime, a path of the live kernel) and the test carries no matching marker, collection
fails naming the test and the signal: an unmarked test would otherwise run, and fail or
skip, in the tier that promises to run anywhere.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
from functools import lru_cache
from pathlib import Path

import pytest

KERNEL_BTF = Path("/sys/kernel/btf/vmlinux")

# What in a test's source says it needs BPF, or reads the running kernel.
SIGNALS = {
    "bpf": re.compile(r"\b(bpf_or_skip|uprobe_self_test|bpf_runtime|verify_programs)\b"
                      r"|pytest\.skip\([^)]*\b(uprobes?|BPF|bpf)\b"
                      r"|\[\s*sys\.executable\s*,\s*\"-m\"\s*,\s*\"ctracer\"\s*,\s*\"demo\""),
    "kernel": re.compile(r"[\"']/sys/kernel/|(Path|open)\(\s*[\"']/proc/kallsyms"
                         r"|\bprobe_support\(|\bKERNEL_BTF\b"),
}
FIXTURE_MARKS = {"bpf": "bpf", "live_kernel": "kernel"}


@pytest.fixture(scope="session")
def bpf():
    """Skips (saying why) unless this process may load BPF programs here: root, and a
    kernel that takes raw tracepoint or uprobe programs."""
    if os.geteuid() != 0:
        pytest.skip("loading BPF programs needs root")
    from ctracer.host import features
    support = features.probe_support()
    if support.raw_tracepoints.works is False and support.uprobes.works is False:
        pytest.skip(f"BPF unavailable: {support.summary()}")


@pytest.fixture(scope="session")
def live_kernel() -> Path:
    """The running kernel's BTF; skips (saying why) where it cannot be read."""
    if not os.access(KERNEL_BTF, os.R_OK):
        pytest.skip(f"this kernel has no readable BTF at {KERNEL_BTF}")
    return KERNEL_BTF


@lru_cache(maxsize=None)
def _module_parts(path: str) -> dict[str, str]:
    """Each module-level name of a test module and the source that defines it."""
    text = Path(path).read_text()
    parts: dict[str, str] = {}
    for node in ast.parse(text).body:
        segment = ast.get_source_segment(text, node) or ""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            parts[node.name] = segment
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        parts[n.id] = segment
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                parts[(alias.asname or alias.name).split(".")[0]] = segment
    return parts


def _used_source(item) -> str:
    """The source a test runs: its function, its fixtures', and what they name in the
    module, followed transitively."""
    sources = []
    try:
        sources.append(inspect.getsource(item.function))
    except (OSError, TypeError):
        return ""
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for d in defs:
            try:
                if inspect.getsourcefile(d.func) == str(item.path):
                    sources.append(inspect.getsource(d.func))
            except (OSError, TypeError):
                pass
    parts = _module_parts(str(item.path))
    seen: set[str] = set()
    todo = list(sources)
    while todo:
        for name in re.findall(r"\b[A-Za-z_]\w*\b", todo.pop()):
            if name in parts and name not in seen:
                seen.add(name)
                sources.append(parts[name])
                todo.append(parts[name])
    return "\n".join(sources)


def unmarked_uses(item) -> list[str]:
    """Why ``item`` should carry a tier marker it lacks (empty when all is well)."""
    if item.get_closest_marker("vm"):
        return []
    missing = []
    source = _used_source(item)
    for mark, signal in SIGNALS.items():
        if item.get_closest_marker(mark):
            continue
        found = signal.search(source)
        if found:
            missing.append(f"{item.nodeid}: uses {found.group(0).strip()!r} but is not "
                           f"marked {mark!r} (request the fixture "
                           f"{'bpf' if mark == 'bpf' else 'live_kernel'}, or mark it)")
    return missing


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, mark in FIXTURE_MARKS.items():
            if fixture in item.fixturenames and not item.get_closest_marker(mark):
                item.add_marker(mark)
    problems = [p for item in items for p in unmarked_uses(item)]
    if problems:
        raise pytest.UsageError("tests that need a tier marker lack it:\n  "
                                + "\n  ".join(problems))
