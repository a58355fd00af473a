/*
 * test_record.c: the fs trace diff of recording (gateway/record.c): each
 * step lists only what changed since the previous step's trace, with
 * created / modified / deleted right in every combination of "relative to
 * the image" before and after, sizes and hashes carried, unchanged paths
 * left out, traces in any order, and empty or missing traces.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway.h"

#define CREATED MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED
#define MODIFIED MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED
#define DELETED MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED

/* A trace built on the stack: up to 8 entries, hashes one byte long. */
struct t {
	Moat__V1__FsTrace trace;
	Moat__V1__FsTraceEntry ents[8];
	Moat__V1__FsTraceEntry *ptrs[8];
	uint8_t sums[8];
};

static void
t_init(struct t *t)
{
	memset(t, 0, sizeof(*t));
	moat__v1__fs_trace__init(&t->trace);
	t->trace.entries = t->ptrs;
}

static void
t_add(struct t *t, const char *path, Moat__V1__FsChange change, uint64_t size,
    uint8_t sum)
{
	size_t i = t->trace.n_entries++;
	Moat__V1__FsTraceEntry *e = &t->ents[i];

	moat__v1__fs_trace_entry__init(e);
	e->path = (char *)path;
	e->change = change;
	e->type = MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR;
	e->size = size;
	if (change != DELETED) {
		t->sums[i] = sum;
		e->sha256.data = &t->sums[i];
		e->sha256.len = 1;
	}
	t->ptrs[i] = e;
}

static const Moat__V1__FsTraceEntry *
find(Moat__V1__FsTraceEntry **d, size_t n, const char *path)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(d[i]->path, path) == 0)
			return d[i];
	return NULL;
}

static void
test_first_step_without_prev(void **state)
{
	struct t cur;
	Moat__V1__FsTraceEntry **d = NULL;
	size_t n = 0;

	(void)state;
	t_init(&cur);
	t_add(&cur, "/root/b", CREATED, 5, 0xbb);
	t_add(&cur, "/root/a", MODIFIED, 3, 0xaa);
	assert_int_equal(moat_trace_diff(NULL, &cur.trace, &d, &n), MOAT_OK);
	assert_int_equal(n, 2);
	/* Sorted by path, deep copies with size and hash. */
	assert_string_equal(d[0]->path, "/root/a");
	assert_int_equal(d[0]->change, MODIFIED);
	assert_string_equal(d[1]->path, "/root/b");
	assert_int_equal(d[1]->change, CREATED);
	assert_int_equal(d[1]->size, 5);
	assert_int_equal(d[1]->sha256.len, 1);
	assert_int_equal(d[1]->sha256.data[0], 0xbb);
	assert_ptr_not_equal(d[1]->path, cur.ents[0].path);
	moat_trace_diff_free(d, n);
}

static void
test_unchanged_left_out(void **state)
{
	struct t prev, cur;
	Moat__V1__FsTraceEntry **d = NULL;
	size_t n = 7;

	(void)state;
	t_init(&prev);
	t_init(&cur);
	t_add(&prev, "/root/a", CREATED, 3, 1);
	t_add(&cur, "/root/a", CREATED, 3, 1);
	assert_int_equal(moat_trace_diff(&prev.trace, &cur.trace, &d, &n),
	    MOAT_OK);
	assert_int_equal(n, 0);
	assert_null(d);
	moat_trace_diff_free(d, n);
}

static void
test_created_modified_deleted(void **state)
{
	struct t prev, cur;
	Moat__V1__FsTraceEntry **d = NULL;
	const Moat__V1__FsTraceEntry *e;
	size_t n = 0;

	(void)state;
	t_init(&prev);
	t_init(&cur);
	/* step 1 made x and y; step 2 writes x again, removes y, makes z. */
	t_add(&prev, "/w/x", CREATED, 1, 1);
	t_add(&prev, "/w/y", CREATED, 2, 2);
	t_add(&cur, "/w/z", CREATED, 9, 9);
	t_add(&cur, "/w/x", CREATED, 4, 4);
	assert_int_equal(moat_trace_diff(&prev.trace, &cur.trace, &d, &n),
	    MOAT_OK);
	assert_int_equal(n, 3);
	assert_non_null(e = find(d, n, "/w/x"));
	assert_int_equal(e->change, MODIFIED);
	assert_int_equal(e->size, 4);
	assert_int_equal(e->sha256.data[0], 4);
	assert_non_null(e = find(d, n, "/w/y"));
	assert_int_equal(e->change, DELETED);
	assert_int_equal(e->sha256.len, 0);
	assert_non_null(e = find(d, n, "/w/z"));
	assert_int_equal(e->change, CREATED);
	assert_int_equal(e->size, 9);
	moat_trace_diff_free(d, n);
}

static void
test_image_files(void **state)
{
	struct t prev, cur;
	Moat__V1__FsTraceEntry **d = NULL;
	const Moat__V1__FsTraceEntry *e;
	size_t n = 0;

	(void)state;
	t_init(&prev);
	t_init(&cur);
	/* Files of the image: /etc/a deleted before, made again now;
	 * /etc/b modified before, deleted now; /etc/c deleted now for the
	 * first time; /etc/d modified before, back to the image's now;
	 * /etc/e deleted before, back to the image's now. */
	t_add(&prev, "/etc/a", DELETED, 0, 0);
	t_add(&prev, "/etc/b", MODIFIED, 1, 1);
	t_add(&prev, "/etc/d", MODIFIED, 1, 1);
	t_add(&prev, "/etc/e", DELETED, 0, 0);
	t_add(&cur, "/etc/a", MODIFIED, 6, 6);
	t_add(&cur, "/etc/b", DELETED, 0, 0);
	t_add(&cur, "/etc/c", DELETED, 0, 0);
	assert_int_equal(moat_trace_diff(&prev.trace, &cur.trace, &d, &n),
	    MOAT_OK);
	assert_int_equal(n, 5);
	assert_non_null(e = find(d, n, "/etc/a"));
	assert_int_equal(e->change, CREATED);
	assert_int_equal(e->size, 6);
	assert_non_null(e = find(d, n, "/etc/b"));
	assert_int_equal(e->change, DELETED);
	assert_non_null(e = find(d, n, "/etc/c"));
	assert_int_equal(e->change, DELETED);
	assert_non_null(e = find(d, n, "/etc/d"));
	assert_int_equal(e->change, MODIFIED);
	assert_non_null(e = find(d, n, "/etc/e"));
	assert_int_equal(e->change, CREATED);
	moat_trace_diff_free(d, n);
}

static void
test_same_size_other_hash(void **state)
{
	struct t prev, cur;
	Moat__V1__FsTraceEntry **d = NULL;
	size_t n = 0;

	(void)state;
	t_init(&prev);
	t_init(&cur);
	t_add(&prev, "/f", CREATED, 4, 1);
	t_add(&cur, "/f", CREATED, 4, 2);
	assert_int_equal(moat_trace_diff(&prev.trace, &cur.trace, &d, &n),
	    MOAT_OK);
	assert_int_equal(n, 1);
	assert_int_equal(d[0]->change, MODIFIED);
	moat_trace_diff_free(d, n);
}

static void
test_empty_and_missing(void **state)
{
	struct t prev, cur;
	Moat__V1__FsTraceEntry **d = NULL;
	size_t n = 3;

	(void)state;
	t_init(&prev);
	t_init(&cur);
	assert_int_equal(moat_trace_diff(NULL, NULL, &d, &n), MOAT_OK);
	assert_int_equal(n, 0);
	assert_int_equal(moat_trace_diff(&prev.trace, &cur.trace, &d, &n),
	    MOAT_OK);
	assert_int_equal(n, 0);
	/* Everything undone: all of prev's created files are deleted. */
	t_add(&prev, "/p", CREATED, 1, 1);
	t_add(&prev, "/q", CREATED, 1, 1);
	assert_int_equal(moat_trace_diff(&prev.trace, NULL, &d, &n), MOAT_OK);
	assert_int_equal(n, 2);
	assert_int_equal(d[0]->change, DELETED);
	assert_int_equal(d[1]->change, DELETED);
	moat_trace_diff_free(d, n);
	/* A NULL path (a malformed node answer) neither crashes nor is
	 * lost. */
	t_init(&cur);
	t_add(&cur, "/x", CREATED, 1, 1);
	cur.ents[0].path = NULL;
	assert_int_equal(moat_trace_diff(NULL, &cur.trace, &d, &n), MOAT_OK);
	assert_int_equal(n, 1);
	assert_string_equal(d[0]->path, "");
	moat_trace_diff_free(d, n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_first_step_without_prev),
		cmocka_unit_test(test_unchanged_left_out),
		cmocka_unit_test(test_created_modified_deleted),
		cmocka_unit_test(test_image_files),
		cmocka_unit_test(test_same_size_other_hash),
		cmocka_unit_test(test_empty_and_missing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
