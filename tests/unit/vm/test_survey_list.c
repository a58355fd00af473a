/*
 * test_survey_list.c: [vmd] survey as a list of gateway survey addresses
 * (issue 15, several gateways): commas and repeated --survey flags, the
 * refusals of an empty element and of a duplicate. No socket is opened.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "moat/config.h"
#include "moat/status.h"
#include "survey.h"

static void
split_one_and_many(void **state)
{
	char **urls, *err;
	size_t n;

	(void)state;
	assert_int_equal(vmd_survey_split("tls+tcp://10.0.0.1:7701", &urls, &n,
	                     &err),
	    MOAT_OK);
	assert_int_equal(n, 1);
	assert_string_equal(urls[0], "tls+tcp://10.0.0.1:7701");
	vmd_survey_split_free(urls, n);

	assert_int_equal(
	    vmd_survey_split(" tcp://127.0.0.1:1 ,ipc:///x/s.sock,"
	                     "\ttls+tcp://h:2 ",
	        &urls, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 3);
	assert_string_equal(urls[0], "tcp://127.0.0.1:1");
	assert_string_equal(urls[1], "ipc:///x/s.sock");
	assert_string_equal(urls[2], "tls+tcp://h:2");
	vmd_survey_split_free(urls, n);
}

static void
split_refusals(void **state)
{
	const char *bad[] = { "a,,b", "a,", ",a", " ", "tcp://h:1,tcp://h:1" };
	char **urls, *err;
	size_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err = NULL;
		assert_int_equal(vmd_survey_split(bad[i], &urls, &n, &err),
		    MOAT_INVALID_ARGUMENT);
		assert_null(urls);
		assert_int_equal(n, 0);
		assert_non_null(err);
		assert_true(strstr(err, "empty address") != NULL ||
		    strstr(err, "twice") != NULL);
		free(err);
	}
}

static void
repeated_flags_join(void **state)
{
	struct moat_config *cfg = NULL;
	char *err = NULL;
	char *argv[] = { "moat-vmd", "--survey", "tcp://a:1", "--node-id", "n",
		"--survey=tcp://b:2", "--survey-tls-name", "gw", NULL };

	(void)state;
	unsetenv("MOAT_VMD_SURVEY");
	unsetenv("MOAT_CONFIG");
	assert_int_equal(moat_config_load(&cfg, "/dev/null", &err), MOAT_OK);
	assert_int_equal(moat_config_set_flag(cfg, "vmd", "survey",
	                     "tcp://b:2"),
	    MOAT_OK);
	assert_int_equal(vmd_survey_flags(8, argv, cfg), MOAT_OK);
	assert_string_equal(moat_config_get(cfg, "vmd", "survey", NULL),
	    "tcp://a:1,tcp://b:2");
	moat_config_free(cfg);

	/* One --survey: left as the reader set it (it may hold commas). */
	assert_int_equal(moat_config_load(&cfg, "/dev/null", &err), MOAT_OK);
	assert_int_equal(moat_config_set_flag(cfg, "vmd", "survey",
	                     "tcp://a:1,tcp://c:3"),
	    MOAT_OK);
	{
		char *one[] = { "moat-vmd", "--survey", "tcp://a:1,tcp://c:3",
			NULL };
		assert_int_equal(vmd_survey_flags(3, one, cfg), MOAT_OK);
	}
	assert_string_equal(moat_config_get(cfg, "vmd", "survey", NULL),
	    "tcp://a:1,tcp://c:3");
	moat_config_free(cfg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(split_one_and_many),
		cmocka_unit_test(split_refusals),
		cmocka_unit_test(repeated_flags_join),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
