/*
 * test_record_async.c: recorded steps hold no gateway RPC worker (issue
 * 15, part 7). A real gateway with 4 workers in front of the fake node
 * and a real moat-sessiond: 12 recorded Execs on 3 recorded sandboxes,
 * which the node holds until the test releases them (argv {"hold", N}),
 * do not stop the gateway from answering GetSandbox while they wait;
 * each sandbox's steps run one at a time, in the order they came, and
 * land as consecutive steps of its session with the reply saying which.
 * A gateway that stops while a step runs and another waits for its turn
 * records the first and fails the second without running it.
 * Not for: what a step records (test_forward.c, test_snapshots.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "fake_node.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define GW "moat.v1.Gateway"
#define WORKERS 4   /* the gateway's RPC workers */
#define N_SANDBOX 3 /* recorded sandboxes */
#define N_STEP 4    /* held Execs per sandbox: 12 > WORKERS */

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_gateway *gw;
	struct moat_rpc_client *client;
	struct fake_node a;
	pid_t sessiond;
};

static struct env E;

/* One Exec sent without waiting, and what came back. */
struct exec_call {
	pthread_mutex_t *lock;
	pthread_cond_t *cond;
	int *done;
	int code;
	int exit_code;
	uint32_t step_index;
	char session_id[64];
	char recording_error[256];
	char safety[32];
};

static void
exec_done(void *arg, int code, uint8_t *payload, size_t len, char *errmsg)
{
	struct exec_call *c = arg;
	Moat__V1__ExecResult *r = NULL;

	c->code = code;
	if (code == MOAT_OK &&
	    (r = moat__v1__exec_result__unpack(NULL, len, payload)) != NULL) {
		c->exit_code = r->status != NULL ? r->status->exit_code : -1;
		c->step_index = r->step_index;
		snprintf(c->session_id, sizeof(c->session_id), "%s",
		    r->session_id);
		snprintf(c->recording_error, sizeof(c->recording_error), "%s",
		    r->recording_error);
		snprintf(c->safety, sizeof(c->safety), "%s", r->safety);
		moat__v1__exec_result__free_unpacked(r, NULL);
	}
	free(payload);
	free(errmsg);
	pthread_mutex_lock(c->lock);
	(*c->done)++;
	pthread_cond_broadcast(c->cond);
	pthread_mutex_unlock(c->lock);
}

/* exec_send: Exec of argv {word0, word1} on `sandbox_id`, without
 * waiting; `c` gets the outcome. */
static void
exec_send(const char *sandbox_id, const char *word0, const char *word1,
    uint32_t timeout_ms, struct exec_call *c)
{
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = timeout_ms };
	char *argv[2] = { (char *)word0, (char *)word1 };
	uint8_t payload[512];
	char *errmsg = NULL;
	size_t n;

	ex.sandbox_id = (char *)sandbox_id;
	ex.argv = argv;
	ex.n_argv = 2;
	n = moat__v1__exec_request__pack(&ex, payload);
	c->code = -1;
	c->exit_code = -1;
	assert_int_equal(moat_rpc_call_raw_async(E.client, GW, "Exec", payload,
	                     n, &opts, exec_done, c, &errmsg),
	    MOAT_OK);
}

static int
gw_call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
    uint32_t timeout_ms, char **errmsg)
{
	struct moat_rpc_opts opts = { .timeout_ms = timeout_ms };

	*reply = NULL;
	*errmsg = NULL;
	return moat_rpc_call(E.client, GW, method, req, desc, reply, &opts,
	    errmsg);
}

/* wait_until: polls `cond` for up to 30 s. */
#define wait_until(cond)                                                      \
	do {                                                                  \
		for (int w_ = 0; w_ < 1500 && !(cond); w_++)                  \
			nng_msleep(20);                                       \
		if (!(cond))                                                  \
			fail_msg("timed out waiting: %s", #cond);             \
	} while (0)

static int
available_nodes(void)
{
	Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int count = 0;

	if (gw_call("ListNodes", &req.base, &moat__v1__node_list__descriptor,
	        &reply, 5000, &errmsg) != MOAT_OK) {
		free(errmsg);
		return -1;
	}
	for (size_t i = 0; i < ((Moat__V1__NodeList *)reply)->n_nodes; i++)
		if (((Moat__V1__NodeList *)reply)->nodes[i]->available)
			count++;
	protobuf_c_message_free_unpacked(reply, NULL);
	return count;
}

static bool
sessiond_answers(void)
{
	Moat__V1__ListSessionsRequest req =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int rv = gw_call("ListSessions", &req.base,
	    &moat__v1__list_sessions_reply__descriptor, &reply, 2000, &errmsg);

	free(errmsg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv == MOAT_OK;
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", NULL,
		NULL };
	char *errmsg = NULL, *sessiond, *snapd;

	(void)state;
	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-recasync-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	E.survey_url = moat_asprintf("ipc://%s/survey.sock", E.dir);
	E.listen_url = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	sessiond = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	snapd = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	opts.listen_url = E.listen_url;
	opts.survey_url = E.survey_url;
	opts.sessiond_url = sessiond;
	opts.snapd_url = snapd;
	opts.state_dir = E.dir;
	opts.survey_interval_ms = 100;
	opts.workers = WORKERS;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(sessiond);
	free(snapd);
	assert_int_equal(moat_rpc_client_open(&E.client, E.listen_url,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	wait_until(available_nodes() == 1);
	argv[2] = E.dir;
	if ((E.sessiond = fork()) == 0) {
		/* It ends with the test, even one that crashed, and holds
		 * none of ctest's pipes. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (freopen("/dev/null", "w", stderr) == NULL ||
		    freopen("/dev/null", "w", stdout) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(E.sessiond > 0);
	wait_until(sessiond_answers());
	return 0;
}

static int
teardown(void **state)
{
	int status;

	(void)state;
	moat_rpc_client_close(E.client);
	fake_node_halt(&E.a);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	kill(E.sessiond, SIGTERM);
	waitpid(E.sessiond, &status, 0);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	return 0;
}

/* create_recorded: a recorded sandbox (`policy`); its id and session. */
static void
create_recorded(Moat__V1__SnapshotPolicy policy, char **id, char **session)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;

	creq.record = true;
	creq.snapshot_policy = policy;
	if (gw_call("CreateSandbox", &creq.base,
	        &moat__v1__sandbox__descriptor, &reply, 20000,
	        &errmsg) != MOAT_OK)
		fail_msg("CreateSandbox: %s", errmsg);
	*id = strdup(((Moat__V1__Sandbox *)reply)->id);
	*session = strdup(((Moat__V1__Sandbox *)reply)->session_id);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_int_equal(strncmp(*session, "ses-", 4), 0);
}

/* list_steps: the steps of `session` through the gateway (caller
 * frees). */
static Moat__V1__ListStepsReply *
list_steps(const char *session)
{
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;

	lreq.session_id = (char *)session;
	if (gw_call("ListSteps", &lreq.base,
	        &moat__v1__list_steps_reply__descriptor, &reply, 20000,
	        &errmsg) != MOAT_OK)
		fail_msg("ListSteps: %s", errmsg);
	return (Moat__V1__ListStepsReply *)reply;
}

static int
done_count(pthread_mutex_t *lock, int *done)
{
	int n;

	pthread_mutex_lock(lock);
	n = *done;
	pthread_mutex_unlock(lock);
	return n;
}

/* send_rounds: step k of every sandbox, round after round; a round is
 * sent once the previous one is at the node (round 0) or waiting for
 * its sandbox's turn, so each sandbox's steps arrive in order. */
static void
send_rounds(char *ids[N_SANDBOX], struct exec_call calls[N_SANDBOX][N_STEP])
{
	size_t waiting0 = moat_record_steps_waiting();

	for (int k = 0; k < N_STEP; k++) {
		for (int s = 0; s < N_SANDBOX; s++) {
			char word[16];

			snprintf(word, sizeof(word), "%d", 10 * s + k);
			exec_send(ids[s], "hold", word, 60000, &calls[s][k]);
		}
		if (k == 0)
			wait_until(fake_node_held(&E.a) == N_SANDBOX);
		else
			wait_until(moat_record_steps_waiting() ==
			    waiting0 + (size_t)(N_SANDBOX * k));
	}
}

/* check_sandbox: sandbox s's steps came back in order as steps 1..N of
 * its session, and the session lists them so. */
static void
check_sandbox(int s, const char *session, struct exec_call *calls)
{
	Moat__V1__ListStepsReply *steps;

	for (int k = 0; k < N_STEP; k++) {
		assert_int_equal(calls[k].code, MOAT_OK);
		assert_int_equal(calls[k].exit_code, 10 * s + k);
		assert_int_equal(calls[k].step_index, k + 1);
		assert_string_equal(calls[k].session_id, session);
		assert_string_equal(calls[k].recording_error, "");
		assert_true(calls[k].safety[0] != '\0');
	}
	steps = list_steps(session);
	assert_int_equal(steps->n_steps, N_STEP);
	for (int k = 0; k < N_STEP; k++) {
		char input[32];

		snprintf(input, sizeof(input), "hold %d", 10 * s + k);
		assert_int_equal(steps->steps[k]->index, k + 1);
		assert_int_equal(steps->steps[k]->exit_code, 10 * s + k);
		assert_string_equal(steps->steps[k]->input, input);
	}
	moat__v1__list_steps_reply__free_unpacked(steps, NULL);
}

/* 12 recorded Execs the node holds, on a gateway of 4 workers: GetSandbox
 * is answered while they all wait; then each sandbox's steps complete
 * one by one, in order, as consecutive steps of its session. */
static void
test_recorded_steps_hold_no_worker(void **state)
{
	static struct exec_call calls[N_SANDBOX][N_STEP];
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	char *ids[N_SANDBOX], *sessions[N_SANDBOX], *errmsg = NULL;
	ProtobufCMessage *reply = NULL;
	int done = 0;

	(void)state;
	for (int s = 0; s < N_SANDBOX; s++)
		create_recorded(s == 0 ?
		        MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY :
		        MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_MANUAL,
		    &ids[s], &sessions[s]);
	for (int s = 0; s < N_SANDBOX; s++)
		for (int k = 0; k < N_STEP; k++)
			calls[s][k] = (struct exec_call){ .lock = &lock,
				.cond = &cond,
				.done = &done };
	send_rounds(ids, calls);

	/* Every step waits (one per sandbox at the node), more than the
	 * gateway has workers: it still answers. */
	ref.sandbox_id = ids[0];
	if (gw_call("GetSandbox", &ref.base, &moat__v1__sandbox__descriptor,
	        &reply, 5000, &errmsg) != MOAT_OK)
		fail_msg("GetSandbox while steps wait: %s", errmsg);
	assert_string_equal(((Moat__V1__Sandbox *)reply)->session_id,
	    sessions[0]);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_int_equal(done_count(&lock, &done), 0);
	assert_int_equal(fake_node_held(&E.a), N_SANDBOX);

	/* Each release answers the step of every sandbox at the node; the
	 * next of each then reaches it. */
	for (int round = 0; round < N_STEP; round++) {
		int want = N_SANDBOX * (round + 1);

		wait_until(fake_node_held(&E.a) == N_SANDBOX);
		fake_node_release_held(&E.a);
		wait_until(done_count(&lock, &done) == want);
	}
	assert_int_equal(moat_record_steps_waiting(), 0);
	for (int s = 0; s < N_SANDBOX; s++) {
		check_sandbox(s, sessions[s], calls[s]);
		free(ids[s]);
		free(sessions[s]);
	}
}

static void *
stop_gateway(void *arg)
{
	moat_gateway_stop(arg);
	return NULL;
}

/* The gateway stops while a step is at the node and another waits for
 * its turn: the first is recorded (sessiond has it), the second fails
 * without reaching the node, and the stop returns (no step left). */
static void
test_stop_with_steps_waiting(void **state)
{
	static struct exec_call calls[2];
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	Moat__V1__Empty hreq = MOAT__V1__EMPTY__INIT;
	ProtobufCMessage *reply = NULL;
	char *id, *session, *errmsg = NULL;
	size_t waiting0 = moat_record_steps_waiting();
	Moat__V1__ListStepsReply *steps;
	int done = 0, execs_before, rv;
	pthread_t stopper;

	(void)state;
	create_recorded(MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_MANUAL, &id,
	    &session);
	for (int i = 0; i < 2; i++)
		calls[i] = (struct exec_call){ .lock = &lock,
			.cond = &cond,
			.done = &done };
	exec_send(id, "hold", "5", 8000, &calls[0]);
	wait_until(fake_node_held(&E.a) == 1);
	exec_send(id, "echo", "second", 8000, &calls[1]);
	wait_until(moat_record_steps_waiting() == waiting0 + 1);
	pthread_mutex_lock(&E.a.lock);
	execs_before = E.a.execs;
	pthread_mutex_unlock(&E.a.lock);

	fake_node_halt(&E.a); /* before any gateway stops (fake_node.h) */
	assert_int_equal(pthread_create(&stopper, NULL, stop_gateway, E.gw),
	    0);
	/* Once the gateway no longer answers, its stop is draining. */
	do {
		rv = gw_call("Health", &hreq.base,
		    &moat__v1__health_reply__descriptor, &reply, 200, &errmsg);
		free(errmsg);
		if (reply != NULL)
			protobuf_c_message_free_unpacked(reply, NULL);
	} while (rv == MOAT_OK);
	nng_msleep(200);
	fake_node_release_held(&E.a);
	assert_int_equal(pthread_join(stopper, NULL), 0);
	E.gw = NULL;
	assert_int_equal(moat_record_steps_waiting(), waiting0);
	/* The second never reached the node. */
	pthread_mutex_lock(&E.a.lock);
	assert_int_equal(E.a.execs, execs_before);
	pthread_mutex_unlock(&E.a.lock);
	/* Neither reply came (the gateway stopped): both time out. */
	wait_until(done_count(&lock, &done) == 2);
	assert_int_not_equal(calls[0].code, MOAT_OK);
	assert_int_not_equal(calls[1].code, MOAT_OK);

	/* What sessiond holds, asked through a gateway of its own. */
	{
		struct moat_gateway_opts opts = { 0 };
		char *listen = moat_asprintf("ipc://%s/gw2.sock", E.dir);
		char *survey = moat_asprintf("ipc://%s/survey2.sock", E.dir);
		char *sessiond =
		    moat_asprintf("ipc://%s/sessiond.sock", E.dir);
		char *snapd = moat_asprintf("ipc://%s/snapd.sock", E.dir);

		opts.listen_url = listen;
		opts.survey_url = survey;
		opts.sessiond_url = sessiond;
		opts.snapd_url = snapd;
		opts.state_dir = E.dir;
		if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
			fail_msg("gateway: %s", errmsg);
		moat_rpc_client_close(E.client);
		assert_int_equal(moat_rpc_client_open(&E.client, listen,
		                     &errmsg),
		    MOAT_OK);
		free(listen);
		free(survey);
		free(sessiond);
		free(snapd);
	}
	steps = list_steps(session);
	assert_int_equal(steps->n_steps, 1);
	assert_string_equal(steps->steps[0]->input, "hold 5");
	assert_int_equal(steps->steps[0]->exit_code, 5);
	moat__v1__list_steps_reply__free_unpacked(steps, NULL);
	free(id);
	free(session);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_recorded_steps_hold_no_worker),
		cmocka_unit_test(test_stop_with_steps_waiting),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
