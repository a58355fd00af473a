/*
 * test_http_archive.c: directories in and out through the HTTP door
 * (gateway/http_archive.c, issue 17) in front of a real gateway
 * in-process and a fake vmd node (fake_node.h) that records every
 * PutArchive and GetArchive chunk: an upload with Content-Length and
 * one chunked reach the node as 4 MiB chunks in order, at the offsets
 * acknowledged, with the upload's id after the first and `last` on the
 * final one only, and reassemble to the body; one of exactly 4 MiB is a
 * single last chunk; a download is reassembled from its chunks with its
 * Content-Length; the refusals (archive=zip, no path, another query
 * argument, an empty body, the guest's own refusal, an unknown sandbox
 * with the body still coming, a missing path, and
 * archives over [gateway] archive-max-mib as 413 with and without a
 * length, on a second door with a 1 MiB cap) name what to do; and the
 * OpenAPI document describes the archive form.
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

#include "fake_node.h"
#include "gateway.h"
#include "http.h"
#include "http_client.h"
#include "moat/log.h"
#include "moat/util.h"

#define MIB (1u << 20)

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_gateway *gw;
	struct moat_http *http, *small; /* small: archive-max-mib 1 */
	uint16_t port, small_port;
	struct fake_node a;
	char sandbox[128];
};

static struct env E;

static const struct http_client_header tar_type[] = {
	{ "Content-Type", "application/x-tar" }, { NULL, NULL }
};

/* pattern: n bytes, byte i being (i * 7) % 251 (the fake node's). */
static char *
pattern(size_t n)
{
	char *b = malloc(n ? n : 1);

	assert_non_null(b);
	for (size_t i = 0; i < n; i++)
		b[i] = (char)((i * 7) % 251);
	return b;
}

static void
put(uint16_t port, const char *query, const char *body, size_t len,
    bool chunked, struct http_client_resp *r)
{
	char path[512];

	snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?%s", E.sandbox,
	    query);
	http_client_request(port,
	    &(struct http_client_req){ .method = "PUT",
	        .path = path,
	        .body = body,
	        .body_len = len,
	        .body_chunked = chunked,
	        .headers = tar_type },
	    r);
}

static void
get(uint16_t port, const char *query, struct http_client_resp *r)
{
	char path[512];

	snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?%s", E.sandbox,
	    query);
	http_client_request(port,
	    &(struct http_client_req){ .method = "GET", .path = path }, r);
}

static const char *
jstr(const struct http_client_resp *r, const char *key)
{
	const char *s = json_string_value(json_object_get(r->json, key));

	return s != NULL ? s : "";
}

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

/* archive_log: the node's chunk log, then cleared. */
static void
expect_log(const char *want)
{
	pthread_mutex_lock(&E.a.lock);
	if (strcmp(E.a.archive_log, want) != 0) {
		char got[sizeof(E.a.archive_log)];

		snprintf(got, sizeof(got), "%s", E.a.archive_log);
		pthread_mutex_unlock(&E.a.lock);
		fail_msg("chunks: got \"%s\", want \"%s\"", got, want);
	}
	E.a.archive_log[0] = '\0';
	pthread_mutex_unlock(&E.a.lock);
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	struct moat_http_opts small = {
		.mcp_max_sessions = MOAT_HTTP_MCP_MAX_SESSIONS,
		.mcp_idle_s = MOAT_HTTP_MCP_IDLE_S,
		.mcp_table_only = true,
		.archive_max_mib = 1,
	};
	struct http_client_resp r;
	char *errmsg = NULL, *sessiond, *snapd;

	(void)state;
	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	curl_global_init(CURL_GLOBAL_ALL);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-http-archive-XXXXXX");
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
	        MOAT_OK ||
	    moat_http_start(&E.small, E.gw, "127.0.0.1:0", &small, &errmsg) !=
	        MOAT_OK)
		fail_msg("http: %s", errmsg);
	E.port = moat_http_port(E.http);
	E.small_port = moat_http_port(E.small);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	http_client_wait_node(E.gw);
	http_client_request(E.port,
	    &(struct http_client_req){ .method = "POST",
	        .path = "/v1/sandboxes",
	        .body = "{}",
	        .body_len = 2,
	        .json_type = true },
	    &r);
	if (r.status != 200)
		fail_msg("create: %ld %s", r.status, r.body);
	snprintf(E.sandbox, sizeof(E.sandbox), "%s", jstr(&r, "id"));
	http_client_resp_free(&r);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	moat_http_stop(E.small);
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

/* upload: `len` bytes of pattern up, with a length or chunked: the
 * chunks `want` on the node, the body reassembled there, the counts. */
static void
upload(size_t len, bool chunked, const char *want)
{
	struct http_client_resp r;
	char *body = pattern(len), bytes[32];

	put(E.port, "path=/work/tree&archive=tar", body, len, chunked, &r);
	if (r.status != 200)
		fail_msg("upload: %ld %s", r.status, r.body);
	assert_string_equal(r.content_type, "application/json");
	assert_string_equal(jstr(&r, "uploadId"), "up-1");
	assert_true(json_is_true(json_object_get(r.json, "done")));
	assert_int_equal(json_integer_value(json_object_get(r.json, "files")),
	    1);
	assert_int_equal(json_integer_value(
	                     json_object_get(r.json, "symlinks")),
	    3);
	snprintf(bytes, sizeof(bytes), "%zu", len);
	assert_string_equal(jstr(&r, "bytes"), bytes);
	http_client_resp_free(&r);
	expect_log(want);
	pthread_mutex_lock(&E.a.lock);
	assert_true(E.a.put_done);
	assert_int_equal(E.a.put_len, len);
	assert_memory_equal(E.a.put_data, body, len);
	E.a.archive_ids = 0;
	pthread_mutex_unlock(&E.a.lock);
	free(body);
}

static void
test_upload_chunks(void **state)
{
	const char *nine = "put(@0+4194304) put(up-1@4194304+4194304) "
	                   "put(up-1@8388608+1048581,last) ";

	(void)state;
	upload(9 * MIB + 5, false, nine);
	upload(9 * MIB + 5, true, nine);
	/* Exactly one chunk's worth: one call, the last. */
	upload(4 * MIB, false, "put(@0+4194304,last) ");
	upload(4 * MIB, true, "put(@0+4194304,last) ");
	upload(1000, true, "put(@0+1000,last) ");
}

static void
test_upload_refused(void **state)
{
	struct http_client_resp r;
	char *body = pattern(9 * MIB);

	(void)state;
	put(E.port, "path=/d&archive=zip", "x", 1, false, &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "send archive=tar");
	put(E.port, "archive=tar", "x", 1, false, &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "give ?path=DIR");
	put(E.port, "path=/d&archive=tar&mode=420", "x", 1, false, &r);
	expect_error(&r, 400, "INVALID_ARGUMENT",
	    "?mode is not an argument of the archive form");
	put(E.port, "path=/d&archive=tar", "", 0, false, &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "the body is empty");
	expect_log("");
	/* The guest's refusal comes back as it said it. */
	put(E.port, "path=/refuse&archive=tar", body, 100, false, &r);
	expect_error(&r, 400, "INVALID_ARGUMENT",
	    "archive member ../etc/passwd is outside /refuse");
	expect_log("put(@0+100,last) ");
	/* Over the cap: with a length, before a byte reaches the node;
	 * chunked, once the count passes it. */
	put(E.small_port, "path=/d&archive=tar", body, 2 * MIB, false, &r);
	expect_error(&r, 413, "RESOURCE_EXHAUSTED", "archive-max-mib (1 MiB)");
	expect_log("");
	put(E.small_port, "path=/d&archive=tar", body, 2 * MIB, true, &r);
	expect_error(&r, 413, "RESOURCE_EXHAUSTED", "nothing was unpacked");
	expect_log("");
	/* A chunk refused mid-body (no such sandbox): the rest of the
	 * body is dropped and the error answered once it ends. */
	http_client_request(E.port,
	    &(struct http_client_req){ .method = "PUT",
	        .path = "/v1/sandboxes/node-a-sb-404/files?path=/d&"
	                "archive=tar",
	        .body = body,
	        .body_len = 9 * MIB,
	        .body_chunked = true },
	    &r);
	expect_error(&r, 404, "NOT_FOUND", "node-a-sb-404");
	expect_log("");
	/* Under it, the small door takes an archive. */
	put(E.small_port, "path=/d&archive=tar", body, MIB, true, &r);
	assert_int_equal(r.status, 200);
	http_client_resp_free(&r);
	expect_log("put(@0+1048576,last) ");
	free(body);
}

static void
test_download(void **state)
{
	struct http_client_resp r;
	size_t len = 9 * MIB + 3;
	char *want = pattern(len);

	(void)state;
	pthread_mutex_lock(&E.a.lock);
	E.a.archive_get_size = len;
	E.a.archive_ids = 0;
	pthread_mutex_unlock(&E.a.lock);
	get(E.port, "path=/work/tree&archive=tar", &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.content_type, "application/x-tar");
	assert_int_equal(r.len, len);
	assert_memory_equal(r.body, want, len);
	http_client_resp_free(&r);
	expect_log("get(@0+4194304) get(dl-1@4194304+4194304) "
	           "get(dl-1@8388608+4194304) ");
	get(E.port, "path=/missing&archive=tar", &r);
	expect_error(&r, 404, "NOT_FOUND", "no such file or directory");
	get(E.port, "archive=tar", &r);
	expect_error(&r, 400, "INVALID_ARGUMENT", "give ?path=PATH");
	expect_log("get(@0+4194304) ");
	/* Over the cap: the first chunk's size says so. */
	get(E.small_port, "path=/work/tree&archive=tar", &r);
	expect_error(&r, 413, "RESOURCE_EXHAUSTED", "archive-max-mib (1 MiB)");
	expect_log("get(@0+4194304) ");
	/* Without archive, the files route reads a file as before. */
	get(E.port, "path=/etc/hosts", &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.content_type, "application/octet-stream");
	http_client_resp_free(&r);
	free(want);
}

static void
test_openapi(void **state)
{
	struct http_client_resp r;
	json_t *item, *params, *ok;
	bool get_param = false, put_param = false;

	(void)state;
	http_client_request(E.port,
	    &(struct http_client_req){ .method = "GET",
	        .path = "/v1/openapi.json" },
	    &r);
	assert_int_equal(r.status, 200);
	item = json_object_get(json_object_get(r.json, "paths"),
	    "/v1/sandboxes/{id}/files");
	for (int m = 0; m < 2; m++) {
		params =
		    json_object_get(json_object_get(item, m ? "put" : "get"),
		        "parameters");
		for (size_t i = 0; i < json_array_size(params); i++)
			if (strcmp(json_string_value(json_object_get(
			               json_array_get(params, i), "name")),
			        "archive") == 0)
				*(m ? &put_param : &get_param) = true;
	}
	assert_true(get_param && put_param);
	ok = json_object_get(json_object_get(json_object_get(item, "get"),
	                         "responses"),
	    "200");
	assert_non_null(json_object_get(json_object_get(ok, "content"),
	    "application/x-tar"));
	assert_non_null(json_object_get(
	    json_object_get(json_object_get(json_object_get(item, "put"),
	                        "requestBody"),
	        "content"),
	    "application/x-tar"));
	assert_non_null(json_object_get(
	    json_object_get(json_object_get(r.json, "components"), "schemas"),
	    "moat.v1.ArchivePutReply"));
	http_client_resp_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_upload_chunks),
		cmocka_unit_test(test_upload_refused),
		cmocka_unit_test(test_download),
		cmocka_unit_test(test_openapi),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
