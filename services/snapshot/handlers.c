/*
 * handlers.c: the moat.v1.Snapshot method table, the checks shared by
 * every handler, and the chunk calls: MissingChunks, PutChunks (every
 * arriving chunk hashed on the caller's thread, then one write job),
 * GetChunks (every chunk verified; a bad one is DATA_LOSS naming the
 * snapshots that use it), and the writer's sweep of abandoned uploads.
 * Reads run in their own LMDB read transactions, concurrently.
 * Not for: the catalog calls (catalog.c), the key layout (schema.c), the
 * writer's queue (writer.c), or flags and signals (main.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/rpc_tenant.h"
#include "moat/status.h"
#include "moat/util.h"
#include "metrics.h"
#include "snapd.h"

#define SERVICE_NAME "moat-snapd"
#define NAMED_MAX 8      /* snapshots named in a DATA_LOSS */
#define SWEEP_MAX 10000u /* chunks freed per sweep */

/* ---- shared helpers ---- */

const struct moat_chunk_id *
snapd_id_at(const uint8_t *ids, size_t i)
{
	return (const struct moat_chunk_id *)(ids + i * MOAT_CHUNK_ID_LEN);
}

/* error_from: hands a heap message from below to the reply. */
int
snapd_error_from(struct moat_rpc_call *call, int rv, char *errmsg)
{
	rv = moat_rpc_error(call, rv, "%s",
	    errmsg ? errmsg : moat_strerror(rv));
	free(errmsg);
	return rv;
}

int
snapd_check_tenant(struct moat_rpc_call *call, const char *tenant)
{
	const char *acts_for;
	char *errmsg = NULL;
	int rv;

	/* The request's field names the tenant (never "" for any or for
	 * "default"); a call that also carries Envelope.tenant (the
	 * gateway's) must name the same one (rpc_tenant.h). */
	if ((rv = snapd_tenant_check(tenant, &errmsg)) != MOAT_OK)
		return snapd_error_from(call, rv, errmsg);
	return moat_rpc_tenant(call, tenant, &acts_for);
}

static int
check_ids(struct moat_rpc_call *call, const ProtobufCBinaryData *ids,
    size_t max)
{
	if (ids->len % MOAT_CHUNK_ID_LEN != 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "ids is %zu bytes, not a multiple of %d (one SHA-256 per "
		    "chunk)",
		    ids->len, MOAT_CHUNK_ID_LEN);
	if (ids->len / MOAT_CHUNK_ID_LEN > max)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%zu ids in one call; at most %zu: split the request",
		    ids->len / MOAT_CHUNK_ID_LEN, max);
	return MOAT_OK;
}

/* parse_snap_id: INVALID_ARGUMENT for a malformed id. */
int
snapd_parse_snap_id(struct moat_rpc_call *call, const char *text,
    uint8_t raw[SNAPD_SNAP_RAW])
{
	if (!snapd_snap_id_parse(text, raw))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "snapshot id \"%.80s\" is not \"snap-\" and 32 hex "
		    "digits",
		    text);
	return MOAT_OK;
}

int
snapd_read_begin(struct moat_rpc_call *call, struct snapd *sd,
    struct moat_store_txn **txn)
{
	char *errmsg = NULL;
	int rv;

	if ((rv = moat_store_txn_begin(sd->store, false, txn, &errmsg)) !=
	    MOAT_OK)
		return snapd_error_from(call, rv, errmsg);
	return MOAT_OK;
}

/* ---- Health ---- */

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct snapd *sd = call->service_ctx;
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	r->uptime_ms = moat_rpc_now_ms() - sd->started_ms;
	if ((r->service = strdup(SERVICE_NAME)) == NULL ||
	    (r->version = strdup(MOAT_VERSION)) == NULL ||
	    (r->state_dir = strdup(sd->store_dir)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	return MOAT_OK;
}

/* ---- MissingChunks ---- */

static int
h_missing(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__MissingChunksRequest *req =
	    (const Moat__V1__MissingChunksRequest *)request;
	Moat__V1__MissingChunksReply *r =
	    (Moat__V1__MissingChunksReply *)reply;
	struct snapd *sd = call->service_ctx;
	struct moat_store_txn *txn = NULL;
	struct snapd_chunk_ref ref;
	char *errmsg = NULL;
	size_t n;
	int rv;

	if ((rv = snapd_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = check_ids(call, &req->ids, SNAPD_MISSING_MAX_IDS)) !=
	        MOAT_OK)
		return rv;
	n = req->ids.len / MOAT_CHUNK_ID_LEN;
	if (n == 0)
		return MOAT_OK;
	if ((r->missing = malloc(n * sizeof(*r->missing))) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory for %zu ids", n);
	if ((rv = snapd_read_begin(call, sd, &txn)) != MOAT_OK)
		return rv;
	for (size_t i = 0; i < n; i++) {
		const struct moat_chunk_id *id = snapd_id_at(req->ids.data, i);

		if (moat_chunk_id_is_zero(id))
			continue;
		rv = snapd_ref_get(txn, req->tenant, id, &ref, &errmsg);
		if (rv == MOAT_NOT_FOUND)
			r->missing[r->n_missing++] = (uint32_t)i;
		else if (rv != MOAT_OK)
			goto fail;
	}
	moat_store_txn_abort(txn);
	return MOAT_OK;

fail:
	moat_store_txn_abort(txn);
	return snapd_error_from(call, rv, errmsg);
}

/* ---- PutChunks ---- */

struct put_job {
	const Moat__V1__PutChunksRequest *req;
	Moat__V1__PutChunksReply *reply;
};

static int
job_put(struct snapd *sd, struct moat_store_txn *txn, void *arg, char **errmsg)
{
	struct put_job *pj = arg;
	const char *tenant = pj->req->tenant;
	struct snapd_tenant_stats st;
	struct snapd_chunk_ref ref;
	uint64_t now = moat_now_unix_ms();
	int rv;

	pj->reply->stored = pj->reply->present = 0;
	pj->reply->stored_bytes = 0;
	if ((rv = snapd_stats_get(txn, tenant, &st, errmsg)) != MOAT_OK)
		return rv;
	for (size_t i = 0; i < pj->req->n_chunks; i++) {
		const Moat__V1__SnapChunk *c = pj->req->chunks[i];
		const struct moat_chunk_id *id =
		    (const struct moat_chunk_id *)c->id.data;

		rv = snapd_ref_get(txn, tenant, id, &ref, errmsg);
		if (rv == MOAT_OK) {
			pj->reply->present++;
			continue;
		}
		if (rv != MOAT_NOT_FOUND)
			return rv;
		if ((rv = snapd_chunk_store(txn, tenant, id, c->data.data,
		         c->data.len, now, errmsg)) != MOAT_OK)
			return rv;
		pj->reply->stored++;
		pj->reply->stored_bytes += c->data.len;
		st.chunks++;
		st.stored_bytes += c->data.len;
		st.pending_chunks++;
		st.pending_bytes += c->data.len;
	}
	if (pj->reply->stored == 0)
		return MOAT_OK;
	return snapd_stats_put(txn, tenant, &st, errmsg);
}

static int
put_chunks(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__PutChunksRequest *req =
	    (const Moat__V1__PutChunksRequest *)request;
	struct put_job pj = { .req = req,
		.reply = (Moat__V1__PutChunksReply *)reply };
	struct snapd *sd = call->service_ctx;
	char *errmsg = NULL, hex[65];
	size_t total = 0;
	int rv;

	if ((rv = snapd_check_tenant(call, req->tenant)) != MOAT_OK)
		return rv;
	if (req->n_chunks > SNAPD_PUT_MAX_CHUNKS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%zu chunks in one PutChunks; at most %u: split the batch",
		    req->n_chunks, SNAPD_PUT_MAX_CHUNKS);
	/* Every check, hashing included, runs here on the caller's thread,
	 * so the writer only writes. */
	for (size_t i = 0; i < req->n_chunks; i++) {
		const Moat__V1__SnapChunk *c = req->chunks[i];

		if (c->id.len != MOAT_CHUNK_ID_LEN)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "chunk %zu: id is %zu bytes, not %d", i, c->id.len,
			    MOAT_CHUNK_ID_LEN);
		moat_chunk_id_hex((const struct moat_chunk_id *)c->id.data,
		    hex);
		if (c->data.len == 0 || c->data.len > MOAT_CHUNK_MAX_SIZE)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "chunk %zu (%s): %zu bytes; chunks are 1 to %u", i,
			    hex, c->data.len, MOAT_CHUNK_MAX_SIZE);
		total += c->data.len;
		if (total > SNAPD_PUT_MAX_BYTES)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "batch is over %u bytes at chunk %zu: split it",
			    SNAPD_PUT_MAX_BYTES, i);
		if (moat_chunk_is_zero(c->data.data, c->data.len))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "chunk %zu (%s) is all zeros: zero chunks are not "
			    "stored; mark it with a zero id in the manifest",
			    i, hex);
		if (!moat_chunk_verify(c->data.data, c->data.len,
		        (const struct moat_chunk_id *)c->id.data))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "chunk %zu: its %zu bytes do not hash to its id "
			    "%s (corrupted in transit, or a wrong id): "
			    "nothing of this batch was stored",
			    i, c->data.len, hex);
	}
	if (req->n_chunks == 0)
		return MOAT_OK;
	if ((rv = snapd_writer_run(sd->writer, job_put, &pj, call->deadline_ms,
	         &errmsg)) != MOAT_OK)
		return snapd_error_from(call, rv, errmsg);
	return MOAT_OK;
}

/* h_put: put_chunks, counted and timed (metrics.h). */
static int
h_put(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__PutChunksRequest *req =
	    (const Moat__V1__PutChunksRequest *)request;
	const Moat__V1__PutChunksReply *r =
	    (const Moat__V1__PutChunksReply *)reply;
	double t0 = moat_metrics_now();
	uint64_t bytes = 0;
	int rv = put_chunks(call, request, reply);

	for (size_t i = 0; rv == MOAT_OK && i < req->n_chunks; i++)
		bytes += req->chunks[i]->data.len;
	snapd_metrics_put(rv, moat_metrics_now() - t0, req->n_chunks, bytes,
	    r->stored, r->stored_bytes);
	return rv;
}

/* ---- GetChunks ---- */

struct users {
	uint8_t (*raw)[SNAPD_SNAP_RAW];
	size_t n, cap;
};

static int
collect_snap(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct users *u = arg;

	if (u->n >= u->cap)
		return MOAT_STORE_SCAN_STOP;
	if (klen < SNAPD_SNAP_RAW)
		return MOAT_OK;
	memcpy(u->raw[u->n++], (const uint8_t *)key + klen - SNAPD_SNAP_RAW,
	    SNAPD_SNAP_RAW);
	return MOAT_OK;
}

static bool
manifest_uses(const Moat__V1__SnapshotInfo *info,
    const struct moat_chunk_id *id)
{
	for (size_t a = 0; a < info->n_artifacts; a++) {
		const ProtobufCBinaryData *ids =
		    &info->artifacts[a]->chunk_ids;

		for (size_t i = 0; i < ids->len / MOAT_CHUNK_ID_LEN; i++)
			if (memcmp(snapd_id_at(ids->data, i), id,
			        MOAT_CHUNK_ID_LEN) == 0)
				return true;
	}
	return false;
}

/* name_users: up to NAMED_MAX of the tenant's snapshots (of the first
 * SNAPD_CORRUPT_SCAN_MAX) whose manifests use `id`, as a heap string
 * (caller frees; NULL when out of memory). Only on the error path. */
static char *
name_users(struct moat_store_txn *txn, const char *tenant,
    const struct moat_chunk_id *id)
{
	struct users u = { .cap = SNAPD_CORRUPT_SCAN_MAX };
	struct snapd_key k;
	char *names, text[SNAPD_SNAP_TEXT], *errmsg = NULL;
	size_t used = 0, named = 0,
	       cap = NAMED_MAX * (SNAPD_SNAP_TEXT + 2) + 32;

	if ((names = calloc(1, cap)) == NULL ||
	    (u.raw = calloc(u.cap, sizeof(*u.raw))) == NULL) {
		free(names);
		return NULL;
	}
	snapd_key_tenant(&k, tenant);
	if (moat_store_scan(txn, "snapshots", k.b, k.len, NULL, 0,
	        collect_snap, &u, &errmsg) != MOAT_OK) {
		free(errmsg);
		errmsg = NULL;
	}
	for (size_t i = 0; i < u.n; i++) {
		Moat__V1__SnapshotInfo *info;
		uint8_t *packed = NULL;
		size_t len;

		if (snapd_manifest_get(txn, tenant, u.raw[i], true, &packed,
		        &len, &errmsg) != MOAT_OK) {
			free(errmsg);
			errmsg = NULL;
			continue;
		}
		info = moat__v1__snapshot_info__unpack(NULL, len, packed);
		free(packed);
		if (info == NULL)
			continue;
		if (manifest_uses(info, id)) {
			snapd_snap_id_format(u.raw[i], text);
			if (named < NAMED_MAX)
				used +=
				    (size_t)snprintf(names + used, cap - used,
				        "%s%s", named ? ", " : "", text);
			named++;
		}
		moat__v1__snapshot_info__free_unpacked(info, NULL);
	}
	if (named > NAMED_MAX)
		snprintf(names + used, cap - used, " and %zu more",
		    named - NAMED_MAX);
	else if (named == 0)
		snprintf(names, cap, "no snapshot");
	free(u.raw);
	return names;
}

static int
get_chunks(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__GetChunksRequest *req =
	    (const Moat__V1__GetChunksRequest *)request;
	Moat__V1__GetChunksReply *r = (Moat__V1__GetChunksReply *)reply;
	struct snapd *sd = call->service_ctx;
	struct moat_store_txn *txn = NULL;
	uint8_t raw[SNAPD_SNAP_RAW], *data, *packed;
	char *errmsg = NULL, *names, hex[65];
	size_t n, len, bytes = 0;
	int rv;

	if ((rv = snapd_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = check_ids(call, &req->ids, SNAPD_GET_MAX_IDS)) != MOAT_OK)
		return rv;
	if (req->snapshot_id[0] != '\0' &&
	    (rv = snapd_parse_snap_id(call, req->snapshot_id, raw)) != MOAT_OK)
		return rv;
	n = req->ids.len / MOAT_CHUNK_ID_LEN;
	if ((r->chunks = calloc(n ? n : 1, sizeof(*r->chunks))) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	if ((rv = snapd_read_begin(call, sd, &txn)) != MOAT_OK)
		return rv;
	if (req->snapshot_id[0] != '\0') {
		rv = snapd_manifest_get(txn, req->tenant, raw, false, &packed,
		    &len, &errmsg);
		if (rv == MOAT_NOT_FOUND) {
			rv = moat_rpc_error(call, MOAT_NOT_FOUND,
			    "snapshot %s not found", req->snapshot_id);
			goto out;
		}
		if (rv != MOAT_OK)
			goto fail;
		free(packed);
	}
	for (size_t i = 0; i < n; i++) {
		const struct moat_chunk_id *id = snapd_id_at(req->ids.data, i);
		Moat__V1__SnapChunk *c;

		moat_chunk_id_hex(id, hex);
		if (moat_chunk_id_is_zero(id)) {
			rv = moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "id %zu is the zero-chunk marker: zero chunks are "
			    "not stored; leave a hole",
			    i);
			goto out;
		}
		rv = snapd_chunk_read(txn, req->tenant, id, &data, &len,
		    &errmsg);
		if (rv == MOAT_NOT_FOUND) {
			rv = moat_rpc_error(call, MOAT_NOT_FOUND,
			    "chunk %s is not in tenant \"%s\"'s store", hex,
			    req->tenant);
			goto out;
		}
		if (rv == MOAT_DATA_LOSS) {
			names = name_users(txn, req->tenant, id);
			moat_error(call->request_id,
			    "snapd: CORRUPT_CHUNK "
			    "tenant %s chunk %s used by %s: %s",
			    req->tenant, hex, names ? names : "?", errmsg);
			rv = moat_rpc_error(call, MOAT_DATA_LOSS,
			    "snapshot "
			    "%s: %s (used by %s); the chunk is corrupt on "
			    "disk and will not be returned: restore from "
			    "another snapshot or take a new one",
			    req->snapshot_id[0] ? req->snapshot_id :
			                          "(none named)",
			    errmsg, names ? names : "?");
			free(names);
			free(errmsg);
			goto out;
		}
		if (rv != MOAT_OK)
			goto fail;
		/* Stop before the reply outgrows its cap; the client asks
		 * again for the rest. */
		if (r->n_chunks > 0 && bytes + len > SNAPD_GET_MAX_BYTES) {
			free(data);
			break;
		}
		if ((c = malloc(sizeof(*c))) != NULL) {
			moat__v1__snap_chunk__init(c);
			c->id.data = malloc(MOAT_CHUNK_ID_LEN);
		}
		if (c == NULL || c->id.data == NULL) {
			free(c);
			free(data);
			rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "out of memory");
			goto out;
		}
		memcpy(c->id.data, id, MOAT_CHUNK_ID_LEN);
		c->id.len = MOAT_CHUNK_ID_LEN;
		c->data.data = data;
		c->data.len = len;
		r->chunks[r->n_chunks++] = c;
		bytes += len;
	}
	rv = MOAT_OK;
out:
	moat_store_txn_abort(txn);
	return rv;

fail:
	moat_store_txn_abort(txn);
	return snapd_error_from(call, rv, errmsg);
}

/* h_get_chunks: get_chunks, counted and timed (metrics.h). */
static int
h_get_chunks(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__GetChunksReply *r =
	    (const Moat__V1__GetChunksReply *)reply;
	double t0 = moat_metrics_now();
	uint64_t bytes = 0;
	int rv = get_chunks(call, request, reply);

	for (size_t i = 0; rv == MOAT_OK && i < r->n_chunks; i++)
		bytes += r->chunks[i]->data.len;
	snapd_metrics_get(rv, moat_metrics_now() - t0, r->n_chunks, bytes);
	return rv;
}

/* ---- the sweep of abandoned uploads ---- */

struct sweep {
	uint64_t older_than; /* put_ms before this is abandoned */
	size_t n;
	uint8_t (*keys)[SNAPD_KEY_MAX];
	uint32_t *lens;
};

static int
sweep_one(const void *key, size_t klen, const void *val, size_t vlen,
    void *arg)
{
	struct sweep *s = arg;
	const uint8_t *k = key, *v = val;

	if (s->n >= SWEEP_MAX)
		return MOAT_STORE_SCAN_STOP;
	if (vlen != 20 || klen != 1u + k[0] + MOAT_CHUNK_ID_LEN)
		return MOAT_OK;
	if (moat_store_u64_from_key(v) != 0 ||
	    moat_store_u64_from_key(v + 12) >= s->older_than)
		return MOAT_OK;
	memcpy(s->keys[s->n], key, klen);
	s->lens[s->n++] = (uint32_t)v[8] << 24 | (uint32_t)v[9] << 16 |
	    (uint32_t)v[10] << 8 | v[11];
	return MOAT_OK;
}

int
snapd_sweep_pending(struct snapd *sd, struct moat_store_txn *txn, void *arg,
    char **errmsg)
{
	struct sweep s = { 0 };
	uint64_t *freed = arg, now = moat_now_unix_ms();
	int rv;

	*freed = 0;
	if (now < sd->pending_grace_ms)
		return MOAT_OK;
	s.older_than = now - sd->pending_grace_ms;
	if ((s.keys = calloc(SWEEP_MAX, sizeof(*s.keys))) == NULL ||
	    (s.lens = calloc(SWEEP_MAX, sizeof(*s.lens))) == NULL) {
		rv = MOAT_RESOURCE_EXHAUSTED;
		*errmsg = moat_asprintf("out of memory for the sweep");
		goto out;
	}
	if ((rv = moat_store_scan(txn, "chunk_refs", NULL, 0, NULL, 0,
	         sweep_one, &s, errmsg)) != MOAT_OK)
		goto out;
	for (size_t i = 0; i < s.n; i++) {
		struct snapd_tenant_stats st;
		char tenant[SNAPD_TENANT_MAX + 1];
		const struct moat_chunk_id *id;
		size_t tlen = s.keys[i][0];

		memcpy(tenant, s.keys[i] + 1, tlen);
		tenant[tlen] = '\0';
		id = (const struct moat_chunk_id *)(s.keys[i] + 1 + tlen);
		if ((rv = snapd_stats_get(txn, tenant, &st, errmsg)) !=
		        MOAT_OK ||
		    (rv = snapd_chunk_free(txn, tenant, id, s.lens[i],
		         errmsg)) != MOAT_OK)
			goto out;
		st.chunks--;
		st.stored_bytes -= s.lens[i];
		st.pending_chunks--;
		st.pending_bytes -= s.lens[i];
		if ((rv = snapd_stats_put(txn, tenant, &st, errmsg)) !=
		    MOAT_OK)
			goto out;
		(*freed)++;
	}
out:
	free(s.keys);
	free(s.lens);
	return rv;
}

const struct moat_rpc_method snapd_methods[] = {
	{ "Health", h_health, false, false },
	{ "MissingChunks", h_missing, false, false },
	{ "PutChunks", h_put, true, false },
	{ "GetChunks", h_get_chunks, false, false },
	{ "CommitManifest", snapd_h_commit, true, false },
	{ "GetSnapshot", snapd_h_get_snapshot, false, false },
	{ "ListSnapshots", snapd_h_list, false, false },
	{ "DeleteSnapshot", snapd_h_delete, true, false },
	{ "Stats", snapd_h_stats, false, false },
};

const size_t snapd_n_methods =
    sizeof(snapd_methods) / sizeof(snapd_methods[0]);
