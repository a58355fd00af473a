/*
 * test_lifetime.c: the gateway's tenant lifetimes (gateway/lifetime.c,
 * issue 15): [tenants] timeout-s, timeout-max-s and idle-timeout-s with
 * their .<tenant> forms; a create's 0 takes the default, a timeout over
 * the maximum is refused naming the limit and its config key; no config
 * means the built-in defaults; a bad value is a config error. cmocka;
 * label "unit".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/config.h"
#include "moat/status.h"
#include "gateway.h"

static struct moat_config *
config_of(const char *text)
{
	char path[] = "/tmp/moat-life-XXXXXX";
	struct moat_config *cfg = NULL;
	char *err = NULL;
	int fd = mkstemp(path);
	FILE *f;

	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(moat_config_load(&cfg, path, &err), MOAT_OK);
	unlink(path);
	return cfg;
}

static void
test_defaults_without_config(void **state)
{
	struct moat_lifetime_policy p;
	uint32_t t = 0, idle = 0;
	char *msg = NULL;
	(void)state;

	assert_int_equal(moat_lifetime_policy(NULL, "acme", &p, &msg),
	    MOAT_OK);
	assert_int_equal(p.timeout_s, MOAT_LIFETIME_TIMEOUT_S);
	assert_int_equal(p.timeout_max_s, MOAT_LIFETIME_TIMEOUT_MAX_S);
	assert_int_equal(p.idle_timeout_s, 0);
	assert_int_equal(moat_lifetime_fill(NULL, "acme", &t, &idle, &msg),
	    MOAT_OK);
	assert_int_equal(t, 3600);
	assert_int_equal(idle, 0);
	t = 86401;
	assert_int_equal(moat_lifetime_fill(NULL, "acme", &t, &idle, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "maximum of 86400 s"));
	assert_non_null(strstr(msg, "[tenants] timeout-max-s.acme"));
	free(msg);
}

static void
test_tenant_values(void **state)
{
	struct moat_config *cfg = config_of("[tenants]\n"
	                                    "timeout-s = 600\n"
	                                    "timeout-max-s = 1200\n"
	                                    "idle-timeout-s = 30\n"
	                                    "timeout-s.acme = 0\n"
	                                    "timeout-max-s.acme = 0\n"
	                                    "idle-timeout-s.beta = 5\n"
	                                    "timeout-s.big = 99999\n");
	uint32_t t, idle;
	char *msg = NULL;
	(void)state;

	/* Everyone: the plain keys; the request's own values win. */
	t = 0, idle = 0;
	assert_int_equal(moat_lifetime_fill(cfg, "x", &t, &idle, &msg),
	    MOAT_OK);
	assert_int_equal(t, 600);
	assert_int_equal(idle, 30);
	t = 1200, idle = 7;
	assert_int_equal(moat_lifetime_fill(cfg, "x", &t, &idle, &msg),
	    MOAT_OK);
	assert_int_equal(t, 1200);
	assert_int_equal(idle, 7);
	t = 1201;
	assert_int_equal(moat_lifetime_fill(cfg, "x", &t, &idle, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "tenant x's maximum of 1200 s"));
	free(msg);
	msg = NULL;
	/* acme: no default timeout, no maximum. */
	t = 0, idle = 0;
	assert_int_equal(moat_lifetime_fill(cfg, "acme", &t, &idle, &msg),
	    MOAT_OK);
	assert_int_equal(t, 0);
	assert_int_equal(idle, 30);
	t = 4000000;
	assert_int_equal(moat_lifetime_fill(cfg, "acme", &t, &idle, &msg),
	    MOAT_OK);
	/* beta: its own idle timeout. */
	t = 0, idle = 0;
	assert_int_equal(moat_lifetime_fill(cfg, "beta", &t, &idle, &msg),
	    MOAT_OK);
	assert_int_equal(idle, 5);
	/* A default over the maximum is the maximum. */
	t = 0, idle = 0;
	assert_int_equal(moat_lifetime_fill(cfg, "big", &t, &idle, &msg),
	    MOAT_OK);
	assert_int_equal(t, 1200);
	moat_config_free(cfg);
}

static void
test_bad_value(void **state)
{
	struct moat_config *cfg = config_of("[tenants]\ntimeout-s = soon\n");
	uint32_t t = 0, idle = 0;
	char *msg = NULL;
	(void)state;

	assert_int_equal(moat_lifetime_fill(cfg, "x", &t, &idle, &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "timeout-s"));
	assert_non_null(strstr(msg, "fix the config"));
	free(msg);
	moat_config_free(cfg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_without_config),
		cmocka_unit_test(test_tenant_values),
		cmocka_unit_test(test_bad_value),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
