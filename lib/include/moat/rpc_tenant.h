/*
 * rpc_tenant.h: the one rule by which vmd, sessiond and snapd learn whom
 * a tenant-scoped call acts for. The gateway sets Envelope.tenant on
 * every call it makes for a tenant (moat_rpc_opts.tenant); some requests
 * also carry a tenant field of their own (older callers, direct use).
 * Either names the tenant; when both are set they must agree; when
 * neither is, the call is refused: an empty tenant never means "all
 * tenants" nor "default".
 *
 * Not for: the gateway's API keys (gateway/auth.c turns a key into the
 * tenant it then sets here), or deciding what another tenant's object
 * looks like (each service answers NOT_FOUND, as for a missing one).
 */
#ifndef MOAT_RPC_TENANT_H
#define MOAT_RPC_TENANT_H

#include "moat/rpc.h"

/* moat_rpc_tenant: the tenant `call` acts for, from call->tenant and
 * `field` (the request's own tenant field; NULL or "" when it has none).
 * MOAT_OK with *out (never empty; points into call or field); otherwise
 * INVALID_ARGUMENT after moat_rpc_error: no tenant ("tenant is required:
 * ..."), or the two disagree. */
int moat_rpc_tenant(struct moat_rpc_call *call, const char *field,
    const char **out) __attribute__((warn_unused_result));

#endif
