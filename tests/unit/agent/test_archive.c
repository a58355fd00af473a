/*
 * test_archive.c: moat-agent's archive_put and archive_get (issue 17),
 * black-box against the built agent in host mode with --root: a tree
 * packed here goes in over several chunks and comes out again the same;
 * a chunk at the wrong offset is refused naming the expected one and
 * ends the upload; archives with "../x", a device node or over the cap
 * are refused and nothing, not even the target, is made; a fifth
 * transfer at once is refused. Not for: the tar rules themselves
 * (tests/unit/lib/test_tar.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_client.h"
#include "moat/status.h"
#include "moat/tar.h"
#include "moat/util.h"

static int
group_setup(void **state)
{
	static struct tagent t;

	if (tagent_start(&t, NULL, false) != 0)
		return -1;
	*state = &t;
	return 0;
}

static int
group_teardown(void **state)
{
	tagent_stop(*state);
	return 0;
}

static Moat__V1__GuestMessage *
put(struct tagent *t, const char *path, const char *id, uint64_t offset,
    const void *data, size_t len, bool last, uint64_t max)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestArchivePut p = MOAT__V1__GUEST_ARCHIVE_PUT__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_ARCHIVE_PUT;
	req.archive_put = &p;
	p.path = (char *)path;
	p.upload_id = (char *)(id ? id : "");
	p.offset = offset;
	p.data.data = (uint8_t *)data;
	p.data.len = len;
	p.last = last;
	p.max_bytes = max;
	return tagent_call(t, &req);
}

static Moat__V1__GuestMessage *
get(struct tagent *t, const char *path, const char *id, uint64_t offset,
    uint32_t len)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestArchiveGet g = MOAT__V1__GUEST_ARCHIVE_GET__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_ARCHIVE_GET;
	req.archive_get = &g;
	g.path = (char *)path;
	g.download_id = (char *)(id ? id : "");
	g.offset = offset;
	g.length = len;
	return tagent_call(t, &req);
}

/* slurp: the whole of fd from offset 0 (heap). */
static uint8_t *
slurp(int fd, size_t *len)
{
	off_t end = lseek(fd, 0, SEEK_END);
	uint8_t *buf = malloc((size_t)end + 1);

	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, (size_t)end, 0), end);
	*len = (size_t)end;
	return buf;
}

static int
tmp_fd(void)
{
	FILE *f = tmpfile();

	assert_non_null(f);
	return dup(fileno(f));
}

/* put_all: sends the archive in `chunk`-byte pieces; returns the last
 * reply. */
static Moat__V1__GuestMessage *
put_all(struct tagent *t, const char *path, const uint8_t *data, size_t len,
    size_t chunk, uint64_t max)
{
	Moat__V1__GuestMessage *m = NULL;
	char id[64] = "";
	size_t off = 0;

	do {
		size_t n = len - off > chunk ? chunk : len - off;

		if (m != NULL)
			moat__v1__guest_message__free_unpacked(m, NULL);
		m = put(t, path, id, off, data + off, n, off + n == len, max);
		assert_non_null(m);
		if (m->code != MOAT__V1__CODE__OK)
			return m;
		assert_int_equal(m->body_case,
		    MOAT__V1__GUEST_MESSAGE__BODY_ARCHIVE);
		snprintf(id, sizeof(id), "%s", m->archive->id);
		off += n;
	} while (off < len);
	return m;
}

static void
write_file(const char *path, size_t size, unsigned seed)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0640);
	uint8_t *b = malloc(size + 1);

	assert_true(fd >= 0);
	for (size_t i = 0; i < size; i++)
		b[i] = (uint8_t)(i * 31 + seed);
	assert_int_equal(moat_tar_write_all(fd, b, size), 0);
	free(b);
	close(fd);
}

static void
same_file(const char *a, const char *b)
{
	char *x, *y;
	size_t xl, yl;

	assert_int_equal(moat_read_file(a, 64 << 20, &x, &xl), 0);
	assert_int_equal(moat_read_file(b, 64 << 20, &y, &yl), 0);
	assert_int_equal(xl, yl);
	assert_memory_equal(x, y, xl);
	free(x);
	free(y);
}

/* A tree in over 300 KiB chunks, out again over 64 KiB chunks. */
static void
test_round_trip(void **state)
{
	struct tagent *t = *state;
	char src[300], p[400], q[600], back[300], link[32], *why = NULL;
	struct moat_tar_stats st = { 0 };
	Moat__V1__GuestMessage *m;
	uint8_t *data;
	size_t len, off = 0;
	char id[64] = "";
	int sfd, afd = tmp_fd(), bfd = tmp_fd(), dfd;
	struct stat s;

	snprintf(src, sizeof(src), "%s/src", t->dir);
	assert_int_equal(mkdir(src, 0755), 0);
	snprintf(p, sizeof(p), "%s/sub", src);
	assert_int_equal(mkdir(p, 0750), 0);
	for (int i = 0; i < 20; i++) {
		snprintf(p, sizeof(p), "%s/sub/f%02d", src, i);
		write_file(p, (size_t)i * 1000, (unsigned)i);
	}
	snprintf(p, sizeof(p), "%s/big", src);
	write_file(p, 3 << 20, 7);
	snprintf(p, sizeof(p), "%s/link", src);
	assert_int_equal(symlink("sub/f01", p), 0);
	sfd = open(src, O_RDONLY | O_DIRECTORY);
	assert_int_equal(moat_tar_pack(sfd, "src", afd, &st, &why), 0);
	close(sfd);
	data = slurp(afd, &len);

	m = put_all(t, "/in/dst", data, len, 300 << 10, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__OK);
	assert_true(m->archive->done);
	assert_int_equal(m->archive->files, 21);
	assert_int_equal(m->archive->dirs, 1);
	assert_int_equal(m->archive->symlinks, 1);
	assert_int_equal(m->archive->received, len);
	moat__v1__guest_message__free_unpacked(m, NULL);
	snprintf(p, sizeof(p), "%s/big", src);
	same_file(p, tagent_host_path(t, "/in/dst/big"));
	snprintf(p, sizeof(p), "%s/sub/f19", src);
	same_file(p, tagent_host_path(t, "/in/dst/sub/f19"));
	assert_int_equal(stat(tagent_host_path(t, "/in/dst/sub"), &s), 0);
	assert_int_equal(s.st_mode & 07777, 0750);
	assert_int_equal(readlink(tagent_host_path(t, "/in/dst/link"), link,
	                     sizeof(link)),
	    7);

	/* And out again. */
	for (;;) {
		m = get(t, "/in/dst", id, off, 64 << 10);
		assert_non_null(m);
		assert_int_equal(m->code, MOAT__V1__CODE__OK);
		if (id[0] == '\0')
			assert_int_equal(m->archive->files, 21);
		snprintf(id, sizeof(id), "%s", m->archive->id);
		assert_int_equal(moat_tar_write_all(bfd, m->archive->data.data,
		                     m->archive->data.len),
		    0);
		off += m->archive->data.len;
		if (m->archive->eof) {
			assert_int_equal(off, m->archive->size);
			moat__v1__guest_message__free_unpacked(m, NULL);
			break;
		}
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	/* Read to its end: gone. */
	m = get(t, "/in/dst", id, 0, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__NOT_FOUND);
	moat__v1__guest_message__free_unpacked(m, NULL);

	snprintf(back, sizeof(back), "%s/back", t->dir);
	assert_int_equal(mkdir(back, 0755), 0);
	dfd = open(back, O_RDONLY | O_DIRECTORY);
	assert_int_equal(moat_tar_unpack(bfd, dfd, 0, &st, &why), 0);
	close(dfd);
	assert_int_equal(st.files, 21);
	snprintf(p, sizeof(p), "%s/big", src);
	snprintf(q, sizeof(q), "%s/big", back);
	same_file(p, q);
	free(data);
	close(afd);
	close(bfd);
}

/* crafted: a one-member archive (type, name) in memory. */
static uint8_t *
crafted(char type, const char *name, size_t *len)
{
	struct moat_tar_entry e = { type, (char *)name, NULL, 0, 0644, 0 };
	int fd = tmp_fd();
	uint8_t *data;

	assert_int_equal(moat_tar_write_header(fd, &e), 0);
	assert_int_equal(moat_tar_write_end(fd), 0);
	data = slurp(fd, len);
	close(fd);
	return data;
}

static void
expect_refused(struct tagent *t, const char *path, const uint8_t *data,
    size_t len, uint64_t max, Moat__V1__Code code, const char *needle)
{
	Moat__V1__GuestMessage *m = put_all(t, path, data, len, 512, max);
	struct stat s;

	assert_int_equal(m->code, code);
	if (strstr(m->message, needle) == NULL)
		fail_msg("\"%s\" not in \"%s\"", needle, m->message);
	moat__v1__guest_message__free_unpacked(m, NULL);
	assert_int_not_equal(lstat(tagent_host_path(t, path), &s), 0);
}

static void
test_refused(void **state)
{
	struct tagent *t = *state;
	uint8_t *data;
	size_t len;

	data = crafted('0', "../x", &len);
	expect_refused(t, "/evil", data, len, 0,
	    MOAT__V1__CODE__INVALID_ARGUMENT, "\"../x\"");
	free(data);
	data = crafted('3', "null", &len);
	expect_refused(t, "/dev-node", data, len, 0,
	    MOAT__V1__CODE__INVALID_ARGUMENT, "device node");
	free(data);
	data = crafted('0', "ok", &len);
	expect_refused(t, "/capped", data, len, 1000,
	    MOAT__V1__CODE__RESOURCE_EXHAUSTED, "cap");
	free(data);
}

/* A chunk out of order names the offset expected and ends the upload. */
static void
test_offsets(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	char id[64];
	uint8_t zeros[1024] = { 0 };

	m = put(t, "/order", NULL, 0, zeros, 512, false, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__OK);
	snprintf(id, sizeof(id), "%s", m->archive->id);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = put(t, "/order", id, 1024, zeros, 512, false, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__FAILED_PRECONDITION);
	assert_non_null(strstr(m->message, "expected offset 512"));
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = put(t, "/order", id, 512, zeros, 512, true, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__NOT_FOUND);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = put(t, "/order", NULL, 7, zeros, 512, false, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__INVALID_ARGUMENT);
	moat__v1__guest_message__free_unpacked(m, NULL);
}

/* Four transfers at once, not five. */
static void
test_concurrency(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	char ids[4][64];
	uint8_t zeros[512] = { 0 };

	for (int i = 0; i < 4; i++) {
		m = put(t, "/many", NULL, 0, zeros, 512, false, 0);
		assert_int_equal(m->code, MOAT__V1__CODE__OK);
		snprintf(ids[i], sizeof(ids[i]), "%s", m->archive->id);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	m = get(t, "/", NULL, 0, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__RESOURCE_EXHAUSTED);
	assert_non_null(strstr(m->message, "4 archive transfers"));
	moat__v1__guest_message__free_unpacked(m, NULL);
	/* End them: an archive of one zero block is empty, so done. */
	for (int i = 0; i < 4; i++) {
		m = put(t, "/many", ids[i], 512, NULL, 0, true, 0);
		assert_int_equal(m->code, MOAT__V1__CODE__OK);
		assert_true(m->archive->done);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	m = get(t, "/many", NULL, 0, 0);
	assert_int_equal(m->code, MOAT__V1__CODE__OK);
	assert_true(m->archive->eof);
	moat__v1__guest_message__free_unpacked(m, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_offsets),
		cmocka_unit_test(test_concurrency),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
