/*
 * record_async.c: recorded steps that hold no RPC worker (issue 15,
 * part 7). An Exec or RunCode on a recorded sandbox is deferred
 * (moat_rpc_defer) like any long exec: the handler copies what the step
 * needs (payload, the request decoded again, method, request id,
 * deadline, tenant, safety level) into a job and returns. A job runs in
 * two parts on a small pool of recorder threads (RECORD_THREADS, started
 * with the first deferred step, joined by moat_record_fini):
 * - start: when the sandbox's turn is the job's, refresh from sessiond
 *   (record_step.c) and send the call to the node without waiting
 *   (moat_forward_call_async_fn); no thread waits while the node runs;
 * - after: the node's answer (queued by the rpc client's thread) is
 *   traced, diffed, appended to the session, snapshotted under EVERY
 *   (moat_record_step_after), and the deferred call completed.
 * The steps of one sandbox keep their arrival order: each entry is owned
 * by one step at a time and the others wait in its FIFO (record.c); the
 * end of a step starts the next one's first part. Steps of different
 * sandboxes run at once. When the gateway stops, steps running finish
 * (every call they make has a deadline) and steps still waiting for
 * their turn fail UNAVAILABLE without running; moat_record_fini returns
 * once none is left.
 * Not for: what a step records (record_step.c), forwarding
 * (forward.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define RECORD_THREADS 8

enum job_part { JOB_START, JOB_AFTER };

/* One deferred step, from the handler to its completion. */
struct moat_record_job {
	struct moat_record_waiter w; /* w.job is this */
	struct moat_record *rec;
	struct moat_record_entry *e;
	struct moat_rpc_deferred *d;
	enum job_part part;
	struct moat_record_job *next; /* in the pool's queue */
	char *method, *tenant, *sandbox_id, *safety;
	uint64_t request_id, deadline_ms, started_ms, ended_ms;
	uint8_t *payload; /* the request's bytes, sent to the node */
	size_t len;
	ProtobufCMessage *request; /* decoded from payload */
	const ProtobufCMessageDescriptor *reply_desc;
	/* The node's answer (JOB_AFTER). */
	int code;
	uint8_t *reply;
	size_t reply_len;
	char *errmsg;
};

struct moat_record_pool {
	pthread_mutex_t lock; /* guards all below */
	pthread_cond_t cv;
	struct moat_record_job *head, *tail; /* parts ready to run */
	pthread_t threads[RECORD_THREADS];
	int n_threads;
	size_t live; /* jobs not yet completed */
	bool stopping;
};

int
moat_record_pool_init(struct moat_record *rec)
{
	struct moat_record_pool *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	if (pthread_mutex_init(&p->lock, NULL) != 0) {
		free(p);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	if (pthread_cond_init(&p->cv, NULL) != 0) {
		pthread_mutex_destroy(&p->lock);
		free(p);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rec->pool = p;
	return MOAT_OK;
}

void
moat_record_pool_fini(struct moat_record *rec)
{
	struct moat_record_pool *p = rec->pool;

	if (p == NULL)
		return;
	pthread_mutex_lock(&p->lock);
	p->stopping = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < p->n_threads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->lock);
	free(p);
	rec->pool = NULL;
}

static void
job_free(struct moat_record_job *job)
{
	if (job->request != NULL)
		protobuf_c_message_free_unpacked(job->request, NULL);
	free(job->method);
	free(job->tenant);
	free(job->sandbox_id);
	free(job->safety);
	free(job->payload);
	free(job->reply);
	free(job->errmsg);
	free(job);
}

/* push: `part` of job is ready to run on a recorder thread. Never
 * blocks for long (the rpc client's thread calls it). */
static void
push(struct moat_record_pool *p, struct moat_record_job *job,
    enum job_part part)
{
	job->part = part;
	job->next = NULL;
	pthread_mutex_lock(&p->lock);
	if (p->tail != NULL)
		p->tail->next = job;
	else
		p->head = job;
	p->tail = job;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->lock);
}

void
moat_record_job_start(struct moat_record *rec, struct moat_record_job *job)
{
	push(rec->pool, job, JOB_START);
}

/* pool_leave: one job fewer (its call answered). */
static void
pool_leave(struct moat_record *rec)
{
	struct moat_record_pool *p = rec->pool;

	moat_forward_async_end(rec->fw);
	pthread_mutex_lock(&p->lock);
	if (--p->live == 0 && p->stopping)
		pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->lock);
}

/* job_end: completes the deferred call (code, and the reply taken from
 * job when MOAT_OK), passes the sandbox's turn on and frees the job. */
static void
job_end(struct moat_record_job *job, int code, const char *message)
{
	struct moat_record *rec = job->rec;

	if (code == MOAT_OK) {
		moat_rpc_complete_raw(job->d, MOAT_OK, job->reply,
		    job->reply_len, NULL);
		job->reply = NULL;
	} else {
		moat_rpc_complete_raw(job->d, code, NULL, 0, message);
	}
	job->d = NULL;
	moat_record_entry_release(rec, job->e);
	job_free(job);
	pool_leave(rec);
}

/* node_done: the node answered (or did not): the rest of the step is
 * queued. On the rpc client's thread. */
static void
node_done(void *arg, int code, uint8_t *reply, size_t len, char *errmsg)
{
	struct moat_record_job *job = arg;

	job->ended_ms = moat_now_unix_ms();
	job->code = code;
	job->reply = reply;
	job->reply_len = len;
	job->errmsg = errmsg;
	push(job->rec->pool, job, JOB_AFTER);
}

/* run_start: the sandbox's turn is job's: refresh, then send to the
 * node. */
static void
run_start(struct moat_record_job *job)
{
	struct moat_record_pool *p = job->rec->pool;
	struct moat_rpc_call call;
	bool stopping;
	int rv;

	pthread_mutex_lock(&p->lock);
	stopping = p->stopping;
	pthread_mutex_unlock(&p->lock);
	if (stopping || moat_forward_draining(job->rec->fw)) {
		job_end(job, MOAT_UNAVAILABLE,
		    "the gateway stopped before this step's turn came: it did "
		    "not run; retry on a running gateway");
		return;
	}
	moat_record_step_before(job->rec, job->e, job->tenant,
	    job->request_id);
	memset(&call, 0, sizeof(call));
	call.service = "moat.v1.Gateway";
	call.method = job->method;
	call.request_id = job->request_id;
	call.deadline_ms = job->deadline_ms;
	call.principal = job->tenant;
	call.auth = "";
	call.tenant = "";
	job->started_ms = moat_now_unix_ms();
	rv = moat_forward_call_async_fn(job->rec->fw, &call, job->sandbox_id,
	    job->payload, job->len, node_done, job);
	if (rv != MOAT_OK) {
		/* It did not run: no step. */
		job_end(job, rv, call.error_message);
		free(call.error_message);
	}
}

/* run_after: the node answered: record the step, then reply. */
static void
run_after(struct moat_record_job *job)
{
	struct moat_record_step_ctx c = {
		.request = job->request,
		.sandbox_id = job->sandbox_id,
		.tenant = job->tenant,
		.method = job->method,
		.request_id = job->request_id,
		.deadline_ms = job->deadline_ms,
		.started_ms = job->started_ms,
		.ended_ms = job->ended_ms,
	};

	if (job->code != MOAT_OK) {
		/* It did not run (or its answer was lost): no step. */
		job_end(job, job->code, job->errmsg);
		return;
	}
	moat_record_step_after(job->rec, job->e, &c, &job->reply,
	    &job->reply_len);
	if (job->safety != NULL)
		moat_gw_set_safety_raw(job->reply_desc, &job->reply,
		    &job->reply_len, job->safety);
	job_end(job, MOAT_OK, NULL);
}

/* recorder: one of the pool's threads; ends once the gateway stops and
 * no job is left. */
static void *
recorder(void *arg)
{
	struct moat_record_pool *p = arg;
	struct moat_record_job *job;

	for (;;) {
		pthread_mutex_lock(&p->lock);
		while (p->head == NULL && !(p->stopping && p->live == 0))
			pthread_cond_wait(&p->cv, &p->lock);
		if ((job = p->head) != NULL && (p->head = job->next) == NULL)
			p->tail = NULL;
		pthread_mutex_unlock(&p->lock);
		if (job == NULL)
			return NULL;
		if (job->part == JOB_START)
			run_start(job);
		else
			run_after(job);
	}
}

/* pool_admit: one more job, once the threads run (started here the
 * first time). False when none could start or the gateway stops: the
 * step is then recorded without deferring. */
static bool
pool_admit(struct moat_record *rec)
{
	struct moat_record_pool *p = rec->pool;
	bool ok;

	if (!moat_forward_async_begin(rec->fw))
		return false;
	pthread_mutex_lock(&p->lock);
	while (!p->stopping && p->n_threads < RECORD_THREADS &&
	    pthread_create(&p->threads[p->n_threads], NULL, recorder, p) == 0)
		p->n_threads++;
	ok = !p->stopping && p->n_threads > 0;
	if (ok)
		p->live++;
	pthread_mutex_unlock(&p->lock);
	if (!ok)
		moat_forward_async_end(rec->fw);
	return ok;
}

/* job_new: the copy of `call` a deferred step keeps; NULL when out of
 * memory. */
static struct moat_record_job *
job_new(struct moat_record *rec, struct moat_record_entry *e,
    const struct moat_rpc_call *call, const ProtobufCMessage *request,
    const char *sandbox_id, const char *tenant,
    const ProtobufCMessageDescriptor *reply_desc, const char *safety)
{
	struct moat_record_job *job = calloc(1, sizeof(*job));

	if (job == NULL)
		return NULL;
	job->w.job = job;
	job->rec = rec;
	job->e = e;
	job->request_id = call->request_id;
	job->deadline_ms = call->deadline_ms;
	job->reply_desc = reply_desc;
	job->len = call->payload_len;
	job->method = strdup(call->method);
	job->tenant = strdup(tenant);
	job->sandbox_id = strdup(sandbox_id);
	job->payload = malloc(job->len ? job->len : 1);
	if (safety != NULL)
		job->safety = strdup(safety);
	if (job->method == NULL || job->tenant == NULL ||
	    job->sandbox_id == NULL || job->payload == NULL ||
	    (safety != NULL && job->safety == NULL)) {
		job_free(job);
		return NULL;
	}
	if (job->len > 0)
		memcpy(job->payload, call->payload, job->len);
	/* The server frees its decoded request once the handler returns. */
	job->request = protobuf_c_message_unpack(request->descriptor, NULL,
	    job->len, job->payload);
	if (job->request == NULL) {
		job_free(job);
		return NULL;
	}
	return job;
}

int
moat_record_step_async(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, const char *sandbox_id,
    const char *tenant, const ProtobufCMessageDescriptor *reply_desc,
    const char *safety, bool *handled)
{
	struct moat_record_entry *e;
	struct moat_record_job *job;

	if (call->rpc_private == NULL || rec->pool == NULL)
		return moat_record_step(rec, call, request, sandbox_id, tenant,
		    handled);
	e = moat_record_entry_of(rec, tenant, sandbox_id, call->request_id);
	if (!(*handled = e != NULL))
		return MOAT_OK;
	job = job_new(rec, e, call, request, sandbox_id, tenant, reply_desc,
	    safety);
	if (job == NULL || !pool_admit(rec)) {
		if (job != NULL)
			job_free(job);
		return moat_record_step(rec, call, request, sandbox_id, tenant,
		    handled);
	}
	if ((job->d = moat_rpc_defer(call)) == NULL) {
		/* Too many deferred calls: this one waits, as before. */
		job_free(job);
		pool_leave(rec);
		return moat_record_step(rec, call, request, sandbox_id, tenant,
		    handled);
	}
	if (moat_record_entry_enqueue(e, &job->w))
		moat_record_job_start(rec, job);
	return MOAT_OK; /* answered by job_end */
}
