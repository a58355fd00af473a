/*
 * ratelimit.h: token buckets by name for the gateway's HTTP door
 * (http.c): one bucket per client address and one per API key, each
 * refilled at `rps` tokens a second up to `burst`. A request takes one
 * token; with none left it is refused and told how many seconds until
 * one is back (HTTP 429 with Retry-After). The table has a fixed number
 * of slots: a name seen for the first time takes a free slot or the
 * least recently used one among those it may hash to (a bucket that has
 * refilled is the same as a new one), so memory stays bounded whatever
 * names callers send. Not for: connection counts (libmicrohttpd's
 * per-address limit does those) or the nng door.
 */
#ifndef MOAT_GATEWAY_RATELIMIT_H
#define MOAT_GATEWAY_RATELIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOAT_RATELIMIT_RPS 50           /* [gateway] rate-limit-rps */
#define MOAT_RATELIMIT_BURST 100        /* [gateway] rate-limit-burst */
#define MOAT_RATELIMIT_SLOTS 4096       /* buckets kept at once */
#define MOAT_RATELIMIT_NAME_MAX 64      /* bytes of a name kept, with NUL */
#define MOAT_HTTP_MAX_CONNS_PER_ADDR 64 /* [gateway] max-conns-per-addr */

struct moat_ratelimit;

/* moat_ratelimit_new: a table of `slots` buckets (at least 16) of `rps`
 * tokens a second (0: no limit; every take succeeds) and `burst` tokens
 * at most (0: rps). On success *out is the caller's
 * (moat_ratelimit_free); NULL when out of memory. */
struct moat_ratelimit *moat_ratelimit_new(uint32_t rps, uint32_t burst,
    size_t slots);

/* moat_ratelimit_free: safe on NULL. */
void moat_ratelimit_free(struct moat_ratelimit *rl);

/* moat_ratelimit_take: takes one token of `name`'s bucket (a new bucket
 * is full) at `now_ms` (any monotonic clock, never going back). True
 * when there was one; false otherwise, with *retry_after_s (may be NULL)
 * the whole seconds (at least 1) until there is. Names longer than
 * MOAT_RATELIMIT_NAME_MAX - 1 bytes are cut. Thread-safe. */
bool moat_ratelimit_take(struct moat_ratelimit *rl, const char *name,
    uint64_t now_ms, uint32_t *retry_after_s);

/* moat_ratelimit_take_rate: moat_ratelimit_take with the bucket's rate
 * given here rather than the table's (per-tenant limits: [tenants]
 * key-rps / key-burst): `rps` tokens a second (0: no limit) up to
 * `burst` (0: rps). A bucket that exists takes the new rate. */
bool moat_ratelimit_take_rate(struct moat_ratelimit *rl, const char *name,
    uint32_t rps, uint32_t burst, uint64_t now_ms, uint32_t *retry_after_s);

/* moat_ratelimit_refused: how many takes were refused so far. */
uint64_t moat_ratelimit_refused(struct moat_ratelimit *rl);

#endif
