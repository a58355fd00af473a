/*
 * keys_remote.c: the gateway's API keys in moat-sessiond (issue 15), used
 * by auth.c when the gateway is configured with a sessiond (`--sessiond`
 * or [gateway] sessiond) and by `moat-gateway keys ... --sessiond URL`.
 * Thin calls: CreateKey (also the import of a local key, idempotent),
 * VerifyKey, RevokeKey, ListKeys. The secret never leaves the gateway:
 * sessiond gets its SHA-256. Every failure names sessiond's address.
 * Not for: the cache of verified keys or the local store
 * (auth_keys.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define KEYS_SERVICE "moat.v1.Session"
#define KEYS_CALL_MS 3000

int
moat_sessiond_remote_call(struct moat_rpc_client *c, const char *url,
    const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
    char **errmsg)
{
	struct moat_rpc_opts opts = { .timeout_ms = KEYS_CALL_MS };
	char *msg = NULL;
	int rv;

	*reply = NULL;
	rv = moat_rpc_call(c, KEYS_SERVICE, method, req, desc, reply, &opts,
	    &msg);
	if (rv == MOAT_OK) {
		free(msg);
		return MOAT_OK;
	}
	if (rv == MOAT_UNAVAILABLE || rv == MOAT_DEADLINE_EXCEEDED) {
		*errmsg =
		    moat_asprintf("moat-sessiond at %s did not answer "
		                  "%s (%s): is it running? Keys and "
		                  "tenants live there when the gateway has "
		                  "--sessiond",
		        url, method, msg ? msg : "");
		rv = MOAT_UNAVAILABLE;
	} else {
		*errmsg = moat_asprintf("moat-sessiond at %s: %s", url,
		    msg ? msg : moat_strerror(rv));
	}
	free(msg);
	return rv;
}

int
moat_keys_remote_create(struct moat_rpc_client *c, const char *url,
    const struct moat_key_record *k, char **errmsg)
{
	Moat__V1__CreateKeyRequest req = MOAT__V1__CREATE_KEY_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	int rv;

	req.tenant = (char *)k->tenant;
	req.key_id = (char *)k->key_id;
	req.sha256 = (char *)k->sha256;
	req.created_unix_ms = k->created_unix_ms;
	req.revoked = k->revoked;
	rv = moat_sessiond_remote_call(c, url, "CreateKey", &req.base,
	    &moat__v1__key_info__descriptor, &reply, errmsg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

int
moat_keys_remote_get(struct moat_rpc_client *c, const char *url,
    const char *key_id, struct moat_key_record *out, char **errmsg)
{
	Moat__V1__VerifyKeyRequest req = MOAT__V1__VERIFY_KEY_REQUEST__INIT;
	Moat__V1__KeyInfo *k = NULL;
	int rv;

	memset(out, 0, sizeof(*out));
	req.key_id = (char *)key_id;
	if ((rv = moat_sessiond_remote_call(c, url, "VerifyKey", &req.base,
	         &moat__v1__key_info__descriptor, (ProtobufCMessage **)&k,
	         errmsg)) != MOAT_OK)
		return rv;
	if (strlen(k->tenant) >= sizeof(out->tenant) ||
	    strlen(k->sha256) >= sizeof(out->sha256) ||
	    strlen(k->key_id) >= sizeof(out->key_id)) {
		*errmsg = moat_asprintf("moat-sessiond at %s: key %s has a "
		                        "malformed record",
		    url, key_id);
		rv = MOAT_INTERNAL;
	} else {
		strcpy(out->key_id, k->key_id);
		strcpy(out->tenant, k->tenant);
		strcpy(out->sha256, k->sha256);
		out->revoked = k->revoked;
		out->created_unix_ms = k->created_unix_ms;
	}
	protobuf_c_message_free_unpacked(&k->base, NULL);
	return rv;
}

int
moat_keys_remote_revoke(struct moat_rpc_client *c, const char *url,
    const char *key_id, char **errmsg)
{
	Moat__V1__RevokeKeyRequest req = MOAT__V1__REVOKE_KEY_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	int rv;

	req.key_id = (char *)key_id;
	rv = moat_sessiond_remote_call(c, url, "RevokeKey", &req.base,
	    &moat__v1__key_info__descriptor, &reply, errmsg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

void
moat_key_print(FILE *f, const char *key_id, const char *tenant,
    uint64_t created_unix_ms, bool revoked)
{
	time_t secs = (time_t)(created_unix_ms / 1000);
	struct tm tm;
	char when[32] = "?";

	if (gmtime_r(&secs, &tm) != NULL)
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	fprintf(f, "%s %s %s %s\n", key_id, tenant, when,
	    revoked ? "revoked" : "active");
}

int
moat_keys_remote_list(struct moat_rpc_client *c, const char *url,
    const char *tenant, FILE *f, char **errmsg)
{
	Moat__V1__ListKeysRequest req = MOAT__V1__LIST_KEYS_REQUEST__INIT;
	Moat__V1__ListKeysReply *r = NULL;
	int rv;

	req.tenant = (char *)(tenant ? tenant : "");
	if ((rv = moat_sessiond_remote_call(c, url, "ListKeys", &req.base,
	         &moat__v1__list_keys_reply__descriptor,
	         (ProtobufCMessage **)&r, errmsg)) != MOAT_OK)
		return rv;
	for (size_t i = 0; i < r->n_keys; i++)
		moat_key_print(f, r->keys[i]->key_id, r->keys[i]->tenant,
		    r->keys[i]->created_unix_ms, r->keys[i]->revoked);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return MOAT_OK;
}

void
moat_auth_sessiond_start(struct moat_auth *a, struct moat_rpc_client *c,
    const char *url, const char *state_dir, uint64_t stale_ms)
{
	char *path = NULL, *tmp = NULL, *errmsg = NULL;
	size_t n = 0;
	bool ok;
	FILE *f;

	moat_auth_use_sessiond(a, c, url, stale_ms);
	if (moat_auth_import(a, &n, &errmsg) != MOAT_OK) {
		moat_warn(0,
		    "keys: the local key store is not imported into "
		    "moat-sessiond now (%s): each of its keys is on its first "
		    "use",
		    errmsg ? errmsg : "");
		free(errmsg);
	} else if (n > 0) {
		moat_info(0,
		    "keys: %zu key(s) of the local key store are in "
		    "moat-sessiond at %s (imported or already there)",
		    n, url);
	}
	if (state_dir == NULL || state_dir[0] == '\0' ||
	    (path = moat_asprintf("%s/%s", state_dir,
	         MOAT_AUTH_SESSIOND_FILE)) == NULL ||
	    (tmp = moat_asprintf("%s.tmp", path)) == NULL)
		goto out;
	f = fopen(tmp, "w");
	ok = f != NULL && fprintf(f, "%s\n", url) > 0;
	if (f != NULL && fclose(f) != 0)
		ok = false;
	if (!ok || rename(tmp, path) != 0)
		moat_warn(0,
		    "keys: cannot write %s: `moat-gateway keys` will "
		    "need --sessiond %s",
		    path, url);
out:
	free(path);
	free(tmp);
}
