/*
 * auth_internal.h: what the three parts of the gateway's key store and
 * audit log share: struct moat_auth and its constants. auth.c opens and
 * closes it (and starts and stops the audit writer), checks tenant names
 * and applies the command policy; auth_keys.c holds the API keys and
 * their cache; auth_audit.c the audit queue, its writer and listing.
 * Not for: anything outside those files (auth.h is the interface).
 */
#ifndef MOAT_GATEWAY_AUTH_INTERNAL_H
#define MOAT_GATEWAY_AUTH_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <openssl/sha.h>

#include "auth.h"

#define DB_KEYS "keys"
#define DB_AUDIT MOAT_AUTH_DB_AUDIT
#define SECRET_BYTES 32
#define AUTH_MAP_BYTES (256ull << 20)
#define KEY_CACHE_SLOTS 256 /* direct-mapped by key id */
#define DROP_TENANTS 64     /* tenants with drops counted apart */
#define DROP_WARN_EVERY_MS 10000

/* One queued audit entry: its tenant, time and JSON text (heap). */
struct audit_item {
	char tenant[MOAT_AUTH_TENANT_MAX];
	uint64_t us;
	char *text;
};

struct audit_drop {
	char tenant[MOAT_AUTH_TENANT_MAX];
	uint64_t n;
};

struct key_cache_slot {
	char id[MOAT_AUTH_KEY_ID_LEN + 1]; /* "" when empty */
	char hash[2 * SHA256_DIGEST_LENGTH + 1];
	char tenant[MOAT_AUTH_TENANT_MAX];
	uint64_t verified_ms; /* monotonic: when the store last said yes */
};

struct moat_auth {
	struct moat_store *st;

	/* lock guards everything below up to the writer's own state: the
	 * queue ring, the drop table, the sequence numbers, stopping. Never
	 * held across a transaction. */
	pthread_mutex_t lock;
	pthread_cond_t work; /* queue or drops non-empty, stop */
	pthread_cond_t done; /* done_seq moved */
	struct audit_item *ring;
	size_t cap, head, len;
	struct audit_drop drops[DROP_TENANTS];
	size_t n_drops;
	uint64_t drops_unattributed; /* beyond DROP_TENANTS tenants */
	uint64_t seq;                /* entries queued + dropped */
	uint64_t done_seq;           /* of those, handled by the writer */
	bool stopping, writer_started, sync_ready;
	pthread_t writer;
	/* writer thread only */
	struct audit_item *batch; /* cap entries being committed */
	uint64_t warn_at_ms, warn_dropped;

	/* Set once before other threads (moat_auth_use_sessiond). */
	struct moat_rpc_client *sessiond;
	const char *sessiond_url;
	uint64_t stale_ms; /* [gateway] keys-stale-s */

	/* cache_lock guards cache. */
	pthread_mutex_t cache_lock;
	struct key_cache_slot cache[KEY_CACHE_SLOTS];
};

/* moat_auth_audit_writer: the audit writer's thread (auth_audit.c),
 * started by moat_auth_open. */
void *moat_auth_audit_writer(void *arg);

static inline uint64_t
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
