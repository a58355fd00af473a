/*
 * lifetime_rules.c: the expiry rules of sandbox lifetimes
 * (lifetime_rules.h). Pure. Not for: the thread or the RPC (lifetime.c).
 */
#include <stddef.h>

#include "moat/status.h"
#include "lifetime_rules.h"

/* ---- the rules (pure) ---- */

void
vmd_lifetime_init(struct vmd_lifetime *lt, uint32_t timeout_s, uint32_t idle_s,
    uint64_t now_ms)
{
	lt->expires_unix_ms =
	    timeout_s > 0 ? now_ms + (uint64_t)timeout_s * 1000u : 0;
	lt->idle_timeout_s = idle_s;
	lt->last_active_unix_ms = now_ms;
}

enum vmd_expiry
vmd_lifetime_due(const struct vmd_lifetime *lt, bool busy, uint64_t now_ms)
{
	uint64_t last =
	    __atomic_load_n(&lt->last_active_unix_ms, __ATOMIC_RELAXED);

	if (lt->expires_unix_ms != 0 && now_ms >= lt->expires_unix_ms)
		return VMD_EXPIRY_TIMEOUT;
	if (lt->idle_timeout_s != 0 && !busy &&
	    now_ms >= last + (uint64_t)lt->idle_timeout_s * 1000u)
		return VMD_EXPIRY_IDLE;
	return VMD_EXPIRY_NONE;
}

void
vmd_lifetime_set(struct vmd_lifetime *lt, uint32_t timeout_s, uint32_t idle_s,
    bool clear_idle, uint64_t now_ms)
{
	if (timeout_s > 0)
		lt->expires_unix_ms = now_ms + (uint64_t)timeout_s * 1000u;
	if (idle_s > 0)
		lt->idle_timeout_s = idle_s;
	else if (clear_idle)
		lt->idle_timeout_s = 0;
	__atomic_store_n(&lt->last_active_unix_ms, now_ms, __ATOMIC_RELAXED);
}

int
vmd_lifetime_check_request(uint32_t timeout_s, uint32_t idle_s,
    bool clear_idle, const char **why)
{
	*why = NULL;
	if (idle_s > 0 && clear_idle)
		*why = "idle_timeout_s and clear_idle_timeout contradict "
		       "each other: send one";
	else if (timeout_s == 0 && idle_s == 0 && !clear_idle)
		*why = "SetTimeout changes nothing: give timeout_s (seconds "
		       "from now), idle_timeout_s or clear_idle_timeout";
	return *why ? MOAT_INVALID_ARGUMENT : MOAT_OK;
}

const char *
vmd_expiry_name(enum vmd_expiry e)
{
	switch (e) {
	case VMD_EXPIRY_TIMEOUT:
		return "timeout";
	case VMD_EXPIRY_IDLE:
		return "idle timeout";
	default:
		return "none";
	}
}

void
vmd_lifetime_touch(struct vmd_lifetime *lt, uint64_t now_ms)
{
	__atomic_store_n(&lt->last_active_unix_ms, now_ms, __ATOMIC_RELAXED);
}
