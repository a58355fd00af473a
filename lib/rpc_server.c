/*
 * rpc_server.c: the server half of moat's RPC layer. A rep0 socket, a pool
 * of worker threads (one nng context each, serving one call at a time,
 * synchronously, so a handler may block for seconds), and a dispatcher
 * that turns any bytes a peer sends into exactly one moat.v1.Reply:
 * decode the Envelope, find the method in the service descriptor and the
 * service's method table, decode the payload, check auth, answer repeats
 * of mutating calls from a bounded memory of recent replies, run the
 * handler, encode. A handler that defers its reply hands the request's
 * context to rpc_defer.c and the worker takes a new one. Not for: the
 * client (rpc_client.c), or deciding what a method means (that is the
 * handler's business).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>

#include "common.pb-c.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/rpc_dispatch.h"
#include "moat/status.h"
#include "moat/util.h"
#include "rpc_server_internal.h"

#define RPC_MAX_WORKERS 1024
#define RPC_MAX_NAME 128            /* longest service or method name */
#define RPC_MAX_REPLY_MESSAGE 16384 /* longest message in a Reply */

uint64_t
moat_rpc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int
moat_rpc_error(struct moat_rpc_call *call, int code, const char *fmt, ...)
{
	va_list ap;
	char *msg = NULL;

	va_start(ap, fmt);
	if (vasprintf(&msg, fmt, ap) < 0)
		msg = NULL;
	va_end(ap);
	free(call->error_message);
	call->error_message = msg;
	return code;
}

/* ---- dedup memory ---- */

static size_t
dedup_bucket(uint64_t request_id)
{
	uint64_t h = request_id * 0x9e3779b97f4a7c15ull;

	return (size_t)(h >> 32) & (DEDUP_BUCKETS - 1);
}

static void
dedup_unlink(struct dedup_cache *c, struct dedup_entry *e)
{
	struct dedup_entry **pp = &c->buckets[dedup_bucket(e->request_id)];

	while (*pp != NULL && *pp != e)
		pp = &(*pp)->bucket_next;
	if (*pp == e)
		*pp = e->bucket_next;
	if (e->older != NULL)
		e->older->newer = e->newer;
	else
		c->oldest = e->newer;
	if (e->newer != NULL)
		e->newer->older = e->older;
	else
		c->newest = e->older;
	c->n_entries--;
	c->n_bytes -= e->reply_len + strlen(e->auth) + strlen(e->tenant);
	free(e->reply);
	free(e->auth);
	free(e->tenant);
	free(e);
}

/* Drops finished entries that are too old, or the oldest finished ones
 * while over a bound. Running entries are never dropped: their callers
 * still hold them. Called with the lock held. */
static void
dedup_evict(struct dedup_cache *c, uint64_t now)
{
	struct dedup_entry *e = c->oldest, *next;

	while (e != NULL) {
		bool expired = now - e->created_ms >= DEDUP_TTL_MS;
		bool over = c->n_entries >= DEDUP_MAX_ENTRIES ||
		    c->n_bytes > DEDUP_MAX_BYTES;

		next = e->newer;
		if (!expired && !over)
			break;
		if (e->done)
			dedup_unlink(c, e);
		e = next;
	}
}

/* dedup_begin: looks up request_id. A stored reply is only given to the
 * same method with the same credentials and tenant, so a caller who
 * learns another tenant's request id cannot read that tenant's reply.
 * On DEDUP_NEW *entry is the new running entry (finish it with
 * dedup_finish). On DEDUP_DONE *reply is a heap copy of the stored
 * reply (caller frees). */
static enum dedup_verdict
dedup_begin(struct dedup_cache *c, uint64_t request_id, const char *method,
    const char *auth, const char *tenant, struct dedup_entry **entry,
    uint8_t **reply, size_t *reply_len)
{
	enum dedup_verdict v;
	struct dedup_entry *e;
	size_t b = dedup_bucket(request_id);
	uint64_t now = moat_rpc_now_ms();

	pthread_mutex_lock(&c->lock);
	dedup_evict(c, now);
	for (e = c->buckets[b]; e != NULL; e = e->bucket_next)
		if (e->request_id == request_id)
			break;
	if (e != NULL) {
		if (strcmp(e->method, method) != 0 ||
		    strcmp(e->auth, auth) != 0 ||
		    strcmp(e->tenant, tenant) != 0) {
			v = DEDUP_OTHER_CALL;
		} else if (!e->done) {
			v = DEDUP_RUNNING;
		} else if ((*reply = malloc(e->reply_len)) == NULL) {
			v = DEDUP_NOMEM;
		} else {
			memcpy(*reply, e->reply, e->reply_len);
			*reply_len = e->reply_len;
			v = DEDUP_DONE;
		}
		goto out;
	}
	if (c->n_entries >= DEDUP_MAX_ENTRIES) {
		v = DEDUP_FULL;
		goto out;
	}
	if ((e = calloc(1, sizeof(*e))) == NULL ||
	    (e->auth = strdup(auth)) == NULL ||
	    (e->tenant = strdup(tenant)) == NULL) {
		if (e != NULL)
			free(e->auth);
		free(e);
		v = DEDUP_NOMEM;
		goto out;
	}
	c->n_bytes += strlen(auth) + strlen(tenant);
	e->request_id = request_id;
	e->method = method;
	e->created_ms = now;
	e->bucket_next = c->buckets[b];
	c->buckets[b] = e;
	e->older = c->newest;
	if (c->newest != NULL)
		c->newest->newer = e;
	else
		c->oldest = e;
	c->newest = e;
	c->n_entries++;
	*entry = e;
	v = DEDUP_NEW;
out:
	pthread_mutex_unlock(&c->lock);
	return v;
}

/* dedup_finish: stores a copy of the reply (or, when it is too large to
 * keep or NULL, forgets the entry, so that a repeat runs again only when
 * nothing was answered). Takes no ownership. */
static void
dedup_finish(struct dedup_cache *c, struct dedup_entry *e,
    const uint8_t *reply, size_t reply_len, uint8_t *too_large_reply,
    size_t too_large_len)
{
	uint8_t *copy = NULL;
	const uint8_t *keep = reply;
	size_t keep_len = reply_len;

	if (reply_len > DEDUP_MAX_REPLY) {
		keep = too_large_reply;
		keep_len = too_large_len;
	}
	if (keep != NULL && (copy = malloc(keep_len ? keep_len : 1)) != NULL)
		memcpy(copy, keep, keep_len);
	pthread_mutex_lock(&c->lock);
	if (copy == NULL) {
		dedup_unlink(c, e);
	} else {
		e->reply = copy;
		e->reply_len = keep_len;
		e->done = true;
		c->n_bytes += keep_len;
	}
	pthread_mutex_unlock(&c->lock);
}

static void
dedup_fini(struct dedup_cache *c)
{
	while (c->oldest != NULL)
		dedup_unlink(c, c->oldest);
	pthread_mutex_destroy(&c->lock);
}

/* ---- dispatch ---- */

int
rpc_encode_reply(uint64_t request_id, int code, const char *message,
    const uint8_t *payload, size_t payload_len, uint8_t **out, size_t *out_len)
{
	Moat__V1__Reply r = MOAT__V1__REPLY__INIT;
	uint8_t *buf;
	size_t n;

	r.request_id = request_id;
	r.code = (Moat__V1__Code)code;
	r.message = (char *)(message != NULL ? message : "");
	r.payload.data = (uint8_t *)payload;
	r.payload.len = payload_len;
	n = moat__v1__reply__get_packed_size(&r);
	if ((buf = malloc(n ? n : 1)) == NULL)
		return MOAT_INTERNAL;
	moat__v1__reply__pack(&r, buf);
	*out = buf;
	*out_len = n;
	return MOAT_OK;
}

/* A name from a peer goes into log lines and replies: it must be short
 * and printable, or it could forge lines or carry bytes that are not
 * text. */
static bool
name_ok(const char *s)
{
	size_t n = 0;

	for (; *s != '\0'; s++, n++)
		if (n >= RPC_MAX_NAME || *s <= ' ' || *s > '~')
			return false;
	return n > 0;
}

/* Length of the valid UTF-8 sequence at p (at most `left` bytes), or 0. */
static size_t
utf8_seq_len(const unsigned char *p, size_t left)
{
	unsigned char c = p[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xbf;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4;
	else
		return 0;
	if (c == 0xe0)
		lo = 0xa0;
	else if (c == 0xed)
		hi = 0x9f;
	else if (c == 0xf0)
		lo = 0x90;
	else if (c == 0xf4)
		hi = 0x8f;
	if (left < n || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return n;
}

/* A reply's message often quotes what a peer or a guest sent. It must
 * stay text that every client can decode (proto3 strings are UTF-8;
 * Python refuses anything else) and cannot forge terminal output, so
 * invalid UTF-8 and control characters other than newline and tab become
 * '?', and it is cut at RPC_MAX_REPLY_MESSAGE bytes. In place. */
void
rpc_sanitize_message(char *msg)
{
	unsigned char *p = (unsigned char *)msg;
	size_t len = strlen(msg), i = 0;

	while (i < len) {
		size_t n = utf8_seq_len(p + i, len - i);

		if (n == 0 ||
		    (n == 1 &&
		        ((p[i] < 0x20 && p[i] != '\n' && p[i] != '\t') ||
		            p[i] == 0x7f))) {
			p[i++] = '?';
			continue;
		}
		if (i + n > RPC_MAX_REPLY_MESSAGE - 4)
			break;
		i += n;
	}
	if (i < len)
		memcpy(p + i, "...", 4);
}

struct outcome {
	int code;
	char *message;    /* heap or NULL */
	uint8_t *payload; /* heap or NULL */
	size_t payload_len;
};

static int outcome_set(struct outcome *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
outcome_set(struct outcome *o, int code, const char *fmt, ...)
{
	va_list ap;

	free(o->message);
	o->message = NULL;
	va_start(ap, fmt);
	if (vasprintf(&o->message, fmt, ap) < 0)
		o->message = NULL;
	va_end(ap);
	o->code = code;
	return code;
}

/* Runs the handler of a validated call into *o. */
static void
run_handler(struct moat_rpc_server *srv, const struct moat_rpc_method *row,
    const ProtobufCMethodDescriptor *md, struct moat_rpc_call *call,
    const ProtobufCMessage *request, struct outcome *o)
{
	ProtobufCMessage *reply;
	int rv;

	if ((reply = malloc(md->output->sizeof_message)) == NULL) {
		outcome_set(o, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory for the reply of %s.%s: retry later",
		    call->service, call->method);
		return;
	}
	protobuf_c_message_init(md->output, reply);
	rv = row->handler(call, request, reply);
	if (rv < 0 || rv > MOAT_STATUS_MAX) {
		outcome_set(o, MOAT_INTERNAL,
		    "handler of %s.%s returned %d, which is not a status: "
		    "this is a bug in the service",
		    call->service, call->method, rv);
	} else if (rv != MOAT_OK) {
		o->code = rv;
		o->message = call->error_message;
		call->error_message = NULL;
	} else if (call->raw_reply != NULL || call->raw_reply_len != 0) {
		o->code = MOAT_OK;
		o->payload = call->raw_reply;
		o->payload_len = call->raw_reply_len;
		call->raw_reply = NULL;
		call->raw_reply_len = 0;
	} else {
		size_t n = protobuf_c_message_get_packed_size(reply);

		if ((o->payload = malloc(n ? n : 1)) == NULL) {
			outcome_set(o, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory encoding the reply of %s.%s",
			    call->service, call->method);
		} else {
			protobuf_c_message_pack(reply, o->payload);
			o->payload_len = n;
			o->code = MOAT_OK;
		}
	}
	if (o->payload_len > MOAT_RPC_MAX_MSG - 4096) {
		free(o->payload);
		o->payload = NULL;
		o->payload_len = 0;
		outcome_set(o, MOAT_RESOURCE_EXHAUSTED,
		    "the reply of %s.%s is larger than %u bytes: ask for less "
		    "(smaller ranges or limits)",
		    call->service, call->method, MOAT_RPC_MAX_MSG);
	}
	protobuf_c_message_free_unpacked(reply, NULL);
	free(call->raw_reply);
	call->raw_reply = NULL;
	(void)srv;
}

void
rpc_log_outcome(const struct moat_rpc_server *srv, uint64_t rid,
    const char *method, int code, const char *message, uint64_t started)
{
	uint64_t ms = moat_rpc_now_ms() - started;

	if (code == MOAT_OK)
		moat_debug(rid, "rpc %s.%s ok %llums",
		    srv->svc.descriptor->name, method, (unsigned long long)ms);
	else
		moat_info(rid, "rpc %s.%s failed %s %llums: %s",
		    srv->svc.descriptor->name, method, moat_strerror(code),
		    (unsigned long long)ms, message != NULL ? message : "");
}

/* How admit_mutating let a state-changing call through. */
enum admit {
	ADMIT_RUN,     /* new: run it, then keep its reply (*entry) */
	ADMIT_REPEAT,  /* already ran: *reply is the kept answer */
	ADMIT_REFUSED, /* o says why */
};

/* admit_mutating: a state-changing call needs a request id, and runs
 * once per id: a resend is answered from the dedup table. */
static enum admit
admit_mutating(struct moat_rpc_server *srv, const Moat__V1__Envelope *env,
    const ProtobufCMethodDescriptor *md, struct dedup_entry **entry,
    uint8_t **reply, size_t *reply_len, struct outcome *o)
{
	const ProtobufCServiceDescriptor *sd = srv->svc.descriptor;
	uint64_t rid = env->request_id;

	if (rid == 0) {
		outcome_set(o, MOAT_INVALID_ARGUMENT,
		    "%s.%s changes state and needs a request id: set "
		    "Envelope.request_id to a random non-zero number",
		    sd->name, md->name);
		return ADMIT_REFUSED;
	}
	switch (dedup_begin(&srv->dedup, rid, md->name,
	    env->auth != NULL ? env->auth : "",
	    env->tenant != NULL ? env->tenant : "", entry, reply, reply_len)) {
	case DEDUP_NEW:
		return ADMIT_RUN;
	case DEDUP_DONE:
		moat_debug(rid,
		    "rpc %s.%s repeat answered from "
		    "memory",
		    sd->name, md->name);
		return ADMIT_REPEAT;
	case DEDUP_RUNNING:
		outcome_set(o, MOAT_ABORTED,
		    "request %016llx is still running; do not resend",
		    (unsigned long long)rid);
		return ADMIT_REFUSED;
	case DEDUP_OTHER_CALL:
		outcome_set(o, MOAT_INVALID_ARGUMENT,
		    "request id %016llx was already used for another "
		    "call: use a fresh random id per call",
		    (unsigned long long)rid);
		return ADMIT_REFUSED;
	case DEDUP_FULL:
		outcome_set(o, MOAT_RESOURCE_EXHAUSTED,
		    "too many changes are running on %s: retry later",
		    sd->name);
		return ADMIT_REFUSED;
	case DEDUP_NOMEM:
		outcome_set(o, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory: retry later");
		return ADMIT_REFUSED;
	}
	return ADMIT_RUN;
}

/* call_handler: the call as the handler sees it, and the handler run.
 * Returns the deferred call when the handler deferred its reply (which
 * then owns origin->entry), else NULL with *o filled. */
static struct moat_rpc_deferred *
call_handler(struct moat_rpc_server *srv, const struct moat_rpc_method *row,
    const ProtobufCMethodDescriptor *md, const Moat__V1__Envelope *env,
    struct rpc_origin *origin, ProtobufCMessage *req_msg, struct outcome *o)
{
	struct moat_rpc_call call;

	memset(&call, 0, sizeof(call));
	call.service = srv->svc.descriptor->name;
	call.method = md->name;
	call.request_id = env->request_id;
	call.timeout_ms = env->timeout_ms;
	call.deadline_ms = origin->started_ms +
	    (env->timeout_ms != 0 ? env->timeout_ms :
	                            MOAT_RPC_DEFAULT_TIMEOUT_MS);
	call.auth = env->auth != NULL ? env->auth : "";
	call.tenant = env->tenant != NULL ? env->tenant : "";
	call.service_ctx = srv->svc.ctx;
	call.payload = env->payload.data;
	call.payload_len = env->payload.len;
	call.rpc_private = origin;
	run_handler(srv, row, md, &call, req_msg, o);
	free(call.error_message);
	if (call.deferred != NULL) {
		/* The handler's own answer does not count. */
		free(o->message);
		free(o->payload);
		memset(o, 0, sizeof(*o));
	}
	return call.deferred;
}

/* dedup_keep: the reply of a state-changing call (NULL when it could
 * not be encoded) is kept for resends; one too large to keep is
 * replaced, for resends, by an error that says so. */
void
rpc_dedup_keep(struct moat_rpc_server *srv, struct dedup_entry *entry,
    uint64_t rid, const uint8_t *reply, size_t reply_len)
{
	uint8_t *tl = NULL;
	size_t tl_len = 0;

	if (reply != NULL && reply_len > DEDUP_MAX_REPLY) {
		char *m = moat_asprintf(
		    "request %016llx already ran, "
		    "but its reply (%zu bytes) was too large to keep: "
		    "read the result back instead of resending",
		    (unsigned long long)rid, reply_len);

		if (m == NULL ||
		    rpc_encode_reply(rid, MOAT_ABORTED, m, NULL, 0, &tl,
		        &tl_len) != MOAT_OK)
			tl = NULL;
		free(m);
	}
	dedup_finish(&srv->dedup, entry, reply, reply_len, tl, tl_len);
	free(tl);
}

/* dispatch: moat_rpc_server_dispatch, except that a handler that defers
 * leaves *reply NULL and *deferred set (arm or wait for it). */
static int
dispatch(struct moat_rpc_server *srv, const uint8_t *request, size_t len,
    uint8_t **reply, size_t *reply_len, struct moat_rpc_deferred **deferred)
{
	const ProtobufCServiceDescriptor *sd = srv->svc.descriptor;
	const ProtobufCMethodDescriptor *md = NULL;
	const struct moat_rpc_method *row = NULL;
	Moat__V1__Envelope *env;
	ProtobufCMessage *req_msg = NULL;
	struct outcome o = { 0 };
	struct dedup_entry *entry = NULL;
	uint64_t rid = 0, started = moat_rpc_now_ms();
	struct rpc_origin origin = { .srv = srv, .started_ms = started };
	const char *method_for_log = "?";
	int rv;

	*reply = NULL;
	*reply_len = 0;
	*deferred = NULL;
	env = moat__v1__envelope__unpack(NULL, len, request);
	if (env == NULL) {
		outcome_set(&o, MOAT_INVALID_ARGUMENT,
		    "the request (%zu bytes) is not a moat.v1.Envelope: "
		    "send requests with a moat RPC client",
		    len);
		goto answer;
	}
	rid = env->request_id;
	if (!name_ok(env->service) || !name_ok(env->method)) {
		outcome_set(&o, MOAT_INVALID_ARGUMENT,
		    "the envelope's service or method name is empty, too "
		    "long or not printable: name a method of %s",
		    sd->name);
		goto answer;
	}
	method_for_log = env->method;
	if (strcmp(env->service, sd->name) != 0) {
		outcome_set(&o, MOAT_UNIMPLEMENTED,
		    "service %s is not served here (this address serves %s): "
		    "check the url",
		    env->service, sd->name);
		goto answer;
	}
	md = protobuf_c_service_descriptor_get_method_by_name(sd, env->method);
	if (md == NULL) {
		outcome_set(&o, MOAT_UNIMPLEMENTED,
		    "method %s is not a method of %s: is the client newer "
		    "than the server?",
		    env->method, sd->name);
		goto answer;
	}
	row = srv->rows[md - sd->methods];
	req_msg = protobuf_c_message_unpack(md->input, NULL, env->payload.len,
	    env->payload.data);
	if (req_msg == NULL) {
		outcome_set(&o, MOAT_INVALID_ARGUMENT,
		    "malformed %s payload (%zu bytes) for %s.%s: encode the "
		    "request with the method's input message",
		    md->input->name, env->payload.len, sd->name, md->name);
		goto answer;
	}
	if (row->needs_auth && (env->auth == NULL || env->auth[0] == '\0')) {
		outcome_set(&o, MOAT_UNAUTHENTICATED,
		    "%s.%s needs credentials: send an API key with the call",
		    sd->name, md->name);
		goto answer;
	}
	if (row->mutating) {
		switch (admit_mutating(srv, env, md, &entry, reply, reply_len,
		    &o)) {
		case ADMIT_RUN:
			break;
		case ADMIT_REPEAT:
			goto done;
		case ADMIT_REFUSED:
			goto answer;
		}
	}
	origin.entry = entry;
	*deferred = call_handler(srv, row, md, env, &origin, req_msg, &o);
	if (*deferred != NULL)
		goto done; /* the entry went with it */

answer:
	if (o.code != MOAT_OK && o.message == NULL)
		o.message = strdup(moat_strerror(o.code));
	if (o.message != NULL)
		rpc_sanitize_message(o.message);
	rpc_log_outcome(srv, rid, method_for_log, o.code, o.message, started);
	rv = rpc_encode_reply(rid, o.code, o.message, o.payload, o.payload_len,
	    reply, reply_len);
	if (entry != NULL)
		rpc_dedup_keep(srv, entry, rid, rv == MOAT_OK ? *reply : NULL,
		    *reply_len);
done:
	free(o.message);
	free(o.payload);
	if (req_msg != NULL)
		protobuf_c_message_free_unpacked(req_msg, NULL);
	moat__v1__envelope__free_unpacked(env, NULL);
	return *reply != NULL || *deferred != NULL ? MOAT_OK : MOAT_INTERNAL;
}

int
moat_rpc_server_dispatch(struct moat_rpc_server *srv, const uint8_t *request,
    size_t len, uint8_t **reply, size_t *reply_len)
{
	struct moat_rpc_deferred *d = NULL;
	int rv;

	rv = dispatch(srv, request, len, reply, reply_len, &d);
	if (rv == MOAT_OK && d != NULL)
		rv = rpc_defer_wait(d, reply, reply_len);
	return rv;
}

int
moat_rpc_server_dispatch_async(struct moat_rpc_server *srv,
    const uint8_t *request, size_t len, moat_rpc_dispatch_done done, void *arg)
{
	struct moat_rpc_deferred *d = NULL;
	uint8_t *reply = NULL;
	size_t reply_len = 0;

	if (dispatch(srv, request, len, &reply, &reply_len, &d) != MOAT_OK)
		return MOAT_INTERNAL;
	if (d != NULL)
		rpc_defer_arm_async(d, done, arg);
	else
		done(arg, reply, reply_len);
	return 0;
}

/* ---- lifecycle ---- */

static int
check_table(struct moat_rpc_server *srv, char **errmsg)
{
	const ProtobufCServiceDescriptor *sd = srv->svc.descriptor;
	const struct moat_rpc_service *svc = &srv->svc;

	for (size_t r = 0; r < svc->n_methods; r++) {
		const struct moat_rpc_method *row = &svc->methods[r];

		if (row->name == NULL || row->handler == NULL ||
		    protobuf_c_service_descriptor_get_method_by_name(sd,
		        row->name) == NULL) {
			*errmsg = moat_asprintf(
			    "programmer error: row %zu of "
			    "the %s method table names %s, which is not a "
			    "method of the service or has no handler",
			    r, sd->name, row->name ? row->name : "nothing");
			return MOAT_INTERNAL;
		}
	}
	for (unsigned i = 0; i < sd->n_methods; i++) {
		const char *name = sd->methods[i].name;

		for (size_t r = 0; r < svc->n_methods; r++) {
			if (strcmp(svc->methods[r].name, name) != 0)
				continue;
			if (srv->rows[i] != NULL) {
				*errmsg = moat_asprintf(
				    "programmer error: "
				    "%s.%s has two rows in the method table",
				    sd->name, name);
				return MOAT_INTERNAL;
			}
			srv->rows[i] = &svc->methods[r];
		}
		if (srv->rows[i] == NULL) {
			*errmsg = moat_asprintf("programmer error: %s.%s has "
			                        "no row in the method table",
			    sd->name, name);
			return MOAT_INTERNAL;
		}
	}
	return MOAT_OK;
}

int
moat_rpc_server_new_detached(struct moat_rpc_server **out,
    const struct moat_rpc_service *svc, char **errmsg)
{
	struct moat_rpc_server *srv;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if (svc == NULL || svc->descriptor == NULL ||
	    (svc->methods == NULL && svc->n_methods != 0)) {
		*errmsg = moat_asprintf("programmer error: no service "
		                        "descriptor or method table given");
		return MOAT_INTERNAL;
	}
	if ((srv = calloc(1, sizeof(*srv))) == NULL)
		goto fail_nomem;
	srv->svc = *svc;
	srv->rows = calloc(svc->descriptor->n_methods + 1, sizeof(*srv->rows));
	if (srv->rows == NULL)
		goto fail_nomem;
	if ((rv = check_table(srv, errmsg)) != MOAT_OK)
		goto fail;
	if (pthread_mutex_init(&srv->dedup.lock, NULL) != 0)
		goto fail_nomem;
	srv->dedup_inited = true;
	if (!rpc_defer_init(&srv->defer))
		goto fail_nomem;
	atomic_init(&srv->stopping, false);
	*out = srv;
	return MOAT_OK;

fail_nomem:
	*errmsg = moat_asprintf("out of memory starting the %s server",
	    svc->descriptor->name);
	rv = MOAT_RESOURCE_EXHAUSTED;
fail:
	moat_rpc_server_stop(srv);
	return rv;
}

/* Starts a receive or a send on the worker's context, unless the server
 * is stopping. */
static bool
worker_submit(struct worker *w, bool send)
{
	bool ok;

	pthread_mutex_lock(&w->lock);
	ok = !atomic_load(&w->srv->stopping);
	if (ok && send)
		nng_ctx_send(w->ctx, w->send_aio);
	else if (ok)
		nng_ctx_recv(w->ctx, w->aio);
	pthread_mutex_unlock(&w->lock);
	return ok;
}

static bool
server_stopping(struct moat_rpc_server *srv)
{
	return atomic_load(&srv->stopping);
}

/* send_finish: waits for the worker's last send; a reply that could not
 * be sent (the client went away, the server stops) is freed here. */
static void
send_finish(struct worker *w)
{
	if (!w->send_pending)
		return;
	nng_aio_wait(w->send_aio);
	if (nng_aio_result(w->send_aio) != 0) {
		nng_msg_free(nng_aio_get_msg(w->send_aio));
		nng_aio_set_msg(w->send_aio, NULL);
	}
	w->send_pending = false;
}

/* worker_hand_over: the request's context goes with deferred call `d`
 * and the worker takes a new one, so it serves the next call while `d`
 * waits. False when no new context could be had (the worker then waits
 * for `d` itself). */
static bool
worker_hand_over(struct worker *w, struct moat_rpc_deferred *d)
{
	nng_ctx fresh;
	bool stopping;
	int nrv = 0;

	/* The last reply's send runs on this context: it must be done
	 * before the replier sends on it. */
	send_finish(w);
	pthread_mutex_lock(&w->lock);
	stopping = atomic_load(&w->srv->stopping);
	if (!stopping)
		nrv = nng_ctx_open(&fresh, w->srv->sock);
	pthread_mutex_unlock(&w->lock);
	if (stopping) {
		/* The socket's close closes the context: nothing to send. */
		rpc_defer_arm(d, w->ctx, false);
		return true;
	}
	if (nrv != 0) {
		moat_warn(0,
		    "rpc %s: cannot open a context for the next call "
		    "(%s): this worker waits for its deferred call",
		    w->srv->url, nng_strerror(nrv));
		return false;
	}
	rpc_defer_arm(d, w->ctx, true);
	w->ctx = fresh;
	return true;
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	struct moat_rpc_deferred *d;
	nng_msg *msg;
	uint8_t *reply;
	size_t reply_len;
	int rv;

	for (;;) {
		if (!worker_submit(w, false))
			break;
		nng_aio_wait(w->aio);
		if ((rv = nng_aio_result(w->aio)) != 0) {
			if (rv == NNG_ECLOSED || server_stopping(w->srv))
				break;
			moat_warn(0, "rpc %s: receive failed: %s", w->srv->url,
			    nng_strerror(rv));
			continue;
		}
		msg = nng_aio_get_msg(w->aio);
		nng_aio_set_msg(w->aio, NULL);
		if (server_stopping(w->srv)) {
			nng_msg_free(msg);
			break;
		}
		rv = dispatch(w->srv, nng_msg_body(msg), nng_msg_len(msg),
		    &reply, &reply_len, &d);
		if (rv == MOAT_OK && d != NULL) {
			if (worker_hand_over(w, d)) {
				nng_msg_free(msg);
				continue;
			}
			/* No context to go on with: answer here. */
			rv = rpc_defer_wait(d, &reply, &reply_len);
		}
		if (rv != MOAT_OK) {
			/* Out of memory: the client's deadline answers. */
			nng_msg_free(msg);
			continue;
		}
		nng_msg_clear(msg);
		rv = nng_msg_append(msg, reply, reply_len);
		free(reply);
		if (rv != 0) {
			nng_msg_free(msg);
			continue;
		}
		/* rep0 has put the previous reply's header on it when the
		 * send started, so it does not mix with the request just
		 * received; the aio itself must be free again. */
		send_finish(w);
		nng_aio_set_msg(w->send_aio, msg);
		if (!worker_submit(w, true)) {
			nng_aio_set_msg(w->send_aio, NULL);
			nng_msg_free(msg);
			break;
		}
		w->send_pending = true;
	}
	send_finish(w);
	return NULL;
}

/* server_start: moat_rpc_server_start, with TLS on the listener when
 * tls is not NULL (the listener takes its own hold). */
static int
server_start(struct moat_rpc_server **out, const char *url,
    const struct moat_rpc_service *svc, int workers, nng_tls_config *tls,
    char **errmsg)
{
	struct moat_rpc_server *srv = NULL;
	nng_listener l;
	int rv, nrv;

	*out = NULL;
	*errmsg = NULL;
	if (workers <= 0)
		workers = MOAT_RPC_DEFAULT_WORKERS;
	if (workers > RPC_MAX_WORKERS)
		workers = RPC_MAX_WORKERS; /* a thread each */
	if ((rv = moat_rpc_server_new_detached(&srv, svc, errmsg)) != 0)
		return rv;
	if ((srv->url = strdup(url)) == NULL)
		goto fail_nomem;
	if ((nrv = nng_rep0_open(&srv->sock)) != 0)
		goto fail_nng;
	srv->has_socket = true;
	if ((nrv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ,
	         MOAT_RPC_MAX_MSG)) != 0)
		goto fail_nng;
	if ((nrv = nng_listener_create(&l, srv->sock, url)) != 0)
		goto fail_nng;
	if (tls != NULL &&
	    (nrv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, tls)) != 0)
		goto fail_nng;
	if (strncmp(url, "ipc://", 6) == 0 &&
	    (nrv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0600)) !=
	        0)
		goto fail_nng;
	if ((nrv = nng_listener_start(l, 0)) != 0)
		goto fail_nng;
	if ((srv->workers = calloc((size_t)workers, sizeof(*srv->workers))) ==
	    NULL)
		goto fail_nomem;
	for (int i = 0; i < workers; i++) {
		struct worker *w = &srv->workers[i];

		w->srv = srv;
		if (pthread_mutex_init(&w->lock, NULL) != 0)
			goto fail_nomem;
		w->lock_inited = true;
		/* From here stop undoes what this worker has. */
		srv->n_workers = i + 1;
		if ((nrv = nng_ctx_open(&w->ctx, srv->sock)) != 0)
			goto fail_nng;
		if ((nrv = nng_aio_alloc(&w->aio, NULL, NULL)) != 0 ||
		    (nrv = nng_aio_alloc(&w->send_aio, NULL, NULL)) != 0)
			goto fail_nng;
		if ((rv = pthread_create(&w->thread, NULL, worker_main, w)) !=
		    0) {
			*errmsg = moat_asprintf("cannot start worker threads "
			                        "for %s: %s",
			    url, strerror(rv));
			rv = MOAT_RESOURCE_EXHAUSTED;
			goto fail;
		}
		w->thread_started = true;
	}
	if ((rv = rpc_defer_start_replier(srv)) != MOAT_OK) {
		*errmsg =
		    moat_asprintf("cannot start the reply thread for %s", url);
		goto fail;
	}
	moat_info(0, "rpc serving %s on %s with %d workers",
	    svc->descriptor->name, url, workers);
	*out = srv;
	return MOAT_OK;

fail_nng:
	rv = moat_status_from_nng(nrv);
	if (nrv == NNG_EADDRINUSE) {
		rv = MOAT_UNAVAILABLE;
		*errmsg =
		    moat_asprintf("cannot listen on %s: address in use: "
		                  "is another copy of this service running?",
		        url);
	} else if (nrv == NNG_EADDRINVAL || nrv == NNG_ENOTSUP) {
		rv = MOAT_INVALID_ARGUMENT;
		*errmsg = moat_asprintf(
		    "cannot listen on %s: %s: use "
		    "ipc://PATH, tcp://HOST:PORT or tls+tcp://HOST:PORT",
		    url, nng_strerror(nrv));
	} else {
		*errmsg = moat_asprintf(
		    "cannot listen on %s: %s: check the "
		    "address and that its directory exists and is writable",
		    url, nng_strerror(nrv));
	}
	goto fail;
fail_nomem:
	rv = MOAT_RESOURCE_EXHAUSTED;
	*errmsg =
	    moat_asprintf("out of memory starting the server on %s", url);
fail:
	moat_rpc_server_stop(srv);
	return rv;
}

int
moat_rpc_server_start(struct moat_rpc_server **out, const char *url,
    const struct moat_rpc_service *svc, int workers, char **errmsg)
{
	return server_start(out, url, svc, workers, NULL, errmsg);
}

int
moat_rpc_server_start_opts(struct moat_rpc_server **out, const char *url,
    const struct moat_rpc_service *svc, const struct moat_rpc_server_opts *o,
    char **errmsg)
{
	const char *what = o->what != NULL ? o->what : "the RPC listener";
	nng_tls_config *tls = NULL;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if ((rv = moat_tls_check_url(o->tls, url, true, o->peer, what,
	         errmsg)) != MOAT_OK)
		return rv;
	if (moat_tls_url_is_tls(url) &&
	    (rv = moat_tls_server_config(o->tls, o->peer, &tls, errmsg)) !=
	        MOAT_OK)
		return rv;
	rv = server_start(out, url, svc, o->workers, tls, errmsg);
	if (tls != NULL)
		nng_tls_config_free(tls);
	return rv;
}

void
moat_rpc_server_stop(struct moat_rpc_server *srv)
{
	if (srv == NULL)
		return;
	/* No worker starts an operation once stopping is set and its lock
	 * has been taken once after (an operation that was starting has
	 * started); cancelling wakes those waiting, and a worker inside a
	 * handler finishes it and drops its reply. Only then is the socket
	 * closed. */
	atomic_store(&srv->stopping, true);
	for (int i = 0; i < srv->n_workers; i++) {
		struct worker *w = &srv->workers[i];

		if (w->lock_inited) {
			pthread_mutex_lock(&w->lock);
			pthread_mutex_unlock(&w->lock);
		}
		if (w->aio != NULL)
			nng_aio_cancel(w->aio);
		if (w->send_aio != NULL)
			nng_aio_cancel(w->send_aio);
	}
	for (int i = 0; i < srv->n_workers; i++)
		if (srv->workers[i].thread_started)
			pthread_join(srv->workers[i].thread, NULL);
	/* The replier starts sends too: it stops before the close. */
	if (srv->defer.inited)
		rpc_defer_stop_replier(srv);
	if (srv->has_socket)
		nng_close(srv->sock);
	srv->has_socket = false;
	for (int i = 0; i < srv->n_workers; i++) {
		struct worker *w = &srv->workers[i];

		if (w->aio != NULL)
			nng_aio_free(w->aio);
		if (w->send_aio != NULL)
			nng_aio_free(w->send_aio);
		if (w->lock_inited)
			pthread_mutex_destroy(&w->lock);
	}
	free(srv->workers);
	srv->workers = NULL;
	srv->n_workers = 0;
	/* Deferred calls not yet completed keep the rest (their
	 * completion needs the dedup memory); the last one frees it. */
	if (!srv->defer.inited || rpc_defer_release(srv))
		rpc_server_free(srv);
}

void
rpc_server_free(struct moat_rpc_server *srv)
{
	if (srv->defer.inited)
		rpc_defer_fini(&srv->defer);
	if (srv->dedup_inited)
		dedup_fini(&srv->dedup);
	free(srv->rows);
	free(srv->url);
	free(srv);
}
