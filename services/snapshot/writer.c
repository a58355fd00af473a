/*
 * writer.c: moat-snapd's one writer thread. Handlers queue write jobs
 * (PutChunks, CommitManifest, DeleteSnapshot, the sweep of abandoned
 * uploads) on a bounded queue and wait; the writer takes every job queued
 * (up to a batch), runs each in its own nested LMDB transaction inside
 * one parent transaction, and commits the parent once: one fsync for many
 * jobs, while a job that fails (a missing chunk, a full map) is dropped
 * alone without touching the others. Readers never come here: they open
 * read transactions on their own threads.
 * Not for: what the jobs do (handlers.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapd.h"

#define WRITER_BATCH 32 /* jobs per parent transaction */

struct snapd_job {
	snapd_job_fn fn;
	void *arg;
	int status;
	char *errmsg; /* heap; handed to the submitter */
	bool done;
	struct snapd_job *next;
};

struct snapd_writer {
	struct snapd *sd;
	pthread_t thread;
	bool thread_started;
	/* lock guards everything below it. */
	pthread_mutex_t lock;
	pthread_cond_t work;     /* a job was queued, or stopping */
	pthread_cond_t space;    /* the queue has room */
	pthread_cond_t finished; /* some job is done */
	struct snapd_job *head, *tail;
	size_t queued, queue_len;
	bool stopping;
};

/* finish: marks a batch done, moving messages to the submitters. */
static void
finish(struct snapd_writer *w, struct snapd_job **jobs, size_t n)
{
	pthread_mutex_lock(&w->lock);
	for (size_t i = 0; i < n; i++)
		jobs[i]->done = true;
	pthread_cond_broadcast(&w->finished);
	pthread_mutex_unlock(&w->lock);
}

/* run_batch: the jobs in one parent transaction; see the file comment. */
static void
run_batch(struct snapd_writer *w, struct snapd_job **jobs, size_t n)
{
	struct moat_store_txn *parent = NULL, *child;
	char *errmsg = NULL;
	size_t ok = 0;
	int rv;

	if ((rv = moat_store_txn_begin(w->sd->store, true, &parent,
	         &errmsg)) != MOAT_OK) {
		for (size_t i = 0; i < n; i++) {
			jobs[i]->status = rv;
			jobs[i]->errmsg = moat_asprintf("%s", errmsg);
		}
		free(errmsg);
		finish(w, jobs, n);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		struct snapd_job *j = jobs[i];

		if ((rv = moat_store_txn_begin_child(parent, &child,
		         &j->errmsg)) != MOAT_OK) {
			j->status = rv;
			continue;
		}
		j->status = j->fn(w->sd, child, j->arg, &j->errmsg);
		if (j->status == MOAT_OK) {
			if ((j->status = moat_store_txn_commit(child,
			         &j->errmsg)) == MOAT_OK)
				ok++;
		} else {
			moat_store_txn_abort(child);
		}
	}
	/* Nothing a job did is visible, or durable, before this commit. */
	if (ok == 0) {
		moat_store_txn_abort(parent);
	} else if ((rv = moat_store_txn_commit(parent, &errmsg)) != MOAT_OK) {
		moat_warn(0, "snapd writer: commit of %zu jobs failed: %s", ok,
		    errmsg);
		for (size_t i = 0; i < n; i++) {
			if (jobs[i]->status != MOAT_OK)
				continue;
			jobs[i]->status = rv;
			jobs[i]->errmsg = moat_asprintf("%s", errmsg);
		}
		free(errmsg);
	}
	finish(w, jobs, n);
}

/* sweep: the periodic job that frees abandoned uploads. */
static void
sweep(struct snapd_writer *w)
{
	struct snapd_job job = { .fn = snapd_sweep_pending };
	struct snapd_job *jobs[1] = { &job };
	uint64_t freed = 0;

	job.arg = &freed;
	run_batch(w, jobs, 1);
	if (job.status != MOAT_OK)
		moat_warn(0, "snapd: sweep of abandoned chunks failed: %s",
		    job.errmsg ? job.errmsg : moat_strerror(job.status));
	else if (freed > 0)
		moat_info(0, "snapd: freed %llu chunks no manifest used",
		    (unsigned long long)freed);
	free(job.errmsg);
}

static void *
writer_main(void *arg)
{
	struct snapd_writer *w = arg;
	struct snapd_job *batch[WRITER_BATCH];
	uint64_t next_sweep = moat_rpc_now_ms() + w->sd->sweep_every_ms;
	struct timespec ts;
	size_t n;

	for (;;) {
		pthread_mutex_lock(&w->lock);
		while (w->head == NULL && !w->stopping) {
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&w->work, &w->lock, &ts);
			if (moat_rpc_now_ms() >= next_sweep)
				break;
		}
		if (w->head == NULL && w->stopping) {
			pthread_mutex_unlock(&w->lock);
			return NULL;
		}
		for (n = 0; n < WRITER_BATCH && w->head != NULL; n++) {
			batch[n] = w->head;
			w->head = w->head->next;
			w->queued--;
		}
		if (w->head == NULL)
			w->tail = NULL;
		pthread_cond_broadcast(&w->space);
		pthread_mutex_unlock(&w->lock);
		if (n > 0)
			run_batch(w, batch, n);
		if (moat_rpc_now_ms() >= next_sweep) {
			sweep(w);
			next_sweep = moat_rpc_now_ms() + w->sd->sweep_every_ms;
		}
	}
}

int
snapd_writer_start(struct snapd_writer **out, struct snapd *sd,
    size_t queue_len, char **errmsg)
{
	struct snapd_writer *w;
	int err;

	*out = NULL;
	if ((w = calloc(1, sizeof(*w))) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	w->sd = sd;
	w->queue_len = queue_len ? queue_len : 64;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->work, NULL);
	pthread_cond_init(&w->space, NULL);
	pthread_cond_init(&w->finished, NULL);
	if ((err = pthread_create(&w->thread, NULL, writer_main, w)) != 0) {
		*errmsg = moat_asprintf("starting the writer thread: %s",
		    strerror(err));
		snapd_writer_stop(w);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	w->thread_started = true;
	*out = w;
	return MOAT_OK;
}

void
snapd_writer_stop(struct snapd_writer *w)
{
	if (w == NULL)
		return;
	if (w->thread_started) {
		pthread_mutex_lock(&w->lock);
		w->stopping = true;
		pthread_cond_broadcast(&w->work);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
	}
	pthread_cond_destroy(&w->finished);
	pthread_cond_destroy(&w->space);
	pthread_cond_destroy(&w->work);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

int
snapd_writer_run(struct snapd_writer *w, snapd_job_fn fn, void *arg,
    uint64_t deadline_ms, char **errmsg)
{
	struct snapd_job job = { .fn = fn, .arg = arg };
	struct timespec ts;

	pthread_mutex_lock(&w->lock);
	while (w->queued >= w->queue_len && !w->stopping) {
		if (moat_rpc_now_ms() >= deadline_ms) {
			pthread_mutex_unlock(&w->lock);
			*errmsg = moat_asprintf(
			    "the snapshot store's write "
			    "queue stayed full (%zu jobs) until the deadline: "
			    "retry later, or send fewer writes at once",
			    w->queue_len);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&w->space, &w->lock, &ts);
	}
	if (w->stopping) {
		pthread_mutex_unlock(&w->lock);
		*errmsg =
		    moat_asprintf("moat-snapd is stopping: retry on "
		                  "another instance or after it restarts");
		return MOAT_UNAVAILABLE;
	}
	if (w->tail != NULL)
		w->tail->next = &job;
	else
		w->head = &job;
	w->tail = &job;
	w->queued++;
	pthread_cond_signal(&w->work);
	/* Once queued, the job runs: waiting for it is bounded by the
	 * writer's progress, not by the caller's deadline, so the caller
	 * always learns whether its write happened. */
	while (!job.done)
		pthread_cond_wait(&w->finished, &w->lock);
	pthread_mutex_unlock(&w->lock);
	if (job.status != MOAT_OK) {
		*errmsg = job.errmsg != NULL ?
		    job.errmsg :
		    moat_asprintf("%s", moat_strerror(job.status));
		return job.status;
	}
	free(job.errmsg);
	return MOAT_OK;
}
