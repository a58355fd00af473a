/*
 * bench_http.c: measures the gateway's HTTP/JSON door against its nng
 * door in one run, against one local stack with one sandbox, and writes
 * JSON: (1) the round trip of `exec true` through POST
 * /v1/sandboxes/{id}/exec (libcurl, one keep-alive handle) and through
 * moat_client_exec, interleaved, p50/p95 of each and HTTP minus nng at
 * p50 (goal: HTTP adds at most 1 ms), also as the median of the paired
 * differences, and the same for one client's GetSandbox (no guest in
 * the round trip, so the doors' own cost shows); (2) GetSandbox requests
 * per second with THREADS concurrent clients over nng (a moat_client
 * each) and over HTTP (a curl handle each) for SECONDS, with the gateway
 * process's CPU use over each run (utime+stime from /proc/<pid>/stat over
 * wall time, percent of one core). The bench's own threads share the
 * host's cores with the gateway, so the rates are a floor, comparable
 * side by side.
 * It starts the stack itself (deploy/moat-stack in a fresh state
 * directory, HTTP on a free port) and purges it at exit. Not a test: it
 * asserts nothing about time. Run as
 *   MOAT_IMAGE_DIR=images/out moat-bench-http \
 *     tests/bench/results/http.json [N] [SECONDS]
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat_client.h"
#include "bench_stack.h"
#include "bench_stats.h"

#define N_DEFAULT 200
#define N_MAX 5000
#define SECONDS_DEFAULT 5
#define THREADS 32
#define WARMUP 10
#define REPLY_CAP (1u << 20) /* bytes kept of one HTTP reply */

static struct bench_stack S; /* its key, addresses, gateway pid */
static char auth_header[300];
static char sandbox_id[128];

/* One HTTP reply's body, capped at REPLY_CAP. */
struct reply {
	char body[REPLY_CAP];
	size_t len;
};

static void
die(const char *what, const char *detail)
{
	fprintf(stderr, "bench-http: %s: %s\n", what, detail ? detail : "");
	exit(1);
}

static void
die_rv(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench-http: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	free(msg);
	exit(1);
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct reply *r = arg;
	size_t n = size * nmemb, room = REPLY_CAP - 1 - r->len;

	memcpy(r->body + r->len, data, n < room ? n : room);
	r->len += n < room ? n : room;
	r->body[r->len] = '\0';
	return n;
}

/* http_handle: a curl handle with the bench's auth header, writing
 * replies into *r; caller frees both (curl_easy_cleanup,
 * curl_slist_free_all). */
static CURL *
http_handle(struct reply *r, struct curl_slist **headers)
{
	CURL *h = curl_easy_init();

	if (h == NULL)
		die("curl", "curl_easy_init failed");
	*headers = curl_slist_append(NULL, auth_header);
	*headers =
	    curl_slist_append(*headers, "Content-Type: application/json");
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, *headers);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
	return h;
}

/* http_call: one request on handle h (body NULL: GET); returns the HTTP
 * status, 0 when the transport failed. */
static long
http_call(CURL *h, struct reply *r, const char *url, const char *body)
{
	long status = 0;

	r->len = 0;
	r->body[0] = '\0';
	curl_easy_setopt(h, CURLOPT_URL, url);
	if (body != NULL)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	else
		curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
	if (curl_easy_perform(h) != CURLE_OK)
		return 0;
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
	return status;
}

/* ---- (1) exec true, HTTP against nng ---- */

static void
exec_nng(struct moat_client *c)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *res = NULL;
	char *argv[] = { (char *)"true" };
	char *msg = NULL;
	int rv;

	req.sandbox_id = sandbox_id;
	req.n_argv = 1;
	req.argv = argv;
	if ((rv = moat_client_exec(c, &req, &res, &msg)) != MOAT_OK)
		die_rv("exec over nng", rv, msg);
	if (res->status == NULL || res->status->exit_code != 0)
		die("exec over nng", "`true` did not exit 0");
	moat_client_free_msg(res);
}

static void
exec_http(CURL *h, struct reply *r, const char *url)
{
	long status = http_call(h, r, url, "{\"argv\": [\"true\"]}");

	if (status != 200)
		die("exec over HTTP", r->len ? r->body : "no reply");
	if (strstr(r->body, "\"exited\"") == NULL)
		die("exec over HTTP: no status in reply", r->body);
}

static void
get_nng(struct moat_client *c)
{
	Moat__V1__Sandbox *sb = NULL;
	char *msg = NULL;
	int rv;

	if ((rv = moat_client_get(c, sandbox_id, &sb, &msg)) != MOAT_OK)
		die_rv("GetSandbox over nng", rv, msg);
	moat_client_free_msg(sb);
}

static void
get_http(CURL *h, struct reply *r, const char *url)
{
	if (http_call(h, r, url, NULL) != 200)
		die("GetSandbox over HTTP", r->len ? r->body : "no reply");
}

/* ---- (2) GetSandbox rate, THREADS clients ---- */

static atomic_bool stop_flag;
static pthread_barrier_t start_line;

struct worker {
	pthread_t thread;
	bool http;
	unsigned long long calls;
	unsigned long long errors;
};

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	struct moat_client *c = NULL;
	struct reply *r = NULL;
	struct curl_slist *headers = NULL;
	CURL *h = NULL;
	char url[512], *msg = NULL;
	int rv;

	if (w->http) {
		if ((r = calloc(1, sizeof(*r))) == NULL)
			die("worker", "out of memory");
		h = http_handle(r, &headers);
		snprintf(url, sizeof(url), "%s/v1/sandboxes/%s", S.http_base,
		    sandbox_id);
	} else if ((rv = moat_client_open(&c, S.gateway_url, S.api_key,
	                &msg)) != MOAT_OK)
		die_rv("worker open", rv, msg);
	pthread_barrier_wait(&start_line);
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		bool ok;

		if (w->http) {
			ok = http_call(h, r, url, NULL) == 200;
		} else {
			Moat__V1__Sandbox *sb = NULL;

			ok = moat_client_get(c, sandbox_id, &sb, &msg) ==
			    MOAT_OK;
			moat_client_free_msg(sb);
			free(msg);
			msg = NULL;
		}
		if (ok)
			w->calls++;
		else
			w->errors++;
	}
	if (h != NULL)
		curl_easy_cleanup(h);
	curl_slist_free_all(headers);
	free(r);
	moat_client_close(c);
	return NULL;
}

/* rate: THREADS workers over nng or HTTP for `seconds`; returns the
 * result as JSON (caller's). */
static json_t *
rate(bool http, int seconds, long gateway_pid)
{
	struct worker w[THREADS];
	unsigned long long calls = 0, errors = 0, t0_ticks, t1_ticks;
	double t0, wall_s, cpu_s;

	memset(w, 0, sizeof(w));
	atomic_store(&stop_flag, false);
	pthread_barrier_init(&start_line, NULL, THREADS + 1);
	for (int i = 0; i < THREADS; i++) {
		w[i].http = http;
		if (pthread_create(&w[i].thread, NULL, worker_main, &w[i]) !=
		    0)
			die("rate", "cannot start a thread");
	}
	pthread_barrier_wait(&start_line);
	t0_ticks = bench_stack_cpu_ticks(gateway_pid);
	t0 = bench_now_ms();
	sleep((unsigned)seconds);
	atomic_store(&stop_flag, true);
	wall_s = (bench_now_ms() - t0) / 1e3;
	t1_ticks = bench_stack_cpu_ticks(gateway_pid);
	for (int i = 0; i < THREADS; i++) {
		pthread_join(w[i].thread, NULL);
		calls += w[i].calls;
		errors += w[i].errors;
	}
	pthread_barrier_destroy(&start_line);
	/* Calls still in flight at the stop are counted after it; at THREADS
	 * calls out of seconds' worth the error is small. */
	cpu_s = (double)(t1_ticks - t0_ticks) / (double)sysconf(_SC_CLK_TCK);
	fprintf(stderr,
	    "GetSandbox over %s: %.0f req/s, gateway CPU %.0f%%, "
	    "%llu errors\n",
	    http ? "HTTP" : "nng", (double)calls / wall_s,
	    100.0 * cpu_s / wall_s, errors);
	return json_pack("{s:i, s:f, s:I, s:I, s:f, s:f, s:f}", "threads",
	    THREADS, "seconds", wall_s, "calls", (json_int_t)calls, "errors",
	    (json_int_t)errors, "req_per_s", (double)calls / wall_s,
	    "gateway_cpu_percent_of_one_core", 100.0 * cpu_s / wall_s,
	    "gateway_cpu_ms_per_1000_req",
	    calls ? 1e6 * cpu_s / (double)calls : 0.0);
}

int
main(int argc, char **argv)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	struct moat_client *gw = NULL;
	struct curl_slist *headers = NULL;
	struct reply *r;
	CURL *h;
	char exec_url[512], *msg = NULL;
	int n = argc > 2 ? atoi(argv[2]) : N_DEFAULT;
	int seconds = argc > 3 ? atoi(argv[3]) : SECONDS_DEFAULT;
	double *via_http, *via_nng, *paired, *get_http_ms, *get_nng_ms;
	double t0, create_ms;
	char get_url[512];
	long gateway_pid;
	json_t *out, *jh, *jn, *gh, *gn, *rate_nng, *rate_http;
	int rv;

	if (argc < 2) {
		fprintf(stderr,
		    "usage: moat-bench-http OUT.json [N] "
		    "[SECONDS]\n");
		return 2;
	}
	if (n < 1 || n > N_MAX)
		n = N_DEFAULT;
	if (seconds < 1 || seconds > 600)
		seconds = SECONDS_DEFAULT;
	if ((via_http = calloc((size_t)n, sizeof(double))) == NULL ||
	    (via_nng = calloc((size_t)n, sizeof(double))) == NULL ||
	    (paired = calloc((size_t)n, sizeof(double))) == NULL ||
	    (get_http_ms = calloc((size_t)n, sizeof(double))) == NULL ||
	    (get_nng_ms = calloc((size_t)n, sizeof(double))) == NULL ||
	    (r = calloc(1, sizeof(*r))) == NULL)
		die("main", "out of memory");
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0)
		die("curl", "curl_global_init failed");

	/* The stack, in its own state directory, HTTP on a free port. */
	bench_stack_start(&S, "http", MOAT_REPO_DIR, MOAT_BIN_DIR, false);
	snprintf(auth_header, sizeof(auth_header), "Authorization: Bearer %s",
	    S.api_key);
	gateway_pid = S.gateway_pid;

	if ((rv = moat_client_open(&gw, S.gateway_url, S.api_key, &msg)) !=
	    MOAT_OK)
		die_rv("open", rv, msg);
	t0 = bench_now_ms();
	if ((rv = moat_client_create(gw, &creq, &sb, &msg)) != MOAT_OK)
		die_rv("create", rv, msg);
	create_ms = bench_now_ms() - t0;
	snprintf(sandbox_id, sizeof(sandbox_id), "%s", sb->id);
	moat_client_free_msg(sb);
	fprintf(stderr, "sandbox %s up in %.0f ms\n", sandbox_id, create_ms);

	/* (1) Interleaved, alternating which door goes first. */
	h = http_handle(r, &headers);
	snprintf(exec_url, sizeof(exec_url), "%s/v1/sandboxes/%s/exec",
	    S.http_base, sandbox_id);
	for (int i = 0; i < WARMUP; i++) {
		exec_http(h, r, exec_url);
		exec_nng(gw);
	}
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 2; j++) {
			bool http = (i + j) % 2 == 0;

			t0 = bench_now_ms();
			if (http)
				exec_http(h, r, exec_url);
			else
				exec_nng(gw);
			(http ? via_http : via_nng)[i] = bench_now_ms() - t0;
		}
		paired[i] = via_http[i] - via_nng[i];
	}
	/* The doors' own cost, without a guest round trip in the noise:
	 * GetSandbox, one client each, interleaved the same way. */
	snprintf(get_url, sizeof(get_url), "%s/v1/sandboxes/%s", S.http_base,
	    sandbox_id);
	for (int i = 0; i < WARMUP; i++) {
		get_http(h, r, get_url);
		get_nng(gw);
	}
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 2; j++) {
			bool http = (i + j) % 2 == 0;

			t0 = bench_now_ms();
			if (http)
				get_http(h, r, get_url);
			else
				get_nng(gw);
			(http ? get_http_ms : get_nng_ms)[i] =
			    bench_now_ms() - t0;
		}
	}
	curl_easy_cleanup(h);
	curl_slist_free_all(headers);
	jh = bench_summary(via_http, (size_t)n);
	jn = bench_summary(via_nng, (size_t)n);
	gh = bench_summary(get_http_ms, (size_t)n);
	gn = bench_summary(get_nng_ms, (size_t)n);
	fprintf(stderr, "exec true: HTTP p50 %.2f ms, nng p50 %.2f ms\n",
	    json_real_value(json_object_get(jh, "p50_ms")),
	    json_real_value(json_object_get(jn, "p50_ms")));
	fprintf(stderr, "GetSandbox: HTTP p50 %.3f ms, nng p50 %.3f ms\n",
	    json_real_value(json_object_get(gh, "p50_ms")),
	    json_real_value(json_object_get(gn, "p50_ms")));

	/* (2) */
	rate_nng = rate(false, seconds, gateway_pid);
	rate_http = rate(true, seconds, gateway_pid);

	if ((rv = moat_client_destroy(gw, sandbox_id, &msg)) != MOAT_OK) {
		fprintf(stderr, "bench-http: destroy %s: %s\n", sandbox_id,
		    msg ? msg : "");
		free(msg);
	}
	moat_client_close(gw);

	{
		double h50 = json_real_value(json_object_get(jh, "p50_ms"));
		double h95 = json_real_value(json_object_get(jh, "p95_ms"));
		double n50 = json_real_value(json_object_get(jn, "p50_ms"));
		double n95 = json_real_value(json_object_get(jn, "p95_ms"));
		double rn =
		    json_real_value(json_object_get(rate_nng, "req_per_s"));
		double rh =
		    json_real_value(json_object_get(rate_http, "req_per_s"));

		double g50 = json_real_value(json_object_get(gh, "p50_ms")) -
		    json_real_value(json_object_get(gn, "p50_ms"));

		out = json_pack("{s:s, s:i, s:f, s:o, s:o, s:f, s:f, s:f, "
		                "s:f, s:o, s:o, s:f, s:o, s:o, s:f}",
		    "bench", "http", "host_cpus",
		    (int)sysconf(_SC_NPROCESSORS_ONLN), "create_ms", create_ms,
		    "exec_true_via_http", jh, "exec_true_via_nng", jn,
		    "http_added_p50_ms", h50 - n50, "http_added_p95_ms",
		    h95 - n95, "http_added_paired_median_ms",
		    bench_percentile(paired, (size_t)n, 0.50),
		    "goal_http_added_p50_ms", 1.0, "get_sandbox_via_http", gh,
		    "get_sandbox_via_nng", gn, "get_sandbox_http_added_p50_ms",
		    g50, "get_sandbox_rate_nng", rate_nng,
		    "get_sandbox_rate_http", rate_http, "http_over_nng_rate",
		    rn > 0 ? rh / rn : 0.0);
	}
	if (out == NULL || json_dump_file(out, argv[1], JSON_INDENT(2)) != 0)
		die("cannot write", argv[1]);
	json_decref(out);
	free(via_http);
	free(via_nng);
	free(paired);
	free(get_http_ms);
	free(get_nng_ms);
	free(r);
	curl_global_cleanup();
	return 0;
}
