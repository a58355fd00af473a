/*
 * test_mcp_http.c: MCP's Streamable HTTP transport at /mcp of a real
 * gateway and HTTP door in-process (no nodes): initialize issues
 * Mcp-Session-Id, later requests need it (400 without, 404 unknown),
 * notifications get 202, GET is 405 with Allow, DELETE ends the session
 * (204, then 404), a session answers only its own Authorization, a
 * foreign Origin is 403, malformed JSON is -32700, a table full of
 * sessions not idle long enough refuses initialize (503), and tools run
 * through the gateway's own handlers. Then eviction, with keys on, a
 * fake node and a real moat-sessiond (the default sandbox is recorded):
 * a full table evicts the least recently used idle session and destroys
 * its sandbox with that session's own key, not the evicting caller's;
 * initializes without a valid key are 401 and leave the table empty; over
 * the rate limit requests are 429 with Retry-After, per address and per
 * key (a key spent from one address is refused from another); a
 * connection over max-conns-per-addr is closed; two doors on one
 * sessiond share sessions as two gateways do (issue 15).
 * Calls go through the gateway tests' libcurl client (http_client.h).
 * Not for: the protocol's details (tests/unit/mcp) or VMs (mcp_sdk).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "fake_node.h"
#include "gateway.h"
#include "http.h"
#include "http_client.h"
#include "moat/log.h"
#include "moat/util.h"

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_gateway *gw;
	struct moat_http *http;
	uint16_t port;         /* the door the calls go to */
	struct fake_node node; /* eviction group only */
	bool has_node;
	pid_t sessiond;            /* eviction group only; 0: none */
	char *key_acme, *key_zeta; /* eviction group only */
};

static struct env E;
static const char *authz; /* Authorization header of the next calls */

/* request: one request to `path` with the session header `sid` (may be
 * NULL), an Origin (may be NULL) and `authz`. */
static void
request(const char *method, const char *path, const char *body,
    const char *sid, const char *origin, struct http_client_resp *r)
{
	const struct http_client_header hdrs[] = {
		{ "Accept", "application/json, text/event-stream" },
		{ "Mcp-Session-Id", sid }, { "Origin", origin },
		{ "Authorization", authz }, { NULL, NULL }
	};

	http_client_request(E.port,
	    &(struct http_client_req){ .method = method,
	        .path = path,
	        .body = body,
	        .body_len = body ? strlen(body) : 0,
	        .headers = hdrs,
	        .json_type = true },
	    r);
}

/* mcp: one request to /mcp. */
static void
mcp(const char *method, const char *body, const char *sid, const char *origin,
    struct http_client_resp *r)
{
	request(method, "/mcp", body, sid, origin, r);
}

static int
rpc_error(struct http_client_resp *r)
{
	return (int)json_integer_value(
	    json_object_get(json_object_get(r->json, "error"), "code"));
}

/* start: the gateway (keys on when `auth`) in E.dir (env_init) and
 * its HTTP door with `hopts` (NULL: the defaults). */
static void
start(bool auth, const struct moat_http_opts *hopts)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL, *sessiond, *snapd;

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
	opts.auth = auth;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(sessiond);
	free(snapd);
	if (moat_http_start(&E.http, E.gw, "127.0.0.1:0", hopts, &errmsg) !=
	    MOAT_OK)
		fail_msg("http: %s", errmsg);
	E.port = moat_http_port(E.http);
}

/* env_init: a zeroed E, logs, curl and a new E.dir. */
static void
env_init(void)
{
	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	curl_global_init(CURL_GLOBAL_ALL);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-mcphttp-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
}

/* setup: keys off, no sessiond: the table's own behaviour. */
static int
setup(void **state)
{
	static const struct moat_http_opts table_only = {
		.mcp_max_sessions = MOAT_HTTP_MCP_MAX_SESSIONS,
		.mcp_idle_s = MOAT_HTTP_MCP_IDLE_S,
		.mcp_table_only = true
	};

	env_init();
	start(false, &table_only);
	return 0;
}

/* setup_evict: keys on (tenants acme and zeta), a fake node, a real
 * moat-sessiond on the url the gateway was given, and a door of 2 MCP
 * sessions, each evictable as soon as no request uses it (mcp-idle-s
 * 0). */
static int
setup_evict(void **state)
{
	static const struct moat_http_opts two = { .mcp_max_sessions = 2,
		.mcp_idle_s = 0 };
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", NULL,
		NULL };
	char id[MOAT_AUTH_KEY_ID_LEN + 1], bearer[256];
	struct moat_auth *a = NULL;
	char *errmsg = NULL;
	struct http_client_resp r = { 0 };

	env_init();
	/* Keys made before the gateway opens the store. */
	assert_int_equal(moat_auth_open(&a, E.dir, &errmsg), MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "acme", &E.key_acme, id,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "zeta", &E.key_zeta, id,
	                     &errmsg),
	    MOAT_OK);
	moat_auth_close(a);
	start(true, &two);
	assert_int_equal(fake_node_start(&E.node, "node-a", E.dir,
	                     E.survey_url),
	    0);
	E.has_node = true;
	http_client_wait_node(E.gw);

	argv[2] = E.dir;
	if ((E.sessiond = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(E.sessiond > 0);
	snprintf(bearer, sizeof(bearer), "Bearer %s", E.key_acme);
	authz = bearer;
	for (int i = 0; i < 100 && r.status != 200; i++) {
		if (i > 0)
			nng_msleep(50);
		http_client_resp_free(&r);
		request("GET", "/v1/sessions", NULL, NULL, NULL, &r);
	}
	authz = NULL;
	if (r.status != 200)
		fail_msg("moat-sessiond did not come up: GET /v1/sessions "
		         "%ld %s",
		    r.status, r.body ? r.body : "");
	http_client_resp_free(&r);
	return 0;
}

static int
teardown(void **state)
{
	int status;

	if (E.sessiond > 0) {
		kill(E.sessiond, SIGTERM);
		waitpid(E.sessiond, &status, 0);
	}
	moat_http_stop(E.http);
	if (E.has_node)
		fake_node_halt(&E.node);
	moat_gateway_stop(E.gw);
	if (E.has_node)
		fake_node_stop(&E.node);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	free(E.key_acme);
	free(E.key_zeta);
	curl_global_cleanup();
	return 0;
}

#define INIT                                                                  \
	"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\","            \
	"\"params\":{\"protocolVersion\":\"2025-03-26\",\"capabilities\":{}," \
	"\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}"
#define LIST "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}"

static void
test_session_lifecycle(void **state)
{
	struct http_client_resp r;
	char sid[128];

	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_true(strlen(r.session) >= 16);
	assert_string_equal(json_string_value(
	                        json_object_get(json_object_get(r.json,
	                                            "result"),
	                            "protocolVersion")),
	    "2025-03-26");
	snprintf(sid, sizeof(sid), "%s", r.session);
	http_client_resp_free(&r);

	mcp("POST",
	    "{\"jsonrpc\":\"2.0\",\"method\":"
	    "\"notifications/initialized\"}",
	    sid, NULL, &r);
	assert_int_equal(r.status, 202);
	assert_int_equal(r.len, 0);
	http_client_resp_free(&r);

	mcp("POST", LIST, sid, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_true(
	    json_array_size(json_object_get(json_object_get(r.json, "result"),
	        "tools")) >= 13);
	http_client_resp_free(&r);

	/* A tool through the gateway's own handlers (no nodes here). */
	mcp("POST",
	    "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\","
	    "\"params\":{\"name\":\"sandbox_list\",\"arguments\":{}}}",
	    sid, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_non_null(
	    json_object_get(json_object_get(r.json, "result"), "content"));
	http_client_resp_free(&r);
	mcp("POST",
	    "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\","
	    "\"params\":{\"name\":\"read_file\",\"arguments\":{\"path\":"
	    "\"/x\",\"sandbox_id\":\"sb-nowhere\"}}}",
	    sid, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_true(json_is_true(
	    json_object_get(json_object_get(r.json, "result"), "isError")));
	http_client_resp_free(&r);

	mcp("POST", "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"nope\"}", sid,
	    NULL, &r);
	assert_int_equal(rpc_error(&r), -32601);
	http_client_resp_free(&r);

	/* Another caller's credentials do not reach this session. */
	authz = "Bearer someone-else";
	mcp("POST", LIST, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);
	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);
	authz = NULL;

	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	mcp("POST", LIST, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);
	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);
}

static void
test_transport_errors(void **state)
{
	struct http_client_resp r;

	mcp("POST", LIST, NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	assert_non_null(strstr(r.body, "Mcp-Session-Id"));
	http_client_resp_free(&r);
	mcp("POST", LIST, "feedface", NULL, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);
	mcp("POST", "{\"jsonrpc\":", NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	assert_int_equal(rpc_error(&r), -32700);
	http_client_resp_free(&r);
	mcp("POST", "", NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	http_client_resp_free(&r);
	mcp("GET", NULL, NULL, NULL, &r);
	assert_int_equal(r.status, 405);
	assert_non_null(strstr(r.allow, "POST"));
	http_client_resp_free(&r);
	mcp("DELETE", NULL, NULL, NULL, &r);
	assert_int_equal(r.status, 400);
	http_client_resp_free(&r);
	mcp("POST", INIT, NULL, "http://evil.example", &r);
	assert_int_equal(r.status, 403);
	assert_string_equal(r.session, "");
	http_client_resp_free(&r);
	mcp("POST", INIT, NULL, "http://localhost:3000", &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
}

/* A table full of sessions idle for less than mcp-idle-s: initialize is
 * 503 and the sessions stay; an ended one makes room. */
static void
test_full_table(void **state)
{
	static const struct moat_http_opts one = { .mcp_max_sessions = 1,
		.mcp_idle_s = 3600,
		.mcp_table_only = true };
	struct moat_http *h = NULL;
	uint16_t port = E.port;
	char *errmsg = NULL, sid[128];
	struct http_client_resp r;

	if (moat_http_start(&h, E.gw, "127.0.0.1:0", &one, &errmsg) != MOAT_OK)
		fail_msg("http: %s", errmsg);
	E.port = moat_http_port(h);
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid, sizeof(sid), "%s", r.session);
	http_client_resp_free(&r);
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 503);
	assert_string_equal(r.session, "");
	assert_non_null(strstr(r.body, "too many MCP sessions"));
	http_client_resp_free(&r);
	mcp("POST", LIST, sid, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	E.port = port;
	moat_http_stop(h);
}

/* node_sandboxes: how many sandboxes the fake node holds; the first's id
 * and tenant into id and tenant (128 and 64 bytes) when any. */
static int
node_sandboxes(char *id, char *tenant)
{
	int n;

	pthread_mutex_lock(&E.node.lock);
	n = E.node.n_sandboxes;
	if (n > 0) {
		snprintf(id, 128, "%s", E.node.sandboxes[0]);
		snprintf(tenant, 64, "%s", E.node.tenants[0]);
	}
	pthread_mutex_unlock(&E.node.lock);
	return n;
}

/* Eviction: acme's session A makes its default sandbox (run_code);
 * zeta's session B fills the table; zeta's next initialize evicts A,
 * the least recently used, and A's sandbox is destroyed on the node.
 * The gateway answers zeta's DestroySandbox of acme's sandbox with
 * NOT_FOUND before the node sees it, so the sandbox is gone only if
 * the eviction used A's own key. A is then 404; B and the new C stay. */
static void
test_evict_destroys_as_victim(void **state)
{
	char acme[256], zeta[256], sid_a[128], sid_b[128], sid_c[128];
	char sandbox[128] = "", tenant[64] = "", now_id[128] = "";
	char gone[128] = "";
	char method[64];
	struct http_client_resp r;

	snprintf(acme, sizeof(acme), "Bearer %s", E.key_acme);
	snprintf(zeta, sizeof(zeta), "Bearer %s", E.key_zeta);

	authz = acme;
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid_a, sizeof(sid_a), "%s", r.session);
	http_client_resp_free(&r);
	mcp("POST",
	    "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":"
	    "\"tools/call\",\"params\":{\"name\":\"run_code\","
	    "\"arguments\":{\"code\":\"print(1)\"}}}",
	    sid_a, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(sandbox, tenant), 1);
	assert_string_equal(tenant, "acme");

	/* A free slot: nothing is evicted. */
	authz = zeta;
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid_b, sizeof(sid_b), "%s", r.session);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(now_id, tenant), 1);

	/* Full: C evicts A, with A's key. */
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid_c, sizeof(sid_c), "%s", r.session);
	http_client_resp_free(&r);
	assert_true(strlen(sid_c) >= 16);
	assert_string_not_equal(sid_c, sid_a);
	assert_string_not_equal(sid_c, sid_b);
	if (node_sandboxes(now_id, tenant) != 0)
		fail_msg("the evicted session's sandbox %s (tenant %s) is "
		         "still on the node",
		    now_id, tenant);
	pthread_mutex_lock(&E.node.lock);
	snprintf(method, sizeof(method), "%s", E.node.last_method);
	snprintf(gone, sizeof(gone), "%s", E.node.last_sandbox);
	pthread_mutex_unlock(&E.node.lock);
	assert_string_equal(method, "DestroySandbox");
	assert_string_equal(gone, sandbox);

	authz = acme;
	mcp("POST", LIST, sid_a, NULL, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);
	authz = zeta;
	mcp("POST", LIST, sid_b, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	mcp("DELETE", NULL, sid_b, NULL, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	mcp("DELETE", NULL, sid_c, NULL, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	authz = NULL;
}

/* open_door: a second door on E.gw with `o`, the calls' port moved to
 * it; close_door puts the first one back. */
static struct moat_http *
open_door(const struct moat_http_opts *o, uint16_t *saved)
{
	struct moat_http *h = NULL;
	char *errmsg = NULL;

	if (moat_http_start(&h, E.gw, "127.0.0.1:0", o, &errmsg) != MOAT_OK)
		fail_msg("http: %s", errmsg);
	*saved = E.port;
	E.port = moat_http_port(h);
	return h;
}

static void
close_door(struct moat_http *h, uint16_t saved)
{
	E.port = saved;
	moat_http_stop(h);
}

/* mcp_sessions: moat_mcp_sessions of the door's /metrics. */
static long
mcp_sessions(void)
{
	struct http_client_resp r;
	const char *p;
	long n = -1;

	request("GET", "/metrics", NULL, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	p = r.body ? strstr(r.body, "\nmoat_mcp_sessions ") : NULL;
	assert_non_null(p);
	n = strtol(p + strlen("\nmoat_mcp_sessions "), NULL, 10);
	http_client_resp_free(&r);
	return n;
}

#define RUN_CODE                                                              \
	"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\","            \
	"\"params\":{\"name\":\"run_code\",\"arguments\":{\"code\":"          \
	"\"print(1)\"}}}"

/* mcp_on: one request to /mcp of the door on `port`. */
static void
mcp_on(uint16_t port, const char *method, const char *body, const char *sid,
    struct http_client_resp *r)
{
	uint16_t saved = E.port;

	E.port = port;
	mcp(method, body, sid, NULL, r);
	E.port = saved;
}

/* Two doors on one sessiond stand for two gateways (each door has its
 * own table): a session initialized through A goes on through B; the
 * default sandbox B makes is the one A then uses (the node holds one);
 * another tenant's key does not reach it; DELETE through B ends it on A
 * too. A door of one slot (idle 3600) moves a session out of its table
 * without ending it: the next request brings it back, sandbox and all. */
static void
test_shared_across_doors(void **state)
{
	static const struct moat_http_opts ob = { .mcp_max_sessions = 4,
		.mcp_idle_s = 3600 };
	static const struct moat_http_opts oc = { .mcp_max_sessions = 1,
		.mcp_idle_s = 3600 };
	char acme[256], zeta[256], sid[128], sid2[128];
	char sandbox[128] = "", tenant[64] = "", again[128] = "";
	struct http_client_resp r;
	uint16_t a = E.port, saved;
	struct moat_http *hb = open_door(&ob, &saved);
	uint16_t b = E.port;

	E.port = saved;
	snprintf(acme, sizeof(acme), "Bearer %s", E.key_acme);
	snprintf(zeta, sizeof(zeta), "Bearer %s", E.key_zeta);
	authz = acme;
	mcp_on(a, "POST", INIT, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid, sizeof(sid), "%s", r.session);
	http_client_resp_free(&r);

	mcp_on(b, "POST", RUN_CODE, sid, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(sandbox, tenant), 1);
	assert_string_equal(tenant, "acme");
	mcp_on(a, "POST", RUN_CODE, sid, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	if (node_sandboxes(again, tenant) != 1)
		fail_msg("door A made a second default sandbox instead of "
		         "using %s from door B",
		    sandbox);
	assert_string_equal(again, sandbox);

	authz = zeta;
	mcp_on(b, "POST", LIST, sid, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);

	authz = acme;
	mcp_on(b, "DELETE", NULL, sid, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(again, tenant), 0);
	mcp_on(a, "POST", LIST, sid, &r);
	assert_int_equal(r.status, 404);
	assert_non_null(strstr(r.body, "no such MCP session"));
	http_client_resp_free(&r);
	close_door(hb, saved);

	/* One slot: the second session moves the first out of the table. */
	hb = open_door(&oc, &saved);
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid, sizeof(sid), "%s", r.session);
	http_client_resp_free(&r);
	mcp("POST", RUN_CODE, sid, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(sandbox, tenant), 1);
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid2, sizeof(sid2), "%s", r.session);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(again, tenant), 1);
	mcp("POST", RUN_CODE, sid, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(again, tenant), 1);
	assert_string_equal(again, sandbox);
	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	mcp("DELETE", NULL, sid2, NULL, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	assert_int_equal(node_sandboxes(again, tenant), 0);
	authz = NULL;
	close_door(hb, saved);
}

/* With keys on, 300 initializes without a valid key (none, a malformed
 * header, an unknown key, a malformed body) are 401 with
 * WWW-Authenticate: Bearer and a JSON-RPC error, and make no session:
 * the table stays empty and a keyed initialize still gets a slot of a
 * 2-session table. The body of a refused request is never parsed (a
 * malformed one is 401, not 400). */
static void
test_unauthenticated_initialize(void **state)
{
	static const struct moat_http_opts o = { .mcp_max_sessions = 2,
		.mcp_idle_s = 3600,
		.rate_limit_rps = 1000000,
		.rate_limit_burst = 1000000 };
	static const char *const bad[] = { NULL, "Basic dXNlcjpwYXNz",
		"Bearer moat_000000000000_nosuchsecret", "Bearer " };
	char acme[256], sid[128];
	struct http_client_resp r;
	uint16_t saved;
	struct moat_http *h = open_door(&o, &saved);

	for (int i = 0; i < 300; i++) {
		authz = bad[i % 4];
		mcp("POST", i % 5 == 4 ? "{not json" : INIT, NULL, NULL, &r);
		if (r.status != 401)
			fail_msg("unauthenticated initialize %d (%s): %ld %s",
			    i, authz ? authz : "no header", r.status,
			    r.body ? r.body : "");
		assert_string_equal(r.session, "");
		assert_true(strncmp(r.www_authenticate, "Bearer", 6) == 0);
		assert_int_equal(rpc_error(&r), -32600);
		assert_non_null(strstr(r.body, "Bearer <"));
		http_client_resp_free(&r);
	}
	authz = NULL;
	assert_int_equal(mcp_sessions(), 0);
	/* A route of the API is refused the same way, in its own shape. */
	request("GET", "/v1/sessions", NULL, NULL, NULL, &r);
	assert_int_equal(r.status, 401);
	assert_true(strncmp(r.www_authenticate, "Bearer", 6) == 0);
	assert_string_equal(json_string_value(json_object_get(r.json, "code")),
	    "UNAUTHENTICATED");
	http_client_resp_free(&r);
	/* Health and the OpenAPI document answer anyone. */
	request("POST", "/v1/rpc/Health", "{}", NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);

	snprintf(acme, sizeof(acme), "Bearer %s", E.key_acme);
	authz = acme;
	mcp("POST", INIT, NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	snprintf(sid, sizeof(sid), "%s", r.session);
	http_client_resp_free(&r);
	assert_int_equal(mcp_sessions(), 1);
	mcp("DELETE", NULL, sid, NULL, &r);
	assert_int_equal(r.status, 204);
	http_client_resp_free(&r);
	authz = NULL;
	close_door(h, saved);
}

/* Over the rate (1 a second, 2 at once): 429 with Retry-After and the
 * limit named, on /mcp (a JSON-RPC error) and on the routes ({"code":
 * "RESOURCE_EXHAUSTED"}), keyed or not, until a token is back. */
static void
test_rate_limited(void **state)
{
	static const struct moat_http_opts o = { .mcp_max_sessions = 4,
		.mcp_idle_s = 3600,
		.rate_limit_rps = 1,
		.rate_limit_burst = 2 };
	char acme[256];
	struct http_client_resp r;
	uint16_t saved;
	struct moat_http *h = open_door(&o, &saved);
	int ok = 0;

	snprintf(acme, sizeof(acme), "Bearer %s", E.key_acme);
	authz = acme;
	for (int i = 0; i < 3; i++) {
		mcp("POST", INIT, NULL, NULL, &r);
		if (r.status == 200) {
			ok++;
		} else {
			assert_int_equal(r.status, 429);
			assert_true(atoi(r.retry_after) >= 1);
			assert_int_equal(rpc_error(&r), -32600);
			assert_non_null(strstr(r.body, "rate-limit-rps"));
		}
		http_client_resp_free(&r);
	}
	/* Two at once; a third within the second may have one back. */
	assert_true(ok >= 2 && ok <= 3);
	request("GET", "/v1/sessions", NULL, NULL, NULL, &r);
	if (r.status == 429) {
		assert_true(atoi(r.retry_after) >= 1);
		assert_string_equal(json_string_value(
		                        json_object_get(r.json, "code")),
		    "RESOURCE_EXHAUSTED");
	}
	http_client_resp_free(&r);
	/* Without a key too: the address's bucket comes first. */
	authz = NULL;
	for (int i = 0; i < 3; i++) {
		mcp("POST", INIT, NULL, NULL, &r);
		if (r.status == 429)
			break;
		http_client_resp_free(&r);
	}
	assert_int_equal(r.status, 429);
	assert_true(atoi(r.retry_after) >= 1);
	http_client_resp_free(&r);
	/* A token back: keyed requests go through again. */
	nng_msleep(2100);
	authz = acme;
	mcp("POST", LIST, NULL, NULL, &r);
	assert_int_equal(r.status, 400); /* past the limits: no session id */
	http_client_resp_free(&r);
	authz = NULL;
	close_door(h, saved);
}

/* raw_connect: a TCP connection to the door, or -1. */
static int
raw_connect(uint16_t port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* raw_healthz: sends GET /healthz on fd; true when a 200 comes back,
 * false when the door closed the connection or said something else. */
static bool
raw_healthz(int fd)
{
	static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n"
	                          "Connection: close\r\n\r\n";
	struct timeval tv = { .tv_sec = 5 };
	char buf[256] = "";
	ssize_t n;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) < 0)
		return false;
	n = recv(fd, buf, sizeof(buf) - 1, 0);
	return n > 0 && strncmp(buf, "HTTP/1.1 200", 12) == 0;
}

/* max-conns-per-addr 2: a third connection from the same address is
 * closed at once, and one more is served when one of the two ends. */
static void
test_conn_cap(void **state)
{
	static const struct moat_http_opts o = { .mcp_max_sessions = 2,
		.max_conns_per_addr = 2 };
	uint16_t saved;
	struct moat_http *h = open_door(&o, &saved);
	int a = raw_connect(E.port), b = raw_connect(E.port), c, d;

	assert_true(a >= 0 && b >= 0);
	nng_msleep(100); /* both accepted before the third */
	c = raw_connect(E.port);
	if (c >= 0) {
		assert_false(raw_healthz(c));
		close(c);
	}
	assert_true(raw_healthz(a));
	close(a);
	nng_msleep(200); /* the door sees it gone */
	d = raw_connect(E.port);
	assert_true(d >= 0);
	assert_true(raw_healthz(d));
	close(d);
	close(b);
	close_door(h, saved);
}

/* raw_from: sends `method` `path` with the Authorization `auth` (may be
 * NULL) and a
 * small JSON body from source address `src` (a 127.x address: any of
 * them reaches the door on 127.0.0.1) and returns the HTTP status (0:
 * no answer); the head and body into buf (size bytes). */
static int
raw_from(const char *src, const char *method, const char *path,
    const char *auth, char *buf, size_t size)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons(E.port) };
	struct sockaddr_in from = { .sin_family = AF_INET };
	struct timeval tv = { .tv_sec = 5 };
	char req[1024];
	int fd = socket(AF_INET, SOCK_STREAM, 0), n, status = 0;
	size_t got = 0;
	ssize_t r;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	inet_pton(AF_INET, src, &from.sin_addr);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&from, sizeof(from)), 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	n = snprintf(req, sizeof(req),
	    "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
	    "%s%s%sContent-Type: application/json\r\n"
	    "Content-Length: 2\r\n\r\n{}",
	    method, path, auth ? "Authorization: " : "", auth ? auth : "",
	    auth ? "\r\n" : "");
	if (send(fd, req, (size_t)n, MSG_NOSIGNAL) == n)
		while (got < size - 1 &&
		    (r = recv(fd, buf + got, size - 1 - got, 0)) > 0)
			got += (size_t)r;
	buf[got] = '\0';
	close(fd);
	if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
		status = 0;
	return status;
}

/* Per key, not only per address: a key that spent its burst from one
 * address is 429 from another address whose own bucket is full, while
 * that address without the key is still served. */
static void
test_rate_limited_per_key(void **state)
{
	static const struct moat_http_opts o = { .mcp_max_sessions = 2,
		.rate_limit_rps = 1,
		.rate_limit_burst = 2 };
	char acme[256], buf[4096];
	uint16_t saved;
	struct moat_http *h = open_door(&o, &saved);
	int limited = 0;

	snprintf(acme, sizeof(acme), "Bearer %s", E.key_acme);
	/* The key's bucket is the gateway's, shared by every door
	 * (admission.c), and earlier tests used the key: at 1 a second it
	 * is full (2) again after 2 s. */
	sleep(2);
	/* /mcp without a session id: 400 at once, past the limits. */
	for (int i = 0; i < 2; i++)
		assert_int_equal(raw_from("127.0.0.1", "POST", "/mcp", acme,
		                     buf, sizeof(buf)),
		    400);
	/* 127.0.0.2 is new: only the key's bucket can refuse. */
	for (int i = 0; i < 2 && !limited; i++)
		if (raw_from("127.0.0.2", "POST", "/mcp", acme, buf,
		        sizeof(buf)) == 429)
			limited = 1;
	assert_true(limited);
	assert_non_null(strstr(buf, "this API key"));
	assert_non_null(strstr(buf, "Retry-After: "));
	assert_int_equal(raw_from("127.0.0.3", "GET", "/healthz", NULL, buf,
	                     sizeof(buf)),
	    200);
	close_door(h, saved);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_session_lifecycle),
		cmocka_unit_test(test_transport_errors),
		cmocka_unit_test(test_full_table),
	};
	const struct CMUnitTest evict_tests[] = {
		cmocka_unit_test(test_evict_destroys_as_victim),
		cmocka_unit_test(test_shared_across_doors),
		cmocka_unit_test(test_unauthenticated_initialize),
		cmocka_unit_test(test_rate_limited),
		cmocka_unit_test(test_rate_limited_per_key),
		cmocka_unit_test(test_conn_cap),
	};
	int failed;

	failed = cmocka_run_group_tests(tests, setup, teardown);
	failed += cmocka_run_group_tests(evict_tests, setup_evict, teardown);
	return failed;
}
