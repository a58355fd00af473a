/*
 * test_forward.c: a real gateway in-process (discovery, placement,
 * forwarding, the Gateway RPC server) in front of fake vmd nodes, called
 * through the RPC client as the CLI would: a create lands on a node and
 * later calls follow it there with the client's request id; the tenant is
 * the gateway's; unknown sandboxes are NOT_FOUND; sandboxes the gateway
 * never saw are found by asking; a node's own error passes unchanged; a
 * node that dies gives UNAVAILABLE naming node and sandbox; lists merge;
 * with moat-sessiond down a recorded sandbox is refused (and not left
 * behind) and session calls are UNAVAILABLE naming sessiond; with a real
 * sessiond each Exec of a recorded sandbox becomes the next step, so
 * does a started command when it ends (a pty one a shell step), and a
 * fork reports each copy on its own and shares one fs trace.
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

#include "fake_node.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define GW "moat.v1.Gateway"

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_gateway *gw;
	struct moat_rpc_client *client;
	struct fake_node a, b;
	bool b_started;
};

static struct env E;

static int
available_nodes(void)
{
	Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int count = 0;

	if (moat_rpc_call(E.client, GW, "ListNodes", &req.base,
	        &moat__v1__node_list__descriptor, &reply, NULL,
	        &errmsg) != MOAT_OK) {
		free(errmsg);
		return -1;
	}
	for (size_t i = 0; i < ((Moat__V1__NodeList *)reply)->n_nodes; i++)
		if (((Moat__V1__NodeList *)reply)->nodes[i]->available)
			count++;
	protobuf_c_message_free_unpacked(reply, NULL);
	return count;
}

/* wait_node_count: until the gateway's view of `id` (from its surveys)
 * reports `sandboxes`, so placement decides on fresh numbers. */
static void
wait_node_count(const char *id, uint32_t sandboxes)
{
	for (int i = 0; i < 300; i++) {
		Moat__V1__Empty req = MOAT__V1__EMPTY__INIT;
		Moat__V1__NodeList *list;
		ProtobufCMessage *reply = NULL;
		char *errmsg = NULL;
		bool fresh = false;

		if (moat_rpc_call(E.client, GW, "ListNodes", &req.base,
		        &moat__v1__node_list__descriptor, &reply, NULL,
		        &errmsg) == MOAT_OK) {
			list = (Moat__V1__NodeList *)reply;
			for (size_t j = 0; j < list->n_nodes; j++)
				if (strcmp(list->nodes[j]->node_id, id) == 0 &&
				    list->nodes[j]->sandboxes == sandboxes)
					fresh = true;
			protobuf_c_message_free_unpacked(reply, NULL);
		} else
			free(errmsg);
		if (fresh)
			return;
		nng_msleep(20);
	}
	fail_msg("the gateway never saw %u sandbox(es) on %s", sandboxes, id);
}

static void
wait_nodes(int want)
{
	for (int i = 0; i < 300; i++) {
		if (available_nodes() == want)
			return;
		nng_msleep(20);
	}
	fail_msg("the gateway never saw %d available node(s)", want);
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL;
	char *sessiond, *snapd;

	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-fwd-XXXXXX");
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
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(sessiond);
	free(snapd);
	assert_int_equal(moat_rpc_client_open(&E.client, E.listen_url,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	wait_nodes(1);
	return 0;
}

static int
teardown(void **state)
{
	moat_rpc_client_close(E.client);
	fake_node_halt(&E.a);
	if (E.b_started)
		fake_node_halt(&E.b);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	if (E.b_started)
		fake_node_stop(&E.b);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	return 0;
}

static int
create(uint64_t request_id, const char *tenant, char **id, char **errmsg)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	struct moat_rpc_opts opts = { .request_id = request_id };
	ProtobufCMessage *reply = NULL;
	int rv;

	req.tenant = (char *)tenant;
	rv = moat_rpc_call(E.client, GW, "CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, &reply, &opts, errmsg);
	if (rv == MOAT_OK) {
		*id = strdup(((Moat__V1__Sandbox *)reply)->id);
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	return rv;
}

static int
sandbox_call(const char *method, const char *sandbox_id, uint64_t rid,
    const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **reply,
    char **errmsg)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest exec = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__PathRequest path = MOAT__V1__PATH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .request_id = rid };
	const ProtobufCMessage *req = &ref.base;

	ref.sandbox_id = (char *)sandbox_id;
	exec.sandbox_id = (char *)sandbox_id;
	path.sandbox_id = (char *)sandbox_id;
	path.path = (char *)"/etc/shadow";
	if (strcmp(method, "ExecStart") == 0)
		req = &exec.base;
	else if (strcmp(method, "StatFile") == 0)
		req = &path.base;
	*reply = NULL;
	return moat_rpc_call(E.client, GW, method, req, reply_desc, reply,
	    &opts, errmsg);
}

/* Every call the gateway made to a node named its tenant in the
 * envelope (the fake node, as vmd, refuses one that does not). */
static void
assert_all_tenanted(void)
{
	assert_int_equal(E.a.untenanted, 0);
	if (E.b_started)
		assert_int_equal(E.b.untenanted, 0);
}

static void
test_create_routes_to_node(void **state)
{
	ProtobufCMessage *reply = NULL;
	char *id = NULL, *errmsg = NULL;

	assert_int_equal(create(0xabc123, "evil-tenant", &id, &errmsg),
	    MOAT_OK);
	assert_string_equal(id, "node-a-sb-0");
	/* The node saw the client's request id and the gateway's tenant. */
	assert_int_equal(E.a.last_request_id, 0xabc123);
	assert_string_equal(E.a.last_method, "CreateSandbox");
	assert_string_equal(E.a.last_tenant, "default");
	/* ... in the request and in the envelope: without API keys every
	 * caller is tenant "default". */
	assert_string_equal(E.a.last_call_tenant, "default");

	assert_int_equal(sandbox_call("ExecStart", id, 0x5eed,
	                     &moat__v1__exec_handle__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(((Moat__V1__ExecHandle *)reply)->exec_id, 7);
	assert_string_equal(((Moat__V1__ExecHandle *)reply)->sandbox_id, id);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_int_equal(E.a.last_request_id, 0x5eed);
	assert_string_equal(E.a.last_method, "ExecStart");
	assert_string_equal(E.a.last_sandbox, id);
	assert_string_equal(E.a.last_call_tenant, "default");

	/* Destroy, then the sandbox is gone everywhere. */
	assert_int_equal(sandbox_call("DestroySandbox", id, 0xd1e,
	                     &moat__v1__empty__descriptor, &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_int_equal(E.a.last_request_id, 0xd1e);
	assert_int_equal(sandbox_call("GetSandbox", id, 0,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_NOT_FOUND);
	free(errmsg);
	free(id);
	assert_all_tenanted();
}

static void
test_repeated_request_id_runs_once(void **state)
{
	char *id1 = NULL, *id2 = NULL, *errmsg = NULL;
	int calls;

	assert_int_equal(create(0x77, "", &id1, &errmsg), MOAT_OK);
	calls = E.a.calls;
	/* A client retrying with the same id gets the same sandbox. */
	assert_int_equal(create(0x77, "", &id2, &errmsg), MOAT_OK);
	assert_string_equal(id1, id2);
	assert_int_equal(E.a.calls, calls);
	free(id1);
	free(id2);
}

static void
test_unknown_sandbox_not_found(void **state)
{
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;

	assert_int_equal(sandbox_call("GetSandbox", "no-such-sandbox", 0,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_NOT_FOUND);
	assert_null(reply);
	assert_non_null(strstr(errmsg, "no-such-sandbox"));
	assert_non_null(strstr(errmsg, "moat sandbox ls"));
	free(errmsg);
	assert_int_equal(sandbox_call("ExecStart", "", 0,
	                     &moat__v1__exec_handle__descriptor, &reply,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
}

static void
test_node_error_passes_unchanged(void **state)
{
	ProtobufCMessage *reply = NULL;
	char *id = NULL, *errmsg = NULL;

	assert_int_equal(create(0, "", &id, &errmsg), MOAT_OK);
	assert_int_equal(sandbox_call("StatFile", id, 0,
	                     &moat__v1__file_info__descriptor, &reply,
	                     &errmsg),
	    MOAT_PERMISSION_DENIED);
	assert_non_null(strstr(errmsg, "fake node node-a says: no peeking"));
	free(errmsg);
	free(id);
}

static void
test_two_nodes_placement_lookup_and_list(void **state)
{
	Moat__V1__ListSandboxesRequest lreq =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	Moat__V1__SandboxList *list;
	char *id = NULL, *errmsg = NULL;
	bool saw_a = false, saw_b = false, saw_hidden = false;

	assert_int_equal(fake_node_start(&E.b, "node-b", E.dir, E.survey_url),
	    0);
	E.b_started = true;
	wait_nodes(2);
	/* node-a holds sandboxes from the earlier tests (or none if run
	 * alone); b holds none: b gets the next one. */
	if (E.a.n_sandboxes > 0) {
		wait_node_count("node-a", (uint32_t)E.a.n_sandboxes);
		wait_node_count("node-b", 0);
		assert_int_equal(create(0, "", &id, &errmsg), MOAT_OK);
		assert_string_equal(id, "node-b-sb-0");
		assert_string_equal(E.b.last_method, "CreateSandbox");
		free(id);
	}

	/* A sandbox the gateway never saw created is found by asking. */
	fake_node_add_sandbox(&E.b, "hidden-1");
	assert_int_equal(sandbox_call("ExecStart", "hidden-1", 0x99,
	                     &moat__v1__exec_handle__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_string_equal(E.b.last_method, "ExecStart");
	assert_int_equal(E.b.last_request_id, 0x99);

	assert_int_equal(moat_rpc_call(E.client, GW, "ListSandboxes",
	                     &lreq.base, &moat__v1__sandbox_list__descriptor,
	                     &reply, NULL, &errmsg),
	    MOAT_OK);
	list = (Moat__V1__SandboxList *)reply;
	for (size_t i = 0; i < list->n_sandboxes; i++) {
		if (strcmp(list->sandboxes[i]->node_id, "node-a") == 0)
			saw_a = true;
		if (strcmp(list->sandboxes[i]->node_id, "node-b") == 0)
			saw_b = true;
		if (strcmp(list->sandboxes[i]->id, "hidden-1") == 0)
			saw_hidden = true;
		assert_string_equal(list->sandboxes[i]->tenant, "default");
	}
	assert_true(saw_b && saw_hidden);
	assert_true(saw_a || E.a.n_sandboxes == 0);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_all_tenanted();
}

static void
test_dead_node_unavailable(void **state)
{
	ProtobufCMessage *reply = NULL;
	char *id = NULL, *errmsg = NULL;
	int rv;

	struct fake_node *holder;

	assert_int_equal(create(0, "", &id, &errmsg), MOAT_OK);
	holder = strncmp(id, "node-a", 6) == 0 ? &E.a : &E.b;
	assert_non_null(strstr(id, holder->id));
	/* The node's RPC dies; its respondent still answers surveys, so
	 * the gateway still thinks it is up and must find out by calling. */
	fake_node_kill_rpc(holder);
	rv = sandbox_call("ExecStart", id, 0,
	    &moat__v1__exec_handle__descriptor, &reply, &errmsg);
	assert_int_equal(rv, MOAT_UNAVAILABLE);
	assert_non_null(strstr(errmsg, holder->id));
	assert_non_null(strstr(errmsg, id));
	free(errmsg);
	free(id);
}

static void
test_health_and_info(void **state)
{
	Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
	Moat__V1__Empty empty = MOAT__V1__EMPTY__INIT;
	ProtobufCMessage *reply = NULL;
	Moat__V1__ClusterInfo *info;
	char *errmsg = NULL;
	bool vmd_up = false, sessiond_down = false;

	assert_int_equal(moat_rpc_call(E.client, GW, "Health", &hreq.base,
	                     &moat__v1__health_reply__descriptor, &reply, NULL,
	                     &errmsg),
	    MOAT_OK);
	assert_string_equal(((Moat__V1__HealthReply *)reply)->service,
	    "moat-gateway");
	protobuf_c_message_free_unpacked(reply, NULL);

	assert_int_equal(moat_rpc_call(E.client, GW, "Info", &empty.base,
	                     &moat__v1__cluster_info__descriptor, &reply, NULL,
	                     &errmsg),
	    MOAT_OK);
	info = (Moat__V1__ClusterInfo *)reply;
	assert_true(info->n_nodes >= 1);
	for (size_t i = 0; i < info->n_services; i++) {
		Moat__V1__ServiceHealth *s = info->services[i];
		if (strcmp(s->service, "moat-vmd node-a") == 0 && s->up &&
		    strcmp(s->version, "9.9.9") == 0)
			vmd_up = true;
		if (strcmp(s->service, "moat-sessiond") == 0 && !s->up &&
		    strstr(s->message, "UNAVAILABLE") != NULL)
			sessiond_down = true;
	}
	assert_true(vmd_up);
	assert_true(sessiond_down);
	protobuf_c_message_free_unpacked(reply, NULL);
}

/* Recording with moat-sessiond down: a recorded sandbox cannot be made
 * (UNAVAILABLE naming sessiond, and the node's sandbox is destroyed
 * again); session calls are UNAVAILABLE naming sessiond; an unrecorded
 * sandbox's calls are untouched. */
static void
test_record_without_sessiond(void **state)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ListSessionsRequest lreq =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 20000 };
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int before, after, rv;

	pthread_mutex_lock(&E.a.lock);
	before = E.a.n_sandboxes;
	pthread_mutex_unlock(&E.a.lock);
	req.record = true;
	rv = moat_rpc_call(E.client, GW, "CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, &reply, &opts, &errmsg);
	assert_int_equal(rv, MOAT_UNAVAILABLE);
	assert_null(reply);
	assert_non_null(errmsg);
	assert_non_null(strstr(errmsg, "moat-sessiond"));
	free(errmsg);
	errmsg = NULL;
	pthread_mutex_lock(&E.a.lock);
	after = E.a.n_sandboxes;
	pthread_mutex_unlock(&E.a.lock);
	assert_int_equal(after, before);

	rv = moat_rpc_call(E.client, GW, "ListSessions", &lreq.base,
	    &moat__v1__list_sessions_reply__descriptor, &reply, &opts,
	    &errmsg);
	assert_int_equal(rv, MOAT_UNAVAILABLE);
	assert_non_null(strstr(errmsg, "moat-sessiond"));
	free(errmsg);
}

/* gw_call: one Gateway call with a 20 s timeout. */
static int
gw_call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
    char **errmsg)
{
	struct moat_rpc_opts opts = { .timeout_ms = 20000 };

	*reply = NULL;
	*errmsg = NULL;
	return moat_rpc_call(E.client, GW, method, req, desc, reply, &opts,
	    errmsg);
}

/* sessiond_start: a real moat-sessiond on the url the gateway was given
 * (state in the test's directory), once the gateway reaches it. */
static pid_t
sessiond_start(void)
{
	Moat__V1__ListSessionsRequest sreq =
	    MOAT__V1__LIST_SESSIONS_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", E.dir,
		NULL };
	char *errmsg = NULL;
	int rv = MOAT_UNAVAILABLE;
	pid_t pid;

	if ((pid = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(pid > 0);
	for (int i = 0; i < 100 && rv != MOAT_OK; i++) {
		rv = gw_call("ListSessions", &sreq.base,
		    &moat__v1__list_sessions_reply__descriptor, &reply,
		    &errmsg);
		free(errmsg);
		protobuf_c_message_free_unpacked(reply, NULL);
		reply = NULL;
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	assert_int_equal(rv, MOAT_OK);
	return pid;
}

static void
sessiond_stop(pid_t pid)
{
	int status;

	kill(pid, SIGTERM);
	waitpid(pid, &status, 0);
}

/* Recording with a real moat-sessiond (on the url the gateway was given)
 * and the fake node: the recorded sandbox gets a session, GetSandbox
 * shows it, each Exec becomes the next step (index in the reply, no
 * recording error), the steps are listed through the gateway, an unknown
 * session is NOT_FOUND and a deleted one is gone. */
static void
test_record_with_sessiond(void **state)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__GetSessionRequest greq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__DeleteSessionRequest dreq =
	    MOAT__V1__DELETE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	Moat__V1__ExecResult *res;
	Moat__V1__ListStepsReply *steps;
	char *errmsg = NULL, *sandbox_id, *session_id;
	pid_t pid = sessiond_start();
	int rv;

	creq.record = true;
	assert_int_equal(gw_call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_OK);
	sandbox_id = strdup(((Moat__V1__Sandbox *)reply)->id);
	session_id = strdup(((Moat__V1__Sandbox *)reply)->session_id);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_int_equal(strncmp(session_id, "ses-", 4), 0);

	ref.sandbox_id = sandbox_id;
	assert_int_equal(gw_call("GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_OK);
	assert_string_equal(((Moat__V1__Sandbox *)reply)->session_id,
	    session_id);
	protobuf_c_message_free_unpacked(reply, NULL);

	ex.sandbox_id = sandbox_id;
	ex.shell = (char *)"echo hi > /root/x";
	for (uint32_t i = 1; i <= 2; i++) {
		assert_int_equal(gw_call("Exec", &ex.base,
		                     &moat__v1__exec_result__descriptor,
		                     &reply, &errmsg),
		    MOAT_OK);
		res = (Moat__V1__ExecResult *)reply;
		assert_string_equal(res->recording_error, "");
		assert_int_equal(res->step_index, i);
		assert_string_equal(res->session_id, session_id);
		protobuf_c_message_free_unpacked(reply, NULL);
	}

	lreq.session_id = session_id;
	lreq.tenant = (char *)"someone-else"; /* replaced by the gateway */
	assert_int_equal(gw_call("ListSteps", &lreq.base,
	                     &moat__v1__list_steps_reply__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	steps = (Moat__V1__ListStepsReply *)reply;
	assert_int_equal(steps->n_steps, 2);
	assert_int_equal(steps->steps[1]->index, 2);
	assert_int_equal(steps->steps[1]->kind,
	    MOAT__V1__STEP_KIND__STEP_KIND_EXEC);
	assert_string_equal(steps->steps[1]->input, "echo hi > /root/x");
	protobuf_c_message_free_unpacked(reply, NULL);

	greq.session_id = (char *)"ses-0000000000000000";
	rv = gw_call("GetSession", &greq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	assert_int_equal(rv, MOAT_NOT_FOUND);
	free(errmsg);

	dreq.session_id = session_id;
	assert_int_equal(gw_call("DeleteSession", &dreq.base,
	                     &moat__v1__delete_session_reply__descriptor,
	                     &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	greq.session_id = session_id;
	rv = gw_call("GetSession", &greq.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	assert_int_equal(rv, MOAT_NOT_FOUND);
	free(errmsg);

	assert_int_equal(gw_call("DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	sessiond_stop(pid);
	free(sandbox_id);
	free(session_id);
	assert_all_tenanted();
}

/* wait_steps: the session's steps (with outputs) once it has `n`; the
 * followers append them from their own threads. */
static Moat__V1__ListStepsReply *
wait_steps(const char *session_id, size_t n)
{
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;

	lreq.session_id = (char *)session_id;
	lreq.include_outputs = true;
	for (int i = 0; i < 3000; i++) {
		assert_int_equal(gw_call("ListSteps", &lreq.base,
		                     &moat__v1__list_steps_reply__descriptor,
		                     &reply, &errmsg),
		    MOAT_OK);
		if (((Moat__V1__ListStepsReply *)reply)->n_steps >= n)
			return (Moat__V1__ListStepsReply *)reply;
		protobuf_c_message_free_unpacked(reply, NULL);
		nng_msleep(10);
	}
	fail_msg("the session never had %zu steps", n);
	return NULL;
}

static void
exec_start(Moat__V1__ExecRequest *ex)
{
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;

	assert_int_equal(gw_call("ExecStart", &ex->base,
	                     &moat__v1__exec_handle__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
}

/* With a real sessiond, commands started on a recorded sandbox become
 * steps when they end: a plain one (the fake node's exec 7: "hello",
 * "oops", exit 3) an exec step with both outputs, a pty one a shell step
 * whose stdout is a cast. Commands that never end (exec 8) leave no
 * step; destroying the sandbox ends their followers (the teardown's
 * drain would wait for one left). */
static void
test_record_started(void **state)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	char *sleep_argv[] = { (char *)"sleep", (char *)"600" };
	ProtobufCMessage *reply = NULL;
	Moat__V1__ListStepsReply *steps;
	Moat__V1__Step *st;
	char *errmsg = NULL, *sandbox_id, *session_id;
	pid_t pid = sessiond_start();

	(void)state;
	creq.record = true;
	assert_int_equal(gw_call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_OK);
	sandbox_id = strdup(((Moat__V1__Sandbox *)reply)->id);
	session_id = strdup(((Moat__V1__Sandbox *)reply)->session_id);
	protobuf_c_message_free_unpacked(reply, NULL);

	ex.sandbox_id = sandbox_id;
	ex.shell = (char *)"echo out; echo err >&2; exit 3";
	exec_start(&ex);
	steps = wait_steps(session_id, 1);
	st = steps->steps[0];
	assert_int_equal(st->kind, MOAT__V1__STEP_KIND__STEP_KIND_EXEC);
	assert_string_equal(st->input, "echo out; echo err >&2; exit 3");
	assert_int_equal(st->exit_code, 3);
	assert_int_equal(st->stdout.len, 6);
	assert_memory_equal(st->stdout.data, "hello\n", 6);
	assert_int_equal(st->stderr.len, 5);
	assert_memory_equal(st->stderr.data, "oops\n", 5);
	protobuf_c_message_free_unpacked(&steps->base, NULL);

	ex.pty = true;
	ex.shell = (char *)"exec /bin/sh -l";
	exec_start(&ex);
	steps = wait_steps(session_id, 2);
	st = steps->steps[1];
	assert_int_equal(st->kind, MOAT__V1__STEP_KIND__STEP_KIND_SHELL);
	assert_int_equal(st->exit_code, 3);
	assert_true(st->stdout.len > 13);
	assert_memory_equal(st->stdout.data, "{\"version\": 2", 13);
	assert_int_equal(st->stderr.len, 0);
	protobuf_c_message_free_unpacked(&steps->base, NULL);

	ex.pty = false;
	ex.shell = (char *)"";
	ex.argv = sleep_argv;
	ex.n_argv = 2;
	/* Not past MOAT_RECORD_FOLLOW_MAX: the fake node answers one call at
	 * a time, and 64 followers' long polls would slow every call. */
	for (int i = 0; i < 3; i++)
		exec_start(&ex);

	ref.sandbox_id = sandbox_id;
	assert_int_equal(gw_call("DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	sessiond_stop(pid);
	free(sandbox_id);
	free(session_id);
}

/* Fork through the fake node with a real sessiond: a session with a
 * snapshot after every step forks into 3 copies while every 2nd restore
 * fails on purpose: the reply says which copy failed and why, the two
 * others run with a branch session each of (session, step 1), and the
 * copies share one fs trace of the restored state (one TraceFs for the
 * whole fork, taken while the other copies restore). */
static void
test_fork_with_sessiond(void **state)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ForkRequest freq = MOAT__V1__FORK_REQUEST__INIT;
	Moat__V1__GetSessionRequest greq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	ProtobufCMessage *reply = NULL;
	Moat__V1__ForkReply *fr;
	Moat__V1__SessionInfo *si;
	char *errmsg = NULL, *sandbox_id, *session_id;
	const char *branch[2] = { NULL, NULL };
	pid_t pid = sessiond_start();
	struct fake_node *node;
	int traces, failed = 0, ok = 0;

	(void)state;
	creq.record = true;
	creq.snapshot_policy =
	    MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY;
	assert_int_equal(gw_call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_OK);
	sandbox_id = strdup(((Moat__V1__Sandbox *)reply)->id);
	session_id = strdup(((Moat__V1__Sandbox *)reply)->session_id);
	/* Placement picks the node (an earlier test left node-b up); the
	 * snapshot and its copies live there. */
	node =
	    strncmp(((Moat__V1__Sandbox *)reply)->node_id, "node-a", 6) == 0 ?
	    &E.a :
	    &E.b;
	protobuf_c_message_free_unpacked(reply, NULL);
	ex.sandbox_id = sandbox_id;
	ex.shell = (char *)"echo hi > /root/x";
	assert_int_equal(gw_call("Exec", &ex.base,
	                     &moat__v1__exec_result__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	assert_string_equal(((Moat__V1__ExecResult *)reply)->recording_error,
	    "");
	protobuf_c_message_free_unpacked(reply, NULL);

	pthread_mutex_lock(&node->lock);
	traces = node->traces;
	node->restores = 0;
	node->fail_restore_every = 2;
	pthread_mutex_unlock(&node->lock);
	freq.session_id = session_id;
	freq.step = 1;
	freq.count = 3;
	assert_int_equal(gw_call("Fork", &freq.base,
	                     &moat__v1__fork_reply__descriptor, &reply,
	                     &errmsg),
	    MOAT_OK);
	fr = (Moat__V1__ForkReply *)reply;
	/* Read under the lock, asserted after it: a failed assertion must
	 * not leave the fake node locked. */
	pthread_mutex_lock(&node->lock);
	node->fail_restore_every = 0;
	traces = node->traces - traces;
	pthread_mutex_unlock(&node->lock);
	assert_int_equal(traces, 1);
	assert_int_equal(fr->n_copies, 3);
	assert_int_equal(fr->succeeded, 2);
	for (size_t i = 0; i < fr->n_copies; i++) {
		Moat__V1__ForkCopy *c = fr->copies[i];

		if (c->code != MOAT__V1__CODE__OK) {
			assert_int_equal(c->code, MOAT_UNAVAILABLE);
			assert_non_null(strstr(c->message, "on purpose"));
			assert_null(c->sandbox);
			failed++;
			continue;
		}
		assert_non_null(c->sandbox);
		assert_int_equal(strncmp(c->session_id, "ses-", 4), 0);
		assert_string_not_equal(c->session_id, session_id);
		assert_string_equal(c->sandbox->session_id, c->session_id);
		branch[ok++] = c->session_id;
	}
	assert_int_equal(failed, 1);
	assert_string_not_equal(branch[0], branch[1]);
	for (int i = 0; i < 2; i++) {
		greq.session_id = (char *)branch[i];
		assert_int_equal(gw_call("GetSession", &greq.base,
		                     &moat__v1__session_info__descriptor,
		                     (ProtobufCMessage **)&si, &errmsg),
		    MOAT_OK);
		assert_string_equal(si->parent_session_id, session_id);
		assert_int_equal(si->parent_step, 1);
		protobuf_c_message_free_unpacked(&si->base, NULL);
	}
	for (size_t i = 0; i < fr->n_copies; i++) {
		if (fr->copies[i]->sandbox == NULL)
			continue;
		ref.sandbox_id = fr->copies[i]->sandbox->id;
		assert_int_equal(gw_call("DestroySandbox", &ref.base,
		                     &moat__v1__empty__descriptor, &reply,
		                     &errmsg),
		    MOAT_OK);
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	protobuf_c_message_free_unpacked(&fr->base, NULL);
	ref.sandbox_id = sandbox_id;
	assert_int_equal(gw_call("DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	sessiond_stop(pid);
	free(sandbox_id);
	free(session_id);
	assert_all_tenanted();
}

/* ---- long execs hold no worker (issue 15, part 7) ---- */

#define N_HELD 100 /* more than the gateway's 64 workers */

struct held_call {
	pthread_mutex_t *lock;
	pthread_cond_t *cond;
	int *done;
	int index;
	int code;
	int exit_code;
	char safety[32];
};

static void
held_done(void *arg, int code, uint8_t *payload, size_t len, char *errmsg)
{
	struct held_call *h = arg;
	Moat__V1__ExecResult *r = NULL;

	h->code = code;
	if (code == MOAT_OK &&
	    (r = moat__v1__exec_result__unpack(NULL, len, payload)) != NULL) {
		h->exit_code = r->status != NULL ? r->status->exit_code : -1;
		snprintf(h->safety, sizeof(h->safety), "%s", r->safety);
		moat__v1__exec_result__free_unpacked(r, NULL);
	}
	free(payload);
	free(errmsg);
	pthread_mutex_lock(h->lock);
	(*h->done)++;
	pthread_cond_broadcast(h->cond);
	pthread_mutex_unlock(h->lock);
}

/* exec_ok_count: the gateway's count of Exec calls answered OK. */
static long
exec_ok_count(void)
{
	const char *key =
	    "moat_gateway_calls_total{method=\"Exec\",code=\"OK\"} ";
	char *text = moat_gateway_metrics(E.gw), *p;
	long n = 0;

	assert_non_null(text);
	if ((p = strstr(text, key)) != NULL)
		n = strtol(p + strlen(key), NULL, 10);
	free(text);
	return n;
}

/* 100 one-shot Execs the node holds (more than the gateway's workers):
 * GetSandbox still answers through the gateway while they wait, and
 * each Exec gets its own reply, with its safety level, once the node
 * answers. */
static void
test_long_exec_holds_no_worker(void **state)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	static struct held_call calls[N_HELD];
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	ProtobufCMessage *reply = NULL;
	struct fake_node *node;
	char *errmsg = NULL, *sandbox_id;
	struct timespec ts;
	int done = 0;
	long exec_ok_before = exec_ok_count();

	(void)state;
	assert_int_equal(gw_call("CreateSandbox", &creq.base,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_OK);
	sandbox_id = strdup(((Moat__V1__Sandbox *)reply)->id);
	node =
	    strncmp(((Moat__V1__Sandbox *)reply)->node_id, "node-a", 6) == 0 ?
	    &E.a :
	    &E.b;
	protobuf_c_message_free_unpacked(reply, NULL);
	for (int i = 0; i < N_HELD; i++) {
		Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
		struct moat_rpc_opts opts = { .timeout_ms = 60000 };
		char word[16], *argv[2] = { "hold", word };
		uint8_t payload[256];
		size_t n;

		snprintf(word, sizeof(word), "%d", i);
		ex.sandbox_id = sandbox_id;
		ex.argv = argv;
		ex.n_argv = 2;
		n = moat__v1__exec_request__pack(&ex, payload);
		calls[i] = (struct held_call){ .lock = &lock,
			.cond = &cond,
			.done = &done,
			.index = i,
			.code = -1,
			.exit_code = -1 };
		assert_int_equal(moat_rpc_call_raw_async(E.client, GW, "Exec",
		                     payload, n, &opts, held_done, &calls[i],
		                     &errmsg),
		    MOAT_OK);
	}
	for (int i = 0; i < 1500 && fake_node_held(node) < N_HELD; i++)
		nng_msleep(20);
	assert_int_equal(fake_node_held(node), N_HELD);
	ref.sandbox_id = sandbox_id;
	assert_int_equal(gw_call("GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	pthread_mutex_lock(&lock);
	assert_int_equal(done, 0);
	pthread_mutex_unlock(&lock);
	/* Counted when answered, not when deferred. */
	assert_int_equal(exec_ok_count(), exec_ok_before);

	fake_node_release_held(node);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 60;
	pthread_mutex_lock(&lock);
	while (done < N_HELD)
		if (pthread_cond_timedwait(&cond, &lock, &ts) != 0)
			break;
	pthread_mutex_unlock(&lock);
	assert_int_equal(done, N_HELD);
	for (int i = 0; i < N_HELD; i++) {
		assert_int_equal(calls[i].code, MOAT_OK);
		assert_int_equal(calls[i].exit_code, i);
		assert_true(calls[i].safety[0] != '\0');
	}
	assert_int_equal(exec_ok_count(), exec_ok_before + N_HELD);
	assert_int_equal(gw_call("DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, &reply, &errmsg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	free(sandbox_id);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_health_and_info),
		cmocka_unit_test(test_create_routes_to_node),
		cmocka_unit_test(test_repeated_request_id_runs_once),
		cmocka_unit_test(test_unknown_sandbox_not_found),
		cmocka_unit_test(test_node_error_passes_unchanged),
		cmocka_unit_test(test_two_nodes_placement_lookup_and_list),
		cmocka_unit_test(test_record_without_sessiond),
		cmocka_unit_test(test_record_with_sessiond),
		cmocka_unit_test(test_record_started),
		cmocka_unit_test(test_fork_with_sessiond),
		cmocka_unit_test(test_long_exec_holds_no_worker),
		cmocka_unit_test(test_dead_node_unavailable),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
