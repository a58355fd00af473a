/*
 * snapd.h: moat-snapd's internals shared by its files: the service object,
 * the LMDB layout (schema.c), the writer thread (writer.c) and the method
 * table (handlers.c).
 *
 * The layout, every key starting with the tenant (a length byte and the
 * name), so that no lookup can reach another tenant's data:
 *   chunks      T + id(32) + piece(1)   -> up to SNAPD_PIECE_MAX bytes
 *   chunk_refs  T + id(32)              -> refs u64, len u32, put_ms u64
 *   snapshots   T + snap(16)            -> SnapshotInfo, no chunk lists
 *   manifests   T + snap(16) + piece(4) -> SnapshotInfo with chunk lists,
 *                                          packed and cut in pieces
 *   tenants     T                       -> six u64 counters (Stats)
 * Integers are big-endian. A snapshot id's 16 bytes start with its creation
 * time in ms (48 bits), so keys, and lists, are in creation order.
 * Not for: anything outside moat-snapd (clients use snap_client.h).
 */
#ifndef MOAT_SNAPD_H
#define MOAT_SNAPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moat/chunk.h"
#include "moat/rpc.h"
#include "moat/store.h"
#include "snapshot.pb-c.h"

#define SNAPD_TENANT_MAX 64
#define SNAPD_SNAP_RAW 16
#define SNAPD_SNAP_TEXT 38 /* "snap-" + 32 hex + NUL */
#define SNAPD_KEY_MAX (1 + SNAPD_TENANT_MAX + MOAT_CHUNK_ID_LEN + 8)

/* LMDB keeps a value over ~2 KB in its own run of 4 KiB overflow pages,
 * each run with a 16-byte header. Pieces of 16 pages less that header
 * fill their pages exactly, and runs this short are easy to reuse from
 * the free list; a chunk's last few bytes ride inline in a leaf. */
#define SNAPD_PAGE 4096u
#define SNAPD_PIECE_MAX (4u * SNAPD_PAGE - 16u)

/* Caps on what one call may carry (the proto says the same). */
#define SNAPD_MISSING_MAX_IDS 65536u
#define SNAPD_PUT_MAX_CHUNKS 256u
#define SNAPD_PUT_MAX_BYTES (32u << 20)
#define SNAPD_GET_MAX_IDS 256u
#define SNAPD_GET_MAX_BYTES (32u << 20)
#define SNAPD_MAX_ARTIFACTS 16u
#define SNAPD_MAX_LABELS 64u
#define SNAPD_MAX_TEXT 256u /* image id, label keys and values */
#define SNAPD_LIST_DEFAULT 100u
#define SNAPD_LIST_MAX 1000u
#define SNAPD_CORRUPT_SCAN_MAX 1000u /* snapshots searched to name */

struct snapd_writer;

struct snapd {
	struct moat_store *store;
	char *store_dir;
	uint64_t started_ms;
	struct snapd_writer *writer;
	uint64_t pending_grace_ms; /* unreferenced chunks older are swept */
	uint64_t sweep_every_ms;   /* how often the writer sweeps */
};

struct snapd_key {
	uint8_t b[SNAPD_KEY_MAX];
	size_t len;
};

struct snapd_tenant_stats {
	uint64_t snapshots;
	uint64_t chunks; /* stored, referenced or pending */
	uint64_t stored_bytes;
	uint64_t logical_bytes;
	uint64_t pending_chunks; /* stored, no manifest uses them yet */
	uint64_t pending_bytes;
};

struct snapd_chunk_ref {
	uint64_t refs; /* manifest references */
	uint32_t len;
	uint64_t put_ms; /* unix ms of the put that stored it */
};

/* ---- schema.c ---- */

/* snapd_tenant_check: MOAT_OK for 1..64 of [A-Za-z0-9._-]; otherwise
 * INVALID_ARGUMENT with *errmsg set (heap). */
int snapd_tenant_check(const char *tenant, char **errmsg);

/* snapd_snap_id_parse: "snap-" + 32 lower-case hex digits -> raw bytes;
 * false when malformed. */
bool snapd_snap_id_parse(const char *text, uint8_t raw[SNAPD_SNAP_RAW]);
void snapd_snap_id_format(const uint8_t raw[SNAPD_SNAP_RAW],
    char out[SNAPD_SNAP_TEXT]);

/* snapd_snap_id_new: creation time `ms` then 10 random bytes. */
int snapd_snap_id_new(uint8_t raw[SNAPD_SNAP_RAW], uint64_t ms, char **errmsg);

/* Keys. `tenant` must have passed snapd_tenant_check. */
void snapd_key_tenant(struct snapd_key *k, const char *tenant);
void snapd_key_chunk(struct snapd_key *k, const char *tenant,
    const struct moat_chunk_id *id);
void snapd_key_snap(struct snapd_key *k, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW]);

/* Every function below takes a transaction of the caller's and sets
 * *errmsg (heap, caller frees) on any failure but NOT_FOUND. */

int snapd_stats_get(struct moat_store_txn *txn, const char *tenant,
    struct snapd_tenant_stats *s, char **errmsg);
/* snapd_stats_total: every tenant's counters added up (metrics). */
int snapd_stats_total(struct moat_store_txn *txn,
    struct snapd_tenant_stats *total, char **errmsg);
int snapd_stats_put(struct moat_store_txn *txn, const char *tenant,
    const struct snapd_tenant_stats *s, char **errmsg);

/* snapd_ref_get: NOT_FOUND when the tenant does not hold the chunk. */
int snapd_ref_get(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, struct snapd_chunk_ref *ref,
    char **errmsg);
int snapd_ref_put(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, const struct snapd_chunk_ref *ref,
    char **errmsg);

/* snapd_chunk_store: writes the data pieces and a ref (0 references);
 * the caller has checked that the chunk is absent. */
int snapd_chunk_store(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, const void *data, size_t len,
    uint64_t now_ms, char **errmsg);

/* snapd_chunk_free: removes the pieces and the ref of a chunk of `len`. */
int snapd_chunk_free(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, uint32_t len, char **errmsg);

/* snapd_chunk_read: the chunk's bytes into *data (heap, caller frees),
 * verified against the id. NOT_FOUND when the tenant lacks it; DATA_LOSS
 * (with *errmsg naming the chunk) when a piece is missing or the bytes do
 * not hash to the id. */
int snapd_chunk_read(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id, uint8_t **data, size_t *len,
    char **errmsg);

/* snapd_manifest_put: stores a snapshot: `full` (packed SnapshotInfo with
 * chunk lists) cut in pieces, and `light` (without) in the catalog. */
int snapd_manifest_put(struct moat_store_txn *txn, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW], const uint8_t *full, size_t full_len,
    const uint8_t *light, size_t light_len, char **errmsg);

/* snapd_manifest_get: the packed SnapshotInfo, with chunk lists when
 * `full`, into *out (heap, caller frees). NOT_FOUND when the tenant has no
 * such snapshot. */
int snapd_manifest_get(struct moat_store_txn *txn, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW], bool full, uint8_t **out, size_t *len,
    char **errmsg);

/* snapd_manifest_del: removes the catalog entry and all pieces. */
int snapd_manifest_del(struct moat_store_txn *txn, const char *tenant,
    const uint8_t raw[SNAPD_SNAP_RAW], char **errmsg);

/* ---- writer.c ---- */

/* A write job: runs on the writer thread inside its own nested
 * transaction, which is committed (with others, one fsync) when fn
 * returns MOAT_OK and dropped otherwise. fn sets *errmsg (heap) on
 * failure. */
typedef int (*snapd_job_fn)(struct snapd *sd, struct moat_store_txn *txn,
    void *arg, char **errmsg);

/* snapd_writer_start: the writer thread with a queue of `queue_len`
 * jobs. On failure returns a status and sets *errmsg (heap). */
int snapd_writer_start(struct snapd_writer **out, struct snapd *sd,
    size_t queue_len, char **errmsg);

/* snapd_writer_stop: finishes the queued jobs, joins, frees. Safe on
 * NULL. */
void snapd_writer_stop(struct snapd_writer *w);

/* snapd_writer_run: queues fn(arg) and waits until it is durable or has
 * failed; returns its status (*errmsg set, heap, on failure). A queue that
 * stays full until `deadline_ms` (monotonic) is RESOURCE_EXHAUSTED. Any
 * thread but the writer's. */
int snapd_writer_run(struct snapd_writer *w, snapd_job_fn fn, void *arg,
    uint64_t deadline_ms, char **errmsg);

/* ---- handlers.c ---- */

extern const struct moat_rpc_method snapd_methods[];
extern const size_t snapd_n_methods;

/* Checks shared by the handlers. Each returns MOAT_OK, or the status of an
 * error already put in the reply with moat_rpc_error. */
int snapd_check_tenant(struct moat_rpc_call *call, const char *tenant);
int snapd_parse_snap_id(struct moat_rpc_call *call, const char *text,
    uint8_t raw[SNAPD_SNAP_RAW]);
int snapd_read_begin(struct moat_rpc_call *call, struct snapd *sd,
    struct moat_store_txn **txn);

/* snapd_error_from: puts `errmsg` (heap, freed here; NULL for the status
 * name) in the reply and returns rv. */
int snapd_error_from(struct moat_rpc_call *call, int rv, char *errmsg);

/* snapd_id_at: the i-th id of a packed list of 32-byte ids. */
const struct moat_chunk_id *snapd_id_at(const uint8_t *ids, size_t i);

/* ---- catalog.c: handlers of the catalog calls ---- */

int snapd_h_commit(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply);
int snapd_h_get_snapshot(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply);
int snapd_h_list(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply);
int snapd_h_delete(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply);
int snapd_h_stats(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply);

/* snapd_sweep_pending: frees chunks that no manifest has used for longer
 * than sd->pending_grace_ms (uploads that never committed). A writer
 * job; `arg` is a uint64_t * that receives the count freed. */
int snapd_sweep_pending(struct snapd *sd, struct moat_store_txn *txn,
    void *arg, char **errmsg);

#endif
