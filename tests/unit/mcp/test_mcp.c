/*
 * test_mcp.c: the MCP protocol layer (lib/mcp) against a fake
 * gateway call function: initialize's version negotiation, the shape of
 * tools/list, JSON-RPC errors (-32700, -32600, -32601, -32602), tool
 * failures as isError results, the session's default sandbox, and host
 * paths that try to leave --allow-dir; upload_dir and download_dir (in
 * order, confined, a refused archive writes nothing).
 * Not for: transports (the integration test mcp_sdk covers both).
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/codec.h"
#include "moat/mcp.h"
#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

/* The fake gateway: records calls, answers from a small script. */
struct fake {
	char methods[32][32];
	json_t *requests[32];
	int n;
	bool fail_read;         /* ReadFile: NOT_FOUND */
	bool list_empty;        /* ListFiles: no "entries" (proto3 JSON) */
	const uint8_t *archive; /* GetArchive serves it, 3000 bytes a call */
	size_t archive_len;
};

static int
fake_call(void *arg, const char *method, json_t *request, json_t **reply,
    char **errmsg)
{
	struct fake *f = arg;
	char *b64;

	if (f->n < 32) {
		snprintf(f->methods[f->n], sizeof(f->methods[0]), "%s",
		    method);
		f->requests[f->n] = json_deep_copy(request);
		f->n++;
	}
	*reply = NULL;
	*errmsg = NULL;
	if (strcmp(method, "CreateSandbox") == 0) {
		*reply = json_pack("{s:s, s:s}", "id", "sb-fake", "sessionId",
		    "ses-fake");
	} else if (strcmp(method, "RunCode") == 0) {
		b64 = moat_codec_base64("42\n", 3);
		*reply = json_pack("{s:{s:s}}", "result", "stdout", b64);
		free(b64);
	} else if (strcmp(method, "ReadFile") == 0) {
		if (f->fail_read) {
			*errmsg = strdup("/root/x: no such file");
			return MOAT_NOT_FOUND;
		}
		b64 = moat_codec_base64("hi\n", 3);
		*reply = json_pack("{s:s}", "data", b64);
		free(b64);
	} else if (strcmp(method, "PutArchive") == 0) {
		*reply = json_pack("{s:s, s:b, s:i}", "uploadId", "up-1",
		    "done", json_is_true(json_object_get(request, "last")),
		    "files", 1);
	} else if (strcmp(method, "GetArchive") == 0) {
		size_t off = (size_t)json_integer_value(
		    json_object_get(request, "offset"));
		size_t n =
		    f->archive_len - off > 3000 ? 3000 : f->archive_len - off;

		b64 = moat_codec_base64(f->archive + off, n);
		*reply = json_pack("{s:s, s:s, s:I, s:b}", "downloadId",
		    "dl-1", "data", b64, "size", (json_int_t)f->archive_len,
		    "eof", off + n == f->archive_len);
		free(b64);
	} else if (strcmp(method, "GetSessionTree") == 0) {
		*reply = json_pack("{s:[{s:s, s:s, s:b}, {s:s, s:i, s:s, "
		                   "s:s, s:b, s:i}]}",
		    "nodes", "sessionId", "ses-fake", "stepCount", "3",
		    "hasExit", 1, "sessionId", "ses-b", "depth", 1,
		    "branchedAt", "1", "stepCount", "2", "hasExit", 1,
		    "lastExitCode", 4);
	} else if (strcmp(method, "ListSteps") == 0) {
		*reply = json_pack("{s:[{s:s, s:s, s:s, s:s}, {s:s, s:s, "
		                   "s:s}]}",
		    "steps", "index", "1", "kind", "STEP_KIND_EXEC", "input",
		    "ls", "heldBySession", "ses-root", "index", "2", "kind",
		    "STEP_KIND_EXEC", "input", "pwd");
	} else if (strcmp(method, "ListFiles") == 0 && !f->list_empty) {
		*reply = json_pack("{s:[{s:s, s:s, s:s}, {s:s, s:s, s:s}]}",
		    "entries", "name", "d", "type", "FILE_TYPE_DIRECTORY",
		    "size", "0", "name", "b.txt", "type", "FILE_TYPE_REGULAR",
		    "size", "3");
	} else {
		*reply = json_object();
	}
	return MOAT_OK;
}

static void
fake_reset(struct fake *f)
{
	for (int i = 0; i < f->n && i < 32; i++)
		json_decref(f->requests[i]);
	memset(f, 0, sizeof(*f));
}

/* rpc: sends text, returns the parsed reply (NULL: none). */
static json_t *
rpc(struct moat_mcp_session *s, struct fake *f, const char *text)
{
	char *out = moat_mcp_handle_text(s, text, strlen(text), fake_call, f);
	json_t *j;

	if (out == NULL)
		return NULL;
	j = json_loads(out, 0, NULL);
	free(out);
	assert_non_null(j);
	return j;
}

static int
error_code(json_t *reply)
{
	return (int)json_integer_value(
	    json_object_get(json_object_get(reply, "error"), "code"));
}

static struct moat_mcp_session *
new_session(const char *allow_dir)
{
	struct moat_mcp_session *s = NULL;
	char *errmsg = NULL;

	assert_int_equal(moat_mcp_session_new(&s, allow_dir, "t", &errmsg),
	    MOAT_OK);
	return s;
}

static const char *
negotiated(struct moat_mcp_session *s, struct fake *f, const char *asked)
{
	static char buf[32];
	char *text = asked ?
	    moat_asprintf(
	        "{\"jsonrpc\":\"2.0\",\"id\":1,"
	        "\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
	        "\"%s\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\","
	        "\"version\":\"1\"}}}",
	        asked) :
	    strdup("{\"jsonrpc\":\"2.0\","
	           "\"id\":1,\"method\":\"initialize\"}");
	json_t *r = rpc(s, f, text);
	json_t *res = json_object_get(r, "result");

	free(text);
	assert_non_null(res);
	assert_string_equal(json_string_value(json_object_get(
	                        json_object_get(res, "serverInfo"), "name")),
	    "moat");
	assert_non_null(
	    json_object_get(json_object_get(res, "capabilities"), "tools"));
	snprintf(buf, sizeof(buf), "%s",
	    json_string_value(json_object_get(res, "protocolVersion")));
	json_decref(r);
	return buf;
}

static void
test_initialize_negotiates(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };

	assert_string_equal(negotiated(s, &f, "2024-11-05"), "2024-11-05");
	assert_string_equal(negotiated(s, &f, "2025-03-26"), "2025-03-26");
	assert_string_equal(negotiated(s, &f, "2025-06-18"), "2025-06-18");
	assert_string_equal(negotiated(s, &f, "1999-01-01"), "2025-06-18");
	assert_string_equal(negotiated(s, &f, "2099-12-31"), "2025-06-18");
	assert_string_equal(negotiated(s, &f, NULL), "2025-06-18");
	assert_int_equal(f.n, 0);
	moat_mcp_session_free(s);
}

static void
check_tools(json_t *tools, bool host)
{
	json_t *t, *schema, *req, *name;
	size_t i, j;
	bool saw_upload = false, saw_run = false;

	assert_true(json_is_array(tools));
	json_array_foreach (tools, i, t) {
		assert_true(json_is_string(json_object_get(t, "name")));
		assert_true(json_is_string(json_object_get(t, "description")));
		schema = json_object_get(t, "inputSchema");
		assert_true(json_is_object(schema));
		assert_string_equal(json_string_value(
		                        json_object_get(schema, "type")),
		    "object");
		assert_true(
		    json_is_object(json_object_get(schema, "properties")));
		req = json_object_get(schema, "required");
		json_array_foreach (req, j, name)
			assert_non_null(json_object_get(json_object_get(schema,
			                                    "properties"),
			    json_string_value(name)));
		if (strcmp(json_string_value(json_object_get(t, "name")),
		        "upload_file") == 0)
			saw_upload = true;
		if (strcmp(json_string_value(json_object_get(t, "name")),
		        "run_code") == 0)
			saw_run = true;
	}
	assert_true(saw_run);
	assert_int_equal(saw_upload, host);
}

static void
test_tools_list_shape(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };
	json_t *r;

	r = rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":"
	    "\"tools/list\"}");
	assert_string_equal(json_string_value(json_object_get(r, "id")), "a");
	check_tools(json_object_get(json_object_get(r, "result"), "tools"),
	    false);
	json_decref(r);
	moat_mcp_session_free(s);

	s = new_session("/tmp");
	r = rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":"
	    "\"tools/list\",\"params\":{}}");
	check_tools(json_object_get(json_object_get(r, "result"), "tools"),
	    true);
	json_decref(r);
	moat_mcp_session_free(s);
}

static void
test_jsonrpc_errors(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };
	json_t *r;

	r = rpc(s, &f, "{\"jsonrpc\":\"2.0\",\"id\":1,");
	assert_int_equal(error_code(r), -32700);
	assert_true(json_is_null(json_object_get(r, "id")));
	json_decref(r);
	r = rpc(s, &f, "[1,2");
	assert_int_equal(error_code(r), -32700);
	json_decref(r);
	r = rpc(s, &f, "\"just a string\"");
	assert_int_equal(error_code(r), -32600);
	json_decref(r);
	r = rpc(s, &f, "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}");
	assert_int_equal(error_code(r), -32600);
	json_decref(r);
	r = rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":"
	    "\"resources/list\"}");
	assert_int_equal(error_code(r), -32601);
	assert_int_equal(json_integer_value(json_object_get(r, "id")), 7);
	json_decref(r);
	r = rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":"
	    "\"tools/call\",\"params\":{\"name\":\"nope\",\"arguments\":{}}}");
	assert_int_equal(error_code(r), -32602);
	json_decref(r);
	/* Host file tools are unknown without --allow-dir. */
	r = rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":"
	    "\"tools/call\",\"params\":{\"name\":\"upload_file\"}}");
	assert_int_equal(error_code(r), -32602);
	assert_non_null(strstr(json_string_value(
	                           json_object_get(json_object_get(r, "error"),
	                               "message")),
	    "--allow-dir"));
	json_decref(r);
	r = rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":"
	    "\"tools/call\",\"params\":{\"name\":\"exec\",\"arguments\":[]}}");
	assert_int_equal(error_code(r), -32602);
	json_decref(r);
	r = rpc(s, &f, "{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"ping\"}");
	assert_true(json_is_object(json_object_get(r, "result")));
	json_decref(r);
	/* Notifications and responses get no reply. */
	assert_null(rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"method\":"
	    "\"notifications/initialized\"}"));
	assert_null(rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":3,"
	    "\"result\":{}}"));
	/* A batch: one reply per request. */
	r = rpc(s, &f,
	    "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"},"
	    "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"},"
	    "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"bogus\"}]");
	assert_int_equal(json_array_size(r), 2);
	assert_int_equal(error_code(json_array_get(r, 1)), -32601);
	json_decref(r);
	assert_int_equal(f.n, 0);
	moat_mcp_session_free(s);
}

/* call_tool: the result of tools/call name(args). */
static json_t *
call_tool(struct moat_mcp_session *s, struct fake *f, const char *name,
    const char *args)
{
	char *text = moat_asprintf(
	    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":"
	    "\"tools/call\",\"params\":{\"name\":\"%s\",\"arguments\":%s}}",
	    name, args);
	json_t *r = rpc(s, f, text), *res;

	free(text);
	res = json_incref(json_object_get(r, "result"));
	json_decref(r);
	assert_non_null(res);
	return res;
}

static const char *
result_text(json_t *res)
{
	return json_string_value(
	    json_object_get(json_array_get(json_object_get(res, "content"), 0),
	        "text"));
}

static void
test_tool_errors_are_results(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };
	json_t *res;

	res = call_tool(s, &f, "run_code", "{}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res), "\"code\""));
	json_decref(res);
	res = call_tool(s, &f, "run_code", "{\"code\": 5}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	res = call_tool(s, &f, "exec", "{\"command\":\"ls\",\"env\":[1]}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res), "env"));
	json_decref(res);
	res = call_tool(s, &f, "exec", "{\"command\":\"ls\",\"timeout\":-1}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res), "timeout"));
	json_decref(res);
	res = call_tool(s, &f, "restore", "{}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res), "step"));
	json_decref(res);
	assert_int_equal(f.n, 0); /* nothing reached the gateway */

	f.fail_read = true;
	res = call_tool(s, &f, "read_file",
	    "{\"path\":\"/root/x\","
	    "\"sandbox_id\":\"sb-1\"}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res), "NOT_FOUND"));
	assert_non_null(strstr(result_text(res), "no such file"));
	json_decref(res);
	fake_reset(&f);
	moat_mcp_session_free(s);
}

/* restore's "reseed" (issue 18) reaches RestoreStep only when true; a
 * value that is not a boolean reaches no gateway. */
static void
test_restore_reseed(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };
	json_t *res;
	(void)state;

	res = call_tool(s, &f, "restore",
	    "{\"step\":2,\"session_id\":\"ses-1\",\"sandbox_id\":\"sb-1\","
	    "\"reseed\":true}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	assert_int_equal(f.n, 1);
	assert_string_equal(f.methods[0], "RestoreStep");
	assert_true(json_is_true(json_object_get(f.requests[0], "reseed")));
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[0], "sandboxId")),
	    "sb-1");
	res = call_tool(s, &f, "restore",
	    "{\"step\":2,\"session_id\":\"ses-1\",\"sandbox_id\":\"sb-1\"}");
	json_decref(res);
	assert_int_equal(f.n, 2);
	assert_null(json_object_get(f.requests[1], "reseed"));
	res = call_tool(s, &f, "restore",
	    "{\"step\":2,\"session_id\":\"ses-1\",\"reseed\":\"yes\"}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res), "reseed"));
	json_decref(res);
	assert_int_equal(f.n, 2);
	fake_reset(&f);
	moat_mcp_session_free(s);
}

/* sandbox_create's "allow" becomes CreateSandboxRequest.network (guest
 * egress, issue 14); a bad one reaches no gateway. */
static void
test_sandbox_create_allow(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };
	json_t *res, *net;
	(void)state;

	res = call_tool(s, &f, "sandbox_create",
	    "{\"allow\":[\"pypi.org\",\"x.test:8080\"],\"record\":false}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	assert_int_equal(f.n, 1);
	assert_string_equal(f.methods[0], "CreateSandbox");
	net = json_object_get(f.requests[0], "network");
	assert_non_null(net);
	assert_string_equal(json_string_value(json_object_get(net, "mode")),
	    "allowlist");
	assert_int_equal(json_array_size(json_object_get(net, "allow")), 2);
	assert_string_equal(json_string_value(
	                        json_array_get(json_object_get(net, "allow"),
	                            1)),
	    "x.test:8080");
	fake_reset(&f);

	res = call_tool(s, &f, "sandbox_create", "{\"record\":false}");
	json_decref(res);
	assert_null(json_object_get(f.requests[0], "network"));
	fake_reset(&f);

	res = call_tool(s, &f, "sandbox_create", "{\"allow\":\"pypi.org\"}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res), "allow"));
	json_decref(res);
	res = call_tool(s, &f, "sandbox_create", "{\"allow\":[1]}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	assert_int_equal(f.n, 0);
	fake_reset(&f);
	moat_mcp_session_free(s);
}

static void
test_default_sandbox(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };
	json_t *res;

	res = call_tool(s, &f, "run_code", "{\"code\":\"print(6*7)\"}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	assert_string_equal(result_text(res), "42\n");
	assert_string_equal(json_string_value(
	                        json_object_get(json_object_get(res,
	                                            "structuredContent"),
	                            "stdout")),
	    "42\n");
	json_decref(res);
	assert_int_equal(f.n, 2);
	assert_string_equal(f.methods[0], "CreateSandbox");
	assert_true(json_is_true(json_object_get(f.requests[0], "record")));
	assert_string_equal(f.methods[1], "RunCode");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[1], "sandboxId")),
	    "sb-fake");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[1], "code")),
	    "print(6*7)");

	/* Made once per session; an explicit sandbox_id wins. */
	res = call_tool(s, &f, "read_file", "{\"path\":\"/etc/x\"}");
	assert_string_equal(result_text(res), "hi\n");
	json_decref(res);
	res = call_tool(s, &f, "read_file",
	    "{\"path\":\"/etc/x\","
	    "\"sandbox_id\":\"sb-other\"}");
	json_decref(res);
	assert_int_equal(f.n, 4);
	assert_string_equal(f.methods[2], "ReadFile");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[2], "sandboxId")),
	    "sb-fake");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[3], "sandboxId")),
	    "sb-other");

	/* list_dir: a line per entry, the entries as structured content;
	 * an empty directory (no "entries" in the reply) is an empty array
	 * (and, under the sanitizer build, leaks nothing). */
	res = call_tool(s, &f, "list_dir", "{\"path\":\"/root\"}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	assert_string_equal(result_text(res), "d/\t0\nb.txt\t3\n");
	assert_int_equal(json_array_size(
	                     json_object_get(json_object_get(res,
	                                         "structuredContent"),
	                         "entries")),
	    2);
	json_decref(res);
	f.list_empty = true;
	res = call_tool(s, &f, "list_dir", "{}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	assert_string_equal(result_text(res), "");
	assert_true(json_is_array(
	    json_object_get(json_object_get(res, "structuredContent"),
	        "entries")));
	assert_int_equal(json_array_size(
	                     json_object_get(json_object_get(res,
	                                         "structuredContent"),
	                         "entries")),
	    0);
	json_decref(res);
	f.list_empty = false;
	assert_int_equal(f.n, 6);
	assert_string_equal(f.methods[5], "ListFiles");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[5], "path")),
	    "/root");

	/* Closing the session destroys its sandbox, once. */
	assert_int_equal(moat_mcp_session_close(s, fake_call, &f), MOAT_OK);
	assert_int_equal(moat_mcp_session_close(s, fake_call, &f),
	    MOAT_NOT_FOUND);
	assert_int_equal(f.n, 7);
	assert_string_equal(f.methods[6], "DestroySandbox");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[6], "sandboxId")),
	    "sb-fake");
	fake_reset(&f);
	moat_mcp_session_free(s);
}

static void
test_host_paths(void **state)
{
	char tmpl[] = "/tmp/moat-mcp-unit.XXXXXX", *dir, *p, *out, *errmsg;
	struct moat_mcp_session *s;
	struct fake f = { 0 };
	json_t *res;
	FILE *fp;

	assert_non_null(dir = mkdtemp(tmpl));
	p = moat_asprintf("%s/sub", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	free(p);
	p = moat_asprintf("%s/ok.txt", dir);
	assert_non_null(fp = fopen(p, "w"));
	fclose(fp);
	free(p);
	p = moat_asprintf("%s/link", dir);
	assert_int_equal(symlink("/etc", p), 0);
	free(p);
	p = moat_asprintf("%s/badfile", dir);
	assert_int_equal(symlink("/tmp/moat-mcp-unit-outside", p), 0);
	free(p);

	assert_int_equal(moat_mcp_host_path(dir, "ok.txt", true, &out,
	                     &errmsg),
	    MOAT_OK);
	assert_non_null(strstr(out, "/ok.txt"));
	free(out);
	assert_int_equal(moat_mcp_host_path(dir, "sub/new.txt", false, &out,
	                     &errmsg),
	    MOAT_OK);
	free(out);

	static const char *const escapes[] = { "../x", "sub/../../x", "..",
		"/etc/passwd", "link/passwd", "link", "/tmp/x", "sub/.." };
	for (size_t i = 0; i < sizeof(escapes) / sizeof(escapes[0]); i++) {
		out = NULL;
		errmsg = NULL;
		assert_int_not_equal(moat_mcp_host_path(dir, escapes[i], true,
		                         &out, &errmsg),
		    MOAT_OK);
		assert_null(out);
		free(errmsg);
		errmsg = NULL;
		assert_int_not_equal(moat_mcp_host_path(dir, escapes[i], false,
		                         &out, &errmsg),
		    MOAT_OK);
		assert_null(out);
		free(errmsg);
	}
	/* Writing through a symlink that points outside: refused. */
	assert_int_equal(moat_mcp_host_path(dir, "badfile", false, &out,
	                     &errmsg),
	    MOAT_PERMISSION_DENIED);
	free(errmsg);

	/* Through the tools: an isError result, and no gateway call. */
	s = new_session(dir);
	res = call_tool(s, &f, "upload_file",
	    "{\"host_path\":\"../../etc/"
	    "passwd\",\"path\":\"/root/x\",\"sandbox_id\":\"sb-1\"}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	res = call_tool(s, &f, "download_file",
	    "{\"host_path\":\"link/x\","
	    "\"path\":\"/root/x\",\"sandbox_id\":\"sb-1\"}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	assert_int_equal(f.n, 0);
	moat_mcp_session_free(s);

	p = moat_asprintf("rm -rf '%s'", dir);
	assert_int_equal(system(p), 0);
	free(p);
}

static void
test_allow_dir_must_exist(void **state)
{
	struct moat_mcp_session *s = NULL;
	char *errmsg = NULL;

	assert_int_equal(moat_mcp_session_new(&s, "/no/such/dir", NULL,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(s);
	assert_non_null(strstr(errmsg, "/no/such/dir"));
	free(errmsg);
}

/* mk_tree: dir/tree with a 5 MiB file and a symlink. */
static char *
mk_tree(const char *dir)
{
	char *t = moat_asprintf("%s/tree", dir), *p;
	uint8_t *big = calloc(1, 5 << 20);
	FILE *fp;

	assert_int_equal(mkdir(t, 0755), 0);
	p = moat_asprintf("%s/big", t);
	assert_non_null(fp = fopen(p, "w"));
	big[12345] = 7;
	assert_int_equal(fwrite(big, 1, 5 << 20, fp), 5 << 20);
	fclose(fp);
	free(p);
	free(big);
	p = moat_asprintf("%s/link", t);
	assert_int_equal(symlink("big", p), 0);
	free(p);
	return t;
}

/* upload_dir and download_dir: only with --allow-dir, confined to it;
 * the upload goes in order in 4 MiB chunks, the download unpacks. */
static void
test_dir_tools(void **state)
{
	char tmpl[] = "/tmp/moat-mcp-dir.XXXXXX", *dir, *tree, *p;
	struct moat_mcp_session *s;
	struct fake f = { 0 };
	uint8_t *all = NULL, *piece;
	size_t all_len = 0, len;
	char link[16];
	json_t *res;
	struct stat sb;
	int fd;

	(void)state;
	assert_non_null(dir = mkdtemp(tmpl));
	tree = mk_tree(dir);
	/* Without --allow-dir: not a tool at all, and the error says why. */
	s = new_session(NULL);
	res = rpc(s, &f,
	    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\","
	    "\"params\":{\"name\":\"upload_dir\"}}");
	assert_int_equal(error_code(res), -32602);
	assert_non_null(strstr(json_string_value(json_object_get(
	                           json_object_get(res, "error"), "message")),
	    "--allow-dir"));
	json_decref(res);
	assert_false(moat_mcp_tool_known("download_dir", false));
	assert_true(moat_mcp_tool_known("download_dir", true));
	moat_mcp_session_free(s);

	s = new_session(dir);
	res = call_tool(s, &f, "upload_dir",
	    "{\"host_path\":\"../\",\"path\":\"/root/t\",\"sandbox_id\":"
	    "\"sb-1\"}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	assert_int_equal(f.n, 0);

	res = call_tool(s, &f, "upload_dir",
	    "{\"host_path\":\"tree\",\"path\":\"/root/t\",\"sandbox_id\":"
	    "\"sb-1\"}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	assert_int_equal(f.n, 2);
	for (int i = 0; i < 2; i++) {
		json_t *rq = f.requests[i];
		const char *b64 =
		    json_string_value(json_object_get(rq, "data"));

		assert_string_equal(f.methods[i], "PutArchive");
		assert_int_equal(json_integer_value(
		                     json_object_get(rq, "offset")),
		    all_len);
		assert_string_equal(json_string_value(
		                        json_object_get(rq, "uploadId")),
		    i == 0 ? "" : "up-1");
		assert_int_equal(json_is_true(json_object_get(rq, "last")),
		    i == 1);
		assert_int_equal(moat_codec_base64_decode(b64, strlen(b64),
		                     &piece, &len),
		    MOAT_OK);
		assert_true(i == 1 || len == 4u << 20);
		all = realloc(all, all_len + len);
		memcpy(all + all_len, piece, len);
		all_len += len;
		free(piece);
	}
	fake_reset(&f);

	/* The same archive back, unpacked under the allow-dir. */
	f.archive = all;
	f.archive_len = all_len;
	res = call_tool(s, &f, "download_dir",
	    "{\"host_path\":\"back\",\"path\":\"/root/t\",\"sandbox_id\":"
	    "\"sb-1\"}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	/* Many 3000-byte chunks (the fake keeps 32): the first without an
	 * id, the next with the one it gave, at increasing offsets. */
	assert_int_equal(f.n, 32);
	assert_string_equal(f.methods[0], "GetArchive");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[0], "downloadId")),
	    "");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[1], "downloadId")),
	    "dl-1");
	assert_int_equal(json_integer_value(
	                     json_object_get(f.requests[31], "offset")),
	    31 * 3000);
	p = moat_asprintf("%s/back/big", dir);
	assert_int_equal(stat(p, &sb), 0);
	assert_int_equal(sb.st_size, 5 << 20);
	free(p);
	p = moat_asprintf("%s/back/link", dir);
	assert_int_equal(readlink(p, link, sizeof(link)), 3);
	free(p);
	fake_reset(&f);

	/* A sandbox's archive with "../x" writes nothing, not even back2. */
	{
		struct moat_tar_entry e = { '0', "../x", NULL, 0, 0644, 0 };
		FILE *tf = tmpfile();

		fd = fileno(tf);
		assert_int_equal(moat_tar_write_header(fd, &e), 0);
		assert_int_equal(moat_tar_write_end(fd), 0);
		free(all);
		all_len = (size_t)lseek(fd, 0, SEEK_END);
		all = malloc(all_len);
		assert_int_equal(pread(fd, all, all_len, 0), all_len);
		fclose(tf);
	}
	f.archive = all;
	f.archive_len = all_len;
	res = call_tool(s, &f, "download_dir",
	    "{\"host_path\":\"back2\",\"path\":\"/root/t\",\"sandbox_id\":"
	    "\"sb-1\"}");
	assert_true(json_is_true(json_object_get(res, "isError")));
	json_decref(res);
	p = moat_asprintf("%s/back2", dir);
	assert_int_not_equal(lstat(p, &sb), 0);
	free(p);
	p = moat_asprintf("%s/x", dir);
	assert_int_not_equal(lstat(p, &sb), 0);
	free(p);
	fake_reset(&f);
	moat_mcp_session_free(s);
	free(all);
	free(tree);
	p = moat_asprintf("rm -rf '%s'", dir);
	assert_int_equal(system(p), 0);
	free(p);
}

/* Branches read as paths (issue 18): history marks a branch's inherited
 * steps; session_tree lists the session and its branches. */
static void
test_branch_tools(void **state)
{
	struct moat_mcp_session *s = new_session(NULL);
	struct fake f = { 0 };
	json_t *res;
	(void)state;

	res = call_tool(s, &f, "history", "{\"session_id\":\"ses-b\"}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	assert_non_null(strstr(result_text(res),
	    "1\tSTEP_KIND_EXEC\texit 0\tls\t(inherited from ses-root)\n"));
	assert_non_null(strstr(result_text(res),
	    "2\tSTEP_KIND_EXEC\texit "
	    "0\tpwd\n"));
	json_decref(res);
	res =
	    call_tool(s, &f, "session_tree", "{\"session_id\":\"ses-fake\"}");
	assert_false(json_is_true(json_object_get(res, "isError")));
	assert_string_equal(f.methods[f.n - 1], "GetSessionTree");
	assert_string_equal(json_string_value(
	                        json_object_get(f.requests[f.n - 1],
	                            "sessionId")),
	    "ses-fake");
	assert_non_null(strstr(result_text(res),
	    "ses-fake  steps 3  last exit 0\n"
	    "  ses-b  branched at step 1  steps 2  last exit 4\n"));
	json_decref(res);
	fake_reset(&f);
	moat_mcp_session_free(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_initialize_negotiates),
		cmocka_unit_test(test_tools_list_shape),
		cmocka_unit_test(test_jsonrpc_errors),
		cmocka_unit_test(test_tool_errors_are_results),
		cmocka_unit_test(test_default_sandbox),
		cmocka_unit_test(test_sandbox_create_allow),
		cmocka_unit_test(test_host_paths),
		cmocka_unit_test(test_allow_dir_must_exist),
		cmocka_unit_test(test_dir_tools),
		cmocka_unit_test(test_restore_reseed),
		cmocka_unit_test(test_branch_tools),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
