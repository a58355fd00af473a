/*
 * tools.c: the MCP tools of moat (mcp.h): one table entry per tool with
 * its description and JSON-Schema inputSchema, arguments checked before
 * the tool runs (a wrong one is an isError result naming it), and each
 * tool run as one or two Gateway methods through the session's call
 * function. Tools that take an optional sandbox_id use the session's
 * default sandbox (recorded, made on first use) when it is left out.
 * upload_file and download_file move files between the MCP host's disk
 * (only below --allow-dir) and a sandbox; upload_dir and download_dir
 * move trees as tar archives (lib/tar.c; a download is checked whole
 * before anything is written on the host).
 * Not for: JSON-RPC framing (mcp.c) or transports.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mcp_internal.h"
#include "moat/codec.h"
#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

/* The context a tool runs in. */
struct tool_ctx {
	struct moat_mcp_session *s;
	moat_mcp_call_fn call;
	void *arg;
	json_t *args;
};

/* A tool returns its CallToolResult (new reference). */
typedef json_t *(*tool_fn)(struct tool_ctx *t);

struct tool {
	const char *name;
	const char *description;
	const char *schema; /* JSON text of inputSchema */
	tool_fn run;
	bool host_files; /* only with --allow-dir */
};

/* ---- results ---- */

/* result_text: a result with one text item; takes `structured` (may be
 * NULL). */
static json_t *
result_text(const char *text, bool is_error, json_t *structured)
{
	json_t *r = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type",
	    "text", "text", text ? text : "", "isError", is_error);

	if (r == NULL) {
		/* Text that is not UTF-8: say so rather than fail. */
		r = json_pack("{s:[{s:s, s:s}], s:b}", "content", "type",
		    "text", "text", "(output is not UTF-8 text)", "isError",
		    is_error);
	}
	if (r != NULL && structured != NULL)
		json_object_set(r, "structuredContent", structured);
	json_decref(structured);
	return r;
}

static json_t *tool_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static json_t *
tool_error(const char *fmt, ...)
{
	va_list ap;
	char *msg = NULL;
	json_t *r;

	va_start(ap, fmt);
	if (vasprintf(&msg, fmt, ap) < 0)
		msg = NULL;
	va_end(ap);
	r = result_text(msg ? msg : "out of memory", true, NULL);
	free(msg);
	return r;
}

/* call_error: the isError result of a failed Gateway call; takes
 * errmsg. */
static json_t *
call_error(const char *what, int code, char *errmsg)
{
	json_t *r = tool_error("%s failed (%s): %s", what, moat_strerror(code),
	    errmsg && errmsg[0] ? errmsg : moat_strerror(code));

	free(errmsg);
	return r;
}

/* ---- arguments ---- */

/* arg_string: args[name] as a string; NULL when absent. *bad is set when
 * present and not a string. */
static const char *
arg_string(struct tool_ctx *t, const char *name, bool *bad)
{
	json_t *v = json_object_get(t->args, name);

	if (v == NULL || json_is_null(v))
		return NULL;
	if (!json_is_string(v)) {
		*bad = true;
		return NULL;
	}
	return json_string_value(v);
}

/* arg_number: args[name] as a non-negative number no larger than max;
 * false (with *bad) when present and not one. */
static bool
arg_number(struct tool_ctx *t, const char *name, double max, double *out,
    bool *bad)
{
	json_t *v = json_object_get(t->args, name);

	if (v == NULL || json_is_null(v))
		return false;
	if (!json_is_number(v) || json_number_value(v) < 0 ||
	    json_number_value(v) > max) {
		*bad = true;
		return false;
	}
	*out = json_number_value(v);
	return true;
}

#define REQUIRE_STRING(var, name, what)                                       \
	do {                                                                  \
		bool bad_ = false;                                            \
		(var) = arg_string(t, (name), &bad_);                         \
		if (bad_ || (var) == NULL)                                    \
			return tool_error("argument \"%s\" is required "      \
			                  "and must be a string: %s",         \
			    (name), (what));                                  \
	} while (0)

#define OPTIONAL_STRING(var, name, what)                                      \
	do {                                                                  \
		bool bad_ = false;                                            \
		(var) = arg_string(t, (name), &bad_);                         \
		if (bad_)                                                     \
			return tool_error("argument \"%s\" must be a "        \
			                  "string: %s",                       \
			    (name), (what));                                  \
	} while (0)

/* ---- calls ---- */

/* gw: runs `method` with `req` (taken). On MOAT_OK *reply is the caller's;
 * otherwise *errmsg (heap). */
static int
gw(struct tool_ctx *t, const char *method, json_t *req, json_t **reply,
    char **errmsg)
{
	int rv;

	*reply = NULL;
	*errmsg = NULL;
	if (req == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rv = t->call(t->arg, method, req, reply, errmsg);
	json_decref(req);
	if (rv == MOAT_OK && *reply == NULL)
		*reply = json_object();
	return rv;
}

/* sandbox_of: the sandbox_id argument, or the session's default sandbox,
 * made (recorded) when there is none yet. On MOAT_OK id holds it. */
static int
sandbox_of(struct tool_ctx *t, char *id, size_t size, char **errmsg)
{
	struct moat_mcp_session *s = t->s;
	bool bad = false;
	const char *given = arg_string(t, "sandbox_id", &bad);
	json_t *req, *reply = NULL;
	const char *made;
	char spare[MOAT_MCP_ID_MAX] = "";
	int rv;

	*errmsg = NULL;
	if (bad) {
		*errmsg = moat_asprintf(
		    "argument \"sandbox_id\" must be a "
		    "string (sandbox_list lists them; leave it out to use "
		    "this session's sandbox)");
		return MOAT_INVALID_ARGUMENT;
	}
	if (given != NULL && given[0] != '\0') {
		snprintf(id, size, "%s", given);
		return MOAT_OK;
	}
	pthread_mutex_lock(&s->lock);
	snprintf(id, size, "%s", s->default_sandbox);
	pthread_mutex_unlock(&s->lock);
	if (id[0] != '\0')
		return MOAT_OK;
	req = json_pack("{s:b}", "record", 1);
	if (req != NULL && s->label != NULL)
		json_object_set_new(req, "labels",
		    json_pack("{s:s}", "mcp-session", s->label));
	if ((rv = gw(t, "CreateSandbox", req, &reply, errmsg)) != MOAT_OK)
		return rv;
	made = json_string_value(json_object_get(reply, "id"));
	if (made == NULL) {
		json_decref(reply);
		*errmsg = moat_asprintf("CreateSandbox returned no id");
		return MOAT_INTERNAL;
	}
	/* Two first calls at once both made one: keep the first. */
	pthread_mutex_lock(&s->lock);
	if (s->default_sandbox[0] == '\0')
		snprintf(s->default_sandbox, sizeof(s->default_sandbox), "%s",
		    made);
	else
		snprintf(spare, sizeof(spare), "%s", made);
	snprintf(id, size, "%s", s->default_sandbox);
	pthread_mutex_unlock(&s->lock);
	json_decref(reply);
	if (spare[0] != '\0') {
		char *e = NULL;
		if (gw(t, "DestroySandbox",
		        json_pack("{s:s}", "sandboxId", spare), &reply,
		        &e) == MOAT_OK)
			json_decref(reply);
		free(e);
	}
	return MOAT_OK;
}

#define SANDBOX_OR_FAIL(id)                                                   \
	do {                                                                  \
		char *e_;                                                     \
		int rv_ = sandbox_of(t, (id), sizeof(id), &e_);               \
		if (rv_ != MOAT_OK)                                           \
			return call_error("getting the sandbox", rv_, e_);    \
	} while (0)

/* b64_text: the bytes of base64 field `v` as a heap NUL-terminated
 * string (*len bytes before the NUL); NULL when out of memory. */
static char *
b64_text(json_t *v, size_t *len)
{
	const char *s = json_string_value(v);
	uint8_t *bytes = NULL;
	char *text;

	*len = 0;
	if (s != NULL &&
	    moat_codec_base64_decode(s, strlen(s), &bytes, len) != MOAT_OK)
		*len = 0;
	if ((text = malloc(*len + 1)) == NULL) {
		free(bytes);
		return NULL;
	}
	if (*len > 0)
		memcpy(text, bytes, *len);
	text[*len] = '\0';
	free(bytes);
	return text;
}

/* utf8_ok: whether jansson takes these bytes as a string. */
static bool
utf8_ok(const char *text, size_t len)
{
	json_t *j = json_stringn(text, len);
	bool ok = j != NULL;

	json_decref(j);
	return ok;
}

/* ---- the tools ---- */

static json_t *
t_run_code(struct tool_ctx *t)
{
	const char *code, *language, *context;
	char id[MOAT_MCP_ID_MAX], *errmsg, *out, *err, *text;
	json_t *req, *reply, *res, *sc;
	double timeout = 0;
	bool bad = false, failed;
	size_t out_len, err_len;
	const char *result, *ename, *evalue, *tb;
	int rv;

	REQUIRE_STRING(code, "code", "the source code to run");
	OPTIONAL_STRING(language, "language",
	    "python (default), bash, sh "
	    "or node");
	OPTIONAL_STRING(context, "context",
	    "the name of a persistent "
	    "interpreter (default \"default\")");
	arg_number(t, "timeout", 86400, &timeout, &bad);
	if (bad)
		return tool_error("argument \"timeout\" must be a number of "
		                  "seconds between 0 and 86400");
	SANDBOX_OR_FAIL(id);
	req = json_pack("{s:s, s:s, s:s, s:s, s:i}", "sandboxId", id, "code",
	    code, "language", language ? language : "", "context",
	    context ? context : "", "timeoutMs", (int)(timeout * 1000));
	if ((rv = gw(t, "RunCode", req, &reply, &errmsg)) != MOAT_OK)
		return call_error("run_code", rv, errmsg);
	res = json_object_get(reply, "result");
	out = b64_text(json_object_get(res, "stdout"), &out_len);
	err = b64_text(json_object_get(res, "stderr"), &err_len);
	result = json_string_value(json_object_get(res, "result"));
	ename = json_string_value(json_object_get(res, "errorName"));
	evalue = json_string_value(json_object_get(res, "errorValue"));
	tb = json_string_value(json_object_get(res, "traceback"));
	failed = (ename && ename[0]) ||
	    json_is_true(json_object_get(res, "timedOut"));
	if (out == NULL || err == NULL) {
		free(out);
		free(err);
		json_decref(reply);
		return tool_error("out of memory");
	}
	text = moat_asprintf("%s%s%s%s%s%s%s%s%s", out, err_len ? err : "",
	    result && result[0] ? result : "", result && result[0] ? "\n" : "",
	    tb && tb[0] ? tb : "",
	    ename && ename[0] && !(tb && tb[0]) ? ename : "",
	    ename && ename[0] && !(tb && tb[0]) ? ": " : "",
	    ename && ename[0] && !(tb && tb[0]) ? (evalue ? evalue : "") : "",
	    json_is_true(json_object_get(res, "timedOut")) ?
	        "\n(timed out: pass a larger timeout, in seconds)" :
	        "");
	sc = json_pack("{s:s, s:s%, s:s%, s:s, s:s, s:s, s:s, s:b, s:O?}",
	    "sandboxId", id, "stdout", utf8_ok(out, out_len) ? out : "",
	    utf8_ok(out, out_len) ? out_len : 0, "stderr",
	    utf8_ok(err, err_len) ? err : "",
	    utf8_ok(err, err_len) ? err_len : 0, "result",
	    result ? result : "", "errorName", ename ? ename : "",
	    "errorValue", evalue ? evalue : "", "traceback", tb ? tb : "",
	    "timedOut", json_is_true(json_object_get(res, "timedOut")),
	    "executionCount", json_object_get(res, "executionCount"));
	res = result_text(text, failed, sc);
	free(text);
	free(out);
	free(err);
	json_decref(reply);
	return res;
}

static json_t *
t_exec(struct tool_ctx *t)
{
	const char *command, *cwd, *key;
	char id[MOAT_MCP_ID_MAX], *errmsg, *out, *err, *text;
	json_t *req, *reply, *env, *envs, *v, *status, *sc, *r;
	double timeout = 0;
	bool bad = false;
	size_t out_len, err_len;
	json_int_t code;
	int rv;

	REQUIRE_STRING(command, "command", "a shell command line");
	OPTIONAL_STRING(cwd, "cwd", "the working directory in the sandbox");
	arg_number(t, "timeout", 86400, &timeout, &bad);
	if (bad)
		return tool_error("argument \"timeout\" must be a number of "
		                  "seconds between 0 and 86400");
	env = json_object_get(t->args, "env");
	if (env != NULL && !json_is_null(env) && !json_is_object(env))
		return tool_error("argument \"env\" must be an object of "
		                  "variable names to string values");
	if ((envs = json_array()) == NULL)
		return tool_error("out of memory");
	json_object_foreach (env, key, v) {
		char *kv;
		if (!json_is_string(v)) {
			json_decref(envs);
			return tool_error("argument \"env\": the value of %s "
			                  "must be a string",
			    key);
		}
		kv = moat_asprintf("%s=%s", key, json_string_value(v));
		json_array_append_new(envs, json_string(kv ? kv : ""));
		free(kv);
	}
	{
		char *e;
		if ((rv = sandbox_of(t, id, sizeof(id), &e)) != MOAT_OK) {
			json_decref(envs);
			return call_error("getting the sandbox", rv, e);
		}
	}
	req = json_pack("{s:s, s:s, s:s, s:o, s:i}", "sandboxId", id, "shell",
	    command, "cwd", cwd ? cwd : "", "env", envs, "timeoutMs",
	    (int)(timeout * 1000));
	if ((rv = gw(t, "Exec", req, &reply, &errmsg)) != MOAT_OK)
		return call_error("exec", rv, errmsg);
	status = json_object_get(reply, "status");
	code = json_integer_value(json_object_get(status, "exitCode"));
	out = b64_text(json_object_get(reply, "stdout"), &out_len);
	err = b64_text(json_object_get(reply, "stderr"), &err_len);
	if (out == NULL || err == NULL) {
		free(out);
		free(err);
		json_decref(reply);
		return tool_error("out of memory");
	}
	text = moat_asprintf("%s%s%s[exit code %lld%s]", out, err,
	    (out_len && out[out_len - 1] != '\n') ||
	            (err_len && err[err_len - 1] != '\n') ?
	        "\n" :
	        "",
	    (long long)code,
	    json_is_true(json_object_get(status, "timedOut")) ? ", timed out" :
	                                                        "");
	sc = json_pack("{s:s, s:I, s:s%, s:s%, s:b}", "sandboxId", id,
	    "exitCode", code, "stdout", utf8_ok(out, out_len) ? out : "",
	    utf8_ok(out, out_len) ? out_len : 0, "stderr",
	    utf8_ok(err, err_len) ? err : "",
	    utf8_ok(err, err_len) ? err_len : 0, "timedOut",
	    json_is_true(json_object_get(status, "timedOut")));
	r = result_text(text, false, sc);
	free(text);
	free(out);
	free(err);
	json_decref(reply);
	return r;
}

static json_t *
t_read_file(struct tool_ctx *t)
{
	const char *path;
	char id[MOAT_MCP_ID_MAX], *errmsg, *data;
	json_t *reply, *r;
	size_t len;
	int rv;

	REQUIRE_STRING(path, "path",
	    "the file's absolute path in the "
	    "sandbox");
	SANDBOX_OR_FAIL(id);
	if ((rv = gw(t, "ReadFile",
	         json_pack("{s:s, s:s}", "sandboxId", id, "path", path),
	         &reply, &errmsg)) != MOAT_OK)
		return call_error("read_file", rv, errmsg);
	if ((data = b64_text(json_object_get(reply, "data"), &len)) == NULL) {
		json_decref(reply);
		return tool_error("out of memory");
	}
	if (utf8_ok(data, len))
		r = result_text(data, false, NULL);
	else
		r = tool_error("%s is binary (%zu bytes), not UTF-8 text: "
		               "read it with exec (base64 %s)",
		    path, len, path);
	free(data);
	json_decref(reply);
	return r;
}

static json_t *
t_write_file(struct tool_ctx *t)
{
	const char *path, *content;
	char id[MOAT_MCP_ID_MAX], *errmsg, *b64, *text;
	json_t *reply, *r;
	int rv;

	REQUIRE_STRING(path, "path",
	    "the file's absolute path in the "
	    "sandbox");
	REQUIRE_STRING(content, "content", "the text to write");
	SANDBOX_OR_FAIL(id);
	if ((b64 = moat_codec_base64(content, strlen(content))) == NULL)
		return tool_error("out of memory");
	rv = gw(t, "WriteFile",
	    json_pack("{s:s, s:s, s:s, s:b, s:b}", "sandboxId", id, "path",
	        path, "data", b64, "truncate", 1, "makeParents", 1),
	    &reply, &errmsg);
	free(b64);
	if (rv != MOAT_OK)
		return call_error("write_file", rv, errmsg);
	text = moat_asprintf("wrote %zu bytes to %s", strlen(content), path);
	r = result_text(text, false, NULL);
	free(text);
	json_decref(reply);
	return r;
}

static json_t *
t_list_dir(struct tool_ctx *t)
{
	const char *path;
	char id[MOAT_MCP_ID_MAX], *errmsg, *text = NULL;
	json_t *reply, *e, *r, *entries;
	size_t i, len = 0;
	FILE *f;
	int rv;

	OPTIONAL_STRING(path, "path", "a directory in the sandbox");
	SANDBOX_OR_FAIL(id);
	if ((rv = gw(t, "ListFiles",
	         json_pack("{s:s, s:s}", "sandboxId", id, "path",
	             path ? path : "/root"),
	         &reply, &errmsg)) != MOAT_OK)
		return call_error("list_dir", rv, errmsg);
	if ((f = open_memstream(&text, &len)) == NULL) {
		json_decref(reply);
		return tool_error("out of memory");
	}
	json_array_foreach (json_object_get(reply, "entries"), i, e) {
		const char *type =
		    json_string_value(json_object_get(e, "type"));
		fprintf(f, "%s%s\t%s\n",
		    json_string_value(json_object_get(e, "name")) ?: "",
		    type && strstr(type, "DIR") ? "/" : "",
		    json_string_value(json_object_get(e, "size")) ?: "0");
	}
	fclose(f);
	/* An empty listing has no "entries" (proto3 JSON leaves empty
	 * repeated fields out): a new array then, whose one reference the
	 * result takes ("o"); the reply's is shared ("o" after incref). */
	entries = json_object_get(reply, "entries");
	r = result_text(text, false,
	    json_pack("{s:o}", "entries",
	        entries != NULL ? json_incref(entries) : json_array()));
	free(text);
	json_decref(reply);
	return r;
}

static json_t *
t_sandbox_create(struct tool_ctx *t)
{
	const char *image;
	double mem = 0, cpus = 0;
	bool bad = false, record;
	char *errmsg, *text;
	json_t *reply, *r, *v, *req;
	int rv;

	OPTIONAL_STRING(image, "image", "a guest image name");
	arg_number(t, "memory_mib", 1 << 20, &mem, &bad);
	arg_number(t, "vcpus", 256, &cpus, &bad);
	if (bad)
		return tool_error("arguments \"memory_mib\" and \"vcpus\" "
		                  "must be positive numbers");
	v = json_object_get(t->args, "record");
	if (v != NULL && !json_is_boolean(v))
		return tool_error("argument \"record\" must be true or false");
	record = v == NULL || json_is_true(v);
	req = json_pack("{s:s, s:i, s:i, s:b}", "image", image ? image : "",
	    "memoryMib", (int)mem, "vcpus", (int)cpus, "record", record);
	/* Guest egress (issue 14): "allow" names imply an allowlist. */
	if ((v = json_object_get(t->args, "allow")) != NULL) {
		size_t i;
		json_t *e;

		if (!json_is_array(v)) {
			json_decref(req);
			return tool_error("argument \"allow\" must be a list "
			                  "of \"host[:port]\" strings");
		}
		json_array_foreach (v, i, e)
			if (!json_is_string(e)) {
				json_decref(req);
				return tool_error("argument \"allow\" must be "
				                  "a list of \"host[:port]\" "
				                  "strings");
			}
		if (json_array_size(v) > 0)
			json_object_set_new(req, "network",
			    json_pack("{s:s, s:O}", "mode", "allowlist",
			        "allow", v));
	}
	if ((rv = gw(t, "CreateSandbox", req, &reply, &errmsg)) != MOAT_OK)
		return call_error("sandbox_create", rv, errmsg);
	text = moat_asprintf("created sandbox %s%s%s",
	    json_string_value(json_object_get(reply, "id")) ?: "?",
	    record ? ", recording session " : "",
	    record ?
	        json_string_value(json_object_get(reply, "sessionId")) ?: "" :
	        "");
	r = result_text(text, false, reply);
	free(text);
	return r;
}

static json_t *
t_sandbox_list(struct tool_ctx *t)
{
	char *errmsg, *text = NULL;
	json_t *reply, *e, *r;
	size_t i, len = 0;
	FILE *f;
	int rv;

	if ((rv = gw(t, "ListSandboxes", json_object(), &reply, &errmsg)) !=
	    MOAT_OK)
		return call_error("sandbox_list", rv, errmsg);
	if ((f = open_memstream(&text, &len)) == NULL) {
		json_decref(reply);
		return tool_error("out of memory");
	}
	json_array_foreach (json_object_get(reply, "sandboxes"), i, e)
		fprintf(f, "%s\t%s\t%s\n",
		    json_string_value(json_object_get(e, "id")) ?: "",
		    json_string_value(json_object_get(e, "state")) ?: "",
		    json_string_value(json_object_get(e, "sessionId")) ?: "");
	if (i == 0)
		fprintf(f, "no sandboxes\n");
	fclose(f);
	r = result_text(text, false, reply);
	free(text);
	return r;
}

static json_t *
t_sandbox_destroy(struct tool_ctx *t)
{
	const char *id;
	char *errmsg, *text;
	json_t *reply, *r;
	int rv;

	REQUIRE_STRING(id, "sandbox_id",
	    "the sandbox to destroy "
	    "(sandbox_list lists them)");
	if ((rv = gw(t, "DestroySandbox", json_pack("{s:s}", "sandboxId", id),
	         &reply, &errmsg)) != MOAT_OK)
		return call_error("sandbox_destroy", rv, errmsg);
	pthread_mutex_lock(&t->s->lock);
	if (strcmp(t->s->default_sandbox, id) == 0)
		t->s->default_sandbox[0] = '\0';
	pthread_mutex_unlock(&t->s->lock);
	json_decref(reply);
	text = moat_asprintf("destroyed %s", id);
	r = result_text(text, false, NULL);
	free(text);
	return r;
}

static json_t *
t_snapshot(struct tool_ctx *t)
{
	char id[MOAT_MCP_ID_MAX], *errmsg, *text;
	json_t *reply, *r;
	int rv;

	SANDBOX_OR_FAIL(id);
	if ((rv = gw(t, "SnapshotSandbox", json_pack("{s:s}", "sandboxId", id),
	         &reply, &errmsg)) != MOAT_OK)
		return call_error("snapshot", rv, errmsg);
	text = moat_asprintf("snapshot %s of %s",
	    json_string_value(json_object_get(reply, "snapshotId")) ?: "?",
	    id);
	r = result_text(text, false, reply);
	free(text);
	return r;
}

/* session_of: the session_id argument, else the recording session of the
 * sandbox (sandbox_id or the default). On MOAT_OK out holds it. */
static int
session_of(struct tool_ctx *t, char *out, size_t size, char **errmsg)
{
	bool bad = false;
	const char *given = arg_string(t, "session_id", &bad);
	char id[MOAT_MCP_ID_MAX];
	const char *sid;
	json_t *reply;
	int rv;

	if (bad) {
		*errmsg = moat_asprintf("argument \"session_id\" must be a "
		                        "string");
		return MOAT_INVALID_ARGUMENT;
	}
	if (given != NULL && given[0] != '\0') {
		snprintf(out, size, "%s", given);
		return MOAT_OK;
	}
	if ((rv = sandbox_of(t, id, sizeof(id), errmsg)) != MOAT_OK)
		return rv;
	if ((rv = gw(t, "GetSandbox", json_pack("{s:s}", "sandboxId", id),
	         &reply, errmsg)) != MOAT_OK)
		return rv;
	sid = json_string_value(json_object_get(reply, "sessionId"));
	if (sid == NULL || sid[0] == '\0') {
		json_decref(reply);
		*errmsg = moat_asprintf(
		    "sandbox %s is not recorded: give a "
		    "session_id, or use a sandbox made with record true",
		    id);
		return MOAT_FAILED_PRECONDITION;
	}
	snprintf(out, size, "%s", sid);
	json_decref(reply);
	return MOAT_OK;
}

static json_t *
t_restore(struct tool_ctx *t)
{
	char sid[MOAT_MCP_ID_MAX], *errmsg, *text;
	const char *sb, *node;
	json_t *reply, *r, *req, *v;
	double step = -1;
	bool bad = false;
	int rv;

	if (!arg_number(t, "step", 1e15, &step, &bad) || bad)
		return tool_error(
		    "argument \"step\" is required: the step "
		    "number to go back to (history lists them; 0 is the "
		    "state before step 1)");
	OPTIONAL_STRING(sb, "sandbox_id", "the sandbox to restore");
	OPTIONAL_STRING(node, "node", "the node to restore on");
	v = json_object_get(t->args, "reseed");
	if (v != NULL && !json_is_null(v) && !json_is_boolean(v))
		return tool_error("argument \"reseed\" must be true or false: "
		                  "true gives the code contexts new random "
		                  "seeds");
	if ((rv = session_of(t, sid, sizeof(sid), &errmsg)) != MOAT_OK)
		return call_error("restore", rv, errmsg);
	req = json_pack("{s:s, s:I, s:s}", "sessionId", sid, "step",
	    (json_int_t)step, "sandboxId", sb ? sb : "");
	if (req != NULL && node != NULL && node[0] != '\0')
		json_object_set_new(req, "node", json_string(node));
	if (req != NULL && json_is_true(v))
		json_object_set_new(req, "reseed", json_true());
	if ((rv = gw(t, "RestoreStep", req, &reply, &errmsg)) != MOAT_OK)
		return call_error("restore", rv, errmsg);
	text = moat_asprintf("restored session %s to step %lld", sid,
	    (long long)step);
	r = result_text(text, false, reply);
	free(text);
	return r;
}

static json_t *
t_history(struct tool_ctx *t)
{
	char sid[MOAT_MCP_ID_MAX], *errmsg, *text = NULL;
	json_t *reply, *e, *r;
	size_t i, len = 0;
	FILE *f;
	int rv;

	if ((rv = session_of(t, sid, sizeof(sid), &errmsg)) != MOAT_OK)
		return call_error("history", rv, errmsg);
	if ((rv = gw(t, "ListSteps", json_pack("{s:s}", "sessionId", sid),
	         &reply, &errmsg)) != MOAT_OK)
		return call_error("history", rv, errmsg);
	if ((f = open_memstream(&text, &len)) == NULL) {
		json_decref(reply);
		return tool_error("out of memory");
	}
	fprintf(f, "session %s\n", sid);
	json_array_foreach (json_object_get(reply, "steps"), i, e) {
		const char *in =
		    json_string_value(json_object_get(e, "input")) ?: "";
		/* A branch's inherited step (issue 18): who holds it. */
		const char *held =
		    json_string_value(json_object_get(e, "heldBySession"));

		fprintf(f, "%s\t%s\texit %lld\t%.200s%s%s%s\n",
		    json_string_value(json_object_get(e, "index")) ?: "?",
		    json_string_value(json_object_get(e, "kind")) ?: "",
		    (long long)json_integer_value(
		        json_object_get(e, "exitCode")),
		    in, held && held[0] ? "\t(inherited from " : "",
		    held && held[0] ? held : "", held && held[0] ? ")" : "");
	}
	fclose(f);
	json_object_set_new(reply, "sessionId", json_string(sid));
	r = result_text(text, false, reply);
	free(text);
	return r;
}

/* t_session_tree: the session and its branches (issue 18), one line
 * each, indented by depth. */
static json_t *
t_session_tree(struct tool_ctx *t)
{
	char sid[MOAT_MCP_ID_MAX], *errmsg, *text = NULL;
	json_t *reply, *e, *r;
	size_t i, len = 0;
	FILE *f;
	int rv;

	if ((rv = session_of(t, sid, sizeof(sid), &errmsg)) != MOAT_OK)
		return call_error("session_tree", rv, errmsg);
	if ((rv = gw(t, "GetSessionTree", json_pack("{s:s}", "sessionId", sid),
	         &reply, &errmsg)) != MOAT_OK)
		return call_error("session_tree", rv, errmsg);
	if ((f = open_memstream(&text, &len)) == NULL) {
		json_decref(reply);
		return tool_error("out of memory");
	}
	json_array_foreach (json_object_get(reply, "nodes"), i, e) {
		json_int_t depth =
		    json_integer_value(json_object_get(e, "depth"));
		const char *at =
		    json_string_value(json_object_get(e, "branchedAt"));

		fprintf(f, "%*s%s", (int)(depth > 16 ? 32 : 2 * depth), "",
		    json_string_value(json_object_get(e, "sessionId")) ?: "?");
		if (depth > 0)
			fprintf(f, "  branched at step %s", at ? at : "0");
		fprintf(f, "  steps %s",
		    json_string_value(json_object_get(e, "stepCount")) ?: "0");
		if (json_is_true(json_object_get(e, "hasExit")))
			fprintf(f, "  last exit %lld",
			    (long long)json_integer_value(
			        json_object_get(e, "lastExitCode")));
		fputc('\n', f);
	}
	fclose(f);
	r = result_text(text, false, reply);
	free(text);
	return r;
}

static json_t *
t_fork(struct tool_ctx *t)
{
	char sid[MOAT_MCP_ID_MAX], *errmsg, *text;
	const char *node;
	json_t *reply, *r, *req;
	double step = -1, count = 1;
	bool bad = false;
	int rv;

	if (!arg_number(t, "step", 1e15, &step, &bad) || bad)
		return tool_error("argument \"step\" is required: the step "
		                  "to fork from (history lists them)");
	arg_number(t, "count", 16, &count, &bad);
	if (bad)
		return tool_error("argument \"count\" must be 1 to 16");
	OPTIONAL_STRING(node, "node", "the node for every copy");
	if ((rv = session_of(t, sid, sizeof(sid), &errmsg)) != MOAT_OK)
		return call_error("fork", rv, errmsg);
	req = json_pack("{s:s, s:I, s:i}", "sessionId", sid, "step",
	    (json_int_t)step, "count", (int)count);
	if (req != NULL && node != NULL && node[0] != '\0')
		json_object_set_new(req, "node", json_string(node));
	if ((rv = gw(t, "Fork", req, &reply, &errmsg)) != MOAT_OK)
		return call_error("fork", rv, errmsg);
	text = json_dumps(reply, JSON_INDENT(2));
	r = result_text(text, false, reply);
	free(text);
	return r;
}

static json_t *
t_diff(struct tool_ctx *t)
{
	const char *a, *b;
	char *errmsg, *text;
	json_t *reply, *r;
	int rv;

	REQUIRE_STRING(a, "session_a", "a recorded session id");
	REQUIRE_STRING(b, "session_b", "a recorded session id");
	if ((rv = gw(t, "Diff",
	         json_pack("{s:s, s:s}", "sessionA", a, "sessionB", b), &reply,
	         &errmsg)) != MOAT_OK)
		return call_error("diff", rv, errmsg);
	text = json_dumps(reply, JSON_INDENT(2));
	r = result_text(text, false, reply);
	free(text);
	return r;
}

/* ---- host files (moat mcp --allow-dir) ---- */

/* has_dotdot: whether a component of `path` is "..". */
static bool
has_dotdot(const char *path)
{
	for (const char *p = path; (p = strstr(p, "..")) != NULL; p += 2)
		if ((p == path || p[-1] == '/') &&
		    (p[2] == '\0' || p[2] == '/'))
			return true;
	return false;
}

int
moat_mcp_host_path(const char *allow_dir, const char *path, bool must_exist,
    char **out, char **errmsg)
{
	char *joined = NULL, *real = NULL, *dir = NULL, *slash;
	size_t n = strlen(allow_dir);
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if (path[0] == '\0' || has_dotdot(path)) {
		*errmsg = moat_asprintf("host path \"%s\" is refused: give a "
		                        "path below %s without \"..\"",
		    path, allow_dir);
		return MOAT_PERMISSION_DENIED;
	}
	joined = path[0] == '/' ? strdup(path) :
	                          moat_asprintf("%s/%s", allow_dir, path);
	if (joined == NULL)
		goto fail_oom;
	if (must_exist) {
		if ((real = realpath(joined, NULL)) == NULL) {
			rv = errno == ENOENT ? MOAT_NOT_FOUND :
			                       MOAT_INVALID_ARGUMENT;
			*errmsg = moat_asprintf("host path %s: %s", path,
			    strerror(errno));
			free(joined);
			return rv;
		}
	} else {
		/* The file may not exist yet: resolve its directory, and
		 * refuse a name that is an existing symlink. */
		struct stat st;

		if ((slash = strrchr(joined, '/')) == NULL || slash[1] == '\0')
			goto refused;
		*slash = '\0';
		if ((dir = realpath(joined[0] ? joined : "/", NULL)) == NULL) {
			*errmsg = moat_asprintf("host directory of %s: %s",
			    path, strerror(errno));
			free(joined);
			return MOAT_NOT_FOUND;
		}
		if ((real = moat_asprintf("%s/%s", dir, slash + 1)) == NULL)
			goto fail_oom;
		if (lstat(real, &st) == 0 && S_ISLNK(st.st_mode))
			goto refused;
	}
	/* allow_dir "/" holds everything. */
	if (n > 1 &&
	    (strncmp(real, allow_dir, n) != 0 ||
	        (real[n] != '/' && real[n] != '\0')))
		goto refused;
	free(joined);
	free(dir);
	*out = real;
	return MOAT_OK;

refused:
	*errmsg = moat_asprintf(
	    "host path \"%s\" is outside %s (the "
	    "--allow-dir): only files below it can be read or written",
	    path, allow_dir);
	free(joined);
	free(dir);
	free(real);
	return MOAT_PERMISSION_DENIED;
fail_oom:
	free(joined);
	free(dir);
	free(real);
	*errmsg = moat_asprintf("out of memory");
	return MOAT_RESOURCE_EXHAUSTED;
}

static json_t *
t_upload_file(struct tool_ctx *t)
{
	const char *host, *path;
	char id[MOAT_MCP_ID_MAX], *real, *errmsg, *b64, *text;
	uint8_t *bytes = NULL;
	json_t *reply, *r;
	struct stat st;
	ssize_t got;
	size_t len = 0;
	int fd, rv;

	REQUIRE_STRING(host, "host_path", "a file below the --allow-dir");
	REQUIRE_STRING(path, "path", "where to put it in the sandbox");
	SANDBOX_OR_FAIL(id);
	if ((rv = moat_mcp_host_path(t->s->allow_dir, host, true, &real,
	         &errmsg)) != MOAT_OK)
		return call_error("upload_file", rv, errmsg);
	fd = open(real, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_size > MOAT_MCP_MAX_HOST_FILE) {
		r = tool_error("host file %s cannot be sent: %s", host,
		    fd < 0 ? strerror(errno) :
		             "not a regular file of at "
		             "most 64 MiB");
		if (fd >= 0)
			close(fd);
		free(real);
		return r;
	}
	free(real);
	if ((bytes = malloc((size_t)st.st_size + 1)) == NULL) {
		close(fd);
		return tool_error("out of memory");
	}
	while (len < (size_t)st.st_size &&
	    (got = read(fd, bytes + len, (size_t)st.st_size - len)) > 0)
		len += (size_t)got;
	close(fd);
	b64 = moat_codec_base64(bytes, len);
	free(bytes);
	if (b64 == NULL)
		return tool_error("out of memory");
	rv = gw(t, "WriteFile",
	    json_pack("{s:s, s:s, s:s, s:b, s:b}", "sandboxId", id, "path",
	        path, "data", b64, "truncate", 1, "makeParents", 1),
	    &reply, &errmsg);
	free(b64);
	if (rv != MOAT_OK)
		return call_error("upload_file", rv, errmsg);
	json_decref(reply);
	text = moat_asprintf("uploaded %s (%zu bytes) to %s:%s", host, len, id,
	    path);
	r = result_text(text, false, NULL);
	free(text);
	return r;
}

static json_t *
t_download_file(struct tool_ctx *t)
{
	const char *host, *path, *b64;
	char id[MOAT_MCP_ID_MAX], *real, *errmsg, *text;
	uint8_t *bytes = NULL;
	size_t len = 0, done = 0;
	json_t *reply, *r;
	ssize_t n;
	int fd, rv;

	REQUIRE_STRING(path, "path", "the file in the sandbox");
	REQUIRE_STRING(host, "host_path",
	    "where to write it below the "
	    "--allow-dir");
	if ((rv = moat_mcp_host_path(t->s->allow_dir, host, false, &real,
	         &errmsg)) != MOAT_OK)
		return call_error("download_file", rv, errmsg);
	{
		char *e;
		if ((rv = sandbox_of(t, id, sizeof(id), &e)) != MOAT_OK) {
			free(real);
			return call_error("getting the sandbox", rv, e);
		}
	}
	if ((rv = gw(t, "ReadFile",
	         json_pack("{s:s, s:s}", "sandboxId", id, "path", path),
	         &reply, &errmsg)) != MOAT_OK) {
		free(real);
		return call_error("download_file", rv, errmsg);
	}
	b64 = json_string_value(json_object_get(reply, "data"));
	if (b64 != NULL &&
	    moat_codec_base64_decode(b64, strlen(b64), &bytes, &len) !=
	        MOAT_OK) {
		free(real);
		json_decref(reply);
		return tool_error("the gateway's file data did not decode");
	}
	json_decref(reply);
	fd = open(real, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
	    0644);
	if (fd < 0) {
		r = tool_error("cannot write host file %s: %s", host,
		    strerror(errno));
		free(real);
		free(bytes);
		return r;
	}
	while (done < len && (n = write(fd, bytes + done, len - done)) > 0)
		done += (size_t)n;
	close(fd);
	free(bytes);
	free(real);
	if (done < len)
		return tool_error("writing host file %s failed part way",
		    host);
	text = moat_asprintf("downloaded %s:%s (%zu bytes) to %s", id, path,
	    len, host);
	r = result_text(text, false, NULL);
	free(text);
	return r;
}

/* ---- directories (issue 17): tar archives through Put/GetArchive ---- */
#define DIR_CHUNK (4u << 20) /* archive bytes per PutArchive/GetArchive */

static json_t *
dir_summary(const char *what, const char *from, const char *to,
    const struct moat_tar_stats *st)
{
	char *text = moat_asprintf("%s %s to %s: %llu files, %llu dirs, %llu "
	                           "symlinks, %llu bytes",
	    what, from, to, (unsigned long long)st->files,
	    (unsigned long long)st->dirs, (unsigned long long)st->symlinks,
	    (unsigned long long)st->bytes);
	json_t *r = result_text(text, false,
	    json_pack("{s:I, s:I, s:I, s:I}", "files", (json_int_t)st->files,
	        "dirs", (json_int_t)st->dirs, "symlinks",
	        (json_int_t)st->symlinks, "bytes", (json_int_t)st->bytes));

	free(text);
	return r;
}

/* dir_put: sends the archive in afd (size bytes) in chunks; *st gets
 * what the guest unpacked. */
static int
dir_put(struct tool_ctx *t, const char *id, const char *path, int afd,
    uint64_t size, struct moat_tar_stats *st, char **errmsg)
{
	char *upload = strdup("");
	uint8_t *buf = malloc(DIR_CHUNK);
	uint64_t off = 0;
	int rv = MOAT_OK;

	while (rv == MOAT_OK && upload != NULL && buf != NULL) {
		size_t n =
		    size - off > DIR_CHUNK ? DIR_CHUNK : (size_t)(size - off);
		bool last = off + n == size;
		json_t *reply = NULL;
		char *b64;

		if (pread(afd, buf, n, (off_t)off) != (ssize_t)n) {
			*errmsg = moat_asprintf("reading the staged archive");
			rv = MOAT_INTERNAL;
			break;
		}
		if ((b64 = moat_codec_base64(buf, n)) == NULL)
			break;
		rv = gw(t, "PutArchive",
		    json_pack("{s:s, s:s, s:s, s:I, s:s, s:b}", "sandboxId",
		        id, "path", path, "uploadId", upload, "offset",
		        (json_int_t)off, "data", b64, "last", last),
		    &reply, errmsg);
		free(b64);
		if (rv != MOAT_OK)
			break;
		free(upload);
		upload = strdup(
		    json_string_value(json_object_get(reply, "uploadId")) ?:
		                                                            "");
		st->files = (uint64_t)json_integer_value(
		    json_object_get(reply, "files"));
		st->dirs = (uint64_t)json_integer_value(
		    json_object_get(reply, "dirs"));
		st->symlinks = (uint64_t)json_integer_value(
		    json_object_get(reply, "symlinks"));
		json_decref(reply);
		off += n;
		if (last) {
			free(upload);
			free(buf);
			return MOAT_OK;
		}
	}
	if (rv == MOAT_OK) {
		*errmsg = moat_asprintf("out of memory");
		rv = MOAT_RESOURCE_EXHAUSTED;
	}
	free(upload);
	free(buf);
	return rv;
}

static json_t *
t_upload_dir(struct tool_ctx *t)
{
	const char *host, *path;
	char id[MOAT_MCP_ID_MAX], *real, *errmsg = NULL;
	struct moat_tar_stats st = { 0 };
	json_t *r;
	off_t size = 0;
	int dfd, afd, rv;

	REQUIRE_STRING(host, "host_path", "a directory below the --allow-dir");
	REQUIRE_STRING(path, "path", "the directory in the sandbox");
	SANDBOX_OR_FAIL(id);
	if ((rv = moat_mcp_host_path(t->s->allow_dir, host, true, &real,
	         &errmsg)) != MOAT_OK)
		return call_error("upload_dir", rv, errmsg);
	dfd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(real);
	if (dfd < 0)
		return tool_error("host directory %s cannot be read: %s", host,
		    strerror(errno));
	if ((afd = moat_tar_staging(NULL)) < 0) {
		close(dfd);
		return tool_error("no room to stage the archive: %s",
		    strerror(errno));
	}
	rv = moat_tar_pack(dfd, host, afd, &st, &errmsg);
	close(dfd);
	if (rv == MOAT_OK && (size = lseek(afd, 0, SEEK_END)) < 0) {
		errmsg =
		    moat_asprintf("the staged archive: %s", strerror(errno));
		rv = MOAT_INTERNAL;
	}
	if (rv == MOAT_OK)
		rv = dir_put(t, id, path, afd, (uint64_t)size, &st, &errmsg);
	close(afd);
	if (rv != MOAT_OK)
		return call_error("upload_dir", rv, errmsg);
	r = dir_summary("uploaded", host, path, &st);
	return r;
}

/* dir_get: GetArchive of path until eof, into afd. */
static int
dir_get(struct tool_ctx *t, const char *id, const char *path, int afd,
    char **errmsg)
{
	char *download = strdup("");
	uint64_t off = 0;
	int rv = MOAT_OK;

	while (download != NULL) {
		json_t *reply = NULL;
		const char *b64;
		uint8_t *bytes = NULL;
		size_t len = 0;
		bool eof;

		rv = gw(t, "GetArchive",
		    json_pack("{s:s, s:s, s:s, s:I}", "sandboxId", id, "path",
		        path, "downloadId", download, "offset",
		        (json_int_t)off),
		    &reply, errmsg);
		if (rv != MOAT_OK)
			break;
		b64 = json_string_value(json_object_get(reply, "data"));
		if (b64 != NULL &&
		    moat_codec_base64_decode(b64, strlen(b64), &bytes, &len) !=
		        MOAT_OK) {
			json_decref(reply);
			*errmsg = moat_asprintf("the archive data did not "
			                        "decode");
			rv = MOAT_INTERNAL;
			break;
		}
		if (len > 0 && moat_tar_write_all(afd, bytes, len) != 0) {
			free(bytes);
			json_decref(reply);
			*errmsg = moat_asprintf("staging the archive: %s",
			    strerror(errno));
			rv = MOAT_INTERNAL;
			break;
		}
		free(bytes);
		off += len;
		eof = json_is_true(json_object_get(reply, "eof")) || len == 0;
		free(download);
		download = strdup(
		    json_string_value(json_object_get(reply, "downloadId")) ?:
		        "");
		json_decref(reply);
		if (eof) {
			free(download);
			return MOAT_OK;
		}
	}
	if (rv == MOAT_OK) {
		*errmsg = moat_asprintf("out of memory");
		rv = MOAT_RESOURCE_EXHAUSTED;
	}
	free(download);
	return rv;
}

static json_t *
t_download_dir(struct tool_ctx *t)
{
	const char *host, *path;
	char id[MOAT_MCP_ID_MAX], *real, *errmsg = NULL, *e;
	struct moat_tar_stats st = { 0 };
	int dfd = -1, afd, rv;

	REQUIRE_STRING(path, "path", "the directory in the sandbox");
	REQUIRE_STRING(host, "host_path",
	    "the directory to unpack into below the --allow-dir");
	if ((rv = moat_mcp_host_path(t->s->allow_dir, host, false, &real,
	         &errmsg)) != MOAT_OK)
		return call_error("download_dir", rv, errmsg);
	if ((rv = sandbox_of(t, id, sizeof(id), &e)) != MOAT_OK) {
		free(real);
		return call_error("getting the sandbox", rv, e);
	}
	if ((afd = moat_tar_staging(NULL)) < 0) {
		free(real);
		return tool_error("no room to stage the archive: %s",
		    strerror(errno));
	}
	rv = dir_get(t, id, path, afd, &errmsg);
	/* The sandbox is not trusted: check all before making anything. */
	if (rv == MOAT_OK && lseek(afd, 0, SEEK_SET) == 0)
		rv = moat_tar_check(afd, 0, NULL, &errmsg);
	if (rv == MOAT_OK && mkdir(real, 0755) != 0 && errno != EEXIST) {
		errmsg =
		    moat_asprintf("cannot make %s: %s", host, strerror(errno));
		rv = moat_status_from_errno(errno);
	}
	if (rv == MOAT_OK &&
	    (dfd = open(real,
	         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		errmsg =
		    moat_asprintf("cannot open %s: %s", host, strerror(errno));
		rv = moat_status_from_errno(errno);
	}
	if (rv == MOAT_OK)
		rv = moat_tar_unpack(afd, dfd, 0, &st, &errmsg);
	if (dfd >= 0)
		close(dfd);
	close(afd);
	free(real);
	if (rv != MOAT_OK)
		return call_error("download_dir", rv, errmsg);
	return dir_summary("downloaded", path, host, &st);
}

/* ---- the table ---- */

#define SB_PROP                                                               \
	"\"sandbox_id\":{\"type\":\"string\",\"description\":\"the "          \
	"sandbox; default: this session's own (made on first use)\"}"
#define SES_PROP                                                              \
	"\"session_id\":{\"type\":\"string\",\"description\":\"a "            \
	"recorded session; default: the sandbox's\"}"
#define NODE_PROP                                                             \
	"\"node\":{\"type\":\"string\",\"description\":\"the node to "        \
	"restore on; default: the gateway places it\"}"

static const struct tool tools[] = {
	{ "run_code",
	    "Run code in a persistent interpreter in a sandbox "
	    "(state is kept between calls of the same context). Returns "
	    "stdout, stderr, the last expression's value, and the error "
	    "with its traceback.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"code\":{\"type\":\"string\",\"description\":\"source code\"},"
	    "\"language\":{\"type\":\"string\",\"enum\":[\"python\","
	    "\"bash\",\"sh\",\"node\"],\"default\":\"python\"},"
	    "\"context\":{\"type\":\"string\",\"description\":\"the "
	    "interpreter's name; default \\\"default\\\"\"},"
	    "\"timeout\":{\"type\":\"number\",\"description\":\"seconds\"}"
	    "," SB_PROP "},\"required\":[\"code\"]}",
	    t_run_code, false },
	{ "exec",
	    "Run a shell command in a sandbox; returns its output and "
	    "exit code.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"command\":{\"type\":\"string\",\"description\":\"a shell "
	    "command line (sh -c)\"},"
	    "\"cwd\":{\"type\":\"string\"},"
	    "\"env\":{\"type\":\"object\",\"additionalProperties\":"
	    "{\"type\":\"string\"}},"
	    "\"timeout\":{\"type\":\"number\",\"description\":\"seconds\"}"
	    "," SB_PROP "},\"required\":[\"command\"]}",
	    t_exec, false },
	{ "read_file", "Read a text file from a sandbox.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"path\":{\"type\":\"string\"}," SB_PROP
	    "},\"required\":[\"path\"]}",
	    t_read_file, false },
	{ "write_file",
	    "Write a text file in a sandbox (parents are made, "
	    "an existing file is replaced).",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"path\":{\"type\":\"string\"},"
	    "\"content\":{\"type\":\"string\"}," SB_PROP
	    "},\"required\":[\"path\",\"content\"]}",
	    t_write_file, false },
	{ "list_dir", "List a directory in a sandbox (default /root).",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"path\":{\"type\":\"string\"}," SB_PROP "}}",
	    t_list_dir, false },
	{ "sandbox_create",
	    "Create a new sandbox (a microVM); recorded "
	    "unless record is false. No network unless allow names hosts "
	    "(\"host[:port]\", ports 80 and 443 by default) that programs "
	    "reach through the http(s)_proxy set in the sandbox.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"image\":{\"type\":\"string\"},"
	    "\"memory_mib\":{\"type\":\"integer\",\"minimum\":0},"
	    "\"vcpus\":{\"type\":\"integer\",\"minimum\":0},"
	    "\"allow\":{\"type\":\"array\",\"items\":{\"type\":"
	    "\"string\"}},"
	    "\"record\":{\"type\":\"boolean\",\"default\":true}}}",
	    t_sandbox_create, false },
	{ "sandbox_list", "List the sandboxes.",
	    "{\"type\":\"object\",\"properties\":{}}", t_sandbox_list, false },
	{ "sandbox_destroy", "Destroy a sandbox.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"sandbox_id\":{\"type\":\"string\"}},"
	    "\"required\":[\"sandbox_id\"]}",
	    t_sandbox_destroy, false },
	{ "snapshot",
	    "Snapshot a running sandbox (memory and disk). In a "
	    "recorded sandbox the latest step gets it, so restore and fork "
	    "can go back to that step.",
	    "{\"type\":\"object\",\"properties\":{" SB_PROP "}}", t_snapshot,
	    false },
	{ "restore",
	    "Bring a sandbox back to a recorded step that has a "
	    "snapshot (see snapshot and history); in place, same id. Its "
	    "code contexts' random generators come back as recorded (the "
	    "same draws follow) unless reseed is true.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"step\":{\"type\":\"integer\",\"minimum\":0}," SES_PROP
	    "," SB_PROP "," NODE_PROP ",\"reseed\":{\"type\":\"boolean\","
	    "\"default\":false,\"description\":\"new random seeds for "
	    "the code contexts (python random, numpy.random, node "
	    "Math.random); a fork's copies always get them\"}},"
	    "\"required\":[\"step\"]}",
	    t_restore, false },
	{ "history", "The recorded steps of a sandbox or session.",
	    "{\"type\":\"object\",\"properties\":{" SES_PROP "," SB_PROP "}}",
	    t_history, false },
	{ "session_tree",
	    "A recorded session and the branches made from it (restores, "
	    "forks): where each branched, its steps, its last exit status.",
	    "{\"type\":\"object\",\"properties\":{" SES_PROP "," SB_PROP "}}",
	    t_session_tree, false },
	{ "fork",
	    "New sandboxes from a recorded step, each recorded as a "
	    "branch session.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"step\":{\"type\":\"integer\",\"minimum\":0},"
	    "\"count\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":16}"
	    "," SES_PROP "," SB_PROP "," NODE_PROP
	    "},\"required\":[\"step\"]}",
	    t_fork, false },
	{ "diff", "Where two recorded sessions part: steps, outputs, files.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"session_a\":{\"type\":\"string\"},"
	    "\"session_b\":{\"type\":\"string\"}},"
	    "\"required\":[\"session_a\",\"session_b\"]}",
	    t_diff, false },
	{ "upload_file",
	    "Copy a file from the MCP host (below its "
	    "--allow-dir) into a sandbox.",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"host_path\":{\"type\":\"string\"},"
	    "\"path\":{\"type\":\"string\"}," SB_PROP
	    "},\"required\":[\"host_path\",\"path\"]}",
	    t_upload_file, true },
	{ "download_file",
	    "Copy a file from a sandbox to the MCP host "
	    "(below its --allow-dir).",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"path\":{\"type\":\"string\"},"
	    "\"host_path\":{\"type\":\"string\"}," SB_PROP
	    "},\"required\":[\"path\",\"host_path\"]}",
	    t_download_file, true },
	{ "upload_dir",
	    "Copy a directory tree from the MCP host (below its "
	    "--allow-dir) into a sandbox directory (made if missing; "
	    "symlinks stay links).",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"host_path\":{\"type\":\"string\"},"
	    "\"path\":{\"type\":\"string\"}," SB_PROP
	    "},\"required\":[\"host_path\",\"path\"]}",
	    t_upload_dir, true },
	{ "download_dir",
	    "Copy a directory tree from a sandbox into a directory on the "
	    "MCP host (below its --allow-dir; made if missing).",
	    "{\"type\":\"object\",\"properties\":{"
	    "\"path\":{\"type\":\"string\"},"
	    "\"host_path\":{\"type\":\"string\"}," SB_PROP
	    "},\"required\":[\"path\",\"host_path\"]}",
	    t_download_dir, true },
};
#define N_TOOLS (sizeof(tools) / sizeof(tools[0]))

static const struct tool *
find_tool(const char *name, bool host_files)
{
	for (size_t i = 0; i < N_TOOLS; i++)
		if (strcmp(tools[i].name, name) == 0 &&
		    (!tools[i].host_files || host_files))
			return &tools[i];
	return NULL;
}

json_t *
moat_mcp_tools_list(bool host_files)
{
	json_t *list = json_array(), *schema;

	for (size_t i = 0; list != NULL && i < N_TOOLS; i++) {
		if (tools[i].host_files && !host_files)
			continue;
		/* The schemas are constants: a parse failure is a bug. */
		schema = json_loads(tools[i].schema, 0, NULL);
		json_array_append_new(list,
		    json_pack("{s:s, s:s, s:o*}", "name", tools[i].name,
		        "description", tools[i].description, "inputSchema",
		        schema));
	}
	return list;
}

bool
moat_mcp_tool_known(const char *name, bool host_files)
{
	return find_tool(name, host_files) != NULL;
}

json_t *
moat_mcp_tool_call(struct moat_mcp_session *s, const char *name, json_t *args,
    moat_mcp_call_fn call, void *arg)
{
	const struct tool *tool = find_tool(name, s->allow_dir != NULL);
	struct tool_ctx t = { .s = s, .call = call, .arg = arg, .args = args };

	if (tool == NULL)
		return tool_error("unknown tool %s", name);
	return tool->run(&t);
}
