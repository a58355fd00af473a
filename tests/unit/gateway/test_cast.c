/*
 * test_cast.c: the asciicast v2 encoding of a recorded terminal session
 * (record_cast.c): the header's fields, event lines, JSON string
 * escaping of control bytes, invalid UTF-8 as U+FFFD, a character split
 * across two chunks kept whole, resize events, and the size cap with its
 * marker. Every line is checked to be JSON by jansson.
 * Not for: the watcher that follows a session (integration: stack_shell).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "record_cast.h"

/* line: line `n` (0: the header) of the cast, parsed. */
static json_t *
line(const struct moat_cast *c, int n)
{
	const char *p = c->buf, *end;
	json_error_t err;
	json_t *j;

	while (n-- > 0) {
		p = strchr(p, '\n');
		assert_non_null(p);
		p++;
	}
	end = strchr(p, '\n');
	assert_non_null(end);
	j = json_loadb(p, (size_t)(end - p), 0, &err);
	if (j == NULL)
		fail_msg("line is not JSON (%s): %.*s", err.text,
		    (int)(end - p), p);
	return j;
}

static void
test_header(void **state)
{
	struct moat_cast c;
	json_t *h;

	(void)state;
	assert_int_equal(moat_cast_begin(&c, 24, 80, 1700000000, "xterm", 0),
	    0);
	h = line(&c, 0);
	assert_int_equal(json_integer_value(json_object_get(h, "version")), 2);
	assert_int_equal(json_integer_value(json_object_get(h, "width")), 80);
	assert_int_equal(json_integer_value(json_object_get(h, "height")), 24);
	assert_int_equal(json_integer_value(json_object_get(h, "timestamp")),
	    1700000000);
	assert_string_equal(json_string_value(
	                        json_object_get(json_object_get(h, "env"),
	                            "TERM")),
	    "xterm");
	json_decref(h);
	moat_cast_fini(&c);
}

static void
test_output_escapes(void **state)
{
	static const uint8_t raw[] = "a\"b\\c\x1b[1m\r\n\x07\x7f"
	                             "\xc3\xa9\xff\xe2\x82";
	struct moat_cast c;
	json_t *e;

	(void)state;
	assert_int_equal(moat_cast_begin(&c, 24, 80, 0, "xterm", 0), 0);
	/* the last two bytes start a 3-byte character: kept for later */
	assert_int_equal(moat_cast_output(&c, 0.5, raw, sizeof(raw) - 1), 0);
	assert_int_equal(moat_cast_output(&c, 1.25, (const uint8_t *)"\xac!",
	                     2),
	    0);
	assert_int_equal(moat_cast_resize(&c, 2.0, 30, 100), 0);
	e = line(&c, 1);
	assert_true(json_is_array(e));
	assert_true(json_real_value(json_array_get(e, 0)) == 0.5);
	assert_string_equal(json_string_value(json_array_get(e, 1)), "o");
	assert_string_equal(json_string_value(json_array_get(e, 2)),
	    "a\"b\\c\x1b[1m\r\n\x07\x7f\xc3\xa9\xef\xbf\xbd");
	json_decref(e);
	/* no raw control byte made it into the file */
	assert_null(strchr(c.buf, 0x1b));
	e = line(&c, 2);
	assert_string_equal(json_string_value(json_array_get(e, 2)),
	    "\xe2\x82\xac!");
	json_decref(e);
	e = line(&c, 3);
	assert_string_equal(json_string_value(json_array_get(e, 1)), "r");
	assert_string_equal(json_string_value(json_array_get(e, 2)), "100x30");
	json_decref(e);
	moat_cast_fini(&c);
}

static void
test_invalid_utf8(void **state)
{
	/* overlong '/', a surrogate, past U+10FFFF, a lone continuation */
	static const uint8_t raw[] = "\xc0\xaf|\xed\xa0\x80|\xf4\x90\x80\x80|"
	                             "\x80";
	struct moat_cast c;
	const char *s;
	json_t *e;

	(void)state;
	assert_int_equal(moat_cast_begin(&c, 24, 80, 0, "xterm", 0), 0);
	assert_int_equal(moat_cast_output(&c, 0, raw, sizeof(raw) - 1), 0);
	e = line(&c, 1);
	s = json_string_value(json_array_get(e, 2));
	assert_non_null(s);
	assert_null(strstr(s, "\xed\xa0"));
	assert_non_null(strstr(s, "\xef\xbf\xbd|"));
	json_decref(e);
	moat_cast_fini(&c);
}

static void
test_cap(void **state)
{
	uint8_t chunk[1000];
	struct moat_cast c;
	json_t *e;
	size_t lines = 0;

	(void)state;
	memset(chunk, 'x', sizeof(chunk));
	assert_int_equal(moat_cast_begin(&c, 24, 80, 0, "xterm", 4096), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(moat_cast_output(&c, i, chunk, sizeof(chunk)),
		    0);
	assert_true(c.truncated);
	assert_true(c.len <= 4096 + 200);
	for (const char *p = c.buf; (p = strchr(p, '\n')) != NULL; p++)
		lines++;
	e = line(&c, (int)lines - 1);
	assert_non_null(strstr(json_string_value(json_array_get(e, 2)),
	    "recording truncated"));
	json_decref(e);
	moat_cast_fini(&c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_header),
		cmocka_unit_test(test_output_escapes),
		cmocka_unit_test(test_invalid_utf8),
		cmocka_unit_test(test_cap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
