/*
 * test_frame.c: unit tests of the guest-link frame reader and encoder
 * (lib/frame.c): frames split across feeds at every byte, several frames
 * in one feed, empty frames, a declared length over the cap
 * (OUT_OF_RANGE), feeding past the cap refused (RESOURCE_EXHAUSTED), and
 * write_all through a pipe. Not for: the messages inside frames.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moat/frame.h"
#include "moat/status.h"

static void
test_encode(void **state)
{
	size_t n = 0;
	uint8_t *b = moat_frame_encode("abc", 3, &n);

	assert_non_null(b);
	assert_int_equal(n, 7);
	assert_memory_equal(b, "\0\0\0\3abc", 7);
	free(b);
	b = moat_frame_encode(NULL, 0, &n);
	assert_non_null(b);
	assert_int_equal(n, 4);
	free(b);
	assert_null(moat_frame_encode("x", MOAT_FRAME_MAX + 1, &n));
}

/* Two frames fed one byte at a time come out whole and in order. */
static void
test_split_feeds(void **state)
{
	struct moat_frame_reader r;
	uint8_t stream[64], *fr;
	size_t n1, n2, len;
	uint8_t *a = moat_frame_encode("hello", 5, &n1);
	uint8_t *b = moat_frame_encode("", 0, &n2);
	int got = 0;

	memcpy(stream, a, n1);
	memcpy(stream + n1, b, n2);
	free(a);
	free(b);
	moat_frame_reader_init(&r, 0);
	assert_int_equal(r.max_frame, MOAT_FRAME_MAX);
	for (size_t i = 0; i < n1 + n2; i++) {
		assert_int_equal(moat_frame_reader_feed(&r, stream + i, 1), 0);
		while (moat_frame_reader_next(&r, &fr, &len) == MOAT_OK) {
			if (got == 0) {
				assert_int_equal(i, n1 - 1);
				assert_int_equal(len, 5);
				assert_memory_equal(fr, "hello", 5);
			} else {
				assert_int_equal(i, n1 + n2 - 1);
				assert_int_equal(len, 0);
			}
			free(fr);
			got++;
		}
	}
	assert_int_equal(got, 2);
	assert_int_equal(moat_frame_reader_next(&r, &fr, &len),
	    MOAT_UNAVAILABLE);
	assert_null(fr);
	moat_frame_reader_fini(&r);
	moat_frame_reader_fini(&r); /* safe twice */
}

static void
test_many_in_one_feed(void **state)
{
	struct moat_frame_reader r;
	uint8_t stream[3 * 8], *fr;
	size_t n, len;
	int got = 0;

	for (int i = 0; i < 3; i++) {
		uint8_t body[4] = { 'f', (uint8_t)('0' + i), 0, 0 };
		uint8_t *e = moat_frame_encode(body, 4, &n);

		memcpy(stream + 8 * i, e, n);
		free(e);
	}
	moat_frame_reader_init(&r, 64);
	assert_int_equal(moat_frame_reader_feed(&r, stream, sizeof(stream)),
	    0);
	while (moat_frame_reader_next(&r, &fr, &len) == MOAT_OK) {
		assert_int_equal(len, 4);
		assert_int_equal(fr[1], '0' + got);
		free(fr);
		got++;
	}
	assert_int_equal(got, 3);
	moat_frame_reader_fini(&r);
}

static void
test_declared_length_over_cap(void **state)
{
	struct moat_frame_reader r;
	static const uint8_t hdr[] = { 0x7f, 0xff, 0xff, 0xff };
	static const uint8_t just_over[] = { 0, 0, 0, 17 };
	uint8_t *fr = (uint8_t *)1;
	size_t len = 99;

	moat_frame_reader_init(&r, 0);
	assert_int_equal(moat_frame_reader_feed(&r, hdr, 4), 0);
	assert_int_equal(moat_frame_reader_next(&r, &fr, &len),
	    MOAT_OUT_OF_RANGE);
	assert_null(fr);
	assert_int_equal(len, 0);
	/* the reader never grew towards the declared size */
	assert_true(r.alloc <= 4096);
	moat_frame_reader_fini(&r);

	moat_frame_reader_init(&r, 16);
	assert_int_equal(moat_frame_reader_feed(&r, just_over, 4), 0);
	assert_int_equal(moat_frame_reader_next(&r, &fr, &len),
	    MOAT_OUT_OF_RANGE);
	moat_frame_reader_fini(&r);
}

static void
test_feed_beyond_cap_refused(void **state)
{
	struct moat_frame_reader r;
	uint8_t junk[48] = { 0, 0, 0, 16 };
	uint8_t *fr;
	size_t len;

	junk[20] = 0, junk[21] = 0, junk[22] = 0, junk[23] = 16;
	moat_frame_reader_init(&r, 16);
	/* one feed over cap + 4 is refused */
	assert_int_equal(moat_frame_reader_feed(&r, junk, 21),
	    MOAT_RESOURCE_EXHAUSTED);
	/* 20 bytes: one whole frame of the cap, then one more byte */
	assert_int_equal(moat_frame_reader_feed(&r, junk, 20), 0);
	assert_int_equal(moat_frame_reader_feed(&r, junk + 20, 1), 0);
	/* a caller that never takes frames is stopped: 21 > cap + 4 */
	assert_int_equal(moat_frame_reader_feed(&r, junk + 21, 1),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_true(r.alloc <= 2 * 20);
	assert_int_equal(moat_frame_reader_next(&r, &fr, &len), MOAT_OK);
	assert_int_equal(len, 16);
	free(fr);
	assert_int_equal(moat_frame_reader_next(&r, &fr, &len),
	    MOAT_UNAVAILABLE);
	moat_frame_reader_fini(&r);
}

/* A partial frame plus one read that passes cap + 4 in total is a valid
 * stream and must be accepted (cap 16: 14 bytes, then 20). */
static void
test_partial_then_big_read(void **state)
{
	struct moat_frame_reader r;
	uint8_t stream[40] = { 0, 0, 0, 16 };
	uint8_t *fr;
	size_t len;
	int frames = 0;

	stream[20] = 0, stream[21] = 0, stream[22] = 0, stream[23] = 12;
	moat_frame_reader_init(&r, 16);
	assert_int_equal(moat_frame_reader_feed(&r, stream, 14), 0);
	assert_int_equal(moat_frame_reader_next(&r, &fr, &len),
	    MOAT_UNAVAILABLE);
	assert_int_equal(moat_frame_reader_feed(&r, stream + 14, 20), 0);
	while (moat_frame_reader_next(&r, &fr, &len) == MOAT_OK) {
		frames++;
		free(fr);
	}
	assert_int_equal(frames, 1);
	assert_int_equal(moat_frame_reader_feed(&r, stream + 34, 2), 0);
	assert_int_equal(moat_frame_reader_next(&r, &fr, &len), MOAT_OK);
	assert_int_equal(len, 12);
	free(fr);
	moat_frame_reader_fini(&r);
}

static void
test_write_all(void **state)
{
	int p[2];
	uint8_t buf[8] = { 0 };

	assert_int_equal(pipe(p), 0);
	assert_int_equal(moat_frame_write_all(p[1], "\0\0\0\2hi", 6), 0);
	assert_int_equal(read(p[0], buf, sizeof(buf)), 6);
	assert_memory_equal(buf, "\0\0\0\2hi", 6);
	close(p[0]);
	signal(SIGPIPE, SIG_IGN); /* EPIPE, not death */
	assert_int_not_equal(moat_frame_write_all(p[1], "x", 1), 0);
	close(p[1]);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_encode),
		cmocka_unit_test(test_split_feeds),
		cmocka_unit_test(test_many_in_one_feed),
		cmocka_unit_test(test_declared_length_over_cap),
		cmocka_unit_test(test_feed_beyond_cap_refused),
		cmocka_unit_test(test_partial_then_big_read),
		cmocka_unit_test(test_write_all),
	};

	return cmocka_run_group_tests_name("frame", tests, NULL, NULL);
}
