/*
 * test_diff_calls.c: the gateway's Diff and Compare handlers end to end:
 * a real gateway in-process in front of a real moat-sessiond, sessions
 * and steps written straight into sessiond (two tenants), then called
 * through the RPC client as the CLI would: a session longer than one
 * ListSteps page is read whole, the same session twice agrees, an
 * unknown session and another tenant's are NOT_FOUND naming them,
 * Compare wants 2..32 ids, and with sessiond gone both are UNAVAILABLE
 * naming it.
 * Not for: the building of the replies (test_diff.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define GW "moat.v1.Gateway"
#define SS "moat.v1.Session"
#define LONG_STEPS 1003 /* more than one ListSteps page (1000) */

struct env {
	char dir[64];
	char *listen_url, *sessiond_url;
	struct moat_gateway *gw;
	struct moat_rpc_client *client, *sessiond;
	pid_t sessiond_pid;
	char *long_id, *short_id, *other_id;
};

static struct env E;

/* new_session: a session of `tenant` with `n` steps; step i runs
 * "step i" and exits 0; the last one creates /w/last. Heap id. */
static char *
new_session(const char *tenant, int n)
{
	Moat__V1__CreateSessionRequest creq =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL, *id;

	creq.tenant = (char *)tenant;
	creq.sandbox_id = (char *)"sb-test";
	assert_int_equal(moat_rpc_call(E.sessiond, SS, "CreateSession",
	                     &creq.base, &moat__v1__session_info__descriptor,
	                     &reply, NULL, &errmsg),
	    MOAT_OK);
	id = strdup(((Moat__V1__SessionInfo *)reply)->id);
	protobuf_c_message_free_unpacked(reply, NULL);
	for (int i = 1; i <= n; i++) {
		Moat__V1__AppendStepRequest areq =
		    MOAT__V1__APPEND_STEP_REQUEST__INIT;
		Moat__V1__Step st = MOAT__V1__STEP__INIT;
		Moat__V1__FsTraceEntry ent = MOAT__V1__FS_TRACE_ENTRY__INIT;
		Moat__V1__FsTraceEntry *ents[1] = { &ent };
		char input[32];
		uint8_t hash[32];

		snprintf(input, sizeof(input), "step %d", i);
		st.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
		st.input = input;
		st.stdout.data = (uint8_t *)"out";
		st.stdout.len = 3;
		st.started_ms = 1000 + (uint64_t)i;
		st.ended_ms = 1001 + (uint64_t)i;
		if (i == n) {
			memset(hash, 0xab, sizeof(hash));
			ent.path = (char *)"/w/last";
			ent.change = MOAT__V1__FS_CHANGE__FS_CHANGE_CREATED;
			ent.sha256.data = hash;
			ent.sha256.len = sizeof(hash);
			st.fs_trace = ents;
			st.n_fs_trace = 1;
		}
		areq.tenant = (char *)tenant;
		areq.session_id = id;
		areq.step = &st;
		assert_int_equal(moat_rpc_call(E.sessiond, SS, "AppendStep",
		                     &areq.base,
		                     &moat__v1__append_step_reply__descriptor,
		                     &reply, NULL, &errmsg),
		    MOAT_OK);
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	return id;
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL, *snapd, *survey;
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", E.dir,
		NULL };
	int rv = MOAT_UNAVAILABLE;

	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_ERROR);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-diffc-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	argv[2] = E.dir;
	E.listen_url = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	E.sessiond_url = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	snapd = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	survey = moat_asprintf("ipc://%s/survey.sock", E.dir);
	if ((E.sessiond_pid = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(E.sessiond_pid > 0);
	opts.listen_url = E.listen_url;
	opts.survey_url = survey;
	opts.sessiond_url = E.sessiond_url;
	opts.snapd_url = snapd;
	opts.state_dir = E.dir;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(snapd);
	free(survey);
	assert_int_equal(moat_rpc_client_open(&E.client, E.listen_url,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_rpc_client_open(&E.sessiond, E.sessiond_url,
	                     &errmsg),
	    MOAT_OK);
	for (int i = 0; i < 200 && rv != MOAT_OK; i++) {
		struct moat_rpc_opts o = { .timeout_ms = 500 };

		rv = moat_rpc_call(E.sessiond, SS, "Health", &hreq.base,
		    &moat__v1__health_reply__descriptor, &reply, &o, &errmsg);
		free(errmsg);
		errmsg = NULL;
		protobuf_c_message_free_unpacked(reply, NULL);
		reply = NULL;
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	assert_int_equal(rv, MOAT_OK);
	E.long_id = new_session(MOAT_GW_DEFAULT_TENANT, LONG_STEPS);
	E.short_id = new_session(MOAT_GW_DEFAULT_TENANT, 2);
	E.other_id = new_session("other-tenant", 2);
	return 0;
}

static void
stop_sessiond(void)
{
	int status;

	if (E.sessiond_pid > 0) {
		kill(E.sessiond_pid, SIGTERM);
		waitpid(E.sessiond_pid, &status, 0);
		E.sessiond_pid = 0;
	}
}

static int
teardown(void **state)
{
	moat_rpc_client_close(E.client);
	moat_rpc_client_close(E.sessiond);
	moat_gateway_stop(E.gw);
	stop_sessiond();
	moat_rm_rf(E.dir);
	free(E.listen_url);
	free(E.sessiond_url);
	free(E.long_id);
	free(E.short_id);
	free(E.other_id);
	return 0;
}

static int
diff(const char *a, const char *b, Moat__V1__DiffReply **out, char **errmsg)
{
	Moat__V1__DiffRequest req = MOAT__V1__DIFF_REQUEST__INIT;

	req.session_a = (char *)a;
	req.session_b = (char *)b;
	*errmsg = NULL;
	return moat_rpc_call(E.client, GW, "Diff", &req.base,
	    &moat__v1__diff_reply__descriptor, (ProtobufCMessage **)out, NULL,
	    errmsg);
}

static int
compare(char **ids, size_t n, Moat__V1__CompareReply **out, char **errmsg)
{
	Moat__V1__CompareRequest req = MOAT__V1__COMPARE_REQUEST__INIT;

	req.session_ids = ids;
	req.n_session_ids = n;
	*errmsg = NULL;
	return moat_rpc_call(E.client, GW, "Compare", &req.base,
	    &moat__v1__compare_reply__descriptor, (ProtobufCMessage **)out,
	    NULL, errmsg);
}

/* A session longer than a page is read whole; the short one parts from
 * it at step 2 (its last step created /w/last there). */
static void
test_diff_pages_and_divergence(void **state)
{
	Moat__V1__DiffReply *r = NULL;
	char *errmsg = NULL;

	assert_int_equal(diff(E.long_id, E.short_id, &r, &errmsg), MOAT_OK);
	assert_int_equal(r->steps_a, LONG_STEPS);
	assert_int_equal(r->steps_b, 2);
	assert_int_equal(r->n_steps, LONG_STEPS);
	assert_int_equal(r->first_divergent_step, 2);
	assert_true(r->steps[0]->same);
	assert_int_equal(r->steps[1]->n_files, 1);
	assert_string_equal(r->steps[1]->files[0]->change_b, "created");
	assert_true(r->steps[LONG_STEPS - 1]->in_a);
	assert_false(r->steps[LONG_STEPS - 1]->in_b);
	/* net: both created /w/last, same hash: no difference */
	assert_int_equal(r->n_files, 0);
	protobuf_c_message_free_unpacked(&r->base, NULL);

	assert_int_equal(diff(E.short_id, E.short_id, &r, &errmsg), MOAT_OK);
	assert_int_equal(r->first_divergent_step, 0);
	protobuf_c_message_free_unpacked(&r->base, NULL);
}

/* Unknown sessions and other tenants' do not exist for the caller. */
static void
test_diff_not_found(void **state)
{
	Moat__V1__DiffReply *r = NULL;
	char *errmsg = NULL;

	assert_int_equal(diff(E.short_id, "ses-0000000000000000", &r, &errmsg),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(errmsg, "ses-0000000000000000"));
	free(errmsg);
	assert_int_equal(diff(E.other_id, E.short_id, &r, &errmsg),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(errmsg, E.other_id));
	free(errmsg);
	assert_int_equal(diff("", E.short_id, &r, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
}

static void
test_compare_calls(void **state)
{
	Moat__V1__CompareReply *r = NULL;
	char *errmsg = NULL;
	char *ids[33];

	ids[0] = E.long_id;
	ids[1] = E.short_id;
	assert_int_equal(compare(ids, 2, &r, &errmsg), MOAT_OK);
	assert_int_equal(r->n_sessions, 2);
	/* both end well; the short one took less time */
	assert_string_equal(r->sessions[0]->session_id, E.short_id);
	assert_int_equal(r->sessions[0]->rank, 1);
	assert_int_equal(r->sessions[1]->steps, LONG_STEPS);
	assert_string_equal(r->sessions[1]->sandbox_id, "sb-test");
	protobuf_c_message_free_unpacked(&r->base, NULL);

	assert_int_equal(compare(ids, 1, &r, &errmsg), MOAT_INVALID_ARGUMENT);
	free(errmsg);
	for (int i = 0; i < 33; i++)
		ids[i] = E.short_id;
	assert_int_equal(compare(ids, 33, &r, &errmsg), MOAT_INVALID_ARGUMENT);
	free(errmsg);
	assert_int_equal(compare(ids, 32, &r, &errmsg), MOAT_OK);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	ids[1] = E.other_id;
	assert_int_equal(compare(ids, 2, &r, &errmsg), MOAT_NOT_FOUND);
	assert_non_null(strstr(errmsg, E.other_id));
	free(errmsg);
}

/* Last: sessiond goes away. */
static void
test_sessiond_down(void **state)
{
	Moat__V1__DiffReply *r = NULL;
	Moat__V1__CompareReply *c = NULL;
	char *errmsg = NULL;
	char *ids[2] = { E.short_id, E.long_id };

	stop_sessiond();
	assert_int_equal(diff(E.short_id, E.long_id, &r, &errmsg),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(errmsg, "moat-sessiond"));
	free(errmsg);
	assert_int_equal(compare(ids, 2, &c, &errmsg), MOAT_UNAVAILABLE);
	assert_non_null(strstr(errmsg, E.sessiond_url));
	free(errmsg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_diff_pages_and_divergence),
		cmocka_unit_test(test_diff_not_found),
		cmocka_unit_test(test_compare_calls),
		cmocka_unit_test(test_sessiond_down),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
