/*
 * test_grpc.c: the pure pieces of the gateway's gRPC door
 * (gateway/grpc.c): grpc-timeout values in every unit, rounded up and
 * capped, and the malformed ones refused; the 5-byte length prefix, its
 * compressed flag, lengths that do not match the body and the 4 MiB
 * limit; grpc-message's percent-encoding.
 * Not for: the door on the wire (tests/integration/grpc, Debian's gRPC
 * client against a real gateway).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grpc.h"
#include "moat/status.h"

static void
test_timeout_units(void **state)
{
	uint64_t ms = 0;

	(void)state;
	assert_true(moat_grpc_parse_timeout("100m", &ms));
	assert_int_equal(ms, 100);
	assert_true(moat_grpc_parse_timeout("5S", &ms));
	assert_int_equal(ms, 5000);
	assert_true(moat_grpc_parse_timeout("2M", &ms));
	assert_int_equal(ms, 120000);
	assert_true(moat_grpc_parse_timeout("1H", &ms));
	assert_int_equal(ms, 3600000);
	/* Below a millisecond: rounded up, never "no time at all". */
	assert_true(moat_grpc_parse_timeout("1u", &ms));
	assert_int_equal(ms, 1);
	assert_true(moat_grpc_parse_timeout("1500u", &ms));
	assert_int_equal(ms, 2);
	assert_true(moat_grpc_parse_timeout("999999n", &ms));
	assert_int_equal(ms, 1);
	assert_true(moat_grpc_parse_timeout("0m", &ms));
	assert_int_equal(ms, 0);
	/* 8 digits of hours: capped, not wrapped. */
	assert_true(moat_grpc_parse_timeout("99999999H", &ms));
	assert_int_equal(ms, UINT32_MAX);
}

static void
test_timeout_malformed(void **state)
{
	static const char *bad[] = { "", "m", "100", "100x", "100ms",
		"123456789S", "-1S", " 1S", "1 S", "1s" };
	uint64_t ms = 42;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_false(moat_grpc_parse_timeout(bad[i], &ms));
		assert_int_equal(ms, 42);
	}
}

static void
test_unframe(void **state)
{
	uint8_t buf[16] = { 0 };
	const uint8_t *msg = NULL;
	size_t len = 99;
	const char *why = NULL;

	(void)state;
	moat_grpc_frame_header(buf, 3);
	memcpy(buf + MOAT_GRPC_PREFIX, "abc", 3);
	assert_int_equal(moat_grpc_unframe(buf, 8, &msg, &len, &why), MOAT_OK);
	assert_ptr_equal(msg, buf + MOAT_GRPC_PREFIX);
	assert_int_equal(len, 3);
	/* An empty message is a message. */
	moat_grpc_frame_header(buf, 0);
	assert_int_equal(moat_grpc_unframe(buf, 5, &msg, &len, &why), MOAT_OK);
	assert_int_equal(len, 0);
	/* No prefix, a short body, a trailing second message. */
	assert_int_equal(moat_grpc_unframe(buf, 4, &msg, &len, &why),
	    MOAT_INVALID_ARGUMENT);
	moat_grpc_frame_header(buf, 3);
	assert_int_equal(moat_grpc_unframe(buf, 7, &msg, &len, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(moat_grpc_unframe(buf, 9, &msg, &len, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "exactly one message"));
	/* Compressed: not supported; a flag other than 0 or 1: bad. */
	buf[0] = 1;
	assert_int_equal(moat_grpc_unframe(buf, 8, &msg, &len, &why),
	    MOAT_UNIMPLEMENTED);
	assert_string_equal(why, "compression not supported");
	buf[0] = 7;
	assert_int_equal(moat_grpc_unframe(buf, 8, &msg, &len, &why),
	    MOAT_INVALID_ARGUMENT);
	/* Over 4 MiB: refused from the prefix alone. */
	moat_grpc_frame_header(buf, MOAT_GRPC_MAX_MESSAGE + 1);
	assert_int_equal(buf[1], 0);
	assert_int_equal(buf[2], 0x40);
	assert_int_equal(buf[4], 1);
	assert_int_equal(moat_grpc_unframe(buf, 8, &msg, &len, &why),
	    MOAT_RESOURCE_EXHAUSTED);
}

static void
test_percent_encode(void **state)
{
	char *s;

	(void)state;
	s = moat_grpc_percent_encode("plain text: ok (42)");
	assert_string_equal(s, "plain text: ok (42)");
	free(s);
	s = moat_grpc_percent_encode("100% sure\nnext\x7f\xc3\xa9");
	assert_string_equal(s, "100%25 sure%0Anext%7F%C3%A9");
	free(s);
	s = moat_grpc_percent_encode("");
	assert_string_equal(s, "");
	free(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_timeout_units),
		cmocka_unit_test(test_timeout_malformed),
		cmocka_unit_test(test_unframe),
		cmocka_unit_test(test_percent_encode),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
