"""A BPF ring buffer laid out in a memory file, for the reader's tests: the consumer
page, the producer page, then the data twice (the kernel maps it twice in a row)."""

from __future__ import annotations

import mmap
import os
import struct

from ctracer.record import ringbuf

PAGE = mmap.PAGESIZE


class NoPoll:
    """A memory file cannot be polled; the takes do not need it."""

    def register(self, fd, events):
        pass

    def close(self):
        pass


def memory_ring(monkeypatch, ring_bytes: int) -> int:
    """A memory file sized as a ring of ``ring_bytes`` with its two control pages (the
    reader's polls made no-ops); its descriptor."""
    monkeypatch.setattr(ringbuf.select, "epoll", NoPoll)
    fd = os.memfd_create("ring")
    os.ftruncate(fd, 2 * PAGE + 2 * ring_bytes)
    return fd


def put_compact(fd: int, ring_bytes: int, pos: int, event: bytes, first_page: int,
                busy: bool = False) -> int:
    """Write ``event`` as a record at producer position ``pos`` with the kernel's
    ``pg_off`` (ring pages counted from ``first_page``), in both halves as the kernel's
    double mapping shows it; the position after it."""
    at = pos & (ring_bytes - 1)
    record = struct.pack("<II", len(event) | (ringbuf.BUSY_BIT if busy else 0),
                         first_page + at // PAGE) + event + bytes(-len(event) % 8)
    first = min(len(record), ring_bytes - at)
    for half in (0, ring_bytes):
        os.pwrite(fd, record[:first], 2 * PAGE + half + at)
        os.pwrite(fd, record[first:], 2 * PAGE + half)
    return pos + len(record)


def set_producer(fd: int, pos: int) -> None:
    os.pwrite(fd, struct.pack("<Q", pos), PAGE)


def set_consumer(fd: int, pos: int) -> None:
    os.pwrite(fd, struct.pack("<Q", pos), 0)
