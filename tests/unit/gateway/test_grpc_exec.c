/*
 * test_grpc_exec.c: Gateway.ExecStream on the gRPC door (gateway/grpc.c)
 * with the tests' libnghttp2 client (grpc_client.h), in front of a
 * gateway in process (auth off)
 * and a fake vmd node (fake_node.c), whose exec 7 prints "hello\n" and
 * "oops\n" and exits 3 and whose exec 8 ("sleep") never ends. The events
 * come in order with grpc-status 0; a stream past its grpc-timeout ends
 * DEADLINE_EXCEEDED and its process is killed; a stream the client
 * resets is killed too; more streams waiting at once than the door has
 * workers leave a unary call on another connection answered (a stream
 * holds no worker between its polls); 40 unary Execs the node holds
 * leave a GetSandbox answered (a waiting call holds no worker); a door
 * stopped while a stream's process runs kills it first. Attach: start,
 * stdin, resize and close_stdin reach the node in order (held until
 * ExecStart answered), its events are ExecStream's, a first input that
 * is not start or a second start is INVALID_ARGUMENT, a reset stream
 * kills.
 * Not for: the pure pieces (test_grpc_stream) or a real VM
 * (tests/integration/grpc/stream_test.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>
#include <nghttp2/nghttp2.h>

#include "fake_node.h"
#include "gateway.h"
#include "gateway.pb-c.h"
#include "grpc.h"
#include "grpc_client.h"
#include "sessiond_proc.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "vm.pb-c.h"

#define STREAMS (MOAT_GRPC_WORKERS + 4)
#define UNARY_EXECS 40 /* more than the workers, under a conn's streams */

static struct {
	char dir[64];
	struct moat_gateway *gw;
	struct moat_grpc *grpc;
	struct fake_node a;
	uint16_t port;
	pid_t sessiond;
	char sandbox[128];
} E;

/* event: the i-th ExecEvent of the stream's data (the caller frees). */
static Moat__V1__ExecEvent *
event(const struct grpc_stream *st, int i)
{
	size_t off = 0, len;

	for (;;) {
		assert_true(off + MOAT_GRPC_PREFIX <= st->data_len);
		len = (size_t)st->data[off + 1] << 24 |
		    (size_t)st->data[off + 2] << 16 |
		    (size_t)st->data[off + 3] << 8 | st->data[off + 4];
		assert_true(off + MOAT_GRPC_PREFIX + len <= st->data_len);
		if (i-- == 0)
			return moat__v1__exec_event__unpack(NULL, len,
			    st->data + off + MOAT_GRPC_PREFIX);
		off += MOAT_GRPC_PREFIX + len;
	}
}

static int
n_events(const struct grpc_stream *st)
{
	size_t off = 0;
	int n = 0;

	while (off + MOAT_GRPC_PREFIX <= st->data_len) {
		off += MOAT_GRPC_PREFIX +
		    ((size_t)st->data[off + 1] << 24 |
		        (size_t)st->data[off + 2] << 16 |
		        (size_t)st->data[off + 3] << 8 | st->data[off + 4]);
		n++;
	}
	return n;
}

static void
last_method(char *m, size_t size)
{
	pthread_mutex_lock(&E.a.lock);
	snprintf(m, size, "%s", E.a.last_method);
	pthread_mutex_unlock(&E.a.lock);
}

/* wait_method: waits (bounded) until the node's last call is `want`. */
static void
wait_method(const char *want)
{
	char m[64] = "";

	for (int i = 0; i < 3000; i++) {
		last_method(m, sizeof(m));
		if (strcmp(m, want) == 0)
			return;
		usleep(10000);
	}
	fail_msg("the node's last call is %s, not %s", m, want);
}

static void
exec_request(Moat__V1__ExecRequest *rq, char **argv, size_t argc)
{
	moat__v1__exec_request__init(rq);
	rq->sandbox_id = E.sandbox;
	rq->argv = argv;
	rq->n_argv = argc;
}

static void
test_events(void **state)
{
	char *argv[] = { "echo", "hello" };
	Moat__V1__ExecRequest rq;
	Moat__V1__ExecEvent *ev;
	struct grpc_client c;
	struct grpc_stream st;
	char m[64];

	(void)state;
	exec_request(&rq, argv, 2);
	grpc_client_open(&c, E.port);
	grpc_client_call(&c, &st, "/moat.v1.Gateway/ExecStream", NULL,
	    (ProtobufCMessage *)&rq);
	grpc_client_until(&c, &st, grpc_stream_closed);
	grpc_client_close(&c);
	if (st.grpc_status != 0)
		fail_msg("status %d: %s", st.grpc_status, st.message);
	assert_int_equal(n_events(&st), 4);
	ev = event(&st, 0);
	assert_int_equal(ev->event_case, MOAT__V1__EXEC_EVENT__EVENT_STARTED);
	assert_int_equal(ev->started->exec_id, 7);
	moat__v1__exec_event__free_unpacked(ev, NULL);
	ev = event(&st, 1);
	assert_int_equal(ev->event_case, MOAT__V1__EXEC_EVENT__EVENT_STDOUT);
	assert_memory_equal(ev->stdout.data, "hello\n", 6);
	moat__v1__exec_event__free_unpacked(ev, NULL);
	ev = event(&st, 2);
	assert_int_equal(ev->event_case, MOAT__V1__EXEC_EVENT__EVENT_STDERR);
	assert_memory_equal(ev->stderr.data, "oops\n", 5);
	moat__v1__exec_event__free_unpacked(ev, NULL);
	ev = event(&st, 3);
	assert_int_equal(ev->event_case, MOAT__V1__EXEC_EVENT__EVENT_EXIT);
	assert_true(ev->exit->exited);
	assert_int_equal(ev->exit->exit_code, 3);
	moat__v1__exec_event__free_unpacked(ev, NULL);
	/* It exited: nothing was killed. */
	last_method(m, sizeof(m));
	assert_string_equal(m, "ExecRead");
}

static void
test_errors(void **state)
{
	char *argv[] = { "true" };
	Moat__V1__ExecRequest rq;
	struct grpc_client c;
	struct grpc_stream st;

	(void)state;
	exec_request(&rq, argv, 1);
	rq.sandbox_id = "sb-never";
	grpc_client_open(&c, E.port);
	grpc_client_call(&c, &st, "/moat.v1.Gateway/ExecStream", NULL,
	    (ProtobufCMessage *)&rq);
	grpc_client_until(&c, &st, grpc_stream_closed);
	/* Trailers-Only, no message. */
	assert_int_equal(st.grpc_status, MOAT_NOT_FOUND);
	assert_int_equal(st.data_len, 0);
	assert_non_null(strstr(st.message, "sb-never"));
	grpc_client_close(&c);
}

static void
test_deadline(void **state)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;
	struct grpc_client c;
	struct grpc_stream st;

	(void)state;
	exec_request(&rq, argv, 2);
	grpc_client_open(&c, E.port);
	grpc_client_call(&c, &st, "/moat.v1.Gateway/ExecStream", "300m",
	    (ProtobufCMessage *)&rq);
	grpc_client_until(&c, &st, grpc_stream_closed);
	grpc_client_close(&c);
	assert_int_equal(st.grpc_status, MOAT_DEADLINE_EXCEEDED);
	assert_int_equal(n_events(&st), 1); /* started */
	wait_method("ExecKill");
}

/* sleeping_stream: an ExecStream of a process that never ends on a new
 * connection c, once it is started and polled. */
static void
sleeping_stream(struct grpc_client *c, struct grpc_stream *st)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;

	exec_request(&rq, argv, 2);
	grpc_client_open(c, E.port);
	grpc_client_call(c, st, "/moat.v1.Gateway/ExecStream", NULL,
	    (ProtobufCMessage *)&rq);
	grpc_client_until(c, st, grpc_stream_has_data);
	assert_false(st->closed);
	wait_method("ExecRead"); /* polling */
}

/* cancel_kills: the client resets st, and the node sees its process
 * killed; c is closed. */
static void
cancel_kills(struct grpc_client *c, struct grpc_stream *st)
{
	assert_int_equal(nghttp2_submit_rst_stream(c->s, NGHTTP2_FLAG_NONE,
	                     st->id, NGHTTP2_CANCEL),
	    0);
	assert_int_equal(nghttp2_session_send(c->s), 0);
	wait_method("ExecKill");
	grpc_client_close(c);
}

static void
test_cancel(void **state)
{
	struct grpc_client c;
	struct grpc_stream st;

	(void)state;
	sleeping_stream(&c, &st);
	cancel_kills(&c, &st);
}

static void
test_workers_free(void **state)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;
	Moat__V1__ListSandboxesRequest lq =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	static struct grpc_stream st[STREAMS];
	struct grpc_stream one;
	struct grpc_client c, d;

	(void)state;
	exec_request(&rq, argv, 2);
	grpc_client_open(&c, E.port);
	for (int i = 0; i < STREAMS; i++) {
		grpc_client_call(&c, &st[i], "/moat.v1.Gateway/ExecStream",
		    NULL, (ProtobufCMessage *)&rq);
		grpc_client_until(&c, &st[i], grpc_stream_has_data);
		if (st[i].closed)
			fail_msg("stream %d: %d %s", i, st[i].grpc_status,
			    st[i].message);
	}
	/* More streams waiting than workers: a call still runs. */
	grpc_client_open(&d, E.port);
	grpc_client_call(&d, &one, "/moat.v1.Gateway/ListSandboxes", NULL,
	    (ProtobufCMessage *)&lq);
	grpc_client_until(&d, &one, grpc_stream_closed);
	assert_int_equal(one.grpc_status, 0);
	grpc_client_close(&d);
	grpc_client_close(&c); /* every stream gone: killed */
	wait_method("ExecKill");
}

/* More unary Execs waiting on the node than the door has workers: a
 * GetSandbox on another connection is answered while every one of
 * them is still held (a waiting call holds no worker), then they all
 * answer once the node lets them go. */
static void
test_unary_exec_no_worker(void **state)
{
	char *argv[] = { "hold", "4" };
	Moat__V1__ExecRequest rq;
	Moat__V1__SandboxRef gq = MOAT__V1__SANDBOX_REF__INIT;
	static struct grpc_stream st[UNARY_EXECS];
	struct grpc_stream one;
	struct grpc_client c, d;
	int i, held = 0;

	(void)state;
	exec_request(&rq, argv, 2);
	grpc_client_open(&c, E.port);
	for (i = 0; i < UNARY_EXECS; i++)
		grpc_client_call(&c, &st[i], "/moat.v1.Gateway/Exec", NULL,
		    (ProtobufCMessage *)&rq);
	/* Bounded: with blocking workers only 16 ever reach the node. */
	for (i = 0; i < 3000 && held < UNARY_EXECS; i++) {
		held = fake_node_held(&E.a);
		usleep(10000);
	}
	assert_int_equal(held, UNARY_EXECS);
	gq.sandbox_id = E.sandbox;
	grpc_client_open(&d, E.port);
	grpc_client_call(&d, &one, "/moat.v1.Gateway/GetSandbox", NULL,
	    (ProtobufCMessage *)&gq);
	grpc_client_until(&d, &one, grpc_stream_closed);
	grpc_client_close(&d);
	if (one.grpc_status != 0)
		fail_msg("GetSandbox: %d %s", one.grpc_status, one.message);
	/* Every Exec still waits: none was answered before the node. */
	assert_int_equal(fake_node_held(&E.a), UNARY_EXECS);
	for (i = 0; i < UNARY_EXECS; i++)
		assert_false(st[i].closed);
	fake_node_release_held(&E.a);
	for (i = 0; i < UNARY_EXECS; i++) {
		Moat__V1__ExecResult *r;

		while (!st[i].closed)
			grpc_client_pump(&c);
		if (st[i].grpc_status != 0)
			fail_msg("Exec %d: %d %s", i, st[i].grpc_status,
			    st[i].message);
		r = moat__v1__exec_result__unpack(NULL,
		    st[i].data_len - MOAT_GRPC_PREFIX,
		    st[i].data + MOAT_GRPC_PREFIX);
		assert_non_null(r);
		assert_int_equal(r->status->exit_code, 4);
		moat__v1__exec_result__free_unpacked(r, NULL);
	}
	grpc_client_close(&c);
}

/* The door stops while an ExecStream's process runs: the process is
 * killed before the door is gone (then a new door serves on). */
static void
test_stop_kills(void **state)
{
	struct grpc_client c;
	struct grpc_stream st;
	char m[64], *errmsg = NULL;

	(void)state;
	sleeping_stream(&c, &st);
	moat_grpc_stop(E.grpc);
	E.grpc = NULL;
	last_method(m, sizeof(m));
	assert_string_equal(m, "ExecKill");
	grpc_client_close(&c);
	if (moat_grpc_start(&E.grpc, E.gw, "127.0.0.1:0", 0, 0, &errmsg) !=
	    MOAT_OK)
		fail_msg("grpc: %s", errmsg);
	E.port = moat_grpc_port(E.grpc);
}

/* create_sandbox: CreateSandbox through the door; false while the
 * gateway knows no node yet. */
/* attach_frame: appends AttachInput `ai`, length-prefixed, to buf (of
 * `cap` bytes, *len used). */
static void
attach_frame(uint8_t *buf, size_t cap, size_t *len,
    const Moat__V1__AttachInput *ai)
{
	size_t n = moat__v1__attach_input__get_packed_size(ai);

	assert_true(*len + MOAT_GRPC_PREFIX + n <= cap);
	moat_grpc_frame_header(buf + *len, (uint32_t)n);
	moat__v1__attach_input__pack(ai, buf + *len + MOAT_GRPC_PREFIX);
	*len += MOAT_GRPC_PREFIX + n;
}

/* attach_start: an AttachInput starting `rq`. */
static Moat__V1__AttachInput
attach_start(Moat__V1__ExecRequest *rq)
{
	Moat__V1__AttachInput ai = MOAT__V1__ATTACH_INPUT__INIT;

	ai.input_case = MOAT__V1__ATTACH_INPUT__INPUT_START;
	ai.start = rq;
	return ai;
}

static void
exec_log_clear(void)
{
	pthread_mutex_lock(&E.a.lock);
	E.a.exec_log[0] = '\0';
	pthread_mutex_unlock(&E.a.lock);
}

/* wait_exec_log: waits (bounded) until the node's exec log ends with
 * `tail`; the whole log then. */
static void
wait_exec_log(const char *tail, char *log, size_t size)
{
	size_t n, t = strlen(tail);

	for (int i = 0; i < 3000; i++) {
		pthread_mutex_lock(&E.a.lock);
		snprintf(log, size, "%s", E.a.exec_log);
		pthread_mutex_unlock(&E.a.lock);
		n = strlen(log);
		if (n >= t && strcmp(log + n - t, tail) == 0)
			return;
		usleep(10000);
	}
	fail_msg("the node's exec log is \"%s\", not ending \"%s\"", log,
	    tail);
}

/* test_attach: start (a pty), stdin, resize, close_stdin in one go
 * reach the node in that order, the inputs held until ExecStart
 * answered; the started event comes; a reset stream kills. */
static void
test_attach(void **state)
{
	char *argv[] = { "sleep", "100" }, log[256];
	Moat__V1__ExecRequest rq;
	Moat__V1__AttachInput ai[4] = { MOAT__V1__ATTACH_INPUT__INIT,
		MOAT__V1__ATTACH_INPUT__INIT, MOAT__V1__ATTACH_INPUT__INIT,
		MOAT__V1__ATTACH_INPUT__INIT };
	Moat__V1__TerminalSize ts = MOAT__V1__TERMINAL_SIZE__INIT;
	Moat__V1__ExecEvent *ev;
	uint8_t body[512];
	size_t len = 0;
	struct grpc_client c;
	struct grpc_stream st;

	(void)state;
	exec_request(&rq, argv, 2);
	rq.pty = true;
	rq.rows = 24;
	rq.cols = 80;
	ai[0] = attach_start(&rq);
	ai[1].input_case = MOAT__V1__ATTACH_INPUT__INPUT_STDIN;
	ai[1].stdin.data = (uint8_t *)"abc";
	ai[1].stdin.len = 3;
	ts.rows = 30;
	ts.cols = 100;
	ai[2].input_case = MOAT__V1__ATTACH_INPUT__INPUT_RESIZE;
	ai[2].resize = &ts;
	ai[3].input_case = MOAT__V1__ATTACH_INPUT__INPUT_CLOSE_STDIN;
	ai[3].close_stdin = true;
	for (int i = 0; i < 4; i++)
		attach_frame(body, sizeof(body), &len, &ai[i]);
	exec_log_clear();
	grpc_client_open(&c, E.port);
	grpc_client_request(&c, &st, "POST", "/moat.v1.Gateway/Attach", NULL,
	    body, len);
	grpc_client_until(&c, &st, grpc_stream_has_data);
	assert_false(st.closed);
	ev = event(&st, 0);
	assert_non_null(ev);
	assert_int_equal(ev->event_case, MOAT__V1__EXEC_EVENT__EVENT_STARTED);
	assert_int_equal(ev->started->exec_id, 8);
	moat__v1__exec_event__free_unpacked(ev, NULL);
	wait_exec_log("close ", log, sizeof(log));
	assert_string_equal(log,
	    "start(pty) write(abc) resize(30x100) close ");
	cancel_kills(&c, &st);
}

/* test_attach_large: an AttachInput far larger than HTTP/2's default
 * window (64 KiB) gets through: the door raised the stream's window. */
static void
test_attach_large(void **state)
{
	char *argv[] = { "sleep", "100" }, log[256];
	Moat__V1__ExecRequest rq;
	Moat__V1__AttachInput ai[2] = { MOAT__V1__ATTACH_INPUT__INIT,
		MOAT__V1__ATTACH_INPUT__INIT };
	size_t cap = 400 << 10, len = 0;
	uint8_t *body = malloc(cap), *big = calloc(1, 300 << 10);
	struct grpc_client c;
	struct grpc_stream st;

	(void)state;
	assert_non_null(body);
	assert_non_null(big);
	exec_request(&rq, argv, 2);
	ai[0] = attach_start(&rq);
	attach_frame(body, cap, &len, &ai[0]);
	ai[1].input_case = MOAT__V1__ATTACH_INPUT__INPUT_STDIN;
	ai[1].stdin.data = big;
	ai[1].stdin.len = 300 << 10;
	attach_frame(body, cap, &len, &ai[1]);
	exec_log_clear();
	grpc_client_open(&c, E.port);
	grpc_client_request(&c, &st, "POST", "/moat.v1.Gateway/Attach", NULL,
	    body, len);
	/* The client sends as the door's window lets it. */
	for (int i = 0; i < 3000 && st.body_off < st.body_len; i++)
		grpc_client_pump(&c);
	wait_exec_log("close ", log, sizeof(log));
	assert_string_equal(log, "start(pipes) write(307200 bytes) close ");
	cancel_kills(&c, &st);
	free(body);
	free(big);
}

/* test_attach_events: ExecStream's events and status; the client's end
 * closes stdin. */
static void
test_attach_events(void **state)
{
	char *argv[] = { "echo", "hello" }, log[256];
	Moat__V1__ExecRequest rq;
	Moat__V1__AttachInput ai;
	Moat__V1__ExecEvent *ev;
	uint8_t body[256];
	size_t len = 0;
	struct grpc_client c;
	struct grpc_stream st;

	(void)state;
	exec_request(&rq, argv, 2);
	ai = attach_start(&rq);
	attach_frame(body, sizeof(body), &len, &ai);
	exec_log_clear();
	grpc_client_open(&c, E.port);
	grpc_client_request(&c, &st, "POST", "/moat.v1.Gateway/Attach", NULL,
	    body, len);
	grpc_client_until(&c, &st, grpc_stream_closed);
	grpc_client_close(&c);
	assert_int_equal(st.grpc_status, 0);
	assert_int_equal(n_events(&st), 4);
	ev = event(&st, 3);
	assert_int_equal(ev->event_case, MOAT__V1__EXEC_EVENT__EVENT_EXIT);
	assert_int_equal(ev->exit->exit_code, 3);
	moat__v1__exec_event__free_unpacked(ev, NULL);
	/* The process may exit before its stdin closes (then no close). */
	pthread_mutex_lock(&E.a.lock);
	snprintf(log, sizeof(log), "%s", E.a.exec_log);
	pthread_mutex_unlock(&E.a.lock);
	assert_true(strcmp(log, "start(pipes) ") == 0 ||
	    strcmp(log, "start(pipes) close ") == 0);
}

/* test_attach_start_first: a first input that is not start, and a
 * second start, are INVALID_ARGUMENT. */
static void
test_attach_start_first(void **state)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;
	Moat__V1__AttachInput ai = MOAT__V1__ATTACH_INPUT__INIT;
	uint8_t body[256];
	size_t len = 0;
	struct grpc_client c;
	struct grpc_stream st;

	(void)state;
	ai.input_case = MOAT__V1__ATTACH_INPUT__INPUT_STDIN;
	ai.stdin.data = (uint8_t *)"abc";
	ai.stdin.len = 3;
	attach_frame(body, sizeof(body), &len, &ai);
	exec_log_clear();
	grpc_client_open(&c, E.port);
	grpc_client_request(&c, &st, "POST", "/moat.v1.Gateway/Attach", NULL,
	    body, len);
	grpc_client_until(&c, &st, grpc_stream_closed);
	assert_int_equal(st.grpc_status, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "send start first"));
	pthread_mutex_lock(&E.a.lock);
	assert_true(E.a.exec_log[0] == '\0'); /* no ExecStart */
	pthread_mutex_unlock(&E.a.lock);

	exec_request(&rq, argv, 2);
	len = 0;
	ai = attach_start(&rq);
	attach_frame(body, sizeof(body), &len, &ai);
	attach_frame(body, sizeof(body), &len, &ai);
	grpc_client_request(&c, &st, "POST", "/moat.v1.Gateway/Attach", NULL,
	    body, len);
	grpc_client_until(&c, &st, grpc_stream_closed);
	assert_int_equal(st.grpc_status, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(st.message, "already"));
	wait_method("ExecKill");
	grpc_client_close(&c);
}

static bool
create_sandbox(void)
{
	Moat__V1__CreateSandboxRequest rq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb;
	struct grpc_client c;
	struct grpc_stream st;

	grpc_client_open(&c, E.port);
	grpc_client_call(&c, &st, "/moat.v1.Gateway/CreateSandbox", NULL,
	    (ProtobufCMessage *)&rq);
	grpc_client_until(&c, &st, grpc_stream_closed);
	grpc_client_close(&c);
	if (st.grpc_status != 0)
		return false;
	sb = moat__v1__sandbox__unpack(NULL, st.data_len - MOAT_GRPC_PREFIX,
	    st.data + MOAT_GRPC_PREFIX);
	assert_non_null(sb);
	snprintf(E.sandbox, sizeof(E.sandbox), "%s", sb->id);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	return true;
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL, *urls[4];

	(void)state;
	moat_log_init("test", MOAT_LOG_WARN);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-grpc-exec-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	urls[0] = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	urls[1] = moat_asprintf("ipc://%s/survey.sock", E.dir);
	urls[2] = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	urls[3] = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	opts.listen_url = urls[0];
	opts.survey_url = urls[1];
	opts.sessiond_url = urls[2];
	opts.snapd_url = urls[3];
	opts.state_dir = E.dir;
	/* ExecStart asks sessiond whether the sandbox is recorded. */
	E.sessiond = test_sessiond_start(SESSIOND_BIN, E.dir);
	/* The fake node answers ExecRead at once (no long poll) under its
	 * one lock: 20 streams polling slow its survey answers, so the
	 * gateway is given time before it thinks the node gone. */
	opts.survey_interval_ms = 1000;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	if (moat_grpc_start(&E.grpc, E.gw, "127.0.0.1:0", 0, 0, &errmsg) !=
	    MOAT_OK)
		fail_msg("grpc: %s", errmsg);
	E.port = moat_grpc_port(E.grpc);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, urls[1]), 0);
	for (int i = 0; i < 4; i++)
		free(urls[i]);
	/* The node is known once a CreateSandbox lands on it. */
	for (int i = 0; i < 500 && !create_sandbox(); i++)
		usleep(20000);
	assert_true(E.sandbox[0] != '\0');
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	moat_grpc_stop(E.grpc);
	fake_node_halt(&E.a);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	test_sessiond_stop(E.sessiond);
	moat_rm_rf(E.dir);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_events),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_deadline),
		cmocka_unit_test(test_cancel),
		cmocka_unit_test(test_workers_free),
		cmocka_unit_test(test_unary_exec_no_worker),
		cmocka_unit_test(test_attach),
		cmocka_unit_test(test_attach_large),
		cmocka_unit_test(test_attach_events),
		cmocka_unit_test(test_attach_start_first),
		cmocka_unit_test(test_stop_kills),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
