/*
 * code.c: persistent code contexts (RunCode, CloseCodeContext). Each is
 * one guest request: the agent keeps the interpreters (guest/agent/code.c)
 * and answers a CodeRun when the cell is over, with its output, value or
 * exception; vmd only bounds the wait by the call's deadline and makes
 * sure the cell's own timeout (and the agent's interrupt grace) comes
 * before that deadline, so a slow cell ends as a timed-out result rather
 * than a lost call. A RunCode defers its reply (moat_rpc_defer) and its
 * cell is waited for on a thread of its own, so a long cell holds no RPC
 * worker. Not for: one-shot execs (exec.c) or what the agent does with a
 * context.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "code.h"
#include "files.h"
#include "node.h"
#include "sandbox.h"

/* The agent interrupts a cell at its timeout and kills the interpreter
 * 2 s later if the cell does not stop; this leaves room for both. */
#define CODE_GRACE_MS 3000u

/* code_timeout: the cell timeout to ask the agent for: the request's (or
 * the exec default), cut so that the agent answers before `deadline`. */
static uint32_t
code_timeout(uint32_t asked, uint64_t deadline)
{
	uint64_t now = moat_rpc_now_ms();
	uint64_t t = asked ? asked : VMD_EXEC_DEFAULT_TIMEOUT_MS;
	uint64_t room = deadline > now ? deadline - now : 0;

	if (room > CODE_GRACE_MS + 100) {
		if (t > room - CODE_GRACE_MS)
			t = room - CODE_GRACE_MS;
	} else if (t > room / 2) {
		t = room / 2 ? room / 2 : 1;
	}
	return (uint32_t)t;
}

/* code_guest_run: sends the cell and waits for its result (into
 * reply->result, heap). Returns a status after moat_rpc_error. */
static int
code_guest_run(struct sandbox *sb, struct moat_rpc_call *call,
    const char *context, const char *language, const char *code,
    uint32_t timeout_ms, uint64_t deadline, Moat__V1__RunCodeResult *reply)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__CodeRun run = MOAT__V1__CODE_RUN__INIT;
	Moat__V1__GuestMessage *msg = NULL;
	int rv;

	greq.op_case = MOAT__V1__GUEST_REQUEST__OP_CODE_RUN;
	greq.code_run = &run;
	run.context = (char *)context;
	run.language = (char *)language;
	run.code = (char *)code;
	run.timeout_ms = code_timeout(timeout_ms, deadline);
	rv = vmd_guest_call_until(sb, call, &greq,
	    MOAT__V1__GUEST_MESSAGE__BODY_CODE_RESULT, deadline, &msg, NULL);
	if (rv == MOAT_OK) {
		/* the reply takes the decoded result as it is */
		reply->result = msg->code_result;
		msg->code_result = NULL;
		msg->body_case = MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET;
		moat__v1__guest_message__free_unpacked(msg, NULL);
	}
	return rv;
}

/* A RunCode whose reply was deferred: a thread of its own waits for the
 * cell (the agent runs at most AGENT_CODE_MAX contexts, one cell each,
 * so these are few per sandbox), and no RPC worker is held. */
struct code_job {
	struct sandbox *sb; /* a reference */
	struct moat_rpc_deferred *d;
	char *context, *language, *code; /* copies */
	uint32_t timeout_ms;
	uint64_t deadline;
};

/* Cells waited for on threads of their own, at most; more wait on the
 * RPC worker as before. */
#define CODE_MAX_DEFERRED 512
static unsigned code_deferred; /* atomic */

static void
code_job_free(struct code_job *j)
{
	free(j->context);
	free(j->language);
	free(j->code);
	free(j);
}

static void *
code_job_main(void *arg)
{
	struct code_job *j = arg;
	Moat__V1__RunCodeResult reply = MOAT__V1__RUN_CODE_RESULT__INIT;
	struct moat_rpc_call call = { .service = "moat.v1.Vm",
		.method = "RunCode" };
	int rv;

	rv = code_guest_run(j->sb, &call, j->context, j->language, j->code,
	    j->timeout_ms, j->deadline, &reply);
	moat_rpc_complete(j->d, rv, &reply.base, call.error_message);
	free(call.error_message);
	if (reply.result != NULL)
		moat__v1__code_result__free_unpacked(reply.result, NULL);
	vmd_sandbox_put(j->sb);
	code_job_free(j);
	__atomic_sub_fetch(&code_deferred, 1, __ATOMIC_RELAXED);
	return NULL;
}

/* code_defer: defers the call and starts its thread; false when it
 * cannot (the caller then runs the cell itself). */
static bool
code_defer(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__RunCodeRequest *req, uint64_t deadline)
{
	struct code_job *j;
	pthread_attr_t attr;
	pthread_t t;
	bool ok;

	if (sb->vmd == NULL || call->rpc_private == NULL)
		return false;
	if (__atomic_add_fetch(&code_deferred, 1, __ATOMIC_RELAXED) >
	    CODE_MAX_DEFERRED)
		goto fail_count;
	if ((j = calloc(1, sizeof(*j))) == NULL)
		goto fail_count;
	j->context = strdup(req->context ? req->context : "");
	j->language = strdup(req->language ? req->language : "");
	j->code = strdup(req->code ? req->code : "");
	if (j->context == NULL || j->language == NULL || j->code == NULL)
		goto fail_job;
	j->timeout_ms = req->timeout_ms;
	j->deadline = deadline;
	j->sb = sb;
	if (pthread_attr_init(&attr) != 0)
		goto fail_job;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256u << 10);
	if ((j->d = moat_rpc_defer(call)) == NULL) {
		pthread_attr_destroy(&attr);
		goto fail_job;
	}
	pthread_mutex_lock(&sb->vmd->mu);
	sb->refs++; /* the job's */
	pthread_mutex_unlock(&sb->vmd->mu);
	ok = pthread_create(&t, &attr, code_job_main, j) == 0;
	pthread_attr_destroy(&attr);
	if (!ok) {
		moat_rpc_complete(j->d, MOAT_RESOURCE_EXHAUSTED, NULL,
		    "vmd cannot start a thread for the cell: retry later");
		vmd_sandbox_put(sb);
		code_job_free(j);
		__atomic_sub_fetch(&code_deferred, 1, __ATOMIC_RELAXED);
	}
	return true;

fail_job:
	code_job_free(j);
fail_count:
	__atomic_sub_fetch(&code_deferred, 1, __ATOMIC_RELAXED);
	return false;
}

int
vmd_code_run(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RunCodeRequest *req, Moat__V1__RunCodeResult *reply)
{
	uint64_t deadline = vmd_call_deadline(call);
	struct sandbox *sb;
	int rv;

	if (req->timeout_ms > VMD_EXEC_MAX_TIMEOUT_MS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "timeout_ms "
		    "%u is over the limit of %u ms (24 h)",
		    req->timeout_ms, VMD_EXEC_MAX_TIMEOUT_MS);
	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	if (code_defer(sb, call, req, deadline))
		rv = MOAT_OK; /* answered by its thread */
	else
		rv = code_guest_run(sb, call, req->context, req->language,
		    req->code, req->timeout_ms, deadline, reply);
	vmd_sandbox_put(sb);
	return rv;
}

int
vmd_code_close(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CodeContextCall *req)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__CodeContextRef ref = MOAT__V1__CODE_CONTEXT_REF__INIT;
	Moat__V1__GuestMessage *msg = NULL;
	struct sandbox *sb;
	int rv;

	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	greq.op_case = MOAT__V1__GUEST_REQUEST__OP_CODE_CONTEXT_CLOSE;
	greq.code_context_close = &ref;
	ref.context = req->context;
	if ((rv = vmd_guest_call(sb, call, &greq,
	         MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET, &msg)) == MOAT_OK)
		moat__v1__guest_message__free_unpacked(msg, NULL);
	vmd_sandbox_put(sb);
	return rv;
}
