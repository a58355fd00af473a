/*
 * test_pty.c: moat-agent's execs under a pseudo-terminal, black-box (the
 * built agent in host mode): the command sees a terminal of the asked
 * size and TERM, its output comes on stdout only, keys written to it
 * reach the line discipline (a Ctrl-D ends a read), a resize changes what
 * `stty size` says, and bad sizes or a resize of a pipe exec are refused.
 * Not for: pipe execs (test_exec.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* send_collect: sends req (a new id) and collects exec `id`'s output
 * into r until req's answer; returns its code. */
static int
send_collect(struct tagent *t, Moat__V1__GuestRequest *req, uint64_t id,
    struct texec *r)
{
	Moat__V1__GuestMessage *m;
	int code;

	req->id = t->next_id++;
	assert_int_equal(tagent_send(t, req), 0);
	for (;;) {
		m = tagent_recv(t);
		assert_non_null(m);
		if (m->id == req->id)
			break;
		assert_int_equal(m->id, id);
		assert_int_equal(m->body_case,
		    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT);
		assert_int_equal(m->exec_output->stream,
		    MOAT__V1__STREAM__STREAM_STDOUT);
		r->out[0] = realloc(r->out[0],
		    r->len[0] + m->exec_output->data.len + 1);
		memcpy(r->out[0] + r->len[0], m->exec_output->data.data,
		    m->exec_output->data.len);
		r->len[0] += m->exec_output->data.len;
		r->out[0][r->len[0]] = '\0';
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	code = m->code;
	moat__v1__guest_message__free_unpacked(m, NULL);
	return code;
}

static int
resize(struct tagent *t, uint64_t id, uint32_t rows, uint32_t cols,
    struct texec *r)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecWinsize ws = MOAT__V1__EXEC_WINSIZE__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_RESIZE;
	req.exec_resize = &ws;
	ws.exec_id = id;
	ws.rows = rows;
	ws.cols = cols;
	return send_collect(t, &req, id, r);
}

static int
input(struct tagent *t, uint64_t id, const char *data, struct texec *r)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecInput in = MOAT__V1__EXEC_INPUT__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_INPUT;
	req.exec_input = &in;
	in.exec_id = id;
	in.data.data = (uint8_t *)data;
	in.data.len = strlen(data);
	return send_collect(t, &req, id, r);
}

/* stop: SIGKILL to exec `id`'s group, and its exit collected. */
static void
stop(struct tagent *t, uint64_t id)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecSignal sig = MOAT__V1__EXEC_SIGNAL__INIT;
	struct texec r;

	memset(&r, 0, sizeof(r));
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL;
	req.exec_signal = &sig;
	sig.exec_id = id;
	sig.signal = 9;
	assert_int_equal(send_collect(t, &req, id, &r), MOAT_OK);
	assert_int_equal(tagent_exec_wait(t, id, &r), 0);
	texec_free(&r);
}

static void
test_terminal_size_and_term(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	struct texec r;

	es.shell = "stty size; echo TERM=$TERM; [ -t 0 ] && [ -t 2 ] && "
	           "echo tty; echo err >&2";
	es.pty = true;
	es.rows = 30;
	es.cols = 100;
	es.stdin_close = true; /* ignored: a terminal's stdin stays */
	assert_int_equal(tagent_exec(t, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_OK);
	assert_int_equal(r.exit->exit_code, 0);
	assert_non_null(r.out[0]);
	assert_non_null(strstr((char *)r.out[0], "30 100\r\n"));
	assert_non_null(strstr((char *)r.out[0], "TERM=xterm-256color"));
	assert_non_null(strstr((char *)r.out[0], "tty\r\n"));
	assert_non_null(strstr((char *)r.out[0], "err\r\n"));
	assert_int_equal(r.len[1], 0);
	texec_free(&r);
}

static void
test_keys_resize_and_ctrl_d(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	uint64_t id = t->next_id++;
	Moat__V1__GuestMessage *m;
	struct texec r;

	memset(&r, 0, sizeof(r));
	es.shell = "read a; stty size; echo got=$a; read b || exit 3";
	es.pty = true;
	req.id = id;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->body_case,
	    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_STARTED);
	moat__v1__guest_message__free_unpacked(m, NULL);

	assert_int_equal(resize(t, id, 40, 120, &r), MOAT_OK);
	assert_int_equal(input(t, id, "hello\r", &r), MOAT_OK);
	/* a Ctrl-D on an empty line: read's end of file */
	assert_int_equal(input(t, id, "\x04", &r), MOAT_OK);
	assert_int_equal(tagent_exec_wait(t, id, &r), 0);
	assert_int_equal(r.exit->exit_code, 3);
	assert_non_null(r.out[0]);
	assert_non_null(strstr((char *)r.out[0], "40 120\r\n"));
	assert_non_null(strstr((char *)r.out[0], "got=hello"));
	assert_int_equal(r.len[1], 0);
	texec_free(&r);
}

static void
test_bad_sizes_and_not_a_terminal(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	char *argv[] = { "sleep", "30" };
	uint64_t id = t->next_id++;
	Moat__V1__GuestMessage *m;
	struct texec r;

	memset(&r, 0, sizeof(r));
	es.shell = "true";
	es.pty = true;
	es.rows = 1001;
	assert_int_equal(tagent_exec(t, &es, 0, &r), 0);
	assert_int_equal(r.code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(r.message, "out of range"));
	texec_free(&r);

	/* a pipe exec has no window */
	moat__v1__exec_start__init(&es);
	es.argv = argv;
	es.n_argv = 2;
	req.id = id;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	m = tagent_call(t, &req);
	assert_non_null(m);
	moat__v1__guest_message__free_unpacked(m, NULL);
	memset(&r, 0, sizeof(r));
	assert_int_equal(resize(t, id, 30, 100, &r), MOAT_FAILED_PRECONDITION);
	stop(t, id);

	/* a pty exec refuses a size of 0 */
	moat__v1__exec_start__init(&es);
	es.shell = "sleep 30";
	es.pty = true;
	req.id = t->next_id++;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->body_case,
	    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_STARTED);
	moat__v1__guest_message__free_unpacked(m, NULL);
	id = req.id;
	assert_int_equal(resize(t, id, 0, 100, &r), MOAT_INVALID_ARGUMENT);
	stop(t, id);
	texec_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_terminal_size_and_term),
		cmocka_unit_test(test_keys_resize_and_ctrl_d),
		cmocka_unit_test(test_bad_sizes_and_not_a_terminal),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
