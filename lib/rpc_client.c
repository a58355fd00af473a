/*
 * rpc_client.c: the client half of moat's RPC layer. One req0 socket per
 * client with a non-blocking dial (so a server that starts later is
 * found), nng's resend turned off (a mutating call must never run twice
 * because a reply was slow), and one nng context per call in flight (kept
 * for the client's next calls) so many threads can call at once, and
 * asynchronous calls finished by one thread of the process (their
 * callbacks run there) so a caller need not wait at all. Turns
 * transport failures into statuses a person can act on: UNAVAILABLE when
 * no server takes the request or the connection drops during the call,
 * DEADLINE_EXCEEDED when the reply is late. Not for: serving
 * (rpc_server.c) or retrying (callers decide whether a call is safe to
 * repeat).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include "common.pb-c.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"

/* How long a request may wait for a connected server before the call says
 * UNAVAILABLE rather than waiting out its whole timeout. */
#define RPC_CONNECT_WAIT_MS 2000

/* How often a caller past its deadline looks whether its request has
 * reached a server yet (rare: see call_envelope). */
#define RPC_LATE_SEND_POLL_MS 5

/* Idle waits (a context and its two aios) a client keeps for its next
 * calls: opening a context and allocating aios per call costs more than
 * the call's own work on a busy client. Bounded, so a burst of callers
 * does not pin memory for good. */
#define RPC_IDLE_WAITS 256

/* Request ids taken from the kernel at once, per thread: one getrandom
 * per call was a syscall on every call's path. */
#define RPC_IDS_PER_FILL 32

/* Longest service or method name of an asynchronous call. */
#define RPC_ASYNC_NAME 128

/* One call's wait for its reply. The send's completion starts the
 * receive (send_done), so a caller sleeps once per call, however long
 * its request queued behind others on the connection. The receive
 * completes through a callback, not an aio timeout: when the caller's
 * deadline passes the receive stays armed ("abandoned"), so a late reply
 * is taken by its own context, and the client knows whether a reply may
 * still arrive. That matters at close: nng 1.5 can hang for good in
 * nng_close when a message arrives on a pipe while it closes (nng issues
 * 1543, 1813), so a client that may still be answered is parked, not
 * closed, until it has been (moat_rpc_client_close). A wait whose call
 * was answered goes back to the client's idle list for the next call. */
struct rpc_wait {
	struct moat_rpc_client *c;
	nng_ctx ctx;
	bool has_ctx;
	nng_aio *send_aio; /* completes into send_done */
	nng_aio *aio;      /* the receive; completes into recv_done */
	/* The caller sleeps here, with c->lock: one condition per call, so
	 * a reply wakes its own caller and no other. */
	pthread_cond_t wake;
	bool cond_inited;
	int send_rv;      /* the send's error; guarded by c->lock */
	atomic_bool sent; /* a server has the request */
	bool done;        /* guarded by c->lock */
	bool abandoned;   /* guarded by c->lock */
	/* In c->abandoned or c->idle; guarded by c->lock. */
	struct rpc_wait *next;
	/* Asynchronous calls only (moat_rpc_call_raw_async), set before
	 * the send: */
	bool async;
	moat_rpc_done done_fn;
	void *done_arg;
	uint64_t deadline_ms;
	uint32_t timeout_ms;
	char *service, *method; /* heap, for messages */
	/* Guarded by async_lock: */
	bool async_ready;            /* ended: the async thread finishes it */
	struct rpc_wait *async_next; /* in async_calls */
};

/* Asynchronous calls in flight, of every client: one thread finishes
 * them (reply, error, deadline) and calls their callbacks, so that nng's
 * callbacks only flag them. Lock order: a client's lock, then
 * async_lock. */
static pthread_mutex_t async_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t async_cv;      /* monotonic; async_once */
static struct rpc_wait *async_calls; /* guarded by async_lock */
static pthread_once_t async_once = PTHREAD_ONCE_INIT;
static bool async_started; /* written once, in async_once */

static void async_ready(struct rpc_wait *w);

struct moat_rpc_client {
	nng_socket sock;
	bool has_socket;
	bool sync_inited;
	char *url;
	/* Guards the rpc_wait flags, `abandoned`, `n_late`, `idle` and
	 * `n_idle`. */
	pthread_mutex_t lock;
	struct rpc_wait *abandoned;
	unsigned n_late;       /* abandoned and not yet answered */
	struct rpc_wait *idle; /* answered waits, ready for reuse */
	unsigned n_idle;
	struct moat_rpc_client *parked_next;
	/* TLS links only: the dial's config (held), for the probe that
	 * explains a dial that does not come up, and what it last said. */
	nng_tls_config *tls;
	char *server_name;
	pthread_mutex_t diag_lock;
	bool diag_inited;
	bool diag_quiet;
	uint64_t diag_ms, diag_logged_ms;
	char *diag; /* NULL: the last probe said nothing about TLS */
};

/* How often a client probes a TLS peer that does not answer, how long a
 * probe may take, and how often it logs the failure. */
#define RPC_TLS_DIAG_EVERY_MS 10000
#define RPC_TLS_DIAG_TIMEOUT_MS 1000
#define RPC_TLS_DIAG_LOG_MS 60000

/* Clients closed while a late reply could still come: kept here (not
 * lost) and finished by a later close once their replies are in. */
static pthread_mutex_t parked_lock = PTHREAD_MUTEX_INITIALIZER;
static struct moat_rpc_client *parked; /* guarded by parked_lock */

/* wait_free: safe on a half-built wait. Only for a wait no operation is
 * running on (done, never started, or idle). */
static void
wait_free(struct rpc_wait *w)
{
	/* The send first: its callback may still be returning from
	 * starting the receive. nng_aio_free waits for callbacks. */
	if (w->send_aio != NULL)
		nng_aio_free(w->send_aio);
	if (w->aio != NULL)
		nng_aio_free(w->aio);
	if (w->has_ctx)
		nng_ctx_close(w->ctx);
	if (w->cond_inited)
		pthread_cond_destroy(&w->wake);
	free(w->service);
	free(w->method);
	free(w);
}

/* Runs on an nng thread when the send finishes: a connected server has
 * the request (start the receive), or none took it in time, or the
 * socket closed. */
static void
send_done(void *arg)
{
	struct rpc_wait *w = arg;
	struct moat_rpc_client *c = w->c;
	int rv = nng_aio_result(w->send_aio);

	if (rv == 0) {
		/* No lock and no wake: only a caller past its deadline
		 * looks at this, and it polls. */
		atomic_store(&w->sent, true);
		nng_ctx_recv(w->ctx, w->aio);
		return;
	}
	/* A failed send leaves the message with the aio. */
	nng_msg_free(nng_aio_get_msg(w->send_aio));
	nng_aio_set_msg(w->send_aio, NULL);
	pthread_mutex_lock(&c->lock);
	w->send_rv = rv;
	w->done = true;
	if (w->abandoned)
		c->n_late--;
	else if (w->async)
		async_ready(w);
	pthread_mutex_unlock(&c->lock);
	/* After the unlock, so the caller does not wake into a held lock.
	 * w is still alive: whoever frees or reuses it first waits for this
	 * callback to return (nng_aio_free, nng_aio_wait). */
	pthread_cond_signal(&w->wake);
}

/* Runs on an nng thread when a receive finishes (reply, error, close). */
static void
recv_done(void *arg)
{
	struct rpc_wait *w = arg;
	struct moat_rpc_client *c = w->c;

	pthread_mutex_lock(&c->lock);
	w->done = true;
	if (w->abandoned) {
		if (nng_aio_result(w->aio) == 0) {
			nng_msg_free(nng_aio_get_msg(w->aio));
			nng_aio_set_msg(w->aio, NULL);
		}
		c->n_late--;
	} else if (w->async) {
		async_ready(w);
	}
	pthread_mutex_unlock(&c->lock);
	/* After the unlock: see send_done. */
	pthread_cond_signal(&w->wake);
}

/* Moves the abandoned calls answered since onto *done. Called with
 * c->lock held. */
static void
take_answered(struct moat_rpc_client *c, struct rpc_wait **done)
{
	struct rpc_wait **pp, *w;

	for (pp = &c->abandoned; (w = *pp) != NULL;) {
		if (w->done) {
			*pp = w->next;
			w->next = *done;
			*done = w;
		} else {
			pp = &w->next;
		}
	}
}

static void
free_list(struct rpc_wait *w)
{
	struct rpc_wait *next;

	for (; w != NULL; w = next) {
		next = w->next;
		wait_free(w);
	}
}

/* Frees the abandoned calls that have been answered since. */
static void
reap_abandoned(struct moat_rpc_client *c)
{
	struct rpc_wait *done = NULL;

	pthread_mutex_lock(&c->lock);
	take_answered(c, &done);
	pthread_mutex_unlock(&c->lock);
	free_list(done);
}

/* wait_new: a wait with its own context on c's socket; NULL with *nrv
 * set on failure. */
static struct rpc_wait *
wait_new(struct moat_rpc_client *c, int *nrv)
{
	pthread_condattr_t ca;
	struct rpc_wait *w;

	if ((w = calloc(1, sizeof(*w))) == NULL) {
		*nrv = NNG_ENOMEM;
		return NULL;
	}
	w->c = c;
	/* Deadlines are on the monotonic clock. */
	if (pthread_condattr_init(&ca) != 0) {
		free(w);
		*nrv = NNG_ENOMEM;
		return NULL;
	}
	w->cond_inited =
	    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
	    pthread_cond_init(&w->wake, &ca) == 0;
	pthread_condattr_destroy(&ca);
	if (!w->cond_inited) {
		*nrv = NNG_ENOMEM;
		goto fail;
	}
	if ((*nrv = nng_ctx_open(&w->ctx, c->sock)) != 0)
		goto fail;
	w->has_ctx = true;
	if ((*nrv = nng_aio_alloc(&w->send_aio, send_done, w)) != 0 ||
	    (*nrv = nng_aio_alloc(&w->aio, recv_done, w)) != 0)
		goto fail;
	return w;
fail:
	wait_free(w);
	return NULL;
}

/* wait_get: an idle wait of c, or a new one; frees the abandoned calls
 * answered since the last call on the way. NULL with *nrv on failure. */
static struct rpc_wait *
wait_get(struct moat_rpc_client *c, int *nrv)
{
	struct rpc_wait *done = NULL, *w;

	pthread_mutex_lock(&c->lock);
	if (c->abandoned != NULL)
		take_answered(c, &done);
	if ((w = c->idle) != NULL) {
		c->idle = w->next;
		c->n_idle--;
	}
	pthread_mutex_unlock(&c->lock);
	free_list(done);
	if (w == NULL)
		return wait_new(c, nrv);
	w->next = NULL;
	return w;
}

/* wait_put: keeps w, whose call was answered, for the next call. */
static void
wait_put(struct moat_rpc_client *c, struct rpc_wait *w)
{
	/* Both callbacks may still be returning after waking the caller;
	 * reusing an aio before they have is not allowed. */
	nng_aio_wait(w->send_aio);
	nng_aio_wait(w->aio);
	free(w->service);
	free(w->method);
	w->service = w->method = NULL;
	w->async = false;
	w->async_ready = false;
	pthread_mutex_lock(&c->lock);
	if (c->n_idle < RPC_IDLE_WAITS) {
		w->next = c->idle;
		c->idle = w;
		c->n_idle++;
		w = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	if (w != NULL)
		wait_free(w);
}

unsigned
moat_rpc_client_late_replies(struct moat_rpc_client *c)
{
	unsigned n;

	reap_abandoned(c);
	pthread_mutex_lock(&c->lock);
	n = c->n_late;
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* A forked child must not hand out the ids its parent holds: the server
 * would take the child's call for a repeat of the parent's. Each
 * thread's buffer remembers the generation it was filled in. */
static unsigned fork_generation; /* only the child's handler writes */
static pthread_once_t ids_once = PTHREAD_ONCE_INIT;

static void
ids_after_fork(void)
{
	fork_generation++;
}

static void
ids_init(void)
{
	/* Without the handler ids would repeat across a fork; a failure
	 * here (out of memory) leaves every fill at one id. */
	if (pthread_atfork(NULL, NULL, ids_after_fork) != 0)
		fork_generation = ~0u;
}

/* A random non-zero id that does not come from the kernel: ids only
 * need to differ, so mix clock, pid and a counter. */
static uint64_t
fallback_id(void)
{
	static __thread uint64_t counter;
	struct timespec ts;
	uint64_t id = 0;

	while (id == 0) {
		clock_gettime(CLOCK_REALTIME, &ts);
		counter += 0x9e3779b97f4a7c15ull;
		id = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
		    ((uint64_t)getpid() << 16) ^ counter;
		id *= 0xbf58476d1ce4e5b9ull;
	}
	return id;
}

uint64_t
moat_rpc_new_request_id(void)
{
	static __thread uint64_t ids[RPC_IDS_PER_FILL];
	static __thread unsigned n_ids;
	static __thread unsigned generation;
	ssize_t n;

	pthread_once(&ids_once, ids_init);
	if (generation != fork_generation || fork_generation == ~0u) {
		n_ids = 0;
		generation = fork_generation;
	}
	for (;;) {
		while (n_ids > 0)
			if (ids[--n_ids] != 0)
				return ids[n_ids];
		n = getrandom(ids,
		    fork_generation == ~0u ? sizeof(ids[0]) : sizeof(ids), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < (ssize_t)sizeof(ids[0]))
			/* No kernel randomness (very old kernel,
			 * seccomp). */
			return fallback_id();
		n_ids = (unsigned)((size_t)n / sizeof(ids[0]));
	}
}

/* The lock; each wait has its own condition. */
static bool
client_sync_init(struct moat_rpc_client *c)
{
	c->sync_inited = pthread_mutex_init(&c->lock, NULL) == 0;
	return c->sync_inited;
}

/* client_open: moat_rpc_client_open, with TLS on the dial when tls is
 * not NULL (the client keeps a hold on it). */
static int
client_open(struct moat_rpc_client **out, const char *url, nng_tls_config *tls,
    const char *server_name, char **errmsg)
{
	struct moat_rpc_client *c;
	nng_dialer d;
	int nrv, rv;

	*out = NULL;
	*errmsg = NULL;
	if ((c = calloc(1, sizeof(*c))) == NULL ||
	    (c->url = strdup(url)) == NULL) {
		free(c);
		*errmsg = moat_asprintf("out of memory opening a client for "
		                        "%s",
		    url);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (!client_sync_init(c)) {
		nrv = NNG_ENOMEM;
		goto fail_nng;
	}
	if ((nrv = nng_req0_open(&c->sock)) != 0)
		goto fail_nng;
	c->has_socket = true;
	if ((nrv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME,
	         NNG_DURATION_INFINITE)) != 0)
		goto fail_nng;
	if ((nrv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ,
	         MOAT_RPC_MAX_MSG)) != 0)
		goto fail_nng;
	if ((nrv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 20)) != 0 ||
	    (nrv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 500)) != 0)
		goto fail_nng;
	if (tls != NULL) {
		nng_tls_config_hold(tls);
		c->tls = tls;
		c->diag_inited = pthread_mutex_init(&c->diag_lock, NULL) == 0;
		if (!c->diag_inited ||
		    (server_name != NULL &&
		        (c->server_name = strdup(server_name)) == NULL)) {
			nrv = NNG_ENOMEM;
			goto fail_nng;
		}
	}
	if ((nrv = nng_dialer_create(&d, c->sock, url)) != 0 ||
	    (tls != NULL &&
	        (nrv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, tls)) != 0) ||
	    (nrv = nng_dialer_start(d, NNG_FLAG_NONBLOCK)) != 0)
		goto fail_nng;
	*out = c;
	return MOAT_OK;

fail_nng:
	if (nrv == NNG_EADDRINVAL || nrv == NNG_ENOTSUP || nrv == NNG_EINVAL) {
		rv = MOAT_INVALID_ARGUMENT;
		*errmsg =
		    moat_asprintf("cannot dial %s: %s: use ipc://PATH, "
		                  "tcp://HOST:PORT or tls+tcp://HOST:PORT",
		        url, nng_strerror(nrv));
	} else {
		rv = moat_status_from_nng(nrv);
		*errmsg = moat_asprintf("cannot dial %s: %s", url,
		    nng_strerror(nrv));
	}
	moat_rpc_client_close(c);
	return rv;
}

int
moat_rpc_client_open(struct moat_rpc_client **out, const char *url,
    char **errmsg)
{
	return client_open(out, url, NULL, NULL, errmsg);
}

int
moat_rpc_client_open_opts(struct moat_rpc_client **out, const char *url,
    const struct moat_rpc_client_opts *o, char **errmsg)
{
	const char *what = o->what != NULL ? o->what : "the dial";
	nng_tls_config *tls = NULL;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if ((rv = moat_tls_check_url(o->tls, url, false, MOAT_TLS_PEER_NONE,
	         what, errmsg)) != MOAT_OK)
		return rv;
	if (moat_tls_url_is_tls(url) &&
	    (rv = moat_tls_client_config(o->tls, url, o->server_name, &tls,
	         errmsg)) != MOAT_OK)
		return rv;
	rv = client_open(out, url, tls, o->server_name, errmsg);
	if (rv == MOAT_OK)
		(*out)->diag_quiet = o->quiet;
	if (tls != NULL)
		nng_tls_config_free(tls);
	return rv;
}

/* tls_diagnose: why a TLS peer does not take our requests, if the
 * handshake is why: a probe at most every RPC_TLS_DIAG_EVERY_MS (callers
 * in between get the last answer), logged once a minute. Heap sentence
 * or NULL. */
static char *
tls_diagnose(struct moat_rpc_client *c)
{
	uint64_t now = moat_rpc_now_ms();
	char *said = NULL;
	int nrv;

	pthread_mutex_lock(&c->diag_lock);
	if (c->diag_ms == 0 || now - c->diag_ms >= RPC_TLS_DIAG_EVERY_MS) {
		/* Under the lock: concurrent callers wait for one probe
		 * rather than each making their own. */
		nrv = moat_tls_probe(c->url, c->tls, RPC_TLS_DIAG_TIMEOUT_MS);
		free(c->diag);
		c->diag = moat_tls_probe_explain(nrv, c->url, c->server_name);
		c->diag_ms = moat_rpc_now_ms();
		if (c->diag != NULL && !c->diag_quiet &&
		    (c->diag_logged_ms == 0 ||
		        c->diag_ms - c->diag_logged_ms >=
		            RPC_TLS_DIAG_LOG_MS)) {
			moat_warn(0, "rpc: %s", c->diag);
			c->diag_logged_ms = c->diag_ms;
		}
	}
	if (c->diag != NULL)
		said = strdup(c->diag);
	pthread_mutex_unlock(&c->diag_lock);
	return said;
}

/* unavailable_message: "no answer from url", with the TLS probe's
 * sentence on a TLS link. */
static char *
unavailable_message(struct moat_rpc_client *c)
{
	char *diag, *msg;

	if (c->tls == NULL || (diag = tls_diagnose(c)) == NULL)
		return moat_asprintf("no answer from %s: is the service "
		                     "running? (deploy/moat-stack start)",
		    c->url);
	msg = moat_asprintf("no answer from %s: %s", c->url, diag);
	free(diag);
	return msg;
}

static void
client_destroy(struct moat_rpc_client *c)
{
	/* The idle contexts first, while the socket is open: nothing runs
	 * on them. */
	free_list(c->idle);
	c->idle = NULL;
	c->n_idle = 0;
	if (c->has_socket)
		nng_close(c->sock);
	if (c->sync_inited) {
		reap_abandoned(c); /* all answered or closed by now */
		pthread_mutex_destroy(&c->lock);
	}
	if (c->tls != NULL)
		nng_tls_config_free(c->tls);
	if (c->diag_inited)
		pthread_mutex_destroy(&c->diag_lock);
	free(c->diag);
	free(c->server_name);
	free(c->url);
	free(c);
}

/* Finishes closing the parked clients whose late replies have come. */
static void
sweep_parked(void)
{
	struct moat_rpc_client *ready = NULL, **pp, *p;

	pthread_mutex_lock(&parked_lock);
	for (pp = &parked; (p = *pp) != NULL;) {
		if (moat_rpc_client_late_replies(p) == 0) {
			*pp = p->parked_next;
			p->parked_next = ready;
			ready = p;
		} else {
			pp = &p->parked_next;
		}
	}
	pthread_mutex_unlock(&parked_lock);
	while ((p = ready) != NULL) {
		ready = p->parked_next;
		client_destroy(p);
	}
}

void
moat_rpc_client_close(struct moat_rpc_client *c)
{
	unsigned late;

	sweep_parked();
	if (c == NULL)
		return;
	if (c->sync_inited && (late = moat_rpc_client_late_replies(c)) > 0) {
		/* See struct rpc_wait: closing now could hang. The socket
		 * stays open, drops the late replies as they come, and a
		 * later close finishes it. */
		moat_warn(0,
		    "rpc client for %s parked: %u calls that timed "
		    "out may still be answered, and closing now could hang "
		    "(nng 1.5)",
		    c->url, late);
		pthread_mutex_lock(&parked_lock);
		c->parked_next = parked;
		parked = c;
		pthread_mutex_unlock(&parked_lock);
		return;
	}
	client_destroy(c);
}

/* The monotonic clock `ms` from now, for pthread_cond_timedwait. */
static struct timespec
monotonic_after(uint64_t ms)
{
	uint64_t t = moat_rpc_now_ms() + ms;
	struct timespec ts;

	ts.tv_sec = (time_t)(t / 1000);
	ts.tv_nsec = (long)(t % 1000) * 1000000L;
	return ts;
}

/* call_prepare: a wait and the packed request for one call; on failure
 * a status with *errmsg. */
static int
call_prepare(struct moat_rpc_client *c, const Moat__V1__Envelope *env,
    struct rpc_wait **wp, nng_msg **msgp, char **errmsg)
{
	size_t n = moat__v1__envelope__get_packed_size(env);
	struct rpc_wait *w;
	int nrv;

	*wp = NULL;
	*msgp = NULL;
	if (n > MOAT_RPC_MAX_MSG) {
		*errmsg =
		    moat_asprintf("%s.%s: the request is %zu bytes, "
		                  "over the %u-byte limit: send less per call",
		        env->service, env->method, n, MOAT_RPC_MAX_MSG);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((w = wait_get(c, &nrv)) == NULL)
		goto fail_nng;
	if ((nrv = nng_msg_alloc(msgp, n)) != 0) {
		wait_free(w);
		goto fail_nng;
	}
	moat__v1__envelope__pack(env, nng_msg_body(*msgp));
	/* No callback runs before the send starts, so these need no lock
	 * (nng's own locks order them before send_done). */
	w->done = false;
	atomic_store(&w->sent, false);
	w->send_rv = 0;
	w->abandoned = false;
	*wp = w;
	return MOAT_OK;
fail_nng:
	*errmsg = moat_asprintf("%s.%s to %s failed: %s", env->service,
	    env->method, c->url, nng_strerror(nrv));
	return moat_status_from_nng(nrv);
}

/* call_start: sends `msg` (taken) on w. The send finishes when a
 * connected server has the request: if none takes it soon, the service
 * is down, not slow. send_done then starts the receive. */
static void
call_start(struct rpc_wait *w, nng_msg *msg, uint32_t timeout_ms)
{
	nng_aio_set_msg(w->send_aio, msg);
	nng_aio_set_timeout(w->send_aio,
	    (nng_duration)(timeout_ms < RPC_CONNECT_WAIT_MS ?
	            timeout_ms :
	            RPC_CONNECT_WAIT_MS));
	nng_ctx_send(w->ctx, w->send_aio);
}

/* call_result: the outcome of w's call, which has ended (w->done): the
 * Reply into *out (caller frees with moat__v1__reply__free_unpacked) or
 * a transport status with *errmsg. Puts w back or frees it. */
static int
call_result(struct moat_rpc_client *c, struct rpc_wait *w, const char *service,
    const char *method, Moat__V1__Reply **out, char **errmsg)
{
	nng_msg *msg;
	int nrv = w->send_rv, rv;

	*out = NULL;
	if (nrv != 0) {
		if (nrv == NNG_ETIMEDOUT || nrv == NNG_ECONNREFUSED ||
		    nrv == NNG_ECLOSED) {
			rv = MOAT_UNAVAILABLE;
			*errmsg = unavailable_message(c);
			goto fail;
		}
		goto fail_nng;
	}
	if ((nrv = nng_aio_result(w->aio)) != 0) {
		/* With resend off, nng fails a call whose connection closed
		 * (it does not send it again elsewhere). */
		if (nrv == NNG_ECONNRESET || nrv == NNG_ECONNSHUT) {
			rv = MOAT_UNAVAILABLE;
			*errmsg = moat_asprintf(
			    "the connection to %s was "
			    "lost while %s.%s was running: it may or may not "
			    "have run; check its result before retrying",
			    c->url, service, method);
			goto fail;
		}
		goto fail_nng;
	}
	msg = nng_aio_get_msg(w->aio);
	nng_aio_set_msg(w->aio, NULL);
	*out =
	    moat__v1__reply__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
	nng_msg_free(msg);
	if (*out == NULL) {
		rv = MOAT_INTERNAL;
		*errmsg = moat_asprintf(
		    "%s.%s: %s sent a reply that is not "
		    "a moat.v1.Reply: is that address a moat service?",
		    service, method, c->url);
		goto fail;
	}
	wait_put(c, w);
	return MOAT_OK;

fail_nng:
	rv = moat_status_from_nng(nrv);
	*errmsg = moat_asprintf("%s.%s to %s failed: %s", service, method,
	    c->url, nng_strerror(nrv));
fail:
	/* Not reused: after a failure its context's state is nng's guess.
	 * Callbacks may still be returning: wait for them. */
	nng_aio_wait(w->send_aio);
	nng_aio_wait(w->aio);
	wait_free(w);
	return rv;
}

/* Abandons w's call, past its deadline (c->lock held): a late reply is
 * taken and dropped by its own context. */
static void
call_abandon(struct moat_rpc_client *c, struct rpc_wait *w)
{
	w->abandoned = true;
	w->next = c->abandoned;
	c->abandoned = w;
	c->n_late++;
}

/* Sends one encoded Envelope and returns the Reply (caller frees with
 * moat__v1__reply__free_unpacked) or a transport status with *errmsg. */
static int
call_envelope(struct moat_rpc_client *c, const Moat__V1__Envelope *env,
    uint32_t timeout_ms, Moat__V1__Reply **out, char **errmsg)
{
	struct rpc_wait *w;
	struct timespec until;
	nng_msg *msg = NULL;
	uint64_t start = moat_rpc_now_ms(), deadline = start + timeout_ms;
	bool late = false;
	int rv;

	*out = NULL;
	if ((rv = call_prepare(c, env, &w, &msg, errmsg)) != MOAT_OK)
		return rv;
	call_start(w, msg, timeout_ms);

	until.tv_sec = (time_t)(deadline / 1000);
	until.tv_nsec = (long)(deadline % 1000) * 1000000L;
	pthread_mutex_lock(&c->lock);
	while (!w->done) {
		if (!late) {
			late = pthread_cond_timedwait(&w->wake, &c->lock,
			           &until) == ETIMEDOUT;
			continue;
		}
		if (atomic_load(&w->sent))
			break;
		/* Past the deadline with the request not yet taken: its
		 * send times out about now (its timeout is at most the
		 * call's), and that answer (UNAVAILABLE) is the right one:
		 * no server has seen the call. Polled, so that sending
		 * costs no lock on every call. */
		until = monotonic_after(RPC_LATE_SEND_POLL_MS);
		pthread_cond_timedwait(&w->wake, &c->lock, &until);
	}
	if (!w->done) {
		call_abandon(c, w);
		pthread_mutex_unlock(&c->lock);
		*errmsg = moat_asprintf(
		    "%s.%s on %s gave no reply within %u "
		    "ms: the call may still be running; check its result "
		    "before retrying, or allow a longer timeout",
		    env->service, env->method, c->url, timeout_ms);
		return MOAT_DEADLINE_EXCEEDED;
	}
	pthread_mutex_unlock(&c->lock);
	return call_result(c, w, env->service, env->method, out, errmsg);
}

/* Checks the reply's code; on OK leaves it to the caller, else sets
 * *errmsg and returns the code. */
static int
reply_status(const Moat__V1__Reply *r, char **errmsg)
{
	int code = (int)r->code;

	if (code == MOAT_OK)
		return MOAT_OK;
	if (code < 0 || code > MOAT_STATUS_MAX)
		code = MOAT_UNKNOWN;
	if (r->message != NULL && r->message[0] != '\0')
		*errmsg = strdup(r->message);
	else
		*errmsg = strdup(moat_strerror(code));
	return code;
}

/* envelope_fill: the Envelope of one call (borrowing every string);
 * returns its timeout. */
static uint32_t
envelope_fill(Moat__V1__Envelope *env, const char *service, const char *method,
    const uint8_t *payload, size_t len, const struct moat_rpc_opts *opts)
{
	uint32_t timeout_ms = opts != NULL && opts->timeout_ms != 0 ?
	    opts->timeout_ms :
	    MOAT_RPC_DEFAULT_TIMEOUT_MS;

	if (timeout_ms > INT32_MAX)
		timeout_ms = INT32_MAX; /* nng durations are int32 ms */
	env->service = (char *)service;
	env->method = (char *)method;
	env->request_id = opts != NULL && opts->request_id != 0 ?
	    opts->request_id :
	    moat_rpc_new_request_id();
	env->timeout_ms = timeout_ms;
	env->auth =
	    (char *)(opts != NULL && opts->auth != NULL ? opts->auth : "");
	env->tenant =
	    (char *)(opts != NULL && opts->tenant != NULL ? opts->tenant : "");
	env->payload.data = (uint8_t *)payload;
	env->payload.len = len;
	return timeout_ms;
}

/* reply_take: the payload of Reply `r` (freed here) into *reply_payload
 * (heap, may be NULL), or its error into *errmsg. */
static int
reply_take(Moat__V1__Reply *r, uint8_t **reply_payload, size_t *reply_len,
    char **errmsg)
{
	int rv;

	if ((rv = reply_status(r, errmsg)) != MOAT_OK)
		goto out;
	if (r->payload.len != 0) {
		/* Take the buffer rather than copy it: free_unpacked skips a
		 * NULL data pointer. */
		*reply_payload = r->payload.data;
		*reply_len = r->payload.len;
		r->payload.data = NULL;
		r->payload.len = 0;
	}
out:
	moat__v1__reply__free_unpacked(r, NULL);
	if (rv != MOAT_OK && *errmsg == NULL)
		rv = MOAT_RESOURCE_EXHAUSTED;
	return rv;
}

int
moat_rpc_call_raw(struct moat_rpc_client *c, const char *service,
    const char *method, const uint8_t *payload, size_t len,
    uint8_t **reply_payload, size_t *reply_len,
    const struct moat_rpc_opts *opts, char **errmsg)
{
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	Moat__V1__Reply *r = NULL;
	uint32_t timeout_ms;
	int rv;

	*reply_payload = NULL;
	*reply_len = 0;
	*errmsg = NULL;
	timeout_ms = envelope_fill(&env, service, method, payload, len, opts);
	if ((rv = call_envelope(c, &env, timeout_ms, &r, errmsg)) != 0)
		return rv;
	return reply_take(r, reply_payload, reply_len, errmsg);
}

/* ---- asynchronous calls ---- */

/* async_ready: w's call has ended; called with w->c->lock held. */
static void
async_ready(struct rpc_wait *w)
{
	pthread_mutex_lock(&async_lock);
	w->async_ready = true;
	pthread_cond_signal(&async_cv);
	pthread_mutex_unlock(&async_lock);
}

/* async_finish: calls w's callback with its outcome, on the async
 * thread; w is out of async_calls. */
static void
async_finish(struct rpc_wait *w)
{
	struct moat_rpc_client *c = w->c;
	moat_rpc_done done = w->done_fn;
	void *arg = w->done_arg;
	Moat__V1__Reply *r = NULL;
	uint8_t *payload = NULL;
	size_t len = 0;
	char *errmsg = NULL;
	int rv;

	pthread_mutex_lock(&c->lock);
	if (!w->done) {
		/* The deadline: see call_envelope. */
		call_abandon(c, w);
		pthread_mutex_unlock(&c->lock);
		errmsg = moat_asprintf("%s.%s on %s gave no reply within %u "
		                       "ms: the call may still be running; "
		                       "check its result before retrying, or "
		                       "allow a longer timeout",
		    w->service, w->method, c->url, w->timeout_ms);
		done(arg, MOAT_DEADLINE_EXCEEDED, NULL, 0, errmsg);
		return;
	}
	pthread_mutex_unlock(&c->lock);
	{
		char service[RPC_ASYNC_NAME], method[RPC_ASYNC_NAME];

		/* call_result may free w: keep the names. */
		snprintf(service, sizeof(service), "%s", w->service);
		snprintf(method, sizeof(method), "%s", w->method);
		rv = call_result(c, w, service, method, &r, &errmsg);
	}
	if (rv == MOAT_OK)
		rv = reply_take(r, &payload, &len, &errmsg);
	done(arg, rv, payload, len, errmsg);
}

static void *
async_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&async_lock);
	for (;;) {
		struct rpc_wait **pp, *w, *ready = NULL;
		uint64_t now = moat_rpc_now_ms(), wake = UINT64_MAX;
		struct timespec until;

		for (pp = &async_calls; (w = *pp) != NULL;) {
			if (w->async_ready || now >= w->deadline_ms) {
				*pp = w->async_next;
				w->async_next = ready;
				ready = w;
				continue;
			}
			if (w->deadline_ms < wake)
				wake = w->deadline_ms;
			pp = &w->async_next;
		}
		if (ready == NULL) {
			if (wake == UINT64_MAX) {
				pthread_cond_wait(&async_cv, &async_lock);
				continue;
			}
			until.tv_sec = (time_t)(wake / 1000);
			until.tv_nsec = (long)(wake % 1000) * 1000000L;
			pthread_cond_timedwait(&async_cv, &async_lock, &until);
			continue;
		}
		pthread_mutex_unlock(&async_lock);
		while ((w = ready) != NULL) {
			ready = w->async_next;
			async_finish(w);
		}
		pthread_mutex_lock(&async_lock);
	}
	return NULL;
}

static void
async_init(void)
{
	pthread_condattr_t ca;
	pthread_attr_t attr;
	pthread_t t;

	if (pthread_condattr_init(&ca) != 0)
		return;
	if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
	    pthread_cond_init(&async_cv, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		return;
	}
	pthread_condattr_destroy(&ca);
	/* For the process's life: it holds nothing at exit. */
	if (pthread_attr_init(&attr) != 0)
		return;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	async_started = pthread_create(&t, &attr, async_main, NULL) == 0;
	pthread_attr_destroy(&attr);
}

int
moat_rpc_call_raw_async(struct moat_rpc_client *c, const char *service,
    const char *method, const uint8_t *payload, size_t len,
    const struct moat_rpc_opts *opts, moat_rpc_done done, void *arg,
    char **errmsg)
{
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	struct rpc_wait *w;
	nng_msg *msg;
	uint32_t timeout_ms;
	int rv;

	*errmsg = NULL;
	pthread_once(&async_once, async_init);
	if (!async_started) {
		*errmsg = moat_asprintf("%s.%s: cannot start the thread of "
		                        "asynchronous calls: out of resources",
		    service, method);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (strlen(service) >= RPC_ASYNC_NAME ||
	    strlen(method) >= RPC_ASYNC_NAME) {
		*errmsg = moat_asprintf("%.64s.%.64s: the service or method "
		                        "name is too long",
		    service, method);
		return MOAT_INVALID_ARGUMENT;
	}
	timeout_ms = envelope_fill(&env, service, method, payload, len, opts);
	if ((rv = call_prepare(c, &env, &w, &msg, errmsg)) != MOAT_OK)
		return rv;
	if ((w->service = strdup(service)) == NULL ||
	    (w->method = strdup(method)) == NULL) {
		nng_msg_free(msg);
		wait_free(w);
		*errmsg =
		    moat_asprintf("%s.%s: out of memory", service, method);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	w->async = true;
	w->async_ready = false;
	w->done_fn = done;
	w->done_arg = arg;
	w->timeout_ms = timeout_ms;
	w->deadline_ms = moat_rpc_now_ms() + timeout_ms;
	pthread_mutex_lock(&async_lock);
	w->async_next = async_calls;
	async_calls = w;
	pthread_cond_signal(&async_cv);
	pthread_mutex_unlock(&async_lock);
	call_start(w, msg, timeout_ms);
	return MOAT_OK;
}

int
moat_rpc_call(struct moat_rpc_client *c, const char *service,
    const char *method, const ProtobufCMessage *request,
    const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply,
    const struct moat_rpc_opts *opts, char **errmsg)
{
	uint8_t *req_bytes = NULL, *reply_bytes = NULL;
	size_t n, reply_len = 0;
	int rv;

	*reply = NULL;
	*errmsg = NULL;
	n = protobuf_c_message_get_packed_size(request);
	if ((req_bytes = malloc(n ? n : 1)) == NULL) {
		*errmsg = moat_asprintf("%s.%s: out of memory encoding the "
		                        "request",
		    service, method);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	protobuf_c_message_pack(request, req_bytes);
	rv = moat_rpc_call_raw(c, service, method, req_bytes, n, &reply_bytes,
	    &reply_len, opts, errmsg);
	free(req_bytes);
	if (rv != MOAT_OK)
		return rv;
	*reply = protobuf_c_message_unpack(reply_desc, NULL, reply_len,
	    reply_bytes);
	free(reply_bytes);
	if (*reply == NULL) {
		*errmsg = moat_asprintf(
		    "%s.%s: the reply is not a valid %s: "
		    "are client and server built from the same protos?",
		    service, method, reply_desc->name);
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}
