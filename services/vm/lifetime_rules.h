/*
 * lifetime_rules.h: the expiry rules of sandbox lifetimes (issue 15) as
 * pure functions over one sandbox's struct vmd_lifetime (kept in struct
 * sandbox): a timeout (destroyed at expires_unix_ms) and an idle timeout
 * (destroyed idle_timeout_s after the last call; a running exec counts as
 * a call). No sandbox, no clock, no locks: unit-tested. Not for: the
 * expiry thread and SetTimeout (lifetime.h).
 */
#ifndef MOAT_VMD_LIFETIME_RULES_H
#define MOAT_VMD_LIFETIME_RULES_H

#include <stdbool.h>
#include <stdint.h>

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

/* vmd_lifetime_touch: a call at now_ms (atomic: no lock needed). */
void vmd_lifetime_touch(struct vmd_lifetime *lt, uint64_t now_ms);

#endif
