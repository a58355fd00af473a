/*
 * http.h: the gateway's HTTP/JSON door (http.c). Requests arrive as JSON
 * over HTTP, are decoded into the Gateway method's input message
 * (moat/codec.h) and run through the same dispatcher and handlers as the
 * nng door, so validation, auth, deduplication and forwarding are the
 * same; replies are the output message as proto3 JSON. Connect clients
 * call the same methods at POST /moat.v1.Gateway/<Method> (JSON or
 * binary protobuf, unary; ExecStream in Connect's streaming form), and
 * so do gRPC-Web clients (http_connect.h has the framing).
 * Not for: the nng RPC door (handlers.c) or any behaviour of its own:
 * what a route does is what its Gateway method does.
 */
#ifndef MOAT_GATEWAY_HTTP_H
#define MOAT_GATEWAY_HTTP_H

#include <stdint.h>

#include "gateway.h"

#define MOAT_HTTP_DEFAULT_ADDR "127.0.0.1:7780"
#define MOAT_HTTP_MAX_BODY (4u << 20) /* larger bodies: 413 */
#define MOAT_HTTP_MAX_CONNECTIONS 256
#define MOAT_HTTP_IDLE_TIMEOUT_S 120
#define MOAT_HTTP_MCP_MAX_SESSIONS 256 /* mcp-max-sessions default */
#define MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT 65536u
#define MOAT_HTTP_MCP_IDLE_S 3600      /* mcp-idle-s default */
#define MOAT_HTTP_UNLIMITED UINT32_MAX /* rate-limit-rps 0: no limit */
/* [gateway] archive-max-mib's default and its largest value. */
#define MOAT_HTTP_ARCHIVE_MAX_MIB 2048
#define MOAT_HTTP_ARCHIVE_MAX_MIB_LIMIT (1u << 20)

struct moat_http;

/* The door's settings besides its address ([gateway] options). */
struct moat_http_opts {
	uint32_t mcp_max_sessions; /* /mcp sessions at once, 1 to
	                             * MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT */
	uint32_t mcp_idle_s;       /* with the table full, a session idle
	                             * this long (0: any not in use) is
	                             * evicted and its sandbox destroyed */
	/* [gateway] http-tls-cert / http-tls-key: PEM files; both set,
	 * the door serves HTTPS (libmicrohttpd with GnuTLS). */
	const char *tls_cert;
	const char *tls_key;
	/* [gateway] rate-limit-rps / rate-limit-burst: each client address
	 * (an IPv6 one by its /64) and each API key may make rps requests
	 * a second, up to burst at once; more are answered 429 with
	 * Retry-After (0: MOAT_RATELIMIT_RPS / MOAT_RATELIMIT_BURST of
	 * ratelimit.h; rps MOAT_HTTP_UNLIMITED: no limit).
	 * max-conns-per-addr: connections at once from one address, more
	 * are closed at accept (0: MOAT_HTTP_MAX_CONNS_PER_ADDR). */
	uint32_t rate_limit_rps, rate_limit_burst, max_conns_per_addr;
	/* [gateway] http-cors-origins: the origins whose browser pages may
	 * call the Connect and gRPC-Web routes and read the replies
	 * (commas or blanks between; "*": any; NULL or "": none, and a
	 * preflight is refused). */
	const char *cors_origins;
	/* [gateway] archive-max-mib: the largest tar archive PUT or GET
	 * .../files?archive=tar carries, in MiB (0: 2048; more: 413). */
	uint32_t archive_max_mib;
	/* /mcp sessions stay in this door's table, never in moat-sessiond
	 * (tests of the table; a gateway shares them when it has one). */
	bool mcp_table_only;
};

/* moat_http_start: serves the HTTP door on `addr` ("host:port",
 * "[v6addr]:port", numeric hosts only; port 0 picks a free port, see
 * moat_http_port) in front of `gw`, which must outlive the door (stop
 * the door first), with `opts` (borrowed; NULL: the defaults). One
 * thread per connection, at most MOAT_HTTP_MAX_CONNECTIONS. With auth on,
 * /mcp, /v1/ and the Connect routes /moat.v1.Gateway/ (but
 * /v1/openapi.json and Health) need a valid key, checked with the rate limits on the request's headers before its
 * body is read (401 with WWW-Authenticate: Bearer). On MOAT_OK
 * *out is the caller's (moat_http_stop). On failure returns
 * INVALID_ARGUMENT (a bad address or option) or UNAVAILABLE (cannot
 * listen) with *errmsg (heap, caller frees) naming the address or
 * option. */
int moat_http_start(struct moat_http **out, struct moat_gateway *gw,
    const char *addr, const struct moat_http_opts *opts, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_http_decode: what the door makes of a request before it calls the
 * gateway, without a connection (for the fuzz target
 * tests/fuzz/services/fuzz_http_route.c): the route of `method` `url`
 * (unescaped, as libmicrohttpd hands it over), its input message of
 * service `svc` from the JSON `body` (`len` bytes) or the raw query
 * string `query` (after '?'; NULL: none) and the URL id. On MOAT_OK *out
 * is the message (protobuf_c_message_free_unpacked; NULL for /healthz);
 * otherwise a status with *errmsg (heap, caller frees). */
int moat_http_decode(const ProtobufCServiceDescriptor *svc, const char *method,
    const char *url, const char *query, const char *body, size_t len,
    ProtobufCMessage **out, char **errmsg) __attribute__((warn_unused_result));

/* moat_http_port: the TCP port the door listens on. */
uint16_t moat_http_port(const struct moat_http *h);

/* moat_http_stop: stops listening, waits for requests in progress to
 * finish, frees. Safe on NULL. */
void moat_http_stop(struct moat_http *h);

/* moat_http_bearer_key: the api key of the Authorization header value
 * `authz` (NULL: no header, key ""), a pointer into authz.
 * UNAUTHENTICATED with *errmsg (heap, caller frees) when it is not
 * "Bearer <api key>". */
int moat_http_bearer_key(const char *authz, const char **auth, char **errmsg)
    __attribute__((warn_unused_result));

#endif
