/*
 * test_crosshost.c: cross-host restore and fork, and node loss (issue
 * 13), the gateway's part: a real gateway in-process (auth off) with a
 * real moat-sessiond, two fake vmd nodes and a fake moat-snapd that knows
 * each local snapshot's snapd id by its label local_id. It shows: a
 * restore on another node (RestoreStepRequest.node) sends that node
 * snapd's id, found by label, and the reply says where it landed and the
 * bytes pulled; in place on another node it is a new sandbox there and
 * the old one goes; a corrupt copy in snapd is DATA_LOSS naming the
 * chunk, the node left as it was; RestoreSandbox takes snapd's id; an
 * unknown node is FAILED_PRECONDITION naming the available ones;
 * step_latest restores the last step whose snapshot can be restored
 * there (on another node: one in snapd); a fork of 4 lands on both
 * nodes; placement's spread on its own; locating a sandbox asks the
 * nodes in parallel (a slow node does not delay finding it on another);
 * a node that stops answering lists its sandboxes as UNAVAILABLE,
 * GetSandbox answers them so, and a call on one fails at once saying how
 * to bring it back.
 * Not for: real restores (tests/integration) or TLS.
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

#include "fake_node.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/util.h"
#include "session.pb-c.h"
#include "snapshot.pb-c.h"

#define GW "moat.v1.Gateway"

/* The fake moat-snapd: ListSnapshots by label local_id answers
 * "snap-" + 32 hex made from the local id; every other call fails. */
struct fake_snapd {
	struct moat_rpc_server *srv;
	struct moat_rpc_method *rows;
	pthread_mutex_t lock;
	char last_local_id[128];
	char missing[128]; /* a local id it has no copy of */
	int lists;
};

struct env {
	char dir[64];
	char *survey_url, *listen_url, *snapd_url;
	struct moat_gateway *gw;
	struct moat_rpc_client *client;
	struct fake_node a, b;
	struct fake_snapd snapd;
	pid_t sessiond;
	char sandbox[64], session[64]; /* recorded on node-a, 2 steps */
};

static struct env E;

/* snapd_id_of: the fake snapd's id of local snapshot `local`. */
static void
snapd_id_of(const char *local, char *out, size_t size)
{
	uint64_t h = 1469598103934665603ull;

	for (const char *p = local; *p != '\0'; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ull;
	snprintf(out, size, "snap-%016llx%016llx", (unsigned long long)h,
	    (unsigned long long)~h);
}

static int
snapd_handler(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct fake_snapd *sd = call->service_ctx;
	const Moat__V1__ListSnapshotsRequest *q = (const void *)request;
	Moat__V1__ListSnapshotsReply *r = (void *)reply;
	Moat__V1__SnapshotInfo *info;
	char id[64];

	if (strcmp(call->method, "ListSnapshots") != 0)
		return moat_rpc_error(call, MOAT_UNIMPLEMENTED, "fake snapd");
	if (q->n_labels != 1 || strcmp(q->labels[0]->key, "local_id") != 0)
		return MOAT_OK; /* only the lookup by label is faked */
	pthread_mutex_lock(&sd->lock);
	sd->lists++;
	snprintf(sd->last_local_id, sizeof(sd->last_local_id), "%s",
	    q->labels[0]->value);
	if (strcmp(sd->missing, q->labels[0]->value) == 0) {
		pthread_mutex_unlock(&sd->lock);
		return MOAT_OK; /* never pushed */
	}
	pthread_mutex_unlock(&sd->lock);
	snapd_id_of(q->labels[0]->value, id, sizeof(id));
	r->snapshots = calloc(1, sizeof(*r->snapshots));
	info = malloc(sizeof(*info));
	moat__v1__snapshot_info__init(info);
	info->id = strdup(id);
	info->tenant = strdup(q->tenant);
	r->snapshots[r->n_snapshots++] = info;
	return MOAT_OK;
}

static void
snapd_start(struct fake_snapd *sd, const char *url)
{
	const ProtobufCServiceDescriptor *d = &moat__v1__snapshot__descriptor;
	struct moat_rpc_service svc = { .descriptor = d, .ctx = sd };
	char *errmsg = NULL;

	pthread_mutex_init(&sd->lock, NULL);
	sd->rows = calloc(d->n_methods, sizeof(*sd->rows));
	assert_non_null(sd->rows);
	for (unsigned i = 0; i < d->n_methods; i++)
		sd->rows[i] = (struct moat_rpc_method){ d->methods[i].name,
			snapd_handler, false, false };
	svc.methods = sd->rows;
	svc.n_methods = d->n_methods;
	if (moat_rpc_server_start(&sd->srv, url, &svc, 2, &errmsg) != MOAT_OK)
		fail_msg("fake snapd: %s", errmsg);
}

static void
snapd_stop(struct fake_snapd *sd)
{
	moat_rpc_server_stop(sd->srv);
	free(sd->rows);
	pthread_mutex_destroy(&sd->lock);
}

/* call: one Gateway call, 20 s at most. */
static int
call(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, void *reply, char **errmsg)
{
	struct moat_rpc_opts opts = { .timeout_ms = 20000 };

	*(ProtobufCMessage **)reply = NULL;
	*errmsg = NULL;
	return moat_rpc_call(E.client, GW, method, req, desc,
	    (ProtobufCMessage **)reply, &opts, errmsg);
}

static void *
ok(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc)
{
	ProtobufCMessage *reply;
	char *msg;
	int rv = call(method, req, desc, &reply, &msg);

	if (rv != MOAT_OK)
		fail_msg("%s: %d %s", method, rv, msg ? msg : "");
	free(msg);
	return reply;
}

/* wait_available: until the gateway has `n` available nodes. */
static void
wait_available(size_t want)
{
	for (int i = 0; i < 300; i++) {
		struct moat_node_id *ids = NULL;
		size_t n = 0;

		if (moat_nodes_available_ids(moat_gateway_nodes(E.gw), &ids,
		        &n) == MOAT_OK &&
		    n == want) {
			free(ids);
			return;
		}
		free(ids);
		nng_msleep(20);
	}
	fail_msg("the gateway never had %zu available nodes", want);
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
		    &moat__v1__list_sessions_reply__descriptor, &reply, &msg);
		free(msg);
		protobuf_c_message_free_unpacked(reply, NULL);
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	assert_int_equal(rv, MOAT_OK);
}

/* recorded_on_a: a recorded sandbox (EVERY) with two steps, on node-a
 * (placement's tie goes to the first id). */
static void
recorded_on_a(void)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__Sandbox *sb;

	req.record = true;
	req.snapshot_policy = MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY;
	sb = ok("CreateSandbox", &req.base, &moat__v1__sandbox__descriptor);
	assert_string_equal(sb->node_id, "node-a");
	snprintf(E.sandbox, sizeof(E.sandbox), "%s", sb->id);
	snprintf(E.session, sizeof(E.session), "%s", sb->session_id);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	ex.sandbox_id = E.sandbox;
	ex.shell = (char *)"echo step";
	for (int i = 1; i <= 2; i++) {
		Moat__V1__ExecResult *r =
		    ok("Exec", &ex.base, &moat__v1__exec_result__descriptor);

		assert_int_equal(r->step_index, i);
		moat__v1__exec_result__free_unpacked(r, NULL);
	}
}

static int
setup(void **state)
{
	struct moat_gateway_opts opts = { 0 };
	char *errmsg = NULL, *sessiond;

	(void)state;
	memset(&E, 0, sizeof(E));
	moat_log_init("test", MOAT_LOG_ERROR);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-cross-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	E.survey_url = moat_asprintf("ipc://%s/survey.sock", E.dir);
	E.listen_url = moat_asprintf("ipc://%s/gateway.sock", E.dir);
	E.snapd_url = moat_asprintf("ipc://%s/snapd.sock", E.dir);
	sessiond = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	snapd_start(&E.snapd, E.snapd_url);
	opts.listen_url = E.listen_url;
	opts.survey_url = E.survey_url;
	opts.sessiond_url = sessiond;
	opts.snapd_url = E.snapd_url;
	opts.state_dir = E.dir;
	/* Fast surveys, but not so fast that a loaded machine (sanitizers,
	 * tests side by side) misses three in a row. */
	opts.survey_interval_ms = 200;
	if (moat_gateway_start(&E.gw, &opts, &errmsg) != MOAT_OK)
		fail_msg("gateway: %s", errmsg);
	free(sessiond);
	assert_int_equal(moat_rpc_client_open(&E.client, E.listen_url,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(fake_node_start(&E.a, "node-a", E.dir, E.survey_url),
	    0);
	assert_int_equal(fake_node_start(&E.b, "node-b", E.dir, E.survey_url),
	    0);
	wait_available(2);
	sessiond_start();
	recorded_on_a();
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
	fake_node_halt(&E.b);
	moat_gateway_stop(E.gw);
	fake_node_stop(&E.a);
	fake_node_stop(&E.b);
	snapd_stop(&E.snapd);
	moat_rm_rf(E.dir);
	free(E.survey_url);
	free(E.listen_url);
	free(E.snapd_url);
	return 0;
}

/* node_snap: node-a's snapshot of step `index` of E.session into id. */
static void
node_snap(uint64_t index, char *id, size_t size)
{
	id[0] = '\0';
	pthread_mutex_lock(&E.a.lock);
	for (int i = 0; i < E.a.n_snaps; i++)
		if (strcmp(E.a.snaps[i].session, E.session) == 0 &&
		    E.a.snaps[i].step == index)
			snprintf(id, size, "%s", E.a.snaps[i].id);
	pthread_mutex_unlock(&E.a.lock);
	assert_true(id[0] != '\0');
}

/* ---- tests ---- */

static void
test_restore_on_other_node(void **state)
{
	Moat__V1__RestoreStepRequest req =
	    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
	Moat__V1__RestoreStepReply *r;
	Moat__V1__RestoreSandboxRequest rs =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb;
	ProtobufCMessage *reply;
	char local[128], remote[64], old[128], *msg;
	int n_b;

	(void)state;
	node_snap(2, local, sizeof(local));
	snapd_id_of(local, remote, sizeof(remote));
	req.session_id = E.session;
	req.step = 2;
	req.new_sandbox = true;
	req.node = (char *)"node-b";
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	assert_non_null(r->sandbox);
	assert_string_equal(r->sandbox->node_id, "node-b");
	assert_int_equal(r->sandbox->pulled_bytes, FAKE_PULLED_BYTES);
	assert_string_equal(r->snapshot_id, local);
	assert_string_not_equal(r->session_id, E.session);
	/* The new sandbox got the tenant's default lifetime (issue 15): the
	 * fake node answers SetTimeout with 1000 * timeout_s. */
	assert_true(E.b.set_timeouts >= 1);
	assert_int_equal(E.b.last_timeout_s, MOAT_LIFETIME_TIMEOUT_S);
	assert_int_equal(r->sandbox->expires_unix_ms,
	    1000ull * MOAT_LIFETIME_TIMEOUT_S);
	/* node-b was sent snapd's id, found in snapd by label local_id. */
	assert_string_equal(E.b.last_restore_snap, remote);
	assert_string_equal(E.snapd.last_local_id, local);
	moat__v1__restore_step_reply__free_unpacked(r, NULL);

	/* Without a node: the snapshot's own node, its local id, no pull. */
	req.node = (char *)"";
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	assert_string_equal(r->sandbox->node_id, "node-a");
	assert_int_equal(r->sandbox->pulled_bytes, 0);
	assert_string_equal(E.a.last_restore_snap, local);
	/* A new sandbox: the node reseeds it by itself (issue 18). */
	assert_string_equal(E.a.last_restore_replace, "");
	assert_int_equal(E.a.last_restore_reseed, 0);
	snprintf(old, sizeof(old), "%s", r->sandbox->id);
	moat__v1__restore_step_reply__free_unpacked(r, NULL);

	/* In place with reseed: the node is asked to replace and reseed. */
	req.new_sandbox = false;
	req.sandbox_id = old;
	req.reseed = true;
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	assert_string_equal(E.a.last_restore_replace, old);
	assert_int_equal(E.a.last_restore_reseed, 1);
	snprintf(old, sizeof(old), "%s", r->sandbox->id);
	moat__v1__restore_step_reply__free_unpacked(r, NULL);
	req.reseed = false;
	req.sandbox_id = (char *)"";
	req.new_sandbox = true;

	/* In place, but on node-b: a new sandbox there, the old one gone. */
	req.new_sandbox = false;
	req.sandbox_id = old;
	req.node = (char *)"node-b";
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	assert_string_equal(r->sandbox->node_id, "node-b");
	assert_string_not_equal(r->sandbox->id, old);
	assert_false(fake_node_has_sandbox(&E.a, old));
	moat__v1__restore_step_reply__free_unpacked(r, NULL);
	req.sandbox_id = (char *)"";
	req.new_sandbox = true;

	/* Corrupt in snapd: DATA_LOSS naming the chunk, node-b unchanged. */
	pthread_mutex_lock(&E.b.lock);
	snprintf(E.b.corrupt_snap, sizeof(E.b.corrupt_snap), "%s", remote);
	n_b = E.b.n_sandboxes;
	pthread_mutex_unlock(&E.b.lock);
	assert_int_equal(call("RestoreStep", &req.base,
	                     &moat__v1__restore_step_reply__descriptor, &reply,
	                     &msg),
	    MOAT_DATA_LOSS);
	assert_non_null(strstr(msg, "chunk 7"));
	assert_int_equal(E.b.n_sandboxes, n_b);
	free(msg);
	E.b.corrupt_snap[0] = '\0';

	/* RestoreSandbox through the gateway takes snapd's id too. */
	rs.snapshot_id = remote;
	sb = ok("RestoreSandbox", &rs.base, &moat__v1__sandbox__descriptor);
	assert_string_equal(strcmp(sb->node_id, "node-a") == 0 ?
	        E.a.last_restore_snap :
	        E.b.last_restore_snap,
	    remote);
	assert_int_equal(sb->pulled_bytes, FAKE_PULLED_BYTES);
	moat__v1__sandbox__free_unpacked(sb, NULL);
}

static void
test_unknown_node_refused(void **state)
{
	Moat__V1__RestoreStepRequest req =
	    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
	Moat__V1__ForkRequest freq = MOAT__V1__FORK_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *msg;

	(void)state;
	req.session_id = E.session;
	req.step = 1;
	req.new_sandbox = true;
	req.node = (char *)"node-z";
	assert_int_equal(call("RestoreStep", &req.base,
	                     &moat__v1__restore_step_reply__descriptor, &reply,
	                     &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "node-z"));
	assert_non_null(strstr(msg, "available: node-"));
	assert_non_null(strstr(msg, "node-a"));
	assert_non_null(strstr(msg, "node-b"));
	free(msg);
	freq.session_id = E.session;
	freq.step = 1;
	freq.count = 2;
	freq.node = (char *)"node-z";
	assert_int_equal(call("Fork", &freq.base,
	                     &moat__v1__fork_reply__descriptor, &reply, &msg),
	    MOAT_FAILED_PRECONDITION);
	free(msg);
}

static void
test_step_latest(void **state)
{
	Moat__V1__RestoreStepRequest req =
	    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
	Moat__V1__RestoreStepReply *r;
	ProtobufCMessage *reply;
	char local[128], local1[128], remote1[64], *msg;

	(void)state;
	node_snap(2, local, sizeof(local));
	/* By sandbox id, without the session: found in sessiond. */
	req.sandbox_id = E.sandbox;
	req.step = 1; /* ignored */
	req.step_latest = true;
	req.new_sandbox = true;
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	assert_string_equal(r->snapshot_id, local);
	moat__v1__restore_step_reply__free_unpacked(r, NULL);

	/* On another node, step 2's snapshot never reached snapd: the
	 * latest that can be restored there is step 1's. */
	pthread_mutex_lock(&E.snapd.lock);
	snprintf(E.snapd.missing, sizeof(E.snapd.missing), "%s", local);
	pthread_mutex_unlock(&E.snapd.lock);
	node_snap(1, local1, sizeof(local1));
	snapd_id_of(local1, remote1, sizeof(remote1));
	req.node = (char *)"node-b";
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	assert_string_equal(r->snapshot_id, local1);
	assert_string_equal(r->sandbox->node_id, "node-b");
	assert_string_equal(E.b.last_restore_snap, remote1);
	moat__v1__restore_step_reply__free_unpacked(r, NULL);
	/* A given step that is not in snapd: refused, saying why. */
	req.step_latest = false;
	req.step = 2;
	assert_int_equal(call("RestoreStep", &req.base,
	                     &moat__v1__restore_step_reply__descriptor, &reply,
	                     &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "never stored in moat-snapd"));
	free(msg);
	E.snapd.missing[0] = '\0';
}

static void
test_fork_spreads(void **state)
{
	Moat__V1__ForkRequest req = MOAT__V1__FORK_REQUEST__INIT;
	Moat__V1__ForkReply *r;
	int on_a = 0, on_b = 0;

	(void)state;
	/* Both nodes answering now: a survey missed under load must not
	 * leave one out of the placement. */
	wait_available(2);
	req.session_id = E.session;
	req.step = 1;
	req.count = 4;
	r = ok("Fork", &req.base, &moat__v1__fork_reply__descriptor);
	assert_int_equal(r->succeeded, 4);
	for (size_t i = 0; i < r->n_copies; i++) {
		const Moat__V1__Sandbox *sb = r->copies[i]->sandbox;

		assert_non_null(sb);
		if (strcmp(sb->node_id, "node-a") == 0) {
			on_a++;
			assert_int_equal(sb->pulled_bytes, 0);
		} else if (strcmp(sb->node_id, "node-b") == 0) {
			on_b++;
			assert_int_equal(sb->pulled_bytes, FAKE_PULLED_BYTES);
		}
	}
	assert_true(on_a >= 1);
	assert_true(on_b >= 1);
	assert_int_equal(on_a + on_b, 4);
	moat__v1__fork_reply__free_unpacked(r, NULL);
}

static void
test_placement_spread(void **state)
{
	Moat__V1__Node a = MOAT__V1__NODE__INIT, b = MOAT__V1__NODE__INIT;
	Moat__V1__Node *nodes[2] = { &a, &b };
	size_t chosen[4];
	char *msg = NULL;

	(void)state;
	a.node_id = (char *)"node-a";
	a.protocol_version = 2;
	b.node_id = (char *)"node-b";
	b.protocol_version = 2;
	a.available = b.available = true;
	a.memory_mib_total = b.memory_mib_total = 4096;
	a.sandboxes = 3; /* busier, but preferred for the first */
	assert_int_equal(moat_placement_spread(nodes, 2, 4, 0, 0, "", "node-a",
	                     "ipc:///x", chosen, &msg),
	    MOAT_OK);
	assert_int_equal(chosen[0], 0);
	assert_int_equal(chosen[1], 1);
	assert_int_equal(chosen[2], 1);
	assert_int_equal(chosen[3], 1);
	/* Unavailable preferred node: placement alone. */
	a.available = false;
	assert_int_equal(moat_placement_spread(nodes, 2, 1, 0, 0, "", "node-a",
	                     "ipc:///x", chosen, &msg),
	    MOAT_OK);
	assert_int_equal(chosen[0], 1);
}

/* test_locate_parallel: a table of its own (no inventory, no routes):
 * the slow node first, the sandbox on the fast one. */
static void
test_locate_parallel(void **state)
{
	struct moat_nodes nodes;
	struct moat_forward fw;
	struct fake_node slow, fast;
	struct moat_sandbox_id sb;
	struct moat_node_id where;
	char *msg = NULL;
	uint64_t t0, spent;

	(void)state;
	assert_int_equal(fake_node_start(&slow, "slow", E.dir, ""), 0);
	assert_int_equal(fake_node_start(&fast, "fast", E.dir, ""), 0);
	atomic_store(&slow.get_delay_ms, 3000);
	fake_node_add_sandbox(&fast, "far-1");
	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	assert_int_equal(moat_forward_init(&fw, &nodes), MOAT_OK);
	for (int i = 0; i < 2; i++) {
		Moat__V1__Node n = MOAT__V1__NODE__INIT;
		struct fake_node *fn = i == 0 ? &slow : &fast;
		size_t len;
		uint8_t *buf;

		n.node_id = fn->id;
		n.protocol_version = 2;
		n.rpc_url = fn->rpc_url;
		len = moat__v1__node__get_packed_size(&n);
		buf = malloc(len);
		moat__v1__node__pack(&n, buf);
		assert_int_equal(moat_nodes_seen(&nodes,
		                     moat__v1__node__unpack(NULL, len, buf),
		                     moat_now_unix_ms()),
		    MOAT_OK);
		free(buf);
	}
	assert_true(moat_sandbox_id_set(&sb, "far-1"));
	t0 = moat_rpc_now_ms();
	assert_int_equal(moat_forward_locate(&fw, &sb, "default",
	                     moat_rpc_now_ms() + 10000, &where, &msg),
	    MOAT_OK);
	spent = moat_rpc_now_ms() - t0;
	assert_string_equal(where.s, "fast");
	assert_true(spent < 1500);
	/* fini waits for the slow asker, then the nodes may go. */
	moat_forward_fini(&fw);
	moat_nodes_fini(&nodes);
	fake_node_stop(&slow);
	fake_node_stop(&fast);
}

/* wait_unavailable: until node `id` is not available. */
static void
wait_unavailable(const char *id)
{
	struct moat_node_id node;

	assert_true(moat_node_id_set(&node, id));
	for (int i = 0; i < 300; i++) {
		if (!moat_nodes_is_available(moat_gateway_nodes(E.gw), &node))
			return;
		nng_msleep(20);
	}
	fail_msg("node %s never became unavailable", id);
}

/* Last: node-b goes away for good. */
static void
test_node_loss(void **state)
{
	Moat__V1__ListSandboxesRequest lreq =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__SandboxList *list;
	Moat__V1__Sandbox *sb;
	ProtobufCMessage *reply;
	bool seen = false;
	char *msg;
	uint64_t t0;

	(void)state;
	fake_node_add_sandbox(&E.b, "lost-1");
	/* The inventory's refresh (every 100 ms here) learns of it. */
	nng_msleep(500);
	/* Its vmd dies while its survey answers still come: the node is
	 * listed from the inventory after the (parallel) list timeout. */
	fake_node_kill_rpc(&E.b);
	t0 = moat_rpc_now_ms();
	list = ok("ListSandboxes", &lreq.base,
	    &moat__v1__sandbox_list__descriptor);
	assert_true(moat_rpc_now_ms() - t0 < 4500);
	for (size_t i = 0; i < list->n_sandboxes; i++)
		if (strcmp(list->sandboxes[i]->id, "lost-1") == 0) {
			assert_int_equal(list->sandboxes[i]->state,
			    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNAVAILABLE);
			seen = true;
		}
	assert_true(seen);
	moat__v1__sandbox_list__free_unpacked(list, NULL);
	seen = false;
	/* Then the survey marks it unavailable: no waiting at all. */
	atomic_store(&E.b.silent, true);
	wait_unavailable("node-b");
	t0 = moat_rpc_now_ms();
	list = ok("ListSandboxes", &lreq.base,
	    &moat__v1__sandbox_list__descriptor);
	assert_true(moat_rpc_now_ms() - t0 < 1000);
	for (size_t i = 0; i < list->n_sandboxes; i++) {
		const Moat__V1__Sandbox *s = list->sandboxes[i];

		if (strcmp(s->node_id, "node-b") == 0)
			assert_int_equal(s->state,
			    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNAVAILABLE);
		if (strcmp(s->id, "lost-1") == 0)
			seen = true;
	}
	assert_true(seen);
	moat__v1__sandbox_list__free_unpacked(list, NULL);
	ref.sandbox_id = (char *)"lost-1";
	sb = ok("GetSandbox", &ref.base, &moat__v1__sandbox__descriptor);
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_UNAVAILABLE);
	assert_string_equal(sb->node_id, "node-b");
	moat__v1__sandbox__free_unpacked(sb, NULL);
	/* A call on it fails at once, saying how to bring it back. */
	ex.sandbox_id = (char *)"lost-1";
	ex.shell = (char *)"true";
	t0 = moat_rpc_now_ms();
	assert_int_equal(call("Exec", &ex.base,
	                     &moat__v1__exec_result__descriptor, &reply, &msg),
	    MOAT_UNAVAILABLE);
	assert_true(moat_rpc_now_ms() - t0 < 1000);
	assert_non_null(strstr(msg, "node-b"));
	assert_non_null(strstr(msg, "--step latest --new"));
	free(msg);
}

/* Branches read as paths (issue 18), through the gateway: restore step 1
 * of the recorded session (2 steps) and run one step: it is step 2 of
 * the branch; its steps are step 1 (inherited, held by the parent) and
 * step 2; a fork from step 2 of the branch works; the parent's tree
 * shows the branch at step 1. */
static void
test_branch_path(void **state)
{
	Moat__V1__RestoreStepRequest req =
	    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__ForkRequest freq = MOAT__V1__FORK_REQUEST__INIT;
	Moat__V1__GetSessionTreeRequest treq =
	    MOAT__V1__GET_SESSION_TREE_REQUEST__INIT;
	Moat__V1__GetStepRequest sreq = MOAT__V1__GET_STEP_REQUEST__INIT;
	Moat__V1__RestoreStepReply *r;
	Moat__V1__ExecResult *er;
	Moat__V1__ListStepsReply *l;
	Moat__V1__ForkReply *fr;
	Moat__V1__SessionTreeReply *t;
	ProtobufCMessage *reply;
	char branch[64], sandbox[128], *msg = NULL;
	bool found = false;

	(void)state;
	req.session_id = E.session;
	req.step = 1;
	req.new_sandbox = true;
	req.node = (char *)"node-a";
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	snprintf(branch, sizeof(branch), "%s", r->session_id);
	snprintf(sandbox, sizeof(sandbox), "%s", r->sandbox->id);
	moat__v1__restore_step_reply__free_unpacked(r, NULL);

	ex.sandbox_id = sandbox;
	ex.shell = (char *)"echo branch";
	er = ok("Exec", &ex.base, &moat__v1__exec_result__descriptor);
	assert_int_equal(er->step_index, 2);
	moat__v1__exec_result__free_unpacked(er, NULL);

	lreq.session_id = branch;
	l = ok("ListSteps", &lreq.base,
	    &moat__v1__list_steps_reply__descriptor);
	assert_int_equal(l->n_steps, 2);
	assert_int_equal(l->steps[0]->index, 1);
	assert_string_equal(l->steps[0]->held_by_session, E.session);
	assert_int_equal(l->steps[1]->index, 2);
	assert_string_equal(l->steps[1]->held_by_session, "");
	assert_string_not_equal(l->steps[1]->snapshot_id, "");
	moat__v1__list_steps_reply__free_unpacked(l, NULL);

	/* Step 3 of the branch: not found, saying which there are. */
	sreq.session_id = branch;
	sreq.index = 3;
	assert_int_equal(call("GetStep", &sreq.base,
	                     &moat__v1__step__descriptor, &reply, &msg),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(msg, "1..2"));
	free(msg);
	msg = NULL;

	/* A fork from step 2 of the branch, and one from its inherited step
	 * 1 (the parent's snapshot). */
	freq.session_id = branch;
	freq.step = 2;
	freq.node = (char *)"node-a";
	fr = ok("Fork", &freq.base, &moat__v1__fork_reply__descriptor);
	assert_int_equal(fr->succeeded, 1);
	moat__v1__fork_reply__free_unpacked(fr, NULL);
	freq.step = 1;
	fr = ok("Fork", &freq.base, &moat__v1__fork_reply__descriptor);
	assert_int_equal(fr->succeeded, 1);
	moat__v1__fork_reply__free_unpacked(fr, NULL);
	/* Step 0 of the branch's path is the parent's step 0. */
	req.session_id = branch;
	req.step = 0;
	r = ok("RestoreStep", &req.base,
	    &moat__v1__restore_step_reply__descriptor);
	moat__v1__restore_step_reply__free_unpacked(r, NULL);

	treq.session_id = E.session;
	t = ok("GetSessionTree", &treq.base,
	    &moat__v1__session_tree_reply__descriptor);
	assert_string_equal(t->nodes[0]->session_id, E.session);
	for (size_t i = 1; i < t->n_nodes; i++)
		if (strcmp(t->nodes[i]->session_id, branch) == 0) {
			found = true;
			assert_int_equal(t->nodes[i]->depth, 1);
			assert_int_equal(t->nodes[i]->branched_at, 1);
			assert_int_equal(t->nodes[i]->step_count, 2);
			assert_int_equal(t->nodes[i]->own_steps, 1);
			assert_true(t->nodes[i]->has_exit);
		}
	assert_true(found);
	moat__v1__session_tree_reply__free_unpacked(t, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_placement_spread),
		cmocka_unit_test(test_restore_on_other_node),
		cmocka_unit_test(test_unknown_node_refused),
		cmocka_unit_test(test_step_latest),
		cmocka_unit_test(test_fork_spreads),
		cmocka_unit_test(test_branch_path),
		cmocka_unit_test(test_locate_parallel),
		cmocka_unit_test(test_node_loss),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, setup, teardown);
}
