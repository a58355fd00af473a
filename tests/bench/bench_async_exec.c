/*
 * bench_async_exec.c: many long one-shot execs through the gateway while
 * other calls must stay fast (issue 15, part 7). Creates N sandboxes
 * through a running gateway, starts M `sleep S` Execs spread over them
 * all at once (asynchronous calls: this program holds no thread per
 * exec either), and probes GetSandbox every 100 ms until every exec has
 * answered; writes the GetSandbox latencies (p50, p95, p99, max) and the
 * outcome as JSON. --waits K also starts K `sleep S; echo done` execs
 * with ExecStart and waits for them with long polls, half ExecWait and
 * half ExecRead, also asynchronous (they too must hold no worker).
 * --baseline B (default 20) first probes GetSandbox for B seconds with
 * the sandboxes idle, side by side in the same run: the p99 under load
 * over that idle p99 is the ratio to read (the TCG guests alone load
 * this 2-core machine), reported as getsandbox_idle and p99_ratio.
 * --record R also creates R recorded sandboxes (CreateSandbox record,
 * snapshots MANUAL: no snapshot per step) and sends each --record-execs E
 * execs of `sleep --record-sleep` (default 1) at once: each becomes a
 * step of its session, and the steps of one sandbox run one after the
 * other, so R * E of them wait for their turn (more than the gateway's
 * 64 workers in the test) while holding none.
 * With --check it is the pass/fail test of
 * tests/integration/stack/async_exec_test.sh: it fails unless every
 * GetSandbox answered OK, every exec answered with exit code 0 and each
 * recorded sandbox's session has as many steps as execs were sent to
 * it; it never fails on a time. Run as
 *   moat-bench-async-exec GATEWAY_URL API_KEY OUT.json
 *       [--sandboxes N] [--execs M] [--sleep S] [--memory MIB]
 *       [--waits K] [--record R] [--record-execs E] [--record-sleep T]
 *       [--check]
 * (deploy/moat-stack start gives the url ipc://<state>/gateway.sock and
 * the key <state>/api-key).
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "session.pb-c.h"
#include "vm.pb-c.h"
#include "bench_stats.h"

#define GW "moat.v1.Gateway"
#define MAX_SANDBOXES 64
#define MAX_EXECS 4096
#define MAX_RECORDED 1024 /* recorded execs, all sandboxes */
#define PROBE_EVERY_MS 100
#define PROBE_TIMEOUT_MS 30000

enum call_kind { CALL_EXEC, CALL_WAIT, CALL_READ };

struct exec_call {
	enum call_kind kind;
	int code;             /* -1 while in flight */
	int exit_code;        /* -1 unless the exec answered */
	char *errmsg;         /* heap, or NULL */
	bool recording_error; /* a recorded exec's reply said one */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int n_done; /* guarded by lock */

static void
exec_done(void *arg, int code, uint8_t *payload, size_t len, char *errmsg)
{
	struct exec_call *e = arg;
	Moat__V1__ExecResult *r;
	Moat__V1__ExecStatus *st;
	Moat__V1__ExecReadReply *rr;

	e->code = code;
	e->errmsg = errmsg;
	if (code == MOAT_OK && e->kind == CALL_EXEC &&
	    (r = moat__v1__exec_result__unpack(NULL, len, payload)) != NULL) {
		e->exit_code = r->status != NULL ? r->status->exit_code : -1;
		e->recording_error = r->recording_error != NULL &&
		    r->recording_error[0] != '\0';
		moat__v1__exec_result__free_unpacked(r, NULL);
	} else if (code == MOAT_OK && e->kind == CALL_WAIT &&
	    (st = moat__v1__exec_status__unpack(NULL, len, payload)) != NULL) {
		e->exit_code = st->exited ? st->exit_code : -1;
		moat__v1__exec_status__free_unpacked(st, NULL);
	} else if (code == MOAT_OK && e->kind == CALL_READ &&
	    (rr = moat__v1__exec_read_reply__unpack(NULL, len, payload)) !=
	        NULL) {
		/* The long poll answers when the output comes. */
		e->exit_code = rr->stdout.len == 5 &&
		        memcmp(rr->stdout.data, "done\n", 5) == 0 ?
		    0 :
		    -1;
		moat__v1__exec_read_reply__free_unpacked(rr, NULL);
	}
	free(payload);
	pthread_mutex_lock(&lock);
	n_done++;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
}

static int
done_count(void)
{
	int n;

	pthread_mutex_lock(&lock);
	n = n_done;
	pthread_mutex_unlock(&lock);
	return n;
}

struct opts {
	const char *url, *key, *out;
	int sandboxes, execs, sleep_s, waits;
	int baseline_s;           /* idle probing before the execs */
	int record, record_execs; /* recorded sandboxes, execs each */
	int record_sleep;         /* s, each recorded exec */
	uint32_t memory_mib;
	bool check;
};

static int
parse(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){ .sandboxes = 10,
		.execs = 500,
		.sleep_s = 30,
		.record_execs = 16,
		.record_sleep = 1,
		.baseline_s = 20,
		.memory_mib = 256 };
	if (argc < 4)
		return -1;
	o->url = argv[1];
	o->key = argv[2];
	o->out = argv[3];
	for (int i = 4; i < argc; i++) {
		if (strcmp(argv[i], "--check") == 0)
			o->check = true;
		else if (i + 1 < argc && strcmp(argv[i], "--sandboxes") == 0)
			o->sandboxes = atoi(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--execs") == 0)
			o->execs = atoi(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--waits") == 0)
			o->waits = atoi(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--sleep") == 0)
			o->sleep_s = atoi(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--record") == 0)
			o->record = atoi(argv[++i]);
		else if (i + 1 < argc &&
		    strcmp(argv[i], "--record-execs") == 0)
			o->record_execs = atoi(argv[++i]);
		else if (i + 1 < argc &&
		    strcmp(argv[i], "--record-sleep") == 0)
			o->record_sleep = atoi(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--baseline") == 0)
			o->baseline_s = atoi(argv[++i]);
		else if (i + 1 < argc && strcmp(argv[i], "--memory") == 0)
			o->memory_mib = (uint32_t)atoi(argv[++i]);
		else
			return -1;
	}
	if (o->sandboxes < 1 || o->record < 0 || o->record_execs < 1 ||
	    o->record_sleep < 0 || o->baseline_s < 0 ||
	    o->sandboxes + o->record > MAX_SANDBOXES || o->execs < 1 ||
	    o->execs > MAX_EXECS || o->sleep_s < 0 ||
	    o->record * o->record_execs > MAX_RECORDED)
		return -1;
	return 0;
}

/* Creates o->sandboxes sandboxes, then o->record recorded ones, into
 * ids (heap strings); the number made. */
static int
create_sandboxes(struct moat_rpc_client *c, const struct opts *o, char **ids)
{
	struct moat_rpc_opts ro = { .timeout_ms = 300000, .auth = o->key };
	int n = 0;

	for (int i = 0; i < o->sandboxes + o->record; i++) {
		Moat__V1__CreateSandboxRequest req =
		    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
		Moat__V1__Sandbox *sb = NULL;
		char *msg = NULL;
		int rv;

		req.memory_mib = o->memory_mib;
		req.record = i >= o->sandboxes;
		req.snapshot_policy =
		    MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_MANUAL;
		ro.request_id = 0;
		rv = moat_rpc_call(c, GW, "CreateSandbox", &req.base,
		    &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&sb,
		    &ro, &msg);
		if (rv != MOAT_OK) {
			fprintf(stderr, "bench: CreateSandbox %d: %s: %s\n", i,
			    moat_strerror(rv), msg ? msg : "");
			free(msg);
			break;
		}
		ids[n++] = strdup(sb->id);
		protobuf_c_message_free_unpacked(&sb->base, NULL);
	}
	return n;
}

static void
destroy_sandboxes(struct moat_rpc_client *c, const struct opts *o, char **ids,
    int n)
{
	struct moat_rpc_opts ro = { .timeout_ms = 120000, .auth = o->key };

	for (int i = 0; i < n; i++) {
		Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
		ProtobufCMessage *r = NULL;
		char *msg = NULL;

		ref.sandbox_id = ids[i];
		if (moat_rpc_call(c, GW, "DestroySandbox", &ref.base,
		        &moat__v1__empty__descriptor, &r, &ro,
		        &msg) == MOAT_OK)
			protobuf_c_message_free_unpacked(r, NULL);
		free(msg);
		free(ids[i]);
	}
}

/* Starts every exec; the number started. */
static int
start_execs(struct moat_rpc_client *c, const struct opts *o, char **ids,
    int n_ids, struct exec_call *calls)
{
	struct moat_rpc_opts ro = { .auth = o->key };
	char secs[16], *argv[2] = { "sleep", secs };
	int n = 0;

	ro.timeout_ms = (uint32_t)(o->sleep_s + 300) * 1000u;
	snprintf(secs, sizeof(secs), "%d", o->sleep_s);
	for (int i = 0; i < o->execs; i++) {
		Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
		uint8_t payload[512];
		size_t len;
		char *msg = NULL;
		int rv;

		req.sandbox_id = ids[i % n_ids];
		req.argv = argv;
		req.n_argv = 2;
		req.timeout_ms = (uint32_t)(o->sleep_s + 240) * 1000u;
		len = moat__v1__exec_request__pack(&req, payload);
		calls[i] = (struct exec_call){ .code = -1, .exit_code = -1 };
		rv = moat_rpc_call_raw_async(c, GW, "Exec", payload, len, &ro,
		    exec_done, &calls[i], &msg);
		if (rv != MOAT_OK) {
			fprintf(stderr, "bench: Exec %d not sent: %s: %s\n", i,
			    moat_strerror(rv), msg ? msg : "");
			free(msg);
			break;
		}
		n++;
	}
	return n;
}

/* Starts `waits` execs with ExecStart and long-polls each, ExecWait and
 * ExecRead in turn, asynchronously; the number of polls sent. */
static int
start_waits(struct moat_rpc_client *c, const struct opts *o, char **ids,
    int n_ids, struct exec_call *calls)
{
	struct moat_rpc_opts ro = { .auth = o->key, .timeout_ms = 60000 };
	char script[64], *argv[3] = { "sh", "-c", script };
	int n = 0;

	snprintf(script, sizeof(script), "sleep %d; echo done", o->sleep_s);
	for (int i = 0; i < o->waits; i++) {
		Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
		Moat__V1__ExecWaitRequest wr =
		    MOAT__V1__EXEC_WAIT_REQUEST__INIT;
		Moat__V1__ExecReadRequest rr =
		    MOAT__V1__EXEC_READ_REQUEST__INIT;
		Moat__V1__ExecHandle *h = NULL;
		uint8_t payload[512];
		size_t len;
		char *msg = NULL;
		int rv;

		req.sandbox_id = ids[i % n_ids];
		req.argv = argv;
		req.n_argv = 3;
		ro.timeout_ms = 60000;
		rv = moat_rpc_call(c, GW, "ExecStart", &req.base,
		    &moat__v1__exec_handle__descriptor,
		    (ProtobufCMessage **)&h, &ro, &msg);
		if (rv != MOAT_OK) {
			fprintf(stderr, "bench: ExecStart %d: %s: %s\n", i,
			    moat_strerror(rv), msg ? msg : "");
			free(msg);
			break;
		}
		calls[i] =
		    (struct exec_call){ .kind = i % 2 ? CALL_READ : CALL_WAIT,
			    .code = -1,
			    .exit_code = -1 };
		ro.timeout_ms = (uint32_t)(o->sleep_s + 300) * 1000u;
		if (calls[i].kind == CALL_WAIT) {
			wr.sandbox_id = req.sandbox_id;
			wr.exec_id = h->exec_id;
			wr.wait_ms = (uint32_t)(o->sleep_s + 240) * 1000u;
			len = moat__v1__exec_wait_request__pack(&wr, payload);
		} else {
			rr.sandbox_id = req.sandbox_id;
			rr.exec_id = h->exec_id;
			rr.wait_ms = (uint32_t)(o->sleep_s + 240) * 1000u;
			len = moat__v1__exec_read_request__pack(&rr, payload);
		}
		moat__v1__exec_handle__free_unpacked(h, NULL);
		rv = moat_rpc_call_raw_async(c, GW,
		    calls[i].kind == CALL_WAIT ? "ExecWait" : "ExecRead",
		    payload, len, &ro, exec_done, &calls[i], &msg);
		if (rv != MOAT_OK) {
			fprintf(stderr,
			    "bench: long poll %d not sent: %s: %s\n", i,
			    moat_strerror(rv), msg ? msg : "");
			free(msg);
			break;
		}
		n++;
	}
	return n;
}

/* Sends o->record_execs execs of `sleep o->record_sleep` to each
 * recorded sandbox (ids[o->sandboxes...]), all at once; the number
 * sent. */
static int
start_recorded(struct moat_rpc_client *c, const struct opts *o, char **ids,
    struct exec_call *calls)
{
	struct moat_rpc_opts ro = { .auth = o->key };
	int sleep_s = o->record_sleep, n = 0;
	char secs[16], *argv[2] = { "sleep", secs };

	/* A step waits for the steps of its sandbox sent before it. */
	ro.timeout_ms =
	    (uint32_t)(o->record_execs * (sleep_s + 30) + 300) * 1000u;
	snprintf(secs, sizeof(secs), "%d", sleep_s);
	for (int i = 0; i < o->record * o->record_execs; i++) {
		Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
		uint8_t payload[512];
		size_t len;
		char *msg = NULL;

		req.sandbox_id = ids[o->sandboxes + i % o->record];
		req.argv = argv;
		req.n_argv = 2;
		req.timeout_ms = (uint32_t)(sleep_s + 240) * 1000u;
		len = moat__v1__exec_request__pack(&req, payload);
		calls[i] = (struct exec_call){ .code = -1, .exit_code = -1 };
		if (moat_rpc_call_raw_async(c, GW, "Exec", payload, len, &ro,
		        exec_done, &calls[i], &msg) != MOAT_OK) {
			fprintf(stderr,
			    "bench: recorded Exec %d not sent: "
			    "%s\n",
			    i, msg ? msg : "");
			free(msg);
			break;
		}
		n++;
	}
	return n;
}

/* recorded_steps: the number of steps in the session of recorded
 * sandbox `id`; -1 when it cannot be read. */
static int
recorded_steps(struct moat_rpc_client *c, const struct opts *o, const char *id)
{
	struct moat_rpc_opts ro = { .timeout_ms = 60000, .auth = o->key };
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ListStepsRequest lreq = MOAT__V1__LIST_STEPS_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__ListStepsReply *steps = NULL;
	char *msg = NULL;
	int n = -1;

	ref.sandbox_id = (char *)id;
	if (moat_rpc_call(c, GW, "GetSandbox", &ref.base,
	        &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&sb, &ro,
	        &msg) != MOAT_OK)
		goto out;
	lreq.session_id = sb->session_id;
	lreq.page_size = 1000;
	if (moat_rpc_call(c, GW, "ListSteps", &lreq.base,
	        &moat__v1__list_steps_reply__descriptor,
	        (ProtobufCMessage **)&steps, &ro, &msg) == MOAT_OK)
		n = (int)steps->n_steps;
out:
	if (n < 0)
		fprintf(stderr, "bench: the session of %s: %s\n", id,
		    msg ? msg : "?");
	free(msg);
	if (sb != NULL)
		moat__v1__sandbox__free_unpacked(sb, NULL);
	if (steps != NULL)
		moat__v1__list_steps_reply__free_unpacked(steps, NULL);
	return n;
}

/* Probes GetSandbox until `started` execs answered (or a bound far past
 * their sleep), or with `for_s` > 0 for that long; latencies into *ms
 * (heap), failures counted. */
static size_t
probe(struct moat_rpc_client *c, const struct opts *o, char **ids, int n_ids,
    int started, int for_s, double **ms, int *failures)
{
	struct moat_rpc_opts ro = { .timeout_ms = PROBE_TIMEOUT_MS,
		.auth = o->key };
	double give_up =
	    bench_now_ms() + (for_s > 0 ? for_s : o->sleep_s + 600) * 1000.0;
	size_t n = 0, cap = 1024;

	*ms = malloc(cap * sizeof(**ms));
	*failures = 0;
	for (int i = 0;
	     (for_s > 0 || done_count() < started) && bench_now_ms() < give_up;
	     i++) {
		Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
		ProtobufCMessage *r = NULL;
		char *msg = NULL;
		double t0 = bench_now_ms();
		int rv;

		ref.sandbox_id = ids[i % n_ids];
		rv = moat_rpc_call(c, GW, "GetSandbox", &ref.base,
		    &moat__v1__sandbox__descriptor, &r, &ro, &msg);
		if (rv == MOAT_OK) {
			protobuf_c_message_free_unpacked(r, NULL);
			if (n == cap)
				*ms = realloc(*ms, (cap *= 2) * sizeof(**ms));
			(*ms)[n++] = bench_now_ms() - t0;
		} else {
			if (*failures < 5)
				fprintf(stderr, "bench: GetSandbox: %s: %s\n",
				    moat_strerror(rv), msg ? msg : "");
			(*failures)++;
		}
		free(msg);
		nanosleep(&(struct timespec){ .tv_nsec =
		                                  PROBE_EVERY_MS * 1000000L },
		    NULL);
	}
	return n;
}

/* count_recorded: the recorded execs that answered exit code 0 (their
 * errmsg freed); those whose reply names a recording error into
 * *errors. */
static int
count_recorded(struct exec_call *calls, int n, int *errors, int *shown)
{
	int ok = 0;

	*errors = 0;
	for (int i = 0; i < n; i++) {
		if (calls[i].code == MOAT_OK && calls[i].exit_code == 0)
			ok++;
		else if ((*shown)++ < 10)
			fprintf(stderr,
			    "bench: recorded exec %d: %s (exit %d): %s\n", i,
			    calls[i].code < 0 ? "no answer" :
			                        moat_strerror(calls[i].code),
			    calls[i].exit_code,
			    calls[i].errmsg ? calls[i].errmsg : "");
		if (calls[i].recording_error)
			(*errors)++;
		free(calls[i].errmsg);
	}
	return ok;
}

/* check_sessions: the recorded sandboxes whose session does not have a
 * step per exec sent to it (execs sent round-robin). */
static int
check_sessions(struct moat_rpc_client *c, const struct opts *o, char **ids,
    int sent)
{
	int mismatched = 0;

	for (int r = 0; r < o->record; r++) {
		int want = sent / o->record + (r < sent % o->record ? 1 : 0);
		int have = recorded_steps(c, o, ids[o->sandboxes + r]);

		if (have != want) {
			fprintf(stderr,
			    "bench: recorded sandbox %s: %d steps for %d "
			    "execs\n",
			    ids[o->sandboxes + r], have, want);
			mismatched++;
		}
	}
	return mismatched;
}

/* Waits (bounded) for the execs still in flight, so their memory is not
 * freed under a late callback. */
static void
wait_all(int started)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 600;
	pthread_mutex_lock(&lock);
	while (n_done < started)
		if (pthread_cond_timedwait(&cond, &lock, &ts) != 0)
			break;
	pthread_mutex_unlock(&lock);
}

int
main(int argc, char **argv)
{
	static struct exec_call calls[MAX_EXECS], rcalls[MAX_RECORDED];
	struct moat_rpc_client *c = NULL;
	char *ids[MAX_SANDBOXES], *msg = NULL;
	int n_ids, started, waited = 0, failures = 0, ok = 0, shown = 0;
	int waits_ok = 0, recorded, rec_ok = 0, rec_errors = 0, mismatched;
	double *ms = NULL, *idle = NULL, t0, execs_ms, p99_idle;
	size_t n_ms, n_idle = 0;
	int idle_failures = 0;
	struct opts o;
	json_t *out, *lat;
	bool pass;

	if (parse(argc, argv, &o) != 0) {
		fprintf(stderr,
		    "usage: %s GATEWAY_URL API_KEY OUT.json [--sandboxes N] "
		    "[--execs M] [--sleep S] [--memory MIB] [--waits K] "
		    "[--record R] [--record-execs E] [--record-sleep T] "
		    "[--baseline B] [--check]\n",
		    argv[0]);
		return 2;
	}
	if (moat_rpc_client_open(&c, o.url, &msg) != MOAT_OK) {
		fprintf(stderr, "bench: %s\n", msg);
		return 1;
	}
	if ((n_ids = create_sandboxes(c, &o, ids)) < o.sandboxes + o.record) {
		destroy_sandboxes(c, &o, ids, n_ids);
		return 1;
	}
	if (o.baseline_s > 0)
		n_idle = probe(c, &o, ids, n_ids, 0, o.baseline_s, &idle,
		    &idle_failures);
	t0 = bench_now_ms();
	if (o.waits > MAX_EXECS / 2)
		o.waits = MAX_EXECS / 2;
	if (o.execs > MAX_EXECS / 2)
		o.execs = MAX_EXECS / 2;
	waited = start_waits(c, &o, ids, o.sandboxes, calls + MAX_EXECS / 2);
	started = start_execs(c, &o, ids, o.sandboxes, calls);
	recorded = start_recorded(c, &o, ids, rcalls);
	n_ms = probe(c, &o, ids, n_ids, started + waited + recorded, 0, &ms,
	    &failures);
	wait_all(started + waited + recorded);
	execs_ms = bench_now_ms() - t0;
	rec_ok = count_recorded(rcalls, recorded, &rec_errors, &shown);
	mismatched = check_sessions(c, &o, ids, recorded);
	for (int i = 0; i < started; i++) {
		if (calls[i].code == MOAT_OK && calls[i].exit_code == 0) {
			ok++;
		} else if (shown++ < 5) {
			fprintf(stderr, "bench: exec %d: %s (exit %d): %s\n",
			    i,
			    calls[i].code < 0 ? "no answer" :
			                        moat_strerror(calls[i].code),
			    calls[i].exit_code,
			    calls[i].errmsg ? calls[i].errmsg : "");
		}
		free(calls[i].errmsg);
	}
	for (int i = MAX_EXECS / 2; i < MAX_EXECS / 2 + waited; i++) {
		if (calls[i].code == MOAT_OK && calls[i].exit_code == 0)
			waits_ok++;
		else if (shown++ < 10)
			fprintf(stderr, "bench: %s %d: %s: %s\n",
			    calls[i].kind == CALL_WAIT ? "ExecWait" :
			                                 "ExecRead",
			    i - MAX_EXECS / 2,
			    calls[i].code < 0 ? "no answer" :
			                        moat_strerror(calls[i].code),
			    calls[i].errmsg ? calls[i].errmsg : "(not done)");
		free(calls[i].errmsg);
	}
	destroy_sandboxes(c, &o, ids, n_ids);
	moat_rpc_client_close(c);

	lat = bench_summary(ms, n_ms);
	json_object_set_new(lat, "p99_ms",
	    json_real(bench_percentile(ms, n_ms, 0.99)));
	p99_idle = n_idle ? bench_percentile(idle, n_idle, 0.99) : 0;
	out = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, "
	                "s:f, s:o, s:i, s:i, s:i, s:i, s:i}",
	    "what", "GetSandbox through the gateway while long execs run",
	    "sandboxes", o.sandboxes, "execs", o.execs, "execs_started",
	    started, "execs_ok", ok, "long_polls", waited, "long_polls_ok",
	    waits_ok, "sleep_s", o.sleep_s, "probes", (int)n_ms + failures,
	    "probe_failures", failures, "execs_wall_ms", execs_ms,
	    "getsandbox", lat, "recorded_sandboxes", o.record,
	    "recorded_execs", recorded, "recorded_ok", rec_ok,
	    "recording_errors", rec_errors, "sessions_mismatched", mismatched);
	if (out != NULL && n_idle > 0) {
		json_t *il = bench_summary(idle, n_idle);

		json_object_set_new(il, "p99_ms", json_real(p99_idle));
		json_object_set_new(il, "seconds", json_integer(o.baseline_s));
		json_object_set_new(il, "failures",
		    json_integer(idle_failures));
		json_object_set_new(out, "getsandbox_idle", il);
		json_object_set_new(out, "p99_ratio",
		    json_real(p99_idle > 0 ?
		            bench_percentile(ms, n_ms, 0.99) / p99_idle :
		            0));
	}
	if (out == NULL || json_dump_file(out, o.out, JSON_INDENT(2)) != 0)
		fprintf(stderr, "bench: cannot write %s\n", o.out);
	printf(
	    "execs %d/%d ok in %.0f ms; GetSandbox %zu answered, %d failed, "
	    "p50 %.1f ms p99 %.1f ms max %.1f ms\n",
	    ok, o.execs, execs_ms, n_ms, failures,
	    bench_percentile(ms, n_ms, 0.5), bench_percentile(ms, n_ms, 0.99),
	    n_ms ? ms[n_ms - 1] : 0.0);
	if (n_idle > 0)
		printf("GetSandbox idle (%d s before the execs): p50 %.1f ms "
		       "p99 %.1f ms\n",
		    o.baseline_s, bench_percentile(idle, n_idle, 0.5),
		    p99_idle);
	json_decref(out);
	free(ms);
	free(idle);
	pass = ok == o.execs && waits_ok == o.waits && failures == 0 &&
	    idle_failures == 0 && n_ms > 0 &&
	    rec_ok == o.record * o.record_execs && mismatched == 0;
	if (o.check && !pass) {
		fprintf(stderr,
		    "FAIL: %d of %d execs ok, %d of %d long polls ok, %d "
		    "GetSandbox calls failed, %d of %d recorded execs ok, %d "
		    "sessions without a step per exec\n",
		    ok, o.execs, waits_ok, o.waits, failures, rec_ok,
		    o.record * o.record_execs, mismatched);
		return 1;
	}
	return 0;
}
