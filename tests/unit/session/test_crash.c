/*
 * test_crash.c: moat-sessiond killed with SIGKILL in the middle of 1000
 * appends from one client (four threads, so appends are in flight and
 * batched when it dies). After a restart on the same directory every
 * acknowledged step is there with what was sent, the indexes run 1..N
 * without gaps, and the rest of the 1000 appends go on from there. It
 * fails if sessiond acknowledges a step before its commit.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "harness.h"

#define TOTAL 1000
#define THREADS 4
#define KILL_AFTER 300 /* acknowledged appends before the kill */
#define TENANT "tenant-crash"

struct ack {
	uint64_t index;
	int seq; /* which append: its input is "a<seq>" */
};

static struct {
	pthread_mutex_t lock; /* guards everything below */
	struct ses_proc *p;
	const char *session;
	int next_seq;
	struct ack acks[TOTAL];
	size_t n_acks;
	bool stop; /* a call failed: sessiond is gone */
} run = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void
fmt_step(int seq, char *input, char *out, size_t cap)
{
	snprintf(input, cap, "a%d", seq);
	snprintf(out, cap, "stdout of append %d\n", seq);
}

static void *
client_main(void *arg)
{
	Moat__V1__AppendStepRequest req = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 2000 };
	char input[64], out[64];

	req.tenant = (char *)TENANT;
	req.step = &step;
	step.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	for (;;) {
		ProtobufCMessage *reply = NULL;
		char *errmsg = NULL;
		int seq, rv;

		pthread_mutex_lock(&run.lock);
		seq = run.stop || run.next_seq >= TOTAL ? -1 : run.next_seq++;
		req.session_id = (char *)run.session;
		pthread_mutex_unlock(&run.lock);
		if (seq < 0)
			break;
		fmt_step(seq, input, out, sizeof(input));
		step.input = input;
		step.stdout.data = (uint8_t *)out;
		step.stdout.len = strlen(out);
		rv = moat_rpc_call(run.p->client, "moat.v1.Session",
		    "AppendStep", &req.base,
		    &moat__v1__append_step_reply__descriptor, &reply, &opts,
		    &errmsg);
		pthread_mutex_lock(&run.lock);
		if (rv == MOAT_OK) {
			run.acks[run.n_acks].index =
			    ((Moat__V1__AppendStepReply *)reply)->index;
			run.acks[run.n_acks++].seq = seq;
		} else {
			run.stop = true;
		}
		pthread_mutex_unlock(&run.lock);
		protobuf_c_message_free_unpacked(reply, NULL);
		free(errmsg);
	}
	return NULL;
}

static void
run_clients(void)
{
	pthread_t threads[THREADS];

	for (int i = 0; i < THREADS; i++)
		assert_int_equal(pthread_create(&threads[i], NULL, client_main,
		                     NULL),
		    0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(threads[i], NULL);
}

/* check_all: every acknowledged step is there and holds what its append
 * sent; indexes 1..step_count all exist. Returns step_count. */
static uint64_t
check_all(struct ses_proc *p)
{
	Moat__V1__GetSessionRequest greq = MOAT__V1__GET_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	uint64_t count;
	char *errmsg = NULL;

	greq.tenant = (char *)TENANT;
	greq.session_id = (char *)run.session;
	if (ses_call(p, "GetSession", &greq.base,
	        &moat__v1__session_info__descriptor, &reply,
	        &errmsg) != MOAT_OK)
		fail_msg("GetSession after restart: %s", errmsg);
	count = ((Moat__V1__SessionInfo *)reply)->step_count;
	protobuf_c_message_free_unpacked(reply, NULL);
	if (count < run.n_acks)
		fail_msg("%zu appends were acknowledged but the session has "
		         "%llu steps after SIGKILL",
		    run.n_acks, (unsigned long long)count);
	for (size_t i = 0; i < run.n_acks; i++) {
		Moat__V1__GetStepRequest req =
		    MOAT__V1__GET_STEP_REQUEST__INIT;
		Moat__V1__Step *st;
		char input[64], out[64];

		req.tenant = (char *)TENANT;
		req.session_id = (char *)run.session;
		req.index = run.acks[i].index;
		if (ses_call(p, "GetStep", &req.base,
		        &moat__v1__step__descriptor, &reply,
		        &errmsg) != MOAT_OK)
			fail_msg("acknowledged step %llu (append %d) is lost: "
			         "%s",
			    (unsigned long long)req.index, run.acks[i].seq,
			    errmsg);
		st = (Moat__V1__Step *)reply;
		fmt_step(run.acks[i].seq, input, out, sizeof(input));
		assert_string_equal(st->input, input);
		assert_int_equal(st->stdout.len, strlen(out));
		assert_memory_equal(st->stdout.data, out, strlen(out));
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	for (uint64_t ix = 1; ix <= count; ix++) {
		Moat__V1__GetStepRequest req =
		    MOAT__V1__GET_STEP_REQUEST__INIT;

		req.tenant = (char *)TENANT;
		req.session_id = (char *)run.session;
		req.index = ix;
		req.omit_outputs = true;
		if (ses_call(p, "GetStep", &req.base,
		        &moat__v1__step__descriptor, &reply,
		        &errmsg) != MOAT_OK)
			fail_msg("step %llu of %llu is missing: %s",
			    (unsigned long long)ix, (unsigned long long)count,
			    errmsg);
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	return count;
}

static void
test_sigkill_mid_appends(void **state)
{
	struct ses_proc p = { 0 };
	uint64_t count;
	size_t acked_before;
	char *session;
	int status, waited = 0;

	ses_start(&p, NULL);
	session = ses_create(&p, TENANT, "sbx-crash");
	run.p = &p;
	run.session = session;
	{
		pthread_t threads[THREADS];

		for (int i = 0; i < THREADS; i++)
			assert_int_equal(pthread_create(&threads[i], NULL,
			                     client_main, NULL),
			    0);
		/* Kill while the clients are appending. */
		for (;;) {
			size_t n;

			pthread_mutex_lock(&run.lock);
			n = run.n_acks;
			pthread_mutex_unlock(&run.lock);
			if (n >= KILL_AFTER || waited++ > 6000)
				break;
			nng_msleep(1);
		}
		status = ses_kill(&p, SIGKILL);
		for (int i = 0; i < THREADS; i++)
			pthread_join(threads[i], NULL);
	}
	assert_true(WIFSIGNALED(status));
	acked_before = run.n_acks;
	assert_true(acked_before >= KILL_AFTER);
	assert_true(run.next_seq < TOTAL); /* it died mid-run */

	ses_start(&p, NULL);
	count = check_all(&p);
	print_message("killed after %zu acknowledged appends; %llu steps "
	              "after restart\n",
	    acked_before, (unsigned long long)count);

	/* The rest of the 1000 go on after the last step. */
	run.stop = false;
	run_clients();
	assert_int_equal(run.next_seq, TOTAL);
	assert_true(!run.stop);
	check_all(&p);
	free(session);
	ses_stop(&p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_sigkill_mid_appends,
		    ses_reap_all),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
