/*
 * writer.c: sessiond's one LMDB writer thread. Handlers hand their writes
 * (create, append, delete, set snapshot, set keep) to it through a bounded
 * queue and wait; it takes everything queued (up to a batch limit),
 * applies it in one write transaction and commits once, with fsync, so
 * many sandboxes recording at once share one durable commit (group
 * commit) and every write is acknowledged only after that commit
 * returned. A write that adds or removes a snapshot reference (a step's
 * snapshot_id, a session's step-0 label) changes its count (refs.c) in
 * the same transaction.
 *
 * Each op makes all its checks before its first put, so an op that is
 * refused (unknown session, wrong index) leaves the shared transaction
 * clean and the others go on. When the store itself fails inside a batch
 * (map full, I/O error) or the commit fails, the batch is dropped and each
 * op is run again in its own transaction, so each gets its own answer.
 * Not for: validating requests (validate.c) or reads (handlers.c read in
 * their own threads with read transactions).
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guest.pb-c.h"
#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/util.h"
#include "metrics.h"
#include "sessiond.h"

#define QUEUE_CAP 1024              /* ops waiting for the writer */
#define BATCH_MAX_OPS 512           /* ops in one transaction */
#define BATCH_MAX_BYTES (64u << 20) /* their rough size */

struct sessiond_writer {
	struct moat_store *store; /* borrowed */
	pthread_t thread;
	bool thread_started;
	/* `lock` guards the ring, `stopping` and `idle`. */
	pthread_mutex_t lock;
	pthread_cond_t not_empty; /* writer waits for work */
	/* The writer waits on not_empty and nobody has woken it yet: only
	 * then does a submit signal, not once per op. */
	bool idle;
	pthread_cond_t not_full; /* handlers wait for room */
	size_t room_waiters;     /* handlers waiting on not_full */
	struct sessiond_op *ring[QUEUE_CAP];
	size_t head;
	size_t count;
	bool stopping;
	uint64_t batches;
	uint64_t ops;
};

/* op_reset: forgets the results of a try, so the op can run again. */
static void
op_reset(struct sessiond_op *op)
{
	free(op->errmsg);
	free(op->record);
	op->errmsg = NULL;
	op->record = NULL;
	op->record_len = 0;
	op->status = MOAT_OK;
	op->result_index = 0;
	op->result_count = 0;
	sessiond_strings_free(op->unreferenced, op->n_unreferenced);
	op->unreferenced = NULL;
	op->n_unreferenced = 0;
}

/* put_packed: packs msg and puts it under key. */
static int
put_packed(struct moat_store_txn *txn, const char *db, const void *key,
    size_t klen, const ProtobufCMessage *msg, char **errmsg)
{
	uint8_t *buf;
	size_t len;
	int rv;

	if ((buf = sessiond_pack(msg, &len)) == NULL) {
		*errmsg = moat_asprintf("out of memory packing a %s",
		    msg->descriptor->short_name);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rv = moat_store_put(txn, db, key, klen, buf, len, false, errmsg);
	free(buf);
	return rv;
}

/* put_indexes: the by_tenant and by_sandbox entries of a session. */
static int
put_indexes(struct moat_store_txn *txn, const Moat__V1__SessionInfo *s,
    const struct sessiond_id *id, bool del, char **errmsg)
{
	uint8_t key[SESSIOND_KEY_INDEX_MAX];
	size_t klen;
	int rv;

	klen = sessiond_key_by_tenant(key, sizeof(key), s->tenant,
	    s->created_ms, id, NULL);
	rv = del ?
	    moat_store_del(txn, "by_tenant", key, klen, errmsg) :
	    moat_store_put(txn, "by_tenant", key, klen, "", 0, false, errmsg);
	if (rv != MOAT_OK && !(del && rv == MOAT_NOT_FOUND))
		return rv;
	klen = sessiond_key_by_sandbox(key, sizeof(key), s->tenant,
	    s->sandbox_id, s->created_ms, id, NULL);
	rv = del ?
	    moat_store_del(txn, "by_sandbox", key, klen, errmsg) :
	    moat_store_put(txn, "by_sandbox", key, klen, "", 0, false, errmsg);
	if (rv != MOAT_OK && !(del && rv == MOAT_NOT_FOUND))
		return rv;
	return MOAT_OK;
}

/* apply_create: a new session. Refusals: the parent is unknown or has
 * fewer steps than parent_step. */
static int
apply_create(struct moat_store_txn *txn, struct sessiond_op *op, bool *broken)
{
	const Moat__V1__CreateSessionRequest *req = op->create;
	Moat__V1__SessionInfo s = MOAT__V1__SESSION_INFO__INIT;
	Moat__V1__SessionInfo *parent = NULL;
	struct sessiond_id parent_id;
	const char *step0;
	const void *val;
	size_t len;
	bool parent_of_branch = false;
	int rv;

	if (req->parent_session_id != NULL &&
	    req->parent_session_id[0] != '\0') {
		parent_of_branch = true;
		if (!sessiond_id_parse(req->parent_session_id, &parent_id))
			abort(); /* validate.c checked it */
		if ((rv = sessiond_session_load(txn, op->tenant, &parent_id,
		         &parent, &op->errmsg)) != MOAT_OK) {
			*broken = rv != MOAT_NOT_FOUND;
			return rv;
		}
		if (req->parent_step > parent->step_count) {
			op->errmsg =
			    moat_asprintf("parent_step %llu: parent "
			                  "session %s has steps 1 to %llu",
			        (unsigned long long)req->parent_step,
			        parent_id.s,
			        (unsigned long long)parent->step_count);
			moat__v1__session_info__free_unpacked(parent, NULL);
			return MOAT_INVALID_ARGUMENT;
		}
		moat__v1__session_info__free_unpacked(parent, NULL);
	}
	/* 64 random bits: a collision is unlikely, but never overwrite. */
	do {
		sessiond_id_new(&op->id);
		rv = moat_store_get(txn, "sessions", op->id.s, SESSIOND_ID_LEN,
		    &val, &len, &op->errmsg);
	} while (rv == MOAT_OK);
	if (rv != MOAT_NOT_FOUND) {
		*broken = true;
		return rv;
	}
	s.id = op->id.s;
	s.tenant = req->tenant;
	s.sandbox_id = req->sandbox_id;
	s.created_ms = moat_now_unix_ms();
	s.n_labels = req->n_labels;
	s.labels = (Moat__V1__SessionInfo__LabelsEntry **)req->labels;
	s.parent_session_id = req->parent_session_id;
	s.parent_step = req->parent_step;
	/* A branch continues its parent's path (issue 18): its own steps
	 * are numbered from the branch point on. */
	if (parent_of_branch) {
		s.first_step = req->parent_step + 1;
		s.step_count = req->parent_step;
	}
	s.snapshot_policy = req->snapshot_policy;
	if ((op->record = sessiond_pack(&s.base, &op->record_len)) == NULL) {
		op->errmsg = moat_asprintf("out of memory");
		*broken = true;
		return MOAT_RESOURCE_EXHAUSTED;
	}
	step0 = sessiond_label(&s, SESSIOND_LABEL_STEP0);
	*broken = true; /* from here on, a failure dirties the txn */
	if ((rv = moat_store_put(txn, "sessions", op->id.s, SESSIOND_ID_LEN,
	         op->record, op->record_len, true, &op->errmsg)) != MOAT_OK ||
	    (rv = put_indexes(txn, &s, &op->id, false, &op->errmsg)) !=
	        MOAT_OK ||
	    (rv = sessiond_refs_move(txn, s.tenant, NULL, step0,
	         &op->errmsg)) != MOAT_OK)
		return rv;
	*broken = false;
	return MOAT_OK;
}

/* put_output: one stream of a step, in SESSIOND_CHUNK pieces. */
static int
put_output(struct moat_store_txn *txn, const struct sessiond_id *id,
    uint64_t index, int stream, const ProtobufCBinaryData *data, char **errmsg)
{
	uint8_t key[SESSIOND_ID_LEN + 13];
	uint32_t chunk = 0;
	int rv;

	for (size_t off = 0; off < data->len; off += SESSIOND_CHUNK) {
		size_t n = data->len - off;

		if (n > SESSIOND_CHUNK)
			n = SESSIOND_CHUNK;
		sessiond_key_output(key, id, index, stream, chunk++);
		if ((rv = moat_store_put(txn, "outputs", key, sizeof(key),
		         data->data + off, n, false, errmsg)) != MOAT_OK)
			return rv;
	}
	return MOAT_OK;
}

/* apply_append: the next step of a session. Refusals: unknown session,
 * step.index given and not the next one. */
static int
apply_append(struct moat_store_txn *txn, struct sessiond_op *op, bool *broken)
{
	const Moat__V1__Step *in = op->step;
	Moat__V1__Step rec;
	Moat__V1__FsTrace trace = MOAT__V1__FS_TRACE__INIT;
	Moat__V1__SessionInfo *s = NULL;
	uint8_t key[SESSIOND_ID_LEN + 8];
	uint64_t index;
	int rv;

	if ((rv = sessiond_session_load(txn, op->tenant, &op->id, &s,
	         &op->errmsg)) != MOAT_OK) {
		*broken = rv != MOAT_NOT_FOUND;
		return rv;
	}
	index = s->step_count + 1;
	if (in->index != 0 && in->index != index) {
		op->errmsg = moat_asprintf(
		    "step.index %llu: session %s is at "
		    "step %llu, so the next is %llu (or send 0 to take the "
		    "next)",
		    (unsigned long long)in->index, op->id.s,
		    (unsigned long long)s->step_count,
		    (unsigned long long)index);
		moat__v1__session_info__free_unpacked(s, NULL);
		return MOAT_FAILED_PRECONDITION;
	}
	/* The step record: everything but the outputs and the fs trace,
	 * which have their own sub-databases. A shallow copy of the
	 * request's step, so nothing is allocated. */
	rec = *in;
	rec.session_id = op->id.s;
	rec.index = index;
	rec.stdout.len = 0;
	rec.stdout.data = NULL;
	rec.stderr.len = 0;
	rec.stderr.data = NULL;
	rec.stdout_bytes = in->stdout.len;
	rec.stderr_bytes = in->stderr.len;
	rec.n_fs_trace = 0;
	rec.fs_trace = NULL;
	rec.outputs_omitted = false;
	*broken = true;
	sessiond_key_step(key, &op->id, index);
	if ((rv = put_packed(txn, "steps", key, sizeof(key), &rec.base,
	         &op->errmsg)) != MOAT_OK)
		goto out;
	if (in->n_fs_trace > 0) {
		trace.n_entries = in->n_fs_trace;
		trace.entries = in->fs_trace;
		trace.truncated = in->fs_trace_truncated;
		if ((rv = put_packed(txn, "fs_traces", key, sizeof(key),
		         &trace.base, &op->errmsg)) != MOAT_OK)
			goto out;
	}
	if ((rv = put_output(txn, &op->id, index, 0, &in->stdout,
	         &op->errmsg)) != MOAT_OK ||
	    (rv = put_output(txn, &op->id, index, 1, &in->stderr,
	         &op->errmsg)) != MOAT_OK)
		goto out;
	s->step_count = index;
	if ((rv = put_packed(txn, "sessions", op->id.s, SESSIOND_ID_LEN,
	         &s->base, &op->errmsg)) != MOAT_OK ||
	    (rv = sessiond_refs_move(txn, op->tenant, NULL, in->snapshot_id,
	         &op->errmsg)) != MOAT_OK)
		goto out;
	op->result_index = index;
	*broken = false;
out:
	moat__v1__session_info__free_unpacked(s, NULL);
	return rv;
}

/* cmp_string: qsort's order of C strings. */
static int
cmp_string(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* drop_refs: removes the references `ids` (n of them, sorted here) of the
 * session being deleted, and moves each id whose count fell to 0 into
 * op->unreferenced, once; those left in `ids` stay the caller's. */
static int
drop_refs(struct moat_store_txn *txn, struct sessiond_op *op, char **ids,
    size_t n)
{
	uint64_t left;
	size_t i, j;
	int rv;

	if (n == 0)
		return MOAT_OK;
	qsort(ids, n, sizeof(*ids), cmp_string);
	if ((op->unreferenced = calloc(n, sizeof(*op->unreferenced))) ==
	    NULL) {
		op->errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (i = 0; i < n; i = j) {
		for (j = i + 1; j < n && strcmp(ids[i], ids[j]) == 0; j++)
			;
		if ((rv = sessiond_refs_drop(txn, op->tenant, ids[i], j - i,
		         &left, &op->errmsg)) != MOAT_OK)
			return rv;
		if (left == 0) {
			op->unreferenced[op->n_unreferenced++] = ids[i];
			ids[i] = NULL;
		}
	}
	return MOAT_OK;
}

/* apply_delete: a session, its index entries, steps, traces, outputs, and
 * its snapshot references; op->unreferenced lists the snapshots nothing
 * of the tenant references any more. */
static int
apply_delete(struct moat_store_txn *txn, struct sessiond_op *op, bool *broken)
{
	Moat__V1__SessionInfo *s = NULL;
	char **ids = NULL;
	size_t n_ids = 0;
	int rv;

	if ((rv = sessiond_session_load(txn, op->tenant, &op->id, &s,
	         &op->errmsg)) != MOAT_OK) {
		*broken = rv != MOAT_NOT_FOUND;
		return rv;
	}
	/* Its references, read before its steps go. A failure here wrote
	 * nothing, but may be the store's: let the op run alone. */
	*broken = true;
	if ((rv = sessiond_session_snapshots(txn, s, &ids, &n_ids,
	         &op->errmsg)) != MOAT_OK)
		goto out;
	if ((rv = moat_store_del(txn, "sessions", op->id.s, SESSIOND_ID_LEN,
	         &op->errmsg)) != MOAT_OK ||
	    (rv = put_indexes(txn, s, &op->id, true, &op->errmsg)) !=
	        MOAT_OK ||
	    (rv = moat_store_del_prefix(txn, "steps", op->id.s,
	         SESSIOND_ID_LEN, &op->result_count, &op->errmsg)) !=
	        MOAT_OK ||
	    (rv = moat_store_del_prefix(txn, "fs_traces", op->id.s,
	         SESSIOND_ID_LEN, NULL, &op->errmsg)) != MOAT_OK ||
	    (rv = moat_store_del_prefix(txn, "outputs", op->id.s,
	         SESSIOND_ID_LEN, NULL, &op->errmsg)) != MOAT_OK ||
	    (rv = drop_refs(txn, op, ids, n_ids)) != MOAT_OK)
		goto out;
	*broken = false;
out:
	sessiond_strings_free(ids, n_ids);
	moat__v1__session_info__free_unpacked(s, NULL);
	return rv;
}

/* put_step: stores `rec` (the loaded `step`, changed) as step op->index
 * and packs the reply into op->record: the record with its fs trace and
 * outputs_omitted. The stored record has no fs trace (its own db) and
 * no outputs flag. */
static int
put_step(struct moat_store_txn *txn, struct sessiond_op *op,
    const Moat__V1__Step *step, Moat__V1__Step *rec)
{
	uint8_t key[SESSIOND_ID_LEN + 8];
	int rv;

	rec->n_fs_trace = 0;
	rec->fs_trace = NULL;
	rec->outputs_omitted = false;
	sessiond_key_step(key, &op->id, op->index);
	if ((rv = put_packed(txn, "steps", key, sizeof(key), &rec->base,
	         &op->errmsg)) != MOAT_OK)
		return rv;
	rec->n_fs_trace = step->n_fs_trace;
	rec->fs_trace = step->fs_trace;
	rec->outputs_omitted = true;
	if ((op->record = sessiond_pack(&rec->base, &op->record_len)) ==
	    NULL) {
		op->errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}

/* load_step: the session and step op->index for SET_SNAPSHOT and
 * SET_KEEP; on failure both are NULL and *broken says whether the store
 * failed. A step the session inherits (issue 18) is the one its holder
 * keeps: *s is then the holder and op->id its id. */
static int
load_step(struct moat_store_txn *txn, struct sessiond_op *op,
    Moat__V1__SessionInfo **s, Moat__V1__Step **step, bool *broken)
{
	Moat__V1__SessionInfo *owned = NULL;
	const Moat__V1__SessionInfo *holder;
	int rv;

	*step = NULL;
	if ((rv = sessiond_session_load(txn, op->tenant, &op->id, s,
	         &op->errmsg)) != MOAT_OK) {
		*broken = rv != MOAT_NOT_FOUND;
		return rv;
	}
	if ((rv = sessiond_path_holder(txn, *s, op->index, &owned, &holder,
	         &op->errmsg)) == MOAT_OK) {
		/* owned: an ancestor holds it (NULL: the session does). */
		if (owned != NULL) {
			moat__v1__session_info__free_unpacked(*s, NULL);
			*s = owned;
		}
		if (owned != NULL && !sessiond_id_parse((*s)->id, &op->id)) {
			op->errmsg = moat_asprintf(
			    "session record \"%.40s\" has a bad id: the "
			    "store is damaged",
			    (*s)->id);
			rv = MOAT_DATA_LOSS;
		} else {
			rv = sessiond_step_load(txn, *s, op->index, true, step,
			    &op->errmsg);
		}
	}
	if (rv != MOAT_OK) {
		*broken =
		    rv != MOAT_NOT_FOUND && rv != MOAT_FAILED_PRECONDITION;
		moat__v1__session_info__free_unpacked(*s, NULL);
		*s = NULL;
	}
	return rv;
}

/* set_step0: SetStepSnapshot with index 0: the session's step-0 labels
 * (the snapshot, or why it is gone) and the reference they hold. The
 * reply is a Step of index 0 with snapshot_id or snapshot_removed. */
static int
set_step0(struct moat_store_txn *txn, struct sessiond_op *op,
    Moat__V1__SessionInfo *s, bool *broken)
{
	Moat__V1__SessionInfo__LabelsEntry snap =
	    MOAT__V1__SESSION_INFO__LABELS_ENTRY__INIT;
	Moat__V1__SessionInfo__LabelsEntry removed =
	    MOAT__V1__SESSION_INFO__LABELS_ENTRY__INIT;
	Moat__V1__SessionInfo__LabelsEntry **labels, **stored = s->labels;
	Moat__V1__Step reply = MOAT__V1__STEP__INIT;
	const char *to = op->snapshot_id ? op->snapshot_id : "";
	const char *reason =
	    to[0] == '\0' && op->removed_reason ? op->removed_reason : "";
	const char *from = sessiond_label(s, SESSIOND_LABEL_STEP0);
	size_t n = 0, n_stored = s->n_labels;
	int rv;

	if ((labels = calloc(n_stored + 2, sizeof(*labels))) == NULL) {
		op->errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (size_t i = 0; i < n_stored; i++)
		if (strcmp(stored[i]->key, SESSIOND_LABEL_STEP0) != 0 &&
		    strcmp(stored[i]->key, SESSIOND_LABEL_STEP0_REMOVED) != 0)
			labels[n++] = stored[i];
	if (to[0] != '\0') {
		snap.key = (char *)SESSIOND_LABEL_STEP0;
		snap.value = (char *)to;
		labels[n++] = &snap;
	}
	if (reason[0] != '\0') {
		removed.key = (char *)SESSIOND_LABEL_STEP0_REMOVED;
		removed.value = (char *)reason;
		labels[n++] = &removed;
	}
	/* The session's own labels go back before it is freed; `from`
	 * points into them. */
	s->labels = labels;
	s->n_labels = n;
	*broken = true;
	rv = put_packed(txn, "sessions", op->id.s, SESSIOND_ID_LEN, &s->base,
	    &op->errmsg);
	s->labels = stored;
	s->n_labels = n_stored;
	free(labels);
	if (rv != MOAT_OK ||
	    (rv = sessiond_refs_move(txn, op->tenant, from, to,
	         &op->errmsg)) != MOAT_OK)
		return rv;
	reply.session_id = op->id.s;
	reply.index = 0;
	reply.snapshot_id = (char *)to;
	reply.snapshot_removed = (char *)reason;
	reply.outputs_omitted = true;
	if ((op->record = sessiond_pack(&reply.base, &op->record_len)) ==
	    NULL) {
		op->errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	*broken = false;
	return MOAT_OK;
}

/* apply_set_snapshot: replaces the snapshot id of a step (index 0: of the
 * session's step 0), with the reason when it is emptied, and moves the
 * reference; the new record (without outputs) is the result. */
static int
apply_set_snapshot(struct moat_store_txn *txn, struct sessiond_op *op,
    bool *broken)
{
	Moat__V1__SessionInfo *s = NULL;
	Moat__V1__Step *step = NULL;
	Moat__V1__Step rec;
	const char *to = op->snapshot_id ? op->snapshot_id : "";
	int rv;

	if (op->index == 0) {
		if ((rv = sessiond_session_load(txn, op->tenant, &op->id, &s,
		         &op->errmsg)) != MOAT_OK) {
			*broken = rv != MOAT_NOT_FOUND;
			return rv;
		}
		rv = set_step0(txn, op, s, broken);
		moat__v1__session_info__free_unpacked(s, NULL);
		return rv;
	}
	if ((rv = load_step(txn, op, &s, &step, broken)) != MOAT_OK)
		return rv;
	rec = *step;
	rec.snapshot_id = (char *)to;
	rec.snapshot_removed =
	    (char *)(to[0] == '\0' && op->removed_reason ? op->removed_reason :
	                                                   "");
	*broken = true;
	if ((rv = put_step(txn, op, step, &rec)) != MOAT_OK ||
	    (rv = sessiond_refs_move(txn, op->tenant, step->snapshot_id, to,
	         &op->errmsg)) != MOAT_OK)
		goto out;
	*broken = false;
out:
	moat__v1__step__free_unpacked(step, NULL);
	moat__v1__session_info__free_unpacked(s, NULL);
	return rv;
}

/* apply_set_keep: pins or unpins a step; the new record (without
 * outputs) is the result. */
static int
apply_set_keep(struct moat_store_txn *txn, struct sessiond_op *op,
    bool *broken)
{
	Moat__V1__SessionInfo *s = NULL;
	Moat__V1__Step *step = NULL;
	Moat__V1__Step rec;
	int rv;

	if ((rv = load_step(txn, op, &s, &step, broken)) != MOAT_OK)
		return rv;
	rec = *step;
	rec.keep = op->keep;
	*broken = true;
	if ((rv = put_step(txn, op, step, &rec)) != MOAT_OK)
		goto out;
	*broken = false;
out:
	moat__v1__step__free_unpacked(step, NULL);
	moat__v1__session_info__free_unpacked(s, NULL);
	return rv;
}

/* apply: one op inside `txn`. *broken says whether a failure left
 * writes in the transaction (or the transaction unusable). */
static int
apply(struct moat_store_txn *txn, struct sessiond_op *op, bool *broken)
{
	*broken = false;
	switch (op->kind) {
	case SESSIOND_OP_CREATE:
		return apply_create(txn, op, broken);
	case SESSIOND_OP_APPEND:
		return apply_append(txn, op, broken);
	case SESSIOND_OP_DELETE:
		return apply_delete(txn, op, broken);
	case SESSIOND_OP_SET_SNAPSHOT:
		return apply_set_snapshot(txn, op, broken);
	case SESSIOND_OP_SET_KEEP:
		return apply_set_keep(txn, op, broken);
	}
	abort();
}

/* run_alone: one op in its own transaction. */
static void
run_alone(struct moat_store *st, struct sessiond_op *op)
{
	struct moat_store_txn *txn;
	bool broken;
	double t;

	op_reset(op);
	if ((op->status = moat_store_txn_begin(st, true, &txn, &op->errmsg)) !=
	    MOAT_OK)
		return;
	if ((op->status = apply(txn, op, &broken)) != MOAT_OK) {
		moat_store_txn_abort(txn);
		return;
	}
	t = moat_metrics_now();
	op->status = moat_store_txn_commit(txn, &op->errmsg);
	sessiond_metrics_commit(1, op->status == MOAT_OK,
	    moat_metrics_now() - t);
}

/* run_batch: the ops in one transaction and one durable commit; falls
 * back to one transaction each when the store fails. */
static void
run_batch(struct moat_store *st, struct sessiond_op **ops, size_t n)
{
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	bool broken = false;
	double t;
	int rv;

	if (n == 1) {
		run_alone(st, ops[0]);
		return;
	}
	if ((rv = moat_store_txn_begin(st, true, &txn, &errmsg)) != MOAT_OK)
		goto fallback;
	for (size_t i = 0; i < n && !broken; i++) {
		op_reset(ops[i]);
		ops[i]->status = apply(txn, ops[i], &broken);
	}
	if (broken) {
		moat_store_txn_abort(txn);
		goto fallback;
	}
	t = moat_metrics_now();
	rv = moat_store_txn_commit(txn, &errmsg);
	sessiond_metrics_commit(n, rv == MOAT_OK, moat_metrics_now() - t);
	if (rv != MOAT_OK) {
		moat_warn(0,
		    "sessiond: group commit of %zu writes failed "
		    "(%s); retrying them one by one",
		    n, errmsg);
		goto fallback;
	}
	return;

fallback:
	free(errmsg);
	for (size_t i = 0; i < n; i++)
		run_alone(st, ops[i]);
}

static void *
writer_main(void *arg)
{
	struct sessiond_writer *w = arg;
	struct sessiond_op *batch[BATCH_MAX_OPS];
	size_t n, bytes;

	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (w->count == 0 && !w->stopping) {
			w->idle = true;
			pthread_cond_wait(&w->not_empty, &w->lock);
		}
		w->idle = false;
		if (w->count == 0)
			break;
		/* Take what is queued: at least one op, then as many as fit
		 * the batch limits. */
		n = 0;
		bytes = 0;
		while (w->count > 0 && n < BATCH_MAX_OPS &&
		    (n == 0 ||
		        bytes + w->ring[w->head]->bytes <= BATCH_MAX_BYTES)) {
			batch[n] = w->ring[w->head];
			bytes += batch[n++]->bytes;
			w->head = (w->head + 1) % QUEUE_CAP;
			w->count--;
		}
		if (w->room_waiters > 0)
			pthread_cond_broadcast(&w->not_full);
		pthread_mutex_unlock(&w->lock);

		run_batch(w->store, batch, n);

		/* The writer wakes only the first handler, which wakes the
		 * others (sessiond_writer_submit): each wake lets the woken
		 * thread preempt the waker, and the writer, the one thread
		 * every write waits for, should be on its next commit, not
		 * waking handlers. Outside the queue's lock, so a woken
		 * handler has no lock to wait for. */
		for (size_t i = 0; i < n; i++)
			batch[i]->wake_next = i + 1 < n ? batch[i + 1] : NULL;
		sem_post(&batch[0]->done);
		pthread_mutex_lock(&w->lock);
		w->batches++;
		w->ops += n;
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

int
sessiond_writer_start(struct sessiond_writer **out, struct moat_store *st,
    char **errmsg)
{
	struct sessiond_writer *w;
	pthread_condattr_t ca;
	int rc;

	*out = NULL;
	if ((w = calloc(1, sizeof(*w))) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	w->store = st;
	pthread_mutex_init(&w->lock, NULL);
	/* Handlers wait for room against the monotonic deadline. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->not_full, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&w->not_empty, NULL);
	if ((rc = pthread_create(&w->thread, NULL, writer_main, w)) != 0) {
		*errmsg = moat_asprintf("cannot start the writer thread: %s",
		    strerror(rc));
		sessiond_writer_stop(w);
		return moat_status_from_errno(rc);
	}
	w->thread_started = true;
	*out = w;
	return MOAT_OK;
}

void
sessiond_writer_stop(struct sessiond_writer *w)
{
	if (w == NULL)
		return;
	if (w->thread_started) {
		pthread_mutex_lock(&w->lock);
		w->stopping = true;
		w->idle = false;
		pthread_cond_signal(&w->not_empty);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->thread, NULL);
		moat_info(0,
		    "sessiond: writer stopped after %llu writes in "
		    "%llu commits",
		    (unsigned long long)w->ops,
		    (unsigned long long)w->batches);
	}
	pthread_cond_destroy(&w->not_empty);
	pthread_cond_destroy(&w->not_full);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

int
sessiond_writer_submit(struct sessiond_writer *w, struct sessiond_op *op,
    uint64_t deadline_ms)
{
	struct timespec ts;
	double t0 = moat_metrics_now();
	int rc = 0;

	op->status = MOAT_OK;
	op->errmsg = NULL;
	op->record = NULL;
	op->unreferenced = NULL;
	op->n_unreferenced = 0;
	op->wake_next = NULL;
	if (sem_init(&op->done, 0, 0) != 0) {
		op->errmsg = moat_asprintf("cannot wait for the writer: %s",
		    strerror(errno));
		return op->status = MOAT_INTERNAL;
	}
	ts.tv_sec = (time_t)(deadline_ms / 1000);
	ts.tv_nsec = (long)(deadline_ms % 1000) * 1000000L;
	pthread_mutex_lock(&w->lock);
	w->room_waiters++;
	while (w->count == QUEUE_CAP && !w->stopping && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&w->not_full, &w->lock, &ts);
	w->room_waiters--;
	if (w->count == QUEUE_CAP || w->stopping) {
		pthread_mutex_unlock(&w->lock);
		sem_destroy(&op->done);
		op->errmsg = moat_asprintf(
		    "sessiond's write queue (%d "
		    "writes) stayed full until the call's deadline: the disk "
		    "is slower than the writes; retry later",
		    QUEUE_CAP);
		op->status = MOAT_UNAVAILABLE;
		sessiond_metrics_write(op->kind, op->status,
		    moat_metrics_now() - t0);
		return op->status;
	}
	w->ring[(w->head + w->count) % QUEUE_CAP] = op;
	w->count++;
	if (w->idle) {
		w->idle = false;
		pthread_cond_signal(&w->not_empty);
	}
	pthread_mutex_unlock(&w->lock);
	/* Once queued the op must finish before it leaves this stack: the
	 * writer never takes long to answer each one. The post orders the
	 * writer's results (of the whole batch) before what follows. */
	while (sem_wait(&op->done) != 0)
		; /* EINTR (the only error): a signal */
	/* The first op of a batch wakes the rest. An op is its handler's
	 * again once posted, so its successor is read before; sem_post
	 * touches nothing of it after (glibc allows destroying a semaphore
	 * as soon as sem_wait returns). */
	for (struct sessiond_op *next = op->wake_next, *o; next != NULL;) {
		o = next;
		next = o->wake_next;
		o->wake_next = NULL;
		sem_post(&o->done);
	}
	sem_destroy(&op->done);
	sessiond_metrics_write(op->kind, op->status, moat_metrics_now() - t0);
	return op->status;
}

size_t
sessiond_writer_queued(struct sessiond_writer *w)
{
	size_t n;

	if (w == NULL)
		return 0;
	pthread_mutex_lock(&w->lock);
	n = w->count;
	pthread_mutex_unlock(&w->lock);
	return n;
}
