/*
 * exec_async.c: one-shot Execs answered later. The RPC worker only
 * queues the call (moat_rpc_defer): a pool of launchers makes the guest
 * round trip that starts the exec, and one waiter thread answers every
 * deferred call when its exec exits, when its sandbox stops running, or
 * at its deadline (killing the exec, as a waiting worker would). So a
 * long command holds no RPC worker (issue 15).
 * Not for: the exec table and the other exec calls (exec.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "exec.h"
#include "files.h"
#include "node.h"
#include "sandbox.h"
#include "sync.h"

/* A one-shot Exec whose reply was deferred (moat_rpc_defer), so that it
 * holds no RPC worker while the program runs: one thread of the process
 * (waiters_main) answers every such call when its exec exits (the exit
 * event kicks it), when its sandbox stops running, or at its deadline
 * (then the exec is killed, as a waiting worker would). */
struct exec_waiter {
	struct exec_waiter *next;
	struct sandbox *sb; /* a reference */
	uint64_t exec_id;
	uint64_t deadline_ms; /* vmd_call_deadline of the call */
	struct moat_rpc_deferred *d;
	/* A deferred ExecWait or ExecRead (vmd_exec_watch), not a
	 * one-shot Exec: answered by running the call again without
	 * waiting, once that would not block. */
	bool watch;
	bool read;                      /* ExecRead, else ExecWait */
	char *tenant;                   /* the call's Envelope.tenant, heap */
	uint64_t request_id;            /* the call's */
	Moat__V1__ExecReadRequest rreq; /* sandbox_id unset */
	Moat__V1__ExecWaitRequest wreq; /* sandbox_id unset */
};

/* How often the waiter thread looks at sandboxes that may have stopped
 * (no event says so). */
#define EXEC_WAITERS_POLL_MS 500

static pthread_mutex_t waiters_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t waiters_cv;   /* monotonic; waiters_once */
static struct exec_waiter *waiters; /* guarded by waiters_lock */
static bool waiters_kicked;         /* guarded by waiters_lock */
static bool waiters_busy;           /* answering; guarded by waiters_lock */
static bool waiters_stopping;       /* guarded by waiters_lock */
static pthread_cond_t waiters_idle_cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t waiters_once = PTHREAD_ONCE_INIT;
static bool waiters_started; /* written once, in waiters_once */

/* vmd_exec_waiters_kick: an exec with a waiter exited. Called with its
 * sandbox's mu held (lock order: sb->mu, then waiters_lock). */
void
vmd_exec_waiters_kick(void)
{
	pthread_mutex_lock(&waiters_lock);
	waiters_kicked = true;
	pthread_cond_signal(&waiters_cv);
	pthread_mutex_unlock(&waiters_lock);
}

static bool watch_answer(struct exec_waiter *w, uint64_t now, bool stopping);

/* waiter_answer: answers w if its exec is over (or can no longer be
 * answered by it) and frees it; false when it still waits. */
static bool
waiter_answer(struct exec_waiter *w, uint64_t now, bool stopping)
{
	Moat__V1__ExecResult result = MOAT__V1__EXEC_RESULT__INIT;
	struct sandbox *sb = w->sb;
	struct exec *e;
	char *msg = NULL;
	int rv = MOAT_OK;

	if (w->watch)
		return watch_answer(w, now, stopping);
	pthread_mutex_lock(&sb->mu);
	e = vmd_exec_find(sb, w->exec_id);
	if (e == NULL) {
		rv = MOAT_NOT_FOUND;
		msg = moat_asprintf("exec %" PRIu64 " of sandbox %s is gone",
		    w->exec_id, sb->id.str);
	} else if (e->exited) {
		if (vmd_exec_result_locked(e, &result) != MOAT_OK) {
			rv = MOAT_INTERNAL;
			msg = strdup("out of memory");
		}
	} else if (vmd_sandbox_api_state(sb) !=
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING) {
		rv = MOAT_FAILED_PRECONDITION;
		msg = moat_asprintf("sandbox %s is no longer running%s%s: its "
		                    "execs will not finish",
		    sb->id.str, sb->failure_reason ? ": " : "",
		    sb->failure_reason ? sb->failure_reason : "");
	} else if (now >= w->deadline_ms) {
		rv = MOAT_DEADLINE_EXCEEDED;
		msg = moat_asprintf(EXEC_DEADLINE_FMT, w->exec_id, sb->id.str);
	} else if (stopping) {
		rv = MOAT_UNAVAILABLE;
		msg =
		    moat_asprintf("moat-vmd stopped (or restarts) while exec "
		                  "%" PRIu64 " in sandbox %s ran: its outcome "
		                  "is unknown",
		        w->exec_id, sb->id.str);
	} else {
		pthread_mutex_unlock(&sb->mu);
		return false;
	}
	if (e != NULL) {
		e->waiter = NULL;
		vmd_exec_evict(sb); /* it was kept for us */
	}
	pthread_mutex_unlock(&sb->mu);
	if (rv == MOAT_DEADLINE_EXCEEDED) {
		struct moat_rpc_call kill = { .service = "moat.v1.Vm",
			.method = "ExecKill" };

		(void)vmd_exec_signal(sb, &kill, w->exec_id, SIGKILL,
		    moat_rpc_now_ms() + 2000);
		free(kill.error_message);
	}
	moat_rpc_complete(w->d, rv, &result.base, msg);
	free(msg);
	free(result.stdout.data);
	free(result.stderr.data);
	free(result.status);
	vmd_sandbox_put(sb);
	free(w);
	return true;
}

static void *
waiters_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&waiters_lock);
	for (;;) {
		struct exec_waiter *mine, *keep = NULL, *w, *next;
		bool stopping;
		uint64_t now = moat_rpc_now_ms(),
		         wake = now + EXEC_WAITERS_POLL_MS;
		struct timespec until;

		for (w = waiters; w != NULL; w = w->next)
			if (w->deadline_ms < wake)
				wake = w->deadline_ms;
		if (!waiters_kicked && (waiters == NULL || wake > now)) {
			until.tv_sec = (time_t)(wake / 1000);
			until.tv_nsec = (long)(wake % 1000) * 1000000L;
			if (waiters == NULL)
				pthread_cond_wait(&waiters_cv, &waiters_lock);
			else
				pthread_cond_timedwait(&waiters_cv,
				    &waiters_lock, &until);
		}
		waiters_kicked = false;
		mine = waiters;
		waiters = NULL;
		waiters_busy = true;
		stopping = waiters_stopping;
		pthread_mutex_unlock(&waiters_lock);
		now = moat_rpc_now_ms();
		for (w = mine; w != NULL; w = next) {
			next = w->next;
			if (!waiter_answer(w, now, stopping)) {
				w->next = keep;
				keep = w;
			}
		}
		pthread_mutex_lock(&waiters_lock);
		while ((w = keep) != NULL) {
			keep = w->next;
			w->next = waiters;
			waiters = w;
		}
		waiters_busy = false;
		pthread_cond_broadcast(&waiters_idle_cv);
	}
	return NULL;
}

static void
waiters_init(void)
{
	pthread_condattr_t ca;
	pthread_attr_t attr;
	pthread_t t;

	if (pthread_condattr_init(&ca) != 0)
		return;
	if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
	    pthread_cond_init(&waiters_cv, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		return;
	}
	pthread_condattr_destroy(&ca);
	if (pthread_attr_init(&attr) != 0)
		return;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	waiters_started = pthread_create(&t, &attr, waiters_main, NULL) == 0;
	pthread_attr_destroy(&attr);
}

/* waiter_add: the deferred call `d` of one-shot exec `id` of sb waits
 * for it (the waiter thread answers it; also when it has already
 * exited). */
static void
waiter_add(struct sandbox *sb, uint64_t id, struct moat_rpc_deferred *d,
    uint64_t deadline_ms)
{
	struct exec_waiter *w = calloc(1, sizeof(*w));
	struct exec *e;

	if (w == NULL) {
		moat_rpc_complete(d, MOAT_RESOURCE_EXHAUSTED, NULL,
		    "vmd is out of memory: the exec runs, but its result is "
		    "lost; read it with ExecWait");
		return;
	}
	/* The waiter's reference, taken before sb->mu (the node's lock is
	 * never taken inside a sandbox's). */
	pthread_mutex_lock(&sb->vmd->mu);
	sb->refs++;
	pthread_mutex_unlock(&sb->vmd->mu);
	w->sb = sb;
	w->exec_id = id;
	w->deadline_ms = deadline_ms;
	w->d = d;
	pthread_mutex_lock(&sb->mu);
	if ((e = vmd_exec_find(sb, id)) != NULL)
		e->waiter = w; /* kept from eviction until answered */
	pthread_mutex_unlock(&sb->mu);
	pthread_mutex_lock(&waiters_lock);
	w->next = waiters;
	waiters = w;
	waiters_kicked = true;
	pthread_cond_signal(&waiters_cv);
	pthread_mutex_unlock(&waiters_lock);
}

/* ---- ExecWait and ExecRead answered later ---- */

/* watch_try: w's call run again, without waiting, for `tenant`; true
 * when that is its answer (the exec exited, output came, an error, or
 * the wait is over: `final`), then completed. */
static bool
watch_try(struct exec_waiter *w, uint64_t now, bool final)
{
	struct moat_rpc_call call = { .service = "moat.v1.Vm",
		.method = w->read ? "ExecRead" : "ExecWait",
		.request_id = w->request_id,
		.tenant = w->tenant,
		.deadline_ms = now ? now : 1 };
	Moat__V1__ExecReadReply rr = MOAT__V1__EXEC_READ_REPLY__INIT;
	Moat__V1__ExecStatus st = MOAT__V1__EXEC_STATUS__INIT;
	Moat__V1__ExecReadRequest rreq = w->rreq;
	Moat__V1__ExecWaitRequest wreq = w->wreq;
	bool done;
	int rv;

	if (w->read) {
		rreq.sandbox_id = w->sb->id.str;
		rreq.wait_ms = 0;
		rv = vmd_exec_read(w->sb->vmd, &call, &rreq, &rr);
		done = rv != MOAT_OK || rr.eof || rr.stdout.len > 0 ||
		    rr.stderr.len > 0 || (rr.status && rr.status->exited);
	} else {
		wreq.sandbox_id = w->sb->id.str;
		wreq.wait_ms = 0;
		rv = vmd_exec_wait(w->sb->vmd, &call, &wreq, &st);
		done = rv != MOAT_OK || st.exited;
	}
	if (done || final)
		moat_rpc_complete(w->d, rv, w->read ? &rr.base : &st.base,
		    call.error_message);
	free(call.error_message);
	free(rr.stdout.data);
	free(rr.stderr.data);
	free(rr.status);
	return done || final;
}

/* watch_answer: waiter_answer of a deferred ExecWait / ExecRead. */
static bool
watch_answer(struct exec_waiter *w, uint64_t now, bool stopping)
{
	struct sandbox *sb = w->sb;
	struct exec *e;

	if (!watch_try(w, now, stopping || now >= w->deadline_ms))
		return false;
	pthread_mutex_lock(&sb->mu);
	if ((e = vmd_exec_find(sb, w->exec_id)) != NULL && e->watchers > 0) {
		e->watchers--;
		vmd_exec_evict(sb); /* it was kept for us */
	}
	pthread_mutex_unlock(&sb->mu);
	vmd_sandbox_put(sb);
	free(w->tenant);
	free(w);
	return true;
}

bool
vmd_exec_watch(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWaitRequest *wreq,
    const Moat__V1__ExecReadRequest *rreq)
{
	uint32_t wait_ms = wreq ? wreq->wait_ms : rreq->wait_ms;
	uint64_t now = moat_rpc_now_ms(), deadline = vmd_call_deadline(call);
	struct moat_rpc_call look = { .service = "moat.v1.Vm",
		.method = call->method,
		.request_id = call->request_id,
		.tenant = call->tenant };
	struct exec_waiter *w;
	struct sandbox *sb;
	struct exec *e;

	if (vmd == NULL || call->rpc_private == NULL ||
	    (rreq != NULL && rreq->wait_ms == 0))
		return false;
	if (wait_ms > 0 && now + wait_ms < deadline)
		deadline = now + wait_ms;
	pthread_once(&waiters_once, waiters_init);
	if (!waiters_started || (w = calloc(1, sizeof(*w))) == NULL)
		return false;
	if (vmd_sandbox_get(vmd, &look,
	        wreq ? wreq->sandbox_id : rreq->sandbox_id, &sb) != MOAT_OK) {
		free(look.error_message); /* the caller answers it */
		free(w);
		return false;
	}
	w->sb = sb; /* vmd_sandbox_get's reference */
	w->watch = true;
	w->read = rreq != NULL;
	w->exec_id = wreq ? wreq->exec_id : rreq->exec_id;
	w->deadline_ms = deadline;
	w->request_id = call->request_id;
	w->tenant = strdup(call->tenant ? call->tenant : "");
	if (rreq != NULL)
		w->rreq = *rreq;
	else
		w->wreq = *wreq;
	pthread_mutex_lock(&sb->mu);
	if ((e = vmd_exec_find(sb, w->exec_id)) == NULL || e->exited ||
	    (w->read &&
	        (e->out[0].len > rreq->stdout_offset ||
	            e->out[1].len > rreq->stderr_offset)) ||
	    vmd_sandbox_api_state(sb) !=
	        MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING ||
	    w->tenant == NULL || (w->d = moat_rpc_defer(call)) == NULL) {
		/* Answered at once, by the caller. */
		pthread_mutex_unlock(&sb->mu);
		vmd_sandbox_put(sb);
		free(w->tenant);
		free(w);
		return false;
	}
	e->watchers++;
	pthread_mutex_unlock(&sb->mu);
	pthread_mutex_lock(&waiters_lock);
	w->next = waiters;
	waiters = w;
	waiters_kicked = true;
	pthread_cond_signal(&waiters_cv);
	pthread_mutex_unlock(&waiters_lock);
	return true;
}

/* ---- launches off the RPC workers ---- */

/* Starting an exec is one guest round trip, which under load (many
 * execs started at once in a slow guest) takes long enough to fill
 * every RPC worker. So a deferred one-shot Exec is launched by a small
 * pool of its own, and the workers only queue it. */
struct exec_job {
	struct exec_job *next;
	struct sandbox *sb;         /* a reference */
	Moat__V1__ExecRequest *req; /* a copy, the job's */
	struct moat_rpc_deferred *d;
	uint64_t request_id;
	uint64_t deadline_ms; /* the call's */
};

#define EXEC_LAUNCHERS 32
#define EXEC_MAX_QUEUED 4096

static pthread_mutex_t jobs_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jobs_cv = PTHREAD_COND_INITIALIZER;
static struct exec_job *jobs_head, *jobs_tail; /* guarded by jobs_lock */
static size_t n_jobs;                          /* guarded by jobs_lock */
static int jobs_running;                       /* guarded by jobs_lock */
static bool jobs_stopping;                     /* guarded by jobs_lock */
static pthread_cond_t jobs_idle_cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t launchers_once = PTHREAD_ONCE_INIT;
static int launchers_started; /* written once, in launchers_once */

static void
exec_job_run(struct exec_job *j, bool stopping)
{
	struct moat_rpc_call call = { .service = "moat.v1.Vm",
		.method = "Exec",
		.request_id = j->request_id,
		.deadline_ms = j->deadline_ms };
	uint64_t id = 0;
	int32_t pid = 0;
	int rv;

	if (stopping)
		rv = moat_rpc_error(&call, MOAT_UNAVAILABLE,
		    "moat-vmd stopped before the exec started: retry it");
	else
		rv = vmd_exec_launch(j->sb, &call, j->req,
		    VMD_EXEC_DEFAULT_TIMEOUT_MS, &id, &pid);
	if (rv != MOAT_OK)
		moat_rpc_complete(j->d, rv, NULL, call.error_message);
	else
		waiter_add(j->sb, id, j->d, vmd_call_deadline(&call));
	free(call.error_message);
	moat__v1__exec_request__free_unpacked(j->req, NULL);
	vmd_sandbox_put(j->sb);
	free(j);
}

static void *
launcher_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct exec_job *j;
		bool stopping;

		pthread_mutex_lock(&jobs_lock);
		while (jobs_head == NULL)
			pthread_cond_wait(&jobs_cv, &jobs_lock);
		j = jobs_head;
		if ((jobs_head = j->next) == NULL)
			jobs_tail = NULL;
		n_jobs--;
		jobs_running++;
		stopping = jobs_stopping;
		pthread_mutex_unlock(&jobs_lock);
		exec_job_run(j, stopping);
		pthread_mutex_lock(&jobs_lock);
		jobs_running--;
		pthread_cond_broadcast(&jobs_idle_cv);
		pthread_mutex_unlock(&jobs_lock);
	}
	return NULL;
}

static void
launchers_init(void)
{
	pthread_attr_t attr;
	pthread_t t;

	if (pthread_attr_init(&attr) != 0)
		return;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256u << 10);
	for (int i = 0; i < EXEC_LAUNCHERS; i++)
		if (pthread_create(&t, &attr, launcher_main, NULL) == 0)
			launchers_started++;
	pthread_attr_destroy(&attr);
}

/* exec_copy: a heap copy of req (free with ..._free_unpacked). */
static Moat__V1__ExecRequest *
exec_copy(const Moat__V1__ExecRequest *req)
{
	size_t n = moat__v1__exec_request__get_packed_size(req);
	uint8_t *buf = malloc(n ? n : 1);
	Moat__V1__ExecRequest *copy = NULL;

	if (buf != NULL) {
		moat__v1__exec_request__pack(req, buf);
		copy = moat__v1__exec_request__unpack(NULL, n, buf);
		free(buf);
	}
	return copy;
}

/* vmd_exec_enqueue: defers the call and queues its launch; false when it
 * cannot be (a unit test's sandbox, a call built outside the server,
 * the waiter or launch threads missing, the queue full): the caller
 * then runs it on its own thread. */
bool
vmd_exec_enqueue(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req)
{
	struct exec_job *j;

	if (sb->vmd == NULL || call->rpc_private == NULL)
		return false;
	pthread_once(&waiters_once, waiters_init);
	pthread_once(&launchers_once, launchers_init);
	if (!waiters_started || launchers_started == 0)
		return false;
	if ((j = calloc(1, sizeof(*j))) == NULL)
		return false;
	if ((j->req = exec_copy(req)) == NULL) {
		free(j);
		return false;
	}
	pthread_mutex_lock(&jobs_lock);
	if (n_jobs >= EXEC_MAX_QUEUED ||
	    (j->d = moat_rpc_defer(call)) == NULL) {
		pthread_mutex_unlock(&jobs_lock);
		moat__v1__exec_request__free_unpacked(j->req, NULL);
		free(j);
		return false;
	}
	j->request_id = call->request_id;
	j->deadline_ms = call->deadline_ms;
	pthread_mutex_lock(&sb->vmd->mu);
	sb->refs++; /* the job's */
	pthread_mutex_unlock(&sb->vmd->mu);
	j->sb = sb;
	if (jobs_tail != NULL)
		jobs_tail->next = j;
	else
		jobs_head = j;
	jobs_tail = j;
	n_jobs++;
	pthread_cond_signal(&jobs_cv);
	pthread_mutex_unlock(&jobs_lock);
	return true;
}

void
vmd_exec_stop(void)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	pthread_mutex_lock(&jobs_lock);
	jobs_stopping = true;
	while (jobs_head != NULL || jobs_running > 0)
		if (pthread_cond_timedwait(&jobs_idle_cv, &jobs_lock,
		        &until) != 0)
			break;
	pthread_mutex_unlock(&jobs_lock);
	pthread_mutex_lock(&waiters_lock);
	waiters_stopping = true;
	if (waiters_started) {
		waiters_kicked = true;
		pthread_cond_signal(&waiters_cv);
		while (waiters != NULL || waiters_busy)
			if (pthread_cond_timedwait(&waiters_idle_cv,
			        &waiters_lock, &until) != 0)
				break;
	}
	pthread_mutex_unlock(&waiters_lock);
}
