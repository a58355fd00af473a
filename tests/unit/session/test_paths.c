/*
 * test_paths.c: branches read as paths (issue 18), with moat-sessiond as
 * a real process. A branch made at step N of its parent holds steps from
 * N + 1 on; GetStep and ListSteps read steps 1..N from the session that
 * holds them (held_by_session), through any depth of branches up to the
 * bound; a step past the end is NOT_FOUND saying which steps there are;
 * a pin of an inherited step pins it where it is held; retention's
 * own_only leaves inherited steps out; GetSessionTree lists a session
 * and its branches depth first with where each branched, its path's
 * length and its last exit status. With the store edited through LMDB
 * (sessiond stopped): a branch recorded before first_step existed keeps
 * its numbers from 1, and a loop of parents is refused, not followed.
 */
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

static char *
create(struct ses_proc *p, const char *parent, uint64_t parent_step)
{
	Moat__V1__CreateSessionRequest req =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL, *id;
	int rv;

	req.tenant = (char *)TA;
	req.sandbox_id = (char *)"sbx-paths";
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

/* append: a step with exit code `code` and snapshot `snap` (NULL: none);
 * it must get index `want`. */
static void
append(struct ses_proc *p, const char *id, int code, const char *snap,
    uint64_t want)
{
	Moat__V1__AppendStepRequest req = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL, input[64];
	int rv;

	snprintf(input, sizeof(input), "echo %s %d", id, code);
	req.tenant = (char *)TA;
	req.session_id = (char *)id;
	req.step = &step;
	step.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	step.input = input;
	step.exit_code = code;
	step.stdout.data = (uint8_t *)input;
	step.stdout.len = strlen(input);
	if (snap != NULL)
		step.snapshot_id = (char *)snap;
	rv = ses_call(p, "AppendStep", &req.base,
	    &moat__v1__append_step_reply__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("AppendStep: %s: %s", moat_strerror(rv), errmsg);
	assert_int_equal(((Moat__V1__AppendStepReply *)reply)->index, want);
	protobuf_c_message_free_unpacked(reply, NULL);
}

static Moat__V1__Step *
get_step(struct ses_proc *p, const char *id, uint64_t index, int *rv,
    char **errmsg)
{
	Moat__V1__GetStepRequest req = MOAT__V1__GET_STEP_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;

	req.tenant = (char *)TA;
	req.session_id = (char *)id;
	req.index = index;
	*rv = ses_call(p, "GetStep", &req.base, &moat__v1__step__descriptor,
	    &reply, errmsg);
	return (Moat__V1__Step *)reply;
}

/* step_ok: step `index` of id's path, which session `holder` holds
 * ("" : id itself), with `snap` ("" : none). */
static void
step_ok(struct ses_proc *p, const char *id, uint64_t index, const char *holder,
    const char *snap)
{
	char *errmsg = NULL;
	int rv;
	Moat__V1__Step *st = get_step(p, id, index, &rv, &errmsg);

	if (rv != MOAT_OK)
		fail_msg("GetStep %s %llu: %s: %s", id,
		    (unsigned long long)index, moat_strerror(rv), errmsg);
	assert_int_equal(st->index, index);
	assert_string_equal(st->session_id, id);
	assert_string_equal(st->held_by_session, holder);
	assert_string_equal(st->snapshot_id, snap);
	/* The outputs come from the holder too. */
	assert_true(st->stdout.len > 0);
	protobuf_c_message_free_unpacked(&st->base, NULL);
}

static Moat__V1__ListStepsReply *
list_steps(struct ses_proc *p, const char *id, uint32_t page_size,
    const char *token, bool own_only)
{
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;

	req.tenant = (char *)TA;
	req.session_id = (char *)id;
	req.page_size = page_size;
	req.page_token = (char *)(token ? token : "");
	req.own_only = own_only;
	if (ses_call(p, "ListSteps", &req.base,
	        &moat__v1__list_steps_reply__descriptor, &reply,
	        &errmsg) != MOAT_OK)
		fail_msg("ListSteps: %s", errmsg);
	return (Moat__V1__ListStepsReply *)reply;
}

static Moat__V1__SessionInfo *
get_session(struct ses_proc *p, const char *id)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;

	req.tenant = (char *)TA;
	req.session_id = (char *)id;
	if (ses_call(p, "GetSession", &req.base,
	        &moat__v1__session_info__descriptor, &reply,
	        &errmsg) != MOAT_OK)
		fail_msg("GetSession: %s", errmsg);
	return (Moat__V1__SessionInfo *)reply;
}

static Moat__V1__SessionTreeReply *
get_tree(struct ses_proc *p, const char *id)
{
	Moat__V1__GetSessionTreeRequest req =
	    MOAT__V1__GET_SESSION_TREE_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL;

	req.tenant = (char *)TA;
	req.session_id = (char *)id;
	if (ses_call(p, "GetSessionTree", &req.base,
	        &moat__v1__session_tree_reply__descriptor, &reply,
	        &errmsg) != MOAT_OK)
		fail_msg("GetSessionTree: %s", errmsg);
	return (Moat__V1__SessionTreeReply *)reply;
}

/* The scenario: record 3 steps, restore step 1, run one step:
 * it is step 2 of the branch, whose history is step 1 (inherited) and
 * step 2; a fork from step 2 of the branch reads steps 1 and 2. */
static void
test_branch_path(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__SessionInfo *s;
	Moat__V1__ListStepsReply *l;
	Moat__V1__Step *st;
	char *root = create(p, NULL, 0), *branch, *fork, *errmsg = NULL;
	int rv;

	append(p, root, 0, "snap-r1", 1);
	append(p, root, 1, "snap-r2", 2);
	append(p, root, 2, "snap-r3", 3);
	branch = create(p, root, 1);
	s = get_session(p, branch);
	assert_int_equal(s->first_step, 2);
	assert_int_equal(s->step_count, 1);
	assert_int_equal(s->parent_step, 1);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	append(p, branch, 7, "snap-b2", 2);

	step_ok(p, branch, 1, root, "snap-r1");
	step_ok(p, branch, 2, "", "snap-b2");
	st = get_step(p, branch, 3, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "it has steps 1..2");
	assert_null(st);
	st = get_step(p, branch, 0, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "count from 1");

	/* History: the inherited step first, marked, then its own. */
	l = list_steps(p, branch, 0, NULL, false);
	assert_int_equal(l->n_steps, 2);
	assert_int_equal(l->steps[0]->index, 1);
	assert_string_equal(l->steps[0]->held_by_session, root);
	assert_int_equal(l->steps[0]->exit_code, 0);
	assert_int_equal(l->steps[1]->index, 2);
	assert_string_equal(l->steps[1]->held_by_session, "");
	assert_int_equal(l->steps[1]->exit_code, 7);
	protobuf_c_message_free_unpacked(&l->base, NULL);
	/* Pages of one step go across the branch point. */
	l = list_steps(p, branch, 1, NULL, false);
	assert_int_equal(l->n_steps, 1);
	assert_int_equal(l->steps[0]->index, 1);
	assert_string_not_equal(l->next_page_token, "");
	{
		char *token = strdup(l->next_page_token);

		protobuf_c_message_free_unpacked(&l->base, NULL);
		l = list_steps(p, branch, 1, token, false);
		free(token);
	}
	assert_int_equal(l->n_steps, 1);
	assert_int_equal(l->steps[0]->index, 2);
	assert_string_equal(l->next_page_token, "");
	protobuf_c_message_free_unpacked(&l->base, NULL);
	/* Retention reads only what the branch holds. */
	l = list_steps(p, branch, 0, NULL, true);
	assert_int_equal(l->n_steps, 1);
	assert_int_equal(l->steps[0]->index, 2);
	protobuf_c_message_free_unpacked(&l->base, NULL);

	/* A fork from step 2 of the branch. */
	fork = create(p, branch, 2);
	append(p, fork, 0, NULL, 3);
	step_ok(p, fork, 1, root, "snap-r1");
	step_ok(p, fork, 2, branch, "snap-b2");
	step_ok(p, fork, 3, "", "");
	/* Beyond the branch's path: refused, saying what it has. */
	{
		Moat__V1__CreateSessionRequest req =
		    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
		ProtobufCMessage *reply = NULL;

		req.tenant = (char *)TA;
		req.sandbox_id = (char *)"sbx-paths";
		req.parent_session_id = branch;
		req.parent_step = 3;
		rv = ses_call(p, "CreateSession", &req.base,
		    &moat__v1__session_info__descriptor, &reply, &errmsg);
		ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "1 to 2");
	}

	/* The parent's steps keep their numbers. */
	step_ok(p, root, 2, "", "snap-r2");
	l = list_steps(p, root, 0, NULL, false);
	assert_int_equal(l->n_steps, 3);
	protobuf_c_message_free_unpacked(&l->base, NULL);
	free(root);
	free(branch);
	free(fork);
}

/* Keep of an inherited step pins it where it is held. */
static void
test_keep_inherited(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__SetStepKeepRequest req =
	    MOAT__V1__SET_STEP_KEEP_REQUEST__INIT;
	ProtobufCMessage *reply;
	Moat__V1__Step *st;
	char *root = create(p, NULL, 0), *branch, *errmsg = NULL;
	int rv;

	append(p, root, 0, "snap-k1", 1);
	append(p, root, 0, "snap-k2", 2);
	branch = create(p, root, 2);
	req.tenant = (char *)TA;
	req.session_id = branch;
	req.index = 1;
	req.keep = true;
	rv = ses_call(p, "SetStepKeep", &req.base, &moat__v1__step__descriptor,
	    &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("SetStepKeep: %s", errmsg);
	assert_true(((Moat__V1__Step *)reply)->keep);
	protobuf_c_message_free_unpacked(reply, NULL);
	st = get_step(p, root, 1, &rv, &errmsg);
	assert_int_equal(rv, MOAT_OK);
	assert_true(st->keep);
	protobuf_c_message_free_unpacked(&st->base, NULL);
	/* Step 3 of the branch does not exist yet. */
	req.index = 3;
	rv = ses_call(p, "SetStepKeep", &req.base, &moat__v1__step__descriptor,
	    &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "1..2");
	free(root);
	free(branch);
}

/* A chain of branches: step 1 of the last is the root's; past
 * SESSIOND_PATH_MAX_DEPTH (64) parents the read is refused, clearly. */
static void
test_deep_chain(void **state)
{
	struct ses_proc *p = *state;
	char *ids[70], *errmsg = NULL;
	Moat__V1__Step *st;
	int rv;

	ids[0] = create(p, NULL, 0);
	append(p, ids[0], 0, "snap-d1", 1);
	for (int i = 1; i < 70; i++) {
		ids[i] = create(p, ids[i - 1], (uint64_t)i);
		append(p, ids[i], i, NULL, (uint64_t)i + 1);
	}
	/* 5 sessions deep: found. */
	step_ok(p, ids[5], 1, ids[0], "snap-d1");
	step_ok(p, ids[5], 3, ids[2], "");
	/* 64 parents up: still found; 65: refused. */
	step_ok(p, ids[64], 1, ids[0], "snap-d1");
	st = get_step(p, ids[65], 1, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_FAILED_PRECONDITION, "more than 64");
	assert_null(st);
	step_ok(p, ids[65], 2, ids[1], "");
	for (int i = 0; i < 70; i++)
		free(ids[i]);
}

/* A deleted parent: its branch's own steps are still read and listed;
 * the inherited ones say where they were. */
static void
test_parent_deleted(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__DeleteSessionRequest req =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	Moat__V1__ListStepsReply *l;
	Moat__V1__Step *st;
	char *root = create(p, NULL, 0), *branch, *errmsg = NULL;
	int rv;

	append(p, root, 0, NULL, 1);
	branch = create(p, root, 1);
	append(p, branch, 0, NULL, 2);
	req.tenant = (char *)TA;
	req.session_id = root;
	assert_int_equal(ses_call(p, "DeleteSession", &req.base,
	                     &moat__v1__delete_session_reply__descriptor,
	                     &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	st = get_step(p, branch, 1, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "was deleted");
	assert_null(st);
	step_ok(p, branch, 2, "", "");
	/* Its history lists its own steps. */
	l = list_steps(p, branch, 0, NULL, false);
	assert_int_equal(l->n_steps, 1);
	assert_int_equal(l->steps[0]->index, 2);
	assert_string_equal(l->next_page_token, "");
	protobuf_c_message_free_unpacked(&l->base, NULL);
	free(root);
	free(branch);
}

/* The tree: the root, its branches depth first, each with where it
 * branched, its path's length, its own steps and last exit status. */
static void
test_tree(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__SessionTreeReply *t;
	char *root = create(p, NULL, 0), *b1, *b2, *b11, *other;

	append(p, root, 0, NULL, 1);
	append(p, root, 0, NULL, 2);
	append(p, root, 3, NULL, 3);
	b1 = create(p, root, 1);
	append(p, b1, 5, NULL, 2);
	b11 = create(p, b1, 2);
	b2 = create(p, root, 3);
	append(p, b2, 0, NULL, 4);
	append(p, b2, 9, NULL, 5);
	other = create(p, NULL, 0); /* not in the tree */

	t = get_tree(p, root);
	assert_int_equal(t->n_nodes, 4);
	assert_false(t->truncated);
	assert_string_equal(t->nodes[0]->session_id, root);
	assert_int_equal(t->nodes[0]->depth, 0);
	assert_int_equal(t->nodes[0]->step_count, 3);
	assert_int_equal(t->nodes[0]->own_steps, 3);
	assert_true(t->nodes[0]->has_exit);
	assert_int_equal(t->nodes[0]->last_exit_code, 3);
	assert_string_equal(t->nodes[1]->session_id, b1);
	assert_string_equal(t->nodes[1]->parent_session_id, root);
	assert_int_equal(t->nodes[1]->depth, 1);
	assert_int_equal(t->nodes[1]->branched_at, 1);
	assert_int_equal(t->nodes[1]->step_count, 2);
	assert_int_equal(t->nodes[1]->own_steps, 1);
	assert_int_equal(t->nodes[1]->last_exit_code, 5);
	assert_string_equal(t->nodes[2]->session_id, b11);
	assert_int_equal(t->nodes[2]->depth, 2);
	assert_int_equal(t->nodes[2]->branched_at, 2);
	assert_int_equal(t->nodes[2]->own_steps, 0);
	assert_false(t->nodes[2]->has_exit);
	assert_string_equal(t->nodes[3]->session_id, b2);
	assert_int_equal(t->nodes[3]->depth, 1);
	assert_int_equal(t->nodes[3]->branched_at, 3);
	assert_int_equal(t->nodes[3]->step_count, 5);
	assert_int_equal(t->nodes[3]->last_exit_code, 9);
	protobuf_c_message_free_unpacked(&t->base, NULL);

	/* A branch's tree starts at it. */
	t = get_tree(p, b1);
	assert_int_equal(t->n_nodes, 2);
	assert_string_equal(t->nodes[0]->session_id, b1);
	assert_int_equal(t->nodes[0]->depth, 0);
	assert_string_equal(t->nodes[1]->session_id, b11);
	protobuf_c_message_free_unpacked(&t->base, NULL);
	free(root);
	free(b1);
	free(b2);
	free(b11);
	free(other);
}

static void
test_tree_unknown(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__GetSessionTreeRequest req =
	    MOAT__V1__GET_SESSION_TREE_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int rv;

	req.tenant = (char *)TA;
	req.session_id = (char *)"ses-0123456789abcdef";
	rv = ses_call(p, "GetSessionTree", &req.base,
	    &moat__v1__session_tree_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_NOT_FOUND, "moat session ls");
	req.session_id = (char *)"nope";
	rv = ses_call(p, "GetSessionTree", &req.base,
	    &moat__v1__session_tree_reply__descriptor, &reply, &errmsg);
	ses_expect(rv, errmsg, MOAT_INVALID_ARGUMENT, "session_id");
}

/* rewrite_session: with sessiond stopped, rewrites session `id`'s record
 * in its store: parent, parent_step, first_step and step_count. */
static void
rewrite_session(const char *dir, const char *id, const char *parent,
    uint64_t parent_step, uint64_t first_step, uint64_t step_count)
{
	char *path = moat_asprintf("%s/sessiond", dir);
	Moat__V1__SessionInfo *si;
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = { strlen(id), (void *)id }, v;
	uint8_t *buf;
	size_t len;

	assert_int_equal(mdb_env_create(&env), 0);
	assert_int_equal(mdb_env_set_maxdbs(env, 32), 0);
	assert_int_equal(mdb_env_set_mapsize(env, 1024ull << 20), 0);
	assert_int_equal(mdb_env_open(env, path, 0, 0600), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "sessions", 0, &dbi), 0);
	assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
	si = moat__v1__session_info__unpack(NULL, v.mv_size, v.mv_data);
	assert_non_null(si);
	if (si->parent_session_id != (char *)protobuf_c_empty_string)
		free(si->parent_session_id);
	si->parent_session_id = strdup(parent);
	si->parent_step = parent_step;
	si->first_step = first_step;
	si->step_count = step_count;
	len = moat__v1__session_info__get_packed_size(si);
	buf = malloc(len);
	moat__v1__session_info__pack(si, buf);
	v.mv_size = len;
	v.mv_data = buf;
	assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
	moat__v1__session_info__free_unpacked(si, NULL);
	free(buf);
	free(path);
}

/* A branch recorded before first_step existed (its record has none):
 * its steps keep their numbers from 1 and are its own. */
static void
test_recorded_before(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__ListStepsReply *l;
	char *root = create(p, NULL, 0), *old;

	append(p, root, 0, NULL, 1);
	append(p, root, 0, NULL, 2);
	old = create(p, root, 2);
	ses_kill(p, SIGTERM);
	rewrite_session(p->dir, old, root, 2, 0, 0);
	ses_start(p, NULL);
	append(p, old, 0, "snap-old-1", 1);
	step_ok(p, old, 1, "", "snap-old-1");
	l = list_steps(p, old, 0, NULL, false);
	assert_int_equal(l->n_steps, 1);
	assert_string_equal(l->steps[0]->held_by_session, "");
	protobuf_c_message_free_unpacked(&l->base, NULL);
	/* A branch of it continues its numbers. */
	{
		char *b = create(p, old, 1);

		append(p, b, 0, NULL, 2);
		step_ok(p, b, 1, old, "snap-old-1");
		free(b);
	}
	free(root);
	free(old);
}

/* A loop of parents (a damaged store: CreateSession cannot make one):
 * reads stop at the bound with a clear error, the tree ends. */
static void
test_parent_loop(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__SessionTreeReply *t;
	Moat__V1__Step *st;
	char *a = create(p, NULL, 0), *b, *errmsg = NULL;
	int rv;

	append(p, a, 0, NULL, 1);
	b = create(p, a, 1);
	append(p, b, 0, NULL, 2);
	ses_kill(p, SIGTERM);
	/* a now says it branched from step 1 of b. */
	rewrite_session(p->dir, a, b, 1, 2, 1);
	ses_start(p, NULL);
	st = get_step(p, b, 1, &rv, &errmsg);
	ses_expect(rv, errmsg, MOAT_FAILED_PRECONDITION, "more than 64");
	assert_null(st);
	step_ok(p, b, 2, "", "");
	t = get_tree(p, a);
	assert_int_equal(t->n_nodes, 2);
	protobuf_c_message_free_unpacked(&t->base, NULL);
	t = get_tree(p, b);
	assert_int_equal(t->n_nodes, 2);
	protobuf_c_message_free_unpacked(&t->base, NULL);
	free(a);
	free(b);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(test_branch_path),
		SES_CASE(test_keep_inherited),
		SES_CASE(test_deep_chain),
		SES_CASE(test_parent_deleted),
		SES_CASE(test_tree),
		SES_CASE(test_tree_unknown),
		SES_CASE(test_recorded_before),
		SES_CASE(test_parent_loop),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
