/*
 * handlers.c: the RPC methods of moat.v1.Session and their table. Each
 * handler checks its request (validate.c), then either reads in its own
 * read transaction (gets, lists, export) or hands a write to the writer
 * thread and waits for the durable commit (create, append, delete, set
 * snapshot, set keep). Replies are built from the stored records, so what
 * a client reads is what is on disk.
 * Not for: option parsing and startup (main.c), the layout (layout.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/codec.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

/* fail_with: replies with `status` and the heap message `errmsg` (freed
 * here), or a plain message when there is none. */
static int
fail_with(struct moat_rpc_call *call, int status, char *errmsg)
{
	int rv = moat_rpc_error(call, status, "%s",
	    errmsg ? errmsg : moat_strerror(status));

	free(errmsg);
	return rv;
}

static int
oom(struct moat_rpc_call *call)
{
	return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
	    "sessiond is out "
	    "of memory");
}

/* submit: runs `op` through the writer; on failure replies with its
 * message and frees its results. On success the op's record and
 * unreferenced list stay the caller's. */
static int
submit(struct moat_rpc_call *call, struct sessiond_op *op)
{
	struct sessiond *sd = call->service_ctx;
	int rv = sessiond_writer_submit(sd->writer, op, call->deadline_ms);

	if (rv != MOAT_OK) {
		free(op->record);
		op->record = NULL;
		sessiond_strings_free(op->unreferenced, op->n_unreferenced);
		op->unreferenced = NULL;
		op->n_unreferenced = 0;
		rv = fail_with(call, rv, op->errmsg);
		op->errmsg = NULL;
	}
	return rv;
}

/* read_begin: a read transaction, or the error replied. */
static int
read_begin(struct moat_rpc_call *call, struct moat_store_txn **txn)
{
	struct sessiond *sd = call->service_ctx;
	char *errmsg = NULL;
	int rv;

	if ((rv = moat_store_txn_begin(sd->store, false, txn, &errmsg)) !=
	    MOAT_OK)
		return fail_with(call, rv, errmsg);
	return MOAT_OK;
}

/* session_read: a read transaction and the caller's session in it; on
 * failure the error is replied and nothing is left open. */
static int
session_read(struct moat_rpc_call *call, const char *tenant,
    const char *session_id, struct moat_store_txn **txn,
    Moat__V1__SessionInfo **s)
{
	struct sessiond_id id;
	char *errmsg = NULL;
	int rv;

	*txn = NULL;
	*s = NULL;
	if ((rv = sessiond_check_tenant(call, tenant)) != MOAT_OK ||
	    (rv = sessiond_check_id(call, "session_id", session_id, &id)) !=
	        MOAT_OK ||
	    (rv = read_begin(call, txn)) != MOAT_OK)
		return rv;
	if ((rv = sessiond_session_load(*txn, tenant, &id, s, &errmsg)) !=
	    MOAT_OK) {
		moat_store_txn_abort(*txn);
		*txn = NULL;
		return fail_with(call, rv, errmsg);
	}
	return MOAT_OK;
}

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	r->uptime_ms = moat_rpc_now_ms() - sd->started_ms;
	if ((r->service = strdup(SESSIOND_SERVICE_NAME)) == NULL ||
	    (r->version = strdup(MOAT_VERSION)) == NULL ||
	    (r->state_dir = strdup(sd->store_dir)) == NULL)
		return oom(call);
	return MOAT_OK;
}

/* reply_from_record: unpacks a stored record into the reply. */
static int
reply_from_record(struct moat_rpc_call *call, ProtobufCMessage *reply,
    const uint8_t *buf, size_t len)
{
	ProtobufCMessage *m =
	    protobuf_c_message_unpack(reply->descriptor, NULL, len, buf);

	if (m == NULL)
		return oom(call);
	sessiond_reply_move(reply, m);
	return MOAT_OK;
}

static int
h_create_session(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__CreateSessionRequest *req =
	    (const Moat__V1__CreateSessionRequest *)request;
	struct sessiond_op op = {
		.kind = SESSIOND_OP_CREATE,
		.tenant = req->tenant,
		.create = req,
		.bytes = 1024,
	};
	int rv;

	if ((rv = sessiond_check_create(call, req)) != MOAT_OK ||
	    (rv = submit(call, &op)) != MOAT_OK)
		return rv;
	rv = reply_from_record(call, reply, op.record, op.record_len);
	free(op.record);
	return rv;
}

static int
h_get_session(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__GetSessionRequest *req =
	    (const Moat__V1__GetSessionRequest *)request;
	struct moat_store_txn *txn;
	Moat__V1__SessionInfo *s;
	int rv;

	if ((rv = session_read(call, req->tenant, req->session_id, &txn,
	         &s)) != MOAT_OK)
		return rv;
	moat_store_txn_abort(txn);
	sessiond_reply_move(reply, &s->base);
	return MOAT_OK;
}

/* Ids collected by a scan of by_tenant or by_sandbox. */
struct id_page {
	size_t prefix_len;
	uint32_t limit; /* ids wanted; one more is the next page */
	size_t n;
	uint8_t (*suffixes)[SESSIOND_INDEX_SUFFIX];
};

static int
id_page_visit(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct id_page *p = arg;

	/* by_tenant's prefix "t\0" also starts no other tenant's keys, but
	 * skip anything not of this shape rather than misread it. */
	if (klen != p->prefix_len + SESSIOND_INDEX_SUFFIX)
		return MOAT_OK;
	memcpy(p->suffixes[p->n++], (const uint8_t *)key + p->prefix_len,
	    SESSIOND_INDEX_SUFFIX);
	return p->n <= p->limit ? MOAT_OK : MOAT_STORE_SCAN_STOP;
}

static int
h_list_sessions(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ListSessionsRequest *req =
	    (const Moat__V1__ListSessionsRequest *)request;
	Moat__V1__ListSessionsReply *r = (Moat__V1__ListSessionsReply *)reply;
	uint8_t key[SESSIOND_KEY_INDEX_MAX + SESSIOND_INDEX_SUFFIX];
	struct id_page page = { 0 };
	struct moat_store_txn *txn = NULL;
	bool by_sandbox = req->sandbox_id && req->sandbox_id[0] != '\0';
	const char *db = by_sandbox ? "by_sandbox" : "by_tenant";
	size_t start_len = 0;
	char *errmsg = NULL;
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "sandbox_id", req->sandbox_id,
	         SESSIOND_MAX_SANDBOX)) != MOAT_OK ||
	    (rv = sessiond_check_page(call, req->page_size, &page.limit)) !=
	        MOAT_OK)
		return rv;
	if (by_sandbox)
		sessiond_key_by_sandbox(key, sizeof(key), req->tenant,
		    req->sandbox_id, 0, NULL, &page.prefix_len);
	else
		sessiond_key_by_tenant(key, sizeof(key), req->tenant, 0, NULL,
		    &page.prefix_len);
	if (req->page_token != NULL && req->page_token[0] != '\0') {
		if (!sessiond_token_decode(req->page_token,
		        key + page.prefix_len, SESSIOND_INDEX_SUFFIX))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "page_token \"%.64s\" is not one this call "
			    "returned: pass next_page_token unchanged, or "
			    "none for the first page",
			    req->page_token);
		start_len = page.prefix_len + SESSIOND_INDEX_SUFFIX;
	}
	if ((page.suffixes = malloc(
	         ((size_t)page.limit + 1) * sizeof(*page.suffixes))) == NULL)
		return oom(call);
	if ((rv = read_begin(call, &txn)) != MOAT_OK)
		goto out;
	if ((rv = moat_store_scan(txn, db, key, page.prefix_len,
	         start_len ? key : NULL, start_len, id_page_visit, &page,
	         &errmsg)) != MOAT_OK) {
		rv = fail_with(call, rv, errmsg);
		goto out;
	}
	if (page.n > page.limit &&
	    (r->next_page_token =
	            sessiond_token_encode(page.suffixes[page.limit],
	                SESSIOND_INDEX_SUFFIX)) == NULL) {
		rv = oom(call);
		goto out;
	}
	if (page.n > page.limit)
		page.n = page.limit;
	if (page.n > 0 &&
	    (r->sessions = calloc(page.n, sizeof(*r->sessions))) == NULL) {
		rv = oom(call);
		goto out;
	}
	for (size_t i = 0; i < page.n; i++) {
		struct sessiond_id id;

		memcpy(id.s, page.suffixes[i] + 8, SESSIOND_ID_LEN);
		id.s[SESSIOND_ID_LEN] = '\0';
		if ((rv = sessiond_session_load(txn, req->tenant, &id,
		         &r->sessions[r->n_sessions], &errmsg)) != MOAT_OK) {
			rv = fail_with(call,
			    rv == MOAT_NOT_FOUND ? MOAT_DATA_LOSS : rv,
			    errmsg);
			goto out;
		}
		r->n_sessions++;
	}
	rv = MOAT_OK;
out:
	moat_store_txn_abort(txn);
	free(page.suffixes);
	return rv;
}

static int
h_delete_session(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__DeleteSessionRequest *req =
	    (const Moat__V1__DeleteSessionRequest *)request;
	Moat__V1__DeleteSessionReply *r =
	    (Moat__V1__DeleteSessionReply *)reply;
	struct sessiond_op op = {
		.kind = SESSIOND_OP_DELETE,
		.tenant = req->tenant,
		.bytes = 1024,
	};
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = sessiond_check_id(call, "session_id", req->session_id,
	         &op.id)) != MOAT_OK ||
	    (rv = submit(call, &op)) != MOAT_OK)
		return rv;
	r->steps_deleted = op.result_count;
	/* The list moves into the reply, which frees it. */
	r->unreferenced_snapshots = op.unreferenced;
	r->n_unreferenced_snapshots = op.n_unreferenced;
	return MOAT_OK;
}

static int
h_append_step(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__AppendStepRequest *req =
	    (const Moat__V1__AppendStepRequest *)request;
	Moat__V1__AppendStepReply *r = (Moat__V1__AppendStepReply *)reply;
	struct sessiond_op op = {
		.kind = SESSIOND_OP_APPEND,
		.tenant = req->tenant,
		.step = req->step,
	};
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = sessiond_check_id(call, "session_id", req->session_id,
	         &op.id)) != MOAT_OK ||
	    (rv = sessiond_check_step(call, req->step)) != MOAT_OK)
		return rv;
	op.bytes = 1024 + req->step->stdout.len + req->step->stderr.len +
	    strlen(req->step->input) + req->step->n_fs_trace * 128;
	if ((rv = submit(call, &op)) != MOAT_OK)
		return rv;
	r->index = op.result_index;
	if ((r->session_id = strdup(op.id.s)) == NULL)
		return oom(call);
	return MOAT_OK;
}

/* check_index: steps count from 1. */
static int
check_index(struct moat_rpc_call *call, uint64_t index)
{
	if (index == 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "index is "
		    "0: steps count from 1 (ListSteps lists them)");
	return MOAT_OK;
}

static int
h_get_step(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__GetStepRequest *req =
	    (const Moat__V1__GetStepRequest *)request;
	struct moat_store_txn *txn;
	Moat__V1__SessionInfo *s;
	Moat__V1__Step *step;
	char *errmsg = NULL;
	int rv;

	if ((rv = check_index(call, req->index)) != MOAT_OK ||
	    (rv = session_read(call, req->tenant, req->session_id, &txn,
	         &s)) != MOAT_OK)
		return rv;
	rv = sessiond_path_step_load(txn, s, req->index, req->omit_outputs,
	    &step, &errmsg);
	moat_store_txn_abort(txn);
	moat__v1__session_info__free_unpacked(s, NULL);
	if (rv != MOAT_OK)
		return fail_with(call, rv, errmsg);
	sessiond_reply_move(reply, &step->base);
	return MOAT_OK;
}

/* inherited_gone: whether reading step i of s failed (rv) because the
 * session that held it, an ancestor of s, was deleted (issue 18): lists
 * then go on with s's own steps. *errmsg is freed when so. */
static bool
inherited_gone(const Moat__V1__SessionInfo *s, uint64_t i, int rv,
    char **errmsg)
{
	if (rv != MOAT_NOT_FOUND || i >= sessiond_first_step(s))
		return false;
	free(*errmsg);
	*errmsg = NULL;
	return true;
}

/* load_steps: steps [first, ...] of session s into *steps and *n (heap array
 * of heap messages; the caller's even on failure), at most `limit`, and
 * stopping after `max_bytes` of outputs. *next is the index after the
 * last one loaded, or 0 when the session ends there. */
static int
load_steps(struct moat_store_txn *txn, const Moat__V1__SessionInfo *s,
    uint64_t first, uint64_t limit, bool outputs, size_t max_bytes,
    Moat__V1__Step ***steps, size_t *n, uint64_t *next, char **errmsg)
{
	uint64_t last = s->step_count, i;
	size_t bytes = 0;
	int rv;

	*next = 0;
	if (first > last)
		return MOAT_OK;
	if (last - first + 1 > limit)
		last = first + limit - 1;
	if ((*steps = calloc(last - first + 1, sizeof(**steps))) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	for (i = first; i <= last; i++) {
		if (bytes >= max_bytes)
			break;
		rv = sessiond_path_step_load(txn, s, i, !outputs,
		    &(*steps)[*n], errmsg);
		if (inherited_gone(s, i, rv, errmsg)) {
			i = sessiond_first_step(s) - 1; /* on to its own */
			continue;
		}
		if (rv != MOAT_OK)
			return rv;
		bytes += (*steps)[*n]->stdout.len + (*steps)[*n]->stderr.len;
		(*n)++;
	}
	if (i <= s->step_count)
		*next = i;
	return MOAT_OK;
}

static int
h_list_steps(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ListStepsRequest *req =
	    (const Moat__V1__ListStepsRequest *)request;
	Moat__V1__ListStepsReply *r = (Moat__V1__ListStepsReply *)reply;
	struct moat_store_txn *txn;
	Moat__V1__SessionInfo *s;
	uint8_t token[8];
	uint64_t first = 1, next;
	uint32_t limit;
	char *errmsg = NULL;
	int rv;

	if ((rv = sessiond_check_page(call, req->page_size, &limit)) !=
	    MOAT_OK)
		return rv;
	if (req->page_token != NULL && req->page_token[0] != '\0') {
		if (!sessiond_token_decode(req->page_token, token, 8) ||
		    (first = moat_store_u64_from_key(token)) == 0)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "page_token \"%.64s\" is not one this call "
			    "returned: pass next_page_token unchanged, or "
			    "none for the first page",
			    req->page_token);
	}
	if ((rv = session_read(call, req->tenant, req->session_id, &txn,
	         &s)) != MOAT_OK)
		return rv;
	/* A branch's inherited steps come first, unless own_only. */
	if (req->own_only && first < sessiond_first_step(s))
		first = sessiond_first_step(s);
	rv = load_steps(txn, s, first, limit, req->include_outputs,
	    req->include_outputs ? SESSIOND_PAGE_BYTES : SIZE_MAX, &r->steps,
	    &r->n_steps, &next, &errmsg);
	moat_store_txn_abort(txn);
	moat__v1__session_info__free_unpacked(s, NULL);
	if (rv != MOAT_OK)
		return fail_with(call, rv, errmsg);
	if (next != 0) {
		moat_store_key_u64(token, next);
		if ((r->next_page_token = sessiond_token_encode(token, 8)) ==
		    NULL)
			return oom(call);
	}
	return MOAT_OK;
}

/* export_size: the outputs and inputs of a whole session, from the step
 * records, so that an export too large for one reply is refused before
 * anything is loaded. */
static int
export_size(struct moat_store_txn *txn, const Moat__V1__SessionInfo *s,
    uint64_t *bytes, char **errmsg)
{
	Moat__V1__Step *step;
	int rv;

	*bytes = 0;
	for (uint64_t i = 1; i <= s->step_count; i++) {
		rv = sessiond_path_step_load(txn, s, i, true, &step, errmsg);
		if (inherited_gone(s, i, rv, errmsg)) {
			i = sessiond_first_step(s) - 1;
			continue;
		}
		if (rv != MOAT_OK)
			return rv;
		*bytes += step->stdout_bytes + step->stderr_bytes +
		    strlen(step->input) + 256 * (step->n_fs_trace + 1);
		moat__v1__step__free_unpacked(step, NULL);
	}
	return MOAT_OK;
}

static int
h_export_session(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ExportSessionRequest *req =
	    (const Moat__V1__ExportSessionRequest *)request;
	Moat__V1__ExportSessionReply *r =
	    (Moat__V1__ExportSessionReply *)reply;
	struct moat_store_txn *txn;
	Moat__V1__SessionInfo *s;
	uint64_t bytes, next;
	char *errmsg = NULL, *json = NULL;
	int rv;

	if (req->format != MOAT__V1__EXPORT_FORMAT__EXPORT_FORMAT_MESSAGE &&
	    req->format != MOAT__V1__EXPORT_FORMAT__EXPORT_FORMAT_JSON)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "format %d "
		    "is not MESSAGE (0) or JSON (1)",
		    (int)req->format);
	if ((rv = session_read(call, req->tenant, req->session_id, &txn,
	         &s)) != MOAT_OK)
		return rv;
	r->session = s;
	if ((rv = export_size(txn, s, &bytes, &errmsg)) != MOAT_OK)
		goto fail;
	if (bytes > SESSIOND_EXPORT_BYTES) {
		errmsg = moat_asprintf(
		    "session %s holds about %llu MiB of "
		    "steps, more than one export carries (%u MiB): page "
		    "through ListSteps with include_outputs instead",
		    s->id, (unsigned long long)(bytes >> 20),
		    SESSIOND_EXPORT_BYTES >> 20);
		rv = MOAT_RESOURCE_EXHAUSTED;
		goto fail;
	}
	if ((rv = load_steps(txn, s, 1, UINT64_MAX, true, SIZE_MAX, &r->steps,
	         &r->n_steps, &next, &errmsg)) != MOAT_OK)
		goto fail;
	moat_store_txn_abort(txn);
	txn = NULL;
	if (req->format == MOAT__V1__EXPORT_FORMAT__EXPORT_FORMAT_JSON) {
		if ((rv = moat_codec_to_json_string(&r->base,
		         MOAT_CODEC_EMIT_DEFAULTS, 1, &json, &errmsg)) !=
		    MOAT_OK)
			return fail_with(call, rv, errmsg);
		/* The reply carries the text alone. */
		moat__v1__session_info__free_unpacked(r->session, NULL);
		r->session = NULL;
		for (size_t i = 0; i < r->n_steps; i++)
			moat__v1__step__free_unpacked(r->steps[i], NULL);
		free(r->steps);
		r->steps = NULL;
		r->n_steps = 0;
		r->json = json;
	}
	return MOAT_OK;

fail:
	moat_store_txn_abort(txn);
	return fail_with(call, rv, errmsg);
}

static int
h_set_step_snapshot(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	const Moat__V1__SetStepSnapshotRequest *req =
	    (const Moat__V1__SetStepSnapshotRequest *)request;
	struct sessiond_op op = {
		.kind = SESSIOND_OP_SET_SNAPSHOT,
		.tenant = req->tenant,
		.index = req->index,
		.snapshot_id = req->snapshot_id,
		.removed_reason = req->removed_reason,
		.bytes = 1024,
	};
	int rv;

	/* Index 0 is the session's step 0 (its step-0 labels). */
	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = sessiond_check_id(call, "session_id", req->session_id,
	         &op.id)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "snapshot_id", req->snapshot_id,
	         SESSIOND_MAX_SNAPSHOT_ID)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "removed_reason",
	         req->removed_reason, SESSIOND_MAX_LABEL_VALUE)) != MOAT_OK)
		return rv;
	if (req->snapshot_id[0] != '\0' && req->removed_reason[0] != '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "removed_reason is given with snapshot_id \"%.64s\": a "
		    "reason says why a step has no snapshot; send an empty "
		    "snapshot_id to remove it, or no reason to set it",
		    req->snapshot_id);
	if ((rv = submit(call, &op)) != MOAT_OK)
		return rv;
	rv = reply_from_record(call, reply, op.record, op.record_len);
	free(op.record);
	return rv;
}

static int
h_set_step_keep(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__SetStepKeepRequest *req =
	    (const Moat__V1__SetStepKeepRequest *)request;
	struct sessiond_op op = {
		.kind = SESSIOND_OP_SET_KEEP,
		.tenant = req->tenant,
		.index = req->index,
		.keep = req->keep,
		.bytes = 1024,
	};
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = sessiond_check_id(call, "session_id", req->session_id,
	         &op.id)) != MOAT_OK ||
	    (rv = check_index(call, req->index)) != MOAT_OK ||
	    (rv = submit(call, &op)) != MOAT_OK)
		return rv;
	rv = reply_from_record(call, reply, op.record, op.record_len);
	free(op.record);
	return rv;
}

static int
h_snapshot_refs(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__SnapshotRefsRequest *req =
	    (const Moat__V1__SnapshotRefsRequest *)request;
	Moat__V1__SnapshotRefsReply *r = (Moat__V1__SnapshotRefsReply *)reply;
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	uint64_t count;
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK)
		return rv;
	if (req->n_snapshot_ids > SESSIOND_MAX_REFS_ASKED)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "snapshot_ids holds %zu ids; at most %d per call: ask in "
		    "batches",
		    req->n_snapshot_ids, SESSIOND_MAX_REFS_ASKED);
	if (req->n_snapshot_ids == 0)
		return MOAT_OK;
	if ((r->refs = calloc(req->n_snapshot_ids, sizeof(*r->refs))) == NULL)
		return oom(call);
	if ((rv = read_begin(call, &txn)) != MOAT_OK)
		return rv;
	/* An empty id, or one longer than any stored, is referenced by
	 * nothing: 0, like an unknown one. */
	for (size_t i = 0; i < req->n_snapshot_ids; i++) {
		if ((rv = sessiond_refs_get(txn, req->tenant,
		         req->snapshot_ids[i], &count, &errmsg)) != MOAT_OK) {
			moat_store_txn_abort(txn);
			return fail_with(call, rv, errmsg);
		}
		r->refs[r->n_refs++] =
		    count > UINT32_MAX ? UINT32_MAX : (uint32_t)count;
	}
	moat_store_txn_abort(txn);
	return MOAT_OK;
}

static int
h_get_session_tree(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__GetSessionTreeRequest *req =
	    (const Moat__V1__GetSessionTreeRequest *)request;
	Moat__V1__SessionTreeReply *r = (Moat__V1__SessionTreeReply *)reply;
	struct moat_store_txn *txn;
	Moat__V1__SessionInfo *s;
	char *errmsg = NULL;
	int rv;

	if ((rv = session_read(call, req->tenant, req->session_id, &txn,
	         &s)) != MOAT_OK)
		return rv;
	rv = sessiond_tree_build(txn, s, r, &errmsg);
	moat_store_txn_abort(txn);
	moat__v1__session_info__free_unpacked(s, NULL);
	if (rv != MOAT_OK)
		return fail_with(call, rv, errmsg);
	return MOAT_OK;
}

/* Mutating calls are answered from the RPC layer's memory when a client
 * repeats a request id, so a retried append is never recorded twice. */
const struct moat_rpc_method sessiond_methods[] = {
	{ "Health", h_health, false, false },
	{ "CreateSession", h_create_session, true, false },
	{ "GetSession", h_get_session, false, false },
	{ "ListSessions", h_list_sessions, false, false },
	{ "DeleteSession", h_delete_session, true, false },
	{ "AppendStep", h_append_step, true, false },
	{ "GetStep", h_get_step, false, false },
	{ "ListSteps", h_list_steps, false, false },
	{ "ExportSession", h_export_session, false, false },
	{ "SetStepSnapshot", h_set_step_snapshot, true, false },
	{ "SetStepKeep", h_set_step_keep, true, false },
	{ "SnapshotRefs", h_snapshot_refs, false, false },
	{ "GetSessionTree", h_get_session_tree, false, false },
	/* A claim is asked again while its call runs: never answered
	 * from the RPC layer's memory. */
	{ "ClaimRequest", sessiond_h_claim_request, false, false },
	{ "CompleteRequest", sessiond_h_complete_request, true, false },
	/* Keys are read fresh on every verify (a revoke must show). */
	{ "CreateKey", sessiond_h_create_key, true, false },
	{ "ListKeys", sessiond_h_list_keys, false, false },
	{ "RevokeKey", sessiond_h_revoke_key, true, false },
	{ "VerifyKey", sessiond_h_verify_key, false, false },
	{ "AppendAudit", sessiond_h_append_audit, true, false },
	{ "ListAuditLog", sessiond_h_list_audit_log, false, false },
	/* A put marks the session used: never answered from memory. */
	{ "PutMcpSession", sessiond_h_put_mcp_session, false, false },
	{ "GetMcpSession", sessiond_h_get_mcp_session, false, false },
	{ "DeleteMcpSession", sessiond_h_delete_mcp_session, true, false },
	{ "SetTenant", sessiond_h_set_tenant, true, false },
	{ "GetTenant", sessiond_h_get_tenant, false, false },
	{ "ListTenants", sessiond_h_list_tenants, false, false },
	{ "DeleteTenant", sessiond_h_delete_tenant, true, false },
	/* A retried reserve must not be answered with another's handle
	 * from memory, nor a land or release replayed: never cached. */
	{ "ReserveQuota", sessiond_h_reserve_quota, false, false },
	{ "LandQuota", sessiond_h_land_quota, false, false },
	{ "ReleaseQuota", sessiond_h_release_quota, false, false },
};
const size_t sessiond_n_methods =
    sizeof(sessiond_methods) / sizeof(sessiond_methods[0]);
