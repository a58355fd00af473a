/*
 * sandbox_create.h: CreateSandbox (sandbox_create.c). Not for: restores
 * (sandbox_restore.h) or the template builder's own boots
 * (sandbox_boot.h).
 */
#ifndef MOAT_VMD_SANDBOX_CREATE_H
#define MOAT_VMD_SANDBOX_CREATE_H

#include "moat/rpc.h"
#include "vm.pb-c.h"

struct sandbox;
struct vmd;

/* vmd_sandbox_create: validates `req`, boots a sandbox and waits for its
 * agent; with [vmd] templates and no req->cold_boot, a clone of the
 * template of its shape when there is one (Sandbox.template_id), and
 * after a cold boot the template is made in the background. On success
 * *out holds a reference (vmd_sandbox_put). On failure returns a status
 * after moat_rpc_error(call, ...); nothing is left. */
int vmd_sandbox_create(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, struct sandbox **out)
    __attribute__((warn_unused_result));

#endif
