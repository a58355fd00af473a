/*
 * grpc.c: the gateway's gRPC door (grpc.h) on libnghttp2's server
 * session API, over cleartext HTTP/2 with prior knowledge. One loop
 * thread polls the listener, a wakeup eventfd and every connection
 * (nonblocking sockets); a stream's headers and DATA frames gather into
 * a call, which a worker runs through a detached dispatcher of the
 * gateway's own method table (moat/rpc_dispatch.h), packed into a
 * moat.v1.Envelope exactly as an nng client would send it; the worker
 * hands the Reply back to the loop through the eventfd, and the loop
 * answers: headers, one length-prefixed message, trailers grpc-status
 * and grpc-message (moat's codes are gRPC's numbering). Calls whose
 * stream or connection went away meanwhile are freed, never answered.
 * Not for: the pure protocol pieces' callers elsewhere, streaming
 * methods, TLS or reflection (issue 16 continues).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "common.pb-c.h"
#include "grpc.h"
#include "http.h"
#include "moat/log.h"
#include "moat/rpc_dispatch.h"
#include "moat/status.h"
#include "moat/util.h"
#include "ratelimit.h"

#define GRPC_READ_CHUNK 16384
#define HEALTH_CHECK "/grpc.health.v1.Health/Check"

enum call_state {
	CALL_READING,  /* headers and DATA still arriving */
	CALL_QUEUED,   /* waiting for a worker */
	CALL_RUNNING,  /* a worker has it */
	CALL_FINISHED, /* on the done list, not yet taken by the loop */
	CALL_DONE,     /* answered (or to answer) by the loop */
};

struct grpc_conn;

/* One stream's call. The loop owns it but while QUEUED or RUNNING (the
 * workers then); `conn` NULL means the stream is gone: free, never
 * answer. */
struct grpc_call {
	struct grpc_call *next;      /* the queue, or the done list */
	struct grpc_call *conn_next; /* the connection's calls */
	struct grpc_conn *conn;
	int32_t stream_id;
	enum call_state state;
	char *path, *authz;
	char peer[MOAT_RATELIMIT_NAME_MAX]; /* the connection's, copied */
	bool has_timeout, bad_timeout, grpc_type, post, too_large;
	bool queued; /* handed to the workers (loop thread's own copy) */
	uint64_t deadline_ms; /* monotonic; with has_timeout */
	uint8_t *body;
	size_t len, cap;
	/* The answer: status, message, reply bytes (prefix included). */
	int status;
	char *message;
	uint8_t *out;
	size_t out_len, out_off;
};

struct grpc_conn {
	int fd;
	char peer[MOAT_RATELIMIT_NAME_MAX]; /* its rate bucket's name */
	nghttp2_session *session;
	struct grpc_call *calls;
	struct moat_grpc *g;
};

struct moat_grpc {
	struct moat_gateway *gw;
	struct moat_rpc_server *dispatcher;
	const ProtobufCServiceDescriptor *service;
	int listen_fd, wake_fd;
	uint16_t port;
	pthread_t loop, workers[MOAT_GRPC_WORKERS];
	bool loop_started;
	int nworkers;
	struct grpc_conn *conns[MOAT_GRPC_MAX_CONNECTIONS];
	nghttp2_session_callbacks *cbs;
	struct moat_ratelimit *rl; /* per address buckets */
	uint32_t rps, burst;       /* rps 0: no limit */
	pthread_mutex_t mu; /* the queue, the done list, stopping, states */
	pthread_cond_t cv;
	struct grpc_call *queue, *queue_tail, *done;
	bool stopping;
};

/* ---- the pure pieces (grpc.h) ---- */

bool
moat_grpc_parse_timeout(const char *v, uint64_t *ms)
{
	uint64_t n = 0, num = 1, den = 1;
	size_t i;

	for (i = 0; v[i] >= '0' && v[i] <= '9'; i++)
		n = n * 10 + (uint64_t)(v[i] - '0');
	if (i == 0 || i > 8 || v[i] == '\0' || v[i + 1] != '\0')
		return false;
	switch (v[i]) {
	case 'H':
		num = 3600000;
		break;
	case 'M':
		num = 60000;
		break;
	case 'S':
		num = 1000;
		break;
	case 'm':
		break;
	case 'u':
		den = 1000;
		break;
	case 'n':
		den = 1000000;
		break;
	default:
		return false;
	}
	/* 8 digits of hours fit in 64 bits; round up, so a nonzero
	 * timeout never becomes "no time at all". */
	n = (n * num + den - 1) / den;
	*ms = n > UINT32_MAX ? UINT32_MAX : n;
	return true;
}

int
moat_grpc_unframe(const uint8_t *buf, size_t len, const uint8_t **msg,
    size_t *msg_len, const char **why)
{
	uint32_t n;

	if (len < MOAT_GRPC_PREFIX) {
		*why = "the request has no gRPC message (5-byte prefix)";
		return MOAT_INVALID_ARGUMENT;
	}
	if (buf[0] != 0) {
		*why = buf[0] == 1 ?
		    "compression not supported" :
		    "the message's compressed flag is not 0 or 1";
		return buf[0] == 1 ? MOAT_UNIMPLEMENTED :
		                     MOAT_INVALID_ARGUMENT;
	}
	n = (uint32_t)buf[1] << 24 | (uint32_t)buf[2] << 16 |
	    (uint32_t)buf[3] << 8 | buf[4];
	if (n > MOAT_GRPC_MAX_MESSAGE) {
		*why = "the message is larger than 4 MiB";
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if ((size_t)n != len - MOAT_GRPC_PREFIX) {
		*why = "a unary call carries exactly one message: the length "
		       "prefix does not match the body";
		return MOAT_INVALID_ARGUMENT;
	}
	*msg = buf + MOAT_GRPC_PREFIX;
	*msg_len = n;
	return MOAT_OK;
}

void
moat_grpc_frame_header(uint8_t out[MOAT_GRPC_PREFIX], uint32_t len)
{
	out[0] = 0;
	out[1] = (uint8_t)(len >> 24);
	out[2] = (uint8_t)(len >> 16);
	out[3] = (uint8_t)(len >> 8);
	out[4] = (uint8_t)len;
}

char *
moat_grpc_percent_encode(const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(s), i, j = 0;
	char *out = malloc(n * 3 + 1);

	if (out == NULL)
		return NULL;
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c <= 0x7e && c != '%') {
			out[j++] = (char)c;
		} else {
			out[j++] = '%';
			out[j++] = hex[c >> 4];
			out[j++] = hex[c & 15];
		}
	}
	out[j] = '\0';
	return out;
}

/* ---- calls ---- */

static void
call_free(struct grpc_call *c)
{
	if (c == NULL)
		return;
	free(c->path);
	free(c->authz);
	free(c->body);
	free(c->message);
	free(c->out);
	free(c);
}

/* call_fail: the call's answer is `status` with `msg` (copied) and no
 * message. */
static void
call_fail(struct grpc_call *c, int status, const char *msg)
{
	c->status = status;
	free(c->message);
	c->message = strdup(msg);
}

/* call_set_reply: the answer is the dispatcher's Reply `r`. */
static void
call_set_reply(struct grpc_call *c, const Moat__V1__Reply *r)
{
	if (r->code != MOAT__V1__CODE__OK) {
		call_fail(c, (int)r->code, r->message ? r->message : "");
		return;
	}
	if (r->payload.len > MOAT_GRPC_MAX_MESSAGE) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED,
		    "the reply is larger than 4 MiB");
		return;
	}
	if ((c->out = malloc(MOAT_GRPC_PREFIX + r->payload.len)) == NULL) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	moat_grpc_frame_header(c->out, (uint32_t)r->payload.len);
	if (r->payload.len > 0)
		memcpy(c->out + MOAT_GRPC_PREFIX, r->payload.data,
		    r->payload.len);
	c->out_len = MOAT_GRPC_PREFIX + r->payload.len;
	c->status = MOAT_OK;
}

/* call_admit: the rate limits of the HTTP door: the caller's address,
 * then its key (at its tenant's rate, shared with the nng door). A call
 * refused is failed here. */
static int
call_admit(struct moat_grpc *g, struct grpc_call *c, const char *key)
{
	char *errmsg = NULL, *m;
	uint32_t retry = 0;

	if (!moat_ratelimit_take(g->rl, c->peer, moat_rpc_now_ms(), &retry)) {
		m = moat_asprintf("too many calls from this address: retry in "
		                  "%u s",
		    retry);
		call_fail(c, MOAT_RESOURCE_EXHAUSTED,
		    m ? m : "too many calls");
		free(m);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (key[0] != '\0' &&
	    moat_gateway_key_admit(g->gw, key, g->rps, g->burst, &retry,
	        &errmsg) != MOAT_OK) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED,
		    errmsg ? errmsg : "too many calls");
		free(errmsg);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}

/* call_dispatch: runs the Gateway method `name` with the message `msg`
 * through the dispatcher, as an nng client's Envelope would. */
static void
call_dispatch(struct moat_grpc *g, struct grpc_call *c, const char *name,
    const uint8_t *msg, size_t msg_len)
{
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	Moat__V1__Reply *r;
	uint8_t *packed, *out = NULL;
	size_t packed_len, out_len = 0;
	const char *key = "";
	char *errmsg = NULL;
	uint64_t now = moat_rpc_now_ms();

	if (c->authz != NULL &&
	    moat_http_bearer_key(c->authz, &key, &errmsg) != MOAT_OK) {
		call_fail(c, MOAT_UNAUTHENTICATED, errmsg);
		free(errmsg);
		return;
	}
	if (call_admit(g, c, key) != MOAT_OK)
		return;
	if (c->has_timeout && now >= c->deadline_ms) {
		moat_debug(0, "grpc: %s: the deadline passed before it ran",
		    name);
		call_fail(c, MOAT_DEADLINE_EXCEEDED,
		    "the deadline passed before the call ran");
		return;
	}
	env.service = (char *)g->service->name;
	env.method = (char *)name;
	env.auth = (char *)key;
	env.request_id = moat_rpc_new_request_id();
	if (c->has_timeout)
		env.timeout_ms = (uint32_t)(c->deadline_ms - now);
	env.payload.data = (uint8_t *)msg;
	env.payload.len = msg_len;
	packed_len = moat__v1__envelope__get_packed_size(&env);
	if ((packed = malloc(packed_len)) == NULL) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	moat__v1__envelope__pack(&env, packed);
	if (moat_rpc_server_dispatch(g->dispatcher, packed, packed_len, &out,
	        &out_len) != 0) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
	} else if ((r = moat__v1__reply__unpack(NULL, out_len, out)) == NULL) {
		call_fail(c, MOAT_INTERNAL,
		    "the gateway's reply did not "
		    "decode");
	} else {
		call_set_reply(c, r);
		moat__v1__reply__free_unpacked(r, NULL);
	}
	free(out);
	free(packed);
}

/* call_run: what a worker does with a call: check what the stream
 * carried, then answer health here or the method by the dispatcher. */
static void
call_run(struct moat_grpc *g, struct grpc_call *c)
{
	static const uint8_t serving[] = { 0, 0, 0, 0, 2, 0x08, 0x01 };
	static const char prefix[] = "/moat.v1.Gateway/";
	const ProtobufCMethodDescriptor *md = NULL;
	const uint8_t *msg;
	size_t msg_len;
	const char *why;
	int rv;

	if (!c->post || !c->grpc_type || c->path == NULL) {
		call_fail(c, MOAT_INVALID_ARGUMENT,
		    "a gRPC call is a POST with content-type "
		    "application/grpc and a :path");
		return;
	}
	if (c->bad_timeout) {
		call_fail(c, MOAT_INVALID_ARGUMENT,
		    "grpc-timeout must be 1-8 digits and a unit "
		    "(H M S m u n)");
		return;
	}
	if (c->too_large) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED,
		    "the message is larger than 4 MiB");
		return;
	}
	if ((rv = moat_grpc_unframe(c->body, c->len, &msg, &msg_len, &why)) !=
	    MOAT_OK) {
		call_fail(c, rv, why);
		return;
	}
	if (strcmp(c->path, HEALTH_CHECK) == 0) {
		/* HealthCheckResponse{status: SERVING}: field 1, varint 1.
		 * No key, like the HTTP door's Health. */
		if ((c->out = malloc(sizeof(serving))) == NULL) {
			call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
			return;
		}
		memcpy(c->out, serving, sizeof(serving));
		c->out_len = sizeof(serving);
		c->status = MOAT_OK;
		return;
	}
	if (strncmp(c->path, prefix, sizeof(prefix) - 1) == 0)
		md = protobuf_c_service_descriptor_get_method_by_name(
		    g->service, c->path + sizeof(prefix) - 1);
	if (md == NULL) {
		char *m = moat_asprintf("unknown method %s: see the Gateway "
		                        "service in proto/gateway.proto",
		    c->path);
		call_fail(c, MOAT_UNIMPLEMENTED, m ? m : "unknown method");
		free(m);
		return;
	}
	call_dispatch(g, c, md->name, msg, msg_len);
}

/* wake: tells the loop thread there is something on the done list. */
static void
wake(struct moat_grpc *g)
{
	uint64_t one = 1;

	while (write(g->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

static void *
worker_main(void *arg)
{
	struct moat_grpc *g = arg;
	struct grpc_call *c;

	pthread_mutex_lock(&g->mu);
	for (;;) {
		while (g->queue == NULL && !g->stopping)
			pthread_cond_wait(&g->cv, &g->mu);
		if (g->queue == NULL)
			break;
		c = g->queue;
		if ((g->queue = c->next) == NULL)
			g->queue_tail = NULL;
		c->state = CALL_RUNNING;
		/* Stopping: every queued call lost its stream; run none. */
		if (!g->stopping) {
			pthread_mutex_unlock(&g->mu);
			call_run(g, c);
			pthread_mutex_lock(&g->mu);
		}
		c->state = CALL_FINISHED;
		c->next = g->done;
		g->done = c;
		wake(g);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

/* call_queue: hands a call whose request is complete to the workers. */
static void
call_queue(struct moat_grpc *g, struct grpc_call *c)
{
	pthread_mutex_lock(&g->mu);
	c->state = CALL_QUEUED;
	c->next = NULL;
	if (g->queue_tail != NULL)
		g->queue_tail->next = c;
	else
		g->queue = c;
	g->queue_tail = c;
	pthread_cond_signal(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* call_detach: takes c off its connection's list. */
static void
call_detach(struct grpc_call *c)
{
	struct grpc_call **p;

	if (c->conn == NULL)
		return;
	for (p = &c->conn->calls; *p != NULL; p = &(*p)->conn_next)
		if (*p == c) {
			*p = c->conn_next;
			break;
		}
	c->conn = NULL;
}

/* call_drop: the stream of c is gone: free it now, or leave it for the
 * loop to free when its worker is done. Loop thread only. */
static void
call_drop(struct moat_grpc *g, struct grpc_call *c)
{
	bool busy;

	call_detach(c);
	pthread_mutex_lock(&g->mu);
	busy = c->state == CALL_QUEUED || c->state == CALL_RUNNING ||
	    c->state == CALL_FINISHED;
	pthread_mutex_unlock(&g->mu);
	if (!busy)
		call_free(c);
}

/* ---- nghttp2 callbacks (loop thread) ---- */

static ssize_t
reply_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct grpc_call *c = src->ptr;
	size_t n = c->out_len - c->out_off;
	nghttp2_nv tr[] = {
		{ (uint8_t *)"grpc-status", (uint8_t *)"0", 11, 1,
		    NGHTTP2_NV_FLAG_NONE },
	};

	(void)ud;
	if (n > len)
		n = len;
	memcpy(buf, c->out + c->out_off, n);
	c->out_off += n;
	if (c->out_off == c->out_len) {
		*flags |=
		    NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
		if (nghttp2_submit_trailer(s, id, tr, 1) != 0)
			return NGHTTP2_ERR_CALLBACK_FAILURE;
	}
	return (ssize_t)n;
}

#define NV(n, v)                                                              \
	{                                                                     \
		(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v),     \
		    NGHTTP2_NV_FLAG_NONE                                      \
	}

/* call_answer: submits c's answer on its stream: headers, the message
 * and grpc-status 0 trailers; or, failed, one HEADERS frame with the
 * status (gRPC's Trailers-Only). */
static void
call_answer(struct grpc_conn *cn, struct grpc_call *c)
{
	char code[16], *msg;
	nghttp2_data_provider dp = { .source.ptr = c,
		.read_callback = reply_read };

	if (c->status == MOAT_OK) {
		nghttp2_nv h[] = { NV(":status", "200"),
			NV("content-type", "application/grpc") };
		if (nghttp2_submit_response(cn->session, c->stream_id, h, 2,
		        &dp) != 0)
			nghttp2_submit_rst_stream(cn->session,
			    NGHTTP2_FLAG_NONE, c->stream_id,
			    NGHTTP2_INTERNAL_ERROR);
		return;
	}
	snprintf(code, sizeof(code), "%d", c->status);
	msg = moat_grpc_percent_encode(c->message ? c->message : "");
	{
		nghttp2_nv h[] = { NV(":status", "200"),
			NV("content-type", "application/grpc"),
			NV("grpc-status", code),
			NV("grpc-message", msg ? msg : "") };
		if (nghttp2_submit_response(cn->session, c->stream_id, h, 4,
		        NULL) != 0)
			nghttp2_submit_rst_stream(cn->session,
			    NGHTTP2_FLAG_NONE, c->stream_id,
			    NGHTTP2_INTERNAL_ERROR);
	}
	free(msg);
}

static int
on_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct grpc_conn *cn = ud;
	struct grpc_call *c;

	if (f->hd.type != NGHTTP2_HEADERS ||
	    f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	if ((c = calloc(1, sizeof(*c))) == NULL)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	c->conn = cn;
	memcpy(c->peer, cn->peer, sizeof(c->peer));
	c->stream_id = f->hd.stream_id;
	c->conn_next = cn->calls;
	cn->calls = c;
	nghttp2_session_set_stream_user_data(s, f->hd.stream_id, c);
	return 0;
}

static char *
dup_n(const uint8_t *v, size_t n)
{
	char *s = malloc(n + 1);

	if (s != NULL) {
		memcpy(s, v, n);
		s[n] = '\0';
	}
	return s;
}

static int
on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
    size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
    void *ud)
{
	struct grpc_call *c;
	char *v;
	uint64_t ms;

	(void)flags;
	(void)ud;
	/* Once queued a worker reads the call: nothing changes it. */
	if (f->hd.type != NGHTTP2_HEADERS ||
	    (c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id)) ==
	        NULL ||
	    c->queued)
		return 0;
	if ((v = dup_n(value, valuelen)) == NULL)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	if (namelen == 5 && memcmp(name, ":path", 5) == 0 && !c->path) {
		c->path = v;
		return 0;
	}
	if (namelen == 13 && memcmp(name, "authorization", 13) == 0 &&
	    !c->authz) {
		c->authz = v;
		return 0;
	}
	if (namelen == 7 && memcmp(name, ":method", 7) == 0)
		c->post = strcmp(v, "POST") == 0;
	else if (namelen == 12 && memcmp(name, "content-type", 12) == 0)
		c->grpc_type = strcmp(v, "application/grpc") == 0 ||
		    strncmp(v, "application/grpc+proto", 22) == 0 ||
		    strncmp(v, "application/grpc;", 17) == 0;
	else if (namelen == 12 && memcmp(name, "grpc-timeout", 12) == 0) {
		if (moat_grpc_parse_timeout(v, &ms)) {
			c->has_timeout = true;
			c->deadline_ms = moat_rpc_now_ms() + ms;
		} else {
			c->bad_timeout = true;
		}
	}
	free(v);
	return 0;
}

static int
on_data_chunk(nghttp2_session *s, uint8_t flags, int32_t id,
    const uint8_t *data, size_t len, void *ud)
{
	struct grpc_call *c = nghttp2_session_get_stream_user_data(s, id);
	size_t cap;
	uint8_t *b;

	(void)flags;
	(void)ud;
	if (c == NULL || c->queued || c->too_large)
		return 0;
	if (c->len + len > MOAT_GRPC_MAX_MESSAGE + MOAT_GRPC_PREFIX) {
		/* Dropped from here on: memory stays bounded. */
		c->too_large = true;
		free(c->body);
		c->body = NULL;
		c->len = c->cap = 0;
		return 0;
	}
	if (c->len + len > c->cap) {
		cap = c->cap ? c->cap : 1024;
		while (cap < c->len + len)
			cap *= 2;
		if ((b = realloc(c->body, cap)) == NULL)
			return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
		c->body = b;
		c->cap = cap;
	}
	memcpy(c->body + c->len, data, len);
	c->len += len;
	return 0;
}

static int
on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct grpc_conn *cn = ud;
	struct grpc_call *c;

	if ((f->hd.type != NGHTTP2_DATA && f->hd.type != NGHTTP2_HEADERS) ||
	    !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
		return 0;
	c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
	if (c != NULL && !c->queued) {
		c->queued = true;
		call_queue(cn->g, c);
	}
	return 0;
}

static int
on_stream_close(nghttp2_session *s, int32_t id, uint32_t err, void *ud)
{
	struct grpc_conn *cn = ud;
	struct grpc_call *c = nghttp2_session_get_stream_user_data(s, id);

	(void)err;
	if (c != NULL) {
		nghttp2_session_set_stream_user_data(s, id, NULL);
		call_drop(cn->g, c);
	}
	return 0;
}

static ssize_t
on_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags,
    void *ud)
{
	struct grpc_conn *cn = ud;
	ssize_t n;

	(void)s;
	(void)flags;
	while (
	    (n = send(cn->fd, data, len, MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ?
		    NGHTTP2_ERR_WOULDBLOCK :
		    NGHTTP2_ERR_CALLBACK_FAILURE;
	return n;
}

/* ---- connections (loop thread) ---- */

static void
conn_close(struct moat_grpc *g, int slot)
{
	struct grpc_conn *cn = g->conns[slot];

	/* nghttp2_session_del calls no stream-close callback: drop the
	 * calls here, before it. */
	while (cn->calls != NULL) {
		nghttp2_session_set_stream_user_data(cn->session,
		    cn->calls->stream_id, NULL);
		call_drop(g, cn->calls);
	}
	nghttp2_session_del(cn->session);
	close(cn->fd);
	free(cn);
	g->conns[slot] = NULL;
}

/* peer_name: the rate bucket of a client address: "grpc:" and the
 * address, an IPv6 one by its /64 (one host holds a whole /64). */
static void
peer_name(struct sockaddr_storage *ss, char *out, size_t size)
{
	char a[INET6_ADDRSTRLEN] = "?";

	if (ss->ss_family == AF_INET6) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
		memset(s6->sin6_addr.s6_addr + 8, 0, 8);
		inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
	} else if (ss->ss_family == AF_INET) {
		inet_ntop(AF_INET, &((struct sockaddr_in *)ss)->sin_addr, a,
		    sizeof(a));
	}
	snprintf(out, size, "grpc:%s", a);
}

static void
conn_accept(struct moat_grpc *g)
{
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
		    MOAT_GRPC_MAX_STREAMS },
	};
	struct grpc_conn *cn;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int fd, slot;

	while ((fd = accept4(g->listen_fd, (struct sockaddr *)&ss, &sl,
	            SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
		sl = sizeof(ss);
		for (slot = 0; slot < MOAT_GRPC_MAX_CONNECTIONS; slot++)
			if (g->conns[slot] == NULL)
				break;
		if (slot == MOAT_GRPC_MAX_CONNECTIONS ||
		    (cn = calloc(1, sizeof(*cn))) == NULL) {
			close(fd);
			continue;
		}
		cn->fd = fd;
		cn->g = g;
		peer_name(&ss, cn->peer, sizeof(cn->peer));
		if (nghttp2_session_server_new(&cn->session, g->cbs, cn) !=
		        0 ||
		    nghttp2_submit_settings(cn->session, NGHTTP2_FLAG_NONE, iv,
		        1) != 0) {
			if (cn->session != NULL)
				nghttp2_session_del(cn->session);
			close(fd);
			free(cn);
			continue;
		}
		g->conns[slot] = cn;
	}
}

/* conn_io: reads what the connection has, then writes what nghttp2
 * has; false when the connection is done with (closed, or broken: a
 * client that sends no HTTP/2 ends here, and only its connection). */
static bool
conn_io(struct grpc_conn *cn, short revents)
{
	uint8_t buf[GRPC_READ_CHUNK];
	ssize_t n;

	if (revents & (POLLIN | POLLHUP | POLLERR)) {
		for (;;) {
			n = recv(cn->fd, buf, sizeof(buf), 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			if (n <= 0)
				return false;
			if (nghttp2_session_mem_recv(cn->session, buf,
			        (size_t)n) < 0)
				return false;
		}
	}
	if (nghttp2_session_send(cn->session) != 0)
		return false;
	return nghttp2_session_want_read(cn->session) ||
	    nghttp2_session_want_write(cn->session);
}

/* drain_done: answers every call the workers finished (or frees it
 * when its stream went away meanwhile). */
static void
drain_done(struct moat_grpc *g)
{
	struct grpc_call *c, *next;
	uint64_t v;

	while (read(g->wake_fd, &v, sizeof(v)) < 0 && errno == EINTR)
		;
	pthread_mutex_lock(&g->mu);
	c = g->done;
	g->done = NULL;
	for (next = c; next != NULL; next = next->next)
		next->state = CALL_DONE;
	pthread_mutex_unlock(&g->mu);
	for (; c != NULL; c = next) {
		next = c->next;
		if (c->conn == NULL)
			call_free(c);
		else
			call_answer(c->conn, c);
	}
}

static void *
loop_main(void *arg)
{
	struct moat_grpc *g = arg;
	struct pollfd pfd[MOAT_GRPC_MAX_CONNECTIONS + 2];
	int slot_of[MOAT_GRPC_MAX_CONNECTIONS + 2];
	int i, n;
	bool stop;

	for (;;) {
		pthread_mutex_lock(&g->mu);
		stop = g->stopping;
		pthread_mutex_unlock(&g->mu);
		if (stop)
			break;
		pfd[0] =
		    (struct pollfd){ .fd = g->listen_fd, .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = g->wake_fd, .events = POLLIN };
		n = 2;
		for (i = 0; i < MOAT_GRPC_MAX_CONNECTIONS; i++) {
			struct grpc_conn *cn = g->conns[i];
			if (cn == NULL)
				continue;
			pfd[n].fd = cn->fd;
			pfd[n].events = POLLIN |
			    (nghttp2_session_want_write(cn->session) ?
			            POLLOUT :
			            0);
			pfd[n].revents = 0;
			slot_of[n++] = i;
		}
		if (poll(pfd, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			moat_error(0, "grpc: poll: %s", strerror(errno));
			break;
		}
		if (pfd[1].revents & POLLIN)
			drain_done(g);
		for (i = 2; i < n; i++) {
			struct grpc_conn *cn = g->conns[slot_of[i]];
			if (cn != NULL && !conn_io(cn, pfd[i].revents))
				conn_close(g, slot_of[i]);
		}
		if (pfd[0].revents & POLLIN)
			conn_accept(g);
	}
	for (i = 0; i < MOAT_GRPC_MAX_CONNECTIONS; i++)
		if (g->conns[i] != NULL)
			conn_close(g, i);
	return NULL;
}

/* ---- start, stop ---- */

/* grpc_listen: a nonblocking listening socket on `addr` (numeric
 * "host:port" or "[v6]:port"). */
static int
grpc_listen(struct moat_grpc *g, const char *addr, char **errmsg)
{
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV |
		    AI_PASSIVE,
		.ai_socktype = SOCK_STREAM },
	                *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[64];
	const char *colon = strrchr(addr, ':');
	size_t hn;
	int one = 1;

	hn = colon ? (size_t)(colon - addr) : 0;
	if (hn > 2 && addr[0] == '[' && addr[hn - 1] == ']') {
		addr++;
		hn -= 2;
	}
	/* getaddrinfo takes ports past 65535 and wraps them. */
	if (colon == NULL || hn == 0 || hn >= sizeof(host) ||
	    colon[1] == '\0' || strspn(colon + 1, "0123456789") > 5 ||
	    colon[strspn(colon + 1, "0123456789") + 1] != '\0' ||
	    atol(colon + 1) > 65535) {
		*errmsg = moat_asprintf("grpc address \"%s\" is not "
		                        "host:port or [v6addr]:port with a "
		                        "numeric host: fix --grpc, or \"off\"",
		    addr);
		return MOAT_INVALID_ARGUMENT;
	}
	memcpy(host, addr, hn);
	host[hn] = '\0';
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0) {
		*errmsg = moat_asprintf("grpc address \"%s\" is not "
		                        "host:port with a numeric host and "
		                        "port: fix --grpc, or \"off\"",
		    host);
		return MOAT_INVALID_ARGUMENT;
	}
	g->listen_fd = socket(res->ai_family,
	    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (g->listen_fd < 0 ||
	    setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one,
	        sizeof(one)) != 0 ||
	    bind(g->listen_fd, res->ai_addr, res->ai_addrlen) != 0 ||
	    listen(g->listen_fd, 128) != 0 ||
	    getsockname(g->listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
		*errmsg = moat_asprintf("cannot serve gRPC on %s:%s: %s: "
		                        "pick another address with --grpc, "
		                        "or \"off\"",
		    host, colon + 1, strerror(errno));
		freeaddrinfo(res);
		return MOAT_UNAVAILABLE;
	}
	freeaddrinfo(res);
	g->port = ntohs(ss.ss_family == AF_INET6 ?
	        ((struct sockaddr_in6 *)&ss)->sin6_port :
	        ((struct sockaddr_in *)&ss)->sin_port);
	return MOAT_OK;
}

static int
grpc_callbacks(struct moat_grpc *g)
{
	if (nghttp2_session_callbacks_new(&g->cbs) != 0)
		return MOAT_RESOURCE_EXHAUSTED;
	nghttp2_session_callbacks_set_send_callback(g->cbs, on_send);
	nghttp2_session_callbacks_set_on_begin_headers_callback(g->cbs,
	    on_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(g->cbs, on_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(g->cbs,
	    on_data_chunk);
	nghttp2_session_callbacks_set_on_frame_recv_callback(g->cbs,
	    on_frame_recv);
	nghttp2_session_callbacks_set_on_stream_close_callback(g->cbs,
	    on_stream_close);
	return MOAT_OK;
}

int
moat_grpc_start(struct moat_grpc **out, struct moat_gateway *gw,
    const char *addr, uint32_t rps, uint32_t burst, char **errmsg)
{
	struct moat_rpc_service svc;
	struct moat_grpc *g;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if ((g = calloc(1, sizeof(*g))) == NULL) {
		*errmsg = moat_asprintf("out of memory starting gRPC");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	g->listen_fd = g->wake_fd = -1;
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	moat_gateway_service(gw, &svc);
	g->gw = gw;
	g->service = svc.descriptor;
	g->rps = rps ? rps : MOAT_RATELIMIT_RPS;
	g->burst = burst ? burst : MOAT_RATELIMIT_BURST;
	if (g->rps == MOAT_HTTP_UNLIMITED)
		g->rps = 0;
	if ((g->rl = moat_ratelimit_new(g->rps, g->burst,
	         MOAT_RATELIMIT_SLOTS)) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory starting gRPC");
		goto fail;
	}
	if ((rv = moat_rpc_server_new_detached(&g->dispatcher, &svc,
	         errmsg)) != MOAT_OK ||
	    (rv = grpc_listen(g, addr, errmsg)) != MOAT_OK)
		goto fail;
	if ((g->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
	    grpc_callbacks(g) != MOAT_OK) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory starting gRPC");
		goto fail;
	}
	for (; g->nworkers < MOAT_GRPC_WORKERS; g->nworkers++)
		if (pthread_create(&g->workers[g->nworkers], NULL, worker_main,
		        g) != 0)
			break;
	if (g->nworkers == 0 ||
	    pthread_create(&g->loop, NULL, loop_main, g) != 0) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("cannot start gRPC's threads");
		goto fail;
	}
	g->loop_started = true;
	*out = g;
	return MOAT_OK;

fail:
	moat_grpc_stop(g);
	return rv;
}

uint16_t
moat_grpc_port(const struct moat_grpc *g)
{
	return g->port;
}

void
moat_grpc_stop(struct moat_grpc *g)
{
	struct grpc_call *c, *next;
	int i;

	if (g == NULL)
		return;
	pthread_mutex_lock(&g->mu);
	g->stopping = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	/* The loop first: it closes every connection, which leaves calls
	 * in the workers' hands without a stream. */
	if (g->loop_started) {
		wake(g);
		pthread_join(g->loop, NULL);
	}
	/* The workers end their call in progress, then the queue (every
	 * call there lost its stream). */
	for (i = 0; i < g->nworkers; i++)
		pthread_join(g->workers[i], NULL);
	for (c = g->done; c != NULL; c = next) {
		next = c->next;
		call_free(c);
	}
	if (g->cbs != NULL)
		nghttp2_session_callbacks_del(g->cbs);
	if (g->listen_fd >= 0)
		close(g->listen_fd);
	if (g->wake_fd >= 0)
		close(g->wake_fd);
	moat_rpc_server_stop(g->dispatcher);
	moat_ratelimit_free(g->rl);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
}
