/*
 * validate.c: the checks sessiond runs on a request before it reads or
 * queues a write, so that bad input is an INVALID_ARGUMENT naming the
 * field (and saying what is allowed) and nothing malformed reaches the
 * store or the writer thread.
 * Not for: checks that need the store (the session exists, the index is
 * the next one): those happen where the data is read or written.
 */
#include <string.h>

#include "guest.pb-c.h"
#include "moat/rpc_tenant.h"
#include "moat/status.h"
#include "sessiond.h"

/* A step-0 label names a snapshot: any label value fits a reference key. */
_Static_assert(SESSIOND_MAX_LABEL_VALUE <= SESSIOND_MAX_SNAPSHOT_ID,
    "label values must fit snapshot_refs keys");

int
sessiond_check_short(struct moat_rpc_call *call, const char *field,
    const char *value, size_t max)
{
	size_t n = value ? strlen(value) : 0;

	if (n > max)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%s is %zu "
		    "bytes long; at most %zu",
		    field, n, max);
	return MOAT_OK;
}

int
sessiond_check_tenant(struct moat_rpc_call *call, const char *tenant)
{
	const char *acts_for;
	int rv;

	/* The request's field names the tenant (never "" for any or for
	 * "default"); a call that also carries Envelope.tenant (the
	 * gateway's) must name the same one (rpc_tenant.h). */
	if (tenant == NULL || tenant[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "tenant is "
		    "required: every sessiond call names the tenant it acts "
		    "for (the gateway sets it)");
	if ((rv = sessiond_check_short(call, "tenant", tenant,
	         SESSIOND_MAX_TENANT)) != MOAT_OK)
		return rv;
	return moat_rpc_tenant(call, tenant, &acts_for);
}

int
sessiond_check_id(struct moat_rpc_call *call, const char *field,
    const char *value, struct sessiond_id *id)
{
	if (value == NULL || value[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%s is "
		    "empty: pass a session id (\"ses-\" and 16 hex digits; "
		    "ListSessions lists them)",
		    field);
	if (!sessiond_id_parse(value, id))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%s \"%.64s"
		    "\" is not a session id (\"ses-\" and 16 lowercase hex "
		    "digits; ListSessions lists them)",
		    field, value);
	return MOAT_OK;
}

int
sessiond_check_page(struct moat_rpc_call *call, uint32_t page_size,
    uint32_t *limit)
{
	if (page_size > SESSIOND_PAGE_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "page_size "
		    "%u is over %u; ask for smaller pages and follow "
		    "next_page_token",
		    page_size, SESSIOND_PAGE_MAX);
	*limit = page_size ? page_size : SESSIOND_PAGE_DEFAULT;
	return MOAT_OK;
}

int
sessiond_check_create(struct moat_rpc_call *call,
    const Moat__V1__CreateSessionRequest *req)
{
	struct sessiond_id parent;
	int rv;

	if ((rv = sessiond_check_tenant(call, req->tenant)) != MOAT_OK)
		return rv;
	if (req->sandbox_id == NULL || req->sandbox_id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "sandbox_id is empty: a session records one sandbox");
	if ((rv = sessiond_check_short(call, "sandbox_id", req->sandbox_id,
	         SESSIOND_MAX_SANDBOX)) != MOAT_OK)
		return rv;
	if (req->n_labels > SESSIOND_MAX_LABELS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "labels: "
		    "%zu given; at most %d",
		    req->n_labels, SESSIOND_MAX_LABELS);
	for (size_t i = 0; i < req->n_labels; i++) {
		const char *k = req->labels[i]->key;

		if (k == NULL || k[0] == '\0')
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "labels: a key is empty");
		if ((rv = sessiond_check_short(call, "labels key", k,
		         SESSIOND_MAX_LABEL_KEY)) != MOAT_OK ||
		    (rv = sessiond_check_short(call, "labels value",
		         req->labels[i]->value, SESSIOND_MAX_LABEL_VALUE)) !=
		        MOAT_OK)
			return rv;
		/* One value per key, so the step-0 snapshot a session
		 * references is never in doubt. */
		for (size_t j = 0; j < i; j++)
			if (strcmp(req->labels[j]->key, k) == 0)
				return moat_rpc_error(call,
				    MOAT_INVALID_ARGUMENT,
				    "labels: key "
				    "\"%.64s\" is given twice; give each key "
				    "once",
				    k);
	}
	switch (req->snapshot_policy) {
	case MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_MANUAL:
	case MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY:
	case MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_NONE:
		break;
	default:
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "snapshot_policy %d is not one of MANUAL (0), EVERY (1), "
		    "NONE (2)",
		    (int)req->snapshot_policy);
	}
	if (req->parent_session_id == NULL ||
	    req->parent_session_id[0] == '\0') {
		if (req->parent_step != 0)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "parent_step %llu given without "
			    "parent_session_id",
			    (unsigned long long)req->parent_step);
		return MOAT_OK;
	}
	return sessiond_check_id(call, "parent_session_id",
	    req->parent_session_id, &parent);
}

static int
check_trace_entry(struct moat_rpc_call *call, size_t i,
    const Moat__V1__FsTraceEntry *e)
{
	size_t n = e->path ? strlen(e->path) : 0;

	if (n == 0 || n > SESSIOND_MAX_PATH)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.fs_trace[%zu].path is %zu bytes; 1 to %d", i, n,
		    SESSIOND_MAX_PATH);
	if (e->change != MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED &&
	    e->change != MOAT__V1__FS_CHANGE__FS_CHANGE_MODIFIED &&
	    e->change != MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.fs_trace[%zu].change %d is not CREATED (0), "
		    "MODIFIED (1) or DELETED (2)",
		    i, (int)e->change);
	if (e->sha256.len != 0 && e->sha256.len != 32)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.fs_trace[%zu].sha256 is %zu bytes; a SHA-256 is 32 "
		    "(or leave it empty)",
		    i, e->sha256.len);
	return MOAT_OK;
}

int
sessiond_check_step(struct moat_rpc_call *call, const Moat__V1__Step *step)
{
	size_t argv_bytes = 0;
	int rv;

	if (step == NULL)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step is "
		    "missing");
	if (step->kind != MOAT__V1__STEP_KIND__STEP_KIND_EXEC &&
	    step->kind != MOAT__V1__STEP_KIND__STEP_KIND_CODE &&
	    step->kind != MOAT__V1__STEP_KIND__STEP_KIND_FILE_WRITE &&
	    step->kind != MOAT__V1__STEP_KIND__STEP_KIND_SHELL)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.kind "
		    "%d is not EXEC (1), CODE (2), FILE_WRITE (3) or SHELL "
		    "(4)",
		    (int)step->kind);
	if ((rv = sessiond_check_short(call, "step.input", step->input,
	         SESSIOND_MAX_INPUT)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "step.language", step->language,
	         SESSIOND_MAX_SHORT)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "step.path", step->path,
	         SESSIOND_MAX_PATH)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "step.snapshot_id",
	         step->snapshot_id, SESSIOND_MAX_SHORT)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "step.safety", step->safety,
	         SESSIOND_MAX_SHORT)) != MOAT_OK ||
	    (rv = sessiond_check_short(call, "step.snapshot_removed",
	         step->snapshot_removed, SESSIOND_MAX_SHORT)) != MOAT_OK)
		return rv;
	if (step->snapshot_id[0] != '\0' && step->snapshot_removed[0] != '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.snapshot_removed is set with step.snapshot_id "
		    "\"%.64s\": a reason is for a step whose snapshot is "
		    "gone; leave one of them empty",
		    step->snapshot_id);
	if (step->kind == MOAT__V1__STEP_KIND__STEP_KIND_FILE_WRITE &&
	    (step->path == NULL || step->path[0] == '\0'))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.path "
		    "is empty: a FILE_WRITE step names the file written");
	if (step->n_argv > SESSIOND_MAX_ARGV)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.argv "
		    "has %zu items; at most %d",
		    step->n_argv, SESSIOND_MAX_ARGV);
	for (size_t i = 0; i < step->n_argv; i++)
		argv_bytes += strlen(step->argv[i]);
	if (argv_bytes > SESSIOND_MAX_INPUT)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.argv "
		    "holds %zu bytes; at most %u",
		    argv_bytes, SESSIOND_MAX_INPUT);
	if (step->ended_ms != 0 && step->ended_ms < step->started_ms)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.ended_ms %llu is before step.started_ms %llu",
		    (unsigned long long)step->ended_ms,
		    (unsigned long long)step->started_ms);
	if (step->n_fs_trace > SESSIOND_MAX_FS_TRACE)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "step.fs_trace has %zu entries; at most %d (set "
		    "fs_trace_truncated and keep the first ones)",
		    step->n_fs_trace, SESSIOND_MAX_FS_TRACE);
	for (size_t i = 0; i < step->n_fs_trace; i++)
		if ((rv = check_trace_entry(call, i, step->fs_trace[i])) !=
		    MOAT_OK)
			return rv;
	return MOAT_OK;
}
