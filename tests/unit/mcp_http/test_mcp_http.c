/*
 * test_mcp_http.c: MCP's Streamable HTTP transport at /mcp of a real
 * gateway and HTTP door in-process (no nodes): initialize issues
 * Mcp-Session-Id, later requests need it (400 without, 404 unknown),
 * notifications get 202, GET is 405 with Allow, DELETE ends the session
 * (204, then 404), a session answers only its own Authorization, a
 * foreign Origin is 403, malformed JSON is -32700,
 * and tools run through the gateway's own handlers.
 * Not for: the protocol's details (tests/unit/mcp) or VMs (mcp_sdk).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>

#include "gateway.h"
#include "http.h"
#include "moat/log.h"
#include "moat/util.h"

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_gateway *gw;
	struct moat_http *http;
	uint16_t port;
};

static struct env E;
static const char *authz;   /* Authorization header of the next calls */

struct resp {
	long status;
	char *body;
	size_t len;
	char session[128];      /* Mcp-Session-Id of the reply */
	char allow[128];
	json_t *json;
};

static size_t
on_body(char *data, size_t size, size_t n, void *cls)
{
	struct resp *r = cls;
	char *nb = realloc(r->body, r->len + size * n + 1);

	if (nb == NULL)
		return 0;
	memcpy(nb + r->len, data, size * n);
	r->body = nb;
	r->len += size * n;
	r->body[r->len] = '\0';
	return size * n;
}

/* header_value: copies the value of header `name` in data to out. */
static void
header_value(const char *data, size_t len, const char *name, char *out,
    size_t size)
{
	size_t n = strlen(name), start, end = len;

	if (len <= n + 1 || strncasecmp(data, name, n) != 0 || data[n] != ':')
		return;
	start = n + 1;
	while (start < end && data[start] == ' ')
		start++;
	while (end > start && (data[end - 1] == '\r' || data[end - 1] == '\n'))
		end--;
	snprintf(out, size, "%.*s", (int)(end - start), data + start);
}

static size_t
on_header(char *data, size_t size, size_t n, void *cls)
{
	struct resp *r = cls;

	header_value(data, size * n, "Mcp-Session-Id", r->session,
	    sizeof(r->session));
	header_value(data, size * n, "Allow", r->allow, sizeof(r->allow));
	return size * n;
}

/* mcp: one request to /mcp with the session header `sid` (may be NULL)
 * and an Origin (may be NULL). */
static void
mcp(const char *method, const char *body, const char *sid,
    const char *origin, struct resp *r)
{
	CURL *c = curl_easy_init();
	struct curl_slist *hdrs = NULL;
	char url[64], h[256];
	CURLcode cc;

	memset(r, 0, sizeof(*r));
	assert_non_null(c);
	snprintf(url, sizeof(url), "http://127.0.0.1:%u/mcp", E.port);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	if (body != NULL) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
		    (curl_off_t)strlen(body));
	}
	hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
	hdrs = curl_slist_append(hdrs,
	    "Accept: application/json, text/event-stream");
	if (sid != NULL) {
		snprintf(h, sizeof(h), "Mcp-Session-Id: %s", sid);
		hdrs = curl_slist_append(hdrs, h);
	}
	if (origin != NULL) {
		snprintf(h, sizeof(h), "Origin: %s", origin);
		hdrs = curl_slist_append(hdrs, h);
	}
	if (authz != NULL) {
		snprintf(h, sizeof(h), "Authorization: %s", authz);
		hdrs = curl_slist_append(hdrs, h);
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
	cc = curl_easy_perform(c);
	curl_slist_free_all(hdrs);
	if (cc != CURLE_OK)
		fail_msg("%s /mcp: %s", method, curl_easy_strerror(cc));
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	curl_easy_cleanup(c);
	if (r->body != NULL)
		r->json = json_loads(r->body, JSON_DECODE_ANY, NULL);
}

static void
resp_free(struct resp *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof(*r));
}

static int
rpc_error(struct resp *r)
{
	return (int)json_integer_value(json_object_get(json_object_get(
	    r->json, "error"), "code"));
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL, *sessiond, *snapd;

	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	curl_global_init(CURL_GLOBAL_ALL);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-mcphttp-XXXXXX");
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
	if (moat_http_start(&E.http, E.gw, "127.0.0.1:0", &errmsg) !=
	    MOAT_OK)
		fail_msg("http: %s", errmsg);
	E.port = moat_http_port(E.http);
	return 0;
}

static int
teardown(void **state)
{
	moat_http_stop(E.http);
	moat_gateway_stop(E.gw);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	curl_global_cleanup();
	return 0;
}

#define INIT "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"," \
	"\"params\":{\"protocolVersion\":\"2025-03-26\",\"capabilities\":{}," \
	"\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}"
#define LIST "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}"

static void
test_session_lifecycle(void **state)
{
	struct resp r;
	char sid[128];

	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_true(strlen(r.session) >= 16);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
	    r.json, "result"), "protocolVersion")), "2025-03-26");
	snprintf(sid, sizeof(sid), "%s", r.session);
	resp_free(&r);

	mcp("POST", "{\"jsonrpc\":\"2.0\",\"method\":"
	    "\"notifications/initialized\"}", sid, NULL, &r);
	assert_int_equal(r.status, 202);
	assert_int_equal(r.len, 0);
	resp_free(&r);

	mcp("POST", LIST, sid, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_true(json_array_size(json_object_get(json_object_get(r.json,
	    "result"), "tools")) >= 13);
	resp_free(&r);

	/* A tool through the gateway's own handlers (no nodes here). */
	mcp("POST", "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\","
	    "\"params\":{\"name\":\"sandbox_list\",\"arguments\":{}}}", sid,
	    NULL, &r);
	assert_int_equal(r.status, 200);
	assert_non_null(json_object_get(json_object_get(r.json, "result"),
	    "content"));
	resp_free(&r);
	mcp("POST", "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\","
	    "\"params\":{\"name\":\"read_file\",\"arguments\":{\"path\":"
	    "\"/x\",\"sandbox_id\":\"sb-nowhere\"}}}", sid, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_true(json_is_true(json_object_get(json_object_get(r.json,
	    "result"), "isError")));
	resp_free(&r);

	mcp("POST", "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"nope\"}", sid,
	    NULL, &r);
	assert_int_equal(rpc_error(&r), -32601);
	resp_free(&r);

	/* Another caller's credentials do not reach this session. */
	authz = "Bearer someone-else";
	mcp("POST", LIST, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	resp_free(&r);
	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	resp_free(&r);
	authz = NULL;

	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 204);
	resp_free(&r);
	mcp("POST", LIST, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	resp_free(&r);
	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	resp_free(&r);
}

static void
test_transport_errors(void **state)
{
	struct resp r;

	mcp("POST", LIST, NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	assert_non_null(strstr(r.body, "Mcp-Session-Id"));
	resp_free(&r);
	mcp("POST", LIST, "feedface", NULL, &r);
	assert_int_equal(r.status, 404);
	resp_free(&r);
	mcp("POST", "{\"jsonrpc\":", NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	assert_int_equal(rpc_error(&r), -32700);
	resp_free(&r);
	mcp("POST", "", NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	resp_free(&r);
	mcp("GET", NULL, NULL, NULL, &r);
	assert_int_equal(r.status, 405);
	assert_non_null(strstr(r.allow, "POST"));
	resp_free(&r);
	mcp("DELETE", NULL, NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	resp_free(&r);
	mcp("POST", INIT, NULL, "http://evil.example", &r);
	assert_int_equal(r.status, 403);
	assert_string_equal(r.session, "");
	resp_free(&r);
	mcp("POST", INIT, NULL, "http://localhost:3000", &r);
	assert_int_equal(r.status, 200);
	resp_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_session_lifecycle),
		cmocka_unit_test(test_transport_errors),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
