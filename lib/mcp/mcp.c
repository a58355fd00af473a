/*
 * mcp.c: the JSON-RPC 2.0 side of moat's MCP server (mcp.h): message
 * shape checks, initialize with protocol version negotiation, ping,
 * tools/list and tools/call (run by tools.c), notifications and
 * responses (accepted, never answered), batches, and the errors of the
 * spec (-32700 malformed JSON, -32600 not a request, -32601 unknown
 * method, -32602 bad params or unknown tool).
 * Not for: what a tool does (tools.c) or how messages travel
 * (cmd_mcp.c, gateway/mcp_http.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mcp_internal.h"
#include "moat/codec.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define SERVER_NAME "moat"
#define SERVER_VERSION "0.1.0"

static const char *const versions[] = MOAT_MCP_VERSIONS;
#define N_VERSIONS (sizeof(versions) / sizeof(versions[0]))

int
moat_mcp_session_new(struct moat_mcp_session **out, const char *allow_dir,
    const char *label, char **errmsg)
{
	struct moat_mcp_session *s;
	struct stat st;

	*out = NULL;
	*errmsg = NULL;
	if ((s = calloc(1, sizeof(*s))) == NULL)
		goto fail_oom;
	pthread_mutex_init(&s->lock, NULL);
	snprintf(s->version, sizeof(s->version), "%s", versions[0]);
	if (label != NULL && (s->label = strdup(label)) == NULL)
		goto fail_oom;
	if (allow_dir != NULL) {
		if ((s->allow_dir = realpath(allow_dir, NULL)) == NULL) {
			*errmsg = moat_asprintf("--allow-dir %s: %s: give an "
			                        "existing directory",
			    allow_dir, strerror(errno));
			moat_mcp_session_free(s);
			return MOAT_INVALID_ARGUMENT;
		}
		if (stat(s->allow_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
			*errmsg = moat_asprintf("--allow-dir %s is not a "
			                        "directory",
			    allow_dir);
			moat_mcp_session_free(s);
			return MOAT_INVALID_ARGUMENT;
		}
	}
	*out = s;
	return MOAT_OK;

fail_oom:
	moat_mcp_session_free(s);
	*errmsg = moat_asprintf("out of memory starting an MCP session");
	return MOAT_RESOURCE_EXHAUSTED;
}

void
moat_mcp_session_free(struct moat_mcp_session *s)
{
	if (s == NULL)
		return;
	pthread_mutex_destroy(&s->lock);
	free(s->allow_dir);
	free(s->label);
	free(s);
}

void
moat_mcp_session_state(struct moat_mcp_session *s, struct moat_mcp_state *out)
{
	pthread_mutex_lock(&s->lock);
	out->initialized = s->initialized;
	snprintf(out->version, sizeof(out->version), "%s", s->version);
	snprintf(out->default_sandbox, sizeof(out->default_sandbox), "%s",
	    s->default_sandbox);
	pthread_mutex_unlock(&s->lock);
}

void
moat_mcp_session_set_state(struct moat_mcp_session *s,
    const struct moat_mcp_state *st)
{
	pthread_mutex_lock(&s->lock);
	s->initialized = st->initialized;
	snprintf(s->version, sizeof(s->version), "%s", st->version);
	snprintf(s->default_sandbox, sizeof(s->default_sandbox), "%s",
	    st->default_sandbox);
	pthread_mutex_unlock(&s->lock);
}

int
moat_mcp_session_close(struct moat_mcp_session *s, moat_mcp_call_fn call,
    void *arg)
{
	char id[MOAT_MCP_ID_MAX];
	json_t *req, *reply = NULL;
	char *errmsg = NULL;
	int rv;

	if (s == NULL)
		return MOAT_NOT_FOUND;
	pthread_mutex_lock(&s->lock);
	snprintf(id, sizeof(id), "%s", s->default_sandbox);
	s->default_sandbox[0] = '\0';
	pthread_mutex_unlock(&s->lock);
	if (id[0] == '\0')
		return MOAT_NOT_FOUND;
	if ((req = json_pack("{s:s}", "sandboxId", id)) == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	else
		rv = call(arg, "DestroySandbox", req, &reply, &errmsg);
	if (rv != MOAT_OK)
		moat_warn(0,
		    "mcp-sandbox-leaked %s: could not destroy the "
		    "MCP session's sandbox: %s: remove it with `moat sandbox "
		    "rm %s`",
		    id, errmsg ? errmsg : moat_strerror(rv), id);
	json_decref(req);
	json_decref(reply);
	free(errmsg);
	return rv;
}

json_t *
moat_mcp_error_reply(int code, const char *message)
{
	json_t *r = json_pack("{s:s, s:n, s:{s:i, s:s}}", "jsonrpc", "2.0",
	    "id", "error", "code", code, "message", message);
	char *clean;

	/* A message that quotes the input (a parse error near bytes that
	 * are not UTF-8) is sent with those bytes as '?'. */
	if (r == NULL && message != NULL &&
	    (clean = strdup(message)) != NULL) {
		for (char *p = clean; *p != '\0'; p++)
			if ((unsigned char)*p >= 0x80)
				*p = '?';
		r = json_pack("{s:s, s:n, s:{s:i, s:s}}", "jsonrpc", "2.0",
		    "id", "error", "code", code, "message", clean);
		free(clean);
	}
	return r;
}

/* error_for: an error reply to the request with `id` (borrowed). */
static json_t *
error_for(json_t *id, int code, const char *message)
{
	json_t *r = moat_mcp_error_reply(code, message);

	if (r != NULL && id != NULL)
		json_object_set(r, "id", id);
	return r;
}

/* result_for: a result reply; takes `result`. */
static json_t *
result_for(json_t *id, json_t *result)
{
	if (result == NULL)
		return error_for(id, MOAT_MCP_INTERNAL_ERROR, "out of memory");
	return json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id,
	    "result", result);
}

bool
moat_mcp_is_initialize(json_t *msg)
{
	json_t *m = json_object_get(msg, "method");

	return json_is_object(msg) && json_is_string(m) &&
	    strcmp(json_string_value(m), "initialize") == 0 &&
	    json_object_get(msg, "id") != NULL;
}

bool
moat_mcp_has_request(json_t *msg)
{
	size_t i;
	json_t *m;

	if (json_is_array(msg)) {
		json_array_foreach (msg, i, m)
			if (moat_mcp_has_request(m))
				return true;
		return false;
	}
	return json_is_object(msg) && json_object_get(msg, "method") != NULL &&
	    json_object_get(msg, "id") != NULL;
}

static json_t *
do_initialize(struct moat_mcp_session *s, json_t *params)
{
	const char *asked =
	    json_string_value(json_object_get(params, "protocolVersion"));
	const char *chosen = versions[0];

	for (size_t i = 0; asked != NULL && i < N_VERSIONS; i++)
		if (strcmp(asked, versions[i]) == 0)
			chosen = versions[i];
	pthread_mutex_lock(&s->lock);
	snprintf(s->version, sizeof(s->version), "%s", chosen);
	s->initialized = true;
	pthread_mutex_unlock(&s->lock);
	return json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s}, s:s}",
	    "protocolVersion", chosen, "capabilities", "tools", "listChanged",
	    0, "serverInfo", "name", SERVER_NAME, "version", SERVER_VERSION,
	    "instructions",
	    "moat runs code in disposable microVM sandboxes. run_code and "
	    "exec without sandbox_id use one sandbox made for this session "
	    "(recorded: history, restore and fork work on it); "
	    "sandbox_create makes more.");
}

static json_t *
do_tools_call(struct moat_mcp_session *s, json_t *id, json_t *params,
    moat_mcp_call_fn call, void *arg)
{
	const char *name = json_string_value(json_object_get(params, "name"));
	json_t *args = json_object_get(params, "arguments");
	bool host = s->allow_dir != NULL;
	char *msg;
	json_t *r;

	if (name == NULL)
		return error_for(id, MOAT_MCP_INVALID_PARAMS,
		    "tools/call "
		    "needs params.name, the tool's name (see tools/list)");
	if (!moat_mcp_tool_known(name, host)) {
		msg = moat_asprintf("unknown tool \"%s\": tools/list lists "
		                    "the tools%s",
		    name,
		    !host &&
		            (strcmp(name, "upload_file") == 0 ||
		                strcmp(name, "download_file") == 0 ||
		                strcmp(name, "upload_dir") == 0 ||
		                strcmp(name, "download_dir") == 0) ?
		        " (host file tools need `moat mcp --allow-dir DIR`)" :
		        "");
		r = error_for(id, MOAT_MCP_INVALID_PARAMS,
		    msg ? msg : "unknown tool");
		free(msg);
		return r;
	}
	if (args != NULL && !json_is_object(args) && !json_is_null(args))
		return error_for(id, MOAT_MCP_INVALID_PARAMS,
		    "params.arguments must be an object");
	if (args == NULL || json_is_null(args)) {
		json_t *empty = json_object();

		r = moat_mcp_tool_call(s, name, empty, call, arg);
		json_decref(empty);
	} else {
		r = moat_mcp_tool_call(s, name, args, call, arg);
	}
	return result_for(id, r);
}

/* handle_one: one message (not a batch). */
static json_t *
handle_one(struct moat_mcp_session *s, json_t *msg, moat_mcp_call_fn call,
    void *arg)
{
	json_t *id, *method, *params, *jv;
	const char *m;
	char *text;
	json_t *r;

	if (!json_is_object(msg))
		return error_for(NULL, MOAT_MCP_INVALID_REQUEST,
		    "a JSON-RPC message must be an object");
	id = json_object_get(msg, "id");
	method = json_object_get(msg, "method");
	jv = json_object_get(msg, "jsonrpc");
	if (method == NULL) {
		/* A response to a request we never send, or junk: neither
		 * gets an answer unless it carries an id. */
		if (id != NULL && json_object_get(msg, "result") == NULL &&
		    json_object_get(msg, "error") == NULL)
			return error_for(id, MOAT_MCP_INVALID_REQUEST,
			    "a request needs a \"method\"");
		return NULL;
	}
	if (!json_is_string(jv) || strcmp(json_string_value(jv), "2.0") != 0 ||
	    !json_is_string(method) ||
	    (id != NULL && !json_is_string(id) && !json_is_integer(id)))
		return id != NULL || !json_is_string(method) ?
		    error_for(json_is_string(id) || json_is_integer(id) ? id :
		                                                          NULL,
		        MOAT_MCP_INVALID_REQUEST,
		        "not a JSON-RPC 2.0 "
		        "request: it needs \"jsonrpc\": \"2.0\", a string "
		        "\"method\" and a string or integer \"id\"") :
		    NULL;
	m = json_string_value(method);
	params = json_object_get(msg, "params");
	if (params != NULL && !json_is_object(params) && !json_is_null(params))
		return id == NULL ? NULL :
		                    error_for(id, MOAT_MCP_INVALID_PARAMS,
		                        "params must be an object");
	if (id == NULL)
		return NULL; /* notifications/initialized, cancelled, ... */
	if (strcmp(m, "initialize") == 0)
		return result_for(id, do_initialize(s, params));
	if (strcmp(m, "ping") == 0)
		return result_for(id, json_object());
	if (strcmp(m, "tools/list") == 0)
		return result_for(id,
		    json_pack("{s:o}", "tools",
		        moat_mcp_tools_list(s->allow_dir != NULL)));
	if (strcmp(m, "tools/call") == 0)
		return do_tools_call(s, id, params, call, arg);
	text = moat_asprintf("method \"%s\" is not offered: this server has "
	                     "initialize, ping, tools/list and tools/call",
	    m);
	r = error_for(id, MOAT_MCP_METHOD_NOT_FOUND,
	    text ? text : "method not found");
	free(text);
	return r;
}

json_t *
moat_mcp_handle(struct moat_mcp_session *s, json_t *msg, moat_mcp_call_fn call,
    void *arg)
{
	json_t *replies, *m, *r;
	size_t i;

	if (!json_is_array(msg))
		return handle_one(s, msg, call, arg);
	if (json_array_size(msg) == 0)
		return error_for(NULL, MOAT_MCP_INVALID_REQUEST,
		    "an empty batch");
	if ((replies = json_array()) == NULL)
		return NULL;
	json_array_foreach (msg, i, m) {
		if ((r = handle_one(s, m, call, arg)) != NULL)
			json_array_append_new(replies, r);
	}
	if (json_array_size(replies) == 0) {
		json_decref(replies);
		return NULL;
	}
	return replies;
}

char *
moat_mcp_handle_text(struct moat_mcp_session *s, const char *text, size_t len,
    moat_mcp_call_fn call, void *arg)
{
	json_error_t jerr;
	json_t *msg, *reply;
	char *out, *emsg;

	msg = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
	    &jerr);
	if (msg == NULL) {
		emsg = moat_asprintf("malformed JSON at line %d column %d: "
		                     "%s",
		    jerr.line, jerr.column, jerr.text);
		reply = moat_mcp_error_reply(MOAT_MCP_PARSE_ERROR,
		    emsg ? emsg : "malformed JSON");
		free(emsg);
	} else {
		reply = moat_mcp_handle(s, msg, call, arg);
		json_decref(msg);
	}
	if (reply == NULL)
		return NULL;
	out = json_dumps(reply, JSON_COMPACT);
	json_decref(reply);
	return out;
}

int
moat_mcp_decode_request(const ProtobufCServiceDescriptor *service,
    const char *method, json_t *request, const ProtobufCMethodDescriptor **md,
    ProtobufCMessage **req, char **errmsg)
{
	*req = NULL;
	*md =
	    protobuf_c_service_descriptor_get_method_by_name(service, method);
	if (*md == NULL) {
		*errmsg = moat_asprintf("%s has no method %s", service->name,
		    method);
		return MOAT_NOT_FOUND;
	}
	return moat_codec_from_json((*md)->input, request, 0, req, errmsg);
}

uint32_t
moat_mcp_timeout_ms(const char *method, json_t *request)
{
	json_int_t t =
	    json_integer_value(json_object_get(request, "timeoutMs"));

	if (strcmp(method, "RunCode") == 0 || strcmp(method, "Exec") == 0)
		return t > 0 && t < 86400000 ? (uint32_t)t + 60000 : 600000;
	if (strcmp(method, "CreateSandbox") == 0 ||
	    strcmp(method, "RestoreStep") == 0 ||
	    strcmp(method, "Fork") == 0 ||
	    strcmp(method, "SnapshotSandbox") == 0)
		return 300000;
	return 30000;
}
