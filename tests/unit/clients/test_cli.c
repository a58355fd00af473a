/*
 * test_cli.c: the `moat` binary as a user runs it, against a fake
 * gateway: run streams stdout and stderr to the right places, exits with
 * the program's code (124 on timeout, 128+N on a signal) and always
 * destroys its sandbox, even on SIGTERM; errors have the documented form
 * and exit code, with what to do when the gateway is down; cp moves a
 * binary file up and back; --json prints JSON; the session commands
 * check their arguments and say when a sandbox has no recording; the
 * snapshot retention commands and flags reach the gateway.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "fake_gateway.h"
#include "moat/log.h"
#include "moat/util.h"

static char dir[64];
static struct fake_gateway fg;

struct result {
	int code;
	char *out, *err;
	size_t out_len;
};

static int
setup(void **state)
{
	moat_log_init("test", MOAT_LOG_ERROR);
	snprintf(dir, sizeof(dir), "/tmp/moat-cli-XXXXXX");
	assert_non_null(mkdtemp(dir));
	assert_int_equal(fake_gateway_start(&fg, dir), 0);
	return 0;
}

static int
teardown(void **state)
{
	fake_gateway_stop(&fg);
	moat_rm_rf(dir);
	return 0;
}

static char *
slurp(const char *path, size_t *len)
{
	char *s = NULL;
	size_t n = 0;

	if (moat_read_file(path, 64u << 20, &s, &n) != 0)
		return strdup("");
	if (len != NULL)
		*len = n;
	return s;
}

static int second_signal_ms; /* >0: moat() signals again after it */

/* moat: runs the CLI with `args` (NULL-terminated, after the binary),
 * stdin from /dev/null; sends `sig` after `sig_after_ms` when sig != 0
 * (and again second_signal_ms later when that is set). */
static struct result
moat(int sig, int sig_after_ms, ...)
{
	char *argv[32], *out_path, *err_path;
	struct result r = { 0 };
	va_list ap;
	int n = 0, status;
	pid_t pid;

	argv[n++] = (char *)MOAT_BIN;
	va_start(ap, sig_after_ms);
	while (n < 31 && (argv[n] = va_arg(ap, char *)) != NULL)
		n++;
	va_end(ap);
	argv[n] = NULL;
	out_path = moat_asprintf("%s/stdout", dir);
	err_path = moat_asprintf("%s/stderr", dir);
	if ((pid = fork()) == 0) {
		int in = open("/dev/null", O_RDONLY);
		int out = open(out_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
		int err = open(err_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
		dup2(in, 0);
		dup2(out, 1);
		dup2(err, 2);
		unsetenv("MOAT_GATEWAY");
		execv(MOAT_BIN, argv);
		_exit(127);
	}
	if (sig != 0) {
		nng_msleep(sig_after_ms);
		kill(pid, sig);
		if (second_signal_ms > 0) {
			nng_msleep(second_signal_ms);
			kill(pid, sig);
		}
	}
	waitpid(pid, &status, 0);
	r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 1000;
	r.out = slurp(out_path, &r.out_len);
	r.err = slurp(err_path, NULL);
	free(out_path);
	free(err_path);
	return r;
}

static void
result_free(struct result *r)
{
	free(r->out);
	free(r->err);
}

static void
test_run_streams_and_exits_with_code(void **state)
{
	struct result r;
	int destroys = fg.destroys;

	r = moat(0, 0, "--gateway", fg.url, "run", "-c", "print(1)", NULL);
	assert_int_equal(r.code, 3);
	assert_string_equal(r.out, "hello\n");
	assert_non_null(strstr(r.err, "warn\n"));
	assert_string_equal(fg.exec_language, "python");
	assert_string_equal(fg.exec_code, "print(1)");
	assert_int_equal(fg.destroys, destroys + 1);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "run", "-l", "sh", "-c", "timeout",
	    NULL);
	assert_int_equal(r.code, 124);
	assert_non_null(strstr(r.err, "timeout"));
	assert_string_equal(fg.exec_language, "sh");
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "run", "-c", "signal", NULL);
	assert_int_equal(r.code, 128 + 9);
	assert_int_equal(fg.destroys, destroys + 3);
	result_free(&r);

	/* A read refused by the rate limit is tried again: nothing lost. */
	r = moat(0, 0, "--gateway", fg.url, "run", "-c", "ratelimited", NULL);
	assert_int_equal(r.code, 3);
	assert_string_equal(r.out, "hello\n");
	assert_int_equal(fg.exec_reads, 3);
	result_free(&r);
}

static void
test_run_destroys_on_sigterm(void **state)
{
	struct result r;
	int destroys = fg.destroys;

	r = moat(SIGTERM, 700, "--gateway", fg.url, "run", "-c", "forever",
	    NULL);
	assert_int_equal(r.code, 128 + SIGTERM);
	assert_int_equal(fg.destroys, destroys + 1);
	assert_non_null(strstr(r.err, "destroying sandbox"));
	result_free(&r);
}

static void
test_run_interrupted_during_create(void **state)
{
	struct result r;
	int destroys = fg.destroys;
	uint64_t t0;

	/* One ^C while the sandbox boots: it is destroyed once it exists,
	 * and the program never starts. */
	fg.exec_code[0] = '\0';
	r = moat(SIGINT, 300, "--gateway", fg.url, "run", "--image", "slow",
	    "-c", "never", NULL);
	assert_int_equal(r.code, 128 + SIGINT);
	assert_int_equal(fg.destroys, destroys + 1);
	assert_string_equal(fg.exec_code, "");
	result_free(&r);

	/* A second ^C does not wait for the boot. */
	second_signal_ms = 200;
	t0 = moat_now_unix_ms();
	r = moat(SIGINT, 200, "--gateway", fg.url, "run", "--image", "slow",
	    "-c", "never", NULL);
	second_signal_ms = 0;
	assert_int_equal(r.code, 128 + SIGINT);
	assert_true(moat_now_unix_ms() - t0 < 1300);
	assert_non_null(strstr(r.err, "interrupted twice"));
	assert_non_null(strstr(r.err, "moat sandbox ls"));
	result_free(&r);
	nng_msleep(1500); /* let the fake finish that create */
}

static void
test_errors(void **state)
{
	char *down = moat_asprintf("ipc://%s/nothing.sock", dir);
	struct result r;

	r = moat(0, 0, "--gateway", down, "--timeout", "1", "info", NULL);
	assert_int_equal(r.code, 64 + 14);
	assert_true(strncmp(r.err, "moat: ", 6) == 0);
	assert_non_null(strstr(r.err, "deploy/moat-stack start"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "sandbox", "get", "ghost", NULL);
	assert_int_equal(r.code, 64 + 5);
	assert_non_null(strstr(r.err,
	    "moat: getting sandbox ghost: sandbox "
	    "ghost does not exist"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "frobnicate", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "moat help"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "cp", "a", "b", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "ID:/path"));
	result_free(&r);
	free(down);
}

static void
test_cp_round_trip(void **state)
{
	char *up = moat_asprintf("%s/up.bin", dir);
	char *down = moat_asprintf("%s/down.bin", dir);
	char *remote = moat_asprintf("sb-1:/data/up.bin");
	size_t n = 1536 * 1024, got = 0;
	uint8_t *data = malloc(n);
	char *back;
	struct result r;

	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)(i * 131 + (i >> 9));
	data[10] = 0; /* binary: NULs and all */
	assert_int_equal(moat_write_file_atomic(up, data, n, 0640), 0);

	r = moat(0, 0, "--gateway", fg.url, "cp", up, remote, NULL);
	assert_int_equal(r.code, 0);
	result_free(&r);
	assert_string_equal(fg.file_path, "/data/up.bin");
	assert_int_equal(fg.file_len, n);
	assert_int_equal(fg.file_mode, 0640);

	r = moat(0, 0, "--gateway", fg.url, "cp", remote, down, NULL);
	assert_int_equal(r.code, 0);
	result_free(&r);
	back = slurp(down, &got);
	assert_int_equal(got, n);
	assert_memory_equal(back, data, n);
	free(back);

	/* A directory in the sandbox is refused with what to do. */
	r = moat(0, 0, "--gateway", fg.url, "cp", "sb-1:/dir", down, NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "is a directory"));
	assert_non_null(strstr(r.err, "cp -r"));
	result_free(&r);

	/* Into a directory: the source's name is kept. */
	r = moat(0, 0, "--gateway", fg.url, "cp", up, "sb-1:/dir", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(fg.file_path, "/dir/up.bin");
	result_free(&r);

	free(data);
	free(up);
	free(down);
	free(remote);
}

static void
test_json_output(void **state)
{
	struct result r;
	json_t *j;

	r = moat(0, 0, "--gateway", fg.url, "--json", "sandbox", "create",
	    NULL);
	assert_int_equal(r.code, 0);
	j = json_loads(r.out, 0, NULL);
	assert_non_null(j);
	assert_non_null(
	    strstr(json_string_value(json_object_get(j, "id")), "sb-fake-"));
	assert_string_equal(json_string_value(json_object_get(j, "state")),
	    "SANDBOX_STATE_RUNNING");
	json_decref(j);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "sandbox", "create", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "sb-fake-"));
	assert_null(strchr(r.out, '{'));
	result_free(&r);
}

/* json_of: r's stdout parsed as one JSON object; fails the test when it
 * is not. The caller frees it (json_decref). */
static json_t *
json_of(const struct result *r)
{
	json_error_t e;
	json_t *j = json_loads(r->out, 0, &e);

	if (j == NULL)
		fail_msg("not JSON (%s at line %d): %s", e.text, e.line,
		    r->out);
	assert_true(json_is_object(j));
	return j;
}

/* exec_json_ok: an ExecResult as the fake's exec makes it: "hello\n" on
 * stdout, "warn\n" on stderr (base64, as proto3 JSON has bytes), exit 3. */
static void
exec_json_ok(const struct result *r)
{
	json_t *j = json_of(r), *st;

	assert_int_equal(r->code, 3);
	assert_string_equal(json_string_value(json_object_get(j, "stdout")),
	    "aGVsbG8K");
	assert_string_equal(json_string_value(json_object_get(j, "stderr")),
	    "d2Fybgo=");
	st = json_object_get(j, "status");
	assert_true(json_is_object(st));
	assert_true(json_is_true(json_object_get(st, "exited")));
	assert_int_equal(json_integer_value(json_object_get(st, "exitCode")),
	    3);
	/* Nothing but the JSON on stdout: the output is inside it. */
	assert_null(strstr(r->out, "hello"));
	json_decref(j);
}

/* --json on run, exec, ls, info and sandbox ls: stdout is one JSON
 * object with the reply's fields, and nothing else. */
static void
test_json_outputs(void **state)
{
	struct result r;
	json_t *j, *a, *e;
	int destroys;

	pthread_mutex_lock(&fg.lock);
	destroys = fg.destroys;
	pthread_mutex_unlock(&fg.lock);
	r = moat(0, 0, "--gateway", fg.url, "--json", "run", "-c", "print(1)",
	    NULL);
	exec_json_ok(&r);
	result_free(&r);
	pthread_mutex_lock(&fg.lock);
	assert_int_equal(fg.destroys, destroys + 1);
	pthread_mutex_unlock(&fg.lock);

	r = moat(0, 0, "--gateway", fg.url, "--json", "exec", "sb-1", "--",
	    "echo", "hi", NULL);
	exec_json_ok(&r);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "--json", "ls", "sb-1", "/data",
	    NULL);
	assert_int_equal(r.code, 0);
	j = json_of(&r);
	a = json_object_get(j, "entries");
	assert_true(json_is_array(a));
	assert_int_equal(json_array_size(a), 1);
	e = json_array_get(a, 0);
	assert_string_equal(json_string_value(json_object_get(e, "name")),
	    "hello.txt");
	assert_string_equal(json_string_value(json_object_get(e, "path")),
	    "/data/hello.txt");
	assert_string_equal(json_string_value(json_object_get(e, "type")),
	    "FILE_TYPE_REGULAR");
	assert_int_equal(json_integer_value(json_object_get(e, "mode")), 0644);
	json_decref(j);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "--json", "info", NULL);
	assert_int_equal(r.code, 0);
	j = json_of(&r);
	assert_string_equal(json_string_value(json_object_get(j, "version")),
	    "0.0-fake");
	a = json_object_get(j, "services");
	assert_true(json_is_array(a));
	assert_int_equal(json_array_size(a), 2);
	e = json_array_get(a, 0);
	assert_string_equal(json_string_value(json_object_get(e, "service")),
	    "moat-gateway");
	assert_true(json_is_true(json_object_get(e, "up")));
	/* A down service says so (false printed, not left out): what
	 * deploy/moat-stack's wait_healthy looks for. */
	e = json_array_get(a, 1);
	assert_string_equal(json_string_value(json_object_get(e, "service")),
	    "moat-sessiond");
	assert_true(json_is_false(json_object_get(e, "up")));
	assert_string_equal(json_string_value(json_object_get(e, "message")),
	    "fake: down");
	a = json_object_get(j, "nodes");
	assert_true(json_is_array(a));
	assert_int_equal(json_array_size(a), 1);
	e = json_array_get(a, 0);
	assert_string_equal(json_string_value(json_object_get(e, "nodeId")),
	    "node-x");
	assert_true(json_is_true(json_object_get(e, "available")));
	assert_string_equal(json_string_value(json_object_get(e, "accel")),
	    "tcg");
	json_decref(j);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "--json", "sandbox", "ls", NULL);
	assert_int_equal(r.code, 0);
	j = json_of(&r);
	a = json_object_get(j, "sandboxes");
	assert_true(json_is_array(a));
	assert_int_equal(json_array_size(a), 1);
	e = json_array_get(a, 0);
	assert_string_equal(json_string_value(json_object_get(e, "id")),
	    "sb-1");
	assert_string_equal(json_string_value(json_object_get(e, "nodeId")),
	    "node-x");
	assert_string_equal(json_string_value(json_object_get(e, "state")),
	    "SANDBOX_STATE_RUNNING");
	assert_int_equal(json_integer_value(json_object_get(e, "memoryMib")),
	    256);
	json_decref(j);
	/* Without --json: the table, not JSON. */
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "ls", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "sb-1"));
	assert_null(strchr(r.out, '{'));
	result_free(&r);
}

/* The session commands' own argument checks and their answers from a
 * gateway that knows no sessions (the fake answers empty lists). */
static void
test_session_commands(void **state)
{
	struct result r;

	r = moat(0, 0, "--gateway", fg.url, "sandbox", "create", "--snapshot",
	    "every", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "--record"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "sandbox", "create", "--record",
	    "--snapshot", "sometimes", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "every, manual or none"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "session", "ls", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "SANDBOX"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "history", "sb-1", NULL);
	assert_int_equal(r.code, 64 + 5);
	assert_non_null(strstr(r.err, "--record"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "session", "show", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "session", "frob", "x", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);

	/* The tree of a session (issue 18): branches indented under their
	 * parent, where each branched, its steps, its last exit status. */
	r = moat(0, 0, "--gateway", fg.url, "session", "tree", "ses-tree",
	    NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "SESSION"));
	assert_non_null(strstr(r.out, "\nses-tree "));
	assert_non_null(strstr(r.out,
	    "\n  ses-branch                              step 1       2     1 "
	    " 7"));
	assert_non_null(strstr(r.out,
	    "\n    ses-leaf                              step 2       2     "
	    "0  -"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "session", "tree", "ses-tree",
	    "--json", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "\"branchedAt\""));
	assert_non_null(strstr(r.out, "\"ses-leaf\""));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "session", "tree", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "session tree ID"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "session", "tree", "ses-none",
	    NULL);
	assert_int_equal(r.code, 64 + 5);
	assert_non_null(strstr(r.err, "moat session ls"));
	result_free(&r);
}

/* restore (issue 18): in place by default, keeping the recorded state;
 * --reseed asks for new seeds in the code contexts, --new restores into
 * a new sandbox (which the gateway always reseeds). */
static void
test_restore_reseed(void **state)
{
	struct result r;

	(void)state;
	r = moat(0, 0, "--gateway", fg.url, "restore", "sb-rec", "--session",
	    "ses-rec", "--step", "2", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out, "sb-rec\n");
	assert_string_equal(fg.restore_session, "ses-rec");
	assert_string_equal(fg.restore_sandbox, "sb-rec");
	assert_int_equal(fg.restore_step, 2);
	assert_int_equal(fg.restore_reseed, 0);
	assert_int_equal(fg.restore_new, 0);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "restore", "sb-rec", "--session",
	    "ses-rec", "--step", "2", "--reseed", NULL);
	assert_int_equal(r.code, 0);
	assert_int_equal(fg.restore_reseed, 1);
	assert_string_equal(fg.restore_sandbox, "sb-rec");
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "restore", "sb-rec", "--session",
	    "ses-rec", "--step", "1", "--new", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out, "sb-restored\n");
	assert_int_equal(fg.restore_new, 1);
	assert_int_equal(fg.restore_reseed, 0);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "help", "restore", NULL);
	assert_non_null(strstr(r.out, "--reseed"));
	result_free(&r);
}

/* diff and compare: argument checks, the human and JSON output, and an
 * HTML report that escapes what the sessions hold. */
static void
test_diff_and_compare(void **state)
{
	struct result r;
	char *html_path = moat_asprintf("%s/report.html", dir), *html;

	r = moat(0, 0, "--gateway", fg.url, "diff", "ses-a", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "compare", "ses-a", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "diff", "nope", "ses-b", NULL);
	assert_int_equal(r.code, 64 + 5);
	assert_non_null(strstr(r.err, "nope"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "diff", "ses-a", "ses-b", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "first divergent step: 2"));
	assert_non_null(strstr(r.out, "B + created /w/new"));
	assert_non_null(strstr(r.out, "touch /w/new"));
	assert_non_null(strstr(r.out, "stdout"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "diff", "ses-a", "ses-b", "--json",
	    NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "\"firstDivergentStep\""));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "compare", "ses-html1",
	    "ses-html2", "--html", html_path, NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "RANK"));
	assert_non_null(strstr(r.out, "ses-html1"));
	result_free(&r);
	html = slurp(html_path, NULL);
	assert_non_null(strstr(html, "<!DOCTYPE html>"));
	assert_non_null(strstr(html, "ses-html1"));
	assert_non_null(strstr(html, "ses-html2"));
	assert_non_null(strstr(html, "&lt;script&gt;alert(1)&lt;/script&gt;"));
	assert_non_null(strstr(html, "&amp; &quot;q&quot;"));
	assert_non_null(strstr(html, "sb-&lt;b&gt;"));
	/* self-contained: no script, no link out */
	assert_null(strstr(html, "<script"));
	assert_null(strstr(html, "src="));
	assert_null(strstr(html, "href="));
	assert_null(strstr(html, "http"));
	free(html);

	r = moat(0, 0, "--gateway", fg.url, "compare", "ses-a", "ses-b",
	    "--json", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "\"finalSuccess\""));
	result_free(&r);
	free(html_path);
}

/* Snapshot retention and garbage (issue 11): --keep reaches Exec and
 * RunCode, `session keep` pins and unpins (a bad step is a usage error),
 * `snapshot gc` sends
 * its flags and prints each snapshot, the total and the errors, `snapshot
 * ls` says where a snapshot lives and its session and step, `session rm`
 * what it freed, `info` the snapshot RAM of a node; `session show`
 * marks pinned steps and removed snapshots. */
static void
test_snapshot_retention_commands(void **state)
{
	struct result r;

	r = moat(0, 0, "--gateway", fg.url, "exec", "sb-rec", "--keep", "--",
	    "make", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out, "rec\n");
	assert_int_equal(fg.exec_keep, 1);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "exec", "sb-rec", "--", "make",
	    NULL);
	assert_int_equal(fg.exec_keep, 0);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "exec", "sb-rec", "--keep", "-i",
	    "--", "make", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "code", "sb-rec", "--keep", "-c",
	    "6*7", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out, "42\n");
	assert_int_equal(fg.code_keep, 1);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "session", "keep", "ses-rec", "2",
	    NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(fg.keep_session, "ses-rec");
	assert_int_equal(fg.keep_index, 2);
	assert_int_equal(fg.keep_keep, 1);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "session", "keep", "ses-rec", "3",
	    "--off", NULL);
	assert_int_equal(r.code, 0);
	assert_int_equal(fg.keep_index, 3);
	assert_int_equal(fg.keep_keep, 0);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "session", "keep", "ses-rec", "x",
	    NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "session", "keep", "ses-none", "1",
	    NULL);
	assert_int_equal(r.code, 64 + 5);
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "session", "show", "ses-rec",
	    NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "[pinned]"));
	assert_non_null(strstr(r.out, "removed by retention (keep-last 3)"));
	assert_non_null(strstr(r.out, "[inherited from ses-parent]"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "snapshot", "gc", "--dry-run",
	    "--min-age", "120", NULL);
	assert_int_equal(r.code, 64 + 14); /* a node failed */
	assert_int_equal(fg.gc_dry_run, 1);
	assert_int_equal(fg.gc_min_age, 120);
	assert_non_null(strstr(r.out,
	    "would remove "
	    "snap-node-x-00000000000000aa  node node-x  2.0 MiB"));
	assert_non_null(strstr(r.out, "snapd"));
	assert_non_null(strstr(r.out, "would free 3.0 MiB in 2 snapshots"));
	assert_non_null(strstr(r.err, "node node-y"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "snapshot", "gc", NULL);
	assert_int_equal(fg.gc_dry_run, 0);
	assert_int_equal(fg.gc_min_age, 0);
	assert_non_null(strstr(r.out, "freed 3.0 MiB in 2 snapshots"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "snapshot", "gc", "--json", NULL);
	assert_non_null(strstr(r.out, "\"bytesFreed\""));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "snapshot", "gc", "--min-age",
	    "soon", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "snapshot", "gc", "--min-age", "0",
	    NULL);
	assert_int_equal(fg.gc_min_age, 1); /* 0 would be the default */
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "snapshot", "ls", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "disk+snapd"));
	assert_non_null(strstr(r.out, "4.0")); /* 3 MiB RAM + 1 disk */
	assert_non_null(strstr(r.out, "ses-rec"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "session", "rm", "ses-rec", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out, "ses-rec\n");
	assert_non_null(strstr(r.err, "3 steps, 2 snapshots, 5.0 MiB freed"));
	assert_non_null(strstr(r.err, "moat snapshot gc"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "info", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out,
	    "snapshot RAM 128.0/512.0 MiB used, 3 "
	    "in RAM, 5 on disk, 7 evictions"));
	assert_non_null(strstr(r.out,
	    "RAM dir /dev/shm/moat-ram: 1024.0 MiB, "
	    "300.0 MiB reserved"));
	assert_non_null(strstr(r.out, "isolation relaxed: no cgroup (fake)"));
	result_free(&r);
}

/* Operating nodes (issue 15): `node ls` shows cordons, protocol
 * versions and why a node is unusable; cordon and uncordon send the
 * node and reason; drain prints each sandbox's outcome and pause and
 * exits 1 when some stayed; bad usage is a usage error. */
static void
test_node_commands(void **state)
{
	struct result r;

	(void)state;
	r = moat(0, 0, "--gateway", fg.url, "node", "ls", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "PROTOCOL"));
	assert_non_null(strstr(r.out, "node-x cordoned: kernel upgrade"));
	assert_non_null(strstr(r.out, "protocol version 1 < 2"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "ls", "--json", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "\"cordonReason\""));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "cordon", "node-x",
	    "--reason", "disk", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out, "node node-x cordoned: disk\n");
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "uncordon", "node-x",
	    NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out, "node node-x uncordoned\n");
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "uncordon", "node-q",
	    NULL);
	assert_int_not_equal(r.code, 0);
	assert_non_null(strstr(r.err, "unknown"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "drain", "node-x", "--to",
	    "node-z", NULL);
	assert_int_equal(r.code, 1);
	assert_non_null(strstr(r.out,
	    "moved  sb-1 (default) node-x -> node-z, paused 1234 ms"));
	assert_non_null(strstr(r.out,
	    "failed sb-2 (default) stays on node-x: node node-y refused"));
	assert_non_null(strstr(r.out, "1 moved, 1 failed"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "drain", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "drain", "node-x", "--to",
	    NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "node", "frob", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
}

/* Images (issue 17): `image build` sends the spec and the files its
 * [files] section names (relative to the spec, with their modes), prints
 * each step with its time and the image at the end; a failed build
 * exits non-zero with its error; a [files] entry that is missing is
 * refused before anything is sent; ls, rm (and a refused rm), push. */
static void
test_image_commands(void **state)
{
	char spec[192], sub[96], file[192], *text;
	struct result r;
	FILE *f;

	(void)state;
	snprintf(sub, sizeof(sub), "%s/spec", dir);
	assert_int_equal(mkdir(sub, 0700), 0);
	snprintf(file, sizeof(file), "%s/hello.sh", sub);
	assert_non_null(f = fopen(file, "w"));
	fputs("echo hi\n", f);
	fclose(f);
	assert_int_equal(chmod(file, 0750), 0);
	snprintf(spec, sizeof(spec), "%s/tools.ini", sub);
	assert_non_null(f = fopen(spec, "w"));
	fputs("[image]\nbase = bookworm\n[packages]\njq =\n[files]\n"
	      "/usr/local/bin/hello = hello.sh\n/etc/x = hello.sh:0644\n",
	    f);
	fclose(f);
	r = moat(0, 0, "--gateway", fg.url, "image", "build", spec, "--node",
	    "node-x", "--force", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "[  0.1s] debootstrap bookworm\n"));
	assert_non_null(strstr(r.out, "[ 12.3s] apt-get install jq\n"));
	assert_non_null(strstr(r.out,
	    "image tools: id 0123456789ab, 3.0 MiB, "
	    "2 packages, nodes node-x"));
	result_free(&r);
	pthread_mutex_lock(&fg.lock);
	assert_string_equal(fg.build_name, "tools");
	assert_string_equal(fg.build_node, "node-x");
	assert_int_equal(fg.build_force, 1);
	assert_non_null(strstr(fg.build_spec, "[packages]"));
	assert_string_equal(fg.build_files, "hello.sh:750:8 hello.sh:644:8 ");
	assert_int_equal(fg.build_polls, 2);
	pthread_mutex_unlock(&fg.lock);

	r = moat(0, 0, "--gateway", fg.url, "image", "build", spec, "--name",
	    "broken", NULL);
	assert_int_equal(r.code, 64 + 9); /* FAILED_PRECONDITION */
	assert_non_null(strstr(r.err,
	    "building image broken: apt-get: "
	    "unable to locate package nope"));
	result_free(&r);

	/* A [files] source that is not there: nothing is sent. */
	assert_non_null(f = fopen(spec, "a"));
	fputs("/etc/y = missing.txt\n", f);
	fclose(f);
	pthread_mutex_lock(&fg.lock);
	fg.build_name[0] = '\0';
	pthread_mutex_unlock(&fg.lock);
	r = moat(0, 0, "--gateway", fg.url, "image", "build", spec, NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "missing.txt is not a readable file"));
	result_free(&r);
	pthread_mutex_lock(&fg.lock);
	assert_string_equal(fg.build_name, "");
	pthread_mutex_unlock(&fg.lock);

	r = moat(0, 0, "--gateway", fg.url, "image", "ls", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "NAME"));
	assert_non_null(strstr(r.out, "STORED"));
	text = strstr(r.out, "default ");
	assert_non_null(text);
	assert_non_null(strstr(text, "0123456789ab "));
	assert_non_null(strstr(text, "node-x"));
	assert_non_null(strstr(r.out, "tools "));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "image", "ls", "--json", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "\"sizeBytes\""));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "image", "rm", "busy", NULL);
	assert_int_equal(r.code, 64 + 9);
	assert_non_null(strstr(r.err, "sb-1"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "image", "rm", "tools", NULL);
	assert_int_equal(r.code, 0);
	assert_string_equal(r.out,
	    "removed image tools from 1 node(s) "
	    "(node-x) and moat-snapd, 2.0 MiB freed\n");
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "image", "push", "tools", "--node",
	    "node-x", NULL);
	assert_int_equal(r.code, 0);
	assert_non_null(strstr(r.out, "image tools (0123456789ab) stored"));
	result_free(&r);
	pthread_mutex_lock(&fg.lock);
	assert_string_equal(fg.removed, "tools");
	assert_string_equal(fg.pushed, "tools");
	assert_string_equal(fg.push_node, "node-x");
	pthread_mutex_unlock(&fg.lock);
	r = moat(0, 0, "--gateway", fg.url, "image", "build", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "usage: moat image build SPEC"));
	result_free(&r);
}

/* Lifetimes (issue 15): create --timeout/--idle-timeout, keepalive with
 * and without values, --idle-timeout 0 clears, a refusal is shown. */
static void
test_lifetime_commands(void **state)
{
	struct result r;
	(void)state;

	r = moat(0, 0, "--gateway", fg.url, "sandbox", "create", "--timeout",
	    "30", "--idle-timeout", "10", NULL);
	assert_int_equal(r.code, 0);
	assert_int_equal(fg.create_timeout, 30);
	assert_int_equal(fg.create_idle, 10);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "create", "--timeout",
	    "0", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "--timeout"));
	result_free(&r);

	r = moat(0, 0, "--gateway", fg.url, "sandbox", "keepalive", "sb-rec",
	    "--timeout", "600", NULL);
	assert_int_equal(r.code, 0);
	assert_int_equal(fg.life_timeout, 600);
	assert_int_equal(fg.life_idle, 0);
	assert_int_equal(fg.life_clear, 0);
	assert_non_null(strstr(r.out, "sb-rec\n"));
	assert_non_null(strstr(r.out, "expires:     2026-12-05 03:00:00Z"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "keepalive", "sb-rec",
	    NULL);
	assert_int_equal(r.code, 0);
	assert_int_equal(fg.life_timeout, 0);
	assert_non_null(strstr(r.out, "expires:     never"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "keepalive", "sb-rec",
	    "--idle-timeout", "0", NULL);
	assert_int_equal(r.code, 0);
	assert_int_equal(fg.life_clear, 1);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "keepalive", "sb-rec",
	    "--idle-timeout", "45", NULL);
	assert_int_equal(r.code, 0);
	assert_int_equal(fg.life_idle, 45);
	assert_non_null(strstr(r.out, "after 45 s without a call"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "keepalive", "sb-rec",
	    "--timeout", "5000", NULL);
	assert_int_equal(r.code, 64 + 3);
	assert_non_null(strstr(r.err, "timeout-max-s"));
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "keepalive", "sb-none",
	    NULL);
	assert_int_equal(r.code, 64 + 5);
	result_free(&r);
	r = moat(0, 0, "--gateway", fg.url, "sandbox", "keepalive", NULL);
	assert_int_equal(r.code, 64 + 3);
	result_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_run_streams_and_exits_with_code),
		cmocka_unit_test(test_run_destroys_on_sigterm),
		cmocka_unit_test(test_run_interrupted_during_create),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_cp_round_trip),
		cmocka_unit_test(test_json_output),
		cmocka_unit_test(test_json_outputs),
		cmocka_unit_test(test_session_commands),
		cmocka_unit_test(test_diff_and_compare),
		cmocka_unit_test(test_restore_reseed),
		cmocka_unit_test(test_snapshot_retention_commands),
		cmocka_unit_test(test_node_commands),
		cmocka_unit_test(test_image_commands),
		cmocka_unit_test(test_lifetime_commands),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
