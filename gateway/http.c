/*
 * http.c: the gateway's HTTP/JSON door (http.h) on libmicrohttpd. A
 * route table maps URLs to Gateway methods; each request's JSON body (or
 * query string, or URL id) becomes the method's input message through
 * the codec, is packed into a moat.v1.Envelope exactly as an nng client
 * would send it, and goes through moat_rpc_server_dispatch of a detached
 * server serving the gateway's own method table; the Reply comes back as
 * the output message in proto3 JSON, or as {"code", "message"} with the
 * HTTP status of the code.
 * POST .../exec with Accept: text/event-stream (or ?stream=true) streams
 * exec output: ExecStart, then ExecRead long polls, as Server-Sent
 * Events. POST /moat.v1.Gateway/<Method> is the Connect protocol's unary
 * call (JSON or binary protobuf) through the same dispatcher; ExecStream
 * there streams the same output as Connect envelopes or gRPC-Web frames
 * (one producer, struct exec_stream, for the three forms), and gRPC-Web
 * calls every method (framing: http_connect.c). CORS for browsers by
 * [gateway] http-cors-origins. PUT and GET .../files?archive=tar stream
 * tar archives of whole directories in PutArchive/GetArchive chunks
 * (http_archive.c).
 * Not for: behaviour of its own (every route is a Gateway method), or
 * TLS (put a proxy in front).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <jansson.h>
#include <microhttpd.h>

#include "auth.h"
#include "common.pb-c.h"
#include "gateway.pb-c.h"
#include "http.h"
#include "http_archive.h"
#include "http_connect.h"
#include "grpc.h"
#include "mcp_http.h"
#include "moat/codec.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "moat/rpc_dispatch.h"
#include "ratelimit.h"

struct moat_http {
	struct moat_gateway *gw;
	struct MHD_Daemon *daemon;
	struct moat_rpc_server *dispatcher;
	const ProtobufCServiceDescriptor *service;
	uint16_t port;
	struct moat_mcp_http *mcp; /* MCP sessions of /mcp (mcp_http.c) */
	char *tls_cert, *tls_key;  /* PEM, while the daemon runs (HTTPS) */
	struct moat_ratelimit *rl; /* per address and per key buckets */
	uint64_t refused_auth;     /* 401s before a body (atomic) */
	uint32_t rps, burst;       /* of rl; rps 0: no limit */
	char *cors;                /* heap: http-cors-origins; NULL: none */
	uint64_t archive_max;      /* [gateway] archive-max-mib, in bytes */
};

/* One request's state across libmicrohttpd's calls of the handler. */
struct http_req {
	char *body; /* heap, at most MOAT_HTTP_MAX_BODY bytes */
	size_t len, cap;
	bool too_large; /* the rest of the body was dropped */
	bool refused;   /* answered from the headers: drop the body */
	/* PUT .../files?archive=tar: the body streams into PutArchive
	 * chunks (http_archive.c) instead of `body`. */
	struct moat_http_archive_put *archive;
};

/* How a door's refusal made from the headers is written: as the routes'
 * errors, as /mcp's JSON-RPC error, or as a Connect error. */
enum dialect {
	DIALECT_ROUTES,
	DIALECT_MCP,
	DIALECT_CONNECT,
};

enum body_kind {
	BODY_JSON,  /* the JSON body is the input message */
	BODY_QUERY, /* the query string's fields are */
	BODY_FILE,  /* query fields; the raw body is `data` */
};

/* One route: a URL pattern ("{}" is one path segment, the id) and an
 * HTTP method, mapped to a Gateway method. */
struct route {
	const char *pattern;
	const char *http_method;
	const char *rpc_method; /* NULL: the {} segment names it */
	enum body_kind body;
	const char *id_field; /* the field the {} segment fills */
	bool raw_reply;       /* reply with FileData.data as bytes */
};

static const struct route routes[] = {
	{ "/v1/rpc/{}", "POST", NULL, BODY_JSON, NULL, false },
	{ "/v1/sandboxes", "POST", "CreateSandbox", BODY_JSON, NULL, false },
	{ "/v1/sandboxes", "GET", "ListSandboxes", BODY_QUERY, NULL, false },
	{ "/v1/sandboxes/{}", "GET", "GetSandbox", BODY_QUERY, "sandbox_id",
	    false },
	{ "/v1/sandboxes/{}", "DELETE", "DestroySandbox", BODY_QUERY,
	    "sandbox_id", false },
	{ "/v1/sandboxes/{}/exec", "POST", "Exec", BODY_JSON, "sandbox_id",
	    false },
	{ "/v1/sandboxes/{}/files", "GET", "ReadFile", BODY_QUERY,
	    "sandbox_id", true },
	{ "/v1/sandboxes/{}/files", "PUT", "WriteFile", BODY_FILE,
	    "sandbox_id", false },
	{ "/v1/sessions", "GET", "ListSessions", BODY_QUERY, NULL, false },
	{ "/v1/sessions/{}", "GET", "GetSession", BODY_QUERY, "session_id",
	    false },
	{ "/v1/sessions/{}/steps", "GET", "ListSteps", BODY_QUERY,
	    "session_id", false },
	{ "/v1/sessions/{}/tree", "GET", "GetSessionTree", BODY_QUERY,
	    "session_id", false },
	{ "/v1/audit", "GET", "ListAudit", BODY_QUERY, NULL, false },
	{ "/v1/nodes", "GET", "ListNodes", BODY_QUERY, NULL, false },
	{ "/v1/nodes/{}/cordon", "POST", "CordonNode", BODY_JSON, "node_id",
	    false },
	{ "/v1/nodes/{}/drain", "POST", "DrainNode", BODY_JSON, "node_id",
	    false },
	{ "/v1/sandboxes/{}/timeout", "POST", "SetTimeout", BODY_JSON,
	    "sandbox_id", false },
	{ "/v1/images", "GET", "ListImages", BODY_QUERY, NULL, false },
	{ "/v1/images", "POST", "StartImageBuild", BODY_JSON, NULL, false },
	/* node_id in the query: a route fills one path segment. */
	{ "/v1/images/builds/{}", "GET", "GetImageBuild", BODY_QUERY,
	    "build_id", false },
	{ "/v1/images/{}/push", "POST", "PushImage", BODY_JSON, "name",
	    false },
	{ "/v1/images/{}", "DELETE", "RemoveImage", BODY_QUERY, "name",
	    false },
	{ "/healthz", "GET", NULL, BODY_QUERY, NULL, false },
};

#define ROUTE_FAMILIES                                                        \
	"GET /healthz, POST /mcp, POST /v1/rpc/{Method}, "                    \
	"POST /moat.v1.Gateway/{Method} (Connect), "                          \
	"/v1/sandboxes[/{id}[/exec|"                                          \
	"/files|/timeout]], /v1/sessions[/{id}[/steps|/tree]], GET "          \
	"/v1/audit, "                                                         \
	"/metrics, /v1/nodes[/{id}/cordon|/drain], "                          \
	"/v1/images[/{name}[/push]|/builds/{id}], /v1/openapi.json"

/* ---- replies ---- */

static int
http_status_of(int code)
{
	switch (code) {
	case MOAT_OK:
		return MHD_HTTP_OK;
	case MOAT_INVALID_ARGUMENT:
	case MOAT_OUT_OF_RANGE:
		return MHD_HTTP_BAD_REQUEST;
	case MOAT_NOT_FOUND:
		return MHD_HTTP_NOT_FOUND;
	case MOAT_ALREADY_EXISTS:
	case MOAT_ABORTED:
		return MHD_HTTP_CONFLICT;
	case MOAT_PERMISSION_DENIED:
		return MHD_HTTP_FORBIDDEN;
	case MOAT_UNAUTHENTICATED:
		return MHD_HTTP_UNAUTHORIZED;
	case MOAT_RESOURCE_EXHAUSTED:
		return MHD_HTTP_TOO_MANY_REQUESTS;
	case MOAT_FAILED_PRECONDITION:
		return MHD_HTTP_PRECONDITION_FAILED;
	case MOAT_UNIMPLEMENTED:
		return MHD_HTTP_NOT_IMPLEMENTED;
	case MOAT_UNAVAILABLE:
		return MHD_HTTP_SERVICE_UNAVAILABLE;
	case MOAT_DEADLINE_EXCEEDED:
		return MHD_HTTP_GATEWAY_TIMEOUT;
	default:
		return MHD_HTTP_INTERNAL_SERVER_ERROR;
	}
}

/* ---- CORS: [gateway] http-cors-origins ---- */

/* The request headers a browser's Connect or gRPC-Web client sends, and
 * the reply headers it must be let read (gRPC-Web's status may come as
 * headers). */
#define CORS_ALLOW_HEADERS                                                    \
	"authorization, content-type, connect-protocol-version, "             \
	"connect-timeout-ms, grpc-timeout, x-grpc-web, x-user-agent, "        \
	"x-moat-request-id, x-moat-timeout-ms"
#define CORS_EXPOSE_HEADERS                                                   \
	"grpc-status, grpc-message, grpc-status-details-bin"

/* door_of: the door serving `conn`: its socket context, set when the
 * connection is accepted (on_connection). */
static struct moat_http *
door_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci != NULL ? ci->socket_context : NULL;
}

/* cors_origin: the request's Origin when the door lets it read replies
 * ([gateway] http-cors-origins); NULL otherwise. */
static const char *
cors_origin(struct MHD_Connection *conn)
{
	const struct moat_http *h = door_of(conn);
	const char *origin =
	    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");

	if (h == NULL || origin == NULL ||
	    !moat_http_cors_allowed(h->cors, origin))
		return NULL;
	return origin;
}

/* cors_headers: on a reply to an allowed Origin, the headers that let
 * the browser's script read it. */
static void
cors_headers(struct MHD_Connection *conn, struct MHD_Response *resp)
{
	const char *origin = cors_origin(conn);

	if (origin == NULL)
		return;
	MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
	MHD_add_response_header(resp, "Access-Control-Expose-Headers",
	    CORS_EXPOSE_HEADERS);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Origin");
}

/* respond_with: queues `body` (heap, taken in every case; NULL: empty)
 * with `status`, `content_type` and the header `name`: `value` (name
 * NULL: none). */
static enum MHD_Result
respond_with(struct MHD_Connection *conn, unsigned status, char *body,
    size_t len, const char *content_type, const char *name, const char *value)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;

	resp = MHD_create_response_from_buffer(body ? len : 0, body,
	    body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (resp == NULL) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
	    content_type);
	if (name != NULL)
		MHD_add_response_header(resp, name, value);
	if (status == MHD_HTTP_UNAUTHORIZED)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
		    "Bearer realm=\"moat\"");
	cors_headers(conn, resp);
	ret = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* respond: respond_with an Allow header when `allow` is not NULL. */
static enum MHD_Result
respond(struct MHD_Connection *conn, unsigned status, char *body, size_t len,
    const char *content_type, const char *allow)
{
	return respond_with(conn, status, body, len, content_type,
	    allow ? MHD_HTTP_HEADER_ALLOW : NULL, allow);
}

/* respond_json: `j` (a reference taken) as the body. */
static enum MHD_Result
respond_json(struct MHD_Connection *conn, unsigned status, json_t *j,
    const char *allow)
{
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

	json_decref(j);
	if (text == NULL)
		return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL, 0,
		    "application/json", NULL);
	return respond(conn, status, text, strlen(text), "application/json",
	    allow);
}

/* error_json: {"code": name, "message": message}; NULL when out of
 * memory. */
static json_t *
error_json(const char *name, const char *message)
{
	json_t *j = json_pack("{s:s, s:s}", "code", name, "message", message);

	/* A message that echoes bytes of the request (a URL that is not
	 * UTF-8) is sent with those bytes as '?'. */
	if (j == NULL) {
		char *clean = strdup(message);

		for (char *p = clean; p != NULL && *p != '\0'; p++)
			if ((unsigned char)*p >= 0x80)
				*p = '?';
		if (clean != NULL)
			j = json_pack("{s:s, s:s}", "code", name, "message",
			    clean);
		free(clean);
	}
	return j;
}

/* respond_error: {"code": "NOT_FOUND", "message": ...} with the HTTP
 * status of `code` (or `status` when not 0). */
static enum MHD_Result
respond_error(struct MHD_Connection *conn, unsigned status, int code,
    const char *message, const char *allow)
{
	return respond_json(conn,
	    status ? status : (unsigned)http_status_of(code),
	    error_json(moat_strerror(code),
	        message ? message : moat_strerror(code)),
	    allow);
}

/* ---- Connect errors ---- */

/* connect_status_of: the HTTP status of `code` in the Connect protocol's
 * table, which differs from http_status_of's: failed_precondition is a
 * 400 and canceled a 499. */
static unsigned
connect_status_of(int code)
{
	switch (code) {
	case MOAT_CANCELLED:
		return 499;
	case MOAT_FAILED_PRECONDITION:
		return MHD_HTTP_BAD_REQUEST;
	default:
		return (unsigned)http_status_of(code);
	}
}

/* connect_error: a Connect unary error, {"code": "not_found", "message":
 * ...} as application/json whatever the request's codec, with the
 * status of `code` in Connect's table (or `status` when not 0). */
static enum MHD_Result
connect_error(struct MHD_Connection *conn, unsigned status, int code,
    const char *message, const char *allow)
{
	return respond_json(conn, status ? status : connect_status_of(code),
	    error_json(moat_http_connect_code(code),
	        message ? message : moat_http_connect_code(code)),
	    allow);
}

/* ---- calling the gateway ---- */

/* header_u64: a decimal header value, or `def` when absent. False when
 * present but not a number. */
static bool
header_u64(struct MHD_Connection *conn, const char *name, uint64_t max,
    uint64_t *out)
{
	const char *v =
	    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
	char *end;
	unsigned long long n;

	if (v == NULL)
		return true;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || n > max)
		return false;
	*out = n;
	return true;
}

int
moat_http_bearer_key(const char *authz, const char **auth, char **errmsg)
{
	*auth = "";
	if (authz == NULL)
		return MOAT_OK;
	if (strncasecmp(authz, "Bearer ", 7) != 0) {
		*errmsg = moat_asprintf("the Authorization header must be "
		                        "\"Bearer <api key>\"");
		return MOAT_UNAUTHENTICATED;
	}
	*auth = authz + 7;
	return MOAT_OK;
}

/* request_auth: the request's api key (a pointer into the connection's
 * headers, "" when none), request id (0: new) and timeout from its
 * headers. A status with *errmsg (heap, caller frees) when malformed. */
static int
request_auth(struct MHD_Connection *conn, const char **auth, uint64_t *rid,
    uint64_t *timeout, char **errmsg)
{
	if (!header_u64(conn, "X-Moat-Request-Id", UINT64_MAX, rid) ||
	    !header_u64(conn, "X-Moat-Timeout-Ms", UINT32_MAX, timeout)) {
		*errmsg =
		    moat_asprintf("X-Moat-Request-Id and "
		                  "X-Moat-Timeout-Ms must be decimal numbers");
		return MOAT_INVALID_ARGUMENT;
	}
	return moat_http_bearer_key(MHD_lookup_connection_value(conn,
	                                MHD_HEADER_KIND,
	                                MHD_HTTP_HEADER_AUTHORIZATION),
	    auth, errmsg);
}

/* call_gateway_as: call_gateway with the api key, request id (0: a new
 * one) and timeout given rather than read from a connection, for calls
 * made after the request's headers may be gone (exec streams). */
static int
call_gateway_as(struct moat_http *h, const char *auth, uint64_t rid,
    uint32_t timeout_ms, const ProtobufCMethodDescriptor *md,
    const ProtobufCMessage *req, ProtobufCMessage **reply, char **errmsg)
{
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	Moat__V1__Reply *r = NULL;
	uint8_t *payload = NULL, *packed = NULL, *out = NULL;
	size_t payload_len, packed_len, out_len = 0;
	uint64_t timeout = timeout_ms;
	int rv;

	*reply = NULL;
	*errmsg = NULL;
	env.auth = (char *)auth;
	payload_len = protobuf_c_message_get_packed_size(req);
	if ((payload = malloc(payload_len ? payload_len : 1)) == NULL)
		goto fail_oom;
	protobuf_c_message_pack(req, payload);
	env.service = (char *)h->service->name;
	env.method = (char *)md->name;
	env.request_id = rid != 0 ? rid : moat_rpc_new_request_id();
	env.timeout_ms = (uint32_t)timeout;
	env.payload.data = payload;
	env.payload.len = payload_len;
	packed_len = moat__v1__envelope__get_packed_size(&env);
	if ((packed = malloc(packed_len)) == NULL)
		goto fail_oom;
	moat__v1__envelope__pack(&env, packed);
	if (moat_rpc_server_dispatch(h->dispatcher, packed, packed_len, &out,
	        &out_len) != 0)
		goto fail_oom;
	if ((r = moat__v1__reply__unpack(NULL, out_len, out)) == NULL) {
		rv = MOAT_INTERNAL;
		*errmsg = moat_asprintf("the gateway's reply to %s did not "
		                        "decode",
		    md->name);
		goto out;
	}
	if (r->code != MOAT__V1__CODE__OK) {
		rv = (int)r->code;
		*errmsg = strdup(r->message ? r->message : "");
		goto out;
	}
	*reply = protobuf_c_message_unpack(md->output, NULL, r->payload.len,
	    r->payload.data);
	if (*reply == NULL) {
		rv = MOAT_INTERNAL;
		*errmsg = moat_asprintf("the reply payload of %s is not a %s",
		    md->name, md->output->name);
		goto out;
	}
	rv = MOAT_OK;
	goto out;

fail_oom:
	rv = MOAT_RESOURCE_EXHAUSTED;
	*errmsg = moat_asprintf("out of memory calling %s", md->name);
out:
	if (r != NULL)
		moat__v1__reply__free_unpacked(r, NULL);
	free(out);
	free(packed);
	free(payload);
	return rv;
}

/* call_gateway: runs `method` with `req` through the gateway's own
 * dispatcher, as an nng client's Envelope would. On MOAT_OK *reply is a
 * message of the method's output the caller frees with
 * protobuf_c_message_free_unpacked(*reply, NULL); otherwise *errmsg
 * (heap, caller frees) has the gateway's message. */
static int
call_gateway(struct moat_http *h, struct MHD_Connection *conn,
    const ProtobufCMethodDescriptor *md, const ProtobufCMessage *req,
    uint32_t default_timeout_ms, ProtobufCMessage **reply, char **errmsg)
{
	const char *auth;
	uint64_t rid = 0, timeout = default_timeout_ms;
	int rv;

	*reply = NULL;
	*errmsg = NULL;
	if ((rv = request_auth(conn, &auth, &rid, &timeout, errmsg)) !=
	    MOAT_OK)
		return rv;
	return call_gateway_as(h, auth, rid, (uint32_t)timeout, md, req, reply,
	    errmsg);
}

/* ---- building the input message ---- */

struct query_ctx {
	const ProtobufCMessageDescriptor *d;
	json_t *obj;
	bool failed;
};

/* query_field: one query argument as a JSON value of its field: a bool
 * field takes true/false, anything else a string (the codec parses
 * numbers and enum names from strings). */
static enum MHD_Result
query_field(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct query_ctx *q = cls;
	const ProtobufCFieldDescriptor *f = moat_codec_find_field(q->d, key);
	json_t *v;

	if (value == NULL)
		value = "";
	if (f != NULL && f->type == PROTOBUF_C_TYPE_BOOL &&
	    f->label != PROTOBUF_C_LABEL_REPEATED &&
	    (strcmp(value, "true") == 0 || strcmp(value, "false") == 0))
		v = json_boolean(strcmp(value, "true") == 0);
	else
		v = json_string(value);
	/* A repeated key, or bytes that are not UTF-8: refused by the
	 * codec as a type error or here. */
	if (v == NULL || json_object_get(q->obj, key) != NULL) {
		json_decref(v);
		q->failed = true;
		return MHD_NO;
	}
	if (json_object_set_new(q->obj, key, v) != 0)
		q->failed = true;
	return MHD_YES;
}

/* query_parse: the arguments of the raw query string `query` through
 * query_field, split and unescaped as libmicrohttpd does for a
 * connection (for moat_http_decode, which has none). */
static void
query_parse(const char *query, struct query_ctx *q)
{
	char *copy = strdup(query), *save = NULL, *tok;

	if (copy == NULL) {
		q->failed = true;
		return;
	}
	for (tok = strtok_r(copy, "&", &save); tok != NULL && !q->failed;
	     tok = strtok_r(NULL, "&", &save)) {
		char *eq = strchr(tok, '=');

		if (eq != NULL) {
			*eq = '\0';
			MHD_http_unescape(eq + 1);
		}
		MHD_http_unescape(tok);
		query_field(q, MHD_GET_ARGUMENT_KIND, tok,
		    eq != NULL ? eq + 1 : NULL);
	}
	free(copy);
}

/* build_input: the JSON of the method's input from the route's source
 * (the query arguments of `conn`, or of `query` when conn is NULL),
 * with the URL id put in its field. NULL with *errmsg (heap) set on a
 * client error. */
static json_t *
build_input(struct MHD_Connection *conn, const char *query,
    const struct route *rt, const ProtobufCMessageDescriptor *in,
    const struct http_req *hr, const char *id, char **errmsg)
{
	json_t *obj;

	if (rt->body == BODY_JSON && hr->len > 0) {
		json_error_t jerr;

		obj = json_loadb(hr->body, hr->len, JSON_REJECT_DUPLICATES,
		    &jerr);
		if (obj == NULL) {
			*errmsg = moat_asprintf("malformed JSON body at line "
			                        "%d column %d: %s",
			    jerr.line, jerr.column, jerr.text);
			return NULL;
		}
		if (!json_is_object(obj)) {
			json_decref(obj);
			*errmsg = moat_asprintf("the body must be a JSON "
			                        "object (a %s)",
			    in->name);
			return NULL;
		}
	} else if (rt->body == BODY_JSON) {
		obj = json_object();
	} else {
		struct query_ctx q = { .d = in, .obj = json_object() };

		if ((obj = q.obj) == NULL)
			goto fail_oom;
		if (conn != NULL)
			MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND,
			    query_field, &q);
		else if (query != NULL)
			query_parse(query, &q);
		if (q.failed) {
			json_decref(obj);
			*errmsg = moat_asprintf(
			    "the query string has a key "
			    "twice or a value that is not UTF-8");
			return NULL;
		}
	}
	if (obj == NULL)
		goto fail_oom;
	if (rt->id_field != NULL) {
		const ProtobufCFieldDescriptor *idf =
		    moat_codec_find_field(in, rt->id_field);
		const char *key;
		json_t *v;

		json_object_foreach (obj, key, v) {
			if (moat_codec_find_field(in, key) == idf) {
				char json_name[64];
				moat_codec_json_name(rt->id_field, json_name,
				    sizeof(json_name));
				*errmsg = moat_asprintf(
				    "%s comes from the "
				    "URL; leave it out of the request",
				    json_name);
				json_decref(obj);
				return NULL;
			}
		}
		if (json_object_set_new(obj, rt->id_field, json_string(id)) !=
		    0) {
			json_decref(obj);
			*errmsg = moat_asprintf("the id in the URL is not "
			                        "UTF-8");
			return NULL;
		}
	}
	return obj;

fail_oom:
	*errmsg = moat_asprintf("out of memory");
	return NULL;
}

/* ---- routing ---- */

/* route_match: whether `url` matches `pattern`; the {} segment (if any)
 * is copied to id (size bytes). */
static bool
route_match(const char *pattern, const char *url, char *id, size_t size)
{
	const char *p = pattern, *u = url;

	while (*p != '\0') {
		if (p[0] == '{' && p[1] == '}') {
			const char *end = strchr(u, '/');
			size_t n = end ? (size_t)(end - u) : strlen(u);

			if (n == 0 || n >= size)
				return false;
			memcpy(id, u, n);
			id[n] = '\0';
			u += n;
			p += 2;
			continue;
		}
		if (*p != *u)
			return false;
		p++;
		u++;
	}
	return *u == '\0' || (u[0] == '/' && u[1] == '\0');
}

/* find_route: the route of `method` `url`, its {} segment in id (size
 * bytes); NULL when none, with the methods the URL takes in allow
 * (size 64). */
static const struct route *
find_route(const char *url, const char *method, char *id, size_t size,
    char allow[64])
{
	allow[0] = '\0';
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		const struct route *rt = &routes[i];

		if (!route_match(rt->pattern, url, id, size))
			continue;
		if (strcmp(rt->http_method, method) == 0)
			return rt;
		size_t n = strlen(allow);
		snprintf(allow + n, 64 - n, "%s%s", n ? ", " : "",
		    rt->http_method);
	}
	return NULL;
}

int
moat_http_decode(const ProtobufCServiceDescriptor *svc, const char *method,
    const char *url, const char *query, const char *body, size_t len,
    ProtobufCMessage **out, char **errmsg)
{
	const struct http_req hr = { .body = (char *)body, .len = len };
	const ProtobufCMethodDescriptor *md;
	const struct route *rt;
	char id[MOAT_ID_MAX], allow[64];
	json_t *in;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if ((rt = find_route(url, method, id, sizeof(id), allow)) == NULL) {
		*errmsg = moat_asprintf("no route %s %s%s%s", method, url,
		    allow[0] ? ": use " : "", allow);
		return MOAT_NOT_FOUND;
	}
	if (strcmp(rt->pattern, "/healthz") == 0)
		return MOAT_OK;
	md = protobuf_c_service_descriptor_get_method_by_name(svc,
	    rt->rpc_method ? rt->rpc_method : id);
	if (md == NULL) {
		*errmsg = moat_asprintf("no method %s", id);
		return MOAT_NOT_FOUND;
	}
	if ((in = build_input(NULL, query, rt, md->input, &hr,
	         rt->rpc_method ? id : NULL, errmsg)) == NULL)
		return MOAT_INVALID_ARGUMENT;
	rv = moat_codec_from_json(md->input, in, 0, out, errmsg);
	json_decref(in);
	return rv;
}

/* ---- exec output as it comes: SSE, Connect or gRPC-Web ---- */

#define EXEC_STREAM_WAIT_MS 1000     /* one ExecRead's long poll */
#define EXEC_STREAM_READ_BYTES 65536 /* per stream per ExecRead */
#define EXEC_STREAM_CALL_MS 10000    /* an ExecRead's deadline past it */
#define EXEC_STREAM_KILL_MS 5000

/* One streamed exec, owned by its MHD response: the reader polls
 * ExecRead and writes what comes back in the stream's form (`wire`:
 * Server-Sent Events, Connect envelopes or gRPC-Web frames, one
 * producer for all three); the free callback kills the process unless
 * it was seen to exit. At most one ExecRead's worth of output (about
 * 2 * 4/3 * EXEC_STREAM_READ_BYTES) is held. */
struct exec_stream {
	struct moat_http *h;
	enum moat_http_wire wire; /* MOAT_WIRE_SSE or a streaming form */
	int fd;                   /* the client's socket (peer_gone) */
	char *auth;               /* heap: the request's api key */
	uint64_t request_id;      /* ExecStart's, for the logs; each
	                             * later call gets its own (a
	                             * mutating id is used only once) */
	uint64_t deadline_ms;     /* moat_rpc_now_ms; 0: none */
	char *sandbox_id;         /* heap */
	uint64_t exec_id;
	uint64_t stdout_offset, stderr_offset;
	struct moat_http_buf pending; /* not yet sent */
	size_t pending_sent;
	bool exited; /* the process is gone: nothing to kill */
	bool done;   /* the last event is in `pending` */
};

/* How a stream is asked for and whose it is, read before it starts. */
struct stream_opts {
	enum moat_http_wire wire;
	const char *auth;
	uint64_t rid;
	uint32_t timeout_ms;  /* ExecStart's deadline (0: the default) */
	uint64_t deadline_ms; /* the stream's, moat_rpc_now_ms; 0: none */
};

/* wants_event_stream: whether the client asked for exec output as it
 * comes (Accept: text/event-stream, or ?stream=true). */
static bool
wants_event_stream(struct MHD_Connection *conn)
{
	const char *accept = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_ACCEPT);
	const char *q =
	    MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "stream");

	return (accept != NULL &&
	           strstr(accept, "text/event-stream") != NULL) ||
	    (q != NULL && (strcmp(q, "true") == 0 || strcmp(q, "1") == 0));
}

/* buf_append: `n` bytes onto b. False when out of memory. */
static bool
buf_append(struct moat_http_buf *b, const void *data, size_t n)
{
	uint8_t *nb = realloc(b->data, b->len + n);

	if (nb == NULL)
		return false;
	memcpy(nb + b->len, data, n);
	b->data = nb;
	b->len += n;
	return true;
}

/* sse_append: "event: <event>\ndata: <j compact>\n\n" (or the comment
 * line `comment` when event is NULL) onto st->pending; takes `j`. False
 * when out of memory. */
static bool
sse_append(struct exec_stream *st, const char *event, json_t *j,
    const char *comment)
{
	char *data = NULL, *line;
	bool ok;

	if (event != NULL) {
		data = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
		if (data == NULL)
			return false;
		line = moat_asprintf("event: %s\ndata: %s\n\n", event, data);
		free(data);
	} else {
		line = moat_asprintf(": %s\n\n", comment);
	}
	ok = line != NULL && buf_append(&st->pending, line, strlen(line));
	free(line);
	return ok;
}

/* sse_event: an ExecEvent as SSE: start (the ExecHandle), stdout and
 * stderr ({"data": base64}), exit (the ExecStatus). */
static bool
sse_event(struct exec_stream *st, const Moat__V1__ExecEvent *ev)
{
	const ProtobufCBinaryData *bytes =
	    ev->event_case == MOAT__V1__EXEC_EVENT__EVENT_STDOUT ?
	    &ev->stdout :
	    &ev->stderr;
	ProtobufCMessage *m =
	    ev->event_case == MOAT__V1__EXEC_EVENT__EVENT_STARTED ?
	    (ProtobufCMessage *)ev->started :
	    (ProtobufCMessage *)ev->exit;
	char *errmsg = NULL, *b64;
	json_t *j = NULL;

	if (ev->event_case == MOAT__V1__EXEC_EVENT__EVENT_STDOUT ||
	    ev->event_case == MOAT__V1__EXEC_EVENT__EVENT_STDERR) {
		b64 = moat_codec_base64(bytes->data, bytes->len);
		j = b64 ? json_pack("{s:s}", "data", b64) : NULL;
		free(b64);
		return j != NULL &&
		    sse_append(st,
		        ev->event_case == MOAT__V1__EXEC_EVENT__EVENT_STDOUT ?
		            "stdout" :
		            "stderr",
		        j, NULL);
	}
	if (moat_codec_to_json(m, 0, &j, &errmsg) != MOAT_OK) {
		free(errmsg);
		return false;
	}
	return sse_append(st,
	    ev->event_case == MOAT__V1__EXEC_EVENT__EVENT_STARTED ? "start" :
	                                                            "exit",
	    j, NULL);
}

/* stream_event: one ExecEvent in the stream's form: an SSE event, or an
 * enveloped message, proto3 JSON for connect+json, packed otherwise. */
static bool
stream_event(struct exec_stream *st, const Moat__V1__ExecEvent *ev)
{
	char *errmsg = NULL, *text = NULL;
	uint8_t *packed;
	size_t len;
	json_t *j = NULL;
	bool ok;

	if (st->wire == MOAT_WIRE_SSE)
		return sse_event(st, ev);
	if (st->wire == MOAT_WIRE_CONNECT_JSON) {
		if (moat_codec_to_json((const ProtobufCMessage *)ev, 0, &j,
		        &errmsg) != MOAT_OK) {
			free(errmsg);
			return false;
		}
		text = json_dumps(j, JSON_COMPACT);
		json_decref(j);
		ok = text != NULL &&
		    moat_http_frame(&st->pending, MOAT_HTTP_FLAG_MESSAGE, text,
		        strlen(text));
		free(text);
		return ok;
	}
	len = protobuf_c_message_get_packed_size((const ProtobufCMessage *)ev);
	if ((packed = malloc(len ? len : 1)) == NULL)
		return false;
	protobuf_c_message_pack((const ProtobufCMessage *)ev, packed);
	ok =
	    moat_http_frame(&st->pending, MOAT_HTTP_FLAG_MESSAGE, packed, len);
	free(packed);
	return ok;
}

/* stream_bytes: a stdout or stderr ExecEvent of `bytes`. */
static bool
stream_bytes(struct exec_stream *st, bool is_stdout,
    const ProtobufCBinaryData *bytes)
{
	Moat__V1__ExecEvent ev = MOAT__V1__EXEC_EVENT__INIT;

	ev.event_case = is_stdout ? MOAT__V1__EXEC_EVENT__EVENT_STDOUT :
	                            MOAT__V1__EXEC_EVENT__EVENT_STDERR;
	if (is_stdout)
		ev.stdout = *bytes;
	else
		ev.stderr = *bytes;
	return stream_event(st, &ev);
}

/* wire_end: the end of a stream in `w` onto b: Connect's end-of-stream
 * message, gRPC-Web's trailers, or (SSE) an `error` event
 * {"code", "message"} unless code is MOAT_OK. */
static bool
wire_end(struct moat_http_buf *b, enum moat_http_wire w, int code,
    const char *message)
{
	json_t *j;
	char *text, *line;
	bool ok;

	if (w == MOAT_WIRE_CONNECT_JSON || w == MOAT_WIRE_CONNECT_PROTO)
		return moat_http_connect_end(b, code, message);
	if (w == MOAT_WIRE_GRPC_WEB || w == MOAT_WIRE_GRPC_WEB_TEXT)
		return moat_http_grpc_web_trailers(b, code, message);
	if (code == MOAT_OK)
		return true;
	j = json_pack("{s:s, s:s}", "code", moat_strerror(code), "message",
	    message ? message : "");
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	line = text ? moat_asprintf("event: error\ndata: %s\n\n", text) : NULL;
	ok = line != NULL && buf_append(b, line, strlen(line));
	json_decref(j);
	free(text);
	free(line);
	return ok;
}

/* stream_end: the stream's last message, its status; nothing follows. */
static void
stream_end(struct exec_stream *st, int code, const char *message)
{
	if (!wire_end(&st->pending, st->wire, code, message))
		moat_warn(st->request_id,
		    "http-exec-stream sandbox %s exec %llu: out of memory "
		    "ending the stream (%s)",
		    st->sandbox_id, (unsigned long long)st->exec_id,
		    moat_strerror(code));
	st->done = true;
}

/* peer_gone: whether the client closed its side. Connect and gRPC-Web
 * have no comment to write while a command is quiet (SSE writes one),
 * so a quiet stream looks at its socket instead: a read of 0 bytes is
 * the peer's FIN. */
static bool
peer_gone(int fd)
{
	char c;

	return fd >= 0 && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* exec_stream_kill: ExecKill of the stream's process, once. */
static void
exec_stream_kill(struct exec_stream *st)
{
	Moat__V1__ExecKillRequest kq = MOAT__V1__EXEC_KILL_REQUEST__INIT;
	const ProtobufCMethodDescriptor *md =
	    protobuf_c_service_descriptor_get_method_by_name(st->h->service,
	        "ExecKill");
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;

	if (st->exited || st->sandbox_id == NULL)
		return;
	st->exited = true;
	kq.sandbox_id = st->sandbox_id;
	kq.exec_id = st->exec_id;
	if (call_gateway_as(st->h, st->auth ? st->auth : "", 0,
	        EXEC_STREAM_KILL_MS, md, (ProtobufCMessage *)&kq, &reply,
	        &errmsg) != MOAT_OK)
		moat_warn(st->request_id,
		    "http-exec-stream-kill "
		    "sandbox %s exec %llu: the stream ended but the "
		    "kill failed: %s",
		    st->sandbox_id, (unsigned long long)st->exec_id, errmsg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	free(errmsg);
}

/* stream_wait_ms: how long the next ExecRead may wait: a long poll's
 * worth, or less if the deadline comes first; 0 when it has passed. */
static uint32_t
stream_wait_ms(const struct exec_stream *st)
{
	uint64_t now = moat_rpc_now_ms();

	if (st->deadline_ms == 0)
		return EXEC_STREAM_WAIT_MS;
	if (now >= st->deadline_ms)
		return 0;
	return st->deadline_ms - now < EXEC_STREAM_WAIT_MS ?
	    (uint32_t)(st->deadline_ms - now) :
	    EXEC_STREAM_WAIT_MS;
}

/* stream_exit: the exit event of ExecRead's `rr` and the stream's end. */
static bool
stream_exit(struct exec_stream *st, Moat__V1__ExecReadReply *rr)
{
	Moat__V1__ExecStatus none = MOAT__V1__EXEC_STATUS__INIT;
	Moat__V1__ExecEvent ev = MOAT__V1__EXEC_EVENT__INIT;

	st->exited = true;
	ev.event_case = MOAT__V1__EXEC_EVENT__EVENT_EXIT;
	ev.exit = rr->status != NULL ? rr->status : &none;
	if (!stream_event(st, &ev))
		return false;
	stream_end(st, MOAT_OK, NULL);
	return true;
}

/* exec_stream_poll: one ExecRead (blocking up to about
 * EXEC_STREAM_WAIT_MS), its output as events; the exit event and the
 * end once everything is read; past the deadline, the kill and
 * DEADLINE_EXCEEDED. When nothing came: SSE writes a comment, so that a
 * client that went away is noticed at the next write; the other forms
 * look at the socket. False when the client is gone. */
static bool
exec_stream_poll(struct exec_stream *st)
{
	Moat__V1__ExecReadRequest rq = MOAT__V1__EXEC_READ_REQUEST__INIT;
	const ProtobufCMethodDescriptor *md =
	    protobuf_c_service_descriptor_get_method_by_name(st->h->service,
	        "ExecRead");
	Moat__V1__ExecReadReply *rr;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	bool had_output, ok = true;
	int rv;

	if ((rq.wait_ms = stream_wait_ms(st)) == 0) {
		exec_stream_kill(st);
		stream_end(st, MOAT_DEADLINE_EXCEEDED,
		    "the stream's deadline (Connect-Timeout-Ms or "
		    "grpc-timeout) passed: the command was killed");
		return true;
	}
	rq.sandbox_id = st->sandbox_id;
	rq.exec_id = st->exec_id;
	rq.stdout_offset = st->stdout_offset;
	rq.stderr_offset = st->stderr_offset;
	rq.max_bytes = EXEC_STREAM_READ_BYTES;
	rv = call_gateway_as(st->h, st->auth, 0,
	    rq.wait_ms + EXEC_STREAM_CALL_MS, md, (ProtobufCMessage *)&rq,
	    &reply, &errmsg);
	if (rv != MOAT_OK) {
		stream_end(st, rv, errmsg);
		free(errmsg);
		return true;
	}
	rr = (Moat__V1__ExecReadReply *)reply;
	had_output = rr->stdout.len > 0 || rr->stderr.len > 0;
	if (rr->stdout.len > 0)
		ok = ok && stream_bytes(st, true, &rr->stdout);
	if (rr->stderr.len > 0)
		ok = ok && stream_bytes(st, false, &rr->stderr);
	st->stdout_offset = rr->stdout_next > st->stdout_offset ?
	    rr->stdout_next :
	    st->stdout_offset + rr->stdout.len;
	st->stderr_offset = rr->stderr_next > st->stderr_offset ?
	    rr->stderr_next :
	    st->stderr_offset + rr->stderr.len;
	/* eof: exited and all read. An exited process whose read came
	 * back empty has nothing left either, eof or not. */
	if (ok &&
	    (rr->eof ||
	        (rr->status != NULL && rr->status->exited && !had_output)))
		ok = stream_exit(st, rr);
	else if (ok && !had_output && st->wire == MOAT_WIRE_SSE)
		ok = sse_append(st, NULL, NULL, "waiting");
	else if (ok && !had_output && peer_gone(st->fd)) {
		protobuf_c_message_free_unpacked(reply, NULL);
		return false;
	}
	protobuf_c_message_free_unpacked(reply, NULL);
	if (!ok)
		stream_end(st, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory formatting exec output");
	return true;
}

/* wire_text: gRPC-Web-text's base64 of b's bytes from `from` on, in
 * place (each piece padded: clients decode 4 characters at a time). */
static bool
wire_text(struct moat_http_buf *b, size_t from)
{
	char *b64;

	if (b->len == from)
		return true;
	if ((b64 = moat_codec_base64(b->data + from, b->len - from)) == NULL)
		return false;
	b->len = from;
	if (!buf_append(b, b64, strlen(b64))) {
		free(b64);
		return false;
	}
	free(b64);
	return true;
}

/* exec_stream_read: libmicrohttpd's content reader; blocks this
 * connection's thread (thread per connection) for one ExecRead at most
 * per poll. */
static ssize_t
exec_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct exec_stream *st = cls;
	size_t n;

	(void)pos;
	while (st->pending_sent == st->pending.len) {
		free(st->pending.data);
		st->pending.data = NULL;
		st->pending.len = st->pending_sent = 0;
		if (st->done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (!exec_stream_poll(st))
			return MHD_CONTENT_READER_END_WITH_ERROR; /* killed */
		if (st->wire == MOAT_WIRE_GRPC_WEB_TEXT &&
		    !wire_text(&st->pending, 0))
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (st->done && st->pending.len == 0) /* no end fit */
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
	n = st->pending.len - st->pending_sent;
	if (n > max)
		n = max;
	memcpy(buf, st->pending.data + st->pending_sent, n);
	st->pending_sent += n;
	return (ssize_t)n;
}

/* exec_stream_free: libmicrohttpd's free callback, once the response is
 * done with: whole, failed, or the client gone. Kills the process
 * unless it exited, so no command outlives the stream that shows it. */
static void
exec_stream_free(void *cls)
{
	struct exec_stream *st = cls;

	if (st == NULL)
		return;
	exec_stream_kill(st);
	free(st->pending.data);
	free(st->sandbox_id);
	free(st->auth);
	free(st);
}

/* stream_response: a 200 whose body `st` writes (st NULL: the `len`
 * bytes at `body`, taken), in `w`'s Content-Type, with the CORS headers
 * of the door. MHD_NO when it cannot be queued. */
static enum MHD_Result
stream_response(struct MHD_Connection *conn, enum moat_http_wire w,
    struct exec_stream *st, uint8_t *body, size_t len)
{
	struct MHD_Response *resp = st != NULL ?
	    MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
	        exec_stream_read, st, exec_stream_free) :
	    MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	enum MHD_Result ret;

	if (resp == NULL) {
		if (st != NULL)
			exec_stream_free(st);
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
	    w == MOAT_WIRE_SSE ? "text/event-stream" : moat_http_wire_type(w));
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
	    "no-cache");
	cors_headers(conn, resp);
	ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp); /* a failed queue frees st: killed */
	return ret;
}

/* wire_error: an error in `w` before anything was streamed: a JSON
 * error for SSE and Connect unary; for the streaming forms a 200 whose
 * body is the end alone (Connect's end-of-stream message, gRPC-Web's
 * trailers), as their clients read errors. */
static enum MHD_Result
wire_error(struct MHD_Connection *conn, enum moat_http_wire w, int code,
    const char *message)
{
	struct moat_http_buf b = { 0 };

	if (w == MOAT_WIRE_SSE)
		return respond_error(conn, 0, code, message, NULL);
	if (!moat_http_wire_streams(w))
		return connect_error(conn, 0, code, message, NULL);
	if (!wire_end(&b, w, code, message) ||
	    (w == MOAT_WIRE_GRPC_WEB_TEXT && !wire_text(&b, 0))) {
		free(b.data);
		return MHD_NO;
	}
	return stream_response(conn, w, NULL, b.data, b.len);
}

/* connection_fd: the client's socket, -1 when unknown. */
static int
connection_fd(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

	return ci != NULL ? ci->connect_fd : -1;
}

/* serve_exec_stream: exec output as it comes: ExecStart with `req` (an
 * ExecRequest, the caller's), then the ExecHandle (SSE: a `start`
 * event; else a `started` ExecEvent), stdout/stderr events as output
 * comes, and the exit ExecStatus, then the stream's end in o->wire.
 * Errors before the start are wire_error's. */
static enum MHD_Result
serve_exec_stream(struct moat_http *h, struct MHD_Connection *conn,
    const ProtobufCMessage *req, const struct stream_opts *o)
{
	const ProtobufCMethodDescriptor *md =
	    protobuf_c_service_descriptor_get_method_by_name(h->service,
	        "ExecStart");
	Moat__V1__ExecEvent ev = MOAT__V1__EXEC_EVENT__INIT;
	ProtobufCMessage *reply = NULL;
	struct exec_stream *st;
	uint64_t rid = o->rid ? o->rid : moat_rpc_new_request_id();
	char *errmsg = NULL;
	enum MHD_Result ret;
	bool ok;
	int rv;

	if ((rv = call_gateway_as(h, o->auth, rid, o->timeout_ms, md, req,
	         &reply, &errmsg)) != MOAT_OK) {
		ret = wire_error(conn, o->wire, rv, errmsg);
		free(errmsg);
		return ret;
	}
	ev.event_case = MOAT__V1__EXEC_EVENT__EVENT_STARTED;
	ev.started = (Moat__V1__ExecHandle *)reply;
	if ((st = calloc(1, sizeof(*st))) == NULL) {
		protobuf_c_message_free_unpacked(reply, NULL);
		return MHD_NO;
	}
	st->h = h;
	st->wire = o->wire;
	st->fd = connection_fd(conn);
	st->request_id = rid;
	st->deadline_ms = o->deadline_ms;
	st->exec_id = ev.started->exec_id;
	st->auth = strdup(o->auth);
	st->sandbox_id =
	    strdup(ev.started->sandbox_id ? ev.started->sandbox_id : "");
	ok = st->auth != NULL && st->sandbox_id != NULL &&
	    stream_event(st, &ev) &&
	    (st->wire != MOAT_WIRE_GRPC_WEB_TEXT ||
	        wire_text(&st->pending, 0));
	protobuf_c_message_free_unpacked(reply, NULL);
	if (!ok) {
		exec_stream_free(st); /* kills it */
		return wire_error(conn, o->wire, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory starting the exec stream");
	}
	return stream_response(conn, o->wire, st, NULL, 0);
}

/* serve_sse: POST .../exec as Server-Sent Events, with the key, request
 * id and ExecStart timeout of the X-Moat- headers (request_auth); no
 * deadline for the stream (the client ends it by going away). */
static enum MHD_Result
serve_sse(struct moat_http *h, struct MHD_Connection *conn,
    const ProtobufCMessage *req)
{
	struct stream_opts o = { .wire = MOAT_WIRE_SSE };
	uint64_t timeout = 0;
	char *errmsg = NULL;
	enum MHD_Result ret;
	int rv;

	if ((rv = request_auth(conn, &o.auth, &o.rid, &timeout, &errmsg)) !=
	    MOAT_OK) {
		ret = respond_error(conn, 0, rv, errmsg, NULL);
		free(errmsg);
		return ret;
	}
	o.timeout_ms = (uint32_t)timeout;
	return serve_exec_stream(h, conn, req, &o);
}

/* route_input: the input message of `md` from the request as route `rt`
 * reads it (build_input), the URL id `id` (NULL: none) in its field. On
 * MOAT_OK *req is the caller's (protobuf_c_message_free_unpacked);
 * otherwise a status with *errmsg (heap, caller frees). */
static int
route_input(struct MHD_Connection *conn, const struct route *rt,
    const ProtobufCMethodDescriptor *md, const struct http_req *hr,
    const char *id, ProtobufCMessage **req, char **errmsg)
{
	json_t *in;
	int rv;

	*req = NULL;
	if ((in = build_input(conn, NULL, rt, md->input, hr, id, errmsg)) ==
	    NULL)
		return MOAT_INVALID_ARGUMENT;
	rv = moat_codec_from_json(md->input, in, 0, req, errmsg);
	json_decref(in);
	return rv;
}

static enum MHD_Result
serve_route(struct moat_http *h, struct MHD_Connection *conn,
    const struct route *rt, const char *id, const struct http_req *hr)
{
	const ProtobufCMethodDescriptor *md;
	ProtobufCMessage *req = NULL, *reply = NULL;
	const char *rpc_method = rt->rpc_method ? rt->rpc_method : id;
	char *errmsg = NULL;
	json_t *out = NULL;
	enum MHD_Result ret;
	int rv;

	if (rt->raw_reply && moat_http_archive_asked(conn))
		return moat_http_archive_get(h, conn, id, h->archive_max);
	md = protobuf_c_service_descriptor_get_method_by_name(h->service,
	    rpc_method);
	if (md == NULL) {
		errmsg = moat_asprintf(
		    "%s has no method \"%s\": POST "
		    "/v1/rpc/{Method} with a method of gateway.proto "
		    "(CreateSandbox, Exec, ...)",
		    h->service->name, rpc_method);
		ret = respond_error(conn, 0, MOAT_NOT_FOUND, errmsg, NULL);
		free(errmsg);
		return ret;
	}
	if ((rv = route_input(conn, rt, md, hr, rt->rpc_method ? id : NULL,
	         &req, &errmsg)) != MOAT_OK) {
		ret = respond_error(conn, 0, rv, errmsg, NULL);
		free(errmsg);
		return ret;
	}
	if (rt->body == BODY_FILE && hr->len > 0) {
		Moat__V1__FileWriteRequest *w =
		    (Moat__V1__FileWriteRequest *)req;
		if ((w->data.data = malloc(hr->len)) == NULL) {
			protobuf_c_message_free_unpacked(req, NULL);
			return respond_error(conn, 0, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory", NULL);
		}
		memcpy(w->data.data, hr->body, hr->len);
		w->data.len = hr->len;
	}
	if (rt->rpc_method != NULL && strcmp(rt->rpc_method, "Exec") == 0 &&
	    wants_event_stream(conn)) {
		ret = serve_sse(h, conn, req);
		protobuf_c_message_free_unpacked(req, NULL);
		return ret;
	}
	rv = call_gateway(h, conn, md, req, 0, &reply, &errmsg);
	protobuf_c_message_free_unpacked(req, NULL);
	if (rv != MOAT_OK) {
		ret = respond_error(conn, 0, rv, errmsg, NULL);
		free(errmsg);
		return ret;
	}
	if (rt->raw_reply) {
		Moat__V1__FileData *fd = (Moat__V1__FileData *)reply;
		char *bytes = malloc(fd->data.len ? fd->data.len : 1);

		if (bytes == NULL) {
			protobuf_c_message_free_unpacked(reply, NULL);
			return respond_error(conn, 0, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory", NULL);
		}
		if (fd->data.len > 0)
			memcpy(bytes, fd->data.data, fd->data.len);
		ret = respond(conn, MHD_HTTP_OK, bytes, fd->data.len,
		    "application/octet-stream", NULL);
		protobuf_c_message_free_unpacked(reply, NULL);
		return ret;
	}
	rv = moat_codec_to_json(reply, 0, &out, &errmsg);
	protobuf_c_message_free_unpacked(reply, NULL);
	if (rv != MOAT_OK) {
		ret = respond_error(conn, 0, rv, errmsg, NULL);
		free(errmsg);
		return ret;
	}
	return respond_json(conn, MHD_HTTP_OK, out, NULL);
}

/* ---- Connect unary: POST /<service>/<Method> ---- */

/* The Connect route reads its JSON body as the generic /v1/rpc/ one. */
static const struct route connect_route = { "/{service}/{}", "POST", NULL,
	BODY_JSON, NULL, false };

/* connect_method: the method name of a Connect URL, /<service>/<Method>
 * with the door's service (moat.v1.Gateway); NULL when `url` is not
 * one. */
static const char *
connect_method(const ProtobufCServiceDescriptor *svc, const char *url)
{
	size_t n = strlen(svc->name);

	if (url[0] != '/' || strncmp(url + 1, svc->name, n) != 0 ||
	    url[1 + n] != '/')
		return NULL;
	return url + 2 + n;
}

/* connect_wire: the protocol the request's Content-Type asks for
 * (http_connect.h); 415 naming those served otherwise, answered in
 * *ret. */
static bool
connect_wire(struct MHD_Connection *conn, enum moat_http_wire *w,
    enum MHD_Result *ret)
{
	const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_CONTENT_TYPE);
	char *msg, *text;
	json_t *j;

	if ((*w = moat_http_wire_of(ct)) != MOAT_WIRE_OTHER)
		return true;
	msg = moat_asprintf("Content-Type \"%s\" is not one of Connect's or "
	                    "gRPC-Web's: send " MOAT_HTTP_WIRE_TYPES,
	    ct ? ct : "(none)");
	j = error_json("unimplemented",
	    msg ? msg : "unsupported Content-Type");
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	free(msg);
	json_decref(j);
	/* Accept-Post names the codecs (RFC 9110's 415 hint). */
	*ret = respond_with(conn, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, text,
	    text ? strlen(text) : 0, "application/json",
	    MHD_HTTP_HEADER_ACCEPT_POST, MOAT_HTTP_WIRE_TYPES);
	return false;
}

/* connect_call_opts: the api key, request id and deadline of a Connect
 * request: Authorization and the X-Moat- headers as the other routes
 * read them (request_auth), then Connect-Protocol-Version (1 when sent),
 * Content-Encoding (identity only) and Connect-Timeout-Ms (1 to 10
 * digits; it wins over X-Moat-Timeout-Ms). A status with *errmsg (heap)
 * when one is wrong. */
static int
connect_call_opts(struct MHD_Connection *conn, const char **auth,
    uint64_t *rid, uint32_t *timeout_ms, char **errmsg)
{
	const char *ver = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    "Connect-Protocol-Version");
	const char *enc = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_CONTENT_ENCODING);
	const char *tmo = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    "Connect-Timeout-Ms");
	uint64_t timeout = 0;
	int rv;

	if ((rv = request_auth(conn, auth, rid, &timeout, errmsg)) != MOAT_OK)
		return rv;
	if (ver != NULL && strcmp(ver, "1") != 0) {
		*errmsg = moat_asprintf("Connect-Protocol-Version \"%s\" is "
		                        "not one this door speaks: send 1",
		    ver);
		return MOAT_INVALID_ARGUMENT;
	}
	if (enc != NULL && strcasecmp(enc, "identity") != 0) {
		*errmsg = moat_asprintf("Content-Encoding \"%s\" is not "
		                        "supported: send the body "
		                        "uncompressed (identity)",
		    enc);
		return MOAT_UNIMPLEMENTED;
	}
	if (tmo != NULL) {
		size_t n = strspn(tmo, "0123456789");

		if (n == 0 || n > 10 || tmo[n] != '\0') {
			*errmsg = moat_asprintf(
			    "Connect-Timeout-Ms \"%s\" is "
			    "not 1 to 10 decimal digits: send the deadline in "
			    "milliseconds",
			    tmo);
			return MOAT_INVALID_ARGUMENT;
		}
		timeout = strtoull(tmo, NULL, 10);
		/* 0 is already past: the shortest deadline the Envelope
		 * has (its 0 means none). */
		if (timeout == 0)
			timeout = 1;
	}
	*timeout_ms = timeout > UINT32_MAX ? UINT32_MAX : (uint32_t)timeout;
	return MOAT_OK;
}

/* connect_reply: the output message `reply` as the request's codec
 * wrote it, 200. */
static enum MHD_Result
connect_reply(struct MHD_Connection *conn, ProtobufCMessage *reply, bool proto)
{
	char *errmsg = NULL;
	json_t *out = NULL;
	enum MHD_Result ret;
	int rv;

	if (proto) {
		size_t len = protobuf_c_message_get_packed_size(reply);
		uint8_t *buf = malloc(len ? len : 1);

		if (buf == NULL)
			return connect_error(conn, 0, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory", NULL);
		protobuf_c_message_pack(reply, buf);
		return respond(conn, MHD_HTTP_OK, (char *)buf, len,
		    "application/proto", NULL);
	}
	if ((rv = moat_codec_to_json(reply, 0, &out, &errmsg)) != MOAT_OK) {
		ret = connect_error(conn, 0, rv, errmsg, NULL);
		free(errmsg);
		return ret;
	}
	return respond_json(conn, MHD_HTTP_OK, out, NULL);
}

/* grpc_web_opts: the api key and deadline of a gRPC-Web call, as the
 * gRPC door reads them: authorization: Bearer and grpc-timeout. */
static int
grpc_web_opts(struct MHD_Connection *conn, struct stream_opts *o,
    char **errmsg)
{
	const char *tmo =
	    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "grpc-timeout");
	uint64_t ms = 0;
	int rv;

	if ((rv = moat_http_bearer_key(MHD_lookup_connection_value(conn,
	                                   MHD_HEADER_KIND,
	                                   MHD_HTTP_HEADER_AUTHORIZATION),
	         &o->auth, errmsg)) != MOAT_OK)
		return rv;
	if (tmo != NULL && !moat_grpc_parse_timeout(tmo, &ms)) {
		*errmsg =
		    moat_asprintf("grpc-timeout \"%s\" is not 1 to 8 "
		                  "digits and a unit (H M S m u n): send "
		                  "e.g. 500m",
		        tmo);
		return MOAT_INVALID_ARGUMENT;
	}
	o->timeout_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
	return MOAT_OK;
}

/* stream_input: the input message of `md` from a streaming form's body:
 * one envelope, its message packed or (connect+json) proto3 JSON. On
 * MOAT_OK *req is the caller's; otherwise *errmsg (heap). */
static int
stream_input(enum moat_http_wire w, const ProtobufCMethodDescriptor *md,
    const struct http_req *hr, ProtobufCMessage **req, char **errmsg)
{
	const uint8_t *msg;
	uint8_t *owned = NULL;
	size_t msg_len;
	const char *why;
	json_t *j;
	int rv;

	*req = NULL;
	if ((rv = moat_http_unenvelope(w, (const uint8_t *)hr->body, hr->len,
	         &owned, &msg, &msg_len, &why)) != MOAT_OK) {
		*errmsg = moat_asprintf("%s: send one enveloped %s (a flag "
		                        "byte 0, its length in 4 bytes "
		                        "big-endian, the message)",
		    why, md->input->name);
		return rv;
	}
	if (w == MOAT_WIRE_CONNECT_JSON) {
		j = json_loadb((const char *)msg, msg_len, 0, NULL);
		rv = j == NULL ?
		    MOAT_INVALID_ARGUMENT :
		    moat_codec_from_json(md->input, j, 0, req, errmsg);
		if (j == NULL)
			*errmsg =
			    moat_asprintf("the enveloped message is not "
			                  "JSON: send a %s as proto3 JSON",
			        md->input->name);
		json_decref(j);
	} else if ((*req = protobuf_c_message_unpack(md->input, NULL, msg_len,
	                msg)) == NULL) {
		rv = MOAT_INVALID_ARGUMENT;
		*errmsg = moat_asprintf("the enveloped message is not a "
		                        "binary %s",
		    md->input->name);
	} else
		rv = MOAT_OK;
	free(owned);
	return rv;
}

/* grpc_web_reply: a unary gRPC-Web reply: `reply`'s data frame, then
 * the trailers frame with the status. */
static enum MHD_Result
grpc_web_reply(struct MHD_Connection *conn, enum moat_http_wire w,
    const ProtobufCMessage *reply)
{
	struct moat_http_buf b = { 0 };
	size_t len = protobuf_c_message_get_packed_size(reply);
	uint8_t *packed = malloc(len ? len : 1);
	bool ok = packed != NULL;

	if (ok)
		protobuf_c_message_pack(reply, packed);
	ok = ok && moat_http_frame(&b, MOAT_HTTP_FLAG_MESSAGE, packed, len) &&
	    moat_http_grpc_web_trailers(&b, MOAT_OK, NULL) &&
	    (w != MOAT_WIRE_GRPC_WEB_TEXT || wire_text(&b, 0));
	free(packed);
	if (!ok) {
		free(b.data);
		return wire_error(conn, w, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	}
	return stream_response(conn, w, NULL, b.data, b.len);
}

/* serve_streaming: a call in a streaming form (Connect streaming or
 * gRPC-Web): ExecStream streams; gRPC-Web calls every other method
 * unary; Connect's streaming form of a unary method is refused saying
 * what to send. */
static enum MHD_Result
serve_streaming(struct moat_http *h, struct MHD_Connection *conn,
    const ProtobufCMethodDescriptor *md, enum moat_http_wire w,
    const struct http_req *hr)
{
	struct stream_opts o = { .wire = w };
	ProtobufCMessage *req = NULL, *reply = NULL;
	bool streams = strcmp(md->name, "ExecStream") == 0;
	bool connect =
	    w == MOAT_WIRE_CONNECT_JSON || w == MOAT_WIRE_CONNECT_PROTO;
	char *errmsg = NULL;
	enum MHD_Result ret;
	int rv;

	if (connect && !streams) {
		errmsg = moat_asprintf("%s is unary: send application/proto "
		                       "or application/json (Connect's unary "
		                       "form); only ExecStream streams",
		    md->name);
		rv = MOAT_UNIMPLEMENTED;
		goto fail;
	}
	rv = connect ?
	    connect_call_opts(conn, &o.auth, &o.rid, &o.timeout_ms, &errmsg) :
	    grpc_web_opts(conn, &o, &errmsg);
	if (rv != MOAT_OK ||
	    (rv = stream_input(w, md, hr, &req, &errmsg)) != MOAT_OK)
		goto fail;
	if (streams) {
		/* The deadline is the stream's: the command is killed
		 * when it passes. */
		if (o.timeout_ms != 0)
			o.deadline_ms = moat_rpc_now_ms() + o.timeout_ms;
		ret = serve_exec_stream(h, conn, req, &o);
		protobuf_c_message_free_unpacked(req, NULL);
		return ret;
	}
	rv = call_gateway_as(h, o.auth, o.rid, o.timeout_ms, md, req, &reply,
	    &errmsg);
	protobuf_c_message_free_unpacked(req, NULL);
	if (rv != MOAT_OK)
		goto fail;
	ret = grpc_web_reply(conn, w, reply);
	protobuf_c_message_free_unpacked(reply, NULL);
	return ret;

fail:
	ret = wire_error(conn, w, rv, errmsg);
	free(errmsg);
	return ret;
}

/* serve_connect: a Connect or gRPC-Web call of `method`: the unary
 * Connect forms through the same decoding (JSON) and dispatcher as POST
 * /v1/rpc/<Method>, the enveloped forms by serve_streaming; the door's
 * admission (keys, rate limits, body limit) ran before. */
static enum MHD_Result
serve_connect(struct moat_http *h, struct MHD_Connection *conn,
    const char *method, const char *http_method, const struct http_req *hr)
{
	const ProtobufCMethodDescriptor *md;
	ProtobufCMessage *req = NULL, *reply = NULL;
	const char *auth;
	char *errmsg = NULL;
	uint64_t rid = 0;
	uint32_t timeout_ms = 0;
	enum moat_http_wire w;
	enum MHD_Result ret;
	bool proto;
	int rv;

	if (strcmp(http_method, "POST") != 0)
		return connect_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
		    MOAT_UNIMPLEMENTED,
		    "Connect calls are POST (the GET form is not served)",
		    "POST");
	if (!connect_wire(conn, &w, &ret))
		return ret;
	md = protobuf_c_service_descriptor_get_method_by_name(h->service,
	    method);
	if (md == NULL) {
		errmsg = moat_asprintf("%s has no method \"%s\": POST "
		                       "/%s/<Method> with a method of "
		                       "gateway.proto (CreateSandbox, ...)",
		    h->service->name, method, h->service->name);
		ret = wire_error(conn, w, MOAT_UNIMPLEMENTED, errmsg);
		free(errmsg);
		return ret;
	}
	if (moat_http_wire_streams(w))
		return serve_streaming(h, conn, md, w, hr);
	proto = w == MOAT_WIRE_PROTO;
	if (strcmp(md->name, "ExecStream") == 0) {
		rv = MOAT_UNIMPLEMENTED;
		errmsg = moat_asprintf(
		    "ExecStream streams: send application/connect+proto or "
		    "+json (or application/grpc-web+proto), one enveloped "
		    "ExecRequest; or call Exec unary");
		goto fail;
	}
	if ((rv = connect_call_opts(conn, &auth, &rid, &timeout_ms,
	         &errmsg)) != MOAT_OK)
		goto fail;
	if (proto) {
		req = protobuf_c_message_unpack(md->input, NULL, hr->len,
		    (const uint8_t *)(hr->body ? hr->body : ""));
		if (req == NULL) {
			rv = MOAT_INVALID_ARGUMENT;
			errmsg = moat_asprintf("the body is not a binary %s: "
			                       "send the packed input message "
			                       "(or JSON as application/json)",
			    md->input->name);
			goto fail;
		}
	} else if ((rv = route_input(conn, &connect_route, md, hr, NULL, &req,
	                &errmsg)) != MOAT_OK)
		goto fail;
	rv = call_gateway_as(h, auth, rid, timeout_ms, md, req, &reply,
	    &errmsg);
	protobuf_c_message_free_unpacked(req, NULL);
	if (rv != MOAT_OK)
		goto fail;
	ret = connect_reply(conn, reply, proto);
	protobuf_c_message_free_unpacked(reply, NULL);
	return ret;

fail:
	ret = connect_error(conn, 0, rv, errmsg, NULL);
	free(errmsg);
	return ret;
}

/* ---- operator routes: /metrics, /v1/openapi.json ---- */

/* The OpenAPI document says what the codec (lib/codec.c, codec_decode.c)
 * really writes and reads, so a generated client round-trips: maps are
 * objects, 64-bit integers decimal strings, bytes base64, enums names. */
#define OPENAPI_CODEC_NOTE                                                    \
	"Messages are proto3 JSON as moat's codec writes them: fields by "    \
	"their lowerCamelCase JSON names, default values left out, "          \
	"64-bit integers as decimal strings, bytes as base64, enums by "      \
	"value name, map<K, V> fields as JSON objects (keys as strings). "    \
	"Requests may also name fields by their .proto names (sandbox_id), "  \
	"give 64-bit and other integers as numbers or strings, and enums by " \
	"number; unknown fields are refused (400)."

static void schema_add(json_t *schemas, const ProtobufCMessageDescriptor *d);

/* value_schema: the schema of one value of field `f` (one element of a
 * repeated field), a message by $ref to its schema, added first. */
static json_t *
value_schema(json_t *schemas, const ProtobufCFieldDescriptor *f)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_BOOL:
		return json_pack("{s:s}", "type", "boolean");
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		return json_pack("{s:s, s:s}", "type", "integer", "format",
		    "int32");
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		return json_pack("{s:s, s:i, s:I}", "type", "integer",
		    "minimum", 0, "maximum", (json_int_t)UINT32_MAX);
	case PROTOBUF_C_TYPE_FLOAT:
	case PROTOBUF_C_TYPE_DOUBLE:
		return json_pack("{s:s, s:s}", "type", "number", "format",
		    f->type == PROTOBUF_C_TYPE_FLOAT ? "float" : "double");
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		return json_pack("{s:s, s:s, s:s}", "type", "string", "format",
		    "int64", "pattern", "^-?[0-9]+$");
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return json_pack("{s:s, s:s, s:s}", "type", "string", "format",
		    "uint64", "pattern", "^[0-9]+$");
	case PROTOBUF_C_TYPE_BYTES:
		return json_pack("{s:s, s:s}", "type", "string", "format",
		    "byte");
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumDescriptor *e = f->descriptor;
		json_t *names = json_array();

		for (unsigned k = 0; k < e->n_values; k++)
			json_array_append_new(names,
			    json_string(e->values[k].name));
		return json_pack("{s:s, s:o}", "type", "string", "enum",
		    names);
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessageDescriptor *m = f->descriptor;
		char *ref = moat_asprintf("#/components/schemas/%s", m->name);
		json_t *t;

		schema_add(schemas, m);
		t = ref ? json_pack("{s:s}", "$ref", ref) : NULL;
		free(ref);
		return t;
	}
	case PROTOBUF_C_TYPE_STRING:
	default:
		return json_pack("{s:s}", "type", "string");
	}
}

/* field_schema: the schema of field `f`: a map<K, V> (a repeated
 * KEntry, moat_codec_is_map_entry) is an object of V's, as the codec
 * writes it, any other repeated field an array. */
static json_t *
field_schema(json_t *schemas, const ProtobufCFieldDescriptor *f)
{
	json_t *t;

	if (f->label == PROTOBUF_C_LABEL_REPEATED &&
	    f->type == PROTOBUF_C_TYPE_MESSAGE &&
	    moat_codec_is_map_entry(f->descriptor)) {
		const ProtobufCMessageDescriptor *entry = f->descriptor;

		t = value_schema(schemas, &entry->fields[1]);
		return t ? json_pack("{s:s, s:o}", "type", "object",
		               "additionalProperties", t) :
		           NULL;
	}
	t = value_schema(schemas, f);
	if (t != NULL && f->label == PROTOBUF_C_LABEL_REPEATED)
		t = json_pack("{s:s, s:o}", "type", "array", "items", t);
	return t;
}

/* schema_add: the JSON schema of message `d` in `schemas` (components),
 * added with every message it uses; added before its fields, so a
 * message that holds itself refers to itself. */
static void
schema_add(json_t *schemas, const ProtobufCMessageDescriptor *d)
{
	json_t *props, *s;

	if (json_object_get(schemas, d->name) != NULL)
		return;
	props = json_object();
	s = json_pack("{s:s, s:o}", "type", "object", "properties", props);
	if (s == NULL || json_object_set_new(schemas, d->name, s) != 0)
		return;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		char name[128];
		json_t *t = field_schema(schemas, f);

		if (t == NULL)
			continue;
		moat_codec_json_name(f->name, name, sizeof(name));
		/* A $ref's siblings are ignored in OpenAPI 3.0: only the
		 * others say which .proto name the codec also takes. */
		if (strcmp(name, f->name) != 0 &&
		    json_object_get(t, "$ref") == NULL)
			json_object_set_new(t, "description",
			    json_sprintf(".proto name %s (also accepted)",
			        f->name));
		json_object_set_new(props, name, t);
	}
}

/* openapi_exec_stream: POST .../exec's other reply in its operation
 * `op` and `params`: the `stream` query parameter and the Server-Sent
 * Events of serve_exec_stream as a text/event-stream content. (OpenAPI
 * ignores an Accept header parameter, so the descriptions name it.) */
static void
openapi_exec_stream(json_t *op, json_t *params)
{
	json_t *ok = json_object_get(json_object_get(op, "responses"), "200");

	json_array_append_new(params,
	    json_pack("{s:s, s:s, s:b, s:{s:s}, "
	              "s:s}",
	        "name", "stream", "in", "query", "required", 0, "schema",
	        "type", "boolean", "description",
	        "true (or 1), or the header "
	        "Accept: text/event-stream: start the command (ExecStart) and "
	        "answer with its output as Server-Sent Events while it runs, "
	        "instead of the ExecResult once it ends"));
	json_object_set_new(ok, "description",
	    json_string(
	        "the ExecResult "
	        "(application/json); with ?stream=true or Accept: "
	        "text/event-stream, Server-Sent Events as the command runs "
	        "(text/event-stream)"));
	json_object_set_new(json_object_get(ok, "content"),
	    "text/event-stream",
	    json_pack("{s:{s:s, s:s}}", "schema", "type", "string",
	        "description",
	        "Server-Sent Events, each \"event: "
	        "NAME\" and \"data: JSON\": start (the ExecHandle: sandboxId, "
	        "execId, pid) first; stdout and stderr, {\"data\": base64 "
	        "bytes}, as output arrives (read in one-second ExecRead long "
	        "polls; a \": waiting\" comment when none came); last either "
	        "exit (the ExecStatus: exited, exitCode, signal, timedOut, "
	        "...) or error ({\"code\", \"message\"}: reading failed). A "
	        "client that goes away before exit gets the command killed "
	        "(ExecKill). Errors before the command starts are JSON "
	        "errors."));
}

static json_t *
ref_of(const ProtobufCMessageDescriptor *d)
{
	char *ref = moat_asprintf("#/components/schemas/%s", d->name);
	json_t *j = ref ? json_pack("{s:{s:{s:{s:s}}}}", "content",
	                      "application/json", "schema", "$ref", ref) :
	                  NULL;

	free(ref);
	return j;
}

/* openapi_error: the Error schema, whose description maps each code to
 * its HTTP status from http_status_of itself, so the two cannot part. */
static json_t *
openapi_error(void)
{
	json_t *codes = json_array(), *err;
	char *more,
	    *text = strdup("{code, message}: code names the status (as in "
	                   "gRPC), message says what to do next. HTTP "
	                   "status by code:");

	for (int c = 1; c <= MOAT_STATUS_MAX && text != NULL; c++) {
		more = moat_asprintf("%s%s %s %d", text, c > 1 ? "," : "",
		    moat_strerror(c), http_status_of(c));

		free(text);
		text = more;
		json_array_append_new(codes, json_string(moat_strerror(c)));
	}
	more = moat_asprintf(
	    "%s. The door itself answers 401 "
	    "UNAUTHENTICATED (no or a bad key, with "
	    "WWW-Authenticate), 405 UNIMPLEMENTED (another "
	    "HTTP method, with Allow), 413 RESOURCE_EXHAUSTED (a body over "
	    "%u MiB, or a tar archive over [gateway] archive-max-mib) and "
	    "429 RESOURCE_EXHAUSTED (over a rate limit, with "
	    "Retry-After).",
	    text ? text : "", MOAT_HTTP_MAX_BODY >> 20);
	free(text);
	text = more;
	err = json_pack("{s:s, s:s?, s:[s, s], s:{s:{s:s, s:o}, s:{s:s}}}",
	    "type", "object", "description", text, "required", "code",
	    "message", "properties", "code", "type", "string", "enum", codes,
	    "message", "type", "string");
	free(text);
	return err;
}

/* rest_operation: the operation of REST route `rt` (not the generic
 * /v1/rpc/{} one), with its id parameter, its query parameters or JSON
 * body, and its reply; operationId is the method's name and "Rest",
 * since the method's own name is its /v1/rpc/<Method> operation's. */
static json_t *
rest_operation(struct moat_http *h, json_t *schemas, const struct route *rt)
{
	const ProtobufCMethodDescriptor *md = rt->rpc_method ?
	    protobuf_c_service_descriptor_get_method_by_name(h->service,
	        rt->rpc_method) :
	    NULL;
	json_t *op, *params, *ok;
	char *id;

	op = json_pack("{s:s, s:{s:{s:s}, s:{s:s, s:{s:{s:{s:s}}}}}}",
	    "summary", md ? md->name : rt->pattern, "responses", "200",
	    "description", "the method's output message", "default",
	    "description", "an error", "content", "application/json", "schema",
	    "$ref", "#/components/schemas/Error");
	if (op == NULL)
		return NULL;
	ok = json_object_get(json_object_get(op, "responses"), "200");
	params = json_array();
	if (strstr(rt->pattern, "{}") != NULL)
		json_array_append_new(params,
		    json_pack("{s:s, s:s, s:b, s:{s:s}, s:s}", "name", "id",
		        "in", "path", "required", 1, "schema", "type",
		        "string", "description",
		        rt->id_field ? rt->id_field : "id"));
	if (md == NULL) { /* /healthz */
		json_object_set_new(op, "operationId", json_string("healthz"));
		json_object_set_new(op, "security", json_array());
		json_object_set_new(op, "parameters", params);
		return op;
	}
	id = moat_asprintf("%sRest", md->name);
	json_object_set_new(op, "operationId", json_string(id ? id : ""));
	free(id);
	schema_add(schemas, md->input);
	if (rt->body == BODY_JSON)
		json_object_set_new(op, "requestBody", ref_of(md->input));
	for (unsigned f = 0; rt->body != BODY_JSON && f < md->input->n_fields;
	     f++) {
		const ProtobufCFieldDescriptor *fd = &md->input->fields[f];

		/* A query string holds one value a key: no lists, maps
		 * or messages (the codec would refuse the string). */
		if ((rt->id_field != NULL &&
		        strcmp(fd->name, rt->id_field) == 0) ||
		    fd->label == PROTOBUF_C_LABEL_REPEATED ||
		    fd->type == PROTOBUF_C_TYPE_MESSAGE)
			continue;
		json_array_append_new(params,
		    json_pack("{s:s, s:s, s:o}", "name", fd->name, "in",
		        "query", "schema", value_schema(schemas, fd)));
	}
	if (rt->raw_reply) {
		json_object_set_new(ok, "description",
		    json_string("the file's bytes"));
		json_object_set_new(ok, "content",
		    json_pack("{s:{s:{s:s, s:s}}}", "application/octet-stream",
		        "schema", "type", "string", "format", "binary"));
	} else {
		json_t *out = ref_of(md->output);

		schema_add(schemas, md->output);
		json_object_set(ok, "content",
		    json_object_get(out, "content"));
		json_decref(out);
	}
	if (strcmp(md->name, "Exec") == 0)
		openapi_exec_stream(op, params);
	json_object_set_new(op, "parameters", params);
	return op;
}

/* openapi_rest: the routes table's operations in `paths`, but the
 * generic POST /v1/rpc/{} route, which openapi_rpc describes method by
 * method (OpenAPI has no way to tie a path segment to a body schema). */
static void
openapi_rest(struct moat_http *h, json_t *paths, json_t *schemas)
{
	for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		const struct route *rt = &routes[i];
		char path[256], method[16], *p;
		json_t *item, *op;
		size_t k;

		if (rt->rpc_method == NULL && strstr(rt->pattern, "{}"))
			continue;
		snprintf(path, sizeof(path), "%s", rt->pattern);
		if ((p = strstr(path, "{}")) != NULL) {
			memmove(p + 4, p + 2, strlen(p + 2) + 1);
			memcpy(p, "{id}", 4);
		}
		for (k = 0; rt->http_method[k] != '\0' && k < 15; k++)
			method[k] = (char)(rt->http_method[k] | 0x20);
		method[k] = '\0';
		if ((op = rest_operation(h, schemas, rt)) == NULL)
			continue;
		if ((item = json_object_get(paths, path)) == NULL) {
			item = json_object();
			json_object_set_new(paths, path, item);
		}
		json_object_set_new(item, method, op);
	}
}

/* openapi_rpc: POST /v1/rpc/<Method> for every method of the service,
 * as serve_route answers it: the JSON body (empty: {}) is the input
 * message, the reply the output message, whatever the method (ReadFile's
 * data base64 in FileData, Exec's ExecResult once the command ends). */
static void
openapi_rpc(struct moat_http *h, json_t *paths, json_t *schemas)
{
	for (unsigned i = 0; i < h->service->n_methods; i++) {
		const ProtobufCMethodDescriptor *md = &h->service->methods[i];
		char *path = moat_asprintf("/v1/rpc/%s", md->name);
		char *summary =
		    moat_asprintf("%s.%s", h->service->name, md->name);
		json_t *op, *body = ref_of(md->input),
		            *out = ref_of(md->output);

		schema_add(schemas, md->input);
		schema_add(schemas, md->output);
		op = json_pack("{s:s, s:s?, s:[s], s:o, s:{s:{s:s, s:O}, "
		               "s:{s:s, s:{s:{s:{s:s}}}}}}",
		    "operationId", md->name, "summary", summary, "tags", "rpc",
		    "requestBody", body, "responses", "200", "description",
		    "the method's output message", "content",
		    json_object_get(out, "content"), "default", "description",
		    "an error", "content", "application/json", "schema",
		    "$ref", "#/components/schemas/Error");
		json_decref(out);
		/* Health answers anyone (needs_key); the rest need a key
		 * when keys are on. */
		if (op != NULL && strcmp(md->name, "Health") == 0)
			json_object_set_new(op, "security", json_array());
		/* Attach streams both ways, which only gRPC carries. */
		if (op != NULL && strcmp(md->name, "Attach") == 0)
			json_object_set_new(op, "description",
			    json_string(
			        "gRPC only (a bidirectional stream "
			        "of AttachInput to ExecEvent on the "
			        "gRPC door): here UNIMPLEMENTED; use "
			        "ExecStart with stdin_open, ExecWrite, "
			        "ExecResize and ExecRead"));
		if (op != NULL && path != NULL)
			json_object_set_new(paths, path,
			    json_pack("{s:o}", "post", op));
		else
			json_decref(op);
		free(path);
		free(summary);
	}
}

/* openapi_exec_stream_connect: POST /moat.v1.Gateway/ExecStream, the
 * one streaming method, in Connect's streaming form (the unary Connect
 * routes mirror /v1/rpc/ and are not listed; this one has no /v1/rpc/
 * form: there it is UNIMPLEMENTED, as over nng). */
static json_t *
openapi_exec_stream_connect(json_t *schemas)
{
	char *ref = moat_asprintf("#/components/schemas/%s",
	    moat__v1__exec_event__descriptor.name);
	json_t *op;

	schema_add(schemas, &moat__v1__exec_event__descriptor);
	op = json_pack(
	    "{s:{s:s, s:s, s:s, s:[s], s:{s:b, s:s, s:{s:{s:{s:s, s:s}}}}, "
	    "s:{s:{s:s, s:{s:{s:{s:s, s:s, s:{s:s}}}}}}}}",
	    "post", "operationId", "ExecStreamConnect", "summary",
	    "moat.v1.Gateway.ExecStream (Connect server streaming)",
	    "description",
	    "Runs a command and streams its output as it comes. Request: "
	    "Content-Type application/connect+json (or connect+proto), the "
	    "body one envelope: a flag byte 0, the message's length in 4 "
	    "bytes big-endian, an ExecRequest. Reply: 200 with the same "
	    "Content-Type, a sequence of envelopes (flag 0) each holding an "
	    "ExecEvent: started (the ExecHandle) first, stdout and stderr "
	    "bytes as output arrives, exit (the ExecStatus) last; then the "
	    "end-of-stream envelope (flag 2) whose JSON is {} or {\"error\": "
	    "{\"code\": \"deadline_exceeded\", \"message\": ...}}. "
	    "Connect-Timeout-Ms is the stream's deadline: past it the "
	    "command is killed. A client that goes away gets the command "
	    "killed. gRPC-Web (application/grpc-web+proto) is served at the "
	    "same URL, with a trailers frame (flag 0x80) for the status. The "
	    "unary Connect forms (application/json, application/proto) "
	    "answer unimplemented. Server-Sent Events of the same output: "
	    "POST /v1/sandboxes/{id}/exec with Accept: text/event-stream.",
	    "tags", "rpc", "requestBody", "required", 1, "description",
	    "one enveloped ExecRequest", "content", "application/connect+json",
	    "schema", "type", "string", "format", "binary", "responses", "200",
	    "description",
	    "enveloped ExecEvent messages, then the end-of-stream message",
	    "content", "application/connect+json", "schema", "type", "array",
	    "description",
	    "the ExecEvents in order, each in its own envelope (not a JSON "
	    "array on the wire)",
	    "items", "$ref", ref ? ref : "");
	free(ref);
	return op;
}

/* openapi: the OpenAPI 3 document of the door: every Gateway method at
 * POST /v1/rpc/<Method>, the REST routes, and the operator routes, with
 * the messages' schemas from the methods' descriptors. */
static json_t *
openapi(struct moat_http *h)
{
	json_t *doc, *paths, *schemas;

	doc = json_pack("{s:s, s:{s:s, s:s, s:s}, s:o, s:{s:o, s:{s:{s:s, "
	                "s:s}}}, s:[{s:[]}]}",
	    "openapi", "3.0.3", "info", "title", "moat gateway HTTP API",
	    "version", MOAT_VERSION, "description",
	    "Every method of moat.v1.Gateway (proto/gateway.proto) is POST "
	    "/v1/rpc/<Method> with its input message as the JSON body and "
	    "its output message as the reply; the REST routes (/v1/sandboxes"
	    ", ...) call the same methods. Errors are the Error schema with "
	    "the HTTP status of its code. Headers X-Moat-Request-Id and "
	    "X-Moat-Timeout-Ms (decimal) set the call's request id and "
	    "deadline. The same methods answer Connect unary calls (POST "
	    "/moat.v1.Gateway/<Method>, Content-Type application/json or "
	    "application/proto, Connect-Timeout-Ms, errors as "
	    "{\"code\": \"not_found\", ...}), which this document does "
	    "not list, and gRPC-Web calls (application/grpc-web+proto); "
	    "ExecStream streams in Connect's streaming form "
	    "(listed). " OPENAPI_CODEC_NOTE,
	    "paths", json_object(), "components", "schemas", json_object(),
	    "securitySchemes", "apiKey", "type", "http", "scheme", "bearer",
	    "security", "apiKey");
	if (doc == NULL)
		return NULL;
	paths = json_object_get(doc, "paths");
	schemas =
	    json_object_get(json_object_get(doc, "components"), "schemas");
	json_object_set_new(schemas, "Error", openapi_error());
	openapi_rpc(h, paths, schemas);
	openapi_rest(h, paths, schemas);
	schema_add(schemas, &moat__v1__archive_put_reply__descriptor);
	moat_http_archive_openapi(paths);
	json_object_set_new(paths, "/moat.v1.Gateway/ExecStream",
	    openapi_exec_stream_connect(schemas));
	json_object_set_new(paths, "/metrics",
	    json_pack("{s:{s:s, s:s, s:[], "
	              "s:{s:{s:s, s:{s:{}}}}}}",
	        "get", "operationId", "metrics", "summary",
	        "Prometheus "
	        "counters (no key needed)",
	        "security", "responses", "200", "description",
	        "text/plain exposition format", "content", "text/plain"));
	json_object_set_new(paths, "/v1/openapi.json",
	    json_pack("{s:{s:s, s:s, "
	              "s:[], s:{s:{s:s}}}}",
	        "get", "operationId", "openapi", "summary", "this document",
	        "security", "responses", "200", "description", "OpenAPI 3"));
	return doc;
}

/* http_metrics: `gw_text` (the gateway's metrics) with the door's own
 * counters after it; heap, NULL when out of memory. */
static char *
http_metrics(struct moat_http *h, const char *gw_text)
{
	return moat_asprintf(
	    "%s"
	    "# HELP moat_http_refused_total HTTP requests answered from "
	    "their headers: 401 without a valid key, 429 over a rate "
	    "limit.\n"
	    "# TYPE moat_http_refused_total counter\n"
	    "moat_http_refused_total{reason=\"unauthenticated\"} %llu\n"
	    "moat_http_refused_total{reason=\"rate\"} %llu\n"
	    "# HELP moat_mcp_sessions MCP sessions open at /mcp.\n"
	    "# TYPE moat_mcp_sessions gauge\n"
	    "moat_mcp_sessions %zu\n",
	    gw_text,
	    (unsigned long long)__atomic_load_n(&h->refused_auth,
	        __ATOMIC_RELAXED),
	    (unsigned long long)moat_ratelimit_refused(h->rl),
	    moat_mcp_http_sessions(h->mcp));
}

/* serve_extra: the routes that are not Gateway methods; MHD_NO in
 * *handled when `url` is none of them. */
static enum MHD_Result
serve_extra(struct moat_http *h, struct MHD_Connection *conn, const char *url,
    const char *method, bool *handled)
{
	*handled = true;
	if (strcmp(url, "/metrics") == 0 && strcmp(method, "GET") == 0) {
		char *gw_text = moat_gateway_metrics(h->gw), *text = NULL;

		if (gw_text != NULL)
			text = http_metrics(h, gw_text);
		free(gw_text);
		if (text == NULL)
			return respond_error(conn, 0, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory", NULL);
		return respond(conn, MHD_HTTP_OK, text, strlen(text),
		    "text/plain; version=0.0.4", NULL);
	}
	if (strcmp(url, "/v1/openapi.json") == 0 && strcmp(method, "GET") == 0)
		return respond_json(conn, MHD_HTTP_OK, openapi(h), NULL);
	*handled = false;
	return MHD_NO;
}

/* ---- MCP (mcp_http.c) ---- */

struct mcp_call {
	struct moat_http *h;
	struct MHD_Connection *conn; /* the request, whose headers the
	                                * calls with no authz carry */
};

/* mcp_gateway_call: the moat_mcp_http_call_fn of /mcp: JSON to the
 * method's message, run in process like any route as the request's
 * caller (`authz` NULL) or as the Authorization header value `authz`
 * ("": none; an evicted session's), the reply back to JSON. */
static int
mcp_gateway_call(void *arg, const char *authz, const char *method,
    json_t *request, json_t **reply, char **errmsg)
{
	struct mcp_call *mc = arg;
	const ProtobufCMethodDescriptor *md;
	ProtobufCMessage *req = NULL, *out = NULL;
	uint32_t timeout_ms = moat_mcp_timeout_ms(method, request);
	const char *auth;
	int rv;

	*reply = NULL;
	*errmsg = NULL;
	if ((rv = moat_mcp_decode_request(mc->h->service, method, request, &md,
	         &req, errmsg)) != MOAT_OK)
		return rv;
	if (authz == NULL)
		rv = call_gateway(mc->h, mc->conn, md, req, timeout_ms, &out,
		    errmsg);
	else if ((rv = moat_http_bearer_key(authz[0] != '\0' ? authz : NULL,
	              &auth, errmsg)) == MOAT_OK)
		rv = call_gateway_as(mc->h, auth, 0, timeout_ms, md, req, &out,
		    errmsg);
	protobuf_c_message_free_unpacked(req, NULL);
	if (rv != MOAT_OK)
		return rv;
	rv = moat_codec_to_json(out, 0, reply, errmsg);
	protobuf_c_message_free_unpacked(out, NULL);
	return rv;
}

static enum MHD_Result
dispatch_url(struct moat_http *h, struct MHD_Connection *conn, const char *url,
    const char *method, const struct http_req *hr)
{
	if (strcmp(url, "/mcp") == 0 || strcmp(url, "/mcp/") == 0) {
		struct mcp_call mc = { .h = h, .conn = conn };

		return moat_mcp_http_serve(h->mcp, conn, method, hr->body,
		    hr->len, mcp_gateway_call, &mc);
	}
	const char *connect = connect_method(h->service, url);

	if (connect != NULL)
		return serve_connect(h, conn, connect, method, hr);

	char id[MOAT_ID_MAX], allow[64] = "";
	char *msg;
	enum MHD_Result ret;
	bool extra;

	ret = serve_extra(h, conn, url, method, &extra);
	if (extra)
		return ret;

	const struct route *rt =
	    find_route(url, method, id, sizeof(id), allow);

	if (rt != NULL && strcmp(rt->pattern, "/healthz") == 0)
		return respond_json(conn, MHD_HTTP_OK,
		    json_pack("{s:s}", "status", "ok"), NULL);
	if (rt != NULL)
		return serve_route(h, conn, rt, id, hr);
	if (allow[0] != '\0') {
		msg = moat_asprintf("%s is not allowed on %s: use %s", method,
		    url, allow);
		ret = respond_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
		    MOAT_UNIMPLEMENTED, msg, allow);
	} else {
		msg = moat_asprintf(
		    "no route %s %s: the routes are " ROUTE_FAMILIES, method,
		    url);
		ret = respond_error(conn, 0, MOAT_NOT_FOUND, msg, NULL);
	}
	free(msg);
	return ret;
}

/* ---- admission: keys and rate limits, from the headers alone ---- */

/* needs_key: whether `url` needs an API key when auth is on: /mcp and
 * the Gateway methods under /v1/ and /moat.v1.Gateway/ (Connect), but
 * the OpenAPI document and Health, which answer anyone (the gateway's
 * own check agrees: Health needs no key). Other URLs are /healthz,
 * /metrics or 404s. */
static bool
needs_key(const struct moat_http *h, const char *url)
{
	const char *connect = connect_method(h->service, url);

	if (strcmp(url, "/mcp") == 0 || strcmp(url, "/mcp/") == 0)
		return true;
	if (connect != NULL)
		return strcmp(connect, "Health") != 0;
	if (strncmp(url, "/v1/", 4) != 0)
		return false;
	return strcmp(url, "/v1/openapi.json") != 0 &&
	    strcmp(url, "/v1/rpc/Health") != 0 &&
	    strcmp(url, "/v1/rpc/Health/") != 0;
}

/* client_name: the rate limit bucket of the client's address, "a:" and
 * the address; an IPv6 one by its /64 (one host holds a whole /64). */
static void
client_name(struct MHD_Connection *conn, char *out, size_t size)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	char text[INET6_ADDRSTRLEN] = "unknown";

	if (ci != NULL && ci->client_addr != NULL &&
	    ci->client_addr->sa_family == AF_INET) {
		const struct sockaddr_in *sin =
		    (const struct sockaddr_in *)ci->client_addr;

		inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text));
	} else if (ci != NULL && ci->client_addr != NULL &&
	    ci->client_addr->sa_family == AF_INET6) {
		struct in6_addr a =
		    ((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr;

		if (!IN6_IS_ADDR_V4MAPPED(&a))
			memset(a.s6_addr + 8, 0, 8);
		inet_ntop(AF_INET6, &a, text, sizeof(text));
	}
	snprintf(out, size, "a:%s", text);
}

/* url_dialect: how errors to a request for `url` are written. */
static enum dialect
url_dialect(const struct moat_http *h, const char *url)
{
	if (strcmp(url, "/mcp") == 0 || strcmp(url, "/mcp/") == 0)
		return DIALECT_MCP;
	if (connect_method(h->service, url) != NULL)
		return DIALECT_CONNECT;
	return DIALECT_ROUTES;
}

/* refuse: answers a request from its headers, before its body: as /mcp
 * answers (a JSON-RPC error) or as the routes do ({"code", "message"},
 * Connect's with its own code names),
 * with Retry-After when retry_s is not 0 (WWW-Authenticate comes with
 * every 401, from respond). */
static enum MHD_Result
refuse(struct MHD_Connection *conn, enum dialect d, unsigned status, int code,
    const char *message, uint32_t retry_s)
{
	enum moat_http_wire w =
	    moat_http_wire_of(MHD_lookup_connection_value(conn,
	        MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE));

	/* The streaming forms' clients read the status from the stream's
	 * end, not from the HTTP status. */
	if (d == DIALECT_CONNECT && moat_http_wire_streams(w))
		return wire_error(conn, w, code, message);

	json_t *j = d == DIALECT_MCP ?
	    moat_mcp_error_reply(MOAT_MCP_INVALID_REQUEST, message) :
	    error_json(d == DIALECT_CONNECT ? moat_http_connect_code(code) :
	                                      moat_strerror(code),
	        message);
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	char retry[16];

	json_decref(j);
	snprintf(retry, sizeof(retry), "%u", retry_s);
	return respond_with(conn, status, text, text ? strlen(text) : 0,
	    "application/json",
	    retry_s != 0 ? MHD_HTTP_HEADER_RETRY_AFTER : NULL, retry);
}

/* refuse_rate: 429 for the bucket of `whose` ("this address"). */
static enum MHD_Result
refuse_rate(struct moat_http *h, struct MHD_Connection *conn, enum dialect d,
    const char *whose, uint32_t retry_s)
{
	char *msg =
	    moat_asprintf("too many requests from %s: at most %u a "
	                  "second, %u at once ([gateway] rate-limit-rps, "
	                  "rate-limit-burst); retry in %u s",
	        whose, h->rps, h->burst, retry_s);
	enum MHD_Result ret = refuse(conn, d, MHD_HTTP_TOO_MANY_REQUESTS,
	    MOAT_RESOURCE_EXHAUSTED, msg ? msg : "too many requests", retry_s);

	free(msg);
	return ret;
}

/* admit: the checks made on a request's headers before a byte of its
 * body is read: the client address's bucket, then (a URL that needs one,
 * auth on) the API key, then the key's bucket. *refused false: go on;
 * true: the refusal is queued (or could not be: MHD_NO). */
static enum MHD_Result
admit(struct moat_http *h, struct MHD_Connection *conn, const char *url,
    bool *refused)
{
	const char *authz = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    MHD_HTTP_HEADER_AUTHORIZATION);
	enum dialect d = url_dialect(h, url);
	char name[MOAT_RATELIMIT_NAME_MAX], key_id[MOAT_AUTH_KEY_ID_LEN + 1];
	const char *key;
	char *errmsg = NULL;
	uint32_t retry = 0;
	uint64_t now = moat_rpc_now_ms();
	enum MHD_Result ret;
	int rv;

	*refused = true;
	client_name(conn, name, sizeof(name));
	if (!moat_ratelimit_take(h->rl, name, now, &retry))
		return refuse_rate(h, conn, d, "this address", retry);
	if (!needs_key(h, url)) {
		*refused = false;
		return MHD_YES;
	}
	if ((rv = moat_http_bearer_key(authz, &key, &errmsg)) == MOAT_OK)
		rv = moat_gateway_check_key(h->gw, key, key_id, NULL);
	if (rv != MOAT_OK) {
		__atomic_add_fetch(&h->refused_auth, 1, __ATOMIC_RELAXED);
		ret = refuse(conn, d,
		    rv == MOAT_UNAUTHENTICATED ?
		        MHD_HTTP_UNAUTHORIZED :
		        MHD_HTTP_INTERNAL_SERVER_ERROR,
		    rv,
		    errmsg ? errmsg :
		        rv == MOAT_UNAUTHENTICATED ?
		             "an API key is required: send \"Authorization: "
		             "Bearer <key>\" (" MOAT_AUTH_UNAUTHENTICATED_MSG
		             ")" :
		             "the gateway's key store failed: see the gateway "
		             "log",
		    0);
		free(errmsg);
		return ret;
	}
	/* The key's bucket at its tenant's rate ([tenants] key-rps),
	 * shared with the nng door (admission.c). */
	if (key_id[0] != '\0' &&
	    moat_gateway_key_admit(h->gw, key, h->rps, h->burst, &retry,
	        &errmsg) != MOAT_OK) {
		ret = refuse(conn, d, MHD_HTTP_TOO_MANY_REQUESTS,
		    MOAT_RESOURCE_EXHAUSTED,
		    errmsg ? errmsg : "too many requests", retry);
		free(errmsg);
		return ret;
	}
	*refused = false;
	return MHD_YES;
}

/* serve_preflight: a browser's CORS preflight (OPTIONS) of a Connect or
 * gRPC-Web URL, answered from the headers (it carries no key): 204 with
 * the methods and headers allowed when its Origin is in [gateway]
 * http-cors-origins; 403 saying so otherwise. */
static enum MHD_Result
serve_preflight(struct moat_http *h, struct MHD_Connection *conn,
    const char *url)
{
	const char *origin = cors_origin(conn);
	const char *asked = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	    "Access-Control-Request-Headers");
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char *msg;

	if (origin == NULL) {
		const char *o = MHD_lookup_connection_value(conn,
		    MHD_HEADER_KIND, "Origin");

		msg = moat_asprintf("origin %s may not call %s from a "
		                    "browser: add it to [gateway] "
		                    "http-cors-origins (now \"%s\")",
		    o ? o : "(none)", url, h->cors ? h->cors : "");
		ret = connect_error(conn, MHD_HTTP_FORBIDDEN,
		    MOAT_PERMISSION_DENIED, msg, NULL);
		free(msg);
		return ret;
	}
	if ((resp = MHD_create_response_from_buffer(0, NULL,
	         MHD_RESPMEM_PERSISTENT)) == NULL)
		return MHD_NO;
	cors_headers(conn, resp);
	MHD_add_response_header(resp, "Access-Control-Allow-Methods",
	    "POST, OPTIONS");
	/* The headers asked for are echoed: what a client adds (its own
	 * x- headers) is its business; the key is checked anyway. */
	MHD_add_response_header(resp, "Access-Control-Allow-Headers",
	    asked ? asked : CORS_ALLOW_HEADERS);
	MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
	ret = MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* archive_upload: whether the request is PUT /v1/sandboxes/{id}/files
 * with ?archive= (http_archive.c), read from its headers: then either
 * hr->archive takes the body as it comes (*ret MHD_YES), or the refusal
 * is queued in *ret and the body dropped. */
static bool
archive_upload(struct moat_http *h, struct MHD_Connection *conn,
    const char *url, const char *method, struct http_req *hr,
    enum MHD_Result *ret)
{
	const struct route *rt;
	char id[MOAT_ID_MAX], allow[64];

	if (strcmp(method, "PUT") != 0 || !moat_http_archive_asked(conn) ||
	    (rt = find_route(url, method, id, sizeof(id), allow)) == NULL ||
	    rt->body != BODY_FILE)
		return false;
	hr->refused = moat_http_archive_put_begin(h, conn, id, h->archive_max,
	    &hr->archive, ret);
	if (!hr->refused)
		*ret = MHD_YES;
	return true;
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **con_cls)
{
	struct moat_http *h = cls;
	struct http_req *hr = *con_cls;

	if (hr == NULL && strcmp(method, "OPTIONS") == 0 &&
	    connect_method(h->service, url) != NULL)
		return serve_preflight(h, conn, url);
	if (hr == NULL) {
		const char *cl = MHD_lookup_connection_value(conn,
		    MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);

		enum MHD_Result ret;

		if ((hr = calloc(1, sizeof(*hr))) == NULL)
			return MHD_NO;
		*con_cls = hr;
		ret = admit(h, conn, url, &hr->refused);
		if (hr->refused)
			return ret;
		if (archive_upload(h, conn, url, method, hr, &ret))
			return ret;
		/* Refused before reading a byte of it. */
		if (cl != NULL && strtoull(cl, NULL, 10) > MOAT_HTTP_MAX_BODY)
			hr->too_large = true;
		else
			return MHD_YES;
	}
	if (hr->refused) { /* answered already: the body is dropped */
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (hr->archive != NULL && *upload_data_size > 0) {
		moat_http_archive_put_data(hr->archive, upload_data,
		    *upload_data_size);
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (hr->archive != NULL)
		return moat_http_archive_put_end(hr->archive, conn);
	if (*upload_data_size > 0) {
		size_t n = *upload_data_size;

		*upload_data_size = 0;
		if (hr->too_large || hr->len + n > MOAT_HTTP_MAX_BODY) {
			hr->too_large = true;
			free(hr->body);
			hr->body = NULL;
			hr->len = hr->cap = 0;
			return MHD_YES;
		}
		if (hr->len + n > hr->cap) {
			size_t cap = hr->cap ? hr->cap : 4096;
			char *nb;

			while (cap < hr->len + n)
				cap *= 2;
			if (cap > MOAT_HTTP_MAX_BODY)
				cap = MOAT_HTTP_MAX_BODY;
			if ((nb = realloc(hr->body, cap)) == NULL)
				return MHD_NO;
			hr->body = nb;
			hr->cap = cap;
		}
		memcpy(hr->body + hr->len, upload_data, n);
		hr->len += n;
		return MHD_YES;
	}
	if (hr->too_large) {
		char *msg = moat_asprintf(
		    "the request body is larger than "
		    "%u bytes: write big files in parts (PUT .../files with "
		    "?offset=)",
		    MOAT_HTTP_MAX_BODY);
		/* Connect's table has no 413: resource_exhausted is a 429
		 * there, as connect-go answers a message over its limit. */
		enum MHD_Result ret = url_dialect(h, url) == DIALECT_CONNECT ?
		    wire_error(conn,
		        moat_http_wire_of(MHD_lookup_connection_value(conn,
		            MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE)),
		        MOAT_RESOURCE_EXHAUSTED, msg) :
		    respond_error(conn, MHD_HTTP_CONTENT_TOO_LARGE,
		        MOAT_RESOURCE_EXHAUSTED, msg, NULL);
		free(msg);
		return ret;
	}
	return dispatch_url(h, conn, url, method, hr);
}

static void
on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct http_req *hr = *con_cls;

	if (hr != NULL) {
		moat_http_archive_put_free(hr->archive);
		free(hr->body);
		free(hr);
		*con_cls = NULL;
	}
}

/* on_connection: each connection's socket context is its door, so that
 * replies made without it at hand (respond_with) find its CORS origins. */
static void
on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
    enum MHD_ConnectionNotificationCode toe)
{
	(void)conn;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED)
		*socket_context = cls;
}

/* ---- start and stop ---- */

/* parse_addr: "a.b.c.d:port" or "[v6]:port" (numeric only: inet_pton
 * refuses the legacy forms getaddrinfo would take) into *ss. */
static int
parse_addr(const char *addr, struct sockaddr_storage *ss, char **errmsg)
{
	struct sockaddr_in *sin = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
	char host[64], *end;
	const char *colon, *port, *hs = addr;
	unsigned long pn;
	size_t hn;
	bool v6 = addr[0] == '[';

	if (v6) {
		const char *close = strchr(addr, ']');
		if (close == NULL || close[1] != ':')
			goto bad;
		hs = addr + 1;
		hn = (size_t)(close - hs);
		port = close + 2;
	} else {
		if ((colon = strrchr(addr, ':')) == NULL)
			goto bad;
		hn = (size_t)(colon - addr);
		port = colon + 1;
	}
	if (hn == 0 || hn >= sizeof(host) || port[0] < '0' || port[0] > '9')
		goto bad;
	errno = 0;
	pn = strtoul(port, &end, 10);
	if (*end != '\0' || errno != 0 || pn > 65535)
		goto bad;
	memcpy(host, hs, hn);
	host[hn] = '\0';
	memset(ss, 0, sizeof(*ss));
	if (v6) {
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t)pn);
		if (inet_pton(AF_INET6, host, &sin6->sin6_addr) != 1)
			goto bad;
	} else {
		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)pn);
		if (inet_pton(AF_INET, host, &sin->sin_addr) != 1)
			goto bad;
	}
	return MOAT_OK;

bad:
	*errmsg = moat_asprintf(
	    "HTTP address \"%s\" is not a numeric "
	    "host:port: give one as 127.0.0.1:7780 or [::1]:7780, or "
	    "\"off\"",
	    addr);
	return MOAT_INVALID_ARGUMENT;
}

/* http_tls: reads the HTTPS certificate and key when both are set. */
static int
http_tls(struct moat_http *h, const struct moat_http_opts *opts, char **errmsg)
{
	bool cert = opts->tls_cert != NULL && opts->tls_cert[0] != '\0';
	bool key = opts->tls_key != NULL && opts->tls_key[0] != '\0';
	size_t len;
	int err;

	if (!cert && !key)
		return MOAT_OK;
	if (cert != key) {
		*errmsg = moat_asprintf("[gateway] http-tls-cert and "
		                        "http-tls-key go together: give both "
		                        "or neither");
		return MOAT_INVALID_ARGUMENT;
	}
	if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		*errmsg = moat_asprintf(
		    "http-tls-cert is set but this "
		    "libmicrohttpd has no TLS: install one built with GnuTLS, "
		    "or unset http-tls-cert and http-tls-key");
		return MOAT_UNIMPLEMENTED;
	}
	for (int i = 0; i < 2; i++) {
		const char *path = i == 0 ? opts->tls_cert : opts->tls_key;

		if ((err = moat_read_file(path, 1u << 20,
		         i == 0 ? &h->tls_cert : &h->tls_key, &len)) != 0) {
			*errmsg = moat_asprintf("cannot read [gateway] %s %s: "
			                        "%s",
			    i == 0 ? "http-tls-cert" : "http-tls-key", path,
			    strerror(err));
			return MOAT_INVALID_ARGUMENT;
		}
	}
	return MOAT_OK;
}

int
moat_http_start(struct moat_http **out, struct moat_gateway *gw,
    const char *addr, const struct moat_http_opts *opts, char **errmsg)
{
	static const struct moat_http_opts defaults = {
		.mcp_max_sessions = MOAT_HTTP_MCP_MAX_SESSIONS,
		.mcp_idle_s = MOAT_HTTP_MCP_IDLE_S,
	};
	struct moat_rpc_service svc;
	struct moat_mcp_http_store mcp_store;
	struct sockaddr_storage ss;
	const union MHD_DaemonInfo *info;
	struct moat_http *h;
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD |
	    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if (opts == NULL)
		opts = &defaults;
	if (opts->mcp_max_sessions < 1 ||
	    opts->mcp_max_sessions > MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT) {
		*errmsg = moat_asprintf("mcp-max-sessions must be 1-%u, not "
		                        "%u",
		    MOAT_HTTP_MCP_MAX_SESSIONS_LIMIT, opts->mcp_max_sessions);
		return MOAT_INVALID_ARGUMENT;
	}
	if (opts->archive_max_mib > MOAT_HTTP_ARCHIVE_MAX_MIB_LIMIT) {
		*errmsg = moat_asprintf("archive-max-mib must be at most %u "
		                        "(MiB), not %u",
		    MOAT_HTTP_ARCHIVE_MAX_MIB_LIMIT, opts->archive_max_mib);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((rv = parse_addr(addr, &ss, errmsg)) != MOAT_OK)
		return rv;
	if (ss.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	if ((h = calloc(1, sizeof(*h))) == NULL) {
		*errmsg = moat_asprintf("out of memory starting HTTP");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	moat_gateway_service(gw, &svc);
	h->gw = gw;
	h->service = svc.descriptor;
	h->archive_max =
	    (uint64_t)(opts->archive_max_mib ? opts->archive_max_mib :
	                                       MOAT_HTTP_ARCHIVE_MAX_MIB)
	    << 20;
	h->rps =
	    opts->rate_limit_rps ? opts->rate_limit_rps : MOAT_RATELIMIT_RPS;
	h->burst = opts->rate_limit_burst ? opts->rate_limit_burst :
	                                    MOAT_RATELIMIT_BURST;
	if (h->rps == MOAT_HTTP_UNLIMITED)
		h->rps = 0;
	if ((h->rl = moat_ratelimit_new(h->rps, h->burst,
	         MOAT_RATELIMIT_SLOTS)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory starting HTTP");
		goto fail;
	}
	if (moat_mcp_http_new(&h->mcp, opts->mcp_max_sessions,
	        opts->mcp_idle_s) != MOAT_OK) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory starting HTTP");
		goto fail;
	}
	if (opts->cors_origins != NULL && opts->cors_origins[0] != '\0' &&
	    (h->cors = strdup(opts->cors_origins)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory starting HTTP");
		goto fail;
	}
	if (!opts->mcp_table_only && moat_gateway_mcp_store(gw, &mcp_store))
		moat_mcp_http_set_store(h->mcp, &mcp_store);
	if ((rv = moat_rpc_server_new_detached(&h->dispatcher, &svc,
	         errmsg)) != MOAT_OK ||
	    (rv = http_tls(h, opts, errmsg)) != MOAT_OK)
		goto fail;
	/* The TLS options last: MHD_OPTION_END ends the list early
	 * without them. */
	h->daemon = MHD_start_daemon(flags | (h->tls_cert ? MHD_USE_TLS : 0),
	    0, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR,
	    (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned)MOAT_HTTP_MAX_CONNECTIONS,
	    MHD_OPTION_PER_IP_CONNECTION_LIMIT,
	    (unsigned)(opts->max_conns_per_addr ?
	            opts->max_conns_per_addr :
	            MOAT_HTTP_MAX_CONNS_PER_ADDR),
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)MOAT_HTTP_IDLE_TIMEOUT_S,
	    MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
	    MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
	    h->tls_cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END,
	    h->tls_cert, MHD_OPTION_HTTPS_MEM_KEY, h->tls_key, MHD_OPTION_END);
	if (h->daemon == NULL) {
		rv = MOAT_UNAVAILABLE;
		*errmsg = moat_asprintf(
		    "cannot serve HTTP%s on %s: the address "
		    "is in use or not local%s: pick another with --http, or "
		    "--http off",
		    h->tls_cert ? "S" : "", addr,
		    h->tls_cert ? ", or http-tls-cert / http-tls-key are not "
		                  "a PEM certificate and its key" :
		                  "");
		goto fail;
	}
	info = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
	h->port = info != NULL ? info->port : 0;
	*out = h;
	return MOAT_OK;

fail:
	moat_http_stop(h);
	return rv;
}

uint16_t
moat_http_port(const struct moat_http *h)
{
	return h->port;
}

void
moat_http_stop(struct moat_http *h)
{
	if (h == NULL)
		return;
	/* Joins every connection thread: no request runs after this. */
	if (h->daemon != NULL)
		MHD_stop_daemon(h->daemon);
	moat_rpc_server_stop(h->dispatcher);
	moat_mcp_http_free(h->mcp);
	moat_ratelimit_free(h->rl);
	free(h->cors);
	free(h->tls_cert);
	if (h->tls_key != NULL) {
		explicit_bzero(h->tls_key, strlen(h->tls_key));
		free(h->tls_key);
	}
	free(h);
}

/* ---- for http_archive.c ---- */

int
moat_http_call(struct moat_http *h, const char *auth, uint64_t rid,
    uint32_t timeout_ms, const char *method, const ProtobufCMessage *req,
    ProtobufCMessage **reply, char **errmsg)
{
	const ProtobufCMethodDescriptor *md =
	    protobuf_c_service_descriptor_get_method_by_name(h->service,
	        method);

	*reply = NULL;
	if (md == NULL) {
		*errmsg = moat_asprintf("%s has no method %s",
		    h->service->name, method);
		return MOAT_UNIMPLEMENTED;
	}
	return call_gateway_as(h, auth, rid, timeout_ms, md, req, reply,
	    errmsg);
}

int
moat_http_request_opts(struct MHD_Connection *conn, const char **auth,
    uint64_t *rid, uint64_t *timeout, char **errmsg)
{
	return request_auth(conn, auth, rid, timeout, errmsg);
}

enum MHD_Result
moat_http_error(struct MHD_Connection *conn, unsigned status, int code,
    const char *message)
{
	return respond_error(conn, status, code, message, NULL);
}

enum MHD_Result
moat_http_reply(struct MHD_Connection *conn, const ProtobufCMessage *reply)
{
	char *errmsg = NULL;
	json_t *out = NULL;
	enum MHD_Result ret;
	int rv;

	if ((rv = moat_codec_to_json(reply, 0, &out, &errmsg)) != MOAT_OK) {
		ret = respond_error(conn, 0, rv, errmsg, NULL);
		free(errmsg);
		return ret;
	}
	return respond_json(conn, MHD_HTTP_OK, out, NULL);
}

void
moat_http_cors(struct MHD_Connection *conn, struct MHD_Response *resp)
{
	cors_headers(conn, resp);
}
