/*
 * sessiond.h: what the files of moat-sessiond share: the service's state,
 * the on-disk layout of recordings (layout.c), the reference counts of
 * snapshot ids (refs.c), the checks of requests (validate.c), the single
 * writer thread with group commit (writer.c) and the RPC method table
 * (handlers.c). main.c only parses options, opens
 * the store and starts these.
 * Not for: clients (they use session.proto through the RPC layer).
 */
#ifndef MOAT_SESSIOND_H
#define MOAT_SESSIOND_H

#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"
#include "moat/store.h"
#include "session.pb-c.h"

#define SESSIOND_SERVICE_NAME "moat-sessiond"

/* A session id: "ses-" and 16 lowercase hex digits. Its own type so it
 * cannot be mixed up with a sandbox or snapshot id. */
#define SESSIOND_ID_PREFIX "ses-"
#define SESSIOND_ID_LEN 20
struct sessiond_id {
	char s[SESSIOND_ID_LEN + 1];
};

/* Outputs are stored in chunks of this size in their own sub-database. */
#define SESSIOND_CHUNK (64u << 10)

/* Limits on what one request may hold (each names its field when hit). */
#define SESSIOND_MAX_TENANT 128
#define SESSIOND_MAX_SANDBOX 128
#define SESSIOND_MAX_LABELS 64
#define SESSIOND_MAX_LABEL_KEY 63
#define SESSIOND_MAX_LABEL_VALUE 256
#define SESSIOND_MAX_INPUT (8u << 20)
#define SESSIOND_MAX_SHORT 256 /* language, path part, safety, ids */
#define SESSIOND_MAX_PATH 4096
#define SESSIOND_MAX_ARGV 4096
#define SESSIOND_MAX_FS_TRACE 100000
#define SESSIOND_PAGE_DEFAULT 100
#define SESSIOND_PAGE_MAX 1000
#define SESSIOND_PAGE_BYTES (16u << 20) /* ListSteps with outputs */
#define SESSIOND_EXPORT_BYTES (32u << 20)
#define SESSIOND_MAX_REFS_ASKED 4096 /* ids in one SnapshotRefs call */

/* The session labels that stand for step 0, the state before step 1: its
 * snapshot (set by the gateway at CreateSession, or by SetStepSnapshot
 * with index 0) and why that snapshot is gone. */
#define SESSIOND_LABEL_STEP0 "moat.step0_snapshot"
#define SESSIOND_LABEL_STEP0_REMOVED "moat.step0_removed"

struct sessiond_writer;

struct sessiond {
	struct moat_store *store;
	/* idem.c: claims of request ids, an environment of its own. */
	struct moat_store *idem;
	uint64_t idem_ttl_ms; /* [sessiond] idempotency-ttl-s */
	uint64_t idem_max;    /* [sessiond] idempotency-max-keys */
	/* keys.c: the gateways' API keys, an environment of its own. */
	struct moat_store *keys;
	/* audit.c: the gateways' audit log, an environment of its own. */
	struct moat_store *audit;
	uint64_t audit_max_age_s; /* [sessiond] audit-max-age-s; 0: none */
	uint64_t audit_max_bytes; /* [sessiond] audit-max-bytes */
	/* mcp_sessions.c: the gateways' MCP sessions, an environment of
	 * its own. */
	struct moat_store *mcp;
	uint64_t mcp_ttl_ms; /* [sessiond] mcp-session-ttl-s */
	uint64_t mcp_max;    /* [sessiond] mcp-sessions-max */
	/* quota.c: the gateways' quota reservations, in memory. */
	struct sessiond_quota *quota;
	uint64_t quota_max; /* [sessiond] quota-reservations-max */
	struct sessiond_writer *writer;
	char *store_dir;
	uint64_t started_ms;
	uint64_t map_mib;
};

/* ---- layout.c: keys and records ---- */

/* Sub-databases, NULL-terminated, for moat_store_open. */
extern const char *const sessiond_dbs[];

/* sessiond_id_new: a fresh random id. */
void sessiond_id_new(struct sessiond_id *id);

/* sessiond_id_parse: true when `s` is a well-formed session id, copied
 * into *id. */
bool sessiond_id_parse(const char *s, struct sessiond_id *id);

/* Key builders. The returned length is the key's. Integers big-endian. */
size_t sessiond_key_step(uint8_t key[SESSIOND_ID_LEN + 8],
    const struct sessiond_id *id, uint64_t index);
size_t sessiond_key_output(uint8_t key[SESSIOND_ID_LEN + 13],
    const struct sessiond_id *id, uint64_t index, int stream, uint32_t chunk);
/* By tenant: tenant NUL created id; by sandbox: tenant NUL sandbox NUL
 * created id. `prefix_len` (may be NULL) is the length before created. */
size_t sessiond_key_by_tenant(uint8_t *key, size_t cap, const char *tenant,
    uint64_t created_ms, const struct sessiond_id *id, size_t *prefix_len);
size_t sessiond_key_by_sandbox(uint8_t *key, size_t cap, const char *tenant,
    const char *sandbox, uint64_t created_ms, const struct sessiond_id *id,
    size_t *prefix_len);
#define SESSIOND_KEY_INDEX_MAX                                                \
	(SESSIOND_MAX_TENANT + SESSIOND_MAX_SANDBOX + 2 + 8 + SESSIOND_ID_LEN)
/* The part of an index key after its prefix: created (8) + id. */
#define SESSIOND_INDEX_SUFFIX (8 + SESSIOND_ID_LEN)

/* sessiond_label: the value of label `key` of `s` (owned by s), or NULL
 * when it has none. */
const char *sessiond_label(const Moat__V1__SessionInfo *s, const char *key);

/* sessiond_pack: `msg` packed into a heap buffer (caller frees); NULL
 * when out of memory. */
uint8_t *sessiond_pack(const ProtobufCMessage *msg, size_t *len);

/* sessiond_session_load: the session `id` of `tenant` in *out (heap,
 * caller frees with protobuf_c_message_free_unpacked). NOT_FOUND, with a
 * message saying how to list sessions, when it is absent or another
 * tenant's. Other errors set *errmsg too (heap, caller frees). */
int sessiond_session_load(struct moat_store_txn *txn, const char *tenant,
    const struct sessiond_id *id, Moat__V1__SessionInfo **out, char **errmsg)
    __attribute__((warn_unused_result));

/* sessiond_step_load: step `index` of session `session` (already loaded
 * for the caller's tenant) in *out (heap, caller frees with
 * protobuf_c_message_free_unpacked), with its fs trace, and its outputs
 * unless omit_outputs. NOT_FOUND says which indexes exist. */
int sessiond_step_load(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *session, uint64_t index, bool omit_outputs,
    Moat__V1__Step **out, char **errmsg) __attribute__((warn_unused_result));

/* ---- path.c: branches read as paths (issue 18) ---- */

/* How many parents a step is looked for through, at most. */
#define SESSIOND_PATH_MAX_DEPTH 64

/* sessiond_first_step: the first step `s` holds itself (1 for sessions
 * recorded before first_step existed). */
uint64_t sessiond_first_step(const Moat__V1__SessionInfo *s);

/* sessiond_path_holder: the session that holds step `index` of s's path
 * in *holder: s itself, or an ancestor loaded into *owned (heap, caller
 * frees; NULL when s holds it). NOT_FOUND says which steps s has;
 * FAILED_PRECONDITION past SESSIOND_PATH_MAX_DEPTH parents. */
int sessiond_path_holder(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *s, uint64_t index,
    Moat__V1__SessionInfo **owned, const Moat__V1__SessionInfo **holder,
    char **errmsg) __attribute__((warn_unused_result));

/* sessiond_path_step_load: sessiond_step_load of step `index` of s's
 * path; an inherited step names s as session_id and its holder in
 * held_by_session. */
int sessiond_path_step_load(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *s, uint64_t index, bool omit_outputs,
    Moat__V1__Step **out, char **errmsg) __attribute__((warn_unused_result));

/* ---- tree.c: GetSessionTree ---- */

/* The most sessions of a tenant one tree is built from. */
#define SESSIOND_TREE_MAX 10000

/* sessiond_tree_build: the nodes of `root`'s tree into r (its nodes,
 * freed with r). Errors set *errmsg (heap, caller frees). */
int sessiond_tree_build(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *root, Moat__V1__SessionTreeReply *r,
    char **errmsg) __attribute__((warn_unused_result));

/* sessiond_token_encode / _decode: page tokens are the hex of the next
 * key suffix. encode returns a heap string (caller frees) or NULL;
 * decode returns false unless `token` is exactly 2 * len hex digits. */
char *sessiond_token_encode(const uint8_t *bytes, size_t len);
bool sessiond_token_decode(const char *token, uint8_t *bytes, size_t len);

/* sessiond_reply_move: moves the fields of `from` (unpacked, same
 * descriptor) into the caller-initialised `reply` and frees the shell of
 * `from`. */
void sessiond_reply_move(ProtobufCMessage *reply, ProtobufCMessage *from);

/* ---- refs.c: snapshot reference counts ----
 * snapshot_refs: tenant NUL snapshot_id -> count (8 bytes, big-endian),
 * present only while the count is above 0. Every write that adds or
 * removes a reference changes the count in its own transaction. */

/* The longest snapshot id a reference can name (step.snapshot_id and
 * label values are checked against it on the way in). */
#define SESSIOND_MAX_SNAPSHOT_ID SESSIOND_MAX_SHORT

/* sessiond_refs_get: the count of `snapshot_id` for `tenant` in *count (0
 * when nothing references it, or the id is empty or longer than any
 * stored one). Errors set *errmsg (heap, caller frees). */
int sessiond_refs_get(struct moat_store_txn *txn, const char *tenant,
    const char *snapshot_id, uint64_t *count, char **errmsg)
    __attribute__((warn_unused_result));

/* sessiond_refs_add: adds `n` references to `snapshot_id` (non-empty) of
 * `tenant`, in a write transaction. Errors set *errmsg (heap, caller
 * frees). */
int sessiond_refs_add(struct moat_store_txn *txn, const char *tenant,
    const char *snapshot_id, uint64_t n, char **errmsg)
    __attribute__((warn_unused_result));

/* sessiond_refs_drop: removes `n` references and sets *left to the count
 * after; at 0 the entry goes. A count smaller than `n` (a damaged store)
 * is logged and taken as 0. Errors set *errmsg (heap, caller frees). */
int sessiond_refs_drop(struct moat_store_txn *txn, const char *tenant,
    const char *snapshot_id, uint64_t n, uint64_t *left, char **errmsg)
    __attribute__((warn_unused_result));

/* sessiond_refs_move: a reference moved from `from` to `to` (either may
 * be NULL or empty: none); nothing when they are equal. */
int sessiond_refs_move(struct moat_store_txn *txn, const char *tenant,
    const char *from, const char *to, char **errmsg)
    __attribute__((warn_unused_result));

/* sessiond_session_snapshots: every snapshot id session `s` references,
 * its step-0 label's and its steps', once per reference, in *ids (heap
 * array of heap strings, *n of them; the caller frees them with
 * sessiond_strings_free). On failure *ids is NULL and *errmsg is set
 * (heap, caller frees). */
int sessiond_session_snapshots(struct moat_store_txn *txn,
    const Moat__V1__SessionInfo *s, char ***ids, size_t *n, char **errmsg)
    __attribute__((warn_unused_result));

/* sessiond_strings_free: frees `n` strings and the array. Safe on NULL. */
void sessiond_strings_free(char **strings, size_t n);

/* sessiond_refs_build: empties snapshot_refs and counts every reference
 * of every session again, in the write transaction `txn` (a store of
 * format 1 has no counts). *sessions and *refs say what was counted.
 * Errors set *errmsg (heap, caller frees); the caller aborts the txn. */
int sessiond_refs_build(struct moat_store_txn *txn, uint64_t *sessions,
    uint64_t *refs, char **errmsg) __attribute__((warn_unused_result));

/* ---- validate.c: every check returns MOAT_OK or the status of
 * moat_rpc_error naming the field. ---- */

int sessiond_check_tenant(struct moat_rpc_call *call, const char *tenant);
int sessiond_check_id(struct moat_rpc_call *call, const char *field,
    const char *value, struct sessiond_id *id);
int sessiond_check_create(struct moat_rpc_call *call,
    const Moat__V1__CreateSessionRequest *req);
int sessiond_check_step(struct moat_rpc_call *call,
    const Moat__V1__Step *step);
int sessiond_check_short(struct moat_rpc_call *call, const char *field,
    const char *value, size_t max);
int sessiond_check_page(struct moat_rpc_call *call, uint32_t page_size,
    uint32_t *limit);

/* ---- writer.c: the one LMDB writer ---- */

enum sessiond_op_kind {
	SESSIOND_OP_CREATE,
	SESSIOND_OP_APPEND,
	SESSIOND_OP_DELETE,
	SESSIOND_OP_SET_SNAPSHOT,
	SESSIOND_OP_SET_KEEP,
};

/* One write handed to the writer thread. The handler owns it (usually on
 * its stack) and keeps it alive until sessiond_writer_submit returns. */
struct sessiond_op {
	enum sessiond_op_kind kind;
	/* Inputs, borrowed from the request for the duration of the op. */
	const char *tenant;
	struct sessiond_id id; /* CREATE: filled by the writer */
	const Moat__V1__CreateSessionRequest *create;
	const Moat__V1__Step *step; /* APPEND */
	uint64_t index;             /* SET_SNAPSHOT (0: step 0), KEEP */
	const char *snapshot_id;    /* SET_SNAPSHOT */
	const char *removed_reason; /* SET_SNAPSHOT */
	bool keep;                  /* SET_KEEP */
	size_t bytes;               /* rough size, for batch limits */
	/* Results, valid after submit returns. `record` (heap, caller
	 * frees) is the packed SessionInfo (CREATE) or Step (SET_SNAPSHOT,
	 * SET_KEEP); `unreferenced` (DELETE: heap array of heap strings,
	 * caller frees with sessiond_strings_free) the snapshot ids whose
	 * count the delete brought to 0; `errmsg` (heap, caller frees)
	 * goes with a failed status. */
	int status;
	char *errmsg;
	uint64_t result_index; /* APPEND: the step's index */
	uint64_t result_count; /* DELETE: steps removed */
	uint8_t *record;
	size_t record_len;
	char **unreferenced;
	size_t n_unreferenced;
	/* Posted when the op is finished (by the writer for the first op
	 * of a batch, which posts the others, linked by wake_next), so a
	 * commit wakes exactly the handlers whose ops it carried, and none
	 * of them then waits for a lock the writer holds. */
	sem_t done;
	struct sessiond_op *wake_next;
};

/* sessiond_writer_start: starts the writer thread over `st` (borrowed,
 * must outlive the writer). On failure returns a status and sets *errmsg
 * (heap, caller frees). */
int sessiond_writer_start(struct sessiond_writer **out, struct moat_store *st,
    char **errmsg) __attribute__((warn_unused_result));

/* sessiond_writer_stop: finishes what is queued, stops the thread, frees
 * the writer. Safe on NULL. No submit may run or follow. */
void sessiond_writer_stop(struct sessiond_writer *w);

/* sessiond_writer_queued: writes waiting in the queue now (metrics);
 * 0 on NULL. Thread-safe. */
size_t sessiond_writer_queued(struct sessiond_writer *w);

/* sessiond_writer_submit: queues `op` (bounded queue: waits for room
 * until `deadline_ms`, monotonic, then UNAVAILABLE) and waits until the
 * writer has committed it durably or failed it. Returns op->status, with
 * op->errmsg set on failure. Thread-safe. */
int sessiond_writer_submit(struct sessiond_writer *w, struct sessiond_op *op,
    uint64_t deadline_ms) __attribute__((warn_unused_result));

/* ---- handlers.c ---- */

/* ---- aged.c: small environments, records bounded in age and count ---- */

/* sessiond_env_open: opens <state_dir>/<name>, an LMDB environment of
 * its own with `dbs`, into *st. */
int sessiond_env_open(struct moat_store **st, const char *state_dir,
    const char *name, uint64_t map_bytes, const char *const *dbs,
    char **errmsg) __attribute__((warn_unused_result));

/* sessiond_fail: fails `call` with `status` and errmsg (taken: freed),
 * or the status's own words when it is NULL. */
int sessiond_fail(struct moat_rpc_call *call, int status, char *errmsg);

#define SESSIOND_SWEEP_MAX 64 /* records a sweep drops, at most */
#define SESSIOND_AGED_KEY_MAX (SESSIOND_MAX_TENANT + 1 + 8)

/* sessiond_aged_sweep: in write txn `txn`, drops from `db` (and its age
 * index `age_db`) records aged before `cutoff_ms`, and the oldest while
 * `db` holds `max` or more, SESSIOND_SWEEP_MAX at most. */
int sessiond_aged_sweep(struct moat_store_txn *txn, const char *db,
    const char *age_db, uint64_t cutoff_ms, uint64_t max, char **errmsg)
    __attribute__((warn_unused_result));

/* sessiond_aged_index: adds (or with `del` removes: absent is fine) the
 * age index entry of record `key` (klen <= SESSIOND_AGED_KEY_MAX) at
 * `at_ms`. */
int sessiond_aged_index(struct moat_store_txn *txn, const char *age_db,
    uint64_t at_ms, const void *key, size_t klen, bool del, char **errmsg)
    __attribute__((warn_unused_result));

/* ---- idem.c: idempotency claims (issue 15) ---- */

/* sessiond_idem_open: opens <state_dir>/sessiond-idem into sd->idem. */
int sessiond_idem_open(struct sessiond *sd, const char *state_dir,
    char **errmsg) __attribute__((warn_unused_result));
int sessiond_h_claim_request(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_complete_request(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* ---- mcp_sessions.c: MCP sessions of every gateway (issue 15) ---- */

/* sessiond_mcp_open: opens <state_dir>/sessiond-mcp into sd->mcp. */
int sessiond_mcp_open(struct sessiond *sd, const char *state_dir,
    char **errmsg) __attribute__((warn_unused_result));
int sessiond_h_put_mcp_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_get_mcp_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_delete_mcp_session(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* ---- tenants.c: tenants' settings of every gateway (issue 15) ---- */

int sessiond_h_set_tenant(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_get_tenant(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_list_tenants(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_delete_tenant(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* ---- keys.c: API keys of every gateway (issue 15) ---- */

/* sessiond_check_tenant_name: INVALID_ARGUMENT unless `t` is a tenant
 * name as keys are made for (1-63 letters, digits, '.', '_', '-'). */
int sessiond_check_tenant_name(struct moat_rpc_call *call, const char *t);

/* sessiond_keys_open: opens <state_dir>/sessiond-keys into sd->keys. */
int sessiond_keys_open(struct sessiond *sd, const char *state_dir,
    char **errmsg) __attribute__((warn_unused_result));
int sessiond_h_create_key(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_verify_key(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_revoke_key(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_list_keys(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* ---- audit.c: the gateways' audit log (issue 15) ---- */

/* sessiond_audit_open: opens <state_dir>/sessiond-audit into sd->audit
 * (sd->audit_max_bytes set first: the map is sized from it). */
int sessiond_audit_open(struct sessiond *sd, const char *state_dir,
    char **errmsg) __attribute__((warn_unused_result));
int sessiond_h_append_audit(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_list_audit_log(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* ---- quota.c: quota reservations of every gateway (issue 15) ---- */

struct sessiond_quota;

/* sessiond_quota_new: an empty table of at most `max` reservations. */
int sessiond_quota_new(struct sessiond_quota **out, uint64_t max)
    __attribute__((warn_unused_result));
void sessiond_quota_free(struct sessiond_quota *q);
/* sessiond_quota_count: reservations held now (expired ones included
 * until the next call drops them). Safe on NULL (0). */
size_t sessiond_quota_count(struct sessiond_quota *q);
int sessiond_h_reserve_quota(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_land_quota(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int sessiond_h_release_quota(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);

/* sessiond_metrics_quota (metrics.c): a ReserveQuota refused for
 * `key` ("max-sandboxes", ..., or "full"). Thread-safe; nothing while
 * metrics are off. */
void sessiond_metrics_quota(const char *key);

extern const struct moat_rpc_method sessiond_methods[];
extern const size_t sessiond_n_methods;

#endif
