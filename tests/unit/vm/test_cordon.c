/*
 * test_cordon.c: the cordon file of a node (services/vm/cordon.c, issue
 * 15): absent is not cordoned; a written reason reads back (control
 * characters flattened, long ones cut); uncordon removes it; a rewrite
 * replaces it atomically; an unreadable one is an error. cmocka; label
 * "unit".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cordon.h"

static char dir[] = "/tmp/moat-cordon-XXXXXX";
static char path[256];

static int
setup(void **state)
{
	(void)state;
	if (mkdtemp(dir) == NULL)
		return -1;
	snprintf(path, sizeof(path), "%s/cordon", dir);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	unlink(path);
	rmdir(dir);
	return 0;
}

static void
test_absent(void **state)
{
	bool c = true;
	char *r = (char *)"x";

	(void)state;
	unlink(path);
	assert_int_equal(vmd_cordon_read(path, &c, &r), 0);
	assert_false(c);
	assert_null(r);
}

static void
test_round_trip(void **state)
{
	bool c = false;
	char *r = NULL;

	(void)state;
	assert_int_equal(vmd_cordon_write(path, true, "kernel\nupgrade\t1"),
	    0);
	assert_int_equal(vmd_cordon_read(path, &c, &r), 0);
	assert_true(c);
	assert_string_equal(r, "kernel upgrade 1");
	free(r);
	/* A rewrite replaces it; an empty reason is still cordoned. */
	assert_int_equal(vmd_cordon_write(path, true, NULL), 0);
	assert_int_equal(vmd_cordon_read(path, &c, &r), 0);
	assert_true(c);
	assert_string_equal(r, "");
	free(r);
	assert_int_equal(vmd_cordon_write(path, false, "ignored"), 0);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(vmd_cordon_read(path, &c, &r), 0);
	assert_false(c);
	/* Uncordoning an uncordoned node is fine. */
	assert_int_equal(vmd_cordon_write(path, false, NULL), 0);
}

static void
test_long_reason(void **state)
{
	char big[VMD_CORDON_REASON_MAX * 2];
	bool c = false;
	char *r = NULL;

	(void)state;
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(vmd_cordon_write(path, true, big), 0);
	assert_int_equal(vmd_cordon_read(path, &c, &r), 0);
	assert_true(c);
	assert_int_equal(strlen(r), VMD_CORDON_REASON_MAX);
	free(r);
	/* One written by hand, longer still and with a CR: cut, cleaned. */
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(big, f);
	fputs(big, f);
	fputs("\r\n", f);
	fclose(f);
	assert_int_equal(vmd_cordon_read(path, &c, &r), 0);
	assert_true(c);
	assert_int_equal(strlen(r), VMD_CORDON_REASON_MAX);
	free(r);
}

static void
test_unreadable(void **state)
{
	bool c = false;
	char *r = NULL;

	(void)state;
	unlink(path);
	assert_int_equal(mkdir(path, 0700), 0); /* a directory: EISDIR */
	assert_int_not_equal(vmd_cordon_read(path, &c, &r), 0);
	assert_null(r);
	assert_int_not_equal(vmd_cordon_write(path, false, NULL), 0);
	rmdir(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_absent),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_long_reason),
		cmocka_unit_test(test_unreadable),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
