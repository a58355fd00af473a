/*
 * test_store.c: the LMDB wrapper: named sub-databases, put/get/del with
 * their statuses, durability across reopen, a full map reported as
 * RESOURCE_EXHAUSTED with LMDB's message and what to do, readers running
 * while a writer holds its transaction, and numeric key order.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/status.h"
#include "moat/store.h"
#include "moat/util.h"

static const char *const dbs[] = { "meta", "things", NULL };
static char dir[64];

static int
setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/moat-store-XXXXXX");
	assert_non_null(mkdtemp(dir));
	return 0;
}

static int
teardown(void **state)
{
	moat_rm_rf(dir);
	return 0;
}

static struct moat_store *
open_store(const char *sub, uint64_t map)
{
	struct moat_store *st = NULL;
	char *path = moat_asprintf("%s/%s", dir, sub), *errmsg = NULL;

	if (moat_store_open(&st, path, map, dbs, &errmsg) != MOAT_OK)
		fail_msg("open: %s", errmsg);
	free(path);
	return st;
}

static void
test_put_get_del_reopen(void **state)
{
	struct moat_store *st = open_store("a", 0);
	struct moat_store_txn *txn;
	const void *val;
	size_t len;
	uint64_t count;
	char *errmsg = NULL;

	assert_int_equal(moat_store_txn_begin(st, true, &txn, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_put(txn, "things", "k1", 2, "v1", 2, false,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_put(txn, "things", "k1", 2, "zz", 2, true,
	                     &errmsg),
	    MOAT_ALREADY_EXISTS);
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_store_put(txn, "nope", "k", 1, "v", 1, false,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(errmsg, "nope"));
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_store_put(txn, "things", "k2", 2, "v2", 2, false,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_txn_commit(txn, &errmsg), MOAT_OK);
	moat_store_close(st);

	st = open_store("a", 0);
	assert_int_equal(moat_store_txn_begin(st, false, &txn, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_get(txn, "things", "k1", 2, &val, &len,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(len, 2);
	assert_memory_equal(val, "v1", 2);
	assert_int_equal(moat_store_get(txn, "things", "k3", 2, &val, &len,
	                     &errmsg),
	    MOAT_NOT_FOUND);
	assert_null(errmsg);
	assert_int_equal(moat_store_get(txn, "meta", "k1", 2, &val, &len,
	                     &errmsg),
	    MOAT_NOT_FOUND);
	assert_int_equal(moat_store_count(txn, "things", &count, &errmsg),
	    MOAT_OK);
	assert_int_equal(count, 2);
	/* A read transaction refuses writes. */
	assert_int_equal(moat_store_put(txn, "things", "x", 1, "y", 1, false,
	                     &errmsg),
	    MOAT_INTERNAL);
	free(errmsg);
	errmsg = NULL;
	moat_store_txn_abort(txn);

	assert_int_equal(moat_store_txn_begin(st, true, &txn, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_del(txn, "things", "k1", 2, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_del(txn, "things", "k1", 2, &errmsg),
	    MOAT_NOT_FOUND);
	moat_store_txn_abort(txn); /* dropped: k1 stays */
	assert_int_equal(moat_store_txn_begin(st, false, &txn, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_get(txn, "things", "k1", 2, &val, &len,
	                     &errmsg),
	    MOAT_OK);
	moat_store_txn_abort(txn);
	moat_store_close(st);
}

static void
test_map_full(void **state)
{
	struct moat_store *st = open_store("small", 64 * 1024);
	struct moat_store_txn *txn;
	char *errmsg = NULL, value[4000];
	int rv = MOAT_OK;

	memset(value, 'x', sizeof(value));
	assert_int_equal(moat_store_txn_begin(st, true, &txn, &errmsg),
	    MOAT_OK);
	for (uint64_t i = 0; i < 1000 && rv == MOAT_OK; i++) {
		uint8_t key[8];
		moat_store_key_u64(key, i);
		rv = moat_store_put(txn, "things", key, 8, value,
		    sizeof(value), false, &errmsg);
	}
	if (rv == MOAT_OK)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(errmsg, "MDB_MAP_FULL"));
	assert_non_null(strstr(errmsg, "map-size-mib"));
	free(errmsg);
	moat_store_close(st);
}

static void
test_open_failure_names_path(void **state)
{
	struct moat_store *st = NULL;
	char *errmsg = NULL, *path;
	FILE *f;

	/* A plain file where the directory should be. */
	path = moat_asprintf("%s/file", dir);
	f = fopen(path, "w");
	fputs("x", f);
	fclose(f);
	assert_int_not_equal(moat_store_open(&st, path, 0, dbs, &errmsg),
	    MOAT_OK);
	assert_null(st);
	assert_non_null(strstr(errmsg, path));
	free(errmsg);
	free(path);
}

struct reader_arg {
	struct moat_store *st;
	int rv;
	size_t len;
};

static void *
reader_main(void *p)
{
	struct reader_arg *a = p;
	struct moat_store_txn *txn;
	const void *val;
	char *errmsg = NULL;

	if ((a->rv = moat_store_txn_begin(a->st, false, &txn, &errmsg)) !=
	    MOAT_OK)
		return NULL;
	a->rv = moat_store_get(txn, "meta", "seen", 4, &val, &a->len, &errmsg);
	moat_store_txn_abort(txn);
	free(errmsg);
	return NULL;
}

static void
test_readers_run_beside_a_writer(void **state)
{
	struct moat_store *st = open_store("rw", 0);
	struct moat_store_txn *w, *txn;
	struct reader_arg a = { .st = st };
	pthread_t t;
	char *errmsg = NULL;

	assert_int_equal(moat_store_txn_begin(st, true, &txn, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_put(txn, "meta", "seen", 4, "old", 3,
	                     false, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_txn_commit(txn, &errmsg), MOAT_OK);

	/* A writer is mid-transaction; a reader on another thread sees the
	 * committed value without waiting for it. */
	assert_int_equal(moat_store_txn_begin(st, true, &w, &errmsg), MOAT_OK);
	assert_int_equal(moat_store_put(w, "meta", "seen", 4, "newer", 5,
	                     false, &errmsg),
	    MOAT_OK);
	assert_int_equal(pthread_create(&t, NULL, reader_main, &a), 0);
	pthread_join(t, NULL);
	assert_int_equal(a.rv, MOAT_OK);
	assert_int_equal(a.len, 3);
	assert_int_equal(moat_store_txn_commit(w, &errmsg), MOAT_OK);
	moat_store_close(st);
}

static void
test_key_order(void **state)
{
	uint8_t k1[8], k2[8];

	moat_store_key_u64(k1, 255);
	moat_store_key_u64(k2, 256);
	assert_true(memcmp(k1, k2, 8) < 0);
	assert_int_equal(moat_store_u64_from_key(k2), 256);
	moat_store_key_u64(k1, 0x0102030405060708ull);
	assert_int_equal(k1[0], 1);
	assert_int_equal(k1[7], 8);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_put_get_del_reopen),
		cmocka_unit_test(test_map_full),
		cmocka_unit_test(test_open_failure_names_path),
		cmocka_unit_test(test_readers_run_beside_a_writer),
		cmocka_unit_test(test_key_order),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
