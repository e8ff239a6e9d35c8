"""`ctracer.record.ringbuf.MappedRing` on a ring laid out as the kernel lays one out
(consumer page, producer page, data), in a memory file: records taken up to the first
one a producer has not submitted, discarded ones skipped, and `drained` saying whether
every record reserved before the take was taken (what lets ``--tail`` print events in
time order, `ctracer.record.tail`)."""

from __future__ import annotations

import mmap
import os
import struct

import pytest

from ctracer.record import ringbuf

RING = 1 << 16
EVENT = 12


class _NoPoll:
    """A memory file cannot be polled; the take does not need it."""

    def register(self, fd, events):
        pass

    def close(self):
        pass


@pytest.fixture
def ring(monkeypatch):
    monkeypatch.setattr(ringbuf.select, "epoll", _NoPoll)
    page = mmap.PAGESIZE
    fd = os.memfd_create("ring")
    os.ftruncate(fd, 2 * page + 2 * RING)
    taken = ringbuf.MappedRing(fd, RING, EVENT)
    stride = ringbuf.record_bytes(EVENT)

    def put(index: int, payload: bytes, busy: bool = False, discard: bool = False):
        length = len(payload) | (ringbuf.BUSY_BIT if busy else 0) \
            | (ringbuf.DISCARD_BIT if discard else 0)
        os.pwrite(fd, struct.pack("<II", length, 0) + payload, 2 * page + index * stride)

    def fill(*records: tuple[bytes, dict]):
        """Records (payload, put's flags) from the start, then the producer past them."""
        for index, (payload, flags) in enumerate(records):
            put(index, payload, **flags)
        os.pwrite(fd, struct.pack("<Q", len(records) * stride), page)

    yield taken, put, fill
    taken.close()
    os.close(fd)


def test_a_take_stops_at_a_busy_record_and_says_the_ring_was_not_drained(ring):
    taken, put, fill = ring
    fill((b"a" * EVENT, {}), (b"b" * EVENT, {"busy": True}), (b"c" * EVENT, {}))
    assert taken.take() == (b"a" * EVENT, 1) and not taken.drained
    put(1, b"b" * EVENT)          # submitted now
    assert taken.take() == (b"b" * EVENT + b"c" * EVENT, 2) and taken.drained
    assert taken.take() == (b"", 0) and taken.drained


def test_a_limit_leaves_records_and_a_discarded_record_is_skipped(ring):
    taken, _put, fill = ring
    fill((b"a" * EVENT, {}), (b"x" * EVENT, {"discard": True}), (b"c" * EVENT, {}))
    assert taken.take(limit=2) == (b"a" * EVENT, 2) and not taken.drained
    assert taken.take(limit=2) == (b"c" * EVENT, 1) and taken.drained
