/*
 * test_sessiond.c: moat-sessiond as a real process: sessions created,
 * read, listed by tenant and sandbox, paged, deleted with their steps;
 * steps appended, read and paged, with or without outputs; outputs of
 * 5 MiB round trip byte for byte; what is acknowledged survives a
 * restart; tenants never see each other's sessions; bad input is
 * INVALID_ARGUMENT naming the field, unknown ids NOT_FOUND saying how to
 * list, a full map RESOURCE_EXHAUSTED naming the setting; forks, snapshot
 * ids, fs traces and the JSON export.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "guest.pb-c.h"
#include "harness.h"

#define TA "tenant-a"
#define TB "tenant-b"

static Moat__V1__SessionInfo *
get_session(struct ses_proc *p, const char *tenant, const char *id, int *rv,
    char **errmsg)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	*rv = ses_call(p, "GetSession", &req.base,
	    &moat__v1__session_info__descriptor, &reply, errmsg);
	return (Moat__V1__SessionInfo *)reply;
}

static Moat__V1__Step *
get_step(struct ses_proc *p, const char *tenant, const char *id,
    uint64_t index, bool omit, int *rv, char **errmsg)
{
	Moat__V1__GetStepRequest req = MOAT__V1__GET_STEP_REQUEST__INIT;
	ProtobufCMessage *reply;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	req.index = index;
	req.omit_outputs = omit;
	*rv = ses_call(p, "GetStep", &req.base, &moat__v1__step__descriptor,
	    &reply, errmsg);
	return (Moat__V1__Step *)reply;
}

static Moat__V1__ListSessionsReply *
list_sessions(struct ses_proc *p, const char *tenant, const char *sandbox,
    uint32_t page_size, const char *token)
{
	Moat__V1__ListSessionsRequest req =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.sandbox_id = (char *)(sandbox ? sandbox : "");
	req.page_size = page_size;
	req.page_token = (char *)(token ? token : "");
	rv = ses_call(p, "ListSessions", &req.base,
	    &moat__v1__list_sessions_reply__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("ListSessions: %s", errmsg);
	return (Moat__V1__ListSessionsReply *)reply;
}

static Moat__V1__ListStepsReply *
list_steps(struct ses_proc *p, const char *tenant, const char *id,
    uint32_t page_size, const char *token, bool outputs)
{
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	req.page_size = page_size;
	req.page_token = (char *)(token ? token : "");
	req.include_outputs = outputs;
	rv = ses_call(p, "ListSteps", &req.base,
	    &moat__v1__list_steps_reply__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("ListSteps: %s", errmsg);
	return (Moat__V1__ListStepsReply *)reply;
}

static int
delete_session(struct ses_proc *p, const char *tenant, const char *id,
    uint64_t *deleted, char **errmsg)
{
	Moat__V1__DeleteSessionRequest req =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	rv = ses_call(p, "DeleteSession", &req.base,
	    &moat__v1__delete_session_reply__descriptor, &reply, errmsg);
	if (rv == MOAT_OK) {
		*deleted =
		    ((Moat__V1__DeleteSessionReply *)reply)->steps_deleted;
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	return rv;
}

static void
append_ok(struct ses_proc *p, const char *tenant, const char *id,
    const char *input, const char *out, uint64_t want)
{
	uint64_t index = 0;
	char *errmsg = NULL;
	int rv = ses_append(p, tenant, id, input, out, strlen(out), &index,
	    &errmsg);

	if (rv != MOAT_OK)
		fail_msg("AppendStep: %s: %s", moat_strerror(rv), errmsg);
	assert_int_equal(index, want);
}

static void
test_sessions_and_steps(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__CreateSessionRequest creq =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	Moat__V1__SessionInfo__LabelsEntry label =
	    MOAT__V1__SESSION_INFO__LABELS_ENTRY__INIT;
	Moat__V1__SessionInfo__LabelsEntry *labels[] = { &label };
	Moat__V1__ListSessionsReply *ls;
	Moat__V1__ListStepsReply *lt;
	Moat__V1__SessionInfo *s;
	Moat__V1__Step *step;
	ProtobufCMessage *reply;
	char *ids[3], *errmsg = NULL, *token;
	uint64_t deleted;
	int rv;

	label.key = (char *)"purpose";
	label.value = (char *)"test";
	creq.tenant = (char *)TA;
	creq.sandbox_id = (char *)"sbx-1";
	creq.n_labels = 1;
	creq.labels = (Moat__V1__CreateSessionRequest__LabelsEntry **)labels;
	creq.snapshot_policy =
	    MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY;
	assert_int_equal(ses_call(p, "CreateSession", &creq.base,
	                     &moat__v1__session_info__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	s = (Moat__V1__SessionInfo *)reply;
	ids[0] = strdup(s->id);
	assert_int_equal(strlen(s->id), 20);
	assert_memory_equal(s->id, "ses-", 4);
	assert_true(s->created_ms > 1600000000000ull);
	protobuf_c_message_free_unpacked(reply, NULL);
	/* Lists are oldest first with ties (one millisecond) in id order:
	 * keep the three apart so the expected order is theirs. */
	usleep(3000);
	ids[1] = ses_create(p, TA, "sbx-1");
	usleep(3000);
	ids[2] = ses_create(p, TA, "sbx-2");

	append_ok(p, TA, ids[0], "echo one", "one\n", 1);
	append_ok(p, TA, ids[0], "echo two", "two\n", 2);
	append_ok(p, TA, ids[0], "echo three", "three\n", 3);

	/* Everything acknowledged is there after a restart. */
	ses_kill(p, SIGTERM);
	ses_start(p, NULL);

	s = get_session(p, TA, ids[0], &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_string_equal(s->tenant, TA);
	assert_string_equal(s->sandbox_id, "sbx-1");
	assert_int_equal(s->step_count, 3);
	assert_int_equal(s->snapshot_policy,
	    MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY);
	assert_int_equal(s->n_labels, 1);
	assert_string_equal(s->labels[0]->key, "purpose");
	assert_string_equal(s->labels[0]->value, "test");
	protobuf_c_message_free_unpacked(&s->base, NULL);

	step = get_step(p, TA, ids[0], 2, false, &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_int_equal(step->index, 2);
	assert_string_equal(step->session_id, ids[0]);
	assert_string_equal(step->input, "echo two");
	assert_int_equal(step->stdout.len, 4);
	assert_memory_equal(step->stdout.data, "two\n", 4);
	assert_int_equal(step->stdout_bytes, 4);
	assert_int_equal(step->kind, MOAT__V1__STEP_KIND__STEP_KIND_EXEC);
	assert_false(step->outputs_omitted);
	protobuf_c_message_free_unpacked(&step->base, NULL);

	/* Sessions of the tenant, oldest first, in pages of two. */
	ls = list_sessions(p, TA, NULL, 2, NULL);
	assert_int_equal(ls->n_sessions, 2);
	assert_string_equal(ls->sessions[0]->id, ids[0]);
	assert_string_equal(ls->sessions[1]->id, ids[1]);
	assert_true(ls->next_page_token[0] != '\0');
	token = strdup(ls->next_page_token);
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	ls = list_sessions(p, TA, NULL, 2, token);
	assert_int_equal(ls->n_sessions, 1);
	assert_string_equal(ls->sessions[0]->id, ids[2]);
	assert_string_equal(ls->next_page_token, "");
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	free(token);
	/* By sandbox. */
	ls = list_sessions(p, TA, "sbx-1", 0, NULL);
	assert_int_equal(ls->n_sessions, 2);
	assert_string_equal(ls->sessions[0]->id, ids[0]);
	assert_string_equal(ls->sessions[1]->id, ids[1]);
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	ls = list_sessions(p, TA, "sbx-2", 0, NULL);
	assert_int_equal(ls->n_sessions, 1);
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	ls = list_sessions(p, TA, "sbx-", 0, NULL);
	assert_int_equal(ls->n_sessions, 0);
	protobuf_c_message_free_unpacked(&ls->base, NULL);

	/* Steps in pages of two, outputs on request only. */
	lt = list_steps(p, TA, ids[0], 2, NULL, true);
	assert_int_equal(lt->n_steps, 2);
	assert_int_equal(lt->steps[0]->index, 1);
	assert_int_equal(lt->steps[1]->index, 2);
	assert_memory_equal(lt->steps[0]->stdout.data, "one\n", 4);
	token = strdup(lt->next_page_token);
	protobuf_c_message_free_unpacked(&lt->base, NULL);
	lt = list_steps(p, TA, ids[0], 2, token, false);
	assert_int_equal(lt->n_steps, 1);
	assert_int_equal(lt->steps[0]->index, 3);
	assert_string_equal(lt->steps[0]->input, "echo three");
	assert_true(lt->steps[0]->outputs_omitted);
	assert_int_equal(lt->steps[0]->stdout.len, 0);
	assert_int_equal(lt->steps[0]->stdout_bytes, 6);
	assert_string_equal(lt->next_page_token, "");
	protobuf_c_message_free_unpacked(&lt->base, NULL);
	free(token);

	/* Delete takes the steps and outputs along. */
	assert_int_equal(delete_session(p, TA, ids[0], &deleted, &errmsg),
	    MOAT_OK);
	assert_int_equal(deleted, 3);
	s = get_session(p, TA, ids[0], &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	step = get_step(p, TA, ids[0], 1, false, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, ids[0]);
	rv = delete_session(p, TA, ids[0], &deleted, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);
	ls = list_sessions(p, TA, NULL, 0, NULL);
	assert_int_equal(ls->n_sessions, 2);
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	ls = list_sessions(p, TA, "sbx-1", 0, NULL);
	assert_int_equal(ls->n_sessions, 1);
	assert_string_equal(ls->sessions[0]->id, ids[1]);
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	/* Another session's steps are untouched. */
	append_ok(p, TA, ids[1], "true", "", 1);
	for (int i = 0; i < 3; i++)
		free(ids[i]);
}

/* fill: bytes no compression or chunking mistake would reproduce. */
static void
fill(uint8_t *buf, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++) {
		seed = seed * 1103515245u + 12345u;
		buf[i] = (uint8_t)(seed >> 16);
	}
}

static void
test_big_outputs(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__AppendStepRequest req = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step in = MOAT__V1__STEP__INIT;
	Moat__V1__ListStepsReply *lt;
	Moat__V1__Step *step;
	ProtobufCMessage *reply;
	size_t out_len = 5u << 20, err_len = (5u << 20) + 12345;
	uint8_t *out = malloc(out_len), *err = malloc(err_len);
	char *id = ses_create(p, TA, "sbx-big"), *errmsg = NULL;
	int rv;

	fill(out, out_len, 1);
	fill(err, err_len, 2);
	out[0] = 0; /* NULs are bytes like any other */
	req.tenant = (char *)TA;
	req.session_id = id;
	req.step = &in;
	in.kind = MOAT__V1__STEP_KIND__STEP_KIND_CODE;
	in.language = (char *)"python";
	in.input = (char *)"print('x' * 5000000)";
	in.stdout.data = out;
	in.stdout.len = out_len;
	in.stderr.data = err;
	in.stderr.len = err_len;
	rv = ses_call(p, "AppendStep", &req.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("AppendStep of 10 MiB: %s", errmsg);
	protobuf_c_message_free_unpacked(reply, NULL);

	step = get_step(p, TA, id, 1, false, &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_int_equal(step->stdout.len, out_len);
	assert_int_equal(step->stderr.len, err_len);
	assert_int_equal(step->stdout_bytes, out_len);
	assert_int_equal(step->stderr_bytes, err_len);
	assert_true(memcmp(step->stdout.data, out, out_len) == 0);
	assert_true(memcmp(step->stderr.data, err, err_len) == 0);
	assert_string_equal(step->language, "python");
	protobuf_c_message_free_unpacked(&step->base, NULL);

	step = get_step(p, TA, id, 1, true, &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_true(step->outputs_omitted);
	assert_int_equal(step->stdout.len, 0);
	assert_int_equal(step->stdout_bytes, out_len);
	protobuf_c_message_free_unpacked(&step->base, NULL);

	lt = list_steps(p, TA, id, 0, NULL, true);
	assert_int_equal(lt->n_steps, 1);
	assert_true(memcmp(lt->steps[0]->stderr.data, err, err_len) == 0);
	protobuf_c_message_free_unpacked(&lt->base, NULL);
	free(out);
	free(err);
	free(id);
}

static void
test_tenant_isolation(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__ExportSessionRequest ereq =
	    MOAT__V1__EXPORT_SESSION_REQUEST__INIT;
	Moat__V1__SetStepSnapshotRequest sreq =
	    MOAT__V1__SET_STEP_SNAPSHOT_REQUEST__INIT;
	Moat__V1__ListSessionsReply *ls;
	Moat__V1__SessionInfo *s;
	ProtobufCMessage *reply;
	char *id = ses_create(p, TA, "sbx-shared"), *errmsg = NULL;
	uint64_t index, deleted;
	int rv;

	append_ok(p, TA, id, "secret", "tenant a's data", 1);
	s = get_session(p, TB, id, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	get_step(p, TB, id, 1, false, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);
	rv = ses_append(p, TB, id, "intrude", "", 0, &index, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);
	rv = delete_session(p, TB, id, &deleted, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);
	ereq.tenant = (char *)TB;
	ereq.session_id = id;
	rv = ses_call(p, "ExportSession", &ereq.base,
	    &moat__v1__export_session_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);
	sreq.tenant = (char *)TB;
	sreq.session_id = id;
	sreq.index = 1;
	sreq.snapshot_id = (char *)"snap-evil";
	rv = ses_call(p, "SetStepSnapshot", &sreq.base,
	    &moat__v1__step__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);
	ls = list_sessions(p, TB, NULL, 0, NULL);
	assert_int_equal(ls->n_sessions, 0);
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	ls = list_sessions(p, TB, "sbx-shared", 0, NULL);
	assert_int_equal(ls->n_sessions, 0);
	protobuf_c_message_free_unpacked(&ls->base, NULL);
	/* A tenant whose name is a prefix of another's sees nothing. */
	ls = list_sessions(p, "tenant-", NULL, 0, NULL);
	assert_int_equal(ls->n_sessions, 0);
	protobuf_c_message_free_unpacked(&ls->base, NULL);

	/* Tenant a's session is as it was. */
	s = get_session(p, TA, id, &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_int_equal(s->step_count, 1);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	free(id);
}

/* The gateway also puts the tenant in Envelope.tenant: it must be the
 * request's, the request's own field is still required (never "" for
 * any tenant), and another tenant's session and steps stay NOT_FOUND. */
static void
test_envelope_tenant(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__GetSessionRequest g = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__GetStepRequest st = MOAT__V1__GET_STEP_REQUEST__INIT;
	Moat__V1__ListSessionsRequest ls =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	Moat__V1__SnapshotRefsRequest refs =
	    MOAT__V1__SNAPSHOT_REFS_REQUEST__INIT;
	char *id = ses_create(p, TA, "sbx-env"), *errmsg = NULL;
	char *snaps[] = { "snap-x" };
	ProtobufCMessage *reply = NULL;
	int rv;

	append_ok(p, TA, id, "true", "a", 1);
	g.session_id = id;
	st.session_id = id;
	st.index = 1;
	refs.snapshot_ids = snaps;
	refs.n_snapshot_ids = 1;

	/* Tenant A, named in both: OK. */
	g.tenant = TA;
	rv = ses_call_as(p, TA, "GetSession", &g.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	st.tenant = TA;
	rv = ses_call_as(p, TA, "GetStep", &st.base,
	    &moat__v1__step__descriptor, &reply, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);

	/* The envelope and the request disagree. */
	rv = ses_call_as(p, TB, "GetSession", &g.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, TB);

	/* Tenant B, in both: A's session and step do not exist. */
	g.tenant = TB;
	rv = ses_call_as(p, TB, "GetSession", &g.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);
	st.tenant = TB;
	rv = ses_call_as(p, TB, "GetStep", &st.base,
	    &moat__v1__step__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, NULL);

	/* No tenant in the request: refused, with or without the
	 * envelope's, for reads, listings and the refs count alike. */
	g.tenant = "";
	rv = ses_call_as(p, NULL, "GetSession", &g.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "tenant is required");
	rv = ses_call_as(p, TA, "GetSession", &g.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "tenant is required");
	st.tenant = "";
	rv = ses_call_as(p, NULL, "GetStep", &st.base,
	    &moat__v1__step__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "tenant is required");
	rv = ses_call_as(p, NULL, "ListSessions", &ls.base,
	    &moat__v1__list_sessions_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "tenant is required");
	rv = ses_call_as(p, NULL, "SnapshotRefs", &refs.base,
	    &moat__v1__snapshot_refs_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "tenant is required");
	free(id);
}

static void
test_bad_input(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__AppendStepRequest areq = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__CreateSessionRequest creq =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	Moat__V1__FsTraceEntry fe = MOAT__V1__FS_TRACE_ENTRY__INIT;
	Moat__V1__FsTraceEntry *fes[] = { &fe };
	ProtobufCMessage *reply;
	char *id = ses_create(p, TA, "sbx-bad"), *errmsg = NULL;
	uint64_t index;
	int rv;

	append_ok(p, TA, id, "true", "", 1);

	/* Tenant and ids. */
	get_session(p, "", id, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "tenant");
	get_session(p, TA, "ses-xyz", &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "session_id");
	get_session(p, TA, "", &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "session_id");
	get_session(p, TA, "ses-0123456789abcdef", &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");
	rv = ses_append(p, TA, "ses-0123456789abcdef", "x", "", 0, &index,
	    &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ListSessions");

	/* Steps. */
	get_step(p, TA, id, 0, false, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "index");
	get_step(p, TA, id, 7, false, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "1..1");
	areq.tenant = (char *)TA;
	areq.session_id = id;
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "step");
	areq.step = &step;
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "step.kind");
	step.kind = MOAT__V1__STEP_KIND__STEP_KIND_FILE_WRITE;
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "step.path");
	step.path = (char *)"/root/a.txt";
	step.started_ms = 10;
	step.ended_ms = 5;
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "step.ended_ms");
	step.ended_ms = 20;
	step.n_fs_trace = 1;
	step.fs_trace = fes;
	fe.path = (char *)"/root/a.txt";
	fe.sha256.len = 5;
	fe.sha256.data = (uint8_t *)"short";
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "fs_trace[0].sha256");
	fe.sha256.len = 0;
	step.index = 5;
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_FAILED_PRECONDITION, "next is 2");
	step.index = 2;
	rv = ses_call(p, "AppendStep", &areq.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_int_equal(((Moat__V1__AppendStepReply *)reply)->index, 2);
	protobuf_c_message_free_unpacked(reply, NULL);

	/* Paging. */
	lreq.tenant = (char *)TA;
	lreq.session_id = id;
	lreq.page_size = 5000;
	rv = ses_call(p, "ListSteps", &lreq.base,
	    &moat__v1__list_steps_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "page_size");
	lreq.page_size = 0;
	lreq.page_token = (char *)"not-a-token";
	rv = ses_call(p, "ListSteps", &lreq.base,
	    &moat__v1__list_steps_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "page_token");

	/* Creating. */
	creq.tenant = (char *)TA;
	rv = ses_call(p, "CreateSession", &creq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "sandbox_id");
	creq.sandbox_id = (char *)"sbx-bad";
	creq.parent_step = 1;
	rv = ses_call(p, "CreateSession", &creq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "parent_step");
	creq.parent_session_id = (char *)"ses-0123456789abcdef";
	rv = ses_call(p, "CreateSession", &creq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "ses-0123456789abcdef");
	creq.parent_session_id = id;
	creq.parent_step = 3;
	rv = ses_call(p, "CreateSession", &creq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "parent_step 3");
	creq.parent_step = 0;
	creq.snapshot_policy = 9;
	rv = ses_call(p, "CreateSession", &creq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "snapshot_policy");
	free(id);
}

static void
test_fork_snapshot_export(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__CreateSessionRequest creq =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	Moat__V1__SetStepSnapshotRequest sreq =
	    MOAT__V1__SET_STEP_SNAPSHOT_REQUEST__INIT;
	Moat__V1__ExportSessionRequest ereq =
	    MOAT__V1__EXPORT_SESSION_REQUEST__INIT;
	Moat__V1__AppendStepRequest areq = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step in = MOAT__V1__STEP__INIT;
	Moat__V1__FsTraceEntry fe[2] = { MOAT__V1__FS_TRACE_ENTRY__INIT,
		MOAT__V1__FS_TRACE_ENTRY__INIT };
	Moat__V1__FsTraceEntry *fes[] = { &fe[0], &fe[1] };
	Moat__V1__ExportSessionReply *ex;
	Moat__V1__SessionInfo *s;
	Moat__V1__Step *step;
	ProtobufCMessage *reply;
	uint8_t hash[32];
	char *id = ses_create(p, TA, "sbx-fork"), *errmsg = NULL;
	json_t *doc, *steps;
	int rv;

	memset(hash, 0xab, sizeof(hash));
	append_ok(p, TA, id, "echo a > a.txt", "", 1);
	areq.tenant = (char *)TA;
	areq.session_id = id;
	areq.step = &in;
	in.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	in.n_argv = 2;
	in.argv = (char *[]){ (char *)"rm", (char *)"a.txt" };
	in.exit_code = 3;
	in.safety = (char *)"strict";
	in.n_fs_trace = 2;
	in.fs_trace = fes;
	fe[0].path = (char *)"/root/a.txt";
	fe[0].change = MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED;
	fe[1].path = (char *)"/root/b.txt";
	fe[1].change = MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED;
	fe[1].size = 42;
	fe[1].sha256.data = hash;
	fe[1].sha256.len = 32;
	assert_int_equal(ses_call(p, "AppendStep", &areq.base,
	                     &moat__v1__append_step_reply__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);

	step = get_step(p, TA, id, 2, false, &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_int_equal(step->n_argv, 2);
	assert_string_equal(step->argv[1], "a.txt");
	assert_int_equal(step->exit_code, 3);
	assert_string_equal(step->safety, "strict");
	assert_int_equal(step->n_fs_trace, 2);
	assert_int_equal(step->fs_trace[0]->change,
	    MOAT__V1__FS_CHANGE__FS_CHANGE_DELETED);
	assert_int_equal(step->fs_trace[1]->size, 42);
	assert_int_equal(step->fs_trace[1]->sha256.len, 32);
	assert_memory_equal(step->fs_trace[1]->sha256.data, hash, 32);
	assert_string_equal(step->snapshot_id, "");
	protobuf_c_message_free_unpacked(&step->base, NULL);

	/* A snapshot id attached afterwards. */
	sreq.tenant = (char *)TA;
	sreq.session_id = id;
	sreq.index = 2;
	sreq.snapshot_id = (char *)"snap-0001";
	assert_int_equal(ses_call(p, "SetStepSnapshot", &sreq.base,
	                     &moat__v1__step__descriptor, &reply, &errmsg),
	    MOAT_OK);
	assert_string_equal(((Moat__V1__Step *)reply)->snapshot_id,
	    "snap-0001");
	assert_int_equal(((Moat__V1__Step *)reply)->n_fs_trace, 2);
	protobuf_c_message_free_unpacked(reply, NULL);
	sreq.index = 3;
	rv = ses_call(p, "SetStepSnapshot", &sreq.base,
	    &moat__v1__step__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "1..2");
	step = get_step(p, TA, id, 2, true, &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_string_equal(step->snapshot_id, "snap-0001");
	assert_int_equal(step->n_fs_trace, 2);
	protobuf_c_message_free_unpacked(&step->base, NULL);

	/* A fork names its parent and step. */
	creq.tenant = (char *)TA;
	creq.sandbox_id = (char *)"sbx-fork-2";
	creq.parent_session_id = id;
	creq.parent_step = 2;
	assert_int_equal(ses_call(p, "CreateSession", &creq.base,
	                     &moat__v1__session_info__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	s = (Moat__V1__SessionInfo *)reply;
	assert_string_equal(s->parent_session_id, id);
	assert_int_equal(s->parent_step, 2);
	/* Its path inherits steps 1..2 (issue 18). */
	assert_int_equal(s->step_count, 2);
	assert_int_equal(s->first_step, 3);
	protobuf_c_message_free_unpacked(reply, NULL);

	/* Export as messages, then as JSON. */
	ereq.tenant = (char *)TA;
	ereq.session_id = id;
	assert_int_equal(ses_call(p, "ExportSession", &ereq.base,
	                     &moat__v1__export_session_reply__descriptor,
	                     &reply, &errmsg),
	    MOAT_OK);
	ex = (Moat__V1__ExportSessionReply *)reply;
	assert_non_null(ex->session);
	assert_string_equal(ex->session->id, id);
	assert_int_equal(ex->n_steps, 2);
	assert_string_equal(ex->steps[1]->snapshot_id, "snap-0001");
	assert_string_equal(ex->json, "");
	protobuf_c_message_free_unpacked(reply, NULL);
	ereq.format = MOAT__V1__EXPORT_FORMAT__EXPORT_FORMAT_JSON;
	assert_int_equal(ses_call(p, "ExportSession", &ereq.base,
	                     &moat__v1__export_session_reply__descriptor,
	                     &reply, &errmsg),
	    MOAT_OK);
	ex = (Moat__V1__ExportSessionReply *)reply;
	assert_null(ex->session);
	assert_int_equal(ex->n_steps, 0);
	doc = json_loads(ex->json, 0, NULL);
	assert_non_null(doc);
	assert_string_equal(json_string_value(json_object_get(
	                        json_object_get(doc, "session"), "id")),
	    id);
	steps = json_object_get(doc, "steps");
	assert_int_equal(json_array_size(steps), 2);
	assert_string_equal(json_string_value(
	                        json_object_get(json_array_get(steps, 1),
	                            "snapshotId")),
	    "snap-0001");
	assert_string_equal(json_string_value(
	                        json_object_get(json_array_get(steps, 0),
	                            "input")),
	    "echo a > a.txt");
	assert_int_equal(json_array_size(
	                     json_object_get(json_array_get(steps, 1),
	                         "fsTrace")),
	    2);
	json_decref(doc);
	protobuf_c_message_free_unpacked(reply, NULL);
	free(id);
}

/* A map too small for a step: RESOURCE_EXHAUSTED naming the setting, and
 * the service goes on. */
static void
test_map_full(void **state)
{
	struct ses_proc p = { 0 };
	char *args[] = { (char *)"--map-size-mib", (char *)"1", NULL };
	size_t len = 2u << 20;
	uint8_t *out = calloc(1, len);
	char *id, *errmsg = NULL;
	uint64_t index;
	int rv;

	ses_start(&p, args);
	id = ses_create(&p, TA, "sbx-full");
	rv = ses_append(&p, TA, id, "big", out, len, &index, &errmsg);
	ses_expect(rv, errmsg, MOAT_RESOURCE_EXHAUSTED, "map-size-mib");
	rv = ses_append(&p, TA, id, "small", "ok", 2, &index, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("append after a full map: %s", errmsg);
	assert_int_equal(index, 1);
	ses_stop(&p);
	free(out);
	free(id);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(test_sessions_and_steps),
		SES_CASE(test_big_outputs),
		SES_CASE(test_tenant_isolation),
		SES_CASE(test_envelope_tenant),
		SES_CASE(test_bad_input),
		SES_CASE(test_fork_snapshot_export),
		cmocka_unit_test_teardown(test_map_full, ses_reap_all),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
