/*
 * test_chunk.c: lib/chunk.c on real files: a sparse file whose holes come
 * back as zero chunks without being read, a written run of zeros that is
 * still a zero chunk, a short last chunk, ids that are the SHA-256 of the
 * bytes, a file written back from its chunks that is equal and sparse,
 * a writer that refuses a corrupt chunk and never leaves a partial
 * file, and one seeded from a local file without hashing it.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/sha.h>

#include "moat/chunk.h"
#include "moat/status.h"
#include "moat/util.h"

#define CS (64u << 10)
#define NCH 10
#define FILE_SIZE ((uint64_t)NCH * CS - 1000) /* last chunk is short */

static char dir[64];

static int
setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/moat-chunk-XXXXXX");
	assert_non_null(mkdtemp(dir));
	return 0;
}

static int
teardown(void **state)
{
	moat_rm_rf(dir);
	return 0;
}

struct seen {
	uint64_t n;
	struct moat_chunk c[NCH];
	bool read[NCH]; /* data was handed over (not a hole) */
};

static int
record(const struct moat_chunk *c, void *arg, char **errmsg)
{
	struct seen *s = arg;

	assert_true(s->n < NCH);
	assert_int_equal(c->index, s->n);
	s->c[s->n] = *c;
	s->read[s->n] = c->data != NULL;
	if (c->data != NULL) {
		uint8_t md[32];

		SHA256(c->data, c->len, md);
		assert_memory_equal(md, c->id.b, 32);
	}
	s->n++;
	return MOAT_OK;
}

/* make_sparse: chunks 0, 3 and 9 hold data; chunk 5 is written zeros;
 * the rest are holes. Returns the expected contents (heap). */
static uint8_t *
make_sparse(const char *path)
{
	uint8_t *want = calloc(1, FILE_SIZE);
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	const int data_chunks[] = { 0, 3, 9 };

	assert_non_null(want);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)FILE_SIZE), 0);
	for (int k = 0; k < 3; k++) {
		uint64_t off = (uint64_t)data_chunks[k] * CS;
		size_t len = off + CS > FILE_SIZE ? FILE_SIZE - off : CS;

		for (size_t i = 0; i < len; i++)
			want[off + i] = (uint8_t)(i * 7 + k + 1);
		/* One zero byte at the end of a data chunk: still data. */
		want[off + len - 1] = 0;
		assert_int_equal(pwrite(fd, want + off, len, (off_t)off),
		    (ssize_t)len);
	}
	assert_int_equal(pwrite(fd, want + 5 * CS, CS, 5 * CS), (ssize_t)CS);
	assert_int_equal(fsync(fd), 0);
	close(fd);
	return want;
}

static void
test_sparse_walk(void **state)
{
	char *path = moat_asprintf("%s/ram", dir), *errmsg = NULL;
	uint8_t *want = make_sparse(path);
	struct seen s = { 0 };
	uint64_t size = 0;

	assert_int_equal(moat_chunk_file(path, CS, record, &s, &size, &errmsg),
	    MOAT_OK);
	assert_int_equal(size, FILE_SIZE);
	assert_int_equal(s.n, NCH);
	for (int i = 0; i < NCH; i++) {
		bool data = i == 0 || i == 3 || i == 9;

		assert_int_equal(s.c[i].zero, !data);
		assert_int_equal(s.c[i].offset, (uint64_t)i * CS);
		if (!data)
			assert_true(moat_chunk_id_is_zero(&s.c[i].id));
	}
	assert_int_equal(s.c[9].len, FILE_SIZE - 9 * CS);
	/* Zero chunks, holes or written zeros, come without data. */
	for (int i = 0; i < NCH; i++)
		assert_int_equal(s.read[i], !s.c[i].zero);
	free(want);
	free(path);
}

static int
from_memory(uint64_t index, const struct moat_chunk_id *id, void *buf,
    size_t len, void *arg, char **errmsg)
{
	memcpy(buf, (const uint8_t *)arg + index * CS, len);
	return MOAT_OK;
}

static void
test_assemble_sparse(void **state)
{
	char *path = moat_asprintf("%s/ram", dir);
	char *back = moat_asprintf("%s/ram.restored", dir), *errmsg = NULL;
	uint8_t *want = make_sparse(path), *ids, *got = NULL;
	struct seen s = { 0 };
	struct stat st;
	size_t len = 0;

	assert_int_equal(moat_chunk_file(path, CS, record, &s, NULL, &errmsg),
	    MOAT_OK);
	ids = calloc(NCH, 32);
	for (int i = 0; i < NCH; i++)
		memcpy(ids + 32 * i, s.c[i].id.b, 32);
	assert_int_equal(moat_chunk_assemble(back, FILE_SIZE, CS, ids, NCH,
	                     from_memory, want, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_read_file(back, FILE_SIZE + 1, (char **)&got,
	                     &len),
	    0);
	assert_int_equal(len, FILE_SIZE);
	assert_memory_equal(got, want, FILE_SIZE);
	/* Seven zero chunks were left as holes: 3 data chunks' worth of
	 * blocks, give or take the filesystem's rounding. */
	assert_int_equal(stat(back, &st), 0);
	assert_true((uint64_t)st.st_blocks * 512 <= 4 * (uint64_t)CS);
	free(got);
	free(ids);
	free(want);
	free(path);
	free(back);
}

static void
test_writer_refuses(void **state)
{
	char *path = moat_asprintf("%s/disk", dir), *errmsg = NULL;
	struct moat_chunk_writer *w = NULL;
	uint8_t ids[2 * 32], data[2][4096];
	struct moat_chunk_id id;
	struct stat st;

	memset(data[0], 'a', sizeof(data[0]));
	memset(data[1], 'b', sizeof(data[1]));
	moat_chunk_hash(data[0], 4096, &id);
	memcpy(ids, id.b, 32);
	moat_chunk_hash(data[1], 4096, &id);
	memcpy(ids + 32, id.b, 32);
	assert_int_equal(moat_chunk_writer_open(&w, path, 8192, 4096, ids, 2,
	                     &errmsg),
	    MOAT_OK);
	/* Chunk 1's bytes at index 0: refused, nothing written. */
	assert_int_equal(moat_chunk_writer_put(w, 0, data[1], 4096, &errmsg),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(errmsg, "does not match"));
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_chunk_writer_put(w, 2, data[1], 4096, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_chunk_writer_put(w, 1, data[1], 4096, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_chunk_writer_next_missing(w, 0), 0);
	/* Chunk 0 never came: no file appears. */
	assert_int_equal(moat_chunk_writer_commit(w, &errmsg),
	    MOAT_FAILED_PRECONDITION);
	free(errmsg);
	assert_int_not_equal(stat(path, &st), 0);
	free(path);
}

/* A writer seeded from a local file by copy_trusted: a run at the same
 * offsets and a chunk from another offset arrive without put, a short
 * last chunk is copied short, a zero chunk or a range past the end is
 * refused, a short source leaves its chunks missing, and the file
 * committed is the wanted one, sparse where its chunks are zero. */
static void
test_writer_copy_trusted(void **state)
{
	char *src = moat_asprintf("%s/parent", dir);
	char *path = moat_asprintf("%s/child", dir), *errmsg = NULL, *got;
	uint8_t *want = calloc(1, FILE_SIZE), ids[NCH * 32];
	struct moat_chunk_writer *w = NULL;
	struct moat_chunk_id id;
	struct stat st;
	size_t len;
	int fd;

	/* The parent: every chunk holds data, chunk k bytes k + 1. */
	fd = open(src, O_CREAT | O_RDWR | O_TRUNC, 0600);
	assert_true(fd >= 0);
	for (uint64_t k = 0; k < NCH; k++) {
		size_t n = k == NCH - 1 ? FILE_SIZE - k * CS : CS;

		memset(want + k * CS, (int)k + 1, n);
	}
	assert_int_equal(pwrite(fd, want, FILE_SIZE, 0), (ssize_t)FILE_SIZE);
	/* The child: chunk 2 is the parent's chunk 7, chunk 4 is zero,
	 * chunk 5 is new; the rest as in the parent. */
	memcpy(want + 2 * CS, want + 7 * CS, CS);
	memset(want + 4 * CS, 0, CS);
	memset(want + 5 * CS, 0xee, CS);
	for (uint64_t k = 0; k < NCH; k++) {
		size_t n = k == NCH - 1 ? FILE_SIZE - k * CS : CS;

		if (k == 4)
			memset(&id, 0, sizeof(id));
		else
			moat_chunk_hash(want + k * CS, n, &id);
		memcpy(ids + k * 32, id.b, 32);
	}
	assert_int_equal(moat_chunk_writer_open(&w, path, FILE_SIZE, CS, ids,
	                     NCH, &errmsg),
	    MOAT_OK);
	/* Refused: a range with the zero chunk, one past the end. */
	assert_int_equal(moat_chunk_writer_copy_trusted(w, 3, 2, fd, 3,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_chunk_writer_copy_trusted(w, 9, 2, fd, 9,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_chunk_writer_next_missing(w, 0), 0);
	assert_int_equal(moat_chunk_writer_copy_trusted(w, 0, 2, fd, 0,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_chunk_writer_copy_trusted(w, 2, 1, fd, 7,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_chunk_writer_copy_trusted(w, 3, 1, fd, 3,
	                     &errmsg),
	    MOAT_OK);
	/* A source too short for chunks 6..9: they stay missing. */
	assert_int_equal(ftruncate(fd, 7 * CS), 0);
	assert_int_not_equal(moat_chunk_writer_copy_trusted(w, 6, 4, fd, 6,
	                         &errmsg),
	    MOAT_OK);
	assert_non_null(strstr(errmsg, "local file"));
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_chunk_writer_next_missing(w, 0), 5);
	assert_int_equal(moat_chunk_writer_next_missing(w, 6), 6);
	assert_int_equal(pwrite(fd, want + 7 * CS, FILE_SIZE - 7 * CS, 7 * CS),
	    (ssize_t)(FILE_SIZE - 7 * CS));
	assert_int_equal(moat_chunk_writer_copy_trusted(w, 6, 4, fd, 6,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_chunk_writer_put(w, 5, want + 5 * CS, CS,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_chunk_writer_commit(w, &errmsg), MOAT_OK);
	close(fd);
	assert_int_equal(moat_read_file(path, FILE_SIZE + 1, &got, &len), 0);
	assert_int_equal(len, FILE_SIZE);
	assert_memory_equal(got, want, FILE_SIZE);
	free(got);
	/* Chunk 4 is a hole: less allocated than the file's size. */
	assert_int_equal(stat(path, &st), 0);
	assert_true((uint64_t)st.st_blocks * 512 <= FILE_SIZE - CS + 4096);
	free(want);
	free(src);
	free(path);
}

static void
test_zero_and_bad_sizes(void **state)
{
	uint8_t buf[100] = { 0 };
	struct moat_chunk_id id;
	char *errmsg = NULL;

	assert_true(moat_chunk_is_zero(buf, 100));
	assert_true(moat_chunk_is_zero(buf, 3));
	buf[99] = 1;
	assert_false(moat_chunk_is_zero(buf, 100));
	buf[99] = 0;
	buf[5] = 1;
	assert_false(moat_chunk_is_zero(buf, 100));
	memset(&id, 0, sizeof(id));
	assert_true(moat_chunk_id_is_zero(&id));
	assert_false(moat_chunk_size_valid(1000));
	assert_false(moat_chunk_size_valid(2u << 20));
	assert_true(moat_chunk_size_valid(16384));
	assert_int_equal(moat_chunk_count(0, 4096), 0);
	assert_int_equal(moat_chunk_count(4097, 4096), 2);
	assert_int_equal(moat_chunk_file("/nonexistent/moat", CS, record, NULL,
	                     NULL, &errmsg),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(errmsg, "/nonexistent/moat"));
	free(errmsg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sparse_walk, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_assemble_sparse, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_writer_refuses, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_writer_copy_trusted,
		    setup, teardown),
		cmocka_unit_test(test_zero_and_bad_sizes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
