/*
 * pushq.c: the background push of step snapshots to moat-snapd (see
 * pushq.h). One FIFO queue, one worker: pushes run one at a time, in the
 * order the snapshots were taken, so each finds its parent (the
 * sandbox's previous pushed snapshot) already stored and sends only the
 * chunks that changed. A push's outcome goes into the snapshot's meta
 * (remote_id, remote_stored, remote_error ...), read back by
 * ListLocalSnapshots, eviction and deletion. Locks: q->mu guards the
 * queue and `running`; it is never held across I/O. Not for: the push
 * itself (snapshot_push.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "pushq.h"
#include "snapshot_meta.h"
#include "snapshot_push.h"
#include "sync.h"

struct push_job {
	struct push_job *next;
	uint64_t request_id;
	char *id, *dir, *sandbox_id;
};

struct vmd_pushq {
	pthread_mutex_t mu;
	pthread_cond_t cv;              /* a job queued, one done, stop */
	struct push_job *head, *tail;   /* queued, oldest first */
	const struct push_job *running; /* being pushed now, or NULL */
	bool stopping;
	pthread_t thread;
};

static void
job_free(struct push_job *j)
{
	if (j == NULL)
		return;
	free(j->id);
	free(j->dir);
	free(j->sandbox_id);
	free(j);
}

/* Replaces string field *field of an unpacked message with a copy of
 * `value` (NULL: ""); the old value is freed unless it is protobuf-c's
 * shared empty string (what an unset field points to). */
static bool
replace_str(char **field, const char *value)
{
	char *copy = strdup(value != NULL ? value : "");

	if (copy == NULL)
		return false;
	if (*field != NULL && *field != protobuf_c_empty_string)
		free(*field);
	*field = copy;
	return true;
}

/* Records `res` in the meta of snapshot j->dir, read again now so what
 * others wrote meanwhile (last use, location) is kept. */
static void
job_record(const struct push_job *j, const char *parent,
    const struct vmd_push_result *res)
{
	Moat__V1__LocalSnapshot *m = NULL;
	int e;

	if ((e = vmd_snapshot_read_meta(j->dir, &m)) != 0) {
		moat_warn(j->request_id,
		    "snapshot %s: its push ended but its meta cannot be "
		    "read (%s): deleted meanwhile?",
		    j->id, strerror(e));
		return;
	}
	m->remote_stored = res->remote_id != NULL;
	m->remote_stored_bytes = res->stored_bytes;
	m->remote_logical_bytes = res->logical_bytes;
	if (!replace_str(&m->remote_id, res->remote_id) ||
	    !replace_str(&m->remote_error, res->error) ||
	    !replace_str(&m->remote_parent_id,
	        res->remote_id != NULL ? parent : "")) {
		moat_warn(j->request_id,
		    "snapshot %s: out of memory recording its push", j->id);
	} else if ((e = vmd_snapshot_write_meta(j->dir, m)) != 0) {
		moat_warn(j->request_id,
		    "snapshot %s: cannot record its push in %s/meta.pb: %s",
		    j->id, j->dir, strerror(e));
	}
	moat__v1__local_snapshot__free_unpacked(m, NULL);
}

/* Pushes one snapshot; its meta may be gone (deleted while queued is
 * cancelled, so only a broken directory gets here). */
static void
job_run(struct vmd *vmd, const struct push_job *j)
{
	Moat__V1__LocalSnapshot *m = NULL;
	struct vmd_push_result res = { 0 };
	char *parent, *root = strdup(j->dir), *slash;
	int e;

	if (root != NULL && (slash = strrchr(root, '/')) != NULL)
		*slash = '\0';
	if ((e = vmd_snapshot_read_meta(j->dir, &m)) != 0) {
		moat_warn(j->request_id,
		    "snapshot %s: not pushed: its meta cannot be read (%s)",
		    j->id, strerror(e));
		free(root);
		return;
	}
	/* The sandbox's previous snapshot, pushed before this one. */
	parent =
	    root != NULL ? vmd_snapshot_parent(root, j->sandbox_id) : NULL;
	vmd_snapshot_push(vmd, j->request_id, m, j->dir,
	    parent != NULL ? parent : "", &res);
	job_record(j, parent != NULL ? parent : "", &res);
	moat__v1__local_snapshot__free_unpacked(m, NULL);
	free(parent);
	free(root);
	free(res.remote_id);
	free(res.error);
}

static void *
pushq_main(void *arg)
{
	struct vmd *vmd = arg;
	struct vmd_pushq *q = vmd->pushq;
	struct push_job *j;

	pthread_mutex_lock(&q->mu);
	for (;;) {
		while (q->head == NULL && !q->stopping)
			pthread_cond_wait(&q->cv, &q->mu);
		if (q->stopping)
			break;
		j = q->head;
		q->head = j->next;
		if (q->head == NULL)
			q->tail = NULL;
		q->running = j;
		pthread_mutex_unlock(&q->mu);
		job_run(vmd, j);
		pthread_mutex_lock(&q->mu);
		q->running = NULL;
		pthread_cond_broadcast(&q->cv);
		job_free(j);
	}
	pthread_mutex_unlock(&q->mu);
	return NULL;
}

int
vmd_pushq_start(struct vmd *vmd)
{
	struct vmd_pushq *q;
	int e;

	if (vmd->snapd == NULL)
		return MOAT_OK;
	if ((q = calloc(1, sizeof(*q))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	vmd->pushq = q;
	if ((e = vmd_thread_create(&q->thread, pushq_main, vmd)) != 0) {
		moat_warn(0,
		    "cannot start the snapshot push thread (%s): snapshots "
		    "are pushed to moat-snapd before SnapshotSandbox answers",
		    strerror(e));
		vmd->pushq = NULL;
		pthread_cond_destroy(&q->cv);
		pthread_mutex_destroy(&q->mu);
		free(q);
		return moat_status_from_errno(e);
	}
	return MOAT_OK;
}

void
vmd_pushq_stop(struct vmd *vmd)
{
	struct vmd_pushq *q = vmd->pushq;
	struct push_job *j, *next;
	size_t abandoned = 0;

	if (q == NULL)
		return;
	pthread_mutex_lock(&q->mu);
	q->stopping = true;
	for (j = q->head; j != NULL; j = next) {
		next = j->next;
		job_free(j);
		abandoned++;
	}
	q->head = q->tail = NULL;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
	pthread_join(q->thread, NULL); /* after the running push */
	if (abandoned > 0)
		moat_info(0,
		    "%zu snapshot push(es) to moat-snapd abandoned at stop: "
		    "those snapshots stay on this node and are pushed when "
		    "evicted",
		    abandoned);
	vmd->pushq = NULL;
	pthread_cond_destroy(&q->cv);
	pthread_mutex_destroy(&q->mu);
	free(q);
}

bool
vmd_pushq_add(struct vmd *vmd, uint64_t request_id, const char *id,
    const char *dir, const char *sandbox_id)
{
	struct vmd_pushq *q = vmd->pushq;
	struct push_job *j;

	if (q == NULL || (j = calloc(1, sizeof(*j))) == NULL)
		return false;
	j->request_id = request_id;
	j->id = strdup(id);
	j->dir = strdup(dir);
	j->sandbox_id = strdup(sandbox_id);
	if (j->id == NULL || j->dir == NULL || j->sandbox_id == NULL) {
		job_free(j);
		return false;
	}
	pthread_mutex_lock(&q->mu);
	if (q->stopping) {
		pthread_mutex_unlock(&q->mu);
		job_free(j);
		return false;
	}
	if (q->tail != NULL)
		q->tail->next = j;
	else
		q->head = j;
	q->tail = j;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
	return true;
}

bool
vmd_pushq_pending(struct vmd *vmd, const char *id)
{
	struct vmd_pushq *q = vmd->pushq;
	bool found = false;

	if (q == NULL)
		return false;
	pthread_mutex_lock(&q->mu);
	found = q->running != NULL && strcmp(q->running->id, id) == 0;
	for (const struct push_job *j = q->head; j != NULL && !found;
	     j = j->next)
		found = strcmp(j->id, id) == 0;
	pthread_mutex_unlock(&q->mu);
	return found;
}

void
vmd_pushq_settle(struct vmd *vmd, const char *id)
{
	struct vmd_pushq *q = vmd->pushq;
	struct push_job **pp, *j = NULL;

	if (q == NULL)
		return;
	pthread_mutex_lock(&q->mu);
	for (pp = &q->head; *pp != NULL; pp = &(*pp)->next)
		if (strcmp((*pp)->id, id) == 0) {
			j = *pp;
			*pp = j->next;
			break;
		}
	if (j != NULL) {
		/* The tail is the last job left, if any. */
		q->tail = q->head;
		while (q->tail != NULL && q->tail->next != NULL)
			q->tail = q->tail->next;
	}
	while (q->running != NULL && strcmp(q->running->id, id) == 0)
		pthread_cond_wait(&q->cv, &q->mu);
	pthread_mutex_unlock(&q->mu);
	if (j != NULL)
		moat_debug(j->request_id,
		    "snapshot %s: its queued push was cancelled", id);
	job_free(j);
}
