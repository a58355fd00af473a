/*
 * lifetime.c: the gateway's half of sandbox lifetimes (issue 15): the
 * tenant's default timeout and idle timeout and its maximum ([tenants]
 * timeout-s, idle-timeout-s, timeout-max-s, each with a .<tenant> form),
 * filled into creates and restores and enforced on SetTimeout, whose
 * handler is here. The node keeps and enforces the lifetime (moat-vmd's
 * lifetime.c). Not for: placement or quotas.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "gateway.h"

#define SECTION "tenants"

int
moat_lifetime_policy(const struct moat_config *cfg, const char *tenant,
    struct moat_lifetime_policy *out, char **errmsg)
{
	int rv;

	*errmsg = NULL;
	out->timeout_s = MOAT_LIFETIME_TIMEOUT_S;
	out->timeout_max_s = MOAT_LIFETIME_TIMEOUT_MAX_S;
	out->idle_timeout_s = 0;
	if ((rv = moat_config_get_u64_for(cfg, SECTION, "timeout-s", tenant,
	         MOAT_LIFETIME_TIMEOUT_S, &out->timeout_s, errmsg)) !=
	        MOAT_OK ||
	    (rv = moat_config_get_u64_for(cfg, SECTION, "timeout-max-s",
	         tenant, MOAT_LIFETIME_TIMEOUT_MAX_S, &out->timeout_max_s,
	         errmsg)) != MOAT_OK ||
	    (rv = moat_config_get_u64_for(cfg, SECTION, "idle-timeout-s",
	         tenant, 0, &out->idle_timeout_s, errmsg)) != MOAT_OK)
		return rv;
	/* Seconds on the wire are 32-bit; a default over the maximum is
	 * the maximum. */
	if (out->timeout_max_s > UINT32_MAX)
		out->timeout_max_s = UINT32_MAX;
	if (out->timeout_s > UINT32_MAX)
		out->timeout_s = UINT32_MAX;
	if (out->idle_timeout_s > UINT32_MAX)
		out->idle_timeout_s = UINT32_MAX;
	if (out->timeout_max_s != 0 && out->timeout_s > out->timeout_max_s)
		out->timeout_s = out->timeout_max_s;
	return MOAT_OK;
}

/* over_max: INVALID_ARGUMENT with *errmsg when timeout_s is over the
 * tenant's maximum (0: none). */
static int
over_max(const struct moat_lifetime_policy *p, const char *tenant,
    uint32_t timeout_s, char **errmsg)
{
	if (p->timeout_max_s == 0 || timeout_s <= p->timeout_max_s)
		return MOAT_OK;
	*errmsg = moat_asprintf(
	    "timeout_s %" PRIu32 " is over tenant %s's maximum of %" PRIu64
	    " s ([tenants] timeout-max-s.%s, else timeout-max-s): ask for "
	    "at most %" PRIu64 " s, or raise the limit",
	    timeout_s, tenant, p->timeout_max_s, tenant, p->timeout_max_s);
	return MOAT_INVALID_ARGUMENT;
}

int
moat_lifetime_fill(const struct moat_config *cfg, const char *tenant,
    uint32_t *timeout_s, uint32_t *idle_timeout_s, char **errmsg)
{
	struct moat_lifetime_policy p;
	char *msg = NULL;
	int rv;

	*errmsg = NULL;
	if ((rv = moat_lifetime_policy(cfg, tenant, &p, &msg)) != MOAT_OK) {
		*errmsg = moat_asprintf("the gateway's [tenants] section is "
		                        "wrong: %s (fix the config)",
		    msg ? msg : "?");
		free(msg);
		return MOAT_FAILED_PRECONDITION;
	}
	if ((rv = over_max(&p, tenant, *timeout_s, errmsg)) != MOAT_OK)
		return rv;
	if (*timeout_s == 0)
		*timeout_s = (uint32_t)p.timeout_s;
	if (*idle_timeout_s == 0)
		*idle_timeout_s = (uint32_t)p.idle_timeout_s;
	return MOAT_OK;
}

int
moat_lifetime_apply(struct moat_travel *t, const struct moat_node_id *node,
    uint64_t deadline, Moat__V1__Sandbox **sb, char **errmsg)
{
	Moat__V1__SetTimeoutRequest req = MOAT__V1__SET_TIMEOUT_REQUEST__INIT;
	Moat__V1__Sandbox *out = NULL;
	uint32_t timeout_s = 0, idle_s = 0;
	int rv;

	if ((rv = moat_lifetime_fill(t->config, t->tenant, &timeout_s, &idle_s,
	         errmsg)) != MOAT_OK)
		return rv;
	if (timeout_s == 0 && idle_s == 0)
		return MOAT_OK; /* the tenant's sandboxes live until destroyed */
	req.sandbox_id = (*sb)->id;
	req.tenant = (char *)t->tenant;
	req.timeout_s = timeout_s;
	req.idle_timeout_s = idle_s;
	if ((rv = moat_forward_node_call(t->fw, node, t->tenant, "SetTimeout",
	         &req.base, &moat__v1__sandbox__descriptor,
	         moat_rpc_new_request_id(), deadline, "the restored sandbox",
	         (ProtobufCMessage **)&out, errmsg)) != MOAT_OK)
		return rv;
	/* The restore's answer stays (what the gateway added to it too);
	 * only the lifetime is the node's new one. */
	(*sb)->expires_unix_ms = out->expires_unix_ms;
	(*sb)->idle_timeout_s = out->idle_timeout_s;
	(*sb)->last_active_unix_ms = out->last_active_unix_ms;
	moat__v1__sandbox__free_unpacked(out, NULL);
	return MOAT_OK;
}

/* keepalive_default: a SetTimeout that asks nothing: the tenant's
 * default timeout from now (FAILED_PRECONDITION when it has none). */
static int
keepalive_default(struct moat_rpc_call *call, struct moat_travel *t,
    const Moat__V1__SetTimeoutRequest *req,
    const struct moat_lifetime_policy *p)
{
	Moat__V1__SetTimeoutRequest fwd = *req;
	uint8_t *payload;
	size_t len;
	int rv;

	if (p->timeout_s == 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "tenant %s has no default timeout ([tenants] timeout-s "
		    "is 0): give timeout_s (seconds from now) or "
		    "idle_timeout_s",
		    t->tenant);
	fwd.timeout_s = (uint32_t)p->timeout_s;
	len = moat__v1__set_timeout_request__get_packed_size(&fwd);
	if ((payload = malloc(len ? len : 1)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	moat__v1__set_timeout_request__pack(&fwd, payload);
	rv = moat_forward_call(t->fw, call, req->sandbox_id, payload, len);
	free(payload);
	return rv;
}

int
moat_lifetime_set_timeout(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	const Moat__V1__SetTimeoutRequest *req =
	    (const Moat__V1__SetTimeoutRequest *)request;
	struct moat_travel t;
	struct moat_lifetime_policy p;
	char *msg = NULL;
	int rv;

	(void)reply;
	moat_gateway_travel(call->service_ctx, &t);
	t.tenant = moat_gw_tenant(call);
	if (moat_lifetime_policy(t.config, t.tenant, &p, &msg) != MOAT_OK) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "the gateway's [tenants] section is wrong: %s (fix the "
		    "config)",
		    msg ? msg : "?");
		free(msg);
		return rv;
	}
	if (over_max(&p, t.tenant, req->timeout_s, &msg) != MOAT_OK) {
		rv = moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "%s", msg);
		free(msg);
		return rv;
	}
	if (req->timeout_s != 0 || req->idle_timeout_s != 0 ||
	    req->clear_idle_timeout)
		return moat_forward_call(t.fw, call, req->sandbox_id,
		    call->payload, call->payload_len);
	return keepalive_default(call, &t, req, &p);
}
