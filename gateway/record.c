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
 * Not for: snapshots and restore (later work), sessiond's storage
 * (services/session/).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define SESSIOND_SERVICE "moat.v1.Session"
#define RECORD_CALL_MIN_MS 5000  /* trace / append get at least this */

/* One recorded sandbox. Entries are allocated one by one and freed only
 * by moat_record_fini, so a pointer taken under the table lock stays
 * valid; `lock` orders the steps of one sandbox (its execs are recorded
 * one at a time). */
struct moat_record_entry {
	pthread_mutex_t lock;
	char sandbox_id[MOAT_ID_MAX];
	char session_id[MOAT_ID_MAX];
	bool gone;                  /* the sandbox was destroyed */
	Moat__V1__FsTrace *prev;    /* owned: the trace after the last step */
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
	    a->sha256.len == b->sha256.len && (a->sha256.len == 0 ||
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
	if (np + nc > 0 &&
	    (res = calloc(np + nc, sizeof(*res))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto cleanup;
	}
	while (i < np || j < nc) {
		const Moat__V1__FsTraceEntry *a = i < np ? p[i] : NULL;
		const Moat__V1__FsTraceEntry *b = j < nc ? c[j] : NULL;
		Moat__V1__FsTraceEntry *e = NULL;
		int order = a == NULL ? 1 : b == NULL ? -1 :
		    cmp_entry_path(&p[i], &c[j]);

		if (order > 0) {
			e = new_entry(b, b->change, true);
			j++;
		} else if (order < 0) {
			if (a->change == MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED)
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
			if (b->change == MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
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
		moat_trace_diff_free(res, n);  /* n entries made so far */
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
	rec->ready = true;
	return MOAT_OK;
}

void
moat_record_fini(struct moat_record *rec)
{
	if (!rec->ready)
		return;
	for (size_t i = 0; i < rec->n; i++) {
		pthread_mutex_destroy(&rec->entries[i]->lock);
		if (rec->entries[i]->prev != NULL)
			moat__v1__fs_trace__free_unpacked(
			    rec->entries[i]->prev, NULL);
		free(rec->entries[i]);
	}
	free(rec->entries);
	pthread_mutex_destroy(&rec->lock);
	rec->ready = false;
}

/* find: the live entry of `sandbox_id`, or NULL. Takes the table lock. */
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

bool
moat_record_session_of(struct moat_record *rec, const char *sandbox_id,
    char *session_id, size_t size)
{
	struct moat_record_entry *e = find(rec, sandbox_id);

	if (e == NULL || size == 0)
		return false;
	snprintf(session_id, size, "%s", e->session_id);
	return true;
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
	 * the big part, goes. */
	pthread_mutex_lock(&e->lock);
	if (e->prev != NULL)
		moat__v1__fs_trace__free_unpacked(e->prev, NULL);
	e->prev = NULL;
	pthread_mutex_unlock(&e->lock);
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

/* trace_fs: the hashed filesystem trace of `sandbox_id` from its node.
 * On MOAT_OK *out is the caller's; else *errmsg (heap, caller frees). */
static int
trace_fs(struct moat_record *rec, const char *sandbox_id,
    uint64_t deadline_ms, Moat__V1__FsTrace **out, char **errmsg)
{
	Moat__V1__FsTraceCall req = MOAT__V1__FS_TRACE_CALL__INIT;
	struct moat_sandbox_id sandbox;
	struct moat_node_id node;
	uint8_t payload[MOAT_ID_MAX + 16], *reply = NULL;
	size_t len, reply_len = 0;
	uint64_t deadline = moat_rpc_now_ms() + call_timeout(deadline_ms);
	int rv;

	*out = NULL;
	if (!moat_sandbox_id_set(&sandbox, sandbox_id)) {
		*errmsg = moat_asprintf("sandbox id unusable");
		return MOAT_INVALID_ARGUMENT;
	}
	req.sandbox_id = (char *)sandbox_id;
	req.hash = true;
	len = moat__v1__fs_trace_call__get_packed_size(&req);
	if (len > sizeof(payload)) {
		*errmsg = moat_asprintf("sandbox id too long");
		return MOAT_INVALID_ARGUMENT;
	}
	moat__v1__fs_trace_call__pack(&req, payload);
	if ((rv = moat_forward_locate(rec->fw, &sandbox, deadline, &node,
	    errmsg)) != MOAT_OK)
		return rv;
	if ((rv = moat_forward_to_node(rec->fw, &node, "TraceFs", payload,
	    len, moat_rpc_new_request_id(), deadline, "the sandbox's fs trace",
	    &reply, &reply_len, errmsg)) != MOAT_OK)
		return rv;
	*out = moat__v1__fs_trace__unpack(NULL, reply_len, reply);
	free(reply);
	if (*out == NULL) {
		*errmsg = moat_asprintf("node %s answered TraceFs with "
		    "something that is not a moat.v1.FsTrace", node.s);
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

int
moat_record_start(struct moat_record *rec, const char *tenant,
    const Moat__V1__CreateSandboxRequest *req, const char *sandbox_id,
    uint64_t request_id, uint64_t deadline_ms, char *session_id,
    size_t size, char **errmsg)
{
	Moat__V1__CreateSessionRequest creq =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	struct moat_rpc_opts opts = {
		.timeout_ms = call_timeout(deadline_ms),
		.request_id = request_id,
	};
	ProtobufCMessage *reply = NULL;
	Moat__V1__SessionInfo *info;
	struct moat_record_entry *e = NULL, **grown;
	char *msg = NULL;
	int rv;

	creq.tenant = (char *)tenant;
	creq.sandbox_id = (char *)sandbox_id;
	creq.snapshot_policy = req->snapshot_policy;
	if ((rv = moat_rpc_call(rec->sessiond, SESSIOND_SERVICE,
	    "CreateSession", &creq.base, &moat__v1__session_info__descriptor,
	    &reply, &opts, &msg)) != MOAT_OK) {
		*errmsg = moat_asprintf("moat-sessiond at %s: %s: %s (is "
		    "moat-sessiond running? see `moat info`)",
		    rec->sessiond_url, moat_strerror(rv), msg ? msg : "");
		free(msg);
		return rv;
	}
	info = (Moat__V1__SessionInfo *)reply;
	if ((e = calloc(1, sizeof(*e))) == NULL ||
	    pthread_mutex_init(&e->lock, NULL) != 0) {
		free(e);
		protobuf_c_message_free_unpacked(reply, NULL);
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	snprintf(e->sandbox_id, sizeof(e->sandbox_id), "%s", sandbox_id);
	snprintf(e->session_id, sizeof(e->session_id), "%s",
	    info->id ? info->id : "");
	snprintf(session_id, size, "%s", e->session_id);
	protobuf_c_message_free_unpacked(reply, NULL);
	/* The image's own changes since boot are no step's: the first
	 * step is diffed against this. Best effort. */
	if (trace_fs(rec, sandbox_id, deadline_ms, &e->prev, &msg) !=
	    MOAT_OK) {
		moat_warn(request_id, "recording %s: no starting fs trace "
		    "(%s): the first step lists every change since boot",
		    sandbox_id, msg ? msg : "");
		free(msg);
		msg = NULL;
	}
	pthread_mutex_lock(&rec->lock);
	grown = rec->n < rec->cap ? rec->entries :
	    realloc(rec->entries, (rec->cap * 2 + 8) * sizeof(*grown));
	if (grown != NULL) {
		if (grown != rec->entries) {
			rec->entries = grown;
			rec->cap = rec->cap * 2 + 8;
		}
		rec->entries[rec->n++] = e;
		e = NULL;
	}
	pthread_mutex_unlock(&rec->lock);
	if (e != NULL) {
		pthread_mutex_destroy(&e->lock);
		if (e->prev != NULL)
			moat__v1__fs_trace__free_unpacked(e->prev, NULL);
		free(e);
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	return MOAT_OK;
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

/* append_step: builds the step of `req` / `res` with `diff` and appends
 * it. On MOAT_OK *index is its index. */
static int
append_step(struct moat_record *rec, struct moat_record_entry *e,
    const char *tenant, const Moat__V1__ExecRequest *req,
    const Moat__V1__ExecResult *res, uint64_t started, uint64_t ended,
    Moat__V1__FsTraceEntry **diff, size_t n_diff, bool truncated,
    uint64_t deadline_ms, uint64_t *index, char **errmsg)
{
	Moat__V1__AppendStepRequest areq = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = call_timeout(deadline_ms) };
	ProtobufCMessage *reply = NULL;
	char *joined = NULL, *msg = NULL;
	int rv;

	if (req->code != NULL && req->code[0] != '\0') {
		step.kind = MOAT__V1__STEP_KIND__STEP_KIND_CODE;
		step.input = req->code;
		step.language = req->language;
	} else {
		step.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
		if (req->shell != NULL && req->shell[0] != '\0') {
			step.input = req->shell;
		} else {
			if ((joined = join_argv(req->argv, req->n_argv)) ==
			    NULL) {
				*errmsg = moat_asprintf("out of memory");
				return MOAT_RESOURCE_EXHAUSTED;
			}
			step.input = joined;
		}
		step.n_argv = req->n_argv;
		step.argv = req->argv;
	}
	if (res->status != NULL)
		step.exit_code = res->status->exited ? res->status->exit_code :
		    128 + res->status->signal;
	step.stdout = res->stdout;
	step.stderr = res->stderr;
	step.started_ms = started;
	step.ended_ms = ended;
	step.n_fs_trace = n_diff;
	step.fs_trace = diff;
	step.fs_trace_truncated = truncated;
	areq.tenant = (char *)tenant;
	areq.session_id = e->session_id;
	areq.step = &step;
	rv = moat_rpc_call(rec->sessiond, SESSIOND_SERVICE, "AppendStep",
	    &areq.base, &moat__v1__append_step_reply__descriptor, &reply,
	    &opts, &msg);
	free(joined);
	if (rv != MOAT_OK) {
		*errmsg = moat_asprintf("step not recorded: moat-sessiond at "
		    "%s: %s: %s", rec->sessiond_url, moat_strerror(rv),
		    msg ? msg : "");
		free(msg);
		return rv;
	}
	*index = ((Moat__V1__AppendStepReply *)reply)->index;
	protobuf_c_message_free_unpacked(reply, NULL);
	return MOAT_OK;
}

int
moat_record_exec(struct moat_record *rec, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, const char *tenant, bool *handled)
{
	struct moat_record_entry *e = find(rec, req->sandbox_id);
	Moat__V1__ExecResult *res = NULL;
	Moat__V1__FsTrace *cur = NULL;
	Moat__V1__FsTraceEntry **diff = NULL;
	size_t n_diff = 0, len;
	uint64_t started, ended, index = 0;
	uint8_t *packed;
	char *err = NULL, *msg = NULL, *node_session, *node_error;
	bool truncated = false;
	int rv;

	*handled = e != NULL;
	if (e == NULL)
		return MOAT_OK;
	pthread_mutex_lock(&e->lock);
	started = moat_now_unix_ms();
	rv = moat_forward_call(rec->fw, call, req->sandbox_id, call->payload,
	    call->payload_len);
	ended = moat_now_unix_ms();
	if (rv != MOAT_OK)
		goto cleanup;   /* the exec did not run: no step */
	res = moat__v1__exec_result__unpack(NULL, call->raw_reply_len,
	    call->raw_reply);
	if (res == NULL) {
		moat_warn(call->request_id, "recording %s: the node's "
		    "ExecResult does not decode: step not recorded",
		    req->sandbox_id);
		goto cleanup;
	}
	if (trace_fs(rec, req->sandbox_id, call->deadline_ms, &cur, &msg) ==
	    MOAT_OK) {
		if (moat_trace_diff(e->prev, cur, &diff, &n_diff) != MOAT_OK) {
			err = moat_asprintf("out of memory diffing the fs "
			    "trace");
			goto reply;
		}
		truncated = cur->truncated ||
		    (e->prev != NULL && e->prev->truncated);
	} else {
		/* The step still lands, marked as lacking its trace. */
		moat_warn(call->request_id, "recording %s: fs trace failed: "
		    "%s", req->sandbox_id, msg ? msg : "");
		truncated = true;
	}
	if (append_step(rec, e, tenant, req, res, started, ended, diff,
	    n_diff, truncated, call->deadline_ms, &index, &err) == MOAT_OK) {
		if (cur != NULL) {
			if (e->prev != NULL)
				moat__v1__fs_trace__free_unpacked(e->prev,
				    NULL);
			e->prev = cur;
			cur = NULL;
		}
	} else {
		moat_warn(call->request_id, "recording %s: %s",
		    req->sandbox_id, err);
	}
reply:
	/* Borrowed strings go in for packing only; what the node put there
	 * (normally protobuf-c's static empty string) goes back after. */
	node_session = res->session_id;
	node_error = res->recording_error;
	res->step_index = (uint32_t)index;
	res->session_id = e->session_id;   /* borrowed until packed */
	res->recording_error = err != NULL ? err : (char *)"";
	len = moat__v1__exec_result__get_packed_size(res);
	if ((packed = malloc(len ? len : 1)) != NULL) {
		moat__v1__exec_result__pack(res, packed);
		free(call->raw_reply);
		call->raw_reply = packed;
		call->raw_reply_len = len;
	}
	res->session_id = node_session;
	res->recording_error = node_error;
cleanup:
	pthread_mutex_unlock(&e->lock);
	if (res != NULL)
		moat__v1__exec_result__free_unpacked(res, NULL);
	if (cur != NULL)
		moat__v1__fs_trace__free_unpacked(cur, NULL);
	moat_trace_diff_free(diff, n_diff);
	free(err);
	free(msg);
	return rv;
}

int
moat_record_session_call(struct moat_record *rec, struct moat_rpc_call *call,
    const ProtobufCMessage *request, const char *tenant)
{
	const ProtobufCMessageDescriptor *d = request->descriptor;
	const ProtobufCFieldDescriptor *f;
	struct moat_rpc_opts opts = { .request_id = call->request_id };
	uint64_t now = moat_rpc_now_ms();
	ProtobufCMessage *copy = NULL;
	uint8_t *payload = NULL, *out = NULL;
	size_t len, out_len = 0;
	char *msg = NULL;
	int rv;

	f = protobuf_c_message_descriptor_get_field_by_name(d, "tenant");
	if (f == NULL || f->type != PROTOBUF_C_TYPE_STRING ||
	    f->label == PROTOBUF_C_LABEL_REPEATED)
		return moat_rpc_error(call, MOAT_INTERNAL, "%s has no tenant "
		    "field: the gateway's method table is wrong", d->name);
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
	opts.timeout_ms = call->deadline_ms > now ?
	    (uint32_t)(call->deadline_ms - now) : 1;
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
		rv = moat_rpc_error(call, rv, "moat-sessiond at %s did not "
		    "answer %s (%s): is it running? `moat info` shows it",
		    rec->sessiond_url, call->method, msg ? msg : "");
	else
		rv = moat_rpc_error(call, rv, "%s", msg ? msg :
		    moat_strerror(rv));
	free(msg);
	return rv;
}
