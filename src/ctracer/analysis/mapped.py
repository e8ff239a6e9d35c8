"""Big arrays of a big trace kept in files mapped into memory, not in the heap.

Ten million events' columns are about a gigabyte and a half (their snapshots, the
pairing's per-event arrays, the nesting); held on the heap they are memory the kernel
can never take back, and every helper the report forks reports them again.  An
`ArraySpace` made for such a trace puts each array of at least `MIN_BYTES` in its own
unnamed file (``O_TMPFILE``: no name on disk, so nothing is left behind even when the
process is killed) mapped shared: its pages are the file's, written back and dropped
by the kernel under memory pressure, and read again when touched.  The values are the
same as on the heap; only where they live changes.  For a trace under
`MAPPED_FROM_BYTES` the space is the heap (`ArraySpace(None)`).

The directory should be on a disk, not tmpfs (there the pages could not be dropped):
the report's output directory, an export's, or the system's temporary directory.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any, Optional

import numpy as np

#: a trace whose event columns reach this many bytes has its big arrays mapped
MAPPED_FROM_BYTES = 256 << 20
#: arrays smaller than this stay on the heap while the analysis works on them
MIN_BYTES = 16 << 20
#: a finished array this big moves into a file (`ArraySpace.settle`)
SETTLED_FROM_BYTES = 1 << 20


class ArraySpace:
    """Where the analysis puts its big arrays: the heap (``directory`` None) or unnamed
    files mapped from ``directory``."""

    def __init__(self, directory: Optional[str]):
        self.directory = directory
        self.mapped_bytes = 0

    @classmethod
    def for_trace(cls, events: int, row_bytes: int, directory: Optional[str]) -> "ArraySpace":
        """The space for a trace of ``events`` events of ``row_bytes`` each."""
        if events * row_bytes < MAPPED_FROM_BYTES:
            return cls(None)
        return cls(directory or tempfile.gettempdir())

    def zeros(self, shape: Any, dtype: Any) -> np.ndarray:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.directory is None or size < max(MIN_BYTES, 1):
            return np.zeros(shape, dtype)
        return self._mapped(shape, dtype, size)

    def _mapped(self, shape: tuple, dtype: np.dtype, size: int) -> np.ndarray:
        """Zeros in a new unnamed file mapped shared."""
        with tempfile.TemporaryFile(dir=self.directory) as f:
            os.ftruncate(f.fileno(), size)  # a sparse file: reads as zeros
            buffer = mmap.mmap(f.fileno(), size, mmap.MAP_SHARED,
                               mmap.PROT_READ | mmap.PROT_WRITE)
        self.mapped_bytes += size
        return np.frombuffer(buffer, dtype, count=int(np.prod(shape, dtype=np.int64))).reshape(shape)

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
        out = self.zeros(shape, dtype)
        if value:
            out[...] = value
        return out

    def copy(self, array: np.ndarray) -> np.ndarray:
        out = self.zeros(array.shape, array.dtype)
        out[...] = array
        return out

    def take(self, array: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``array[rows]`` (rows: positions), in this space."""
        out = self.zeros((len(rows),) + array.shape[1:], array.dtype)
        for lo in range(0, len(rows), 1 << 20):  # no heap copy of the whole result
            out[lo:lo + (1 << 20)] = array[rows[lo:lo + (1 << 20)]]
        return out


def is_mapped(array: Any) -> bool:
    """The array's values live in a mapped file (`ArraySpace`)."""
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
