/*
 * rpc_defer.c: calls whose reply a handler sends later (moat_rpc_defer),
 * so that a long exec holds no worker. A deferred call takes its
 * request's nng context away from the worker (which opens a new one and
 * serves on); moat_rpc_complete, from any thread, encodes the reply,
 * keeps it for repeats of a mutating call and hands it to the server's
 * replier thread, which alone starts the sends on those contexts and
 * closes them (so no nng operation starts while the socket closes, and
 * a completer never waits on the network). The replier also answers
 * DEADLINE_EXCEEDED for a call whose completion did not come by its
 * deadline. A call dispatched without a socket (the gateway's HTTP door)
 * is waited for by its own thread instead, or, dispatched asynchronously
 * (the gRPC door), handed to its done callback by the completer. Not for: dispatching
 * (rpc_server.c) or the client side (rpc_client.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nng/nng.h>

#include "common.pb-c.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "rpc_server_internal.h"

struct moat_rpc_deferred {
	struct moat_rpc_server *srv;
	struct moat_rpc_deferred *next, *prev; /* in srv->defer.head */
	struct moat_rpc_deferred *job_next;    /* the replier's own */
	uint64_t request_id;
	const char *method; /* the descriptor's: static */
	uint64_t started_ms;
	uint64_t deadline_ms;
	struct dedup_entry *entry; /* mutating calls; NULL else */
	nng_ctx ctx;
	nng_aio *send_aio; /* completes into deferred_sent */
	uint8_t *send_buf; /* what the replier sends next (its own) */
	size_t send_len;
	/* Guarded by srv->defer.lock: */
	bool armed;     /* the handler returned */
	bool has_ctx;   /* ctx is open and this call's */
	bool waiter;    /* a thread waits for the reply (no ctx) */
	bool completed; /* moat_rpc_complete ran; reply holds it */
	bool answered;  /* a reply went to the transport or the waiter */
	bool sending;   /* send_aio started, not yet reaped */
	bool sent;      /* send_aio's callback ran */
	uint8_t *reply; /* the encoded Reply, until sent */
	size_t reply_len;
	int code;                    /* the completion's */
	moat_rpc_complete_hook hook; /* moat_rpc_deferred_on_complete */
	void *hook_arg;
	moat_rpc_dispatch_done async_done; /* rpc_defer_arm_async */
	void *async_arg;
};

bool
rpc_defer_init(struct rpc_defer_table *t)
{
	pthread_condattr_t ca;
	bool ok;

	memset(t, 0, sizeof(*t));
	if (pthread_condattr_init(&ca) != 0)
		return false;
	ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
	if (ok && pthread_mutex_init(&t->lock, NULL) != 0)
		ok = false;
	if (ok && pthread_cond_init(&t->replier_cv, &ca) != 0) {
		pthread_mutex_destroy(&t->lock);
		ok = false;
	}
	if (ok && pthread_cond_init(&t->waiter_cv, &ca) != 0) {
		pthread_cond_destroy(&t->replier_cv);
		pthread_mutex_destroy(&t->lock);
		ok = false;
	}
	pthread_condattr_destroy(&ca);
	t->inited = ok;
	return ok;
}

static void
deferred_free(struct moat_rpc_deferred *d)
{
	free(d->reply);
	free(d->send_buf);
	free(d);
}

/* Unlinks d from its table. Lock held. */
static void
deferred_unlink(struct rpc_defer_table *t, struct moat_rpc_deferred *d)
{
	if (d->prev != NULL)
		d->prev->next = d->next;
	else
		t->head = d->next;
	if (d->next != NULL)
		d->next->prev = d->prev;
	t->n--;
}

/* Whether nothing is left to do for d: answered, completed, its send
 * reaped and its context closed, nobody waiting. Lock held. */
static bool
deferred_finished(const struct moat_rpc_deferred *d)
{
	return d->completed && d->answered && !d->sending && !d->has_ctx &&
	    !d->waiter;
}

void
rpc_defer_fini(struct rpc_defer_table *t)
{
	struct moat_rpc_deferred *d, *next;

	for (d = t->head; d != NULL; d = next) {
		next = d->next;
		deferred_free(d);
	}
	t->head = NULL;
	pthread_cond_destroy(&t->waiter_cv);
	pthread_cond_destroy(&t->replier_cv);
	pthread_mutex_destroy(&t->lock);
	t->inited = false;
}

struct moat_rpc_deferred *
moat_rpc_defer(struct moat_rpc_call *call)
{
	struct rpc_origin *o = call->rpc_private;
	struct moat_rpc_deferred *d;
	struct rpc_defer_table *t;

	if (o == NULL || call->deferred != NULL || !o->srv->defer.inited)
		return NULL;
	t = &o->srv->defer;
	if ((d = calloc(1, sizeof(*d))) == NULL)
		return NULL;
	d->srv = o->srv;
	d->request_id = call->request_id;
	d->method = call->method;
	d->started_ms = o->started_ms;
	d->deadline_ms = call->deadline_ms;
	pthread_mutex_lock(&t->lock);
	if (t->n >= MOAT_RPC_MAX_DEFERRED || t->stopped) {
		pthread_mutex_unlock(&t->lock);
		free(d);
		return NULL;
	}
	d->next = t->head;
	if (t->head != NULL)
		t->head->prev = d;
	t->head = d;
	t->n++;
	pthread_mutex_unlock(&t->lock);
	d->entry = o->entry;
	o->entry = NULL;
	call->deferred = d;
	return d;
}

void
rpc_defer_arm(struct moat_rpc_deferred *d, nng_ctx ctx, bool has_ctx)
{
	struct rpc_defer_table *t = &d->srv->defer;

	pthread_mutex_lock(&t->lock);
	d->ctx = ctx;
	d->has_ctx = has_ctx;
	d->armed = true;
	if (!has_ctx)
		d->answered = true; /* nobody to answer */
	if (deferred_finished(d)) {
		deferred_unlink(t, d);
		deferred_free(d);
	} else {
		pthread_cond_signal(&t->replier_cv);
	}
	pthread_mutex_unlock(&t->lock);
}

/* encode_outcome: the Reply of a completion (or of a deadline) into
 * *buf, logged. Takes `payload`. */
static void
encode_outcome(struct moat_rpc_deferred *d, int code, uint8_t *payload,
    size_t len, const char *message, uint8_t **buf, size_t *buf_len)
{
	const char *svc = d->srv->svc.descriptor->name;
	char *msg = NULL;

	*buf = NULL;
	*buf_len = 0;
	if (code < 0 || code > MOAT_STATUS_MAX) {
		msg = moat_asprintf("the deferred reply of %s.%s has code %d, "
		                    "which is not a status: this is a bug in "
		                    "the service",
		    svc, d->method, code);
		code = MOAT_INTERNAL;
	} else if (code == MOAT_OK && len > MOAT_RPC_MAX_MSG - 4096) {
		msg = moat_asprintf("the reply of %s.%s is larger than %u "
		                    "bytes: ask for less (smaller ranges or "
		                    "limits)",
		    svc, d->method, MOAT_RPC_MAX_MSG);
		code = MOAT_RESOURCE_EXHAUSTED;
	} else if (code != MOAT_OK) {
		msg = strdup(message != NULL ? message : moat_strerror(code));
	}
	if (code != MOAT_OK) {
		free(payload);
		payload = NULL;
		len = 0;
	}
	if (msg != NULL)
		rpc_sanitize_message(msg);
	rpc_log_outcome(d->srv, d->request_id, d->method, code, msg,
	    d->started_ms);
	if (rpc_encode_reply(d->request_id, code, msg, payload, len, buf,
	        buf_len) != MOAT_OK) {
		*buf = NULL;
		*buf_len = 0;
	}
	free(msg);
	free(payload);
}

void
moat_rpc_complete_raw(struct moat_rpc_deferred *d, int code, uint8_t *payload,
    size_t len, const char *message)
{
	struct moat_rpc_server *srv = d->srv;
	struct rpc_defer_table *t = &srv->defer;
	uint8_t *buf;
	size_t buf_len;
	bool free_srv = false;
	moat_rpc_complete_hook hook;
	void *hook_arg;
	moat_rpc_dispatch_done done = NULL;
	void *done_arg = NULL;
	uint8_t *out = NULL;
	size_t out_len = 0;

	encode_outcome(d, code, payload, len, message, &buf, &buf_len);
	if (d->entry != NULL)
		rpc_dedup_keep(srv, d->entry, d->request_id, buf, buf_len);
	pthread_mutex_lock(&t->lock);
	hook = d->hook;
	hook_arg = d->hook_arg;
	d->hook = NULL;
	d->code = code < 0 || code > MOAT_STATUS_MAX ? MOAT_INTERNAL : code;
	code = d->code;
	d->completed = true;
	d->reply = buf;
	d->reply_len = buf_len;
	if (d->async_done != NULL) {
		/* Dispatched asynchronously: the reply is done's, even when
		 * the server stopped meanwhile. */
		done = d->async_done;
		done_arg = d->async_arg;
		d->async_done = NULL;
		out = d->reply;
		out_len = d->reply_len;
		d->reply = NULL;
		d->answered = true;
	}
	if (t->stopped) {
		/* No socket any more: the server waited only for this. */
		d->answered = true;
		d->has_ctx = false;
		d->sending = false;
	}
	if (deferred_finished(d)) {
		deferred_unlink(t, d);
		deferred_free(d);
		free_srv = t->stopped && t->n == 0;
	} else if (d->waiter) {
		pthread_cond_broadcast(&t->waiter_cv);
	} else {
		pthread_cond_signal(&t->replier_cv);
	}
	pthread_mutex_unlock(&t->lock);
	if (hook != NULL)
		hook(hook_arg, code);
	if (done != NULL)
		done(done_arg, out, out_len);
	if (free_srv)
		rpc_server_free(srv);
}

void
rpc_defer_arm_async(struct moat_rpc_deferred *d, moat_rpc_dispatch_done done,
    void *arg)
{
	struct moat_rpc_server *srv = d->srv;
	struct rpc_defer_table *t = &srv->defer;
	uint8_t *out = NULL;
	size_t out_len = 0;
	bool now, free_srv = false;

	pthread_mutex_lock(&t->lock);
	d->armed = true;
	now = d->completed;
	if (now) {
		/* Completed before its handler returned: answer here. */
		out = d->reply;
		out_len = d->reply_len;
		d->reply = NULL;
		d->answered = true;
		if (deferred_finished(d)) {
			deferred_unlink(t, d);
			deferred_free(d);
			free_srv = t->stopped && t->n == 0;
		}
	} else {
		d->async_done = done;
		d->async_arg = arg;
	}
	pthread_mutex_unlock(&t->lock);
	if (now)
		done(arg, out, out_len);
	if (free_srv)
		rpc_server_free(srv);
}

void
moat_rpc_deferred_on_complete(struct moat_rpc_deferred *d,
    moat_rpc_complete_hook fn, void *arg)
{
	struct rpc_defer_table *t = &d->srv->defer;
	bool now;
	int code;

	pthread_mutex_lock(&t->lock);
	now = d->completed;
	code = d->code;
	if (!now) {
		d->hook = fn;
		d->hook_arg = arg;
	}
	pthread_mutex_unlock(&t->lock);
	if (now)
		fn(arg, code);
}

void
moat_rpc_complete(struct moat_rpc_deferred *d, int code,
    const ProtobufCMessage *reply, const char *message)
{
	uint8_t *payload = NULL;
	size_t len = 0;

	if (code == MOAT_OK && reply != NULL) {
		len = protobuf_c_message_get_packed_size(reply);
		if ((payload = malloc(len ? len : 1)) == NULL) {
			moat_rpc_complete_raw(d, MOAT_RESOURCE_EXHAUSTED, NULL,
			    0,
			    "out of memory encoding the reply: retry later");
			return;
		}
		protobuf_c_message_pack(reply, payload);
	}
	moat_rpc_complete_raw(d, code, payload, len, message);
}

/* The deadline's answer for d. Heap, or NULL when out of memory. */
static void
deadline_reply(struct moat_rpc_deferred *d, uint8_t **buf, size_t *len)
{
	char *msg = moat_asprintf(
	    "%s.%s did not finish within its deadline (%llu ms): it may "
	    "still be running; check its result before retrying, or allow "
	    "a longer timeout",
	    d->srv->svc.descriptor->name, d->method,
	    (unsigned long long)(d->deadline_ms - d->started_ms));

	encode_outcome(d, MOAT_DEADLINE_EXCEEDED, NULL, 0, msg, buf, len);
	free(msg);
}

int
rpc_defer_wait(struct moat_rpc_deferred *d, uint8_t **reply, size_t *reply_len)
{
	struct rpc_defer_table *t = &d->srv->defer;
	struct timespec until;
	uint8_t *late = NULL;
	size_t late_len = 0;

	*reply = NULL;
	*reply_len = 0;
	until.tv_sec = (time_t)(d->deadline_ms / 1000);
	until.tv_nsec = (long)(d->deadline_ms % 1000) * 1000000L;
	pthread_mutex_lock(&t->lock);
	d->armed = true;
	d->waiter = true;
	while (!d->completed && moat_rpc_now_ms() < d->deadline_ms)
		if (pthread_cond_timedwait(&t->waiter_cv, &t->lock, &until) ==
		    ETIMEDOUT)
			break;
	if (!d->completed) {
		/* d stays while waiter is set: nobody else frees it. */
		pthread_mutex_unlock(&t->lock);
		deadline_reply(d, &late, &late_len);
		pthread_mutex_lock(&t->lock);
	}
	d->waiter = false;
	d->answered = true;
	if (d->completed) {
		/* Also when it came while the deadline's answer was made. */
		free(late);
		*reply = d->reply;
		*reply_len = d->reply_len;
		d->reply = NULL;
		deferred_unlink(t, d);
		deferred_free(d);
	} else {
		/* The completion, when it comes, frees d. */
		*reply = late;
		*reply_len = late_len;
	}
	pthread_mutex_unlock(&t->lock);
	return *reply != NULL ? MOAT_OK : MOAT_INTERNAL;
}

/* ---- the replier ---- */

/* Runs on an nng thread when a deferred reply's send ends. */
static void
deferred_sent(void *arg)
{
	struct moat_rpc_deferred *d = arg;
	struct rpc_defer_table *t = &d->srv->defer;

	if (nng_aio_result(d->send_aio) != 0) {
		/* The client went away or the socket closed. */
		nng_msg_free(nng_aio_get_msg(d->send_aio));
		nng_aio_set_msg(d->send_aio, NULL);
	}
	pthread_mutex_lock(&t->lock);
	d->sent = true;
	pthread_cond_signal(&t->replier_cv);
	pthread_mutex_unlock(&t->lock);
}

/* Starts d's send of d->send_buf (taken); outside the lock. */
static void
send_start(struct moat_rpc_deferred *d)
{
	struct rpc_defer_table *t = &d->srv->defer;
	nng_msg *msg = NULL;
	int nrv;

	if (d->send_buf == NULL) {
		nrv = NNG_ENOMEM;
		goto fail;
	}
	if ((nrv = nng_msg_alloc(&msg, 0)) != 0 ||
	    (nrv = nng_msg_append(msg, d->send_buf, d->send_len)) != 0)
		goto fail;
	free(d->send_buf);
	d->send_buf = NULL;
	if (d->send_aio == NULL &&
	    (nrv = nng_aio_alloc(&d->send_aio, deferred_sent, d)) != 0)
		goto fail;
	nng_aio_set_msg(d->send_aio, msg);
	nng_ctx_send(d->ctx, d->send_aio);
	return;
fail:
	moat_warn(d->request_id,
	    "rpc %s.%s: the deferred reply was not sent: "
	    "%s; the caller's deadline answers it",
	    d->srv->svc.descriptor->name, d->method, nng_strerror(nrv));
	if (msg != NULL)
		nng_msg_free(msg);
	free(d->send_buf);
	d->send_buf = NULL;
	pthread_mutex_lock(&t->lock);
	d->sent = true;
	pthread_mutex_unlock(&t->lock);
}

/* Closes d's context after its send; outside the lock. */
static void
send_reap(struct moat_rpc_deferred *d)
{
	if (d->send_aio != NULL) {
		nng_aio_free(d->send_aio);
		d->send_aio = NULL;
	}
	nng_ctx_close(d->ctx);
}

/* Picks the replier's work under the lock: sends to start (*to_send)
 * and sends to reap (*to_reap); frees what is finished. Returns the
 * earliest deadline still to watch (UINT64_MAX: none). */
static uint64_t
replier_pick(struct rpc_defer_table *t, struct moat_rpc_deferred **to_send,
    struct moat_rpc_deferred **to_reap, struct moat_rpc_deferred **expired)
{
	struct moat_rpc_deferred *d, *next;
	uint64_t now = moat_rpc_now_ms(), wake = UINT64_MAX;

	for (d = t->head; d != NULL; d = next) {
		next = d->next;
		if (d->sending && d->sent) {
			d->job_next = *to_reap;
			*to_reap = d;
			continue;
		}
		if (d->sending || !d->armed || d->waiter || d->answered) {
			if (deferred_finished(d)) {
				deferred_unlink(t, d);
				deferred_free(d);
			}
			continue;
		}
		if (d->completed) {
			d->send_buf = d->reply;
			d->send_len = d->reply_len;
			d->reply = NULL;
		} else if (now < d->deadline_ms) {
			if (d->deadline_ms < wake)
				wake = d->deadline_ms;
			continue;
		} else {
			d->job_next = *expired;
			*expired = d;
		}
		d->answered = true;
		d->sending = true;
		d->sent = false;
		d->job_next = *to_send;
		*to_send = d;
	}
	return wake;
}

static void *
replier_main(void *arg)
{
	struct moat_rpc_server *srv = arg;
	struct rpc_defer_table *t = &srv->defer;

	pthread_mutex_lock(&t->lock);
	while (!t->replier_stop) {
		struct moat_rpc_deferred *to_send = NULL, *to_reap = NULL;
		struct moat_rpc_deferred *expired = NULL, *d;
		uint64_t wake = replier_pick(t, &to_send, &to_reap, &expired);
		struct timespec until;

		if (to_send == NULL && to_reap == NULL) {
			if (wake == UINT64_MAX) {
				pthread_cond_wait(&t->replier_cv, &t->lock);
				continue;
			}
			until.tv_sec = (time_t)(wake / 1000);
			until.tv_nsec = (long)(wake % 1000) * 1000000L;
			pthread_cond_timedwait(&t->replier_cv, &t->lock,
			    &until);
			continue;
		}
		/* An expired call's d stays while the lock is dropped: only
		 * this thread frees a d that is sending. */
		pthread_mutex_unlock(&t->lock);
		for (d = expired; d != NULL; d = d->job_next)
			deadline_reply(d, &d->send_buf, &d->send_len);
		for (d = to_send; d != NULL; d = d->job_next)
			send_start(d);
		for (d = to_reap; d != NULL; d = d->job_next)
			send_reap(d);
		pthread_mutex_lock(&t->lock);
		for (d = to_reap; d != NULL; d = d->job_next) {
			d->sending = false;
			d->has_ctx = false;
		}
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

int
rpc_defer_start_replier(struct moat_rpc_server *srv)
{
	struct rpc_defer_table *t = &srv->defer;

	if (pthread_create(&t->replier, NULL, replier_main, srv) != 0)
		return MOAT_RESOURCE_EXHAUSTED;
	t->replier_started = true;
	return MOAT_OK;
}

void
rpc_defer_stop_replier(struct moat_rpc_server *srv)
{
	struct rpc_defer_table *t = &srv->defer;

	if (!t->replier_started)
		return;
	pthread_mutex_lock(&t->lock);
	t->replier_stop = true;
	pthread_cond_signal(&t->replier_cv);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->replier, NULL);
	t->replier_started = false;
}

bool
rpc_defer_release(struct moat_rpc_server *srv)
{
	struct rpc_defer_table *t = &srv->defer;
	struct moat_rpc_deferred *d, *next;
	bool free_now;

	struct moat_rpc_deferred *aios = NULL;

	/* The socket is closed: every send has ended or ends now, and
	 * every context is closed with it. nng_aio_free waits for a
	 * callback still running, which takes the lock: not under it. A
	 * call still sending is not freed by anyone else meanwhile. */
	pthread_mutex_lock(&t->lock);
	for (d = t->head; d != NULL; d = d->next)
		if (d->send_aio != NULL) {
			d->sending = true;
			d->job_next = aios;
			aios = d;
		}
	pthread_mutex_unlock(&t->lock);
	for (d = aios; d != NULL; d = d->job_next) {
		nng_aio_free(d->send_aio);
		d->send_aio = NULL;
	}
	pthread_mutex_lock(&t->lock);
	for (d = t->head; d != NULL; d = next) {
		next = d->next;
		d->sending = false;
		d->has_ctx = false;
		d->answered = true;
		if (deferred_finished(d)) {
			deferred_unlink(t, d);
			deferred_free(d);
		}
	}
	t->stopped = true;
	free_now = t->n == 0;
	pthread_mutex_unlock(&t->lock);
	return free_now;
}
