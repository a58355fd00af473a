/*
 * test_image_spec.c: unit tests of lib/image_spec.c: a good spec parses
 * into its normalised form; each bad input (unknown section or key, a
 * package name that could be an option, bad guest paths and sources,
 * env keys, odd bytes, what inih would silently change) fails with an
 * error naming its line; the id changes with a source file's bytes.
 * Not for: building images (tests/integration/images).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moat/image_spec.h"
#include "moat/status.h"

static const char good[] = "# a comment\n"
                           "[image]\n"
                           "suite = trixie\n"
                           "packages = python3-numpy, git  g++\n"
                           "languages = python bash\n"
                           "description = numbers and git\n"
                           "\n"
                           "[files]\n"
                           "/opt//tools/./run.sh = run.sh:0755\n"
                           "/etc/motd = motd\n"
                           "[run]\n"
                           "cmd = chmod 0644 /etc/motd && echo a; echo b\n"
                           "cmd = /opt/tools/run.sh\n"
                           "[env]\n"
                           "MPLBACKEND = Agg\n"
                           "GREETING = hello world\n";

static void
test_good(void **state)
{
	struct moat_image_spec *s;
	char *why = NULL, *text;

	(void)state;
	assert_int_equal(moat_image_spec_parse(good, strlen(good), "g.ini", &s,
	                     &why),
	    MOAT_OK);
	assert_null(why);
	text = moat_image_spec_print(s);
	assert_string_equal(text,
	    "suite\ttrixie\n"
	    "description\tnumbers and git\n"
	    "package\tpython3-numpy\npackage\tgit\npackage\tg++\n"
	    "language\tpython\nlanguage\tbash\n"
	    "file\t/opt/tools/run.sh\trun.sh\t0755\n"
	    "file\t/etc/motd\tmotd\t-\n"
	    "run\tchmod 0644 /etc/motd && echo a; echo b\n"
	    "run\t/opt/tools/run.sh\n"
	    "env\tMPLBACKEND\tAgg\nenv\tGREETING\thello world\n");
	free(text);
	moat_image_spec_free(s);
}

static void
test_defaults(void **state)
{
	struct moat_image_spec *s;
	char *why = NULL, *text;

	(void)state;
	assert_int_equal(moat_image_spec_parse("", 0, "e.ini", &s, &why),
	    MOAT_OK);
	text = moat_image_spec_print(s);
	assert_string_equal(text, "suite\tbookworm\n");
	free(text);
	moat_image_spec_free(s);
}

struct bad_case {
	const char *text;
	const char *error; /* a part of the error */
};

static const struct bad_case bad[] = {
	{ "[image]\n[nope]\nx = 1\n", "t.ini line 3: unknown section [nope]" },
	{ "[image]\nsuit = bookworm\n", "line 2: unknown key \"suit\"" },
	{ "[image]\npackages = git --allow-unauthenticated\n",
	    "\"--allow-unauthenticated\" is not a Debian package name" },
	{ "[image]\npackages = Git\n", "\"Git\" is not a Debian package" },
	{ "[image]\npackages = git=1.2\n", "\"git=1.2\" is not a Debian" },
	{ "[image]\npackages = a\n", "\"a\" is not a Debian package name" },
	{ "[image]\nsuite = ../x\n", "suite \"../x\" is not a Debian suite" },
	{ "[image]\nsuite = sid\nsuite = trixie\n",
	    "line 3: \"suite\" is set twice" },
	{ "[image]\nlanguages = Py-thon\n", "\"Py-thon\" is not a language" },
	{ "[files]\nrel/path = f\n", "\"rel/path\" is not an absolute guest" },
	{ "[files]\n/a/../etc/x = f\n", "without \"..\"" },
	{ "[files]\n/proc/x = f\n", "is under /proc" },
	{ "[files]\n/sys = f\n", "is under /sys" },
	{ "[files]\n//dev/./null = f\n", "\"/dev/null\" is under /dev" },
	{ "[files]\n/ = f\n", "guest path \"/\" must be a file path" },
	{ "[files]\n/a b = f\n", "guest path \"/a b\"" },
	{ "[files]\n/x = ../f\n", "source \"../f\" must be a file name" },
	{ "[files]\n/x = d/f\n", "source \"d/f\" must be a file name" },
	{ "[files]\n/x = .f\n", "source \".f\"" },
	{ "[files]\n/x = f:4755\n", "mode \"4755\" is not an octal mode" },
	{ "[files]\n/x = f:9\n", "mode \"9\"" },
	{ "[files]\n/x = f\n//x = g\n", "line 3: guest path /x is listed" },
	{ "[run]\ncommand = ls\n", "unknown key \"command\" in [run]" },
	{ "[run]\ncmd =\n", "line 2: empty cmd" },
	{ "[run]\ncmd = ls ; rm x\n", "line 2: \" ;\" starts a comment" },
	{ "[run]\ncmd = ls\n  -l\n", "line 3: starts with a space" },
	{ "[env]\n1X = y\n", "\"1X\" is not a shell variable name" },
	{ "[env]\nA-B = y\n", "\"A-B\" is not a shell variable name" },
	{ "[env]\nA = 1\nA = 2\n", "line 3: A is set twice" },
	{ "[env]\nA = x\ty\n", "line 2: a control character" },
	{ "[env]\nA = x\ry\n", "a control character (tab, carriage" },
	{ "[env]\nA = x\033y\n", "line 2: a control character" },
	{ "x = 1\n", "line 1: \"x\" comes before any section" },
	{ "[image\n", "line 1: not a [section]" },
};

static void
test_bad(void **state)
{
	struct moat_image_spec *s;
	char *why;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why = NULL;
		assert_int_equal(moat_image_spec_parse(bad[i].text,
		                     strlen(bad[i].text), "t.ini", &s, &why),
		    MOAT_INVALID_ARGUMENT);
		assert_null(s);
		assert_non_null(why);
		if (strstr(why, bad[i].error) == NULL)
			fail_msg("case %zu: error \"%s\" lacks \"%s\"", i, why,
			    bad[i].error);
		free(why);
	}
}

static void
test_nul_and_long_line(void **state)
{
	static const char nul[] = "[image]\nsuite = a\0b\n";
	char text[400];
	struct moat_image_spec *s;
	char *why = NULL;

	(void)state;
	assert_int_equal(moat_image_spec_parse(nul, sizeof(nul) - 1, "n.ini",
	                     &s, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "n.ini line 2: a NUL byte"));
	free(why);
	snprintf(text, sizeof(text), "[run]\ncmd = %0250d\n", 7);
	assert_int_equal(moat_image_spec_parse(text, strlen(text), "l.ini", &s,
	                     &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "l.ini line 2: longer than 199 bytes"));
	free(why);
}

static void
write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void
test_id(void **state)
{
	char dir[] = "/tmp/moat-spec-test.XXXXXX", path[128], a[65], b[65];
	struct moat_image_spec *s;
	char *why = NULL;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/s.ini", dir);
	write_file(path, "[files]\n/etc/motd = motd\n");
	assert_int_equal(moat_image_spec_load(path, &s, &why), MOAT_OK);
	/* a missing source is named */
	assert_int_not_equal(moat_image_spec_id(s, dir, a, &why), MOAT_OK);
	assert_non_null(strstr(why, "/motd: No such file"));
	free(why);
	snprintf(path, sizeof(path), "%s/motd", dir);
	write_file(path, "one\n");
	assert_int_equal(moat_image_spec_id(s, dir, a, &why), MOAT_OK);
	assert_int_equal(moat_image_spec_id(s, dir, b, &why), MOAT_OK);
	assert_string_equal(a, b);
	write_file(path, "two\n");
	assert_int_equal(moat_image_spec_id(s, dir, b, &why), MOAT_OK);
	assert_string_not_equal(a, b);
	assert_int_equal(strlen(b), 64);
	moat_image_spec_free(s);
	unlink(path);
	snprintf(path, sizeof(path), "%s/s.ini", dir);
	unlink(path);
	rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_bad),
		cmocka_unit_test(test_nul_and_long_line),
		cmocka_unit_test(test_id),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
