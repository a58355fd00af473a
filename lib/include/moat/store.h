/*
 * store.h: a small wrapper over LMDB for the services that keep durable
 * state (sessiond, snapd): one environment per service directory, a fixed
 * set of named sub-databases opened once, the map size chosen by the
 * operator, fsync left on (an acknowledged write survives a crash), one
 * writer at a time (LMDB's own writer lock) and any number of concurrent
 * readers on any thread (MDB_NOTLS). LMDB errors are mapped onto moat
 * status codes with LMDB's own message kept in the text.
 * Not for: deciding what is stored (each service owns its schema) or
 * values larger than LMDB handles well (callers split outputs and chunks).
 */
#ifndef MOAT_STORE_H
#define MOAT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOAT_STORE_MAX_DBS 32
#define MOAT_STORE_DEFAULT_MAP_MIB 1024u

struct moat_store;
struct moat_store_txn;

/* moat_store_open: opens (creating if missing, mode 0700) the environment
 * in directory `path` with a map of `map_size` bytes (0: the default) and
 * the named sub-databases listed in `db_names` (NULL-terminated, at most
 * MOAT_STORE_MAX_DBS; each is created if missing). On success *out is the
 * caller's (moat_store_close). On failure returns a status and sets *errmsg
 * (heap, caller frees) naming the path and LMDB's message. */
int moat_store_open(struct moat_store **out, const char *path,
    uint64_t map_size, const char *const *db_names, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_store_close: no transaction may be open. Safe on NULL. */
void moat_store_close(struct moat_store *st);

/* moat_store_path: the directory, owned by st. */
const char *moat_store_path(const struct moat_store *st);

/* moat_store_usage: the pages the environment has written so far, in
 * bytes (LMDB never shrinks them: freed pages are reused), and its map
 * size; for metrics. Thread-safe. */
void moat_store_usage(const struct moat_store *st, uint64_t *used_bytes,
    uint64_t *map_bytes);

/* moat_store_txn_begin: a read (write == false) or write transaction.
 * A write transaction waits for the one before it to end. The transaction
 * belongs to the calling thread until it ends (commit or abort). On
 * failure returns a status and sets *errmsg (heap, caller frees). */
int moat_store_txn_begin(struct moat_store *st, bool write,
    struct moat_store_txn **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_store_txn_commit: makes a write transaction durable (fsync) and
 * ends it; ends a read transaction. The txn is freed in every case. On
 * failure (MAP_FULL: RESOURCE_EXHAUSTED saying to raise the map size)
 * returns a status and sets *errmsg (heap, caller frees). */
int moat_store_txn_commit(struct moat_store_txn *txn, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_store_txn_abort: ends and frees the transaction, dropping its
 * writes. Safe on NULL. */
void moat_store_txn_abort(struct moat_store_txn *txn);

/* moat_store_get: looks `key` up in sub-database `db`. On MOAT_OK *val
 * points into LMDB's map and is valid until the transaction ends (never
 * freed by the caller). MOAT_NOT_FOUND when absent (no *errmsg set);
 * any other status sets *errmsg (heap, caller frees). */
int moat_store_get(struct moat_store_txn *txn, const char *db, const void *key,
    size_t klen, const void **val, size_t *vlen, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_store_put: stores `val` under `key` (copied by LMDB) in a write
 * transaction, replacing any value unless no_overwrite (then an existing
 * key is ALREADY_EXISTS). Errors set *errmsg (heap, caller frees). */
int moat_store_put(struct moat_store_txn *txn, const char *db, const void *key,
    size_t klen, const void *val, size_t vlen, bool no_overwrite,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_store_del: removes `key`; NOT_FOUND (no *errmsg) when absent. */
int moat_store_del(struct moat_store_txn *txn, const char *db, const void *key,
    size_t klen, char **errmsg) __attribute__((warn_unused_result));

/* moat_store_count: number of entries in `db`. */
int moat_store_count(struct moat_store_txn *txn, const char *db,
    uint64_t *count, char **errmsg) __attribute__((warn_unused_result));

/* moat_store_txn_begin_child: a write transaction nested in `parent` (a
 * write transaction): on commit its writes join the parent's (durable only
 * when the parent commits), on abort they vanish and the parent goes on as
 * before. The parent must not be used until the child ends. Lets one
 * writer group many independent jobs into one fsync. On failure returns a
 * status and sets *errmsg (heap, caller frees). */
int moat_store_txn_begin_child(struct moat_store_txn *parent,
    struct moat_store_txn **out, char **errmsg)
    __attribute__((warn_unused_result));

/* A moat_store_scan callback: key and value point into LMDB's map, valid
 * during the call only. Returns MOAT_OK to go on, MOAT_STORE_SCAN_STOP to
 * end the scan (moat_store_scan then returns MOAT_OK), or any other status
 * to end it with that status. */
#define MOAT_STORE_SCAN_STOP (-1)
typedef int (*moat_store_scan_fn)(const void *key, size_t klen,
    const void *val, size_t vlen, void *arg);

/* moat_store_scan: calls fn, in key order, for each entry of `db` whose key
 * starts with `prefix` (plen bytes; 0 for all), beginning at the first key
 * >= `from` (flen bytes; NULL or 0 to start at the prefix). The callback
 * must not write to `db`. Errors set *errmsg (heap, caller frees). */
int moat_store_scan(struct moat_store_txn *txn, const char *db,
    const void *prefix, size_t plen, const void *from, size_t flen,
    moat_store_scan_fn fn, void *arg, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_store_key_u64 / moat_store_u64_from_key: big-endian integer keys,
 * so LMDB's byte order is numeric order. */
void moat_store_key_u64(uint8_t key[8], uint64_t v);
uint64_t moat_store_u64_from_key(const uint8_t key[8]);

/* moat_store_status_from_mdb: the moat status for an MDB_* or errno value
 * returned by LMDB. */
int moat_store_status_from_mdb(int mdb_rc);

/* moat_store_del_prefix: in a write transaction, removes every entry of
 * `db` whose key starts with `prefix` (plen >= 1) and sets *deleted (may
 * be NULL) to how many. Errors set *errmsg (heap, caller frees). */
int moat_store_del_prefix(struct moat_store_txn *txn, const char *db,
    const void *prefix, size_t plen, uint64_t *deleted, char **errmsg)
    __attribute__((warn_unused_result));

/* The on-disk format a service's store is stamped with: the value of
 * `key` in sub-database "meta". */
struct moat_store_format {
	const char *key;     /* in "meta" */
	const char *version; /* the format this program reads */
	const char *program; /* named in the refusal of another */
	/* A format `older` that upgrade brings to `version` in the write
	 * transaction given (stamping it too), or NULL: none. On failure
	 * upgrade returns a status and sets *errmsg (heap); nothing is
	 * committed. */
	const char *older;
	int (*upgrade)(struct moat_store *st, struct moat_store_txn *txn,
	    char **errmsg);
};

/* moat_store_check_format: stamps a new store with fmt->version, brings
 * one of fmt->older to it, and refuses one written in another format
 * (FAILED_PRECONDITION, saying what to do) rather than misreading it. The
 * store must have a "meta" sub-database. On failure returns a status and
 * sets *errmsg (heap, caller frees). */
int moat_store_check_format(struct moat_store *st,
    const struct moat_store_format *fmt, char **errmsg)
    __attribute__((warn_unused_result));

#endif
