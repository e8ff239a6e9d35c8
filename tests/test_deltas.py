"""`ctracer.deltas` on ring records built here: whole events rebuilt by carrying each
(object, CPU)'s words forward, across batches, and a broken link flagged, never
rebuilt wrong; the records of a batch found with numpy exactly where a walk from record
to record finds them, whatever the events' words hold."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ctracer import deltas
from ctracer.deltas import DeltaDecoder, RecordShape, offsets
from ctracer.event import (DELTA_ALONE, DELTA_CHANGED, DELTA_FIRST, DELTA_FIXED,
                           FLAG_SNAPSHOT_LOST, HEADER, Field, Layout, compact_size,
                           delta_words, event_dtype)

MINI = Layout.packed_in_order("ctracer__mini_t", [Field(f"f{i}", "u64", 0) for i in range(4)])
WORDS = delta_words(MINI)
#: the delta word of the snapshot's first word (the words before it: the command name's)
SNAP = WORDS - MINI.size // 8


def record(ts, obj, cpu, kind, base, words: dict[int, int], mini: Layout = MINI) -> bytes:
    fixed = bytearray(DELTA_FIXED)
    struct.pack_into("<QQ", fixed, 0, ts, obj)
    struct.pack_into("<I", fixed, HEADER.field("cpu").offset, cpu)
    bitmap = sum(1 << i for i in words)
    body = bytes(fixed) + struct.pack("<IHBBQ", base, len(words), kind, 0, bitmap) + \
        b"".join(struct.pack("<Q", words[i]) for i in sorted(words))
    return struct.pack("<II", len(body), 0) + body + bytes(-len(body) % 8)


def values(full: bytes) -> tuple[np.ndarray, np.ndarray]:
    a = np.frombuffer(full, event_dtype(MINI))
    snap = np.ascontiguousarray(a["snapshot"]).view("<u8").reshape(len(a), -1)
    return snap, a["flags"]


def every(v):
    return {i: v + i for i in range(WORDS)}


def test_words_carry_forward_per_object_and_cpu_across_batches():
    d = DeltaDecoder(MINI)
    first = record(1, 0xa, 0, DELTA_FIRST, 0, every(100)) + \
        record(2, 0xa, 1, DELTA_FIRST, 0, every(200)) + \
        record(3, 0xa, 0, DELTA_CHANGED, 0, {WORDS - 1: 7})
    snap, flags = values(d.to_full(first))
    assert snap[2, -1] == 7 and snap[2, -2] == 100 + WORDS - 2
    # next batch: the chain on CPU 1 goes on from version 0, CPU 0's from version 1
    second = record(4, 0xa, 1, DELTA_CHANGED, 0, {WORDS - 2: 9}) + \
        record(5, 0xa, 0, DELTA_CHANGED, 1, {}) + \
        record(6, 0xb, 0, DELTA_ALONE, 0, every(300))
    snap, flags = values(d.to_full(second))
    assert snap[0, -2] == 9 and snap[0, -1] == 200 + WORDS - 1
    assert snap[1, -1] == 7 and snap[1, -2] == 100 + WORDS - 2
    assert snap[2, -1] == 300 + WORDS - 1
    assert not (flags & FLAG_SNAPSHOT_LOST).any()


def test_a_broken_link_is_flagged_until_an_event_carries_every_word():
    d = DeltaDecoder(MINI)
    raw = record(1, 0xa, 0, DELTA_FIRST, 0, every(100)) + \
        record(2, 0xa, 0, DELTA_CHANGED, 1, {WORDS - 1: 5}) + \
        record(3, 0xa, 0, DELTA_CHANGED, 2, {WORDS - 1: 6}) + \
        record(4, 0xa, 0, DELTA_FIRST, 0, every(400)) + \
        record(5, 0xa, 0, DELTA_CHANGED, 0, {SNAP: 1})
    snap, flags = values(d.to_full(raw))
    lost = (flags & FLAG_SNAPSHOT_LOST) != 0
    assert lost.tolist() == [False, True, True, False, False]
    assert (snap[1] == 0).all() and snap[4, 0] == 1 and snap[4, 1] == 400 + SNAP + 1


# -- finding records without a walk ---------------------------------------------------

def _lookalike(words_in_record: int) -> int:
    """A ring header's word as a record carrying ``words_in_record`` words has it."""
    return compact_size(MINI, 0, words_in_record)


#: delta words that look like a record's length or delta head: what kernel data may hold
_WORD = st.one_of(
    st.integers(0, 2**64 - 1),
    st.integers(0, WORDS).map(_lookalike),
    st.integers(0, WORDS).map(lambda n: n << 32),
    st.sampled_from([0, 1, 8, 64]))


@st.composite
def _batches(draw):
    out = b""
    for _ in range(draw(st.integers(0, 12))):
        carried = draw(st.lists(st.integers(0, WORDS - 1), unique=True, max_size=WORDS))
        words = {i: draw(_WORD) for i in carried}
        out += record(draw(st.integers(0, 2**40)), draw(_WORD), draw(st.integers(0, 3)),
                      draw(st.sampled_from([DELTA_CHANGED, DELTA_FIRST, DELTA_ALONE])),
                      draw(st.integers(0, 5)), words)
    return out


@settings(max_examples=400, deadline=None)
@given(_batches())
def test_numpy_finds_the_records_a_walk_finds_whatever_the_words_hold(batch):
    starts, kept = offsets(batch, RecordShape(MINI))
    walked, walked_kept = deltas._walk(batch)
    assert starts.tolist() == walked.tolist() and kept.tolist() == walked_kept.tolist()


def test_plain_records_are_found_without_a_walk(monkeypatch):
    batch = b"".join(record(i, 0xa + i % 3, i % 2, DELTA_CHANGED, i, {i % WORDS: i})
                     for i in range(500))
    monkeypatch.setattr(deltas, "_walk", None)  # calling it would fail the test
    starts, kept = offsets(batch, RecordShape(MINI))
    assert len(starts) == 500 and kept.all()
    assert np.frombuffer(batch, np.uint8)[starts[7]] == 7   # ts_ns's low byte


#: a snapshot of 30 words: room in one record's words for a false one
WIDE = Layout.packed_in_order("ctracer__mini_w", [Field(f"f{i}", "u64", 0) for i in range(30)])


def _fake_headers(n_words: int, at: int, k: int) -> dict[int, int]:
    """Delta words holding, from word ``at`` on, what a record carrying ``k`` words has
    as its ring header and delta head (a false start for numpy to rule out)."""
    words = {i: 0 for i in range(n_words)}
    words[at] = compact_size(WIDE, 0, k)
    words[at + 7] = k << 32
    return words


def test_words_that_look_like_records_are_ruled_out():
    shape = RecordShape(WIDE)
    n = delta_words(WIDE)
    cases = []
    for k in range(0, n + 1, 3):
        for at in range(0, n - 7, 2):
            inner = record(1, 0xa, 0, DELTA_FIRST, 0, _fake_headers(n, at, k), WIDE)
            cases.append(inner + record(2, 0xa, 0, DELTA_CHANGED, 0, {0: 5}, WIDE) + inner)
    # a false start inside a false record's words: a chain of two false ones
    double = _fake_headers(n, 0, 1)
    double[10], double[17] = compact_size(WIDE, 0, 0), 0
    cases.append(record(1, 0xa, 0, DELTA_FIRST, 0, double, WIDE)
                 + record(2, 0xb, 1, DELTA_FIRST, 0, {}, WIDE))
    false_starts = 0
    for batch in cases:
        lengths = np.frombuffer(batch, "<u4")[0::2]
        walked, _ = deltas._walk(batch)
        at = np.flatnonzero(shape.plausible(lengths))
        at = at[at + shape.head_slot < len(lengths)]
        heads = np.frombuffer(batch, "<u8")[at + shape.head_slot]
        false_starts += int(shape.matches(lengths[at], heads).sum()) - len(walked)
        starts, kept = offsets(batch, shape)
        assert starts.tolist() == walked.tolist() and kept.all()
    assert false_starts > len(cases) // 2   # the cases did offer false starts


def test_argument_values_of_a_compact_batch_are_those_its_rebuilt_events_hold():
    """`RawDecoder.argument_values` reads only the carried words: every value the
    rebuilt events' arguments (`RawDecoder.columns`) hold, and only values carried in
    a slot where some function has the argument."""
    from ctracer.event import args_offset
    from ctracer.event import ENCODING_COMPACT
    from ctracer.tracefile.format import RawDecoder
    import json
    import random

    nargs = 2
    words = delta_words(MINI, nargs)
    slot_word = [(args_offset() + 8 * k - DELTA_FIXED) // 8 for k in range(nargs)]
    specs = {3: [{"name": "location", "ctype": "u64"}, {"name": "reason", "ctype": "u64"}],
             5: [{"name": "other", "ctype": "u64"}, {"name": "location", "ctype": "u64"}]}
    fid_at = HEADER.field("function_id").offset
    rnd = random.Random(7)
    batch, version = b"", {}   # per (object, CPU): the version of its last event
    for i in range(300):
        obj, cpu, fid = 0xa + i % 4, i % 2, rnd.choice([3, 5, 7])
        base = version.get((obj, cpu))
        carry = {j: rnd.randrange(1, 50) for j in range(words)} if base is None \
            else {j: rnd.randrange(1, 50) for j in rnd.sample(slot_word, rnd.randint(0, 2))}
        kind = DELTA_FIRST if base is None else DELTA_CHANGED
        version[obj, cpu] = 0 if base is None else base + 1
        rec = bytearray(record(i, obj, cpu, kind, base or 0, carry))
        struct.pack_into("<I", rec, 8 + fid_at, fid)
        batch += bytes(rec)
    decoder = RawDecoder(MINI, (), specs, nargs, ENCODING_COMPACT)
    wanted = {"location"}
    fast = decoder.argument_values(batch, wanted)
    columns = decoder.fresh().columns(batch, 0)
    assert not (columns["flags"] & FLAG_SNAPSHOT_LOST).any()   # every chain rebuilt
    slow = {v for t in columns["args_texts"] for k, v in json.loads(t).items()
            if k in wanted and v}
    assert slow <= fast and len(slow) > 20
    events = np.frombuffer(decoder.fresh()._whole(batch), decoder.dtype)
    assert fast <= set(events["args"].ravel().tolist()) - {0}
