/*
 * store.c: the LMDB wrapper behind moat/store.h: environment and named
 * sub-databases opened once, transactions, get/put/del, and the mapping of
 * LMDB's errors onto moat status codes. Not for: any service's schema, or
 * a writer thread (LMDB's writer lock already serialises writers; a
 * service that batches writes runs its own thread on top of this).
 */
#include <errno.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

struct moat_store {
	MDB_env *env;
	char *path;
	size_t n_dbs;
	char *db_names[MOAT_STORE_MAX_DBS];
	MDB_dbi dbis[MOAT_STORE_MAX_DBS];
};

struct moat_store_txn {
	struct moat_store *st;
	MDB_txn *txn;
	bool write;
};

int
moat_store_status_from_mdb(int rc)
{
	switch (rc) {
	case MDB_SUCCESS:
		return MOAT_OK;
	case MDB_NOTFOUND:
		return MOAT_NOT_FOUND;
	case MDB_KEYEXIST:
		return MOAT_ALREADY_EXISTS;
	case MDB_MAP_FULL:
	case MDB_DBS_FULL:
	case MDB_READERS_FULL:
	case MDB_TXN_FULL:
	case MDB_CURSOR_FULL:
	case MDB_PAGE_FULL:
	case MDB_TLS_FULL:
		return MOAT_RESOURCE_EXHAUSTED;
	case MDB_CORRUPTED:
	case MDB_PAGE_NOTFOUND:
		return MOAT_DATA_LOSS;
	case MDB_VERSION_MISMATCH:
	case MDB_INVALID:
	case MDB_INCOMPATIBLE:
		return MOAT_FAILED_PRECONDITION;
	case MDB_MAP_RESIZED:
	case MDB_BAD_RSLOT:
	case MDB_BAD_TXN:
	case MDB_BAD_VALSIZE:
	case MDB_BAD_DBI:
		return MOAT_INTERNAL;
	default:
		if (rc > 0)
			return moat_status_from_errno(rc);
		return MOAT_INTERNAL;
	}
}

/* store_fail: sets *errmsg to "<what>: <LMDB's message><hint>" and
 * returns the mapped status. */
static int
store_fail(char **errmsg, int rc, const char *fmt, ...)
{
	char what[512];
	const char *hint = "";
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (rc == MDB_MAP_FULL)
		hint = ": raise the map size (--map-size-mib or map-size-mib "
		       "in moat.conf) and restart the service";
	else if (rc == MDB_VERSION_MISMATCH || rc == MDB_INVALID)
		hint = ": the directory holds something that is not this "
		       "LMDB version's environment; move it away or point "
		       "--state-dir elsewhere";
	else if (rc == EACCES)
		hint = ": check the directory's owner and mode";
	if (errmsg != NULL)
		*errmsg =
		    moat_asprintf("%s: %s%s", what, mdb_strerror(rc), hint);
	return moat_store_status_from_mdb(rc);
}

void
moat_store_usage(const struct moat_store *st, uint64_t *used_bytes,
    uint64_t *map_bytes)
{
	MDB_envinfo info;
	MDB_stat stat;

	*used_bytes = *map_bytes = 0;
	if (st == NULL || mdb_env_info(st->env, &info) != 0 ||
	    mdb_env_stat(st->env, &stat) != 0)
		return;
	*used_bytes = ((uint64_t)info.me_last_pgno + 1) * stat.ms_psize;
	*map_bytes = info.me_mapsize;
}

int
moat_store_open(struct moat_store **out, const char *path, uint64_t map_size,
    const char *const *db_names, char **errmsg)
{
	struct moat_store *st;
	MDB_txn *txn = NULL;
	int rc, status;
	size_t n = 0;

	*out = NULL;
	while (db_names != NULL && db_names[n] != NULL)
		n++;
	if (n > MOAT_STORE_MAX_DBS) {
		*errmsg = moat_asprintf("store %s: %zu sub-databases asked, "
		                        "at most %d",
		    path, n, MOAT_STORE_MAX_DBS);
		return MOAT_INVALID_ARGUMENT;
	}
	if (map_size == 0)
		map_size = (uint64_t)MOAT_STORE_DEFAULT_MAP_MIB << 20;
	if ((st = calloc(1, sizeof(*st))) == NULL ||
	    (st->path = strdup(path)) == NULL) {
		free(st);
		*errmsg = moat_asprintf("store %s: out of memory", path);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((rc = moat_mkdir_p(path, 0700)) != 0) {
		status = moat_status_from_errno(rc);
		*errmsg = moat_asprintf("store %s: cannot create the "
		                        "directory: %s",
		    path, strerror(rc));
		goto fail_st;
	}
	if ((rc = mdb_env_create(&st->env)) != 0) {
		status =
		    store_fail(errmsg, rc, "store %s: mdb_env_create", path);
		goto fail_st;
	}
	if ((rc = mdb_env_set_mapsize(st->env, (size_t)map_size)) != 0 ||
	    (rc = mdb_env_set_maxdbs(st->env, MOAT_STORE_MAX_DBS)) != 0 ||
	    (rc = mdb_env_set_maxreaders(st->env, 256)) != 0) {
		status = store_fail(errmsg, rc,
		    "store %s: configuring the "
		    "environment (map size %llu bytes)",
		    path, (unsigned long long)map_size);
		goto fail_env;
	}
	/* MDB_NOTLS: read transactions are not tied to a thread, so an RPC
	 * worker pool can hold many. No MDB_NOSYNC: fsync stays on. */
	if ((rc = mdb_env_open(st->env, path, MDB_NOTLS, 0600)) != 0) {
		status = store_fail(errmsg, rc,
		    "store %s: opening the LMDB "
		    "environment",
		    path);
		goto fail_env;
	}
	if ((rc = mdb_txn_begin(st->env, NULL, 0, &txn)) != 0) {
		status = store_fail(errmsg, rc, "store %s: first transaction",
		    path);
		goto fail_env;
	}
	for (size_t i = 0; i < n; i++) {
		if ((st->db_names[i] = strdup(db_names[i])) == NULL) {
			*errmsg =
			    moat_asprintf("store %s: out of memory", path);
			status = MOAT_RESOURCE_EXHAUSTED;
			goto fail_txn;
		}
		st->n_dbs = i + 1;
		if ((rc = mdb_dbi_open(txn, db_names[i], MDB_CREATE,
		         &st->dbis[i])) != 0) {
			status = store_fail(errmsg, rc,
			    "store %s: opening "
			    "sub-database \"%s\"",
			    path, db_names[i]);
			goto fail_txn;
		}
	}
	if ((rc = mdb_txn_commit(txn)) != 0) {
		txn = NULL;
		status = store_fail(errmsg, rc,
		    "store %s: creating the "
		    "sub-databases",
		    path);
		goto fail_env;
	}
	*out = st;
	return MOAT_OK;

fail_txn:
	mdb_txn_abort(txn);
fail_env:
	mdb_env_close(st->env);
	st->env = NULL;
fail_st:
	moat_store_close(st);
	return status;
}

void
moat_store_close(struct moat_store *st)
{
	if (st == NULL)
		return;
	if (st->env != NULL)
		mdb_env_close(st->env);
	for (size_t i = 0; i < st->n_dbs; i++)
		free(st->db_names[i]);
	free(st->path);
	free(st);
}

const char *
moat_store_path(const struct moat_store *st)
{
	return st->path;
}

int
moat_store_txn_begin(struct moat_store *st, bool write,
    struct moat_store_txn **out, char **errmsg)
{
	struct moat_store_txn *t;
	int rc;

	*out = NULL;
	if ((t = calloc(1, sizeof(*t))) == NULL) {
		*errmsg = moat_asprintf("store %s: out of memory", st->path);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	t->st = st;
	t->write = write;
	if ((rc = mdb_txn_begin(st->env, NULL, write ? 0 : MDB_RDONLY,
	         &t->txn)) != 0) {
		free(t);
		return store_fail(errmsg, rc,
		    "store %s: beginning a %s "
		    "transaction",
		    st->path, write ? "write" : "read");
	}
	*out = t;
	return MOAT_OK;
}

int
moat_store_txn_commit(struct moat_store_txn *t, char **errmsg)
{
	struct moat_store *st = t->st;
	int rc = mdb_txn_commit(t->txn);

	free(t);
	if (rc != 0)
		return store_fail(errmsg, rc, "store %s: commit", st->path);
	return MOAT_OK;
}

void
moat_store_txn_abort(struct moat_store_txn *t)
{
	if (t == NULL)
		return;
	mdb_txn_abort(t->txn);
	free(t);
}

/* store_dbi: the handle of a named sub-database opened by
 * moat_store_open; INVALID_ARGUMENT for any other name (a programming
 * error in the service, reported rather than crashing). */
static int
store_dbi(struct moat_store_txn *t, const char *db, MDB_dbi *dbi,
    char **errmsg)
{
	for (size_t i = 0; i < t->st->n_dbs; i++) {
		if (strcmp(t->st->db_names[i], db) == 0) {
			*dbi = t->st->dbis[i];
			return MOAT_OK;
		}
	}
	*errmsg = moat_asprintf("store %s: no sub-database \"%s\" was "
	                        "opened",
	    t->st->path, db);
	return MOAT_INVALID_ARGUMENT;
}

int
moat_store_get(struct moat_store_txn *t, const char *db, const void *key,
    size_t klen, const void **val, size_t *vlen, char **errmsg)
{
	MDB_val k = { .mv_size = klen, .mv_data = (void *)key };
	MDB_val v;
	MDB_dbi dbi;
	int rc;

	*val = NULL;
	*vlen = 0;
	if ((rc = store_dbi(t, db, &dbi, errmsg)) != MOAT_OK)
		return rc;
	rc = mdb_get(t->txn, dbi, &k, &v);
	if (rc == MDB_NOTFOUND)
		return MOAT_NOT_FOUND;
	if (rc != 0)
		return store_fail(errmsg, rc, "store %s: get in \"%s\"",
		    t->st->path, db);
	*val = v.mv_data;
	*vlen = v.mv_size;
	return MOAT_OK;
}

int
moat_store_put(struct moat_store_txn *t, const char *db, const void *key,
    size_t klen, const void *val, size_t vlen, bool no_overwrite,
    char **errmsg)
{
	MDB_val k = { .mv_size = klen, .mv_data = (void *)key };
	MDB_val v = { .mv_size = vlen, .mv_data = (void *)val };
	MDB_dbi dbi;
	int rc;

	if ((rc = store_dbi(t, db, &dbi, errmsg)) != MOAT_OK)
		return rc;
	if (!t->write) {
		*errmsg = moat_asprintf("store %s: put in \"%s\" inside a "
		                        "read transaction",
		    t->st->path, db);
		return MOAT_INTERNAL;
	}
	rc = mdb_put(t->txn, dbi, &k, &v, no_overwrite ? MDB_NOOVERWRITE : 0);
	if (rc != 0)
		return store_fail(errmsg, rc,
		    "store %s: put in \"%s\" "
		    "(%zu-byte key, %zu-byte value)",
		    t->st->path, db, klen, vlen);
	return MOAT_OK;
}

int
moat_store_del(struct moat_store_txn *t, const char *db, const void *key,
    size_t klen, char **errmsg)
{
	MDB_val k = { .mv_size = klen, .mv_data = (void *)key };
	MDB_dbi dbi;
	int rc;

	if ((rc = store_dbi(t, db, &dbi, errmsg)) != MOAT_OK)
		return rc;
	rc = mdb_del(t->txn, dbi, &k, NULL);
	if (rc == MDB_NOTFOUND)
		return MOAT_NOT_FOUND;
	if (rc != 0)
		return store_fail(errmsg, rc, "store %s: delete in \"%s\"",
		    t->st->path, db);
	return MOAT_OK;
}

int
moat_store_count(struct moat_store_txn *t, const char *db, uint64_t *count,
    char **errmsg)
{
	MDB_stat ms;
	MDB_dbi dbi;
	int rc;

	*count = 0;
	if ((rc = store_dbi(t, db, &dbi, errmsg)) != MOAT_OK)
		return rc;
	if ((rc = mdb_stat(t->txn, dbi, &ms)) != 0)
		return store_fail(errmsg, rc, "store %s: stat of \"%s\"",
		    t->st->path, db);
	*count = ms.ms_entries;
	return MOAT_OK;
}

int
moat_store_txn_begin_child(struct moat_store_txn *parent,
    struct moat_store_txn **out, char **errmsg)
{
	struct moat_store *st = parent->st;
	struct moat_store_txn *t;
	int rc;

	*out = NULL;
	if (!parent->write) {
		*errmsg = moat_asprintf("store %s: a nested transaction needs "
		                        "a write parent",
		    st->path);
		return MOAT_INTERNAL;
	}
	if ((t = calloc(1, sizeof(*t))) == NULL) {
		*errmsg = moat_asprintf("store %s: out of memory", st->path);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	t->st = st;
	t->write = true;
	if ((rc = mdb_txn_begin(st->env, parent->txn, 0, &t->txn)) != 0) {
		free(t);
		return store_fail(errmsg, rc,
		    "store %s: beginning a nested "
		    "transaction",
		    st->path);
	}
	*out = t;
	return MOAT_OK;
}

int
moat_store_scan(struct moat_store_txn *t, const char *db, const void *prefix,
    size_t plen, const void *from, size_t flen, moat_store_scan_fn fn,
    void *arg, char **errmsg)
{
	MDB_cursor *cur = NULL;
	MDB_val k, v;
	MDB_dbi dbi;
	int rc, rv;

	if ((rv = store_dbi(t, db, &dbi, errmsg)) != MOAT_OK)
		return rv;
	if ((rc = mdb_cursor_open(t->txn, dbi, &cur)) != 0)
		return store_fail(errmsg, rc, "store %s: cursor on \"%s\"",
		    t->st->path, db);
	if (from == NULL || flen == 0) {
		from = prefix;
		flen = plen;
	}
	k.mv_size = flen;
	k.mv_data = (void *)from;
	rc = flen == 0 ? mdb_cursor_get(cur, &k, &v, MDB_FIRST) :
	                 mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	rv = MOAT_OK;
	while (rc == 0) {
		if (plen > 0 &&
		    (k.mv_size < plen || memcmp(k.mv_data, prefix, plen) != 0))
			break;
		rv = fn(k.mv_data, k.mv_size, v.mv_data, v.mv_size, arg);
		if (rv != MOAT_OK)
			break;
		rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
	}
	mdb_cursor_close(cur);
	if (rv == MOAT_STORE_SCAN_STOP)
		return MOAT_OK;
	if (rv != MOAT_OK)
		return rv;
	if (rc != 0 && rc != MDB_NOTFOUND)
		return store_fail(errmsg, rc, "store %s: scan of \"%s\"",
		    t->st->path, db);
	return MOAT_OK;
}

void
moat_store_key_u64(uint8_t key[8], uint64_t v)
{
	for (int i = 7; i >= 0; i--) {
		key[i] = (uint8_t)(v & 0xff);
		v >>= 8;
	}
}

uint64_t
moat_store_u64_from_key(const uint8_t key[8])
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = (v << 8) | key[i];
	return v;
}

/* key_has_prefix: whether an LMDB key starts with prefix. */
static bool
key_has_prefix(const MDB_val *k, const void *prefix, size_t plen)
{
	return k->mv_size >= plen && memcmp(k->mv_data, prefix, plen) == 0;
}

int
moat_store_del_prefix(struct moat_store_txn *t, const char *db,
    const void *prefix, size_t plen, uint64_t *deleted, char **errmsg)
{
	MDB_cursor *cur;
	MDB_val k, v;
	MDB_dbi dbi;
	uint64_t n = 0;
	int rc, status = MOAT_OK;

	if (deleted != NULL)
		*deleted = 0;
	if ((rc = store_dbi(t, db, &dbi, errmsg)) != MOAT_OK)
		return rc;
	if (!t->write || plen == 0) {
		*errmsg =
		    moat_asprintf("store %s: prefix delete in \"%s\" "
		                  "needs a write transaction and a prefix",
		        t->st->path, db);
		return MOAT_INTERNAL;
	}
	if ((rc = mdb_cursor_open(t->txn, dbi, &cur)) != 0)
		return store_fail(errmsg, rc, "store %s: cursor on \"%s\"",
		    t->st->path, db);
	k.mv_data = (void *)prefix;
	k.mv_size = plen;
	rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	while (rc == 0 && key_has_prefix(&k, prefix, plen)) {
		if ((rc = mdb_cursor_del(cur, 0)) != 0)
			break;
		n++;
		/* Seek again rather than trust the cursor's position after
		 * deleting the last entry of a page or of the db. */
		k.mv_data = (void *)prefix;
		k.mv_size = plen;
		rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
	}
	if (rc != 0 && rc != MDB_NOTFOUND)
		status = store_fail(errmsg, rc,
		    "store %s: prefix delete in "
		    "\"%s\"",
		    t->st->path, db);
	mdb_cursor_close(cur);
	if (deleted != NULL)
		*deleted = n;
	return status;
}

int
moat_store_check_format(struct moat_store *st,
    const struct moat_store_format *fmt, char **errmsg)
{
	size_t klen = strlen(fmt->key), vlen = strlen(fmt->version);
	struct moat_store_txn *txn;
	const void *val;
	size_t len;
	int rv;

	if ((rv = moat_store_txn_begin(st, true, &txn, errmsg)) != MOAT_OK)
		return rv;
	rv = moat_store_get(txn, "meta", fmt->key, klen, &val, &len, errmsg);
	if (rv == MOAT_NOT_FOUND) {
		if ((rv = moat_store_put(txn, "meta", fmt->key, klen,
		         fmt->version, vlen, true, errmsg)) != MOAT_OK)
			goto fail;
		return moat_store_txn_commit(txn, errmsg);
	}
	if (rv != MOAT_OK)
		goto fail;
	if (fmt->older != NULL && len == strlen(fmt->older) &&
	    memcmp(val, fmt->older, len) == 0) {
		if ((rv = fmt->upgrade(st, txn, errmsg)) != MOAT_OK)
			goto fail;
		return moat_store_txn_commit(txn, errmsg);
	}
	if (len != vlen || memcmp(val, fmt->version, len) != 0) {
		*errmsg = moat_asprintf(
		    "store %s has format \"%.*s\"; this "
		    "%s reads format %s: run the moat version that wrote it, "
		    "or move the directory away",
		    moat_store_path(st), (int)(len < 32 ? len : 32),
		    (const char *)val, fmt->program, fmt->version);
		rv = MOAT_FAILED_PRECONDITION;
		goto fail;
	}
	moat_store_txn_abort(txn);
	return MOAT_OK;

fail:
	moat_store_txn_abort(txn);
	return rv;
}
