/*
 * test_client.c: libmoat against a fake gateway: files move in 1 MiB
 * pieces (the first truncates), come back byte for byte, empty files and
 * fds work, a size limit is enforced, errors carry the server's words,
 * and a gateway that is not there is UNAVAILABLE naming its url.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_gateway.h"
#include "moat/log.h"
#include "moat/util.h"
#include "moat_client.h"

static char dir[64];
static struct fake_gateway fg;
static struct moat_client *client;

static int
setup(void **state)
{
	char *errmsg = NULL;

	moat_log_init("test", MOAT_LOG_ERROR);
	snprintf(dir, sizeof(dir), "/tmp/moat-cli-XXXXXX");
	assert_non_null(mkdtemp(dir));
	assert_int_equal(fake_gateway_start(&fg, dir), MOAT_OK);
	assert_int_equal(moat_client_open(&client, fg.url, "key", &errmsg),
	    MOAT_OK);
	return 0;
}

static int
teardown(void **state)
{
	moat_client_close(client);
	fake_gateway_stop(&fg);
	moat_rm_rf(dir);
	return 0;
}

static uint8_t *
pattern(size_t n)
{
	uint8_t *p = malloc(n);

	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 7919u) >> 3);
	return p;
}

static void
test_write_then_read_in_pieces(void **state)
{
	size_t n = 2 * MOAT_CLIENT_FILE_CHUNK + MOAT_CLIENT_FILE_CHUNK / 2 + 1;
	uint8_t *data = pattern(n), *back = NULL;
	Moat__V1__FileInfo *fi = NULL;
	char *errmsg = NULL;
	size_t len = 0;
	uint32_t mode = 0;

	fg.write_calls = fg.read_calls = 0;
	assert_int_equal(moat_client_write_file(client, "sb", "/big.bin", data,
	                     n, 0600, false, &fi, &errmsg),
	    MOAT_OK);
	assert_int_equal(fg.write_calls, 3);
	assert_int_equal(fg.largest_write, MOAT_CLIENT_FILE_CHUNK);
	assert_true(fg.first_write_truncated);
	assert_int_equal(fi->size, n);
	moat_client_free_msg(fi);

	assert_int_equal(moat_client_read_file(client, "sb", "/big.bin", 0,
	                     &back, &len, &mode, &errmsg),
	    MOAT_OK);
	assert_int_equal(len, n);
	assert_memory_equal(back, data, n);
	assert_int_equal(back[len], 0); /* NUL after the data */
	assert_int_equal(mode, 0600);
	assert_int_equal(fg.read_calls, 3);
	free(back);

	/* A limit below the size is refused before reading it all. */
	assert_int_equal(moat_client_read_file(client, "sb", "/big.bin", 1000,
	                     &back, &len, NULL, &errmsg),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_null(back);
	assert_non_null(strstr(errmsg, "/big.bin"));
	free(errmsg);
	free(data);
}

static void
test_empty_file_and_fds(void **state)
{
	char path[128];
	uint8_t *back = NULL, *data = pattern(MOAT_CLIENT_FILE_CHUNK);
	char *errmsg = NULL;
	size_t len = 99;
	uint64_t size = 0;
	int fd;

	fg.write_calls = 0;
	assert_int_equal(moat_client_write_file(client, "sb", "/empty", NULL,
	                     0, 0, false, NULL, &errmsg),
	    MOAT_OK);
	assert_int_equal(fg.write_calls, 1);
	assert_int_equal(moat_client_read_file(client, "sb", "/empty", 0,
	                     &back, &len, NULL, &errmsg),
	    MOAT_OK);
	assert_int_equal(len, 0);
	free(back);

	/* Exactly one chunk from an fd: one piece, no empty tail call. */
	snprintf(path, sizeof(path), "%s/up", dir);
	fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
	assert_true(write(fd, data, MOAT_CLIENT_FILE_CHUNK) ==
	    (ssize_t)MOAT_CLIENT_FILE_CHUNK);
	lseek(fd, 0, SEEK_SET);
	fg.write_calls = 0;
	assert_int_equal(moat_client_write_file_from_fd(client, "sb", "/fd",
	                     fd, 0644, true, NULL, &errmsg),
	    MOAT_OK);
	assert_int_equal(fg.write_calls, 1);
	close(fd);

	snprintf(path, sizeof(path), "%s/down", dir);
	fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0600);
	assert_int_equal(moat_client_read_file_to_fd(client, "sb", "/fd", fd,
	                     &size, NULL, &errmsg),
	    MOAT_OK);
	assert_int_equal(size, MOAT_CLIENT_FILE_CHUNK);
	lseek(fd, 0, SEEK_SET);
	back = malloc(MOAT_CLIENT_FILE_CHUNK);
	assert_true(read(fd, back, MOAT_CLIENT_FILE_CHUNK) ==
	    (ssize_t)MOAT_CLIENT_FILE_CHUNK);
	assert_memory_equal(back, data, MOAT_CLIENT_FILE_CHUNK);
	close(fd);
	free(back);
	free(data);
}

static void
test_errors_carry_server_words(void **state)
{
	Moat__V1__Sandbox *sb = (Moat__V1__Sandbox *)1;
	char *errmsg = NULL;

	assert_int_equal(moat_client_get(client, "ghost", &sb, &errmsg),
	    MOAT_NOT_FOUND);
	assert_null(sb);
	assert_non_null(strstr(errmsg, "ghost"));
	free(errmsg);
	assert_int_equal(moat_client_read_file(client, "sb", "/nope", 0,
	                     (uint8_t **)&sb, &(size_t){ 0 }, NULL, &errmsg),
	    MOAT_NOT_FOUND);
	free(errmsg);
}

static void
test_sandbox_calls(void **state)
{
	Moat__V1__Sandbox *sb = NULL;
	char *errmsg = NULL;

	assert_int_equal(moat_client_create(client, NULL, &sb, &errmsg),
	    MOAT_OK);
	assert_non_null(strstr(sb->id, "sb-fake-"));
	assert_int_equal(moat_client_destroy(client, sb->id, &errmsg),
	    MOAT_OK);
	assert_string_equal(fg.destroyed, sb->id);
	moat_client_free_msg(sb);
}

static void
test_gateway_down(void **state)
{
	struct moat_client *c = NULL;
	Moat__V1__ClusterInfo *info = NULL;
	char *errmsg = NULL, *url = moat_asprintf("ipc://%s/none.sock", dir);

	assert_int_equal(moat_client_open(&c, url, NULL, &errmsg), MOAT_OK);
	moat_client_set_timeout(c, 300);
	assert_int_equal(moat_client_info(c, &info, &errmsg),
	    MOAT_UNAVAILABLE);
	assert_null(info);
	assert_non_null(strstr(errmsg, url));
	free(errmsg);
	moat_client_close(c);
	free(url);
}

/* The address rules and TLS settings of moat_client_open_tls (no dial
 * leaves loopback: the refusals come before any). */
static void
test_tls_settings(void **state)
{
	struct moat_client_tls tls = { 0 };
	struct moat_client *c = NULL;
	char *errmsg = NULL;

	unsetenv("MOAT_TLS_CA");
	unsetenv("MOAT_INSECURE");
	assert_int_equal(moat_client_open_tls(&c, "tcp://10.0.0.1:1", NULL,
	                     &tls, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(c);
	assert_non_null(strstr(errmsg, "--insecure"));
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_client_open(&c, "tls+tcp://127.0.0.1:1", NULL,
	                     &errmsg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(errmsg, "MOAT_TLS_CA"));
	free(errmsg);
	errmsg = NULL;
	/* A CA file that is no PEM: named, from the environment. */
	setenv("MOAT_TLS_CA", "/dev/null", 1);
	assert_int_not_equal(moat_client_open(&c, "tls+tcp://127.0.0.1:1",
	                         NULL, &errmsg),
	    MOAT_OK);
	assert_non_null(strstr(errmsg, "MOAT_TLS_CA"));
	free(errmsg);
	errmsg = NULL;
	unsetenv("MOAT_TLS_CA");
	/* A key without its certificate. */
	tls.key = "/dev/null";
	assert_int_equal(moat_client_open_tls(&c, "tls+tcp://127.0.0.1:1",
	                     NULL, &tls, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(errmsg, "--tls-cert"));
	free(errmsg);
	/* Loopback tcp and ipc need nothing. */
	assert_int_equal(moat_client_open(&c, "tcp://127.0.0.1:1", NULL,
	                     &errmsg),
	    MOAT_OK);
	moat_client_close(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_write_then_read_in_pieces),
		cmocka_unit_test(test_empty_file_and_fds),
		cmocka_unit_test(test_errors_carry_server_words),
		cmocka_unit_test(test_sandbox_calls),
		cmocka_unit_test(test_gateway_down),
		cmocka_unit_test(test_tls_settings),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
