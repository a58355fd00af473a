/*
 * bench_grpc.c: the gateway's gRPC door against its nng and HTTP/JSON
 * doors in one run, one local stack, one sandbox; writes JSON: (1) the
 * round trip of `exec true` as a unary gRPC Exec (a small C client on
 * libnghttp2's client session, h2c with prior knowledge, one
 * connection, so the figures are the door's and not a client library's
 * overhead), as moat_client_exec over nng, and as POST
 * /v1/sandboxes/{id}/exec (libcurl, one keep-alive handle), interleaved
 * in turn, p50/p95 of each, gRPC minus nng at p50 (goal: at most
 * 0.5 ms) and the ratios; one client's GetSandbox over gRPC and nng
 * the same way (no guest: the doors' own cost); (2) unary GetSandbox calls per second over
 * gRPC with 32 streams in flight on one connection, for SECONDS, with
 * the gateway's CPU use. The bench shares the host's cores with the
 * gateway and the guest: compare the figures side by side.
 * It starts and purges its own stack (bench_stack.h). Not a test: it
 * asserts nothing about time. Run as
 *   MOAT_IMAGE_DIR=images/out moat-bench-grpc \
 *     tests/bench/results/grpc.json [N] [SECONDS]
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_stack.h"
#include "bench_stats.h"
#include "moat/status.h"
#include "moat_client.h"

#define N_DEFAULT 200
#define N_MAX 5000
#define SECONDS_DEFAULT 5
#define STREAMS 32
#define WARMUP 10
#define REPLY_MAX 65536

static struct bench_stack S;
static char sandbox_id[128];

/* ---- a unary gRPC client on one h2c connection ---- */

/* One call: its request message framed, its reply and status. */
struct call {
	uint8_t req[512];
	size_t req_len, req_off;
	uint8_t reply[REPLY_MAX];
	size_t reply_len;
	int grpc_status; /* -1: none yet */
	bool done;
	double t0;
};

struct h2 {
	int fd;
	nghttp2_session *s;
	int in_flight;
	unsigned long long finished, failed;
	bool keep_going; /* rate: resubmit each call that ends */
	const char *path;
};

static ssize_t
on_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags,
    void *arg)
{
	struct h2 *h = arg;
	ssize_t n = send(h->fd, data, len, MSG_NOSIGNAL);

	(void)s;
	(void)flags;
	return n < 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : n;
}

static ssize_t
on_read_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *arg)
{
	struct call *c = src->ptr;
	size_t n = c->req_len - c->req_off;

	(void)s;
	(void)id;
	(void)arg;
	if (n > len)
		n = len;
	memcpy(buf, c->req + c->req_off, n);
	c->req_off += n;
	if (c->req_off == c->req_len)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

static int
on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
    size_t len, void *arg)
{
	struct call *c = nghttp2_session_get_stream_user_data(s, id);

	(void)flags;
	(void)arg;
	if (c != NULL && c->reply_len + len <= REPLY_MAX) {
		memcpy(c->reply + c->reply_len, data, len);
		c->reply_len += len;
	}
	return 0;
}

static int
on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
    size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
    void *arg)
{
	struct call *c =
	    nghttp2_session_get_stream_user_data(s, f->hd.stream_id);

	(void)flags;
	(void)arg;
	(void)valuelen;
	if (c != NULL && namelen == 11 && memcmp(name, "grpc-status", 11) == 0)
		c->grpc_status = atoi((const char *)value);
	return 0;
}

static int submit(struct h2 *h, struct call *c);

static int
on_close(nghttp2_session *s, int32_t id, uint32_t err, void *arg)
{
	struct h2 *h = arg;
	struct call *c = nghttp2_session_get_stream_user_data(s, id);

	if (c == NULL)
		return 0;
	c->done = true;
	h->in_flight--;
	if (err == 0 && c->grpc_status == 0)
		h->finished++;
	else
		h->failed++;
	if (h->keep_going)
		submit(h, c);
	return 0;
}

#define HDR(n, v)                                                             \
	{                                                                     \
		(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v),     \
		    NGHTTP2_NV_FLAG_NONE                                      \
	}

/* submit: sends call c (its request already framed) on h->path. */
static int
submit(struct h2 *h, struct call *c)
{
	char authz[300];
	nghttp2_data_provider dp = { .source.ptr = c,
		.read_callback = on_read_body };

	snprintf(authz, sizeof(authz), "Bearer %s", S.api_key);
	const nghttp2_nv nv[] = { HDR(":method", "POST"),
		HDR(":scheme", "http"), HDR(":path", h->path),
		HDR(":authority", "127.0.0.1"),
		HDR("content-type", "application/grpc"), HDR("te", "trailers"),
		HDR("authorization", authz) };

	c->req_off = 0;
	c->reply_len = 0;
	c->grpc_status = -1;
	c->done = false;
	c->t0 = bench_now_ms();
	if (nghttp2_submit_request(h->s, NULL, nv, sizeof(nv) / sizeof(nv[0]),
	        &dp, c) < 0)
		bench_stack_die("grpc", "nghttp2_submit_request failed");
	h->in_flight++;
	return 0;
}

/* pump: sends what is queued, then reads once (blocking up to 1 s). */
static void
pump(struct h2 *h)
{
	struct pollfd p = { .fd = h->fd, .events = POLLIN };
	uint8_t buf[65536];
	ssize_t n;

	if (nghttp2_session_send(h->s) != 0)
		bench_stack_die("grpc", "send failed");
	if (poll(&p, 1, 1000) <= 0)
		return;
	if ((n = recv(h->fd, buf, sizeof(buf), 0)) <= 0)
		bench_stack_die("grpc", "the gateway closed the connection");
	if (nghttp2_session_mem_recv(h->s, buf, (size_t)n) < 0)
		bench_stack_die("grpc", "bad HTTP/2 from the gateway");
}

static void
h2_open(struct h2 *h)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t)S.grpc_port) };
	nghttp2_session_callbacks *cb;
	int one = 1;

	memset(h, 0, sizeof(*h));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((h->fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
	    connect(h->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		bench_stack_die("grpc", "cannot connect to the gRPC door");
	setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	nghttp2_session_callbacks_new(&cb);
	nghttp2_session_callbacks_set_send_callback(cb, on_send);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
	nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
	nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
	if (nghttp2_session_client_new(&h->s, cb, h) != 0)
		bench_stack_die("grpc", "nghttp2_session_client_new failed");
	nghttp2_session_callbacks_del(cb);
	nghttp2_submit_settings(h->s, NGHTTP2_FLAG_NONE, NULL, 0);
}

static void
h2_close(struct h2 *h)
{
	nghttp2_session_del(h->s);
	close(h->fd);
}

/* frame: `m` packed behind gRPC's 5-byte prefix into c->req. */
static void
frame(struct call *c, const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);

	if (len + 5 > sizeof(c->req))
		bench_stack_die("grpc", "request too large");
	c->req[0] = 0;
	c->req[1] = (uint8_t)(len >> 24);
	c->req[2] = (uint8_t)(len >> 16);
	c->req[3] = (uint8_t)(len >> 8);
	c->req[4] = (uint8_t)len;
	protobuf_c_message_pack(m, c->req + 5);
	c->req_len = len + 5;
}

/* grpc_call: one unary call of c on path, to its end. */
static void
grpc_call(struct h2 *h, const char *path, struct call *c)
{
	h->path = path;
	submit(h, c);
	while (!c->done)
		pump(h);
	if (c->grpc_status != 0)
		bench_stack_die("grpc call failed", path);
}

/* ---- exec true by each door ---- */

static void
exec_grpc(struct h2 *h, struct call *c)
{
	Moat__V1__ExecResult *res;

	grpc_call(h, "/moat.v1.Gateway/Exec", c);
	res = moat__v1__exec_result__unpack(NULL, c->reply_len - 5,
	    c->reply + 5);
	if (c->reply_len < 5 || res == NULL || res->status == NULL ||
	    res->status->exit_code != 0)
		bench_stack_die("exec over gRPC", "`true` did not exit 0");
	moat__v1__exec_result__free_unpacked(res, NULL);
}

static void
exec_nng(struct moat_client *mc, const Moat__V1__ExecRequest *req)
{
	Moat__V1__ExecResult *res = NULL;
	char *msg = NULL;

	if (moat_client_exec(mc, req, &res, &msg) != MOAT_OK ||
	    res->status == NULL || res->status->exit_code != 0)
		bench_stack_die("exec over nng", msg);
	moat_client_free_msg(res);
}

static size_t
on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	(void)data;
	*(size_t *)arg += size * nmemb;
	return size * nmemb;
}

static void
exec_http(CURL *ch)
{
	long status = 0;

	if (curl_easy_perform(ch) != CURLE_OK ||
	    curl_easy_getinfo(ch, CURLINFO_RESPONSE_CODE, &status) !=
	        CURLE_OK ||
	    status != 200)
		bench_stack_die("exec over HTTP", "not 200");
}

static CURL *
http_exec_handle(struct curl_slist **hdrs, size_t *got)
{
	static char url[512], authz[300];
	CURL *ch = curl_easy_init();

	snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/exec", S.http_base,
	    sandbox_id);
	snprintf(authz, sizeof(authz), "Authorization: Bearer %s", S.api_key);
	*hdrs = curl_slist_append(NULL, authz);
	*hdrs = curl_slist_append(*hdrs, "Content-Type: application/json");
	curl_easy_setopt(ch, CURLOPT_URL, url);
	curl_easy_setopt(ch, CURLOPT_HTTPHEADER, *hdrs);
	curl_easy_setopt(ch, CURLOPT_POSTFIELDS, "{\"argv\": [\"true\"]}");
	curl_easy_setopt(ch, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(ch, CURLOPT_WRITEDATA, got);
	curl_easy_setopt(ch, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(ch, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(ch, CURLOPT_TIMEOUT_MS, 60000L);
	return ch;
}

/* rate: GetSandbox with STREAMS calls in flight on one connection for
 * `seconds`; JSON (caller's). */
static json_t *
rate(int seconds)
{
	static struct call calls[STREAMS];
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	struct h2 h;
	unsigned long long t0_ticks, t1_ticks;
	double t0, wall_s, cpu_s;

	h2_open(&h);
	h.path = "/moat.v1.Gateway/GetSandbox";
	h.keep_going = true;
	ref.sandbox_id = sandbox_id;
	t0_ticks = bench_stack_cpu_ticks(S.gateway_pid);
	t0 = bench_now_ms();
	for (int i = 0; i < STREAMS; i++) {
		frame(&calls[i], (const ProtobufCMessage *)&ref);
		submit(&h, &calls[i]);
	}
	while (bench_now_ms() - t0 < seconds * 1e3)
		pump(&h);
	wall_s = (bench_now_ms() - t0) / 1e3;
	t1_ticks = bench_stack_cpu_ticks(S.gateway_pid);
	h.keep_going = false;
	while (h.in_flight > 0)
		pump(&h);
	h2_close(&h);
	cpu_s = (double)(t1_ticks - t0_ticks) / (double)sysconf(_SC_CLK_TCK);
	fprintf(stderr,
	    "GetSandbox over gRPC, %d streams: %.0f calls/s, gateway CPU "
	    "%.0f%%, %llu failed\n",
	    STREAMS, (double)h.finished / wall_s, 100.0 * cpu_s / wall_s,
	    h.failed);
	return json_pack("{s:i, s:f, s:I, s:I, s:f, s:f}", "streams", STREAMS,
	    "seconds", wall_s, "calls", (json_int_t)h.finished, "errors",
	    (json_int_t)h.failed, "calls_per_s", (double)h.finished / wall_s,
	    "gateway_cpu_percent_of_one_core", 100.0 * cpu_s / wall_s);
}

/* gets: n rounds of one client's GetSandbox over gRPC and over nng in
 * turn (no guest in the round trip: the doors' own cost), into t[0]
 * and t[1]. */
static void
gets(int n, double *t[2])
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	static struct call c;
	struct moat_client *mc = NULL;
	Moat__V1__Sandbox *sb;
	char *msg = NULL;
	struct h2 h;

	ref.sandbox_id = sandbox_id;
	if (moat_client_open(&mc, S.gateway_url, S.api_key, &msg) != MOAT_OK)
		bench_stack_die("open", msg);
	h2_open(&h);
	frame(&c, (const ProtobufCMessage *)&ref);
	for (int i = -WARMUP; i < n; i++) {
		for (int j = 0; j < 2; j++) {
			double t0 = bench_now_ms();

			if ((i + j) % 2 == 0) {
				grpc_call(&h, "/moat.v1.Gateway/GetSandbox",
				    &c);
			} else {
				sb = NULL;
				if (moat_client_get(mc, sandbox_id, &sb,
				        &msg) != MOAT_OK)
					bench_stack_die("GetSandbox over nng",
					    msg);
				moat_client_free_msg(sb);
			}
			if (i >= 0)
				t[(i + j) % 2][i] = bench_now_ms() - t0;
		}
	}
	h2_close(&h);
	moat_client_close(mc);
}

/* p50: the p50 of summary j. */
static double
p50(json_t *j)
{
	return json_real_value(json_object_get(j, "p50_ms"));
}

/* round_trips: n rounds of exec true by the three doors, the order
 * turning each round; each door's times into t[door]. */
static void
round_trips(int n, double *t[3])
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[] = { (char *)"true" }, *msg = NULL;
	static struct call c;
	struct moat_client *mc = NULL;
	struct curl_slist *hdrs = NULL;
	size_t got = 0;
	struct h2 h;
	CURL *ch;

	req.sandbox_id = sandbox_id;
	req.n_argv = 1;
	req.argv = argv;
	if (moat_client_open(&mc, S.gateway_url, S.api_key, &msg) != MOAT_OK)
		bench_stack_die("open", msg);
	h2_open(&h);
	ch = http_exec_handle(&hdrs, &got);
	frame(&c, (const ProtobufCMessage *)&req);
	for (int i = -WARMUP; i < n; i++) {
		for (int j = 0; j < 3; j++) {
			int door = (i + WARMUP + j) % 3;
			double t0 = bench_now_ms();

			if (door == 0)
				exec_grpc(&h, &c);
			else if (door == 1)
				exec_nng(mc, &req);
			else
				exec_http(ch);
			if (i >= 0)
				t[door][i] = bench_now_ms() - t0;
		}
	}
	curl_easy_cleanup(ch);
	curl_slist_free_all(hdrs);
	h2_close(&h);
	moat_client_close(mc);
}

int
main(int argc, char **argv)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	struct moat_client *gw = NULL;
	int n = argc > 2 ? atoi(argv[2]) : N_DEFAULT;
	int seconds = argc > 3 ? atoi(argv[3]) : SECONDS_DEFAULT;
	double *t[3], *gt[2];
	json_t *out, *g, *ng, *ht, *r, *gg, *gn;
	char *msg = NULL;

	if (argc < 2) {
		fprintf(stderr,
		    "usage: moat-bench-grpc OUT.json [N] "
		    "[SECONDS]\n");
		return 2;
	}
	if (n < 1 || n > N_MAX)
		n = N_DEFAULT;
	if (seconds < 1 || seconds > 600)
		seconds = SECONDS_DEFAULT;
	for (int i = 0; i < 3; i++)
		if ((t[i] = calloc((size_t)n, sizeof(double))) == NULL ||
		    (i < 2 &&
		        (gt[i] = calloc((size_t)n, sizeof(double))) == NULL))
			bench_stack_die("main", "out of memory");
	curl_global_init(CURL_GLOBAL_DEFAULT);
	bench_stack_start(&S, "grpc", MOAT_REPO_DIR, MOAT_BIN_DIR, true);
	if (moat_client_open(&gw, S.gateway_url, S.api_key, &msg) != MOAT_OK ||
	    moat_client_create(gw, &creq, &sb, &msg) != MOAT_OK)
		bench_stack_die("create", msg);
	snprintf(sandbox_id, sizeof(sandbox_id), "%s", sb->id);
	moat_client_free_msg(sb);

	round_trips(n, t);
	g = bench_summary(t[0], (size_t)n);
	ng = bench_summary(t[1], (size_t)n);
	ht = bench_summary(t[2], (size_t)n);
	fprintf(stderr,
	    "exec true p50: gRPC %.2f ms, nng %.2f ms, HTTP %.2f ms\n", p50(g),
	    p50(ng), p50(ht));
	gets(n, gt);
	gg = bench_summary(gt[0], (size_t)n);
	gn = bench_summary(gt[1], (size_t)n);
	fprintf(stderr, "GetSandbox p50: gRPC %.3f ms, nng %.3f ms\n", p50(gg),
	    p50(gn));
	r = rate(seconds);
	if (moat_client_destroy(gw, sandbox_id, &msg) != MOAT_OK) {
		fprintf(stderr, "bench-grpc: destroy: %s\n", msg ? msg : "");
		free(msg);
	}
	moat_client_close(gw);
	out = json_pack("{s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:f, s:f, s:f, "
	                "s:f, s:f, s:o, s:o, s:f, s:o}",
	    "bench", "grpc", "grpc_client",
	    "C, libnghttp2 client session, one h2c connection (no gRPC "
	    "library)",
	    "host_cpus", (int)sysconf(_SC_NPROCESSORS_ONLN), "n", n,
	    "exec_true_via_grpc", g, "exec_true_via_nng", ng,
	    "exec_true_via_http", ht, "grpc_added_p50_ms", p50(g) - p50(ng),
	    "goal_grpc_added_p50_ms", 0.5, "grpc_over_nng_p50",
	    p50(ng) > 0 ? p50(g) / p50(ng) : 0.0, "http_over_nng_p50",
	    p50(ng) > 0 ? p50(ht) / p50(ng) : 0.0, "grpc_over_http_p50",
	    p50(ht) > 0 ? p50(g) / p50(ht) : 0.0, "get_sandbox_via_grpc", gg,
	    "get_sandbox_via_nng", gn, "get_sandbox_grpc_added_p50_ms",
	    p50(gg) - p50(gn), "get_sandbox_rate_grpc", r);
	if (out == NULL || json_dump_file(out, argv[1], JSON_INDENT(2)) != 0)
		bench_stack_die("cannot write", argv[1]);
	json_decref(out);
	for (int i = 0; i < 3; i++)
		free(t[i]);
	free(gt[0]);
	free(gt[1]);
	curl_global_cleanup();
	return 0;
}
