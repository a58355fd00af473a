/*
 * test_auth.c: tenants, API keys, policy, audit and the operator routes
 * of the gateway (gateway/auth.c, the gate in handlers.c, http.c), with a
 * real gateway in-process (auth on), a fake vmd node, and HTTP calls
 * through http_client.h: the key store itself (create, verify, a wrong
 * secret, revoke); 10,000 audit appends from 8 threads all in the log
 * after a flush (or counted as dropped), and closing commits what is
 * queued; missing, malformed, unknown and revoked keys refused on nng
 * (UNAUTHENTICATED) and HTTP (401), Health and /healthz needing none; a
 * key revoked by the `moat-gateway keys` command while the gateway runs;
 * two tenants, each seeing the other's sandbox as NOT_FOUND for get,
 * exec, files, snapshot and destroy, and not in its list; a command the
 * policy refuses is PERMISSION_DENIED, never reaches the node and is
 * audited, per-tenant policy overrides; ExecResult.safety; /metrics
 * counts calls; the OpenAPI document parses; with a real moat-sessiond,
 * another tenant's session is NOT_FOUND for every session call and a
 * step keeps its safety level.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
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
	struct moat_rpc_client *client;
	uint16_t port;
	struct fake_node a;
	char *key_acme, *key_zeta, *key_gone;
	char gone_id[MOAT_AUTH_KEY_ID_LEN + 1];
};

static struct env E;

/* http: one request; `key` NULL sends no Authorization header. */
static void
http(const char *method, const char *path, const char *body, const char *key,
    struct http_client_resp *r)
{
	char bearer[256];
	const struct http_client_header hdrs[] = {
		{ "Authorization", key != NULL ? bearer : NULL },
		{ NULL, NULL }
	};

	if (key != NULL)
		snprintf(bearer, sizeof(bearer), "Bearer %s", key);
	http_client_request(E.port,
	    &(struct http_client_req){ .method = method,
	        .path = path,
	        .body = body,
	        .body_len = body ? strlen(body) : 0,
	        .headers = hdrs,
	        .json_type = body != NULL },
	    r);
}

/* call: one nng call to the gateway with `key` (NULL: none). Returns the
 * status; *reply (may be NULL) is the caller's. */
static int
call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *out, const char *key,
    ProtobufCMessage **reply, char **msg)
{
	struct moat_rpc_opts o = { .timeout_ms = 10000, .auth = key };
	ProtobufCMessage *r = NULL;
	int rv;

	*msg = NULL;
	rv = moat_rpc_call(E.client, "moat.v1.Gateway", method, req, out, &r,
	    &o, msg);
	if (reply != NULL)
		*reply = r;
	else if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	return rv;
}

static int
call_code(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *out, const char *key)
{
	char *msg = NULL;
	int rv = call(method, req, out, key, NULL, &msg);

	free(msg);
	return rv;
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	struct moat_auth *a = NULL;
	char *errmsg = NULL, *sessiond, *snapd, *gw_url;
	char id[MOAT_AUTH_KEY_ID_LEN + 1];

	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	curl_global_init(CURL_GLOBAL_ALL);
	unsetenv("MOAT_POLICY_REFUSE");
	setenv("MOAT_POLICY_REFUSE_ZETA", "destructive,blocked", 1);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-auth-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	/* Keys made before the gateway opens the store: one process holds
	 * the environment open once. */
	assert_int_equal(moat_auth_open(&a, E.dir, &errmsg), MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "acme", &E.key_acme, id,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "zeta", &E.key_zeta, id,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "acme", &E.key_gone,
	                     E.gone_id, &errmsg),
	    MOAT_OK);
	moat_auth_close(a);
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
	opts.auth = true;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(sessiond);
	free(snapd);
	if (moat_http_start(&E.http, E.gw, "127.0.0.1:0", NULL, &errmsg) !=
	    MOAT_OK)
		fail_msg("http: %s", errmsg);
	E.port = moat_http_port(E.http);
	gw_url = E.listen_url;
	assert_int_equal(moat_rpc_client_open(&E.client, gw_url, &errmsg),
	    MOAT_OK);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	http_client_wait_node(E.gw);
	return 0;
}

static int
teardown(void **state)
{
	moat_rpc_client_close(E.client);
	moat_http_stop(E.http);
	fake_node_halt(&E.a);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	free(E.key_acme);
	free(E.key_zeta);
	free(E.key_gone);
	unsetenv("MOAT_POLICY_REFUSE_ZETA");
	curl_global_cleanup();
	return 0;
}

/* The store on its own, in a directory of its own. */
static void
test_key_store(void **state)
{
	char dir[] = "/tmp/moat-keys-XXXXXX", tenant[64], id[16], id2[16];
	struct moat_auth *a = NULL;
	char *key = NULL, *errmsg = NULL, *bad;

	assert_non_null(mkdtemp(dir));
	assert_int_equal(moat_auth_open(&a, dir, &errmsg), MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "bad name!", &key, id,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	errmsg = NULL;
	/* Issue 17: "moat.*" tenants hold moat's own data (images). */
	assert_int_equal(moat_auth_key_create(a, "moat.images", &key, id,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(key);
	assert_non_null(strstr(errmsg, "reserved"));
	free(errmsg);
	errmsg = NULL;
	{
		char cmd[512], out[256] = "";
		FILE *p;

		snprintf(cmd, sizeof(cmd),
		    "%s keys create --tenant moat.x --local --state-dir %s "
		    "2>&1; echo rc=$?",
		    GATEWAY_BIN, dir);
		assert_non_null(p = popen(cmd, "r"));
		(void)!fread(out, 1, sizeof(out) - 1, p);
		pclose(p);
		assert_non_null(strstr(out, "tenant moat.x is reserved"));
		assert_non_null(strstr(out, "rc=67"));
	}
	assert_int_equal(moat_auth_key_create(a, "t1", &key, id, &errmsg),
	    MOAT_OK);
	assert_non_null(strstr(key, id));
	assert_int_equal(moat_auth_key_verify(a, key, tenant, sizeof(tenant),
	                     id2),
	    MOAT_OK);
	assert_string_equal(tenant, "t1");
	assert_string_equal(id2, id);
	/* One secret character off, no prefix, empty, garbage. */
	bad = strdup(key);
	bad[strlen(bad) - 1] = bad[strlen(bad) - 1] == '0' ? '1' : '0';
	assert_int_equal(moat_auth_key_verify(a, bad, tenant, sizeof(tenant),
	                     id2),
	    MOAT_UNAUTHENTICATED);
	assert_int_equal(moat_auth_key_verify(a, key + 5, tenant,
	                     sizeof(tenant), id2),
	    MOAT_UNAUTHENTICATED);
	assert_int_equal(moat_auth_key_verify(a, "", tenant, sizeof(tenant),
	                     id2),
	    MOAT_UNAUTHENTICATED);
	assert_int_equal(moat_auth_key_verify(a, "moat_x_y", tenant,
	                     sizeof(tenant), id2),
	    MOAT_UNAUTHENTICATED);
	assert_int_equal(moat_auth_key_revoke(a, id, &errmsg), MOAT_OK);
	assert_int_equal(moat_auth_key_verify(a, key, tenant, sizeof(tenant),
	                     id2),
	    MOAT_UNAUTHENTICATED);
	assert_int_equal(moat_auth_key_revoke(a, "000000000000", &errmsg),
	    MOAT_NOT_FOUND);
	free(errmsg);
	free(bad);
	free(key);
	moat_auth_close(a);
	moat_rm_rf(dir);
}

#define AUDIT_THREADS 8
#define AUDIT_CALLS 10000
#define AUDIT_TENANTS_PER_THREAD 2

struct audit_worker {
	struct moat_auth *a;
	int index;
	int failed;
};

static void *
audit_worker_run(void *arg)
{
	struct audit_worker *w = arg;
	char tenant[32], *errmsg = NULL;

	for (int i = 0; i < AUDIT_CALLS / AUDIT_THREADS; i++) {
		json_t *e = json_pack("{s:s, s:s, s:i}", "method", "Exec",
		    "code", "OK", "seq", i);

		snprintf(tenant, sizeof(tenant), "t%d-%d", w->index,
		    i % AUDIT_TENANTS_PER_THREAD);
		if (e == NULL ||
		    moat_auth_audit_append(w->a, tenant, e, &errmsg) !=
		        MOAT_OK) {
			free(errmsg);
			errmsg = NULL;
			w->failed++;
		}
		json_decref(e);
	}
	return NULL;
}

/* audit_count: entries of `tenant` that are calls, and the sum of the
 * dropped counts its "AuditDropped" entries report. */
static void
audit_count(struct moat_auth *a, const char *tenant, int *calls, int *dropped)
{
	json_t *list = NULL, *e;
	char *errmsg = NULL;
	size_t i;

	*calls = *dropped = 0;
	assert_int_equal(moat_auth_audit_list(a, tenant,
	                     MOAT_AUTH_AUDIT_MAX_LIMIT, &list, &errmsg),
	    MOAT_OK);
	json_array_foreach (list, i, e) {
		const char *m =
		    json_string_value(json_object_get(e, "method"));

		assert_non_null(m);
		assert_non_null(json_object_get(e, "at_unix_ms"));
		if (strcmp(m, "Exec") == 0) {
			(*calls)++;
		} else {
			assert_string_equal(m, "AuditDropped");
			assert_non_null(
			    strstr(json_string_value(
			               json_object_get(e, "message")),
			        "audit entries dropped (queue full)"));
			*dropped += (int)json_integer_value(
			    json_object_get(e, "dropped"));
		}
	}
	json_decref(list);
}

/* Audit appends from many threads go through one writer; after a flush
 * every one is in its tenant's log, or counted in a "dropped" entry.
 * Closing commits what is still queued. */
static void
test_audit_concurrent(void **state)
{
	char dir[] = "/tmp/moat-audit-XXXXXX", tenant[32], *errmsg = NULL;
	struct audit_worker w[AUDIT_THREADS];
	pthread_t th[AUDIT_THREADS];
	struct moat_auth *a = NULL;
	int calls, dropped, total = 0, landed = 0;

	assert_non_null(mkdtemp(dir));
	assert_int_equal(moat_auth_open(&a, dir, &errmsg), MOAT_OK);
	for (int t = 0; t < AUDIT_THREADS; t++) {
		w[t] = (struct audit_worker){ .a = a, .index = t };
		assert_int_equal(pthread_create(&th[t], NULL, audit_worker_run,
		                     &w[t]),
		    0);
	}
	for (int t = 0; t < AUDIT_THREADS; t++) {
		assert_int_equal(pthread_join(th[t], NULL), 0);
		assert_int_equal(w[t].failed, 0);
	}
	moat_auth_audit_flush(a);
	for (int t = 0; t < AUDIT_THREADS; t++)
		for (int k = 0; k < AUDIT_TENANTS_PER_THREAD; k++) {
			snprintf(tenant, sizeof(tenant), "t%d-%d", t, k);
			audit_count(a, tenant, &calls, &dropped);
			assert_int_equal(calls + dropped,
			    AUDIT_CALLS / AUDIT_THREADS /
			        AUDIT_TENANTS_PER_THREAD);
			total += calls + dropped;
			landed += calls;
		}
	assert_int_equal(total, AUDIT_CALLS);
	assert_true(landed >= MOAT_AUTH_AUDIT_QUEUE_LEN);

	/* Queued, not flushed: closing commits them. */
	for (int i = 0; i < 100; i++) {
		json_t *e =
		    json_pack("{s:s, s:s}", "method", "Exec", "code", "OK");

		assert_int_equal(moat_auth_audit_append(a, "late", e, &errmsg),
		    MOAT_OK);
		json_decref(e);
	}
	moat_auth_close(a);
	assert_int_equal(moat_auth_open(&a, dir, &errmsg), MOAT_OK);
	audit_count(a, "late", &calls, &dropped);
	assert_int_equal(calls + dropped, 100);
	moat_auth_close(a);
	moat_rm_rf(dir);
}

static void
test_unauthenticated(void **state)
{
	Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
	Moat__V1__ListSandboxesRequest lreq =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	const ProtobufCMessageDescriptor *ld =
	    &moat__v1__sandbox_list__descriptor;
	char *msg = NULL, cmd[512];
	struct http_client_resp r;

	/* Health needs no key; everything else does. */
	assert_int_equal(call_code("Health", &hreq.base,
	                     &moat__v1__health_reply__descriptor, NULL),
	    MOAT_OK);
	assert_int_equal(call("ListSandboxes", &lreq.base, ld, NULL, NULL,
	                     &msg),
	    MOAT_UNAUTHENTICATED);
	assert_non_null(strstr(msg, "moat-gateway keys create --tenant"));
	free(msg);
	assert_int_equal(call_code("ListSandboxes", &lreq.base, ld,
	                     "moat_000000000000_00"),
	    MOAT_UNAUTHENTICATED);
	assert_int_equal(call_code("ListSandboxes", &lreq.base, ld, "garbage"),
	    MOAT_UNAUTHENTICATED);
	assert_int_equal(call_code("ListSandboxes", &lreq.base, ld,
	                     E.key_gone),
	    MOAT_OK);

	http("GET", "/v1/sandboxes", NULL, NULL, &r);
	assert_int_equal(r.status, 401);
	assert_string_equal(json_string_value(json_object_get(r.json, "code")),
	    "UNAUTHENTICATED");
	http_client_resp_free(&r);
	http("GET", "/v1/sandboxes", NULL, "moat_nope", &r);
	assert_int_equal(r.status, 401);
	http_client_resp_free(&r);
	http("GET", "/v1/sandboxes", NULL, E.key_gone, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	http("GET", "/healthz", NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);

	/* Revoked by the operator's command while the gateway runs: the
	 * gateway's key cache lets it through for at most the TTL. */
	snprintf(cmd, sizeof(cmd),
	    "%s keys revoke %s --state-dir %s "
	    ">/dev/null",
	    GATEWAY_BIN, E.gone_id, E.dir);
	assert_int_equal(system(cmd), 0);
	{
		int rv = MOAT_OK;

		for (int i = 0;
		     i <= (MOAT_AUTH_KEY_CACHE_TTL_MS + 1000) / 50 &&
		     rv == MOAT_OK;
		     i++) {
			rv = call_code("ListSandboxes", &lreq.base, ld,
			    E.key_gone);
			if (rv == MOAT_OK)
				nng_msleep(50);
		}
		assert_int_equal(rv, MOAT_UNAUTHENTICATED);
	}
	assert_int_equal(call_code("ListSandboxes", &lreq.base, ld,
	                     E.key_gone),
	    MOAT_UNAUTHENTICATED);
	http("GET", "/v1/sandboxes", NULL, E.key_gone, &r);
	assert_int_equal(r.status, 401);
	http_client_resp_free(&r);
}

static void
test_cross_tenant(void **state)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest ereq = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__FileReadRequest rreq = MOAT__V1__FILE_READ_REQUEST__INIT;
	Moat__V1__FileWriteRequest wreq = MOAT__V1__FILE_WRITE_REQUEST__INIT;
	Moat__V1__SnapshotSandboxRequest sreq =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__ListSandboxesRequest lreq =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__SandboxList *list = NULL;
	char *msg = NULL, *argv[] = { "ls", "/" }, id[128], path[256];
	struct http_client_resp r;
	int calls;

	creq.tenant = "zeta"; /* the client's say is ignored */
	assert_int_equal(call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, E.key_acme,
	                     (ProtobufCMessage **)&sb, &msg),
	    MOAT_OK);
	assert_string_equal(E.a.last_tenant, "acme");
	snprintf(id, sizeof(id), "%s", sb->id);
	moat__v1__sandbox__free_unpacked(sb, NULL);

	ref.sandbox_id = id;
	ereq.sandbox_id = id;
	ereq.n_argv = 2;
	ereq.argv = argv;
	rreq.sandbox_id = id;
	rreq.path = "/etc/hostname";
	wreq.sandbox_id = id;
	wreq.path = "/tmp/x";
	sreq.sandbox_id = id;
	assert_int_equal(call_code("GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, E.key_acme),
	    MOAT_OK);
	calls = E.a.calls;
	assert_int_equal(call("GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, E.key_zeta, NULL,
	                     &msg),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(msg, "does not exist"));
	free(msg);
	assert_int_equal(call_code("Exec", &ereq.base,
	                     &moat__v1__exec_result__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	assert_int_equal(call_code("ExecStart", &ereq.base,
	                     &moat__v1__exec_handle__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	assert_int_equal(call_code("ReadFile", &rreq.base,
	                     &moat__v1__file_data__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	assert_int_equal(call_code("WriteFile", &wreq.base,
	                     &moat__v1__file_info__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	assert_int_equal(call_code("SnapshotSandbox", &sreq.base,
	                     &moat__v1__local_snapshot__descriptor,
	                     E.key_zeta),
	    MOAT_NOT_FOUND);
	assert_int_equal(call_code("DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	/* None of them reached the node. */
	assert_int_equal(E.a.calls, calls);
	snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
	http("GET", path, NULL, E.key_zeta, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);
	http("DELETE", path, NULL, E.key_zeta, &r);
	assert_int_equal(r.status, 404);
	http_client_resp_free(&r);

	/* Not in zeta's list; in acme's. */
	assert_int_equal(call("ListSandboxes", &lreq.base,
	                     &moat__v1__sandbox_list__descriptor, E.key_zeta,
	                     (ProtobufCMessage **)&list, &msg),
	    MOAT_OK);
	for (size_t i = 0; i < list->n_sandboxes; i++)
		assert_string_not_equal(list->sandboxes[i]->id, id);
	moat__v1__sandbox_list__free_unpacked(list, NULL);
	http("GET", path, NULL, E.key_acme, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
}

/* The audit entries of `key` whose method is `method` and code `code`. */
static int
audited(const char *key, const char *method, const char *code,
    const char *command)
{
	struct http_client_resp r;
	json_t *e;
	size_t i;
	int n = 0;

	http("GET", "/v1/audit?limit=50", NULL, key, &r);
	assert_int_equal(r.status, 200);
	json_array_foreach (json_object_get(r.json, "entries"), i, e) {
		const char *m =
		    json_string_value(json_object_get(e, "method"));
		const char *c = json_string_value(json_object_get(e, "code"));
		const char *cmd =
		    json_string_value(json_object_get(e, "command"));

		assert_non_null(json_object_get(e, "atUnixMs"));
		if (m != NULL && strcmp(m, method) == 0 && c != NULL &&
		    strcmp(c, code) == 0 &&
		    (command == NULL ||
		        (cmd != NULL && strcmp(cmd, command) == 0)))
			n++;
	}
	http_client_resp_free(&r);
	return n;
}

/* audited_wait: audited(), polled until it reaches `want` (the writer
 * commits a call's entry a little after the reply), for at most 5 s. */
static int
audited_wait(const char *key, const char *method, const char *code,
    const char *command, int want)
{
	int n = audited(key, method, code, command);

	for (int i = 0; i < 100 && n < want; i++) {
		nng_msleep(50);
		n = audited(key, method, code, command);
	}
	return n;
}

static void
test_policy_and_audit(void **state)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ereq = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *er = NULL;
	Moat__V1__Sandbox *sb = NULL;
	char *msg = NULL, ida[128], idz[128];
	int calls;

	assert_int_equal(call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, E.key_acme,
	                     (ProtobufCMessage **)&sb, &msg),
	    MOAT_OK);
	snprintf(ida, sizeof(ida), "%s", sb->id);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	assert_int_equal(call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, E.key_zeta,
	                     (ProtobufCMessage **)&sb, &msg),
	    MOAT_OK);
	snprintf(idz, sizeof(idz), "%s", sb->id);
	moat__v1__sandbox__free_unpacked(sb, NULL);

	/* Blocked everywhere by default: never reaches the node. */
	calls = E.a.calls;
	ereq.sandbox_id = ida;
	ereq.shell = ":(){ :|:& };:";
	assert_int_equal(call("Exec", &ereq.base,
	                     &moat__v1__exec_result__descriptor, E.key_acme,
	                     NULL, &msg),
	    MOAT_PERMISSION_DENIED);
	assert_non_null(strstr(msg, "blocked"));
	free(msg);
	assert_int_equal(E.a.calls, calls);
	assert_int_equal(audited_wait(E.key_acme, "Exec", "PERMISSION_DENIED",
	                     ":(){ :|:& };:", 1),
	    1);

	/* Destructive: refused for zeta (refuse.zeta), run for acme with
	 * the level in the reply. */
	ereq.shell = "rm -rf /tmp/work";
	ereq.sandbox_id = idz;
	assert_int_equal(call("Exec", &ereq.base,
	                     &moat__v1__exec_result__descriptor, E.key_zeta,
	                     NULL, &msg),
	    MOAT_PERMISSION_DENIED);
	assert_non_null(strstr(msg, "destructive"));
	free(msg);
	ereq.sandbox_id = ida;
	assert_int_equal(call("Exec", &ereq.base,
	                     &moat__v1__exec_result__descriptor, E.key_acme,
	                     (ProtobufCMessage **)&er, &msg),
	    MOAT_OK);
	assert_string_equal(er->safety, "destructive");
	moat__v1__exec_result__free_unpacked(er, NULL);
	assert_string_equal(E.a.last_method, "Exec");

	/* Each tenant's log is its own. One writer commits in call order:
	 * once zeta's last entry is there, so are its earlier ones. */
	assert_int_equal(audited_wait(E.key_acme, "Exec", "OK",
	                     "rm -rf /tmp/work", 1),
	    1);
	assert_true(audited(E.key_acme, "CreateSandbox", "OK", NULL) >= 1);
	assert_int_equal(audited_wait(E.key_zeta, "Exec", "PERMISSION_DENIED",
	                     "rm -rf /tmp/work", 1),
	    1);
	assert_int_equal(audited(E.key_zeta, "Exec", "OK", NULL), 0);
	assert_int_equal(audited(E.key_zeta, "Exec", "PERMISSION_DENIED",
	                     ":(){ :|:& };:"),
	    0);
	{
		struct http_client_resp r;

		http("GET", "/v1/audit", NULL, NULL, &r);
		assert_int_equal(r.status, 401);
		http_client_resp_free(&r);
		http("GET", "/v1/audit?limit=5000", NULL, E.key_acme, &r);
		assert_int_equal(r.status, 400);
		http_client_resp_free(&r);
	}
}

static void
test_metrics_and_openapi(void **state)
{
	Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
	struct http_client_resp r;

	assert_int_equal(call_code("Health", &hreq.base,
	                     &moat__v1__health_reply__descriptor, NULL),
	    MOAT_OK);
	http("GET", "/metrics", NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body,
	    "moat_gateway_calls_total{method="
	    "\"Health\",code=\"OK\"}"));
	assert_non_null(strstr(r.body,
	    "moat_gateway_calls_total{method="
	    "\"ListSandboxes\",code=\"UNAUTHENTICATED\"}"));
	assert_non_null(strstr(r.body,
	    "moat_gateway_call_seconds_bucket{"
	    "method=\"Health\",le=\"+Inf\"}"));
	assert_non_null(strstr(r.body,
	    "moat_sandboxes{node=\"node-a\","
	    "state=\"running\"}"));
	assert_non_null(strstr(r.body,
	    "moat_sandboxes{node=\"node-a\","
	    "state=\"failed\"} 0"));
	http_client_resp_free(&r);

	http("GET", "/v1/openapi.json", NULL, NULL, &r);
	assert_int_equal(r.status, 200);
	assert_non_null(r.json);
	assert_string_equal(json_string_value(
	                        json_object_get(r.json, "openapi")),
	    "3.0.3");
	assert_non_null(
	    json_object_get(json_object_get(json_object_get(r.json, "paths"),
	                        "/v1/sandboxes"),
	        "post"));
	assert_non_null(json_object_get(
	    json_object_get(json_object_get(r.json, "components"), "schemas"),
	    "moat.v1.ExecRequest"));
	assert_non_null(
	    json_object_get(json_object_get(json_object_get(r.json, "paths"),
	                        "/v1/audit"),
	        "get"));
	http_client_resp_free(&r);
}

/* Sessions with a real moat-sessiond: acme's recorded sandbox and its
 * session are NOT_FOUND for zeta in every session call, and the step
 * keeps its safety level. */
static void
test_sessions_cross_tenant(void **state)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__GetSessionRequest greq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__DeleteSessionRequest dreq =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;
	Moat__V1__ListSessionsRequest sreq =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	Moat__V1__RestoreStepRequest rreq =
	    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
	Moat__V1__ForkRequest freq = MOAT__V1__FORK_REQUEST__INIT;
	Moat__V1__DiffRequest dfreq = MOAT__V1__DIFF_REQUEST__INIT;
	Moat__V1__ListSessionsReply *sl = NULL;
	Moat__V1__ListStepsReply *steps = NULL;
	Moat__V1__Sandbox *sb = NULL;
	char *msg = NULL, sandbox_id[128], session_id[128];
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", E.dir,
		NULL };
	pid_t pid;
	int rv = MOAT_UNAVAILABLE, status;

	if ((pid = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(pid > 0);
	for (int i = 0; i < 100 && rv != MOAT_OK; i++) {
		rv = call_code("ListSessions", &sreq.base,
		    &moat__v1__list_sessions_reply__descriptor, E.key_acme);
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	assert_int_equal(rv, MOAT_OK);

	creq.record = true;
	assert_int_equal(call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, E.key_acme,
	                     (ProtobufCMessage **)&sb, &msg),
	    MOAT_OK);
	snprintf(sandbox_id, sizeof(sandbox_id), "%s", sb->id);
	snprintf(session_id, sizeof(session_id), "%s", sb->session_id);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	ex.sandbox_id = sandbox_id;
	ex.shell = "echo hi > /root/x";
	assert_int_equal(call_code("Exec", &ex.base,
	                     &moat__v1__exec_result__descriptor, E.key_acme),
	    MOAT_OK);

	lreq.session_id = session_id;
	assert_int_equal(call("ListSteps", &lreq.base,
	                     &moat__v1__list_steps_reply__descriptor,
	                     E.key_acme, (ProtobufCMessage **)&steps, &msg),
	    MOAT_OK);
	assert_int_equal(steps->n_steps, 1);
	assert_string_equal(steps->steps[0]->safety, "write");
	moat__v1__list_steps_reply__free_unpacked(steps, NULL);

	/* zeta: as if it did not exist. */
	assert_int_equal(call("ListSessions", &sreq.base,
	                     &moat__v1__list_sessions_reply__descriptor,
	                     E.key_zeta, (ProtobufCMessage **)&sl, &msg),
	    MOAT_OK);
	for (size_t i = 0; i < sl->n_sessions; i++)
		assert_string_not_equal(sl->sessions[i]->id, session_id);
	moat__v1__list_sessions_reply__free_unpacked(sl, NULL);
	greq.session_id = session_id;
	assert_int_equal(call_code("GetSession", &greq.base,
	                     &moat__v1__session_info__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	assert_int_equal(call_code("ListSteps", &lreq.base,
	                     &moat__v1__list_steps_reply__descriptor,
	                     E.key_zeta),
	    MOAT_NOT_FOUND);
	rreq.session_id = session_id;
	rreq.step = 1;
	assert_int_equal(call_code("RestoreStep", &rreq.base,
	                     &moat__v1__restore_step_reply__descriptor,
	                     E.key_zeta),
	    MOAT_NOT_FOUND);
	freq.session_id = session_id;
	freq.step = 1;
	assert_int_equal(call_code("Fork", &freq.base,
	                     &moat__v1__fork_reply__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	dfreq.session_a = session_id;
	dfreq.session_b = session_id;
	assert_int_equal(call_code("Diff", &dfreq.base,
	                     &moat__v1__diff_reply__descriptor, E.key_zeta),
	    MOAT_NOT_FOUND);
	dreq.session_id = session_id;
	assert_int_equal(call_code("DeleteSession", &dreq.base,
	                     &moat__v1__delete_session_reply__descriptor,
	                     E.key_zeta),
	    MOAT_NOT_FOUND);
	/* Still acme's. */
	assert_int_equal(call_code("GetSession", &greq.base,
	                     &moat__v1__session_info__descriptor, E.key_acme),
	    MOAT_OK);

	kill(pid, SIGTERM);
	assert_int_equal(waitpid(pid, &status, 0), pid);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_store),
		cmocka_unit_test(test_audit_concurrent),
		cmocka_unit_test(test_unauthenticated),
		cmocka_unit_test(test_cross_tenant),
		cmocka_unit_test(test_policy_and_audit),
		cmocka_unit_test(test_metrics_and_openapi),
		cmocka_unit_test(test_sessions_cross_tenant),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
