/*
 * idempotency.c: a mutating call retried on another gateway returns the
 * first result (issue 15). Before CreateSandbox, DestroySandbox,
 * RestoreSandbox, RestoreStep or Fork runs, the gateway claims the call's
 * request id (Envelope.request_id; HTTP X-Moat-Request-Id) for the
 * caller's tenant and the method in moat-sessiond (ClaimRequest). The
 * first claimer runs the call and stores its reply payload, status and
 * message (CompleteRequest); a claimer that finds it running waits for it
 * (asking again every IDEM_POLL_MS until the call's deadline), then
 * replies what the first run replied. UNAVAILABLE and RESOURCE_EXHAUSTED
 * outcomes are released instead (nothing ran, or it may be tried again),
 * so a retry runs the call anew. When sessiond does not answer the claim
 * the call runs without it (logged): availability first. Within one
 * gateway the RPC layer's memory already answers a repeat first.
 * Not for: storage of claims (services/session/idem.c).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gateway.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define IDEM_POLL_MS 200
#define IDEM_CLAIM_MS 3000 /* one claim call at most */
#define IDEM_LEASE_EXTRA_MS 5000
/* After sessiond failed to answer a claim, calls skip claiming for this
 * long instead of each waiting IDEM_CLAIM_MS for it. */
#define IDEM_BACKOFF_MS 10000

static _Atomic uint64_t idem_skip_until_ms;

static const char *const idem_methods[] = { "CreateSandbox", "DestroySandbox",
	"RestoreSandbox", "RestoreStep", "Fork" };

bool
moat_idem_method(const char *method)
{
	for (size_t i = 0; i < sizeof(idem_methods) / sizeof(idem_methods[0]);
	     i++)
		if (strcmp(idem_methods[i], method) == 0)
			return true;
	return false;
}

static void
sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* complete: stores the first run's outcome (or releases the claim).
 * Best effort: logged when sessiond does not take it. */
static void
complete(struct moat_record *rec, struct moat_rpc_call *call,
    const char *tenant, int rv, const ProtobufCMessage *reply)
{
	Moat__V1__CompleteRequestRequest req =
	    MOAT__V1__COMPLETE_REQUEST_REQUEST__INIT;
	ProtobufCMessage *out = NULL;
	uint8_t *packed = NULL;
	char *msg = NULL;

	req.tenant = (char *)tenant;
	req.request_id = call->request_id;
	req.method = (char *)call->method;
	req.code = rv;
	req.message = call->error_message != NULL ? call->error_message : "";
	req.release = rv == MOAT_UNAVAILABLE ||
	    rv == MOAT_RESOURCE_EXHAUSTED || call->deferred != NULL;
	if (rv == MOAT_OK && !req.release) {
		if (call->raw_reply != NULL) {
			req.reply.data = call->raw_reply;
			req.reply.len = call->raw_reply_len;
		} else {
			size_t len = protobuf_c_message_get_packed_size(reply);

			if ((packed = malloc(len ? len : 1)) == NULL) {
				req.release = true;
			} else {
				protobuf_c_message_pack(reply, packed);
				req.reply.data = packed;
				req.reply.len = len;
			}
		}
	}
	if (moat_record_sessiond(rec, "CompleteRequest", &req.base,
	        &moat__v1__complete_request_reply__descriptor, &out,
	        moat_rpc_now_ms() + IDEM_CLAIM_MS, &msg) != MOAT_OK) {
		moat_warn(call->request_id,
		    "%s: its result is not stored for retries on other "
		    "gateways: %s",
		    call->method, msg ? msg : "");
		free(msg);
	}
	if (out != NULL)
		protobuf_c_message_free_unpacked(out, NULL);
	free(packed);
}

/* replay: the first run's outcome, as this call's. */
static int
replay(struct moat_rpc_call *call, Moat__V1__ClaimRequestReply *c)
{
	moat_info(call->request_id,
	    "%s: request id already run (on this or another gateway): its "
	    "stored result is the reply",
	    call->method);
	if (c->code != MOAT_OK)
		return moat_rpc_error(call, c->code, "%s",
		    c->message[0] ? c->message : moat_strerror(c->code));
	free(call->raw_reply);
	call->raw_reply = NULL;
	call->raw_reply_len = 0;
	if (c->reply.len > 0) {
		if ((call->raw_reply = malloc(c->reply.len)) == NULL)
			return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory");
		memcpy(call->raw_reply, c->reply.data, c->reply.len);
		call->raw_reply_len = c->reply.len;
	}
	return MOAT_OK;
}

int
moat_idem_run(struct moat_record *rec, struct moat_rpc_call *call,
    moat_rpc_handler fn, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	Moat__V1__ClaimRequestRequest req =
	    MOAT__V1__CLAIM_REQUEST_REQUEST__INIT;
	Moat__V1__ClaimRequestReply *c = NULL;
	const char *tenant = moat_gw_tenant(call);
	uint64_t now = moat_rpc_now_ms();
	char *msg = NULL;
	int rv;

	if (rec->sessiond == NULL || call->request_id == 0 ||
	    !moat_idem_method(call->method) ||
	    now < atomic_load(&idem_skip_until_ms))
		return fn(call, request, reply);
	req.tenant = (char *)tenant;
	req.request_id = call->request_id;
	req.method = (char *)call->method;
	req.lease_ms =
	    (uint32_t)((call->deadline_ms > now ? call->deadline_ms - now :
	                                          0) +
	        IDEM_LEASE_EXTRA_MS);
	for (;;) {
		if (moat_record_sessiond(rec, "ClaimRequest", &req.base,
		        &moat__v1__claim_request_reply__descriptor,
		        (ProtobufCMessage **)&c,
		        moat_rpc_now_ms() + IDEM_CLAIM_MS, &msg) != MOAT_OK) {
			if (msg != NULL &&
			    strstr(msg, "did not answer") != NULL)
				atomic_store(&idem_skip_until_ms,
				    moat_rpc_now_ms() + IDEM_BACKOFF_MS);
			if (msg != NULL &&
			    strstr(msg, "was used for") != NULL) {
				rv = moat_rpc_error(call,
				    MOAT_INVALID_ARGUMENT, "%s", msg);
				free(msg);
				return rv;
			}
			moat_warn(call->request_id,
			    "%s: runs without a cluster-wide idempotency "
			    "claim: %s",
			    call->method, msg ? msg : "");
			free(msg);
			return fn(call, request, reply);
		}
		if (c->state != MOAT__V1__CLAIM_STATE__CLAIM_STATE_RUNNING)
			break;
		moat__v1__claim_request_reply__free_unpacked(c, NULL);
		c = NULL;
		if (moat_rpc_now_ms() + IDEM_POLL_MS >= call->deadline_ms)
			return moat_rpc_error(call, MOAT_DEADLINE_EXCEEDED,
			    "request id %llu (%s) is still running on "
			    "another gateway: retry with the same request id "
			    "to get its result",
			    (unsigned long long)call->request_id,
			    call->method);
		sleep_ms(IDEM_POLL_MS);
	}
	if (c->state == MOAT__V1__CLAIM_STATE__CLAIM_STATE_DONE) {
		rv = replay(call, c);
		moat__v1__claim_request_reply__free_unpacked(c, NULL);
		return rv;
	}
	moat__v1__claim_request_reply__free_unpacked(c, NULL);
	rv = fn(call, request, reply);
	complete(rec, call, tenant, rv, reply);
	return rv;
}
