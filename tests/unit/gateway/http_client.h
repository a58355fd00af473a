/*
 * http_client.h: the libcurl client that the gateway's unit tests
 * (test_http, test_auth, test_mcp_http) call the HTTP door with: one
 * request with a body, a chunked upload or none and extra headers,
 * answered with the status, the body (parsed when it is JSON), and the
 * Content-Type, Allow, Mcp-Session-Id, Retry-After,
 * WWW-Authenticate and two CORS headers; and the wait until a
 * gateway sees its fake node (fake_node.h).
 * Not for: anything but cmocka tests (a failed transfer fails the
 * running test), nor reading a stream as it comes: a transfer is read
 * whole, or cut once the body holds a given string.
 */
#ifndef MOAT_TEST_HTTP_CLIENT_H
#define MOAT_TEST_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct moat_gateway;

/* One extra header of a request. */
struct http_client_header {
	const char *name;  /* NULL: the end of the list */
	const char *value; /* NULL: the header is not sent */
};

/* One request to the door; designated initialisers, unset fields off. */
struct http_client_req {
	const char *method;
	const char *path; /* with the query string */
	const char *body; /* NULL: none; need not end in NUL */
	size_t body_len;
	size_t chunked;    /* no body: this many 'x', chunked */
	bool body_chunked; /* send `body` chunked, without a length */
	const struct http_client_header *headers; /* may be NULL */
	bool json_type;      /* Content-Type: application/json */
	const char *stop_at; /* cut once the body holds it */
};

/* One HTTP exchange as a test sees it. */
struct http_client_resp {
	long status; /* 0: no answer */
	char *body;  /* heap, NUL-terminated; NULL: empty */
	size_t len;
	char content_type[128];
	char allow[128];            /* the Allow header */
	char session[128];          /* the Mcp-Session-Id header */
	char retry_after[32];       /* the Retry-After header (429) */
	char www_authenticate[128]; /* the WWW-Authenticate header (401) */
	char cors_origin[128];      /* Access-Control-Allow-Origin */
	char cors_expose[128];      /* Access-Control-Expose-Headers */
	json_t *json;               /* the body, when application/json */
};

/* http_client_request: sends `req` to http://127.0.0.1:<port> and fills
 * *r (zeroed first; the caller frees it with http_client_resp_free, also
 * when the test then fails). The body is parsed (any JSON value) when the
 * Content-Type is exactly application/json; r->json is NULL otherwise or
 * when it does not parse. A transport error fails the running test,
 * except a send error after the door answered (it may answer 413 and
 * close before an upload ends) and the cut at req->stop_at. */
void http_client_request(uint16_t port, const struct http_client_req *req,
    struct http_client_resp *r);

/* http_client_resp_free: frees what *r holds and zeroes it; safe on a
 * zeroed or freed one. */
void http_client_resp_free(struct http_client_resp *r);

/* http_client_wait_node: waits up to 4 s for `gw` to list a node that is
 * available (the test's fake node); fails the running test otherwise. */
void http_client_wait_node(struct moat_gateway *gw);

#endif
