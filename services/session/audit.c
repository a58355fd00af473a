/*
 * audit.c: the gateways' audit log (issue 15), so ListAudit (ListAuditLog here) through any
 * gateway shows the calls made through every one. Its own LMDB
 * environment (<state>/sessiond-audit), apart from the keys, claims and
 * recordings: an audit writer never holds a lock that a key operation
 * waits for. Databases: "audit" (tenant NUL, time in us 8 bytes
 * big-endian -> the entry's JSON text), "audit_age" (time, then tenant ->
 * nothing: the oldest entries of every tenant first) and "audit_meta"
 * ("bytes" -> the bytes of keys and values in "audit", 8 bytes). Every
 * AppendAudit drops, in the same transaction, entries older than
 * [sessiond] audit-max-age-s and the oldest while the log holds more than
 * audit-max-bytes (at most SWEEP_MAX a call, so a call stays short; the
 * rest goes with the next). Two entries of one tenant at the same
 * microsecond: the later one moves to the next free microsecond.
 * Not for: the gateways' queueing and batching (gateway/auth.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

#define DB_AUDIT "audit"
#define DB_AGE "audit_age"
#define DB_META "audit_meta"
#define KEY_MAX (SESSIOND_MAX_TENANT + 1 + 8)
#define SWEEP_MAX 1024
#define APPEND_MAX 4096       /* entries a call */
#define ENTRY_MAX (64u << 10) /* JSON bytes an entry */
#define LIST_MAX 1000
#define SAME_US_TRIES 64

const char *const sessiond_audit_dbs[] = { DB_AUDIT, DB_AGE, DB_META, NULL };

int
sessiond_audit_open(struct sessiond *sd, const char *state_dir, char **errmsg)
{
	/* Room for the bound, LMDB's own pages and a sweep's lag. */
	uint64_t map = sd->audit_max_bytes * 2 + (64ull << 20);

	return sessiond_env_open(&sd->audit, state_dir, "sessiond-audit", map,
	    sessiond_audit_dbs, errmsg);
}

static int
get_bytes(struct moat_store_txn *txn, uint64_t *bytes, char **errmsg)
{
	const void *val;
	size_t vlen;
	int rv = moat_store_get(txn, DB_META, "bytes", 5, &val, &vlen, errmsg);

	*bytes = 0;
	if (rv == MOAT_NOT_FOUND) {
		free(*errmsg);
		*errmsg = NULL;
		return MOAT_OK;
	}
	if (rv == MOAT_OK && vlen == 8)
		*bytes = moat_store_u64_from_key(val);
	return rv;
}

static int
put_bytes(struct moat_store_txn *txn, uint64_t bytes, char **errmsg)
{
	uint8_t v[8];

	moat_store_key_u64(v, bytes);
	return moat_store_put(txn, DB_META, "bytes", 5, v, 8, false, errmsg);
}

struct sweep {
	uint64_t cutoff_us, bytes, max_bytes;
	uint8_t keys[SWEEP_MAX][8 + KEY_MAX];
	size_t lens[SWEEP_MAX];
	size_t n;
};

static int
sweep_cb(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
	struct sweep *s = arg;

	(void)val;
	(void)vlen;
	if (s->n == SWEEP_MAX || klen <= 8 || klen > sizeof(s->keys[0]))
		return MOAT_STORE_SCAN_STOP;
	if (moat_store_u64_from_key(key) >= s->cutoff_us &&
	    s->bytes <= s->max_bytes)
		return MOAT_STORE_SCAN_STOP;
	/* Old, or the log is over its size: a candidate; sweep stops at
	 * the first young one once the size is back under the bound. */
	memcpy(s->keys[s->n], key, klen);
	s->lens[s->n++] = klen;
	return MOAT_OK;
}

/* drop_one: removes the entry whose age key is `age` (8 + tenant);
 * *freed its bytes. */
static int
drop_one(struct moat_store_txn *txn, const uint8_t *age, size_t alen,
    uint64_t *freed, char **errmsg)
{
	uint8_t key[KEY_MAX];
	size_t tlen = alen - 8, klen = tlen + 1 + 8;
	const void *val;
	size_t vlen;
	int rv;

	memcpy(key, age + 8, tlen);
	key[tlen] = '\0';
	memcpy(key + tlen + 1, age, 8);
	*freed = 0;
	rv = moat_store_get(txn, DB_AUDIT, key, klen, &val, &vlen, errmsg);
	if (rv == MOAT_OK) {
		*freed = klen + vlen;
		rv = moat_store_del(txn, DB_AUDIT, key, klen, errmsg);
	}
	if (rv == MOAT_NOT_FOUND) {
		free(*errmsg);
		*errmsg = NULL;
		rv = MOAT_OK;
	}
	if (rv == MOAT_OK)
		rv = moat_store_del(txn, DB_AGE, age, alen, errmsg);
	return rv == MOAT_NOT_FOUND ? MOAT_OK : rv;
}

/* sweep: drops what retention says, oldest first; *bytes is updated. */
static int
sweep(struct sessiond *sd, struct moat_store_txn *txn, uint64_t now_us,
    uint64_t *bytes, char **errmsg)
{
	struct sweep *s = calloc(1, sizeof(*s));
	uint64_t age_us = sd->audit_max_age_s * 1000000ull, freed;
	int rv;

	if (s == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	s->cutoff_us =
	    sd->audit_max_age_s == 0 || now_us < age_us ? 0 : now_us - age_us;
	s->bytes = *bytes;
	s->max_bytes = sd->audit_max_bytes;
	rv = moat_store_scan(txn, DB_AGE, NULL, 0, NULL, 0, sweep_cb, s,
	    errmsg);
	for (size_t i = 0; rv == MOAT_OK && i < s->n; i++) {
		bool old = moat_store_u64_from_key(s->keys[i]) < s->cutoff_us;

		/* Past the age cutoff, or still over the size bound. */
		if (!old && *bytes <= sd->audit_max_bytes)
			break;
		rv = drop_one(txn, s->keys[i], s->lens[i], &freed, errmsg);
		*bytes = *bytes > freed ? *bytes - freed : 0;
	}
	free(s);
	return rv;
}

/* put_entry: one entry; *added its bytes. */
static int
put_entry(struct moat_store_txn *txn, const Moat__V1__AuditLogEntry *e,
    uint64_t *added, char **errmsg)
{
	uint8_t key[KEY_MAX], age[8 + KEY_MAX];
	size_t tlen = strlen(e->tenant), jlen = strlen(e->json);
	uint64_t us = e->at_unix_us;
	int rv = MOAT_ALREADY_EXISTS;

	memcpy(key, e->tenant, tlen + 1);
	for (int i = 0; i < SAME_US_TRIES && rv == MOAT_ALREADY_EXISTS;
	     i++, us++) {
		moat_store_key_u64(key + tlen + 1, us);
		free(*errmsg);
		*errmsg = NULL;
		rv = moat_store_put(txn, DB_AUDIT, key, tlen + 1 + 8, e->json,
		    jlen, true, errmsg);
	}
	if (rv != MOAT_OK)
		return rv;
	memcpy(age, key + tlen + 1, 8);
	memcpy(age + 8, e->tenant, tlen);
	*added = tlen + 1 + 8 + jlen;
	return moat_store_put(txn, DB_AGE, age, 8 + tlen, "", 0, false,
	    errmsg);
}

static int
check_entries(struct moat_rpc_call *call,
    const Moat__V1__AppendAuditRequest *r)
{
	int rv;

	if (r->n_entries > APPEND_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%zu audit entries in one call: send at most %d",
		    r->n_entries, APPEND_MAX);
	for (size_t i = 0; i < r->n_entries; i++) {
		const Moat__V1__AuditLogEntry *e = r->entries[i];

		if ((rv = sessiond_check_short(call, "tenant", e->tenant,
		         SESSIOND_MAX_TENANT)) != MOAT_OK)
			return rv;
		if (e->tenant[0] == '\0' || e->at_unix_us == 0 ||
		    strlen(e->json) > ENTRY_MAX)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "audit entry %zu: needs a tenant, a time "
			    "(at_unix_us) and at most 64 KiB of JSON",
			    i);
	}
	return MOAT_OK;
}

int
sessiond_h_append_audit(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__AppendAuditRequest *req =
	    (const Moat__V1__AppendAuditRequest *)request;
	struct moat_store_txn *txn = NULL;
	uint64_t bytes = 0, added = 0;
	char *errmsg = NULL;
	int rv;

	if ((rv = check_entries(call, req)) != MOAT_OK)
		return rv;
	if ((rv = moat_store_txn_begin(sd->audit, true, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = get_bytes(txn, &bytes, &errmsg);
	for (size_t i = 0; rv == MOAT_OK && i < req->n_entries; i++) {
		rv = put_entry(txn, req->entries[i], &added, &errmsg);
		bytes += added;
	}
	if (rv == MOAT_OK)
		rv =
		    sweep(sd, txn, moat_now_unix_ms() * 1000, &bytes, &errmsg);
	if (rv == MOAT_OK)
		rv = put_bytes(txn, bytes, &errmsg);
	if (rv == MOAT_OK)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	if (rv != MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	((Moat__V1__AppendAuditReply *)reply)->appended =
	    (uint32_t)req->n_entries;
	return MOAT_OK;
}

struct list_ctx {
	const char *tenant;
	Moat__V1__AuditLogEntry **ring;
	size_t limit, n;
};

static int
list_one(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
	struct list_ctx *c = arg;
	Moat__V1__AuditLogEntry *e;
	size_t slot = c->n % c->limit;

	if (klen < 8)
		return MOAT_OK;
	if ((e = c->ring[slot]) == NULL) {
		if ((e = calloc(1, sizeof(*e))) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		moat__v1__audit_log_entry__init(e);
		c->ring[slot] = e;
	} else {
		free(e->json);
		e->json = NULL;
	}
	if ((e->json = strndup(val, vlen)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	e->at_unix_us =
	    moat_store_u64_from_key((const uint8_t *)key + klen - 8);
	c->n++;
	return MOAT_OK;
}

int
sessiond_h_list_audit_log(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__ListAuditLogRequest *req =
	    (const Moat__V1__ListAuditLogRequest *)request;
	Moat__V1__ListAuditLogReply *out =
	    (Moat__V1__ListAuditLogReply *)reply;
	struct list_ctx c = { .tenant = req->tenant, .limit = req->limit };
	struct moat_store_txn *txn = NULL;
	size_t first, count;
	char *errmsg = NULL;
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK)
		return rv;
	if (req->limit < 1 || req->limit > LIST_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "limit must be 1-%d", LIST_MAX);
	if ((c.ring = calloc(c.limit, sizeof(*c.ring))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if ((rv = moat_store_txn_begin(sd->audit, false, &txn, &errmsg)) ==
	    MOAT_OK) {
		rv = moat_store_scan(txn, DB_AUDIT, req->tenant,
		    strlen(req->tenant) + 1, NULL, 0, list_one, &c, &errmsg);
		moat_store_txn_abort(txn);
	}
	count = c.n < c.limit ? c.n : c.limit;
	first = c.n < c.limit ? 0 : c.n % c.limit;
	if (rv == MOAT_OK && count > 0 &&
	    (out->entries = calloc(count, sizeof(*out->entries))) == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	for (size_t i = 0; rv == MOAT_OK && i < count; i++) {
		size_t slot = (first + i) % c.limit;

		out->entries[i] = c.ring[slot];
		c.ring[slot] = NULL;
		if ((out->entries[i]->tenant = strdup(req->tenant)) == NULL)
			rv = MOAT_RESOURCE_EXHAUSTED;
		out->n_entries = i + 1;
	}
	for (size_t i = 0; i < c.limit; i++)
		if (c.ring[i] != NULL)
			moat__v1__audit_log_entry__free_unpacked(c.ring[i],
			    NULL);
	free(c.ring);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}
