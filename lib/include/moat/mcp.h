/*
 * mcp.h: moat's Model Context Protocol server, the one implementation
 * both transports share: `moat mcp` (stdio, clients/cli/cmd_mcp.c) and
 * the gateway's Streamable HTTP door at /mcp (gateway/mcp_http.c).
 * mcp.c speaks JSON-RPC 2.0 (initialize with version negotiation, ping,
 * tools/list, tools/call, notifications); tools.c defines the tools and
 * runs each as Gateway methods through the caller's `moat_mcp_call_fn`,
 * which takes and returns proto3 JSON (moat/codec.h), so the library
 * never knows whether a call crosses nng or stays in process.
 * Not for: transports (framing, HTTP headers, session ids) or auth: the
 * callback carries the caller's credentials.
 */
#ifndef MOAT_MCP_H
#define MOAT_MCP_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Newest first; initialize answers with the client's version when it is
 * one of these, else the first. */
#define MOAT_MCP_VERSIONS                                                     \
	{                                                                     \
		"2025-06-18", "2025-03-26", "2024-11-05"                      \
	}
#define MOAT_MCP_MAX_MESSAGE (8u << 20)    /* bytes of one JSON-RPC message */
#define MOAT_MCP_MAX_HOST_FILE (64u << 20) /* upload_file/download_file */

/* JSON-RPC error codes. */
#define MOAT_MCP_PARSE_ERROR -32700
#define MOAT_MCP_INVALID_REQUEST -32600
#define MOAT_MCP_METHOD_NOT_FOUND -32601
#define MOAT_MCP_INVALID_PARAMS -32602
#define MOAT_MCP_INTERNAL_ERROR -32603

/* moat_mcp_call_fn: runs Gateway method `method` (its name in
 * gateway.proto, "RunCode") with `request`, the input message as proto3
 * JSON (borrowed). On MOAT_OK *reply is the output message as proto3 JSON
 * (a new reference the library releases). Otherwise returns a moat status
 * and sets *errmsg (heap, the library frees) to the gateway's message.
 * May be called from any thread the library is called on. */
typedef int (*moat_mcp_call_fn)(void *arg, const char *method, json_t *request,
    json_t **reply, char **errmsg);

struct moat_mcp_session;

#define MOAT_MCP_ID_MAX 128 /* longest sandbox id, with its NUL */

/* moat_mcp_session_new: one MCP session (one client connection). Host
 * file tools (upload_file, download_file) are offered only when
 * `allow_dir` is not NULL; it is resolved here (realpath) and must be a
 * directory. `label` (may be NULL) is set as the label "mcp-session" of
 * the default sandbox. On MOAT_OK *out is the caller's
 * (moat_mcp_session_free); otherwise *errmsg (heap, caller frees). */
int moat_mcp_session_new(struct moat_mcp_session **out, const char *allow_dir,
    const char *label, char **errmsg) __attribute__((warn_unused_result));

/* The part of a session that outlives one process: what a gateway keeps
 * in moat-sessiond so another gateway can go on with the session. */
struct moat_mcp_state {
	bool initialized;
	char version[16];                      /* the negotiated version */
	char default_sandbox[MOAT_MCP_ID_MAX]; /* "": none yet */
};

/* moat_mcp_session_state / moat_mcp_session_set_state: read or replace
 * a session's state. Thread-safe. */
void moat_mcp_session_state(struct moat_mcp_session *s,
    struct moat_mcp_state *out);
void moat_mcp_session_set_state(struct moat_mcp_session *s,
    const struct moat_mcp_state *st);

/* moat_mcp_session_free: frees. Does not destroy the default sandbox
 * (moat_mcp_session_close does). Safe on NULL. */
void moat_mcp_session_free(struct moat_mcp_session *s);

/* moat_mcp_session_close: destroys the sandbox run_code and the other
 * tools created for this session when given no sandbox_id, if any,
 * through `call`. Returns MOAT_OK when it was destroyed, NOT_FOUND when
 * the session had none, else DestroySandbox's status (logged as
 * mcp-sandbox-leaked; the sandbox is forgotten either way). Thread-safe. */
int moat_mcp_session_close(struct moat_mcp_session *s, moat_mcp_call_fn call,
    void *arg);

/* moat_mcp_handle: handles one JSON-RPC message (a request, a
 * notification, a response, or a batch of them) in `msg` (borrowed).
 * Returns the reply to send (a new reference, caller releases), or NULL
 * when nothing is to be sent (notifications and responses). Calls the
 * gateway through `call`. Thread-safe: several calls of one session may
 * run at once. */
json_t *moat_mcp_handle(struct moat_mcp_session *s, json_t *msg,
    moat_mcp_call_fn call, void *arg);

/* moat_mcp_handle_text: the same from `len` bytes of text; malformed
 * JSON gets the -32700 error reply. Returns heap text (compact, no
 * newline) the caller frees, or NULL when nothing is to be sent. */
char *moat_mcp_handle_text(struct moat_mcp_session *s, const char *text,
    size_t len, moat_mcp_call_fn call, void *arg);

/* moat_mcp_error_reply: {"jsonrpc":"2.0","id":null,"error":{code,
 * message}} as a new reference (NULL when out of memory). */
json_t *moat_mcp_error_reply(int code, const char *message);

/* moat_mcp_is_initialize: whether `msg` is an initialize request. */
bool moat_mcp_is_initialize(json_t *msg);

/* moat_mcp_has_request: whether `msg` (or a batch) holds a request (a
 * message with a method and an id), which needs a reply. */
bool moat_mcp_has_request(json_t *msg);

/* moat_mcp_decode_request: the codec's half of a moat_mcp_call_fn, for
 * transports that move messages: decodes `request` into the input of
 * `method` of `service` (*req, heap, caller frees with
 * protobuf_c_message_free_unpacked) and gives its method descriptor.
 * INVALID_ARGUMENT or NOT_FOUND with *errmsg (heap) otherwise. */
int moat_mcp_decode_request(const ProtobufCServiceDescriptor *service,
    const char *method, json_t *request, const ProtobufCMethodDescriptor **md,
    ProtobufCMessage **req, char **errmsg) __attribute__((warn_unused_result));

/* moat_mcp_timeout_ms: how long a transport lets Gateway method `method`
 * with `request` (borrowed) run: a boot, restore or fork minutes, a run
 * its own timeout and a margin, anything else 30 s. */
uint32_t moat_mcp_timeout_ms(const char *method, json_t *request);

/* ---- tools.c, for mcp.c and the tests ---- */

/* moat_mcp_tools_list: the tools as the "tools" array of tools/list (a
 * new reference), the host file tools included when `host_files`. */
json_t *moat_mcp_tools_list(bool host_files);

/* moat_mcp_tool_known: whether `name` is a tool of this session. */
bool moat_mcp_tool_known(const char *name, bool host_files);

/* moat_mcp_tool_call: runs tool `name` (known) with `args` (an object,
 * borrowed) and returns its CallToolResult (a new reference): content,
 * isError, structuredContent where natural. */
json_t *moat_mcp_tool_call(struct moat_mcp_session *s, const char *name,
    json_t *args, moat_mcp_call_fn call, void *arg);

/* moat_mcp_host_path: resolves `path` (relative to `allow_dir`, or
 * absolute) for reading (`must_exist`) or for creating a file, refusing
 * any path that leaves allow_dir (a resolved real path) through "..",
 * a symlink or an absolute path elsewhere. On MOAT_OK *out is a heap
 * real path (caller frees); otherwise PERMISSION_DENIED, NOT_FOUND or
 * INVALID_ARGUMENT with *errmsg (heap). */
int moat_mcp_host_path(const char *allow_dir, const char *path,
    bool must_exist, char **out, char **errmsg)
    __attribute__((warn_unused_result));

#endif
