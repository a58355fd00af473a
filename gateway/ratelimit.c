/*
 * ratelimit.c: token buckets by name (ratelimit.h). Tokens are counted in
 * thousandths so refills need no floating point: `elapsed_ms * rps`
 * thousandths come back per elapsed millisecond. Names hash (FNV-1a)
 * into a window of PROBE slots; a new name takes an empty slot there, else
 * one whose bucket has refilled (the same as a new bucket), else the
 * least recently used one. One mutex; a take is a few dozen
 * instructions. Not for: connection counts.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ratelimit.h"

#define PROBE 8
#define MILLI 1000u

struct bucket {
	char name[MOAT_RATELIMIT_NAME_MAX]; /* "": empty slot */
	uint64_t tokens_m;                  /* thousandths of a token */
	uint64_t last_ms;                   /* tokens_m was right then */
	uint64_t rps, burst_m;              /* this bucket's rate */
};

struct moat_ratelimit {
	pthread_mutex_t lock;
	struct bucket *slots;
	size_t n_slots;
	uint64_t rps, burst_m;
	uint64_t refused;
};

struct moat_ratelimit *
moat_ratelimit_new(uint32_t rps, uint32_t burst, size_t slots)
{
	struct moat_ratelimit *rl = calloc(1, sizeof(*rl));

	if (slots < 16)
		slots = 16;
	if (rl == NULL ||
	    (rl->slots = calloc(slots, sizeof(*rl->slots))) == NULL) {
		free(rl);
		return NULL;
	}
	rl->n_slots = slots;
	rl->rps = rps;
	rl->burst_m = (uint64_t)(burst ? burst : rps) * MILLI;
	if (rl->burst_m < MILLI)
		rl->burst_m = MILLI;
	pthread_mutex_init(&rl->lock, NULL);
	return rl;
}

void
moat_ratelimit_free(struct moat_ratelimit *rl)
{
	if (rl == NULL)
		return;
	pthread_mutex_destroy(&rl->lock);
	free(rl->slots);
	free(rl);
}

static uint64_t
fnv1a(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s != '\0'; s++) {
		h ^= (unsigned char)*s;
		h *= 1099511628211ull;
	}
	return h;
}

/* refill: b's tokens as of now_ms, at b's own rate. */
static void
refill(struct bucket *b, uint64_t now_ms)
{
	uint64_t add;

	if (now_ms <= b->last_ms)
		return;
	/* An elapsed time of more ms than the bucket holds thousandths
	 * fills it (rps >= 1): no overflow in the product. */
	if (now_ms - b->last_ms > b->burst_m) {
		b->tokens_m = b->burst_m;
		b->last_ms = now_ms;
		return;
	}
	add = (now_ms - b->last_ms) * b->rps;
	if (b->tokens_m + add >= b->burst_m)
		b->tokens_m = b->burst_m;
	else
		b->tokens_m += add;
	b->last_ms = now_ms;
}

/* find: name's bucket, made (full, of rps and burst_m) when absent; a
 * bucket found takes the rate given (a tenant's limit may change). */
static struct bucket *
find(struct moat_ratelimit *rl, const char *name, uint64_t rps,
    uint64_t burst_m, uint64_t now_ms)
{
	size_t start = (size_t)(fnv1a(name) % rl->n_slots);
	struct bucket *pick = NULL, *full = NULL, *oldest = NULL;

	for (size_t i = 0; i < PROBE; i++) {
		struct bucket *b = &rl->slots[(start + i) % rl->n_slots];

		if (b->name[0] == '\0') {
			if (pick == NULL)
				pick = b;
			continue;
		}
		if (strcmp(b->name, name) == 0) {
			refill(b, now_ms);
			b->rps = rps;
			if (b->tokens_m > burst_m)
				b->tokens_m = burst_m;
			b->burst_m = burst_m;
			return b;
		}
		refill(b, now_ms);
		if (full == NULL && b->tokens_m >= b->burst_m)
			full = b;
		if (oldest == NULL || b->last_ms < oldest->last_ms)
			oldest = b;
	}
	if (pick == NULL)
		pick = full != NULL ? full : oldest;
	memcpy(pick->name, name, strlen(name) + 1);
	pick->rps = rps;
	pick->burst_m = burst_m;
	pick->tokens_m = burst_m;
	pick->last_ms = now_ms;
	return pick;
}

/* take: one token of name's bucket at rps and burst_m (rps > 0). */
static bool
take(struct moat_ratelimit *rl, const char *name, uint64_t rps,
    uint64_t burst_m, uint64_t now_ms, uint32_t *retry_after_s)
{
	char cut[MOAT_RATELIMIT_NAME_MAX];
	struct bucket *b;
	bool ok;

	snprintf(cut, sizeof(cut), "%s", name ? name : "");
	pthread_mutex_lock(&rl->lock);
	b = find(rl, cut[0] != '\0' ? cut : "-", rps, burst_m, now_ms);
	ok = b->tokens_m >= MILLI;
	if (ok) {
		b->tokens_m -= MILLI;
	} else {
		uint64_t ms = (MILLI - b->tokens_m + rps - 1) / rps;

		rl->refused++;
		if (retry_after_s != NULL)
			*retry_after_s = (uint32_t)((ms + 999) / 1000);
	}
	pthread_mutex_unlock(&rl->lock);
	return ok;
}

bool
moat_ratelimit_take(struct moat_ratelimit *rl, const char *name,
    uint64_t now_ms, uint32_t *retry_after_s)
{
	if (rl->rps == 0)
		return true;
	return take(rl, name, rl->rps, rl->burst_m, now_ms, retry_after_s);
}

bool
moat_ratelimit_take_rate(struct moat_ratelimit *rl, const char *name,
    uint32_t rps, uint32_t burst, uint64_t now_ms, uint32_t *retry_after_s)
{
	uint64_t burst_m = (uint64_t)(burst ? burst : rps) * MILLI;

	if (rps == 0)
		return true;
	return take(rl, name, rps, burst_m < MILLI ? MILLI : burst_m, now_ms,
	    retry_after_s);
}

uint64_t
moat_ratelimit_refused(struct moat_ratelimit *rl)
{
	uint64_t n;

	pthread_mutex_lock(&rl->lock);
	n = rl->refused;
	pthread_mutex_unlock(&rl->lock);
	return n;
}
