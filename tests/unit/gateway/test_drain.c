/*
 * test_drain.c: DrainNode holds no gateway RPC worker (issue 15, parts 3
 * and 7). A real gateway with 2 workers in front of three fake nodes
 * whose snapshots are held until the test releases them: two drains
 * running at once (as many as the gateway has workers) do not stop
 * GetSandbox and ListSandboxes from being answered; a second drain of a
 * node being drained is refused, naming the first; each drain's reply
 * comes when it ends and says what moved; each call is counted once. A
 * drain whose caller's deadline passes finishes the move under way,
 * tries no other, and keeps its report for a repeat of the call; a
 * gateway that stops during a drain waits for the move under way and
 * returns.
 * Not for: what a move does on real nodes
 * (tests/integration/cluster/drain_test.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "fake_node.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/util.h"

#define GW "moat.v1.Gateway"
#define WORKERS 2 /* the gateway's RPC workers: one per drain below */

struct env {
	char dir[64];
	char *survey_url, *listen_url;
	struct moat_gateway *gw;
	struct moat_rpc_client *client;
	struct fake_node a, b, c; /* a and c are drained into b */
};

static struct env E;

/* One DrainNode sent without waiting, and what came back. */
struct drain_call {
	pthread_mutex_t lock;
	int done;
	int code;
	char errmsg[512];
	Moat__V1__DrainNodeReply *reply;
};

static void
drain_done(void *arg, int code, uint8_t *payload, size_t len, char *errmsg)
{
	struct drain_call *c = arg;

	pthread_mutex_lock(&c->lock);
	c->code = code;
	snprintf(c->errmsg, sizeof(c->errmsg), "%s", errmsg ? errmsg : "");
	if (code == MOAT_OK)
		c->reply =
		    moat__v1__drain_node_reply__unpack(NULL, len, payload);
	c->done = 1;
	pthread_mutex_unlock(&c->lock);
	free(payload);
	free(errmsg);
}

static bool
drain_finished(struct drain_call *c)
{
	bool done;

	pthread_mutex_lock(&c->lock);
	done = c->done != 0;
	pthread_mutex_unlock(&c->lock);
	return done;
}

/* drain_send: DrainNode of `node` into `target`, without waiting. */
static void
drain_send(const char *node, const char *target, uint32_t timeout_ms,
    uint64_t request_id, struct drain_call *c)
{
	Moat__V1__DrainNodeRequest req = MOAT__V1__DRAIN_NODE_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = timeout_ms,
		.request_id = request_id };
	uint8_t payload[256];
	char *errmsg = NULL;
	size_t n;

	req.node_id = (char *)node;
	req.target_node_id = (char *)target;
	n = moat__v1__drain_node_request__pack(&req, payload);
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->lock, NULL);
	c->code = -1;
	assert_int_equal(moat_rpc_call_raw_async(E.client, GW, "DrainNode",
	                     payload, n, &opts, drain_done, c, &errmsg),
	    MOAT_OK);
}

static void
drain_call_free(struct drain_call *c)
{
	if (c->reply != NULL)
		moat__v1__drain_node_reply__free_unpacked(c->reply, NULL);
	pthread_mutex_destroy(&c->lock);
}

static int
gw_call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
    uint32_t timeout_ms, uint64_t request_id, char **errmsg)
{
	struct moat_rpc_opts opts = { .timeout_ms = timeout_ms,
		.request_id = request_id };

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
	        &reply, 5000, 0, &errmsg) != MOAT_OK) {
		free(errmsg);
		return -1;
	}
	for (size_t i = 0; i < ((Moat__V1__NodeList *)reply)->n_nodes; i++)
		if (((Moat__V1__NodeList *)reply)->nodes[i]->available)
			count++;
	protobuf_c_message_free_unpacked(reply, NULL);
	return count;
}

static int
sandboxes_on(struct fake_node *fn)
{
	int n;

	pthread_mutex_lock(&fn->lock);
	n = fn->n_sandboxes;
	pthread_mutex_unlock(&fn->lock);
	return n;
}

/* calls_counted: moat_gateway_calls_total of DrainNode with `code`. */
static int
calls_counted(const char *code)
{
	char *text = moat_gateway_metrics(E.gw), *p, key[96];
	int n = 0;

	assert_non_null(text);
	snprintf(key, sizeof(key), "{method=\"DrainNode\",code=\"%s\"} ",
	    code);
	if ((p = strstr(text, key)) != NULL)
		n = atoi(p + strlen(key));
	free(text);
	return n;
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL, *sessiond, *snapd;

	(void)state;
	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_WARN);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-drain-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	E.survey_url = moat_asprintf("ipc://%s/survey.sock", E.dir);
	E.listen_url = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	/* Nothing listens there: a drain needs neither. */
	sessiond = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	snapd = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	opts.listen_url = E.listen_url;
	opts.survey_url = E.survey_url;
	opts.sessiond_url = sessiond;
	opts.snapd_url = snapd;
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
	assert_int_equal(fake_node_start(&E.b, "node-b", E.dir, E.survey_url),
	    0);
	assert_int_equal(fake_node_start(&E.c, "node-c", E.dir, E.survey_url),
	    0);
	wait_until(available_nodes() == 3);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	moat_rpc_client_close(E.client);
	fake_node_halt(&E.a);
	fake_node_halt(&E.b);
	fake_node_halt(&E.c);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	fake_node_stop(&E.b);
	fake_node_stop(&E.c);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	return 0;
}

/* check_moved: a drain's reply: every sandbox of `from` moved to b. */
static void
check_moved(struct drain_call *c, const char *from, size_t n)
{
	assert_int_equal(c->code, MOAT_OK);
	assert_non_null(c->reply);
	assert_int_equal(c->reply->moved, n);
	assert_int_equal(c->reply->failed, 0);
	assert_int_equal(c->reply->n_sandboxes, n);
	for (size_t i = 0; i < n; i++) {
		assert_true(c->reply->sandboxes[i]->moved);
		assert_string_equal(c->reply->sandboxes[i]->from_node_id,
		    from);
		assert_string_equal(c->reply->sandboxes[i]->to_node_id,
		    "node-b");
		assert_string_equal(c->reply->sandboxes[i]->error, "");
	}
}

/* Two drains at once on a gateway of two workers, each waiting for a
 * snapshot its node holds: the gateway still answers GetSandbox and
 * ListSandboxes (each of which would wait out its timeout behind drains
 * that held the workers), refuses a second drain of node a, and answers
 * each drain when its last sandbox moved. */
static void
test_drains_hold_no_worker(void **state)
{
	static struct drain_call da, dc;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ListSandboxesRequest lreq =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	Moat__V1__DrainNodeRequest again = MOAT__V1__DRAIN_NODE_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *errmsg = NULL;
	int rv;

	(void)state;
	fake_node_add_sandbox(&E.a, "sb-a1");
	fake_node_add_sandbox(&E.a, "sb-a2");
	fake_node_add_sandbox(&E.c, "sb-c1");
	fake_node_add_sandbox(&E.c, "sb-c2");
	fake_node_add_sandbox(&E.b, "sb-b-stays");
	atomic_store(&E.a.hold_snapshots, true);
	atomic_store(&E.c.hold_snapshots, true);
	drain_send("node-a", "node-b", 60000, 0, &da);
	drain_send("node-c", "node-b", 60000, 0, &dc);
	wait_until(fake_node_held(&E.a) == 1 && fake_node_held(&E.c) == 1);

	/* Both drains wait at their node: more calls than workers. */
	ref.sandbox_id = "sb-b-stays";
	for (int i = 0; i < 2 * WORKERS; i++) {
		if ((rv = gw_call("GetSandbox", &ref.base,
		         &moat__v1__sandbox__descriptor, &reply, 5000, 0,
		         &errmsg)) != MOAT_OK)
			fail_msg("GetSandbox during the drains: %s: %s",
			    moat_strerror(rv), errmsg);
		assert_string_equal(((Moat__V1__Sandbox *)reply)->id,
		    "sb-b-stays");
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	if ((rv = gw_call("ListSandboxes", &lreq.base,
	         &moat__v1__sandbox_list__descriptor, &reply, 5000, 0,
	         &errmsg)) != MOAT_OK)
		fail_msg("ListSandboxes during the drains: %s: %s",
		    moat_strerror(rv), errmsg);
	protobuf_c_message_free_unpacked(reply, NULL);

	/* Another drain of node a: refused, naming the running one. */
	again.node_id = "node-a";
	rv = gw_call("DrainNode", &again.base,
	    &moat__v1__drain_node_reply__descriptor, &reply, 5000, 0, &errmsg);
	assert_int_equal(rv, MOAT_FAILED_PRECONDITION);
	assert_non_null(
	    strstr(errmsg, "node node-a is already being drained"));
	assert_non_null(strstr(errmsg, "wait for that call's reply"));
	free(errmsg);
	errmsg = NULL;
	assert_false(drain_finished(&da));
	assert_false(drain_finished(&dc));

	/* Each release lets every waiting move go on to the next. */
	while (!drain_finished(&da) || !drain_finished(&dc)) {
		fake_node_release_held(&E.a);
		fake_node_release_held(&E.c);
		nng_msleep(20);
	}
	check_moved(&da, "node-a", 2);
	check_moved(&dc, "node-c", 2);
	assert_int_equal(sandboxes_on(&E.a), 0);
	assert_int_equal(sandboxes_on(&E.c), 0);
	assert_int_equal(sandboxes_on(&E.b), 5);
	assert_true(E.a.cordons >= 1 && E.c.cordons >= 1);
	/* Counted once each, when they answered. */
	assert_int_equal(calls_counted("OK"), 2);
	assert_int_equal(calls_counted("FAILED_PRECONDITION"), 1);
	drain_call_free(&da);
	drain_call_free(&dc);
}

/* A drain whose caller's deadline passes while a snapshot waits: the
 * caller gets DEADLINE_EXCEEDED; the move under way finishes, the next
 * sandbox is not tried, and a repeat of the call (its request id) gets
 * that report. */
static void
test_drain_past_its_deadline(void **state)
{
	static struct drain_call d;
	Moat__V1__DrainNodeRequest req = MOAT__V1__DRAIN_NODE_REQUEST__INIT;
	Moat__V1__DrainNodeReply *r;
	ProtobufCMessage *reply = NULL;
	uint64_t rid = 0x5eed0000d1a10001ull;
	char *errmsg = NULL;
	int rv, b0 = sandboxes_on(&E.b);

	(void)state;
	fake_node_add_sandbox(&E.a, "sb-a3");
	fake_node_add_sandbox(&E.a, "sb-a4");
	drain_send("node-a", "node-b", 1500, rid, &d);
	wait_until(fake_node_held(&E.a) == 1);
	wait_until(drain_finished(&d));
	assert_int_equal(d.code, MOAT_DEADLINE_EXCEEDED);
	fake_node_release_held(&E.a);

	req.node_id = "node-a";
	req.target_node_id = "node-b";
	for (int i = 0; i < 1500; i++) {
		rv = gw_call("DrainNode", &req.base,
		    &moat__v1__drain_node_reply__descriptor, &reply, 5000, rid,
		    &errmsg);
		if (rv != MOAT_ABORTED) /* "still running" */
			break;
		free(errmsg);
		errmsg = NULL;
		nng_msleep(20);
	}
	if (rv != MOAT_OK)
		fail_msg("DrainNode repeated: %s: %s", moat_strerror(rv),
		    errmsg);
	r = (Moat__V1__DrainNodeReply *)reply;
	assert_int_equal(r->moved, 1);
	assert_int_equal(r->failed, 1);
	assert_int_equal(r->n_sandboxes, 2);
	assert_true(r->sandboxes[0]->moved);
	assert_false(r->sandboxes[1]->moved);
	assert_non_null(strstr(r->sandboxes[1]->error,
	    "not tried: the DrainNode call's deadline passed first"));
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_int_equal(fake_node_held(&E.a), 0);
	assert_int_equal(sandboxes_on(&E.a), 1);
	assert_int_equal(sandboxes_on(&E.b), b0 + 1);
	drain_call_free(&d);
}

static atomic_bool stopped;

static void *
stop_gateway(void *arg)
{
	moat_gateway_stop(arg);
	atomic_store(&stopped, true);
	return NULL;
}

/* The gateway stops while a drain waits for a snapshot: the stop waits
 * for the drain's move under way and returns, the drain tries no
 * sandbox after the stop reached it, and nothing is lost or left held
 * (under ASan: nothing leaks). */
static void
test_stop_during_drain(void **state)
{
	static struct drain_call d;
	pthread_t stopper;
	int total;

	(void)state;
	fake_node_add_sandbox(&E.a, "sb-a5");
	total = sandboxes_on(&E.a) + sandboxes_on(&E.b);
	drain_send("node-a", "node-b", 8000, 0, &d);
	wait_until(fake_node_held(&E.a) == 1);
	fake_node_halt(&E.a);
	fake_node_halt(&E.b);
	fake_node_halt(&E.c);
	assert_int_equal(pthread_create(&stopper, NULL, stop_gateway, E.gw),
	    0);
	/* Until the stop reaches the drain, its moves go on. */
	while (!atomic_load(&stopped)) {
		fake_node_release_held(&E.a);
		nng_msleep(20);
	}
	assert_int_equal(pthread_join(stopper, NULL), 0);
	E.gw = NULL;
	assert_int_equal(sandboxes_on(&E.a) + sandboxes_on(&E.b), total);
	assert_int_equal(fake_node_held(&E.a), 0);
	/* The client's call ends (no reply: the server is gone). */
	wait_until(drain_finished(&d));
	drain_call_free(&d);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_drains_hold_no_worker),
		cmocka_unit_test(test_drain_past_its_deadline),
		cmocka_unit_test(test_stop_during_drain),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
