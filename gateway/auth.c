/*
 * auth.c: tenants, API keys, the per-tenant audit log and the command
 * policy of the gateway (auth.h). A key is "moat_<keyid>_<secret>": the
 * key id finds its record (tenant, SHA-256 of the secret, created,
 * revoked) in the "keys" database; the secret itself is never stored.
 * The "audit" database holds JSON entries under tenant NUL + big-endian
 * microseconds, so one tenant's entries are one ordered range. Writes go
 * through LMDB's single writer lock (moat/store.h), which also serialises
 * the gateway and an operator's `keys` command in another process.
 * Audit appends never touch the disk in the caller's thread: they go into
 * a bounded queue that one writer thread per moat_auth drains, committing
 * whatever is queued in one transaction (one fsync per batch). A caller
 * that finds the queue full waits up to 2 s for room; past that (a stuck
 * disk) the entry is dropped, counted per tenant, and the writer logs one
 * "N audit entries dropped (queue full)" entry once space returns.
 * Verified keys are cached in memory for MOAT_AUTH_KEY_CACHE_TTL_MS so a
 * call costs no LMDB read; a revoke in this process evicts at once.
 * With a sessiond (moat_auth_use_sessiond, issue 15) keys are read and
 * written there (keys_remote.c; a key only the local store has is
 * imported on first use) and the writer sends each batch there
 * (audit_remote.c), keeping a batch locally when sessiond does not take
 * it.
 * Not for: which calls need a key, or what is audited (handlers.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "auth.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

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

static const char *const db_names[] = { DB_KEYS, DB_AUDIT,
	MOAT_AUTH_DB_AUDIT_PENDING, NULL };

static void *audit_writer(void *arg);

static uint64_t
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int
moat_auth_open(struct moat_auth **out, const char *state_dir, char **errmsg)
{
	struct moat_auth *a;
	char *path;
	int rv;

	*out = NULL;
	if ((a = calloc(1, sizeof(*a))) == NULL ||
	    (path = moat_asprintf("%s/%s", state_dir, MOAT_AUTH_DB_DIR)) ==
	        NULL) {
		free(a);
		*errmsg = moat_asprintf("out of memory opening the key store");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rv = moat_store_open(&a->st, path, AUTH_MAP_BYTES, db_names, errmsg);
	free(path);
	if (rv != MOAT_OK) {
		free(a);
		return rv;
	}
	a->cap = MOAT_AUTH_AUDIT_QUEUE_LEN;
	if ((a->ring = calloc(a->cap, sizeof(*a->ring))) == NULL ||
	    (a->batch = calloc(a->cap, sizeof(*a->batch))) == NULL) {
		*errmsg = moat_asprintf("out of memory for the audit queue");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
	}
	if (pthread_mutex_init(&a->lock, NULL) != 0 ||
	    pthread_mutex_init(&a->cache_lock, NULL) != 0 ||
	    pthread_cond_init(&a->work, NULL) != 0 ||
	    pthread_cond_init(&a->done, NULL) != 0) {
		/* glibc's init does not fail; other libcs may. */
		*errmsg = moat_asprintf("cannot create the audit queue's "
		                        "locks");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	a->sync_ready = true;
	if (pthread_create(&a->writer, NULL, audit_writer, a) != 0) {
		*errmsg = moat_asprintf("cannot start the audit writer "
		                        "thread");
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
	}
	a->writer_started = true;
	*out = a;
	return MOAT_OK;
fail:
	moat_auth_close(a);
	return rv;
}

void
moat_auth_close(struct moat_auth *a)
{
	if (a == NULL)
		return;
	if (a->writer_started) {
		/* The writer drains the queue and commits before it ends. */
		pthread_mutex_lock(&a->lock);
		a->stopping = true;
		pthread_cond_signal(&a->work);
		pthread_mutex_unlock(&a->lock);
		pthread_join(a->writer, NULL);
	}
	for (size_t i = 0; a->ring != NULL && i < a->len; i++)
		free(a->ring[(a->head + i) % a->cap].text);
	free(a->ring);
	free(a->batch);
	if (a->sync_ready) {
		pthread_mutex_destroy(&a->lock);
		pthread_mutex_destroy(&a->cache_lock);
		pthread_cond_destroy(&a->work);
		pthread_cond_destroy(&a->done);
	}
	moat_store_close(a->st);
	free(a);
}

bool
moat_auth_tenant_valid(const char *tenant)
{
	size_t n = tenant != NULL ? strlen(tenant) : 0;

	if (n == 0 || n >= MOAT_AUTH_TENANT_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = tenant[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		        c == '-'))
			return false;
	}
	return true;
}

static void
hex(const uint8_t *b, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * n] = '\0';
}

void
moat_auth_sha256_hex(const char *secret, char out[MOAT_AUTH_SHA256_HEX])
{
	uint8_t md[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *)secret, strlen(secret), md);
	hex(md, sizeof(md), out);
}

static bool
random_bytes(uint8_t *b, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = getrandom(b + got, n - got, 0);
		if (r <= 0)
			return false;
		got += (size_t)r;
	}
	return true;
}

int
moat_auth_key_create(struct moat_auth *a, const char *tenant, char **secret,
    char *key_id, char **errmsg)
{
	uint8_t id_bytes[MOAT_AUTH_KEY_ID_LEN / 2], sec_bytes[SECRET_BYTES];
	char sec_hex[2 * SECRET_BYTES + 1], hash[2 * SHA256_DIGEST_LENGTH + 1];
	struct moat_store_txn *txn = NULL;
	json_t *rec = NULL;
	char *text = NULL;
	int rv;

	*secret = NULL;
	if (!moat_auth_tenant_valid(tenant)) {
		*errmsg =
		    moat_asprintf("tenant \"%.80s\" is not a name: use "
		                  "1-63 letters, digits, '.', '_' or '-'",
		        tenant ? tenant : "");
		return MOAT_INVALID_ARGUMENT;
	}
	if (!random_bytes(id_bytes, sizeof(id_bytes)) ||
	    !random_bytes(sec_bytes, sizeof(sec_bytes))) {
		*errmsg = moat_asprintf("no random bytes for a new key");
		return MOAT_INTERNAL;
	}
	hex(id_bytes, sizeof(id_bytes), key_id);
	hex(sec_bytes, sizeof(sec_bytes), sec_hex);
	moat_auth_sha256_hex(sec_hex, hash);
	rec = json_pack("{s:s, s:s, s:I, s:b}", "tenant", tenant, "sha256",
	    hash, "created_unix_ms", (json_int_t)moat_now_unix_ms(), "revoked",
	    0);
	if (rec == NULL || (text = json_dumps(rec, JSON_COMPACT)) == NULL ||
	    (*secret = moat_asprintf("moat_%s_%s", key_id, sec_hex)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory creating a key");
		goto out;
	}
	if (a->sessiond != NULL) {
		struct moat_key_record k = { .created_unix_ms =
			                         moat_now_unix_ms() };

		snprintf(k.key_id, sizeof(k.key_id), "%s", key_id);
		snprintf(k.tenant, sizeof(k.tenant), "%s", tenant);
		snprintf(k.sha256, sizeof(k.sha256), "%s", hash);
		rv = moat_keys_remote_create(a->sessiond, a->sessiond_url, &k,
		    errmsg);
		goto out;
	}
	if ((rv = moat_store_txn_begin(a->st, true, &txn, errmsg)) != MOAT_OK)
		goto out;
	if ((rv = moat_store_put(txn, DB_KEYS, key_id, strlen(key_id), text,
	         strlen(text), true, errmsg)) != MOAT_OK) {
		moat_store_txn_abort(txn);
		goto out;
	}
	rv = moat_store_txn_commit(txn, errmsg);
out:
	if (rv != MOAT_OK) {
		free(*secret);
		*secret = NULL;
	}
	OPENSSL_cleanse(sec_hex, sizeof(sec_hex));
	free(text);
	json_decref(rec);
	return rv;
}

/* key_record: the parsed record of `key_id` (a new reference), or NULL
 * with *rv set (NOT_FOUND, or the store's status and *errmsg). */
static json_t *
key_record(struct moat_store_txn *txn, const char *key_id, int *rv,
    char **errmsg)
{
	const void *val;
	size_t vlen;
	json_t *rec;

	if ((*rv = moat_store_get(txn, DB_KEYS, key_id, strlen(key_id), &val,
	         &vlen, errmsg)) != MOAT_OK)
		return NULL;
	if ((rec = json_loadb(val, vlen, 0, NULL)) == NULL ||
	    !json_is_object(rec)) {
		json_decref(rec);
		*rv = MOAT_INTERNAL;
		*errmsg = moat_asprintf("key %s: its record in the key store "
		                        "is not JSON",
		    key_id);
		return NULL;
	}
	return rec;
}

static struct key_cache_slot *
cache_slot(struct moat_auth *a, const char *id)
{
	uint32_t h = 2166136261u; /* FNV-1a of the id */

	for (const char *p = id; *p != '\0'; p++)
		h = (h ^ (uint8_t)*p) * 16777619u;
	return &a->cache[h % KEY_CACHE_SLOTS];
}

/* cache_lookup: whether key `id` with secret hash `hash` was verified
 * within `max_age_ms`; then copies its tenant (tenant_size bytes). */
static bool
cache_lookup(struct moat_auth *a, const char *id, const char *hash,
    char *tenant, size_t tenant_size, uint64_t max_age_ms)
{
	struct key_cache_slot *c;
	bool hit = false;

	pthread_mutex_lock(&a->cache_lock);
	c = cache_slot(a, id);
	if (strcmp(c->id, id) == 0 &&
	    c->verified_ms + max_age_ms > mono_ms() &&
	    CRYPTO_memcmp(c->hash, hash, sizeof(c->hash)) == 0 &&
	    strlen(c->tenant) < tenant_size) {
		strcpy(tenant, c->tenant);
		hit = true;
	}
	pthread_mutex_unlock(&a->cache_lock);
	return hit;
}

static void
cache_put(struct moat_auth *a, const char *id, const char *hash,
    const char *tenant)
{
	struct key_cache_slot *c;

	pthread_mutex_lock(&a->cache_lock);
	c = cache_slot(a, id);
	snprintf(c->id, sizeof(c->id), "%s", id);
	snprintf(c->hash, sizeof(c->hash), "%s", hash);
	snprintf(c->tenant, sizeof(c->tenant), "%s", tenant);
	c->verified_ms = mono_ms();
	pthread_mutex_unlock(&a->cache_lock);
}

static void
cache_evict(struct moat_auth *a, const char *id)
{
	struct key_cache_slot *c;

	pthread_mutex_lock(&a->cache_lock);
	c = cache_slot(a, id);
	if (strcmp(c->id, id) == 0)
		memset(c, 0, sizeof(*c));
	pthread_mutex_unlock(&a->cache_lock);
}

/* local_get: key `id` of the local store in *k; NOT_FOUND when absent
 * (no *errmsg). One read transaction: no writer lock, no fsync. */
static int
local_get(struct moat_auth *a, const char *id, struct moat_key_record *k,
    char **errmsg)
{
	struct moat_store_txn *txn = NULL;
	const char *want, *t;
	json_t *rec;
	int rv;

	memset(k, 0, sizeof(*k));
	if ((rv = moat_store_txn_begin(a->st, false, &txn, errmsg)) != MOAT_OK)
		return rv;
	rec = key_record(txn, id, &rv, errmsg);
	moat_store_txn_abort(txn);
	if (rec == NULL)
		return rv;
	want = json_string_value(json_object_get(rec, "sha256"));
	t = json_string_value(json_object_get(rec, "tenant"));
	if (want == NULL || t == NULL || strlen(want) >= sizeof(k->sha256) ||
	    strlen(t) >= sizeof(k->tenant)) {
		json_decref(rec);
		*errmsg = moat_asprintf("key %s: its record lacks a tenant "
		                        "or hash",
		    id);
		return MOAT_INTERNAL;
	}
	snprintf(k->key_id, sizeof(k->key_id), "%s", id);
	snprintf(k->tenant, sizeof(k->tenant), "%s", t);
	snprintf(k->sha256, sizeof(k->sha256), "%s", want);
	k->revoked = json_is_true(json_object_get(rec, "revoked"));
	k->created_unix_ms = (uint64_t)json_integer_value(
	    json_object_get(rec, "created_unix_ms"));
	json_decref(rec);
	return MOAT_OK;
}

/* key_lookup: key `id` from sessiond when `a` uses one, else from the
 * local store. A key sessiond does not know but the local store does
 * (made by `keys create --state-dir` next to this gateway) is imported
 * into sessiond now. NOT_FOUND (no *errmsg) when nowhere. */
static int
key_lookup(struct moat_auth *a, const char *id, struct moat_key_record *k,
    char **errmsg)
{
	int rv;

	if (a->sessiond == NULL)
		return local_get(a, id, k, errmsg);
	rv = moat_keys_remote_get(a->sessiond, a->sessiond_url, id, k, errmsg);
	if (rv != MOAT_NOT_FOUND)
		return rv;
	free(*errmsg);
	*errmsg = NULL;
	if ((rv = local_get(a, id, k, errmsg)) != MOAT_OK)
		return rv;
	if ((rv = moat_keys_remote_create(a->sessiond, a->sessiond_url, k,
	         errmsg)) != MOAT_OK)
		return rv;
	moat_info(0,
	    "auth: key %s of tenant %s imported from the local key "
	    "store into moat-sessiond",
	    id, k->tenant);
	return MOAT_OK;
}

int
moat_auth_key_verify(struct moat_auth *a, const char *key, char *tenant,
    size_t tenant_size, char *key_id)
{
	char id[MOAT_AUTH_KEY_ID_LEN + 1], hash[2 * SHA256_DIGEST_LENGTH + 1];
	struct moat_key_record k;
	const char *sep;
	char *errmsg = NULL;
	int rv;

	if (a == NULL || key == NULL || strncmp(key, "moat_", 5) != 0 ||
	    (sep = strchr(key + 5, '_')) == NULL ||
	    sep - (key + 5) != MOAT_AUTH_KEY_ID_LEN ||
	    strlen(sep + 1) != 2 * SECRET_BYTES)
		return MOAT_UNAUTHENTICATED;
	memcpy(id, key + 5, MOAT_AUTH_KEY_ID_LEN);
	id[MOAT_AUTH_KEY_ID_LEN] = '\0';
	moat_auth_sha256_hex(sep + 1, hash);
	if (cache_lookup(a, id, hash, tenant, tenant_size,
	        MOAT_AUTH_KEY_CACHE_TTL_MS)) {
		strcpy(key_id, id);
		return MOAT_OK;
	}
	if ((rv = key_lookup(a, id, &k, &errmsg)) != MOAT_OK) {
		if (rv == MOAT_NOT_FOUND)
			rv = MOAT_UNAUTHENTICATED;
		/* sessiond, where any revoke would go, does not answer: a
		 * key it said yes to within keys-stale-s still passes. */
		if (rv == MOAT_UNAVAILABLE && a->stale_ms > 0 &&
		    cache_lookup(a, id, hash, tenant, tenant_size,
		        a->stale_ms)) {
			strcpy(key_id, id);
			rv = MOAT_OK;
			free(errmsg);
			errmsg = NULL;
		}
		goto out;
	}
	if (strlen(k.sha256) != strlen(hash) ||
	    CRYPTO_memcmp(k.sha256, hash, strlen(hash)) != 0 || k.revoked ||
	    strlen(k.tenant) >= tenant_size) {
		rv = MOAT_UNAUTHENTICATED;
		goto out;
	}
	strcpy(tenant, k.tenant);
	strcpy(key_id, id);
	cache_put(a, id, hash, k.tenant);
	rv = MOAT_OK;
out:
	if (errmsg != NULL && rv != MOAT_UNAUTHENTICATED) {
		moat_warn(0, "auth: key %s not verified: %s", id, errmsg);
		if (rv != MOAT_UNAVAILABLE)
			rv = MOAT_INTERNAL;
	}
	free(errmsg);
	return rv;
}

static int local_revoke(struct moat_auth *a, const char *key_id,
    char **errmsg);

/* remote_revoke: RevokeKey in sessiond (a key only the local store has is
 * imported first), then the local record too when there is one, so no
 * later import could bring it back. */
static int
remote_revoke(struct moat_auth *a, const char *key_id, char **errmsg)
{
	struct moat_key_record k;
	char *ignored = NULL;
	int rv;

	rv = moat_keys_remote_revoke(a->sessiond, a->sessiond_url, key_id,
	    errmsg);
	if (rv == MOAT_NOT_FOUND) {
		free(*errmsg);
		*errmsg = NULL;
		if ((rv = key_lookup(a, key_id, &k, errmsg)) == MOAT_NOT_FOUND)
			*errmsg = moat_asprintf("no key %s: `moat-gateway "
			                        "keys ls` lists them",
			    key_id);
		if (rv == MOAT_OK)
			rv = moat_keys_remote_revoke(a->sessiond,
			    a->sessiond_url, key_id, errmsg);
	}
	if (rv != MOAT_OK)
		return rv;
	cache_evict(a, key_id);
	if (local_revoke(a, key_id, &ignored) != MOAT_OK)
		free(ignored);
	return MOAT_OK;
}

int
moat_auth_key_revoke(struct moat_auth *a, const char *key_id, char **errmsg)
{
	if (key_id == NULL || strlen(key_id) != MOAT_AUTH_KEY_ID_LEN) {
		*errmsg = moat_asprintf("\"%.80s\" is not a key id: `moat-"
		                        "gateway keys ls` lists them",
		    key_id ? key_id : "");
		return MOAT_NOT_FOUND;
	}
	if (a->sessiond != NULL)
		return remote_revoke(a, key_id, errmsg);
	return local_revoke(a, key_id, errmsg);
}

static int
local_revoke(struct moat_auth *a, const char *key_id, char **errmsg)
{
	struct moat_store_txn *txn = NULL;
	json_t *rec;
	char *text = NULL;
	int rv;

	if ((rv = moat_store_txn_begin(a->st, true, &txn, errmsg)) != MOAT_OK)
		return rv;
	if ((rec = key_record(txn, key_id, &rv, errmsg)) == NULL) {
		if (rv == MOAT_NOT_FOUND)
			*errmsg = moat_asprintf("no key %s: `moat-gateway "
			                        "keys ls` lists them",
			    key_id);
		moat_store_txn_abort(txn);
		return rv;
	}
	if (json_object_set_new(rec, "revoked", json_true()) != 0 ||
	    json_object_set_new(rec, "revoked_unix_ms",
	        json_integer((json_int_t)moat_now_unix_ms())) != 0 ||
	    (text = json_dumps(rec, JSON_COMPACT)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory revoking %s", key_id);
		moat_store_txn_abort(txn);
		goto out;
	}
	if ((rv = moat_store_put(txn, DB_KEYS, key_id, strlen(key_id), text,
	         strlen(text), false, errmsg)) != MOAT_OK) {
		moat_store_txn_abort(txn);
		goto out;
	}
	rv = moat_store_txn_commit(txn, errmsg);
	if (rv == MOAT_OK)
		cache_evict(a, key_id);
out:
	free(text);
	json_decref(rec);
	return rv;
}

struct list_ctx {
	const char *tenant;
	FILE *f;
};

static int
list_one(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
	struct list_ctx *c = arg;
	json_t *rec = json_loadb(val, vlen, 0, NULL);
	const char *t = json_string_value(json_object_get(rec, "tenant"));
	time_t secs;
	struct tm tm;
	char when[32] = "?";

	if (t != NULL && (c->tenant == NULL || strcmp(c->tenant, t) == 0)) {
		secs = (time_t)(json_integer_value(
		                    json_object_get(rec, "created_unix_ms")) /
		    1000);
		if (gmtime_r(&secs, &tm) != NULL)
			strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ",
			    &tm);
		fprintf(c->f, "%.*s %s %s %s\n", (int)klen, (const char *)key,
		    t, when,
		    json_is_true(json_object_get(rec, "revoked")) ? "revoked" :
		                                                    "active");
	}
	json_decref(rec);
	return MOAT_OK;
}

int
moat_auth_key_list(struct moat_auth *a, const char *tenant, FILE *f,
    char **errmsg)
{
	struct moat_store_txn *txn = NULL;
	struct list_ctx c = { .tenant = tenant, .f = f };
	int rv;

	if (a->sessiond != NULL)
		return moat_keys_remote_list(a->sessiond, a->sessiond_url,
		    tenant, f, errmsg);
	if ((rv = moat_store_txn_begin(a->st, false, &txn, errmsg)) != MOAT_OK)
		return rv;
	rv = moat_store_scan(txn, DB_KEYS, NULL, 0, NULL, 0, list_one, &c,
	    errmsg);
	moat_store_txn_abort(txn);
	return rv;
}

void
moat_auth_use_sessiond(struct moat_auth *a, struct moat_rpc_client *c,
    const char *url, uint64_t stale_ms)
{
	/* Under the lock: the audit writer thread reads them. */
	pthread_mutex_lock(&a->lock);
	a->sessiond = c;
	a->sessiond_url = url;
	a->stale_ms = stale_ms;
	pthread_mutex_unlock(&a->lock);
}

struct import_ctx {
	struct moat_auth *a;
	char **ids;
	size_t n, cap;
};

static int
import_one(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct import_ctx *c = arg;
	char **grown;

	(void)val;
	(void)vlen;
	if (klen != MOAT_AUTH_KEY_ID_LEN)
		return MOAT_OK;
	if (c->n == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 16;
		if ((grown = realloc(c->ids, c->cap * sizeof(*grown))) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		c->ids = grown;
	}
	if ((c->ids[c->n] = strndup(key, klen)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	c->n++;
	return MOAT_OK;
}

int
moat_auth_import(struct moat_auth *a, size_t *n, char **errmsg)
{
	struct import_ctx c = { .a = a };
	struct moat_store_txn *txn = NULL;
	struct moat_key_record k;
	int rv;

	*n = 0;
	if (a->sessiond == NULL)
		return MOAT_OK;
	/* Ids first, then one call each: no read txn held across calls. */
	if ((rv = moat_store_txn_begin(a->st, false, &txn, errmsg)) != MOAT_OK)
		return rv;
	rv = moat_store_scan(txn, DB_KEYS, NULL, 0, NULL, 0, import_one, &c,
	    errmsg);
	moat_store_txn_abort(txn);
	for (size_t i = 0; rv == MOAT_OK && i < c.n; i++) {
		if ((rv = local_get(a, c.ids[i], &k, errmsg)) == MOAT_OK)
			rv = moat_keys_remote_create(a->sessiond,
			    a->sessiond_url, &k, errmsg);
		if (rv == MOAT_OK) {
			(*n)++;
		} else if (rv != MOAT_UNAVAILABLE) {
			/* This key only (e.g. its id taken by another
			 * key in sessiond): the others go on. */
			moat_warn(0, "keys: key %s not imported: %s", c.ids[i],
			    *errmsg ? *errmsg : "");
			free(*errmsg);
			*errmsg = NULL;
			rv = MOAT_OK;
		}
	}
	for (size_t i = 0; i < c.n; i++)
		free(c.ids[i]);
	free(c.ids);
	if (rv == MOAT_RESOURCE_EXHAUSTED && *errmsg == NULL)
		*errmsg = moat_asprintf("out of memory importing keys");
	return rv;
}

/* audit_key: tenant NUL then the big-endian time in us; returns its
 * length. */
static size_t
audit_key(uint8_t *key, const char *tenant, uint64_t us)
{
	size_t n = strlen(tenant) + 1;

	memcpy(key, tenant, n);
	moat_store_key_u64(key + n, us);
	return n + 8;
}

/* How long a caller waits for room in a full audit queue before its
 * entry is counted as dropped (the disk is then stuck, not just busy). */
#define AUDIT_FULL_WAIT_MS 2000

/* note_drop: counts a dropped entry of `tenant`; lock held. */
static void
note_drop(struct moat_auth *a, const char *tenant)
{
	for (size_t i = 0; i < a->n_drops; i++)
		if (strcmp(a->drops[i].tenant, tenant) == 0) {
			a->drops[i].n++;
			return;
		}
	if (a->n_drops == DROP_TENANTS) {
		a->drops_unattributed++;
		return;
	}
	snprintf(a->drops[a->n_drops].tenant, MOAT_AUTH_TENANT_MAX, "%s",
	    tenant);
	a->drops[a->n_drops++].n = 1;
}

int
moat_auth_audit_append(struct moat_auth *a, const char *tenant, json_t *entry,
    char **errmsg)
{
	struct timespec ts;
	uint64_t us;
	char *text;

	if (!moat_auth_tenant_valid(tenant)) {
		*errmsg = moat_asprintf("audit: bad tenant name");
		return MOAT_INVALID_ARGUMENT;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	if (json_object_set_new(entry, "at_unix_ms",
	        json_integer((json_int_t)(us / 1000))) != 0 ||
	    (text = json_dumps(entry, JSON_COMPACT)) == NULL) {
		*errmsg = moat_asprintf("out of memory writing the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	pthread_mutex_lock(&a->lock);
	a->seq++;
	if (a->len == a->cap) {
		/* A full queue slows the caller down rather than losing its
		 * entry: wait (at most AUDIT_FULL_WAIT_MS) for the writer's
		 * next commit to make room. */
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += AUDIT_FULL_WAIT_MS / 1000;
		pthread_cond_signal(&a->work);
		while (a->len == a->cap && !a->stopping &&
		    pthread_cond_timedwait(&a->done, &a->lock, &until) == 0)
			;
	}
	if (a->len == a->cap) {
		/* The disk is stuck: count it, the writer says so. */
		note_drop(a, tenant);
		free(text);
	} else {
		struct audit_item *it = &a->ring[(a->head + a->len) % a->cap];

		snprintf(it->tenant, sizeof(it->tenant), "%s", tenant);
		it->us = us;
		it->text = text;
		a->len++;
	}
	pthread_cond_signal(&a->work);
	pthread_mutex_unlock(&a->lock);
	return MOAT_OK;
}

void
moat_auth_audit_flush(struct moat_auth *a)
{
	uint64_t target;

	if (a == NULL)
		return;
	pthread_mutex_lock(&a->lock);
	target = a->seq;
	while (a->done_seq < target)
		pthread_cond_wait(&a->done, &a->lock);
	pthread_mutex_unlock(&a->lock);
}

/* put_entry: stores one entry in the write transaction; two entries in
 * one microsecond: the later one takes the next. */
static int
put_entry(struct moat_store_txn *txn, const char *tenant, uint64_t us,
    const char *text, bool pending, char **errmsg)
{
	uint8_t key[MOAT_AUTH_TENANT_MAX + 8];
	size_t klen;
	int rv;

	do {
		klen = audit_key(key, tenant, us++);
		rv = moat_store_put(txn, DB_AUDIT, key, klen, text,
		    strlen(text), true, errmsg);
		if (rv == MOAT_ALREADY_EXISTS) {
			free(*errmsg);
			*errmsg = NULL;
		}
	} while (rv == MOAT_ALREADY_EXISTS);
	/* Kept here while sessiond is away: sent there when it is back
	 * (moat_audit_pending_push). */
	if (rv == MOAT_OK && pending)
		rv = moat_store_put(txn, MOAT_AUTH_DB_AUDIT_PENDING, key, klen,
		    "", 0, false, errmsg);
	return rv;
}

/* drop_text: the one entry saying how many of `tenant`'s were dropped
 * (heap JSON, NULL when out of memory) and its time in *us. */
static char *
drop_text(uint64_t n, uint64_t *us)
{
	struct timespec ts;
	char *text, *msg;
	json_t *e;

	clock_gettime(CLOCK_REALTIME, &ts);
	*us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	msg = moat_asprintf("%llu audit entries dropped (queue full)",
	    (unsigned long long)n);
	/* The text also as "command": the one field of ListAudit's
	 * AuditEntry that carries free text. */
	e = json_pack("{s:s, s:s, s:s?, s:s?, s:I, s:I}", "method",
	    "AuditDropped", "code", "RESOURCE_EXHAUSTED", "message", msg,
	    "command", msg, "dropped", (json_int_t)n, "at_unix_ms",
	    (json_int_t)(*us / 1000));
	free(msg);
	text = e != NULL ? json_dumps(e, JSON_COMPACT) : NULL;
	json_decref(e);
	return text;
}

/* put_drop: drop_text's entry for `tenant`, in the write txn. */
static int
put_drop(struct moat_store_txn *txn, const char *tenant, uint64_t n,
    bool pending, char **errmsg)
{
	uint64_t us;
	char *text = drop_text(n, &us);
	int rv;

	if (text == NULL) {
		*errmsg = moat_asprintf("out of memory writing the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rv = put_entry(txn, tenant, us, text, pending, errmsg);
	free(text);
	return rv;
}

/* commit_remote: the batch and the drop counts as one AppendAudit. */
static int
commit_remote(struct moat_rpc_client *c, const char *url,
    const struct audit_item *batch, size_t n, const struct audit_drop *drops,
    size_t n_drops, char **errmsg)
{
	struct moat_audit_item *items =
	    calloc(n + n_drops + 1, sizeof(*items));
	size_t k = 0;
	int rv = MOAT_OK;

	if (items == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; i < n; i++, k++)
		items[k] = (struct moat_audit_item){ batch[i].tenant,
			batch[i].us, batch[i].text };
	for (size_t i = 0; i < n_drops && rv == MOAT_OK; i++, k++) {
		items[k].tenant = drops[i].tenant;
		if ((items[k].text = drop_text(drops[i].n, &items[k].us)) ==
		    NULL)
			rv = MOAT_RESOURCE_EXHAUSTED;
	}
	if (rv == MOAT_OK)
		rv = moat_audit_remote_append(c, url, items, k, errmsg);
	for (size_t i = n; i < k; i++)
		free((char *)items[i].text);
	free(items);
	return rv;
}

/* commit_batch: one write transaction (one fsync) for the whole batch
 * and the drop counts; writer thread only. */
static void
commit_batch(struct moat_auth *a, struct audit_item *batch, size_t n,
    const struct audit_drop *drops, size_t n_drops, uint64_t unattributed)
{
	struct moat_store_txn *txn = NULL;
	struct moat_rpc_client *remote;
	const char *url;
	char *errmsg = NULL;
	uint64_t dropped = unattributed, now;
	int rv;

	for (size_t i = 0; i < n_drops; i++)
		dropped += drops[i].n;
	pthread_mutex_lock(&a->lock);
	remote = a->sessiond;
	url = a->sessiond_url;
	pthread_mutex_unlock(&a->lock);
	if (remote != NULL && n + n_drops > 0) {
		if ((rv = commit_remote(remote, url, batch, n, drops, n_drops,
		         &errmsg)) == MOAT_OK) {
			moat_audit_pending_push(a->st, remote, url);
			goto out;
		}
		moat_warn(0,
		    "audit: %zu entries kept in this gateway's own log until "
		    "moat-sessiond takes them: %s",
		    n + n_drops, errmsg ? errmsg : moat_strerror(rv));
		free(errmsg);
		errmsg = NULL;
	}
	if ((rv = moat_store_txn_begin(a->st, true, &txn, &errmsg)) != MOAT_OK)
		goto out;
	for (size_t i = 0; i < n && rv == MOAT_OK; i++)
		rv = put_entry(txn, batch[i].tenant, batch[i].us,
		    batch[i].text, remote != NULL, &errmsg);
	for (size_t i = 0; i < n_drops && rv == MOAT_OK; i++)
		rv = put_drop(txn, drops[i].tenant, drops[i].n, remote != NULL,
		    &errmsg);
	if (rv != MOAT_OK) {
		moat_store_txn_abort(txn);
		goto out;
	}
	rv = moat_store_txn_commit(txn, &errmsg);
out:
	if (rv != MOAT_OK)
		moat_warn(0, "audit: %zu entries not logged: %s", n + n_drops,
		    errmsg ? errmsg : "?");
	free(errmsg);
	if (dropped > 0) {
		a->warn_dropped += dropped;
		now = mono_ms();
		if (a->warn_at_ms == 0 ||
		    now - a->warn_at_ms >= DROP_WARN_EVERY_MS) {
			moat_warn(0,
			    "audit: %llu entries dropped (queue of %zu "
			    "full)%s",
			    (unsigned long long)a->warn_dropped, a->cap,
			    unattributed > 0 ?
			        "; some of tenants "
			        "beyond the first 64 not logged per tenant" :
			        "");
			a->warn_at_ms = now;
			a->warn_dropped = 0;
		}
	}
}

/* audit_writer: the one LMDB writer of the audit log: takes all that is
 * queued, commits it in one transaction, again until stopped with an
 * empty queue. */
static void *
audit_writer(void *arg)
{
	struct moat_auth *a = arg;
	struct audit_drop drops[DROP_TENANTS];
	size_t n, n_drops;
	uint64_t unattributed, taken;

	pthread_mutex_lock(&a->lock);
	for (;;) {
		while (a->len == 0 && a->n_drops == 0 &&
		    a->drops_unattributed == 0 && !a->stopping)
			pthread_cond_wait(&a->work, &a->lock);
		if (a->len == 0 && a->n_drops == 0 &&
		    a->drops_unattributed == 0)
			break; /* stopping, all done */
		/* Take everything: the queue is empty again for handlers. */
		for (n = 0; n < a->len; n++)
			a->batch[n] = a->ring[(a->head + n) % a->cap];
		a->head = (a->head + n) % a->cap;
		a->len = 0;
		n_drops = a->n_drops;
		memcpy(drops, a->drops, n_drops * sizeof(*drops));
		unattributed = a->drops_unattributed;
		a->n_drops = 0;
		a->drops_unattributed = 0;
		taken = a->seq;
		pthread_mutex_unlock(&a->lock);
		commit_batch(a, a->batch, n, drops, n_drops, unattributed);
		for (size_t i = 0; i < n; i++)
			free(a->batch[i].text);
		pthread_mutex_lock(&a->lock);
		a->done_seq = taken;
		pthread_cond_broadcast(&a->done);
	}
	a->done_seq = a->seq;
	pthread_cond_broadcast(&a->done);
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

struct audit_ctx {
	json_t **ring;
	size_t limit, n; /* n: entries seen */
};

static int
audit_one(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct audit_ctx *c = arg;
	json_t *e = json_loadb(val, vlen, 0, NULL);
	size_t slot = c->n % c->limit;

	if (e == NULL)
		return MOAT_OK;
	json_decref(c->ring[slot]);
	c->ring[slot] = e;
	c->n++;
	return MOAT_OK;
}

int
moat_auth_audit_list(struct moat_auth *a, const char *tenant, size_t limit,
    json_t **out, char **errmsg)
{
	struct moat_store_txn *txn = NULL;
	struct audit_ctx c = { .limit = limit };
	size_t plen, first, count;
	json_t *arr = NULL;
	int rv;

	*out = NULL;
	if (!moat_auth_tenant_valid(tenant) || limit == 0 ||
	    limit > MOAT_AUTH_AUDIT_MAX_LIMIT) {
		*errmsg = moat_asprintf("audit: limit must be 1-%d",
		    MOAT_AUTH_AUDIT_MAX_LIMIT);
		return MOAT_INVALID_ARGUMENT;
	}
	if (a->sessiond != NULL)
		return moat_audit_remote_list(a->sessiond, a->sessiond_url,
		    tenant, limit, out, errmsg);
	if ((c.ring = calloc(limit, sizeof(*c.ring))) == NULL ||
	    (arr = json_array()) == NULL) {
		free(c.ring);
		*errmsg = moat_asprintf("out of memory reading the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	plen = strlen(tenant) + 1; /* with its NUL: not a longer name */
	if ((rv = moat_store_txn_begin(a->st, false, &txn, errmsg)) ==
	    MOAT_OK) {
		rv = moat_store_scan(txn, DB_AUDIT, tenant, plen, NULL, 0,
		    audit_one, &c, errmsg);
		moat_store_txn_abort(txn);
	}
	count = c.n < limit ? c.n : limit;
	first = c.n < limit ? 0 : c.n % limit;
	for (size_t i = 0; i < count && rv == MOAT_OK; i++) {
		json_t *e = c.ring[(first + i) % limit];
		if (json_array_append(arr, e) != 0) {
			rv = MOAT_RESOURCE_EXHAUSTED;
			*errmsg = moat_asprintf("out of memory");
		}
	}
	for (size_t i = 0; i < limit; i++)
		json_decref(c.ring[i]);
	free(c.ring);
	if (rv != MOAT_OK) {
		json_decref(arr);
		return rv;
	}
	*out = arr;
	return MOAT_OK;
}

bool
moat_policy_refuses(const struct moat_config *cfg, const char *tenant,
    enum moat_safety_level level)
{
	const char *name = moat_safety_level_name(level), *list = NULL, *p;
	char key[MOAT_AUTH_TENANT_MAX + 16];
	size_t n = strlen(name);

	if (tenant != NULL && strlen(tenant) < MOAT_AUTH_TENANT_MAX) {
		snprintf(key, sizeof(key), "refuse.%s", tenant);
		list = moat_config_get(cfg, "policy", key, NULL);
	}
	if (list == NULL)
		list = moat_config_get(cfg, "policy", "refuse", "blocked");
	for (p = list; (p = strstr(p, name)) != NULL; p += n) {
		bool start = p == list || p[-1] == ',' || p[-1] == ' ';
		bool end = p[n] == '\0' || p[n] == ',' || p[n] == ' ';
		if (start && end)
			return true;
	}
	return false;
}
