"""Reading a BPF ring buffer through its memory map, a batch of events at a time.

libbpf's consumer (what bcc's ``ring_buffer_poll`` runs) calls back into Python once per
event: about 0.8 µs of the reader's CPU per event here, on a 2-core machine where that
CPU is taken from the traced program.  Every record ctracer's probes reserve has the same
size (``sizeof(struct ctracer_event)``), so the records between the consumer and the
producer positions lie at a fixed stride, and `MappedRing.take` reads them with a few
numpy operations: the record headers (a length with a *busy* bit while the producer has
not submitted it yet, a *discard* bit for a record given back), then the payloads copied
out in one piece, then the consumer position moved past them.

The layout is the kernel's (``kernel/bpf/ringbuf.c``, ``include/uapi/linux/bpf.h``):
page 0 of the map holds the consumer position (written by the reader); from page 1 on,
read-only, the producer position, then the data pages mapped twice in a row, so a run of
records that wraps around the end reads as one contiguous block.  A record header is
written (busy) before the producer position moves past it, and its busy bit is cleared
after its payload is written; the reader relies on x86's ordering of loads and stores
for that (`supported` is true only there; elsewhere libbpf's consumer is used).

`MappedRing.take_into` (the recorder's path for compact events) walks the records in C
where scripts/setup.sh built ``ringwalk.c`` beside this module (`native_walk`): a few
nanoseconds a record, where numpy's finder costs about 70 (docs/compact-events.md);
without it, numpy finds them as described there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import mmap
import os
import platform
import select

from typing import Optional

import numpy as np

from ctracer.deltas import RecordShape
from ctracer.event import FLAG_READ_FAILED, HEADER, RING_HEADER_BYTES

#: include/uapi/linux/bpf.h
BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HEADER_BYTES = 8
_LENGTH = ~(BUSY_BIT | DISCARD_BIT) & 0xffffffff

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


#: the C walk (``ringwalk.c``) and what scripts/setup.sh builds from it
NATIVE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ringwalk.c")
NATIVE_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ringwalk.so")
_native = None


def native_walk():
    """The C walk of `MappedRing.take_into` (``ctracer_ring_take`` in ``ringwalk.c``),
    or None where it was not built (scripts/setup.sh builds it), was built from another
    version of the source, or this is no x86-64 machine: numpy then finds the records."""
    global _native
    if _native is None:
        _native = _load_native() or False
    return _native or None


def _load_native(library: str = NATIVE_LIBRARY, source_path: str = NATIVE_SOURCE):
    """``ctracer_ring_take`` of ``library`` if it was built from ``source_path`` as it
    is now (the sha256 setup.sh built it with), else None."""
    if not supported() or not os.path.exists(library):
        return None
    try:
        with open(source_path, "rb") as f:
            source = hashlib.sha256(f.read()).hexdigest()
        lib = ctypes.CDLL(library)
        built_from = ctypes.c_char_p.in_dll(lib, "ctracer_ringwalk_source").value
    except (OSError, ValueError):
        return None
    if built_from is None or built_from.decode() != source:
        return None   # a stale build: the source changed since setup.sh ran
    take = lib.ctracer_ring_take
    take.restype = ctypes.c_long
    take.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                     ctypes.c_void_p, ctypes.c_uint64, ctypes.c_long, ctypes.c_void_p,
                     ctypes.c_long, ctypes.c_long, ctypes.c_uint, ctypes.c_void_p,
                     ctypes.c_void_p]
    return take


def supported() -> bool:
    """Whether this machine orders memory as `MappedRing` assumes (x86-64)."""
    return platform.machine() in ("x86_64", "AMD64")


def record_bytes(event_bytes: int) -> int:
    """Bytes one event takes in the ring: its header, then the event, 8-byte aligned."""
    return (event_bytes + HEADER_BYTES + 7) // 8 * 8


def _map(fd: int, length: int, prot: int, offset: int) -> int:
    address = _libc.mmap(None, length, prot, mmap.MAP_SHARED, fd, offset)
    if address in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"cannot map the ring buffer: {os.strerror(err)}")
    return address


class MappedRing:
    """One ring buffer map (``fd``, ``ring_bytes`` of data) whose records all carry
    ``event_bytes`` of event."""

    def __init__(self, fd: int, ring_bytes: int, event_bytes: int, whole: bool = False,
                 shape: Optional[RecordShape] = None):
        if ring_bytes & (ring_bytes - 1):
            raise ValueError("a ring buffer's size is a power of two")
        page = mmap.PAGESIZE
        self.event_bytes = event_bytes
        #: records of any length (compact events), taken whole with their ring headers
        self.whole = whole
        #: what a whole record looks like (compact events), for finding them with numpy
        self.shape = shape
        #: whether the last `take` left no record reserved before it behind
        self.drained = False
        #: the most bytes a take found reserved in the ring (between the consumer's and
        #: the producer's positions): how close the reader came to losing records
        self.fullest = 0
        #: where each record the last `take` returned starts in it (its ring header),
        #: when numpy or the C walk found them; None after a walk in Python
        self.starts = None
        #: the object address of the records the last `take_into` returned, where
        #: the C walk read them: one for each run of records of the same object (a
        #: record whose snapshot read failed left out); None otherwise
        self.objects = None
        #: the C walk (`native_walk`) for `take_into`, when built and the records are
        #: whole (None: numpy, or the walk in Python, finds them)
        self.native = native_walk() if whole else None
        self.stride = record_bytes(event_bytes)
        self._record_guess = float(self.stride)   # bytes a record takes, on average
        self._ring_pages = max(1, ring_bytes // page)
        self._mask = ring_bytes - 1
        self._consumer_len = page
        self._producer_len = page + 2 * ring_bytes
        self._consumer = _map(fd, self._consumer_len, mmap.PROT_READ | mmap.PROT_WRITE, 0)
        try:
            self._producer = _map(fd, self._producer_len, mmap.PROT_READ, page)
        except OSError:
            _libc.munmap(self._consumer, self._consumer_len)
            raise
        # single aligned 8-byte loads and stores (ctypes copies the value as one word)
        self._consumer_pos = ctypes.c_uint64.from_address(self._consumer)
        self._producer_pos = ctypes.c_uint64.from_address(self._producer)
        data = (ctypes.c_uint8 * (2 * ring_bytes)).from_address(self._producer + page)
        self._data = np.frombuffer(data, dtype=np.uint8)
        self._data_address = self._producer + page
        # for the C walk: its results, and room for a start and an object per 8 bytes of
        # the caller's buffer (made for the largest buffer seen)
        self._native_result = np.zeros(4, np.uint64)
        self._native_starts = np.empty(0, np.int64)
        self._native_objects = np.empty(0, np.uint64)
        self._object_at = RING_HEADER_BYTES + HEADER.field("object").offset \
            if shape is not None else -1
        self._flags_at = RING_HEADER_BYTES + HEADER.field("flags").offset
        self._words = (ctypes.c_uint32 * (ring_bytes // 4)).from_address(self._producer + page)
        # for `_find_records`: the upper half of every 8-byte word, a row per page of
        # the data (mapped twice), each row's page in the ring, and room for a mark per
        # word of a take, made once (a take touches no fresh memory)
        self._page_words = self._data.view("<u4").reshape(-1, page // 4)[:, 1::2]
        self._row_pages = (np.arange(2 * self._ring_pages)
                           % self._ring_pages).astype(np.uint32)
        self._hits = np.empty((self._ring_pages + 1) * (page // 8), bool) \
            if whole and shape is not None else None
        self._poller = select.epoll()
        self._poller.register(fd, select.EPOLLIN)

    def wait(self, timeout_s: float) -> None:
        """Sleep until a probe wakes the reader or ``timeout_s`` passes."""
        self._poller.poll(timeout_s)

    def take(self, limit: int = 0) -> tuple[bytes, int]:
        """The events submitted since the last call (at most ``limit`` records when
        given), back to back, and how many records were consumed (discarded ones
        included); the space they took is given back to the producers.  `drained` then
        says whether every record reserved before the call was taken (none was still
        busy, nor left for the next call by ``limit``)."""
        self.starts = None
        if self.whole:
            return self._take_whole(limit)
        consumer = self._consumer_pos.value
        producer = self._producer_pos.value
        self.fullest = max(self.fullest, producer - consumer)
        reserved = (producer - consumer) // self.stride
        count = min(reserved, limit) if limit else reserved
        self.drained = count == reserved
        if count <= 0:
            return b"", 0
        start = consumer & self._mask
        block = self._data[start:start + count * self.stride].reshape(count, self.stride)
        lengths = block[:, :4].copy().view("<u4").ravel()
        busy = np.flatnonzero(lengths & BUSY_BIT)
        if len(busy):  # a producer has not submitted it yet: stop before it
            count = int(busy[0])
            self.drained = False
            block, lengths = block[:count], lengths[:count]
        kept = (lengths & DISCARD_BIT) == 0
        if np.any(lengths[kept] != self.event_bytes):
            raise RuntimeError("a record of unexpected size in the ring buffer")
        payload = block[kept, HEADER_BYTES:HEADER_BYTES + self.event_bytes].tobytes()
        self._consumer_pos.value = consumer + count * self.stride
        return payload, count

    def deliver(self, on_event, limit: int = 0) -> int:
        """Hand the records submitted since the last call (at most ``limit``) to
        ``on_event`` in one piece; the number taken.  Whole records go straight into
        the consumer's buffer where it offers one (``on_event.space()``: the free part
        of its buffer, then ``on_event.taken(bytes, starts)``; see
        `ctracer.record.recorder.EventSink`), else ``on_event(bytes, starts=...)``
        gets a copy (also when that buffer is full)."""
        space = getattr(on_event, "space", None) if self.whole else None
        room = space() if space is not None else None
        if room is not None and len(room):
            copied, taken = self.take_into(room, limit)
            if copied:
                on_event.taken(copied, self.starts, objects=self.objects)
            return taken
        events, taken = self.take(limit)
        if events:
            if self.starts is not None:
                on_event(events, starts=self.starts)
            else:
                on_event(events)
        return taken

    def take_into(self, out: np.ndarray, limit: int = 0) -> tuple[int, int]:
        """Like `take` for whole records (compact events), but copied into the start of
        ``out`` (uint8; as many records as fit, so a caller's buffer is reused and no
        memory is freshly touched per take): the bytes copied and the records taken."""
        self.starts = self.objects = None
        if self.native is not None:
            return self._take_native(out, limit)
        claimed = self._claim_whole(limit, len(out))
        if claimed is None:
            return 0, 0
        consumer, end, count = claimed
        start = consumer & self._mask
        out[:end] = self._data[start:start + end]
        self._consumer_pos.value = consumer + end
        return end, count

    def _take_native(self, out: np.ndarray, limit: int) -> tuple[int, int]:
        """`take_into` by the C walk: it stops where the numpy finder and the walk in
        Python stop, copies, and says where each submitted record starts and, for
        compact records, their objects (`objects`)."""
        consumer = self._consumer_pos.value
        producer = self._producer_pos.value
        if producer == consumer:
            self.drained = True
            return 0, 0
        self.fullest = max(self.fullest, producer - consumer)
        room = len(out)
        if len(self._native_starts) < room // 8 + 1:
            self._native_starts = np.empty(room // 8 + 1, np.int64)
            self._native_objects = np.empty(room // 8 + 1, np.uint64)
        result = self._native_result
        count = self.native(self._data_address, self._mask, consumer, producer,
                            out.ctypes.data, room, limit, self._native_starts.ctypes.data,
                            self._object_at, self._flags_at, FLAG_READ_FAILED,
                            self._native_objects.ctypes.data, result.ctypes.data)
        copied, kept, objects, drained = (int(v) for v in result)
        self.drained = bool(drained)
        if not count:
            return 0, 0
        self.starts = self._native_starts[:kept].copy()
        if self._object_at >= 0:
            self.objects = self._native_objects[:objects].copy()
        self._consumer_pos.value = consumer + copied
        return copied, count

    def _take_whole(self, limit: int) -> tuple[bytes, int]:
        """The records submitted since the last call, as the ring holds them (each its
        8-byte header, then its event, padded to 8 bytes), in one copy."""
        claimed = self._claim_whole(limit, None)
        if claimed is None:
            return b"", 0
        consumer, end, count = claimed
        start = consumer & self._mask
        taken = self._data[start:start + end].tobytes()
        self._consumer_pos.value = consumer + end
        return taken, count

    def _claim_whole(self, limit: int, room: Optional[int]) -> Optional[tuple[int, int, int]]:
        """Where the records to take begin (the consumer's position), how many bytes
        and how many records they are (at most ``limit`` records and ``room`` bytes
        when given), every one's header seen submitted; None when there is none.  With
        the records' `shape`, numpy finds them (`_find_records`); else a walk from one
        length to the next finds where the first record not yet submitted is.  The
        caller copies them, then moves the consumer's position past them: a payload
        must be read after its header says it is there."""
        consumer = self._consumer_pos.value
        producer = self._producer_pos.value
        if producer == consumer:
            self.drained = True
            return None
        span = producer - consumer
        self.fullest = max(self.fullest, span)
        window = span
        if limit:  # look only as far as ``limit`` records are likely to reach
            window = min(span, int(limit * self._record_guess * 1.25) + 4096 & ~7)
        if room is not None:
            window = min(window, room & ~7)
        found = self._find_records(consumer, window, window == span) \
            if self.shape is not None and window else None
        if found is None:
            return self._walk_whole(consumer, producer, limit, room)
        starts, ends, busy = found
        cut = int(np.argmax(busy)) if busy.any() else len(starts)
        self.drained = cut == len(starts) and window == span
        if limit and cut > limit:
            cut, self.drained = limit, False
        if not cut:
            return None
        end = int(ends[cut - 1])
        self._record_guess = max(8.0, end / cut)
        self.starts = starts[:cut]
        return consumer, end, cut

    def _find_records(self, consumer: int, window: int, whole: bool):
        """The records in the ``window`` bytes from the consumer's position, each one's
        start and end and whether it is still busy, with numpy over the ring's words in
        place (only the headers found are read into arrays); None when numpy cannot
        tell (the walk then does).  ``whole``: the window reaches the producer's
        position, so the records must end there exactly.

        A record's header also holds the page of the kernel's ring it lies in
        (``pg_off``, after the length): one comparison of every word's upper half with
        its page's (a row of words per page) finds the few words of event data that
        could be a header; where one is, the shape of a compact record (or the busy bit
        of one not yet submitted) must match (`RecordShape.chain`), and
        `ctracer.deltas.record_chain` rules out the rest."""
        start = consumer & self._mask
        page = mmap.PAGESIZE
        if start & 7:   # the kernel's records are 8-byte aligned: this is no ring of them
            return None
        halves = self._data[start:start + window].view("<u4")
        ring_page = int(halves[1]) - start // page   # pg_off of the ring's first page
        if ring_page < 0:
            return None
        top, bottom = start // page, -(-(start + window) // page)
        per_row = page // 8
        hits = self._hits[:(bottom - top) * per_row]
        np.equal(self._page_words[top:bottom],
                 (self._row_pages[top:bottom] + np.uint32(ring_page))[:, None],
                 out=hits.reshape(bottom - top, per_row))
        at = np.flatnonzero(hits) - (start - top * page) // 8
        at = at[np.searchsorted(at, 0):np.searchsorted(at, window // 8)]
        # a record's delta head, read where it would be: a few words past the window
        # (still inside the doubled mapping; none needed there: such a record is not
        # whole in the window)
        head_slot = self.shape.head_slot
        words = self._data[start:start + min(window + 8 * head_slot,
                                             2 * (self._mask + 1) - start)].view("<u8")
        heads = at + head_slot
        if len(words) < window // 8 + head_slot:
            np.minimum(heads, len(words) - 1, out=heads)
        lengths = halves[0::2][at]   # read once: a busy record may be submitted now
        found = self.shape.chain(at, lengths, words[heads])
        if found is None:
            return None
        starts, ends, busy = found
        if whole and ends[-1] * 8 != window:
            return None
        complete = np.searchsorted(ends, window // 8, side="right")
        return starts[:complete] * 8, ends[:complete] * 8, busy[:complete]

    def _walk_whole(self, consumer: int, producer: int, limit: int,
                    room: Optional[int]) -> Optional[tuple[int, int, int]]:
        words, mask = self._words, self._mask
        at, count = consumer, 0
        self.drained = True
        while at < producer:
            if limit and count >= limit:
                self.drained = False
                break
            length = words[(at & mask) >> 2]
            if length & BUSY_BIT:
                self.drained = False
                break
            step = ((length & _LENGTH) + HEADER_BYTES + 7) & ~7
            if room is not None and at + step - consumer > room:
                self.drained = False
                break
            at += step
            count += 1
        if not count:
            return None
        return consumer, at - consumer, count

    def close(self) -> None:
        if self._poller is None:
            return
        self._poller.close()
        self._poller = None
        self._data = None
        _libc.munmap(self._producer, self._producer_len)
        _libc.munmap(self._consumer, self._consumer_len)
