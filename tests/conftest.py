"""Fixtures shared by the tests of every stage.

``private_cache``: ctracer's cache directory (``$XDG_CACHE_HOME/ctracer``) private to the
test, so that DWARF catalogs, BTF indexes and kernel symbol lists written by one test
are never read by another, nor by the user.  Modules that want it for every test say
``pytestmark = pytest.mark.usefixtures("private_cache")``.

``build_c``: compiles a C fixture into the test's own directory (see
`support.cbuild.compile_c`),
e.g. ``build_c("net.c", Build("clang", dwarf=4, opt=2))``; modules and sessions that
build once call `support.cbuild.compile_c` directly.

``vm_kernel`` and the marker ``vm``: tests that run inside QEMU guests booting Debian's
6.1 and 6.12 kernels, one boot per kernel (`support.vmguest`, loaded here).

``bpf`` and ``live_kernel`` and the markers ``bpf`` and ``kernel``: the test tiers
(`support.tiers`, loaded here; collection fails on a test that needs a marker it lacks).
Helpers shared by tests live in tests/support/.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from support.cbuild import Build, compile_c

pytest_plugins = ["support.vmguest", "support.tiers"]

# Debian installs bpftool (which reads BTF files, no privilege needed) in /usr/sbin, which
# an ordinary user's PATH lacks: the oracle tests that run it would skip for that user.
_SBIN = [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin")
         if d not in os.environ.get("PATH", "").split(os.pathsep)]
if _SBIN:
    os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])


@pytest.fixture(autouse=True)
def _files_of_dropped_readers_closed():
    """A debug-info reader keeps its file open until the cycle collector frees it, which
    ctracer pauses while reading and `ctracer.cli.main` freezes out (``gc.freeze``:
    right for a process that runs one command); a session that reads hundreds of
    binaries in process would otherwise run out of file descriptors (1024 for a user).
    So once many are open, the garbage is collected."""
    yield
    if len(os.listdir("/proc/self/fd")) > 256:
        gc.unfreeze()
        gc.collect()


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> Path:
    """The test's own ctracer cache directory (not created until something writes)."""
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home / "ctracer"


@pytest.fixture
def build_c(tmp_path):
    """``build_c(sources, build=Build(), name=None, **options) -> Path``: the program
    compiled into the test's directory (named after the first source by default)."""

    def build(sources, build: Build = Build(), name=None, **options) -> Path:
        first = sources if isinstance(sources, (str, Path)) else sources[0]
        out = tmp_path / (name or Path(first).stem)
        compile_c(sources, out, build, **options)
        return out

    return build


@pytest.fixture(scope="session")
def busy_kernel_trace(bpf, tmp_path_factory):
    """About 2M events of 4 busy sockets, every field (`support.busy_trace`), recorded
    once for the memory-limit tests of the render and the exports: (path, events)."""
    from support.busy_trace import record

    return record(tmp_path_factory.mktemp("busy-kernel"))
