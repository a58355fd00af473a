/*
 * lifetime.h: sandbox lifetimes (issue 15): a timeout (the sandbox is
 * destroyed at expires_unix_ms) and an idle timeout (destroyed
 * idle_timeout_s after its last call; a running exec counts as a call).
 * The rules are pure functions (lifetime_rules.h); one thread per vmd checks
 * every sandbox a few times a second and destroys the ones that are due
 * (only the sandbox: its sessions and snapshots stay), logging and
 * counting each (moat_vmd_sandboxes_expired_total). SetTimeout changes
 * them; both persist in the sandbox's state file (adopt.h), so a
 * restarted vmd keeps them. Not for: the tenant defaults and maximum
 * (the gateway's [tenants] timeout-s, timeout-max-s, idle-timeout-s).
 */
#ifndef MOAT_VMD_LIFETIME_H
#define MOAT_VMD_LIFETIME_H

#include <stdbool.h>
#include <stdint.h>

#include "moat/rpc.h"
#include "lifetime_rules.h"
#include "vm.pb-c.h"

struct vmd;
struct sandbox;

/* vmd_lifetime_start: the expiry thread. Call after re-adoption (a
 * sandbox that expired while vmd was down goes on the first pass).
 * Returns 0 or an errno value (then nothing expires: logged). */
int vmd_lifetime_start(struct vmd *vmd);

/* vmd_lifetime_stop: joins the thread; safe when never started. Call
 * before sandboxes are detached or destroyed at shutdown. */
void vmd_lifetime_stop(struct vmd *vmd);

/* vmd_lifetime_set_timeout: the SetTimeout RPC: the caller's tenant's
 * sandbox gets req's lifetime (persisted); *reply is the sandbox. */
int vmd_lifetime_set_timeout(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SetTimeoutRequest *req, Moat__V1__Sandbox *reply)
    __attribute__((warn_unused_result));

#endif
