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


# -- the walk in C (ringwalk.c, built by scripts/setup.sh) ------------------------------

def build_walk(directory, source_sha: str = "", name: str = "_ringwalk.so") -> str:
    """``ringwalk.c`` built as scripts/setup.sh builds it, saying it was built from the
    source whose sha256 is ``source_sha`` (the real one when empty); the library's path."""
    import hashlib
    import shutil
    import subprocess
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the C walk")
    with open(ringbuf.NATIVE_SOURCE, "rb") as f:
        sha = source_sha or hashlib.sha256(f.read()).hexdigest()
    library = os.path.join(str(directory), name)
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC",
                    f'-DSOURCE_SHA256="{sha}"', "-o", library, ringbuf.NATIVE_SOURCE],
                   check=True)
    return library


def test_only_a_build_of_the_source_beside_it_is_loaded(tmp_path):
    if not ringbuf.supported():
        pytest.skip("the mapped ring reader runs on x86-64 only")
    assert ringbuf._load_native(build_walk(tmp_path)) is not None
    stale = build_walk(tmp_path, "0" * 64, "stale.so")   # built before the source changed
    assert ringbuf._load_native(stale) is None
    assert ringbuf._load_native(str(tmp_path / "missing.so")) is None


def _discard(fd: int, pos: int) -> None:
    """Mark the record at producer position ``pos`` discarded (in both halves)."""
    at = pos & (RING - 1)
    length = struct.unpack("<I", os.pread(fd, 4, 2 * mmap.PAGESIZE + at))[0]
    for half in (0, RING):
        os.pwrite(fd, struct.pack("<I", length | ringbuf.DISCARD_BIT),
                  2 * mmap.PAGESIZE + half + at)


def test_the_c_walk_takes_what_numpy_takes_and_reads_the_objects(monkeypatch, tmp_path):
    """Records of any length across the ring's end, one discarded, one whose snapshot read
    failed, a busy one, taken a room and a limit at a time by the C walk and by numpy:
    the same bytes, counts, starts and `drained`; the C walk's objects are the run
    starts of the submitted records' objects, the failed one left out."""
    from ctracer.event import FLAG_READ_FAILED, HEADER
    if not ringbuf.supported():
        pytest.skip("the mapped ring reader runs on x86-64 only")
    walk = ringbuf._load_native(build_walk(tmp_path))
    fd = memring.memory_ring(monkeypatch, RING)
    rings = {how: ringbuf.MappedRing(fd, RING, 0, whole=True, shape=RecordShape(MINI))
             for how in ("c", "numpy")}
    rings["c"].native, rings["numpy"].native = walk, None
    rng = np.random.default_rng(11)
    pos = start = RING - 2000
    objects, heads = [], []
    for i in range(120):
        event = bytearray(compact(i, [i] * int(rng.integers(0, WORDS + 1))))
        obj = 0xdead0000 if i in (40, 70) else 0xffff0000 + int(rng.integers(0, 3)) * 64
        struct.pack_into("<Q", event, HEADER.field("object").offset, obj)
        if i == 40:
            event[HEADER.field("flags").offset] |= FLAG_READ_FAILED
        heads.append(pos)
        pos = memring.put_compact(fd, RING, pos, bytes(event), FIRST_PAGE, busy=(i == 100))
        if i not in (40, 70):
            objects.append(obj)
    _discard(fd, heads[70])
    memring.set_producer(fd, pos)
    runs = [o for k, o in enumerate(objects[:98]) if k == 0 or o != objects[k - 1]]
    takes = {}
    for how, ring in rings.items():
        memring.set_consumer(fd, start)
        out, got, seen = np.zeros(900, np.uint8), [], []
        for k in range(200):
            copied, count = ring.take_into(out, (7, 0, 3)[k % 3])
            if not count:
                break
            got.append((out[:copied].tobytes(), count, ring.drained,
                        None if ring.starts is None else ring.starts.tolist()))
            if ring.objects is not None:
                seen.extend(ring.objects.tolist())
        takes[how] = got, seen
    c_takes, c_objects = takes["c"]
    numpy_takes, _ = takes["numpy"]
    # numpy may stop before a discarded record and take the rest next time
    assert b"".join(t[0] for t in c_takes) == b"".join(t[0] for t in numpy_takes)
    assert sum(t[1] for t in c_takes) == sum(t[1] for t in numpy_takes) == 100
    starts, before = [], 0   # where each submitted record starts in all that was taken
    for span, _, _, at in c_takes:
        starts += [before + a for a in at]
        before += len(span)
    assert starts == [h - start for i, h in enumerate(heads[:100]) if i != 70]
    assert not rings["c"].drained   # the busy one is still there
    taken_objects = [o for k, o in enumerate(c_objects) if k == 0 or o != c_objects[k - 1]]
    assert taken_objects == runs
    for ring in rings.values():
        ring.close()
    os.close(fd)
