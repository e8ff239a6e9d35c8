"""Big arrays of a big trace kept in files mapped into memory, not in the heap.

Ten million events' columns are about a gigabyte and a half (their snapshots, the
pairing's per-event arrays, the nesting); held on the heap they are memory the kernel
can never take back, and every helper the report forks reports them again.  An
`ArraySpace` made for such a trace puts each array of at least `MIN_BYTES` in its own
unnamed file (``O_TMPFILE``: no name on disk, so nothing is left behind even when the
process is killed) mapped shared: its pages are the file's, written back and dropped
by the kernel under memory pressure, and read again when touched.  The values are the
same as on the heap; only where they live changes.  For a trace under
`MAPPED_FROM_BYTES` (or a quarter of the memory limit the process runs under, when
that is less) the space is the heap (`ArraySpace(None)`).

The directory should be on a disk, not tmpfs (there the pages could not be dropped):
the report's output directory, an export's, or the system's temporary directory.

Under a memory limit (a memory cgroup: a container, a systemd unit's ``MemoryMax=``)
the pages of these files count as the process's until they are dropped, and a dirty
one (written, not yet on disk) cannot be dropped until it is written back: the kernel's
writeback starts from a share of the whole machine's memory, and in a cgroup (v1 at
least) reclaim does not write such pages itself, so a process filling a gigabyte of
mapped arrays under a 1 GB limit is killed by the OOM killer although nothing of it
needed to stay in memory.  `ArraySpace.writing_back` runs a thread that writes the
mapped arrays' dirty pages back every `WRITE_BACK_SECONDS` (``msync``, which releases
no memory but leaves clean pages the limit can drop at once), and at its end writes
everything back and unmaps the pages from the process (``MADV_DONTNEED``: the values
stay in the file, read again when touched), so the report's helpers forked afterwards
start from clean, droppable pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import tempfile
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import numpy as np

from ctracer.analysis.memory import MIN_BYTES, memory_limit

#: a trace whose event columns reach this many bytes has its big arrays mapped
MAPPED_FROM_BYTES = 256 << 20
#: a finished array this big moves into a file (`ArraySpace.settle`)
SETTLED_FROM_BYTES = 1 << 20
#: how often `ArraySpace.writing_back` writes the mapped arrays' dirty pages back
WRITE_BACK_SECONDS = 0.5

_MS_SYNC = 4


class ArraySpace:
    """Where the analysis puts its big arrays: the heap (``directory`` None) or unnamed
    files mapped from ``directory``."""

    def __init__(self, directory: Optional[str], min_bytes: Optional[int] = None):
        self.directory = directory
        self.min_bytes = min_bytes  # smaller arrays stay on the heap (None: `MIN_BYTES`)
        self.mapped_bytes = 0
        self._arrays: list[weakref.ref] = []  # every mapped array still alive

    @classmethod
    def for_trace(cls, events: int, row_bytes: int, directory: Optional[str]) -> "ArraySpace":
        """The space for a trace of ``events`` events of ``row_bytes`` each."""
        limit = memory_limit()
        # under a memory limit, columns of a quarter of it already go to files
        threshold = min(MAPPED_FROM_BYTES, limit // 4) if limit else MAPPED_FROM_BYTES
        if events * row_bytes < threshold:
            return cls(None)
        # and arrays of a 64th of it
        smallest = min(MIN_BYTES, limit // 64) if limit else MIN_BYTES
        return cls(directory or tempfile.gettempdir(), smallest)

    def zeros(self, shape: Any, dtype: Any) -> np.ndarray:
        """A zeroed array, mapped from the space's directory when it is big enough."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        smallest = MIN_BYTES if self.min_bytes is None else self.min_bytes
        if self.directory is None or size < max(smallest, 1):
            return np.zeros(shape, dtype)
        return self._mapped(shape, dtype, size)

    def _mapped(self, shape: tuple, dtype: np.dtype, size: int) -> np.ndarray:
        """Zeros in a new unnamed file mapped shared."""
        with tempfile.TemporaryFile(dir=self.directory) as f:
            os.ftruncate(f.fileno(), size)  # a sparse file: reads as zeros
            buffer = mmap.mmap(f.fileno(), size, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE)
        self.mapped_bytes += size
        array = np.frombuffer(buffer, dtype, count=int(np.prod(shape, dtype=np.int64)))
        self._arrays = [r for r in self._arrays if r() is not None] + [weakref.ref(array)]
        return array.reshape(shape)

    def _alive(self) -> list[np.ndarray]:
        """Every mapped array still alive (held while their pages are worked on)."""
        return [a for a in (ref() for ref in self._arrays) if a is not None]

    def write_back(self, drop: bool = False) -> None:
        """Write the mapped arrays' dirty pages to their files (and with ``drop`` unmap
        their pages from this process: they stay in the files)."""
        libc = _libc()
        if libc is None:
            return
        page = mmap.PAGESIZE
        alive = self._alive()
        for array in alive:
            address, size = array.__array_interface__["data"][0], array.nbytes
            start = address - address % page  # a mapping starts on a page
            length = size + (address - start)
            libc.msync(ctypes.c_void_p(start), ctypes.c_size_t(length), _MS_SYNC)
            if drop:
                libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length),
                             mmap.MADV_DONTNEED)

    @contextmanager
    def writing_back(self) -> Iterator[None]:
        """While the block runs, a thread writes the mapped arrays' dirty pages back
        every `WRITE_BACK_SECONDS` (see the module docstring); at its end everything is
        written back and unmapped from this process.  Nothing on the heap space."""
        if self.directory is None or _libc() is None:
            yield
            return
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(WRITE_BACK_SECONDS):
                self.write_back()  # ctypes lets go of the GIL: the passes go on

        thread = threading.Thread(target=run, name="ctracer-write-back", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.write_back(drop=True)

    def settle(self, array: Any) -> Any:
        """A finished array where it stays until the process ends: in a mapped space,
        a heap array of `SETTLED_FROM_BYTES` or more is copied into a file (the caller
        drops the heap one) and made read-only, so the pages helpers forked later
        share are the file's, never copied nor kept on the heap."""
        if self.directory is None or not isinstance(array, np.ndarray) or is_mapped(array):
            return array
        if array.nbytes < SETTLED_FROM_BYTES:
            return array
        out = self._mapped(array.shape, array.dtype, array.nbytes)
        out[...] = array
        out.setflags(write=False)
        return out

    def full(self, shape: Any, value: Any, dtype: Any) -> np.ndarray:
        """An array of ``value``, placed as `zeros` places it."""
        out = self.zeros(shape, dtype)
        if value:
            out[...] = value
        return out

    def copy(self, array: np.ndarray) -> np.ndarray:
        """A copy of ``array``, placed as `zeros` places it."""
        out = self.zeros(array.shape, array.dtype)
        out[...] = array
        return out

    def growing(self, dtype: Any) -> "GrowingArray":
        """A one-dimensional array of ``dtype`` made by appending parts whose total is
        not known beforehand (`GrowingArray`), in this space."""
        return GrowingArray(self, np.dtype(dtype))

    def _adopt(self, array: np.ndarray) -> None:
        """Count a mapped array made elsewhere as this space's (written back, dropped)."""
        self.mapped_bytes += array.nbytes
        self._arrays = [r for r in self._arrays if r() is not None] + [weakref.ref(array)]

    def take(self, array: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``array[rows]`` (rows: positions), in this space."""
        out = self.zeros((len(rows),) + array.shape[1:], array.dtype)
        for lo in range(0, len(rows), 1 << 20):  # no heap copy of the whole result
            out[lo:lo + (1 << 20)] = array[rows[lo:lo + (1 << 20)]]
        return out


class GrowingArray:
    """Parts appended one after the other, then one array (`finish`): on the heap space
    the parts joined; in a mapped space written to an unnamed file as they come (every
    `WRITTEN_BACK_BYTES` written back and dropped from the page cache, so under a
    memory limit they never pile up as dirty pages) and mapped read-only at the end.
    Nothing is copied twice, and nothing of it stays on the heap."""

    WRITTEN_BACK_BYTES = 32 << 20

    def __init__(self, space: ArraySpace, dtype: np.dtype):
        self.space, self.dtype = space, dtype
        self.parts: list[np.ndarray] = []
        self.length = 0
        self.file: Any = None
        self.unsynced = 0

    def append(self, part: np.ndarray) -> None:
        part = np.ascontiguousarray(part, dtype=self.dtype)
        if not len(part):
            return
        self.length += len(part)
        if self.space.directory is None:
            self.parts.append(part)
            return
        if self.file is None:
            self.file = tempfile.TemporaryFile(dir=self.space.directory)
        self.file.write(memoryview(part).cast("B"))
        self.unsynced += part.nbytes
        if self.unsynced >= self.WRITTEN_BACK_BYTES:
            self._let_go()

    def _let_go(self) -> None:
        self.file.flush()
        os.fdatasync(self.file.fileno())
        try:
            os.posix_fadvise(self.file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):
            pass
        self.unsynced = 0

    def finish(self) -> np.ndarray:
        """The whole array (read-only when mapped); the parts are let go."""
        if self.file is None:
            out = np.concatenate(self.parts) if self.parts else np.zeros(0, self.dtype)
            self.parts = []
            return out
        with self.file:
            self._let_go()
            buffer = mmap.mmap(self.file.fileno(), self.length * self.dtype.itemsize,
                               mmap.MAP_SHARED, mmap.PROT_READ)
        self.file = None
        out = np.frombuffer(buffer, self.dtype, count=self.length)
        self.space._adopt(out)
        return out


_libc_loaded: list = []


def _libc() -> Optional[Any]:
    """The C library with ``msync`` and ``madvise`` (None elsewhere)."""
    if not _libc_loaded:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc_loaded.append(libc if hasattr(libc, "msync") else None)
        except OSError:
            _libc_loaded.append(None)
    return _libc_loaded[0]


def is_mapped(array: Any) -> bool:
    """The array's values live in a mapped file (`ArraySpace`)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
