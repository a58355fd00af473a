/*
 * test_metrics.c: unit tests of lib/metrics.c and lib/metrics_server.c:
 * histogram buckets (bounds inclusive, cumulative, +Inf, _sum, _count),
 * label escaping, the text parsed back line by line into the values that
 * were set (a round trip through the format), concurrent updates from
 * many threads adding up exactly, refused names and labels, process
 * figures, and the listener: GET /metrics, 404, 405, 400, an oversized
 * request, a bad address. Not for: what the services measure
 * (tests/integration/stack/metrics_test.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "moat/metrics.h"
#include "moat/status.h"

/* ---- a small parser of the text format, for the round trip ---- */

struct sample {
	char name[128];
	char labels[512]; /* unescaped: name=value,name=value */
	double value;
};

/* parse_line: one sample line into *s; false for comments and blanks. */
static bool
parse_line(const char *line, struct sample *s)
{
	const char *p = line;
	size_t n = 0, l = 0;

	memset(s, 0, sizeof(*s));
	if (line[0] == '#' || line[0] == '\0')
		return false;
	while (*p && *p != '{' && *p != ' ')
		s->name[n++] = *p++;
	if (*p == '{') {
		p++;
		while (*p && *p != '}') {
			while (*p != '=')
				s->labels[l++] = *p++;
			s->labels[l++] = *p++; /* = */
			assert_int_equal(*p++, '"');
			while (*p != '"') {
				if (*p == '\\') {
					p++;
					s->labels[l++] = *p == 'n' ? '\n' : *p;
					p++;
				} else {
					s->labels[l++] = *p++;
				}
			}
			p++; /* closing quote */
			if (*p == ',')
				s->labels[l++] = *p++;
		}
		p++; /* } */
	}
	assert_int_equal(*p++, ' ');
	s->value = strcmp(p, "+Inf") == 0 ? INFINITY : strtod(p, NULL);
	return true;
}

/* find: the value of `name` with `labels` in `text`; NAN when absent. */
static double
find(const char *text, const char *name, const char *labels)
{
	char *copy = strdup(text), *save = NULL;
	double v = NAN;

	for (char *line = strtok_r(copy, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		struct sample s;

		if (parse_line(line, &s) && strcmp(s.name, name) == 0 &&
		    strcmp(s.labels, labels) == 0) {
			v = s.value;
			break;
		}
	}
	free(copy);
	return v;
}

static size_t
count_lines(const char *text, const char *prefix)
{
	size_t n = 0, plen = strlen(prefix);

	for (const char *p = text; p && *p;
	     p = strchr(p, '\n'), p = p ? p + 1 : p)
		n += strncmp(p, prefix, plen) == 0;
	return n;
}

/* ---- tests ---- */

static void
test_histogram_buckets(void **state)
{
	static const double bounds[] = { 0.1, 1, 10 };
	struct moat_metrics *reg;
	struct moat_histogram *h;
	char *text;

	assert_int_equal(moat_metrics_new(&reg), MOAT_OK);
	h = moat_metrics_histogram(reg, "moat_test_seconds", "A test.", NULL,
	    bounds, 3);
	assert_non_null(h);
	moat_histogram_observe(h, 0.05);
	moat_histogram_observe(h, 0.1); /* a bound is its own bucket's */
	moat_histogram_observe(h, 0.5);
	moat_histogram_observe(h, 5);
	moat_histogram_observe(h, 50);
	moat_histogram_observe(h, NAN); /* ignored */
	moat_histogram_observe_ms(h, 250);
	assert_int_equal(moat_histogram_count(h), 6);
	text = moat_metrics_text(reg, NULL);
	assert_non_null(text);
	assert_true(find(text, "moat_test_seconds_bucket", "le=0.1") == 2);
	assert_true(find(text, "moat_test_seconds_bucket", "le=1") == 4);
	assert_true(find(text, "moat_test_seconds_bucket", "le=10") == 5);
	assert_true(find(text, "moat_test_seconds_bucket", "le=+Inf") == 6);
	assert_true(find(text, "moat_test_seconds_count", "") == 6);
	assert_true(
	    fabs(find(text, "moat_test_seconds_sum", "") - 55.9) < 1e-9);
	assert_int_equal(count_lines(text,
	                     "# TYPE moat_test_seconds "
	                     "histogram"),
	    1);
	free(text);
	/* Bad bounds are refused. */
	static const double unsorted[] = { 1, 0.5 };
	assert_null(
	    moat_metrics_histogram(reg, "moat_test_b", "", NULL, unsorted, 2));
	assert_null(
	    moat_metrics_histogram(reg, "moat_test_c", "", NULL, bounds, 0));
	moat_metrics_free(reg);
}

static void
test_label_escaping(void **state)
{
	char out[64];
	size_t n;

	n = moat_metrics_escape_label(out, sizeof(out), "a\"b\\c\nd");
	assert_string_equal(out, "a\\\"b\\\\c\\nd");
	assert_int_equal(n, strlen("a\\\"b\\\\c\\nd"));
	/* Truncated like snprintf: the length it needs, NUL-terminated. */
	n = moat_metrics_escape_label(out, 4, "\"\"\"");
	assert_int_equal(n, 6);
	assert_int_equal(strlen(out), 3);
	assert_int_equal(moat_metrics_escape_label(NULL, 0, "ab"), 2);
	assert_int_equal(moat_metrics_escape_label(out, sizeof(out), NULL), 0);
	assert_string_equal(out, "");
}

/* Every kind with labels, written and parsed back to the same values;
 * HELP and TYPE once per name, before its samples. */
static void
test_round_trip(void **state)
{
	const char *a[] = { "state", "running", NULL };
	const char *b[] = { "state", "failed \"x\"\n\\", NULL };
	const char *c[] = { "method", "Get", "code", "OK", NULL };
	struct moat_metrics *reg;
	struct moat_counter *ca, *cb;
	struct moat_gauge *g;
	char *text;

	assert_int_equal(moat_metrics_new(&reg), MOAT_OK);
	ca = moat_metrics_counter(reg, "moat_t_total",
	    "Things.\nTwo "
	    "lines \\.",
	    a);
	cb = moat_metrics_counter(reg, "moat_t_total", "ignored", b);
	g = moat_metrics_gauge(reg, "moat_t_bytes", "Bytes.", c);
	assert_non_null(ca);
	assert_non_null(cb);
	assert_non_null(g);
	/* The same series twice is one series. */
	assert_ptr_equal(moat_metrics_counter(reg, "moat_t_total", "", a), ca);
	moat_counter_add(ca, 41);
	moat_counter_inc(ca);
	moat_counter_set(cb, 7);
	moat_gauge_set(g, 1e15 + 3);
	moat_gauge_add(g, 0.5);
	text = moat_metrics_text(reg, NULL);
	assert_non_null(text);
	assert_true(find(text, "moat_t_total", "state=running") == 42);
	assert_true(find(text, "moat_t_total", "state=failed \"x\"\n\\") == 7);
	assert_true(
	    find(text, "moat_t_bytes", "method=Get,code=OK") == 1e15 + 3.5);
	assert_int_equal(count_lines(text, "# HELP moat_t_total "), 1);
	assert_int_equal(count_lines(text, "# TYPE moat_t_total counter"), 1);
	assert_non_null(
	    strstr(text, "# HELP moat_t_total Things.\\nTwo lines \\\\.\n"));
	assert_true(strstr(text, "# TYPE moat_t_total") <
	    strstr(text, "moat_t_total{"));
	assert_non_null(strstr(text, "# TYPE moat_t_bytes gauge\n"));
	free(text);
	moat_metrics_free(reg);
}

static void
test_refused(void **state)
{
	const char *le[] = { "le", "1", NULL };
	const char *bad[] = { "1x", "1", NULL };
	const char *novalue[] = { "a", NULL };
	const char *many[] = { "a", "1", "b", "1", "c", "1", "d", "1", "e",
		"1", NULL };
	struct moat_metrics *reg;

	assert_int_equal(moat_metrics_new(&reg), MOAT_OK);
	assert_null(moat_metrics_counter(reg, "9lives", "", NULL));
	assert_null(moat_metrics_counter(reg, "a-b", "", NULL));
	assert_null(moat_metrics_counter(reg, "", "", NULL));
	assert_null(moat_metrics_counter(reg, "moat_x", "", le));
	assert_null(moat_metrics_counter(reg, "moat_x", "", bad));
	assert_null(moat_metrics_counter(reg, "moat_x", "", novalue));
	assert_null(moat_metrics_counter(reg, "moat_x", "", many));
	assert_non_null(moat_metrics_counter(reg, "moat_x", "", NULL));
	/* One name, one type. */
	assert_null(moat_metrics_gauge(reg, "moat_x", "", NULL));
	assert_null(moat_metrics_counter(NULL, "moat_y", "", NULL));
	/* Updates of a metric that could not be made do nothing. */
	moat_counter_inc(NULL);
	moat_gauge_set(NULL, 1);
	moat_histogram_observe(NULL, 1);
	assert_int_equal(moat_counter_get(NULL), 0);
	moat_metrics_free(reg);
	moat_metrics_free(NULL);
}

#define THREADS 8
#define ROUNDS 100000

struct shared {
	struct moat_counter *c;
	struct moat_gauge *g;
	struct moat_histogram *h;
	struct moat_metrics *reg;
};

static void *
hammer(void *arg)
{
	struct shared *s = arg;

	for (int i = 0; i < ROUNDS; i++) {
		moat_counter_inc(s->c);
		moat_gauge_add(s->g, 1);
		moat_histogram_observe(s->h, (i % 3) * 0.5);
		if (i % 20000 == 0)
			free(moat_metrics_text(s->reg, NULL));
	}
	return NULL;
}

static void
test_concurrent(void **state)
{
	static const double bounds[] = { 0.25, 0.75 };
	struct shared s;
	pthread_t t[THREADS];
	char *text;

	assert_int_equal(moat_metrics_new(&s.reg), MOAT_OK);
	s.c = moat_metrics_counter(s.reg, "moat_c_total", "", NULL);
	s.g = moat_metrics_gauge(s.reg, "moat_g", "", NULL);
	s.h = moat_metrics_histogram(s.reg, "moat_h", "", NULL, bounds, 2);
	for (int i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&t[i], NULL, hammer, &s), 0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(moat_counter_get(s.c), THREADS * ROUNDS);
	assert_true(moat_gauge_get(s.g) == THREADS * ROUNDS);
	assert_int_equal(moat_histogram_count(s.h), THREADS * ROUNDS);
	text = moat_metrics_text(s.reg, NULL);
	/* i % 3 == 0 -> 0; 1 -> 0.5; 2 -> 1.0 */
	assert_true(find(text, "moat_h_bucket", "le=0.25") ==
	    THREADS * ((ROUNDS + 2) / 3));
	assert_true(
	    find(text, "moat_h_bucket", "le=+Inf") == THREADS * ROUNDS);
	assert_true(find(text, "moat_h_sum", "") ==
	    THREADS * (0.5 * ((ROUNDS + 1) / 3) + 1.0 * (ROUNDS / 3)));
	free(text);
	moat_metrics_free(s.reg);
}

static int hook_runs;

static void
hook(void *ctx)
{
	hook_runs++;
	moat_gauge_set(ctx, 17);
}

static void
test_process_and_hooks(void **state)
{
	struct moat_metrics *reg;
	struct moat_gauge *g;
	char *text;

	assert_int_equal(moat_metrics_new(&reg), MOAT_OK);
	assert_int_equal(moat_metrics_process(reg, "test"), MOAT_OK);
	assert_int_equal(moat_metrics_process(reg, "test"),
	    MOAT_ALREADY_EXISTS);
	g = moat_metrics_gauge(reg, "moat_hooked", "", NULL);
	assert_int_equal(moat_metrics_on_scrape(reg, hook, g), MOAT_OK);
	text = moat_metrics_text(reg, NULL);
	assert_int_equal(hook_runs, 1);
	assert_true(find(text, "moat_hooked", "") == 17);
	assert_true(find(text, "moat_test_resident_memory_bytes", "") > 0);
	assert_true(find(text, "moat_test_open_fds", "") >= 3);
	assert_true(find(text, "moat_test_uptime_seconds", "") >= 0);
	assert_true(find(text, "moat_test_start_time_seconds", "") > 1.6e9);
	free(text);
	moat_metrics_free(reg);
}

/* ---- the listener ---- */

/* http: sends `request` to 127.0.0.1:port and returns the whole answer
 * (heap). */
static char *
http(uint16_t port, const char *request)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons(port) };
	char *buf = calloc(1, 1 << 20);
	size_t len = 0;
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(send(fd, request, strlen(request), MSG_NOSIGNAL),
	    (ssize_t)strlen(request));
	while ((n = recv(fd, buf + len, (1 << 20) - 1 - len, 0)) > 0)
		len += (size_t)n;
	close(fd);
	return buf;
}

static void
test_server(void **state)
{
	struct moat_metrics_server *srv;
	struct moat_metrics *reg;
	char *errmsg = NULL, *r, big[4096]; /* the cap, less its NUL */
	uint16_t port;

	assert_int_equal(moat_metrics_new(&reg), MOAT_OK);
	moat_counter_add(moat_metrics_counter(reg, "moat_s_total", "S.", NULL),
	    3);
	assert_int_equal(moat_metrics_serve(&srv, reg, "127.0.0.1:0", &errmsg),
	    MOAT_OK);
	port = moat_metrics_server_port(srv);
	assert_true(port > 0);

	r = http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
	assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
	assert_non_null(strstr(r, "text/plain; version=0.0.4"));
	assert_non_null(strstr(r, "\r\n\r\n# HELP moat_s_total S.\n"));
	assert_non_null(strstr(r, "\nmoat_s_total 3\n"));
	free(r);
	r = http(port, "GET /metrics?x=1 HTTP/1.0\n\n");
	assert_non_null(strstr(r, " 200 OK"));
	free(r);
	r = http(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
	assert_non_null(strstr(r, " 200 OK"));
	assert_null(strstr(r, "moat_s_total"));
	free(r);
	r = http(port, "GET / HTTP/1.1\r\n\r\n");
	assert_non_null(strstr(r, "HTTP/1.1 404 Not Found"));
	assert_non_null(strstr(r, "/metrics"));
	free(r);
	r = http(port, "POST /metrics HTTP/1.1\r\n\r\n");
	assert_non_null(strstr(r, "HTTP/1.1 405 "));
	assert_non_null(strstr(r, "Allow: GET"));
	free(r);
	r = http(port, "hello\r\n\r\n");
	assert_non_null(strstr(r, "HTTP/1.1 400 "));
	free(r);
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	r = http(port, big);
	assert_non_null(strstr(r, "HTTP/1.1 431 "));
	free(r);
	/* Still serving after all that. */
	r = http(port, "GET /metrics HTTP/1.1\r\n\r\n");
	assert_non_null(strstr(r, " 200 OK"));
	free(r);
	moat_metrics_server_stop(srv);

	assert_int_equal(moat_metrics_serve(&srv, reg, "nonsense", &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(srv);
	assert_non_null(strstr(errmsg, "HOST:PORT"));
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_metrics_serve(&srv, reg, "::1:80", &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(moat_metrics_serve(&srv, reg, "127.0.0.1:99999",
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	moat_metrics_server_stop(NULL);
	moat_metrics_free(reg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_histogram_buckets),
		cmocka_unit_test(test_label_escaping),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_concurrent),
		cmocka_unit_test(test_process_and_hooks),
		cmocka_unit_test(test_server),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
