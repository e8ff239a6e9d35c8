"""`ctracer.analysis.memory.passes_memory`: while the passes run, a large block freed is
served again from the heap without the kernel faulting in fresh pages; afterwards the
free memory goes back to the system."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In a fresh interpreter: a 8 MiB array made and freed, then another one; prints the
# page faults of the second, the MB resident once it is freed, and the MB resident once
# the passes' settings are undone (each relative to the start).
PROBE = r"""
import resource, sys
import numpy as np
from ctracer.analysis.memory import map_large_blocks, passes_memory, small_pages_for_arrays

def anon_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def twice():
    first = np.ones(8 << 20, np.uint8)
    del first
    before = faults()
    second = np.ones(8 << 20, np.uint8)
    del second
    return faults() - before

start = anon_mb()
if sys.argv[1] == "passes":
    with passes_memory(mapped=True):
        refaults, kept = twice(), anon_mb() - start
else:  # the settings the report's helpers get: every large block mapped afresh
    small_pages_for_arrays()
    map_large_blocks()
    refaults, kept = twice(), anon_mb() - start
print(refaults, kept, anon_mb() - start)
"""


def _probe(mode: str) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True)
    refaults, kept, after = out.stdout.split()
    return int(refaults), float(kept), float(after)


def test_freed_blocks_are_reused_while_the_passes_run_then_returned():
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's allocator only")
    pages = (8 << 20) // 4096
    refaults, kept, _after = _probe("helpers")
    assert refaults > pages // 2, "a freed 8 MiB block was reused with the helpers' settings"
    refaults, kept, after = _probe("passes")
    assert refaults < pages // 10, f"{refaults} page faults for a block made a second time"
    assert kept > 6, "the freed block did not stay in the heap while the passes ran"
    assert after < 4, f"{after:.0f} MB still resident once the passes' settings were undone"
