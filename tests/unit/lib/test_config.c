/*
 * test_config.c: unit tests of lib/config.c: the precedence flag > env >
 * file > default, env names (MOAT_<SECTION>_<KEY>, MOAT_<KEY> for
 * [moat]), numbers and booleans with errors that name the key and its
 * source, missing and broken files, the default state directory, and a
 * service's command line (moat_config_from_args, moat_config_state_dir).
 * Each test writes its own moat.conf in a temporary directory and cleans
 * the variables it set. Not for: what the values mean to each service.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moat/config.h"
#include "moat/status.h"
#include "moat/util.h"

static const char *const env_names[] = { "MOAT_CONFIG", "MOAT_VMD_WORKERS",
	"MOAT_VMD_STATE_DIR", "MOAT_STATE_DIR", "MOAT_MOAT_STATE_DIR",
	"MOAT_VMD_KVM", "MOAT_GATEWAY_LISTEN", "XDG_STATE_HOME", NULL };

struct fixture {
	char dir[64];
	char path[128];
};

static void
clear_env(void)
{
	for (int i = 0; env_names[i] != NULL; i++)
		unsetenv(env_names[i]);
}

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return -1;
	clear_env();
	snprintf(f->dir, sizeof(f->dir), "/tmp/moat-config-test.XXXXXX");
	if (mkdtemp(f->dir) == NULL)
		return -1;
	snprintf(f->path, sizeof(f->path), "%s/moat.conf", f->dir);
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	clear_env();
	moat_rm_rf(f->dir);
	free(f);
	return 0;
}

static void
write_conf(const struct fixture *f, const char *text)
{
	FILE *fp = fopen(f->path, "w");

	assert_non_null(fp);
	assert_int_equal(fputs(text, fp) >= 0, 1);
	assert_int_equal(fclose(fp), 0);
}

static const char sample[] = "; moat.conf for tests\n"
                             "[moat]\n"
                             "state-dir = /srv/moat\n"
                             "\n"
                             "[vmd]\n"
                             "workers = 8\n"
                             "state-dir = /srv/vmd\n"
                             "kvm = yes\n"
                             "[gateway]\n"
                             "listen = tcp://0.0.0.0:7700\n"
                             "workers = 12x\n";

static void
test_precedence(void **state)
{
	struct fixture *f = *state;
	struct moat_config *cfg = NULL;
	char *err = NULL;

	write_conf(f, sample);
	assert_int_equal(moat_config_load(&cfg, f->path, &err), MOAT_OK);
	assert_null(err);

	/* default: set nowhere */
	assert_string_equal(moat_config_get(cfg, "vmd", "driver", "qemu"),
	    "qemu");
	assert_null(moat_config_get(cfg, "vmd", "driver", NULL));
	/* file over default */
	assert_string_equal(moat_config_get(cfg, "vmd", "state-dir", "/d"),
	    "/srv/vmd");
	/* env over file */
	setenv("MOAT_VMD_STATE_DIR", "/env/vmd", 1);
	assert_string_equal(moat_config_get(cfg, "vmd", "state-dir", "/d"),
	    "/env/vmd");
	/* flag over env */
	assert_int_equal(moat_config_set_flag(cfg, "vmd", "state-dir",
	                     "/flag/vmd"),
	    MOAT_OK);
	assert_string_equal(moat_config_get(cfg, "vmd", "state-dir", "/d"),
	    "/flag/vmd");
	/* a later flag replaces an earlier one */
	assert_int_equal(moat_config_set_flag(cfg, "vmd", "state-dir",
	                     "/flag2"),
	    MOAT_OK);
	assert_string_equal(moat_config_get(cfg, "vmd", "state-dir", "/d"),
	    "/flag2");
	/* other sections are untouched */
	assert_string_equal(moat_config_get(cfg, "moat", "state-dir", "/d"),
	    "/srv/moat");
	moat_config_free(cfg);
}

static void
test_env_names(void **state)
{
	struct fixture *f = *state;
	struct moat_config *cfg = NULL;
	char *err = NULL;

	write_conf(f, sample);
	assert_int_equal(moat_config_load(&cfg, f->path, &err), MOAT_OK);
	/* [moat] keys answer to MOAT_<KEY> too */
	setenv("MOAT_STATE_DIR", "/short", 1);
	assert_string_equal(moat_config_get(cfg, "moat", "state-dir", "/d"),
	    "/short");
	/* ... but not keys of other sections */
	assert_string_equal(moat_config_get(cfg, "vmd", "state-dir", "/d"),
	    "/srv/vmd");
	/* '.' and '-' become '_', letters upper case */
	setenv("MOAT_GATEWAY_LISTEN", "ipc:///x", 1);
	assert_string_equal(moat_config_get(cfg, "gateway", "listen", NULL),
	    "ipc:///x");
	moat_config_free(cfg);

	/* NULL cfg: env and default only */
	assert_string_equal(moat_config_get(NULL, "gateway", "listen", "d"),
	    "ipc:///x");
	assert_string_equal(moat_config_get(NULL, "vmd", "nothing", "d"), "d");
}

static void
test_numbers_and_bools(void **state)
{
	struct fixture *f = *state;
	struct moat_config *cfg = NULL;
	uint64_t n = 0;
	bool b = false;
	char *err = NULL;

	write_conf(f, sample);
	assert_int_equal(moat_config_load(&cfg, f->path, &err), MOAT_OK);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 3, &n,
	                     &err),
	    MOAT_OK);
	assert_int_equal(n, 8);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "absent", 3, &n,
	                     &err),
	    MOAT_OK);
	assert_int_equal(n, 3);

	/* a bad number in the file names the key, the file and the line */
	assert_int_equal(moat_config_get_u64(cfg, "gateway", "workers", 3, &n,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "workers"));
	assert_non_null(strstr(err, "12x"));
	assert_non_null(strstr(err, f->path));
	assert_non_null(strstr(err, "line 11"));
	free(err);

	/* a bad number in the environment names the variable */
	setenv("MOAT_VMD_WORKERS", "-1", 1);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 3, &n,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "MOAT_VMD_WORKERS"));
	free(err);
	setenv("MOAT_VMD_WORKERS", "99999999999999999999999", 1);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 3, &n,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	free(err);
	setenv("MOAT_VMD_WORKERS", "18446744073709551615", 1);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 3, &n,
	                     &err),
	    MOAT_OK);
	assert_true(n == UINT64_MAX);

	/* a bad flag names the flag */
	assert_int_equal(moat_config_set_flag(cfg, "vmd", "workers", ""), 0);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 3, &n,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "workers"));
	free(err);

	assert_int_equal(moat_config_get_bool(cfg, "vmd", "kvm", false, &b,
	                     &err),
	    MOAT_OK);
	assert_true(b);
	setenv("MOAT_VMD_KVM", "Off", 1);
	assert_int_equal(moat_config_get_bool(cfg, "vmd", "kvm", true, &b,
	                     &err),
	    MOAT_OK);
	assert_false(b);
	setenv("MOAT_VMD_KVM", "maybe", 1);
	assert_int_equal(moat_config_get_bool(cfg, "vmd", "kvm", true, &b,
	                     &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "kvm"));
	assert_non_null(strstr(err, "maybe"));
	free(err);
	assert_int_equal(moat_config_get_bool(cfg, "vmd", "absent", true, &b,
	                     &err),
	    MOAT_OK);
	assert_true(b);
	moat_config_free(cfg);
}

/* A per-name value (key.<name>) wins over the section's key. */
static void
test_u64_for(void **state)
{
	struct fixture *f = *state;
	struct moat_config *cfg = NULL;
	uint64_t n = 0;
	char *err = NULL;

	write_conf(f,
	    "[tenants]\nmax-sandboxes = 10\n"
	    "max-sandboxes.acme = 2\nmax-vcpus.bad = 3x\n");
	assert_int_equal(moat_config_load(&cfg, f->path, &err), MOAT_OK);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants",
	                     "max-sandboxes", "acme", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 2);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants",
	                     "max-sandboxes", "other", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 10);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants",
	                     "max-sandboxes", NULL, 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 10);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants", "max-vcpus",
	                     "acme", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 7);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants", "max-vcpus",
	                     "bad", 7, &n, &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "max-vcpus.bad"));
	free(err);
	moat_config_free(cfg);
}

/* An overlay standing for the tenants kept in moat-sessiond: acme has
 * max-sandboxes 4 and a broken key-rps; nobody else has settings. */
static bool
overlay(void *arg, const char *key, const char *who, char *buf, size_t size)
{
	(*(int *)arg)++;
	if (strcmp(who, "acme") != 0)
		return false;
	if (strcmp(key, "max-sandboxes") == 0) {
		snprintf(buf, size, "4");
		return true;
	}
	if (strcmp(key, "key-rps") == 0) {
		snprintf(buf, size, "many");
		return true;
	}
	return false;
}

/* The overlay's value wins over key.<name> and key; without one the
 * file's apply; a value that is not a number names the tenant; other
 * sections and lookups without a name never ask it; cleared, the file's
 * apply again. */
static void
test_u64_for_overlay(void **state)
{
	struct fixture *f = *state;
	struct moat_config *cfg = NULL;
	uint64_t n = 0;
	char *err = NULL;
	int asked = 0;

	write_conf(f,
	    "[tenants]\nmax-sandboxes = 10\nmax-sandboxes.acme = 2\n"
	    "[retention]\nkeep-last = 5\n");
	assert_int_equal(moat_config_load(&cfg, f->path, &err), MOAT_OK);
	moat_config_set_overlay(cfg, "tenants", overlay, &asked);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants",
	                     "max-sandboxes", "acme", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 4);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants",
	                     "max-sandboxes", "other", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 10);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants", "max-vcpus",
	                     "acme", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 7);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants", "key-rps",
	                     "acme", 7, &n, &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "key-rps of acme"));
	assert_non_null(strstr(err, "tenants set"));
	free(err);
	asked = 0;
	assert_int_equal(moat_config_get_u64_for(cfg, "retention", "keep-last",
	                     "acme", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 5);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants",
	                     "max-sandboxes", NULL, 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 10);
	assert_int_equal(asked, 0);
	moat_config_set_overlay(cfg, "tenants", NULL, NULL);
	assert_int_equal(moat_config_get_u64_for(cfg, "tenants",
	                     "max-sandboxes", "acme", 7, &n, &err),
	    MOAT_OK);
	assert_int_equal(n, 2);
	moat_config_free(cfg);
}

static void
test_missing_and_broken_files(void **state)
{
	struct fixture *f = *state;
	struct moat_config *cfg = NULL;
	char *err = NULL;
	int rv;

	/* no path and no MOAT_CONFIG: no file, not an error */
	assert_int_equal(moat_config_load(&cfg, NULL, &err), MOAT_OK);
	assert_non_null(cfg);
	moat_config_free(cfg);

	/* a named file that is missing is an error naming it */
	rv = moat_config_load(&cfg, f->path, &err);
	assert_int_equal(rv, MOAT_NOT_FOUND);
	assert_null(cfg);
	assert_non_null(strstr(err, f->path));
	free(err);

	/* MOAT_CONFIG names the file when path is NULL */
	setenv("MOAT_CONFIG", f->path, 1);
	rv = moat_config_load(&cfg, NULL, &err);
	assert_int_equal(rv, MOAT_NOT_FOUND);
	assert_non_null(strstr(err, "MOAT_CONFIG"));
	free(err);

	write_conf(f, "[vmd]\nworkers = 2\n");
	assert_int_equal(moat_config_load(&cfg, NULL, &err), MOAT_OK);
	assert_string_equal(moat_config_get(cfg, "vmd", "workers", NULL), "2");
	moat_config_free(cfg);

	/* a parse error names the line */
	write_conf(f, "[vmd]\nworkers = 2\nthis is not ini\n");
	rv = moat_config_load(&cfg, f->path, &err);
	assert_int_equal(rv, MOAT_INVALID_ARGUMENT);
	assert_null(cfg);
	assert_non_null(strstr(err, "line 3"));
	free(err);
}

static void
test_default_state_dir(void **state)
{
	char *d;

	setenv("MOAT_STATE_DIR", "/from/env", 1);
	d = moat_default_state_dir();
	assert_string_equal(d, "/from/env");
	free(d);
	unsetenv("MOAT_STATE_DIR");
	d = moat_default_state_dir();
	assert_non_null(d);
	if (geteuid() == 0) {
		assert_string_equal(d, "/var/lib/moat");
	} else {
		assert_non_null(strstr(d, "moat"));
	}
	free(d);
}

static int usage_calls;

static void
count_usage(FILE *f)
{
	(void)f;
	usage_calls++;
}

static const struct option svc_opts[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "state-dir", required_argument, NULL, 's' },
	{ "workers", required_argument, NULL, 'w' },
	{ "version", no_argument, NULL, 'V' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* args: runs moat_config_from_args on a NULL-terminated argv. */
static int
args(struct moat_config **cfg, char **argv)
{
	int argc = 0;

	while (argv[argc] != NULL)
		argc++;
	return moat_config_from_args(argc, argv, svc_opts, "moat-test", "vmd",
	    count_usage, cfg);
}

static void
test_service_args(void **state)
{
	struct fixture *f = *state;
	struct moat_config *cfg = NULL;
	uint64_t v = 0;
	char *err = NULL, *dir;

	write_conf(f, sample);
	setenv("MOAT_VMD_WORKERS", "9", 1);
	/* --config is read; a flag wins over env and file, by its name. */
	{
		char *argv[] = { "moat-test", "--config", f->path, "--workers",
			"3", NULL };

		assert_int_equal(args(&cfg, argv), -1);
	}
	assert_non_null(cfg);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 1, &v,
	                     &err),
	    MOAT_OK);
	assert_int_equal(v, 3);
	assert_string_equal(moat_config_get(cfg, "gateway", "listen", ""),
	    "tcp://0.0.0.0:7700");
	/* state-dir: [vmd] over [moat] over the default. */
	dir = moat_config_state_dir(cfg, "vmd");
	assert_string_equal(dir, "/srv/vmd");
	free(dir);
	dir = moat_config_state_dir(cfg, "sessiond");
	assert_string_equal(dir, "/srv/moat");
	free(dir);
	moat_config_free(cfg);
	{
		char *argv[] = { "moat-test", "--state-dir", "/flag/dir",
			NULL };

		assert_int_equal(args(&cfg, argv), -1);
	}
	dir = moat_config_state_dir(cfg, "vmd");
	assert_string_equal(dir, "/flag/dir");
	free(dir);
	moat_config_free(cfg);

	/* --help and --version end the program with 0 and load nothing. */
	usage_calls = 0;
	{
		char *argv[] = { "moat-test", "--help", NULL };

		assert_int_equal(args(&cfg, argv), 0);
	}
	assert_null(cfg);
	assert_int_equal(usage_calls, 1);
	{
		char *argv[] = { "moat-test", "--version", NULL };

		assert_int_equal(args(&cfg, argv), 0);
	}
	assert_null(cfg);
	/* An unknown option, a stray argument, a config that is not there:
	 * the exit code of INVALID_ARGUMENT or NOT_FOUND, nothing loaded. */
	{
		char *argv[] = { "moat-test", "--bogus", NULL };

		assert_int_equal(args(&cfg, argv),
		    moat_status_exit_code(MOAT_INVALID_ARGUMENT));
	}
	assert_null(cfg);
	assert_int_equal(usage_calls, 2);
	{
		char *argv[] = { "moat-test", "stray", NULL };

		assert_int_equal(args(&cfg, argv),
		    moat_status_exit_code(MOAT_INVALID_ARGUMENT));
	}
	assert_null(cfg);
	{
		char *argv[] = { "moat-test", "--config",
			"/nonexistent/moat.conf", NULL };

		assert_int_not_equal(args(&cfg, argv), -1);
		assert_int_not_equal(args(&cfg, argv), 0);
	}
	assert_null(cfg);
}

/* Without --config or $MOAT_CONFIG, /etc/moat/moat.conf is read where it
 * exists; a flag and the environment still win over it. Needs root and
 * no such file already (then it is skipped, saying so). */
static void
test_system_default_file(void **state)
{
	struct moat_config *cfg = NULL;
	char *errmsg = NULL;
	bool made_dir = false;
	uint64_t v = 0;
	FILE *f;

	(void)state;
	if (geteuid() != 0 || access(MOAT_CONFIG_SYSTEM_PATH, F_OK) == 0) {
		printf("SKIPPED: test_system_default_file (needs root and no "
		       "%s)\n",
		    MOAT_CONFIG_SYSTEM_PATH);
		skip();
	}
	if (mkdir("/etc/moat", 0755) == 0)
		made_dir = true;
	f = fopen(MOAT_CONFIG_SYSTEM_PATH, "w");
	assert_non_null(f);
	fputs("[vmd]\nworkers = 7\n", f);
	fclose(f);
	assert_int_equal(moat_config_load(&cfg, NULL, &errmsg), MOAT_OK);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 1, &v,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(v, 7);
	setenv("MOAT_VMD_WORKERS", "9", 1);
	assert_int_equal(moat_config_get_u64(cfg, "vmd", "workers", 1, &v,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(v, 9);
	moat_config_free(cfg);
	unlink(MOAT_CONFIG_SYSTEM_PATH);
	if (made_dir)
		rmdir("/etc/moat");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
		T(test_precedence),
		T(test_env_names),
		T(test_numbers_and_bools),
		T(test_u64_for),
		T(test_u64_for_overlay),
		T(test_missing_and_broken_files),
		T(test_default_state_dir),
		T(test_service_args),
		T(test_system_default_file),
#undef T
	};

	return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
