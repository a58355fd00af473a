/*
 * snapshot_fetch.c: a snapshot that is in moat-snapd but not here,
 * pulled into the local catalog: every artifact written from its chunks
 * (verified), those this node already has in a parent snapshot copied
 * from there instead, the RAM into the RAM dir (admitted first). Not
 * for: pushing (snapshot_push.c) or an evicted RAM copy coming back
 * (vmd_snapshot_pull_ram).
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
#include "node.h"
#include "ramdir.h"
#include "snap_client.h"
#include "snapram.h"
#include "snapshot_fetch.h"
#include "snapshot_push.h"

#define FETCH_META_MAX (64u << 10)

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
	        MOAT_OK ||
	    (sd->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
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

/* The bytes of the chunks `w` (opened on `a`) still misses: what a
 * pull from snapd brings. */
static uint64_t
missing_bytes(const struct moat_chunk_writer *w,
    const Moat__V1__SnapArtifact *a)
{
	uint64_t idx, bytes = 0;

	for (idx = moat_chunk_writer_next_missing(w, 0); idx != UINT64_MAX;
	     idx = moat_chunk_writer_next_missing(w, idx + 1)) {
		uint64_t off = idx * a->chunk_size;

		bytes += a->size - off < a->chunk_size ? a->size - off :
		                                         a->chunk_size;
	}
	return bytes;
}

/* Writes artifact `a` of snapshot `snap_id` to `path`: chunks found in
 * `sd` (may be NULL) are copied from there, the rest come from snapd;
 * every one is verified by the writer. *local / *remote count them,
 * *remote_bytes adds the bytes pulled. */
static int
pull_seeded(struct vmd *vmd, const char *tenant, const char *snap_id,
    const Moat__V1__SnapArtifact *a, const char *path, struct seed *sd,
    uint64_t *local, uint64_t *remote, uint64_t *remote_bytes, char **errmsg)
{
	uint64_t want;

	struct moat_chunk_writer *w = NULL;
	uint64_t idx;
	size_t n_ids = a->chunk_ids.len / MOAT_CHUNK_ID_LEN;
	uint8_t *buf = NULL;
	int rv;

	if ((rv = moat_chunk_writer_open(&w, path, a->size, a->chunk_size,
	         a->chunk_ids.data, n_ids, errmsg)) != MOAT_OK)
		return rv;
	if (sd != NULL && sd->n > 0 && (buf = malloc(a->chunk_size)) != NULL) {
		for (idx = moat_chunk_writer_next_missing(w, 0);
		     idx != UINT64_MAX;
		     idx = moat_chunk_writer_next_missing(w, idx + 1)) {
			const struct seed_chunk *hit =
			    bsearch(a->chunk_ids.data +
			            idx * MOAT_CHUNK_ID_LEN,
			        sd->v, sd->n, sizeof(*sd->v), seed_cmp);
			uint64_t off = idx * a->chunk_size;
			size_t len = a->size - off < a->chunk_size ?
			    (size_t)(a->size - off) :
			    a->chunk_size;
			char *err = NULL;

			if (hit == NULL ||
			    pread(sd->fd, buf, len, (off_t)hit->offset) !=
			        (ssize_t)len)
				continue;
			/* A seed that changed since is caught here and the
			 * chunk comes from snapd instead. */
			if (moat_chunk_writer_put(w, idx, buf, len, &err) ==
			    MOAT_OK)
				(*local)++;
			free(err);
		}
	}
	want = missing_bytes(w, a);
	if ((rv = moat_snap_pull_chunks(vmd->snapd, tenant, snap_id, a, w, 0,
	         UINT64_MAX, MOAT_SNAP_PULL_BATCH, remote, errmsg)) != MOAT_OK)
		goto fail;
	*remote_bytes += want;
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
	for (size_t i = 0; i < VMD_SNAP_N_ARTIFACTS; i++)
		if (strcmp(name, vmd_snap_artifacts[i].name) == 0)
			return moat_asprintf("%s/%s", tmp,
			    vmd_snap_artifacts[i].file);
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
	/* The sandbox's own tenant (the label; older pushes of a sandbox
	 * without one name snapd's tenant only). */
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

/* One fetch in progress: what vmd_snapshot_fetch's steps share. root,
 * tmp, link and ram are heap (ram once the RAM is linked, so a failure
 * can remove it); info is borrowed from the caller. */
struct fetch {
	struct vmd *vmd;
	struct moat_rpc_call *call;
	const char *id;
	const char *snapd_tenant;
	const Moat__V1__SnapshotInfo *info;
	char *root, *tmp, *link, *ram;
	bool have[VMD_SNAP_N_ARTIFACTS];
	uint64_t n_local, n_remote;
	uint64_t remote_bytes; /* chunk bytes pulled from snapd */
};

/* Asks moat-snapd for snapshot f->id with its chunk ids. On MOAT_OK
 * *info is set (free with protobuf_c_message_free_unpacked); otherwise
 * the error has been replied on f->call. */
static int
fetch_describe(struct fetch *f, Moat__V1__SnapshotInfo **info)
{
	Moat__V1__GetSnapshotRequest req =
	    MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	struct vmd *vmd = f->vmd;
	ProtobufCMessage *reply = NULL;
	char *err = NULL;
	int rv;

	*info = NULL;
	if ((rv = vmd_snapd_ping(vmd, &err)) != MOAT_OK) {
		rv = moat_rpc_error(f->call, MOAT_UNAVAILABLE,
		    "snapshot %s is "
		    "not on node %s and moat-snapd %s does not answer (%s): "
		    "start it, or restore on the node that took the snapshot",
		    f->id, vmd->cfg.node_id, vmd->cfg.snapd_url,
		    err ? err : "?");
		goto out;
	}
	free(err);
	err = NULL;
	req.tenant = (char *)f->snapd_tenant;
	req.id = (char *)f->id;
	req.with_chunks = true;
	if ((rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "GetSnapshot",
	         &req.base, &moat__v1__snapshot_info__descriptor, &reply, NULL,
	         &err)) != MOAT_OK) {
		if (rv == MOAT_NOT_FOUND)
			rv = moat_rpc_error(f->call, MOAT_NOT_FOUND,
			    "snapshot %s "
			    "not found on node %s nor in moat-snapd: %s",
			    f->id, vmd->cfg.node_id, err ? err : "?");
		else
			rv = moat_rpc_error(f->call, rv,
			    "snapshot %s is not on "
			    "node %s and moat-snapd %s failed to describe it: "
			    "%s",
			    f->id, vmd->cfg.node_id, vmd->cfg.snapd_url,
			    err ? err : "?");
		goto out;
	}
	*info = (Moat__V1__SnapshotInfo *)reply;
	if (strcmp((*info)->vmm, vmd->vmm->name) != 0) {
		rv = moat_rpc_error(f->call, MOAT_FAILED_PRECONDITION,
		    "snapshot "
		    "%s was taken by the %s driver; node %s runs %s: restore "
		    "it on a %s node",
		    f->id, (*info)->vmm, vmd->cfg.node_id, vmd->vmm->name,
		    (*info)->vmm);
		*info = NULL;
		goto out;
	}
	reply = NULL;
out:
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	free(err);
	return rv;
}

/* Creates f->tmp (and the snapshots root) for snapshot directory `dir`,
 * after removing one a crash left. Errors are replied on f->call. */
static int
fetch_make_tmp(struct fetch *f, const char *dir)
{
	int e;

	f->root = moat_asprintf("%s/snapshots", f->vmd->cfg.state_dir);
	f->tmp = moat_asprintf("%s.tmp", dir);
	f->link =
	    f->tmp ? moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, f->tmp) : NULL;
	if (!f->root || !f->tmp || !f->link)
		return moat_rpc_error(f->call, MOAT_INTERNAL, "out of memory");
	/* A .tmp left by a crash: fetches here are serialised (fetch_mu)
	 * and the state directory is this process's (vmd.lock). */
	(void)moat_rm_rf(f->tmp);
	if ((e = moat_mkdir_p(f->root, 0700)) != 0 ||
	    mkdir(f->tmp, 0700) != 0) {
		e = e ? e : errno;
		return moat_rpc_error(f->call, moat_status_from_errno(e),
		    "cannot "
		    "create snapshot directory %s: %s",
		    f->tmp, strerror(e));
	}
	return MOAT_OK;
}

/* The bytes of RAM-dir space the snapshot's RAM needs: its non-zero
 * chunks (zero ones stay holes in the sparse file). */
static uint64_t
fetch_ram_bytes(const Moat__V1__SnapshotInfo *info)
{
	uint64_t bytes = 0;

	for (size_t i = 0; i < info->n_artifacts; i++) {
		const Moat__V1__SnapArtifact *a = info->artifacts[i];
		size_t n = a->chunk_ids.len / MOAT_CHUNK_ID_LEN;

		if (strcmp(a->name, "ram") != 0)
			continue;
		for (size_t c = 0; c < n; c++)
			if (!moat_chunk_id_is_zero((const struct moat_chunk_id
			            *)(a->chunk_ids.data +
			        c * MOAT_CHUNK_ID_LEN)))
				bytes += a->chunk_size;
	}
	return bytes;
}

/* Pulls artifact `a` (slot k of vmd_snap_artifacts) to `target`, seeded
 * from the parent snapshot's copy when this node holds it. */
static int
fetch_pull(struct fetch *f, const Moat__V1__SnapArtifact *a, size_t k,
    const char *target, char **errmsg)
{
	struct seed sd;
	char *seed_path = f->info->parent_id[0] ?
	    moat_asprintf("%s/%s/%s", f->root, f->info->parent_id,
	        vmd_snap_artifacts[k].file) :
	    NULL;
	bool seeded =
	    seed_path != NULL && seed_load(&sd, seed_path, a->chunk_size);
	int rv;

	rv = pull_seeded(f->vmd, f->snapd_tenant, f->id, a, target,
	    seeded ? &sd : NULL, &f->n_local, &f->n_remote, &f->remote_bytes,
	    errmsg);
	if (seeded)
		seed_free(&sd);
	free(seed_path);
	return rv;
}

/* Fetches artifact `a` into its place (the RAM into the RAM dir, linked
 * from f->link) and marks it in f->have. Errors are replied on f->call;
 * the caller removes f->tmp and f->ram. */
static int
fetch_artifact(struct fetch *f, const Moat__V1__SnapArtifact *a)
{
	char *target = fetch_target(a->name, f->tmp, f->id);
	char *err = NULL;
	size_t k;
	int rv, e;

	for (k = 0; k < VMD_SNAP_N_ARTIFACTS; k++)
		if (strcmp(a->name, vmd_snap_artifacts[k].name) == 0)
			break;
	if (target == NULL || k == VMD_SNAP_N_ARTIFACTS || f->have[k]) {
		free(target);
		return moat_rpc_error(f->call, MOAT_FAILED_PRECONDITION,
		    "snapshot %s in moat-snapd has an artifact \"%s\" "
		    "a vmd snapshot does not have (or twice): it was "
		    "not made by vmd and cannot be restored",
		    f->id, a->name);
	}
	if (k == 0) {
		f->ram = target;
		if (symlink(f->ram, f->link) != 0) {
			e = errno;
			return moat_rpc_error(f->call,
			    moat_status_from_errno(e),
			    "cannot link "
			    "%s: %s",
			    f->link, strerror(e));
		}
	}
	rv = fetch_pull(f, a, k, target, &err);
	if (k != 0)
		free(target);
	if (rv == MOAT_DATA_LOSS)
		rv = moat_rpc_error(f->call, MOAT_DATA_LOSS,
		    "snapshot %s "
		    "is corrupt in moat-snapd (its %s): %s; it was "
		    "not "
		    "restored",
		    f->id, a->name, err ? err : "?");
	else if (rv != MOAT_OK)
		rv = moat_rpc_error(f->call, rv,
		    "cannot pull the %s of "
		    "snapshot %s from moat-snapd %s: %s",
		    a->name, f->id, f->vmd->cfg.snapd_url, err ? err : "?");
	else
		f->have[k] = true;
	free(err);
	return rv;
}

/* Fetches every artifact of f->info, then checks none is missing. */
static int
fetch_artifacts(struct fetch *f)
{
	int rv;

	for (size_t i = 0; i < f->info->n_artifacts; i++)
		if ((rv = fetch_artifact(f, f->info->artifacts[i])) != MOAT_OK)
			return rv;
	for (size_t k = 0; k < VMD_SNAP_N_ARTIFACTS; k++)
		if (!f->have[k])
			return moat_rpc_error(f->call,
			    MOAT_FAILED_PRECONDITION,
			    "snapshot %s in moat-snapd lacks its %s: it "
			    "cannot "
			    "be restored",
			    f->id, vmd_snap_artifacts[k].name);
	return MOAT_OK;
}

int
vmd_snapshot_fetch(struct vmd *vmd, struct moat_rpc_call *call, const char *id,
    const char *tenant, const char *dir, uint64_t *pulled_bytes)
{
	struct fetch f = { .vmd = vmd,
		.call = call,
		.id = id,
		.snapd_tenant = tenant };
	Moat__V1__SnapshotInfo *info = NULL;
	char *err = NULL;
	struct stat st;
	uint64_t t0 = moat_rpc_now_ms();
	uint64_t admitted = 0;
	int rv, e;

	*pulled_bytes = 0;
	if (tenant == NULL || tenant[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "tenant is required: snapshot %s is pulled from "
		    "moat-snapd for one tenant",
		    id);
	if (vmd->snapd == NULL)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "snapshot %s not "
		    "found on node %s (ListLocalSnapshots lists them; this "
		    "node has no [vmd] snapd to pull others from)",
		    id, vmd->cfg.node_id);
	pthread_mutex_lock(&vmd->fetch_mu);
	/* Another restore may have fetched it while this one waited. */
	if (stat(dir, &st) == 0) {
		rv = MOAT_OK;
		goto out;
	}
	if ((rv = fetch_describe(&f, &info)) != MOAT_OK)
		goto out;
	f.info = info;
	if ((rv = fetch_make_tmp(&f, dir)) != MOAT_OK)
		goto out;
	/* Its RAM lands in the RAM dir: make room as a create would. */
	admitted = fetch_ram_bytes(info);
	if ((rv = vmd_ram_admit(vmd, call, admitted,
	         "a pulled snapshot's "
	         "RAM")) != MOAT_OK) {
		admitted = 0;
		goto out_rm;
	}
	if ((rv = fetch_artifacts(&f)) != MOAT_OK)
		goto out_rm;
	if ((rv = fetch_write_meta(info, f.tmp, dir, &err)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv, "snapshot %s: %s", id,
		    err ? err : "?");
		goto out_rm;
	}
	if (rename(f.tmp, dir) != 0) {
		e = errno;
		rv = moat_rpc_error(call, moat_status_from_errno(e),
		    "cannot "
		    "rename %s to %s: %s",
		    f.tmp, dir, strerror(e));
		goto out_rm;
	}
	moat_info(call->request_id,
	    "snapshot %s: pulled from moat-snapd in "
	    "%" PRIu64 " ms (%" PRIu64 " B logical): %" PRIu64 " chunks "
	    "pulled (%" PRIu64 " B), %" PRIu64 " copied from parent %s here",
	    id, moat_rpc_now_ms() - t0, info->logical_bytes, f.n_remote,
	    f.remote_bytes, f.n_local,
	    info->parent_id[0] ? info->parent_id : "(none)");
	*pulled_bytes = f.remote_bytes;
	rv = MOAT_OK;
	goto out;
out_rm:
	if (f.ram != NULL && unlink(f.ram) != 0 && errno != ENOENT)
		moat_warn(call->request_id, "cannot remove %s: %s", f.ram,
		    strerror(errno));
	(void)moat_rm_rf(f.tmp);
out:
	vmd_ram_admit_done(vmd, admitted);
	pthread_mutex_unlock(&vmd->fetch_mu);
	if (info != NULL)
		protobuf_c_message_free_unpacked(&info->base, NULL);
	free(f.ram);
	free(f.link);
	free(f.tmp);
	free(f.root);
	free(err);
	return rv;
}
