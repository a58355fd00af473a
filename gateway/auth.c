/*
 * auth.c: tenants, API keys, the per-tenant audit log and the command
 * policy of the gateway (auth.h). A key is "moat_<keyid>_<secret>": the
 * key id finds its record (tenant, SHA-256 of the secret, created,
 * revoked) in the "keys" database; the secret itself is never stored.
 * The "audit" database holds JSON entries under tenant NUL + big-endian
 * microseconds, so one tenant's entries are one ordered range. Writes go
 * through LMDB's single writer lock (moat/store.h), which also serialises
 * the gateway and an operator's `keys` command in another process.
 * Not for: which calls need a key, or what is audited (handlers.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "auth.h"
#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

#define DB_KEYS "keys"
#define DB_AUDIT "audit"
#define SECRET_BYTES 32
#define AUTH_MAP_BYTES (256ull << 20)

struct moat_auth {
	struct moat_store *st;
};

static const char *const db_names[] = { DB_KEYS, DB_AUDIT, NULL };

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
	*out = a;
	return MOAT_OK;
}

void
moat_auth_close(struct moat_auth *a)
{
	if (a == NULL)
		return;
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

static void
secret_hash(const char *secret, char out[2 * SHA256_DIGEST_LENGTH + 1])
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
		*errmsg = moat_asprintf("tenant \"%.80s\" is not a name: use "
		    "1-63 letters, digits, '.', '_' or '-'", tenant ? tenant :
		    "");
		return MOAT_INVALID_ARGUMENT;
	}
	if (!random_bytes(id_bytes, sizeof(id_bytes)) ||
	    !random_bytes(sec_bytes, sizeof(sec_bytes))) {
		*errmsg = moat_asprintf("no random bytes for a new key");
		return MOAT_INTERNAL;
	}
	hex(id_bytes, sizeof(id_bytes), key_id);
	hex(sec_bytes, sizeof(sec_bytes), sec_hex);
	secret_hash(sec_hex, hash);
	rec = json_pack("{s:s, s:s, s:I, s:b}", "tenant", tenant, "sha256",
	    hash, "created_unix_ms", (json_int_t)moat_now_unix_ms(),
	    "revoked", 0);
	if (rec == NULL || (text = json_dumps(rec, JSON_COMPACT)) == NULL ||
	    (*secret = moat_asprintf("moat_%s_%s", key_id, sec_hex)) ==
	    NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory creating a key");
		goto out;
	}
	if ((rv = moat_store_txn_begin(a->st, true, &txn, errmsg)) !=
	    MOAT_OK)
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
		    "is not JSON", key_id);
		return NULL;
	}
	return rec;
}

int
moat_auth_key_verify(struct moat_auth *a, const char *key, char *tenant,
    size_t tenant_size, char *key_id)
{
	char id[MOAT_AUTH_KEY_ID_LEN + 1], hash[2 * SHA256_DIGEST_LENGTH + 1];
	struct moat_store_txn *txn = NULL;
	const char *sep, *want, *t;
	char *errmsg = NULL;
	json_t *rec = NULL;
	int rv;

	if (a == NULL || key == NULL || strncmp(key, "moat_", 5) != 0 ||
	    (sep = strchr(key + 5, '_')) == NULL ||
	    sep - (key + 5) != MOAT_AUTH_KEY_ID_LEN ||
	    strlen(sep + 1) != 2 * SECRET_BYTES)
		return MOAT_UNAUTHENTICATED;
	memcpy(id, key + 5, MOAT_AUTH_KEY_ID_LEN);
	id[MOAT_AUTH_KEY_ID_LEN] = '\0';
	secret_hash(sep + 1, hash);
	if ((rv = moat_store_txn_begin(a->st, false, &txn, &errmsg)) !=
	    MOAT_OK)
		goto out;
	rec = key_record(txn, id, &rv, &errmsg);
	moat_store_txn_abort(txn);
	if (rec == NULL) {
		if (rv == MOAT_NOT_FOUND)
			rv = MOAT_UNAUTHENTICATED;
		goto out;
	}
	want = json_string_value(json_object_get(rec, "sha256"));
	t = json_string_value(json_object_get(rec, "tenant"));
	if (want == NULL || t == NULL || strlen(want) != strlen(hash) ||
	    CRYPTO_memcmp(want, hash, strlen(hash)) != 0 ||
	    json_is_true(json_object_get(rec, "revoked")) ||
	    strlen(t) >= tenant_size) {
		rv = MOAT_UNAUTHENTICATED;
		goto out;
	}
	strcpy(tenant, t);
	strcpy(key_id, id);
	rv = MOAT_OK;
out:
	if (errmsg != NULL && rv != MOAT_UNAUTHENTICATED)
		rv = MOAT_INTERNAL;
	free(errmsg);
	json_decref(rec);
	return rv;
}

int
moat_auth_key_revoke(struct moat_auth *a, const char *key_id, char **errmsg)
{
	struct moat_store_txn *txn = NULL;
	json_t *rec;
	char *text = NULL;
	int rv;

	if (key_id == NULL || strlen(key_id) != MOAT_AUTH_KEY_ID_LEN) {
		*errmsg = moat_asprintf("\"%.80s\" is not a key id: `moat-"
		    "gateway keys ls` lists them", key_id ? key_id : "");
		return MOAT_NOT_FOUND;
	}
	if ((rv = moat_store_txn_begin(a->st, true, &txn, errmsg)) !=
	    MOAT_OK)
		return rv;
	if ((rec = key_record(txn, key_id, &rv, errmsg)) == NULL) {
		if (rv == MOAT_NOT_FOUND)
			*errmsg = moat_asprintf("no key %s: `moat-gateway "
			    "keys ls` lists them", key_id);
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
list_one(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct list_ctx *c = arg;
	json_t *rec = json_loadb(val, vlen, 0, NULL);
	const char *t = json_string_value(json_object_get(rec, "tenant"));
	time_t secs;
	struct tm tm;
	char when[32] = "?";

	if (t != NULL && (c->tenant == NULL || strcmp(c->tenant, t) == 0)) {
		secs = (time_t)(json_integer_value(json_object_get(rec,
		    "created_unix_ms")) / 1000);
		if (gmtime_r(&secs, &tm) != NULL)
			strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ",
			    &tm);
		fprintf(c->f, "%.*s %s %s %s\n", (int)klen, (const char *)key,
		    t, when, json_is_true(json_object_get(rec, "revoked")) ?
		    "revoked" : "active");
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

	if ((rv = moat_store_txn_begin(a->st, false, &txn, errmsg)) !=
	    MOAT_OK)
		return rv;
	rv = moat_store_scan(txn, DB_KEYS, NULL, 0, NULL, 0, list_one, &c,
	    errmsg);
	moat_store_txn_abort(txn);
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

int
moat_auth_audit_append(struct moat_auth *a, const char *tenant,
    json_t *entry, char **errmsg)
{
	uint8_t key[MOAT_AUTH_TENANT_MAX + 8];
	struct moat_store_txn *txn = NULL;
	struct timespec ts;
	uint64_t us;
	char *text;
	int rv;

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
	if ((rv = moat_store_txn_begin(a->st, true, &txn, errmsg)) !=
	    MOAT_OK)
		goto out;
	/* Two entries in one microsecond: the later one takes the next. */
	do {
		size_t klen = audit_key(key, tenant, us++);

		rv = moat_store_put(txn, DB_AUDIT, key, klen, text,
		    strlen(text), true, errmsg);
		if (rv == MOAT_ALREADY_EXISTS) {
			free(*errmsg);
			*errmsg = NULL;
		}
	} while (rv == MOAT_ALREADY_EXISTS);
	if (rv != MOAT_OK) {
		moat_store_txn_abort(txn);
		goto out;
	}
	rv = moat_store_txn_commit(txn, errmsg);
out:
	free(text);
	return rv;
}

struct audit_ctx {
	json_t **ring;
	size_t limit, n;   /* n: entries seen */
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
	if ((c.ring = calloc(limit, sizeof(*c.ring))) == NULL ||
	    (arr = json_array()) == NULL) {
		free(c.ring);
		*errmsg = moat_asprintf("out of memory reading the audit log");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	plen = strlen(tenant) + 1;  /* with its NUL: not a longer name */
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
