/*
 * rpc_tenant.c: the tenant a tenant-scoped call acts for (rpc_tenant.h):
 * Envelope.tenant or the request's own field, which must agree, and never
 * empty. Not for: checking that an object belongs to it (each service
 * does, answering NOT_FOUND for another tenant's).
 */
#include <string.h>

#include "moat/rpc_tenant.h"
#include "moat/status.h"

int
moat_rpc_tenant(struct moat_rpc_call *call, const char *field,
    const char **out)
{
	const char *env = call->tenant != NULL ? call->tenant : "";
	const char *req = field != NULL ? field : "";

	*out = NULL;
	if (env[0] != '\0' && req[0] != '\0' && strcmp(env, req) != 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%s: the request names tenant \"%.80s\" but the call acts "
		    "for tenant \"%.80s\": a call acts for one tenant; leave "
		    "the request's tenant empty or make them equal",
		    call->method, req, env);
	*out = env[0] != '\0' ? env : req;
	if ((*out)[0] == '\0') {
		*out = NULL;
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "tenant is required: %s acts for one tenant; set "
		    "Envelope.tenant (moat_rpc_opts.tenant; the gateway "
		    "does this for every call it forwards)",
		    call->method);
	}
	return MOAT_OK;
}
