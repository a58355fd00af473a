/*
 * record_step.c: the step pipeline of a recorded sandbox (record.c has
 * the table): before a step (moat_record_step_before) its entry is
 * refreshed from sessiond, since another gateway may have recorded
 * steps; after it (moat_record_step_after) the node's filesystem trace
 * is diffed against the previous one, the step (its input, output and
 * changes) appended to the session, the reply repacked with the step's
 * index, and under EVERY the sandbox snapshotted and the snapshot
 * attached to the step. moat_record_step runs both on the caller's
 * thread (a call built inside the gateway: replay); record_async.c runs
 * them for deferred client calls.
 * Not for: the table and whose turn it is (record.c), deferring steps
 * (record_async.c).
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
			/* A terminal session's stdout is a cast, not output
			 * to compare or replay as a command's. */
			step->kind = req->pty ?
			    MOAT__V1__STEP_KIND__STEP_KIND_SHELL :
			    MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
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
	         moat_rpc_now_ms() + record_call_timeout(deadline_ms),
	         &msg)) != MOAT_OK) {
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
	latest = record_latest_session(list);
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
		step0 = record_label_of(latest, MOAT_RECORD_STEP0_LABEL);
		snprintf(e->step0, sizeof(e->step0), "%s",
		    step0 != NULL ? step0 : "");
		pthread_mutex_unlock(&rec->lock);
		e->policy = latest->snapshot_policy;
		e->last_index = latest->step_count;
		e->base_index =
		    latest->first_step ? latest->first_step - 1 : 0;
		e->snapshots = UINT32_MAX;
		if (record_trace_fs(rec, tenant, e->sandbox_id, 0, &cur,
		        &msg) != MOAT_OK) {
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

	if (record_trace_fs(rec, c->tenant, c->sandbox_id, c->deadline_ms, cur,
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
	    record_set_step_snapshot(rec, c->tenant, e->session_id, index,
	        snap, c->deadline_ms, &msg) != MOAT_OK) {
		*err = moat_asprintf("step %llu recorded without a snapshot "
		                     "(it cannot be restored): %s",
		    (unsigned long long)index, msg ? msg : "");
		moat_warn(c->request_id, "recording %s: %s", c->sandbox_id,
		    *err);
	} else {
		record_retain(rec, e, c->tenant, c->request_id);
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
	    record_lookup(rec, tenant, sandbox_id, request_id);

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
	record_entry_own(e);
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
