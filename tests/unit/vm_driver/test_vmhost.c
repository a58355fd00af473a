/*
 * test_vmhost.c: the host helpers both VMM drivers share
 * (services/vm/vmhost.c), linked alone with moat_vmhost as a driver links
 * them: a log tail keeps the last lines, cleaned, of a file's end; a pid
 * is the VMM only while it lives (not a zombie) and its command line
 * holds the mark, whole or within, as asked; an orphan is killed only
 * when its pidfile names such a process; a socket nobody listens on is
 * "try again", not an error; a version line must start as expected.
 * Not for: the drivers' own use of them (tests/unit/firecracker, the
 * integration tests).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sync.h"
#include "vmhost.h"

#define MARK "moat-vmhost-test-mark"

static char dir[] = "/tmp/moat-vmhost-XXXXXX";

static char *
in_dir(const char *name)
{
	char *p = moat_asprintf("%s/%s", dir, name);

	assert_non_null(p);
	return p;
}

static void
write_text(const char *path, const void *text, size_t len, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	close(fd);
}

/* A child `sleep 30` whose argv holds MARK as one argument (argv[0]). */
static pid_t
start_marked(void)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		execlp("sleep", MARK, "30", (char *)NULL);
		_exit(127);
	}
	/* Until exec, the child's command line is ours. */
	for (int i = 0; i < 500 && !vmd_proc_runs(pid, MARK, true); i++)
		vmd_sleep_ms(10);
	assert_true(vmd_proc_runs(pid, MARK, true));
	return pid;
}

static void
test_log_tail(void **state)
{
	char *path = in_dir("console.log");
	char *missing = in_dir("missing.log");
	static const char text[] = "first\r\nsecond\r\nthird \x01\xff\n\n";
	char big[20000];
	char *t;

	(void)state;
	t = vmd_log_tail(missing, 5);
	assert_string_equal(t, "");
	free(t);
	t = vmd_log_tail(NULL, 5);
	assert_string_equal(t, "");
	free(t);

	write_text(path, text, sizeof(text) - 1, 0600);
	t = vmd_log_tail(path, 2);
	/* CR becomes a space, other control bytes and non-ASCII '?', and
	 * the trailing blank line goes. */
	assert_string_equal(t, "second \nthird ??");
	free(t);
	t = vmd_log_tail(path, 10);
	assert_string_equal(t, "first \nsecond \nthird ??");
	free(t);

	/* Only the end of a large file is read. */
	memset(big, 'x', sizeof(big));
	big[0] = 'A';
	big[sizeof(big) - 2] = 'Z';
	big[sizeof(big) - 1] = '\n';
	write_text(path, big, sizeof(big), 0600);
	t = vmd_log_tail(path, 1);
	assert_int_equal(strlen(t), 16384 - 1);
	assert_int_equal(t[strlen(t) - 1], 'Z');
	assert_null(strchr(t, 'A'));
	free(t);

	write_text(path, "", 0, 0600);
	t = vmd_log_tail(path, 3);
	assert_string_equal(t, "");
	free(t);
	(void)unlink(path);
	free(path);
	free(missing);
}

static void
test_proc_runs(void **state)
{
	pid_t pid;
	int status;

	(void)state;
	pid = start_marked();
	assert_true(vmd_proc_runs(pid, MARK, false));
	assert_true(vmd_proc_runs(pid, "vmhost-test", false));
	/* A part of an argument is not the argument. */
	assert_false(vmd_proc_runs(pid, "vmhost-test", true));
	assert_false(vmd_proc_runs(pid, "moat-no-such-mark", false));
	assert_false(vmd_proc_runs(getpid(), MARK, true));

	/* A zombie is not a running VMM. */
	assert_int_equal(kill(pid, SIGKILL), 0);
	for (int i = 0; i < 500; i++) {
		char path[64];
		char *stat_text = NULL;
		size_t len;
		bool zombie;

		snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
		assert_int_equal(moat_read_file(path, 4096, &stat_text, &len),
		    0);
		zombie = strstr(stat_text, ") Z ") != NULL;
		free(stat_text);
		if (zombie)
			break;
		vmd_sleep_ms(10);
	}
	assert_false(vmd_proc_runs(pid, MARK, true));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_false(vmd_proc_runs(pid, MARK, true));
}

static void
test_kill_orphan(void **state)
{
	char *pidfile = in_dir("vmm.pid");
	char *missing = in_dir("none.pid");
	char text[32];
	pid_t pid;
	int status;

	(void)state;
	assert_false(vmd_kill_orphan(missing, MARK, true));
	assert_false(vmd_kill_orphan(NULL, MARK, true));

	pid = start_marked();
	snprintf(text, sizeof(text), "%d\n", (int)pid);
	write_text(pidfile, text, strlen(text), 0600);
	/* Another sandbox's mark: the process is left alone. */
	assert_false(vmd_kill_orphan(pidfile, "moat-other-mark", true));
	assert_int_equal(waitpid(pid, &status, WNOHANG), 0);

	assert_true(vmd_kill_orphan(pidfile, MARK, true));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGKILL);

	/* A pidfile naming pid 1 or garbage kills nothing. */
	write_text(pidfile, "1\n", 2, 0600);
	assert_false(vmd_kill_orphan(pidfile, "init", false));
	write_text(pidfile, "none\n", 5, 0600);
	assert_false(vmd_kill_orphan(pidfile, MARK, true));
	(void)unlink(pidfile);
	free(pidfile);
	free(missing);
}

static void
test_unix_connect(void **state)
{
	char *path = in_dir("agent.sock");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char *err = NULL;
	int listener;
	int fd = 7;

	(void)state;
	/* Nobody there yet: the caller retries, no message. */
	assert_int_equal(vmd_unix_connect(path, &fd, &err), MOAT_UNAVAILABLE);
	assert_int_equal(fd, -1);
	assert_null(err);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(listener >= 0);
	assert_int_equal(bind(listener, (struct sockaddr *)&sa, sizeof(sa)),
	    0);
	assert_int_equal(listen(listener, 1), 0);
	assert_int_equal(vmd_unix_connect(path, &fd, &err), MOAT_OK);
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
	close(listener);

	/* A socket file nobody listens on any more: refused, retried. */
	assert_int_equal(vmd_unix_connect(path, &fd, &err), MOAT_UNAVAILABLE);
	assert_null(err);
	(void)unlink(path);
	free(path);
}

static void
test_version_line(void **state)
{
	char *fake = in_dir("fakevmm");
	char *quoted = in_dir("it's");
	static const char script[] = "#!/bin/sh\n"
	                             "[ \"$1\" = --version ] || exit 3\n"
	                             "echo 'Fakevmm v1.2.3'\n"
	                             "echo 'more text'\n";
	char line[64];
	char *err = NULL;

	(void)state;
	write_text(fake, script, sizeof(script) - 1, 0700);
	assert_int_equal(vmd_version_line(fake, "fakevmm", "Fakevmm v", line,
	                     sizeof(line), &err),
	    MOAT_OK);
	assert_string_equal(line, "Fakevmm v1.2.3");
	assert_null(err);

	/* Something else answers: the driver says what to install. */
	assert_int_equal(vmd_version_line(fake, "fakevmm", "QEMU emulator",
	                     line, sizeof(line), &err),
	    MOAT_FAILED_PRECONDITION);
	assert_null(err);
	assert_int_equal(vmd_version_line("/nonexistent/fakevmm", "fakevmm",
	                     "Fakevmm v", line, sizeof(line), &err),
	    MOAT_FAILED_PRECONDITION);
	assert_null(err);

	/* A quote would break out of the shell command. */
	assert_int_equal(vmd_version_line(quoted, "fakevmm", "Fakevmm v", line,
	                     sizeof(line), &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(err);
	assert_non_null(strstr(err, "quote"));
	free(err);
	(void)unlink(fake);
	free(fake);
	free(quoted);
}

static int
setup(void **state)
{
	(void)state;
	return mkdtemp(dir) != NULL ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	return rmdir(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_log_tail),
		cmocka_unit_test(test_proc_runs),
		cmocka_unit_test(test_kill_orphan),
		cmocka_unit_test(test_unix_connect),
		cmocka_unit_test(test_version_line),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
