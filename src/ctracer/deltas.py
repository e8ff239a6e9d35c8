"""Decoding compact events: the ring buffer's records, as a compact trace keeps them,
turned back into whole events with full snapshots (`ctracer.event`'s compact events).

A compact trace stores the ring buffer's bytes as they were: each record its 8-byte ring
header (length, busy and discard bits), then the event, padded to 8 bytes.  `offsets`
finds the records of a batch; `DeltaDecoder.to_full` rebuilds each event by carrying every
object's words forward from its last event on the same CPU, with numpy over the whole
batch (a bitmap per event expanded to a mask, the words scattered into it, then per
snapshot word the index of the last event of the object's chain that carried it).

An event whose delta was taken against a version of its object's last event that the
reader did not get cannot be rebuilt: it is flagged `ctracer.event.FLAG_SNAPSHOT_LOST`
(no snapshot, no arguments), and so is every later event of that chain up to one that
carries every word again.  The kernel sends such an event after every lost one, so
this happens only when a baseline the kernel keeps was pushed out and reused while a
program compared against it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ctracer.event import (DELTA, DELTA_ALONE, DELTA_CHANGED, DELTA_FIRST, DELTA_FIXED,
                           FLAG_SNAPSHOT_LOST, HEADER, RING_BUSY_BIT, RING_DISCARD_BIT,
                           RING_HEADER_BYTES, Layout, bitmap_words, delta_words,
                           delta_words_offset, event_size)

_LENGTH = ~(RING_BUSY_BIT | RING_DISCARD_BIT) & 0xffffffff
#: records rebuilt at once (`DeltaDecoder.to_full`): bounds the work arrays
PIECE = 32768


def record_end(length_word: int) -> int:
    """Bytes a ring record takes (its header, the event, padding) from its first word."""
    return ((length_word & _LENGTH) + RING_HEADER_BYTES + 7) & ~7


class RecordShape:
    """What every compact event's ring record looks like, for finding records without a
    walk: its length word equals the bytes its delta head says it carries
    (`compact_size`), the head's word count is at most the event's words, its kind one
    of the three and its pad zero.  Kernel data rarely looks like that at an 8-byte
    boundary, and where it does `record_chain` notices and the walk decides."""

    def __init__(self, mini: Layout, nargs: int = 0):
        self.words_at = delta_words_offset(mini, nargs)
        self.max_words = delta_words(mini, nargs)
        #: where the delta head is, in 8-byte words from the record's ring header
        self.head_slot = (RING_HEADER_BYTES + DELTA_FIXED) // 8

    def plausible(self, lengths: np.ndarray) -> np.ndarray:
        """Whether each ring header's length word (``<u4``, flag bits clear) is one a
        compact record may have."""
        room = (lengths - np.uint32(self.words_at)).astype(np.uint32)
        return (room <= np.uint32(8 * self.max_words)) & ((lengths & np.uint32(7)) == 0)

    def matches(self, lengths: np.ndarray, heads: np.ndarray) -> np.ndarray:
        """Whether each record whose length word is ``lengths`` has ``heads`` (``<u8``)
        as the delta head a compact record with that length has."""
        words = ((heads >> np.uint64(32)) & np.uint64(0xffff)).astype(np.int64)
        return ((lengths.astype(np.int64) == self.words_at + 8 * words)
                & (words <= self.max_words)
                & (((heads >> np.uint64(48)) & np.uint64(0xff)) <= np.uint64(DELTA_ALONE))
                & ((heads >> np.uint64(56)) == 0))

    def fits(self, lengths: np.ndarray, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which ring headers (length words ``lengths``, ``<u4`` with their flag bits,
        and the word ``heads`` where each one's delta head would be) a compact record
        may have, and which of those are busy: a submitted one is `plausible` and
        `matches`; a busy one (its event not written yet) has a plausible length.  The
        two tests in fewer passes: with ``room``, the bytes of words its length says it
        carries, the head's word count (bits 32-47) minus ``room / 8`` leaves only the
        kind and the pad (bits 48-63), and those are at most `DELTA_ALONE` and 0; a
        length with the busy bit fails, and the few that failed are looked at again."""
        room = lengths - np.uint32(self.words_at)
        rest = (heads >> np.uint64(32)) - (room >> np.uint32(3))
        fit = (room <= np.uint32(8 * self.max_words)) & ((room & np.uint32(7)) == 0)
        fit &= (rest & np.uint64(0xffff)) == 0
        fit &= rest <= np.uint64(DELTA_ALONE << 16)
        busy = np.zeros(len(fit), bool)
        failed = np.flatnonzero(~fit)
        if len(failed):
            length = lengths[failed]
            room = (length & np.uint32(~RING_BUSY_BIT & 0xffffffff)) - np.uint32(self.words_at)
            held = failed[(length >= np.uint32(RING_BUSY_BIT))
                          & (room <= np.uint32(8 * self.max_words))
                          & ((room & np.uint32(7)) == 0)]
            fit[held] = busy[held] = True
        return fit, busy

    def chain(self, at: np.ndarray, lengths: np.ndarray,
              heads: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The records among candidate ring headers at the 8-byte words ``at`` (sorted,
        the first record at word 0; every record's header among them), given each
        one's length word and delta head word (`fits`): each record's word, the word
        where it ends and whether it is busy; None when numpy cannot tell."""
        fit, busy = self.fits(lengths, heads)
        if not fit.all():
            at, lengths, busy = at[fit], lengths[fit], busy[fit]
        steps = ((lengths & np.uint32(_LENGTH))
                 + np.uint32(RING_HEADER_BYTES + 7)) >> np.uint32(3)   # in words
        found = record_chain(at, steps, 0)
        if found is None:
            return None
        words, ends, kept = found
        return words, ends, busy if kept is None else busy[kept]


def record_chain(starts: np.ndarray, steps: np.ndarray, first: int, rounds: int = 8
                 ) -> Optional[tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]:
    """The records from ``first`` on, given ``starts`` (sorted positions that include
    those of every record up to where the chain leaves them) and each one's step to the
    next: the chain of steps from ``first``, as its positions, where each one ends and
    which of ``starts`` they are (None: all of them); None when a candidate that is no
    record could not be ruled out in ``rounds`` rounds (the caller then walks).

    A position no other candidate steps to cannot be a record unless it is ``first``;
    dropping those, round after round, leaves exactly the chain (a false candidate
    survives a round only if another false one, earlier, steps to it)."""
    pos = starts.astype(np.int64, copy=False)
    nxt = pos + steps
    if len(pos) and pos[0] == first and np.array_equal(nxt[:-1], pos[1:]):
        return pos, nxt, None   # no false candidate: the usual case
    kept = np.arange(len(pos))
    for _ in range(rounds):
        at = np.searchsorted(pos, nxt)
        inside = at < len(pos)
        reached = np.zeros(len(pos), bool)
        hit = at[inside]
        reached[hit[pos[hit] == nxt[inside]]] = True
        reached |= pos == first
        if reached.all():
            if len(pos) and pos[0] == first and np.array_equal(nxt[:-1], pos[1:]):
                return pos, nxt, kept
            return None
        pos, nxt, kept = pos[reached], nxt[reached], kept[reached]
    return None


def _walk(raw: bytes) -> tuple[np.ndarray, np.ndarray]:
    words = memoryview(raw).cast("I")
    starts, kept = [], []
    at, end = 0, len(raw)
    while at < end:
        length = words[at >> 2]
        step = record_end(length)
        if at + step > end or length & RING_BUSY_BIT:
            raise ValueError("a batch of ring records ends inside a record")
        starts.append(at + RING_HEADER_BYTES)
        kept.append(not length & RING_DISCARD_BIT)
        at += step
    return np.array(starts, np.int64), np.array(kept, bool)


def offsets(raw: bytes, shape: Optional[RecordShape] = None) -> tuple[np.ndarray, np.ndarray]:
    """Where each ring record of ``raw`` starts (its event: after the ring header) and
    whether it was submitted (not discarded).  With the records' ``shape``, numpy over
    the 8-byte words finds them (`record_chain`); otherwise, or where that cannot
    decide, a walk from record to record (each one's length says where the next
    begins)."""
    if len(raw) % 8 if shape is not None else len(raw) % 4:
        raise ValueError("a batch of ring records is not a whole number of words")
    if shape is not None and raw:
        lengths = np.frombuffer(raw, "<u4")[0::2]
        at = np.flatnonzero(shape.plausible(lengths))
        at = at[:np.searchsorted(at, len(lengths) - shape.head_slot)]
        found = shape.chain(at, lengths[at], np.frombuffer(raw, "<u8")[at + shape.head_slot])
        if found is not None and found[1][-1] * 8 == len(raw) and not found[2].any():
            return found[0] * 8 + RING_HEADER_BYTES, np.ones(len(found[0]), bool)
    return _walk(raw)


def cut_records(raw, shape: RecordShape, max_bytes: int,
                starts: Optional[np.ndarray] = None) -> list[tuple[bytes, int]]:
    """``raw`` (ring records) cut between records into consecutive pieces of about
    ``max_bytes`` (a record longer than that is a piece of its own), each with the
    submitted events it holds; ``starts``: where each of its records starts (its ring
    header; all submitted), when the caller found them.  Raises ValueError where
    ``raw`` is no run of records."""
    if starts is None:
        starts, kept = offsets(raw, shape)
    else:
        starts, kept = starts + RING_HEADER_BYTES, np.ones(len(starts), bool)
    if len(raw) <= max_bytes:
        return [(raw, int(kept.sum()))]
    heads = starts - RING_HEADER_BYTES
    cuts = np.unique(np.searchsorted(heads, np.arange(max_bytes, len(raw), max_bytes)))
    cuts = cuts[(cuts > 0) & (cuts < len(heads))]
    counted = np.r_[0, np.cumsum(kept)]
    first, last = np.r_[0, cuts], np.r_[cuts, len(heads)]
    begins, ends = np.r_[0, heads[cuts]], np.r_[heads[cuts], len(raw)]
    return [(raw[int(b):int(e)], int(counted[hi] - counted[lo]))
            for b, e, lo, hi in zip(begins, ends, first, last)]


class DeltaDecoder:
    """Rebuilds the whole events of a compact trace's batches, given in the order they
    were recorded (each object's chain on each CPU carries from one batch to the
    next)."""

    def __init__(self, mini: Layout, nargs: int = 0):
        self.mini, self.nargs = mini, nargs
        self.words = delta_words(mini, nargs)
        self.bitmap = bitmap_words(mini, nargs)
        self.full_size = event_size(mini, nargs)
        self.words_at = delta_words_offset(mini, nargs)
        self.shape = RecordShape(mini, nargs)
        #: per (object, cpu): (version of its last chained event, its words or None:
        #: not rebuildable)
        self.carry: dict[tuple[int, int], tuple[int, Optional[np.ndarray]]] = {}

    def count(self, raw: bytes) -> int:
        return int(offsets(raw, self.shape)[1].sum())

    def heads(self, raw: bytes) -> np.ndarray:
        """The fixed bytes (`DELTA_FIXED`: the header up to the command name) of every
        submitted event, no state used: an ``(n, DELTA_FIXED)`` uint8 array."""
        starts, kept = offsets(raw, self.shape)
        data = np.frombuffer(raw, np.uint8)
        return data[starts[kept, None] + np.arange(DELTA_FIXED)]

    def carried(self, raw: bytes, word: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Delta word ``word`` where the batch's events carry it, no chain followed:
        each submitted event's fixed bytes (as `heads`), whether it carries the word,
        and the word's value there (0 where not carried).  Every value a chain ever
        holds is carried by some event of it, so this gives the distinct values of a
        word without rebuilding a snapshot."""
        starts, kept = offsets(raw, self.shape)
        starts = starts[kept]
        data = np.frombuffer(raw, np.uint8)
        fixed = data[starts[:, None] + np.arange(DELTA_FIXED)]
        head = data[starts[:, None] + np.arange(DELTA_FIXED, self.words_at)]
        bits = head[:, DELTA.size:].copy().view("<u8")
        below = bits[:, :word // 64 + 1].copy()
        below[:, -1] &= np.uint64((1 << (word % 64)) - 1)
        has = ((bits[:, word // 64] >> np.uint64(word % 64)) & np.uint64(1)).astype(bool)
        # the word's place among those carried: the bits set below it
        place = np.unpackbits(below.view(np.uint8), axis=1).sum(axis=1).astype(np.int64)
        values = np.zeros(len(starts), np.uint64)
        at = (starts[has] + self.words_at) // 8 + place[has]
        values[has] = np.frombuffer(raw, "<u8", len(raw) // 8)[at]
        return fixed, has, values

    def to_full(self, raw: bytes) -> bytes:
        """The batch's events as whole events (`ctracer.event.event_dtype`); an event
        whose delta cannot be applied gets `FLAG_SNAPSHOT_LOST` and zeros after its
        fixed bytes (no snapshot, no arguments, the command name cut)."""
        starts, kept = offsets(raw, self.shape)
        starts = starts[kept]
        if len(starts) <= PIECE:
            return self._rebuilt(raw, starts).tobytes()
        # a batch of a fast recording holds a quarter of a second of events (250,000 at
        # 1M events/s): rebuilt a piece at a time, in order (the chains carry from one
        # to the next), each piece's work arrays are a few of its own size, not the batch's
        out = np.empty((len(starts), self.full_size), np.uint8)
        for lo in range(0, len(starts), PIECE):
            out[lo:lo + PIECE] = self._rebuilt(raw, starts[lo:lo + PIECE])
        return out.tobytes()

    def _rebuilt(self, raw: bytes, starts: np.ndarray) -> np.ndarray:
        """The whole events of the submitted records at ``starts`` of ``raw`` (in
        recording order, after those of every earlier call), as rows of bytes."""
        n = len(starts)
        data = np.frombuffer(raw, np.uint8)
        out = np.zeros((n, self.full_size), np.uint8)
        if not n:
            return out
        out[:, :DELTA_FIXED] = data[starts[:, None] + np.arange(DELTA_FIXED)]
        head = data[starts[:, None] + np.arange(DELTA_FIXED, self.words_at)]
        base = head[:, 0:4].copy().view("<u4").ravel().astype(np.int64)
        count = head[:, 4:6].copy().view("<u2").ravel().astype(np.int64)
        kind = head[:, 6].copy()
        bits = head[:, DELTA.size:].copy().view("<u8")          # (n, bitmap)
        w = np.arange(self.words)
        mask = ((bits[:, w // 64] >> (w % 64).astype(np.uint64)) & np.uint64(1)).astype(bool)
        if int(mask.sum()) != int(count.sum()):
            raise ValueError("a compact event's bitmap and word count disagree")
        # every word carried, in event order then word order: the mask's order
        first = (starts + self.words_at) // 8 - (np.cumsum(count) - count)
        flat = np.repeat(first, count) + np.arange(int(count.sum()))
        values = np.zeros((n, self.words), np.uint64)
        values[mask] = np.frombuffer(raw, "<u8", len(raw) // 8)[flat]
        known = kind == DELTA_ALONE
        chained = np.flatnonzero((kind == DELTA_CHANGED) | (kind == DELTA_FIRST))
        if len(chained):
            fixed = out[chained, :DELTA_FIXED]
            objects = fixed[:, _OBJECT:_OBJECT + 8].copy().view("<u8").ravel()
            cpus = fixed[:, _CPU:_CPU + 4].copy().view("<u4").ravel()
            values[chained], known[chained] = self._chain(
                objects, cpus, kind[chained], base[chained], mask[chained], values[chained])
        values[~known] = 0
        out[~known, _FLAGS] |= FLAG_SNAPSHOT_LOST
        out[:, DELTA_FIXED:] = values.view(np.uint8).reshape(n, 8 * self.words)
        return out

    def _chain(self, objects, cpus, kind, base, mask, values):
        """The words of chained events (each object's on each CPU, in ring order, each
        against the version before it), after the state earlier batches left."""
        n = len(objects)
        key = np.stack([objects, cpus.astype(np.uint64)], axis=1)
        pairs = [tuple(k) for k in np.unique(key, axis=0).tolist()]
        carried = [p for p in pairs if p in self.carry]
        c = len(carried)
        obj = np.concatenate([np.array([p[0] for p in carried], np.uint64), objects])
        cpu = np.concatenate([np.array([p[1] for p in carried], np.uint64),
                              cpus.astype(np.uint64)])
        kinds = np.concatenate([np.full(c, 255, np.uint8), kind])
        produced = np.concatenate([
            np.array([self.carry[p][0] for p in carried], np.int64),
            np.where(kind == DELTA_FIRST, 0, (base + 1) & 0xffffffff)])
        bases = np.concatenate([np.full(c, -1, np.int64), base])
        carried_known = np.array([self.carry[p][1] is not None for p in carried], bool)
        vals = np.zeros((c + n, self.words), np.uint64)
        for i, p in enumerate(carried):
            if self.carry[p][1] is not None:
                vals[i] = self.carry[p][1]
        vals[c:] = values
        msk = np.concatenate([np.ones((c, self.words), bool), mask])
        order = np.lexsort((cpu, obj))   # stable: ring order within a key
        obj, cpu, kinds = obj[order], cpu[order], kinds[order]
        produced, bases = produced[order], bases[order]
        vals, msk = vals[order], msk[order]
        starts_known = np.concatenate([carried_known, np.zeros(n, bool)])[order]
        same = np.zeros(c + n, bool)
        same[1:] = (obj[1:] == obj[:-1]) & (cpu[1:] == cpu[:-1])
        link = same.copy()
        link[1:] &= bases[1:] == produced[:-1]
        start = (kinds == DELTA_FIRST) | starts_known
        reset = start | (kinds == 255) | ~link
        segment = np.cumsum(reset) - 1
        known = start[np.flatnonzero(reset)][segment]
        rows = np.where(msk, np.arange(c + n)[:, None], -1)
        np.maximum.accumulate(rows, axis=0, out=rows)
        filled = np.take_along_axis(vals, np.maximum(rows, 0), axis=0)
        filled[~known] = 0
        last = np.flatnonzero(np.append(~same[1:], True))
        for i in last.tolist():
            self.carry[(int(obj[i]), int(cpu[i]))] = (
                int(produced[i]), filled[i].copy() if known[i] else None)
        back = np.empty(c + n, np.int64)
        back[order] = np.arange(c + n)
        mine = back[c:]
        return filled[mine], known[mine]


_OBJECT = HEADER.field("object").offset
_CPU = HEADER.field("cpu").offset
_FLAGS = HEADER.field("flags").offset
