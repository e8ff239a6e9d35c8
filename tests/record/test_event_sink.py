"""The recorder's reading path for compact events, without BPF: a ring laid out as the
kernel lays one out (in a memory file), delivered by `ctracer.record.ringbuf.MappedRing`
into `ctracer.record.recorder.EventSink`'s reused rows, committed by
`ctracer.tracefile.TraceWriter`: the spool rows, joined, are every record in the ring's
order, none much longer than a row, the rows reused, and the events and objects counted
are those of the records, whether the records went straight into the rows or, when too
many waited, as bytes."""

from __future__ import annotations

import os
import sqlite3
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from ctracer.deltas import RecordShape, offsets
from ctracer.event import (DELTA_CHANGED, DELTA_FIXED, FLAG_READ_FAILED, HEADER, Field,
                           Layout, delta_words)
from ctracer.record import ringbuf
from support import memring
from ctracer.record.recorder import EventSink, ProgressCounts
from ctracer.tracefile import TraceWriter

RING = 1 << 16
MINI = Layout.packed_in_order("ctracer__mini_s", [Field(f"f{i}", "u64", 0) for i in range(20)])
WORDS = delta_words(MINI)
ROW = 4096   # a small spool row, so that a few dozen records fill one
FIRST_PAGE = 7


def event(ts: int, obj: int, words: int, failed: bool = False) -> bytes:
    """A compact event of object ``obj`` carrying ``words`` words (without ring header)."""
    fixed = bytearray(DELTA_FIXED)
    struct.pack_into("<QQ", fixed, 0, ts, obj)
    if failed:
        fixed[HEADER.field("flags").offset] = FLAG_READ_FAILED
    return bytes(fixed) + struct.pack("<IHBBQ", 0, words, DELTA_CHANGED, 0,
                                      (1 << words) - 1) + \
        b"".join(struct.pack("<Q", 0x80000000 | ts << 8 | w) for w in range(words))


@pytest.fixture(params=["c walk", "numpy"])
def reading(monkeypatch, tmp_path, request):
    """A ring, a sink and a writer: ``put(event)`` writes a record where the producer
    is (moving it), ``take(limit)`` delivers what the ring holds to the sink as the
    recorder's polls do, ``drain()`` all of it at once, ``trace`` is the file's path.
    The ring finds its records with the C walk (built from ringwalk.c), then with
    numpy."""
    fd = memring.memory_ring(monkeypatch, RING)
    program = SimpleNamespace(mini=MINI, nargs=0, compact=True, ring_bytes=RING,
                              filtered=False)
    trace = tmp_path / "t.ctrace"
    writer = TraceWriter(str(trace))
    writer.SPOOL_ROW_BYTES = ROW
    writer.set_meta(mini_layout=MINI.to_json(), event_encoding="compact", event_nargs=0)
    writer.expect_raw()
    counts = ProgressCounts()
    sink = EventSink(program, writer, counts)
    ring = ringbuf.MappedRing(fd, RING, 0, whole=True, shape=RecordShape(MINI))
    if request.param == "numpy":
        ring.native = None
    else:
        from record.test_ringbuf import build_walk
        if not ringbuf.supported():
            pytest.skip("the mapped ring reader runs on x86-64 only")
        ring.native = ringbuf._load_native(build_walk(tmp_path))
    producer = [0]

    def put(ev: bytes) -> bytes:
        pos = producer[0]
        producer[0] = memring.put_compact(fd, RING, pos, ev, FIRST_PAGE)
        memring.set_producer(fd, producer[0])
        # the record as written: the data's second copy continues the first past its end
        return os.pread(fd, producer[0] - pos, 2 * memring.PAGE + (pos & (RING - 1)))

    def drain():
        while ring.deliver(sink):
            pass

    # no commit falls due while a test runs, however slowly (building the C walk under
    # load took longer than COMMIT_S): the tests say when to commit
    sink.COMMIT_S = float("inf")
    yield SimpleNamespace(put=put, take=lambda limit: ring.deliver(sink, limit),
                          drain=drain, sink=sink, writer=writer, counts=counts, trace=trace)
    writer.close()
    ring.close()
    os.close(fd)


def spool(trace) -> list[bytes]:
    db = sqlite3.connect(str(trace))
    rows = [raw for (raw,) in db.execute("SELECT raw FROM spool ORDER BY seq")]
    db.close()
    return rows


def test_rows_hold_every_record_in_order_through_the_row_and_as_bytes(reading, monkeypatch):
    reading.sink.MAX_WAITING_ROWS = 3   # soon reached: the rest of a drain comes as bytes
    as_bytes = []
    take = ringbuf.MappedRing.take

    def counted_take(ring, limit=0):
        as_bytes.append(take(ring, limit))
        return as_bytes[-1]

    monkeypatch.setattr(ringbuf.MappedRing, "take", counted_take)
    rng = np.random.default_rng(5)
    sent, objects, events = [], set(), 0
    for round_ in range(12):
        for i in range(int(rng.integers(1, 60))):
            failed = rng.random() < 0.1   # its object is not counted
            obj = 0xdead0000 + events if failed else 0xffff0000 + int(rng.integers(0, 9)) * 64
            sent.append(reading.put(event(events, obj, int(rng.integers(0, WORDS + 1)),
                                          failed)))
            events += 1
            if not failed:
                objects.add(obj)
        if round_ % 4 == 3:
            reading.drain()   # all at once: past a full row, as bytes
        else:
            reading.take(int(rng.integers(5, 40)))
        reading.sink.flush(commit=round_ % 3 == 0)
    reading.drain()
    reading.sink.flush(commit=True)
    rows = spool(reading.trace)
    assert b"".join(rows) == b"".join(sent)
    # a row is cut after the record that reaches its size, at the latest
    assert max(len(r) for r in rows) <= ROW + reading.sink.max_record
    assert len(rows) > 3
    for row in rows:   # each a run of whole records
        offsets(row, RecordShape(MINI))
    assert reading.counts.events == events == reading.writer.events_spooled
    assert reading.counts.objects == objects
    assert sum(count for _, count in as_bytes) > 20   # both ways were taken


def test_full_rows_wait_for_the_commit_and_are_filled_again(reading):
    sink = reading.sink
    sent = b"".join(reading.put(event(i, 0xa0, WORDS)) for i in range(60))
    reading.drain()
    assert len(sink.waiting) > 1
    record = len(sent) // 60   # every record the same size here
    for row, used, events, _, _ in sink.waiting:   # full: the rest went on to another
        assert 0 < ROW - used < sink.max_record and events * record == used
    assert b"".join(bytes(row[:used]) for row, used, *_ in sink.waiting) \
        + bytes(sink.row[:sink.row_used]) == sent
    waiting = len(sink.waiting)
    sink.flush()   # no commit due: one full row written, nothing committed yet
    assert len(sink.waiting) == waiting - 1 and len(sink.spare_rows) == 1
    assert not spool(reading.trace) and reading.writer.events_spooled == 0
    sink.flush(commit=True)
    assert b"".join(spool(reading.trace)) == sent and not sink.waiting
    assert reading.writer.events_spooled == 60
    rows = None
    for i in range(250):   # the same rows are filled again: no new memory
        reading.put(event(i, 0xa0, WORDS))
        if i % 50 == 49:
            reading.drain()
            sink.flush()
            sink.flush(commit=True)
            if rows is None:   # the rows one commit's records need, made once
                rows = {id(sink.row)} | {id(r) for r in sink.spare_rows}
    assert {id(sink.row)} | {id(r) for r in sink.spare_rows} == rows


def test_a_row_is_committed_as_it_is_written_when_the_disk_is_nearly_full(reading):
    """Where the trace's file system has little room left, each row written between
    commits is committed at once: SQLite gives up a whole open transaction when a row
    does not fit, and a full disk must keep the rows before it."""
    sink, writer = reading.sink, reading.writer
    writer.SHORT_ROOM_BYTES = 1 << 62   # more than any file system has left
    for i in range(60):
        reading.put(event(i, 0xa0, WORDS))
    reading.drain()
    assert len(sink.waiting) > 1
    first_row = sink.waiting[0][2]
    sink.flush()   # no commit due: one full row written, and committed at once
    assert writer.events_spooled == first_row and len(spool(reading.trace)) == 1
