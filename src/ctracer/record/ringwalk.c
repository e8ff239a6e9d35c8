/* The mapped ring reader's walk in C (`ctracer.record.ringbuf.MappedRing.take_into`,
 * loaded with ctypes when scripts/setup.sh has built it; the numpy finder is the
 * fallback).  Why C: numpy finds records of any length only with several passes over
 * every word of a take and over every candidate header (docs/compact-events.md), about
 * 70 ns of the reader's CPU a record at 2M records/s; this walk costs a few.
 *
 * ctracer_ring_take: from the consumer's position, walk the ring's records (each an
 * 8-byte header: a length with the kernel's busy and discard bits, then the event,
 * padded to 8 bytes; kernel/bpf/ringbuf.c) until the producer's position, the first
 * record still busy, LIMIT records (0: no limit) or ROOM bytes; copy them, headers and
 * all, to OUT; write the start in OUT of each submitted (not discarded) record to
 * STARTS (room for ROOM / 8), and the
 * object address (the 8 bytes at OBJECT_AT in the record) of each submitted record
 * whose flags byte at FLAGS_AT lacks READ_FAILED, where it differs from the last one
 * written, to OBJECTS (room for ROOM / 8; OBJECT_AT < 0: none).  The data is mapped
 * twice in a row, so records that wrap around the ring's end read as one block.
 *
 * Returns the records taken (discarded ones too); RESULT gets [bytes copied, starts
 * written, objects written, whether every record up to the producer's position was
 * taken]. */
#include <stdint.h>
#include <string.h>

#define BUSY_BIT (1u << 31)
#define DISCARD_BIT (1u << 30)
#define HEADER_BYTES 8

#ifndef SOURCE_SHA256
#define SOURCE_SHA256 ""
#endif

/* what this library was built from (the sha256 of this file, given by scripts/setup.sh):
   ctracer.record.ringbuf loads only a build of the source beside it */
const char *ctracer_ringwalk_source = SOURCE_SHA256;

long ctracer_ring_take(const uint8_t *data, uint64_t mask, uint64_t consumer,
                       uint64_t producer, uint8_t *out, uint64_t room, long limit,
                       int64_t *starts, long object_at, long flags_at,
                       unsigned read_failed, uint64_t *objects, uint64_t *result)
{
	uint64_t at = consumer, last = 0;
	long count = 0, kept = 0, nobjects = 0;
	int drained = 1, have_last = 0;

	while (at < producer) {
		const uint8_t *record = data + (at & mask);
		/* the length is read before the event (the kernel clears the busy bit
		 * after writing it) */
		uint32_t length = __atomic_load_n((const uint32_t *)record, __ATOMIC_ACQUIRE);
		uint64_t step = ((uint64_t)(length & ~(BUSY_BIT | DISCARD_BIT))
				 + HEADER_BYTES + 7) & ~(uint64_t)7;

		if ((limit && count >= limit) || (length & BUSY_BIT)
		    || at + step - consumer > room || at + step > producer) {
			drained = 0;
			break;
		}
		count++;
		if (!(length & DISCARD_BIT))
			starts[kept++] = (int64_t)(at - consumer);
		if (!(length & DISCARD_BIT) && object_at >= 0 && (uint64_t)object_at + 8 <= step
			   && (uint64_t)flags_at < step && !(record[flags_at] & read_failed)) {
			uint64_t object;

			memcpy(&object, record + object_at, 8);
			if (!have_last || object != last) {
				objects[nobjects++] = object;
				last = object;
				have_last = 1;
			}
		}
		at += step;
	}
	if (at > consumer)
		memcpy(out, data + (consumer & mask), at - consumer);
	result[0] = at - consumer;
	result[1] = (uint64_t)kept;
	result[2] = (uint64_t)nobjects;
	result[3] = (uint64_t)drained;
	return count;
}
