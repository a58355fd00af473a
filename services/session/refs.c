/*
 * refs.c: how many references each snapshot id has, per tenant, so the
 * gateway knows which snapshots no recording needs any more. A step's
 * snapshot_id is one reference; a session's "moat.step0_snapshot" label
 * (the state before its step 1) is one more. The counts live in the
 * snapshot_refs sub-database (tenant NUL snapshot_id -> count, 8 bytes
 * big-endian, absent at 0); the writer changes them in the transaction of
 * the write that adds or removes a reference, so they never disagree with
 * the sessions and steps on disk. A store of format 1, written before
 * the counts existed, gets them built once when sessiond opens it.
 * Not for: deciding what to delete (the gateway does, with SnapshotRefs
 * and DeleteSession's answer), or the snapshots themselves (snapd).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

#define REFS_DB "snapshot_refs"
#define REF_KEY_MAX (SESSIOND_MAX_TENANT + 1 + SESSIOND_MAX_SNAPSHOT_ID)

/* ref_key: tenant NUL snapshot_id into key; 0 when either is empty or too
 * long to have been stored. */
static size_t
ref_key(uint8_t key[REF_KEY_MAX], const char *tenant, const char *snapshot_id)
{
	size_t lt = tenant ? strlen(tenant) : 0;
	size_t ls = snapshot_id ? strlen(snapshot_id) : 0;

	if (lt == 0 || lt > SESSIOND_MAX_TENANT || ls == 0 ||
	    ls > SESSIOND_MAX_SNAPSHOT_ID)
		return 0;
	memcpy(key, tenant, lt + 1);
	memcpy(key + lt + 1, snapshot_id, ls);
	return lt + 1 + ls;
}

/* ref_read: the count under key (0 when absent). */
static int
ref_read(struct moat_store_txn *txn, const uint8_t *key, size_t klen,
    uint64_t *count, char **errmsg)
{
	const void *val;
	size_t len;
	int rv;

	*count = 0;
	rv = moat_store_get(txn, REFS_DB, key, klen, &val, &len, errmsg);
	if (rv == MOAT_NOT_FOUND)
		return MOAT_OK;
	if (rv != MOAT_OK)
		return rv;
	if (len != 8) {
		*errmsg =
		    moat_asprintf("snapshot reference count \"%.*s\" is "
		                  "%zu bytes, not 8: the store is damaged",
		        (int)klen, (const char *)key, len);
		return MOAT_DATA_LOSS;
	}
	*count = moat_store_u64_from_key(val);
	return MOAT_OK;
}

/* ref_write: count under key, or no entry at 0. */
static int
ref_write(struct moat_store_txn *txn, const uint8_t *key, size_t klen,
    uint64_t count, char **errmsg)
{
	uint8_t val[8];
	int rv;

	if (count == 0) {
		rv = moat_store_del(txn, REFS_DB, key, klen, errmsg);
		return rv == MOAT_NOT_FOUND ? MOAT_OK : rv;
	}
	moat_store_key_u64(val, count);
	return moat_store_put(txn, REFS_DB, key, klen, val, sizeof(val), false,
	    errmsg);
}

int
sessiond_refs_get(struct moat_store_txn *txn, const char *tenant,
    const char *snapshot_id, uint64_t *count, char **errmsg)
{
	uint8_t key[REF_KEY_MAX];
	size_t klen = ref_key(key, tenant, snapshot_id);

	*count = 0;
	if (klen == 0)
		return MOAT_OK;
	return ref_read(txn, key, klen, count, errmsg);
}

int
sessiond_refs_add(struct moat_store_txn *txn, const char *tenant,
    const char *snapshot_id, uint64_t n, char **errmsg)
{
	uint8_t key[REF_KEY_MAX];
	size_t klen = ref_key(key, tenant, snapshot_id);
	uint64_t count;
	int rv;

	if (klen == 0) {
		/* Lengths are checked on the way in (validate.c). */
		*errmsg = moat_asprintf(
		    "snapshot id \"%.64s\" of tenant "
		    "\"%.64s\" cannot be counted: it is empty or over %d "
		    "bytes",
		    snapshot_id ? snapshot_id : "", tenant,
		    SESSIOND_MAX_SNAPSHOT_ID);
		return MOAT_INTERNAL;
	}
	if ((rv = ref_read(txn, key, klen, &count, errmsg)) != MOAT_OK)
		return rv;
	return ref_write(txn, key, klen, count + n, errmsg);
}

int
sessiond_refs_drop(struct moat_store_txn *txn, const char *tenant,
    const char *snapshot_id, uint64_t n, uint64_t *left, char **errmsg)
{
	uint8_t key[REF_KEY_MAX];
	size_t klen = ref_key(key, tenant, snapshot_id);
	uint64_t count;
	int rv;

	*left = 0;
	if (klen == 0)
		return MOAT_OK; /* never counted, so nothing to drop */
	if ((rv = ref_read(txn, key, klen, &count, errmsg)) != MOAT_OK)
		return rv;
	if (count < n) {
		/* The references are gone either way; say so and go on
		 * rather than refuse the write that removes them. */
		moat_warn(0,
		    "sessiond: snapshot %s of tenant \"%s\" had %llu "
		    "references counted and %llu removed: counting it as "
		    "unreferenced",
		    snapshot_id, tenant, (unsigned long long)count,
		    (unsigned long long)n);
		count = n;
	}
	*left = count - n;
	return ref_write(txn, key, klen, *left, errmsg);
}

int
sessiond_refs_move(struct moat_store_txn *txn, const char *tenant,
    const char *from, const char *to, char **errmsg)
{
	uint64_t left;
	int rv;

	if (from == NULL)
		from = "";
	if (to == NULL)
		to = "";
	if (strcmp(from, to) == 0)
		return MOAT_OK;
	if (from[0] != '\0' &&
	    (rv = sessiond_refs_drop(txn, tenant, from, 1, &left, errmsg)) !=
	        MOAT_OK)
		return rv;
	if (to[0] != '\0' &&
	    (rv = sessiond_refs_add(txn, tenant, to, 1, errmsg)) != MOAT_OK)
		return rv;
	return MOAT_OK;
}

void
sessiond_strings_free(char **strings, size_t n)
{
	if (strings == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		free(strings[i]);
	free(strings);
}

/* A growing list of heap strings (each also ended by a NUL), with their
 * lengths, since a key may hold a NUL. `oom` is set when an add failed. */
struct string_list {
	char **items;
	size_t *lens;
	size_t n;
	size_t cap;
	bool oom;
};

static int
string_list_add(struct string_list *l, const void *s, size_t len)
{
	char **items;
	size_t *lens;
	char *copy;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;

		if ((items = realloc(l->items, cap * sizeof(*items))) == NULL)
			goto oom;
		l->items = items;
		if ((lens = realloc(l->lens, cap * sizeof(*lens))) == NULL)
			goto oom;
		l->lens = lens;
		l->cap = cap;
	}
	if ((copy = malloc(len + 1)) == NULL)
		goto oom;
	memcpy(copy, s, len);
	copy[len] = '\0';
	l->items[l->n] = copy;
	l->lens[l->n++] = len;
	return MOAT_OK;

oom:
	l->oom = true;
	return MOAT_RESOURCE_EXHAUSTED;
}

static void
string_list_fini(struct string_list *l)
{
	sessiond_strings_free(l->items, l->n);
	free(l->lens);
	l->items = NULL;
	l->lens = NULL;
	l->n = l->cap = 0;
}

/* What step_visit needs: the list, and a message for a record that does
 * not decode. */
struct step_refs {
	struct string_list list;
	const char *session_id;
	char *errmsg; /* heap, with MOAT_DATA_LOSS */
};

static int
step_visit(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct step_refs *r = arg;
	Moat__V1__Step *step;
	int rv = MOAT_OK;

	if ((step = moat__v1__step__unpack(NULL, vlen, val)) == NULL) {
		r->errmsg =
		    moat_asprintf("session %s: a step record does not "
		                  "decode (%zu bytes): the store is damaged",
		        r->session_id, vlen);
		return MOAT_DATA_LOSS;
	}
	if (step->snapshot_id[0] != '\0')
		rv = string_list_add(&r->list, step->snapshot_id,
		    strlen(step->snapshot_id));
	moat__v1__step__free_unpacked(step, NULL);
	return rv;
}

int
sessiond_session_snapshots(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *s, char ***ids, size_t *n, char **errmsg)
{
	struct step_refs r = { .session_id = s->id };
	const char *step0 = sessiond_label(s, SESSIOND_LABEL_STEP0);
	char *scan_err = NULL;
	int rv;

	*ids = NULL;
	*n = 0;
	if (strlen(s->id) != SESSIOND_ID_LEN) {
		*errmsg = moat_asprintf("session record \"%.64s\" has a bad "
		                        "id: the store is damaged",
		    s->id);
		return MOAT_DATA_LOSS;
	}
	if (step0 != NULL && step0[0] != '\0')
		(void)string_list_add(&r.list, step0, strlen(step0));
	rv = r.list.oom ? MOAT_RESOURCE_EXHAUSTED :
	                  moat_store_scan(txn, "steps", s->id, SESSIOND_ID_LEN,
	                      NULL, 0, step_visit, &r, &scan_err);
	if (rv != MOAT_OK) {
		if (r.errmsg != NULL)
			*errmsg = r.errmsg;
		else if (r.list.oom)
			*errmsg = moat_asprintf("session %s: out of memory "
			                        "listing its snapshots",
			    s->id);
		else
			*errmsg = scan_err;
		if (*errmsg != scan_err)
			free(scan_err);
		string_list_fini(&r.list);
		return rv;
	}
	*ids = r.list.items;
	*n = r.list.n;
	free(r.list.lens);
	return MOAT_OK;
}

/* key_visit: gathers keys, to act on once the scan is over (a scan
 * callback must not write to the db it walks). */
static int
key_visit(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	return string_list_add(arg, key, klen);
}

/* scan_keys: every key of `db` into *keys. */
static int
scan_keys(struct moat_store_txn *txn, const char *db, struct string_list *keys,
    char **errmsg)
{
	int rv = moat_store_scan(txn, db, NULL, 0, NULL, 0, key_visit, keys,
	    errmsg);

	if (rv != MOAT_OK && keys->oom)
		*errmsg = moat_asprintf("out of memory listing the keys of "
		                        "%s (%zu so far)",
		    db, keys->n);
	return rv;
}

/* refs_clear: removes every count. */
static int
refs_clear(struct moat_store_txn *txn, char **errmsg)
{
	struct string_list keys = { 0 };
	int rv;

	if ((rv = scan_keys(txn, REFS_DB, &keys, errmsg)) != MOAT_OK)
		goto out;
	for (size_t i = 0; i < keys.n; i++)
		if ((rv = moat_store_del(txn, REFS_DB, keys.items[i],
		         keys.lens[i], errmsg)) != MOAT_OK)
			goto out;
out:
	string_list_fini(&keys);
	return rv;
}

/* refs_count_session: adds the references of the session stored under
 * `id`; *refs grows by their number. */
static int
refs_count_session(struct moat_store_txn *txn, const char *id, uint64_t *refs,
    char **errmsg)
{
	Moat__V1__SessionInfo *s;
	const void *val;
	char **ids = NULL;
	size_t len, n = 0;
	int rv;

	if ((rv = moat_store_get(txn, "sessions", id, SESSIOND_ID_LEN, &val,
	         &len, errmsg)) != MOAT_OK)
		return rv;
	if ((s = moat__v1__session_info__unpack(NULL, len, val)) == NULL) {
		*errmsg =
		    moat_asprintf("session %s: its record does not "
		                  "decode (%zu bytes): the store is damaged",
		        id, len);
		return MOAT_DATA_LOSS;
	}
	if ((rv = sessiond_session_snapshots(txn, s, &ids, &n, errmsg)) !=
	    MOAT_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		if ((rv = sessiond_refs_add(txn, s->tenant, ids[i], 1,
		         errmsg)) != MOAT_OK)
			goto out;
		(*refs)++;
	}
out:
	sessiond_strings_free(ids, n);
	moat__v1__session_info__free_unpacked(s, NULL);
	return rv;
}

int
sessiond_refs_build(struct moat_store_txn *txn, uint64_t *sessions,
    uint64_t *refs, char **errmsg)
{
	struct string_list ids = { 0 };
	int rv;

	*sessions = 0;
	*refs = 0;
	if ((rv = refs_clear(txn, errmsg)) != MOAT_OK ||
	    (rv = scan_keys(txn, "sessions", &ids, errmsg)) != MOAT_OK)
		goto out;
	for (size_t i = 0; i < ids.n; i++) {
		if (ids.lens[i] != SESSIOND_ID_LEN ||
		    strlen(ids.items[i]) != SESSIOND_ID_LEN) {
			*errmsg = moat_asprintf(
			    "sessions holds a key of %zu "
			    "bytes that is not a session id: the store is "
			    "damaged",
			    ids.lens[i]);
			rv = MOAT_DATA_LOSS;
			goto out;
		}
		if ((rv = refs_count_session(txn, ids.items[i], refs,
		         errmsg)) != MOAT_OK)
			goto out;
		(*sessions)++;
	}
out:
	string_list_fini(&ids);
	return rv;
}
