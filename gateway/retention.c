/*
 * retention.c: how many step snapshots a recorded session keeps (issue
 * 11). Every tenant has a policy ([retention] keep-last and keep-age-s,
 * per tenant with keep-last.<tenant> / keep-age-s.<tenant>): after a
 * step's snapshot is attached, the session's step snapshots beyond the
 * newest keep-last, older than keep-age-s and not pinned (Step.keep) are
 * taken off their steps in moat-sessiond, which keeps the reason in the
 * step, and the snapshots no step names any more are deleted. It runs
 * in the step's call but never fails it: errors are logged.
 * Not for: deleting snapshots (snapshots.c) or attaching them
 * (record.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define SECTION "retention"
#define RETENTION_MS 5000 /* all of one session's retention */
#define STEPS_PAGE 1000

int
moat_retention_policy(const struct moat_config *cfg, const char *tenant,
    struct moat_retention *out, char **errmsg)
{
	int rv;

	*errmsg = NULL;
	if ((rv = moat_config_get_u64_for(cfg, SECTION, "keep-last", tenant,
	         MOAT_RETENTION_KEEP_LAST, &out->keep_last, errmsg)) !=
	    MOAT_OK) {
		out->keep_last = MOAT_RETENTION_KEEP_LAST;
		out->keep_age_s = MOAT_RETENTION_KEEP_AGE_S;
		return rv;
	}
	if ((rv = moat_config_get_u64_for(cfg, SECTION, "keep-age-s", tenant,
	         MOAT_RETENTION_KEEP_AGE_S, &out->keep_age_s, errmsg)) !=
	    MOAT_OK)
		out->keep_age_s = MOAT_RETENTION_KEEP_AGE_S;
	return rv;
}

/* One step that has a snapshot. */
struct held {
	uint64_t index;    /* 0: the session's step 0 */
	char *snapshot_id; /* heap */
	uint64_t at_ms;    /* unix ms: when the step ended */
	bool keep;
};

struct session_snaps {
	struct held *v; /* by index, ascending */
	size_t n, cap;
};

static void
snaps_free(struct session_snaps *ss)
{
	for (size_t i = 0; i < ss->n; i++)
		free(ss->v[i].snapshot_id);
	free(ss->v);
}

static int
snaps_add(struct session_snaps *ss, uint64_t index, const char *id,
    uint64_t at_ms, bool keep)
{
	struct held *grown;

	if (ss->n == ss->cap) {
		size_t cap = ss->cap ? ss->cap * 2 : 32;

		if ((grown = realloc(ss->v, cap * sizeof(*grown))) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		ss->v = grown;
		ss->cap = cap;
	}
	if ((ss->v[ss->n].snapshot_id = strdup(id)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	ss->v[ss->n].index = index;
	ss->v[ss->n].at_ms = at_ms;
	ss->v[ss->n].keep = keep;
	ss->n++;
	return MOAT_OK;
}

/* session_snaps_get: the steps of the session that have a snapshot,
 * step 0 first: GetSession for step 0, then ListSteps without outputs,
 * page by page. Errors set *errmsg (heap). */
static int
session_snaps_get(struct moat_record *rec, const char *tenant,
    const char *session_id, uint64_t request_id, uint64_t deadline,
    struct session_snaps *ss, char **errmsg)
{
	Moat__V1__GetSessionRequest sreq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__SessionInfo *s = NULL;
	Moat__V1__ListStepsReply *page = NULL;
	const char *step0;
	char *token = NULL;
	int rv;

	sreq.tenant = req.tenant = (char *)tenant;
	sreq.session_id = req.session_id = (char *)session_id;
	if ((rv = moat_record_sessiond_call(rec, "GetSession", &sreq.base,
	         &moat__v1__session_info__descriptor, (ProtobufCMessage **)&s,
	         request_id, deadline, errmsg)) != MOAT_OK)
		return rv;
	if ((step0 = moat_record_session_step0(s)) != NULL && step0[0] != '\0')
		rv = snaps_add(ss, 0, step0, s->created_ms, false);
	moat__v1__session_info__free_unpacked(s, NULL);
	req.page_size = STEPS_PAGE;
	/* A branch's inherited steps are its parent's to keep or drop. */
	req.own_only = true;
	while (rv == MOAT_OK) {
		req.page_token = token != NULL ? token : (char *)"";
		if ((rv = moat_record_sessiond_call(rec, "ListSteps",
		         &req.base, &moat__v1__list_steps_reply__descriptor,
		         (ProtobufCMessage **)&page, request_id, deadline,
		         errmsg)) != MOAT_OK)
			break;
		for (size_t i = 0; i < page->n_steps && rv == MOAT_OK; i++) {
			const Moat__V1__Step *st = page->steps[i];

			if (st->snapshot_id[0] != '\0')
				rv = snaps_add(ss, st->index, st->snapshot_id,
				    st->ended_ms, st->keep);
		}
		free(token);
		token = page->next_page_token[0] != '\0' ?
		    strdup(page->next_page_token) :
		    NULL;
		moat__v1__list_steps_reply__free_unpacked(page, NULL);
		if (token == NULL)
			break;
	}
	free(token);
	if (rv == MOAT_RESOURCE_EXHAUSTED && *errmsg == NULL)
		*errmsg = moat_asprintf("out of memory");
	return rv;
}

/* drop_unreferenced: deletes those of the `n` ids that no step names. */
static void
drop_unreferenced(struct moat_record *rec, const char *tenant, char **ids,
    size_t n, uint64_t request_id, uint64_t deadline)
{
	struct moat_snapshots_freed freed;
	uint32_t *refs = calloc(n, sizeof(*refs));
	char *msg = NULL;
	size_t m = 0;

	if (refs == NULL ||
	    moat_snapshots_refs(rec, tenant, ids, n, refs, request_id,
	        deadline, &msg) != MOAT_OK) {
		moat_warn(request_id,
		    "retention: snapshots taken off steps "
		    "but not deleted (`moat snapshot gc` will): %s",
		    msg ? msg : "out of memory");
		free(msg);
		free(refs);
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (refs[i] == 0)
			ids[m++] = ids[i];
	free(refs);
	moat_snapshots_delete(rec, tenant, ids, m, request_id, deadline,
	    &freed);
	if (m > 0)
		moat_info(request_id,
		    "retention: %u snapshots deleted (%llu "
		    "bytes), %u left for `moat snapshot gc`%s%s",
		    freed.deleted, (unsigned long long)freed.bytes, freed.left,
		    freed.first_error ? ": " : "",
		    freed.first_error ? freed.first_error : "");
	free(freed.first_error);
}

uint32_t
moat_retention_apply(struct moat_record *rec, const char *tenant,
    const char *session_id, const struct moat_retention *policy,
    uint64_t request_id)
{
	uint64_t deadline = moat_rpc_now_ms() + RETENTION_MS;
	uint64_t now = moat_now_unix_ms();
	uint64_t young = now -
	    (policy->keep_age_s * 1000 < now ? policy->keep_age_s * 1000 :
	                                       now);
	struct session_snaps ss = { 0 };
	char reason[64], **gone = NULL, *msg = NULL;
	size_t n_gone = 0, still;

	if (policy->keep_last == 0)
		return UINT32_MAX;
	if (session_snaps_get(rec, tenant, session_id, request_id, deadline,
	        &ss, &msg) != MOAT_OK ||
	    (ss.n > policy->keep_last &&
	        (gone = calloc(ss.n, sizeof(*gone))) == NULL)) {
		moat_warn(request_id,
		    "retention of session %s not applied: "
		    "%s",
		    session_id, msg ? msg : "out of memory");
		free(msg);
		snaps_free(&ss);
		return UINT32_MAX;
	}
	snprintf(reason, sizeof(reason),
	    "removed by retention (keep-last "
	    "%llu)",
	    (unsigned long long)policy->keep_last);
	still = ss.n;
	/* The newest keep_last stay whatever their age; older ones stay
	 * when pinned or young. */
	for (size_t i = 0;
	     ss.n > policy->keep_last && i < ss.n - policy->keep_last; i++) {
		struct held *h = &ss.v[i];

		if (h->keep || h->at_ms > young)
			continue;
		if (moat_record_set_step_snapshot(rec, tenant, session_id,
		        h->index, "", reason, request_id, deadline,
		        &msg) != MOAT_OK) {
			moat_warn(request_id,
			    "retention: step %llu of session "
			    "%s keeps snapshot %s: %s",
			    (unsigned long long)h->index, session_id,
			    h->snapshot_id, msg ? msg : "");
			free(msg);
			msg = NULL;
			continue;
		}
		if (h->index == 0)
			moat_record_step0_forget(rec, session_id);
		gone[n_gone++] = h->snapshot_id;
		still--;
	}
	if (n_gone > 0)
		drop_unreferenced(rec, tenant, gone, n_gone, request_id,
		    deadline);
	free(gone);
	snaps_free(&ss);
	return still > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)still;
}
