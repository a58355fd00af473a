/*
 * mcp_http.h: MCP's Streamable HTTP transport at /mcp on the gateway's
 * HTTP door (http.c): POSTed JSON-RPC messages answered as
 * application/json, an Mcp-Session-Id issued at initialize and required
 * after it, DELETE to end a session, GET refused with 405 (no
 * server-initiated stream). The protocol and tools are clients/mcp/
 * (shared with `moat mcp`); http.c gives the call function, which runs
 * Gateway methods in process with the request's own auth.
 * Not for: the protocol, the tools, or the rest of the HTTP door.
 */
#ifndef MOAT_GATEWAY_MCP_HTTP_H
#define MOAT_GATEWAY_MCP_HTTP_H

#include <stddef.h>

#include <microhttpd.h>

#include "mcp.h"

#define MOAT_MCP_HTTP_MAX_SESSIONS 256
#define MOAT_MCP_HTTP_IDLE_S 3600    /* an idle session may be evicted */

struct moat_mcp_http;

/* moat_mcp_http_new: an empty session table. On MOAT_OK *out is the
 * caller's (moat_mcp_http_free); RESOURCE_EXHAUSTED otherwise. */
int moat_mcp_http_new(struct moat_mcp_http **out)
    __attribute__((warn_unused_result));

/* moat_mcp_http_free: frees every session (their sandboxes are left to
 * their owners). No request may be in progress. Safe on NULL. */
void moat_mcp_http_free(struct moat_mcp_http *m);

/* moat_mcp_http_serve: answers one request to /mcp: `method` is the HTTP
 * method, `body` (`len` bytes, may be NULL) the request body. Gateway
 * methods run through `call` with `arg`. Thread-safe. */
enum MHD_Result moat_mcp_http_serve(struct moat_mcp_http *m,
    struct MHD_Connection *conn, const char *method, const char *body,
    size_t len, moat_mcp_call_fn call, void *arg);

#endif
