"""`ctracer.analysis.memory.map_large_blocks`: a large array freed after glibc raised its
mmap threshold goes back to the system (without the call, it stays in the heap)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In a fresh interpreter: a 16 MB block freed raises glibc's threshold above 10 MB, so a
# 10 MB array then comes from the heap; a small block allocated after it pins the heap's
# top, so freeing the array leaves it resident.  Prints the MB still resident after
# the 10 MB array is freed.
PROBE = r"""
import sys
import numpy as np
from ctracer.analysis.memory import map_large_blocks

def anon_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

if sys.argv[1] == "fixed":
    assert map_large_blocks()
first = np.ones(16 << 20, np.uint8)
del first
before = anon_mb()
big = np.ones(10 << 20, np.uint8)
pin = np.ones(1000, np.uint8)
del big
print(anon_mb() - before)
"""


def _kept_mb(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True)
    return float(out.stdout)


def test_a_freed_large_array_leaves_the_process():
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's allocator only")
    assert _kept_mb("default") > 8, "glibc kept no freed heap block: the probe shows nothing"
    assert _kept_mb("fixed") < 2
