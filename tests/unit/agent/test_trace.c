/*
 * test_trace.c: moat-agent's fs_trace on a fake overlay: a lower dir (the
 * image) and an upper dir (what a step changed) built by the test, with a
 * real whiteout (mknod 0:0; the tests run as root) and, where the
 * filesystem takes trusted xattrs, an opaque directory. Checks created /
 * modified / deleted, that directories which only hold changes are not
 * reported, sha256 against OpenSSL, the entry cap, the error when the
 * agent has no overlay, and the memory of hashes: an unchanged file is
 * not read again, a changed one (same size and mtime) is, and a big
 * file written just before a trace is remembered by it. Not for: the SHA-256 code (test_sha256.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_client.h"
#include "moat/status.h"
#include "moat/util.h"

struct fixture {
	struct tagent t;
	char dir[128];
	bool opaque; /* the fs took trusted.overlay.opaque */
};

static void
put(const char *base, const char *rel, const char *content)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s%s", base, rel);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(content, f);
	fclose(f);
}

static void
dir(const char *base, const char *rel, mode_t mode)
{
	char path[512];

	snprintf(path, sizeof(path), "%s%s", base, rel);
	assert_int_equal(mkdir(path, mode), 0);
	assert_int_equal(chmod(path, mode), 0);
}

static int
setup(void **state)
{
	static struct fixture fx;
	char lower[200], upper[200], path[300];
	const char *extra[5];

	memset(&fx, 0, sizeof(fx));
	snprintf(fx.dir, sizeof(fx.dir), "/tmp/moat-trace-test.XXXXXX");
	if (mkdtemp(fx.dir) == NULL)
		return -1;
	snprintf(lower, sizeof(lower), "%s/lower", fx.dir);
	snprintf(upper, sizeof(upper), "%s/upper", fx.dir);
	dir(lower, "", 0755);
	dir(lower, "/etc", 0755);
	put(lower, "/etc/passwd", "root:x");
	put(lower, "/etc/hosts", "127.0.0.1");
	put(lower, "/etc/keep", "same");
	dir(lower, "/home", 0755);
	dir(lower, "/usr", 0755);
	dir(lower, "/usr/bin", 0755);
	put(lower, "/usr/bin/tool", "tool");
	dir(lower, "/var", 0755);
	dir(lower, "/var/log", 0755);
	put(lower, "/var/log/a.log", "a");
	put(lower, "/var/log/b.log", "b");

	dir(upper, "", 0755);
	dir(upper, "/etc", 0755);
	put(upper, "/etc/passwd", "root:y");
	snprintf(path, sizeof(path), "%s/etc/hosts", upper);
	if (mknod(path, S_IFCHR | 0, makedev(0, 0)) != 0)
		return -1;
	put(upper, "/etc/new.conf", "new");
	dir(upper, "/home", 0700);
	dir(upper, "/newdir", 0755);
	put(upper, "/newdir/file", "content");
	dir(upper, "/usr", 0755);
	dir(upper, "/usr/bin", 0755);
	put(upper, "/usr/bin/tool2", "tool2");
	dir(upper, "/var", 0755);
	dir(upper, "/var/log", 0755);
	put(upper, "/var/log/c.log", "c");
	snprintf(path, sizeof(path), "%s/var/log", upper);
	fx.opaque = setxattr(path, "trusted.overlay.opaque", "y", 1, 0) == 0;
	if (!fx.opaque)
		print_message("no trusted xattrs here (%s): opaque "
		              "directories untested\n",
		    strerror(errno));

	extra[0] = "--trace-lower";
	extra[1] = lower;
	extra[2] = "--trace-upper";
	extra[3] = upper;
	extra[4] = NULL;
	if (tagent_start(&fx.t, extra, false) != 0)
		return -1;
	*state = &fx;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *fx = *state;

	tagent_stop(&fx->t);
	(void)moat_rm_rf(fx->dir);
	return 0;
}

static Moat__V1__GuestMessage *
trace(struct tagent *t, uint32_t max, bool hash)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__FsTraceRequest fr = MOAT__V1__FS_TRACE_REQUEST__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_FS_TRACE;
	req.fs_trace = &fr;
	fr.max_entries = max;
	fr.hash = hash;
	return tagent_call(t, &req);
}

struct want {
	const char *path;
	Moat__V1__FsChange change;
	Moat__V1__FileType type;
	const char *content; /* regular files: hashed; NULL otherwise */
};

#define C MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED
#define M MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED
#define D MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED
#define REG MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR
#define DIR MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY

static void
test_trace_changes(void **state)
{
	struct fixture *fx = *state;
	static const struct want with_opaque[] = {
		{ "/etc/hosts", D, REG, NULL },
		{ "/etc/new.conf", C, REG, "new" },
		{ "/etc/passwd", M, REG, "root:y" },
		{ "/home", M, DIR, NULL },
		{ "/newdir", C, DIR, NULL },
		{ "/newdir/file", C, REG, "content" },
		{ "/usr/bin/tool2", C, REG, "tool2" },
		{ "/var/log", M, DIR, NULL },
		{ "/var/log/a.log", D, REG, NULL },
		{ "/var/log/b.log", D, REG, NULL },
		{ "/var/log/c.log", C, REG, "c" },
	};
	static const struct want without_opaque[] = {
		{ "/etc/hosts", D, REG, NULL },
		{ "/etc/new.conf", C, REG, "new" },
		{ "/etc/passwd", M, REG, "root:y" },
		{ "/home", M, DIR, NULL },
		{ "/newdir", C, DIR, NULL },
		{ "/newdir/file", C, REG, "content" },
		{ "/usr/bin/tool2", C, REG, "tool2" },
		{ "/var/log/c.log", C, REG, "c" },
	};
	const struct want *w = fx->opaque ? with_opaque : without_opaque;
	size_t n = fx->opaque ? sizeof(with_opaque) / sizeof(w[0]) :
	                        sizeof(without_opaque) / sizeof(w[0]);
	Moat__V1__GuestMessage *m = trace(&fx->t, 0, true);
	size_t i;

	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->body_case, MOAT__V1__GUEST_MESSAGE__BODY_FS_TRACE);
	assert_false(m->fs_trace->truncated);
	for (i = 0; i < m->fs_trace->n_entries; i++)
		print_message("  %s %d\n", m->fs_trace->entries[i]->path,
		    (int)m->fs_trace->entries[i]->change);
	assert_int_equal(m->fs_trace->n_entries, n);
	for (i = 0; i < n; i++) {
		Moat__V1__FsTraceEntry *e = m->fs_trace->entries[i];

		assert_string_equal(e->path, w[i].path);
		assert_int_equal(e->change, w[i].change);
		assert_int_equal(e->type, w[i].type);
		if (w[i].content != NULL) {
			uint8_t sum[SHA256_DIGEST_LENGTH];

			SHA256((const uint8_t *)w[i].content,
			    strlen(w[i].content), sum);
			assert_int_equal(e->sha256.len, sizeof(sum));
			assert_memory_equal(e->sha256.data, sum, sizeof(sum));
			assert_int_equal(e->size, strlen(w[i].content));
		} else {
			assert_int_equal(e->sha256.len, 0);
		}
	}
	assert_int_equal(m->fs_trace->entries[3]->mode, 0700);
	moat__v1__guest_message__free_unpacked(m, NULL);
}

static void
test_trace_no_hash_and_cap(void **state)
{
	struct fixture *fx = *state;
	Moat__V1__GuestMessage *m = trace(&fx->t, 0, false);
	size_t i;

	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	for (i = 0; i < m->fs_trace->n_entries; i++)
		assert_int_equal(m->fs_trace->entries[i]->sha256.len, 0);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = trace(&fx->t, 3, true);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->fs_trace->n_entries, 3);
	assert_true(m->fs_trace->truncated);
	assert_string_equal(m->fs_trace->entries[2]->path, "/etc/passwd");
	moat__v1__guest_message__free_unpacked(m, NULL);
}

/* memo_trace: a hashed trace; *sum the sha256 entry of /memo.bin, and
 * the count of files it read. */
static uint64_t
memo_trace(struct fixture *fx, uint8_t sum[32])
{
	Moat__V1__GuestMessage *m = trace(&fx->t, 0, true);
	uint64_t hashed;
	bool found = false;

	assert_non_null(m);
	assert_int_equal(m->code, MOAT_OK);
	for (size_t i = 0; i < m->fs_trace->n_entries; i++) {
		Moat__V1__FsTraceEntry *e = m->fs_trace->entries[i];

		if (strcmp(e->path, "/memo.bin") == 0) {
			assert_int_equal(e->sha256.len, 32);
			memcpy(sum, e->sha256.data, 32);
			found = true;
		}
	}
	assert_true(found);
	hashed = m->fs_trace->files_hashed;
	assert_true(hashed == 0 || m->fs_trace->bytes_hashed > 0);
	moat__v1__guest_message__free_unpacked(m, NULL);
	return hashed;
}

static void
test_trace_memo(void **state)
{
	struct fixture *fx = *state;
	char upper[200], path[300];
	uint8_t sum[32], want[32];
	struct timespec times[2];
	struct stat st;

	snprintf(upper, sizeof(upper), "%s/upper", fx->dir);
	snprintf(path, sizeof(path), "%s/memo.bin", upper);
	put(upper, "/memo.bin", "0123456789");
	usleep(100000); /* older than the settle time (20 ms) */
	assert_true(memo_trace(fx, sum) >= 1);
	SHA256((const uint8_t *)"0123456789", 10, want);
	assert_memory_equal(sum, want, 32);
	/* Nothing changed: nothing is read. */
	assert_int_equal(memo_trace(fx, sum), 0);
	assert_memory_equal(sum, want, 32);

	/* Same size, mtime put back: the ctime still tells. */
	assert_int_equal(stat(path, &st), 0);
	put(upper, "/memo.bin", "abcdefghij");
	times[0] = st.st_atim;
	times[1] = st.st_mtim;
	assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
	assert_int_equal(memo_trace(fx, sum), 1);
	SHA256((const uint8_t *)"abcdefghij", 10, want);
	assert_memory_equal(sum, want, 32);
	/* Written just before that trace, so maybe not remembered by it
	 * (how soon it ran is up to the scheduler); a settled one is. */
	usleep(100000);
	assert_true(memo_trace(fx, sum) <= 1);
	assert_int_equal(memo_trace(fx, sum), 0);
	assert_memory_equal(sum, want, 32);
	assert_int_equal(unlink(path), 0);

	/* A big file written just now: hashed once it settled, and kept. */
	{
		char *big = malloc(2u << 20);
		FILE *f;

		assert_non_null(big);
		memset(big, 'x', 2u << 20);
		snprintf(path, sizeof(path), "%s/memo.bin", upper);
		assert_non_null(f = fopen(path, "w"));
		assert_int_equal(fwrite(big, 1, 2u << 20, f), 2u << 20);
		fclose(f);
		assert_int_equal(memo_trace(fx, sum), 1);
		SHA256((const uint8_t *)big, 2u << 20, want);
		assert_memory_equal(sum, want, 32);
		assert_int_equal(memo_trace(fx, sum), 0);
		assert_memory_equal(sum, want, 32);
		free(big);
		assert_int_equal(unlink(path), 0);
	}
}

static int
start_plain(void **state)
{
	static struct tagent t;

	if (tagent_start(&t, NULL, false) != 0)
		return -1;
	*state = &t;
	return 0;
}

static int
stop_plain(void **state)
{
	tagent_stop(*state);
	return 0;
}

static void
test_trace_without_overlay(void **state)
{
	Moat__V1__GuestMessage *m;

	m = trace(*state, 0, false);
	assert_non_null(m);
	assert_int_equal(m->code, MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(m->message, "--trace-upper"));
	moat__v1__guest_message__free_unpacked(m, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_trace_changes),
		cmocka_unit_test(test_trace_no_hash_and_cap),
		cmocka_unit_test(test_trace_memo),
		cmocka_unit_test_setup_teardown(test_trace_without_overlay,
		    start_plain, stop_plain),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
