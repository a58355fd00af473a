/*
 * lifetime.h: sandbox lifetimes (issue 15): a timeout (the sandbox is
 * destroyed at expires_unix_ms) and an idle timeout (destroyed
 * idle_timeout_s after its last call; a running exec counts as a call).
 * The rules are pure functions (unit-tested); one thread per vmd checks
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
#include "vm.pb-c.h"

struct vmd;
struct sandbox;

/* One sandbox's lifetime. expires and idle under sb->mu; last_active
 * read and written with atomics (every call touches it). */
struct vmd_lifetime {
	uint64_t expires_unix_ms;     /* 0: never */
	uint32_t idle_timeout_s;      /* 0: none */
	uint64_t last_active_unix_ms; /* the last call (or running exec) */
};

enum vmd_expiry {
	VMD_EXPIRY_NONE,
	VMD_EXPIRY_TIMEOUT, /* expires_unix_ms passed */
	VMD_EXPIRY_IDLE,    /* idle_timeout_s without a call */
};

/* vmd_lifetime_init: a new sandbox's lifetime at `now_ms`: expires
 * timeout_s from now (0: never), idle timeout idle_s (0: none). */
void vmd_lifetime_init(struct vmd_lifetime *lt, uint32_t timeout_s,
    uint32_t idle_s, uint64_t now_ms);

/* vmd_lifetime_due: whether lt is over at now_ms; `busy` (an exec runs)
 * keeps an idle timeout from firing, never the timeout. */
enum vmd_expiry vmd_lifetime_due(const struct vmd_lifetime *lt, bool busy,
    uint64_t now_ms);

/* vmd_lifetime_set: SetTimeout's rules: timeout_s > 0 moves the expiry
 * to timeout_s from now (0 leaves it); idle_s > 0 sets the idle timeout,
 * clear_idle removes it (neither: left). Counts as activity. */
void vmd_lifetime_set(struct vmd_lifetime *lt, uint32_t timeout_s,
    uint32_t idle_s, bool clear_idle, uint64_t now_ms);

/* vmd_lifetime_check_request: SetTimeout's request is sensible: 0, or
 * INVALID_ARGUMENT with *why (static) saying what to send instead. */
int vmd_lifetime_check_request(uint32_t timeout_s, uint32_t idle_s,
    bool clear_idle, const char **why);

/* vmd_expiry_name: "timeout", "idle timeout" or "none". */
const char *vmd_expiry_name(enum vmd_expiry e);

/* vmd_lifetime_touch: a call on sb now (atomic; no lock needed). */
void vmd_lifetime_touch(struct sandbox *sb);

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
