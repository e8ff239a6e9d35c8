"""`ctracer.record.ringbuf.MappedRing` on a ring laid out as the kernel lays one out
(consumer page, producer page, data), in a memory file: records taken up to the first
one a producer has not submitted, discarded ones skipped, and `drained` saying whether
every record reserved before the take was taken (what lets ``--tail`` print events in
time order, `ctracer.record.tail`); compact records of any length found with numpy
exactly where the walk from record to record finds them, across the ring's end and up to
a busy one."""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np
import pytest

from ctracer.deltas import RecordShape
from ctracer.event import DELTA_CHANGED, DELTA_FIXED, Field, Layout, compact_size, delta_words
from ctracer.record import ringbuf
from support import memring

RING = 1 << 16
EVENT = 12


@pytest.fixture
def ring(monkeypatch):
    page = mmap.PAGESIZE
    fd = memring.memory_ring(monkeypatch, RING)
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


# -- whole records of any length (compact events), found with numpy ------------------

MINI = Layout.packed_in_order("ctracer__mini_r", [Field(f"f{i}", "u64", 0) for i in range(30)])
WORDS = delta_words(MINI)
FIRST_PAGE = 3   # the kernel's page of the ring's data in its own allocation (any will do)


def compact(ts: int, words: list[int]) -> bytes:
    """A compact event carrying ``words`` (as the probes send one, without ring header)."""
    fixed = struct.pack("<QQ", ts, 0xa) + bytes(DELTA_FIXED - 16)
    return (fixed + struct.pack("<IHBBQ", 0, len(words), DELTA_CHANGED, 0,
                                (1 << len(words)) - 1)
            + b"".join(struct.pack("<Q", w) for w in words))


@pytest.fixture
def whole_ring(monkeypatch):
    """A ring of compact records: ``put(pos, event, busy)`` writes a record at producer
    position ``pos`` (twice, as the kernel's double mapping shows it) with the kernel's
    ``pg_off``; ``produce(pos)`` moves the producer."""
    fd = memring.memory_ring(monkeypatch, RING)
    rings = {shaped: ringbuf.MappedRing(fd, RING, 0, whole=True,
                                        shape=RecordShape(MINI) if shaped else None)
             for shaped in (True, False)}

    def put(pos: int, event: bytes, busy: bool = False) -> int:
        return memring.put_compact(fd, RING, pos, event, FIRST_PAGE, busy)

    yield rings, put, (lambda pos: memring.set_producer(fd, pos)), \
        (lambda pos: memring.set_consumer(fd, pos))
    for r in rings.values():
        r.close()
    os.close(fd)


def test_numpy_takes_what_the_walk_takes_up_to_a_busy_record_and_across_the_end(whole_ring):
    rings, put, produce, consume = whole_ring
    start = RING - 1000   # records run past the ring's end
    lookalike = [compact_size(MINI, 0, 2), 2 << 32] * 8   # words that look like records
    events = [compact(i, lookalike[: i % WORDS] if i % 3 else [i] * (i % WORDS))
              for i in range(40)]
    pos, ends = start, []
    for i, e in enumerate(events):
        pos = put(pos, e, busy=(i == 25))
        ends.append(pos)
    produce(pos)
    taken = {}
    for shaped, ring in rings.items():
        consume(start)
        if shaped:
            ring._walk_whole = None   # numpy must find them alone
        taken[shaped] = ring.take()
        assert not ring.drained
    assert taken[True] == taken[False]
    span, count = taken[True]
    assert count == 25 and len(span) == ends[24] - start
    assert span[8:16] == struct.pack("<Q", 0)   # the first event's time


def test_a_limit_takes_the_same_records_with_numpy_as_with_the_walk(whole_ring):
    rings, put, produce, consume = whole_ring
    pos = start = 4096 - 24
    for i in range(60):
        pos = put(pos, compact(i, [i] * (i % WORDS)))
    produce(pos)
    takes = {}
    for shaped, ring in rings.items():
        consume(start)
        if shaped:
            ring._walk_whole = None
        takes[shaped] = [ring.take(limit=7) for _ in range(10)] + [ring.take()]
        assert ring.drained
    assert takes[True] == takes[False]
    assert [count for _span, count in takes[True]] == [7] * 8 + [4, 0, 0]


def test_take_into_copies_what_take_gives_a_room_at_a_time(whole_ring):
    rings, put, produce, consume = whole_ring
    pos = start = RING - 1496   # across the ring's end
    heads = []
    for i in range(50):
        heads.append(pos - start)
        pos = put(pos, compact(i, [i] * (i % WORDS)))
    produce(pos)
    for shaped, ring in rings.items():
        consume(start)
        whole, count = ring.take()
        assert count == 50
        consume(start)
        if shaped:
            ring._walk_whole = None   # numpy must find them alone
        out = np.zeros(700, np.uint8)
        got, taken = b"", 0
        assert ring.take_into(out[:40]) == (0, 0)   # the first record does not fit
        while True:
            copied, records = ring.take_into(out)
            if not records:
                break
            assert 0 < copied <= len(out)
            if shaped:   # where each record starts, in what was copied
                assert (ring.starts + len(got)).tolist() == heads[taken:taken + records]
            got += out[:copied].tobytes()
            taken += records
        assert got == whole and taken == 50 and ring.drained
