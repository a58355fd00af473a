/*
 * test_concurrency.c: 16 threads append to two sessions at once through
 * one client. Every acknowledged step is there afterwards, each session's
 * indexes run 1..N without gaps or repeats, each step holds what the
 * append that got its index sent, and one thread's steps keep its order.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"
#include "moat/util.h"

#define THREADS 16
#define PER_THREAD 60
#define SESSIONS 2
#define TENANT "tenant-c"

struct appender {
	struct ses_proc *p;
	const char *session;
	int thread;
	uint64_t acked[PER_THREAD]; /* index of each append, 0: failed */
	char *error;                /* heap: the first failure */
};

static void *
appender_main(void *arg)
{
	struct appender *a = arg;
	char input[64], out[64];

	for (int i = 0; i < PER_THREAD; i++) {
		char *errmsg = NULL;
		int rv;

		snprintf(input, sizeof(input), "t%d-%d", a->thread, i);
		snprintf(out, sizeof(out), "out of t%d-%d\n", a->thread, i);
		rv = ses_append(a->p, TENANT, a->session, input, out,
		    strlen(out), &a->acked[i], &errmsg);
		if (rv != MOAT_OK && a->error == NULL)
			a->error = moat_asprintf("%s: %s", moat_strerror(rv),
			    errmsg ? errmsg : "");
		free(errmsg);
	}
	return NULL;
}

static void
test_concurrent_appenders(void **state)
{
	static struct appender apps[THREADS];
	struct ses_proc p = { 0 };
	pthread_t threads[THREADS];
	char *sessions[SESSIONS];
	/* owner[s][index] = thread * PER_THREAD + i + 1 */
	static int owner[SESSIONS][THREADS * PER_THREAD + 1];

	ses_start(&p, NULL);
	for (int s = 0; s < SESSIONS; s++)
		sessions[s] = ses_create(&p, TENANT, "sbx-conc");
	for (int t = 0; t < THREADS; t++) {
		apps[t] = (struct appender){ .p = &p,
			.thread = t,
			.session = sessions[t % SESSIONS] };
		assert_int_equal(pthread_create(&threads[t], NULL,
		                     appender_main, &apps[t]),
		    0);
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(threads[t], NULL);
	for (int t = 0; t < THREADS; t++) {
		if (apps[t].error != NULL)
			fail_msg("thread %d: %s", t, apps[t].error);
		for (int i = 0; i < PER_THREAD; i++) {
			uint64_t ix = apps[t].acked[i];

			assert_true(
			    ix >= 1 && ix <= THREADS / SESSIONS * PER_THREAD);
			/* No index handed out twice. */
			assert_int_equal(owner[t % SESSIONS][ix], 0);
			owner[t % SESSIONS][ix] = t * PER_THREAD + i + 1;
			if (i > 0)
				assert_true(ix > apps[t].acked[i - 1]);
		}
	}
	for (int s = 0; s < SESSIONS; s++) {
		uint64_t want = 1, n = THREADS / SESSIONS * PER_THREAD;
		char *token = NULL;

		do {
			Moat__V1__ListStepsRequest req =
			    MOAT__V1__LIST_STEPS_REQUEST__INIT;
			Moat__V1__ListStepsReply *r;
			ProtobufCMessage *reply;
			char *errmsg = NULL;

			req.tenant = (char *)TENANT;
			req.session_id = sessions[s];
			req.page_size = 97;
			req.page_token = token ? token : (char *)"";
			req.include_outputs = true;
			if (ses_call(&p, "ListSteps", &req.base,
			        &moat__v1__list_steps_reply__descriptor,
			        &reply, &errmsg) != MOAT_OK)
				fail_msg("ListSteps: %s", errmsg);
			r = (Moat__V1__ListStepsReply *)reply;
			for (size_t k = 0; k < r->n_steps; k++) {
				Moat__V1__Step *st = r->steps[k];
				int o = owner[s][st->index] - 1;
				char input[64], out[96];

				assert_int_equal(st->index, want);
				assert_true(o >= 0);
				snprintf(input, sizeof(input), "t%d-%d",
				    o / PER_THREAD, o % PER_THREAD);
				snprintf(out, sizeof(out), "out of %s\n",
				    input);
				assert_string_equal(st->input, input);
				assert_int_equal(st->stdout.len, strlen(out));
				assert_memory_equal(st->stdout.data, out,
				    strlen(out));
				want++;
			}
			free(token);
			token = r->next_page_token[0] ?
			    strdup(r->next_page_token) :
			    NULL;
			protobuf_c_message_free_unpacked(reply, NULL);
		} while (token != NULL);
		assert_int_equal(want - 1, n);
	}
	for (int s = 0; s < SESSIONS; s++)
		free(sessions[s]);
	ses_stop(&p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_concurrent_appenders,
		    ses_reap_all),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
