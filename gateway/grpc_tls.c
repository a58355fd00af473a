/*
 * grpc_tls.c: the gRPC door's TLS (grpc_tls.h) on OpenSSL's SSL API with
 * a nonblocking socket: SSL_read and SSL_write run the handshake as they
 * go, and a call that cannot go on says whether it waits for the socket
 * to be readable or writable (WANT_READ / WANT_WRITE), so that the
 * door's poll loop asks for the right event. Partial writes and a moved
 * write buffer are allowed, as nghttp2 retries with what is left.
 * Not for: the HTTP door's HTTPS (http.c) or certificates of the nng
 * doors (lib/tls.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "grpc_tls.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

struct moat_grpc_tls {
	SSL_CTX *ctx;
};

struct moat_grpc_tls_conn {
	SSL *ssl;
	char peer[128];
	bool alpn_checked;
	enum moat_grpc_tls_wait rd, wr; /* what the last blocked one wants */
};

/* The first OpenSSL error as text, or `dflt`. */
static const char *
ssl_error(char *buf, size_t size, const char *dflt)
{
	unsigned long e = ERR_get_error();

	if (e == 0)
		return dflt;
	ERR_error_string_n(e, buf, size);
	ERR_clear_error();
	return buf;
}

/* alpn_select: "h2" or refuse the handshake: a gRPC client over TLS
 * always offers h2; one that does not speaks something else. */
static int
alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
    const unsigned char *in, unsigned int inlen, void *arg)
{
	static const unsigned char h2[] = { 2, 'h', '2' };
	struct moat_grpc_tls_conn *c = SSL_get_app_data(ssl);
	unsigned char *sel = NULL;

	(void)arg;
	if (SSL_select_next_proto(&sel, outlen, h2, sizeof(h2), in, inlen) !=
	        OPENSSL_NPN_NEGOTIATED ||
	    *outlen != 2 || memcmp(sel, "h2", 2) != 0) {
		moat_warn(0,
		    "grpc: TLS client %s does not offer ALPN \"h2\": gRPC "
		    "over TLS is HTTP/2; refused (use a gRPC client)",
		    c ? c->peer : "?");
		return SSL_TLSEXT_ERR_ALERT_FATAL;
	}
	*out = sel;
	return SSL_TLSEXT_ERR_OK;
}

int
moat_grpc_tls_new(struct moat_grpc_tls **out, const char *cert,
    const char *key, char **errmsg)
{
	struct moat_grpc_tls *t;
	char eb[256];
	const char *what = NULL, *file = NULL;

	*out = NULL;
	if ((t = calloc(1, sizeof(*t))) == NULL ||
	    (t->ctx = SSL_CTX_new(TLS_server_method())) == NULL) {
		free(t);
		*errmsg = moat_asprintf("out of memory setting up gRPC TLS");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
	SSL_CTX_set_mode(t->ctx,
	    SSL_MODE_ENABLE_PARTIAL_WRITE |
	        SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_alpn_select_cb(t->ctx, alpn_select, NULL);
	if (SSL_CTX_use_certificate_chain_file(t->ctx, cert) != 1) {
		what = "is not a readable PEM certificate";
		file = cert;
	} else if (SSL_CTX_use_PrivateKey_file(t->ctx, key,
	               SSL_FILETYPE_PEM) != 1) {
		what = "is not a readable PEM private key";
		file = key;
	} else if (SSL_CTX_check_private_key(t->ctx) != 1) {
		what = "does not match the certificate";
		file = key;
	}
	if (what != NULL) {
		*errmsg = moat_asprintf("gRPC TLS: %s %s (%s): fix [gateway] "
		                        "grpc-tls-cert / grpc-tls-key (or "
		                        "http-tls-cert / http-tls-key, their "
		                        "default)",
		    file, what, ssl_error(eb, sizeof(eb), "no detail"));
		moat_grpc_tls_free(t);
		return MOAT_INVALID_ARGUMENT;
	}
	*out = t;
	return MOAT_OK;
}

void
moat_grpc_tls_free(struct moat_grpc_tls *t)
{
	if (t == NULL)
		return;
	SSL_CTX_free(t->ctx);
	free(t);
}

struct moat_grpc_tls_conn *
moat_grpc_tls_accept(struct moat_grpc_tls *t, int fd, const char *peer)
{
	struct moat_grpc_tls_conn *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return NULL;
	if ((c->ssl = SSL_new(t->ctx)) == NULL ||
	    SSL_set_fd(c->ssl, fd) != 1) {
		moat_grpc_tls_conn_free(c);
		return NULL;
	}
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	SSL_set_app_data(c->ssl, c);
	SSL_set_accept_state(c->ssl);
	return c;
}

void
moat_grpc_tls_conn_free(struct moat_grpc_tls_conn *c)
{
	if (c == NULL)
		return;
	SSL_free(c->ssl);
	free(c);
}

/* alpn_ok: once the handshake is done, whether h2 was agreed (a client
 * that offers no ALPN at all never reaches alpn_select). */
static bool
alpn_ok(struct moat_grpc_tls_conn *c)
{
	const unsigned char *p = NULL;
	unsigned int len = 0;

	if (c->alpn_checked || !SSL_is_init_finished(c->ssl))
		return true;
	c->alpn_checked = true;
	SSL_get0_alpn_selected(c->ssl, &p, &len);
	if (len == 2 && memcmp(p, "h2", 2) == 0)
		return true;
	moat_warn(0,
	    "grpc: TLS client %s offered no ALPN: gRPC over TLS is HTTP/2 "
	    "negotiated as \"h2\"; refused (use a gRPC client)",
	    c->peer);
	return false;
}

/* io_result: what SSL_read / SSL_write's `rv` means (see grpc_tls.h);
 * *wait is what a blocked one waits for. */
static ssize_t
io_result(struct moat_grpc_tls_conn *c, int rv, enum moat_grpc_tls_wait *wait)
{
	char eb[256];
	int err;

	*wait = MOAT_GRPC_TLS_WAIT_NONE;
	if (rv > 0)
		return alpn_ok(c) ? rv : -1;
	err = SSL_get_error(c->ssl, rv);
	if (err == SSL_ERROR_WANT_READ) {
		*wait = MOAT_GRPC_TLS_WAIT_READ;
		return alpn_ok(c) ? 0 : -1;
	}
	if (err == SSL_ERROR_WANT_WRITE) {
		*wait = MOAT_GRPC_TLS_WAIT_WRITE;
		return alpn_ok(c) ? 0 : -1;
	}
	if (err == SSL_ERROR_ZERO_RETURN ||
	    (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) {
		ERR_clear_error();
		return -1; /* closed */
	}
	if (!SSL_is_init_finished(c->ssl))
		moat_warn(0,
		    "grpc: TLS handshake with %s failed: %s (a client "
		    "speaking plaintext to a TLS port? use TLS, or the "
		    "right port)",
		    c->peer,
		    ssl_error(eb, sizeof(eb), "the connection ended"));
	else
		moat_debug(0, "grpc: TLS with %s: %s", c->peer,
		    ssl_error(eb, sizeof(eb), "error"));
	ERR_clear_error();
	return -1;
}

ssize_t
moat_grpc_tls_read(struct moat_grpc_tls_conn *c, void *buf, size_t n)
{
	int rv;

	ERR_clear_error();
	rv = SSL_read(c->ssl, buf, n > INT_MAX ? INT_MAX : (int)n);
	return io_result(c, rv, &c->rd);
}

ssize_t
moat_grpc_tls_write(struct moat_grpc_tls_conn *c, const void *buf, size_t n)
{
	int rv;

	if (n == 0)
		return 0;
	ERR_clear_error();
	rv = SSL_write(c->ssl, buf, n > INT_MAX ? INT_MAX : (int)n);
	return io_result(c, rv, &c->wr);
}

enum moat_grpc_tls_wait
moat_grpc_tls_waits(const struct moat_grpc_tls_conn *c, bool write)
{
	return write ? c->wr : c->rd;
}
