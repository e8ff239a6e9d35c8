"""`ctracer.analysis.memory.passes_memory`: while the passes run, a block freed is served
again from the heap without the kernel faulting in fresh pages (blocks under 16 MiB for
a trace whose arrays are mapped, under 4 MiB for one on the heap); afterwards the free
memory goes back to the system."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In a fresh interpreter: an array of argv[2] MiB made and freed, then another one;
# prints the page faults of the second, the MB resident once it is freed, and the MB
# resident once the passes' settings are undone (each relative to the start).
PROBE = r"""
import resource, sys
import numpy as np
from ctracer.analysis.memory import map_large_blocks, passes_memory, small_pages_for_arrays

size = int(sys.argv[2]) << 20

def anon_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def twice():
    first = np.ones(size, np.uint8)
    del first
    before = faults()
    second = np.ones(size, np.uint8)
    del second
    return faults() - before

start = anon_mb()
if sys.argv[1] == "helpers":  # the settings the report's helpers get
    small_pages_for_arrays()
    map_large_blocks()
    refaults, kept = twice(), anon_mb() - start
else:
    with passes_memory(mapped=sys.argv[1] == "mapped"):
        refaults, kept = twice(), anon_mb() - start
print(refaults, kept, anon_mb() - start)
"""


def _probe(mode: str, mib: int) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(mib)], capture_output=True,
                         text=True, check=True)
    refaults, kept, after = out.stdout.split()
    return int(refaults), float(kept), float(after)


@pytest.mark.parametrize("mode, mib, reused", [
    ("helpers", 8, False),
    ("mapped", 8, True),
    ("heap", 2, True),
    ("heap", 8, False),  # a heap trace's columns stay mapped: its helpers copy none
])
def test_freed_blocks_are_reused_while_the_passes_run_then_returned(mode, mib, reused):
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's allocator only")
    pages = (mib << 20) // 4096
    refaults, kept, after = _probe(mode, mib)
    if reused:
        assert refaults < pages // 10, f"{refaults} page faults for a block made again"
        assert kept > mib * 0.75, "the freed block did not stay in the heap"
    else:
        assert refaults > pages // 2, f"a freed {mib} MiB block was reused ({mode})"
    assert after < 4, f"{after:.0f} MB still resident once the passes' settings were undone"
