/*
 * fuzz_frame.c: fuzz target for the guest-link frame reader (lib/frame.c),
 * the first thing that touches bytes a hostile guest sends. The input's
 * first two bytes choose the cap and the read sizes; the rest is the
 * stream. Invariants: no frame over the cap, the buffer never grows past
 * cap + 4, bytes come out in order and none are invented, and after
 * OUT_OF_RANGE the reader keeps saying so. Not for: the messages inside.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "moat/frame.h"
#include "moat/status.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct moat_frame_reader r;
	size_t cap, chunk, off, taken = 0;
	uint8_t *frame;
	size_t len;
	int rv = MOAT_OK;

	if (size < 2)
		return 0;
	cap = 1 + (data[0] & 0x3f) * 4; /* 1 .. 253 */
	chunk = 1 + (data[1] & 0x1f);   /* 1 .. 32 */
	data += 2;
	size -= 2;
	moat_frame_reader_init(&r, cap);
	for (off = 0; off < size && rv != MOAT_OUT_OF_RANGE;) {
		size_t n = size - off < chunk ? size - off : chunk;
		int frv = moat_frame_reader_feed(&r, data + off, n);

		moat_fuzz_check(frv == MOAT_OK ||
		        frv == MOAT_RESOURCE_EXHAUSTED,
		    "feed status");
		moat_fuzz_check(r.len <= 2 * (cap + 4),
		    "buffer past twice cap + 4");
		moat_fuzz_check(r.alloc <= 2 * (cap + 4),
		    "allocation past twice cap + 4");
		if (frv == MOAT_OK)
			off += n;
		while ((rv = moat_frame_reader_next(&r, &frame, &len)) ==
		    MOAT_OK) {
			moat_fuzz_check(len <= cap, "frame over cap");
			moat_fuzz_check(taken + 4 + len <= off,
			    "frame longer than the bytes fed");
			/* The body is the stream's bytes after the header. */
			moat_fuzz_check(len == 0 ||
			        memcmp(frame, data + taken + 4, len) == 0,
			    "frame bytes differ");
			taken += 4 + len;
			free(frame);
		}
		moat_fuzz_check(rv == MOAT_UNAVAILABLE ||
		        rv == MOAT_OUT_OF_RANGE,
		    "next status");
		if (rv == MOAT_OUT_OF_RANGE) {
			moat_fuzz_check(moat_frame_reader_next(&r, &frame,
			                    &len) == MOAT_OUT_OF_RANGE,
			    "out of range sticks");
		} else if (frv != MOAT_OK) {
			/* Refused with no whole frame to take: the cap has
			 * been reached by one frame, impossible within it. */
			moat_fuzz_check(r.len + n > cap + 4,
			    "feed refused below the cap");
			break;
		}
	}
	moat_frame_reader_fini(&r);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const uint8_t s1[] = { 0x10, 0x03, 0, 0, 0, 3, 'a', 'b', 'c', 0,
		0, 0, 0, 0, 0, 0, 1, 'z' };
	static const uint8_t s2[] = { 0x01, 0x00, 0, 0, 0, 5, 1, 2, 3, 4, 5 };
	static const uint8_t s3[] = { 0x3f, 0x1f, 0, 0, 0, 200 };
	uint8_t s4[2 + 4 + 253];

	add(s1, sizeof(s1));
	add(s2, sizeof(s2));
	add(s3, sizeof(s3));
	memset(s4, 'x', sizeof(s4));
	s4[0] = 0x3f;
	s4[1] = 0x07;
	s4[2] = 0;
	s4[3] = 0;
	s4[4] = 0;
	s4[5] = 253;
	add(s4, sizeof(s4));
}
