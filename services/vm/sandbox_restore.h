/*
 * sandbox_restore.h: RestoreSandbox, also in place
 * (sandbox_restore.c). Not for: taking snapshots (snapshot.h).
 */
#ifndef MOAT_VMD_SANDBOX_RESTORE_H
#define MOAT_VMD_SANDBOX_RESTORE_H

#include "moat/rpc.h"
#include "vm.pb-c.h"

struct sandbox;
struct vmd;

/* vmd_sandbox_restore: a new sandbox (a clone) from local snapshot
 * req->snapshot_id: same contract as vmd_sandbox_create. With
 * req->replace_sandbox_id the clone takes over that sandbox's id (same
 * tenant, else NOT_FOUND) and the old VM is stopped once the new one
 * runs; on failure the old one is left as it was. With
 * req->keep_sandbox_id (a drain) the clone takes that id (INVALID_ARGUMENT
 * when it is not a sandbox id, ALREADY_EXISTS when a sandbox here has it). */
int vmd_sandbox_restore(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct sandbox **out)
    __attribute__((warn_unused_result));

#endif
