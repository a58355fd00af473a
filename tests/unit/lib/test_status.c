/*
 * test_status.c: unit tests of lib/status.c: every code has its gRPC name,
 * out-of-range values read UNKNOWN, and errno and nng errors map to the
 * statuses callers rely on. Not for: messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include <nng/nng.h>

#include "common.pb-c.h"
#include "moat/status.h"

static void
test_names(void **state)
{
	assert_string_equal(moat_strerror(MOAT_OK), "OK");
	assert_string_equal(moat_strerror(MOAT_INVALID_ARGUMENT),
	    "INVALID_ARGUMENT");
	assert_string_equal(moat_strerror(MOAT_NOT_FOUND), "NOT_FOUND");
	assert_string_equal(moat_strerror(MOAT_DEADLINE_EXCEEDED),
	    "DEADLINE_EXCEEDED");
	assert_string_equal(moat_strerror(MOAT_UNAUTHENTICATED),
	    "UNAUTHENTICATED");
	assert_string_equal(moat_strerror(-1), "UNKNOWN");
	assert_string_equal(moat_strerror(MOAT_STATUS_MAX + 1), "UNKNOWN");
}

/* The enum and moat.v1.Code on the wire agree, name for name. */
static void
test_names_match_wire_enum(void **state)
{
	const ProtobufCEnumDescriptor *d = &moat__v1__code__descriptor;

	assert_int_equal(d->n_values, MOAT_STATUS_MAX + 1);
	for (unsigned i = 0; i < d->n_values; i++) {
		int v = d->values[i].value;

		assert_string_equal(moat_strerror(v), d->values[i].name);
	}
}

static void
test_errno_and_nng(void **state)
{
	assert_int_equal(moat_status_from_errno(0), MOAT_OK);
	assert_int_equal(moat_status_from_errno(ENOENT), MOAT_NOT_FOUND);
	assert_int_equal(moat_status_from_errno(EACCES),
	    MOAT_PERMISSION_DENIED);
	assert_int_equal(moat_status_from_errno(ENOSPC),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_int_equal(moat_status_from_errno(EINVAL),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(moat_status_from_errno(ETIMEDOUT),
	    MOAT_DEADLINE_EXCEEDED);
	assert_int_equal(moat_status_from_nng(0), MOAT_OK);
	assert_int_equal(moat_status_from_nng(NNG_ETIMEDOUT),
	    MOAT_DEADLINE_EXCEEDED);
	assert_int_equal(moat_status_from_nng(NNG_ECONNREFUSED),
	    MOAT_UNAVAILABLE);
	assert_int_equal(moat_status_from_nng(NNG_ECLOSED), MOAT_UNAVAILABLE);
}

static void
test_exit_codes_differ(void **state)
{
	/* scripts tell failures apart: OK is 0, failures are not */
	assert_int_equal(moat_status_exit_code(MOAT_OK), 0);
	assert_int_not_equal(moat_status_exit_code(MOAT_NOT_FOUND), 0);
	assert_int_not_equal(moat_status_exit_code(MOAT_UNAVAILABLE), 0);
	assert_int_not_equal(moat_status_exit_code(MOAT_NOT_FOUND),
	    moat_status_exit_code(MOAT_UNAVAILABLE));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_names_match_wire_enum),
		cmocka_unit_test(test_errno_and_nng),
		cmocka_unit_test(test_exit_codes_differ),
	};

	return cmocka_run_group_tests_name("status", tests, NULL, NULL);
}
