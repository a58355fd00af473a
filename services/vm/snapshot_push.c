/*
 * snapshot_push.c: a node's local snapshots to and from moat-snapd
 * (issue 3). After a snapshot is complete and the sandbox runs again,
 * push cuts its three files (RAM copy, scratch disk copy, device state)
 * into chunks, sends only those the tenant's store lacks and commits one
 * manifest that carries what a restore needs (VMM kind, image and its
 * build stamp, size, accelerator). Fetch does the reverse for a snapshot
 * this node does not hold: every chunk is verified on the way in, the
 * files are assembled in <id>.tmp and the directory is renamed into
 * place only when complete, so a restore never sees a partial snapshot.
 * A fetch pulls only the chunks this node lacks: when the snapshot's
 * parent is here, its files seed the new ones (a chunk whose id matches
 * is copied locally, verified like any other) and only the rest cross
 * the wire.
 * Not for: pausing and copying (the driver) or the local catalog
 * (snapshot.c); the push never fails a snapshot, it records why not.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moat/chunk.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snap_client.h"
#include "ramdir.h"
#include "snapram.h"
#include "node.h"
#include "sync.h"
#include "snapshot.h"
#include "snapshot_push.h"

#define PUSH_HEALTH_MS 2000u       /* a snapd that is down, found fast */
#define FETCH_META_MAX (64u << 10)
#define N_ARTIFACTS 3

/* The artifacts of a snapshot directory, by their manifest names. */
static const struct {
	const char *name;
	const char *file;
} artifacts[N_ARTIFACTS] = {
	{ "ram", MOAT_VMM_SNAP_RAM },
	{ "disk", MOAT_VMM_SNAP_SCRATCH },
	{ "device_state", MOAT_VMM_SNAP_DEVICE_STATE },
};

static const char *
tenant_or_default(const char *tenant)
{
	return tenant != NULL && tenant[0] != '\0' ? tenant : "default";
}

/* Is snapd there? A short Health, so a snapd that is down costs the
 * snapshot seconds, not the RPC default. */
static int
snapd_ping(struct vmd *vmd, char **errmsg)
{
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = PUSH_HEALTH_MS };
	ProtobufCMessage *reply = NULL;
	int rv;

	rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "Health", &req.base,
	    &moat__v1__health_reply__descriptor, &reply, &opts, errmsg);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

void
vmd_snapshot_push(struct vmd *vmd, uint64_t request_id,
    const Moat__V1__LocalSnapshot *meta, const char *dir,
    const char *parent_id, struct vmd_push_result *res)
{
	Moat__V1__CommitManifestRequest req =
	    MOAT__V1__COMMIT_MANIFEST_REQUEST__INIT;
	Moat__V1__SnapArtifact arts[N_ARTIFACTS];
	Moat__V1__SnapArtifact *art_ptrs[N_ARTIFACTS];
	Moat__V1__SnapLabel labels[8];
	Moat__V1__SnapLabel *label_ptrs[8];
	Moat__V1__SnapshotInfo *info = NULL;
	ProtobufCMessage *reply = NULL;
	const char *tenant = tenant_or_default(meta->tenant);
	char scratch_mib[24];
	char *err = NULL, *path = NULL;
	size_t n_labels = 0;
	int rv;

	memset(res, 0, sizeof(*res));
	for (size_t i = 0; i < N_ARTIFACTS; i++)
		moat__v1__snap_artifact__init(&arts[i]);
	if (vmd->snapd == NULL)
		return;
	if ((rv = snapd_ping(vmd, &err)) != MOAT_OK)
		goto fail;
	for (size_t i = 0; i < N_ARTIFACTS; i++) {
		struct moat_snap_push_stats st = { 0 };

		free(path);
		if ((path = moat_asprintf("%s/%s", dir, artifacts[i].file)) ==
		    NULL) {
			rv = MOAT_INTERNAL;
			err = strdup("out of memory");
			goto fail;
		}
		if ((rv = moat_snap_push_file(vmd->snapd, tenant,
		    artifacts[i].name, path, MOAT_CHUNK_SIZE, &arts[i], &st,
		    &err)) != MOAT_OK)
			goto fail;
		art_ptrs[i] = &arts[i];
	}
#define LABEL(k, v)                                                         \
	do {                                                                \
		moat__v1__snap_label__init(&labels[n_labels]);              \
		labels[n_labels].key = (char *)(k);                         \
		labels[n_labels].value = (char *)(v);                       \
		label_ptrs[n_labels] = &labels[n_labels];                   \
		n_labels++;                                                 \
	} while (0)
	snprintf(scratch_mib, sizeof(scratch_mib), "%" PRIu64,
	    meta->scratch_mib);
	LABEL("local_id", meta->snapshot_id);
	LABEL("node", vmd->cfg.node_id);
	LABEL("sandbox_id", meta->sandbox_id);
	LABEL("tenant", meta->tenant);
	LABEL("accel", meta->accel);
	LABEL("image_stamp", meta->image_stamp);
	LABEL("scratch_mib", scratch_mib);
#undef LABEL
	req.tenant = (char *)tenant;
	req.vmm = (char *)vmd->vmm->name;
	req.image_id = meta->image;
	req.vcpus = meta->vcpus;
	req.memory_mib = meta->memory_mib;
	req.parent_id = (char *)(parent_id ? parent_id : "");
	req.labels = label_ptrs;
	req.n_labels = n_labels;
	req.artifacts = art_ptrs;
	req.n_artifacts = N_ARTIFACTS;
	if ((rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE,
	    "CommitManifest", &req.base, &moat__v1__snapshot_info__descriptor,
	    &reply, NULL, &err)) != MOAT_OK)
		goto fail;
	info = (Moat__V1__SnapshotInfo *)reply;
	res->remote_id = strdup(info->id);
	res->stored_bytes = info->stored_bytes;
	res->logical_bytes = info->logical_bytes;
	if (res->remote_id == NULL) {
		rv = MOAT_INTERNAL;
		err = strdup("out of memory");
		goto fail;
	}
	moat_info(request_id, "snapshot %s: stored in moat-snapd as %s "
	    "(tenant %s, parent %s): %" PRIu64 " B new of %" PRIu64 " B",
	    meta->snapshot_id, info->id, tenant,
	    req.parent_id[0] ? req.parent_id : "none", info->stored_bytes,
	    info->logical_bytes);
	goto out;
fail:
	res->error = moat_asprintf("not stored in moat-snapd %s (%s): %s",
	    vmd->cfg.snapd_url, moat_strerror(rv), err ? err : "?");
	moat_warn(request_id, "snapshot %s: %s; it stays local to node %s",
	    meta->snapshot_id, res->error ? res->error : "not stored",
	    vmd->cfg.node_id);
out:
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	for (size_t i = 0; i < N_ARTIFACTS; i++)
		moat_snap_artifact_clear(&arts[i]);
	free(path);
	free(err);
}

/* One non-zero chunk of a local file that may seed a pull. */
struct seed_chunk {
	uint8_t id[MOAT_CHUNK_ID_LEN];
	uint64_t offset;
};

/* A local file's non-zero chunks, sorted by id (owned: free v, close fd). */
struct seed {
	struct seed_chunk *v;
	size_t n, cap;
	int fd;
};

static int
seed_add(const struct moat_chunk *c, void *arg, char **errmsg)
{
	struct seed *sd = arg;

	if (c->zero)
		return MOAT_OK;
	if (sd->n == sd->cap) {
		size_t cap = sd->cap ? sd->cap * 2 : 1024;
		struct seed_chunk *v = realloc(sd->v, cap * sizeof(*v));

		if (v == NULL) {
			*errmsg = strdup("out of memory");
			return MOAT_INTERNAL;
		}
		sd->v = v;
		sd->cap = cap;
	}
	memcpy(sd->v[sd->n].id, c->id.b, MOAT_CHUNK_ID_LEN);
	sd->v[sd->n++].offset = c->offset;
	return MOAT_OK;
}

static int
seed_cmp(const void *a, const void *b)
{
	return memcmp(a, b, MOAT_CHUNK_ID_LEN);
}

/* Chunks `path` (if it exists) into *sd. Returns false when there is no
 * usable seed; a seed is only an optimisation, so errors just log. */
static bool
seed_load(struct seed *sd, const char *path, uint32_t chunk_size)
{
	char *err = NULL;

	memset(sd, 0, sizeof(*sd));
	sd->fd = -1;
	if (access(path, R_OK) != 0)
		return false;
	if (moat_chunk_file(path, chunk_size, seed_add, sd, NULL, &err) !=
	    MOAT_OK || (sd->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		moat_warn(0, "not seeding a pull from %s: %s", path,
		    err ? err : strerror(errno));
		free(err);
		free(sd->v);
		memset(sd, 0, sizeof(*sd));
		sd->fd = -1;
		return false;
	}
	qsort(sd->v, sd->n, sizeof(*sd->v), seed_cmp);
	return true;
}

static void
seed_free(struct seed *sd)
{
	free(sd->v);
	if (sd->fd >= 0)
		close(sd->fd);
	memset(sd, 0, sizeof(*sd));
	sd->fd = -1;
}

/* Writes artifact `a` of snapshot `snap_id` to `path`: chunks found in
 * `sd` (may be NULL) are copied from there, the rest come from snapd;
 * every one is verified by the writer. *local / *remote count them. */
static int
pull_seeded(struct vmd *vmd, const char *tenant, const char *snap_id,
    const Moat__V1__SnapArtifact *a, const char *path, struct seed *sd,
    uint64_t *local, uint64_t *remote, char **errmsg)
{
	Moat__V1__GetChunksRequest req = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	struct moat_chunk_writer *w = NULL;
	uint8_t ids[MOAT_SNAP_PULL_BATCH * MOAT_CHUNK_ID_LEN];
	uint64_t batch[MOAT_SNAP_PULL_BATCH], idx, next = 0;
	size_t n_ids = a->chunk_ids.len / MOAT_CHUNK_ID_LEN;
	uint8_t *buf = NULL;
	int rv;

	if ((rv = moat_chunk_writer_open(&w, path, a->size, a->chunk_size,
	    a->chunk_ids.data, n_ids, errmsg)) != MOAT_OK)
		return rv;
	if (sd != NULL && sd->n > 0 &&
	    (buf = malloc(a->chunk_size)) != NULL) {
		for (idx = moat_chunk_writer_next_missing(w, 0);
		    idx != UINT64_MAX;
		    idx = moat_chunk_writer_next_missing(w, idx + 1)) {
			const struct seed_chunk *hit = bsearch(
			    a->chunk_ids.data + idx * MOAT_CHUNK_ID_LEN, sd->v,
			    sd->n, sizeof(*sd->v), seed_cmp);
			uint64_t off = idx * a->chunk_size;
			size_t len = a->size - off < a->chunk_size ?
			    (size_t)(a->size - off) : a->chunk_size;
			char *err = NULL;

			if (hit == NULL || pread(sd->fd, buf, len,
			    (off_t)hit->offset) != (ssize_t)len)
				continue;
			/* A seed that changed since is caught here and the
			 * chunk comes from snapd instead. */
			if (moat_chunk_writer_put(w, idx, buf, len, &err) ==
			    MOAT_OK)
				(*local)++;
			free(err);
		}
	}
	req.tenant = (char *)tenant;
	req.snapshot_id = (char *)snap_id;
	idx = moat_chunk_writer_next_missing(w, 0);
	while (idx != UINT64_MAX) {
		Moat__V1__GetChunksReply *r;
		ProtobufCMessage *reply = NULL;
		size_t n = 0;

		for (next = idx; next != UINT64_MAX &&
		    n < MOAT_SNAP_PULL_BATCH;
		    next = moat_chunk_writer_next_missing(w, next + 1)) {
			batch[n] = next;
			memcpy(ids + n++ * MOAT_CHUNK_ID_LEN,
			    a->chunk_ids.data + next * MOAT_CHUNK_ID_LEN,
			    MOAT_CHUNK_ID_LEN);
		}
		req.ids.data = ids;
		req.ids.len = n * MOAT_CHUNK_ID_LEN;
		if ((rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE,
		    "GetChunks", &req.base,
		    &moat__v1__get_chunks_reply__descriptor, &reply, NULL,
		    errmsg)) != MOAT_OK)
			goto fail;
		r = (Moat__V1__GetChunksReply *)reply;
		if (r->n_chunks == 0 || r->n_chunks > n) {
			*errmsg = moat_asprintf("GetChunks answered %zu "
			    "chunks for %zu ids", r->n_chunks, n);
			protobuf_c_message_free_unpacked(reply, NULL);
			rv = MOAT_INTERNAL;
			goto fail;
		}
		for (size_t i = 0; i < r->n_chunks && rv == MOAT_OK; i++)
			rv = moat_chunk_writer_put(w, batch[i],
			    r->chunks[i]->data.data, r->chunks[i]->data.len,
			    errmsg);
		*remote += r->n_chunks;
		/* A short reply resumes at the first chunk it left out. */
		idx = r->n_chunks == n ? next : batch[r->n_chunks];
		protobuf_c_message_free_unpacked(reply, NULL);
		if (rv != MOAT_OK)
			goto fail;
	}
	free(buf);
	return moat_chunk_writer_commit(w, errmsg);
fail:
	free(buf);
	moat_chunk_writer_abort(w);
	return rv;
}

/* The value of label `key` of `info`, or "" (borrowed). */
static const char *
label_of(const Moat__V1__SnapshotInfo *info, const char *key)
{
	for (size_t i = 0; i < info->n_labels; i++)
		if (strcmp(info->labels[i]->key, key) == 0)
			return info->labels[i]->value;
	return "";
}

/* Where artifact `name` goes: the RAM on tmpfs next to the driver's own
 * snapshot copies ("<ram-dir>/moat-<id>.ram", a symlink in the directory,
 * so deleting the snapshot removes it), the others inside tmp. Heap. */
static char *
fetch_target(const char *name, const char *tmp, const char *id)
{
	if (strcmp(name, "ram") == 0)
		return moat_asprintf("%s/moat-%s.ram", vmd_ram_dir(), id);
	for (size_t i = 0; i < N_ARTIFACTS; i++)
		if (strcmp(name, artifacts[i].name) == 0)
			return moat_asprintf("%s/%s", tmp, artifacts[i].file);
	return NULL;
}

/* Writes <tmp>/meta.pb for snapshot `info` fetched into `dir`. */
static int
fetch_write_meta(const Moat__V1__SnapshotInfo *info, const char *tmp,
    const char *dir, char **errmsg)
{
	Moat__V1__LocalSnapshot meta = MOAT__V1__LOCAL_SNAPSHOT__INIT;
	char *path = moat_asprintf("%s/meta.pb", tmp);
	uint8_t *packed = NULL;
	size_t len;
	int e;

	meta.snapshot_id = info->id;
	meta.sandbox_id = (char *)label_of(info, "sandbox_id");
	meta.dir = (char *)dir;
	/* The sandbox's own tenant; "" was pushed as "default". */
	meta.tenant = (char *)label_of(info, "tenant");
	if (meta.tenant[0] == '\0')
		meta.tenant = info->tenant;
	meta.image = info->image_id;
	meta.vcpus = info->vcpus;
	meta.memory_mib = info->memory_mib;
	meta.scratch_mib = strtoull(label_of(info, "scratch_mib"), NULL, 10);
	meta.accel = (char *)label_of(info, "accel");
	meta.image_stamp = (char *)label_of(info, "image_stamp");
	meta.created_unix_ms = info->created_ms;
	meta.remote_id = info->id;
	meta.remote_stored = true;
	meta.remote_stored_bytes = info->stored_bytes;
	meta.remote_logical_bytes = info->logical_bytes;
	meta.remote_parent_id = info->parent_id;
	for (size_t i = 0; i < info->n_artifacts; i++) {
		const Moat__V1__SnapArtifact *a = info->artifacts[i];

		if (strcmp(a->name, "ram") == 0)
			meta.ram_bytes = a->size;
		else if (strcmp(a->name, "disk") == 0)
			meta.disk_bytes = a->size;
		else if (strcmp(a->name, "device_state") == 0)
			meta.device_state_bytes = a->size;
	}
	len = moat__v1__local_snapshot__get_packed_size(&meta);
	if (path == NULL || len > FETCH_META_MAX ||
	    (packed = malloc(len ? len : 1)) == NULL) {
		free(path);
		*errmsg = strdup("out of memory or a catalog entry too large");
		return MOAT_INTERNAL;
	}
	moat__v1__local_snapshot__pack(&meta, packed);
	e = moat_write_file_atomic(path, packed, len, 0600);
	free(packed);
	free(path);
	if (e != 0) {
		*errmsg = moat_asprintf("cannot write its catalog entry: %s",
		    strerror(e));
		return moat_status_from_errno(e);
	}
	return MOAT_OK;
}

int
vmd_snapshot_fetch(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, const char *tenant, const char *dir)
{
	Moat__V1__GetSnapshotRequest req = MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	Moat__V1__SnapshotInfo *info = NULL;
	ProtobufCMessage *reply = NULL;
	char *tmp = NULL, *err = NULL, *ram = NULL, *link = NULL;
	char *root = NULL;
	bool have[N_ARTIFACTS] = { false };
	uint64_t n_local = 0, n_remote = 0;
	struct stat st;
	uint64_t t0 = moat_rpc_now_ms();
	uint64_t admitted = 0;
	int rv, e;

	if (vmd->snapd == NULL)
		return moat_rpc_error(call, MOAT_NOT_FOUND, "snapshot %s not "
		    "found on node %s (ListLocalSnapshots lists them; this "
		    "node has no [vmd] snapd to pull others from)", id,
		    vmd->cfg.node_id);
	pthread_mutex_lock(&vmd->fetch_mu);
	/* Another restore may have fetched it while this one waited. */
	if (stat(dir, &st) == 0) {
		rv = MOAT_OK;
		goto out;
	}
	if ((rv = snapd_ping(vmd, &err)) != MOAT_OK) {
		rv = moat_rpc_error(call, MOAT_UNAVAILABLE, "snapshot %s is "
		    "not on node %s and moat-snapd %s does not answer (%s): "
		    "start it, or restore on the node that took the snapshot",
		    id, vmd->cfg.node_id, vmd->cfg.snapd_url, err ? err : "?");
		goto out;
	}
	free(err);
	err = NULL;
	req.tenant = (char *)tenant_or_default(tenant);
	req.id = (char *)id;
	req.with_chunks = true;
	if ((rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "GetSnapshot",
	    &req.base, &moat__v1__snapshot_info__descriptor, &reply, NULL,
	    &err)) != MOAT_OK) {
		if (rv == MOAT_NOT_FOUND)
			rv = moat_rpc_error(call, MOAT_NOT_FOUND, "snapshot %s "
			    "not found on node %s nor in moat-snapd: %s", id,
			    vmd->cfg.node_id, err ? err : "?");
		else
			rv = moat_rpc_error(call, rv, "snapshot %s is not on "
			    "node %s and moat-snapd %s failed to describe it: "
			    "%s", id, vmd->cfg.node_id, vmd->cfg.snapd_url,
			    err ? err : "?");
		goto out;
	}
	info = (Moat__V1__SnapshotInfo *)reply;
	if (strcmp(info->vmm, vmd->vmm->name) != 0) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION, "snapshot "
		    "%s was taken by the %s driver; node %s runs %s: restore "
		    "it on a %s node", id, info->vmm, vmd->cfg.node_id,
		    vmd->vmm->name, info->vmm);
		goto out;
	}
	root = moat_asprintf("%s/snapshots", vmd->cfg.state_dir);
	tmp = moat_asprintf("%s.tmp", dir);
	link = tmp ? moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, tmp) : NULL;
	if (!root || !tmp || !link) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	/* A .tmp left by a crash: fetches here are serialised (fetch_mu)
	 * and the state directory is this process's (vmd.lock). */
	(void)moat_rm_rf(tmp);
	if ((e = moat_mkdir_p(root, 0700)) != 0 || mkdir(tmp, 0700) != 0) {
		e = e ? e : errno;
		rv = moat_rpc_error(call, moat_status_from_errno(e), "cannot "
		    "create snapshot directory %s: %s", tmp, strerror(e));
		goto out;
	}
	/* Its RAM lands in the RAM dir: make room as a create would. */
	for (size_t i = 0; i < info->n_artifacts; i++) {
		const Moat__V1__SnapArtifact *a = info->artifacts[i];
		size_t n = a->chunk_ids.len / MOAT_CHUNK_ID_LEN;

		if (strcmp(a->name, "ram") != 0)
			continue;
		for (size_t c = 0; c < n; c++)
			if (!moat_chunk_id_is_zero((const struct moat_chunk_id *)
			    (a->chunk_ids.data + c * MOAT_CHUNK_ID_LEN)))
				admitted += a->chunk_size;
	}
	if ((rv = vmd_ram_admit(vmd, call, admitted, "a pulled snapshot's "
	    "RAM")) != MOAT_OK) {
		admitted = 0;
		goto out_rm;
	}
	for (size_t i = 0; i < info->n_artifacts; i++) {
		const Moat__V1__SnapArtifact *a = info->artifacts[i];
		char *target = fetch_target(a->name, tmp, id);
		size_t k;

		for (k = 0; k < N_ARTIFACTS; k++)
			if (strcmp(a->name, artifacts[k].name) == 0)
				break;
		if (target == NULL || k == N_ARTIFACTS || have[k]) {
			free(target);
			rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
			    "snapshot %s in moat-snapd has an artifact \"%s\" "
			    "a vmd snapshot does not have (or twice): it was "
			    "not made by vmd and cannot be restored", id,
			    a->name);
			goto out_rm;
		}
		if (k == 0) {
			ram = target;
			if (symlink(ram, link) != 0) {
				e = errno;
				rv = moat_rpc_error(call,
				    moat_status_from_errno(e), "cannot link "
				    "%s: %s", link, strerror(e));
				goto out_rm;
			}
		}
		{
			/* The parent, when this node holds it, seeds it. */
			struct seed sd;
			char *seed_path = info->parent_id[0] ?
			    moat_asprintf("%s/%s/%s", root, info->parent_id,
			    artifacts[k].file) : NULL;
			bool seeded = seed_path != NULL &&
			    seed_load(&sd, seed_path, a->chunk_size);

			rv = pull_seeded(vmd, req.tenant, id, a, target,
			    seeded ? &sd : NULL, &n_local, &n_remote, &err);
			if (seeded)
				seed_free(&sd);
			free(seed_path);
		}
		if (k != 0)
			free(target);
		if (rv == MOAT_DATA_LOSS) {
			rv = moat_rpc_error(call, MOAT_DATA_LOSS, "snapshot %s "
			    "is corrupt in moat-snapd (its %s): %s; it was not "
			    "restored", id, a->name, err ? err : "?");
			goto out_rm;
		}
		if (rv != MOAT_OK) {
			rv = moat_rpc_error(call, rv, "cannot pull the %s of "
			    "snapshot %s from moat-snapd %s: %s", a->name, id,
			    vmd->cfg.snapd_url, err ? err : "?");
			goto out_rm;
		}
		free(err);
		err = NULL;
		have[k] = true;
	}
	for (size_t k = 0; k < N_ARTIFACTS; k++)
		if (!have[k]) {
			rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
			    "snapshot %s in moat-snapd lacks its %s: it cannot "
			    "be restored", id, artifacts[k].name);
			goto out_rm;
		}
	if ((rv = fetch_write_meta(info, tmp, dir, &err)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "snapshot %s: %s", id,
		    err ? err : "?");
		goto out_rm;
	}
	if (rename(tmp, dir) != 0) {
		e = errno;
		rv = moat_rpc_error(call, moat_status_from_errno(e), "cannot "
		    "rename %s to %s: %s", tmp, dir, strerror(e));
		goto out_rm;
	}
	moat_info(call->request_id, "snapshot %s: pulled from moat-snapd in "
	    "%" PRIu64 " ms (%" PRIu64 " B logical): %" PRIu64 " chunks "
	    "pulled, %" PRIu64 " copied from parent %s here", id,
	    moat_rpc_now_ms() - t0, info->logical_bytes, n_remote, n_local,
	    info->parent_id[0] ? info->parent_id : "(none)");
	rv = MOAT_OK;
	goto out;
out_rm:
	if (ram != NULL && unlink(ram) != 0 && errno != ENOENT)
		moat_warn(call->request_id, "cannot remove %s: %s", ram,
		    strerror(errno));
	(void)moat_rm_rf(tmp);
out:
	vmd_ram_admit_done(vmd, admitted);
	pthread_mutex_unlock(&vmd->fetch_mu);
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	free(ram);
	free(link);
	free(tmp);
	free(root);
	free(err);
	return rv;
}

/* ---- an evicted snapshot's RAM back from snapd (issue 11) ---- */

#define PULL_THREADS 8u
/* Chunks per stripe, a multiple of 8: threads own whole bytes of the
 * writer's bitmap, and each stripe is one GetChunks. */
#define PULL_STRIPE 64u

/* One puller thread: stripes k, k + n, k + 2n ... of the artifact. */
struct pull_job {
	struct vmd *vmd;
	const char *tenant;
	const char *snap_id;
	const Moat__V1__SnapArtifact *art;
	struct moat_chunk_writer *w;
	uint32_t k, n;
	int rv;
	char *err;                 /* heap, with rv */
	pthread_t thread;
	bool started;
};

/* Pulls the missing chunks of stripe `s` (GetChunks may answer short:
 * it is asked again for the rest). */
static int
pull_stripe(struct pull_job *j, uint64_t s)
{
	Moat__V1__GetChunksRequest req = MOAT__V1__GET_CHUNKS_REQUEST__INIT;
	const Moat__V1__SnapArtifact *a = j->art;
	size_t n_ids = a->chunk_ids.len / MOAT_CHUNK_ID_LEN;
	uint64_t end = (s + 1) * PULL_STRIPE < n_ids ? (s + 1) * PULL_STRIPE :
	    n_ids;
	uint8_t ids[PULL_STRIPE * MOAT_CHUNK_ID_LEN];
	uint64_t batch[PULL_STRIPE];
	int rv = MOAT_OK;

	req.tenant = (char *)j->tenant;
	req.snapshot_id = (char *)j->snap_id;
	for (;;) {
		Moat__V1__GetChunksReply *r;
		ProtobufCMessage *reply = NULL;
		size_t n = 0;

		for (uint64_t i = moat_chunk_writer_next_missing(j->w,
		    s * PULL_STRIPE); i < end;
		    i = moat_chunk_writer_next_missing(j->w, i + 1)) {
			batch[n] = i;
			memcpy(ids + n++ * MOAT_CHUNK_ID_LEN,
			    a->chunk_ids.data + i * MOAT_CHUNK_ID_LEN,
			    MOAT_CHUNK_ID_LEN);
		}
		if (n == 0)
			return MOAT_OK;
		req.ids.data = ids;
		req.ids.len = n * MOAT_CHUNK_ID_LEN;
		if ((rv = moat_rpc_call(j->vmd->snapd, MOAT_SNAP_SERVICE,
		    "GetChunks", &req.base,
		    &moat__v1__get_chunks_reply__descriptor, &reply, NULL,
		    &j->err)) != MOAT_OK)
			return rv;
		r = (Moat__V1__GetChunksReply *)reply;
		if (r->n_chunks == 0 || r->n_chunks > n) {
			j->err = moat_asprintf("GetChunks answered %zu chunks "
			    "for %zu ids", r->n_chunks, n);
			rv = MOAT_INTERNAL;
		}
		for (size_t i = 0; i < r->n_chunks && rv == MOAT_OK; i++)
			rv = moat_chunk_writer_put(j->w, batch[i],
			    r->chunks[i]->data.data, r->chunks[i]->data.len,
			    &j->err);
		protobuf_c_message_free_unpacked(reply, NULL);
		if (rv != MOAT_OK)
			return rv;
	}
}

static void *
pull_main(void *arg)
{
	struct pull_job *j = arg;
	size_t n_ids = j->art->chunk_ids.len / MOAT_CHUNK_ID_LEN;
	uint64_t stripes = (n_ids + PULL_STRIPE - 1) / PULL_STRIPE;

	for (uint64_t s = j->k; s < stripes && j->rv == MOAT_OK; s += j->n)
		j->rv = pull_stripe(j, s);
	return NULL;
}

int
vmd_snapshot_pull_ram(struct vmd *vmd, const Moat__V1__LocalSnapshot *meta,
    const char *path, char **errmsg)
{
	Moat__V1__GetSnapshotRequest req = MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	struct pull_job jobs[PULL_THREADS];
	const Moat__V1__SnapArtifact *ram = NULL;
	struct moat_chunk_writer *w = NULL;
	ProtobufCMessage *reply = NULL;
	Moat__V1__SnapshotInfo *info;
	int rv;

	*errmsg = NULL;
	memset(jobs, 0, sizeof(jobs));
	req.tenant = (char *)tenant_or_default(meta->tenant);
	req.id = meta->remote_id;
	req.with_chunks = true;
	if ((rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "GetSnapshot",
	    &req.base, &moat__v1__snapshot_info__descriptor, &reply, NULL,
	    errmsg)) != MOAT_OK)
		return rv;
	info = (Moat__V1__SnapshotInfo *)reply;
	for (size_t i = 0; i < info->n_artifacts; i++)
		if (strcmp(info->artifacts[i]->name, "ram") == 0)
			ram = info->artifacts[i];
	if (ram == NULL) {
		*errmsg = moat_asprintf("snapd snapshot %s has no RAM",
		    meta->remote_id);
		rv = MOAT_FAILED_PRECONDITION;
		goto out;
	}
	if ((rv = moat_chunk_writer_open(&w, path, ram->size, ram->chunk_size,
	    ram->chunk_ids.data, ram->chunk_ids.len / MOAT_CHUNK_ID_LEN,
	    errmsg)) != MOAT_OK)
		goto out;
	for (uint32_t k = 0; k < PULL_THREADS; k++) {
		struct pull_job *j = &jobs[k];

		*j = (struct pull_job){ .vmd = vmd, .tenant = req.tenant,
			.snap_id = meta->remote_id, .art = ram, .w = w, .k = k,
			.n = PULL_THREADS };
		/* A thread that cannot start leaves its stripes to the
		 * check below: they are pulled here. */
		j->started = vmd_thread_create(&j->thread, pull_main, j) == 0;
	}
	for (uint32_t k = 0; k < PULL_THREADS; k++) {
		if (jobs[k].started)
			pthread_join(jobs[k].thread, NULL);
		else
			pull_main(&jobs[k]);
		if (jobs[k].rv != MOAT_OK && rv == MOAT_OK) {
			rv = jobs[k].rv;
			*errmsg = jobs[k].err;
			jobs[k].err = NULL;
		}
	}
	if (rv == MOAT_OK)
		rv = moat_chunk_writer_commit(w, errmsg);
	else
		moat_chunk_writer_abort(w);
out:
	for (uint32_t k = 0; k < PULL_THREADS; k++)
		free(jobs[k].err);
	protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

int
vmd_snapshot_delete_remote(struct vmd *vmd, const char *tenant,
    const char *remote_id, uint64_t *freed_bytes, char **errmsg)
{
	Moat__V1__DeleteSnapshotRequest req =
	    MOAT__V1__DELETE_SNAPSHOT_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	int rv;

	*errmsg = NULL;
	*freed_bytes = 0;
	if (vmd->snapd == NULL || remote_id == NULL || remote_id[0] == '\0')
		return MOAT_OK;
	req.tenant = (char *)tenant_or_default(tenant);
	req.id = (char *)remote_id;
	rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "DeleteSnapshot",
	    &req.base, &moat__v1__delete_snapshot_reply__descriptor, &reply,
	    NULL, errmsg);
	if (rv == MOAT_OK)
		*freed_bytes = ((Moat__V1__DeleteSnapshotReply *)reply)->
		    freed_bytes;
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	if (rv == MOAT_NOT_FOUND) {
		free(*errmsg);
		*errmsg = NULL;
		rv = MOAT_OK;
	}
	return rv;
}
