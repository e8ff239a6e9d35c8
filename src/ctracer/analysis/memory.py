"""Giving freed memory back to the system once a trace is analysed.

The passes turn chunks of columns into Python lists and build large temporary arrays;
when they are freed, glibc's allocator keeps much of that memory mapped (small objects
leave partly used pages behind), so a process that analysed 3M events stayed at ~720 MB
resident where ~460 MB were in use.  `release_free_memory` asks glibc to return it
(``malloc_trim``), so the report's helper processes, forked after the analysis, start
from what the analysis holds.  `map_large_blocks` keeps glibc from serving large arrays
from its heap: glibc raises its mmap threshold (to up to 32 MB) each time a mapped block
is freed, after which the passes' many-megabyte temporaries come from the heap and leave
it fragmented (10M events: 805 MB resident before the helpers fork, 696 MB with the
threshold fixed at 128 KiB) for a trace whose arrays are mapped
(`ctracer.analysis.mapped`); a smaller trace keeps it at `HEAP_TRACE_THRESHOLD`, since
at 128 KiB every per-page temporary costs a mapping, zeroed pages and an unmapping
(1M events: ~1 s of kernel time in the analysis alone), and a threshold left to move
leaves the report's helpers ~100 MB more (1M events: 595 MB for the renderer and its
helpers together, against 494 MB at 128 KiB and 521-538 MB at 4 MiB).
Elsewhere (not glibc) both do nothing.

`small_pages_for_arrays` stops numpy asking the kernel for huge pages for its arrays
(``madvise(MADV_HUGEPAGE)`` on every array of 4 MiB or more, numpy's default): where the
kernel compacts memory to find one at the fault (``defrag`` ``madvise``, Debian's
default), each new column-sized temporary stalled in the kernel: 10M events, the
analysis took 62-73 s with huge pages, 52-63 s without, in alternating runs (call
counting 12.7-14.4 s, 5.6-7.0 s of it in the kernel, against 6.6-8.8 s).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Optional

_libc: Optional[Any] = None
_tried = False


#: glibc's mallopt parameter and the threshold kept (glibc's own starting value)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 128 * 1024
#: the threshold kept for a trace whose arrays stay on the heap: its per-page and
#: per-object temporaries come from the heap, its column-sized ones are mapped
HEAP_TRACE_THRESHOLD = 4 << 20


def _glibc() -> Optional[Any]:
    global _libc, _tried
    if not _tried:
        _tried = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = libc if hasattr(libc, "malloc_trim") else None
        except OSError:
            _libc = None
    return _libc


def release_free_memory() -> bool:
    """Return the allocator's free memory to the system; whether it could be asked."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def small_pages_for_arrays() -> bool:
    """Keep numpy from asking for huge pages for its arrays (see the module docstring);
    whether this numpy has the switch."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    switch = getattr(multiarray, "_set_madvise_hugepage", None)
    if switch is None:
        return False
    switch(False)
    return True


def map_large_blocks(threshold: int = _MMAP_THRESHOLD) -> bool:
    """Serve every block of ``threshold`` bytes or more (128 KiB) by its own mapping,
    returned to the system when freed (the threshold no longer moves); whether glibc
    took it."""
    libc = _glibc()
    return bool(libc is not None and hasattr(libc, "mallopt")
                and libc.mallopt(_M_MMAP_THRESHOLD, threshold) == 1)
