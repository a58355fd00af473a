/*
 * test_ratelimit.c: the HTTP door's token buckets (gateway/ratelimit.c)
 * on a clock the test moves: a burst then refusals with the seconds to
 * wait, refills at the rate up to the burst and no further, names
 * independent of each other, no limit at rps 0, a table far smaller than
 * the names thrown at it staying correct for a name in use, long names
 * cut, and clock jumps that would overflow a naive refill.
 * Not for: the door's use of them (test_http, test_mcp_http).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ratelimit.h"

static void
test_burst_then_refuse(void **state)
{
	struct moat_ratelimit *rl = moat_ratelimit_new(2, 3, 64);
	uint32_t retry = 0;

	assert_non_null(rl);
	for (int i = 0; i < 3; i++)
		assert_true(moat_ratelimit_take(rl, "a:1", 1000, &retry));
	assert_false(moat_ratelimit_take(rl, "a:1", 1000, &retry));
	assert_int_equal(retry, 1); /* 500 ms to a token: 1 s rounded up */
	assert_false(moat_ratelimit_take(rl, "a:1", 1499, NULL));
	/* 2 a second: a token every 500 ms. */
	assert_true(moat_ratelimit_take(rl, "a:1", 1500, &retry));
	assert_false(moat_ratelimit_take(rl, "a:1", 1500, &retry));
	assert_true(moat_ratelimit_take(rl, "a:1", 2000, &retry));
	assert_int_equal(moat_ratelimit_refused(rl), 3);
	moat_ratelimit_free(rl);
}

static void
test_refill_caps_at_burst(void **state)
{
	struct moat_ratelimit *rl = moat_ratelimit_new(10, 5, 64);
	int ok = 0;

	assert_true(moat_ratelimit_take(rl, "k:x", 0, NULL));
	/* An hour later: the burst, not 36000 tokens. */
	for (int i = 0; i < 100; i++)
		ok += moat_ratelimit_take(rl, "k:x", 3600000, NULL);
	assert_int_equal(ok, 5);
	moat_ratelimit_free(rl);
}

static void
test_retry_after_slow_rate(void **state)
{
	struct moat_ratelimit *rl = moat_ratelimit_new(1, 1, 64);
	uint32_t retry = 0;

	assert_true(moat_ratelimit_take(rl, "a", 0, &retry));
	assert_false(moat_ratelimit_take(rl, "a", 0, &retry));
	assert_int_equal(retry, 1);
	assert_false(moat_ratelimit_take(rl, "a", 999, &retry));
	assert_int_equal(retry, 1);
	assert_true(moat_ratelimit_take(rl, "a", 1000, &retry));
	moat_ratelimit_free(rl);
}

static void
test_names_independent(void **state)
{
	struct moat_ratelimit *rl = moat_ratelimit_new(1, 2, 64);

	assert_true(moat_ratelimit_take(rl, "a:1", 0, NULL));
	assert_true(moat_ratelimit_take(rl, "a:1", 0, NULL));
	assert_false(moat_ratelimit_take(rl, "a:1", 0, NULL));
	assert_true(moat_ratelimit_take(rl, "a:2", 0, NULL));
	assert_true(moat_ratelimit_take(rl, "k:1", 0, NULL));
	assert_false(moat_ratelimit_take(rl, "a:1", 0, NULL));
	moat_ratelimit_free(rl);
}

static void
test_unlimited(void **state)
{
	struct moat_ratelimit *rl = moat_ratelimit_new(0, 0, 16);

	for (int i = 0; i < 100000; i++)
		assert_true(moat_ratelimit_take(rl, "a", 0, NULL));
	assert_int_equal(moat_ratelimit_refused(rl), 0);
	moat_ratelimit_free(rl);
}

/* 20000 names through 16 slots: memory stays the table's, every new
 * name starts with a full bucket, and a name just used is still there
 * for its next request (the table makes room among the others). */
static void
test_small_table(void **state)
{
	struct moat_ratelimit *rl = moat_ratelimit_new(1, 1, 16);
	char name[32];

	for (int i = 0; i < 20000; i++) {
		snprintf(name, sizeof(name), "a:%d", i);
		assert_true(moat_ratelimit_take(rl, name, (uint64_t)i, NULL));
		assert_false(moat_ratelimit_take(rl, name, (uint64_t)i, NULL));
	}
	assert_int_equal(moat_ratelimit_refused(rl), 20000);
	moat_ratelimit_free(rl);
}

static void
test_long_names_and_clock_jumps(void **state)
{
	struct moat_ratelimit *rl = moat_ratelimit_new(1000000, 1000000, 16);
	char longname[300];

	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	assert_true(moat_ratelimit_take(rl, longname, 0, NULL));
	assert_true(moat_ratelimit_take(rl, longname, UINT64_MAX / 2, NULL));
	assert_true(moat_ratelimit_take(rl, longname, UINT64_MAX, NULL));
	/* A clock that goes back refills nothing and breaks nothing. */
	assert_true(moat_ratelimit_take(rl, longname, 5, NULL));
	assert_true(moat_ratelimit_take(rl, "", 5, NULL));
	assert_true(moat_ratelimit_take(rl, NULL, 5, NULL));
	moat_ratelimit_free(rl);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_burst_then_refuse),
		cmocka_unit_test(test_refill_caps_at_burst),
		cmocka_unit_test(test_retry_after_slow_rate),
		cmocka_unit_test(test_names_independent),
		cmocka_unit_test(test_unlimited),
		cmocka_unit_test(test_small_table),
		cmocka_unit_test(test_long_names_and_clock_jumps),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
