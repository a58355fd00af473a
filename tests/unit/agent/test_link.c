/*
 * test_link.c: moat-agent's guest link, black-box: AgentReady on every
 * connection, a host that sends garbage, an oversized frame header, id 0
 * or an op the agent does not know (the agent answers and lives on), a
 * host that hangs up in the middle of an exec, info, shutdown, and the
 * three hostile test modes (garbage, oversize, flood) that vmd's tests
 * rely on. Not for: what exec or file requests do (their own tests).
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

static Moat__V1__GuestMessage *
info(struct tagent *t)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestInfoRequest ir = MOAT__V1__GUEST_INFO_REQUEST__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	req.info = &ir;
	return tagent_call(t, &req);
}

static void
expect_alive(struct tagent *t)
{
	Moat__V1__GuestMessage *m = info(t);

	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->body_case, MOAT__V1__GUEST_MESSAGE__BODY_INFO);
	moat__v1__guest_message__free_unpacked(m, NULL);
}

static void
test_ready(void **state)
{
	struct tagent *t = *state;

	assert_non_null(t->ready);
	assert_string_equal(t->ready->agent_version, MOAT_VERSION);
	assert_true(strlen(t->ready->kernel) > 0);
}

static void
test_info(void **state)
{
	Moat__V1__GuestMessage *m = info(*state);

	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	assert_true(m->info->uptime_ms > 0);
	assert_true(m->info->mem_total_kib > 0);
	assert_true(m->info->mem_available_kib <= m->info->mem_total_kib);
	assert_true(m->info->disk_total_kib > 0);
	assert_true(m->info->ncpu > 0);
	assert_true(m->info->processes > 0);
	assert_true(m->info->load1 >= 0);
	assert_non_null(strstr(m->info->kernel, "Linux"));
	assert_string_equal(m->info->agent_version, MOAT_VERSION);
	moat__v1__guest_message__free_unpacked(m, NULL);
}

static void
test_garbage_from_host(void **state)
{
	struct tagent *t = *state;
	uint8_t frame[4 + 300];
	Moat__V1__GuestMessage *m;
	size_t i;

	frame[0] = frame[1] = 0;
	frame[2] = 300 >> 8;
	frame[3] = 300 & 0xff;
	for (i = 4; i < sizeof(frame); i++)
		frame[i] = (uint8_t)(i * 37 + 11);
	frame[4] = 0x07; /* field 0, wire type 7: never valid */
	assert_int_equal(tagent_send_raw(t, frame, sizeof(frame)), 0);
	m = tagent_recv(t);
	assert_non_null(m);
	assert_int_equal(m->id, 0);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(m->message, "GuestRequest"));
	moat__v1__guest_message__free_unpacked(m, NULL);
	/* an empty frame is a valid, empty GuestRequest: id 0 */
	assert_int_equal(tagent_send_raw(t, "\0\0\0\0", 4), 0);
	m = tagent_recv(t);
	assert_non_null(m);
	assert_int_equal(m->id, 0);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	moat__v1__guest_message__free_unpacked(m, NULL);
	expect_alive(t);
}

static void
test_id_zero_and_unknown_op(void **state)
{
	struct tagent *t = *state;
	/* GuestRequest{info {}} with no id */
	static const uint8_t no_id[] = { 0, 0, 0, 3, 0x9a, 0x01, 0x00 };
	/* GuestRequest{id 7, field 45 (a future op) {}} */
	static const uint8_t future[] = { 0, 0, 0, 5, 0x08, 0x07, 0xea, 0x02,
		0x00 };
	Moat__V1__GuestMessage *m;

	assert_int_equal(tagent_send_raw(t, no_id, sizeof(no_id)), 0);
	m = tagent_recv(t);
	assert_non_null(m);
	assert_int_equal(m->id, 0);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	moat__v1__guest_message__free_unpacked(m, NULL);

	assert_int_equal(tagent_send_raw(t, future, sizeof(future)), 0);
	m = tagent_recv(t);
	assert_non_null(m);
	assert_int_equal(m->id, 7);
	assert_int_equal(m->code, MOAT_UNIMPLEMENTED);
	moat__v1__guest_message__free_unpacked(m, NULL);
	expect_alive(t);
}

static void
test_oversize_from_host(void **state)
{
	struct tagent *t = *state;
	static const uint8_t header[] = { 0x7f, 0xff, 0xff, 0xff, 1, 2, 3 };
	Moat__V1__GuestMessage *m;

	assert_int_equal(tagent_send_raw(t, header, sizeof(header)), 0);
	m = tagent_recv(t);
	assert_non_null(m);
	assert_int_equal(m->id, 0);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(m->message, "cap"));
	moat__v1__guest_message__free_unpacked(m, NULL);
	/* the stream is out of step: the agent hung up ... */
	assert_null(tagent_recv_frame(t, &(size_t){ 0 }));
	/* ... and serves the next connection */
	assert_int_equal(tagent_connect(t), 0);
	expect_alive(t);
}

static void
test_hang_up_mid_exec(void **state)
{
	struct tagent *t = *state;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestMessage *m;
	struct texec r;
	pid_t pid;

	es.shell = "while :; do echo spam; done";
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	pid = m->exec_started->pid;
	moat__v1__guest_message__free_unpacked(m, NULL);
	tagent_disconnect(t);
	/* its host gone, the exec is killed, group and all */
	assert_true(tagent_wait_group_gone(pid));
	assert_int_equal(tagent_connect(t), 0);
	/* the old exec's events are not for this host; requests work */
	memset(&es, 0, sizeof(es));
	moat__v1__exec_start__init(&es);
	es.shell = "echo fine";
	assert_int_equal(tagent_exec(t, &es, 0, &r), 0);
	assert_string_equal((char *)r.out[0], "fine\n");
	texec_free(&r);
}

static struct tagent fresh;

/* a fresh agent, in a test mode or not */
static int
start_mode(void **state, const char *mode)
{
	const char *extra[] = { "--test-mode", mode, NULL };

	if (tagent_start(&fresh, mode ? extra : NULL, false) != 0)
		return -1;
	*state = &fresh;
	return 0;
}

static int
start_plain(void **state)
{
	return start_mode(state, NULL);
}

static int
start_garbage(void **state)
{
	return start_mode(state, "garbage");
}

static int
start_oversize(void **state)
{
	return start_mode(state, "oversize");
}

static int
start_flood(void **state)
{
	return start_mode(state, "flood");
}

static int
stop_fresh(void **state)
{
	tagent_stop(*state);
	return 0;
}

static void
test_mode_garbage(void **state)
{
	struct tagent *t = *state;
	int i;

	for (i = 0; i < 8; i++) {
		size_t len;
		uint8_t *f = tagent_recv_frame(t, &len);
		Moat__V1__GuestMessage *m;

		assert_non_null(f);
		assert_true(len > 0 && len < MOAT_FRAME_MAX);
		m = moat__v1__guest_message__unpack(NULL, len, f);
		assert_null(m);
		free(f);
	}
	expect_alive(t);
}

static void
test_mode_oversize(void **state)
{
	struct tagent *t = *state;
	uint8_t *f;
	size_t len;

	/* the reader refuses the header by itself: no frame comes out */
	f = tagent_recv_frame(t, &len);
	assert_null(f);
	assert_true(t->reader.len >= 4);
	assert_int_equal(t->reader.buf[0], 0x04);
	assert_int_equal(t->reader.buf[1], 0);
	assert_int_equal(t->reader.buf[2], 0);
	assert_int_equal(t->reader.buf[3], 0);
	assert_int_equal(moat_frame_reader_next(&t->reader, &f, &len),
	    MOAT_OUT_OF_RANGE);
}

/* expect_alive_among_flood: an info reply arrives among flood events. */
static void
expect_alive_among_flood(struct tagent *t)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestInfoRequest ir = MOAT__V1__GUEST_INFO_REQUEST__INIT;
	Moat__V1__GuestMessage *m;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_INFO;
	req.info = &ir;
	assert_int_equal(tagent_send(t, &req), 0);
	while ((m = tagent_recv(t)) != NULL && m->id == 999999)
		moat__v1__guest_message__free_unpacked(m, NULL);
	assert_non_null(m);
	assert_int_equal(m->id, req.id);
	assert_int_equal(m->body_case, MOAT__V1__GUEST_MESSAGE__BODY_INFO);
	moat__v1__guest_message__free_unpacked(m, NULL);
}

static void
test_mode_flood(void **state)
{
	struct tagent *t = *state;
	int i;

	for (i = 0; i < 64; i++) {
		Moat__V1__GuestMessage *m = tagent_recv(t);

		assert_non_null(m);
		assert_int_equal(m->id, 999999);
		assert_int_equal(m->body_case,
		    MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	/* and it still answers in between */
	expect_alive_among_flood(t);
}

static void
test_shutdown(void **state)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ShutdownRequest sr = MOAT__V1__SHUTDOWN_REQUEST__INIT;
	Moat__V1__GuestMessage *m;
	struct tagent *t = *state;
	struct timespec ts = { 0, 10000000 };
	struct stat st;
	int i, status = -1;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_SHUTDOWN;
	req.shutdown = &sr;
	m = tagent_call(t, &req);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->body_case, MOAT__V1__GUEST_MESSAGE__BODY_ACK);
	moat__v1__guest_message__free_unpacked(m, NULL);
	/* it exits by itself, with 0 (bounded wait, not a timing check) */
	for (i = 0; i < 6000; i++) {
		if (waitpid(t->pid, &status, WNOHANG) == t->pid)
			break;
		nanosleep(&ts, NULL);
	}
	assert_true(i < 6000);
	t->pid = 0;
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_not_equal(stat(t->sock, &st), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ready),
		cmocka_unit_test(test_info),
		cmocka_unit_test(test_garbage_from_host),
		cmocka_unit_test(test_id_zero_and_unknown_op),
		cmocka_unit_test(test_oversize_from_host),
		cmocka_unit_test(test_hang_up_mid_exec),
		cmocka_unit_test_setup_teardown(test_mode_garbage,
		    start_garbage, stop_fresh),
		cmocka_unit_test_setup_teardown(test_mode_oversize,
		    start_oversize, stop_fresh),
		cmocka_unit_test_setup_teardown(test_mode_flood, start_flood,
		    stop_fresh),
		cmocka_unit_test_setup_teardown(test_shutdown, start_plain,
		    stop_fresh),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
