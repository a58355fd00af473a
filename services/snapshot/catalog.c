/*
 * catalog.c: the moat.v1.Snapshot catalog calls: CommitManifest (every
 * referenced chunk present with the right length, then the references and
 * the manifest in one write job, so no half-written manifest can exist),
 * GetSnapshot, ListSnapshots (by tenant, in creation order, paged; or
 * one page across tenants for the gateway's image removal),
 * DeleteSnapshot (references dropped and unused chunks freed in the same
 * job) and Stats.
 * Not for: moving chunks (handlers.c) or the key layout (schema.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moat/images.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapd.h"

/* ---- CommitManifest ---- */

struct commit_job {
	const Moat__V1__CommitManifestRequest *req;
	uint8_t *light; /* packed reply, heap: the handler's */
	size_t light_len;
};

static bool
name_ok(const char *s, size_t max)
{
	size_t n = strlen(s);

	if (n == 0 || n > max)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		        (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
		        s[i] == '-' || s[i] == '.'))
			return false;
	return true;
}

static int
check_commit(struct moat_rpc_call *call,
    const Moat__V1__CommitManifestRequest *req)
{
	uint8_t raw[SNAPD_SNAP_RAW];
	int rv;

	if ((rv = snapd_check_tenant(call, req->tenant)) != MOAT_OK)
		return rv;
	if (strcmp(req->vmm, "qemu") != 0 &&
	    strcmp(req->vmm, "firecracker") != 0)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "vmm "
		    "\"%.32s\": must be \"qemu\" or \"firecracker\"",
		    req->vmm);
	if (strlen(req->image_id) > SNAPD_MAX_TEXT)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "image id "
		    "longer than %u bytes",
		    SNAPD_MAX_TEXT);
	if (req->vcpus == 0 || req->vcpus > 1024 || req->memory_mib == 0 ||
	    req->memory_mib > (1u << 22))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "vcpus %u, "
		    "memory %u MiB: need 1 to 1024 vcpus and 1 MiB to 4 TiB",
		    req->vcpus, req->memory_mib);
	if (req->parent_id[0] != '\0' &&
	    (rv = snapd_parse_snap_id(call, req->parent_id, raw)) != MOAT_OK)
		return rv;
	if (req->n_labels > SNAPD_MAX_LABELS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%zu "
		    "labels; at most %u",
		    req->n_labels, SNAPD_MAX_LABELS);
	for (size_t i = 0; i < req->n_labels; i++)
		if (req->labels[i]->key[0] == '\0' ||
		    strlen(req->labels[i]->key) > SNAPD_MAX_TEXT ||
		    strlen(req->labels[i]->value) > SNAPD_MAX_TEXT)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "label %zu: keys are 1 to %u bytes, values up to "
			    "%u",
			    i, SNAPD_MAX_TEXT, SNAPD_MAX_TEXT);
	if (req->n_artifacts == 0 || req->n_artifacts > SNAPD_MAX_ARTIFACTS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "%zu "
		    "artifacts; a snapshot has 1 to %u",
		    req->n_artifacts, SNAPD_MAX_ARTIFACTS);
	for (size_t i = 0; i < req->n_artifacts; i++) {
		const Moat__V1__SnapArtifact *a = req->artifacts[i];
		uint64_t n;

		if (!name_ok(a->name, 64))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "artifact %zu: name \"%.64s\" is not 1 to 64 of "
			    "a-z 0-9 . _ -",
			    i, a->name);
		for (size_t j = 0; j < i; j++)
			if (strcmp(req->artifacts[j]->name, a->name) == 0)
				return moat_rpc_error(call,
				    MOAT_INVALID_ARGUMENT,
				    "artifact \"%s\" "
				    "appears twice",
				    a->name);
		if (!moat_chunk_size_valid(a->chunk_size))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "artifact \"%s\": chunk size %u is not a multiple "
			    "of %u from %u to %u",
			    a->name, a->chunk_size, MOAT_CHUNK_MIN_SIZE,
			    MOAT_CHUNK_MIN_SIZE, MOAT_CHUNK_MAX_SIZE);
		n = moat_chunk_count(a->size, a->chunk_size);
		if (n > MOAT_CHUNK_MAX_COUNT ||
		    a->chunk_ids.len != n * MOAT_CHUNK_ID_LEN)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "artifact \"%s\": %llu bytes in chunks of %u need "
			    "%llu ids (at most %u), not %zu bytes of ids",
			    a->name, (unsigned long long)a->size,
			    a->chunk_size, (unsigned long long)n,
			    MOAT_CHUNK_MAX_COUNT, a->chunk_ids.len);
	}
	return MOAT_OK;
}

static size_t
chunk_len(const Moat__V1__SnapArtifact *a, size_t i)
{
	uint64_t off = (uint64_t)i * a->chunk_size;

	return (size_t)(a->size - off < a->chunk_size ? a->size - off :
	                                                a->chunk_size);
}

/* commit_check: the first pass: every chunk present, with the length its
 * place in the file needs. Writes nothing. */
static int
commit_check(struct moat_store_txn *txn,
    const Moat__V1__CommitManifestRequest *req, char **errmsg)
{
	struct snapd_chunk_ref ref;
	uint64_t missing = 0, total = 0;
	char first[160] = "", hex[65];
	int rv;

	for (size_t a = 0; a < req->n_artifacts; a++) {
		const Moat__V1__SnapArtifact *art = req->artifacts[a];
		size_t n = art->chunk_ids.len / MOAT_CHUNK_ID_LEN;

		for (size_t i = 0; i < n; i++) {
			const struct moat_chunk_id *id =
			    snapd_id_at(art->chunk_ids.data, i);

			if (moat_chunk_id_is_zero(id))
				continue;
			total++;
			rv = snapd_ref_get(txn, req->tenant, id, &ref, errmsg);
			if (rv == MOAT_NOT_FOUND) {
				if (missing++ == 0) {
					moat_chunk_id_hex(id, hex);
					snprintf(first, sizeof(first),
					    "%s "
					    "chunk %zu (%s)",
					    art->name, i, hex);
				}
				continue;
			}
			if (rv != MOAT_OK)
				return rv;
			if (ref.len != chunk_len(art, i)) {
				moat_chunk_id_hex(id, hex);
				*errmsg = moat_asprintf(
				    "artifact \"%s\" "
				    "chunk %zu (%s): stored chunk is %u "
				    "bytes, its place needs %zu: wrong chunk "
				    "size?",
				    art->name, i, hex, ref.len,
				    chunk_len(art, i));
				return MOAT_INVALID_ARGUMENT;
			}
		}
	}
	if (missing > 0) {
		*errmsg = moat_asprintf(
		    "%llu of %llu chunks are missing from "
		    "tenant \"%s\"'s store (first: %s): put them "
		    "(MissingChunks says which) and commit again; nothing was "
		    "written",
		    (unsigned long long)missing, (unsigned long long)total,
		    req->tenant, first);
		return MOAT_FAILED_PRECONDITION;
	}
	return MOAT_OK;
}

static int
job_commit(struct snapd *sd, struct moat_store_txn *txn, void *arg,
    char **errmsg)
{
	struct commit_job *cj = arg;
	const Moat__V1__CommitManifestRequest *req = cj->req;
	Moat__V1__SnapshotInfo info = MOAT__V1__SNAPSHOT_INFO__INIT;
	Moat__V1__SnapArtifact *light_arts = NULL, **light_ptrs = NULL;
	uint8_t raw[SNAPD_SNAP_RAW], parent[SNAPD_SNAP_RAW], *full = NULL;
	char id_text[SNAPD_SNAP_TEXT];
	struct snapd_tenant_stats st;
	struct snapd_chunk_ref ref;
	size_t full_len;
	int rv;

	if (req->parent_id[0] != '\0') {
		uint8_t *p = NULL;
		size_t plen;

		snapd_snap_id_parse(req->parent_id, parent);
		rv = snapd_manifest_get(txn, req->tenant, parent, false, &p,
		    &plen, errmsg);
		free(p);
		if (rv == MOAT_NOT_FOUND) {
			*errmsg = moat_asprintf("parent snapshot %s not found",
			    req->parent_id);
			return MOAT_NOT_FOUND;
		}
		if (rv != MOAT_OK)
			return rv;
	}
	if ((rv = commit_check(txn, req, errmsg)) != MOAT_OK ||
	    (rv = snapd_stats_get(txn, req->tenant, &st, errmsg)) != MOAT_OK)
		return rv;
	/* Second pass: the references, in this same transaction. */
	for (size_t a = 0; a < req->n_artifacts; a++) {
		const Moat__V1__SnapArtifact *art = req->artifacts[a];
		size_t n = art->chunk_ids.len / MOAT_CHUNK_ID_LEN;

		info.logical_bytes += art->size;
		for (size_t i = 0; i < n; i++) {
			const struct moat_chunk_id *id =
			    snapd_id_at(art->chunk_ids.data, i);

			if (moat_chunk_id_is_zero(id)) {
				info.zero_chunks++;
				continue;
			}
			if ((rv = snapd_ref_get(txn, req->tenant, id, &ref,
			         errmsg)) != MOAT_OK)
				return rv;
			if (ref.refs++ == 0) {
				/* First use: this snapshot pays for it. */
				info.stored_bytes += ref.len;
				st.pending_chunks--;
				st.pending_bytes -= ref.len;
			}
			info.chunks++;
			if ((rv = snapd_ref_put(txn, req->tenant, id, &ref,
			         errmsg)) != MOAT_OK)
				return rv;
		}
	}
	info.created_ms = moat_now_unix_ms();
	if ((rv = snapd_snap_id_new(raw, info.created_ms, errmsg)) != MOAT_OK)
		return rv;
	snapd_snap_id_format(raw, id_text);
	info.id = id_text;
	info.tenant = req->tenant;
	info.vmm = req->vmm;
	info.image_id = req->image_id;
	info.vcpus = req->vcpus;
	info.memory_mib = req->memory_mib;
	info.parent_id = req->parent_id;
	info.n_labels = req->n_labels;
	info.labels = req->labels;
	info.n_artifacts = req->n_artifacts;
	info.artifacts = req->artifacts;
	full_len = moat__v1__snapshot_info__get_packed_size(&info);
	light_arts = calloc(req->n_artifacts, sizeof(*light_arts));
	light_ptrs = calloc(req->n_artifacts, sizeof(*light_ptrs));
	if ((full = malloc(full_len ? full_len : 1)) == NULL ||
	    light_arts == NULL || light_ptrs == NULL)
		goto fail_oom;
	moat__v1__snapshot_info__pack(&info, full);
	for (size_t a = 0; a < req->n_artifacts; a++) {
		light_arts[a] = *req->artifacts[a];
		light_arts[a].chunk_ids.data = NULL;
		light_arts[a].chunk_ids.len = 0;
		light_ptrs[a] = &light_arts[a];
	}
	info.artifacts = light_ptrs;
	cj->light_len = moat__v1__snapshot_info__get_packed_size(&info);
	if ((cj->light = malloc(cj->light_len ? cj->light_len : 1)) == NULL)
		goto fail_oom;
	moat__v1__snapshot_info__pack(&info, cj->light);
	if ((rv = snapd_manifest_put(txn, req->tenant, raw, full, full_len,
	         cj->light, cj->light_len, errmsg)) != MOAT_OK)
		goto fail;
	st.snapshots++;
	st.logical_bytes += info.logical_bytes;
	if ((rv = snapd_stats_put(txn, req->tenant, &st, errmsg)) != MOAT_OK)
		goto fail;
	free(full);
	free(light_arts);
	free(light_ptrs);
	return MOAT_OK;

fail_oom:
	rv = MOAT_RESOURCE_EXHAUSTED;
	*errmsg = moat_asprintf("out of memory packing a manifest");
fail:
	free(full);
	free(light_arts);
	free(light_ptrs);
	free(cj->light);
	cj->light = NULL;
	return rv;
}

int
snapd_h_commit(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct commit_job cj = {
		.req = (const Moat__V1__CommitManifestRequest *)request
	};
	struct snapd *sd = call->service_ctx;
	char *errmsg = NULL;
	int rv;

	if ((rv = check_commit(call, cj.req)) != MOAT_OK)
		return rv;
	if ((rv = snapd_writer_run(sd->writer, job_commit, &cj,
	         call->deadline_ms, &errmsg)) != MOAT_OK) {
		free(cj.light);
		return snapd_error_from(call, rv, errmsg);
	}
	/* The packed catalog entry is the reply, as is. */
	call->raw_reply = cj.light;
	call->raw_reply_len = cj.light_len;
	moat_info(call->request_id,
	    "snapd: COMMIT tenant %s %zu bytes of "
	    "catalog",
	    cj.req->tenant, cj.light_len);
	return MOAT_OK;
}

/* ---- GetSnapshot ---- */

int
snapd_h_get_snapshot(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	const Moat__V1__GetSnapshotRequest *req =
	    (const Moat__V1__GetSnapshotRequest *)request;
	struct snapd *sd = call->service_ctx;
	struct moat_store_txn *txn = NULL;
	uint8_t raw[SNAPD_SNAP_RAW], *packed = NULL;
	char *errmsg = NULL;
	size_t len;
	int rv;

	if ((rv = snapd_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = snapd_parse_snap_id(call, req->id, raw)) != MOAT_OK ||
	    (rv = snapd_read_begin(call, sd, &txn)) != MOAT_OK)
		return rv;
	rv = snapd_manifest_get(txn, req->tenant, raw, req->with_chunks,
	    &packed, &len, &errmsg);
	moat_store_txn_abort(txn);
	if (rv == MOAT_NOT_FOUND)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "snapshot %s not "
		    "found",
		    req->id);
	if (rv != MOAT_OK)
		return snapd_error_from(call, rv, errmsg);
	call->raw_reply = packed;
	call->raw_reply_len = len;
	return MOAT_OK;
}

/* ---- ListSnapshots ---- */

struct list_page {
	Moat__V1__ListSnapshotsReply *r;
	size_t want;
	const uint8_t *skip; /* the page token's key: not repeated */
	size_t skip_len;
	/* ListSnapshotsRequest.labels: every one must match (borrowed). */
	Moat__V1__SnapLabel *const *labels;
	size_t n_labels;
	const char *image_id; /* "": any */
	bool more;
	bool oom;
};

/* labels_match: whether `info` carries every label of the filter. */
static bool
labels_match(const struct list_page *p, const Moat__V1__SnapshotInfo *info)
{
	for (size_t i = 0; i < p->n_labels; i++) {
		bool found = false;

		for (size_t j = 0; j < info->n_labels && !found; j++)
			found = strcmp(info->labels[j]->key,
			            p->labels[i]->key) == 0 &&
			    strcmp(info->labels[j]->value,
			        p->labels[i]->value) == 0;
		if (!found)
			return false;
	}
	return true;
}

static int
list_one(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
	struct list_page *p = arg;
	Moat__V1__SnapshotInfo *info;

	if (p->skip != NULL && klen == p->skip_len &&
	    memcmp(key, p->skip, klen) == 0)
		return MOAT_OK;
	if (p->r->n_snapshots == p->want) {
		p->more = true;
		return MOAT_STORE_SCAN_STOP;
	}
	if ((info = moat__v1__snapshot_info__unpack(NULL, vlen, val)) == NULL)
		return MOAT_DATA_LOSS;
	if (!labels_match(p, info) ||
	    (p->image_id[0] != '\0' &&
	        strcmp(info->image_id, p->image_id) != 0)) {
		moat__v1__snapshot_info__free_unpacked(info, NULL);
		return MOAT_OK;
	}
	p->r->snapshots[p->r->n_snapshots++] = info;
	return MOAT_OK;
}

int
snapd_h_list(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ListSnapshotsRequest *req =
	    (const Moat__V1__ListSnapshotsRequest *)request;
	struct list_page p = { .r = (Moat__V1__ListSnapshotsReply *)reply };
	struct snapd *sd = call->service_ctx;
	struct moat_store_txn *txn = NULL;
	struct snapd_key prefix, from;
	uint8_t raw[SNAPD_SNAP_RAW];
	char *errmsg = NULL;
	int rv;

	if ((rv = snapd_check_tenant(call, req->tenant)) != MOAT_OK)
		return rv;
	p.want = req->page_size == 0 ? SNAPD_LIST_DEFAULT : req->page_size;
	if (p.want > SNAPD_LIST_MAX)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "page size "
		    "%u; at most %u",
		    req->page_size, SNAPD_LIST_MAX);
	p.labels = req->labels;
	p.n_labels = req->n_labels;
	p.image_id = req->image_id;
	snapd_key_tenant(&prefix, req->tenant);
	from.len = 0;
	if (req->all_tenants) {
		/* A scan of the whole catalog, stopped at one page of
		 * matches: rare (an image's removal) and for moat only. */
		if (strcmp(req->tenant, MOAT_IMAGES_TENANT) != 0 ||
		    req->page_token[0] != '\0')
			return moat_rpc_error(call, MOAT_PERMISSION_DENIED,
			    "all_tenants is for tenant %s only, without a "
			    "page token (the gateway's image removal)",
			    MOAT_IMAGES_TENANT);
		prefix.len = 0;
	}
	if (req->page_token[0] != '\0') {
		if (!snapd_snap_id_parse(req->page_token, raw))
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "page token \"%.80s\" is not one this service "
			    "gave",
			    req->page_token);
		snapd_key_snap(&from, req->tenant, raw);
		p.skip = from.b;
		p.skip_len = from.len;
	}
	if ((p.r->snapshots = calloc(p.want, sizeof(*p.r->snapshots))) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	if ((rv = snapd_read_begin(call, sd, &txn)) != MOAT_OK)
		return rv;
	rv = moat_store_scan(txn, "snapshots", prefix.b, prefix.len,
	    from.len ? from.b : NULL, from.len, list_one, &p, &errmsg);
	moat_store_txn_abort(txn);
	if (rv == MOAT_DATA_LOSS && errmsg == NULL)
		return moat_rpc_error(call, rv,
		    "a catalog entry of tenant "
		    "\"%s\" does not decode: the store is damaged",
		    req->tenant);
	if (rv != MOAT_OK)
		return snapd_error_from(call, rv, errmsg);
	if (p.more && !req->all_tenants && p.r->n_snapshots > 0 &&
	    (p.r->next_page_token =
	            strdup(p.r->snapshots[p.r->n_snapshots - 1]->id)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	return MOAT_OK;
}

/* ---- DeleteSnapshot ---- */

struct delete_job {
	const Moat__V1__DeleteSnapshotRequest *req;
	Moat__V1__DeleteSnapshotReply *reply;
	uint8_t raw[SNAPD_SNAP_RAW];
};

/* drop_refs: one reference less on each chunk of the manifest; a chunk
 * left with none is freed. */
static int
drop_refs(struct moat_store_txn *txn, const char *tenant,
    const Moat__V1__SnapshotInfo *info, struct snapd_tenant_stats *st,
    Moat__V1__DeleteSnapshotReply *r, char **errmsg)
{
	struct snapd_chunk_ref ref;
	char hex[65];
	int rv;

	for (size_t a = 0; a < info->n_artifacts; a++) {
		const ProtobufCBinaryData *ids =
		    &info->artifacts[a]->chunk_ids;

		for (size_t i = 0; i < ids->len / MOAT_CHUNK_ID_LEN; i++) {
			const struct moat_chunk_id *id =
			    snapd_id_at(ids->data, i);

			if (moat_chunk_id_is_zero(id))
				continue;
			rv = snapd_ref_get(txn, tenant, id, &ref, errmsg);
			if (rv == MOAT_NOT_FOUND ||
			    (rv == MOAT_OK && ref.refs == 0)) {
				moat_chunk_id_hex(id, hex);
				moat_warn(0,
				    "snapd: REFCOUNT_SKEW tenant %s "
				    "snapshot %s chunk %s had no reference "
				    "left",
				    tenant, info->id, hex);
				continue;
			}
			if (rv != MOAT_OK)
				return rv;
			if (--ref.refs > 0) {
				rv = snapd_ref_put(txn, tenant, id, &ref,
				    errmsg);
			} else {
				rv = snapd_chunk_free(txn, tenant, id, ref.len,
				    errmsg);
				r->freed_chunks++;
				r->freed_bytes += ref.len;
				st->chunks--;
				st->stored_bytes -= ref.len;
			}
			if (rv != MOAT_OK)
				return rv;
		}
	}
	return MOAT_OK;
}

static int
job_delete(struct snapd *sd, struct moat_store_txn *txn, void *arg,
    char **errmsg)
{
	struct delete_job *dj = arg;
	const char *tenant = dj->req->tenant;
	Moat__V1__SnapshotInfo *info = NULL;
	struct snapd_tenant_stats st;
	uint8_t *packed = NULL;
	size_t len;
	int rv;

	dj->reply->freed_chunks = dj->reply->freed_bytes = 0;
	rv = snapd_manifest_get(txn, tenant, dj->raw, true, &packed, &len,
	    errmsg);
	if (rv == MOAT_NOT_FOUND) {
		*errmsg = moat_asprintf("snapshot %s not found", dj->req->id);
		return rv;
	}
	if (rv != MOAT_OK)
		return rv;
	info = moat__v1__snapshot_info__unpack(NULL, len, packed);
	free(packed);
	if (info == NULL) {
		*errmsg = moat_asprintf("snapshot %s: manifest does not "
		                        "decode: the store is damaged",
		    dj->req->id);
		return MOAT_DATA_LOSS;
	}
	if ((rv = snapd_stats_get(txn, tenant, &st, errmsg)) != MOAT_OK ||
	    (rv = drop_refs(txn, tenant, info, &st, dj->reply, errmsg)) !=
	        MOAT_OK ||
	    (rv = snapd_manifest_del(txn, tenant, dj->raw, errmsg)) != MOAT_OK)
		goto out;
	st.snapshots--;
	st.logical_bytes -= info->logical_bytes;
	rv = snapd_stats_put(txn, tenant, &st, errmsg);
out:
	moat__v1__snapshot_info__free_unpacked(info, NULL);
	return rv;
}

int
snapd_h_delete(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct delete_job dj = {
		.req = (const Moat__V1__DeleteSnapshotRequest *)request,
		.reply = (Moat__V1__DeleteSnapshotReply *)reply
	};
	struct snapd *sd = call->service_ctx;
	char *errmsg = NULL;
	int rv;

	if ((rv = snapd_check_tenant(call, dj.req->tenant)) != MOAT_OK ||
	    (rv = snapd_parse_snap_id(call, dj.req->id, dj.raw)) != MOAT_OK)
		return rv;
	if ((rv = snapd_writer_run(sd->writer, job_delete, &dj,
	         call->deadline_ms, &errmsg)) != MOAT_OK)
		return snapd_error_from(call, rv, errmsg);
	moat_info(call->request_id,
	    "snapd: DELETE tenant %s %s freed %llu "
	    "chunks, %llu bytes",
	    dj.req->tenant, dj.req->id,
	    (unsigned long long)dj.reply->freed_chunks,
	    (unsigned long long)dj.reply->freed_bytes);
	return MOAT_OK;
}

/* ---- Stats ---- */

int
snapd_h_stats(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__SnapshotStatsRequest *req =
	    (const Moat__V1__SnapshotStatsRequest *)request;
	Moat__V1__SnapshotStatsReply *r =
	    (Moat__V1__SnapshotStatsReply *)reply;
	struct snapd *sd = call->service_ctx;
	struct moat_store_txn *txn = NULL;
	struct snapd_tenant_stats st;
	char *errmsg = NULL;
	int rv;

	if ((rv = snapd_check_tenant(call, req->tenant)) != MOAT_OK ||
	    (rv = snapd_read_begin(call, sd, &txn)) != MOAT_OK)
		return rv;
	rv = snapd_stats_get(txn, req->tenant, &st, &errmsg);
	moat_store_txn_abort(txn);
	if (rv != MOAT_OK)
		return snapd_error_from(call, rv, errmsg);
	if ((r->tenant = strdup(req->tenant)) == NULL)
		return moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "out of memory");
	r->snapshots = st.snapshots;
	r->chunks = st.chunks;
	r->stored_bytes = st.stored_bytes;
	r->logical_bytes = st.logical_bytes;
	r->pending_chunks = st.pending_chunks;
	r->pending_bytes = st.pending_bytes;
	r->dedup_ratio = st.stored_bytes == 0 ?
	    0.0 :
	    (double)st.logical_bytes / (double)st.stored_bytes;
	return MOAT_OK;
}
