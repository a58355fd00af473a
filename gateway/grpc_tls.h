/*
 * grpc_tls.h: TLS for the gateway's gRPC door (grpc.c) on OpenSSL: the
 * server context from a PEM certificate (chain) and key, ALPN "h2" only
 * (gRPC over TLS is HTTP/2 negotiated by ALPN; a client that does not
 * offer h2 is refused with a log line), and nonblocking reads and writes
 * on a connection's socket that say which way they wait.
 * Not for: the HTTP door's HTTPS (libmicrohttpd's own, http.c) or the
 * nng doors' TLS (moat/tls.h).
 */
#ifndef MOAT_GATEWAY_GRPC_TLS_H
#define MOAT_GATEWAY_GRPC_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct moat_grpc_tls;      /* a server context */
struct moat_grpc_tls_conn; /* one connection's TLS */

/* moat_grpc_tls_new: a server context of `cert` (PEM, the chain) and
 * `key` (PEM). MOAT_OK with *out the caller's (moat_grpc_tls_free), or
 * INVALID_ARGUMENT with *errmsg (heap) naming the file and the keys
 * [gateway] grpc-tls-cert / grpc-tls-key. */
int moat_grpc_tls_new(struct moat_grpc_tls **out, const char *cert,
    const char *key, char **errmsg) __attribute__((warn_unused_result));
void moat_grpc_tls_free(struct moat_grpc_tls *t);

/* moat_grpc_tls_accept: the server side of a TLS connection on the
 * nonblocking socket `fd` (the caller keeps and closes it) from `peer`
 * (for log lines; copied). NULL when out of memory. */
struct moat_grpc_tls_conn *moat_grpc_tls_accept(struct moat_grpc_tls *t,
    int fd, const char *peer);
void moat_grpc_tls_conn_free(struct moat_grpc_tls_conn *c);

/* What a read or write that could not go on waits for. */
enum moat_grpc_tls_wait {
	MOAT_GRPC_TLS_WAIT_NONE,
	MOAT_GRPC_TLS_WAIT_READ,  /* the socket readable */
	MOAT_GRPC_TLS_WAIT_WRITE, /* the socket writable */
};

/* moat_grpc_tls_read / _write: up to n bytes (the handshake first, as
 * needed). >0: bytes moved; 0: would block (see moat_grpc_tls_waits);
 * -1: the connection is over (closed, a TLS error, or no ALPN h2: each
 * logged). */
ssize_t moat_grpc_tls_read(struct moat_grpc_tls_conn *c, void *buf, size_t n);
ssize_t moat_grpc_tls_write(struct moat_grpc_tls_conn *c, const void *buf,
    size_t n);

/* moat_grpc_tls_waits: what the last read or write that blocked waits
 * for (WAIT_NONE once one went through). */
enum moat_grpc_tls_wait moat_grpc_tls_waits(const struct moat_grpc_tls_conn *c,
    bool write);

#endif
