"""`ctracer.analysis.memory`, each case in a fresh interpreter:

* `map_large_blocks`: a large array freed after glibc raised its mmap threshold goes back
  to the system (without the call, it stays in the heap);
* `passes_memory`: while the passes run, a block freed is served again from the heap
  without the kernel faulting in fresh pages (blocks under 16 MiB for a trace whose
  arrays are mapped, under 4 MiB for one on the heap); afterwards the free memory goes
  back to the system."""

from __future__ import annotations

import subprocess
import sys

import pytest

ANON_MB = r"""
def anon_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
"""

# A 16 MB block freed raises glibc's threshold above 10 MB, so a 10 MB array then comes
# from the heap; a small block allocated after it pins the heap's top, so freeing the
# array leaves it resident.  Prints the MB still resident after the 10 MB array is freed.
THRESHOLD_PROBE = ANON_MB + r"""
import sys
import numpy as np
from ctracer.analysis.memory import map_large_blocks

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

# An array of argv[2] MiB made and freed, then another one; prints the page faults of
# the second, the MB resident once it is freed, and the MB resident once the passes'
# settings are undone (each relative to the start).
REUSE_PROBE = ANON_MB + r"""
import resource, sys
import numpy as np
from ctracer.analysis.memory import map_large_blocks, passes_memory, small_pages_for_arrays

size = int(sys.argv[2]) << 20

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


def _probe(probe: str, *args: str) -> list[str]:
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's allocator only")
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


def test_a_freed_large_array_leaves_the_process():
    assert float(_probe(THRESHOLD_PROBE, "default")[0]) > 8, \
        "glibc kept no freed heap block: the probe shows nothing"
    assert float(_probe(THRESHOLD_PROBE, "fixed")[0]) < 2


@pytest.mark.parametrize("mode, mib, reused", [
    ("helpers", 8, False),
    ("mapped", 8, True),
    ("heap", 2, True),
    ("heap", 8, False),  # a heap trace's columns stay mapped: its helpers copy none
])
def test_freed_blocks_are_reused_while_the_passes_run_then_returned(mode, mib, reused):
    pages = (mib << 20) // 4096
    refaults, kept, after = _probe(REUSE_PROBE, mode, str(mib))
    refaults, kept, after = int(refaults), float(kept), float(after)
    if reused:
        assert refaults < pages // 10, f"{refaults} page faults for a block made again"
        assert kept > mib * 0.75, "the freed block did not stay in the heap"
    else:
        assert refaults > pages // 2, f"a freed {mib} MiB block was reused ({mode})"
    assert after < 4, f"{after:.0f} MB still resident once the passes' settings were undone"
