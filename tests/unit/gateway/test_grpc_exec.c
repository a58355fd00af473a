/*
 * test_grpc_exec.c: Gateway.ExecStream on the gRPC door (gateway/grpc.c)
 * with libnghttp2's client, in front of a gateway in process (auth off)
 * and a fake vmd node (fake_node.c), whose exec 7 prints "hello\n" and
 * "oops\n" and exits 3 and whose exec 8 ("sleep") never ends. The events
 * come in order with grpc-status 0; a stream past its grpc-timeout ends
 * DEADLINE_EXCEEDED and its process is killed; a stream the client
 * resets is killed too; more streams waiting at once than the door has
 * workers leave a unary call on another connection answered (a stream
 * holds no worker between its polls); 40 unary Execs the node holds
 * leave a GetSandbox answered (a waiting call holds no worker); a door
 * stopped while a stream's process runs kills it first.
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
	char sandbox[128];
} E;

/* One stream as the client sees it. */
struct stream {
	int32_t id;
	int grpc_status; /* -1: none yet */
	char message[256];
	uint8_t data[8192];
	size_t data_len;
	bool closed;
	uint8_t body[512];
	size_t body_len, body_off;
};

struct client {
	int fd;
	nghttp2_session *s;
};

static ssize_t
c_send(nghttp2_session *s, const uint8_t *d, size_t n, int fl, void *ud)
{
	struct client *c = ud;

	(void)s;
	(void)fl;
	return send(c->fd, d, n, MSG_NOSIGNAL);
}

static int
c_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
    size_t nl, const uint8_t *v, size_t vl, uint8_t fl, void *ud)
{
	struct stream *st =
	    nghttp2_session_get_stream_user_data(s, f->hd.stream_id);

	(void)fl;
	(void)ud;
	if (st == NULL)
		return 0;
	if (nl == 11 && memcmp(name, "grpc-status", 11) == 0)
		st->grpc_status = atoi((const char *)v);
	if (nl == 12 && memcmp(name, "grpc-message", 12) == 0 &&
	    vl < sizeof(st->message))
		memcpy(st->message, v, vl);
	return 0;
}

static int
c_data(nghttp2_session *s, uint8_t fl, int32_t id, const uint8_t *d, size_t n,
    void *ud)
{
	struct stream *st = nghttp2_session_get_stream_user_data(s, id);

	(void)fl;
	(void)ud;
	if (st != NULL && st->data_len + n <= sizeof(st->data)) {
		memcpy(st->data + st->data_len, d, n);
		st->data_len += n;
	}
	return 0;
}

static int
c_close(nghttp2_session *s, int32_t id, uint32_t err, void *ud)
{
	struct stream *st = nghttp2_session_get_stream_user_data(s, id);

	(void)err;
	(void)ud;
	if (st != NULL)
		st->closed = true;
	return 0;
}

static ssize_t
c_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct stream *st = src->ptr;
	size_t n = st->body_len - st->body_off;

	(void)s;
	(void)id;
	(void)ud;
	if (n > len)
		n = len;
	memcpy(buf, st->body + st->body_off, n);
	st->body_off += n;
	if (st->body_off == st->body_len)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

static void
client_open(struct client *c)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct timeval tv = { .tv_sec = 60 };
	nghttp2_session_callbacks *cbs;

	c->fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(c->fd >= 0);
	/* A door that never answers fails the test, it does not hang it. */
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	sin.sin_port = htons(E.port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(c->fd, (struct sockaddr *)&sin, sizeof(sin)),
	    0);
	assert_int_equal(nghttp2_session_callbacks_new(&cbs), 0);
	nghttp2_session_callbacks_set_send_callback(cbs, c_send);
	nghttp2_session_callbacks_set_on_header_callback(cbs, c_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, c_data);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, c_close);
	assert_int_equal(nghttp2_session_client_new(&c->s, cbs, c), 0);
	nghttp2_session_callbacks_del(cbs);
	assert_int_equal(nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, NULL,
	                     0),
	    0);
}

static void
client_close(struct client *c)
{
	nghttp2_session_del(c->s);
	close(c->fd);
}

/* client_call: a new stream on c: `path` with the message `msg`. */
static void
client_call(struct client *c, struct stream *st, const char *path,
    const char *timeout, const ProtobufCMessage *msg)
{
	nghttp2_data_provider dp = { .source.ptr = st,
		.read_callback = c_body };
	nghttp2_nv nv[6];
	size_t n = 0, len = protobuf_c_message_get_packed_size(msg);

#define H(k, v)                                                               \
	nv[n++] = (nghttp2_nv){ (uint8_t *)(k), (uint8_t *)(v), strlen(k),    \
		strlen(v), NGHTTP2_NV_FLAG_NONE }
	memset(st, 0, sizeof(*st));
	st->grpc_status = -1;
	assert_true(len + MOAT_GRPC_PREFIX <= sizeof(st->body));
	moat_grpc_frame_header(st->body, (uint32_t)len);
	protobuf_c_message_pack(msg, st->body + MOAT_GRPC_PREFIX);
	st->body_len = len + MOAT_GRPC_PREFIX;
	H(":method", "POST");
	H(":scheme", "http");
	H(":authority", "localhost");
	H(":path", path);
	H("content-type", "application/grpc");
	if (timeout != NULL)
		H("grpc-timeout", timeout);
#undef H
	st->id = nghttp2_submit_request(c->s, NULL, nv, n, &dp, st);
	assert_true(st->id > 0);
	assert_int_equal(nghttp2_session_send(c->s), 0);
}

/* client_until: reads until `done(st)`. */
static void
client_until(struct client *c, struct stream *st,
    bool (*done)(const struct stream *))
{
	uint8_t buf[16384];
	ssize_t got;

	while (!done(st)) {
		got = recv(c->fd, buf, sizeof(buf), 0);
		if (got <= 0)
			fail_msg("the door did not answer stream %d", st->id);
		assert_true(
		    nghttp2_session_mem_recv(c->s, buf, (size_t)got) >= 0);
		assert_int_equal(nghttp2_session_send(c->s), 0);
	}
}

static bool
is_closed(const struct stream *st)
{
	return st->closed;
}

static bool
has_data(const struct stream *st)
{
	return st->data_len > 0 || st->closed;
}

/* event: the i-th ExecEvent of the stream's data (the caller frees). */
static Moat__V1__ExecEvent *
event(const struct stream *st, int i)
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
n_events(const struct stream *st)
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
	struct client c;
	struct stream st;
	char m[64];

	(void)state;
	exec_request(&rq, argv, 2);
	client_open(&c);
	client_call(&c, &st, "/moat.v1.Gateway/ExecStream", NULL,
	    (ProtobufCMessage *)&rq);
	client_until(&c, &st, is_closed);
	client_close(&c);
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
	struct client c;
	struct stream st;

	(void)state;
	exec_request(&rq, argv, 1);
	rq.sandbox_id = "sb-never";
	client_open(&c);
	client_call(&c, &st, "/moat.v1.Gateway/ExecStream", NULL,
	    (ProtobufCMessage *)&rq);
	client_until(&c, &st, is_closed);
	/* Trailers-Only, no message. */
	assert_int_equal(st.grpc_status, MOAT_NOT_FOUND);
	assert_int_equal(st.data_len, 0);
	assert_non_null(strstr(st.message, "sb-never"));
	client_close(&c);
}

static void
test_deadline(void **state)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;
	struct client c;
	struct stream st;

	(void)state;
	exec_request(&rq, argv, 2);
	client_open(&c);
	client_call(&c, &st, "/moat.v1.Gateway/ExecStream", "300m",
	    (ProtobufCMessage *)&rq);
	client_until(&c, &st, is_closed);
	client_close(&c);
	assert_int_equal(st.grpc_status, MOAT_DEADLINE_EXCEEDED);
	assert_int_equal(n_events(&st), 1); /* started */
	wait_method("ExecKill");
}

static void
test_cancel(void **state)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;
	struct client c;
	struct stream st;

	(void)state;
	exec_request(&rq, argv, 2);
	client_open(&c);
	client_call(&c, &st, "/moat.v1.Gateway/ExecStream", NULL,
	    (ProtobufCMessage *)&rq);
	client_until(&c, &st, has_data);
	assert_false(st.closed);
	wait_method("ExecRead"); /* polling */
	assert_int_equal(nghttp2_submit_rst_stream(c.s, NGHTTP2_FLAG_NONE,
	                     st.id, NGHTTP2_CANCEL),
	    0);
	assert_int_equal(nghttp2_session_send(c.s), 0);
	wait_method("ExecKill");
	client_close(&c);
}

static void
test_workers_free(void **state)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;
	Moat__V1__ListSandboxesRequest lq =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	static struct stream st[STREAMS];
	struct stream one;
	struct client c, d;

	(void)state;
	exec_request(&rq, argv, 2);
	client_open(&c);
	for (int i = 0; i < STREAMS; i++) {
		client_call(&c, &st[i], "/moat.v1.Gateway/ExecStream", NULL,
		    (ProtobufCMessage *)&rq);
		client_until(&c, &st[i], has_data);
		if (st[i].closed)
			fail_msg("stream %d: %d %s", i, st[i].grpc_status,
			    st[i].message);
	}
	/* More streams waiting than workers: a call still runs. */
	client_open(&d);
	client_call(&d, &one, "/moat.v1.Gateway/ListSandboxes", NULL,
	    (ProtobufCMessage *)&lq);
	client_until(&d, &one, is_closed);
	assert_int_equal(one.grpc_status, 0);
	client_close(&d);
	client_close(&c); /* every stream gone: killed */
	wait_method("ExecKill");
}

/* pump: reads what the door sent on c, once. */
static void
pump(struct client *c)
{
	uint8_t buf[16384];
	ssize_t got = recv(c->fd, buf, sizeof(buf), 0);

	if (got <= 0)
		fail_msg("the door closed or did not answer");
	assert_true(nghttp2_session_mem_recv(c->s, buf, (size_t)got) >= 0);
	assert_int_equal(nghttp2_session_send(c->s), 0);
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
	static struct stream st[UNARY_EXECS];
	struct stream one;
	struct client c, d;
	int i, held = 0;

	(void)state;
	exec_request(&rq, argv, 2);
	client_open(&c);
	for (i = 0; i < UNARY_EXECS; i++)
		client_call(&c, &st[i], "/moat.v1.Gateway/Exec", NULL,
		    (ProtobufCMessage *)&rq);
	/* Bounded: with blocking workers only 16 ever reach the node. */
	for (i = 0; i < 3000 && held < UNARY_EXECS; i++) {
		held = fake_node_held(&E.a);
		usleep(10000);
	}
	assert_int_equal(held, UNARY_EXECS);
	gq.sandbox_id = E.sandbox;
	client_open(&d);
	client_call(&d, &one, "/moat.v1.Gateway/GetSandbox", NULL,
	    (ProtobufCMessage *)&gq);
	client_until(&d, &one, is_closed);
	client_close(&d);
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
			pump(&c);
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
	client_close(&c);
}

/* The door stops while an ExecStream's process runs: the process is
 * killed before the door is gone (then a new door serves on). */
static void
test_stop_kills(void **state)
{
	char *argv[] = { "sleep", "100" };
	Moat__V1__ExecRequest rq;
	struct client c;
	struct stream st;
	char m[64], *errmsg = NULL;

	(void)state;
	exec_request(&rq, argv, 2);
	client_open(&c);
	client_call(&c, &st, "/moat.v1.Gateway/ExecStream", NULL,
	    (ProtobufCMessage *)&rq);
	client_until(&c, &st, has_data);
	assert_false(st.closed);
	wait_method("ExecRead"); /* polling */
	moat_grpc_stop(E.grpc);
	E.grpc = NULL;
	last_method(m, sizeof(m));
	assert_string_equal(m, "ExecKill");
	client_close(&c);
	if (moat_grpc_start(&E.grpc, E.gw, "127.0.0.1:0", 0, 0, &errmsg) !=
	    MOAT_OK)
		fail_msg("grpc: %s", errmsg);
	E.port = moat_grpc_port(E.grpc);
}

/* create_sandbox: CreateSandbox through the door; false while the
 * gateway knows no node yet. */
static bool
create_sandbox(void)
{
	Moat__V1__CreateSandboxRequest rq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb;
	struct client c;
	struct stream st;

	client_open(&c);
	client_call(&c, &st, "/moat.v1.Gateway/CreateSandbox", NULL,
	    (ProtobufCMessage *)&rq);
	client_until(&c, &st, is_closed);
	client_close(&c);
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
		cmocka_unit_test(test_stop_kills),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
