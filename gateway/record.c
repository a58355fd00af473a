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
 * This file: the table and its entries' turns, the calls to sessiond and
 * the node, finding a sandbox's session, the snapshot policy and the
 * session calls; the step pipeline is in record_step.c and the trace
 * diff in record_trace.c (record_internal.h: what record.c and
 * record_step.c share).
 * Not for: restore, fork and replay (travel.c), sessiond's storage
 * (services/session/), deferring steps (record_async.c).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "record_internal.h"
#include "moat/log.h"
#include "moat/safety.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define SESSIOND_SERVICE "moat.v1.Session"
/* A sandbox known not to be recorded is asked about again after this:
 * another gateway may have started recording it. */
#define RECORD_NEGATIVE_TTL_MS 5000

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

/* record_entry_own: this thread's turn on e, after the steps that came before
 * (blocks until then). moat_record_entry_release ends it. */
void
record_entry_own(struct moat_record_entry *e)
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

/* record_call_timeout: what a recording call gets: the caller's time left, but
 * at least RECORD_CALL_MIN_MS (the exec has run; its step must land). */
uint32_t
record_call_timeout(uint64_t deadline_ms)
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

/* record_node_call: `method` of moat.v1.Vm with `req` for `tenant` on the node
 * holding `sandbox_id`; the reply decoded as `reply_desc` (caller
 * frees). */
int
record_node_call(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, const char *method, const ProtobufCMessage *req,
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

/* record_trace_fs: the hashed filesystem trace of `sandbox_id` from its node.
 * On MOAT_OK *out is the caller's; else *errmsg (heap, caller frees). */
int
record_trace_fs(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t deadline_ms, Moat__V1__FsTrace **out,
    char **errmsg)
{
	Moat__V1__FsTraceCall req = MOAT__V1__FS_TRACE_CALL__INIT;

	req.sandbox_id = (char *)sandbox_id;
	req.hash = true;
	return record_node_call(rec, tenant, sandbox_id, "TraceFs", &req.base,
	    &moat__v1__fs_trace__descriptor,
	    moat_rpc_now_ms() + record_call_timeout(deadline_ms),
	    "the sandbox's fs trace", (ProtobufCMessage **)out, errmsg);
}

int
moat_record_trace(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t deadline_ms, Moat__V1__FsTrace **out,
    char **errmsg)
{
	return record_trace_fs(rec, tenant, sandbox_id, deadline_ms, out,
	    errmsg);
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
	if ((rv = record_node_call(rec, tenant, sandbox_id, "SnapshotSandbox",
	         &req.base, &moat__v1__local_snapshot__descriptor,
	         moat_rpc_now_ms() + record_call_timeout(deadline_ms),
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

/* record_set_step_snapshot: attaches `snapshot_id` to step `index` (0: the
 * session's step-0 label), with at least RECORD_CALL_MIN_MS. */
int
record_set_step_snapshot(struct moat_record *rec, const char *tenant,
    const char *session_id, uint64_t index, const char *snapshot_id,
    uint64_t deadline_ms, char **errmsg)
{
	return moat_record_set_step_snapshot(rec, tenant, session_id, index,
	    snapshot_id, NULL, moat_rpc_new_request_id(),
	    moat_rpc_now_ms() + record_call_timeout(deadline_ms), errmsg);
}

/* record_label_of: the value of `key` in a session's labels, or NULL. */
const char *
record_label_of(const Moat__V1__SessionInfo *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i]->key, key) == 0)
			return s->labels[i]->value;
	return NULL;
}

const char *
moat_record_session_step0(const Moat__V1__SessionInfo *s)
{
	return record_label_of(s, MOAT_RECORD_STEP0_LABEL);
}

const char *
moat_record_session_label(const Moat__V1__SessionInfo *s, const char *key)
{
	return record_label_of(s, key);
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

const Moat__V1__SessionInfo *
record_latest_session(const Moat__V1__ListSessionsReply *list)
{
	const Moat__V1__SessionInfo *latest = NULL;

	for (size_t i = 0; i < list->n_sessions; i++)
		if (latest == NULL ||
		    list->sessions[i]->created_ms >= latest->created_ms)
			latest = list->sessions[i];
	return latest;
}

/* record_lookup: the entry of `sandbox_id`: from the table, else (a gateway
 * restarted since the sandbox was created) from sessiond: the latest
 * session recording it. A sandbox sessiond has no session for is
 * remembered as not recorded; when sessiond does not answer, NULL and
 * nothing is remembered. */
struct moat_record_entry *
record_lookup(struct moat_record *rec, const char *tenant,
    const char *sandbox_id, uint64_t request_id)
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
	latest = record_latest_session(list);
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
		e->base_index =
		    latest->first_step ? latest->first_step - 1 : 0;
		e->snapshots = UINT32_MAX; /* retention will count them */
		if ((step0 = record_label_of(latest,
		         MOAT_RECORD_STEP0_LABEL)) != NULL)
			snprintf(e->step0, sizeof(e->step0), "%s", step0);
		/* The next step is diffed against the state found now. */
		if (record_trace_fs(rec, tenant, sandbox_id, 0, &e->prev,
		        &msg) != MOAT_OK) {
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
	    record_lookup(rec, tenant, sandbox_id, request_id);

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
	if (record_set_step_snapshot(rec, tenant, e->session_id, 0, snap,
	        deadline_ms, &msg) != MOAT_OK) {
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
	         moat_rpc_now_ms() + record_call_timeout(deadline_ms),
	         &msg)) != MOAT_OK) {
		*errmsg = moat_asprintf("cannot start the recording of %s: %s",
		    sandbox_id, msg);
		free(msg);
		return rv;
	}
	info = (Moat__V1__SessionInfo *)reply;
	e = entry_new(sandbox_id, info->id ? info->id : "");
	if (e != NULL) {
		/* A branch goes on from its branch point (issue 18). */
		e->last_index = info->step_count;
		e->base_index = info->step_count;
	}
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
	} else if (record_trace_fs(rec, tenant, sandbox_id, deadline_ms,
	               &e->prev, &msg) != MOAT_OK) {
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

/* record_retain: one more of e's steps has a snapshot: once the session may
 * hold more than the tenant's keep-last, retention runs (e is the
 * caller's). */
void
record_retain(struct moat_record *rec, struct moat_record_entry *e,
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
	/* No step of its own yet (a branch's inherited steps are its
	 * parent's): the session's step 0, its starting state. */
	uint64_t index = e->last_index == e->base_index ? 0 : e->last_index;

	if (index == 0) {
		pthread_mutex_lock(&rec->lock);
		snprintf(e->step0, sizeof(e->step0), "%s", snapshot_id);
		pthread_mutex_unlock(&rec->lock);
	}
	if (record_set_step_snapshot(rec, tenant, e->session_id, index,
	        snapshot_id, deadline_ms, &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "snapshot %s of %s not attached to step "
		    "%llu of session %s%s: %s",
		    snapshot_id, e->sandbox_id, (unsigned long long)index,
		    e->session_id,
		    index == 0 ? " (this gateway keeps it)" : "",
		    msg ? msg : "");
		free(msg);
		return;
	}
	moat_info(request_id, "snapshot %s is step %llu of session %s",
	    snapshot_id, (unsigned long long)e->last_index, e->session_id);
	record_retain(rec, e, tenant, request_id);
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
	    record_lookup(rec, tenant, req->sandbox_id, call->request_id);
	Moat__V1__LocalSnapshot *snap = NULL;
	int rv;

	if (e == NULL || e->session_id[0] == '\0' ||
	    e->policy != MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_MANUAL)
		return moat_forward_call(rec->fw, call, req->sandbox_id,
		    call->payload, call->payload_len);
	/* In the entry's turn: no step lands between the snapshot and its
	 * attaching. */
	record_entry_own(e);
	rv = forward_snapshot(rec, call, req, e, &snap);
	if (snap != NULL)
		attach_manual(rec, e, tenant, snap->snapshot_id,
		    call->request_id, call->deadline_ms);
	moat_record_entry_release(rec, e);
	if (snap != NULL)
		moat__v1__local_snapshot__free_unpacked(snap, NULL);
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
