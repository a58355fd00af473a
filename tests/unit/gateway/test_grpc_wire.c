/*
 * test_grpc_wire.c: the gateway's gRPC door (gateway/grpc.c) on the wire,
 * with the tests' libnghttp2 client (grpc_client.h), in front of a gateway
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
#include "grpc_client.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

static struct {
	char dir[64];
	struct moat_gateway *gw;
	struct moat_grpc *grpc;
	uint16_t port;
} E;

/* One call's answer as the client saw it, and its socket. */
struct answer {
	struct grpc_stream st;
	int fd;
};

/* call: one request of `method` `path` with grpc-timeout `timeout`
 * (NULL: none) and the body `body` on a new connection; *a the answer.
 * With `leave_open`, returns right after sending, the socket open. */
static void
call(const char *method, const char *path, const char *timeout,
    const uint8_t *body, size_t len, struct answer *a, bool leave_open)
{
	struct grpc_client c;

	memset(a, 0, sizeof(*a));
	grpc_client_open(&c, E.port);
	grpc_client_request(&c, &a->st, method, path, timeout, body, len);
	a->fd = c.fd;
	if (leave_open) {
		nghttp2_session_del(c.s);
		return;
	}
	grpc_client_until(&c, &a->st, grpc_stream_closed);
	grpc_client_close(&c);
}

static const uint8_t empty_msg[] = { 0, 0, 0, 0, 0 };

static void
test_deadline_spent(void **state)
{
	struct answer a;

	(void)state;
	call("POST", "/moat.v1.Gateway/ListSandboxes", "0m", empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.st.grpc_status, MOAT_DEADLINE_EXCEEDED);
	assert_non_null(strstr(a.st.message, "deadline passed"));
	/* With time left the same call runs (no node: an empty list). */
	call("POST", "/moat.v1.Gateway/ListSandboxes", "10S", empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.st.grpc_status, MOAT_OK);
	assert_int_equal(a.st.data_len, 5);
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
	assert_int_equal(a.st.grpc_status, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(a.st.message, "grpc-timeout"));
	call("POST", "/moat.v1.Gateway/ListSandboxes", NULL, compressed,
	    sizeof(compressed), &a, false);
	assert_int_equal(a.st.grpc_status, MOAT_UNIMPLEMENTED);
	/* grpc-message is percent-encoded: the space stays. */
	assert_string_equal(a.st.message, "compression not supported");
	call("POST", "/moat.v1.Gateway/ListSandboxes", NULL, short_body,
	    sizeof(short_body), &a, false);
	assert_int_equal(a.st.grpc_status, MOAT_INVALID_ARGUMENT);
	call("GET", "/moat.v1.Gateway/ListSandboxes", NULL, empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.st.grpc_status, MOAT_INVALID_ARGUMENT);
}

static void
test_health_bytes(void **state)
{
	static const uint8_t serving[] = { 0, 0, 0, 0, 2, 0x08, 0x01 };
	struct answer a;

	(void)state;
	call("POST", "/grpc.health.v1.Health/Check", NULL, empty_msg,
	    sizeof(empty_msg), &a, false);
	assert_int_equal(a.st.grpc_status, MOAT_OK);
	assert_int_equal(a.st.data_len, sizeof(serving));
	assert_memory_equal(a.st.data, serving, sizeof(serving));
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
	assert_int_equal(a.st.grpc_status, MOAT_OK);
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
