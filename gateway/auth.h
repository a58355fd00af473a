/*
 * auth.h: the gateway's tenants, API keys, audit log and command policy
 * (auth.c, auth_keys.c, auth_audit.c). Keys and the audit log live in
 * the gateway's own LMDB (<state-dir>/gateway-db), which the running
 * gateway and the operator's `moat-gateway keys ...` commands open at
 * once (LMDB allows a second process), or, for a gateway with a
 * sessiond (moat_auth_use_sessiond), in moat-sessiond, shared by every
 * gateway (keys_remote.c, audit_remote.c).
 * Only the SHA-256 of a key's secret is stored.
 * Not for: deciding which calls need a key (the method table in
 * handlers.c) or the HTTP door (http.c).
 */
#ifndef MOAT_GATEWAY_AUTH_H
#define MOAT_GATEWAY_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "moat/config.h"
#include "moat/safety.h"

#define MOAT_AUTH_DB_DIR "gateway-db"
#define MOAT_AUTH_KEY_ID_LEN 12 /* hex characters */
#define MOAT_AUTH_TENANT_MAX 64 /* with its NUL */
#define MOAT_AUTH_AUDIT_MAX_LIMIT 1000
#define MOAT_AUTH_AUDIT_QUEUE_LEN 4096  /* entries awaiting the writer */
#define MOAT_AUTH_KEY_CACHE_TTL_MS 5000 /* a verified key is trusted */
#define MOAT_AUTH_UNAUTHENTICATED_MSG                                         \
	"missing or revoked API key: create one with moat-gateway keys "      \
	"create --tenant NAME"

struct moat_auth;
struct moat_rpc_client;

/* One key's record, wherever it is kept (the local store or sessiond). */
struct moat_key_record {
	char key_id[MOAT_AUTH_KEY_ID_LEN + 1];
	char tenant[MOAT_AUTH_TENANT_MAX];
	char sha256[65]; /* hex */
	bool revoked;
	uint64_t created_unix_ms;
};

/* moat_auth_open: opens (creating) the key store in
 * <state_dir>/gateway-db and starts its audit writer thread. On MOAT_OK
 * *out is the caller's (moat_auth_close); otherwise *errmsg (heap, caller
 * frees). */
int moat_auth_open(struct moat_auth **out, const char *state_dir,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_auth_close: commits every queued audit entry, stops the writer
 * thread and closes the store. No other call on `a` may be running or
 * start. Safe on NULL. */
void moat_auth_close(struct moat_auth *a);

/* moat_auth_tenant_valid: 1-63 of [A-Za-z0-9._-]. */
bool moat_auth_tenant_valid(const char *tenant);

/* moat_auth_tenant_reserved: whether `tenant` is reserved for moat's own
 * data ("moat." and on, e.g. MOAT_IMAGES_TENANT, issue 17): no API key is
 * ever made for one, so no client acts for it. */
bool moat_auth_tenant_reserved(const char *tenant);

/* moat_auth_key_create: a new key of `tenant`. On MOAT_OK *secret is the
 * whole key "moat_<keyid>_<secret>" (heap, caller frees; shown once,
 * never stored) and key_id (MOAT_AUTH_KEY_ID_LEN + 1 bytes) its id.
 * INVALID_ARGUMENT for a bad tenant name; errors set *errmsg (heap). */
int moat_auth_key_create(struct moat_auth *a, const char *tenant,
    char **secret, char *key_id, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_auth_key_verify: the tenant (tenant_size bytes) and key id
 * (MOAT_AUTH_KEY_ID_LEN + 1 bytes) of API key `key`. UNAUTHENTICATED
 * for a missing, malformed, unknown or revoked key; other failures (the
 * store) INTERNAL. A key verified in the last MOAT_AUTH_KEY_CACHE_TTL_MS
 * is answered from memory; otherwise one LMDB read transaction (with keys
 * in sessiond: one VerifyKey; UNAVAILABLE when it does not answer). A key
 * revoked through this `a` is refused at once, one revoked by another
 * process (the `keys revoke` command) within the TTL. Thread-safe. */
int moat_auth_key_verify(struct moat_auth *a, const char *key, char *tenant,
    size_t tenant_size, char *key_id) __attribute__((warn_unused_result));

/* moat_auth_key_revoke: marks key `key_id` revoked (kept, for the audit
 * log) and drops it from this `a`'s key cache. NOT_FOUND when unknown; errors set *errmsg (heap). */
int moat_auth_key_revoke(struct moat_auth *a, const char *key_id,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_auth_key_list: writes one line per key ("KEYID TENANT CREATED
 * active|revoked", CREATED as ISO 8601 UTC) of `tenant` (NULL: all) to
 * `f`. Errors set *errmsg (heap). */
int moat_auth_key_list(struct moat_auth *a, const char *tenant, FILE *f,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_auth_audit_append: queues `entry` (a JSON object, borrowed;
 * "at_unix_ms" is set on it) for `tenant`'s audit log and returns without
 * waiting for the disk: the writer thread commits it with whatever else
 * is queued, so readers see it one commit later (moat_auth_audit_flush).
 * With MOAT_AUTH_AUDIT_QUEUE_LEN entries queued the entry is dropped and
 * counted, and the log gets one "N audit entries dropped (queue full)"
 * entry (method "AuditDropped", code RESOURCE_EXHAUSTED, "dropped": N,
 * the text in "message" and "command") when space returns.
 * Append-only: nothing rewrites or deletes entries. Thread-safe. Errors
 * (a bad tenant, out of memory) set *errmsg (heap). */
int moat_auth_audit_append(struct moat_auth *a, const char *tenant,
    json_t *entry, char **errmsg) __attribute__((warn_unused_result));

/* moat_auth_audit_flush: waits until every entry appended (or dropped)
 * before the call is committed (or reported dropped). For tests and
 * shutdown; never called with a lock held. Safe on NULL. */
void moat_auth_audit_flush(struct moat_auth *a);

/* moat_auth_audit_list: the newest `limit` (1..MOAT_AUTH_AUDIT_MAX_LIMIT)
 * committed entries of `tenant`, oldest first, as a new JSON array in *out (the
 * caller's reference). Errors set *errmsg (heap). */
int moat_auth_audit_list(struct moat_auth *a, const char *tenant, size_t limit,
    json_t **out, char **errmsg) __attribute__((warn_unused_result));

/* moat_auth_use_sessiond: from now on `a`'s keys (create, verify, revoke,
 * list) live in moat-sessiond at `url` (client `c`, borrowed, outliving
 * `a`; NULL: the local store again); the local store stays for the audit
 * log and as the source of imports. A key sessiond does not know but the
 * local store does is imported on its first verify. While sessiond does
 * not answer, a key it confirmed within `stale_ms` (0: none) still
 * passes verification (no revoke can be made meanwhile: revokes go to
 * sessiond); others are UNAVAILABLE. Call before other threads use `a`. */
void moat_auth_use_sessiond(struct moat_auth *a, struct moat_rpc_client *c,
    const char *url, uint64_t stale_ms);

/* moat_auth_import: pushes every key of the local store (revoked ones as
 * revoked) into sessiond (moat_auth_use_sessiond first). Idempotent: a
 * key sessiond has with the same tenant and hash is left as it is, only
 * ever marked revoked. *n: keys sent. Errors set *errmsg (heap). */
int moat_auth_import(struct moat_auth *a, size_t *n, char **errmsg)
    __attribute__((warn_unused_result));

/* ---- keys_remote.c: the keys in moat-sessiond ---- */

/* MOAT_AUTH_SESSIOND_FILE: in the gateway's state directory, the sessiond
 * address its keys live at (written by moat_auth_sessiond_start), where
 * `moat-gateway keys --state-dir` finds it. */
#define MOAT_AUTH_SESSIOND_FILE "keys-sessiond"

/* moat_auth_sessiond_start: at gateway start, keys go to sessiond
 * (moat_auth_use_sessiond), the local store is imported (moat_auth_import;
 * a failure is logged: keys are then imported on first use), and
 * <state_dir>/MOAT_AUTH_SESSIOND_FILE names `url`. */
void moat_auth_sessiond_start(struct moat_auth *a, struct moat_rpc_client *c,
    const char *url, const char *state_dir, uint64_t stale_ms);

/* Each call waits up to 3 s; UNAVAILABLE (sessiond did not answer) and
 * sessiond's own statuses (NOT_FOUND, ALREADY_EXISTS) set *errmsg (heap)
 * naming sessiond's address. */
int moat_keys_remote_create(struct moat_rpc_client *c, const char *url,
    const struct moat_key_record *k, char **errmsg)
    __attribute__((warn_unused_result));
int moat_keys_remote_get(struct moat_rpc_client *c, const char *url,
    const char *key_id, struct moat_key_record *out, char **errmsg)
    __attribute__((warn_unused_result));
int moat_keys_remote_revoke(struct moat_rpc_client *c, const char *url,
    const char *key_id, char **errmsg) __attribute__((warn_unused_result));
int moat_keys_remote_list(struct moat_rpc_client *c, const char *url,
    const char *tenant, FILE *f, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_key_print: the `keys ls` line "KEYID TENANT CREATED active|revoked". */
void moat_key_print(FILE *f, const char *key_id, const char *tenant,
    uint64_t created_unix_ms, bool revoked);

/* ---- audit_remote.c: the audit log in moat-sessiond ---- */

struct moat_audit_item {
	const char *tenant;
	uint64_t us;      /* its time, microseconds since the epoch */
	const char *text; /* the entry's JSON */
};

/* The local store's audit log, and the keys of its entries kept there
 * while moat-sessiond did not take them (auth.c; audit_remote.c sends
 * them later). Keys: tenant NUL, then the time in us, 8 bytes
 * big-endian. */
#define MOAT_AUTH_DB_AUDIT "audit"
#define MOAT_AUTH_DB_AUDIT_PENDING "audit_pending"

/* moat_audit_pending_push: sends sessiond the entries the local store
 * kept while it was away (up to MOAT_AUDIT_PUSH_MAX a call, oldest
 * first), then forgets that they are pending. Logged; best effort: what
 * sessiond does not take stays pending for the next call (the audit
 * writer's, after each batch sessiond took). */
#define MOAT_AUDIT_PUSH_MAX 512
struct moat_store;
void moat_audit_pending_push(struct moat_store *st, struct moat_rpc_client *c,
    const char *url);

/* moat_audit_remote_append: one AppendAudit of `n` entries (3 s at
 * most). Errors (UNAVAILABLE: no answer) set *errmsg (heap). */
int moat_audit_remote_append(struct moat_rpc_client *c, const char *url,
    const struct moat_audit_item *items, size_t n, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_audit_remote_list: `tenant`'s newest `limit` entries from
 * sessiond, oldest first, as moat_auth_audit_list gives them. */
int moat_audit_remote_list(struct moat_rpc_client *c, const char *url,
    const char *tenant, size_t limit, json_t **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_policy_refuses: whether `tenant`'s policy refuses commands of
 * `level`: [policy] refuse.<tenant>, else [policy] refuse, else
 * "blocked"; a comma list of level names, or "none". cfg may be NULL. */
bool moat_policy_refuses(const struct moat_config *cfg, const char *tenant,
    enum moat_safety_level level);

/* moat_auth_sha256_hex: the SHA-256 of the string `s` as 64 lowercase hex
 * digits and a NUL (how secrets and headers are compared and kept). */
#define MOAT_AUTH_SHA256_HEX 65
void moat_auth_sha256_hex(const char *s, char out[MOAT_AUTH_SHA256_HEX]);

/* moat_sessiond_remote_call: one call of `method` to moat-sessiond (3 s
 * at most; keys_remote.c). On MOAT_OK *reply is the caller's; otherwise
 * *errmsg (heap) names sessiond's `url`, and a sessiond that did not
 * answer is UNAVAILABLE. */
int moat_sessiond_remote_call(struct moat_rpc_client *c, const char *url,
    const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
    char **errmsg) __attribute__((warn_unused_result));

#endif
