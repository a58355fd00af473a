/*
 * test_tar.c: unit tests of lib/tar*.c with archives crafted here: each
 * refusal of the checker (absolute names, "..", device nodes, fifos, hard
 * links, a member under an earlier symlink, a bad checksum, a cut-off
 * archive, over the cap) writes nothing; long names through pax and GNU
 * 'L' records; sizes in base-256; a pack/unpack round trip of a tree with
 * a long name, a symlink, modes and an empty directory; a symlink already
 * in the target is never written through. Not for: the RPCs (agent and
 * integration tests).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

static char tmpdir[] = "/tmp/moat-test-tar-XXXXXX";

static int
setup(void **state)
{
	(void)state;
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	return moat_rm_rf(tmpdir);
}

static int
archive(void)
{
	FILE *f = tmpfile();

	assert_non_null(f);
	return dup(fileno(f)); /* the FILE leaks until exit: fine here */
}

static void
add(int fd, char type, const char *name, const char *link, const char *data)
{
	size_t len = data ? strlen(data) : 0;
	struct moat_tar_entry e = { type, (char *)name, (char *)link, len,
		0644, 1700000000 };
	static const char zeros[MOAT_TAR_BLOCK];

	assert_int_equal(moat_tar_write_header(fd, &e), 0);
	if (len) {
		assert_int_equal(moat_tar_write_all(fd, data, len), 0);
		assert_int_equal(moat_tar_write_all(fd, zeros,
		                     (MOAT_TAR_BLOCK - len % MOAT_TAR_BLOCK) %
		                         MOAT_TAR_BLOCK),
		    0);
	}
}

/* fresh_target: an empty directory for one unpack; returns its fd. */
static int
fresh_target(const char *name, char *path, size_t len)
{
	snprintf(path, len, "%s/%s", tmpdir, name);
	(void)moat_rm_rf(path);
	assert_int_equal(mkdir(path, 0755), 0);
	return open(path, O_RDONLY | O_DIRECTORY);
}

static int
count_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

/* expect_refused: the archive fails the check with code and a message
 * holding `needle`, and unpacking it writes nothing. */
static void
expect_refused(int fd, uint64_t cap, int code, const char *needle)
{
	char path[512], *why = NULL;
	int dfd, rv;

	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	rv = moat_tar_check(fd, cap, NULL, &why);
	assert_int_equal(rv, code);
	assert_non_null(why);
	if (strstr(why, needle) == NULL)
		fail_msg("\"%s\" not in \"%s\"", needle, why);
	free(why);
	why = NULL;
	dfd = fresh_target("refused", path, sizeof(path));
	assert_int_equal(moat_tar_unpack(fd, dfd, cap, NULL, &why), code);
	free(why);
	close(dfd);
	assert_int_equal(count_entries(path), 0);
	close(fd);
}

static void
test_refusals(void **state)
{
	int fd;

	(void)state;
	fd = archive();
	add(fd, '0', "ok", NULL, "x");
	add(fd, '0', "/etc/passwd", NULL, "x");
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "absolute");

	fd = archive();
	add(fd, '0', "../x", NULL, "x");
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "\"../x\"");

	fd = archive();
	add(fd, '5', "a/", NULL, NULL);
	add(fd, '0', "a/./b/../../../x", NULL, "x");
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "..");

	fd = archive();
	add(fd, '3', "dev/null", NULL, NULL);
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "device node");

	fd = archive();
	add(fd, '4', "blk", NULL, NULL);
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "device node");

	fd = archive();
	add(fd, '6', "pipe", NULL, NULL);
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "fifo");

	fd = archive();
	add(fd, '0', "f", NULL, "x");
	add(fd, '1', "g", "f", NULL);
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "hard link");

	fd = archive();
	add(fd, '2', "l", "/etc", NULL);
	add(fd, '0', "l/passwd", NULL, "x");
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "\"l/passwd\"");

	fd = archive();
	add(fd, '2', "./d/l", "..", NULL);
	add(fd, '0', "d//l", NULL, "x");
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "symlink");

	fd = archive();
	add(fd, '0', "a", NULL, "12345");
	add(fd, '0', "b", NULL, "12345");
	expect_refused(fd, 8, MOAT_RESOURCE_EXHAUSTED, "\"b\"");
}

static void
test_damaged(void **state)
{
	char byte;
	int fd;

	(void)state;
	fd = archive();
	add(fd, '0', "a", NULL, "hello");
	add(fd, '0', "b", NULL, "world");
	assert_int_equal(pread(fd, &byte, 1, 512 + 512 + 3), 1);
	byte ^= 1; /* b's name */
	assert_int_equal(pwrite(fd, &byte, 1, 512 + 512 + 3), 1);
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "checksum");

	fd = archive();
	add(fd, '0', "a", NULL, "hello");
	assert_int_equal(ftruncate(fd, 512 + 3), 0);
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "truncated");

	fd = archive();
	assert_int_equal(moat_tar_write_all(fd, "not a tar archive", 17), 0);
	expect_refused(fd, 0, MOAT_INVALID_ARGUMENT, "truncated");
}

/* A GNU 'L' long name, a pax path and a base-256 size are read. */
static void
test_long_names(void **state)
{
	char name[300], gnu[MOAT_TAR_BLOCK] = { 0 }, path[512], *why = NULL;
	struct moat_tar_reader r;
	struct moat_tar_entry *e;
	struct stat st;
	int fd = archive(), dfd;

	(void)state;
	memset(name, 'n', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	memcpy(name + 100, "/", 1);
	/* GNU: a 'L' member whose data is the name, then the real one. */
	struct moat_tar_entry l = { 'L', "././@LongLink", NULL,
		strlen(name) + 1, 0644, 0 };
	assert_int_equal(moat_tar_write_header(fd, &l), 0);
	memcpy(gnu, name, strlen(name));
	assert_int_equal(moat_tar_write_all(fd, gnu, sizeof(gnu)), 0);
	add(fd, '0', "truncated-name", NULL, "gnu");
	add(fd, '0', name + 101, NULL, "pax"); /* 198 bytes: pax path */
	assert_int_equal(moat_tar_write_end(fd), 0);

	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	moat_tar_reader_init(&r, fd);
	assert_int_equal(moat_tar_next(&r, &e, &why), 1);
	assert_string_equal(e->name, name);
	assert_int_equal(e->size, 3);
	assert_int_equal(moat_tar_next(&r, &e, &why), 1);
	assert_string_equal(e->name, name + 101);
	assert_int_equal(moat_tar_next(&r, &e, &why), 0);
	moat_tar_reader_free(&r);

	dfd = fresh_target("long", path, sizeof(path));
	assert_int_equal(moat_tar_unpack(fd, dfd, 0, NULL, &why), 0);
	assert_int_equal(fstatat(dfd, name, &st, 0), 0);
	assert_int_equal(st.st_size, 3);
	assert_int_equal(fstatat(dfd, name + 101, &st, 0), 0);
	close(dfd);
	close(fd);
}

/* base-256 size fields (GNU tar over 8 GiB) are decoded. */
static void
test_base256(void **state)
{
	unsigned char b[MOAT_TAR_BLOCK];
	struct moat_tar_reader r;
	struct moat_tar_entry *e;
	char *why = NULL;
	unsigned sum = 0;
	int fd = archive();

	(void)state;
	add(fd, '0', "big", NULL, NULL);
	assert_int_equal(pread(fd, b, sizeof(b), 0), sizeof(b));
	memset(b + 124, 0, 12);
	b[124] = 0x80;
	b[130] = 0x02; /* 2 << 40 */
	memset(b + 148, ' ', 8);
	for (size_t i = 0; i < sizeof(b); i++)
		sum += b[i];
	snprintf((char *)b + 148, 8, "%06o", sum);
	assert_int_equal(pwrite(fd, b, sizeof(b), 0), sizeof(b));
	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	moat_tar_reader_init(&r, fd);
	assert_int_equal(moat_tar_next(&r, &e, &why), 1);
	assert_int_equal(e->size, 2ull << 40);
	moat_tar_reader_free(&r);
	close(fd);
}

static void
write_text(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

	assert_true(fd >= 0);
	assert_int_equal(moat_tar_write_all(fd, text, strlen(text)), 0);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

/* A tree packed and unpacked comes back the same. */
static void
test_round_trip(void **state)
{
	char src[512], dst[512], p[1024], link[64], *why = NULL, *data;
	char longdir[200];
	struct moat_tar_stats st = { 0 }, ust = { 0 };
	struct stat s;
	size_t len;
	int sfd, afd = archive(), dfd;
	ssize_t n;

	(void)state;
	snprintf(src, sizeof(src), "%s/src", tmpdir);
	memset(longdir, 'd', sizeof(longdir) - 1);
	longdir[sizeof(longdir) - 1] = '\0';
	assert_int_equal(mkdir(src, 0755), 0);
	snprintf(p, sizeof(p), "%s/a", src);
	assert_int_equal(mkdir(p, 0750), 0);
	snprintf(p, sizeof(p), "%s/a/%s", src, longdir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/a/%s/deep.txt", src, longdir);
	write_text(p, "deep", 0600);
	snprintf(p, sizeof(p), "%s/run.sh", src);
	write_text(p, "#!/bin/sh\n", 04755);
	snprintf(p, sizeof(p), "%s/empty", src);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/link", src);
	assert_int_equal(symlink("/nowhere/../x", p), 0);
	snprintf(p, sizeof(p), "%s/fifo", src);
	assert_int_equal(mkfifo(p, 0600), 0);

	sfd = open(src, O_RDONLY | O_DIRECTORY);
	assert_int_equal(moat_tar_pack(sfd, "src", afd, &st, &why), 0);
	close(sfd);
	assert_int_equal(st.files, 2);
	assert_int_equal(st.dirs, 3);
	assert_int_equal(st.symlinks, 1);
	assert_int_equal(st.skipped, 1);
	assert_int_equal(st.bytes, 14);

	dfd = fresh_target("dst", dst, sizeof(dst));
	assert_int_equal(moat_tar_unpack(afd, dfd, 0, &ust, &why), 0);
	assert_int_equal(ust.files, 2);
	assert_int_equal(ust.dirs, 3);
	assert_int_equal(ust.symlinks, 1);
	snprintf(p, sizeof(p), "%s/a/%s/deep.txt", dst, longdir);
	assert_int_equal(moat_read_file(p, 100, &data, &len), 0);
	assert_int_equal(len, 4);
	assert_memory_equal(data, "deep", 4);
	free(data);
	assert_int_equal(stat(p, &s), 0);
	assert_int_equal(s.st_mode & 07777, 0600);
	snprintf(p, sizeof(p), "%s/run.sh", dst);
	assert_int_equal(stat(p, &s), 0);
	assert_int_equal(s.st_mode & 07777, 0755); /* no setuid */
	snprintf(p, sizeof(p), "%s/a", dst);
	assert_int_equal(stat(p, &s), 0);
	assert_int_equal(s.st_mode & 07777, 0750);
	snprintf(p, sizeof(p), "%s/empty", dst);
	assert_int_equal(stat(p, &s), 0);
	assert_true(S_ISDIR(s.st_mode));
	snprintf(p, sizeof(p), "%s/link", dst);
	n = readlink(p, link, sizeof(link) - 1);
	assert_int_equal(n, 13);
	link[n] = '\0';
	assert_string_equal(link, "/nowhere/../x");
	snprintf(p, sizeof(p), "%s/fifo", dst);
	assert_int_not_equal(lstat(p, &s), 0);
	close(dfd);
	close(afd);
}

/* A symlink already in the target is replaced, not written through; a
 * directory behind one is not entered. */
static void
test_existing_link(void **state)
{
	char dst[512], p[1024], outside[512], *why = NULL;
	struct stat s;
	int fd = archive(), dfd;

	(void)state;
	snprintf(outside, sizeof(outside), "%s/outside", tmpdir);
	assert_int_equal(mkdir(outside, 0755), 0);
	dfd = fresh_target("dst2", dst, sizeof(dst));
	snprintf(p, sizeof(p), "%s/f", dst);
	snprintf(outside, sizeof(outside), "%s/outside/f", tmpdir);
	write_text(outside, "keep", 0644);
	assert_int_equal(symlink(outside, p), 0);
	add(fd, '0', "f", NULL, "new");
	assert_int_equal(moat_tar_unpack(fd, dfd, 0, NULL, &why), 0);
	assert_int_equal(lstat(p, &s), 0);
	assert_true(S_ISREG(s.st_mode));
	assert_int_equal(stat(outside, &s), 0);
	assert_int_equal(s.st_size, 4);

	snprintf(p, sizeof(p), "%s/d", dst);
	snprintf(outside, sizeof(outside), "%s/outside", tmpdir);
	assert_int_equal(symlink(outside, p), 0);
	close(fd);
	fd = archive();
	add(fd, '0', "d/g", NULL, "new");
	assert_int_equal(moat_tar_unpack(fd, dfd, 0, NULL, &why),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(why, "symlink"));
	free(why);
	snprintf(p, sizeof(p), "%s/outside/g", tmpdir);
	assert_int_not_equal(lstat(p, &s), 0);
	close(dfd);
	close(fd);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_damaged),
		cmocka_unit_test(test_long_names),
		cmocka_unit_test(test_base256),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_existing_link),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
