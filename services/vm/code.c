/*
 * code.c: persistent code contexts (RunCode, CloseCodeContext). Each is
 * one guest request: the agent keeps the interpreters (guest/agent/code.c)
 * and answers a CodeRun when the cell is over, with its output, value or
 * exception; vmd only bounds the wait by the call's deadline and makes
 * sure the cell's own timeout (and the agent's interrupt grace) comes
 * before that deadline, so a slow cell ends as a timed-out result rather
 * than a lost call. Not for: one-shot execs (exec.c) or what the agent
 * does with a context.
 */
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

int
vmd_code_run(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RunCodeRequest *req, Moat__V1__RunCodeResult *reply)
{
	Moat__V1__GuestRequest greq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__CodeRun run = MOAT__V1__CODE_RUN__INIT;
	Moat__V1__GuestMessage *msg = NULL;
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
	greq.op_case = MOAT__V1__GUEST_REQUEST__OP_CODE_RUN;
	greq.code_run = &run;
	run.context = req->context;
	run.language = req->language;
	run.code = req->code;
	run.timeout_ms = code_timeout(req->timeout_ms, deadline);
	rv = vmd_guest_call_until(sb, call, &greq,
	    MOAT__V1__GUEST_MESSAGE__BODY_CODE_RESULT, deadline, &msg, NULL);
	if (rv == MOAT_OK) {
		/* the reply takes the decoded result as it is */
		reply->result = msg->code_result;
		msg->code_result = NULL;
		msg->body_case = MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET;
		moat__v1__guest_message__free_unpacked(msg, NULL);
	}
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
