/*
 * test_rpc_defer.c: unit tests of deferred replies (moat_rpc_defer,
 * moat_rpc_complete in lib/rpc_defer.c) and of asynchronous calls
 * (moat_rpc_call_raw_async in lib/rpc_client.c), over real ipc://
 * sockets with the moat.v1.Vm descriptor and test handlers: many more
 * deferred calls than workers while other calls keep answering,
 * completion in reverse order, completion before the handler returns,
 * the server's deadline answer, repeats by request id (running, then
 * done), a client gone before the completion, a server stopped with
 * calls still deferred, the detached dispatcher, its asynchronous
 * dispatch (done once, on the caller's or the completer's thread, and
 * after the server stopped), and asynchronous calls (reply, server
 * error, deadline, no server). No test asserts a
 * duration. Not for: the synchronous RPC layer (test_rpc.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "common.pb-c.h"
#include "moat/rpc.h"
#include "moat/rpc_dispatch.h"
#include "moat/util.h"
#include "vm.pb-c.h"

#define N_DEFERRED 200 /* far more than the server's workers */
#define N_WORKERS 4
#define GIVE_UP_S 60 /* a broken server fails, never hangs; not timed */

struct fixture {
	char dir[64];
	char url[128];
	struct moat_rpc_server *srv;
	pthread_mutex_t lock; /* guards every field below */
	pthread_cond_t cond;
	struct moat_rpc_deferred *held[N_DEFERRED + 8];
	int32_t held_code[N_DEFERRED + 8]; /* what each Exec asked for */
	int n_held;
	int handler_runs;
};

static struct fixture *current;

/* Exec: defers; argv[0] is a number the reply carries back as its exit
 * code, so each caller can check that it got its own reply. With argv
 * "now" the handler completes before it returns. */
static int
h_exec_defer(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ExecRequest *req =
	    (const Moat__V1__ExecRequest *)request;
	struct fixture *f = call->service_ctx;
	struct moat_rpc_deferred *d = moat_rpc_defer(call);
	int32_t code = req->n_argv > 0 ? atoi(req->argv[0]) : 0;

	(void)reply;
	if (d == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "cannot defer");
	if (req->n_argv > 0 && strcmp(req->argv[0], "now") == 0) {
		Moat__V1__ExecResult r = MOAT__V1__EXEC_RESULT__INIT;
		Moat__V1__ExecStatus st = MOAT__V1__EXEC_STATUS__INIT;

		st.exit_code = 77;
		st.exited = true;
		r.status = &st;
		moat_rpc_complete(d, MOAT_OK, &r.base, NULL);
		/* Ignored: the reply is the completion's. */
		return MOAT_INTERNAL;
	}
	pthread_mutex_lock(&f->lock);
	f->held_code[f->n_held] = code;
	f->held[f->n_held++] = d;
	f->handler_runs++;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
	return MOAT_OK;
}

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	(void)req;
	r->service = strdup(call->service);
	return MOAT_OK;
}

static int
h_unimplemented(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	(void)req;
	(void)reply;
	return moat_rpc_error(call, MOAT_UNIMPLEMENTED, "not in this test");
}

static const struct moat_rpc_method vm_methods[] = {
	{ "Health", h_health, false, false },
	{ "NodeInfo", h_unimplemented, false, false },
	{ "CreateSandbox", h_unimplemented, true, false },
	{ "GetSandbox", h_unimplemented, false, false },
	{ "ListSandboxes", h_unimplemented, false, false },
	{ "ListAllSandboxes", h_unimplemented, false, false },
	{ "DestroySandbox", h_unimplemented, true, false },
	{ "ExecStart", h_unimplemented, true, false },
	{ "ExecRead", h_unimplemented, false, false },
	{ "ExecWrite", h_unimplemented, true, false },
	{ "ExecWait", h_unimplemented, false, false },
	{ "ExecKill", h_unimplemented, true, false },
	{ "Exec", h_exec_defer, true, false },
	{ "ReadFile", h_unimplemented, false, false },
	{ "WriteFile", h_unimplemented, true, false },
	{ "ListFiles", h_unimplemented, false, false },
	{ "StatFile", h_unimplemented, false, false },
	{ "RemoveFile", h_unimplemented, true, false },
	{ "MakeDir", h_unimplemented, true, false },
	{ "SandboxInfo", h_unimplemented, false, false },
	{ "SnapshotSandbox", h_unimplemented, true, false },
	{ "RestoreSandbox", h_unimplemented, true, false },
	{ "ListLocalSnapshots", h_unimplemented, false, false },
	{ "DeleteLocalSnapshot", h_unimplemented, true, false },
	{ "ResumeSandbox", h_unimplemented, true, false },
	{ "RunCode", h_unimplemented, true, false },
	{ "CloseCodeContext", h_unimplemented, true, false },
	{ "EgressEvents", h_unimplemented, false, false },
	{ "Cordon", h_unimplemented, true, false },
	{ "SetTimeout", h_unimplemented, true, false },
	{ "ExecResize", h_unimplemented, true, false },
	/* Images and archives (issue 17). */
	{ "StartImageBuild", h_unimplemented, true, false },
	{ "GetImageBuild", h_unimplemented, false, false },
	{ "ListImages", h_unimplemented, false, false },
	{ "PushImage", h_unimplemented, true, false },
	{ "PullImage", h_unimplemented, true, false },
	{ "RemoveImage", h_unimplemented, true, false },
	{ "PutArchive", h_unimplemented, true, false },
	{ "GetArchive", h_unimplemented, false, false },
	{ "TraceFs", h_unimplemented, false, false },
};

static struct moat_rpc_service
test_service(struct fixture *f)
{
	struct moat_rpc_service svc = {
		.descriptor = &moat__v1__vm__descriptor,
		.methods = vm_methods,
		.n_methods = sizeof(vm_methods) / sizeof(vm_methods[0]),
		.ctx = f,
	};
	return svc;
}

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct moat_rpc_service svc;
	char *err = NULL;

	if (f == NULL)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/moat-defer-test.XXXXXX");
	if (mkdtemp(f->dir) == NULL)
		return -1;
	snprintf(f->url, sizeof(f->url), "ipc://%s/vm.sock", f->dir);
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	svc = test_service(f);
	if (moat_rpc_server_start(&f->srv, f->url, &svc, N_WORKERS, &err) !=
	    MOAT_OK) {
		fprintf(stderr, "server start: %s\n", err);
		free(err);
		return -1;
	}
	current = f;
	*state = f;
	return 0;
}

/* Completes whatever is still held, so nothing leaks. */
static void
complete_held(struct fixture *f)
{
	pthread_mutex_lock(&f->lock);
	while (f->n_held > 0) {
		struct moat_rpc_deferred *d = f->held[--f->n_held];

		pthread_mutex_unlock(&f->lock);
		moat_rpc_complete(d, MOAT_CANCELLED, NULL, "test over");
		pthread_mutex_lock(&f->lock);
	}
	pthread_mutex_unlock(&f->lock);
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	if (f->srv != NULL) {
		complete_held(f);
		moat_rpc_server_stop(f->srv);
	}
	complete_held(f);
	moat_rm_rf(f->dir);
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
	free(f);
	current = NULL;
	return 0;
}

/* Waits until `n` Exec handlers have deferred. */
static void
wait_held(struct fixture *f, int n)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += GIVE_UP_S;
	pthread_mutex_lock(&f->lock);
	while (f->n_held < n)
		if (pthread_cond_timedwait(&f->cond, &f->lock, &ts) != 0)
			break;
	assert_true(f->n_held >= n);
	pthread_mutex_unlock(&f->lock);
}

static struct moat_rpc_client *
open_client(const char *url)
{
	struct moat_rpc_client *c = NULL;
	char *err = NULL;

	assert_int_equal(moat_rpc_client_open(&c, url, &err), MOAT_OK);
	return c;
}

/* One Exec call whose argv[0] is `word`. */
static int
call_exec(struct moat_rpc_client *c, const char *word, uint64_t rid,
    uint32_t timeout_ms, Moat__V1__ExecResult **out, char **err)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[1] = { (char *)word };
	struct moat_rpc_opts opts = { .timeout_ms = timeout_ms,
		.request_id = rid };

	req.sandbox_id = "sb";
	req.argv = argv;
	req.n_argv = 1;
	return moat_rpc_call(c, "moat.v1.Vm", "Exec", &req.base,
	    &moat__v1__exec_result__descriptor, (ProtobufCMessage **)out,
	    &opts, err);
}

static void
complete_code(struct moat_rpc_deferred *d, int32_t code)
{
	Moat__V1__ExecResult r = MOAT__V1__EXEC_RESULT__INIT;
	Moat__V1__ExecStatus st = MOAT__V1__EXEC_STATUS__INIT;

	st.exit_code = code;
	st.exited = true;
	r.status = &st;
	moat_rpc_complete(d, MOAT_OK, &r.base, NULL);
}

struct caller {
	struct fixture *f;
	int index;
	int rv;
	int32_t exit_code;
};

static void *
caller_main(void *arg)
{
	struct caller *cl = arg;
	struct moat_rpc_client *c = NULL;
	Moat__V1__ExecResult *r = NULL;
	char *err = NULL, word[16];

	snprintf(word, sizeof(word), "%d", cl->index);
	if (moat_rpc_client_open(&c, cl->f->url, &err) != MOAT_OK) {
		cl->rv = MOAT_INTERNAL;
		free(err);
		return NULL;
	}
	cl->rv = call_exec(c, word, 0, GIVE_UP_S * 1000, &r, &err);
	if (cl->rv == MOAT_OK) {
		cl->exit_code = r->status != NULL ? r->status->exit_code : -1;
		protobuf_c_message_free_unpacked(&r->base, NULL);
	}
	free(err);
	moat_rpc_client_close(c);
	return NULL;
}

static void
health_ok(const char *url)
{
	struct moat_rpc_client *c = open_client(url);
	Moat__V1__Empty e = MOAT__V1__EMPTY__INIT;
	ProtobufCMessage *r = NULL;
	char *err = NULL;

	assert_int_equal(moat_rpc_call(c, "moat.v1.Vm", "Health", &e.base,
	                     &moat__v1__health_reply__descriptor, &r, NULL,
	                     &err),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(r, NULL);
	moat_rpc_client_close(c);
}

/* 200 deferred calls on 4 workers: all are held at once (so none holds
 * a worker), Health answers meanwhile, and completing them in reverse
 * order gives each caller its own reply. */
static void
test_many_deferred_reverse_order(void **state)
{
	struct fixture *f = *state;
	static struct caller callers[N_DEFERRED];
	pthread_t threads[N_DEFERRED];

	for (int i = 0; i < N_DEFERRED; i++) {
		callers[i] = (struct caller){ .f = f, .index = i, .rv = -1 };
		assert_int_equal(pthread_create(&threads[i], NULL, caller_main,
		                     &callers[i]),
		    0);
	}
	wait_held(f, N_DEFERRED);
	health_ok(f->url);
	pthread_mutex_lock(&f->lock);
	while (f->n_held > 0) {
		int i = --f->n_held;

		complete_code(f->held[i], f->held_code[i]);
	}
	pthread_mutex_unlock(&f->lock);
	for (int i = 0; i < N_DEFERRED; i++) {
		pthread_join(threads[i], NULL);
		assert_int_equal(callers[i].rv, MOAT_OK);
		assert_int_equal(callers[i].exit_code, i);
	}
}

/* A completion before the handler returns is the reply. */
static void
test_complete_inside_handler(void **state)
{
	struct fixture *f = *state;
	struct moat_rpc_client *c = open_client(f->url);
	Moat__V1__ExecResult *r = NULL;
	char *err = NULL;

	assert_int_equal(call_exec(c, "now", 0, 5000, &r, &err), MOAT_OK);
	assert_int_equal(r->status->exit_code, 77);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	moat_rpc_client_close(c);
}

/* Sends a raw Envelope on a plain req socket and returns the Reply (the
 * caller frees), waiting up to GIVE_UP_S: the server's own answer is
 * seen even when the envelope's timeout is short. */
static Moat__V1__Reply *
raw_exec(nng_socket s, const char *word, uint64_t rid, uint32_t timeout_ms)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	char *argv[1] = { (char *)word };
	uint8_t payload[256], *buf;
	size_t n;
	nng_msg *msg;
	Moat__V1__Reply *r;

	req.sandbox_id = "sb";
	req.argv = argv;
	req.n_argv = 1;
	env.payload.len = moat__v1__exec_request__pack(&req, payload);
	env.payload.data = payload;
	env.service = "moat.v1.Vm";
	env.method = "Exec";
	env.request_id = rid;
	env.timeout_ms = timeout_ms;
	env.auth = "";
	env.tenant = "";
	n = moat__v1__envelope__get_packed_size(&env);
	buf = malloc(n);
	moat__v1__envelope__pack(&env, buf);
	assert_int_equal(nng_send(s, buf, n, 0), 0);
	free(buf);
	if (nng_recvmsg(s, &msg, 0) != 0)
		return NULL;
	r = moat__v1__reply__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
	nng_msg_free(msg);
	return r;
}

static nng_socket
raw_socket(const char *url)
{
	nng_socket s;

	assert_int_equal(nng_req0_open(&s), 0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME,
	                     NNG_DURATION_INFINITE),
	    0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_RECVTIMEO,
	                     GIVE_UP_S * 1000),
	    0);
	assert_int_equal(nng_dial(s, url, NULL, 0), 0);
	return s;
}

/* No completion by the deadline: the server answers DEADLINE_EXCEEDED
 * itself; a repeat meanwhile is "still running"; the late completion
 * is what a repeat gets after it. */
static void
test_deadline_then_repeat(void **state)
{
	struct fixture *f = *state;
	nng_socket s = raw_socket(f->url);
	uint64_t rid = 0x5eed0001;
	Moat__V1__Reply *r;
	Moat__V1__ExecResult *res;

	r = raw_exec(s, "41", rid, 200);
	assert_non_null(r);
	assert_int_equal(r->code, MOAT_DEADLINE_EXCEEDED);
	assert_non_null(strstr(r->message, "did not finish within"));
	moat__v1__reply__free_unpacked(r, NULL);

	r = raw_exec(s, "41", rid, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, MOAT_ABORTED);
	assert_non_null(strstr(r->message, "still running"));
	moat__v1__reply__free_unpacked(r, NULL);

	wait_held(f, 1);
	pthread_mutex_lock(&f->lock);
	complete_code(f->held[0], 41);
	f->n_held = 0;
	pthread_mutex_unlock(&f->lock);

	r = raw_exec(s, "41", rid, 5000);
	assert_non_null(r);
	assert_int_equal(r->code, MOAT_OK);
	res = moat__v1__exec_result__unpack(NULL, r->payload.len,
	    r->payload.data);
	assert_non_null(res);
	assert_int_equal(res->status->exit_code, 41);
	moat__v1__exec_result__free_unpacked(res, NULL);
	moat__v1__reply__free_unpacked(r, NULL);
	assert_int_equal(f->handler_runs, 1);
	nng_close(s);
}

/* The caller closes its socket before the completion: the reply is
 * dropped and the server goes on serving. */
static void
test_client_gone(void **state)
{
	struct fixture *f = *state;
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	char *argv[1] = { "5" };
	uint8_t payload[64], buf[512];
	nng_socket s = raw_socket(f->url);
	size_t n;

	req.sandbox_id = "sb";
	req.argv = argv;
	req.n_argv = 1;
	env.payload.len = moat__v1__exec_request__pack(&req, payload);
	env.payload.data = payload;
	env.service = "moat.v1.Vm";
	env.method = "Exec";
	env.request_id = 0x5eed0002;
	env.timeout_ms = 30000;
	env.auth = "";
	env.tenant = "";
	n = moat__v1__envelope__pack(&env, buf);
	assert_int_equal(nng_send(s, buf, n, 0), 0);
	wait_held(f, 1);
	nng_close(s);
	pthread_mutex_lock(&f->lock);
	complete_code(f->held[0], 5);
	f->n_held = 0;
	pthread_mutex_unlock(&f->lock);
	health_ok(f->url);
}

/* The server stops with calls still deferred: their completions come
 * later and free what is left (ASan checks that nothing leaks or is
 * used after it is freed). */
static void
test_stop_while_deferred(void **state)
{
	struct fixture *f = *state;
	static struct caller callers[3];
	pthread_t threads[3];

	for (int i = 0; i < 3; i++) {
		callers[i] = (struct caller){ .f = f, .index = i, .rv = -1 };
		assert_int_equal(pthread_create(&threads[i], NULL, caller_main,
		                     &callers[i]),
		    0);
	}
	wait_held(f, 3);
	/* One completes before the stop: its reply may or may not be
	 * sent; either way nothing breaks. */
	pthread_mutex_lock(&f->lock);
	complete_code(f->held[--f->n_held], 2);
	pthread_mutex_unlock(&f->lock);
	moat_rpc_server_stop(f->srv);
	f->srv = NULL;
	complete_held(f);
	for (int i = 0; i < 3; i++) {
		pthread_join(threads[i], NULL);
		assert_int_not_equal(callers[i].rv, -1);
	}
}

/* The detached dispatcher (the HTTP door's) waits for the completion on
 * the calling thread. */
struct completer {
	struct fixture *f;
};

static void *
completer_main(void *arg)
{
	struct fixture *f = arg;

	wait_held(f, 1);
	pthread_mutex_lock(&f->lock);
	complete_code(f->held[0], 9);
	f->n_held = 0;
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

static void
test_detached_dispatch(void **state)
{
	struct fixture *f = *state;
	struct moat_rpc_service svc = test_service(f);
	struct moat_rpc_server *det = NULL;
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	char *argv[1] = { "9" }, *err = NULL;
	uint8_t payload[64], buf[512], *out = NULL;
	size_t n, out_len = 0;
	Moat__V1__Reply *r;
	Moat__V1__ExecResult *res;
	pthread_t t;

	assert_int_equal(moat_rpc_server_new_detached(&det, &svc, &err),
	    MOAT_OK);
	req.sandbox_id = "sb";
	req.argv = argv;
	req.n_argv = 1;
	env.payload.len = moat__v1__exec_request__pack(&req, payload);
	env.payload.data = payload;
	env.service = "moat.v1.Vm";
	env.method = "Exec";
	env.request_id = 0x5eed0003;
	env.timeout_ms = GIVE_UP_S * 1000;
	env.auth = "";
	env.tenant = "";
	n = moat__v1__envelope__pack(&env, buf);
	assert_int_equal(pthread_create(&t, NULL, completer_main, f), 0);
	assert_int_equal(moat_rpc_server_dispatch(det, buf, n, &out, &out_len),
	    MOAT_OK);
	pthread_join(t, NULL);
	r = moat__v1__reply__unpack(NULL, out_len, out);
	assert_non_null(r);
	assert_int_equal(r->code, MOAT_OK);
	res = moat__v1__exec_result__unpack(NULL, r->payload.len,
	    r->payload.data);
	assert_int_equal(res->status->exit_code, 9);
	moat__v1__exec_result__free_unpacked(res, NULL);
	moat__v1__reply__free_unpacked(r, NULL);
	free(out);

	/* And its deadline, when no completion comes. */
	env.request_id = 0x5eed0004;
	env.timeout_ms = 100;
	n = moat__v1__envelope__pack(&env, buf);
	assert_int_equal(moat_rpc_server_dispatch(det, buf, n, &out, &out_len),
	    MOAT_OK);
	r = moat__v1__reply__unpack(NULL, out_len, out);
	assert_int_equal(r->code, MOAT_DEADLINE_EXCEEDED);
	moat__v1__reply__free_unpacked(r, NULL);
	free(out);
	complete_held(f);
	moat_rpc_server_stop(det);
}

/* ---- asynchronous calls ---- */

struct async_result {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int calls; /* how often the callback ran */
	int code;
	uint8_t *payload;
	size_t len;
	char *errmsg;
};

static void
async_done(void *arg, int code, uint8_t *payload, size_t len, char *errmsg)
{
	struct async_result *a = arg;

	pthread_mutex_lock(&a->lock);
	a->calls++;
	a->code = code;
	a->payload = payload;
	a->len = len;
	a->errmsg = errmsg;
	pthread_cond_broadcast(&a->cond);
	pthread_mutex_unlock(&a->lock);
}

static void
async_wait(struct async_result *a)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += GIVE_UP_S;
	pthread_mutex_lock(&a->lock);
	while (a->calls == 0)
		if (pthread_cond_timedwait(&a->cond, &a->lock, &ts) != 0)
			break;
	pthread_mutex_unlock(&a->lock);
	assert_int_equal(a->calls, 1);
}

static void
async_reset(struct async_result *a)
{
	free(a->payload);
	free(a->errmsg);
	a->payload = NULL;
	a->errmsg = NULL;
	a->calls = 0;
	a->code = -1;
}

static void
async_exec(struct moat_rpc_client *c, const char *word, uint32_t timeout_ms,
    struct async_result *a)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = timeout_ms };
	char *argv[1] = { (char *)word }, *err = NULL;
	uint8_t payload[64];
	size_t n;

	req.sandbox_id = "sb";
	req.argv = argv;
	req.n_argv = 1;
	n = moat__v1__exec_request__pack(&req, payload);
	assert_int_equal(moat_rpc_call_raw_async(c, "moat.v1.Vm", "Exec",
	                     payload, n, &opts, async_done, a, &err),
	    MOAT_OK);
}

static void
test_async_calls(void **state)
{
	struct fixture *f = *state;
	struct moat_rpc_client *c = open_client(f->url);
	struct async_result a = { .code = -1 };
	Moat__V1__ExecResult *res;

	pthread_mutex_init(&a.lock, NULL);
	pthread_cond_init(&a.cond, NULL);

	/* A reply, completed while the call is in flight. */
	async_exec(c, "12", 30000, &a);
	wait_held(f, 1);
	pthread_mutex_lock(&f->lock);
	complete_code(f->held[0], 12);
	f->n_held = 0;
	pthread_mutex_unlock(&f->lock);
	async_wait(&a);
	assert_int_equal(a.code, MOAT_OK);
	res = moat__v1__exec_result__unpack(NULL, a.len, a.payload);
	assert_non_null(res);
	assert_int_equal(res->status->exit_code, 12);
	moat__v1__exec_result__free_unpacked(res, NULL);
	async_reset(&a);

	/* The server's error comes back as it said it. */
	async_exec(c, "13", 30000, &a);
	wait_held(f, 1);
	pthread_mutex_lock(&f->lock);
	moat_rpc_complete(f->held[0], MOAT_NOT_FOUND, NULL, "no such thing");
	f->n_held = 0;
	pthread_mutex_unlock(&f->lock);
	async_wait(&a);
	assert_int_equal(a.code, MOAT_NOT_FOUND);
	assert_string_equal(a.errmsg, "no such thing");
	async_reset(&a);

	/* Nothing answers by the deadline. */
	async_exec(c, "14", 150, &a);
	async_wait(&a);
	assert_int_equal(a.code, MOAT_DEADLINE_EXCEEDED);
	assert_non_null(a.errmsg);
	async_reset(&a);
	complete_held(f);

	moat_rpc_client_close(c);
	/* No server at all. */
	{
		char url[160];

		snprintf(url, sizeof(url), "ipc://%s/nobody.sock", f->dir);
		c = open_client(url);
		async_exec(c, "15", 500, &a);
		async_wait(&a);
		assert_true(a.code == MOAT_UNAVAILABLE ||
		    a.code == MOAT_DEADLINE_EXCEEDED);
		async_reset(&a);
		moat_rpc_client_close(c);
	}
	pthread_cond_destroy(&a.cond);
	pthread_mutex_destroy(&a.lock);
}

/* A call built outside a server cannot be deferred. */
static void
test_defer_outside_server(void **state)
{
	struct moat_rpc_call call = { .method = "Exec" };

	(void)state;
	assert_null(moat_rpc_defer(&call));
}

/* ---- asynchronous in-process dispatch ---- */

struct dispatched {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int calls;       /* how often done ran */
	pthread_t where; /* the thread it ran on */
	uint8_t *reply;
	size_t len;
};

static void
dispatched_done(void *arg, uint8_t *reply, size_t len)
{
	struct dispatched *x = arg;

	pthread_mutex_lock(&x->lock);
	x->calls++;
	x->where = pthread_self();
	free(x->reply); /* a second run would leave one reply behind */
	x->reply = reply;
	x->len = len;
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
}

static void
dispatched_init(struct dispatched *x)
{
	memset(x, 0, sizeof(*x));
	pthread_mutex_init(&x->lock, NULL);
	pthread_cond_init(&x->cond, NULL);
}

/* dispatched_wait: waits (bounded) for done, then checks it ran once on
 * `thread` with a Reply of `code` (and, for Exec, exit code `exit`). */
static void
dispatched_check(struct dispatched *x, pthread_t thread, int code, int exit)
{
	struct timespec ts;
	Moat__V1__Reply *r;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += GIVE_UP_S;
	pthread_mutex_lock(&x->lock);
	while (x->calls == 0)
		if (pthread_cond_timedwait(&x->cond, &x->lock, &ts) != 0)
			break;
	pthread_mutex_unlock(&x->lock);
	assert_int_equal(x->calls, 1);
	assert_true(pthread_equal(x->where, thread));
	r = moat__v1__reply__unpack(NULL, x->len, x->reply);
	assert_non_null(r);
	assert_int_equal(r->code, code);
	if (exit >= 0) {
		Moat__V1__ExecResult *res = moat__v1__exec_result__unpack(NULL,
		    r->payload.len, r->payload.data);

		assert_non_null(res);
		assert_int_equal(res->status->exit_code, exit);
		moat__v1__exec_result__free_unpacked(res, NULL);
	}
	moat__v1__reply__free_unpacked(r, NULL);
	free(x->reply);
	pthread_cond_destroy(&x->cond);
	pthread_mutex_destroy(&x->lock);
}

/* pack_call: an Envelope of `method` (Exec with argv {word}) into buf. */
static size_t
pack_call(uint8_t *buf, const char *method, const char *word, uint64_t rid)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__Envelope env = MOAT__V1__ENVELOPE__INIT;
	char *argv[1] = { (char *)word };
	static uint8_t payload[64];

	req.sandbox_id = "sb";
	req.argv = argv;
	req.n_argv = 1;
	env.payload.len = strcmp(method, "Exec") == 0 ?
	    moat__v1__exec_request__pack(&req, payload) :
	    0;
	env.payload.data = payload;
	env.service = "moat.v1.Vm";
	env.method = (char *)method;
	env.request_id = rid;
	env.timeout_ms = GIVE_UP_S * 1000;
	env.auth = "";
	env.tenant = "";
	return moat__v1__envelope__pack(&env, buf);
}

/* dispatch_start: `method` (Exec with argv {word}) dispatched
 * asynchronously on det, its done into *x. */
static void
dispatch_start(struct moat_rpc_server *det, struct dispatched *x,
    const char *method, const char *word, uint64_t rid)
{
	uint8_t buf[512];
	size_t n = pack_call(buf, method, word, rid);

	dispatched_init(x);
	assert_int_equal(moat_rpc_server_dispatch_async(det, buf, n,
	                     dispatched_done, x),
	    0);
}

/* complete_elsewhere: the held Exec has no answer yet; a completer
 * thread answers it (exit code 9) and done runs once, on that thread. */
static void
complete_elsewhere(struct fixture *f, struct dispatched *x)
{
	pthread_t t;

	wait_held(f, 1);
	pthread_mutex_lock(&x->lock);
	assert_int_equal(x->calls, 0);
	pthread_mutex_unlock(&x->lock);
	assert_int_equal(pthread_create(&t, NULL, completer_main, f), 0);
	pthread_join(t, NULL);
	dispatched_check(x, t, MOAT_OK, 9);
}

static struct moat_rpc_server *
detached(struct fixture *f)
{
	struct moat_rpc_service svc = test_service(f);
	struct moat_rpc_server *det = NULL;
	char *err = NULL;

	assert_int_equal(moat_rpc_server_new_detached(&det, &svc, &err),
	    MOAT_OK);
	return det;
}

static void
test_dispatch_async(void **state)
{
	struct fixture *f = *state;
	struct moat_rpc_server *det = detached(f);
	struct dispatched x;

	/* A handler that answers at once: done on the caller's thread,
	 * before dispatch returns. */
	dispatch_start(det, &x, "Health", "", 0x5eed0101);
	assert_int_equal(x.calls, 1);
	dispatched_check(&x, pthread_self(), MOAT_OK, -1);
	/* Completed inside its handler: the caller's thread too. */
	dispatch_start(det, &x, "Exec", "now", 0x5eed0102);
	dispatched_check(&x, pthread_self(), MOAT_OK, 77);
	/* Deferred: dispatch returns with no reply; done runs once, on
	 * the completer's thread. */
	dispatch_start(det, &x, "Exec", "9", 0x5eed0103);
	complete_elsewhere(f, &x);
	moat_rpc_server_stop(det);
}

/* A server stopped while an asynchronous call is deferred: its memory
 * stays until the completion, whose done still runs once (ASan checks
 * that nothing leaks and nothing is used after it is freed). */
static void
test_dispatch_async_stopped(void **state)
{
	struct fixture *f = *state;
	struct moat_rpc_server *det = detached(f);
	struct dispatched x;

	dispatch_start(det, &x, "Exec", "5", 0x5eed0201);
	wait_held(f, 1);
	moat_rpc_server_stop(det);
	complete_elsewhere(f, &x);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
		    test_many_deferred_reverse_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_complete_inside_handler,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_deadline_then_repeat,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_client_gone, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_stop_while_deferred,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_detached_dispatch, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_async_calls, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_dispatch_async, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_dispatch_async_stopped,
		    setup, teardown),
		cmocka_unit_test(test_defer_outside_server),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
