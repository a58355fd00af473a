/*
 * test_exec.c: moat-agent's exec requests, black-box: the built agent runs
 * in host mode and the tests speak guest.proto to it. Exit codes, stdout,
 * stderr, stdin (at start and streamed), python3, timeouts that kill the
 * whole process group, output caps, background processes that must not
 * hold an exec open, exec failures, signals, and the limits. Not for:
 * files or the fs trace (test_files.c, test_trace.c).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_client.h"
#include "moat/status.h"

static int
group_setup(void **state)
{
	static struct tagent t;

	if (tagent_start(&t, NULL, false) != 0)
		return -1;
	*state = &t;
	return 0;
}

static int
group_teardown(void **state)
{
	tagent_stop(*state);
	return 0;
}

static void
run_shell(struct tagent *t, const char *shell, struct texec *r)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;

	es.shell = (char *)shell;
	assert_int_equal(tagent_exec(t, &es, 0, r), 0);
	assert_int_equal(r->code, MOAT_OK);
	assert_non_null(r->exit);
}

static void
test_echo_exit_code(void **state)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	char *argv[] = { "echo", "hello", "world" };
	struct texec r;

	es.argv = argv;
	es.n_argv = 3;
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_OK);
	assert_true(r.pid > 0);
	assert_int_equal(r.exit->exit_code, 0);
	assert_int_equal(r.exit->signal, 0);
	assert_false(r.exit->timed_out);
	assert_int_equal(r.len[0], 12);
	assert_memory_equal(r.out[0], "hello world\n", 12);
	assert_int_equal(r.exit->stdout_bytes, 12);
	assert_int_equal(r.len[1], 0);
	texec_free(&r);

	run_shell(*state, "exit 3", &r);
	assert_int_equal(r.exit->exit_code, 3);
	texec_free(&r);
}

static void
test_stderr(void **state)
{
	struct texec r;

	run_shell(*state, "echo out; echo oops >&2; exit 1", &r);
	assert_int_equal(r.exit->exit_code, 1);
	assert_string_equal((char *)r.out[0], "out\n");
	assert_string_equal((char *)r.out[1], "oops\n");
	assert_int_equal(r.exit->stderr_bytes, 5);
	texec_free(&r);
}

static void
test_stdin_at_start(void **state)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	char *argv[] = { "cat" };
	struct texec r;

	es.argv = argv;
	es.n_argv = 1;
	es.stdin.data = (uint8_t *)"abc\0def";
	es.stdin.len = 7;
	es.stdin_close = true;
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.exit->exit_code, 0);
	assert_int_equal(r.len[0], 7);
	assert_memory_equal(r.out[0], "abc\0def", 7);
	texec_free(&r);
}

static void
test_stdin_streamed(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecInput in = MOAT__V1__EXEC_INPUT__INIT;
	Moat__V1__GuestMessage *m;
	char *argv[] = { "tr", "a-z", "A-Z" };
	uint64_t id = t->next_id++;
	struct texec r;

	memset(&r, 0, sizeof(r));
	es.argv = argv;
	es.n_argv = 3;
	req.id = id;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->body_case,
	    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_STARTED);
	moat__v1__guest_message__free_unpacked(m, NULL);

	moat__v1__guest_request__init(&req);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_INPUT;
	req.exec_input = &in;
	in.exec_id = id;
	in.data.data = (uint8_t *)"more ";
	in.data.len = 5;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->body_case, MOAT__V1__GUEST_MESSAGE__BODY_ACK);
	moat__v1__guest_message__free_unpacked(m, NULL);

	req.id = 0;
	in.data.data = (uint8_t *)"input";
	in.data.len = 5;
	in.close = true;
	/* events of the exec may come before the ack: collect them all */
	assert_int_equal(tagent_send(t, &req), 0);
	for (;;) {
		m = tagent_recv(t);
		assert_non_null(m);
		if (m->id == req.id) {
			assert_int_equal(m->code, MOAT_OK);
			moat__v1__guest_message__free_unpacked(m, NULL);
			break;
		}
		assert_int_equal(m->id, id);
		assert_int_equal(m->body_case,
		    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT);
		r.out[0] =
		    realloc(r.out[0], r.len[0] + m->exec_output->data.len + 1);
		memcpy(r.out[0] + r.len[0], m->exec_output->data.data,
		    m->exec_output->data.len);
		r.len[0] += m->exec_output->data.len;
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	assert_int_equal(tagent_exec_wait(t, id, &r), 0);
	assert_int_equal(r.exit->exit_code, 0);
	assert_int_equal(r.len[0], 10);
	assert_memory_equal(r.out[0], "MORE INPUT", 10);

	/* stdin is closed now, and the exec is over: NOT_FOUND */
	req.id = 0;
	in.close = false;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_NOT_FOUND);
	moat__v1__guest_message__free_unpacked(m, NULL);
	texec_free(&r);
}

static void
test_python_exit_code(void **state)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	char *argv[] = { "python3", "-c",
		"import sys; print(6 * 7); sys.exit(7)" };
	struct texec r;

	es.argv = argv;
	es.n_argv = 3;
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_OK);
	assert_int_equal(r.exit->exit_code, 7);
	assert_string_equal((char *)r.out[0], "42\n");
	texec_free(&r);
}

static void
test_timeout_kills_group(void **state)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	struct texec r;

	es.shell = "sleep 300 & sleep 300";
	es.timeout_ms = 300;
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_OK);
	assert_true(r.exit->timed_out);
	assert_int_equal(r.exit->exit_code, -1);
	assert_int_equal(r.exit->signal, SIGKILL);
	/* every process of the group is gone, the background one too */
	assert_true(tagent_wait_group_gone(r.pid));
	texec_free(&r);
}

static void
test_output_cap(void **state)
{
	struct texec r;

	/* 5 MiB on stdout, default cap (1 MiB) */
	run_shell(*state, "head -c 5242880 /dev/zero; echo tail >&2", &r);
	assert_int_equal(r.exit->exit_code, 0);
	assert_int_equal(r.len[0], 1u << 20);
	assert_true(r.exit->stdout_truncated);
	assert_int_equal(r.exit->stdout_bytes, 5u << 20);
	assert_false(r.exit->stderr_truncated);
	assert_string_equal((char *)r.out[1], "tail\n");
	assert_true(r.max_chunk <= 65536);
	texec_free(&r);
}

static void
test_output_cap_small(void **state)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	struct texec r;

	es.shell = "printf 0123456789";
	es.output_cap = 4;
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.len[0], 4);
	assert_memory_equal(r.out[0], "0123", 4);
	assert_true(r.exit->stdout_truncated);
	assert_int_equal(r.exit->stdout_bytes, 10);
	texec_free(&r);
}

static void
test_background_does_not_hold(void **state)
{
	struct texec r;

	run_shell(*state, "sleep 300 & echo started", &r);
	assert_int_equal(r.exit->exit_code, 0);
	assert_string_equal((char *)r.out[0], "started\n");
	/* the exec is over, but its background process lives on */
	assert_int_equal(kill(-r.pid, 0), 0);
	assert_int_equal(kill(-r.pid, SIGKILL), 0);
	assert_true(tagent_wait_group_gone(r.pid));
	texec_free(&r);
}

static void
test_exec_failure(void **state)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	char *argv[] = { "/nonexistent/program", "x" };
	struct texec r;

	es.argv = argv;
	es.n_argv = 2;
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_OK);
	assert_int_equal(r.exit->exit_code, 127);
	assert_non_null(r.out[1]);
	assert_non_null(strstr((char *)r.out[1], "cannot run"));
	texec_free(&r);
}

static void
test_bad_requests(void **state)
{
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	char *argv[] = { "true" };
	char *env[] = { "NOEQUALS" };
	struct texec r;

	/* neither argv nor shell */
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_INVALID_ARGUMENT);
	texec_free(&r);
	/* both */
	es.argv = argv;
	es.n_argv = 1;
	es.shell = "true";
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_INVALID_ARGUMENT);
	texec_free(&r);
	/* bad env entry */
	es.shell = "";
	es.env = env;
	es.n_env = 1;
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(r.message, "KEY=VALUE"));
	texec_free(&r);
	/* relative cwd */
	es.env = NULL;
	es.n_env = 0;
	es.cwd = "relative/dir";
	assert_int_equal(tagent_exec(*state, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_INVALID_ARGUMENT);
	texec_free(&r);
}

static void
test_env_and_cwd(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	char *env[] = { "FOO=bar baz", "TERM=xterm" };
	char want[600];
	struct texec r;

	es.shell = "echo \"$FOO|$HOME|$TERM|$LANG\"; pwd";
	es.env = env;
	es.n_env = 2;
	assert_int_equal(tagent_exec(t, &es, 0, &r), 0);
	assert_int_equal(r.exit->exit_code, 0);
	/* default cwd /root, inside --root, made when missing */
	snprintf(want, sizeof(want), "bar baz|/root|xterm|C.UTF-8\n%s\n",
	    tagent_host_path(t, "/root"));
	assert_string_equal((char *)r.out[0], want);
	texec_free(&r);

	es.shell = "pwd";
	es.env = NULL;
	es.n_env = 0;
	es.cwd = "/work/deep/dir";
	assert_int_equal(tagent_exec(t, &es, 0, &r), 0);
	assert_int_equal(r.exit->exit_code, 0);
	snprintf(want, sizeof(want), "%s\n",
	    tagent_host_path(t, "/work/deep/dir"));
	assert_string_equal((char *)r.out[0], want);
	texec_free(&r);
}

/* An image's /etc/moat/env (a spec's [env], issue 17): its variables
 * join the defaults, replace a default's value, and yield to the
 * request's. Without the file the defaults are back. */
static void
test_image_env(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	char *env[] = { "OVER=request" };
	char dir[600], path[600];
	struct texec r;
	FILE *f;

	snprintf(dir, sizeof(dir), "%s", tagent_host_path(t, "/etc"));
	(void)mkdir(dir, 0755);
	snprintf(dir, sizeof(dir), "%s", tagent_host_path(t, "/etc/moat"));
	(void)mkdir(dir, 0755);
	snprintf(path, sizeof(path), "%s",
	    tagent_host_path(t, "/etc/moat/env"));
	assert_non_null(f = fopen(path, "w"));
	fputs("IMG_VAR=from the image\n# a comment\nLANG=C\nOVER=image\n"
	      "bad line\n",
	    f);
	fclose(f);
	es.shell = "echo \"$IMG_VAR|$LANG|$OVER|$HOME\"";
	es.env = env;
	es.n_env = 1;
	assert_int_equal(tagent_exec(t, &es, 0, &r), 0);
	assert_int_equal(r.exit->exit_code, 0);
	assert_string_equal((char *)r.out[0],
	    "from the image|C|request|/root\n");
	texec_free(&r);

	assert_int_equal(unlink(path), 0);
	es.n_env = 0;
	assert_int_equal(tagent_exec(t, &es, 0, &r), 0);
	assert_string_equal((char *)r.out[0], "|C.UTF-8||/root\n");
	texec_free(&r);
	rmdir(dir);
}

static void
test_signal_and_unknown(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecSignal sig = MOAT__V1__EXEC_SIGNAL__INIT;
	Moat__V1__GuestMessage *m;
	char *argv[] = { "sleep", "300" };
	uint64_t id = t->next_id++;
	struct texec r;

	/* unknown exec id */
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL;
	req.exec_signal = &sig;
	sig.exec_id = 987654;
	sig.signal = SIGTERM;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_NOT_FOUND);
	assert_true(strlen(m->message) > 0);
	moat__v1__guest_message__free_unpacked(m, NULL);

	memset(&r, 0, sizeof(r));
	es.argv = argv;
	es.n_argv = 2;
	req.id = id;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->body_case,
	    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_STARTED);
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* the same id again while it runs */
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_ALREADY_EXISTS);
	moat__v1__guest_message__free_unpacked(m, NULL);

	moat__v1__guest_request__init(&req);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL;
	req.exec_signal = &sig;
	sig.exec_id = id;
	sig.signal = 0;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	moat__v1__guest_message__free_unpacked(m, NULL);

	req.id = 0;
	sig.signal = SIGTERM;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(tagent_exec_wait(t, id, &r), 0);
	assert_int_equal(r.exit->exit_code, -1);
	assert_int_equal(r.exit->signal, SIGTERM);
	assert_false(r.exit->timed_out);
	texec_free(&r);
}

/* A signal sent right behind its ExecStart (one write: the agent reads
 * both at once) reaches a child that may not have made its process group
 * yet. */
static void
test_signal_right_after_start(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__ExecSignal sig = MOAT__V1__EXEC_SIGNAL__INIT;
	char *argv[] = { "sleep", "300" };
	int round;

	es.argv = argv;
	es.n_argv = 2;
	es.timeout_ms = 30000; /* a lost signal fails, it does not hang */
	for (round = 0; round < 20; round++) {
		Moat__V1__GuestRequest start = MOAT__V1__GUEST_REQUEST__INIT;
		Moat__V1__GuestRequest sigreq = MOAT__V1__GUEST_REQUEST__INIT;
		uint8_t buf[512], *p = buf;
		size_t n;
		int seen = 0;
		bool exited = false;

		start.id = t->next_id++;
		start.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
		start.exec_start = &es;
		sigreq.id = t->next_id++;
		sigreq.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL;
		sigreq.exec_signal = &sig;
		sig.exec_id = start.id;
		sig.signal = SIGKILL;
		n = moat__v1__guest_request__get_packed_size(&start);
		p[0] = p[1] = p[2] = 0;
		p[3] = (uint8_t)n;
		moat__v1__guest_request__pack(&start, p + 4);
		p += 4 + n;
		n = moat__v1__guest_request__get_packed_size(&sigreq);
		p[0] = p[1] = p[2] = 0;
		p[3] = (uint8_t)n;
		moat__v1__guest_request__pack(&sigreq, p + 4);
		p += 4 + n;
		n = (size_t)(p - buf);
		assert_int_equal(tagent_send_raw(t, buf, n), 0);
		while (!exited || seen < 2) {
			Moat__V1__GuestMessage *m = tagent_recv(t);

			assert_non_null(m);
			assert_int_equal(m->code, MOAT_OK);
			if (m->body_case ==
			    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT) {
				assert_int_equal(m->id, start.id);
				assert_false(m->exec_exit->timed_out);
				assert_int_equal(m->exec_exit->signal,
				    SIGKILL);
				exited = true;
			} else {
				seen++;
			}
			moat__v1__guest_message__free_unpacked(m, NULL);
		}
	}
}

static void
test_stdin_bound(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecInput in = MOAT__V1__EXEC_INPUT__INIT;
	Moat__V1__ExecSignal sig = MOAT__V1__EXEC_SIGNAL__INIT;
	Moat__V1__GuestMessage *m;
	char *argv[] = { "sleep", "300" };
	uint64_t id = t->next_id++;
	uint8_t *big = calloc(1, 1u << 20);
	struct texec r;

	assert_non_null(big);
	memset(&r, 0, sizeof(r));
	es.argv = argv;
	es.n_argv = 2;
	req.id = id;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	m = tagent_call(t, &req);
	assert_non_null(m);
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* sleep never reads: the first MiB queues, the second is refused */
	moat__v1__guest_request__init(&req);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_INPUT;
	req.exec_input = &in;
	in.exec_id = id;
	in.data.data = big;
	in.data.len = 1u << 20;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	moat__v1__guest_message__free_unpacked(m, NULL);
	req.id = 0;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_RESOURCE_EXHAUSTED);
	moat__v1__guest_message__free_unpacked(m, NULL);

	moat__v1__guest_request__init(&req);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL;
	req.exec_signal = &sig;
	sig.exec_id = id;
	sig.signal = SIGKILL;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_equal(tagent_exec_wait(t, id, &r), 0);
	assert_int_equal(r.exit->signal, SIGKILL);
	texec_free(&r);
	free(big);
}

static void
test_exec_limit(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecSignal sig = MOAT__V1__EXEC_SIGNAL__INIT;
	Moat__V1__GuestMessage *m;
	char *argv[] = { "sleep", "300" };
	uint64_t first = t->next_id;
	struct texec r;
	int i;

	es.argv = argv;
	es.n_argv = 2;
	for (i = 0; i < 64; i++) {
		moat__v1__guest_request__init(&req);
		req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
		req.exec_start = &es;
		m = tagent_call(t, &req);
		assert_non_null(m);
		assert_int_equal(m->code, MOAT_OK);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	moat__v1__guest_request__init(&req);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_RESOURCE_EXHAUSTED);
	moat__v1__guest_message__free_unpacked(m, NULL);

	for (i = 0; i < 64; i++) {
		moat__v1__guest_request__init(&req);
		req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL;
		req.exec_signal = &sig;
		sig.exec_id = first + (uint64_t)i;
		sig.signal = SIGKILL;
		assert_int_equal(tagent_send(t, &req), 0);
	}
	/* 64 acks and 64 exits, in any order */
	for (i = 0; i < 128; i++) {
		m = tagent_recv(t);
		assert_non_null(m);
		assert_int_equal(m->code, MOAT_OK);
		assert_true(
		    m->body_case == MOAT__V1__GUEST_MESSAGE__BODY_ACK ||
		    m->body_case == MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	/* room again */
	run_shell(t, "exit 0", &r);
	texec_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_echo_exit_code),
		cmocka_unit_test(test_stderr),
		cmocka_unit_test(test_stdin_at_start),
		cmocka_unit_test(test_stdin_streamed),
		cmocka_unit_test(test_python_exit_code),
		cmocka_unit_test(test_timeout_kills_group),
		cmocka_unit_test(test_output_cap),
		cmocka_unit_test(test_output_cap_small),
		cmocka_unit_test(test_background_does_not_hold),
		cmocka_unit_test(test_exec_failure),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_env_and_cwd),
		cmocka_unit_test(test_image_env),
		cmocka_unit_test(test_signal_and_unknown),
		cmocka_unit_test(test_signal_right_after_start),
		cmocka_unit_test(test_stdin_bound),
		cmocka_unit_test(test_exec_limit),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
