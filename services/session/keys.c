/*
 * keys.c: the API keys of every gateway (issue 15), so a key made or
 * revoked through one gateway holds on all of them. A key is made by a
 * gateway (its id and secret); sessiond keeps its record (KeyInfo: tenant,
 * SHA-256 of the secret, created, revoked) under the key id in the "keys"
 * database of its own LMDB environment (<state>/sessiond-keys), apart from
 * the recordings and the idempotency claims so no writer of theirs ever
 * delays a key operation. CreateKey of an id that exists with the same
 * tenant and hash is an import: it succeeds (revoked carries over, never
 * back), so a gateway may push its old local key store again and again.
 * Not for: secrets (never sent here) or the gateway's cache (gateway/auth.c).
 */
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sessiond.h"

#define DB_KEYS "keys"
#define KEYS_MAP_BYTES (64ull << 20)
#define KEY_ID_LEN 12
#define HASH_LEN 64
#define TENANT_MAX 63
#define LIST_MAX 100000

const char *const sessiond_keys_dbs[] = { DB_KEYS, "tenants", NULL };

int
sessiond_keys_open(struct sessiond *sd, const char *state_dir, char **errmsg)
{
	return sessiond_env_open(&sd->keys, state_dir, "sessiond-keys",
	    KEYS_MAP_BYTES, sessiond_keys_dbs, errmsg);
}

static bool
all_of(const char *s, size_t len, const char *set)
{
	if (s == NULL || strlen(s) != len)
		return false;
	return strspn(s, set) == len;
}

static int
check_key_id(struct moat_rpc_call *call, const char *id)
{
	if (!all_of(id, KEY_ID_LEN, "0123456789abcdef"))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "key_id \"%.40s\" is not a key id (12 lowercase hex "
		    "characters): `moat-gateway keys ls` lists them",
		    id ? id : "");
	return MOAT_OK;
}

int
sessiond_check_tenant_name(struct moat_rpc_call *call, const char *t)
{
	size_t n = t != NULL ? strlen(t) : 0;

	if (n < 1 || n > TENANT_MAX ||
	    strspn(t,
	        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	        "0123456789._-") != n)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "tenant \"%.80s\" is not a name: use 1-63 letters, "
		    "digits, '.', '_' or '-'",
		    t ? t : "");
	return MOAT_OK;
}

/* load: the record of `id` (heap) or NOT_FOUND. */
static int
load(struct moat_store_txn *txn, const char *id, Moat__V1__KeyInfo **out,
    char **errmsg)
{
	const void *val;
	size_t vlen;
	int rv;

	*out = NULL;
	if ((rv = moat_store_get(txn, DB_KEYS, id, strlen(id), &val, &vlen,
	         errmsg)) != MOAT_OK)
		return rv;
	if ((*out = moat__v1__key_info__unpack(NULL, vlen, val)) == NULL) {
		*errmsg =
		    moat_asprintf("key %s: its record is not readable", id);
		return MOAT_INTERNAL;
	}
	return MOAT_OK;
}

static int
store(struct moat_store_txn *txn, const Moat__V1__KeyInfo *k, char **errmsg)
{
	size_t len;
	uint8_t *packed = sessiond_pack(&k->base, &len);
	int rv;

	if (packed == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	rv = moat_store_put(txn, DB_KEYS, k->key_id, strlen(k->key_id), packed,
	    len, false, errmsg);
	free(packed);
	return rv;
}

/* copy_out: `k`'s fields into the reply (strings duplicated). */
static int
copy_out(const Moat__V1__KeyInfo *k, Moat__V1__KeyInfo *out)
{
	out->key_id = strdup(k->key_id);
	out->tenant = strdup(k->tenant);
	out->sha256 = strdup(k->sha256);
	out->revoked = k->revoked;
	out->created_unix_ms = k->created_unix_ms;
	out->revoked_unix_ms = k->revoked_unix_ms;
	if (out->key_id == NULL || out->tenant == NULL || out->sha256 == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	return MOAT_OK;
}

/* create_in: CreateKey in the write txn; *rec the stored record. */
static int
create_in(struct moat_rpc_call *call, struct moat_store_txn *txn,
    const Moat__V1__CreateKeyRequest *req, Moat__V1__KeyInfo **rec,
    bool *changed, char **errmsg)
{
	Moat__V1__KeyInfo k = MOAT__V1__KEY_INFO__INIT;
	int rv = load(txn, req->key_id, rec, errmsg);

	*changed = false;
	if (rv == MOAT_OK) {
		Moat__V1__KeyInfo *old = *rec;

		if (strcmp(old->tenant, req->tenant) != 0 ||
		    strcmp(old->sha256, req->sha256) != 0)
			return moat_rpc_error(call, MOAT_ALREADY_EXISTS,
			    "key %s exists with another tenant or secret: "
			    "make a new key",
			    req->key_id);
		if (req->revoked && !old->revoked) {
			old->revoked = true;
			old->revoked_unix_ms = moat_now_unix_ms();
			*changed = true;
			return store(txn, old, errmsg);
		}
		return MOAT_OK;
	}
	if (rv != MOAT_NOT_FOUND)
		return rv;
	free(*errmsg);
	*errmsg = NULL;
	k.key_id = req->key_id;
	k.tenant = req->tenant;
	k.sha256 = req->sha256;
	k.created_unix_ms =
	    req->created_unix_ms ? req->created_unix_ms : moat_now_unix_ms();
	k.revoked = req->revoked;
	k.revoked_unix_ms = req->revoked ? moat_now_unix_ms() : 0;
	if ((rv = store(txn, &k, errmsg)) != MOAT_OK)
		return rv;
	*changed = true;
	return load(txn, req->key_id, rec, errmsg);
}

int
sessiond_h_create_key(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__CreateKeyRequest *req =
	    (const Moat__V1__CreateKeyRequest *)request;
	Moat__V1__KeyInfo *rec = NULL;
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	bool changed = false;
	int rv;

	if ((rv = sessiond_check_tenant_name(call, req->tenant)) != MOAT_OK ||
	    (rv = check_key_id(call, req->key_id)) != MOAT_OK)
		return rv;
	if (!all_of(req->sha256, HASH_LEN, "0123456789abcdef"))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "sha256 must be the 64 lowercase hex characters of the "
		    "secret's SHA-256");
	if ((rv = moat_store_txn_begin(sd->keys, true, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = create_in(call, txn, req, &rec, &changed, &errmsg);
	if (rv == MOAT_OK && changed)
		rv = moat_store_txn_commit(txn, &errmsg);
	else
		moat_store_txn_abort(txn);
	if (rv == MOAT_OK)
		rv = copy_out(rec, (Moat__V1__KeyInfo *)reply);
	if (rec != NULL)
		moat__v1__key_info__free_unpacked(rec, NULL);
	if (rv == MOAT_OK)
		return MOAT_OK;
	return call->error_message != NULL ? rv :
	                                     sessiond_fail(call, rv, errmsg);
}

int
sessiond_h_verify_key(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__VerifyKeyRequest *req =
	    (const Moat__V1__VerifyKeyRequest *)request;
	Moat__V1__KeyInfo *rec = NULL;
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	int rv;

	if ((rv = check_key_id(call, req->key_id)) != MOAT_OK)
		return rv;
	if ((rv = moat_store_txn_begin(sd->keys, false, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = load(txn, req->key_id, &rec, &errmsg);
	moat_store_txn_abort(txn);
	if (rv == MOAT_NOT_FOUND) {
		free(errmsg);
		return moat_rpc_error(call, MOAT_NOT_FOUND, "no key %s",
		    req->key_id);
	}
	if (rv == MOAT_OK)
		rv = copy_out(rec, (Moat__V1__KeyInfo *)reply);
	if (rec != NULL)
		moat__v1__key_info__free_unpacked(rec, NULL);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}

int
sessiond_h_revoke_key(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__RevokeKeyRequest *req =
	    (const Moat__V1__RevokeKeyRequest *)request;
	Moat__V1__KeyInfo *rec = NULL;
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	int rv;

	if ((rv = check_key_id(call, req->key_id)) != MOAT_OK)
		return rv;
	if ((rv = moat_store_txn_begin(sd->keys, true, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	if ((rv = load(txn, req->key_id, &rec, &errmsg)) == MOAT_OK &&
	    !rec->revoked) {
		rec->revoked = true;
		rec->revoked_unix_ms = moat_now_unix_ms();
		rv = store(txn, rec, &errmsg);
		if (rv == MOAT_OK)
			rv = moat_store_txn_commit(txn, &errmsg);
		else
			moat_store_txn_abort(txn);
	} else {
		moat_store_txn_abort(txn);
	}
	if (rv == MOAT_NOT_FOUND) {
		free(errmsg);
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "no key %s: `moat-gateway keys ls` lists them",
		    req->key_id);
	}
	if (rv == MOAT_OK)
		rv = copy_out(rec, (Moat__V1__KeyInfo *)reply);
	if (rec != NULL)
		moat__v1__key_info__free_unpacked(rec, NULL);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}

struct list_ctx {
	const char *tenant;
	Moat__V1__ListKeysReply *out;
	size_t cap;
};

static int
list_one(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
	struct list_ctx *c = arg;
	Moat__V1__KeyInfo *k = moat__v1__key_info__unpack(NULL, vlen, val);
	Moat__V1__KeyInfo **grown;

	(void)key;
	(void)klen;
	if (k == NULL)
		return MOAT_OK; /* unreadable: skipped */
	if (c->tenant != NULL && strcmp(c->tenant, k->tenant) != 0) {
		moat__v1__key_info__free_unpacked(k, NULL);
		return MOAT_OK;
	}
	if (c->out->n_keys == LIST_MAX) {
		moat__v1__key_info__free_unpacked(k, NULL);
		return MOAT_STORE_SCAN_STOP;
	}
	if (c->out->n_keys == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 16;
		if ((grown = realloc(c->out->keys, c->cap * sizeof(*grown))) ==
		    NULL) {
			moat__v1__key_info__free_unpacked(k, NULL);
			return MOAT_RESOURCE_EXHAUSTED;
		}
		c->out->keys = grown;
	}
	/* Freed with the reply: protobuf-c frees nested messages with the
	 * system allocator, as unpack made them. */
	c->out->keys[c->out->n_keys++] = k;
	return MOAT_OK;
}

int
sessiond_h_list_keys(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	struct sessiond *sd = call->service_ctx;
	const Moat__V1__ListKeysRequest *req =
	    (const Moat__V1__ListKeysRequest *)request;
	struct list_ctx c = { .out = (Moat__V1__ListKeysReply *)reply };
	struct moat_store_txn *txn = NULL;
	char *errmsg = NULL;
	int rv;

	if (req->tenant != NULL && req->tenant[0] != '\0') {
		if ((rv = sessiond_check_tenant_name(call, req->tenant)) !=
		    MOAT_OK)
			return rv;
		c.tenant = req->tenant;
	}
	if ((rv = moat_store_txn_begin(sd->keys, false, &txn, &errmsg)) !=
	    MOAT_OK)
		return sessiond_fail(call, rv, errmsg);
	rv = moat_store_scan(txn, DB_KEYS, NULL, 0, NULL, 0, list_one, &c,
	    &errmsg);
	moat_store_txn_abort(txn);
	return rv == MOAT_OK ? MOAT_OK : sessiond_fail(call, rv, errmsg);
}
