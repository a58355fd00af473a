/*
 * test_files.c: moat-agent's file requests, black-box against the built
 * agent in host mode with --root: a 3 MiB binary round trip of every byte
 * value, write modes (offset, truncate, mode, parents), list, stat,
 * remove, mkdir with their errors, the path rules (absolute, no NUL, no
 * /proc, /sys, /dev), and that no path or symlink leads out of --root,
 * both with openat2 and with the agent's own walk (--no-openat2). Not
 * for: exec (test_exec.c) or the fs trace (test_trace.c).
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
#include <unistd.h>

#include <cmocka.h>

#include "agent_client.h"
#include "moat/status.h"

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
do_write(struct tagent *t, const char *path, const void *data, size_t len,
    uint64_t offset, uint32_t mode, bool truncate, bool parents)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestFileWrite fw = MOAT__V1__GUEST_FILE_WRITE__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_WRITE;
	req.file_write = &fw;
	fw.path = (char *)path;
	fw.data.data = (uint8_t *)data;
	fw.data.len = len;
	fw.offset = offset;
	fw.mode = mode;
	fw.truncate = truncate;
	fw.make_parents = parents;
	return tagent_call(t, &req);
}

static Moat__V1__GuestMessage *
do_read(struct tagent *t, const char *path, uint64_t offset, uint32_t len)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestFileRead fr = MOAT__V1__GUEST_FILE_READ__INIT;

	req.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_READ;
	req.file_read = &fr;
	fr.path = (char *)path;
	fr.offset = offset;
	fr.length = len;
	return tagent_call(t, &req);
}

/* do_path: file_list, file_stat, file_remove or mkdir. */
static Moat__V1__GuestMessage *
do_path(struct tagent *t, Moat__V1__GuestRequest__OpCase op, const char *path,
    bool flag, uint32_t mode)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestPath gp = MOAT__V1__GUEST_PATH__INIT;

	req.op_case = op;
	gp.path = (char *)path;
	gp.recursive = flag;
	gp.parents = flag;
	gp.mode = mode;
	switch (op) {
	case MOAT__V1__GUEST_REQUEST__OP_FILE_LIST:
		req.file_list = &gp;
		break;
	case MOAT__V1__GUEST_REQUEST__OP_FILE_STAT:
		req.file_stat = &gp;
		break;
	case MOAT__V1__GUEST_REQUEST__OP_FILE_REMOVE:
		req.file_remove = &gp;
		break;
	default:
		req.mkdir = &gp;
		break;
	}
	return tagent_call(t, &req);
}

/* expect: the reply's code, and frees it. */
static void
expect(Moat__V1__GuestMessage *m, int code)
{
	assert_non_null(m);
	if ((int)m->code != code)
		print_error("code %d, message: %s\n", (int)m->code,
		    m->message);
	assert_int_equal(m->code, code);
	if (code != MOAT_OK)
		assert_true(strlen(m->message) > 0);
	moat__v1__guest_message__free_unpacked(m, NULL);
}

#define LIST MOAT__V1__GUEST_REQUEST__OP_FILE_LIST
#define STAT MOAT__V1__GUEST_REQUEST__OP_FILE_STAT
#define REMOVE MOAT__V1__GUEST_REQUEST__OP_FILE_REMOVE
#define MKDIR MOAT__V1__GUEST_REQUEST__OP_MKDIR

static void
test_binary_round_trip(void **state)
{
	struct tagent *t = *state;
	const size_t total = 3u << 20, chunk = 1u << 20;
	uint8_t *data = malloc(total), *back = calloc(1, total);
	uint8_t want[SHA256_DIGEST_LENGTH], got[SHA256_DIGEST_LENGTH];
	Moat__V1__GuestMessage *m;
	size_t off, i;

	assert_non_null(data);
	assert_non_null(back);
	for (i = 0; i < total; i++)
		data[i] = (uint8_t)i;
	for (off = 0; off < total; off += chunk) {
		m = do_write(t, "/bin/blob", data + off, chunk, off, 0,
		    off == 0, true);
		assert_non_null(m);
		assert_int_equal(m->code, MOAT_OK);
		assert_int_equal(m->body_case,
		    MOAT__V1__GUEST_MESSAGE__BODY_FILE_STAT);
		assert_int_equal(m->file_stat->size, off + chunk);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	/* read back in pieces that do not line up with the writes */
	for (off = 0; off < total;) {
		m = do_read(t, "/bin/blob", off, 700000);
		assert_non_null(m);
		assert_int_equal(m->code, MOAT_OK);
		assert_int_equal(m->body_case,
		    MOAT__V1__GUEST_MESSAGE__BODY_FILE_DATA);
		assert_int_equal(m->file_data->size, total);
		assert_true(m->file_data->data.len > 0);
		assert_true(off + m->file_data->data.len <= total);
		memcpy(back + off, m->file_data->data.data,
		    m->file_data->data.len);
		off += m->file_data->data.len;
		assert_int_equal(m->file_data->eof, off == total);
		assert_int_equal(m->file_data->mode, 0644);
		moat__v1__guest_message__free_unpacked(m, NULL);
	}
	SHA256(data, total, want);
	SHA256(back, total, got);
	assert_memory_equal(want, got, sizeof(want));
	/* and the file on disk is the same bytes */
	free(back);
	back = NULL;
	{
		FILE *f = fopen(tagent_host_path(t, "/bin/blob"), "rb");
		uint8_t *disk = malloc(total);

		assert_non_null(f);
		assert_int_equal(fread(disk, 1, total, f), total);
		fclose(f);
		assert_memory_equal(disk, data, total);
		free(disk);
	}
	free(data);
}

static void
test_write_modes(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	struct stat st;

	expect(do_write(t, "/w/hello.txt", "hello world", 11, 0, 0600, false,
	           true),
	    MOAT_OK);
	assert_int_equal(stat(tagent_host_path(t, "/w/hello.txt"), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	expect(do_write(t, "/w/hello.txt", "there", 5, 6, 0, false, false),
	    MOAT_OK);
	m = do_read(t, "/w/hello.txt", 0, 0);
	assert_non_null(m);
	assert_int_equal(m->file_data->data.len, 11);
	assert_memory_equal(m->file_data->data.data, "hello there", 11);
	assert_true(m->file_data->eof);
	moat__v1__guest_message__free_unpacked(m, NULL);
	/* truncate to offset + len */
	expect(do_write(t, "/w/hello.txt", "", 0, 5, 0, true, false), MOAT_OK);
	m = do_read(t, "/w/hello.txt", 0, 100);
	assert_int_equal(m->file_data->data.len, 5);
	assert_int_equal(m->file_data->size, 5);
	moat__v1__guest_message__free_unpacked(m, NULL);
	/* reading past the end: nothing, eof */
	m = do_read(t, "/w/hello.txt", 100, 10);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->file_data->data.len, 0);
	assert_true(m->file_data->eof);
	moat__v1__guest_message__free_unpacked(m, NULL);
	/* default mode */
	expect(do_write(t, "/w/default", "x", 1, 0, 0, false, false), MOAT_OK);
	assert_int_equal(stat(tagent_host_path(t, "/w/default"), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0644);
	/* no parents without make_parents */
	expect(do_write(t, "/w/no/such/dir/f", "x", 1, 0, 0, false, false),
	    MOAT_NOT_FOUND);
	/* a directory is not a file */
	expect(do_write(t, "/w", "x", 1, 0, 0, false, false),
	    MOAT_FAILED_PRECONDITION);
	/* too much for one request */
	{
		uint8_t *big = calloc(1, MOAT_GUEST_IO_MAX + 1);

		expect(do_write(t, "/w/big", big, MOAT_GUEST_IO_MAX + 1, 0, 0,
		           false, false),
		    MOAT_INVALID_ARGUMENT);
		free(big);
	}
}

static void
test_read_errors(void **state)
{
	struct tagent *t = *state;

	expect(do_read(t, "/missing", 0, 0), MOAT_NOT_FOUND);
	expect(do_read(t, "/", 0, 0), MOAT_FAILED_PRECONDITION);
	expect(do_write(t, "/r/f", "abc", 3, 0, 0, false, true), MOAT_OK);
	expect(do_read(t, "/r/f", 0, MOAT_GUEST_IO_MAX + 1),
	    MOAT_INVALID_ARGUMENT);
	expect(do_read(t, "/r/f/below", 0, 0), MOAT_FAILED_PRECONDITION);
	/* a FIFO is refused, not opened (that would block the agent) */
	assert_int_equal(mkfifo(tagent_host_path(t, "/r/fifo"), 0644), 0);
	expect(do_read(t, "/r/fifo", 0, 0), MOAT_FAILED_PRECONDITION);
	expect(do_write(t, "/r/fifo", "x", 1, 0, 0, false, false),
	    MOAT_FAILED_PRECONDITION);
}

static void
test_list_stat_mkdir_remove(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;

	expect(do_path(t, MKDIR, "/m/a/b", false, 0), MOAT_NOT_FOUND);
	expect(do_path(t, MKDIR, "/m/a/b", true, 0), MOAT_OK);
	expect(do_path(t, MKDIR, "/m/a/b", false, 0), MOAT_ALREADY_EXISTS);
	expect(do_path(t, MKDIR, "/m/a/b", true, 0), MOAT_OK);
	expect(do_path(t, MKDIR, "/m/private", false, 0700), MOAT_OK);
	expect(do_write(t, "/m/a/b/file", "12345", 5, 0, 0, false, false),
	    MOAT_OK);
	expect(do_path(t, MKDIR, "/m/a/b/file", false, 0),
	    MOAT_FAILED_PRECONDITION);
	assert_int_equal(symlink("b/file", tagent_host_path(t, "/m/a/link")),
	    0);

	m = do_path(t, STAT, "/m/private", false, 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->file_stat->type,
	    MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY);
	assert_int_equal(m->file_stat->mode, 0700);
	assert_string_equal(m->file_stat->name, "private");
	assert_string_equal(m->file_stat->path, "/m/private");
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = do_path(t, STAT, "/m/a/b/file", false, 0);
	assert_int_equal(m->file_stat->type,
	    MOAT__V1__FILE_TYPE__FILE_TYPE_REGULAR);
	assert_int_equal(m->file_stat->size, 5);
	assert_true(m->file_stat->mtime_ns > 0);
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* stat does not follow the last symlink */
	m = do_path(t, STAT, "/m/a/link", false, 0);
	assert_int_equal(m->file_stat->type,
	    MOAT__V1__FILE_TYPE__FILE_TYPE_SYMLINK);
	moat__v1__guest_message__free_unpacked(m, NULL);

	m = do_path(t, LIST, "/m/a", false, 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->file_list->n_entries, 2);
	assert_false(m->file_list->truncated);
	assert_string_equal(m->file_list->entries[0]->name, "b");
	assert_string_equal(m->file_list->entries[0]->path, "/m/a/b");
	assert_int_equal(m->file_list->entries[0]->type,
	    MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY);
	assert_string_equal(m->file_list->entries[1]->name, "link");
	assert_int_equal(m->file_list->entries[1]->type,
	    MOAT__V1__FILE_TYPE__FILE_TYPE_SYMLINK);
	moat__v1__guest_message__free_unpacked(m, NULL);

	expect(do_path(t, LIST, "/m/a/b/file", false, 0),
	    MOAT_FAILED_PRECONDITION);
	expect(do_path(t, LIST, "/m/none", false, 0), MOAT_NOT_FOUND);
	expect(do_path(t, STAT, "/m/none", false, 0), MOAT_NOT_FOUND);

	expect(do_path(t, REMOVE, "/m/a", false, 0), MOAT_FAILED_PRECONDITION);
	expect(do_path(t, REMOVE, "/m/none", false, 0), MOAT_NOT_FOUND);
	expect(do_path(t, REMOVE, "/", true, 0), MOAT_PERMISSION_DENIED);
	expect(do_path(t, REMOVE, "/m/a/link", false, 0), MOAT_OK);
	/* the link went, not what it pointed at */
	expect(do_path(t, STAT, "/m/a/b/file", false, 0), MOAT_OK);
	expect(do_path(t, REMOVE, "/m/a/b/file", false, 0), MOAT_OK);
	expect(do_path(t, STAT, "/m/a/b/file", false, 0), MOAT_NOT_FOUND);
	expect(do_write(t, "/m/a/b/c/d/e", "x", 1, 0, 0, false, true),
	    MOAT_OK);
	expect(do_path(t, REMOVE, "/m/a", true, 0), MOAT_OK);
	expect(do_path(t, STAT, "/m/a", false, 0), MOAT_NOT_FOUND);
	expect(do_path(t, STAT, "/m/private", false, 0), MOAT_OK);
}

static void
test_list_cap(void **state)
{
	struct tagent *t = *state;
	Moat__V1__GuestMessage *m;
	char path[600];
	int i, fd;

	expect(do_path(t, MKDIR, "/many", false, 0), MOAT_OK);
	for (i = 0; i < 10001; i++) {
		snprintf(path, sizeof(path), "%s/f%05d",
		    tagent_host_path(t, "/many"), i);
		fd = open(path, O_CREAT | O_WRONLY, 0644);
		assert_true(fd >= 0);
		close(fd);
	}
	m = do_path(t, LIST, "/many", false, 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->file_list->n_entries, 10000);
	assert_true(m->file_list->truncated);
	moat__v1__guest_message__free_unpacked(m, NULL);
	expect(do_path(t, REMOVE, "/many", true, 0), MOAT_OK);
}

static void
test_path_rules(void **state)
{
	struct tagent *t = *state;
	/* GuestRequest{id 4242, file_stat {path "/tmp\0x"}}, by hand:
	 * protobuf-c would stop the string at the NUL */
	static const uint8_t nul_req[] = { 0, 0, 0, 14, 0x08, 0x92, 0x21, 0x82,
		0x01, 0x08, 0x0a, 0x06, '/', 't', 'm', 'p', 0, 'x' };
	Moat__V1__GuestMessage *m;

	expect(do_path(t, STAT, "relative/path", false, 0),
	    MOAT_INVALID_ARGUMENT);
	expect(do_path(t, STAT, "", false, 0), MOAT_INVALID_ARGUMENT);
	expect(do_read(t, "/proc/self/status", 0, 0), MOAT_PERMISSION_DENIED);
	expect(do_path(t, LIST, "/sys", false, 0), MOAT_PERMISSION_DENIED);
	expect(do_write(t, "/dev/null", "x", 1, 0, 0, false, false),
	    MOAT_PERMISSION_DENIED);
	expect(do_path(t, STAT, "//proc/./1/../self", false, 0),
	    MOAT_PERMISSION_DENIED);
	expect(do_path(t, STAT, "/../etc/passwd", false, 0),
	    MOAT_PERMISSION_DENIED);
	/* "/procfs" is not /proc */
	expect(do_path(t, MKDIR, "/procfs", false, 0), MOAT_OK);
	/* cleaned: /x/../ is fine inside the root */
	expect(do_path(t, STAT, "/procfs/../procfs/./", false, 0), MOAT_OK);

	assert_int_equal(tagent_send_raw(t, nul_req, sizeof(nul_req)), 0);
	m = tagent_recv(t);
	assert_non_null(m);
	assert_int_equal(m->id, 4242);
	assert_int_equal(m->code, MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(m->message, "NUL"));
	moat__v1__guest_message__free_unpacked(m, NULL);
}

/* escape_checks: nothing outside t->root can be read, listed or written
 * through the links make_escapes made. */
static void
escape_checks(struct tagent *t)
{
	char outside[300], secret[400], target[400];
	Moat__V1__GuestMessage *m;
	struct stat st;

	snprintf(outside, sizeof(outside), "%s/outside", t->dir);
	snprintf(secret, sizeof(secret), "%s/secret", outside);
	assert_int_equal(mkdir(outside, 0755), 0);
	{
		FILE *f = fopen(secret, "w");

		assert_non_null(f);
		fputs("SECRET", f);
		fclose(f);
	}
	assert_int_equal(symlink(secret, tagent_host_path(t, "/abs")), 0);
	assert_int_equal(symlink("../outside/secret",
	                     tagent_host_path(t, "/rel")),
	    0);
	assert_int_equal(symlink("../../../../../../outside",
	                     tagent_host_path(t, "/dirlink")),
	    0);
	assert_int_equal(symlink("/", tagent_host_path(t, "/rootlink")), 0);
	snprintf(target, sizeof(target), "%s", outside);
	assert_int_equal(symlink(target, tagent_host_path(t, "/absdir")), 0);

	/* reads through links resolve inside the root: nothing there */
	expect(do_read(t, "/abs", 0, 0), MOAT_NOT_FOUND);
	expect(do_read(t, "/rel", 0, 0), MOAT_NOT_FOUND);
	expect(do_read(t, "/dirlink/secret", 0, 0), MOAT_NOT_FOUND);
	expect(do_read(t, "/rootlink/../outside/secret", 0, 0),
	    MOAT_NOT_FOUND); /* cleaned to /outside/secret, in the root */
	expect(do_read(t, "/rootlink/../../outside/secret", 0, 0),
	    MOAT_PERMISSION_DENIED); /* ".." above / */
	expect(do_path(t, LIST, "/absdir", false, 0), MOAT_NOT_FOUND);
	expect(do_path(t, LIST, "/dirlink", false, 0), MOAT_NOT_FOUND);
	/* "/rootlink" is the root itself: it lists our own links */
	m = do_path(t, LIST, "/rootlink", false, 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_true(m->file_list->n_entries >= 4);
	moat__v1__guest_message__free_unpacked(m, NULL);

	/* writes through links land inside the root, never outside */
	m = do_write(t, "/dirlink/new.txt", "x", 1, 0, 0, false, true);
	assert_non_null(m);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = do_write(t, "/absdir/new2.txt", "x", 1, 0, 0, false, true);
	assert_non_null(m);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = do_write(t, "/rel", "PWNED", 5, 0, 0, true, true);
	assert_non_null(m);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = do_path(t, MKDIR, "/dirlink/made", true, 0);
	assert_non_null(m);
	moat__v1__guest_message__free_unpacked(m, NULL);
	snprintf(target, sizeof(target), "%s/new.txt", outside);
	assert_int_not_equal(stat(target, &st), 0);
	snprintf(target, sizeof(target), "%s/new2.txt", outside);
	assert_int_not_equal(stat(target, &st), 0);
	snprintf(target, sizeof(target), "%s/made", outside);
	assert_int_not_equal(stat(target, &st), 0);
	assert_int_equal(stat(secret, &st), 0);
	assert_int_equal(st.st_size, 6);
	/* removing a link removes the link only */
	expect(do_path(t, REMOVE, "/abs", false, 0), MOAT_OK);
	assert_int_equal(stat(secret, &st), 0);

	/* links that stay inside work */
	expect(do_write(t, "/data/f", "inside", 6, 0, 0, false, true),
	    MOAT_OK);
	assert_int_equal(symlink("/data/f", tagent_host_path(t, "/in")), 0);
	assert_int_equal(symlink("data/f", tagent_host_path(t, "/data2")), 0);
	m = do_read(t, "/in", 0, 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->file_data->data.len, 6);
	assert_memory_equal(m->file_data->data.data, "inside", 6);
	moat__v1__guest_message__free_unpacked(m, NULL);
	m = do_read(t, "/data2", 0, 0);
	assert_int_equal(m->code, MOAT_OK);
	assert_memory_equal(m->file_data->data.data, "inside", 6);
	moat__v1__guest_message__free_unpacked(m, NULL);
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
start_no_openat2(void **state)
{
	static const char *const extra[] = { "--no-openat2", NULL };
	static struct tagent t;

	if (tagent_start(&t, extra, false) != 0)
		return -1;
	*state = &t;
	return 0;
}

static int
stop_agent(void **state)
{
	tagent_stop(*state);
	return 0;
}

static void
test_root_escape(void **state)
{
	escape_checks(*state);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_binary_round_trip),
		cmocka_unit_test(test_write_modes),
		cmocka_unit_test(test_read_errors),
		cmocka_unit_test(test_list_stat_mkdir_remove),
		cmocka_unit_test(test_list_cap),
		cmocka_unit_test(test_path_rules),
		/* a fresh root each: with openat2, and with the agent's own
		 * walk */
		cmocka_unit_test_setup_teardown(test_root_escape, start_plain,
		    stop_agent),
		cmocka_unit_test_setup_teardown(test_root_escape,
		    start_no_openat2, stop_agent),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
