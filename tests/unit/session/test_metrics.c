/*
 * test_metrics.c: moat-sessiond's metrics (`--metrics`, services/session/
 * metrics.c) through the real binary: it logs where they are, a scrape
 * before any write shows every series at zero, and after a create and
 * three appends the writes by op, the append and fsync histograms, the
 * commits, the recordings and the LMDB figures moved; a path other than
 * /metrics is 404. Not for: the registry itself
 * (tests/unit/lib/test_metrics.c).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "moat/util.h"

#define TENANT "tenant-m"

/* metrics_port: the port sessiond logged ("metrics at
 * http://127.0.0.1:PORT/metrics"). */
static int
metrics_port(struct ses_proc *p)
{
	char *path = moat_asprintf("%s/sessiond.log", p->dir), *log = NULL;
	const char *at;
	size_t len;
	int port = 0;

	assert_int_equal(moat_read_file(path, 1 << 20, &log, &len), 0);
	at = strstr(log, "metrics at http://127.0.0.1:");
	assert_non_null(at);
	port = atoi(at + strlen("metrics at http://127.0.0.1:"));
	free(log);
	free(path);
	return port;
}

/* get: the whole HTTP answer to GET `path` (heap). */
static char *
get(int port, const char *path)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t)port) };
	char *req = moat_asprintf("GET %s HTTP/1.1\r\n\r\n", path);
	char *buf = calloc(1, 1 << 20);
	size_t len = 0;
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while ((n = read(fd, buf + len, (1 << 20) - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	free(req);
	return buf;
}

/* value: the value of the sample line starting `series ` in `text`. */
static double
value(const char *text, const char *series)
{
	char *want = moat_asprintf("\n%s ", series);
	const char *at = strstr(text, want);
	double v = -1;

	if (at == NULL)
		fprintf(stderr, "no sample %s in the scrape\n", series);
	else
		v = strtod(at + strlen(want), NULL);
	free(want);
	return v;
}

static void
test_metrics_move(void **state)
{
	struct ses_proc *p = *state;
	char *text, *id;
	uint64_t index;
	int port = metrics_port(p);

	text = get(port, "/metrics");
	assert_non_null(strstr(text, "HTTP/1.1 200 OK"));
	assert_true(value(text,
	                "moat_sessiond_writes_total{op=\"append\","
	                "result=\"ok\"}") == 0);
	assert_true(value(text, "moat_sessiond_recordings") == 0);
	free(text);

	id = ses_create(p, TENANT, "sb-metrics");
	for (int i = 0; i < 3; i++)
		assert_int_equal(ses_append(p, TENANT, id, "echo hi", "hi\n",
		                     3, &index, NULL),
		    0);
	text = get(port, "/metrics");
	assert_true(value(text,
	                "moat_sessiond_writes_total{op=\"create\","
	                "result=\"ok\"}") == 1);
	assert_true(value(text,
	                "moat_sessiond_writes_total{op=\"append\","
	                "result=\"ok\"}") == 3);
	assert_true(value(text, "moat_sessiond_append_seconds_count") == 3);
	assert_true(
	    value(text, "moat_sessiond_append_seconds_bucket{le=\"+Inf\"}") ==
	    3);
	assert_true(value(text, "moat_sessiond_append_seconds_sum") > 0);
	assert_true(value(text, "moat_sessiond_fsync_seconds_count") >= 1);
	assert_true(value(text, "moat_sessiond_commit_writes_count") >= 1);
	assert_true(
	    value(text, "moat_sessiond_commits_total{result=\"ok\"}") >= 1);
	assert_true(value(text, "moat_sessiond_recordings") == 1);
	assert_true(value(text, "moat_sessiond_write_queue") == 0);
	assert_true(value(text, "moat_sessiond_lmdb_used_bytes") > 0);
	assert_true(value(text, "moat_sessiond_lmdb_map_bytes") >=
	    value(text, "moat_sessiond_lmdb_used_bytes"));
	assert_true(value(text, "moat_sessiond_resident_memory_bytes") > 0);
	free(text);

	text = get(port, "/");
	assert_non_null(strstr(text, "HTTP/1.1 404 "));
	free(text);
	free(id);
}

static int
setup(void **state)
{
	static struct ses_proc p;
	char *const extra[] = { "--metrics", "127.0.0.1:0", NULL };

	memset(&p, 0, sizeof(p));
	ses_start(&p, extra);
	*state = &p;
	return 0;
}

static int
teardown(void **state)
{
	ses_stop(*state);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_metrics_move, setup,
		    teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
