/*
 * test_spawn.c: the spawner (services/vm/spawn.c): a child runs with the
 * request's output file and working directory, a missing program is
 * reported with exec's errno, and no_hugepage_advice makes
 * madvise(MADV_HUGEPAGE) fail in the child (EINVAL) while other advice
 * and the same call without the flag still work. The child is python3
 * (as the images script needs it); the huge-page case is skipped, saying
 * so, where this kernel refuses the advice anyway (no THP). keep_fd and
 * output_fd reach the child (the console pipe), nothing else does.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/status.h"
#include "moat/util.h"
#include "spawn.h"

/* Asks for huge pages on an anonymous mapping and for MADV_DONTFORK on
 * another; prints each result. */
#define ADVISE_PY                                                             \
	"import mmap\n"                                                       \
	"def advise(a):\n"                                                    \
	"    m = mmap.mmap(-1, 4 << 20)\n"                                    \
	"    try:\n"                                                          \
	"        m.madvise(a); return 'ok'\n"                                 \
	"    except OSError as e:\n"                                          \
	"        return 'errno %d' % e.errno\n"                               \
	"print('huge', advise(mmap.MADV_HUGEPAGE))\n"                         \
	"print('dontfork', advise(mmap.MADV_DONTFORK))\n"

static char dir[] = "/tmp/moat-spawn-XXXXXX";

/* run_advise: runs ADVISE_PY through the spawner; its output, heap. */
static char *
run_advise(bool no_hugepage_advice)
{
	const char *argv[] = { "python3", "-c", ADVISE_PY, NULL };
	char *out = moat_asprintf("%s/out.txt", dir), *text = NULL,
	     *errmsg = NULL;
	struct moat_spawn_req req = {
		.argv = argv,
		.output_file = out,
		.cwd = dir,
		.no_hugepage_advice = no_hugepage_advice,
	};
	size_t len = 0;
	int status = -1;

	assert_int_equal(moat_spawn_wait(&req, &status, &errmsg), MOAT_OK);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(moat_read_file(out, 4096, &text, &len), 0);
	free(out);
	return text;
}

static void
test_hugepage_advice_denied(void **state)
{
	char *plain, *denied;

	(void)state;
	plain = run_advise(false);
	denied = run_advise(true);
	assert_non_null(strstr(plain, "dontfork ok"));
	assert_non_null(strstr(denied, "dontfork ok"));
	if (strstr(plain, "huge ok") == NULL) {
		print_message("skipped: this kernel refuses MADV_HUGEPAGE "
		              "anyway (%s)\n",
		    plain);
	} else {
		assert_non_null(strstr(denied, "huge errno 22"));
	}
	free(plain);
	free(denied);
}

static void
test_missing_program(void **state)
{
	const char *argv[] = { "moat-no-such-program", NULL };
	struct moat_spawn_req req = { .argv = argv };
	char *errmsg = NULL;
	pid_t pid;

	(void)state;
	assert_int_not_equal(moat_spawn(&req, &pid, &errmsg), MOAT_OK);
	assert_non_null(strstr(errmsg, "No such file"));
	free(errmsg);
}

/* keep_fd stays open in the child under its number, output_fd takes
 * its stdout and stderr, and every other fd of ours is closed there. */
static void
test_keep_and_output_fd(void **state)
{
	const char *argv[] = { "sh", "-c", NULL, NULL };
	struct moat_spawn_req req = { .argv = argv };
	int keep[2], outp[2], other[2];
	char script[128], buf[64];
	char *errmsg = NULL;
	int status = -1;
	ssize_t n;

	(void)state;
	assert_int_equal(pipe2(keep, O_CLOEXEC), 0);
	assert_int_equal(pipe2(outp, O_CLOEXEC), 0);
	assert_int_equal(pipe2(other, O_CLOEXEC), 0);
	snprintf(script, sizeof(script),
	    "echo kept >&%d; echo out; { echo leak >&%d; } 2>/dev/null; "
	    "exit 0",
	    keep[1], other[1]);
	argv[2] = script;
	req.keep_fd = keep[1];
	req.output_fd = outp[1];
	assert_int_equal(moat_spawn_wait(&req, &status, &errmsg), MOAT_OK);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(keep[1]);
	close(outp[1]);
	close(other[1]);
	n = read(keep[0], buf, sizeof(buf) - 1);
	assert_int_equal(n, 5);
	assert_memory_equal(buf, "kept\n", 5);
	n = read(outp[0], buf, sizeof(buf) - 1);
	assert_int_equal(n, 4);
	assert_memory_equal(buf, "out\n", 4);
	assert_int_equal(read(other[0], buf, sizeof(buf)), 0); /* closed */
	close(keep[0]);
	close(outp[0]);
	close(other[0]);
}

static int
setup(void **state)
{
	(void)state;
	assert_non_null(mkdtemp(dir));
	return moat_spawner_start();
}

static int
teardown(void **state)
{
	(void)state;
	moat_spawner_stop();
	moat_rm_rf(dir);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hugepage_advice_denied),
		cmocka_unit_test(test_missing_program),
		cmocka_unit_test(test_keep_and_output_fd),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
