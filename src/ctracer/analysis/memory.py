"""The allocator while a trace is analysed: freed blocks reused, then given back.

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

While the passes run, though, `reuse_freed_blocks` keeps up to `KEPT_FREE` of what is
freed at the heap's top, and for a trace whose arrays are mapped serves every block
under `MIN_BYTES` (16 MiB, the size from which `ctracer.analysis.mapped` puts arrays in files) from the
heap: the passes make and drop such blocks by the thousand (a batch of raw events read
from the trace file, a chunk's temporaries), and a block mapped afresh each time costs
the kernel a fault and a zeroed page for every 4 KiB of it.  10M events: 3.5M page
faults, 1.1M of them reading the events, against 1.3M; the analysis 39.1 and 35.2 s
against 33.6 and 32.0 s, its anonymous peak 720-798 MB against 771 MB (serving blocks up
to 1 GiB from the heap saved no more time and peaked at 823-914 MB).  A trace on the
heap keeps `HEAP_TRACE_THRESHOLD` there: 16 MiB would put its columns on the heap too,
where the report's helpers copied more of them (1M events: 486-487 MB for the renderer
and its helpers against 415-432 MB, the analysis 2.9 s either way).  The analysis then
sets the threshold for the report's helpers (`map_large_blocks`, which also lets the
heap shrink again) and returns what is free (`release_free_memory`).  Elsewhere (not
glibc) these allocator settings do nothing.

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
import functools
from contextlib import contextmanager
from typing import Any, Iterator, Optional

#: arrays smaller than this stay on the heap while the analysis works on them (also
#: `ctracer.analysis.mapped`'s threshold for its files)
MIN_BYTES = 16 << 20

_libc: Optional[Any] = None
_tried = False


#: glibc's mallopt parameters and the thresholds kept (glibc's own starting values)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 128 * 1024
_TRIM_THRESHOLD = 128 * 1024
#: while the passes run, this much of what is freed stays at the heap's top for the
#: next blocks
KEPT_FREE = 32 << 20
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


@contextmanager
def passes_memory(mapped: bool) -> Iterator[None]:
    """The allocator's settings while the analysis' passes run (no huge pages; freed
    blocks reused), then the ones for the report's helpers (blocks mapped from 128 KiB
    for a trace whose arrays are ``mapped``, else from `HEAP_TRACE_THRESHOLD`) and the
    free memory returned, before anyone forks them."""
    small_pages_for_arrays()
    reuse_freed_blocks(MIN_BYTES if mapped else HEAP_TRACE_THRESHOLD)
    try:
        yield
    finally:
        map_large_blocks(_MMAP_THRESHOLD if mapped else HEAP_TRACE_THRESHOLD)
        release_free_memory()


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
    returned to the system when freed (the threshold no longer moves), and let the heap
    shrink from 128 KiB free at its top again; whether glibc took it."""
    return _mallopt(_M_MMAP_THRESHOLD, threshold) and _mallopt(_M_TRIM_THRESHOLD,
                                                                _TRIM_THRESHOLD)


def reuse_freed_blocks(up_to: int) -> bool:
    """Serve blocks under ``up_to`` bytes from the heap and keep `KEPT_FREE` of what is
    freed at its top (see the module docstring); whether glibc took it.  Until
    `map_large_blocks` is called again."""
    return _mallopt(_M_MMAP_THRESHOLD, up_to) and _mallopt(_M_TRIM_THRESHOLD, KEPT_FREE)


def _mallopt(parameter: int, value: int) -> bool:
    libc = _glibc()
    return bool(libc is not None and hasattr(libc, "mallopt")
                and libc.mallopt(parameter, value) == 1)


@functools.lru_cache(maxsize=None)
def memory_limit() -> Optional[int]:
    """The memory limit this process runs under, in bytes: its memory cgroup's (v1
    ``memory.limit_in_bytes``, v2 ``memory.max``, the tightest of its ancestors' for
    v2), None when there is none or it cannot be read.  A limit counts the page cache
    of the files the process reads, writes and maps, not only its heap."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    found: list[int] = []
    for _, names, path in lines:
        if "memory" in names.split(","):  # v1: the limit set on the cgroup (hierarchical)
            found += _limits(["/sys/fs/cgroup/memory" + path.rstrip("/")], "memory.limit_in_bytes")
    if not found:
        for _, names, path in lines:
            if names == "":  # v2: each ancestor's memory.max holds too
                parts = [p for p in path.split("/") if p]
                dirs = ["/sys/fs/cgroup/" + "/".join(parts[:k]) for k in range(len(parts), 0, -1)]
                found += _limits(dirs, "memory.max")
    real = [v for v in found if 0 < v < (1 << 60)]
    return min(real) if real else None


def _limits(directories: list[str], name: str) -> list[int]:
    values = []
    for d in directories:
        try:
            with open(f"{d}/{name}") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            values.append(int(text))
    return values


#: the memory limit from which the passes' slices keep their full size
FULL_SLICES_FROM = 1 << 30


def at_once(default: int) -> int:
    """How many events a pass works on at a time, ``default`` without a memory limit or
    under one of `FULL_SLICES_FROM` or more; under a smaller one proportionally fewer
    (a 256 MB limit: a quarter), never under 16,384.  A slice's temporaries (Python
    lists of its columns while calls are paired: ~100 bytes an event and column) are
    what the analysis holds beside its arrays."""
    limit = memory_limit()
    if not limit or limit >= FULL_SLICES_FROM:
        return default
    return max(1 << 14, int(default * limit / FULL_SLICES_FROM))


#: what writing one object's pages takes beside the analysis, per event of the object
#: (a 500k-event socket of a kernel trace: ~120 MB)
HELPER_BYTES_PER_OBJECT_EVENT = 256
#: what writing the all-objects pages takes, per event of the trace (a helper writes
#: them too)
HELPER_BYTES_PER_EVENT = 64


def helpers_within_limit(wanted: int, busiest_object_events: int = 0,
                         events: int = 0) -> int:
    """How many of ``wanted`` forked helpers the memory limit leaves room for, 0 meaning
    "do the work in this process": without a limit ``wanted``; under one, a helper is
    counted at this process's anonymous memory, at least 64 MB, at least
    `HELPER_BYTES_PER_OBJECT_EVENT` per event of the busiest object whose pages it may
    write and `HELPER_BYTES_PER_EVENT` per event of the trace (what it may copy of the
    parent's memory as it touches the pages it inherited, and its own temporaries: the
    all-objects pages' go over every event; 2M events: ~110 MB a helper; a kernel
    trace's few objects have hundreds of thousands of events each, and their pages need
    as much), and all of them together with this process must stay within three
    quarters of the limit (the rest is the page cache of the trace, the mapped arrays
    and the pages written).  One helper is no faster than this process alone, so 1
    becomes 0."""
    limit = memory_limit()
    if not limit or wanted < 1:
        return wanted
    anonymous = _own_anonymous_bytes()
    if anonymous is None:
        return wanted
    each = max(anonymous, 64 << 20, busiest_object_events * HELPER_BYTES_PER_OBJECT_EVENT,
               events * HELPER_BYTES_PER_EVENT)
    room = int((limit * 3 // 4 - anonymous) // each)
    helpers = max(0, min(wanted, room))
    return 0 if helpers < 2 else helpers


def _own_anonymous_bytes() -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None