/*
 * auth_keys.c: the gateway's API keys (auth.h): creating one (its secret
 * shown once, only its SHA-256 stored), verifying a key with a cache of
 * verified keys (MOAT_AUTH_KEY_CACHE_TTL_MS; a revoke in this process
 * evicts at once), revoking, listing, and with a sessiond
 * (moat_auth_use_sessiond) reading and writing them there
 * (keys_remote.c) and importing the local ones.
 * Not for: the store's lifecycle (auth.c) or the audit log
 * (auth_audit.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "auth.h"
#include "auth_internal.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

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
	if (moat_auth_tenant_reserved(tenant)) {
		*errmsg = moat_asprintf("tenant \"%.80s\" is reserved: names "
		                        "beginning \"moat.\" hold moat's own "
		                        "data (images), and no key acts for "
		                        "them; pick another tenant name",
		    tenant);
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
