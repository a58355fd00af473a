/*
 * test_grpc_wire.c: the gateway's gRPC door (gateway/grpc.c) on the wire,
 * with libnghttp2's client session as the client, in front of a gateway
 * in process (auth off, no node): what a stock gRPC client cannot send
 * or cannot show. A grpc-timeout already spent is refused by the server
 * (DEADLINE_EXCEEDED before the call runs), a malformed one is
 * INVALID_ARGUMENT, a compressed message UNIMPLEMENTED, a GET
 * INVALID_ARGUMENT; health's exact bytes; bad --grpc addresses; a client gone with its call in
 * flight costs nobody else; stop with a connection still open.
 * Not for: the pure pieces (test_grpc) or Debian's client
 * (tests/integration/grpc).
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
#include <unistd.h>

#include <cmocka.h>
#include <nghttp2/nghttp2.h>

#include "gateway.h"
#include "grpc.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

static struct {
	char dir[64];
	struct moat_gateway *gw;
	struct moat_grpc *grpc;
	uint16_t port;
} E;

/* One call's answer as the client saw it. */
struct answer {
	int fd;
	int grpc_status; /* -1: none */
	char message[512];
	uint8_t data[64];
	size_t data_len;
	bool closed;
	const uint8_t *body;
	size_t body_len, body_off;
};

static int
client_connect(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	sin.sin_port = htons(E.port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	return fd;
}

static ssize_t
c_send(nghttp2_session *s, const uint8_t *d, size_t n, int fl, void *ud)
{
	struct answer *a = ud;

	(void)s;
	(void)fl;
	return send(a->fd, d, n, MSG_NOSIGNAL);
}

static int
c_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
    size_t nl, const uint8_t *v, size_t vl, uint8_t fl, void *ud)
{
	struct answer *a = ud;

	(void)s;
	(void)f;
	(void)fl;
	if (nl == 11 && memcmp(name, "grpc-status", 11) == 0)
		a->grpc_status = atoi((const char *)v);
	if (nl == 12 && memcmp(name, "grpc-message", 12) == 0 &&
	    vl < sizeof(a->message))
		memcpy(a->message, v, vl);
	return 0;
}

static int
c_data(nghttp2_session *s, uint8_t fl, int32_t id, const uint8_t *d, size_t n,
    void *ud)
{
	struct answer *a = ud;

	(void)s;
	(void)fl;
	(void)id;
	if (a->data_len + n <= sizeof(a->data)) {
		memcpy(a->data + a->data_len, d, n);
		a->data_len += n;
	}
	return 0;
}

static int
c_close(nghttp2_session *s, int32_t id, uint32_t err, void *ud)
{
	struct answer *a = ud;

	(void)s;
	(void)id;
	(void)err;
	a->closed = true;
	return 0;
}

static ssize_t
c_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct answer *a = ud;
	size_t n = a->body_len - a->body_off;

	(void)s;
	(void)id;
	(void)src;
	if (n > len)
		n = len;
	memcpy(buf, a->body + a->body_off, n);
	a->body_off += n;
	if (a->body_off == a->body_len)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

/* call: one request of `method` `path` with grpc-timeout `timeout`
 * (NULL: none) and the body `body` on a new connection; *a the answer.
 * With `leave_open`, returns right after sending, the socket open. */
static void
call(const char *method, const char *path, const char *timeout,
    const uint8_t *body, size_t len, struct answer *a, bool leave_open)
{
	nghttp2_session_callbacks *cbs;
	nghttp2_session *s;
	nghttp2_nv nv[6];
	nghttp2_data_provider dp = { .read_callback = c_body };
	size_t n = 0;
	uint8_t buf[16384];
	ssize_t got;

#define H(k, v)                                                               \
	nv[n++] = (nghttp2_nv){ (uint8_t *)(k), (uint8_t *)(v), strlen(k),    \
		strlen(v), NGHTTP2_NV_FLAG_NONE }
	memset(a, 0, sizeof(*a));
	a->grpc_status = -1;
	a->body = body;
	a->body_len = len;
	a->fd = client_connect();
	assert_int_equal(nghttp2_session_callbacks_new(&cbs), 0);
	nghttp2_session_callbacks_set_send_callback(cbs, c_send);
	nghttp2_session_callbacks_set_on_header_callback(cbs, c_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, c_data);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, c_close);
	assert_int_equal(nghttp2_session_client_new(&s, cbs, a), 0);
	nghttp2_session_callbacks_del(cbs);
	assert_int_equal(nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, NULL,
	                     0),
	    0);
	H(":method", method);
	H(":scheme", "http");
	H(":authority", "localhost");
	H(":path", path);
	H("content-type", "application/grpc");
	if (timeout != NULL)
		H("grpc-timeout", timeout);
#undef H
	assert_true(nghttp2_submit_request(s, NULL, nv, n, &dp, NULL) > 0);
	assert_int_equal(nghttp2_session_send(s), 0);
	while (!leave_open && !a->closed) {
		got = recv(a->fd, buf, sizeof(buf), 0);
		assert_true(got > 0);
		assert_true(
		    nghttp2_session_mem_recv(s, buf, (size_t)got) >= 0);
		assert_int_equal(nghttp2_session_send(s), 0);
	}
	nghttp2_session_del(s);
	if (!leave_open)
		close(a->fd);
}

static const uint8_t empty_msg[] = { 0, 0, 0, 0, 0 };

static void
test_deadline_spent(void **state)
{
	struct answer a;

	(void)state;
	call("POST", "/moat.v1.Gateway/ListSandboxes", "0m", empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.grpc_status, MOAT_DEADLINE_EXCEEDED);
	assert_non_null(strstr(a.message, "deadline passed"));
	/* With time left the same call runs (no node: an empty list). */
	call("POST", "/moat.v1.Gateway/ListSandboxes", "10S", empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.grpc_status, MOAT_OK);
	assert_int_equal(a.data_len, 5);
}

static void
test_bad_requests(void **state)
{
	static const uint8_t compressed[] = { 1, 0, 0, 0, 0 };
	static const uint8_t short_body[] = { 0, 0, 0, 0, 9, 1 };
	struct answer a;

	(void)state;
	call("POST", "/moat.v1.Gateway/ListSandboxes", "1x", empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.grpc_status, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(a.message, "grpc-timeout"));
	call("POST", "/moat.v1.Gateway/ListSandboxes", NULL, compressed,
	    sizeof(compressed), &a, false);
	assert_int_equal(a.grpc_status, MOAT_UNIMPLEMENTED);
	/* grpc-message is percent-encoded: the space stays. */
	assert_string_equal(a.message, "compression not supported");
	call("POST", "/moat.v1.Gateway/ListSandboxes", NULL, short_body,
	    sizeof(short_body), &a, false);
	assert_int_equal(a.grpc_status, MOAT_INVALID_ARGUMENT);
	call("GET", "/moat.v1.Gateway/ListSandboxes", NULL, empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.grpc_status, MOAT_INVALID_ARGUMENT);
}

static void
test_health_bytes(void **state)
{
	static const uint8_t serving[] = { 0, 0, 0, 0, 2, 0x08, 0x01 };
	struct answer a;

	(void)state;
	call("POST", "/grpc.health.v1.Health/Check", NULL, empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.grpc_status, MOAT_OK);
	assert_int_equal(a.data_len, sizeof(serving));
	assert_memory_equal(a.data, serving, sizeof(serving));
}

static void
test_client_gone(void **state)
{
	struct answer gone, a;

	(void)state;
	/* Sent, then the socket closed before the answer: the call's
	 * stream is gone when its worker is done. */
	for (int i = 0; i < 20; i++) {
		call("POST", "/moat.v1.Gateway/ListSandboxes", NULL, empty_msg,
		    sizeof(empty_msg), &gone, true);
		close(gone.fd);
	}
	call("POST", "/grpc.health.v1.Health/Check", NULL, empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.grpc_status, MOAT_OK);
	/* Left open: moat_grpc_stop in teardown closes it. */
	call("POST", "/moat.v1.Gateway/ListSandboxes", NULL, empty_msg,
	    sizeof(empty_msg), &gone, true);
}

static void
test_bad_addresses(void **state)
{
	static const char *bad[] = { "bogus", "127.0.0.1",
		"127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:12a",
		"localhost:1", ":1", "[::1]1" };
	struct moat_grpc *g;
	char *errmsg;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		errmsg = NULL;
		assert_int_equal(moat_grpc_start(&g, E.gw, bad[i], 0, 0,
		                     &errmsg),
		    MOAT_INVALID_ARGUMENT);
		assert_null(g);
		assert_non_null(strstr(errmsg, "--grpc"));
		free(errmsg);
	}
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL, *urls[4];

	(void)state;
	moat_log_init("test", MOAT_LOG_WARN);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-grpc-XXXXXX");
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
	opts.survey_interval_ms = 100;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	if (moat_grpc_start(&E.grpc, E.gw, "127.0.0.1:0", 0, 0, &errmsg) !=
	    MOAT_OK)
		fail_msg("grpc: %s", errmsg);
	for (int i = 0; i < 4; i++)
		free(urls[i]);
	E.port = moat_grpc_port(E.grpc);
	assert_true(E.port != 0);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	moat_grpc_stop(E.grpc);
	moat_gateway_stop(E.gw);
	moat_rm_rf(E.dir);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deadline_spent),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_health_bytes),
		cmocka_unit_test(test_bad_addresses),
		cmocka_unit_test(test_client_gone),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
