/*
 * test_idem.c: moat-sessiond's idempotency claims (issue 15,
 * services/session/idem.c) over RPC on the real binary: first claim runs,
 * a second waits (RUNNING), after CompleteRequest every claim gets the
 * stored reply, status and message; another method's id is refused; a
 * release lets the call run again; a lease that runs out is taken over;
 * keys expire after idempotency-ttl-s and are bounded by
 * idempotency-max-keys; tenants apart; claims survive a SIGKILL.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "moat/status.h"

#define RUNNING MOAT__V1__CLAIM_STATE__CLAIM_STATE_RUNNING
#define FIRST MOAT__V1__CLAIM_STATE__CLAIM_STATE_FIRST
#define DONE MOAT__V1__CLAIM_STATE__CLAIM_STATE_DONE

/* claim: the state, or -status on failure (*err then set when asked). */
static int
claim(struct ses_proc *p, const char *tenant, uint64_t rid, const char *method,
    uint32_t lease_ms, Moat__V1__ClaimRequestReply **out, char **err)
{
	Moat__V1__ClaimRequestRequest req =
	    MOAT__V1__CLAIM_REQUEST_REQUEST__INIT;
	Moat__V1__ClaimRequestReply *r = NULL;
	int rv, state;

	req.tenant = (char *)tenant;
	req.request_id = rid;
	req.method = (char *)method;
	req.lease_ms = lease_ms;
	rv = ses_call_as(p, tenant, "ClaimRequest", &req.base,
	    &moat__v1__claim_request_reply__descriptor,
	    (ProtobufCMessage **)&r, err);
	if (rv != MOAT_OK)
		return -rv;
	state = r->state;
	if (out != NULL)
		*out = r;
	else
		moat__v1__claim_request_reply__free_unpacked(r, NULL);
	return state;
}

static int
complete(struct ses_proc *p, const char *tenant, uint64_t rid,
    const char *method, int code, const char *message, const char *reply,
    bool release, char **err)
{
	Moat__V1__CompleteRequestRequest req =
	    MOAT__V1__COMPLETE_REQUEST_REQUEST__INIT;
	ProtobufCMessage *r = NULL;
	int rv;

	req.tenant = (char *)tenant;
	req.request_id = rid;
	req.method = (char *)method;
	req.code = code;
	req.message = (char *)message;
	req.reply.data = (uint8_t *)reply;
	req.reply.len = reply ? strlen(reply) : 0;
	req.release = release;
	rv = ses_call_as(p, tenant, "CompleteRequest", &req.base,
	    &moat__v1__complete_request_reply__descriptor, &r, err);
	if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	return rv;
}

static void
first_running_done(void **state)
{
	struct ses_proc *p = *state;
	Moat__V1__ClaimRequestReply *r = NULL;
	char *err = NULL;

	assert_int_equal(claim(p, "t1", 42, "CreateSandbox", 60000, NULL,
	                     NULL),
	    FIRST);
	assert_int_equal(claim(p, "t1", 42, "CreateSandbox", 60000, NULL,
	                     NULL),
	    RUNNING);
	/* Another tenant's id 42 is its own. */
	assert_int_equal(claim(p, "t2", 42, "CreateSandbox", 60000, NULL,
	                     NULL),
	    FIRST);
	assert_int_equal(complete(p, "t1", 42, "CreateSandbox", MOAT_OK, "",
	                     "the-reply", false, NULL),
	    MOAT_OK);
	assert_int_equal(claim(p, "t1", 42, "CreateSandbox", 60000, &r, NULL),
	    DONE);
	assert_int_equal(r->code, MOAT_OK);
	assert_int_equal(r->reply.len, 9);
	assert_memory_equal(r->reply.data, "the-reply", 9);
	moat__v1__claim_request_reply__free_unpacked(r, NULL);
	/* An error outcome is stored too. */
	assert_int_equal(complete(p, "t2", 42, "CreateSandbox",
	                     MOAT_INVALID_ARGUMENT, "bad image", NULL, false,
	                     NULL),
	    MOAT_OK);
	assert_int_equal(claim(p, "t2", 42, "CreateSandbox", 60000, &r, NULL),
	    DONE);
	assert_int_equal(r->code, MOAT_INVALID_ARGUMENT);
	assert_string_equal(r->message, "bad image");
	assert_int_equal(r->reply.len, 0);
	moat__v1__claim_request_reply__free_unpacked(r, NULL);
	/* Another method with the same id: refused, naming the first. */
	assert_int_equal(claim(p, "t1", 42, "DestroySandbox", 60000, NULL,
	                     &err),
	    -MOAT_INVALID_ARGUMENT);
	ses_expect(MOAT_INVALID_ARGUMENT, err, MOAT_INVALID_ARGUMENT,
	    "was used for CreateSandbox");
	/* Completing what was never claimed. */
	err = NULL;
	{
		int rv = complete(p, "t1", 7, "Fork", MOAT_OK, "", "x", false,
		    &err);

		ses_expect(rv, err, MOAT_NOT_FOUND, "claim it first");
	}
	/* Bad requests. */
	err = NULL;
	assert_int_equal(claim(p, "t1", 0, "Fork", 1000, NULL, &err),
	    -MOAT_INVALID_ARGUMENT);
	free(err);
	err = NULL;
	assert_int_equal(claim(p, "t1", 5, "", 1000, NULL, &err),
	    -MOAT_INVALID_ARGUMENT);
	free(err);
}

static void
release_and_lease(void **state)
{
	struct ses_proc *p = *state;

	assert_int_equal(claim(p, "t", 1, "Fork", 60000, NULL, NULL), FIRST);
	assert_int_equal(complete(p, "t", 1, "Fork", MOAT_UNAVAILABLE, "x",
	                     NULL, true, NULL),
	    MOAT_OK);
	assert_int_equal(claim(p, "t", 1, "Fork", 60000, NULL, NULL), FIRST);
	/* A claimer that never completes: its 1 s lease runs out and the
	 * next claimer runs the call. */
	assert_int_equal(claim(p, "t", 2, "Fork", 1000, NULL, NULL), FIRST);
	assert_int_equal(claim(p, "t", 2, "Fork", 1000, NULL, NULL), RUNNING);
	usleep(1200 * 1000);
	assert_int_equal(claim(p, "t", 2, "Fork", 1000, NULL, NULL), FIRST);
}

static void
ttl_bound_and_restart(void **state)
{
	struct ses_proc *p = *state;

	(void)state;
	ses_stop(p);
	memset(p, 0, sizeof(*p));
	setenv("MOAT_SESSIOND_IDEMPOTENCY_TTL_S", "3", 1);
	setenv("MOAT_SESSIOND_IDEMPOTENCY_MAX_KEYS", "3", 1);
	ses_start(p, NULL);
	unsetenv("MOAT_SESSIOND_IDEMPOTENCY_TTL_S");
	unsetenv("MOAT_SESSIOND_IDEMPOTENCY_MAX_KEYS");
	for (uint64_t rid = 1; rid <= 3; rid++) {
		assert_int_equal(claim(p, "t", rid, "CreateSandbox", 60000,
		                     NULL, NULL),
		    FIRST);
		assert_int_equal(complete(p, "t", rid, "CreateSandbox",
		                     MOAT_OK, "", "r", false, NULL),
		    MOAT_OK);
	}
	/* Survives a SIGKILL. */
	ses_kill(p, SIGKILL);
	setenv("MOAT_SESSIOND_IDEMPOTENCY_TTL_S", "3", 1);
	setenv("MOAT_SESSIOND_IDEMPOTENCY_MAX_KEYS", "3", 1);
	ses_start(p, NULL);
	assert_int_equal(claim(p, "t", 1, "CreateSandbox", 60000, NULL, NULL),
	    DONE);
	/* A 4th key pushes the oldest out (max 3). */
	assert_int_equal(claim(p, "t", 4, "CreateSandbox", 60000, NULL, NULL),
	    FIRST);
	assert_int_equal(claim(p, "t", 1, "CreateSandbox", 60000, NULL, NULL),
	    FIRST);
	/* After the TTL every key is new again. */
	assert_int_equal(claim(p, "t", 3, "CreateSandbox", 60000, NULL, NULL),
	    DONE);
	usleep(3200 * 1000);
	assert_int_equal(claim(p, "t", 3, "CreateSandbox", 60000, NULL, NULL),
	    FIRST);
	unsetenv("MOAT_SESSIOND_IDEMPOTENCY_TTL_S");
	unsetenv("MOAT_SESSIOND_IDEMPOTENCY_MAX_KEYS");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		SES_CASE(first_running_done),
		SES_CASE(release_and_lease),
		SES_CASE(ttl_bound_and_restart),
	};

	return cmocka_run_group_tests(tests, NULL, ses_reap_all);
}
