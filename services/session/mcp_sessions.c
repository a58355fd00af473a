/*
 * mcp_sessions.c: the MCP sessions of every gateway's /mcp door (issue
 * 15), so a client behind a load balancer keeps its session, and its
 * session's sandbox, whichever gateway answers. A gateway puts a session
 * when it is initialized and whenever its state changes (protocol
 * version, default sandbox), and at most every minute while it is used;
 * a gateway that gets a session id it does not hold asks for it. Records
 * (McpSessionRecord) live in their own LMDB environment
 * (<state>/sessiond-mcp): "mcp" (id -> record) and "mcp_age" (used ms,
 * 8 bytes, then id -> nothing), swept from the oldest on every put: idle
 * longer than [sessiond] mcp-session-ttl-s, or past mcp-sessions-max. A
 * dropped session's sandbox is left to its own lifetime (its timeout).
 * Not for: the protocol or the gateway's local table (gateway/mcp_http.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

#define DB_MCP "mcp"
#define DB_AGE "mcp_age"
#define MCP_MAP_BYTES (256ull << 20)
#define ID_LEN 32
#define HASH_LEN 64
#define VERSION_MAX 15

const char *const sessiond_mcp_dbs[] = { DB_MCP, DB_AGE, NULL };

int
sessiond_mcp_open(struct sessiond *sd, const char *state_dir, char **errmsg)
{
	return sessiond_env_open(&sd->mcp, state_dir, "sessiond-mcp",
	    MCP_MAP_BYTES, sessiond_mcp_dbs, errmsg);
}

static bool
hex_of(const char *s, size_t len)
{
	return s != NULL && strlen(s) == len &&
	    strspn(s, "0123456789abcdef") == len;
}

static int
check_id(struct moat_rpc_call *call, const char *id)
{
	if (!hex_of(id, ID_LEN))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "id \"%.40s\" is not an MCP session id (32 lowercase hex "
		    "characters, the Mcp-Session-Id header)",
		    id ? id : "");
	return MOAT_OK;
}

static int
check_record(struct moat_rpc_call *call, const Moat__V1__McpSessionRecord *r)
{
	int rv;

	if (r == NULL)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "session is required: the MCP session to store");
	if ((rv = sessiond_check_tenant(call, r->tenant)) != MOAT_OK ||
	    (rv = check_id(call, r->id)) != MOAT_OK)
		return rv;
	if (!hex_of(r->authz_sha256, HASH_LEN))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "authz_sha256 must be 64 lowercase hex characters (the "
		    "SHA-256 of the session's Authorization header)");
	if (strlen(r->version) > VERSION_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "version is over %d characters: an MCP protocol version "
		    "is a date such as 2025-06-18",
		    VERSION_MAX);
	return sessiond_check_short(call, "default_sandbox",
	    r->default_sandbox, SESSIOND_MAX_SANDBOX);
}

/* load: the record of `id` in *out (heap), NOT_FOUND when absent or not
 * readable. */
static int
load(struct moat_store_txn *txn, const char *id,
    Moat__V1__McpSessionRecord **out, char **errmsg)
{
	const void *val;
	size_t vlen;
	int rv;

	*out = NULL;
	if ((rv = moat_store_get(txn, DB_MCP, id, ID_LEN, &val, &vlen,
	         errmsg)) != MOAT_OK)
		return rv;
	*out = moat__v1__mcp_session_record__unpack(NULL, vlen, val);
	return *out != NULL ? MOAT_OK : MOAT_NOT_FOUND;
}

/* copy_out: `r` into the reply `out` (heap strings). */
static int
copy_out(const Moat__V1__McpSessionRecord *r, Moat__V1__McpSessionRecord *out)
{
	out->id = strdup(r->id);
	out->tenant = strdup(r->tenant);
	out->authz_sha256 = strdup(r->authz_sha256);
	out->version = strdup(r->version);
	out->default_sandbox = strdup(r->default_sandbox);
	out->initialized = r->initialized;
	out->created_unix_ms = r->created_unix_ms;
	out->used_unix_ms = r->used_unix_ms;
	if (out->id == NULL || out->tenant == NULL ||
	    out->authz_sha256 == NULL || out->version == NULL ||
	    out->default_sandbox == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	return MOAT_OK;
}

/* not_found: NOT_FOUND for an unknown id, an expired one, and another
 * tenant's alike. */
static int
not_found(struct moat_rpc_call *call, const char *id)
{
	return moat_rpc_error(call, MOAT_NOT_FOUND,
	    "no MCP session %s (ended, expired, or never made): initialize "
	    "a new one",
	    id);
}

int
sessiond_h_put_mcp_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__PutMcpSessionRequest *req =
	    (const Moat__V1__PutMcpSessionRequest *)request;
	Moat__V1__McpSessionRecord r, *old = NULL;
	struct moat_store_txn *txn = NULL;
	uint64_t now = moat_now_unix_ms();
	uint8_t *packed = NULL;
	size_t len;
	char *errmsg = NULL;
	int rv;

	if ((rv = check_record(call, req->session)) != MOAT_OK)
		return rv;
	if (strcmp(req->tenant, req->session->tenant) != 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "tenant \"%.64s\" is not the session's tenant \"%.64s\"",
		    req->tenant, req->session->tenant);
	r = *req->session;
	r.used_unix_ms = now;
	if ((rv = moat_store_txn_begin(sd->mcp, true, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = load(txn, r.id, &old, &errmsg);
	if (rv == MOAT_OK && strcmp(old->tenant, r.tenant) != 0) {
		moat__v1__mcp_session_record__free_unpacked(old, NULL);
		moat_store_txn_abort(txn);
		return moat_rpc_error(call, MOAT_ALREADY_EXISTS,
		    "MCP session %s is another tenant's: a new session needs "
		    "a new random id",
		    r.id);
	}
	if (rv == MOAT_OK) {
		/* One session, made once: its creation time stays. */
		r.created_unix_ms = old->created_unix_ms;
		rv = sessiond_aged_index(txn, DB_AGE, old->used_unix_ms, r.id,
		    ID_LEN, true, &errmsg);
	} else if (rv == MOAT_NOT_FOUND) {
		r.created_unix_ms = now;
		rv = sessiond_aged_sweep(txn, DB_MCP, DB_AGE,
		    now > sd->mcp_ttl_ms ? now - sd->mcp_ttl_ms : 0,
		    sd->mcp_max, &errmsg);
	}
	if (old != NULL)
		moat__v1__mcp_session_record__free_unpacked(old, NULL);
	if (rv == MOAT_OK && (packed = sessiond_pack(&r.base, &len)) == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	if (rv == MOAT_OK)
		rv = moat_store_put(txn, DB_MCP, r.id, ID_LEN, packed, len,
		    false, &errmsg);
	if (rv == MOAT_OK)
		rv = sessiond_aged_index(txn, DB_AGE, now, r.id, ID_LEN, false,
		    &errmsg);
	free(packed);
	if (rv == MOAT_OK)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	if (rv != MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = copy_out(&r, (Moat__V1__McpSessionRecord *)reply);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, NULL);
}

/* get_or_delete: GetMcpSession, or with `del` DeleteMcpSession. */
static int
get_or_delete(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply, bool del)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__GetMcpSessionRequest *req =
	    (const Moat__V1__GetMcpSessionRequest *)request;
	Moat__V1__McpSessionRecord *r = NULL;
	struct moat_store_txn *txn = NULL;
	uint64_t now = moat_now_unix_ms();
	char *errmsg = NULL;
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = check_id(call, req->id)) != MOAT_OK)
		return rv;
	if ((rv = moat_store_txn_begin(sd->mcp, del, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = load(txn, req->id, &r, &errmsg);
	if (rv == MOAT_OK &&
	    (strcmp(r->tenant, req->tenant) != 0 ||
	        now - r->used_unix_ms >= sd->mcp_ttl_ms))
		rv = MOAT_NOT_FOUND; /* another tenant's, or expired */
	if (rv == MOAT_OK && del) {
		rv = moat_store_del(txn, DB_MCP, req->id, ID_LEN, &errmsg);
		if (rv == MOAT_OK)
			rv = sessiond_aged_index(txn, DB_AGE, r->used_unix_ms,
			    req->id, ID_LEN, true, &errmsg);
		if (rv == MOAT_OK)
			rv = moat_store_txn_commit(txn, &errmsg);
		else
			moat_store_txn_abort(txn);
	} else {
		moat_store_txn_abort(txn);
	}
	if (rv == MOAT_OK)
		rv = copy_out(r, (Moat__V1__McpSessionRecord *)reply);
	if (r != NULL)
		moat__v1__mcp_session_record__free_unpacked(r, NULL);
	if (rv == MOAT_NOT_FOUND) {
		free(errmsg);
		return not_found(call, req->id);
	}
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}

int
sessiond_h_get_mcp_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	return get_or_delete(call, request, reply, false);
}

int
sessiond_h_delete_mcp_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	return get_or_delete(call, request, reply, true);
}
