/*
 * test_http.c: the gateway's HTTP/JSON door (gateway/http.c) in front of
 * a real gateway in-process and a fake vmd node, called with libcurl as a
 * client would (through http_client.h): healthz; a sandbox created,
 * fetched, listed, exec'd in, read and written, and destroyed through the
 * resource routes, each landing on the node as the same Gateway method;
 * the generic /v1/rpc/{Method} route; exec output as Server-Sent Events
 * (start, stdout, stderr and exit events; a JSON error before the
 * stream; the command killed when the client goes away) and the stream
 * described in /v1/openapi.json, where every Gateway method has its
 * POST /v1/rpc/<Method> operation in proto3 JSON shapes; an MCP table of no sessions refused;
 * Connect unary calls (POST /moat.v1.Gateway/<Method>) in JSON and
 * binary protobuf, their errors in Connect's shape and statuses (not
 * found, bad Connect-Timeout-Ms, unknown method, wrong codec, body too
 * large, no key on a second door with auth on); ExecStream in Connect's
 * streaming form (+json and +proto: started, stdout, stderr, exit, then
 * the end-of-stream message; a deadline ends it with the command killed;
 * bad envelopes and the unary/streaming mix-ups in the end message);
 * gRPC-Web (unary and ExecStream, -text too, status in the trailers
 * frame); CORS preflights with and without [gateway] http-cors-origins;
 * and the unhappy paths: malformed JSON, unknown fields, wrong types and
 * an id in the body (400 naming the problem), unknown routes, methods
 * and sandboxes (404), wrong HTTP methods (405 with Allow), bodies over
 * 4 MiB with and without a length (413), a bad Authorization header
 * (401), sessiond down (503); and the door still answers after all of
 * them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "fake_node.h"
#include "gateway.h"
#include "gateway.pb-c.h"
#include "http.h"
#include "http_client.h"
#include "http_connect.h"
#include "moat/codec.h"
#include "moat/log.h"
#include "moat/util.h"

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_gateway *gw;
	struct moat_http *http;
	uint16_t port;
	struct fake_node a;
};

static struct env E;

/* http_ex: one request to the door with `body` (NULL: none; sent as
 * JSON) or else `chunked` bytes with chunked transfer encoding, and an
 * Authorization header when `authz` is not NULL. */
static void
http_ex(const char *method, const char *path, const char *body,
    size_t body_len, const char *authz, size_t chunked,
    struct http_client_resp *r)
{
	const struct http_client_header hdrs[] = { { "Authorization", authz },
		{ NULL, NULL } };

	http_client_request(E.port,
	    &(struct http_client_req){ .method = method,
	        .path = path,
	        .body = body,
	        .body_len = body_len,
	        .chunked = chunked,
	        .headers = hdrs,
	        .json_type = body != NULL },
	    r);
}

static void
http(const char *method, const char *path, const char *body,
    struct http_client_resp *r)
{
	http_ex(method, path, body, body ? strlen(body) : 0, NULL, 0, r);
}

static const char *
jstr(const struct http_client_resp *r, const char *key)
{
	const char *s = json_string_value(json_object_get(r->json, key));

	return s != NULL ? s : "";
}

/* expect_error: status `status`, body {"code": code, "message": ...}
 * with `want` in the message. */
static void
expect_error(struct http_client_resp *r, long status, const char *code,
    const char *want)
{
	if (r->status != status || r->json == NULL ||
	    strcmp(jstr(r, "code"), code) != 0 ||
	    strstr(jstr(r, "message"), want) == NULL)
		fail_msg("got %ld %s, want %ld %s with \"%s\"", r->status,
		    r->body ? r->body : "(no body)", status, code, want);
	http_client_resp_free(r);
}

static void
wait_node(void)
{
	struct http_client_resp r;

	for (int i = 0; i < 300; i++) {
		json_t *nodes;

		http("POST", "/v1/rpc/ListNodes", "{}", &r);
		nodes = json_object_get(r.json, "nodes");
		if (r.status == 200 && json_array_size(nodes) == 1 &&
		    json_is_true(json_object_get(json_array_get(nodes, 0),
		        "available"))) {
			http_client_resp_free(&r);
			return;
		}
		http_client_resp_free(&r);
		nng_msleep(20);
	}
	fail_msg("the gateway never saw the fake node");
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL, *sessiond, *snapd;

	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	curl_global_init(CURL_GLOBAL_ALL);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-http-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	E.survey_url = moat_asprintf("ipc://%s/survey.sock", E.dir);
	E.listen_url = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	sessiond = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	snapd = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	opts.listen_url = E.listen_url;
	opts.survey_url = E.survey_url;
	opts.sessiond_url = sessiond;
	opts.snapd_url = snapd;
	opts.state_dir = E.dir;
	opts.survey_interval_ms = 100;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(sessiond);
	free(snapd);
	if (moat_http_start(&E.http, E.gw, "127.0.0.1:0", NULL, &errmsg) !=
	    MOAT_OK)
		fail_msg("http: %s", errmsg);
	E.port = moat_http_port(E.http);
	assert_true(E.port != 0);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	wait_node();
	return 0;
}

static int
teardown(void **state)
{
	moat_http_stop(E.http);
	fake_node_halt(&E.a);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	curl_global_cleanup();
	return 0;
}

static void
test_healthz(void **state)
{
	struct http_client_resp r;

	http("GET", "/healthz", NULL, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.content_type, "application/json");
	assert_string_equal(jstr(&r, "status"), "ok");
	http_client_resp_free(&r);
}

static void
test_sandbox_lifecycle(void **state)
{
	struct http_client_resp r;
	char id[128], path[256];
	json_t *list;
	bool listed = false;

	http("POST", "/v1/sandboxes",
	    "{\"memoryMib\": 256, \"labels\": "
	    "{\"team\": \"blue\"}, \"image\": \"default\"}",
	    &r);
	if (r.status != 200)
		fail_msg("create: %ld %s", r.status, r.body);
	snprintf(id, sizeof(id), "%s", jstr(&r, "id"));
	assert_non_null(strstr(id, "node-a-sb-"));
	assert_string_equal(jstr(&r, "state"), "SANDBOX_STATE_RUNNING");
	assert_string_equal(jstr(&r, "nodeId"), "node-a");
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "CreateSandbox");

	snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
	http("GET", path, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(jstr(&r, "id"), id);
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "GetSandbox");

	http("GET", "/v1/sandboxes", NULL, &r);
	assert_int_equal(r.status, 200);
	list = json_object_get(r.json, "sandboxes");
	for (size_t i = 0; i < json_array_size(list); i++)
		if (strcmp(json_string_value(
		               json_object_get(json_array_get(list, i), "id")),
		        id) == 0)
			listed = true;
	assert_true(listed);
	http_client_resp_free(&r);

	/* Exec: the body is an ExecRequest without the id. */
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
	http("POST", path,
	    "{\"argv\": [\"echo\", \"hi\"], \"timeoutMs\": "
	    "\"5000\"}",
	    &r);
	if (r.status != 200)
		fail_msg("exec: %ld %s", r.status, r.body);
	assert_true(json_is_object(r.json));
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "Exec");
	assert_string_equal(E.a.last_sandbox, id);
	http("POST", path, "{\"sandboxId\": \"other\", \"shell\": \"ls\"}",
	    &r);
	expect_error(&r, 400, "INVALID_ARGUMENT",
	    "sandboxId comes from the "
	    "URL");
	http("POST", path, "{\"argv\": \"ls\"}", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT",
	    "argv: expected an array, got \"ls\"");

	/* SetTimeout (issue 15): the body is a SetTimeoutRequest without
	 * the id; over the tenant's maximum (default 86400 s) is a 400. */
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/timeout", id);
	http("POST", path, "{\"timeoutS\": 600}", &r);
	if (r.status != 200)
		fail_msg("timeout: %ld %s", r.status, r.body);
	assert_string_equal(jstr(&r, "id"), id);
	assert_string_equal(jstr(&r, "expiresUnixMs"), "600000");
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "SetTimeout");
	assert_int_equal(E.a.last_timeout_s, 600);
	http("POST", path, "{\"timeoutS\": 86401}", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT",
	    "maximum of 86400 s ([tenants] timeout-max-s");

	/* Files: raw bytes both ways. */
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=/etc/hosts",
	    id);
	http("GET", path, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.content_type, "application/octet-stream");
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "ReadFile");
	snprintf(path, sizeof(path),
	    "/v1/sandboxes/%s/files?path=/tmp/x&"
	    "makeParents=true&mode=420",
	    id);
	http_ex("PUT", path, "hello", 5, NULL, 0, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "WriteFile");
	snprintf(path, sizeof(path),
	    "/v1/sandboxes/%s/files?path=/x&"
	    "offset=minus",
	    id);
	http("GET", path, NULL, &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "offset: expected uint64");

	snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
	http("DELETE", path, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "DestroySandbox");
	http("GET", path, NULL, &r);
	expect_error(&r, 404, "NOT_FOUND", id);
}

static void
test_generic_rpc(void **state)
{
	struct http_client_resp r;

	http("POST", "/v1/rpc/Health", "{}", &r);
	assert_int_equal(r.status, 200);
	assert_true(json_is_object(r.json));
	http_client_resp_free(&r);
	/* An empty body is an empty message. */
	http("POST", "/v1/rpc/ListNodes", "", &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(
	    json_string_value(json_object_get(
	        json_array_get(json_object_get(r.json, "nodes"), 0),
	        "nodeId")),
	    "node-a");
	http_client_resp_free(&r);
	http("POST", "/v1/rpc/GetSandbox", "{\"sandbox_id\": \"sb-nope\"}",
	    &r);
	expect_error(&r, 404, "NOT_FOUND", "sb-nope");
	http("POST", "/v1/rpc/NoSuchMethod", "{}", &r);
	expect_error(&r, 404, "NOT_FOUND", "no method \"NoSuchMethod\"");
	http("GET", "/v1/rpc/Health", NULL, &r);
	assert_string_equal(r.allow, "POST");
	expect_error(&r, 405, "UNIMPLEMENTED", "use POST");
}

static void
test_bad_requests(void **state)
{
	struct http_client_resp r;

	http("POST", "/v1/sandboxes", "{\"memoryMib\": ", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT",
	    "malformed JSON body at "
	    "line 1");
	http("POST", "/v1/sandboxes", "[1]", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "must be a JSON object");
	http("POST", "/v1/sandboxes", "{\"bogus\": 1}", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT",
	    "bogus: unknown field of moat.v1.CreateSandboxRequest");
	http("POST", "/v1/sandboxes", "{\"vcpus\": \"many\"}", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "vcpus: expected uint32");
	http("POST", "/v1/sandboxes", "{\"a\": 1, \"a\": 2}", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "duplicate");
	http("GET", "/v1/sandboxes?bogus=1", NULL, &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "bogus: unknown field");

	http("GET", "/v2/things", NULL, &r);
	expect_error(&r, 404, "NOT_FOUND", "/v1/sandboxes");
	http("GET", "/", NULL, &r);
	expect_error(&r, 404, "NOT_FOUND", "/healthz");
	http("GET", "/v1/sandboxes/a/b/c", NULL, &r);
	expect_error(&r, 404, "NOT_FOUND", "no route");
	/* Bytes that are not UTF-8 in the URL, and an id too long for
	 * any sandbox. */
	http("GET", "/v1/%ff%fe", NULL, &r);
	expect_error(&r, 404, "NOT_FOUND", "/v1/??");
	{
		char path[400] = "/v1/sandboxes/";
		memset(path + strlen(path), 'a', 300);
		http("GET", path, NULL, &r);
		expect_error(&r, 404, "NOT_FOUND", "no route");
	}
	http("GET", "/v1/sandboxes/sb-never", NULL, &r);
	expect_error(&r, 404, "NOT_FOUND", "sb-never");

	http("PATCH", "/v1/sandboxes", "{}", &r);
	assert_string_equal(r.allow, "POST, GET");
	expect_error(&r, 405, "UNIMPLEMENTED", "PATCH is not allowed");
	http("POST", "/healthz", "{}", &r);
	expect_error(&r, 405, "UNIMPLEMENTED", "use GET");

	http_ex("GET", "/v1/sandboxes", NULL, 0, "Basic dXNlcjpwdw==", 0, &r);
	expect_error(&r, 401, "UNAUTHENTICATED", "Bearer");
	http_ex("GET", "/v1/sandboxes", NULL, 0, "Bearer k-123", 0, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);

	/* Sessions go to moat-sessiond, which is not running. */
	http("GET", "/v1/sessions", NULL, &r);
	expect_error(&r, 503, "UNAVAILABLE", "sessiond");
}

static void
test_body_limit(void **state)
{
	size_t big = 5u << 20;
	char *body = malloc(big);
	struct http_client_resp r;

	memset(body, ' ', big);
	body[0] = '{';
	body[big - 1] = '}';
	/* With a Content-Length: refused before it is read. */
	http_ex("POST", "/v1/sandboxes", body, big, NULL, 0, &r);
	expect_error(&r, 413, "RESOURCE_EXHAUSTED", "larger than 4194304");
	/* Chunked, with no length: read, dropped, refused. */
	http_ex("PUT", "/v1/sandboxes/x/files?path=/big", NULL, 0, NULL, big,
	    &r);
	expect_error(&r, 413, "RESOURCE_EXHAUSTED", "larger than");
	/* Just under the limit is read and decoded. */
	body[(4u << 20) - 2] = '}';
	http_ex("POST", "/v1/rpc/Health", body, (4u << 20) - 1, NULL, 0, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	free(body);
}

static void
test_addresses(void **state)
{
	static const char *bad[] = { "nonsense", "127.0.0.1", ":80",
		"localhost:80", "127.0.0.1:http", "[::1]80", "[::1",
		"1.2.3:80" };
	struct moat_http_opts no_sessions = { .mcp_max_sessions = 0,
		.mcp_idle_s = 60 };
	struct moat_http *h = NULL;
	char *errmsg = NULL;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(moat_http_start(&h, E.gw, bad[i], NULL,
		                     &errmsg),
		    MOAT_INVALID_ARGUMENT);
		assert_null(h);
		assert_non_null(strstr(errmsg, bad[i]));
		free(errmsg);
		errmsg = NULL;
	}
	/* The port the door already has: UNAVAILABLE naming it. */
	{
		char addr[64];
		snprintf(addr, sizeof(addr), "127.0.0.1:%u", E.port);
		assert_int_equal(moat_http_start(&h, E.gw, addr, NULL,
		                     &errmsg),
		    MOAT_UNAVAILABLE);
		assert_non_null(strstr(errmsg, addr));
		free(errmsg);
		errmsg = NULL;
	}
	/* IPv6, where the host has it. */
	if (moat_http_start(&h, E.gw, "[::1]:0", NULL, &errmsg) == MOAT_OK) {
		assert_true(moat_http_port(h) != 0);
		moat_http_stop(h);
	} else {
		free(errmsg);
		errmsg = NULL;
	}
	/* An MCP table of no sessions: INVALID_ARGUMENT naming the
	 * option. */
	assert_int_equal(moat_http_start(&h, E.gw, "127.0.0.1:0", &no_sessions,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(h);
	assert_non_null(strstr(errmsg, "mcp-max-sessions"));
	free(errmsg);
	moat_http_stop(NULL);
}

/* The event stream of one POST .../exec. */
struct sse {
	struct http_client_resp r;
};

/* sse_post: POSTs `body` as JSON with an Accept header when `accept` is
 * not NULL; the transfer is cut once the body holds `stop_at` (the
 * client going away; NULL: read to the end). */
static void
sse_post(const char *path, const char *body, const char *accept,
    const char *stop_at, struct sse *s)
{
	const struct http_client_header hdrs[] = { { "Accept", accept },
		{ NULL, NULL } };

	http_client_request(E.port,
	    &(struct http_client_req){ .method = "POST",
	        .path = path,
	        .body = body,
	        .body_len = strlen(body),
	        .headers = hdrs,
	        .json_type = true,
	        .stop_at = stop_at },
	    &s->r);
}

/* sse_event: the JSON of the first `event` in body, or NULL. */
static json_t *
sse_event(const char *body, const char *event)
{
	char want[64];
	const char *p, *data, *end;

	snprintf(want, sizeof(want), "event: %s\ndata: ", event);
	if ((p = strstr(body, want)) == NULL)
		return NULL;
	data = p + strlen(want);
	if ((end = strstr(data, "\n\n")) == NULL)
		return NULL;
	return json_loadb(data, (size_t)(end - data), 0, NULL);
}

static char *
last_method(void)
{
	static char m[64];

	pthread_mutex_lock(&E.a.lock);
	snprintf(m, sizeof(m), "%s", E.a.last_method);
	pthread_mutex_unlock(&E.a.lock);
	return m;
}

static void
test_exec_stream(void **state)
{
	struct http_client_resp r;
	struct sse s;
	char id[128], path[256];
	json_t *ev;
	const char *out, *err, *exit_ev;
	bool killed = false;

	http("POST", "/v1/sandboxes", "{}", &r);
	assert_int_equal(r.status, 200);
	snprintf(id, sizeof(id), "%s", jstr(&r, "id"));
	http_client_resp_free(&r);
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);

	/* The fake's exec prints to both streams and exits 3: start,
	 * stdout, stderr, exit, in that order, and the stream ends. */
	sse_post(path, "{\"argv\": [\"echo\", \"hello\"]}",
	    "text/event-stream", NULL, &s);
	if (s.r.status != 200)
		fail_msg("stream: %ld %s", s.r.status, s.r.body);
	assert_string_equal(s.r.content_type, "text/event-stream");
	assert_non_null(s.r.body);
	ev = sse_event(s.r.body, "start");
	assert_non_null(ev);
	assert_string_equal(json_string_value(json_object_get(ev, "execId")),
	    "7");
	json_decref(ev);
	ev = sse_event(s.r.body, "stdout");
	assert_non_null(ev);
	assert_string_equal(json_string_value(json_object_get(ev, "data")),
	    "aGVsbG8K"); /* "hello\n" */
	json_decref(ev);
	ev = sse_event(s.r.body, "stderr");
	assert_non_null(ev);
	assert_string_equal(json_string_value(json_object_get(ev, "data")),
	    "b29wcwo="); /* "oops\n" */
	json_decref(ev);
	ev = sse_event(s.r.body, "exit");
	assert_non_null(ev);
	assert_true(json_is_true(json_object_get(ev, "exited")));
	assert_int_equal(json_integer_value(json_object_get(ev, "exitCode")),
	    3);
	json_decref(ev);
	out = strstr(s.r.body, "event: stdout");
	err = strstr(s.r.body, "event: stderr");
	exit_ev = strstr(s.r.body, "event: exit");
	assert_true(strstr(s.r.body, "event: start") < out && out < err &&
	    err < exit_ev);
	assert_null(strstr(exit_ev + 1, "event:"));
	/* It exited: nothing to kill. */
	assert_string_equal(last_method(), "ExecRead");
	http_client_resp_free(&s.r);

	/* ?stream=true without the Accept header streams too. */
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec?stream=true", id);
	sse_post(path, "{\"shell\": \"echo hello\"}", NULL, NULL, &s);
	assert_int_equal(s.r.status, 200);
	assert_non_null(strstr(s.r.body, "event: exit\n"));
	http_client_resp_free(&s.r);
	/* Without either, the reply is the whole ExecResult. */
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
	sse_post(path, "{\"shell\": \"echo hello\"}", NULL, NULL, &s);
	assert_int_equal(s.r.status, 200);
	assert_string_equal(s.r.content_type, "application/json");
	http_client_resp_free(&s.r);

	/* Errors before the stream starts are JSON errors. */
	sse_post("/v1/sandboxes/sb-never/exec", "{\"shell\": \"ls\"}",
	    "text/event-stream", NULL, &s);
	expect_error(&s.r, 404, "NOT_FOUND", "sb-never");
	sse_post(path, "{\"argv\": \"ls\"}", "text/event-stream", NULL, &s);
	expect_error(&s.r, 400, "INVALID_ARGUMENT", "argv");

	/* The client goes away while the command runs: it is killed. */
	sse_post(path, "{\"argv\": [\"sleep\", \"100\"]}", "text/event-stream",
	    ": waiting", &s);
	assert_int_equal(s.r.status, 200);
	assert_non_null(strstr(s.r.body, "\"execId\":\"8\""));
	http_client_resp_free(&s.r);
	for (int i = 0; i < 500 && !killed; i++) {
		killed = strcmp(last_method(), "ExecKill") == 0;
		if (!killed)
			nng_msleep(10);
	}
	if (!killed)
		fail_msg("the exec was not killed when its client went away "
		         "(last call %s)",
		    last_method());
}

/* /v1/openapi.json describes the event stream: POST .../exec has the
 * `stream` query parameter and a text/event-stream reply naming its
 * events, beside the ExecResult as JSON. */
static void
test_openapi_exec_stream(void **state)
{
	struct http_client_resp r;
	json_t *post, *ok, *sse, *param, *p;
	const char *events;
	size_t i;

	http("GET", "/v1/openapi.json", NULL, &r);
	assert_int_equal(r.status, 200);
	assert_non_null(r.json);
	post =
	    json_object_get(json_object_get(json_object_get(r.json, "paths"),
	                        "/v1/sandboxes/{id}/exec"),
	        "post");
	assert_non_null(post);
	ok = json_object_get(json_object_get(post, "responses"), "200");
	assert_non_null(json_object_get(json_object_get(ok, "content"),
	    "application/json"));
	sse = json_object_get(json_object_get(ok, "content"),
	    "text/event-stream");
	assert_non_null(sse);
	events = json_string_value(
	    json_object_get(json_object_get(sse, "schema"), "description"));
	assert_non_null(events);
	assert_non_null(strstr(events, "start (the ExecHandle"));
	assert_non_null(strstr(events,
	    "stdout and stderr, {\"data\": "
	    "base64"));
	assert_non_null(strstr(events, "exit (the ExecStatus"));
	assert_non_null(strstr(events, "error ({\"code\", \"message\"}"));
	param = NULL;
	json_array_foreach (json_object_get(post, "parameters"), i, p)
		if (strcmp(json_string_value(json_object_get(p, "name")),
		        "stream") == 0)
			param = p;
	assert_non_null(param);
	assert_string_equal(json_string_value(json_object_get(param, "in")),
	    "query");
	assert_string_equal(json_string_value(json_object_get(
	                        json_object_get(param, "schema"), "type")),
	    "boolean");
	/* Only exec streams: CreateSandbox's reply is JSON alone. */
	ok = json_object_get(
	    json_object_get(
	        json_object_get(json_object_get(json_object_get(r.json,
	                                            "paths"),
	                            "/v1/sandboxes"),
	            "post"),
	        "responses"),
	    "200");
	assert_non_null(json_object_get(json_object_get(ok, "content"),
	    "application/json"));
	assert_null(json_object_get(json_object_get(ok, "content"),
	    "text/event-stream"));
	/* ExecStream's Connect streaming: ExecEvent items, a schema that
	 * is there. */
	ok = json_object_get(
	    json_object_get(
	        json_object_get(json_object_get(json_object_get(r.json,
	                                            "paths"),
	                            "/moat.v1.Gateway/ExecStream"),
	            "post"),
	        "responses"),
	    "200");
	events = json_string_value(json_object_get(
	    json_object_get(json_object_get(json_object_get(json_object_get(ok,
	                                                        "content"),
	                                        "application/connect+json"),
	                        "schema"),
	        "items"),
	    "$ref"));
	assert_non_null(events);
	assert_non_null(json_object_get(
	    json_object_get(json_object_get(r.json, "components"), "schemas"),
	    strrchr(events, '/') + 1));
	assert_non_null(strstr(events, "ExecEvent"));
	http_client_resp_free(&r);
}

/* schema_ref: the $ref of the application/json schema of `content`. */
static const char *
schema_ref(json_t *content)
{
	return json_string_value(
	    json_object_get(json_object_get(json_object_get(content,
	                                        "application/json"),
	                        "schema"),
	        "$ref"));
}

/* check_fields: each field of message `d` in the document's `schemas`
 * has the shape the codec writes: a map an object of additionalProperties,
 * a 64-bit integer a string; counts the maps and 64-bit ones seen. */
static void
check_fields(json_t *schemas, const ProtobufCMessageDescriptor *d, int *maps,
    int *wide)
{
	json_t *props =
	    json_object_get(json_object_get(schemas, d->name), "properties");

	assert_non_null(props);
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const ProtobufCMessageDescriptor *e;
		char name[128];
		json_t *p;
		const char *type;

		moat_codec_json_name(f->name, name, sizeof(name));
		if ((p = json_object_get(props, name)) == NULL)
			fail_msg("%s.%s is not in its schema", d->name, name);
		type = json_string_value(json_object_get(p, "type"));
		/* protoc's map<K, V>: a repeated NameEntry {key, value}. */
		e = f->type == PROTOBUF_C_TYPE_MESSAGE ? f->descriptor : NULL;
		if (f->label == PROTOBUF_C_LABEL_REPEATED && e != NULL &&
		    e->n_fields == 2 &&
		    strcmp(e->fields[0].name, "key") == 0 &&
		    strcmp(e->fields[1].name, "value") == 0) {
			assert_string_equal(type, "object");
			assert_non_null(
			    json_object_get(p, "additionalProperties"));
			(*maps)++;
		} else if (f->label != PROTOBUF_C_LABEL_REPEATED &&
		    (f->type == PROTOBUF_C_TYPE_INT64 ||
		        f->type == PROTOBUF_C_TYPE_UINT64 ||
		        f->type == PROTOBUF_C_TYPE_SINT64 ||
		        f->type == PROTOBUF_C_TYPE_FIXED64 ||
		        f->type == PROTOBUF_C_TYPE_SFIXED64)) {
			assert_string_equal(type, "string");
			(*wide)++;
		}
	}
}

/* /v1/openapi.json has POST /v1/rpc/<Method> for every method of the
 * Gateway service, operationId its name, body and reply by $ref to its
 * messages' schemas in proto3 JSON shapes; operation ids are unique. */
static void
test_openapi_methods(void **state)
{
	const ProtobufCServiceDescriptor *svc = &moat__v1__gateway__descriptor;
	struct http_client_resp r;
	json_t *paths, *schemas, *ids, *item, *op;
	const char *path, *verb;
	int maps = 0, wide = 0;

	http("GET", "/v1/openapi.json", NULL, &r);
	assert_int_equal(r.status, 200);
	paths = json_object_get(r.json, "paths");
	schemas =
	    json_object_get(json_object_get(r.json, "components"), "schemas");
	for (unsigned i = 0; i < svc->n_methods; i++) {
		const ProtobufCMethodDescriptor *md = &svc->methods[i];
		char url[128], in[256], out[256];

		snprintf(url, sizeof(url), "/v1/rpc/%s", md->name);
		snprintf(in, sizeof(in), "#/components/schemas/%s",
		    md->input->name);
		snprintf(out, sizeof(out), "#/components/schemas/%s",
		    md->output->name);
		op = json_object_get(json_object_get(paths, url), "post");
		if (op == NULL)
			fail_msg("%s has no operation POST %s", md->name, url);
		assert_string_equal(json_string_value(
		                        json_object_get(op, "operationId")),
		    md->name);
		assert_string_equal(schema_ref(
		                        json_object_get(json_object_get(op,
		                                            "requestBody"),
		                            "content")),
		    in);
		assert_string_equal(schema_ref(json_object_get(
		                        json_object_get(json_object_get(op,
		                                            "responses"),
		                            "200"),
		                        "content")),
		    out);
		check_fields(schemas, md->input, &maps, &wide);
		check_fields(schemas, md->output, &maps, &wide);
	}
	assert_true(maps > 0); /* CreateSandboxRequest.labels */
	assert_true(wide > 0); /* HealthReply.uptimeMs */
	assert_null(json_object_get(paths, "/v1/rpc/{id}"));
	/* Unique operation ids: the REST routes' are not the methods'. */
	ids = json_object();
	json_object_foreach (paths, path, item)
		json_object_foreach (item, verb, op) {
			const char *id = json_string_value(
			    json_object_get(op, "operationId"));

			if (id == NULL)
				fail_msg("%s %s has no operationId", verb,
				    path);
			if (json_object_get(ids, id) != NULL)
				fail_msg("operationId %s twice", id);
			json_object_set_new(ids, id, json_true());
		}
	json_decref(ids);
	http_client_resp_free(&r);
}

/* ---- Connect unary (POST /moat.v1.Gateway/<Method>) ---- */

/* gateway_post: POST /moat.v1.Gateway/<method> with `hdrs` and `body`
 * (`len` bytes). */
static void
gateway_post(uint16_t port, const char *method,
    const struct http_client_header *hdrs, const char *body, size_t len,
    struct http_client_resp *r)
{
	char path[128];

	snprintf(path, sizeof(path), "/moat.v1.Gateway/%s", method);
	http_client_request(port,
	    &(struct http_client_req){ .method = "POST",
	        .path = path,
	        .body = body,
	        .body_len = len,
	        .headers = hdrs },
	    r);
}

/* connect_ex: a Connect unary call of `method` to the door on `port` with
 * `body` (`len` bytes) as `type`, and Connect-Timeout-Ms and
 * Authorization when not NULL. */
static void
connect_ex(uint16_t port, const char *method, const char *type,
    const char *body, size_t len, const char *timeout, const char *authz,
    struct http_client_resp *r)
{
	const struct http_client_header hdrs[] = { { "Content-Type", type },
		{ "Connect-Protocol-Version", "1" },
		{ "Connect-Timeout-Ms", timeout }, { "Authorization", authz },
		{ NULL, NULL } };

	gateway_post(port, method, hdrs, body, len, r);
}

static void
connect_json(const char *method, const char *body, const char *timeout,
    struct http_client_resp *r)
{
	connect_ex(E.port, method, "application/json", body, strlen(body),
	    timeout, NULL, r);
}

/* connect_sandbox_proto: GetSandbox of `id` in binary protobuf both
 * ways; the Sandbox decoded, NULL with the reply in *r on an error. */
static Moat__V1__Sandbox *
connect_sandbox_proto(const char *id, struct http_client_resp *r)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	uint8_t buf[256];
	size_t len;
	Moat__V1__Sandbox *sb;

	ref.sandbox_id = (char *)id;
	len = moat__v1__sandbox_ref__pack(&ref, buf);
	connect_ex(E.port, "GetSandbox", "application/proto", (char *)buf, len,
	    "5000", NULL, r);
	if (r->status != 200)
		return NULL;
	assert_string_equal(r->content_type, "application/proto");
	sb = moat__v1__sandbox__unpack(NULL, r->len, (uint8_t *)r->body);
	assert_non_null(sb);
	http_client_resp_free(r);
	return sb;
}

static void
test_connect_unary(void **state)
{
	struct http_client_resp r;
	Moat__V1__Sandbox *sb;
	char id[128];

	connect_json("ListNodes", "{}", NULL, &r);
	if (r.status != 200)
		fail_msg("ListNodes: %ld %s", r.status, r.body);
	assert_string_equal(r.content_type, "application/json");
	assert_string_equal(
	    json_string_value(json_object_get(
	        json_array_get(json_object_get(r.json, "nodes"), 0),
	        "nodeId")),
	    "node-a");
	http_client_resp_free(&r);

	connect_json("CreateSandbox", "{\"memoryMib\": 256}", "30000", &r);
	if (r.status != 200)
		fail_msg("CreateSandbox: %ld %s", r.status, r.body);
	snprintf(id, sizeof(id), "%s", jstr(&r, "id"));
	assert_non_null(strstr(id, "node-a-sb-"));
	http_client_resp_free(&r);
	assert_string_equal(E.a.last_method, "CreateSandbox");

	/* JSON with a charset, and the .proto field name. */
	char body[256];
	snprintf(body, sizeof(body), "{\"sandbox_id\": \"%s\"}", id);
	connect_ex(E.port, "GetSandbox", "application/json; charset=utf-8",
	    body, strlen(body), NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(jstr(&r, "id"), id);
	http_client_resp_free(&r);

	/* Binary protobuf in, binary protobuf out. */
	sb = connect_sandbox_proto(id, &r);
	if (sb == NULL)
		fail_msg("GetSandbox proto: %ld %s", r.status, r.body);
	assert_string_equal(sb->id, id);
	assert_string_equal(sb->node_id, "node-a");
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	assert_string_equal(E.a.last_method, "GetSandbox");
	assert_string_equal(E.a.last_sandbox, id);
}

static void
test_connect_errors(void **state)
{
	struct http_client_resp r;
	char *big;

	/* Errors are Connect's JSON whatever the codec. */
	connect_json("GetSandbox", "{\"sandboxId\": \"sb-nope\"}", NULL, &r);
	assert_string_equal(r.content_type, "application/json");
	expect_error(&r, 404, "not_found", "sb-nope");
	assert_null(connect_sandbox_proto("sb-nope", &r));
	assert_string_equal(r.content_type, "application/json");
	expect_error(&r, 404, "not_found", "sb-nope");
	connect_json("GetSandbox", "{\"sandboxId\": ", NULL, &r);
	expect_error(&r, 400, "invalid_argument", "malformed JSON");
	connect_ex(E.port, "GetSandbox", "application/proto", "\xff\xff", 2,
	    NULL, NULL, &r);
	expect_error(&r, 400, "invalid_argument", "not a binary");

	connect_json("ListNodes", "{}", "soon", &r);
	expect_error(&r, 400, "invalid_argument", "Connect-Timeout-Ms");
	connect_json("ListNodes", "{}", "12345678901", &r);
	expect_error(&r, 400, "invalid_argument", "1 to 10 decimal digits");
	connect_json("ListNodes", "{}", "-5", &r);
	expect_error(&r, 400, "invalid_argument", "Connect-Timeout-Ms");

	/* Unknown method: unimplemented, 501 in Connect's table. */
	connect_json("NoSuchMethod", "{}", NULL, &r);
	expect_error(&r, 501, "unimplemented", "no method \"NoSuchMethod\"");

	/* Codecs this door does not speak. */
	connect_ex(E.port, "ListNodes", "text/plain", "{}", 2, NULL, NULL, &r);
	expect_error(&r, 415, "unimplemented", "application/proto");
	connect_ex(E.port, "ListNodes", "application/grpc-web+json", "{}", 2,
	    NULL, NULL, &r);
	expect_error(&r, 415, "unimplemented", "application/connect+json");
	http_client_request(E.port,
	    &(struct http_client_req){ .method = "GET",
	        .path = "/moat.v1.Gateway/ListNodes" },
	    &r);
	assert_string_equal(r.allow, "POST");
	expect_error(&r, 405, "unimplemented", "POST");

	/* Over the body limit: resource_exhausted (429 in the table). */
	big = malloc(5u << 20);
	memset(big, ' ', 5u << 20);
	big[0] = '{';
	big[(5u << 20) - 1] = '}';
	connect_ex(E.port, "ListNodes", "application/json", big, 5u << 20,
	    NULL, NULL, &r);
	expect_error(&r, 429, "resource_exhausted", "larger than 4194304");
	free(big);

	/* A malformed Authorization header, even with auth off. */
	connect_ex(E.port, "ListNodes", "application/json", "{}", 2, NULL,
	    "Basic eDp5", &r);
	expect_error(&r, 401, "unauthenticated", "Bearer");
}

/* ---- Connect streaming and gRPC-Web ---- */

/* One envelope of a streamed reply. */
struct frame {
	uint8_t flag;
	const uint8_t *data;
	size_t len;
};

/* frames_of: the envelopes of r's body into f (at most max); fails the
 * test when the body is not whole envelopes. */
static size_t
frames_of(const struct http_client_resp *r, struct frame *f, size_t max)
{
	const uint8_t *p = (const uint8_t *)r->body;
	size_t off = 0, n = 0;

	while (off < r->len) {
		uint32_t len;

		assert_true(r->len - off >= 5);
		assert_true(n < max);
		len = (uint32_t)p[off + 1] << 24 | (uint32_t)p[off + 2] << 16 |
		    (uint32_t)p[off + 3] << 8 | p[off + 4];
		assert_true(r->len - off - 5 >= len);
		f[n].flag = p[off];
		f[n].data = p + off + 5;
		f[n].len = len;
		n++;
		off += 5 + (size_t)len;
	}
	return n;
}

/* envelope: `msg` (`len` bytes) behind a 5-byte prefix of `flag`, into
 * out (heap). */
static char *
envelope(uint8_t flag, const void *msg, size_t len, size_t *out_len)
{
	char *out = malloc(len + 5);

	out[0] = (char)flag;
	out[1] = (char)(len >> 24);
	out[2] = (char)(len >> 16);
	out[3] = (char)(len >> 8);
	out[4] = (char)len;
	memcpy(out + 5, msg, len);
	*out_len = len + 5;
	return out;
}

/* wire_call: POST /moat.v1.Gateway/<method> of `body` as `type` with
 * one more header `name: value` (name NULL: none). */
static void
wire_call(uint16_t port, const char *method, const char *type,
    const char *body, size_t len, const char *name, const char *value,
    struct http_client_resp *r)
{
	const struct http_client_header hdrs[] = { { "Content-Type", type },
		{ name ? name : "X-None", value }, { NULL, NULL } };

	gateway_post(port, method, hdrs, body, len, r);
}

/* connect_stream_json: ExecStream of the JSON ExecRequest `req` as
 * connect+json, with Connect-Timeout-Ms `timeout` (NULL: none). */
static void
connect_stream_json(const char *req, const char *timeout,
    struct http_client_resp *r)
{
	size_t len;
	char *body = envelope(0, req, strlen(req), &len);

	wire_call(E.port, "ExecStream", "application/connect+json", body, len,
	    timeout ? "Connect-Timeout-Ms" : NULL, timeout, r);
	free(body);
}

/* frame_json: frame f's JSON. */
static json_t *
frame_json(const struct frame *f)
{
	json_t *j = json_loadb((const char *)f->data, f->len, 0, NULL);

	assert_non_null(j);
	return j;
}

/* expect_end_error: r is a 200 stream whose last envelope is Connect's
 * end of stream with error `code` and `want` in its message. */
static void
expect_end_error(struct http_client_resp *r, const char *code,
    const char *want)
{
	struct frame f[16];
	size_t n;
	json_t *j, *err;

	if (r->status != 200)
		fail_msg("got %ld %s, want 200 and an end-stream %s",
		    r->status, r->body ? r->body : "", code);
	n = frames_of(r, f, 16);
	assert_true(n > 0);
	assert_int_equal(f[n - 1].flag, 2);
	j = frame_json(&f[n - 1]);
	err = json_object_get(j, "error");
	if (strcmp(json_string_value(json_object_get(err, "code")), code) !=
	        0 ||
	    strstr(json_string_value(json_object_get(err, "message")), want) ==
	        NULL)
		fail_msg("end of stream %.*s, want %s with \"%s\"",
		    (int)f[n - 1].len, f[n - 1].data, code, want);
	json_decref(j);
	http_client_resp_free(r);
}

static void
test_connect_stream(void **state)
{
	Moat__V1__ExecRequest q = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[] = { "echo", "hello" }, *body, req[256], id[128];
	const char *want[] = { "started", "stdout", "stderr", "exit" };
	struct http_client_resp r;
	struct frame f[16];
	uint8_t packed[256];
	json_t *j;
	size_t n, len;

	http("POST", "/v1/sandboxes", "{}", &r);
	assert_int_equal(r.status, 200);
	snprintf(id, sizeof(id), "%s", jstr(&r, "id"));
	http_client_resp_free(&r);

	/* connect+json: started, stdout, stderr, exit, then {}. */
	snprintf(req, sizeof(req),
	    "{\"sandboxId\": \"%s\", \"argv\": [\"echo\", \"hello\"]}", id);
	connect_stream_json(req, "30000", &r);
	if (r.status != 200)
		fail_msg("ExecStream: %ld %s", r.status, r.body);
	assert_string_equal(r.content_type, "application/connect+json");
	n = frames_of(&r, f, 16);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(f[i].flag, 0);
		j = frame_json(&f[i]);
		if (json_object_get(j, want[i]) == NULL)
			fail_msg("event %zu is %.*s, want %s", i,
			    (int)f[i].len, f[i].data, want[i]);
		if (i == 1)
			assert_string_equal(json_string_value(
			                        json_object_get(j, "stdout")),
			    "aGVsbG8K");
		if (i == 3)
			assert_int_equal(json_integer_value(
			                     json_object_get(json_object_get(j,
			                                         "exit"),
			                         "exitCode")),
			    3);
		json_decref(j);
	}
	assert_int_equal(f[4].flag, 2);
	assert_int_equal(f[4].len, 2);
	assert_memory_equal(f[4].data, "{}", 2);
	http_client_resp_free(&r);
	assert_string_equal(last_method(), "ExecRead");

	/* connect+proto: the same events, packed. */
	q.sandbox_id = id;
	q.n_argv = 2;
	q.argv = argv;
	len = moat__v1__exec_request__pack(&q, packed);
	body = envelope(0, packed, len, &len);
	wire_call(E.port, "ExecStream", "application/connect+proto", body, len,
	    NULL, NULL, &r);
	free(body);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.content_type, "application/connect+proto");
	n = frames_of(&r, f, 16);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < 4; i++) {
		Moat__V1__ExecEvent *ev =
		    moat__v1__exec_event__unpack(NULL, f[i].len, f[i].data);

		assert_non_null(ev);
		assert_int_equal(ev->event_case, (int)i + 1);
		if (i == 3)
			assert_int_equal(ev->exit->exit_code, 3);
		moat__v1__exec_event__free_unpacked(ev, NULL);
	}
	assert_int_equal(f[4].flag, 2);
	http_client_resp_free(&r);

	/* The deadline passes while the command runs: it is killed and
	 * the end says deadline_exceeded. */
	snprintf(req, sizeof(req),
	    "{\"sandboxId\": \"%s\", \"argv\": [\"sleep\", \"100\"]}", id);
	connect_stream_json(req, "300", &r);
	expect_end_error(&r, "deadline_exceeded", "killed");
	assert_string_equal(last_method(), "ExecKill");
}

static void
test_connect_stream_errors(void **state)
{
	static const char zipped[] = { 1, 0, 0, 0, 2, '{', '}' };
	static const char longer[] = { 0, 0, 0, 0, 9, '{', '}' };
	struct http_client_resp r;

	/* ExecStream unary; a unary method streamed. */
	connect_json("ExecStream", "{}", NULL, &r);
	expect_error(&r, 501, "unimplemented",
	    "ExecStream streams: send application/connect+proto or +json");
	connect_stream_json("{}", NULL, &r);
	expect_end_error(&r, "invalid_argument", "sandbox");
	wire_call(E.port, "ListNodes", "application/connect+json", "{}", 2,
	    NULL, NULL, &r);
	expect_end_error(&r, "unimplemented", "ListNodes is unary");
	/* Bad envelopes: short, longer than the body, compressed, JSON
	 * that is not. */
	wire_call(E.port, "ExecStream", "application/connect+json", "{}", 2,
	    NULL, NULL, &r);
	expect_end_error(&r, "invalid_argument", "5-byte prefix");
	wire_call(E.port, "ExecStream", "application/connect+json", longer,
	    sizeof(longer), NULL, NULL, &r);
	expect_end_error(&r, "invalid_argument", "does not match the body");
	wire_call(E.port, "ExecStream", "application/connect+proto", zipped,
	    sizeof(zipped), NULL, NULL, &r);
	expect_end_error(&r, "unimplemented", "compression not supported");
	connect_stream_json("{\"sandboxId\": ", NULL, &r);
	expect_end_error(&r, "invalid_argument", "not JSON");
	/* A sandbox that is not there: the end says so. */
	connect_stream_json("{\"sandboxId\": \"sb-never\", \"shell\": \"ls\"}",
	    NULL, &r);
	expect_end_error(&r, "not_found", "sb-never");
	connect_stream_json("{\"sandboxId\": \"sb-never\"}", "soon", &r);
	expect_end_error(&r, "invalid_argument", "Connect-Timeout-Ms");
}

/* grpc_web_status: the grpc-status of the trailers frame ending r, its
 * grpc-message into msg. */
static int
grpc_web_status(const struct http_client_resp *r, char *msg, size_t size)
{
	struct frame f[16];
	size_t n = frames_of(r, f, 16);
	char text[512];
	const char *m;
	int st = -1;

	assert_true(n > 0);
	assert_int_equal(f[n - 1].flag, 0x80);
	snprintf(text, sizeof(text), "%.*s", (int)f[n - 1].len, f[n - 1].data);
	assert_int_equal(sscanf(text, "grpc-status: %d\r\n", &st), 1);
	msg[0] = '\0';
	if ((m = strstr(text, "grpc-message: ")) != NULL)
		snprintf(msg, size, "%.*s", (int)strcspn(m + 14, "\r"),
		    m + 14);
	return st;
}

static void
test_grpc_web(void **state)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest q = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[] = { "echo", "hello" }, *body, id[128], msg[256];
	struct http_client_resp r;
	Moat__V1__Sandbox *sb;
	struct frame f[16];
	uint8_t packed[256];
	size_t len, n;

	http("POST", "/v1/sandboxes", "{}", &r);
	snprintf(id, sizeof(id), "%s", jstr(&r, "id"));
	http_client_resp_free(&r);

	/* Unary: the Sandbox's data frame, then grpc-status 0. */
	ref.sandbox_id = id;
	len = moat__v1__sandbox_ref__pack(&ref, packed);
	body = envelope(0, packed, len, &len);
	wire_call(E.port, "GetSandbox", "application/grpc-web+proto", body,
	    len, "grpc-timeout", "5S", &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.content_type, "application/grpc-web+proto");
	n = frames_of(&r, f, 16);
	assert_int_equal(n, 2);
	assert_int_equal(f[0].flag, 0);
	sb = moat__v1__sandbox__unpack(NULL, f[0].len, f[0].data);
	assert_non_null(sb);
	assert_string_equal(sb->id, id);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	assert_int_equal(grpc_web_status(&r, msg, sizeof(msg)), 0);
	http_client_resp_free(&r);
	free(body);

	/* Errors: trailers alone; grpc-timeout malformed. */
	ref.sandbox_id = "sb-nope";
	len = moat__v1__sandbox_ref__pack(&ref, packed);
	body = envelope(0, packed, len, &len);
	wire_call(E.port, "GetSandbox", "application/grpc-web", body, len,
	    NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_int_equal(grpc_web_status(&r, msg, sizeof(msg)),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(msg, "sb-nope"));
	assert_int_equal(frames_of(&r, f, 16), 1);
	http_client_resp_free(&r);
	wire_call(E.port, "GetSandbox", "application/grpc-web", body, len,
	    "grpc-timeout", "soon", &r);
	assert_int_equal(grpc_web_status(&r, msg, sizeof(msg)),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "grpc-timeout"));
	http_client_resp_free(&r);
	free(body);

	/* ExecStream: the events as data frames, then grpc-status 0. */
	q.sandbox_id = id;
	q.n_argv = 2;
	q.argv = argv;
	len = moat__v1__exec_request__pack(&q, packed);
	body = envelope(0, packed, len, &len);
	wire_call(E.port, "ExecStream", "application/grpc-web+proto", body,
	    len, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	n = frames_of(&r, f, 16);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(f[i].flag, 0);
	assert_int_equal(grpc_web_status(&r, msg, sizeof(msg)), 0);
	http_client_resp_free(&r);

	/* grpc-web-text: base64 both ways. */
	char *b64 = moat_codec_base64(body, len);
	uint8_t *raw = NULL;
	size_t raw_len = 0;

	wire_call(E.port, "ExecStream", "application/grpc-web-text", b64,
	    strlen(b64), NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.content_type, "application/grpc-web-text+proto");
	/* Each piece is padded base64: decode them one by one. */
	struct moat_http_buf all = { 0 };
	for (const char *p = r.body; *p != '\0';) {
		size_t k = strcspn(p, "=");

		k += strspn(p + k, "=");
		assert_int_equal(moat_codec_base64_decode(p, k, &raw,
		                     &raw_len),
		    MOAT_OK);
		all.data = realloc(all.data, all.len + raw_len);
		memcpy(all.data + all.len, raw, raw_len);
		all.len += raw_len;
		free(raw);
		p += k;
	}
	http_client_resp_free(&r);
	r.body = (char *)all.data;
	r.len = all.len;
	n = frames_of(&r, f, 16);
	assert_int_equal(n, 5);
	assert_int_equal(f[4].flag, 0x80);
	free(all.data);
	free(b64);
	free(body);
}

/* test_cors: a second door with [gateway] http-cors-origins: a listed
 * origin's preflight is answered, an unlisted one's refused; replies to
 * a listed origin let it read grpc-status. */
static void
test_cors(void **state)
{
	const struct moat_http_opts opts = { .mcp_max_sessions = 4,
		.cors_origins = "https://app.example, https://b.example" };
	const struct http_client_header pre[] = { { "Origin",
		                                      "https://app.example" },
		{ "Access-Control-Request-Method", "POST" },
		{ "Access-Control-Request-Headers",
		    "content-type,x-grpc-web" },
		{ NULL, NULL } };
	const struct http_client_header evil[] = {
		{ "Origin", "https://evil.example" }, { NULL, NULL }
	};
	struct moat_http *door = NULL;
	struct http_client_resp r;
	char *errmsg = NULL;
	uint16_t port;

	if (moat_http_start(&door, E.gw, "127.0.0.1:0", &opts, &errmsg) !=
	    MOAT_OK)
		fail_msg("http: %s", errmsg);
	port = moat_http_port(door);
	http_client_request(port,
	    &(struct http_client_req){ .method = "OPTIONS",
	        .path = "/moat.v1.Gateway/GetSandbox",
	        .headers = pre },
	    &r);
	assert_int_equal(r.status, 204);
	assert_string_equal(r.cors_origin, "https://app.example");
	assert_non_null(strstr(r.cors_expose, "grpc-status"));
	http_client_resp_free(&r);
	http_client_request(port,
	    &(struct http_client_req){ .method = "OPTIONS",
	        .path = "/moat.v1.Gateway/GetSandbox",
	        .headers = evil },
	    &r);
	assert_string_equal(r.cors_origin, "");
	expect_error(&r, 403, "permission_denied", "http-cors-origins");
	/* A call from the listed origin: readable. */
	http_client_request(port,
	    &(struct http_client_req){ .method = "POST",
	        .path = "/moat.v1.Gateway/ListNodes",
	        .body = "{}",
	        .body_len = 2,
	        .json_type = true,
	        .headers = pre },
	    &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.cors_origin, "https://app.example");
	http_client_resp_free(&r);
	moat_http_stop(door);
	/* The default door has no origins: preflights are refused. */
	http_client_request(E.port,
	    &(struct http_client_req){ .method = "OPTIONS",
	        .path = "/moat.v1.Gateway/GetSandbox",
	        .headers = pre },
	    &r);
	assert_string_equal(r.cors_origin, "");
	expect_error(&r, 403, "permission_denied", "http-cors-origins");
}

/* test_connect_auth: a second gateway and door with auth on: Connect
 * calls need a key, Health does not. */
static void
test_connect_auth(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char dir[] = "/tmp/moat-connect-XXXXXX", id[MOAT_AUTH_KEY_ID_LEN + 1];
	char *errmsg = NULL, *key = NULL, *authz;
	struct moat_auth *a = NULL;
	struct moat_gateway *gw = NULL;
	struct moat_http *door = NULL;
	struct http_client_resp r;
	uint16_t port;

	assert_non_null(mkdtemp(dir));
	assert_int_equal(moat_auth_open(&a, dir, &errmsg), MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "acme", &key, id, &errmsg),
	    MOAT_OK);
	moat_auth_close(a);
	opts.listen_url = moat_asprintf("ipc://%s/gateway.sock", dir);
	opts.survey_url = moat_asprintf("ipc://%s/survey.sock", dir);
	opts.sessiond_url = moat_asprintf("ipc://%s/sessiond.sock", dir);
	opts.snapd_url = moat_asprintf("ipc://%s/snapd.sock", dir);
	opts.state_dir = dir;
	opts.survey_interval_ms = 100;
	opts.auth = true;
	if (moat_gateway_start(&gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	if (moat_http_start(&door, gw, "127.0.0.1:0", NULL, &errmsg) !=
	    MOAT_OK)
		fail_msg("http: %s", errmsg);
	port = moat_http_port(door);

	connect_ex(port, "ListSandboxes", "application/json", "{}", 2, NULL,
	    NULL, &r);
	assert_string_equal(r.www_authenticate, "Bearer realm=\"moat\"");
	expect_error(&r, 401, "unauthenticated", "API key is required");
	connect_ex(port, "ListSandboxes", "application/json", "{}", 2, NULL,
	    "Bearer moat_nope_nope", &r);
	assert_int_equal(r.status, 401);
	assert_string_equal(jstr(&r, "code"), "unauthenticated");
	http_client_resp_free(&r);
	connect_ex(port, "Health", "application/json", "{}", 2, NULL, NULL,
	    &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	authz = moat_asprintf("Bearer %s", key);
	connect_ex(port, "ListSandboxes", "application/json", "{}", 2, NULL,
	    authz, &r);
	if (r.status != 200)
		fail_msg("ListSandboxes with a key: %ld %s", r.status, r.body);
	http_client_resp_free(&r);

	free(authz);
	moat_http_stop(door);
	moat_gateway_stop(gw);
	moat_rm_rf(dir);
	free(key);
	free((char *)opts.listen_url);
	free((char *)opts.survey_url);
	free((char *)opts.sessiond_url);
	free((char *)opts.snapd_url);
}

/* Images (issue 17): GET /v1/images lists the node's, POST /v1/images
 * starts a build (its files' data base64) and names the node, GET
 * /v1/images/builds/{id}?node_id= polls it there, POST .../push and
 * DELETE /v1/images/{name} map to PushImage and RemoveImage. */
static void
test_image_routes(void **state)
{
	struct http_client_resp r = { 0 };
	char path[256];

	(void)state;
	http("GET", "/v1/images", NULL, &r);
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "\"default\""));
	assert_non_null(strstr(r.body, "node-a"));
	http_client_resp_free(&r);
	http("POST", "/v1/images",
	    "{\"name\": \"web\", \"spec\": \"[packages]\\njq =\\n\", "
	    "\"files\": [{\"name\": \"a.sh\", \"data\": \"ZWNobw==\", "
	    "\"mode\": 493}]}",
	    &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(jstr(&r, "nodeId"), "node-a");
	assert_string_equal(jstr(&r, "id"), "build-1");
	http_client_resp_free(&r);
	snprintf(path, sizeof(path),
	    "/v1/images/builds/build-1?node_id=node-a&wait_ms=10");
	http("GET", path, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(jstr(&r, "state"), "IMAGE_BUILD_DONE");
	http_client_resp_free(&r);
	http("GET", "/v1/images/builds/build-1?node_id=node-q", NULL, &r);
	assert_int_equal(r.status, 503);
	assert_non_null(strstr(r.body, "node-q"));
	http_client_resp_free(&r);
	http("POST", "/v1/images/default/push", "{}", &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(jstr(&r, "name"), "default");
	http_client_resp_free(&r);
	http("DELETE", "/v1/images/default", NULL, &r);
	assert_int_equal(r.status, 412);
	assert_non_null(strstr(r.body, "never removed"));
	http_client_resp_free(&r);
}

static void
test_still_answers(void **state)
{
	struct http_client_resp r;

	http("GET", "/healthz", NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	http("POST", "/v1/sandboxes", "{}", &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_healthz),
		cmocka_unit_test(test_sandbox_lifecycle),
		cmocka_unit_test(test_generic_rpc),
		cmocka_unit_test(test_bad_requests),
		cmocka_unit_test(test_body_limit),
		cmocka_unit_test(test_addresses),
		cmocka_unit_test(test_exec_stream),
		cmocka_unit_test(test_openapi_exec_stream),
		cmocka_unit_test(test_openapi_methods),
		cmocka_unit_test(test_connect_unary),
		cmocka_unit_test(test_connect_errors),
		cmocka_unit_test(test_connect_auth),
		cmocka_unit_test(test_connect_stream),
		cmocka_unit_test(test_connect_stream_errors),
		cmocka_unit_test(test_grpc_web),
		cmocka_unit_test(test_cors),
		cmocka_unit_test(test_image_routes),
		cmocka_unit_test(test_still_answers),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
