"""The busy kernel trace the memory-limit tests share: this host's tracepoints of struct
sock around the loopback sample, 4 sockets x 28,000 messages, every field (408-byte
snapshots): about 2M events on a handful of objects, recorded once a session
(``busy_kernel_trace`` in tests/conftest.py) for the render's and the exports' tests,
each run inside a memory cgroup several times smaller than it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support.memcgroup import cgroup_unavailable

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TCPLOOP = os.path.join(ROOT, "samples", "tcp", "build", "tcploop")


def ctracer(*args: str) -> list[str]:
    """The command line running this checkout's ctracer with ``args``."""
    return [sys.executable, "-m", "ctracer", *args]


def record(directory) -> tuple[str, int]:
    """The trace recorded into ``directory`` and its event count (the test skips, saying
    why, without cgroups or the built sample)."""
    why = cgroup_unavailable()
    if why:
        pytest.skip(why)
    if not os.access(TCPLOOP, os.X_OK):
        pytest.skip(f"the loopback sample is not built ({TCPLOOP}: scripts/setup.sh)")
    path = str(directory / "tcp.ctrace")
    done = subprocess.run(ctracer("trace", "struct", "sock", "--buffer-mb", "64", "-o", path,
                                  "-q", "--", TCPLOOP, "--connections", "4", "--messages",
                                  "28000"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stderr.splitlines() if " events, " in ln)
    events, objects = (int(n) for n in
                       re.search(r"(\d+) events, (\d+) object addresses", line).groups())
    assert events > 1_500_000 and objects <= 16, line
    return path, events
