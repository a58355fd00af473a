/*
 * test_snapshots.c: snapshots a node can sustain, the gateway's part
 * (issue 11), with a real gateway in-process (auth on: tenants alpha and
 * beta), a real moat-sessiond and a fake vmd node that keeps its local
 * snapshots: the retention policy read per tenant; step snapshots taken
 * with their session and step; retention keep-last 3 (age 0) over six
 * steps clearing steps 0-3 with the reason and deleting their snapshots
 * on the node while steps 4-6 and a pinned step keep theirs; RestoreStep
 * of a removed step FAILED_PRECONDITION naming the nearest steps, and of
 * a snapshot the node lost NOT_FOUND; DeleteSession deleting the
 * snapshots nothing names any more (a branch's base kept until the
 * branch goes), and with the node down deleting the session anyway;
 * GcSnapshots dry run and real, sparing referenced, live, template,
 * young and other tenants' snapshots; SetStepKeep scoped to the caller's
 * tenant; the node's snapshot RAM in /metrics.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "fake_node.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define GW "moat.v1.Gateway"
#define REASON "removed by retention (keep-last 3)"
#define SNAP_BYTES ((uint64_t)FAKE_SNAP_RAM + FAKE_SNAP_DISK)

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_config *cfg;
	struct moat_gateway *gw;
	struct moat_rpc_client *client;
	struct fake_node a;
	char *alpha, *beta; /* API keys */
	pid_t sessiond;
	/* test_retention's sessions, for the later tests */
	char session1[64], sandbox1[64], session2[64];
};

static struct env E;

/* call: one Gateway call as `key`'s tenant, 20 s at most. */
static int
call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, void *reply, const char *key,
    char **errmsg)
{
	struct moat_rpc_opts opts = { .timeout_ms = 20000, .auth = key };

	*(ProtobufCMessage **)reply = NULL;
	*errmsg = NULL;
	return moat_rpc_call(E.client, GW, method, req, desc,
	    (ProtobufCMessage **)reply, &opts, errmsg);
}

/* ok: call, asserting MOAT_OK. */
static void *
ok(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, const char *key)
{
	ProtobufCMessage *reply;
	char *msg;
	int rv = call(method, req, desc, &reply, key, &msg);

	if (rv != MOAT_OK)
		fail_msg("%s: %d %s", method, rv, msg ? msg : "");
	return reply;
}

static void
sessiond_start(void)
{
	Moat__V1__ListSessionsRequest req =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", E.dir,
		NULL };
	ProtobufCMessage *reply;
	char *msg;
	int rv = MOAT_UNAVAILABLE;

	if ((E.sessiond = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(E.sessiond > 0);
	for (int i = 0; i < 100 && rv != MOAT_OK; i++) {
		rv = call("ListSessions", &req.base,
		    &moat__v1__list_sessions_reply__descriptor, &reply,
		    E.alpha, &msg);
		free(msg);
		protobuf_c_message_free_unpacked(reply, NULL);
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	assert_int_equal(rv, MOAT_OK);
}

static void
wait_node(void)
{
	for (int i = 0; i < 300; i++) {
		struct moat_node_id *ids = NULL;
		size_t n = 0;

		if (moat_nodes_available_ids(moat_gateway_nodes(E.gw), &ids,
		        &n) == MOAT_OK &&
		    n == 1) {
			free(ids);
			return;
		}
		free(ids);
		nng_msleep(20);
	}
	fail_msg("the gateway never saw the fake node");
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	struct moat_auth *a = NULL;
	char *errmsg = NULL, *sessiond, *snapd, *conf;
	char id[MOAT_AUTH_KEY_ID_LEN + 1];
	FILE *f;

	(void)state;
	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_ERROR);
	unsetenv("MOAT_RETENTION_KEEP_LAST");
	unsetenv("MOAT_RETENTION_KEEP_AGE_S");
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-snaps-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	conf = moat_asprintf("%s/moat.conf", E.dir);
	assert_non_null(f = fopen(conf, "w"));
	fputs("[retention]\nkeep-last = 3\nkeep-age-s = 0\n", f);
	fclose(f);
	assert_int_equal(moat_config_load(&E.cfg, conf, &errmsg), MOAT_OK);
	free(conf);
	assert_int_equal(moat_auth_open(&a, E.dir, &errmsg), MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "alpha", &E.alpha, id,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_auth_key_create(a, "beta", &E.beta, id, &errmsg),
	    MOAT_OK);
	moat_auth_close(a);
	E.survey_url = moat_asprintf("ipc://%s/survey.sock", E.dir);
	E.listen_url = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	sessiond = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	snapd = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	opts.listen_url = E.listen_url;
	opts.survey_url = E.survey_url;
	opts.sessiond_url = sessiond;
	opts.snapd_url = snapd; /* nothing listens: snapd is down */
	opts.state_dir = E.dir;
	opts.survey_interval_ms = 100;
	opts.auth = true;
	opts.config = E.cfg;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(sessiond);
	free(snapd);
	assert_int_equal(moat_rpc_client_open(&E.client, E.listen_url,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	wait_node();
	sessiond_start();
	return 0;
}

static int
teardown(void **state)
{
	int status;

	(void)state;
	kill(E.sessiond, SIGTERM);
	waitpid(E.sessiond, &status, 0);
	moat_rpc_client_close(E.client);
	fake_node_halt(&E.a);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	moat_config_free(E.cfg);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	free(E.alpha);
	free(E.beta);
	return 0;
}

/* ---- helpers ---- */

/* recorded: a new recorded sandbox (snapshot policy EVERY) of alpha;
 * its id and session's into sandbox / session (64 bytes each). */
static void
recorded(char *sandbox, char *session)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb;

	req.record = true;
	req.snapshot_policy = MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY;
	sb = ok("CreateSandbox", &req.base, &moat__v1__sandbox__descriptor,
	    E.alpha);
	snprintf(sandbox, 64, "%s", sb->id);
	snprintf(session, 64, "%s", sb->session_id);
	moat__v1__sandbox__free_unpacked(sb, NULL);
}

/* step: one recorded Exec (keep: pinned); asserts it became step
 * `index` without a recording error. */
static void
step(const char *sandbox, uint32_t index, bool keep)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *r;

	req.sandbox_id = (char *)sandbox;
	req.shell = (char *)"echo step";
	req.keep = keep;
	r = ok("Exec", &req.base, &moat__v1__exec_result__descriptor, E.alpha);
	assert_string_equal(r->recording_error, "");
	assert_int_equal(r->step_index, index);
	moat__v1__exec_result__free_unpacked(r, NULL);
}

/* node_snap: the id of the node's snapshot of (session, step) into id
 * (128 bytes); false when it holds none. */
static bool
node_snap(const char *session, uint64_t index, char *id)
{
	bool found = false;

	pthread_mutex_lock(&E.a.lock);
	for (int i = 0; i < E.a.n_snaps && !found; i++)
		if (strcmp(E.a.snaps[i].session, session) == 0 &&
		    E.a.snaps[i].step == index) {
			snprintf(id, 128, "%s", E.a.snaps[i].id);
			found = true;
		}
	pthread_mutex_unlock(&E.a.lock);
	return found;
}

static Moat__V1__ListStepsReply *
steps_of(const char *session, const char *key)
{
	Moat__V1__ListStepsRequest req = MOAT__V1__LIST_STEPS_REQUEST__INIT;

	req.session_id = (char *)session;
	return ok("ListSteps", &req.base,
	    &moat__v1__list_steps_reply__descriptor, key);
}

static Moat__V1__SessionInfo *
session_of(const char *session)
{
	Moat__V1__GetSessionRequest req = MOAT__V1__GET_SESSION_REQUEST__INIT;

	req.session_id = (char *)session;
	return ok("GetSession", &req.base, &moat__v1__session_info__descriptor,
	    E.alpha);
}

static const char *
label(const Moat__V1__SessionInfo *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i]->key, key) == 0)
			return s->labels[i]->value;
	return NULL;
}

/* restore_step: RestoreStep of (session, index) into a new sandbox as
 * alpha; the status, with the message in *msg (caller frees). */
static int
restore_step(const char *session, uint64_t index, char **msg)
{
	Moat__V1__RestoreStepRequest req =
	    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
	Moat__V1__RestoreStepReply *r;
	int rv;

	req.session_id = (char *)session;
	req.step = index;
	req.new_sandbox = true;
	rv = call("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor, &r, E.alpha, msg);
	if (r != NULL)
		moat__v1__restore_step_reply__free_unpacked(r, NULL);
	return rv;
}

static Moat__V1__DeleteSessionReply *
delete_session(const char *session)
{
	Moat__V1__DeleteSessionRequest req =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;

	req.session_id = (char *)session;
	return ok("DeleteSession", &req.base,
	    &moat__v1__delete_session_reply__descriptor, E.alpha);
}

static Moat__V1__GcSnapshotsReply *
gc(bool dry_run, const char *key)
{
	Moat__V1__GcSnapshotsRequest req =
	    MOAT__V1__GC_SNAPSHOTS_REQUEST__INIT;

	req.dry_run = dry_run;
	return ok("GcSnapshots", &req.base,
	    &moat__v1__gc_snapshots_reply__descriptor, key);
}

static bool
gc_removed(const Moat__V1__GcSnapshotsReply *r, const char *id)
{
	for (size_t i = 0; i < r->n_removed; i++)
		if (strcmp(r->removed[i]->snapshot_id, id) == 0)
			return true;
	return false;
}

/* ---- tests ---- */

static void
test_retention_policy(void **state)
{
	struct moat_config *cfg = NULL;
	struct moat_retention p;
	char *conf, *msg = NULL;
	FILE *f;

	(void)state;
	assert_int_equal(moat_retention_policy(NULL, "alpha", &p, &msg),
	    MOAT_OK);
	assert_int_equal(p.keep_last, MOAT_RETENTION_KEEP_LAST);
	assert_int_equal(p.keep_age_s, MOAT_RETENTION_KEEP_AGE_S);
	conf = moat_asprintf("%s/policy.conf", E.dir);
	assert_non_null(f = fopen(conf, "w"));
	fputs("[retention]\nkeep-last = 5\nkeep-last.beta = 0\n"
	      "keep-age-s.beta = 7\nkeep-last.gamma = many\n",
	    f);
	fclose(f);
	assert_int_equal(moat_config_load(&cfg, conf, &msg), MOAT_OK);
	assert_int_equal(moat_retention_policy(cfg, "alpha", &p, &msg),
	    MOAT_OK);
	assert_int_equal(p.keep_last, 5);
	assert_int_equal(p.keep_age_s, MOAT_RETENTION_KEEP_AGE_S);
	assert_int_equal(moat_retention_policy(cfg, "beta", &p, &msg),
	    MOAT_OK);
	assert_int_equal(p.keep_last, 0);
	assert_int_equal(p.keep_age_s, 7);
	assert_int_equal(moat_retention_policy(cfg, "gamma", &p, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "keep-last.gamma"));
	assert_int_equal(p.keep_last, MOAT_RETENTION_KEEP_LAST);
	free(msg);
	moat_config_free(cfg);
	free(conf);
}

/* Six steps with a snapshot after each, keep-last 3 and age 0: steps 0-3
 * lose theirs (with the reason; deleted on the node), 4-6 keep theirs.
 * Each snapshot was taken naming its session and step. */
static void
test_retention_keeps_last_three(void **state)
{
	Moat__V1__ListStepsReply *steps;
	Moat__V1__SessionInfo *s;
	struct fake_snapshot fs;
	char ids[7][128];

	(void)state;
	recorded(E.sandbox1, E.session1);
	assert_true(node_snap(E.session1, 0, ids[0]));
	for (uint32_t i = 1; i <= 6; i++) {
		step(E.sandbox1, i, false);
		assert_true(node_snap(E.session1, i, ids[i]));
	}
	steps = steps_of(E.session1, E.alpha);
	assert_int_equal(steps->n_steps, 6);
	for (size_t i = 0; i < 3; i++) {
		assert_string_equal(steps->steps[i]->snapshot_id, "");
		assert_string_equal(steps->steps[i]->snapshot_removed, REASON);
	}
	for (size_t i = 3; i < 6; i++) {
		assert_string_equal(steps->steps[i]->snapshot_id, ids[i + 1]);
		assert_string_equal(steps->steps[i]->snapshot_removed, "");
	}
	moat__v1__list_steps_reply__free_unpacked(steps, NULL);
	s = session_of(E.session1);
	assert_null(label(s, MOAT_RECORD_STEP0_LABEL));
	assert_string_equal(label(s, MOAT_RECORD_STEP0_REMOVED_LABEL), REASON);
	moat__v1__session_info__free_unpacked(s, NULL);
	for (int i = 0; i <= 3; i++) {
		assert_true(fake_node_was_deleted(&E.a, ids[i]));
		assert_false(fake_node_snapshot(&E.a, ids[i], NULL));
	}
	for (int i = 4; i <= 6; i++) {
		assert_true(fake_node_snapshot(&E.a, ids[i], &fs));
		assert_string_equal(fs.session, E.session1);
		assert_int_equal(fs.step, i);
	}
}

/* A pinned step (Exec keep) keeps its snapshot past keep-last; RunCode's
 * keep pins too; RestoreStep of a removed step names the nearest steps
 * that have one, before and after, and says retention removed it. */
static void
test_retention_pinned_and_restore(void **state)
{
	Moat__V1__RunCodeRequest code = MOAT__V1__RUN_CODE_REQUEST__INIT;
	Moat__V1__ListStepsReply *steps;
	char sandbox[64], *msg = NULL;

	(void)state;
	recorded(sandbox, E.session2);
	step(sandbox, 1, false);
	step(sandbox, 2, true);
	for (uint32_t i = 3; i <= 5; i++)
		step(sandbox, i, false);
	code.sandbox_id = sandbox;
	code.code = (char *)"x = 1";
	code.keep = true;
	protobuf_c_message_free_unpacked(
	    ok("RunCode", &code.base, &moat__v1__run_code_result__descriptor,
	        E.alpha),
	    NULL);
	steps = steps_of(E.session2, E.alpha);
	assert_int_equal(steps->n_steps, 6);
	assert_string_equal(steps->steps[0]->snapshot_removed, REASON);
	assert_true(steps->steps[1]->keep);
	assert_string_not_equal(steps->steps[1]->snapshot_id, "");
	assert_string_equal(steps->steps[2]->snapshot_id, "");
	assert_string_equal(steps->steps[2]->snapshot_removed, REASON);
	for (size_t i = 3; i < 6; i++)
		assert_string_not_equal(steps->steps[i]->snapshot_id, "");
	assert_true(steps->steps[5]->keep);
	assert_false(steps->steps[4]->keep);
	moat__v1__list_steps_reply__free_unpacked(steps, NULL);

	assert_int_equal(restore_step(E.session2, 3, &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, REASON));
	assert_non_null(strstr(msg, "2 (before it)"));
	assert_non_null(strstr(msg, "4 (after it)"));
	assert_non_null(strstr(msg, "steps with one: 2, 4, 5, 6;"));
	free(msg);
	assert_int_equal(restore_step(E.session1, 2, &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, REASON));
	assert_non_null(strstr(msg, "4 (after it)"));
	assert_null(strstr(msg, "before it"));
	free(msg);
	assert_int_equal(restore_step(E.session1, 0, &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, REASON));
	free(msg);
	/* A step that keeps its snapshot still restores. */
	assert_int_equal(restore_step(E.session2, 2, &msg), MOAT_OK);
	free(msg);
}

/* A snapshot a step still names but the node no longer has: RestoreStep
 * is NOT_FOUND saying so, never INTERNAL. */
static void
test_restore_lost_snapshot(void **state)
{
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	char id[128], *msg = NULL;

	(void)state;
	assert_true(node_snap(E.session1, 4, id));
	ref.snapshot_id = id;
	protobuf_c_message_free_unpacked(ok("DeleteLocalSnapshot", &ref.base,
	                                     &moat__v1__empty__descriptor,
	                                     E.alpha),
	    NULL);
	assert_int_equal(restore_step(E.session1, 4, &msg), MOAT_NOT_FOUND);
	assert_non_null(strstr(msg, id));
	assert_non_null(strstr(msg, "no longer on node node-a"));
	free(msg);
}

/* DeleteSession deletes the snapshots no other session names: a fork's
 * branch keeps the step it started from until the branch goes too. */
static void
test_delete_session_deletes_snapshots(void **state)
{
	Moat__V1__ForkRequest fork = MOAT__V1__FORK_REQUEST__INIT;
	Moat__V1__GetSessionRequest greq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__ForkReply *fr;
	Moat__V1__DeleteSessionReply *r;
	char sandbox[64], session[64], branch[64], ids[3][128], *msg = NULL;
	ProtobufCMessage *reply;

	(void)state;
	recorded(sandbox, session);
	step(sandbox, 1, false);
	step(sandbox, 2, false);
	for (int i = 0; i < 3; i++)
		assert_true(node_snap(session, (uint64_t)i, ids[i]));
	fork.session_id = session;
	fork.step = 1;
	fork.count = 1;
	fr =
	    ok("Fork", &fork.base, &moat__v1__fork_reply__descriptor, E.alpha);
	assert_int_equal(fr->succeeded, 1);
	snprintf(branch, sizeof(branch), "%s", fr->copies[0]->session_id);
	moat__v1__fork_reply__free_unpacked(fr, NULL);

	r = delete_session(session);
	assert_int_equal(r->steps_deleted, 2);
	assert_int_equal(r->n_unreferenced_snapshots, 2);
	assert_int_equal(r->snapshots_deleted, 2);
	assert_int_equal(r->snapshot_bytes_freed, 2 * SNAP_BYTES);
	moat__v1__delete_session_reply__free_unpacked(r, NULL);
	assert_true(fake_node_was_deleted(&E.a, ids[0]));
	assert_true(fake_node_was_deleted(&E.a, ids[2]));
	assert_true(fake_node_snapshot(&E.a, ids[1], NULL));

	r = delete_session(branch);
	assert_int_equal(r->snapshots_deleted, 1);
	assert_int_equal(r->snapshot_bytes_freed, SNAP_BYTES);
	moat__v1__delete_session_reply__free_unpacked(r, NULL);
	assert_true(fake_node_was_deleted(&E.a, ids[1]));
	greq.session_id = session;
	assert_int_equal(call("GetSession", &greq.base,
	                     &moat__v1__session_info__descriptor, &reply,
	                     E.alpha, &msg),
	    MOAT_NOT_FOUND);
	free(msg);
}

/* GcSnapshots: a dry run lists and removes nothing; a real run removes
 * the unreferenced snapshots whose sandbox is gone, and keeps those a
 * step names, those of live sandboxes, templates, young ones and other
 * tenants' (until that tenant collects). snapd (down here) is an error
 * line, not a failure. */
static void
test_gc(void **state)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__GcSnapshotsReply *r;
	char named[128];
	int deleted;

	(void)state;
	ref.sandbox_id = E.sandbox1;
	protobuf_c_message_free_unpacked(ok("DestroySandbox", &ref.base,
	                                     &moat__v1__empty__descriptor,
	                                     E.alpha),
	    NULL);
	assert_true(node_snap(E.session1, 5, named));
	fake_node_add_sandbox(&E.a, "live-sb");
	fake_node_add_snapshot(&E.a, "snap-node-a-00000000000000a1", "gone-sb",
	    "alpha", 0, false);
	fake_node_add_snapshot(&E.a, "snap-node-a-00000000000000a2", "live-sb",
	    "alpha", 0, false);
	fake_node_add_snapshot(&E.a, "snap-node-a-00000000000000a3", "", "", 0,
	    true);
	fake_node_add_snapshot(&E.a, "snap-node-a-00000000000000b1", "gone-sb",
	    "beta", 0, false);
	fake_node_age_snapshots(&E.a, 120000);
	fake_node_add_snapshot(&E.a, "snap-node-a-00000000000000a4", "gone-sb",
	    "alpha", 0, false);

	pthread_mutex_lock(&E.a.lock);
	deleted = E.a.n_deleted;
	pthread_mutex_unlock(&E.a.lock);
	r = gc(true, E.alpha);
	assert_true(r->dry_run);
	assert_true(gc_removed(r, "snap-node-a-00000000000000a1"));
	assert_int_equal(r->bytes_freed >= SNAP_BYTES, true);
	assert_false(gc_removed(r, named));
	assert_false(gc_removed(r, "snap-node-a-00000000000000a2"));
	assert_false(gc_removed(r, "snap-node-a-00000000000000a3"));
	assert_false(gc_removed(r, "snap-node-a-00000000000000a4"));
	assert_false(gc_removed(r, "snap-node-a-00000000000000b1"));
	assert_true(r->kept >= 2);
	assert_true(r->n_errors >= 1);
	assert_non_null(strstr(r->errors[r->n_errors - 1], "moat-snapd"));
	moat__v1__gc_snapshots_reply__free_unpacked(r, NULL);
	/* Read under the fake node's lock, asserted after it: a failed
	 * assertion must not leave the node locked. */
	pthread_mutex_lock(&E.a.lock);
	deleted = E.a.n_deleted - deleted;
	pthread_mutex_unlock(&E.a.lock);
	assert_int_equal(deleted, 0);

	r = gc(false, E.alpha);
	assert_false(r->dry_run);
	assert_true(gc_removed(r, "snap-node-a-00000000000000a1"));
	moat__v1__gc_snapshots_reply__free_unpacked(r, NULL);
	assert_true(
	    fake_node_was_deleted(&E.a, "snap-node-a-00000000000000a1"));
	assert_true(fake_node_snapshot(&E.a, named, NULL));
	assert_true(
	    fake_node_snapshot(&E.a, "snap-node-a-00000000000000a2", NULL));
	assert_true(
	    fake_node_snapshot(&E.a, "snap-node-a-00000000000000a3", NULL));
	assert_true(
	    fake_node_snapshot(&E.a, "snap-node-a-00000000000000a4", NULL));
	assert_true(
	    fake_node_snapshot(&E.a, "snap-node-a-00000000000000b1", NULL));

	r = gc(false, E.beta);
	assert_true(gc_removed(r, "snap-node-a-00000000000000b1"));
	assert_false(gc_removed(r, named));
	moat__v1__gc_snapshots_reply__free_unpacked(r, NULL);
	assert_false(
	    fake_node_snapshot(&E.a, "snap-node-a-00000000000000b1", NULL));
}

/* SetStepKeep acts for the caller's tenant: alpha pins its step, beta
 * cannot see the session. */
static void
test_set_step_keep_tenants(void **state)
{
	Moat__V1__SetStepKeepRequest req =
	    MOAT__V1__SET_STEP_KEEP_REQUEST__INIT;
	Moat__V1__ListStepsReply *steps;
	Moat__V1__Step *st;
	ProtobufCMessage *reply;
	char *msg = NULL;

	(void)state;
	req.session_id = E.session1;
	req.index = 5;
	req.keep = true;
	req.tenant = (char *)"beta"; /* replaced by the gateway */
	st =
	    ok("SetStepKeep", &req.base, &moat__v1__step__descriptor, E.alpha);
	assert_true(st->keep);
	moat__v1__step__free_unpacked(st, NULL);
	steps = steps_of(E.session1, E.alpha);
	assert_true(steps->steps[4]->keep);
	moat__v1__list_steps_reply__free_unpacked(steps, NULL);

	req.tenant = (char *)"alpha";
	assert_int_equal(call("SetStepKeep", &req.base,
	                     &moat__v1__step__descriptor, &reply, E.beta,
	                     &msg),
	    MOAT_NOT_FOUND);
	free(msg);
	assert_int_equal(call("SetStepKeep", &req.base,
	                     &moat__v1__step__descriptor, &reply, NULL, &msg),
	    MOAT_UNAUTHENTICATED);
	free(msg);
}

/* /metrics has each node's snapshot RAM, budget and evictions. */
static void
test_metrics(void **state)
{
	char *text = moat_gateway_metrics(E.gw);

	(void)state;
	assert_non_null(text);
	assert_non_null(strstr(text,
	    "# TYPE moat_node_snapshot_ram_bytes "
	    "gauge"));
	assert_non_null(strstr(text,
	    "moat_node_snapshot_ram_budget_bytes{"
	    "node=\"node-a\"} 1073741824\n"));
	assert_non_null(strstr(text,
	    "moat_node_snapshot_evictions_total{"
	    "node=\"node-a\"} 3\n"));
	assert_non_null(strstr(text,
	    "moat_node_snapshot_ram_bytes{"
	    "node=\"node-a\"} "));
	free(text);
}

/* With the node down the session is deleted all the same; its snapshots
 * are left for `moat snapshot gc`. Last: the node stays down. */
static void
test_delete_session_node_down(void **state)
{
	Moat__V1__DeleteSessionReply *r;
	Moat__V1__GetSessionRequest greq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char sandbox[64], session[64], id[128], *msg = NULL;

	(void)state;
	recorded(sandbox, session);
	step(sandbox, 1, false);
	assert_true(node_snap(session, 1, id));
	fake_node_kill_rpc(&E.a);
	r = delete_session(session);
	assert_int_equal(r->steps_deleted, 1);
	assert_int_equal(r->n_unreferenced_snapshots, 2);
	assert_int_equal(r->snapshots_deleted, 0);
	moat__v1__delete_session_reply__free_unpacked(r, NULL);
	greq.session_id = session;
	assert_int_equal(call("GetSession", &greq.base,
	                     &moat__v1__session_info__descriptor, &reply,
	                     E.alpha, &msg),
	    MOAT_NOT_FOUND);
	free(msg);
	assert_false(fake_node_was_deleted(&E.a, id));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_retention_policy),
		cmocka_unit_test(test_retention_keeps_last_three),
		cmocka_unit_test(test_retention_pinned_and_restore),
		cmocka_unit_test(test_restore_lost_snapshot),
		cmocka_unit_test(test_delete_session_deletes_snapshots),
		cmocka_unit_test(test_gc),
		cmocka_unit_test(test_set_step_keep_tenants),
		cmocka_unit_test(test_metrics),
		cmocka_unit_test(test_delete_session_node_down),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
