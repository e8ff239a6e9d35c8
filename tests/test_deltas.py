"""`ctracer.deltas` on ring records built here: whole events rebuilt by carrying each
(object, CPU)'s words forward, across batches, and a broken link flagged, never
rebuilt wrong."""

from __future__ import annotations

import struct

import numpy as np

from ctracer.deltas import DeltaDecoder
from ctracer.event import (DELTA_ALONE, DELTA_CHANGED, DELTA_FIRST, DELTA_FIXED,
                           FLAG_SNAPSHOT_LOST, HEADER, Field, Layout, delta_words,
                           event_dtype)

MINI = Layout.packed_in_order("ctracer__mini_t", [Field(f"f{i}", "u64", 0) for i in range(4)])
WORDS = delta_words(MINI)
#: the delta word of the snapshot's first word (the words before it: the command name's)
SNAP = WORDS - MINI.size // 8


def record(ts, obj, cpu, kind, base, words: dict[int, int]) -> bytes:
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
