/*
 * mcp_store.c: /mcp's sessions kept in moat-sessiond (issue 15), the
 * moat_mcp_http_store of mcp_http.c: the caller's tenant from its API key
 * (MOAT_GW_DEFAULT_TENANT when keys are off), then PutMcpSession,
 * GetMcpSession or DeleteMcpSession. The record carries the SHA-256 of the
 * Authorization header, never the key.
 * Not for: the session table and the protocol (mcp_http.c, lib/mcp/).
 */
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "gateway.h"
#include "http.h"
#include "mcp_http.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define MCP_STORE_MS 3000 /* one sessiond call at most */

/* tenant_of: the tenant whose key is in the Authorization header value
 * `authz` ("": none). */
static int
tenant_of(struct moat_gateway *gw, const char *authz,
    char tenant[MOAT_AUTH_TENANT_MAX], char **errmsg)
{
	char key_id[MOAT_AUTH_KEY_ID_LEN + 1];
	const char *key;
	int rv;

	if ((rv = moat_http_bearer_key(authz[0] != '\0' ? authz : NULL, &key,
	         errmsg)) != MOAT_OK)
		return rv;
	rv = moat_gateway_check_key(gw, key, key_id, tenant);
	if (rv != MOAT_OK && *errmsg == NULL)
		*errmsg = moat_asprintf("the caller's API key: %s",
		    moat_strerror(rv));
	return rv;
}

static int
copy_in(const Moat__V1__McpSessionRecord *r, struct moat_mcp_http_record *out)
{
	memset(out, 0, sizeof(*out));
	if (strlen(r->id) >= sizeof(out->id) ||
	    strlen(r->authz_sha256) >= sizeof(out->authz_sha256) ||
	    strlen(r->version) >= sizeof(out->state.version) ||
	    strlen(r->default_sandbox) >= sizeof(out->state.default_sandbox))
		return MOAT_INTERNAL;
	snprintf(out->id, sizeof(out->id), "%s", r->id);
	snprintf(out->authz_sha256, sizeof(out->authz_sha256), "%s",
	    r->authz_sha256);
	snprintf(out->state.version, sizeof(out->state.version), "%s",
	    r->version);
	snprintf(out->state.default_sandbox,
	    sizeof(out->state.default_sandbox), "%s", r->default_sandbox);
	out->state.initialized = r->initialized;
	out->used_unix_ms = r->used_unix_ms;
	return MOAT_OK;
}

/* get_or_delete: GetMcpSession, or DeleteMcpSession (`method`). */
static int
get_or_delete(struct moat_gateway *gw, const char *method, const char *authz,
    const char *id, struct moat_mcp_http_record *out, char **errmsg)
{
	Moat__V1__GetMcpSessionRequest req =
	    MOAT__V1__GET_MCP_SESSION_REQUEST__INIT;
	Moat__V1__McpSessionRecord *r = NULL;
	char tenant[MOAT_AUTH_TENANT_MAX];
	int rv;

	*errmsg = NULL;
	if ((rv = tenant_of(gw, authz, tenant, errmsg)) != MOAT_OK)
		return rv;
	req.tenant = tenant;
	req.id = (char *)id;
	if ((rv = moat_record_sessiond(moat_gateway_record(gw), method,
	         &req.base, &moat__v1__mcp_session_record__descriptor,
	         (ProtobufCMessage **)&r, moat_rpc_now_ms() + MCP_STORE_MS,
	         errmsg)) != MOAT_OK)
		return rv;
	rv = out != NULL ? copy_in(r, out) : MOAT_OK;
	moat__v1__mcp_session_record__free_unpacked(r, NULL);
	return rv;
}

static int
store_get(void *arg, const char *authz, const char *id,
    struct moat_mcp_http_record *out, char **errmsg)
{
	return get_or_delete(arg, "GetMcpSession", authz, id, out, errmsg);
}

static int
store_del(void *arg, const char *authz, const char *id, char **errmsg)
{
	return get_or_delete(arg, "DeleteMcpSession", authz, id, NULL, errmsg);
}

static int
store_put(void *arg, const char *authz, const struct moat_mcp_http_record *rec,
    char **errmsg)
{
	struct moat_gateway *gw = arg;
	Moat__V1__PutMcpSessionRequest req =
	    MOAT__V1__PUT_MCP_SESSION_REQUEST__INIT;
	Moat__V1__McpSessionRecord r = MOAT__V1__MCP_SESSION_RECORD__INIT;
	Moat__V1__McpSessionRecord *out = NULL;
	char tenant[MOAT_AUTH_TENANT_MAX];
	int rv;

	*errmsg = NULL;
	if ((rv = tenant_of(gw, authz, tenant, errmsg)) != MOAT_OK)
		return rv;
	r.id = (char *)rec->id;
	r.tenant = tenant;
	r.authz_sha256 = (char *)rec->authz_sha256;
	r.version = (char *)rec->state.version;
	r.initialized = rec->state.initialized;
	r.default_sandbox = (char *)rec->state.default_sandbox;
	req.session = &r;
	req.tenant = tenant;
	if ((rv = moat_record_sessiond(moat_gateway_record(gw),
	         "PutMcpSession", &req.base,
	         &moat__v1__mcp_session_record__descriptor,
	         (ProtobufCMessage **)&out, moat_rpc_now_ms() + MCP_STORE_MS,
	         errmsg)) != MOAT_OK)
		return rv;
	moat__v1__mcp_session_record__free_unpacked(out, NULL);
	return MOAT_OK;
}

bool
moat_gateway_mcp_store(struct moat_gateway *gw,
    struct moat_mcp_http_store *out)
{
	if (gw == NULL || moat_gateway_record(gw)->sessiond == NULL)
		return false;
	out->get = store_get;
	out->put = store_put;
	out->del = store_del;
	out->arg = gw;
	return true;
}
