"""The test tiers: which tests need BPF, which read the running kernel, and a check at
collection that none of them goes unmarked.

Tiers (markers, declared in pyproject.toml):
- ``bpf``: loads BPF programs (needs root and a kernel that takes them);
- ``kernel``: reads the running kernel (its BTF, tracefs, kallsyms, probe support)
  without loading BPF (a ``bpf`` test reads it too, and needs no second marker);
- ``vm``: runs inside a QEMU guest (`support.vmguest`).
``pytest -m "not bpf and not kernel and not vm"`` is the tier that runs anywhere, as any
user.

A test gets its marker from what it uses: the fixtures ``bpf`` and ``live_kernel``
(directly or through another fixture) add ``bpf`` and ``kernel``.  A test may also carry
the marker itself.  What a test uses is found in its source: the test function, the
fixtures it requests and the module-level functions and names they refer to, followed
within the module and into the helpers of tests/support/ it calls.  If that source shows one of the signals below (a call into the BPF
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
    "bpf": re.compile(r"(bpf_or_skip|uprobe_self_test|bpf_runtime|verify_programs)\b"
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


SUPPORT = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def _module_parts(path: str) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Each module-level name of a test or helper module and the source that defines it;
    and the names it imports from tests/support/: alias → (helper file, name in it, or
    "" for the helper module itself)."""
    text = Path(path).read_text()
    parts: dict[str, str] = {}
    helpers: dict[str, tuple[str, str]] = {}
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
                bound = (alias.asname or alias.name).split(".")[0]
                parts[bound] = segment
                if isinstance(node, ast.ImportFrom) and node.module == "support":
                    helpers[bound] = (str(SUPPORT / f"{alias.name}.py"), "")
                elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("support."):
                    helpers[bound] = (str(SUPPORT / f"{node.module.split('.', 1)[1]}.py"),
                                      alias.name)
    return parts, helpers


def _used_source(item) -> str:
    """The source a test runs: its function, its fixtures', and what they name in the
    module or call of the helpers in tests/support/, followed transitively."""
    fixtures = tuple(d.func for defs in item._fixtureinfo.name2fixturedefs.values()
                     for d in defs)
    return _closure(str(item.path), getattr(item, "function", None), fixtures)


@lru_cache(maxsize=None)
def _closure(path_of_test: str, function, fixtures: tuple) -> str:
    try:
        todo = [(path_of_test, inspect.getsource(function))]
    except (OSError, TypeError):
        return ""
    for func in fixtures:
        try:
            if inspect.getsourcefile(func) == path_of_test:
                todo.append((path_of_test, inspect.getsource(func)))
        except (OSError, TypeError):
            pass
    sources = [text for _, text in todo]
    seen: set[tuple[str, str]] = set()

    def use(path: str, name: str) -> None:
        if (path, name) in seen or not os.path.exists(path):
            return
        seen.add((path, name))
        text = _module_parts(path)[0].get(name)
        if text is not None:
            sources.append(text)
            todo.append((path, text))

    while todo:
        path, text = todo.pop()
        parts, helpers = _module_parts(path)
        for name, attribute in re.findall(r"\b([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?", text):
            if name in helpers:
                helper, inner = helpers[name]
                use(helper, inner or attribute)
            elif name in parts:
                use(path, name)
    return "\n".join(sources)


def unmarked_uses(item) -> list[str]:
    """Why ``item`` should carry a tier marker it lacks (empty when all is well)."""
    if item.get_closest_marker("vm"):
        return []
    missing = []
    source = _used_source(item)
    for mark, signal in SIGNALS.items():
        if item.get_closest_marker(mark) or (mark == "kernel" and item.get_closest_marker("bpf")):
            continue  # loading BPF reads the running kernel too
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
