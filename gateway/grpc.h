/*
 * grpc.h: the gateway's gRPC door (grpc.c): the Gateway service as gRPC
 * over cleartext HTTP/2 (h2c with prior knowledge, as gRPC clients speak
 * to an insecure channel) or over TLS (ALPN h2, grpc_tls.h), on
 * libnghttp2. Each unary call's protobuf
 * bytes go through the same dispatcher, auth, policy and audit as the nng
 * and HTTP doors; grpc.health.v1.Health/Check answers without a key.
 * Gateway.ExecStream streams an exec's output (ExecStart, then ExecRead
 * polls, each through the dispatcher); grpc.reflection.v1alpha serves
 * the descriptors of proto/ (grpc_reflect.h). Streams are bounded
 * (grpc_stream.h): a client that stops reading stops the producer.
 * Also the pure pieces of the protocol (grpc-timeout, the length prefix,
 * grpc-message's percent-encoding), public for their unit test.
 * Gateway.Attach adds stdin, window sizes and the end of stdin to
 * ExecStream (ExecWrite / ExecResize through the dispatcher).
 * Not for: any behaviour of its own:
 * a call is what its Gateway method does.
 */
#ifndef MOAT_GATEWAY_GRPC_H
#define MOAT_GATEWAY_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway.h"

#define MOAT_GRPC_MAX_MESSAGE (4u << 20) /* larger: RESOURCE_EXHAUSTED */
#define MOAT_GRPC_MAX_CONNECTIONS 256    /* more are closed at accept */
#define MOAT_GRPC_MAX_STREAMS 100        /* concurrent streams a conn */
#define MOAT_GRPC_WORKERS 16             /* calls run at once */
#define MOAT_GRPC_PREFIX 5               /* flag byte + 4 length bytes */
#define MOAT_GRPC_IDLE_S 300             /* a conn with no stream: GOAWAY */
#define MOAT_GRPC_DEFAULT_ADDR "127.0.0.1:7781" /* [gateway] grpc unset */

struct moat_grpc;

/* moat_grpc_start: serves gRPC on `addr` ("host:port", "[v6addr]:port",
 * numeric hosts; port 0 picks a free one, see moat_grpc_port) in front
 * of `gw`, which must outlive the door (stop the door first). One
 * thread polls every connection; MOAT_GRPC_WORKERS threads run the
 * calls. Each client address (an IPv6 one by its /64) and each API key
 * may make `rps` calls a second, up to `burst` at once, as on the HTTP
 * door ([gateway] rate-limit-rps / rate-limit-burst; 0: the defaults of
 * ratelimit.h; rps MOAT_HTTP_UNLIMITED: none; a tenant's key-rps comes
 * first for its keys); more get RESOURCE_EXHAUSTED.
 * On MOAT_OK *out is the caller's (moat_grpc_stop); otherwise
 * INVALID_ARGUMENT (a bad address) or UNAVAILABLE (cannot listen) with
 * *errmsg (heap, caller frees) naming the address. */
int moat_grpc_start(struct moat_grpc **out, struct moat_gateway *gw,
    const char *addr, uint32_t rps, uint32_t burst, char **errmsg)
    __attribute__((warn_unused_result));

/* The door's limits ([gateway] grpc-buffer-mib, grpc-idle-s); 0 in a
 * field: its default. And its TLS: with tls_cert (PEM chain) and
 * tls_key (PEM), both set, the door speaks TLS with ALPN h2 only
 * (grpc_tls.h); NULL: cleartext h2c. */
struct moat_grpc_limits {
	uint32_t buffer_mib; /* all streams' queued output together */
	uint32_t idle_s;     /* a connection with no stream is closed */
	const char *tls_cert, *tls_key;
};

/* moat_grpc_start_limits: moat_grpc_start with `lim` (NULL: the
 * defaults, MOAT_GRPC_BUFFER_MIB and MOAT_GRPC_IDLE_S). */
int moat_grpc_start_limits(struct moat_grpc **out, struct moat_gateway *gw,
    const char *addr, uint32_t rps, uint32_t burst,
    const struct moat_grpc_limits *lim, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_grpc_port: the TCP port the door listens on. */
uint16_t moat_grpc_port(const struct moat_grpc *g);

/* moat_grpc_stop: closes the listener and every connection, kills the
 * processes of ExecStreams still running (waiting at most a few seconds
 * for the kills), waits for the calls in progress to end, frees. Safe
 * on NULL. */
void moat_grpc_stop(struct moat_grpc *g);

/* moat_grpc_parse_timeout: the grpc-timeout header value `v` (1 to 8
 * digits and a unit: H M S m u n) in milliseconds, rounded up (a
 * nonzero timeout is at least 1 ms), at most UINT32_MAX. False when
 * malformed. */
bool moat_grpc_parse_timeout(const char *v, uint64_t *ms);

/* moat_grpc_unframe: the one length-prefixed message of a unary call's
 * `len` body bytes: *msg points into buf, *msg_len bytes. MOAT_OK;
 * UNIMPLEMENTED for a compressed message; INVALID_ARGUMENT when the
 * body is not exactly one message; RESOURCE_EXHAUSTED over
 * MOAT_GRPC_MAX_MESSAGE. *why is a static string saying which. */
int moat_grpc_unframe(const uint8_t *buf, size_t len, const uint8_t **msg,
    size_t *msg_len, const char **why) __attribute__((warn_unused_result));

/* moat_grpc_frame_header: writes the 5-byte prefix of an uncompressed
 * message of `len` bytes into out. */
void moat_grpc_frame_header(uint8_t out[MOAT_GRPC_PREFIX], uint32_t len);

/* moat_grpc_percent_encode: `s` as grpc-message wants it: bytes outside
 * printable ASCII (0x20-0x7e) and '%' as %XX. Heap (caller frees); NULL
 * when out of memory. */
char *moat_grpc_percent_encode(const char *s);

#endif
