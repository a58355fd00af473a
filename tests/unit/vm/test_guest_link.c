/*
 * test_guest_link.c: vmd's guest link and exec output bookkeeping against
 * a fake agent on the other end of a socketpair, no VM needed: replies
 * reach their callers, deadlines hold, and every way a hostile guest can
 * break the protocol (garbage, a frame over the cap, answers to requests
 * never sent, output for an exec that does not exist or far past its cap)
 * closes the link as a violation without unbounded memory. Not for: real
 * VMs (tests/integration/vm).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "guest_link.h"
#include "moat/frame.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "exec.h"
#include "node.h"
#include "sandbox.h"
#include "sync.h"

/* What the hooks saw; guarded by mu. */
struct seen {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int ready;
	int closed;
	bool violation;
	char reason[512];
	struct sandbox *sb; /* events go to exec.c when set */
};

static void
seen_init(struct seen *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->mu, NULL);
	vmd_cond_init(&s->cv);
}

static void
on_ready(void *arg, const Moat__V1__AgentReady *r)
{
	struct seen *s = arg;

	pthread_mutex_lock(&s->mu);
	s->ready++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static int
on_event(void *arg, const Moat__V1__GuestMessage *m, char **why)
{
	struct seen *s = arg;

	if (s->sb == NULL) {
		*why = strdup("no exec table in this test");
		return -1;
	}
	return vmd_exec_on_message(s->sb, m, why);
}

static void
on_closed(void *arg, bool violation, const char *reason)
{
	struct seen *s = arg;

	pthread_mutex_lock(&s->mu);
	s->closed++;
	s->violation = violation;
	snprintf(s->reason, sizeof(s->reason), "%s", reason);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static const struct guest_link_hooks hooks = {
	.ready = on_ready,
	.event = on_event,
	.closed = on_closed,
};

/* Waits up to 5 s for the link to close; returns the closed count. */
static int
wait_closed(struct seen *s)
{
	uint64_t until = moat_rpc_now_ms() + 5000;
	int n;

	pthread_mutex_lock(&s->mu);
	while (
	    s->closed == 0 && vmd_cond_wait_until(&s->cv, &s->mu, until) == 0)
		;
	n = s->closed;
	pthread_mutex_unlock(&s->mu);
	return n;
}

static void
send_msg(int fd, const Moat__V1__GuestMessage *m)
{
	size_t len = moat__v1__guest_message__get_packed_size(m);
	uint8_t *body = malloc(len + 1);
	uint8_t *frame;
	size_t flen;

	assert_non_null(body);
	moat__v1__guest_message__pack(m, body);
	frame = moat_frame_encode(body, len, &flen);
	assert_non_null(frame);
	assert_int_equal(moat_frame_write_all(fd, frame, flen), 0);
	free(frame);
	free(body);
}

static void
send_ready(int fd)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__AgentReady r = MOAT__V1__AGENT_READY__INIT;

	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_READY;
	m.ready = &r;
	r.agent_version = "test";
	send_msg(fd, &m);
}

/* Reads one GuestRequest from the fake agent's end (blocking). */
static Moat__V1__GuestRequest *
recv_request(int fd)
{
	struct moat_frame_reader r;
	uint8_t buf[4096];
	uint8_t *frame;
	size_t len;
	Moat__V1__GuestRequest *req = NULL;

	moat_frame_reader_init(&r, 0);
	for (;;) {
		ssize_t n;

		if (moat_frame_reader_next(&r, &frame, &len) == MOAT_OK) {
			req =
			    moat__v1__guest_request__unpack(NULL, len, frame);
			free(frame);
			break;
		}
		n = read(fd, buf, sizeof(buf));
		if (n <= 0)
			break;
		assert_int_equal(moat_frame_reader_feed(&r, buf, (size_t)n),
		    0);
	}
	moat_frame_reader_fini(&r);
	return req;
}

struct fixture {
	int agent_fd; /* the fake agent's end */
	struct guest_link *gl;
	struct seen seen;
};

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	int sv[2];
	char *err = NULL;

	assert_non_null(f);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0,
	                     sv),
	    0);
	seen_init(&f->seen);
	f->agent_fd = sv[1];
	assert_int_equal(guest_link_open(&f->gl, sv[0], 0, &hooks, &f->seen,
	                     &err),
	    MOAT_OK);
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	guest_link_shutdown(f->gl, NULL);
	guest_link_free(f->gl);
	close(f->agent_fd);
	free(f);
	return 0;
}

/* A fake agent thread that answers one request with an ack. */
static void *
ack_one(void *arg)
{
	struct fixture *f = arg;
	Moat__V1__GuestRequest *req = recv_request(f->agent_fd);
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__Empty ack = MOAT__V1__EMPTY__INIT;

	if (req == NULL)
		return NULL;
	m.id = req->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_ACK;
	m.ack = &ack;
	send_msg(f->agent_fd, &m);
	moat__v1__guest_request__free_unpacked(req, NULL);
	return NULL;
}

static void
test_ready_and_call(void **state)
{
	struct fixture *f = *state;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestInfoRequest gi = MOAT__V1__GUEST_INFO_REQUEST__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	pthread_t t;
	char *err = NULL;

	send_ready(f->agent_fd);
	assert_int_equal(pthread_create(&t, NULL, ack_one, f), 0);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	req.info = &gi;
	assert_int_equal(guest_link_call(f->gl, &req, moat_rpc_now_ms() + 5000,
	                     &reply, &err),
	    MOAT_OK);
	assert_non_null(reply);
	assert_int_equal(reply->body_case, MOAT__V1__GUEST_MESSAGE__BODY_ACK);
	assert_int_equal(reply->id, req.id);
	moat__v1__guest_message__free_unpacked(reply, NULL);
	pthread_join(t, NULL);
	pthread_mutex_lock(&f->seen.mu);
	assert_int_equal(f->seen.ready, 1);
	assert_int_equal(f->seen.closed, 0);
	pthread_mutex_unlock(&f->seen.mu);
}

static void
test_deadline(void **state)
{
	struct fixture *f = *state;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestInfoRequest gi = MOAT__V1__GUEST_INFO_REQUEST__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	uint64_t t0 = moat_rpc_now_ms();
	char *err = NULL;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	req.info = &gi;
	assert_int_equal(guest_link_call(f->gl, &req, t0 + 200, &reply, &err),
	    MOAT_DEADLINE_EXCEEDED);
	assert_null(reply);
	assert_non_null(err);
	assert_true(moat_rpc_now_ms() - t0 >= 190);
	assert_true(moat_rpc_now_ms() - t0 < 2000);
	free(err);
	/* A late answer to the abandoned request is dropped, not fatal. */
	{
		Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
		Moat__V1__Empty ack = MOAT__V1__EMPTY__INIT;

		m.id = req.id;
		m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_ACK;
		m.ack = &ack;
		send_msg(f->agent_fd, &m);
	}
	usleep(100 * 1000);
	pthread_mutex_lock(&f->seen.mu);
	assert_int_equal(f->seen.closed, 0);
	pthread_mutex_unlock(&f->seen.mu);
}

static void
test_garbage_is_violation(void **state)
{
	struct fixture *f = *state;
	uint8_t frame[4 + 64];

	memset(frame, 0xab, sizeof(frame));
	frame[0] = frame[1] = frame[2] = 0;
	frame[3] = 64;
	frame[4] = 0x07; /* field 0, wire type 7: never valid */
	assert_int_equal(moat_frame_write_all(f->agent_fd, frame,
	                     sizeof(frame)),
	    0);
	assert_int_equal(wait_closed(&f->seen), 1);
	assert_true(f->seen.violation);
	assert_non_null(strstr(f->seen.reason, "malformed frame"));
}

static void
test_oversize_is_violation(void **state)
{
	struct fixture *f = *state;
	uint8_t hdr[4] = { 0x04, 0x00, 0x00, 0x00 }; /* 64 MiB */

	assert_int_equal(moat_frame_write_all(f->agent_fd, hdr, 4), 0);
	/* Refused by its header: nothing else is sent, and it closes. */
	assert_int_equal(wait_closed(&f->seen), 1);
	assert_true(f->seen.violation);
	assert_non_null(strstr(f->seen.reason, "over the"));
}

static void
test_unsolicited_reply_is_violation(void **state)
{
	struct fixture *f = *state;
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__Empty ack = MOAT__V1__EMPTY__INIT;

	m.id = 12345;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_ACK;
	m.ack = &ack;
	send_msg(f->agent_fd, &m);
	assert_int_equal(wait_closed(&f->seen), 1);
	assert_true(f->seen.violation);
	assert_non_null(strstr(f->seen.reason, "never sent"));
}

/* A restored guest may answer a request the snapshot's vmd sent (the
 * drain of a sandbox with a file call in flight): a link numbering
 * above the snapshot's last id drops that answer and goes on. */
static void
test_restored_stale_answer_dropped(void **state)
{
	struct fixture *f = *state;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestInfoRequest gi = MOAT__V1__GUEST_INFO_REQUEST__INIT;
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	Moat__V1__Empty ack = MOAT__V1__EMPTY__INIT;
	pthread_t t;
	char *err = NULL;

	assert_int_equal(guest_link_last_id(f->gl), 0);
	guest_link_skip_ids(f->gl, 21);
	assert_int_equal(guest_link_last_id(f->gl), 21);
	send_ready(f->agent_fd);
	m.id = 21;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_ACK;
	m.ack = &ack;
	send_msg(f->agent_fd, &m);
	assert_int_equal(pthread_create(&t, NULL, ack_one, f), 0);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	req.info = &gi;
	assert_int_equal(guest_link_call(f->gl, &req, moat_rpc_now_ms() + 5000,
	                     &reply, &err),
	    MOAT_OK);
	assert_int_equal(req.id, 22);
	assert_non_null(reply);
	assert_int_equal(reply->id, 22);
	moat__v1__guest_message__free_unpacked(reply, NULL);
	pthread_join(t, NULL);
	assert_int_equal(guest_link_last_id(f->gl), 22);
	pthread_mutex_lock(&f->seen.mu);
	assert_int_equal(f->seen.closed, 0);
	pthread_mutex_unlock(&f->seen.mu);
}

/* A pooled VM's link handed to its sandbox: from the swap on, the
 * new hooks hear the guest (AgentReady, the close) and the old ones
 * nothing more. */
static void
test_set_hooks(void **state)
{
	struct fixture *f = *state;
	struct seen other;

	seen_init(&other);
	assert_true(guest_link_set_hooks(f->gl, &hooks, &other));
	send_ready(f->agent_fd);
	close(f->agent_fd);
	f->agent_fd = -1;
	assert_int_equal(wait_closed(&other), 1);
	pthread_mutex_lock(&other.mu);
	assert_int_equal(other.ready, 1);
	assert_false(other.violation);
	pthread_mutex_unlock(&other.mu);
	pthread_mutex_lock(&f->seen.mu);
	assert_int_equal(f->seen.ready, 0);
	assert_int_equal(f->seen.closed, 0);
	pthread_mutex_unlock(&f->seen.mu);
	/* Closed: no swap any more (the old hooks were told). */
	assert_false(guest_link_set_hooks(f->gl, &hooks, &f->seen));
	guest_link_shutdown(f->gl, NULL);
}

static void
test_eof_is_not_violation(void **state)
{
	struct fixture *f = *state;

	shutdown(f->agent_fd, SHUT_RDWR);
	assert_int_equal(wait_closed(&f->seen), 1);
	assert_false(f->seen.violation);
}

/* A caller blocked in guest_link_call returns when the link is shut. */
struct call_arg {
	struct guest_link *gl;
	int rv;
};

static void *
call_forever(void *arg)
{
	struct call_arg *c = arg;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestInfoRequest gi = MOAT__V1__GUEST_INFO_REQUEST__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	char *err = NULL;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	req.info = &gi;
	c->rv = guest_link_call(c->gl, &req, moat_rpc_now_ms() + 60000, &reply,
	    &err);
	free(err);
	return NULL;
}

static void
test_shutdown_wakes_callers(void **state)
{
	struct fixture *f = *state;
	struct call_arg c = { .gl = f->gl, .rv = -1 };
	pthread_t t;
	uint64_t t0;

	assert_int_equal(pthread_create(&t, NULL, call_forever, &c), 0);
	usleep(100 * 1000);
	t0 = moat_rpc_now_ms();
	guest_link_shutdown(f->gl, "stopping");
	pthread_join(t, NULL);
	assert_int_equal(c.rv, MOAT_UNAVAILABLE);
	assert_true(moat_rpc_now_ms() - t0 < 2000);
}

/* The guest never reads: a big request cannot block past its deadline,
 * and a half-written frame closes the link. */
static void
test_guest_not_reading(void **state)
{
	struct fixture *f = *state;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestFileWrite fw = MOAT__V1__GUEST_FILE_WRITE__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	uint64_t t0 = moat_rpc_now_ms();
	char *err = NULL;
	size_t len = 3u << 20;
	uint8_t *data = calloc(1, len);

	assert_non_null(data);
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_WRITE;
	req.file_write = &fw;
	fw.path = "/x";
	fw.data.data = data;
	fw.data.len = len;
	assert_int_not_equal(guest_link_call(f->gl, &req, t0 + 300, &reply,
	                         &err),
	    MOAT_OK);
	assert_true(moat_rpc_now_ms() - t0 < 3000);
	free(err);
	free(data);
}

/* ---- exec output bookkeeping (exec.c) ---- */

static struct sandbox *
fake_sandbox(void)
{
	struct sandbox *sb = calloc(1, sizeof(*sb));

	assert_non_null(sb);
	pthread_mutex_init(&sb->mu, NULL);
	vmd_cond_init(&sb->cv);
	snprintf(sb->id.str, sizeof(sb->id.str), "sb-test");
	sb->lifecycle = SANDBOX_RUNNING;
	return sb;
}

static struct exec *
fake_exec(struct sandbox *sb, uint64_t id, uint64_t cap)
{
	struct exec *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	e->id = id;
	e->out[0].cap = e->out[1].cap = cap;
	e->next = sb->execs;
	sb->execs = e;
	sb->execs_running++;
	return e;
}

static void
send_output(int fd, uint64_t id, int stream, const void *data, size_t len)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecOutput o = MOAT__V1__EXEC_OUTPUT__INIT;

	m.id = id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT;
	m.exec_output = &o;
	o.stream = stream;
	o.data.data = (uint8_t *)data;
	o.data.len = len;
	send_msg(fd, &m);
}

static void
send_exit(int fd, uint64_t id, int code)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecExit x = MOAT__V1__EXEC_EXIT__INIT;

	m.id = id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT;
	m.exec_exit = &x;
	x.exit_code = code;
	send_msg(fd, &m);
}

/* Waits until exec `id` exited (or 5 s). */
static bool
wait_exit(struct sandbox *sb, uint64_t id)
{
	uint64_t until = moat_rpc_now_ms() + 5000;
	bool done = false;

	pthread_mutex_lock(&sb->mu);
	for (;;) {
		struct exec *e;
		for (e = sb->execs; e != NULL && e->id != id; e = e->next)
			;
		if (e != NULL && e->exited) {
			done = true;
			break;
		}
		if (vmd_cond_wait_until(&sb->cv, &sb->mu, until) != 0)
			break;
	}
	pthread_mutex_unlock(&sb->mu);
	return done;
}

static void
test_exec_output_capped(void **state)
{
	struct fixture *f = *state;
	struct sandbox *sb = fake_sandbox();
	struct exec *e = fake_exec(sb, 7, 1000);
	uint8_t chunk[600];

	f->seen.sb = sb;
	memset(chunk, 'x', sizeof(chunk));
	send_output(f->agent_fd, 7, 0, chunk, sizeof(chunk));
	send_output(f->agent_fd, 7, 0, chunk, sizeof(chunk));
	send_output(f->agent_fd, 7, 1, "err", 3);
	send_exit(f->agent_fd, 7, 3);
	assert_true(wait_exit(sb, 7));
	pthread_mutex_lock(&sb->mu);
	assert_int_equal(e->out[0].len, 1000);
	assert_true(e->out[0].truncated);
	assert_int_equal(e->stdout_bytes, 1200);
	assert_int_equal(e->out[1].len, 3);
	assert_false(e->out[1].truncated);
	assert_int_equal(e->exit_code, 3);
	assert_int_equal(sb->execs_running, 0);
	assert_int_equal(sb->execs_finished, 1);
	pthread_mutex_unlock(&sb->mu);
	assert_int_equal(f->seen.closed, 0);
	guest_link_shutdown(f->gl, NULL);
	vmd_exec_free_all(sb);
	free(sb);
}

static void
test_exec_unknown_is_violation(void **state)
{
	struct fixture *f = *state;
	struct sandbox *sb = fake_sandbox();

	f->seen.sb = sb;
	send_output(f->agent_fd, 999999, 0, "FFFF", 4);
	assert_int_equal(wait_closed(&f->seen), 1);
	assert_true(f->seen.violation);
	assert_non_null(strstr(f->seen.reason, "does not exist"));
	guest_link_shutdown(f->gl, NULL);
	vmd_exec_free_all(sb);
	free(sb);
}

static void
test_exec_flood_past_cap_is_violation(void **state)
{
	struct fixture *f = *state;
	struct sandbox *sb = fake_sandbox();
	struct exec *e = fake_exec(sb, 3, 1024);
	static uint8_t chunk[64 * 1024];
	int sent = 0;

	f->seen.sb = sb;
	/* Keep sending until vmd drops the link; it must do so soon after
	 * cap + one frame, and keep at most the cap. */
	while (sent < 200) {
		Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
		Moat__V1__ExecOutput o = MOAT__V1__EXEC_OUTPUT__INIT;
		size_t len;
		uint8_t *body, *frame;
		size_t flen;

		m.id = 3;
		m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT;
		m.exec_output = &o;
		o.data.data = chunk;
		o.data.len = sizeof(chunk);
		len = moat__v1__guest_message__get_packed_size(&m);
		body = malloc(len);
		moat__v1__guest_message__pack(&m, body);
		frame = moat_frame_encode(body, len, &flen);
		free(body);
		if (send(f->agent_fd, frame, flen, MSG_NOSIGNAL) < 0) {
			free(frame);
			break;
		}
		free(frame);
		sent++;
	}
	assert_int_equal(wait_closed(&f->seen), 1);
	assert_true(f->seen.violation);
	assert_non_null(strstr(f->seen.reason, "far past"));
	pthread_mutex_lock(&sb->mu);
	assert_true(e->out[0].len <= 1024);
	assert_true(e->out[0].alloc <= 1024);
	pthread_mutex_unlock(&sb->mu);
	guest_link_shutdown(f->gl, NULL);
	vmd_exec_free_all(sb);
	free(sb);
}

static void
test_exec_keeps_last_finished(void **state)
{
	struct fixture *f = *state;
	struct sandbox *sb = fake_sandbox();
	int n = VMD_EXEC_KEEP_FINISHED + 8;

	f->seen.sb = sb;
	for (int i = 1; i <= n; i++) {
		fake_exec(sb, (uint64_t)i, 100);
		send_output(f->agent_fd, (uint64_t)i, 0, "o", 1);
		send_exit(f->agent_fd, (uint64_t)i, 0);
		assert_true(wait_exit(sb, (uint64_t)i));
	}
	pthread_mutex_lock(&sb->mu);
	assert_int_equal(sb->execs_finished, VMD_EXEC_KEEP_FINISHED);
	for (struct exec *e = sb->execs; e != NULL; e = e->next)
		assert_true(e->id > 8);
	pthread_mutex_unlock(&sb->mu);
	/* A second exit for one exec is a violation. */
	send_exit(f->agent_fd, (uint64_t)n, 0);
	assert_int_equal(wait_closed(&f->seen), 1);
	assert_true(f->seen.violation);
	guest_link_shutdown(f->gl, NULL);
	vmd_exec_free_all(sb);
	free(sb);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ready_and_call, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_deadline, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_garbage_is_violation,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversize_is_violation,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_unsolicited_reply_is_violation, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_restored_stale_answer_dropped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_set_hooks, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_eof_is_not_violation,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_shutdown_wakes_callers,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_guest_not_reading, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_exec_output_capped, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_exec_unknown_is_violation,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_exec_flood_past_cap_is_violation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_exec_keeps_last_finished,
		    setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
