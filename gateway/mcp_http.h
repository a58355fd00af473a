/*
 * mcp_http.h: MCP's Streamable HTTP transport at /mcp on the gateway's
 * HTTP door (http.c): POSTed JSON-RPC messages answered as
 * application/json, an Mcp-Session-Id issued at initialize and required
 * after it, DELETE to end a session, GET refused with 405 (no
 * server-initiated stream). The protocol and tools are lib/mcp/
 * (shared with `moat mcp`); http.c gives the call function, which runs
 * Gateway methods in process with the request's own auth, or with the
 * Authorization of an evicted session to destroy that session's sandbox.
 * Not for: the protocol, the tools, or the rest of the HTTP door.
 */
#ifndef MOAT_GATEWAY_MCP_HTTP_H
#define MOAT_GATEWAY_MCP_HTTP_H

#include <stddef.h>

#include <microhttpd.h>

#include "moat/mcp.h"

struct moat_mcp_http;

/* moat_mcp_http_call_fn: runs Gateway method `method` as a
 * moat_mcp_call_fn does (mcp.h), as one caller: the request being
 * served when `authz` is NULL (its Authorization, X-Moat-Request-Id and
 * X-Moat-Timeout-Ms headers), else the Authorization header value
 * `authz` ("Bearer KEY"; "": none) with a new request id: another
 * caller's, an evicted session's. Called on the request's thread. */
typedef int (*moat_mcp_http_call_fn)(void *arg, const char *authz,
    const char *method, json_t *request, json_t **reply, char **errmsg);

/* What /mcp keeps of a session in the cluster's store (moat-sessiond),
 * so any gateway can go on with it. */
struct moat_mcp_http_record {
	char id[33];           /* the Mcp-Session-Id */
	char authz_sha256[65]; /* of the Authorization header ("" hashed) */
	struct moat_mcp_state state;
	uint64_t used_unix_ms; /* read: when a gateway last put it */
};

/* The cluster's store of sessions. Each function acts for the caller
 * whose Authorization header value is `authz` ("": none), which names the
 * tenant; each returns a moat status, NOT_FOUND for an unknown, ended,
 * expired or other tenant's session, and on failure sets *errmsg (heap,
 * caller frees). Called on request threads. */
struct moat_mcp_http_store {
	int (*get)(void *arg, const char *authz, const char *id,
	    struct moat_mcp_http_record *out, char **errmsg);
	int (*put)(void *arg, const char *authz,
	    const struct moat_mcp_http_record *r, char **errmsg);
	int (
	    *del)(void *arg, const char *authz, const char *id, char **errmsg);
	void *arg;
};

/* moat_mcp_http_set_store: from now on sessions are kept in `store`
 * (copied) as well as in the table: put when initialized, when their
 * state changes and at most every MOAT_MCP_HTTP_TOUCH_S while used; read
 * before each request (so a default sandbox made through another gateway
 * is used, never a second one); a session id the table lacks is looked up
 * there. The table is then a cache: when full, the least recently used
 * session no request uses leaves it, and is ended (as without a store)
 * only when it was idle idle_s seconds on every gateway (its used time in
 * the store), else kept in the store for a later request. When the store
 * does not answer, requests go on with the table (logged). Call before
 * serving. */
#define MOAT_MCP_HTTP_TOUCH_S 60
void moat_mcp_http_set_store(struct moat_mcp_http *m,
    const struct moat_mcp_http_store *store);

/* moat_mcp_http_new: an empty table of at most `max_sessions` sessions
 * (at least 1). When it is full, initialize evicts the least recently
 * used session that no request is using and that has been idle for
 * `idle_s` seconds or more (0: any such session), destroying its sandbox
 * as its own caller; with none, initialize is refused (503). On MOAT_OK
 * *out is the caller's (moat_mcp_http_free); INVALID_ARGUMENT (no
 * sessions) or RESOURCE_EXHAUSTED otherwise. */
int moat_mcp_http_new(struct moat_mcp_http **out, size_t max_sessions,
    unsigned idle_s) __attribute__((warn_unused_result));

/* moat_mcp_http_free: frees every session (their sandboxes are left to
 * their owners). No request may be in progress. Safe on NULL. */
void moat_mcp_http_free(struct moat_mcp_http *m);

/* moat_mcp_http_sessions: how many sessions the table holds now. */
size_t moat_mcp_http_sessions(struct moat_mcp_http *m);

/* moat_mcp_http_serve: answers one request to /mcp: `method` is the HTTP
 * method, `body` (`len` bytes, may be NULL) the request body. Gateway
 * methods run through `call` with `arg`; an initialize that evicts a
 * session first destroys that session's sandbox through `call` as the
 * evicted session's Authorization. Thread-safe. */
enum MHD_Result moat_mcp_http_serve(struct moat_mcp_http *m,
    struct MHD_Connection *conn, const char *method, const char *body,
    size_t len, moat_mcp_http_call_fn call, void *arg);

#endif
