/*
 * aged.c: sessiond's small environments of its own (idempotency claims,
 * keys and tenants, the audit log, MCP sessions): opening one, failing a
 * call on it, and records kept for a bounded time and count. Each such
 * database
 * has an age index beside it: a key of 8 bytes big-endian milliseconds
 * then the record's key, to nothing, so the oldest come first. A sweep,
 * run in the write transaction that adds a record, drops records older
 * than a cutoff and the oldest past a count bound, a few at a time.
 * Not for: the recordings' own indexes (layout.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

int
sessiond_env_open(struct moat_store **st, const char *state_dir,
    const char *name, uint64_t map_bytes, const char *const *dbs,
    char **errmsg)
{
	char *dir = moat_asprintf("%s/%s", state_dir, name);
	int rv;

	if (dir == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rv = moat_store_open(st, dir, map_bytes, dbs, errmsg);
	free(dir);
	return rv;
}

int
sessiond_fail(struct moat_rpc_call *call, int status, char *errmsg)
{
	int rv = moat_rpc_error(call, status, "%s",
	    errmsg ? errmsg : moat_strerror(status));

	free(errmsg);
	return rv;
}

struct sweep {
	uint64_t cutoff_ms; /* aged before this: expired */
	uint64_t over;      /* oldest entries to drop for the count bound */
	uint8_t keys[SESSIOND_SWEEP_MAX][8 + SESSIOND_AGED_KEY_MAX];
	size_t lens[SESSIOND_SWEEP_MAX];
	size_t n;
};

static int
sweep_cb(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
	struct sweep *s = arg;

	(void)val;
	(void)vlen;
	if (s->n == SESSIOND_SWEEP_MAX || klen < 8 ||
	    klen > sizeof(s->keys[0]))
		return MOAT_STORE_SCAN_STOP;
	if (moat_store_u64_from_key(key) >= s->cutoff_ms && s->over == 0)
		return MOAT_STORE_SCAN_STOP;
	if (s->over > 0)
		s->over--;
	memcpy(s->keys[s->n], key, klen);
	s->lens[s->n++] = klen;
	return MOAT_OK;
}

int
sessiond_aged_sweep(struct moat_store_txn *txn, const char *db,
    const char *age_db, uint64_t cutoff_ms, uint64_t max, char **errmsg)
{
	struct sweep *s = calloc(1, sizeof(*s));
	uint64_t count = 0;
	int rv;

	if (s == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	s->cutoff_ms = cutoff_ms;
	if ((rv = moat_store_count(txn, db, &count, errmsg)) == MOAT_OK &&
	    count >= max)
		s->over = count - max + 1;
	if (rv == MOAT_OK)
		rv = moat_store_scan(txn, age_db, NULL, 0, NULL, 0, sweep_cb,
		    s, errmsg);
	for (size_t i = 0; rv == MOAT_OK && i < s->n; i++) {
		rv = moat_store_del(txn, db, s->keys[i] + 8, s->lens[i] - 8,
		    errmsg);
		if (rv == MOAT_NOT_FOUND)
			rv = MOAT_OK;
		if (rv == MOAT_OK)
			rv = moat_store_del(txn, age_db, s->keys[i],
			    s->lens[i], errmsg);
		if (rv == MOAT_NOT_FOUND)
			rv = MOAT_OK;
	}
	free(s);
	return rv;
}

int
sessiond_aged_index(struct moat_store_txn *txn, const char *age_db,
    uint64_t at_ms, const void *key, size_t klen, bool del, char **errmsg)
{
	uint8_t age[8 + SESSIOND_AGED_KEY_MAX];
	int rv;

	if (klen > SESSIOND_AGED_KEY_MAX)
		return MOAT_INVALID_ARGUMENT;
	moat_store_key_u64(age, at_ms);
	memcpy(age + 8, key, klen);
	if (del) {
		rv = moat_store_del(txn, age_db, age, 8 + klen, errmsg);
		return rv == MOAT_NOT_FOUND ? MOAT_OK : rv;
	}
	return moat_store_put(txn, age_db, age, 8 + klen, "", 0, false,
	    errmsg);
}
