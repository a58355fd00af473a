/*
 * record.c: recording of sandboxes (issue 3). A sandbox created with
 * `record` gets a session in moat-sessiond; every one-shot Exec on it is
 * forwarded as usual, then the gateway asks the node for the sandbox's
 * filesystem trace, diffs it against the trace taken after the previous
 * step (so a step lists only what it changed) and appends the step to
 * sessiond before replying. The exec has already run when recording
 * fails, so the result still goes back, with `recording_error` set.
 * Also the session calls clients make through the gateway (forwarded to
 * sessiond with the caller's tenant) and the trace diff itself.
 * The snapshot policy of a session is applied here too: EVERY snapshots
 * the sandbox when recording starts and after each step, MANUAL attaches
 * the snapshots clients take to the latest step; each snapshot names its
 * session and step, and once attached the tenant's retention runs
 * (retention.c). The table of recorded sandboxes lives in memory; a
 * gateway restarted finds the session of a sandbox again by asking
 * sessiond (ListSessions by sandbox). With several gateways the table is
 * a cache of sessiond: before each step the sandbox's latest session and
 * its step count are asked again (refresh), and "not recorded" is
 * believed for RECORD_NEGATIVE_TTL_MS only. The steps of one sandbox
 * are recorded one at a time in arrival order: its entry has one owner
 * and a FIFO of waiters. A client's Exec or RunCode is deferred and
 * recorded by record_async.c's threads with this file's before/after
 * parts; a call built inside the gateway (replay) runs them here, on
 * its own thread.
 * Not for: restore, fork and replay (travel.c), sessiond's storage
 * (services/session/), deferring steps (record_async.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/safety.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define SESSIOND_SERVICE "moat.v1.Session"
#define RECORD_CALL_MIN_MS 5000 /* trace / append get at least this */
#define RECORD_LOOKUP_MS 3000   /* finding a sandbox's session again */
/* A sandbox known not to be recorded is asked about again after this:
 * another gateway may have started recording it. */
#define RECORD_NEGATIVE_TTL_MS 5000

/* One recorded sandbox. Entries are allocated one by one and freed only
 * by moat_record_fini, so a pointer taken under the table lock stays
 * valid. Its steps are recorded one at a time, in arrival order: the
 * one running owns the entry (`busy`), the others wait in a FIFO, each
 * a thread waiting on `cv` or a deferred step (record_async.c) started
 * when its turn comes. Only the owner reads or writes what follows
 * `tail` (session_id and step0 also change under the table lock). */
struct moat_record_entry {
	pthread_mutex_t lock; /* guards busy, head, tail */
	pthread_cond_t cv;    /* a waiting thread's turn came */
	bool busy;            /* owned; false: head is NULL */
	struct moat_record_waiter *head, *tail;
	char sandbox_id[MOAT_ID_MAX];
	char session_id[MOAT_ID_MAX]; /* "" : known not to be recorded */
	bool gone;                    /* destroyed, or now records elsewhere */
	Moat__V1__SnapshotPolicy policy;
	uint64_t last_index;     /* the latest step (0: none yet) */
	char step0[MOAT_ID_MAX]; /* snapshot before step 1 ("" : none) */
	uint32_t snapshots;      /* steps with a snapshot, as far as this
	                             * gateway knows (UINT32_MAX: unknown) */
	Moat__V1__FsTrace *prev; /* owned: the trace after the last step */
	uint64_t checked_ms;     /* monotonic: when sessiond last said */
};

/* ---- the trace diff ---- */

static int
cmp_entry_path(const void *a, const void *b)
{
	const Moat__V1__FsTraceEntry *x = *(Moat__V1__FsTraceEntry *const *)a;
	const Moat__V1__FsTraceEntry *y = *(Moat__V1__FsTraceEntry *const *)b;

	return strcmp(x->path ? x->path : "", y->path ? y->path : "");
}

/* sorted_view: a heap array of the trace's entry pointers (borrowed),
 * sorted by path; NULL with *n 0 for an empty or NULL trace. */
static int
sorted_view(const Moat__V1__FsTrace *t, Moat__V1__FsTraceEntry ***out,
    size_t *n)
{
	*out = NULL;
	*n = 0;
	if (t == NULL || t->n_entries == 0)
		return MOAT_OK;
	if ((*out = malloc(t->n_entries * sizeof(**out))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	memcpy(*out, t->entries, t->n_entries * sizeof(**out));
	*n = t->n_entries;
	qsort(*out, *n, sizeof(**out), cmp_entry_path);
	return MOAT_OK;
}

static bool
same_state(const Moat__V1__FsTraceEntry *a, const Moat__V1__FsTraceEntry *b)
{
	return a->change == b->change && a->type == b->type &&
	    a->size == b->size && a->mode == b->mode &&
	    a->sha256.len == b->sha256.len &&
	    (a->sha256.len == 0 ||
	        memcmp(a->sha256.data, b->sha256.data, a->sha256.len) == 0);
}

/* new_entry: a deep copy of `from` (size, hash, mode and type only when
 * `with_data`) with `change`. NULL on allocation failure. */
static Moat__V1__FsTraceEntry *
new_entry(const Moat__V1__FsTraceEntry *from, Moat__V1__FsChange change,
    bool with_data)
{
	Moat__V1__FsTraceEntry *e = malloc(sizeof(*e));

	if (e == NULL)
		return NULL;
	moat__v1__fs_trace_entry__init(e);
	e->change = change;
	e->type = from->type;
	if ((e->path = strdup(from->path ? from->path : "")) == NULL) {
		free(e);
		return NULL;
	}
	if (!with_data)
		return e;
	e->size = from->size;
	e->mode = from->mode;
	if (from->sha256.len > 0) {
		if ((e->sha256.data = malloc(from->sha256.len)) == NULL) {
			free(e->path);
			free(e);
			return NULL;
		}
		memcpy(e->sha256.data, from->sha256.data, from->sha256.len);
		e->sha256.len = from->sha256.len;
	}
	return e;
}

void
moat_trace_diff_free(Moat__V1__FsTraceEntry **ents, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ents[i] != NULL)
			moat__v1__fs_trace_entry__free_unpacked(ents[i], NULL);
	free(ents);
}

/*
 * Both traces say how the filesystem differs from the image. For a path:
 * - in cur only: it differed from the image only since prev: as cur says;
 * - in both, the same: untouched since prev, not listed;
 * - in both, different: now DELETED -> DELETED; was DELETED and exists
 *   now -> CREATED; else MODIFIED (cur's size and hash);
 * - in prev only: it is back to the image's version: was CREATED ->
 *   DELETED; was DELETED -> CREATED; was MODIFIED -> MODIFIED (the
 *   image's size and hash are not known: left 0 and empty).
 */
int
moat_trace_diff(const Moat__V1__FsTrace *prev, const Moat__V1__FsTrace *cur,
    Moat__V1__FsTraceEntry ***out, size_t *n_out)
{
	Moat__V1__FsTraceEntry **p = NULL, **c = NULL, **res = NULL;
	size_t np = 0, nc = 0, i = 0, j = 0, n = 0;
	int rv;

	*out = NULL;
	*n_out = 0;
	if ((rv = sorted_view(prev, &p, &np)) != MOAT_OK ||
	    (rv = sorted_view(cur, &c, &nc)) != MOAT_OK)
		goto cleanup;
	if (np + nc > 0 && (res = calloc(np + nc, sizeof(*res))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto cleanup;
	}
	while (i < np || j < nc) {
		const Moat__V1__FsTraceEntry *a = i < np ? p[i] : NULL;
		const Moat__V1__FsTraceEntry *b = j < nc ? c[j] : NULL;
		Moat__V1__FsTraceEntry *e = NULL;
		int order = a == NULL ? 1 :
		    b == NULL         ? -1 :
		                        cmp_entry_path(&p[i], &c[j]);

		if (order > 0) {
			e = new_entry(b, b->change, true);
			j++;
		} else if (order < 0) {
			if (a->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED)
				e = new_entry(a,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED,
				    false);
			else if (a->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
				e = new_entry(a,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED,
				    false);
			else
				e = new_entry(a,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED,
				    false);
			i++;
		} else {
			i++;
			j++;
			if (same_state(a, b))
				continue;
			if (b->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
				e = new_entry(b,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED,
				    false);
			else if (a->change ==
			    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
				e = new_entry(b,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED,
				    true);
			else
				e = new_entry(b,
				    MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED,
				    true);
		}
		if (e == NULL) {
			rv = MOAT_RESOURCE_EXHAUSTED;
			goto cleanup;
		}
		res[n++] = e;
	}
	if (n > 0) {
		*out = res;
		*n_out = n;
		res = NULL;
	}
	rv = MOAT_OK;
cleanup:
	if (res != NULL)
		moat_trace_diff_free(res, n); /* n entries made so far */
	free(p);
	free(c);
	return rv;
}

/* ---- the sandbox -> session table ---- */

int
moat_record_init(struct moat_record *rec, struct moat_forward *fw,
    struct moat_rpc_client *sessiond, const char *sessiond_url)
{
	memset(rec, 0, sizeof(*rec));
	rec->fw = fw;
	rec->sessiond = sessiond;
	rec->sessiond_url = sessiond_url;
	if (pthread_mutex_init(&rec->lock, NULL) != 0)
		return MOAT_RESOURCE_EXHAUSTED;
	if (moat_record_pool_init(rec) != MOAT_OK) {
		pthread_mutex_destroy(&rec->lock);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	rec->ready = true;
	return MOAT_OK;
}

static void
entry_free(struct moat_record_entry *e)
{
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->cv);
	if (e->prev != NULL)
		moat__v1__fs_trace__free_unpacked(e->prev, NULL);
	free(e);
}

void
moat_record_fini(struct moat_record *rec)
{
	if (!rec->ready)
		return;
	/* The deferred steps end first: they use the entries. */
	moat_record_pool_fini(rec);
	for (size_t i = 0; i < rec->n; i++)
		entry_free(rec->entries[i]);
	free(rec->entries);
	pthread_mutex_destroy(&rec->lock);
	rec->ready = false;
}

/* find: the live entry of `sandbox_id` (recorded or known not to be), or
 * NULL. Takes the table lock. */
static struct moat_record_entry *
find(struct moat_record *rec, const char *sandbox_id)
{
	struct moat_record_entry *e = NULL;

	if (sandbox_id == NULL || sandbox_id[0] == '\0')
		return NULL;
	pthread_mutex_lock(&rec->lock);
	for (size_t i = 0; i < rec->n; i++)
		if (!rec->entries[i]->gone &&
		    strcmp(rec->entries[i]->sandbox_id, sandbox_id) == 0) {
			e = rec->entries[i];
			break;
		}
	pthread_mutex_unlock(&rec->lock);
	return e;
}

/* add_entry: `e` joins the table; a live entry of the same sandbox is
 * retired first (the sandbox now records into e's session). With
 * `keep`, a live entry that says the same (the same session, or both
 * not recorded) stays instead and is *out, and e is freed: lookups of
 * one sandbox that raced share one entry. On success *out is the entry
 * in the table; on failure e is freed. */
static int
add_entry(struct moat_record *rec, struct moat_record_entry *e, bool keep,
    struct moat_record_entry **out)
{
	struct moat_record_entry **grown;
	int rv = MOAT_OK;

	*out = NULL;
	pthread_mutex_lock(&rec->lock);
	for (size_t i = 0; i < rec->n && *out == NULL; i++) {
		if (rec->entries[i]->gone ||
		    strcmp(rec->entries[i]->sandbox_id, e->sandbox_id) != 0)
			continue;
		if (keep &&
		    strcmp(rec->entries[i]->session_id, e->session_id) == 0)
			*out = rec->entries[i];
		else
			rec->entries[i]->gone = true;
	}
	if (*out != NULL)
		goto out;
	if (rec->n == rec->cap) {
		/* cap follows every realloc, also one that grew in place. */
		size_t cap = rec->cap * 2 + 8;

		if ((grown = realloc(rec->entries, cap * sizeof(*grown))) ==
		    NULL) {
			rv = MOAT_RESOURCE_EXHAUSTED;
			goto out;
		}
		rec->entries = grown;
		rec->cap = cap;
	}
	rec->entries[rec->n++] = e;
	*out = e;
	e = NULL;
out:
	pthread_mutex_unlock(&rec->lock);
	if (e != NULL)
		entry_free(e);
	return rv;
}

static struct moat_record_entry *
entry_new(const char *sandbox_id, const char *session_id)
{
	struct moat_record_entry *e = calloc(1, sizeof(*e));

	if (e == NULL)
		return NULL;
	if (pthread_mutex_init(&e->lock, NULL) != 0) {
		free(e);
		return NULL;
	}
	if (pthread_cond_init(&e->cv, NULL) != 0) {
		pthread_mutex_destroy(&e->lock);
		free(e);
		return NULL;
	}
	snprintf(e->sandbox_id, sizeof(e->sandbox_id), "%s", sandbox_id);
	snprintf(e->session_id, sizeof(e->session_id), "%s", session_id);
	e->checked_ms = moat_rpc_now_ms();
	return e;
}

bool
moat_record_session_of(struct moat_record *rec, const char *sandbox_id,
    char *session_id, size_t size)
{
	struct moat_record_entry *e = find(rec, sandbox_id);

	if (e == NULL || size == 0 || e->session_id[0] == '\0')
		return false;
	snprintf(session_id, size, "%s", e->session_id);
	return true;
}

bool
moat_record_step0(struct moat_record *rec, const char *session_id,
    char *snapshot_id, size_t size)
{
	bool found = false;

	pthread_mutex_lock(&rec->lock);
	for (size_t i = 0; i < rec->n && !found; i++)
		if (strcmp(rec->entries[i]->session_id, session_id) == 0 &&
		    rec->entries[i]->step0[0] != '\0') {
			snprintf(snapshot_id, size, "%s",
			    rec->entries[i]->step0);
			found = true;
		}
	pthread_mutex_unlock(&rec->lock);
	return found;
}

void
moat_record_forget(struct moat_record *rec, const char *sandbox_id)
{
	struct moat_record_entry *e = find(rec, sandbox_id);

	if (e == NULL)
		return;
	pthread_mutex_lock(&rec->lock);
	e->gone = true;
	pthread_mutex_unlock(&rec->lock);
	/* The entry itself stays (see struct moat_record_entry); its trace,
	 * the big part, goes: now, or when the step running ends. */
	pthread_mutex_lock(&e->lock);
	if (!e->busy && e->prev != NULL) {
		moat__v1__fs_trace__free_unpacked(e->prev, NULL);
		e->prev = NULL;
	}
	pthread_mutex_unlock(&e->lock);
}

/* ---- whose turn it is on an entry ---- */

static atomic_size_t steps_waiting; /* in every entry's FIFO */

size_t
moat_record_steps_waiting(void)
{
	return atomic_load(&steps_waiting);
}

/* enqueue: w joins e's FIFO unless e is free (then it is w's at once:
 * true). e->lock held. */
static bool
enqueue(struct moat_record_entry *e, struct moat_record_waiter *w)
{
	if (!e->busy) {
		e->busy = true;
		return true;
	}
	w->next = NULL;
	w->granted = false;
	if (e->tail != NULL)
		e->tail->next = w;
	else
		e->head = w;
	e->tail = w;
	atomic_fetch_add(&steps_waiting, 1);
	return false;
}

bool
moat_record_entry_enqueue(struct moat_record_entry *e,
    struct moat_record_waiter *w)
{
	bool mine;

	pthread_mutex_lock(&e->lock);
	mine = enqueue(e, w);
	pthread_mutex_unlock(&e->lock);
	return mine;
}

/* entry_own: this thread's turn on e, after the steps that came before
 * (blocks until then). moat_record_entry_release ends it. */
static void
entry_own(struct moat_record_entry *e)
{
	struct moat_record_waiter w = { 0 };

	pthread_mutex_lock(&e->lock);
	if (!enqueue(e, &w))
		while (!w.granted)
			pthread_cond_wait(&e->cv, &e->lock);
	pthread_mutex_unlock(&e->lock);
}

void
moat_record_entry_release(struct moat_record *rec, struct moat_record_entry *e)
{
	struct moat_record_waiter *w;
	struct moat_record_job *job = NULL;
	bool gone;

	pthread_mutex_lock(&rec->lock);
	gone = e->gone;
	pthread_mutex_unlock(&rec->lock);
	pthread_mutex_lock(&e->lock);
	if (gone && e->prev != NULL) {
		moat__v1__fs_trace__free_unpacked(e->prev, NULL);
		e->prev = NULL;
	}
	if ((w = e->head) != NULL) {
		if ((e->head = w->next) == NULL)
			e->tail = NULL;
		atomic_fetch_sub(&steps_waiting, 1);
		/* e stays busy: it passes to w. */
		if ((job = w->job) == NULL) {
			w->granted = true;
			pthread_cond_broadcast(&e->cv);
		}
	} else {
		e->busy = false;
	}
	pthread_mutex_unlock(&e->lock);
	if (job != NULL)
		moat_record_job_start(rec, job);
}

/* call_timeout: what a recording call gets: the caller's time left, but
 * at least RECORD_CALL_MIN_MS (the exec has run; its step must land). */
static uint32_t
call_timeout(uint64_t deadline_ms)
{
	uint64_t now = moat_rpc_now_ms();
	uint64_t left = deadline_ms > now ? deadline_ms - now : 0;

	if (left < RECORD_CALL_MIN_MS)
		left = RECORD_CALL_MIN_MS;
	if (left > MOAT_RPC_DEFAULT_TIMEOUT_MS)
		left = MOAT_RPC_DEFAULT_TIMEOUT_MS;
	return (uint32_t)left;
}

int
moat_record_sessiond(struct moat_record *rec, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *reply_desc,
    ProtobufCMessage **reply, uint64_t deadline_ms, char **errmsg)
{
	uint64_t now = moat_rpc_now_ms();
	struct moat_rpc_opts opts = {
		.timeout_ms =
		    deadline_ms > now ? (uint32_t)(deadline_ms - now) : 1,
		.tenant = moat_gw_message_tenant(req),
	};
	char *msg = NULL;
	int rv;

	*reply = NULL;
	rv = moat_rpc_call(rec->sessiond, SESSIOND_SERVICE, method, req,
	    reply_desc, reply, &opts, &msg);
	if (rv == MOAT_OK) {
		free(msg);
		return MOAT_OK;
	}
	if (rv == MOAT_UNAVAILABLE || rv == MOAT_DEADLINE_EXCEEDED)
		*errmsg = moat_asprintf(
		    "moat-sessiond at %s did not "
		    "answer %s (%s): is it running? `moat info` shows it",
		    rec->sessiond_url, method, msg ? msg : "");
	else
		*errmsg = moat_asprintf("%s", msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

/* node_call: `method` of moat.v1.Vm with `req` for `tenant` on the node
 * holding `sandbox_id`; the reply decoded as `reply_desc` (caller
 * frees). */
static int
node_call(struct moat_record *rec, const char *tenant, const char *sandbox_id,
    const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *reply_desc, uint64_t deadline,
    const char *what, ProtobufCMessage **out, char **errmsg)
{
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	int rv;

	*out = NULL;
	if (!moat_sandbox_id_set(&sandbox, sandbox_id)) {
		*errmsg = moat_asprintf("sandbox id unusable");
		return MOAT_INVALID_ARGUMENT;
	}
	if ((rv = moat_forward_locate(rec->fw, &sandbox, tenant, deadline,
	         &node, errmsg)) != MOAT_OK)
		return rv;
	return moat_forward_node_call(rec->fw, &node, tenant, method, req,
	    reply_desc, moat_rpc_new_request_id(), deadline, what, out,
	    errmsg);
}

/* trace_fs: the hashed filesystem trace of `sandbox_id` from its node.
 * On MOAT_OK *out is the caller's; else *errmsg (heap, caller frees). */
static int
trace_fs(struct moat_record *rec, const char *tenant, const char *sandbox_id,
    uint64_t deadline_ms, Moat__V1__FsTrace **out, char **errmsg)
{
	Moat__V1__FsTraceCall req = MOAT__V1__FS_TRACE_CALL__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.hash = true;
	return node_call(rec, tenant, sandbox_id, "TraceFs", &req.base,
	    &moat__v1__fs_trace__descriptor,
	    moat_rpc_now_ms() + call_timeout(deadline_ms),
	    "the sandbox's fs trace", (ProtobufCMessage **)out, errmsg);
}

int
moat_record_trace(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t deadline_ms, Moat__V1__FsTrace **out,
    char **errmsg)
{
	return trace_fs(rec, tenant, sandbox_id, deadline_ms, out, errmsg);
}

/* trace_copy: a deep copy (caller frees), or NULL when out of memory. */
static Moat__V1__FsTrace *
trace_copy(const Moat__V1__FsTrace *t)
{
	size_t len = moat__v1__fs_trace__get_packed_size(t);
	uint8_t *buf = malloc(len ? len : 1);
	Moat__V1__FsTrace *copy;

	if (buf == NULL)
		return NULL;
	moat__v1__fs_trace__pack(t, buf);
	copy = moat__v1__fs_trace__unpack(NULL, len, buf);
	free(buf);
	return copy;
}

int
moat_record_snapshot(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, const char *session_id, uint64_t step,
    uint64_t deadline_ms, char *snapshot_id, size_t size, char **errmsg)
{
	Moat__V1__SnapshotSandboxRequest req =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *snap = NULL;
	int rv;

	req.sandbox_id = (char *)sandbox_id;
	req.session_id = (char *)(session_id != NULL ? session_id : "");
	req.step = step;
	if ((rv = node_call(rec, tenant, sandbox_id, "SnapshotSandbox",
	         &req.base, &moat__v1__local_snapshot__descriptor,
	         moat_rpc_now_ms() + call_timeout(deadline_ms),
	         "the sandbox's snapshot", (ProtobufCMessage **)&snap,
	         errmsg)) != MOAT_OK)
		return rv;
	snprintf(snapshot_id, size, "%s", snap->snapshot_id);
	moat__v1__local_snapshot__free_unpacked(snap, NULL);
	return MOAT_OK;
}

int
moat_record_set_step_snapshot(struct moat_record *rec, const char *tenant,
    const char *session_id, uint64_t index, const char *snapshot_id,
    const char *removed_reason, uint64_t request_id, uint64_t deadline_ms,
    char **errmsg)
{
	Moat__V1__SetStepSnapshotRequest req =
	    MOAT__V1__SET_STEP_SNAPSHOT_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)session_id;
	req.index = index;
	req.snapshot_id = (char *)snapshot_id;
	req.removed_reason = (char *)(removed_reason ? removed_reason : "");
	rv = moat_record_sessiond_call(rec, "SetStepSnapshot", &req.base,
	    &moat__v1__step__descriptor, &reply, request_id, deadline_ms,
	    errmsg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

/* set_step_snapshot: attaches `snapshot_id` to step `index` (0: the
 * session's step-0 label), with at least RECORD_CALL_MIN_MS. */
static int
set_step_snapshot(struct moat_record *rec, const char *tenant,
    const char *session_id, uint64_t index, const char *snapshot_id,
    uint64_t deadline_ms, char **errmsg)
{
	return moat_record_set_step_snapshot(rec, tenant, session_id, index,
	    snapshot_id, NULL, moat_rpc_new_request_id(),
	    moat_rpc_now_ms() + call_timeout(deadline_ms), errmsg);
}

/* label_of: the value of `key` in a session's labels, or NULL. */
static const char *
label_of(const Moat__V1__SessionInfo *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i]->key, key) == 0)
			return s->labels[i]->value;
	return NULL;
}

const char *
moat_record_session_step0(const Moat__V1__SessionInfo *s)
{
	return label_of(s, MOAT_RECORD_STEP0_LABEL);
}

const char *
moat_record_session_label(const Moat__V1__SessionInfo *s, const char *key)
{
	return label_of(s, key);
}

/* negative_stale: e says "not recorded" and sessiond was asked longer
 * than RECORD_NEGATIVE_TTL_MS ago. */
static bool
negative_stale(struct moat_record *rec, struct moat_record_entry *e)
{
	bool stale;

	pthread_mutex_lock(&rec->lock);
	stale = e->session_id[0] == '\0' &&
	    moat_rpc_now_ms() - e->checked_ms >= RECORD_NEGATIVE_TTL_MS;
	pthread_mutex_unlock(&rec->lock);
	return stale;
}

static const Moat__V1__SessionInfo *
latest_session(const Moat__V1__ListSessionsReply *list)
{
	const Moat__V1__SessionInfo *latest = NULL;

	for (size_t i = 0; i < list->n_sessions; i++)
		if (latest == NULL ||
		    list->sessions[i]->created_ms >= latest->created_ms)
			latest = list->sessions[i];
	return latest;
}

/* lookup: the entry of `sandbox_id`: from the table, else (a gateway
 * restarted since the sandbox was created) from sessiond: the latest
 * session recording it. A sandbox sessiond has no session for is
 * remembered as not recorded; when sessiond does not answer, NULL and
 * nothing is remembered. */
static struct moat_record_entry *
lookup(struct moat_record *rec, const char *tenant, const char *sandbox_id,
    uint64_t request_id)
{
	Moat__V1__ListSessionsRequest req =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	Moat__V1__ListSessionsReply *list = NULL;
	const Moat__V1__SessionInfo *latest = NULL;
	struct moat_record_entry *e = find(rec, sandbox_id);
	const char *step0;
	char *msg = NULL;

	if (sandbox_id == NULL || sandbox_id[0] == '\0' ||
	    (e != NULL && !negative_stale(rec, e)))
		return e;
	req.tenant = (char *)tenant;
	req.sandbox_id = (char *)sandbox_id;
	req.page_size = 1000;
	if (moat_record_sessiond(rec, "ListSessions", &req.base,
	        &moat__v1__list_sessions_reply__descriptor,
	        (ProtobufCMessage **)&list,
	        moat_rpc_now_ms() + RECORD_LOOKUP_MS, &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "recording: cannot tell whether sandbox "
		    "%s is recorded: %s",
		    sandbox_id, msg ? msg : "");
		free(msg);
		return NULL;
	}
	latest = latest_session(list);
	if (e != NULL && latest == NULL) {
		/* Still not recorded: asked again after the TTL. */
		pthread_mutex_lock(&rec->lock);
		e->checked_ms = moat_rpc_now_ms();
		pthread_mutex_unlock(&rec->lock);
		moat__v1__list_sessions_reply__free_unpacked(list, NULL);
		return e;
	}
	e = entry_new(sandbox_id, latest != NULL ? latest->id : "");
	if (e != NULL && latest != NULL) {
		e->policy = latest->snapshot_policy;
		e->last_index = latest->step_count;
		e->snapshots = UINT32_MAX; /* retention will count them */
		if ((step0 = label_of(latest, MOAT_RECORD_STEP0_LABEL)) !=
		    NULL)
			snprintf(e->step0, sizeof(e->step0), "%s", step0);
		/* The next step is diffed against the state found now. */
		if (trace_fs(rec, tenant, sandbox_id, 0, &e->prev, &msg) !=
		    MOAT_OK) {
			free(msg);
			msg = NULL;
		}
		moat_info(request_id,
		    "sandbox %s records again into session "
		    "%s (found in moat-sessiond)",
		    sandbox_id, e->session_id);
	}
	moat__v1__list_sessions_reply__free_unpacked(list, NULL);
	if (e == NULL || add_entry(rec, e, true, &e) != MOAT_OK)
		return NULL;
	return e;
}

bool
moat_record_session_lookup(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t request_id, char *session_id, size_t size)
{
	struct moat_record_entry *e =
	    lookup(rec, tenant, sandbox_id, request_id);

	if (e == NULL || size == 0 || e->session_id[0] == '\0')
		return false;
	snprintf(session_id, size, "%s", e->session_id);
	return true;
}

/* take_step0: the snapshot of the new session's starting state, as its
 * step 0 (in sessiond, and in e before e is shared). A failure is logged:
 * step 0 then cannot be restored. */
static void
take_step0(struct moat_record *rec, const char *tenant, const char *sandbox_id,
    struct moat_record_entry *e, uint64_t request_id, uint64_t deadline_ms)
{
	char snap[MOAT_ID_MAX], *msg = NULL;

	if (moat_record_snapshot(rec, tenant, sandbox_id, e->session_id, 0,
	        deadline_ms, snap, sizeof(snap), &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "recording %s: no snapshot of its "
		    "starting state (%s): step 0 cannot be restored",
		    sandbox_id, msg ? msg : "");
		free(msg);
		return;
	}
	snprintf(e->step0, sizeof(e->step0), "%s", snap);
	if (set_step_snapshot(rec, tenant, e->session_id, 0, snap, deadline_ms,
	        &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "recording %s: step-0 snapshot %s is "
		    "known to this gateway only: %s",
		    sandbox_id, snap, msg ? msg : "");
		free(msg);
	}
}

int
moat_record_begin(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, const struct moat_record_origin *origin,
    uint64_t request_id, uint64_t deadline_ms, char *session_id, size_t size,
    char **errmsg)
{
	Moat__V1__CreateSessionRequest creq =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	Moat__V1__CreateSessionRequest__LabelsEntry label =
	    MOAT__V1__CREATE_SESSION_REQUEST__LABELS_ENTRY__INIT;
	Moat__V1__CreateSessionRequest__LabelsEntry *labels[1] = { &label };
	ProtobufCMessage *reply = NULL;
	Moat__V1__SessionInfo *info;
	struct moat_record_entry *e;
	char step0[MOAT_ID_MAX] = "", *msg = NULL;
	int rv;

	if (origin->base_snapshot != NULL && origin->base_snapshot[0] != '\0')
		snprintf(step0, sizeof(step0), "%s", origin->base_snapshot);
	creq.tenant = (char *)tenant;
	creq.sandbox_id = (char *)sandbox_id;
	creq.snapshot_policy = origin->policy;
	creq.parent_session_id = (char *)(origin->parent_session_id != NULL ?
	        origin->parent_session_id :
	        "");
	creq.parent_step = origin->parent_step;
	if (step0[0] != '\0') {
		/* SetStepSnapshot knows steps from 1; step 0's snapshot is
		 * the session's label. */
		label.key = (char *)MOAT_RECORD_STEP0_LABEL;
		label.value = step0;
		creq.labels = labels;
		creq.n_labels = 1;
	}
	if ((rv = moat_record_sessiond(rec, "CreateSession", &creq.base,
	         &moat__v1__session_info__descriptor, &reply,
	         moat_rpc_now_ms() + call_timeout(deadline_ms), &msg)) !=
	    MOAT_OK) {
		*errmsg = moat_asprintf("cannot start the recording of %s: %s",
		    sandbox_id, msg);
		free(msg);
		return rv;
	}
	info = (Moat__V1__SessionInfo *)reply;
	e = entry_new(sandbox_id, info->id ? info->id : "");
	protobuf_c_message_free_unpacked(reply, NULL);
	if (e == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	e->policy = origin->policy;
	snprintf(e->step0, sizeof(e->step0), "%s", step0);
	if (step0[0] == '\0' &&
	    origin->policy == MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY)
		take_step0(rec, tenant, sandbox_id, e, request_id,
		    deadline_ms);
	e->snapshots = e->step0[0] != '\0' ? 1 : 0;
	snprintf(session_id, size, "%s", e->session_id);
	/* What the sandbox holds now is no step's: the first step is
	 * diffed against this. Best effort. */
	if (origin->base_trace != NULL) {
		if ((e->prev = trace_copy(origin->base_trace)) == NULL)
			moat_warn(request_id,
			    "recording %s: out of memory "
			    "copying the starting fs trace",
			    sandbox_id);
	} else if (trace_fs(rec, tenant, sandbox_id, deadline_ms, &e->prev,
	               &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "recording %s: no starting fs trace "
		    "(%s): the first step lists every change since boot",
		    sandbox_id, msg ? msg : "");
		free(msg);
	}
	if (add_entry(rec, e, false, &e) != MOAT_OK) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
}

int
moat_record_start(struct moat_record *rec, const char *tenant,
    const Moat__V1__CreateSandboxRequest *req, const char *sandbox_id,
    uint64_t request_id, uint64_t deadline_ms, char *session_id, size_t size,
    char **errmsg)
{
	struct moat_record_origin origin = {
		.policy = req->snapshot_policy,
	};

	return moat_record_begin(rec, tenant, sandbox_id, &origin, request_id,
	    deadline_ms, session_id, size, errmsg);
}

/* retain: one more of e's steps has a snapshot: once the session may
 * hold more than the tenant's keep-last, retention runs (e is the
 * caller's). */
static void
retain(struct moat_record *rec, struct moat_record_entry *e,
    const char *tenant, uint64_t request_id)
{
	struct moat_retention policy;
	char *msg = NULL;

	if (moat_retention_policy(rec->config, tenant, &policy, &msg) !=
	    MOAT_OK) {
		moat_warn(request_id,
		    "retention of tenant %s: %s (the "
		    "default is used)",
		    tenant, msg ? msg : "");
		free(msg);
	}
	if (e->snapshots != UINT32_MAX)
		e->snapshots++;
	if (policy.keep_last == 0 || e->snapshots <= policy.keep_last)
		return;
	e->snapshots = moat_retention_apply(rec, tenant, e->session_id,
	    &policy, request_id);
}

void
moat_record_step0_forget(struct moat_record *rec, const char *session_id)
{
	pthread_mutex_lock(&rec->lock);
	for (size_t i = 0; i < rec->n; i++)
		if (strcmp(rec->entries[i]->session_id, session_id) == 0)
			rec->entries[i]->step0[0] = '\0';
	pthread_mutex_unlock(&rec->lock);
}

/* attach_manual: `snapshot_id`, just taken of e's sandbox, becomes the
 * snapshot of its latest step (step 0 before any). e is the caller's. */
static void
attach_manual(struct moat_record *rec, struct moat_record_entry *e,
    const char *tenant, const char *snapshot_id, uint64_t request_id,
    uint64_t deadline_ms)
{
	char *msg = NULL;

	if (e->last_index == 0) {
		pthread_mutex_lock(&rec->lock);
		snprintf(e->step0, sizeof(e->step0), "%s", snapshot_id);
		pthread_mutex_unlock(&rec->lock);
	}
	if (set_step_snapshot(rec, tenant, e->session_id, e->last_index,
	        snapshot_id, deadline_ms, &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "snapshot %s of %s not attached to step "
		    "%llu of session %s%s: %s",
		    snapshot_id, e->sandbox_id,
		    (unsigned long long)e->last_index, e->session_id,
		    e->last_index == 0 ? " (this gateway keeps it)" : "",
		    msg ? msg : "");
		free(msg);
		return;
	}
	moat_info(request_id, "snapshot %s is step %llu of session %s",
	    snapshot_id, (unsigned long long)e->last_index, e->session_id);
	retain(rec, e, tenant, request_id);
}

/* forward_snapshot: the client's SnapshotSandbox to the node, with the
 * session and step it becomes set; on MOAT_OK *snap is the node's reply
 * decoded (the caller's; NULL when it does not decode). */
static int
forward_snapshot(struct moat_record *rec, struct moat_rpc_call *call,
    const Moat__V1__SnapshotSandboxRequest *req,
    const struct moat_record_entry *e, Moat__V1__LocalSnapshot **snap)
{
	Moat__V1__SnapshotSandboxRequest fwd = *req;
	uint8_t *payload;
	size_t len;
	int rv;

	*snap = NULL;
	fwd.session_id = (char *)e->session_id;
	fwd.step = e->last_index;
	len = moat__v1__snapshot_sandbox_request__get_packed_size(&fwd);
	if ((payload = malloc(len ? len : 1)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	moat__v1__snapshot_sandbox_request__pack(&fwd, payload);
	rv = moat_forward_call(rec->fw, call, req->sandbox_id, payload, len);
	free(payload);
	if (rv == MOAT_OK)
		*snap = moat__v1__local_snapshot__unpack(NULL,
		    call->raw_reply_len, call->raw_reply);
	return rv;
}

int
moat_record_snapshot_call(struct moat_record *rec, struct moat_rpc_call *call,
    const Moat__V1__SnapshotSandboxRequest *req, const char *tenant)
{
	struct moat_record_entry *e =
	    lookup(rec, tenant, req->sandbox_id, call->request_id);
	Moat__V1__LocalSnapshot *snap = NULL;
	int rv;

	if (e == NULL || e->session_id[0] == '\0' ||
	    e->policy != MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_MANUAL)
		return moat_forward_call(rec->fw, call, req->sandbox_id,
		    call->payload, call->payload_len);
	/* In the entry's turn: no step lands between the snapshot and its
	 * attaching. */
	entry_own(e);
	rv = forward_snapshot(rec, call, req, e, &snap);
	if (snap != NULL)
		attach_manual(rec, e, tenant, snap->snapshot_id,
		    call->request_id, call->deadline_ms);
	moat_record_entry_release(rec, e);
	if (snap != NULL)
		moat__v1__local_snapshot__free_unpacked(snap, NULL);
	return rv;
}

/* join_argv: argv as one line (heap), for a step's input. */
static char *
join_argv(char *const *argv, size_t n)
{
	size_t len = 1;
	char *s;

	for (size_t i = 0; i < n; i++)
		len += strlen(argv[i]) + 1;
	if ((s = malloc(len)) == NULL)
		return NULL;
	s[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			strcat(s, " ");
		strcat(s, argv[i]);
	}
	return s;
}

/* One step being recorded: the request's kind and the parts of the
 * node's reply the step keeps (borrowed from `exec` / `code`). */
struct step_run {
	const ProtobufCMessage *request;
	Moat__V1__ExecResult *exec;    /* owned: Exec's reply */
	Moat__V1__RunCodeResult *code; /* owned: RunCode's reply */
};

/* step_fill: the step's input from the request and its outcome from the
 * reply. *joined (heap) may be set for an argv. */
static int
step_fill(const struct step_run *r, Moat__V1__Step *step, char **joined)
{
	const ProtobufCMessageDescriptor *d = r->request->descriptor;

	if (d == &moat__v1__exec_request__descriptor) {
		const Moat__V1__ExecRequest *req =
		    (const Moat__V1__ExecRequest *)r->request;
		const Moat__V1__ExecResult *res = r->exec;

		if (req->code != NULL && req->code[0] != '\0') {
			step->kind = MOAT__V1__STEP_KIND__STEP_KIND_CODE;
			step->input = req->code;
			step->language = req->language;
		} else {
			step->kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
			if (req->shell != NULL && req->shell[0] != '\0') {
				step->input = req->shell;
			} else {
				if ((*joined = join_argv(req->argv,
				         req->n_argv)) == NULL)
					return MOAT_RESOURCE_EXHAUSTED;
				step->input = *joined;
				step->n_argv = req->n_argv;
				step->argv = req->argv;
			}
		}
		if (res->status != NULL)
			step->exit_code = res->status->exited ?
			    res->status->exit_code :
			    128 + res->status->signal;
		step->stdout = res->stdout;
		step->stderr = res->stderr;
		step->keep = req->keep;
	} else if (d == &moat__v1__run_code_request__descriptor) {
		const Moat__V1__RunCodeRequest *req =
		    (const Moat__V1__RunCodeRequest *)r->request;
		const Moat__V1__CodeResult *res = r->code->result;

		step->keep = req->keep;
		step->kind = MOAT__V1__STEP_KIND__STEP_KIND_CODE;
		step->input = req->code;
		step->language =
		    (char *)(req->language[0] != '\0' ? req->language :
		                                        "python");
		if (res != NULL) {
			/* A code run has no exit code: an exception is 1, a
			 * timeout 124 (as `moat run`). */
			step->exit_code = res->timed_out ? 124 :
			    res->error_name[0] != '\0'   ? 1 :
			                                   0;
			step->stdout = res->stdout;
			step->stderr = res->stderr;
		}
	} else {
		const Moat__V1__FileWriteRequest *req =
		    (const Moat__V1__FileWriteRequest *)r->request;

		step->kind = MOAT__V1__STEP_KIND__STEP_KIND_FILE_WRITE;
		step->input = (char *)"";
		step->path = req->path;
		/* The contents are the step's input: text only. */
		if ((*joined = malloc(req->data.len + 1)) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		memcpy(*joined, req->data.data, req->data.len);
		(*joined)[req->data.len] = '\0';
		step->input = *joined;
	}
	return MOAT_OK;
}

/* append_step: appends `step` (for `diff`) to e's session. On MOAT_OK
 * *index is its index. */
static int
append_step(struct moat_record *rec, struct moat_record_entry *e,
    const char *tenant, Moat__V1__Step *step, uint64_t deadline_ms,
    uint64_t *index, char **errmsg)
{
	Moat__V1__AppendStepRequest areq = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *msg = NULL;
	int rv;

	areq.tenant = (char *)tenant;
	areq.session_id = e->session_id;
	areq.step = step;
	if ((rv = moat_record_sessiond(rec, "AppendStep", &areq.base,
	         &moat__v1__append_step_reply__descriptor, &reply,
	         moat_rpc_now_ms() + call_timeout(deadline_ms), &msg)) !=
	    MOAT_OK) {
		*errmsg = moat_asprintf("step not recorded: %s: %s",
		    moat_strerror(rv), msg);
		free(msg);
		return rv;
	}
	*index = ((Moat__V1__AppendStepReply *)reply)->index;
	protobuf_c_message_free_unpacked(reply, NULL);
	return MOAT_OK;
}

/* repack: the node's reply with the recording's fields, as the new
 * *raw (its old bytes freed). A FILE_WRITE's reply has no such fields. */
static void
repack(uint8_t **raw, size_t *raw_len, struct step_run *r, uint64_t index,
    const char *session_id, const char *err)
{
	ProtobufCMessage *m;
	char **session_field, **err_field, *node_session, *node_error;
	uint32_t *index_field;
	uint8_t *packed;
	size_t len;

	if (r->exec != NULL) {
		m = &r->exec->base;
		session_field = &r->exec->session_id;
		err_field = &r->exec->recording_error;
		index_field = &r->exec->step_index;
	} else if (r->code != NULL) {
		m = &r->code->base;
		session_field = &r->code->session_id;
		err_field = &r->code->recording_error;
		index_field = &r->code->step_index;
	} else {
		return;
	}
	/* Borrowed strings go in for packing only; what the node put there
	 * (normally protobuf-c's static empty string) goes back after. */
	node_session = *session_field;
	node_error = *err_field;
	*index_field = (uint32_t)index;
	*session_field = (char *)session_id;
	*err_field = (char *)(err != NULL ? err : "");
	len = protobuf_c_message_get_packed_size(m);
	if ((packed = malloc(len ? len : 1)) != NULL) {
		protobuf_c_message_pack(m, packed);
		free(*raw);
		*raw = packed;
		*raw_len = len;
	}
	*session_field = node_session;
	*err_field = node_error;
}

/*
 * refresh: with several gateways, another one may have recorded steps of
 * e's sandbox (or started a new session for it) since this gateway's
 * last step: sessiond, the state of record, says. When its latest session
 * or step count differs from e's, e follows it and the sandbox's fs trace
 * is taken again now, before the step runs, so the step lists only its
 * own changes. Without an answer from sessiond, e stays as it is (logged).
 * e is the caller's (its turn).
 */
static void
refresh(struct moat_record *rec, struct moat_record_entry *e,
    const char *tenant, uint64_t request_id)
{
	Moat__V1__ListSessionsRequest req =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	Moat__V1__ListSessionsReply *list = NULL;
	const Moat__V1__SessionInfo *latest;
	Moat__V1__FsTrace *cur = NULL;
	const char *step0;
	char *msg = NULL;

	req.tenant = (char *)tenant;
	req.sandbox_id = e->sandbox_id;
	req.page_size = 1000;
	if (moat_record_sessiond(rec, "ListSessions", &req.base,
	        &moat__v1__list_sessions_reply__descriptor,
	        (ProtobufCMessage **)&list,
	        moat_rpc_now_ms() + RECORD_LOOKUP_MS, &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "recording %s: moat-sessiond did not say "
		    "whether another gateway recorded steps (%s): the step "
		    "is diffed against this gateway's last one",
		    e->sandbox_id, msg ? msg : "");
		free(msg);
		return;
	}
	latest = latest_session(list);
	if (latest != NULL && latest->id != NULL &&
	    (strcmp(latest->id, e->session_id) != 0 ||
	        latest->step_count != e->last_index)) {
		moat_info(request_id,
		    "recording %s: session %s has %llu steps, this gateway "
		    "knew %s with %llu: following it (fs trace taken again)",
		    e->sandbox_id, latest->id,
		    (unsigned long long)latest->step_count, e->session_id,
		    (unsigned long long)e->last_index);
		pthread_mutex_lock(&rec->lock);
		snprintf(e->session_id, sizeof(e->session_id), "%s",
		    latest->id);
		step0 = label_of(latest, MOAT_RECORD_STEP0_LABEL);
		snprintf(e->step0, sizeof(e->step0), "%s",
		    step0 != NULL ? step0 : "");
		pthread_mutex_unlock(&rec->lock);
		e->policy = latest->snapshot_policy;
		e->last_index = latest->step_count;
		e->snapshots = UINT32_MAX;
		if (trace_fs(rec, tenant, e->sandbox_id, 0, &cur, &msg) !=
		    MOAT_OK) {
			free(msg);
			cur = NULL;
		}
		if (e->prev != NULL)
			moat__v1__fs_trace__free_unpacked(e->prev, NULL);
		e->prev = cur;
	}
	moat__v1__list_sessions_reply__free_unpacked(list, NULL);
}

void
moat_record_step_before(struct moat_record *rec, struct moat_record_entry *e,
    const char *tenant, uint64_t request_id)
{
	refresh(rec, e, tenant, request_id);
}

/* step_trace: the step's fs changes since e's last step into *diff, and
 * the trace taken now into *cur (NULL when it failed: the step is then
 * marked truncated). Fails only when out of memory (*err set). */
static void
step_trace(struct moat_record *rec, struct moat_record_entry *e,
    const struct moat_record_step_ctx *c, Moat__V1__Step *step,
    Moat__V1__FsTrace **cur, Moat__V1__FsTraceEntry ***diff, size_t *n_diff,
    char **err)
{
	char *msg = NULL;

	if (trace_fs(rec, c->tenant, c->sandbox_id, c->deadline_ms, cur,
	        &msg) != MOAT_OK) {
		/* The step still lands, marked as lacking its trace. */
		moat_warn(c->request_id, "recording %s: fs trace failed: %s",
		    c->sandbox_id, msg ? msg : "");
		free(msg);
		*cur = NULL;
		step->fs_trace_truncated = true;
		return;
	}
	if (moat_trace_diff(e->prev, *cur, diff, n_diff) != MOAT_OK) {
		*err = moat_asprintf("out of memory diffing the fs trace");
		return;
	}
	step->fs_trace_truncated =
	    (*cur)->truncated || (e->prev != NULL && e->prev->truncated);
}

/* step_snapshot: under EVERY, the snapshot after step `index`. One that
 * fails does not fail the step: it is recorded, and the reply says it
 * cannot be restored (*err). */
static void
step_snapshot(struct moat_record *rec, struct moat_record_entry *e,
    const struct moat_record_step_ctx *c, uint64_t index, char **err)
{
	char snap[MOAT_ID_MAX], *msg = NULL;

	if (e->policy != MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY)
		return;
	if (moat_record_snapshot(rec, c->tenant, c->sandbox_id, e->session_id,
	        index, c->deadline_ms, snap, sizeof(snap), &msg) != MOAT_OK ||
	    set_step_snapshot(rec, c->tenant, e->session_id, index, snap,
	        c->deadline_ms, &msg) != MOAT_OK) {
		*err = moat_asprintf("step %llu recorded without a snapshot "
		                     "(it cannot be restored): %s",
		    (unsigned long long)index, msg ? msg : "");
		moat_warn(c->request_id, "recording %s: %s", c->sandbox_id,
		    *err);
	} else {
		retain(rec, e, c->tenant, c->request_id);
	}
	free(msg);
}

void
moat_record_step_after(struct moat_record *rec, struct moat_record_entry *e,
    const struct moat_record_step_ctx *c, uint8_t **raw, size_t *raw_len)
{
	const ProtobufCMessageDescriptor *d = c->request->descriptor;
	struct step_run r = { .request = c->request };
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	Moat__V1__FsTrace *cur = NULL;
	Moat__V1__FsTraceEntry **diff = NULL;
	size_t n_diff = 0;
	uint64_t index = 0;
	char *err = NULL, *joined = NULL;

	if (d == &moat__v1__exec_request__descriptor)
		r.exec = moat__v1__exec_result__unpack(NULL, *raw_len, *raw);
	else if (d == &moat__v1__run_code_request__descriptor)
		r.code =
		    moat__v1__run_code_result__unpack(NULL, *raw_len, *raw);
	if (r.exec == NULL && r.code == NULL &&
	    d != &moat__v1__file_write_request__descriptor) {
		moat_warn(c->request_id,
		    "recording %s: the node's %s reply does not decode: step "
		    "not recorded",
		    c->sandbox_id, c->method);
		return;
	}
	if (step_fill(&r, &step, &joined) != MOAT_OK) {
		err = moat_asprintf("out of memory building the step");
		goto reply;
	}
	/* The label, as the gateway's policy judged it (auth.c): a static
	 * string, like the borrowed fields step_fill set. */
	if (step.input != NULL && step.input[0] != '\0')
		step.safety = (char *)moat_safety_level_name(
		    moat_safety_classify(step.input, step.language).level);
	step_trace(rec, e, c, &step, &cur, &diff, &n_diff, &err);
	if (err != NULL)
		goto reply;
	step.started_ms = c->started_ms;
	step.ended_ms = c->ended_ms;
	step.n_fs_trace = n_diff;
	step.fs_trace = diff;
	if (append_step(rec, e, c->tenant, &step, c->deadline_ms, &index,
	        &err) != MOAT_OK) {
		moat_warn(c->request_id, "recording %s: %s", c->sandbox_id,
		    err);
		goto reply;
	}
	e->last_index = index;
	if (cur != NULL) {
		if (e->prev != NULL)
			moat__v1__fs_trace__free_unpacked(e->prev, NULL);
		e->prev = cur;
		cur = NULL;
	}
	step_snapshot(rec, e, c, index, &err);
reply:
	repack(raw, raw_len, &r, err == NULL || index > 0 ? index : 0,
	    e->session_id, err);
	if (r.exec != NULL)
		moat__v1__exec_result__free_unpacked(r.exec, NULL);
	if (r.code != NULL)
		moat__v1__run_code_result__free_unpacked(r.code, NULL);
	if (cur != NULL)
		moat__v1__fs_trace__free_unpacked(cur, NULL);
	moat_trace_diff_free(diff, n_diff);
	free(joined);
	free(err);
}

struct moat_record_entry *
moat_record_entry_of(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t request_id)
{
	struct moat_record_entry *e =
	    lookup(rec, tenant, sandbox_id, request_id);

	return e != NULL && e->session_id[0] != '\0' ? e : NULL;
}

int
moat_record_step(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, const char *sandbox_id,
    const char *tenant, bool *handled)
{
	struct moat_record_entry *e =
	    moat_record_entry_of(rec, tenant, sandbox_id, call->request_id);
	struct moat_record_step_ctx c = {
		.request = request,
		.sandbox_id = sandbox_id,
		.tenant = tenant,
		.method = call->method,
		.request_id = call->request_id,
		.deadline_ms = call->deadline_ms,
	};
	int rv;

	if (!(*handled = e != NULL))
		return MOAT_OK;
	entry_own(e);
	moat_record_step_before(rec, e, tenant, call->request_id);
	c.started_ms = moat_now_unix_ms();
	rv = moat_forward_call(rec->fw, call, sandbox_id, call->payload,
	    call->payload_len);
	c.ended_ms = moat_now_unix_ms();
	/* A call that failed did not run: no step. */
	if (rv == MOAT_OK)
		moat_record_step_after(rec, e, &c, &call->raw_reply,
		    &call->raw_reply_len);
	moat_record_entry_release(rec, e);
	return rv;
}

int
moat_record_session_call(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, const char *tenant)
{
	const ProtobufCMessageDescriptor *d = request->descriptor;
	const ProtobufCFieldDescriptor *f;
	struct moat_rpc_opts opts = { .request_id = call->request_id,
		.tenant = tenant };
	uint64_t now = moat_rpc_now_ms();
	ProtobufCMessage *copy = NULL;
	uint8_t *payload = NULL, *out = NULL;
	size_t len, out_len = 0;
	char *msg = NULL;
	int rv;

	f = protobuf_c_message_descriptor_get_field_by_name(d, "tenant");
	if (f == NULL || f->type != PROTOBUF_C_TYPE_STRING ||
	    f->label == PROTOBUF_C_LABEL_REPEATED)
		return moat_rpc_error(call, MOAT_INTERNAL,
		    "%s has no tenant "
		    "field: the gateway's method table is wrong",
		    d->name);
	/* A shallow copy with the gateway's tenant: the request stays as
	 * decoded, and the copy only borrows its fields. */
	if ((copy = malloc(d->sizeof_message)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	memcpy(copy, request, d->sizeof_message);
	*(const char **)((char *)copy + f->offset) = tenant;
	len = protobuf_c_message_get_packed_size(copy);
	if ((payload = malloc(len ? len : 1)) == NULL) {
		free(copy);
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	}
	protobuf_c_message_pack(copy, payload);
	free(copy);
	opts.timeout_ms =
	    call->deadline_ms > now ? (uint32_t)(call->deadline_ms - now) : 1;
	rv = moat_rpc_call_raw(rec->sessiond, SESSIOND_SERVICE, call->method,
	    payload, len, &out, &out_len, &opts, &msg);
	free(payload);
	if (rv == MOAT_OK) {
		call->raw_reply = out;
		call->raw_reply_len = out_len;
		free(msg);
		return MOAT_OK;
	}
	free(out);
	if (rv == MOAT_UNAVAILABLE || rv == MOAT_DEADLINE_EXCEEDED)
		rv = moat_rpc_error(call, rv,
		    "moat-sessiond at %s did not "
		    "answer %s (%s): is it running? `moat info` shows it",
		    rec->sessiond_url, call->method, msg ? msg : "");
	else
		rv = moat_rpc_error(call, rv, "%s",
		    msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}

int
moat_record_sessiond_call(struct moat_record *rec, const char *method,
    const ProtobufCMessage *request,
    const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply,
    uint64_t request_id, uint64_t deadline_ms, char **errmsg)
{
	struct moat_rpc_opts opts = { .request_id = request_id,
		.tenant = moat_gw_message_tenant(request) };
	uint64_t now = moat_rpc_now_ms();
	char *msg = NULL;
	int rv;

	*reply = NULL;
	opts.timeout_ms =
	    deadline_ms > now ? (uint32_t)(deadline_ms - now) : 1;
	rv = moat_rpc_call(rec->sessiond, SESSIOND_SERVICE, method, request,
	    reply_desc, reply, &opts, &msg);
	if (rv == MOAT_OK) {
		free(msg);
		return MOAT_OK;
	}
	if (rv == MOAT_UNAVAILABLE || rv == MOAT_DEADLINE_EXCEEDED)
		*errmsg = moat_asprintf(
		    "moat-sessiond at %s did not answer "
		    "%s (%s): is it running? `moat info` shows it",
		    rec->sessiond_url, method, msg ? msg : "");
	else
		*errmsg = moat_asprintf("%s", msg ? msg : moat_strerror(rv));
	free(msg);
	return rv;
}
