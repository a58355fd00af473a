/*
 * grpc.c: the gateway's gRPC door (grpc.h) on libnghttp2's server
 * session API, over cleartext HTTP/2 with prior knowledge or TLS with
 * ALPN h2. One loop
 * thread polls the listener, a wakeup eventfd and every connection
 * (nonblocking sockets); a stream's headers and DATA frames gather into
 * a call, which a worker runs through a detached dispatcher of the
 * gateway's own method table (moat/rpc_dispatch.h), packed into a
 * moat.v1.Envelope exactly as an nng client would send it; the worker
 * hands the Reply back to the loop through the eventfd, and the loop
 * answers: headers, one length-prefixed message, trailers grpc-status
 * and grpc-message (moat's codes are gRPC's numbering). Calls whose
 * stream or connection went away meanwhile are freed, never answered.
 * Streams: a stream's messages wait in a bounded queue (grpc_stream.h)
 * that nghttp2's data provider drains as flow control allows (DEFERRED
 * when empty, resumed when more comes). ExecStream is a chain of worker
 * jobs, each one dispatcher call: ExecStart, then one ExecRead long poll
 * at a time, the next queued only when the previous answered and the
 * stream's queue has room, and ExecKill when the stream ends early. No
 * call holds a worker while it waits: the worker dispatches it
 * asynchronously (moat_rpc_server_dispatch_async) and returns, and the
 * completion (a node's reply, on whatever thread brings it) puts the
 * call on the done list; so a long unary Exec or an ExecRead long poll
 * costs no worker. Stopping, the door first closes its connections and
 * kills the processes of ExecStreams still running (bounded), then ends
 * its threads once every dispatched call came back. Reflection (grpc_reflect.h) runs on the loop thread,
 * one answer per request message; its stream's window is only given
 * back as its requests are answered, so a client that sends and never
 * reads is stopped by HTTP/2 flow control.
 * With TLS (grpc_tls.h) a connection reads and writes through OpenSSL
 * instead of the socket, and polls for what the TLS layer waits for.
 * Attach is ExecStream's chain plus an input side: its first message
 * (start) becomes ExecStart; the later ones, held in the stream's
 * buffer (its HTTP/2 window, ATTACH_WINDOW, given back as they go),
 * become ExecWrite / ExecResize calls of a second call object, one at a
 * time in order, so that input never waits behind an ExecRead.
 * Not for: the pure protocol pieces' callers elsewhere.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#include "grpc_reflect.h"
#include "grpc_tls.h"
#include "grpc_stream.h"
#include "http.h"
#include "moat/log.h"
#include "moat/rpc_dispatch.h"
#include "moat/status.h"
#include "moat/util.h"
#include "ratelimit.h"

#define GRPC_READ_CHUNK 16384
#define HEALTH_CHECK "/grpc.health.v1.Health/Check"
#define HEALTH_WATCH "/grpc.health.v1.Health/Watch"
#define EXEC_STREAM "/moat.v1.Gateway/ExecStream"
#define ATTACH "/moat.v1.Gateway/Attach"
#define REFLECTION                                                            \
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
#define EXEC_WAIT_MS 1000     /* one ExecRead's long poll */
#define EXEC_READ_BYTES 65536 /* per stream per ExecRead */
#define EXEC_CALL_MS 10000    /* an ExecRead's deadline past its wait */
#define EXEC_KILL_MS 5000
/* Stopping: how long the door waits for its ExecStreams' kills. */
#define STOP_KILL_MS (EXEC_KILL_MS + 1000)
/* An ExecRead that came back empty well before its wait (a node that
 * does not long-poll): the next one waits this long, so that a stream
 * never spins. */
#define EXEC_IDLE_POLL_MS 500
/* A reflection stream's unanswered bytes: its HTTP/2 window (64 KiB
 * unless the client says otherwise) keeps it far under this. */
#define REFLECT_BUFFER (1u << 20)
/* An Attach stream's inputs not yet sent to the node: its HTTP/2 window
 * is raised to this and given back only as inputs go out, so a client
 * that types faster than the process reads is held back by flow
 * control; also the largest AttachInput. */
#define ATTACH_WINDOW (1u << 20)
/* The node's stdin buffer was full (RESOURCE_EXHAUSTED): the same
 * input again after this long, while flow control holds the client. */
#define ATTACH_RETRY_MS 50

enum call_kind {
	KIND_UNARY,     /* one message in, one out */
	KIND_EXEC,      /* Gateway.ExecStream */
	KIND_REFLECT,   /* ServerReflectionInfo, bidi */
	KIND_ATTACH,    /* Gateway.Attach: ExecStream's chain plus input */
	KIND_ATTACH_IN, /* an Attach's input side: its own jobs */
};

/* What a worker does with a call next. */
enum call_job {
	JOB_UNARY,      /* the method, or ExecStream's checks and ExecStart */
	JOB_EXEC_READ,  /* one ExecRead */
	JOB_EXEC_KILL,  /* ExecKill: the stream ended before the process */
	JOB_EXEC_INPUT, /* an Attach input: ExecWrite or ExecResize */
};

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
	struct moat_grpc *g;
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
	/* Streams (loop thread, but `result`, `key` and the exec's
	 * identity, which the job's worker fills). */
	enum call_kind kind;
	enum call_job job;
	bool busy;        /* a job is out with the workers */
	bool answered;    /* the response's headers are submitted */
	bool finished;    /* status known: trailers once q is sent */
	bool deferred;    /* the data provider waits for more */
	bool remote_done; /* the client's END_STREAM came */
	bool started, exited, want_kill, kill_queued;
	bool headers_done; /* the request's headers are all in */
	int fin_status;    /* the stream's own status, once finished */
	char *fin_message;
	char *key;        /* ExecStream: its API key, for the later calls */
	char *sandbox_id; /* and its process */
	uint64_t exec_id;
	struct moat_grpc_exec_pos pos;
	uint64_t poll_at;         /* the ExecRead went out; the next may */
	ProtobufCMessage *result; /* an exec job's decoded reply */
	struct moat_grpc_queue q;
	/* Attach (loop thread): its input side is a second call, so that
	 * an ExecWrite never waits behind an ExecRead's long poll; one
	 * input out at a time, in order. The two are freed apart: the
	 * first freed unlinks the other (an input call out with the
	 * workers then frees itself when it comes back). */
	struct grpc_call *in;     /* the Attach's input call */
	struct grpc_call *parent; /* an input call's Attach; NULL: gone */
	const char *in_method;    /* an input call's ExecWrite / ExecResize */
	bool start_sent, pty, stdin_closed, window_set;
	uint64_t retry_at; /* an input call's retry, the node's stdin full */
};

struct grpc_conn {
	int fd;
	char peer[MOAT_RATELIMIT_NAME_MAX]; /* its rate bucket's name */
	nghttp2_session *session;
	struct grpc_call *calls;
	struct moat_grpc *g;
	struct moat_grpc_tls_conn *tls; /* NULL: h2c */
	uint64_t idle_since; /* monotonic ms since it had no stream */
	bool goaway;         /* idle: GOAWAY submitted */
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
	bool closing;  /* stop: close connections, kill their processes */
	bool stopping; /* stop: the loop and the workers end */
	int inflight;  /* calls the dispatcher has not answered yet */
	pthread_cond_t idle_cv; /* inflight fell to 0 */
	int live; /* calls not yet freed (loop thread, then stop's) */
	/* Loop thread: */
	nghttp2_option *opt;
	size_t buffered, buffer_cap; /* every stream's queue together */
	uint64_t idle_ms;            /* 0: connections never idle out */
	struct moat_grpc_descset *desc;
	struct moat_grpc_tls *tls; /* NULL: h2c */
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

static void wake(struct moat_grpc *g);

static void
call_free(struct grpc_call *c)
{
	if (c == NULL)
		return;
	c->g->live--;
	free(c->path);
	free(c->authz);
	free(c->body);
	free(c->message);
	free(c->out);
	free(c->key);
	free(c->fin_message);
	free(c->sandbox_id);
	if (c->result != NULL)
		protobuf_c_message_free_unpacked(c->result, NULL);
	moat_grpc_queue_clear(&c->q);
	if (c->in != NULL) {
		if (c->in->busy)
			c->in->parent = NULL;
		else
			call_free(c->in);
	}
	if (c->parent != NULL)
		c->parent->in = NULL;
	free(c);
}

/* is_exec: a call of ExecStream's chain (ExecStart, ExecRead, ExecKill
 * jobs): ExecStream or Attach. */
static bool
is_exec(const struct grpc_call *c)
{
	return c->kind == KIND_EXEC || c->kind == KIND_ATTACH;
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

/* call_finish: c goes to the loop's done list. g->mu held. */
static void
call_finish(struct moat_grpc *g, struct grpc_call *c)
{
	c->state = CALL_FINISHED;
	c->next = g->done;
	g->done = c;
	wake(g);
}

/* exec_result: an ExecStream job's Reply `r`: on MOAT_OK c->result is
 * the decoded reply of the job's method, otherwise c is failed. */
static void
exec_result(struct moat_grpc *g, struct grpc_call *c, const Moat__V1__Reply *r)
{
	const char *name = c->job == JOB_EXEC_READ ? "ExecRead" :
	    c->job == JOB_EXEC_KILL                ? "ExecKill" :
	                                             "ExecStart";
	const ProtobufCMethodDescriptor *md =
	    protobuf_c_service_descriptor_get_method_by_name(g->service, name);

	if (r->code != MOAT__V1__CODE__OK)
		call_fail(c, (int)r->code, r->message ? r->message : "");
	else if ((c->result = protobuf_c_message_unpack(md->output, NULL,
	              r->payload.len, r->payload.data)) == NULL)
		call_fail(c, MOAT_INTERNAL,
		    "the gateway's reply did not decode");
	else
		c->status = MOAT_OK;
	if (c->job == JOB_EXEC_KILL && c->status != MOAT_OK)
		moat_warn(0,
		    "grpc-exec-stream-kill sandbox %s exec %llu: the stream "
		    "ended but the kill failed: %s",
		    c->sandbox_id, (unsigned long long)c->exec_id,
		    c->message ? c->message : "");
}

/* call_replied: the dispatcher's answer to c's call (`out`, heap, NULL
 * when out of memory), on the thread that completed it: the worker's
 * when the handler answered at once, else the completer's. c goes to
 * the loop. */
static void
call_replied(void *arg, uint8_t *out, size_t out_len)
{
	struct grpc_call *c = arg;
	struct moat_grpc *g = c->g;
	Moat__V1__Reply *r = NULL;

	if (out == NULL)
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
	else if ((r = moat__v1__reply__unpack(NULL, out_len, out)) == NULL)
		call_fail(c, MOAT_INTERNAL,
		    "the gateway's reply did not decode");
	else if (is_exec(c))
		exec_result(g, c, r);
	else if (c->kind == KIND_ATTACH_IN && r->code != MOAT__V1__CODE__OK)
		call_fail(c, (int)r->code, r->message ? r->message : "");
	else if (c->kind == KIND_ATTACH_IN)
		c->status = MOAT_OK;
	else
		call_set_reply(c, r);
	if (r != NULL)
		moat__v1__reply__free_unpacked(r, NULL);
	free(out);
	pthread_mutex_lock(&g->mu);
	call_finish(g, c);
	if (--g->inflight == 0)
		pthread_cond_broadcast(&g->idle_cv);
	pthread_mutex_unlock(&g->mu);
}

/* run_envelope: starts the Gateway method `name` with the message `msg`
 * and the API key `key` through the dispatcher, as an nng client's
 * Envelope would; timeout_ms 0: the dispatcher's default. Returns true
 * when the dispatcher took the call: call_replied then finishes c
 * (perhaps already did: the caller no longer touches c); false with c
 * failed. */
static bool
run_envelope(struct moat_grpc *g, struct grpc_call *c, const char *name,
    const char *key, const uint8_t *msg, size_t msg_len, uint32_t timeout_ms)
{
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	uint8_t *packed;
	size_t packed_len;
	bool taken;

	env.service = (char *)g->service->name;
	env.method = (char *)name;
	env.auth = (char *)key;
	env.request_id = moat_rpc_new_request_id();
	env.timeout_ms = timeout_ms;
	env.payload.data = (uint8_t *)msg;
	env.payload.len = msg_len;
	packed_len = moat__v1__envelope__get_packed_size(&env);
	if ((packed = malloc(packed_len)) == NULL) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return false;
	}
	moat__v1__envelope__pack(&env, packed);
	pthread_mutex_lock(&g->mu);
	g->inflight++;
	pthread_mutex_unlock(&g->mu);
	taken = moat_rpc_server_dispatch_async(g->dispatcher, packed,
	            packed_len, call_replied, c) == 0;
	free(packed);
	if (!taken) {
		pthread_mutex_lock(&g->mu);
		if (--g->inflight == 0)
			pthread_cond_broadcast(&g->idle_cv);
		pthread_mutex_unlock(&g->mu);
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
	}
	return taken;
}

/* call_key: the call's API key (its bearer token, "" without one),
 * admitted by the rate limits and before its deadline; NULL with c
 * failed. */
static const char *
call_key(struct moat_grpc *g, struct grpc_call *c, const char *name)
{
	const char *key = "";
	char *errmsg = NULL;

	if (c->authz != NULL &&
	    moat_http_bearer_key(c->authz, &key, &errmsg) != MOAT_OK) {
		call_fail(c, MOAT_UNAUTHENTICATED, errmsg);
		free(errmsg);
		return NULL;
	}
	if (call_admit(g, c, key) != MOAT_OK)
		return NULL;
	if (c->has_timeout && moat_rpc_now_ms() >= c->deadline_ms) {
		moat_debug(0, "grpc: %s: the deadline passed before it ran",
		    name);
		call_fail(c, MOAT_DEADLINE_EXCEEDED,
		    "the deadline passed before the call ran");
		return NULL;
	}
	return key;
}

/* call_timeout: what is left of the call's deadline in ms (0: none). */
static uint32_t
call_timeout(const struct grpc_call *c)
{
	uint64_t now = moat_rpc_now_ms();

	if (!c->has_timeout)
		return 0;
	return c->deadline_ms > now ? (uint32_t)(c->deadline_ms - now) : 1;
}

/* call_dispatch: starts the Gateway method `name` with the message
 * `msg` through the dispatcher, as an nng client's Envelope would; true
 * when the dispatcher took it (run_envelope). */
static bool
call_dispatch(struct moat_grpc *g, struct grpc_call *c, const char *name,
    const uint8_t *msg, size_t msg_len)
{
	const char *key;

	if ((key = call_key(g, c, name)) == NULL)
		return false;
	return run_envelope(g, c, name, key, msg, msg_len, call_timeout(c));
}

/* exec_call: starts the Gateway method `name` with `msg` for an
 * ExecStream, with its key; its reply comes to exec_result (c->result
 * on MOAT_OK). True when the dispatcher took it (run_envelope). */
static bool
exec_call(struct moat_grpc *g, struct grpc_call *c, const char *name,
    const uint8_t *msg, size_t msg_len, uint32_t timeout_ms)
{
	return run_envelope(g, c, name, c->key, msg, msg_len, timeout_ms);
}

/* exec_call_msg: exec_call with a message to pack. */
static bool
exec_call_msg(struct moat_grpc *g, struct grpc_call *c, const char *name,
    const ProtobufCMessage *req, uint32_t timeout_ms)
{
	size_t n = protobuf_c_message_get_packed_size(req);
	uint8_t *b = malloc(n ? n : 1);
	bool taken;

	if (b == NULL) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return false;
	}
	protobuf_c_message_pack(req, b);
	taken = exec_call(g, c, name, b, n, timeout_ms);
	free(b);
	return taken;
}

/* exec_start: ExecStream's first job: ExecStart with the client's
 * ExecRequest `msg`, authenticated and admitted like any call. */
static bool
exec_start(struct moat_grpc *g, struct grpc_call *c, const uint8_t *msg,
    size_t msg_len)
{
	const char *key;

	if ((key = call_key(g, c,
	         c->kind == KIND_ATTACH ? "Attach" : "ExecStream")) == NULL)
		return false;
	if ((c->key = strdup(key)) == NULL) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return false;
	}
	return exec_call(g, c, "ExecStart", msg, msg_len, call_timeout(c));
}

/* exec_read: one ExecRead long poll from where the stream is. */
static bool
exec_read(struct moat_grpc *g, struct grpc_call *c)
{
	Moat__V1__ExecReadRequest rq = MOAT__V1__EXEC_READ_REQUEST__INIT;
	uint32_t left = call_timeout(c);

	rq.sandbox_id = c->sandbox_id;
	rq.exec_id = c->exec_id;
	rq.stdout_offset = c->pos.stdout_offset;
	rq.stderr_offset = c->pos.stderr_offset;
	rq.wait_ms = left != 0 && left < EXEC_WAIT_MS ? left : EXEC_WAIT_MS;
	rq.max_bytes = EXEC_READ_BYTES;
	return exec_call_msg(g, c, "ExecRead", (ProtobufCMessage *)&rq,
	    rq.wait_ms + EXEC_CALL_MS);
}

/* exec_kill: the stream ended (cancelled, deadline, gone) while its
 * process ran: no command outlives the stream that shows it. */
static bool
exec_kill(struct moat_grpc *g, struct grpc_call *c)
{
	Moat__V1__ExecKillRequest kq = MOAT__V1__EXEC_KILL_REQUEST__INIT;

	kq.sandbox_id = c->sandbox_id;
	kq.exec_id = c->exec_id;
	if (exec_call_msg(g, c, "ExecKill", (ProtobufCMessage *)&kq,
	        EXEC_KILL_MS))
		return true;
	moat_warn(0,
	    "grpc-exec-stream-kill sandbox %s exec %llu: the stream ended "
	    "but the kill failed: %s",
	    c->sandbox_id, (unsigned long long)c->exec_id,
	    c->message ? c->message : "");
	return false;
}

/* call_run: what a worker does with a call: check what the stream
 * carried, then answer health here or start the method by the
 * dispatcher (true: it took the call, see run_envelope). */
static bool
call_run(struct moat_grpc *g, struct grpc_call *c)
{
	static const uint8_t serving[] = { 0, 0, 0, 0, 2, 0x08, 0x01 };
	static const char prefix[] = "/moat.v1.Gateway/";
	const ProtobufCMethodDescriptor *md = NULL;
	const uint8_t *msg;
	size_t msg_len;
	const char *why;
	int rv;

	/* Attach: the loop checked the stream and packed its start. */
	if (c->kind == KIND_ATTACH)
		return exec_start(g, c, c->out, c->out_len);
	if (!c->post || !c->grpc_type || c->path == NULL) {
		call_fail(c, MOAT_INVALID_ARGUMENT,
		    "a gRPC call is a POST with content-type "
		    "application/grpc and a :path");
		return false;
	}
	if (c->bad_timeout) {
		call_fail(c, MOAT_INVALID_ARGUMENT,
		    "grpc-timeout must be 1-8 digits and a unit "
		    "(H M S m u n)");
		return false;
	}
	if (c->too_large) {
		call_fail(c, MOAT_RESOURCE_EXHAUSTED,
		    "the message is larger than 4 MiB");
		return false;
	}
	if ((rv = moat_grpc_unframe(c->body, c->len, &msg, &msg_len, &why)) !=
	    MOAT_OK) {
		call_fail(c, rv, why);
		return false;
	}
	if (c->kind == KIND_EXEC)
		return exec_start(g, c, msg, msg_len);
	if (strcmp(c->path, HEALTH_CHECK) == 0) {
		/* HealthCheckResponse{status: SERVING}: field 1, varint 1.
		 * No key, like the HTTP door's Health. */
		if ((c->out = malloc(sizeof(serving))) == NULL) {
			call_fail(c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
			return false;
		}
		memcpy(c->out, serving, sizeof(serving));
		c->out_len = sizeof(serving);
		c->status = MOAT_OK;
		return false;
	}
	if (strcmp(c->path, HEALTH_WATCH) == 0) {
		/* A stream that would only ever say SERVING: not worth a
		 * stream held per prober. */
		call_fail(c, MOAT_UNIMPLEMENTED,
		    "grpc.health.v1.Health/Watch is not served by moat's "
		    "gateway: poll grpc.health.v1.Health/Check instead");
		return false;
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
		return false;
	}
	return call_dispatch(g, c, md->name, msg, msg_len);
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
	bool taken;

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
		taken = false;
		/* Stopping: every queued call lost its stream; run none. */
		if (!g->stopping) {
			pthread_mutex_unlock(&g->mu);
			if (c->job == JOB_EXEC_READ)
				taken = exec_read(g, c);
			else if (c->job == JOB_EXEC_KILL)
				taken = exec_kill(g, c);
			else if (c->job == JOB_EXEC_INPUT)
				taken = run_envelope(g, c, c->in_method,
				    c->key, c->body, c->len, EXEC_KILL_MS);
			else
				taken = call_run(g, c);
			pthread_mutex_lock(&g->mu);
		}
		/* Taken: the dispatcher's answer finishes c (call_replied),
		 * maybe already has; this worker serves on. */
		if (!taken)
			call_finish(g, c);
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
	c->busy = true;
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
	if (c->conn->calls == NULL)
		c->conn->idle_since = moat_rpc_now_ms();
	c->conn = NULL;
}

/* job_queue: hands an ExecStream's next job to the workers. */
static void
job_queue(struct moat_grpc *g, struct grpc_call *c, enum call_job job)
{
	c->job = job;
	if (c->result != NULL)
		protobuf_c_message_free_unpacked(c->result, NULL);
	c->result = NULL;
	c->status = MOAT_OK;
	free(c->message);
	c->message = NULL;
	call_queue(g, c);
}

/* exec_maybe_kill: queues ExecKill when the stream is over (want_kill)
 * but its process may not be, and no job of the stream is out. */
static void
exec_maybe_kill(struct moat_grpc *g, struct grpc_call *c)
{
	if (!is_exec(c) || !c->want_kill || !c->started || c->exited ||
	    c->kill_queued || c->busy)
		return;
	c->kill_queued = true;
	job_queue(g, c, JOB_EXEC_KILL);
}

/* exec_take_handle: an ExecStart job's handle becomes the stream's. */
static void
exec_take_handle(struct grpc_call *c)
{
	Moat__V1__ExecHandle *h = (Moat__V1__ExecHandle *)c->result;

	if (c->job != JOB_UNARY || c->status != MOAT_OK || h == NULL)
		return;
	c->exec_id = h->exec_id;
	free(c->sandbox_id);
	c->sandbox_id = strdup(h->sandbox_id ? h->sandbox_id : "");
	c->started = c->sandbox_id != NULL;
}

/* call_drop: the stream of c is gone: free it now, or leave it for the
 * loop to free when its worker is done. Loop thread only. */
static void
call_drop(struct moat_grpc *g, struct grpc_call *c)
{
	call_detach(c);
	/* A cancelled or vanished ExecStream: its process is killed
	 * (now, or once the job out with the workers comes back). */
	c->want_kill = true;
	exec_maybe_kill(g, c);
	if (!c->busy)
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

/* answer_status: the whole answer is `status` and `message` in one
 * HEADERS frame (gRPC's Trailers-Only). */
static void
answer_status(struct grpc_conn *cn, int32_t id, int status,
    const char *message)
{
	char code[16], *msg;

	snprintf(code, sizeof(code), "%d", status);
	msg = moat_grpc_percent_encode(message ? message : "");
	{
		nghttp2_nv h[] = { NV(":status", "200"),
			NV("content-type", "application/grpc"),
			NV("grpc-status", code),
			NV("grpc-message", msg ? msg : "") };
		if (nghttp2_submit_response(cn->session, id, h, 4, NULL) != 0)
			nghttp2_submit_rst_stream(cn->session,
			    NGHTTP2_FLAG_NONE, id, NGHTTP2_INTERNAL_ERROR);
	}
	free(msg);
}

/* call_answer: submits c's answer on its stream: headers, the message
 * and grpc-status 0 trailers; or, failed, one HEADERS frame with the
 * status (gRPC's Trailers-Only). */
static void
call_answer(struct grpc_conn *cn, struct grpc_call *c)
{
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
	answer_status(cn, c->stream_id, c->status, c->message);
}

/* stream_read: a stream's data provider: what its queue holds; once
 * finished and drained, the trailers with its status; otherwise
 * DEFERRED until stream_resume. */
static ssize_t
stream_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct grpc_call *c = src->ptr;
	char code[16], *msg;
	size_t n;
	int rv;

	(void)ud;
	if ((n = moat_grpc_queue_read(&c->q, buf, len)) > 0)
		return (ssize_t)n;
	if (!c->finished) {
		c->deferred = true;
		return NGHTTP2_ERR_DEFERRED;
	}
	*flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
	snprintf(code, sizeof(code), "%d", c->fin_status);
	msg = moat_grpc_percent_encode(c->fin_message ? c->fin_message : "");
	{
		nghttp2_nv tr[] = { NV("grpc-status", code),
			NV("grpc-message", msg ? msg : "") };
		rv = nghttp2_submit_trailer(s, id, tr,
		    c->fin_status == MOAT_OK ? 1 : 2);
	}
	free(msg);
	return rv != 0 ? NGHTTP2_ERR_CALLBACK_FAILURE : 0;
}

/* stream_resume: more to send (or the end): wake the data provider. */
static void
stream_resume(struct grpc_conn *cn, struct grpc_call *c)
{
	if (c->deferred) {
		c->deferred = false;
		nghttp2_session_resume_data(cn->session, c->stream_id);
	}
}

/* stream_headers: the response's headers; its messages follow as the
 * queue fills. */
static void
stream_headers(struct grpc_conn *cn, struct grpc_call *c)
{
	nghttp2_data_provider dp = { .source.ptr = c,
		.read_callback = stream_read };
	nghttp2_nv h[] = { NV(":status", "200"),
		NV("content-type", "application/grpc") };

	c->answered = true;
	if (nghttp2_submit_response(cn->session, c->stream_id, h, 2, &dp) != 0)
		nghttp2_submit_rst_stream(cn->session, NGHTTP2_FLAG_NONE,
		    c->stream_id, NGHTTP2_INTERNAL_ERROR);
}

/* stream_finish: the stream's status: sent in the trailers after what
 * is queued, or alone (Trailers-Only) before any headers. */
static void
stream_finish(struct grpc_conn *cn, struct grpc_call *c, int status,
    const char *msg)
{
	if (c->finished)
		return;
	c->finished = true;
	c->fin_status = status;
	c->fin_message = msg != NULL && msg[0] != '\0' ? strdup(msg) : NULL;
	if (!c->answered) {
		c->answered = true;
		answer_status(cn, c->stream_id, status, msg);
	} else {
		stream_resume(cn, c);
	}
}

/* stream_push: one message onto the stream's queue; false (and the
 * stream failed) when out of memory. */
static bool
stream_push(struct grpc_conn *cn, struct grpc_call *c, int rv)
{
	if (rv == MOAT_OK) {
		stream_resume(cn, c);
		return true;
	}
	stream_finish(cn, c, MOAT_RESOURCE_EXHAUSTED,
	    "out of memory queueing the stream's messages");
	return false;
}

/* exec_started: ExecStart's answer: the stream's headers and its
 * `started` event, or its error alone. */
static void
exec_started(struct grpc_conn *cn, struct grpc_call *c)
{
	Moat__V1__ExecEvent ev = MOAT__V1__EXEC_EVENT__INIT;

	exec_take_handle(c);
	if (c->finished) /* the deadline passed meanwhile */
		return;
	if (c->status != MOAT_OK || !c->started) {
		stream_finish(cn, c,
		    c->status != MOAT_OK ? c->status : MOAT_RESOURCE_EXHAUSTED,
		    c->status != MOAT_OK ? c->message : "out of memory");
		return;
	}
	stream_headers(cn, c);
	ev.event_case = MOAT__V1__EXEC_EVENT__EVENT_STARTED;
	ev.started = (Moat__V1__ExecHandle *)c->result;
	(void)stream_push(cn, c, moat_grpc_exec_event(&c->q, &ev));
}

/* exec_output: one ExecRead's answer: stdout and stderr events as they
 * came, and `exit` with grpc-status 0 once the process is done. */
static void
exec_output(struct grpc_conn *cn, struct grpc_call *c)
{
	Moat__V1__ExecReadReply *rr = (Moat__V1__ExecReadReply *)c->result;
	Moat__V1__ExecStatus none = MOAT__V1__EXEC_STATUS__INIT;
	Moat__V1__ExecEvent ev = MOAT__V1__EXEC_EVENT__INIT;
	bool over;

	if (c->finished)
		return;
	if (c->status != MOAT_OK || rr == NULL) {
		stream_finish(cn, c,
		    c->status != MOAT_OK ? c->status : MOAT_INTERNAL,
		    c->message);
		return;
	}
	over = moat_grpc_exec_advance(&c->pos, rr);
	if (rr->stdout.len == 0 && rr->stderr.len == 0 &&
	    moat_rpc_now_ms() < c->poll_at + EXEC_WAIT_MS / 2)
		c->poll_at = moat_rpc_now_ms() + EXEC_IDLE_POLL_MS;
	else
		c->poll_at = 0;
	if (rr->stdout.len > 0) {
		ev.event_case = MOAT__V1__EXEC_EVENT__EVENT_STDOUT;
		ev.stdout = rr->stdout;
		if (!stream_push(cn, c, moat_grpc_exec_event(&c->q, &ev)))
			return;
	}
	if (rr->stderr.len > 0) {
		ev.event_case = MOAT__V1__EXEC_EVENT__EVENT_STDERR;
		ev.stderr = rr->stderr;
		if (!stream_push(cn, c, moat_grpc_exec_event(&c->q, &ev)))
			return;
	}
	if (!over)
		return;
	c->exited = true;
	ev.event_case = MOAT__V1__EXEC_EVENT__EVENT_EXIT;
	ev.exit = rr->status != NULL ? rr->status : &none;
	if (stream_push(cn, c, moat_grpc_exec_event(&c->q, &ev)))
		stream_finish(cn, c, MOAT_OK, NULL);
}

/* exec_pump: the stream's next ExecRead, when it has room for what that
 * brings and nothing is out already. */
static void
exec_pump(struct moat_grpc *g, struct grpc_call *c)
{
	uint64_t now = moat_rpc_now_ms();

	if (c->started && !c->finished && !c->busy && now >= c->poll_at &&
	    moat_grpc_queue_room(&c->q)) {
		c->poll_at = now;
		job_queue(g, c, JOB_EXEC_READ);
	}
}

/* reflect_pump: answers the reflection stream's whole request messages
 * while its queue has room, giving their bytes back to the client's
 * window as it goes; trailers once the client ended and all is
 * answered. */
static void
reflect_pump(struct moat_grpc *g, struct grpc_conn *cn, struct grpc_call *c)
{
	const uint8_t *msg;
	size_t msg_len, used, out_len;
	const char *why = NULL;
	uint8_t *out;
	int r = 0, rv;

	if (c->finished)
		return;
	if (!c->post || !c->grpc_type) {
		stream_finish(cn, c, MOAT_INVALID_ARGUMENT,
		    "a gRPC call is a POST with content-type "
		    "application/grpc");
		return;
	}
	if (c->too_large) {
		stream_finish(cn, c, MOAT_RESOURCE_EXHAUSTED,
		    "the reflection stream sent more than it was let");
		return;
	}
	if (!c->answered)
		stream_headers(cn, c);
	while (moat_grpc_queue_room(&c->q) &&
	    (r = moat_grpc_next_message(c->body, c->len,
	         MOAT_GRPC_REFLECT_MAX_REQUEST, &msg, &msg_len, &used,
	         &why)) == 1) {
		if ((rv = moat_grpc_reflect_answer(g->desc, msg, msg_len, &out,
		         &out_len, &why)) != MOAT_OK) {
			stream_finish(cn, c, rv,
			    rv == MOAT_INVALID_ARGUMENT ? why :
			                                  "out of memory");
			return;
		}
		rv = moat_grpc_queue_push(&c->q, out, out_len);
		free(out);
		if (!stream_push(cn, c, rv))
			return;
		memmove(c->body, c->body + used, c->len - used);
		c->len -= used;
		nghttp2_session_consume_stream(cn->session, c->stream_id,
		    used);
	}
	if (r < 0)
		stream_finish(cn, c, MOAT_INVALID_ARGUMENT, why);
	else if (r == 0 && c->remote_done)
		stream_finish(cn, c,
		    c->len == 0 ? MOAT_OK : MOAT_INVALID_ARGUMENT,
		    c->len == 0 ? NULL : "the stream ended inside a message");
}

/* attach_fail: the Attach ends with `status` and `msg`; its process is
 * killed (as a cancelled stream's). */
static void
attach_fail(struct moat_grpc *g, struct grpc_conn *cn, struct grpc_call *c,
    int status, const char *msg)
{
	stream_finish(cn, c, status, msg);
	c->want_kill = true;
	exec_maybe_kill(g, c);
}

/* attach_send: the input call of c sends `req` by `method` (ExecWrite or
 * ExecResize) to c's process. False (c failed) when out of memory. */
static bool
attach_send(struct moat_grpc *g, struct grpc_conn *cn, struct grpc_call *c,
    const char *method, const ProtobufCMessage *req)
{
	struct grpc_call *in = c->in;
	size_t n = protobuf_c_message_get_packed_size(req);

	if (in == NULL && (in = calloc(1, sizeof(*in))) != NULL) {
		g->live++;
		in->g = g;
		in->kind = KIND_ATTACH_IN;
		in->parent = c;
		c->in = in;
		in->key = strdup(c->key ? c->key : "");
	}
	if (in == NULL || in->key == NULL ||
	    (in->body = malloc(n ? n : 1)) == NULL) {
		attach_fail(g, cn, c, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory sending the stream's input");
		return false;
	}
	protobuf_c_message_pack(req, in->body);
	in->len = n;
	in->in_method = method;
	in->job = JOB_EXEC_INPUT;
	in->status = MOAT_OK;
	free(in->message);
	in->message = NULL;
	call_queue(g, in);
	return true;
}

/* attach_input: one AttachInput past the start, for c's process. */
static void
attach_input(struct moat_grpc *g, struct grpc_conn *cn, struct grpc_call *c,
    const Moat__V1__AttachInput *ai)
{
	Moat__V1__ExecWriteRequest wq = MOAT__V1__EXEC_WRITE_REQUEST__INIT;
	Moat__V1__ExecResizeRequest rq = MOAT__V1__EXEC_RESIZE_REQUEST__INIT;

	wq.sandbox_id = rq.sandbox_id = c->sandbox_id;
	wq.exec_id = rq.exec_id = c->exec_id;
	switch (ai->input_case) {
	case MOAT__V1__ATTACH_INPUT__INPUT_STDIN:
		if (c->stdin_closed) {
			attach_fail(g, cn, c, MOAT_FAILED_PRECONDITION,
			    "stdin was closed (close_stdin): send no stdin "
			    "after it");
		} else if (ai->stdin.len > 0) {
			wq.data = ai->stdin;
			(void)attach_send(g, cn, c, "ExecWrite",
			    (ProtobufCMessage *)&wq);
		}
		break;
	case MOAT__V1__ATTACH_INPUT__INPUT_RESIZE:
		if (!c->pty) {
			attach_fail(g, cn, c, MOAT_FAILED_PRECONDITION,
			    "resize needs a terminal: start with pty true");
			break;
		}
		rq.rows = ai->resize != NULL ? ai->resize->rows : 0;
		rq.cols = ai->resize != NULL ? ai->resize->cols : 0;
		(void)attach_send(g, cn, c, "ExecResize",
		    (ProtobufCMessage *)&rq);
		break;
	case MOAT__V1__ATTACH_INPUT__INPUT_CLOSE_STDIN:
		if (!ai->close_stdin || c->stdin_closed)
			break;
		c->stdin_closed = true;
		wq.close = true;
		(void)attach_send(g, cn, c, "ExecWrite",
		    (ProtobufCMessage *)&wq);
		break;
	case MOAT__V1__ATTACH_INPUT__INPUT_START:
		attach_fail(g, cn, c, MOAT_INVALID_ARGUMENT,
		    "start was already sent: an Attach runs one process; "
		    "open another Attach for another");
		break;
	default:
		attach_fail(g, cn, c, MOAT_INVALID_ARGUMENT,
		    "an AttachInput carries one of start, stdin, resize or "
		    "close_stdin");
		break;
	}
}

/* attach_first: the stream's first input, which must be `start`: its
 * ExecRequest (stdin kept open) goes out as ExecStart. */
static void
attach_first(struct moat_grpc *g, struct grpc_conn *cn, struct grpc_call *c,
    const Moat__V1__AttachInput *ai)
{
	Moat__V1__ExecRequest *rq = ai->start;
	size_t n;

	if (ai->input_case != MOAT__V1__ATTACH_INPUT__INPUT_START ||
	    rq == NULL) {
		stream_finish(cn, c, MOAT_INVALID_ARGUMENT,
		    "send start first: an Attach's first AttachInput is "
		    "start, the ExecRequest of the process to run");
		return;
	}
	rq->stdin_open = true;
	n = protobuf_c_message_get_packed_size((ProtobufCMessage *)rq);
	if ((c->out = malloc(n ? n : 1)) == NULL) {
		stream_finish(cn, c, MOAT_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	c->out_len = protobuf_c_message_pack((ProtobufCMessage *)rq, c->out);
	c->pty = rq->pty;
	c->start_sent = true;
	job_queue(g, c, JOB_UNARY);
}

/* attach_in_free: c's input call may take the next input: none is out
 * with the workers or waiting to be sent again. */
static bool
attach_in_free(const struct grpc_call *c)
{
	return c->in == NULL || (!c->in->busy && c->in->len == 0);
}

/* attach_next: the next whole input of c's stream (*ai, the caller
 * frees), its bytes given back to the client's window; false when none
 * is whole yet, or the stream failed. At the client's end, stdin
 * closes (once). */
static bool
attach_next(struct moat_grpc *g, struct grpc_conn *cn, struct grpc_call *c,
    Moat__V1__AttachInput **ai)
{
	const uint8_t *msg;
	size_t msg_len, used;
	const char *why = NULL;
	int r;

	r = moat_grpc_next_message(c->body, c->len,
	    ATTACH_WINDOW - MOAT_GRPC_PREFIX, &msg, &msg_len, &used, &why);
	if (r < 0) {
		attach_fail(g, cn, c, MOAT_INVALID_ARGUMENT, why);
		return false;
	}
	if (r == 0) {
		if (c->remote_done && c->len > 0)
			attach_fail(g, cn, c, MOAT_INVALID_ARGUMENT,
			    "the stream ended inside a message");
		else if (c->remote_done && !c->start_sent)
			stream_finish(cn, c, MOAT_INVALID_ARGUMENT,
			    "send start first: the stream ended before "
			    "its start");
		return false;
	}
	*ai = moat__v1__attach_input__unpack(NULL, msg_len, msg);
	memmove(c->body, c->body + used, c->len - used);
	c->len -= used;
	nghttp2_session_consume_stream(cn->session, c->stream_id, used);
	if (*ai == NULL) {
		attach_fail(g, cn, c, MOAT_INVALID_ARGUMENT,
		    "a message of the stream is not an AttachInput");
		return false;
	}
	return true;
}

/* attach_pump: an Attach moves on: its start once the first input is
 * whole; then ExecStream's output chain, and its inputs one at a time
 * in order while the input call is free (held before the process
 * started, dropped after it exited: its exit event is coming). */
static void
attach_pump(struct moat_grpc *g, struct grpc_conn *cn, struct grpc_call *c)
{
	Moat__V1__AttachInput *ai = NULL, eof = MOAT__V1__ATTACH_INPUT__INIT;

	if (!c->window_set) {
		/* Room for the largest input; given back as they go. */
		c->window_set = true;
		(void)nghttp2_session_set_local_window_size(cn->session,
		    NGHTTP2_FLAG_NONE, c->stream_id, ATTACH_WINDOW);
	}
	if (!c->finished && (!c->post || !c->grpc_type || c->bad_timeout))
		stream_finish(cn, c, MOAT_INVALID_ARGUMENT,
		    c->bad_timeout ? "grpc-timeout must be 1-8 digits and "
		                     "a unit (H M S m u n)" :
		                     "a gRPC call is a POST with content-type "
		                     "application/grpc");
	if (!c->finished && c->too_large)
		attach_fail(g, cn, c, MOAT_RESOURCE_EXHAUSTED,
		    "the stream sent more than its window let it");
	if (c->finished) { /* what else comes is dropped */
		nghttp2_session_consume_stream(cn->session, c->stream_id,
		    c->len);
		c->len = 0;
		return;
	}
	if (!c->start_sent) {
		if (attach_next(g, cn, c, &ai))
			attach_first(g, cn, c, ai);
		moat__v1__attach_input__free_unpacked(ai, NULL);
		return;
	}
	exec_pump(g, c);
	if (c->exited && c->in != NULL && !c->in->busy && c->in->len > 0) {
		free(c->in->body); /* a retry no process waits for */
		c->in->body = NULL;
		c->in->len = 0;
	}
	while (c->started && !c->finished && attach_in_free(c)) {
		if (!attach_next(g, cn, c, &ai))
			break;
		if (!c->exited)
			attach_input(g, cn, c, ai);
		moat__v1__attach_input__free_unpacked(ai, NULL);
		ai = NULL;
	}
	/* The client's end closes stdin, after what it sent. */
	eof.input_case = MOAT__V1__ATTACH_INPUT__INPUT_CLOSE_STDIN;
	eof.close_stdin = true;
	if (c->started && !c->finished && !c->exited && c->remote_done &&
	    c->len == 0 && !c->stdin_closed && attach_in_free(c))
		attach_input(g, cn, c, &eof);
	if (c->in != NULL && !c->in->busy && c->in->len > 0 && !c->finished &&
	    moat_rpc_now_ms() >= c->in->retry_at) {
		c->in->status = MOAT_OK; /* the node's stdin had no room */
		call_queue(g, c->in);
	}
}

/* attach_input_done: an Attach's input came back. Refused for a
 * process that exited or closed its stdin meanwhile (FAILED_PRECONDITION,
 * NOT_FOUND): ignored, its exit event is coming; the node's stdin full:
 * sent again shortly; any other error ends the stream. */
static void
attach_input_done(struct moat_grpc *g, struct grpc_call *in)
{
	struct grpc_call *c = in->parent;

	if (c == NULL) { /* its Attach is gone */
		call_free(in);
		return;
	}
	if (in->status == MOAT_RESOURCE_EXHAUSTED && !c->exited &&
	    c->conn != NULL && !c->finished) {
		in->retry_at = moat_rpc_now_ms() + ATTACH_RETRY_MS;
		return;
	}
	free(in->body);
	in->body = NULL;
	in->len = 0;
	if (in->status != MOAT_OK && in->status != MOAT_FAILED_PRECONDITION &&
	    in->status != MOAT_NOT_FOUND && c->conn != NULL && !c->finished) {
		moat_debug(0, "grpc: Attach: %s failed: %s", in->in_method,
		    in->message ? in->message : "");
		attach_fail(g, c->conn, c, in->status, in->message);
	}
}

/* conn_pump: every stream of the connection that can move on does. */
static void
conn_pump(struct moat_grpc *g, struct grpc_conn *cn)
{
	struct grpc_call *c, *next;

	for (c = cn->calls; c != NULL; c = next) {
		next = c->conn_next;
		if (c->kind == KIND_EXEC)
			exec_pump(g, c);
		else if (c->kind == KIND_REFLECT && c->headers_done)
			reflect_pump(g, cn, c);
		else if (c->kind == KIND_ATTACH && c->headers_done)
			attach_pump(g, cn, c);
	}
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
	c->g = cn->g;
	cn->g->live++;
	moat_grpc_queue_init(&c->q, MOAT_GRPC_STREAM_QUEUE, &cn->g->buffered,
	    cn->g->buffer_cap);
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
		if (strcmp(v, EXEC_STREAM) == 0)
			c->kind = KIND_EXEC;
		else if (strcmp(v, ATTACH) == 0)
			c->kind = KIND_ATTACH;
		else if (strcmp(v, REFLECTION) == 0)
			c->kind = KIND_REFLECT;
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
	/* Windows are given back by hand (no automatic WINDOW_UPDATE): the
	 * connection's at once; a stream's at once too, but a reflection
	 * stream's only as its requests are answered (reflect_pump), an
	 * Attach's as its inputs go out (attach_pump). */
	nghttp2_session_consume_connection(s, len);
	if (c == NULL || (c->kind != KIND_REFLECT && c->kind != KIND_ATTACH))
		nghttp2_session_consume_stream(s, id, len);
	if (c == NULL || c->queued || c->too_large)
		return 0;
	if (c->len + len > (c->kind == KIND_REFLECT ?
	                           REFLECT_BUFFER :
	                           c->kind == KIND_ATTACH ?
	                           ATTACH_WINDOW :
	                           MOAT_GRPC_MAX_MESSAGE + MOAT_GRPC_PREFIX)) {
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

	if (f->hd.type != NGHTTP2_DATA && f->hd.type != NGHTTP2_HEADERS)
		return 0;
	c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
	if (c == NULL)
		return 0;
	if (f->hd.type == NGHTTP2_HEADERS)
		c->headers_done = true;
	if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
		return 0;
	/* A reflection stream answers as requests come, an Attach sends
	 * them on (conn_pump). */
	if (c->kind == KIND_REFLECT || c->kind == KIND_ATTACH)
		c->remote_done = true;
	else if (!c->queued) {
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
	if (cn->tls != NULL) {
		n = moat_grpc_tls_write(cn->tls, data, len);
		return n > 0 ? n :
		    n == 0   ? NGHTTP2_ERR_WOULDBLOCK :
		               NGHTTP2_ERR_CALLBACK_FAILURE;
	}
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
	moat_grpc_tls_conn_free(cn->tls);
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
		/* A reply is several frames (HEADERS, DATA, trailers),
		 * sent as they are made: with Nagle each small send after
		 * the first waits for the client's delayed ACK, about 40 ms
		 * a call (measured with moat-bench-grpc). */
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 },
		    sizeof(int));
		cn->fd = fd;
		cn->g = g;
		cn->idle_since = moat_rpc_now_ms();
		peer_name(&ss, cn->peer, sizeof(cn->peer));
		if ((g->tls != NULL &&
		        (cn->tls = moat_grpc_tls_accept(g->tls, fd,
		             cn->peer)) == NULL) ||
		    nghttp2_session_server_new2(&cn->session, g->cbs, cn,
		        g->opt) != 0 ||
		    nghttp2_submit_settings(cn->session, NGHTTP2_FLAG_NONE, iv,
		        1) != 0) {
			if (cn->session != NULL)
				nghttp2_session_del(cn->session);
			moat_grpc_tls_conn_free(cn->tls);
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
conn_io(struct moat_grpc *g, struct grpc_conn *cn, short revents)
{
	uint8_t buf[GRPC_READ_CHUNK];
	ssize_t n;

	/* TLS: a handshake may wait for a writable socket as well. */
	if ((revents & (POLLIN | POLLHUP | POLLERR)) ||
	    (cn->tls != NULL && revents != 0)) {
		for (;;) {
			if (cn->tls != NULL) {
				if ((n = moat_grpc_tls_read(cn->tls, buf,
				         sizeof(buf))) == 0)
					break;
				if (n < 0 ||
				    nghttp2_session_mem_recv(cn->session, buf,
				        (size_t)n) < 0)
					return false;
				continue;
			}
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
	/* What came may let streams move; what is sent may make room. */
	conn_pump(g, cn);
	if (nghttp2_session_send(cn->session) != 0)
		return false;
	conn_pump(g, cn);
	return nghttp2_session_want_read(cn->session) ||
	    nghttp2_session_want_write(cn->session);
}

/* done_exec: an ExecStream job came back: its events, and the kill when
 * the stream ended (its deadline) while the job was out. */
static void
done_exec(struct moat_grpc *g, struct grpc_call *c)
{
	if (c->job == JOB_UNARY)
		exec_started(c->conn, c);
	else if (c->job == JOB_EXEC_READ)
		exec_output(c->conn, c);
	exec_maybe_kill(g, c);
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
		c->busy = false;
		if (c->kind == KIND_ATTACH_IN) {
			attach_input_done(g, c);
			continue;
		}
		if (c->conn == NULL) {
			/* Gone meanwhile: a process it started is killed
			 * first (one more job), then it is freed. */
			exec_take_handle(c);
			exec_maybe_kill(g, c);
			if (!c->busy)
				call_free(c);
			continue;
		} else if (!is_exec(c)) {
			call_answer(c->conn, c);
		} else {
			done_exec(g, c);
		}
		if (c->result != NULL && !c->busy) {
			protobuf_c_message_free_unpacked(c->result, NULL);
			c->result = NULL;
		}
	}
}

/* conn_timers: an idle connection's GOAWAY, and ExecStreams past
 * their deadline (DEADLINE_EXCEEDED, the process killed); lowers *next
 * to the nearest time still to come. */
static void
conn_timers(struct moat_grpc *g, struct grpc_conn *cn, uint64_t now,
    uint64_t *next)
{
	struct grpc_call *c;

	if (cn->calls == NULL && g->idle_ms != 0 && !cn->goaway) {
		if (now >= cn->idle_since + g->idle_ms) {
			/* want_read turns false once it is sent: closed. */
			cn->goaway = true;
			nghttp2_session_terminate_session(cn->session,
			    NGHTTP2_NO_ERROR);
		} else if (cn->idle_since + g->idle_ms < *next) {
			*next = cn->idle_since + g->idle_ms;
		}
	}
	for (c = cn->calls; c != NULL; c = c->conn_next) {
		if (is_exec(c) && !c->busy && !c->finished &&
		    c->poll_at > now && c->poll_at < *next)
			*next = c->poll_at; /* its next ExecRead */
		if (c->in != NULL && !c->in->busy && c->in->len > 0 &&
		    c->in->retry_at < *next)
			*next = c->in->retry_at; /* an Attach input again */
		if (!is_exec(c) || !c->has_timeout || c->finished)
			continue;
		if (now < c->deadline_ms) {
			if (c->deadline_ms < *next)
				*next = c->deadline_ms;
			continue;
		}
		stream_finish(cn, c, MOAT_DEADLINE_EXCEEDED,
		    "the deadline passed while the command ran: it is "
		    "killed; give a longer deadline");
		c->want_kill = true;
		exec_maybe_kill(g, c);
	}
}

/* loop_timers: conn_timers for every connection; poll's timeout. */
static int
loop_timers(struct moat_grpc *g)
{
	uint64_t now = moat_rpc_now_ms(), next = UINT64_MAX;
	int i;

	for (i = 0; i < MOAT_GRPC_MAX_CONNECTIONS; i++)
		if (g->conns[i] != NULL)
			conn_timers(g, g->conns[i], now, &next);
	if (next == UINT64_MAX)
		return -1;
	return next - now > 60000 ? 60000 : (int)(next - now);
}

/* loop_closing: the door stops: every connection closes (which queues
 * the kill of each ExecStream's process still running), and no new one
 * is taken. Returns when the loop may end: when every call is freed
 * (the kills came back) or after STOP_KILL_MS; else lowers *timeout. */
static bool
loop_closing(struct moat_grpc *g, uint64_t *until, int *timeout)
{
	uint64_t now = moat_rpc_now_ms();
	int i;

	if (*until == 0) {
		for (i = 0; i < MOAT_GRPC_MAX_CONNECTIONS; i++)
			if (g->conns[i] != NULL)
				conn_close(g, i);
		*until = now + STOP_KILL_MS;
	}
	if (g->live == 0)
		return true;
	if (now >= *until) {
		moat_warn(0,
		    "grpc: stopping with %d calls unanswered: the "
		    "kills of their ExecStreams may not have run",
		    g->live);
		return true;
	}
	if (*timeout < 0 || (uint64_t)*timeout > *until - now)
		*timeout = (int)(*until - now);
	return false;
}

/* conn_pollout: POLLOUT when the connection has something to write
 * that the socket's room lets go on (with TLS: not while the write waits
 * for the peer's bytes, or when the handshake waits to write). */
static short
conn_pollout(struct grpc_conn *cn)
{
	bool want = nghttp2_session_want_write(cn->session) != 0;

	if (cn->tls == NULL)
		return want ? POLLOUT : 0;
	if (moat_grpc_tls_waits(cn->tls, false) == MOAT_GRPC_TLS_WAIT_WRITE ||
	    moat_grpc_tls_waits(cn->tls, true) == MOAT_GRPC_TLS_WAIT_WRITE)
		return POLLOUT;
	return want &&
	        moat_grpc_tls_waits(cn->tls, true) != MOAT_GRPC_TLS_WAIT_READ ?
	    POLLOUT :
	    0;
}

static void *
loop_main(void *arg)
{
	struct moat_grpc *g = arg;
	struct pollfd pfd[MOAT_GRPC_MAX_CONNECTIONS + 2];
	int slot_of[MOAT_GRPC_MAX_CONNECTIONS + 2];
	int i, n, timeout;
	uint64_t until = 0; /* closing: when the loop ends regardless */
	bool stop, closing;

	for (;;) {
		pthread_mutex_lock(&g->mu);
		stop = g->stopping;
		closing = g->closing;
		pthread_mutex_unlock(&g->mu);
		if (stop)
			break;
		timeout = loop_timers(g);
		if (closing && loop_closing(g, &until, &timeout))
			break;
		pfd[0] = (struct pollfd){ .fd = closing ? -1 : g->listen_fd,
			.events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = g->wake_fd, .events = POLLIN };
		n = 2;
		for (i = 0; i < MOAT_GRPC_MAX_CONNECTIONS; i++) {
			struct grpc_conn *cn = g->conns[i];
			if (cn == NULL)
				continue;
			pfd[n].fd = cn->fd;
			pfd[n].events = POLLIN | conn_pollout(cn);
			pfd[n].revents = 0;
			slot_of[n++] = i;
		}
		if (poll(pfd, (nfds_t)n, timeout) < 0) {
			if (errno == EINTR)
				continue;
			moat_error(0, "grpc: poll: %s", strerror(errno));
			break;
		}
		if (pfd[1].revents & POLLIN)
			drain_done(g);
		for (i = 2; i < n; i++) {
			struct grpc_conn *cn = g->conns[slot_of[i]];
			if (cn != NULL && !conn_io(g, cn, pfd[i].revents))
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
	return moat_grpc_start_limits(out, gw, addr, rps, burst, NULL, errmsg);
}

/* grpc_streams_init: the stream limits, the reflection descriptors and
 * the manual window option every session gets. */
static int
grpc_streams_init(struct moat_grpc *g, const struct moat_grpc_limits *lim,
    char **errmsg)
{
	uint32_t mib =
	    lim && lim->buffer_mib ? lim->buffer_mib : MOAT_GRPC_BUFFER_MIB;
	uint32_t idle = lim && lim->idle_s ? lim->idle_s : MOAT_GRPC_IDLE_S;

	g->buffer_cap = (size_t)mib << 20;
	g->idle_ms = (uint64_t)idle * 1000;
	if (moat_grpc_descset_parse(moat_grpc_descriptor_set,
	        moat_grpc_descriptor_set_len, &g->desc) != MOAT_OK) {
		*errmsg = moat_asprintf("programmer error: the embedded gRPC "
		                        "descriptor set does not parse: "
		                        "rebuild moat-gateway");
		return MOAT_INTERNAL;
	}
	if (nghttp2_option_new(&g->opt) != 0) {
		*errmsg = moat_asprintf("out of memory starting gRPC");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	nghttp2_option_set_no_auto_window_update(g->opt, 1);
	return MOAT_OK;
}

int
moat_grpc_start_limits(struct moat_grpc **out, struct moat_gateway *gw,
    const char *addr, uint32_t rps, uint32_t burst,
    const struct moat_grpc_limits *lim, char **errmsg)
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
	pthread_cond_init(&g->idle_cv, NULL);
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
	if (lim != NULL && lim->tls_cert != NULL &&
	    (rv = moat_grpc_tls_new(&g->tls, lim->tls_cert, lim->tls_key,
	         errmsg)) != MOAT_OK)
		goto fail;
	if ((rv = grpc_streams_init(g, lim, errmsg)) != MOAT_OK ||
	    (rv = moat_rpc_server_new_detached(&g->dispatcher, &svc,
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
	/* The loop first: it closes every connection and, while the
	 * workers still run, sees the kills of the ExecStreams that were
	 * running through (bounded); then it ends. */
	pthread_mutex_lock(&g->mu);
	g->closing = true;
	pthread_mutex_unlock(&g->mu);
	if (g->loop_started) {
		wake(g);
		pthread_join(g->loop, NULL);
	}
	pthread_mutex_lock(&g->mu);
	g->stopping = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	/* The workers end their call in progress, then the queue (every
	 * call there lost its stream). */
	for (i = 0; i < g->nworkers; i++)
		pthread_join(g->workers[i], NULL);
	/* Calls still out with the dispatcher finish onto the done list:
	 * their completion (bounded by their own timeouts) uses g. */
	pthread_mutex_lock(&g->mu);
	while (g->inflight > 0)
		pthread_cond_wait(&g->idle_cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
	for (c = g->done; c != NULL; c = next) {
		next = c->next;
		call_free(c);
	}
	/* Kills still queued past STOP_KILL_MS: not run. */
	for (c = g->queue; c != NULL; c = next) {
		next = c->next;
		call_free(c);
	}
	moat_grpc_descset_free(g->desc);
	moat_grpc_tls_free(g->tls);
	if (g->opt != NULL)
		nghttp2_option_del(g->opt);
	if (g->cbs != NULL)
		nghttp2_session_callbacks_del(g->cbs);
	if (g->listen_fd >= 0)
		close(g->listen_fd);
	if (g->wake_fd >= 0)
		close(g->wake_fd);
	moat_rpc_server_stop(g->dispatcher);
	moat_ratelimit_free(g->rl);
	pthread_cond_destroy(&g->cv);
	pthread_cond_destroy(&g->idle_cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
}
