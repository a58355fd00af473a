/*
 * idem.c: idempotency keys of the gateways' mutating calls (issue 15).
 * A gateway claims (tenant, request id, method) before it runs a
 * CreateSandbox, RestoreStep, Fork, RestoreSandbox or DestroySandbox; the
 * first claim runs the call and completes it with the reply (payload,
 * status, message); a claim of the same key from any gateway while it
 * runs is told RUNNING (the gateway asks again), and after it the stored
 * result. Claims live in their own LMDB environment (<state>/sessiond-idem,
 * apart from the recordings, so neither ever waits for the other's
 * writer): "claims" (tenant NUL request id, 8 bytes big-endian ->
 * IdempotencyRecord) and "claims_age" (created ms, 8 bytes, then the
 * claims key -> nothing), swept from the oldest on every new claim: older
 * than [sessiond] idempotency-ttl-s, or past idempotency-max-keys.
 * A claim not completed within its lease (the gateway died) is taken over
 * by the next claimer. Not for: the RPC layer's in-process dedup
 * (lib/rpc_server.c), which a gateway still applies first.
 */
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

#define DB_CLAIMS "claims"
#define DB_AGE "claims_age"
#define KEY_MAX (SESSIOND_MAX_TENANT + 1 + 8)
#define IDEM_MAP_BYTES (512ull << 20)
#define LEASE_MIN_MS 1000
#define LEASE_MAX_MS (3600u * 1000u)

const char *const sessiond_idem_dbs[] = { DB_CLAIMS, DB_AGE, NULL };

int
sessiond_idem_open(struct sessiond *sd, const char *state_dir, char **errmsg)
{
	return sessiond_env_open(&sd->idem, state_dir, "sessiond-idem",
	    IDEM_MAP_BYTES, sessiond_idem_dbs, errmsg);
}

static size_t
claim_key(uint8_t key[KEY_MAX], const char *tenant, uint64_t request_id)
{
	size_t n = strlen(tenant);

	memcpy(key, tenant, n + 1);
	moat_store_key_u64(key + n + 1, request_id);
	return n + 1 + 8;
}

/* sweep: drops expired claims and the oldest past the count bound. */
static int
sweep(struct sessiond *sd, struct moat_store_txn *txn, uint64_t now,
    char **errmsg)
{
	return sessiond_aged_sweep(txn, DB_CLAIMS, DB_AGE,
	    now > sd->idem_ttl_ms ? now - sd->idem_ttl_ms : 0, sd->idem_max,
	    errmsg);
}

/* load: the record under `key` in *out (heap), NOT_FOUND when absent or
 * not readable (then it is replaced). */
static int
load(struct moat_store_txn *txn, const uint8_t *key, size_t klen,
    Moat__V1__IdempotencyRecord **out, char **errmsg)
{
	const void *val;
	size_t vlen;
	int rv;

	*out = NULL;
	if ((rv = moat_store_get(txn, DB_CLAIMS, key, klen, &val, &vlen,
	         errmsg)) != MOAT_OK)
		return rv;
	*out = moat__v1__idempotency_record__unpack(NULL, vlen, val);
	return *out != NULL ? MOAT_OK : MOAT_NOT_FOUND;
}

static int
store(struct moat_store_txn *txn, const uint8_t *key, size_t klen,
    const Moat__V1__IdempotencyRecord *r, char **errmsg)
{
	size_t len;
	uint8_t *packed = sessiond_pack(&r->base, &len);
	int rv;

	if (packed == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	rv = moat_store_put(txn, DB_CLAIMS, key, klen, packed, len, false,
	    errmsg);
	free(packed);
	return rv;
}

static int
age_key_put(struct moat_store_txn *txn, uint64_t created, const uint8_t *key,
    size_t klen, bool del, char **errmsg)
{
	return sessiond_aged_index(txn, DB_AGE, created, key, klen, del,
	    errmsg);
}

/* claim_new: `key` is claimed now by the caller (FIRST). */
static int
claim_new(struct sessiond *sd, struct moat_store_txn *txn, const uint8_t *key,
    size_t klen, const Moat__V1__ClaimRequestRequest *req, uint64_t now,
    char **errmsg)
{
	Moat__V1__IdempotencyRecord r = MOAT__V1__IDEMPOTENCY_RECORD__INIT;
	uint32_t lease = req->lease_ms;
	int rv;

	if (lease < LEASE_MIN_MS)
		lease = LEASE_MIN_MS;
	if (lease > LEASE_MAX_MS)
		lease = LEASE_MAX_MS;
	if ((rv = sweep(sd, txn, now, errmsg)) != MOAT_OK)
		return rv;
	r.method = req->method;
	r.state = MOAT__V1__CLAIM_STATE__CLAIM_STATE_RUNNING;
	r.created_unix_ms = now;
	r.lease_until_unix_ms = now + lease;
	if ((rv = store(txn, key, klen, &r, errmsg)) != MOAT_OK)
		return rv;
	return age_key_put(txn, now, key, klen, false, errmsg);
}

static int
check_request(struct moat_rpc_call *call, const char *tenant, uint64_t rid,
    const char *method)
{
	int rv;

	if ((rv = sessiond_check_tenant(call, tenant)) != MOAT_OK)
		return rv;
	if (rid == 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "request_id is 0: give the call's request id");
	if (method == NULL || method[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "method is required: the gateway method the request id "
		    "belongs to");
	return sessiond_check_short(call, "method", method,
	    SESSIOND_MAX_SHORT);
}

/* claim_decide: what an existing record says to a new claim; may take it
 * over (FIRST) when its lease ran out. */
static int
claim_decide(struct moat_rpc_call *call, struct moat_store_txn *txn,
    const uint8_t *key, size_t klen, Moat__V1__IdempotencyRecord *r,
    const Moat__V1__ClaimRequestRequest *req, uint64_t now,
    Moat__V1__ClaimRequestReply *out, char **errmsg)
{
	if (strcmp(r->method, req->method) != 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "request id %llu was used for %s; this %s needs a new "
		    "request id",
		    (unsigned long long)req->request_id, r->method,
		    req->method);
	if (r->state == MOAT__V1__CLAIM_STATE__CLAIM_STATE_DONE) {
		out->state = MOAT__V1__CLAIM_STATE__CLAIM_STATE_DONE;
		out->code = r->code;
		if (r->message[0] != '\0' &&
		    (out->message = strdup(r->message)) == NULL)
			return MOAT_RESOURCE_EXHAUSTED;
		if (r->reply.len > 0) {
			if ((out->reply.data = malloc(r->reply.len)) == NULL)
				return MOAT_RESOURCE_EXHAUSTED;
			memcpy(out->reply.data, r->reply.data, r->reply.len);
			out->reply.len = r->reply.len;
		}
		return MOAT_OK;
	}
	if (now < r->lease_until_unix_ms) {
		out->state = MOAT__V1__CLAIM_STATE__CLAIM_STATE_RUNNING;
		return MOAT_OK;
	}
	/* The caller that claimed it never completed (gone): this one
	 * runs it. */
	moat_warn(call->request_id,
	    "request %llu (%s) of tenant %s was claimed but not completed "
	    "within its lease: taken over",
	    (unsigned long long)req->request_id, req->method, req->tenant);
	r->lease_until_unix_ms = now +
	    (req->lease_ms > LEASE_MIN_MS ? req->lease_ms : LEASE_MIN_MS);
	out->state = MOAT__V1__CLAIM_STATE__CLAIM_STATE_FIRST;
	return store(txn, key, klen, r, errmsg);
}

int
sessiond_h_claim_request(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__ClaimRequestRequest *req =
	    (const Moat__V1__ClaimRequestRequest *)request;
	Moat__V1__ClaimRequestReply *out =
	    (Moat__V1__ClaimRequestReply *)reply;
	Moat__V1__IdempotencyRecord *r = NULL;
	struct moat_store_txn *txn = NULL;
	uint8_t key[KEY_MAX];
	size_t klen;
	uint64_t now = moat_now_unix_ms();
	char *errmsg = NULL;
	int rv;

	if ((rv = check_request(call, req->tenant, req->request_id,
	         req->method)) != MOAT_OK)
		return rv;
	klen = claim_key(key, req->tenant, req->request_id);
	if ((rv = moat_store_txn_begin(sd->idem, true, &txn, &errmsg)) !=
	    MOAT_OK)
		goto fail;
	rv = load(txn, key, klen, &r, &errmsg);
	if (rv == MOAT_OK && now >= r->created_unix_ms &&
	    now - r->created_unix_ms >= sd->idem_ttl_ms) {
		/* Expired, not swept yet: as if absent. */
		rv = age_key_put(txn, r->created_unix_ms, key, klen, true,
		    &errmsg);
		moat__v1__idempotency_record__free_unpacked(r, NULL);
		r = NULL;
		if (rv == MOAT_OK)
			rv = MOAT_NOT_FOUND;
	}
	if (rv == MOAT_NOT_FOUND) {
		rv = claim_new(sd, txn, key, klen, req, now, &errmsg);
		out->state = MOAT__V1__CLAIM_STATE__CLAIM_STATE_FIRST;
	} else if (rv == MOAT_OK) {
		rv = claim_decide(call, txn, key, klen, r, req, now, out,
		    &errmsg);
	}
	if (r != NULL)
		moat__v1__idempotency_record__free_unpacked(r, NULL);
	if (rv != MOAT_OK) {
		moat_store_txn_abort(txn);
		return call->error_message != NULL ?
		    rv :
		    sessiond_fail(call, rv, errmsg);
	}
	if (out->state == MOAT__V1__CLAIM_STATE__CLAIM_STATE_FIRST)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	if (rv == MOAT_OK)
		return MOAT_OK;
fail:
	return sessiond_fail(call, rv, errmsg);
}

int
sessiond_h_complete_request(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__CompleteRequestRequest *req =
	    (const Moat__V1__CompleteRequestRequest *)request;
	Moat__V1__IdempotencyRecord *r = NULL;
	struct moat_store_txn *txn = NULL;
	uint8_t key[KEY_MAX];
	size_t klen;
	char *errmsg = NULL;
	int rv;

	(void)reply;
	if ((rv = check_request(call, req->tenant, req->request_id,
	         req->method)) != MOAT_OK)
		return rv;
	if (req->message != NULL && strlen(req->message) > 65536)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "message is over 64 KiB");
	klen = claim_key(key, req->tenant, req->request_id);
	if ((rv = moat_store_txn_begin(sd->idem, true, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	if ((rv = load(txn, key, klen, &r, &errmsg)) != MOAT_OK) {
		moat_store_txn_abort(txn);
		if (rv == MOAT_NOT_FOUND)
			return moat_rpc_error(call, MOAT_NOT_FOUND,
			    "request %llu of tenant %s has no claim (expired, "
			    "or never claimed): claim it first",
			    (unsigned long long)req->request_id, req->tenant);
		return sessiond_fail(call, rv, errmsg);
	}
	if (strcmp(r->method, req->method) != 0) {
		moat_store_txn_abort(txn);
		rv = moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "request id %llu was claimed for %s, not %s",
		    (unsigned long long)req->request_id, r->method,
		    req->method);
		moat__v1__idempotency_record__free_unpacked(r, NULL);
		return rv;
	}
	if (req->release) {
		rv = moat_store_del(txn, DB_CLAIMS, key, klen, &errmsg);
		if (rv == MOAT_OK)
			rv = age_key_put(txn, r->created_unix_ms, key, klen,
			    true, &errmsg);
	} else {
		char *own_message = r->message;
		ProtobufCBinaryData own_reply = r->reply;

		r->state = MOAT__V1__CLAIM_STATE__CLAIM_STATE_DONE;
		r->code = req->code;
		r->message = req->message != NULL ? req->message : "";
		r->reply = req->reply;
		rv = store(txn, key, klen, r, &errmsg);
		/* Borrowed for the store only. */
		r->message = own_message;
		r->reply = own_reply;
	}
	moat__v1__idempotency_record__free_unpacked(r, NULL);
	if (rv == MOAT_OK)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}
