/*
 * test_handshake_drop.c: clients that hang up during nng's handshake must
 * not stop a listener. moat-sessiond on ipc:// and on tls+tcp:// (with
 * throwaway certificates, tls_certs.sh): 200 raw connections closed at
 * once, then 200 closed after 4 of the 8 SP header bytes, and on
 * tls+tcp:// twice 200 closed after a TLS ClientHello (the server's
 * answer unread); after each batch a fresh client (a new connection)
 * must get its Health answer within 5 s.
 * nng before 1.6.0 (issue #1518) took such a hang-up for the listener's
 * own close and never accepted again: this fails against Debian 12's nng
 * 1.5.2 and passes against deploy/build-nng.sh's build.
 * Not for: what sessiond answers (test_sessiond).
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "harness.h"
#include "moat/tls.h"
#include "moat/util.h"

#ifndef CERTS_SH
#error CERTS_SH must name tls_certs.sh
#endif

#define DROPS 200
#define ANSWER_MS 5000

static char pki[64]; /* tls_certs.sh's directory; "" without openssl */
static struct moat_tls *client_tls; /* the gateway's certificate */

/* raw_connect: a plain socket connected to an ipc:// or tls+tcp:// url
 * (127.0.0.1 only); -1 on failure. */
static int
raw_connect(const char *url)
{
	const char *tcp = "tls+tcp://127.0.0.1:";
	int fd;

	if (strncmp(url, "ipc://", 6) == 0) {
		struct sockaddr_un a = { .sun_family = AF_UNIX };

		snprintf(a.sun_path, sizeof(a.sun_path), "%s", url + 6);
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (fd >= 0 &&
		    connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
			return fd;
	} else {
		struct sockaddr_in a = { .sin_family = AF_INET };

		assert_int_equal(strncmp(url, tcp, strlen(tcp)), 0);
		a.sin_port = htons((uint16_t)atoi(url + strlen(tcp)));
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 &&
		    connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
			return fd;
	}
	if (fd >= 0)
		close(fd);
	return -1;
}

static ssize_t
send_n(int fd, const void *buf, size_t n)
{
	return send(fd, buf, n, MSG_NOSIGNAL);
}

/* hello: sends a TLS ClientHello on fd and waits (at most 1 s) for the
 * server's first flight, left unread when the caller closes fd. */
static void
hello(int fd)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	SSL *ssl;
	int rv;

	assert_non_null(ctx);
	ssl = SSL_new(ctx);
	assert_non_null(ssl);
	SSL_set_fd(ssl, fd);
	SSL_set_connect_state(ssl);
	/* Non-blocking: the first step writes the ClientHello and stops
	 * where it would wait for the answer. */
	assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	rv = SSL_do_handshake(ssl);
	if (SSL_get_error(ssl, rv) == SSL_ERROR_WANT_READ) {
		poll(&pfd, 1, 1000);
		nng_msleep(20); /* the rest of the server's flight */
	} else
		ERR_clear_error(); /* the server hung up first: fine */
	SSL_free(ssl); /* no close_notify: the handshake never finished */
	SSL_CTX_free(ctx);
}

/* drop: DROPS connections to url, each closed at once after `send` bytes
 * of an SP header (0: none), or (tls_hello) after a TLS ClientHello and
 * the server's answer to it. */
static void
drop(const char *url, size_t send, bool tls_hello)
{
	static const unsigned char head[8] = { 0, 'S', 'P', 0, 0x30, 0x31 };

	for (int i = 0; i < DROPS; i++) {
		int fd = raw_connect(url);

		if (fd < 0)
			fail_msg("connection %d to %s refused", i, url);
		if (send > 0)
			assert_int_equal(send_n(fd, head, send),
			    (ssize_t)send);
		if (tls_hello)
			hello(fd);
		close(fd);
	}
}

/* answers: a fresh client (a new connection, so a new handshake) gets its
 * Health answer within ANSWER_MS. */
static void
answers(struct ses_proc *p, const char *what)
{
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_client_opts co = { .tls = client_tls,
		.server_name = "sessiond",
		.quiet = true };
	struct moat_rpc_client *c = NULL;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	nng_time end = nng_clock() + ANSWER_MS;
	int rv;

	if (moat_tls_url_is_tls(p->url))
		rv = moat_rpc_client_open_opts(&c, p->url, &co, &errmsg);
	else
		rv = moat_rpc_client_open(&c, p->url, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("client for %s: %s", p->url, errmsg);
	do {
		struct moat_rpc_opts opts = { .timeout_ms = 1000 };

		free(errmsg);
		errmsg = NULL;
		rv = moat_rpc_call(c, "moat.v1.Session", "Health", &req.base,
		    &moat__v1__health_reply__descriptor, &reply, &opts,
		    &errmsg);
		if (rv != MOAT_OK)
			nng_msleep(50);
	} while (rv != MOAT_OK && nng_clock() < end);
	moat_rpc_client_close(c);
	if (rv != MOAT_OK)
		fail_msg(
		    "no answer within %d ms after %d connections %s "
		    "(nng issue #1518: is this the unpatched nng?): %s: %s",
		    ANSWER_MS, DROPS, what, moat_strerror(rv), errmsg);
	protobuf_c_message_free_unpacked(reply, NULL);
	free(errmsg);
}

static void
run_drops(struct ses_proc *p)
{
	drop(p->url, 0, false);
	answers(p, "closed at once");
	drop(p->url, 4, false);
	answers(p, "closed after 4 header bytes");
	if (!moat_tls_url_is_tls(p->url)) {
		drop(p->url, 0, false);
		answers(p, "closed at once (again)");
		return;
	}
	/* What jams nng 1.5.2's tls+tcp listener: a TLS client that goes
	 * away in the middle of the TLS handshake. */
	for (int i = 0; i < 2; i++) {
		drop(p->url, 0, true);
		answers(p, "closed after a TLS ClientHello");
	}
}

static void
test_ipc(void **state)
{
	/* static: ses_reap_all reaches it after a failed assertion */
	static struct ses_proc p;

	ses_start(&p, NULL);
	run_drops(&p);
	ses_stop(&p);
}

static int
free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static void
test_tls(void **state)
{
	static struct ses_proc p; /* as in test_ipc */
	struct moat_rpc_client_opts co = { .tls = client_tls,
		.server_name = "sessiond",
		.quiet = true };
	char *cert, *key, *peer, *errmsg = NULL;

	if (pki[0] == '\0')
		skip();
	p.url = moat_asprintf("tls+tcp://127.0.0.1:%d", free_port());
	cert = moat_asprintf("%s/sessiond/cert.pem", pki);
	key = moat_asprintf("%s/sessiond/key.pem", pki);
	peer = moat_asprintf("%s/ca/gateway.crt", pki);
	char *extra[] = { "--listen", p.url, "--tls-cert", cert, "--tls-key",
		key, "--tls-peer-ca", peer, NULL };
	if (moat_rpc_client_open_opts(&p.client, p.url, &co, &errmsg) !=
	    MOAT_OK)
		fail_msg("client: %s", errmsg);
	ses_start(&p, extra);
	run_drops(&p);
	ses_stop(&p);
	free(cert);
	free(key);
	free(peer);
}

static int
group_setup(void **state)
{
	struct moat_tls_files f = { 0 };
	char *cmd, *cert, *key, *ca, *errmsg = NULL;
	int rv;

	if (system("openssl version >/dev/null 2>&1") != 0) {
		fprintf(stderr, "no openssl command: tls+tcp skipped\n");
		return 0;
	}
	snprintf(pki, sizeof(pki), "/tmp/moat-hsdrop-XXXXXX");
	if (mkdtemp(pki) == NULL)
		return -1;
	cmd = moat_asprintf("sh %s %s", CERTS_SH, pki);
	rv = system(cmd);
	free(cmd);
	if (rv != 0)
		return -1;
	cert = moat_asprintf("%s/gw/cert.pem", pki);
	key = moat_asprintf("%s/gw/key.pem", pki);
	ca = moat_asprintf("%s/ca/sessiond.crt", pki);
	f.cert = cert;
	f.key = key;
	f.ca = ca;
	rv = moat_tls_load(&client_tls, &f, &errmsg);
	if (rv != MOAT_OK)
		fprintf(stderr, "client TLS: %s\n", errmsg);
	free(errmsg);
	free(cert);
	free(key);
	free(ca);
	return rv == MOAT_OK ? 0 : -1;
}

static int
group_teardown(void **state)
{
	ses_reap_all(state);
	moat_tls_free(client_tls);
	if (pki[0] != '\0')
		moat_rm_rf(pki);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ipc),
		cmocka_unit_test(test_tls),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
