/*
 * test_snaprefs.c: moat-sessiond's snapshot reference counts and step
 * pins (issue 11), on the real process: steps' snapshot ids and the
 * "moat.step0_snapshot" label are counted per tenant; two sessions
 * sharing a snapshot (a branch whose step 0 is its parent's step 2) keep
 * it referenced until both are gone, and DeleteSession lists what it left
 * unreferenced; SetStepSnapshot (step 0 too) moves counts and keeps why a
 * snapshot went; SetStepKeep round trips and refuses unknown steps;
 * SnapshotRefs caps its batch; tenants never see each other's counts; a
 * store written before the counts existed (format 1, no snapshot_refs)
 * gets them built when sessiond opens it; concurrent appends (group
 * commit) count every reference once.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <lmdb.h>

#include "harness.h"
#include "moat/util.h"

#define TA "tenant-a"
#define TB "tenant-b"
#define STEP0 "moat.step0_snapshot"
#define STEP0_REMOVED "moat.step0_removed"
#define REASON "removed by retention (keep-last 3)"

/* create: a session of `tenant` with the step-0 label `step0` (NULL: no
 * label), forked from `parent` at `parent_step` when parent is given. */
static char *
create(struct ses_proc *p, const char *tenant, const char *step0,
    const char *parent, uint64_t parent_step)
{
	Moat__V1__CreateSessionRequest req =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	Moat__V1__CreateSessionRequest__LabelsEntry label =
	    MOAT__V1__CREATE_SESSION_REQUEST__LABELS_ENTRY__INIT;
	Moat__V1__CreateSessionRequest__LabelsEntry *labels[] = { &label };
	ProtobufCMessage *reply;
	char *errmsg = NULL, *id;
	int rv;

	req.tenant = (char *)tenant;
	req.sandbox_id = (char *)"sbx-refs";
	if (step0 != NULL) {
		label.key = (char *)STEP0;
		label.value = (char *)step0;
		req.n_labels = 1;
		req.labels = labels;
	}
	if (parent != NULL) {
		req.parent_session_id = (char *)parent;
		req.parent_step = parent_step;
	}
	rv = ses_call(p, "CreateSession", &req.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("CreateSession: %s: %s", moat_strerror(rv), errmsg);
	id = strdup(((Moat__V1__SessionInfo *)reply)->id);
	protobuf_c_message_free_unpacked(reply, NULL);
	return id;
}

/* append_snap: appends a step with `snapshot_id` (NULL: none) at `index`
 * (0: the next); returns the status, *got the index on MOAT_OK. */
static int
append_snap(struct ses_proc *p, const char *tenant, const char *id,
    const char *snapshot_id, uint64_t index, uint64_t *got, char **errmsg)
{
	Moat__V1__AppendStepRequest req = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	ProtobufCMessage *reply;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	req.step = &step;
	step.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	step.input = (char *)"true";
	step.index = index;
	if (snapshot_id != NULL)
		step.snapshot_id = (char *)snapshot_id;
	rv = ses_call(p, "AppendStep", &req.base,
	    &moat__v1__append_step_reply__descriptor, &reply, errmsg);
	if (rv == MOAT_OK) {
		*got = ((Moat__V1__AppendStepReply *)reply)->index;
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	return rv;
}

static void
append_ok(struct ses_proc *p, const char *tenant, const char *id,
    const char *snapshot_id, uint64_t want)
{
	char *errmsg = NULL;
	uint64_t got = 0;
	int rv = append_snap(p, tenant, id, snapshot_id, 0, &got, &errmsg);

	if (rv != MOAT_OK)
		fail_msg("AppendStep: %s: %s", moat_strerror(rv), errmsg);
	assert_int_equal(got, want);
}

/* refs_call: SnapshotRefs for `n` ids; *reply on MOAT_OK. */
static int
refs_call(struct ses_proc *p, const char *tenant, const char *const *ids,
    size_t n, Moat__V1__SnapshotRefsReply **reply, char **errmsg)
{
	Moat__V1__SnapshotRefsRequest req =
	    MOAT__V1__SNAPSHOT_REFS_REQUEST__INIT;

	req.tenant = (char *)tenant;
	req.snapshot_ids = (char **)ids;
	req.n_snapshot_ids = n;
	return ses_call(p, "SnapshotRefs", &req.base,
	    &moat__v1__snapshot_refs_reply__descriptor,
	    (ProtobufCMessage **)reply, errmsg);
}

/* refs_of: the count of one id. */
static uint32_t
refs_of(struct ses_proc *p, const char *tenant, const char *snapshot_id)
{
	Moat__V1__SnapshotRefsReply *r;
	char *errmsg = NULL;
	uint32_t count;
	int rv = refs_call(p, tenant, &snapshot_id, 1, &r, &errmsg);

	if (rv != MOAT_OK)
		fail_msg("SnapshotRefs: %s: %s", moat_strerror(rv), errmsg);
	assert_int_equal(r->n_refs, 1);
	count = r->refs[0];
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return count;
}

/* delete_ok: deletes a session; returns its reply (caller frees). */
static Moat__V1__DeleteSessionReply *
delete_ok(struct ses_proc *p, const char *tenant, const char *id)
{
	Moat__V1__DeleteSessionRequest req =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	rv = ses_call(p, "DeleteSession", &req.base,
	    &moat__v1__delete_session_reply__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("DeleteSession: %s: %s", moat_strerror(rv), errmsg);
	return (Moat__V1__DeleteSessionReply *)reply;
}

/* assert_listed: the reply's unreferenced snapshots are exactly `want`
 * (n of them, in any order, each once). */
static void
assert_listed(const Moat__V1__DeleteSessionReply *r, const char *const *want,
    size_t n)
{
	if (r->n_unreferenced_snapshots != n)
		fail_msg("%zu unreferenced snapshots listed (first \"%s\"), "
		         "%zu expected",
		    r->n_unreferenced_snapshots,
		    r->n_unreferenced_snapshots ?
		        r->unreferenced_snapshots[0] :
		        "",
		    n);
	for (size_t i = 0; i < n; i++) {
		size_t seen = 0;

		for (size_t j = 0; j < r->n_unreferenced_snapshots; j++)
			seen +=
			    strcmp(r->unreferenced_snapshots[j], want[i]) == 0;
		if (seen != 1)
			fail_msg("snapshot %s listed %zu times, once "
			         "expected",
			    want[i], seen);
	}
}

/* set_snap: SetStepSnapshot; *reply (caller frees) on MOAT_OK. */
static int
set_snap(struct ses_proc *p, const char *tenant, const char *id,
    uint64_t index, const char *snapshot_id, const char *reason,
    Moat__V1__Step **reply, char **errmsg)
{
	Moat__V1__SetStepSnapshotRequest req =
	    MOAT__V1__SET_STEP_SNAPSHOT_REQUEST__INIT;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	req.index = index;
	req.snapshot_id = (char *)(snapshot_id ? snapshot_id : "");
	req.removed_reason = (char *)(reason ? reason : "");
	return ses_call(p, "SetStepSnapshot", &req.base,
	    &moat__v1__step__descriptor, (ProtobufCMessage **)reply, errmsg);
}

static void
set_snap_ok(struct ses_proc *p, const char *tenant, const char *id,
    uint64_t index, const char *snapshot_id, const char *reason)
{
	Moat__V1__Step *step;
	char *errmsg = NULL;
	int rv = set_snap(p, tenant, id, index, snapshot_id, reason, &step,
	    &errmsg);

	if (rv != MOAT_OK)
		fail_msg("SetStepSnapshot %llu: %s: %s",
		    (unsigned long long)index, moat_strerror(rv), errmsg);
	assert_int_equal(step->index, index);
	assert_string_equal(step->session_id, id);
	assert_string_equal(step->snapshot_id, snapshot_id ? snapshot_id : "");
	assert_string_equal(step->snapshot_removed, reason ? reason : "");
	protobuf_c_message_free_unpacked(&step->base, NULL);
}

static int
set_keep(struct ses_proc *p, const char *tenant, const char *id,
    uint64_t index, bool keep, Moat__V1__Step **reply, char **errmsg)
{
	Moat__V1__SetStepKeepRequest req =
	    MOAT__V1__SET_STEP_KEEP_REQUEST__INIT;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	req.index = index;
	req.keep = keep;
	return ses_call(p, "SetStepKeep", &req.base,
	    &moat__v1__step__descriptor, (ProtobufCMessage **)reply, errmsg);
}

static Moat__V1__Step *
get_step(struct ses_proc *p, const char *tenant, const char *id,
    uint64_t index)
{
	Moat__V1__GetStepRequest req = MOAT__V1__GET_STEP_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	req.index = index;
	rv = ses_call(p, "GetStep", &req.base, &moat__v1__step__descriptor,
	    &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("GetStep %llu: %s: %s", (unsigned long long)index,
		    moat_strerror(rv), errmsg);
	return (Moat__V1__Step *)reply;
}

static Moat__V1__SessionInfo *
get_session(struct ses_proc *p, const char *tenant, const char *id)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	rv = ses_call(p, "GetSession", &req.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("GetSession: %s: %s", moat_strerror(rv), errmsg);
	return (Moat__V1__SessionInfo *)reply;
}

/* label: a session's label value, or NULL. */
static const char *
label(const Moat__V1__SessionInfo *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i]->key, key) == 0)
			return s->labels[i]->value;
	return NULL;
}

static Moat__V1__ExportSessionReply *export(struct ses_proc *p,
    const char *tenant, const char *id)
{
	Moat__V1__ExportSessionRequest req =
	    MOAT__V1__EXPORT_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	rv = ses_call(p, "ExportSession", &req.base,
	    &moat__v1__export_session_reply__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("ExportSession: %s: %s", moat_strerror(rv), errmsg);
	return (Moat__V1__ExportSessionReply *)reply;
}

static Moat__V1__ListStepsReply *
list_steps(struct ses_proc *p, const char *tenant, const char *id)
{
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	rv = ses_call(p, "ListSteps", &req.base,
	    &moat__v1__list_steps_reply__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("ListSteps: %s: %s", moat_strerror(rv), errmsg);
	return (Moat__V1__ListStepsReply *)reply;
}

/* Steps and the step-0 label are counted, in request order; a refused
 * append counts nothing; the counts survive a restart. */
static void
test_refs_counted(void **state)
{
	struct ses_proc *p = *state;
	static const char *const ids[] = { "snap-0", "snap-1", "snap-2",
		"snap-x", "", "snap-1" };
	static const uint32_t want[] = { 1, 1, 2, 0, 0, 1 };
	Moat__V1__SnapshotRefsReply *r;
	char *id = create(p, TA, "snap-0", NULL, 0), *errmsg = NULL;
	uint64_t got;
	int rv;

	append_ok(p, TA, id, "snap-1", 1);
	append_ok(p, TA, id, "snap-2", 2);
	append_ok(p, TA, id, NULL, 3);
	append_ok(p, TA, id, "snap-2", 4);
	/* Refused (wrong index): its snapshot is not counted. */
	rv = append_snap(p, TA, id, "snap-x", 9, &got, &errmsg);
	ses_expect(rv, errmsg, MOAT_FAILED_PRECONDITION, "next is 5");

	for (int round = 0; round < 2; round++) {
		assert_int_equal(refs_call(p, TA, ids, 6, &r, &errmsg),
		    MOAT_OK);
		assert_int_equal(r->n_refs, 6);
		for (size_t i = 0; i < 6; i++)
			if (r->refs[i] != want[i])
				fail_msg("round %d: %s has %u references, "
				         "%u expected",
				    round, ids[i], r->refs[i], want[i]);
		protobuf_c_message_free_unpacked(&r->base, NULL);
		/* Durable: the same after a restart. */
		ses_kill(p, SIGTERM);
		ses_start(p, NULL);
	}
	free(id);
}

/* A branch whose step 0 is its parent's step 2 shares that snapshot:
 * deleting either lists only what nothing else references. */
static void
test_shared_snapshot_delete(void **state)
{
	struct ses_proc *p = *state;
	static const char *const parent_gone[] = { "p0", "p1" };
	static const char *const branch_gone[] = { "b1", "p2" };
	Moat__V1__DeleteSessionReply *d;
	char *parent = create(p, TA, "p0", NULL, 0), *branch, *other;

	append_ok(p, TA, parent, "p1", 1);
	append_ok(p, TA, parent, "p2", 2);
	append_ok(p, TA, parent, "p1", 3); /* a step that changed nothing */
	branch = create(p, TA, "p2", parent, 2);
	append_ok(p, TA, branch, "b1", 3); /* its path goes on (issue 18) */
	/* A session without snapshots lists nothing. */
	other = create(p, TA, NULL, NULL, 0);
	append_ok(p, TA, other, NULL, 1);
	assert_int_equal(refs_of(p, TA, "p2"), 2);
	assert_int_equal(refs_of(p, TA, "p1"), 2);

	d = delete_ok(p, TA, other);
	assert_int_equal(d->steps_deleted, 1);
	assert_listed(d, NULL, 0);
	protobuf_c_message_free_unpacked(&d->base, NULL);

	d = delete_ok(p, TA, parent);
	assert_int_equal(d->steps_deleted, 3);
	assert_listed(d, parent_gone, 2);
	protobuf_c_message_free_unpacked(&d->base, NULL);
	assert_int_equal(refs_of(p, TA, "p0"), 0);
	assert_int_equal(refs_of(p, TA, "p1"), 0);
	assert_int_equal(refs_of(p, TA, "p2"), 1);

	d = delete_ok(p, TA, branch);
	assert_int_equal(d->steps_deleted, 1);
	assert_listed(d, branch_gone, 2);
	protobuf_c_message_free_unpacked(&d->base, NULL);
	assert_int_equal(refs_of(p, TA, "p2"), 0);
	assert_int_equal(refs_of(p, TA, "b1"), 0);

	/* The other order: the branch first lists its own only. */
	free(parent);
	free(branch);
	parent = create(p, TA, NULL, NULL, 0);
	append_ok(p, TA, parent, "q1", 1);
	branch = create(p, TA, "q1", parent, 1);
	d = delete_ok(p, TA, branch);
	assert_listed(d, NULL, 0);
	protobuf_c_message_free_unpacked(&d->base, NULL);
	assert_int_equal(refs_of(p, TA, "q1"), 1);
	free(parent);
	free(branch);
	free(other);
}

/* SetStepSnapshot moves references and keeps why a snapshot went, for
 * steps and for step 0. */
static void
test_set_snapshot(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__ExportSessionReply *ex;
	Moat__V1__ListStepsReply *lt;
	Moat__V1__SessionInfo *s;
	Moat__V1__Step *step;
	char *id = create(p, TA, "s0", NULL, 0), *errmsg = NULL;
	int rv;

	append_ok(p, TA, id, "a", 1);
	append_ok(p, TA, id, "x", 2);

	/* Replaced. */
	set_snap_ok(p, TA, id, 1, "b", NULL);
	assert_int_equal(refs_of(p, TA, "a"), 0);
	assert_int_equal(refs_of(p, TA, "b"), 1);
	/* The same again: no change. */
	set_snap_ok(p, TA, id, 1, "b", NULL);
	assert_int_equal(refs_of(p, TA, "b"), 1);
	/* Cleared, with the reason kept and visible everywhere. */
	set_snap_ok(p, TA, id, 1, NULL, REASON);
	assert_int_equal(refs_of(p, TA, "b"), 0);
	step = get_step(p, TA, id, 1);
	assert_string_equal(step->snapshot_id, "");
	assert_string_equal(step->snapshot_removed, REASON);
	protobuf_c_message_free_unpacked(&step->base, NULL);
	ses_kill(p, SIGTERM);
	ses_start(p, NULL);
	lt = list_steps(p, TA, id);
	assert_int_equal(lt->n_steps, 2);
	assert_string_equal(lt->steps[0]->snapshot_removed, REASON);
	assert_string_equal(lt->steps[1]->snapshot_removed, "");
	assert_string_equal(lt->steps[1]->snapshot_id, "x");
	protobuf_c_message_free_unpacked(&lt->base, NULL);
	ex = export(p, TA, id);
	assert_int_equal(ex->n_steps, 2);
	assert_string_equal(ex->steps[0]->snapshot_removed, REASON);
	protobuf_c_message_free_unpacked(&ex->base, NULL);
	/* Set again: the reason goes. */
	set_snap_ok(p, TA, id, 1, "c", NULL);
	step = get_step(p, TA, id, 1);
	assert_string_equal(step->snapshot_id, "c");
	assert_string_equal(step->snapshot_removed, "");
	protobuf_c_message_free_unpacked(&step->base, NULL);
	assert_int_equal(refs_of(p, TA, "c"), 1);
	/* A reason with a snapshot id contradicts itself. */
	rv = set_snap(p, TA, id, 1, "d", REASON, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "removed_reason");
	assert_int_equal(refs_of(p, TA, "d"), 0);
	assert_int_equal(refs_of(p, TA, "c"), 1);
	rv = set_snap(p, TA, id, 3, "d", NULL, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "1..2");
	assert_int_equal(refs_of(p, TA, "d"), 0);

	/* Step 0: the label, replaced, cleared with a reason, set again. */
	assert_int_equal(refs_of(p, TA, "s0"), 1);
	set_snap_ok(p, TA, id, 0, "s0b", NULL);
	assert_int_equal(refs_of(p, TA, "s0"), 0);
	assert_int_equal(refs_of(p, TA, "s0b"), 1);
	s = get_session(p, TA, id);
	assert_string_equal(label(s, STEP0), "s0b");
	assert_null(label(s, STEP0_REMOVED));
	assert_int_equal(s->step_count, 2);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	set_snap_ok(p, TA, id, 0, NULL, REASON);
	assert_int_equal(refs_of(p, TA, "s0b"), 0);
	s = get_session(p, TA, id);
	assert_null(label(s, STEP0));
	assert_string_equal(label(s, STEP0_REMOVED), REASON);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	set_snap_ok(p, TA, id, 0, "s0c", NULL);
	s = get_session(p, TA, id);
	assert_string_equal(label(s, STEP0), "s0c");
	assert_null(label(s, STEP0_REMOVED));
	protobuf_c_message_free_unpacked(&s->base, NULL);
	assert_int_equal(refs_of(p, TA, "s0c"), 1);
	/* A step-0 snapshot equal to a step's counts twice. */
	set_snap_ok(p, TA, id, 0, "x", NULL);
	assert_int_equal(refs_of(p, TA, "x"), 2);
	assert_int_equal(refs_of(p, TA, "s0c"), 0);
	free(id);
}

/* SetStepKeep round trips (and survives a restart); unknown sessions and
 * steps are NOT_FOUND saying how to list them. */
static void
test_set_step_keep(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__ExportSessionReply *ex;
	Moat__V1__ListStepsReply *lt;
	Moat__V1__Step *step;
	char *id = create(p, TA, NULL, NULL, 0), *errmsg = NULL;
	int rv;

	append_ok(p, TA, id, "k1", 1);
	append_ok(p, TA, id, "k2", 2);
	assert_int_equal(set_keep(p, TA, id, 2, true, &step, &errmsg),
	    MOAT_OK);
	assert_true(step->keep);
	assert_int_equal(step->index, 2);
	assert_string_equal(step->snapshot_id, "k2");
	assert_string_equal(step->input, "true");
	assert_true(step->outputs_omitted);
	protobuf_c_message_free_unpacked(&step->base, NULL);

	ses_kill(p, SIGTERM);
	ses_start(p, NULL);
	step = get_step(p, TA, id, 2);
	assert_true(step->keep);
	protobuf_c_message_free_unpacked(&step->base, NULL);
	step = get_step(p, TA, id, 1);
	assert_false(step->keep);
	protobuf_c_message_free_unpacked(&step->base, NULL);
	lt = list_steps(p, TA, id);
	assert_false(lt->steps[0]->keep);
	assert_true(lt->steps[1]->keep);
	protobuf_c_message_free_unpacked(&lt->base, NULL);
	ex = export(p, TA, id);
	assert_true(ex->steps[1]->keep);
	protobuf_c_message_free_unpacked(&ex->base, NULL);
	/* Pinning changes no reference. */
	assert_int_equal(refs_of(p, TA, "k2"), 1);

	assert_int_equal(set_keep(p, TA, id, 2, false, &step, &errmsg),
	    MOAT_OK);
	assert_false(step->keep);
	protobuf_c_message_free_unpacked(&step->base, NULL);
	step = get_step(p, TA, id, 2);
	assert_false(step->keep);
	protobuf_c_message_free_unpacked(&step->base, NULL);

	rv = set_keep(p, TA, id, 3, true, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSteps");
	rv = set_keep(p, TA, id, 3, true, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "1..2");
	rv = set_keep(p, TA, "ses-0123456789abcdef", 1, true, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	rv = set_keep(p, TB, id, 1, true, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	rv = set_keep(p, TA, id, 0, true, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "index");
	rv = set_keep(p, TA, "nope", 1, true, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "session_id");
	step = get_step(p, TA, id, 1);
	assert_false(step->keep);
	protobuf_c_message_free_unpacked(&step->base, NULL);
	free(id);
}

/* SnapshotRefs answers up to 4096 ids, refuses more, and needs a
 * tenant; contradictory or duplicate input elsewhere is refused too. */
static void
test_limits(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__CreateSessionRequest__LabelsEntry l[2] = {
		MOAT__V1__CREATE_SESSION_REQUEST__LABELS_ENTRY__INIT,
		MOAT__V1__CREATE_SESSION_REQUEST__LABELS_ENTRY__INIT
	};
	Moat__V1__CreateSessionRequest__LabelsEntry *labels[] = { &l[0],
		&l[1] };
	Moat__V1__CreateSessionRequest creq =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	Moat__V1__AppendStepRequest areq = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step in = MOAT__V1__STEP__INIT;
	Moat__V1__SnapshotRefsReply *r;
	ProtobufCMessage *reply;
	const char **ids = calloc(4097, sizeof(*ids));
	char *id = create(p, TA, NULL, NULL, 0), *errmsg = NULL;
	char names[4097][16];
	int rv;

	for (int i = 0; i < 4097; i++) {
		snprintf(names[i], sizeof(names[i]), "snap-%d", i);
		ids[i] = names[i];
	}
	append_ok(p, TA, id, "snap-4095", 1);
	rv = refs_call(p, TA, ids, 4097, &r, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "4096");
	assert_int_equal(refs_call(p, TA, ids, 4096, &r, &errmsg), MOAT_OK);
	assert_int_equal(r->n_refs, 4096);
	for (int i = 0; i < 4096; i++)
		assert_int_equal(r->refs[i], i == 4095);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	assert_int_equal(refs_call(p, TA, ids, 0, &r, &errmsg), MOAT_OK);
	assert_int_equal(r->n_refs, 0);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	rv = refs_call(p, "", ids, 1, &r, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "tenant");

	/* Two step-0 labels would leave the reference in doubt. */
	creq.tenant = (char *)TA;
	creq.sandbox_id = (char *)"sbx-refs";
	creq.n_labels = 2;
	creq.labels = labels;
	l[0].key = l[1].key = (char *)STEP0;
	l[0].value = (char *)"dup-a";
	l[1].value = (char *)"dup-b";
	rv = ses_call(p, "CreateSession", &creq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "twice");
	assert_int_equal(refs_of(p, TA, "dup-a"), 0);

	/* A step appended with a snapshot and a reason it is gone. */
	areq.tenant = (char *)TA;
	areq.session_id = id;
	areq.step = &in;
	in.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	in.input = (char *)"true";
	in.snapshot_id = (char *)"snap-both";
	in.snapshot_removed = (char *)REASON;
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "snapshot_removed");
	assert_int_equal(refs_of(p, TA, "snap-both"), 0);
	/* Appended pinned, without a snapshot, with the reason. */
	in.snapshot_id = (char *)"";
	in.keep = true;
	assert_int_equal(ses_call(p, "AppendStep", &areq.base,
	                     &moat__v1__append_step_reply__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	{
		Moat__V1__Step *step = get_step(p, TA, id, 2);

		assert_true(step->keep);
		assert_string_equal(step->snapshot_removed, REASON);
		protobuf_c_message_free_unpacked(&step->base, NULL);
	}
	free(ids);
	free(id);
}

/* Counts are per tenant: another tenant neither sees nor changes them,
 * and a tenant's delete lists an id another tenant still uses. */
static void
test_refs_tenants(void **state)
{
	struct ses_proc *p = *state;
	static const char *const shared[] = { "shared" };
	Moat__V1__DeleteSessionReply *d;
	Moat__V1__DeleteSessionRequest dreq =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;
	Moat__V1__Step *step;
	ProtobufCMessage *reply;
	char *a = create(p, TA, "a0", NULL, 0), *b, *errmsg = NULL;
	int rv;

	append_ok(p, TA, a, "shared", 1);
	assert_int_equal(refs_of(p, TA, "shared"), 1);
	assert_int_equal(refs_of(p, TB, "shared"), 0);
	assert_int_equal(refs_of(p, TB, "a0"), 0);
	/* A tenant whose name is a prefix of another's. */
	assert_int_equal(refs_of(p, "tenant-", "shared"), 0);

	/* Tenant b cannot move tenant a's references. */
	rv = set_snap(p, TB, a, 1, "evil", NULL, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	rv = set_snap(p, TB, a, 0, "evil", NULL, &step, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	dreq.tenant = (char *)TB;
	dreq.session_id = a;
	rv = ses_call(p, "DeleteSession", &dreq.base,
	    &moat__v1__delete_session_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	assert_int_equal(refs_of(p, TA, "shared"), 1);
	assert_int_equal(refs_of(p, TA, "a0"), 1);
	assert_int_equal(refs_of(p, TB, "evil"), 0);
	assert_int_equal(refs_of(p, TA, "evil"), 0);

	/* The same id in tenant b is tenant b's own. */
	b = create(p, TB, NULL, NULL, 0);
	append_ok(p, TB, b, "shared", 1);
	assert_int_equal(refs_of(p, TA, "shared"), 1);
	assert_int_equal(refs_of(p, TB, "shared"), 1);
	d = delete_ok(p, TB, b);
	assert_listed(d, shared, 1);
	protobuf_c_message_free_unpacked(&d->base, NULL);
	assert_int_equal(refs_of(p, TA, "shared"), 1);
	assert_int_equal(refs_of(p, TB, "shared"), 0);
	free(a);
	free(b);
}

/* rewrite_old: with sessiond stopped, makes its store look like one of
 * format 1: the snapshot_refs sub-database dropped (`stale`: kept, with a
 * wrong count and an id nothing references instead). */
static void
rewrite_old(const char *dir, bool stale)
{
	char *path = moat_asprintf("%s/sessiond", dir);
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi refs, meta;
	MDB_val k, v;
	uint8_t count[8] = { 0, 0, 0, 0, 0, 0, 0, 9 };

	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 32), 0);
	assert_int_equal(mdb_env_set_mapsize(env, 1024ull << 20), 0);
	assert_int_equal(mdb_env_open(env, path, 0, 0600), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "snapshot_refs", 0, &refs), 0);
	if (stale) {
		k.mv_data = (void *)TA "\0"
		                       "old-1";
		k.mv_size = sizeof(TA) + 5;
		v.mv_data = count;
		v.mv_size = 8;
		assert_int_equal(mdb_put(txn, refs, &k, &v, 0), 0);
		k.mv_data = (void *)TA "\0"
		                       "ghost";
		assert_int_equal(mdb_put(txn, refs, &k, &v, 0), 0);
	} else {
		assert_int_equal(mdb_drop(txn, refs, 1), 0);
	}
	assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
	k.mv_data = (void *)"format";
	k.mv_size = 6;
	v.mv_data = (void *)"1";
	v.mv_size = 1;
	assert_int_equal(mdb_put(txn, meta, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	/* Dropped for real: a later open must not find it. */
	if (!stale) {
		assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn),
		    0);
		assert_int_equal(mdb_dbi_open(txn, "snapshot_refs", 0, &refs),
		    MDB_NOTFOUND);
		mdb_txn_abort(txn);
	}
	mdb_env_close(env);
	free(path);
}

/* format_of: the store's format stamp (sessiond stopped). */
static void
assert_format(const char *dir, const char *want)
{
	char *path = moat_asprintf("%s/sessiond", dir);
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi meta;
	MDB_val k = { 6, (void *)"format" }, v;

	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 32), 0);
	assert_int_equal(mdb_env_open(env, path, MDB_RDONLY, 0600), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
	assert_int_equal(mdb_get(txn, meta, &k, &v), 0);
	assert_int_equal(v.mv_size, strlen(want));
	assert_memory_equal(v.mv_data, want, v.mv_size);
	mdb_txn_abort(txn);
	mdb_env_close(env);
	free(path);
}

/* A store of the format before (no snapshot_refs) gets its counts built
 * at open, and stale counts are recounted. */
static void
test_refs_rebuilt(void **state)
{
	struct ses_proc *p = *state;
	static const char *const ids[] = { "old-0", "old-1", "old-2", "ghost",
		"other-1" };
	static const uint32_t want[] = { 2, 2, 1, 0, 0 };
	Moat__V1__SnapshotRefsReply *r;
	Moat__V1__DeleteSessionReply *d;
	char *s1 = create(p, TA, "old-0", NULL, 0), *s2, *s3, *errmsg = NULL;

	append_ok(p, TA, s1, "old-1", 1);
	append_ok(p, TA, s1, "old-2", 2);
	append_ok(p, TA, s1, NULL, 3);
	s2 = create(p, TA, "old-1", s1, 1);
	append_ok(p, TA, s2, "old-0", 2); /* step 2 of its path */
	s3 = create(p, TB, "old-0", NULL, 0);
	append_ok(p, TB, s3, "other-1", 1);

	for (int round = 0; round < 2; round++) {
		ses_kill(p, SIGTERM);
		assert_format(p->dir, "2");
		rewrite_old(p->dir, round == 1);
		ses_start(p, NULL);
		assert_format(p->dir, "2");
		assert_int_equal(refs_call(p, TA, ids, 5, &r, &errmsg),
		    MOAT_OK);
		for (size_t i = 0; i < 5; i++)
			if (r->refs[i] != want[i])
				fail_msg("round %d: %s has %u references "
				         "after the rebuild, %u expected",
				    round, ids[i], r->refs[i], want[i]);
		protobuf_c_message_free_unpacked(&r->base, NULL);
		assert_int_equal(refs_of(p, TB, "old-0"), 1);
		assert_int_equal(refs_of(p, TB, "other-1"), 1);
	}
	/* The rebuilt counts are the ones deletes go by. */
	d = delete_ok(p, TA, s1);
	{
		static const char *const gone[] = { "old-2" };

		assert_listed(d, gone, 1);
	}
	protobuf_c_message_free_unpacked(&d->base, NULL);
	d = delete_ok(p, TA, s2);
	{
		static const char *const gone[] = { "old-0", "old-1" };

		assert_listed(d, gone, 2);
	}
	protobuf_c_message_free_unpacked(&d->base, NULL);
	assert_int_equal(refs_of(p, TB, "old-0"), 1);
	free(s1);
	free(s2);
	free(s3);
}

#define THREADS 8
#define PER_THREAD 25

struct appender {
	struct ses_proc *p;
	char *session;
	char *error; /* heap: the first failure */
};

static void *
appender_main(void *arg)
{
	struct appender *a = arg;

	for (int i = 0; i < PER_THREAD; i++) {
		char *errmsg = NULL;
		uint64_t got;
		int rv = append_snap(a->p, TA, a->session,
		    i % 2 ? "grp-odd" : "grp-even", 0, &got, &errmsg);

		if (rv != MOAT_OK && a->error == NULL)
			a->error = moat_asprintf("%s: %s", moat_strerror(rv),
			    errmsg ? errmsg : "");
		free(errmsg);
	}
	return NULL;
}

/* Appends committed together (group commit) count each reference once. */
static void
test_refs_concurrent(void **state)
{
	struct ses_proc *p = *state;
	struct appender apps[THREADS];
	pthread_t threads[THREADS];
	Moat__V1__DeleteSessionReply *d;

	for (int t = 0; t < THREADS; t++) {
		apps[t] = (struct appender){ .p = p,
			.session = create(p, TA, NULL, NULL, 0) };
		assert_int_equal(pthread_create(&threads[t], NULL,
		                     appender_main, &apps[t]),
		    0);
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(threads[t], NULL);
	for (int t = 0; t < THREADS; t++)
		if (apps[t].error != NULL)
			fail_msg("appender %d: %s", t, apps[t].error);
	assert_int_equal(refs_of(p, TA, "grp-even"),
	    THREADS * ((PER_THREAD + 1) / 2));
	assert_int_equal(refs_of(p, TA, "grp-odd"),
	    THREADS * (PER_THREAD / 2));
	for (int t = 0; t < THREADS; t++) {
		static const char *const both[] = { "grp-even", "grp-odd" };

		d = delete_ok(p, TA, apps[t].session);
		assert_listed(d, both, t == THREADS - 1 ? 2 : 0);
		protobuf_c_message_free_unpacked(&d->base, NULL);
		free(apps[t].session);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(test_refs_counted),
		SES_CASE(test_shared_snapshot_delete),
		SES_CASE(test_set_snapshot),
		SES_CASE(test_set_step_keep),
		SES_CASE(test_limits),
		SES_CASE(test_refs_tenants),
		SES_CASE(test_refs_rebuilt),
		SES_CASE(test_refs_concurrent),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
