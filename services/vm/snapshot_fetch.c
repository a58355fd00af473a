/*
 * snapshot_fetch.c: a snapshot that is in moat-snapd but not here,
 * pulled into the local catalog: every artifact written from its chunks
 * (each one that crosses the wire verified), those this node already has
 * in a parent snapshot it pulled copied from there instead (the parent's
 * recorded chunk list says where, nothing is read to find them), the RAM
 * into the RAM dir (admitted first). Not
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
#include "egress.h"
#include "verify.h"

#define FETCH_META_MAX (64u << 10)

/* What a fetch did, for its log line and reply. */
struct fetch_counts {
	uint64_t local, remote; /* chunks copied here, pulled */
	uint64_t remote_bytes;  /* chunk bytes pulled from snapd */
	uint64_t describe_ms, seed_ms, pull_ms;
};

/* Where a pull records the manifest it wrote the files from (the
 * GetSnapshot reply with its chunk ids), so that a later pull of a child
 * knows which chunk sits where in them without reading them. */
#define FETCH_MANIFEST "snapd-manifest.pb"

/* One non-zero chunk of a parent's file, for a chunk that moved. */
struct seed_chunk {
	uint8_t id[MOAT_CHUNK_ID_LEN];
	uint64_t index;
};

/* A parent snapshot's local file and its chunk list (owned: close fd,
 * free v; `a` is borrowed from the parent's manifest). */
struct seed {
	const Moat__V1__SnapArtifact *a;
	uint64_t n_ids;
	struct seed_chunk *v; /* its non-zero chunks, sorted by id */
	size_t n;
	int fd;
};

static int
seed_cmp(const void *a, const void *b)
{
	return memcmp(a, b, MOAT_CHUNK_ID_LEN);
}

static const uint8_t *
id_at(const Moat__V1__SnapArtifact *a, uint64_t i)
{
	return a->chunk_ids.data + i * MOAT_CHUNK_ID_LEN;
}

static bool
id_zero(const Moat__V1__SnapArtifact *a, uint64_t i)
{
	return moat_chunk_id_is_zero(
	    (const struct moat_chunk_id *)id_at(a, i));
}

/* The manifest this node recorded when it pulled snapshot `id` into
 * root/id, or NULL (none: pulled by an older vmd, or taken here). */
static Moat__V1__SnapshotInfo *
seed_manifest(const char *root, const char *id)
{
	Moat__V1__SnapshotInfo *info = NULL;
	char *path = moat_asprintf("%s/%s/" FETCH_MANIFEST, root, id);
	char *buf = NULL;
	size_t len;
	int e;

	if (path == NULL)
		return NULL;
	if ((e = moat_read_file(path, MOAT_RPC_MAX_MSG, &buf, &len)) == 0)
		info = moat__v1__snapshot_info__unpack(NULL, len,
		    (const uint8_t *)buf);
	if (e == 0 && (info == NULL || strcmp(info->id, id) != 0))
		moat_warn(0,
		    "not seeding a pull from %s: not the manifest of "
		    "%s",
		    path, id);
	else if (e != 0 && e != ENOENT)
		moat_warn(0, "not seeding a pull from %s: %s", path,
		    strerror(e));
	if (info != NULL && strcmp(info->id, id) != 0) {
		protobuf_c_message_free_unpacked(&info->base, NULL);
		info = NULL;
	}
	free(buf);
	free(path);
	return info;
}

/* Opens the parent's copy of artifact `a` (file `file` of snapshot
 * directory `dir`, described by `pm`) as a seed. False when there is
 * none that fits; a seed is only an optimisation, so errors just log. */
static bool
seed_open(struct seed *sd, const Moat__V1__SnapshotInfo *pm,
    const Moat__V1__SnapArtifact *a, const char *dir, const char *file)
{
	char *path = NULL;
	struct stat st;

	memset(sd, 0, sizeof(*sd));
	sd->fd = -1;
	for (size_t i = 0; pm != NULL && i < pm->n_artifacts; i++)
		if (strcmp(pm->artifacts[i]->name, a->name) == 0)
			sd->a = pm->artifacts[i];
	if (sd->a == NULL || sd->a->chunk_size != a->chunk_size ||
	    sd->a->chunk_ids.len % MOAT_CHUNK_ID_LEN != 0 ||
	    (path = moat_asprintf("%s/%s", dir, file)) == NULL)
		goto none;
	sd->n_ids = sd->a->chunk_ids.len / MOAT_CHUNK_ID_LEN;
	if ((sd->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		if (errno != ENOENT) /* an evicted RAM copy is ENOENT */
			moat_warn(0, "not seeding a pull from %s: %s", path,
			    strerror(errno));
		goto none;
	}
	if (fstat(sd->fd, &st) != 0 || (uint64_t)st.st_size != sd->a->size ||
	    moat_chunk_count(sd->a->size, a->chunk_size) != sd->n_ids) {
		moat_warn(0,
		    "not seeding a pull from %s: it is not the size "
		    "its manifest says",
		    path);
		goto none;
	}
	if ((sd->v = malloc((sd->n_ids ? sd->n_ids : 1) * sizeof(*sd->v))) ==
	    NULL)
		goto none;
	for (uint64_t i = 0; i < sd->n_ids; i++) {
		if (id_zero(sd->a, i))
			continue;
		memcpy(sd->v[sd->n].id, id_at(sd->a, i), MOAT_CHUNK_ID_LEN);
		sd->v[sd->n++].index = i;
	}
	qsort(sd->v, sd->n, sizeof(*sd->v), seed_cmp);
	free(path);
	return true;
none:
	if (sd->fd >= 0)
		close(sd->fd);
	free(sd->v);
	free(path);
	memset(sd, 0, sizeof(*sd));
	sd->fd = -1;
	return false;
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

/* How many chunks from `idx` on `a` has the same as the seed at the same
 * places (non-zero ones; 0 when chunk idx differs). */
static uint64_t
seed_run(const struct seed *sd, const Moat__V1__SnapArtifact *a,
    uint64_t n_ids, uint64_t idx)
{
	uint64_t n = 0;

	while (idx + n < n_ids && idx + n < sd->n_ids &&
	    !id_zero(a, idx + n) &&
	    memcmp(id_at(a, idx + n), id_at(sd->a, idx + n),
	        MOAT_CHUNK_ID_LEN) == 0)
		n++;
	return n;
}

/* Copies into `w` every chunk of `a` the seed holds: runs at the same
 * offsets as one copy (a reflink where the RAM dir has them), a chunk
 * that moved on its own. These chunks are not hashed again: the seed is
 * a file this node wrote itself from chunks it verified against exactly
 * these ids when it pulled the parent, and a snapshot's files are never
 * written once its directory is in place (a restore copies them). The
 * chunks the seed lacks, or a copy that fails, are left missing: they
 * come from snapd, verified. Returns the chunks copied. */
static uint64_t
seed_copy(struct moat_chunk_writer *w, const Moat__V1__SnapArtifact *a,
    const struct seed *sd)
{
	uint64_t n_ids = a->chunk_ids.len / MOAT_CHUNK_ID_LEN, copied = 0;
	uint64_t idx = moat_chunk_writer_next_missing(w, 0), run, src;
	const struct seed_chunk *hit;
	char *err = NULL;

	while (idx != UINT64_MAX) {
		run = seed_run(sd, a, n_ids, idx);
		src = idx;
		if (run == 0 &&
		    (hit = bsearch(id_at(a, idx), sd->v, sd->n, sizeof(*sd->v),
		         seed_cmp)) != NULL) {
			run = 1;
			src = hit->index;
		}
		if (run > 0 &&
		    moat_chunk_writer_copy_trusted(w, idx, run, sd->fd, src,
		        &err) != MOAT_OK) {
			moat_warn(0,
			    "seeding a pull: %s; the rest comes from "
			    "moat-snapd",
			    err ? err : "?");
			free(err);
			return copied;
		}
		copied += run;
		idx = moat_chunk_writer_next_missing(w, idx + (run ? run : 1));
	}
	return copied;
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

/* Writes artifact `a` of snapshot `snap_id` to `path`: chunks the seed
 * `sd` (may be NULL) holds are copied from there, the rest come from
 * snapd, several requests in flight, each verified by the writer.
 * *local / *remote count them, *remote_bytes adds the bytes pulled,
 * *seed_ms / *pull_ms the time each part took. */
static int
pull_seeded(struct vmd *vmd, const char *tenant, const char *snap_id,
    const Moat__V1__SnapArtifact *a, const char *path, const struct seed *sd,
    struct fetch_counts *fc, char **errmsg)
{
	struct moat_chunk_writer *w = NULL;
	uint64_t t0 = moat_rpc_now_ms(), want;
	size_t n_ids = a->chunk_ids.len / MOAT_CHUNK_ID_LEN;
	int rv;

	if ((rv = moat_chunk_writer_open(&w, path, a->size, a->chunk_size,
	         a->chunk_ids.data, n_ids, errmsg)) != MOAT_OK)
		return rv;
	if (sd != NULL)
		fc->local += seed_copy(w, a, sd);
	fc->seed_ms += moat_rpc_now_ms() - t0;
	t0 = moat_rpc_now_ms();
	want = missing_bytes(w, a);
	if ((rv = vmd_snapshot_pull_missing(vmd, tenant, snap_id, a, w,
	         &fc->remote, errmsg)) != MOAT_OK) {
		moat_chunk_writer_abort(w);
		return rv;
	}
	fc->remote_bytes += want;
	rv = moat_chunk_writer_commit(w, errmsg);
	fc->pull_ms += moat_rpc_now_ms() - t0;
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
	struct vmd_seal seal;
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
	meta.link_last_id = strtoull(label_of(info, "link_last_id"), NULL, 10);
	meta.accel = (char *)label_of(info, "accel");
	meta.image_stamp = (char *)label_of(info, "image_stamp");
	meta.created_unix_ms = info->created_ms;
	meta.remote_id = info->id;
	meta.remote_stored = true;
	meta.remote_stored_bytes = info->stored_bytes;
	meta.remote_logical_bytes = info->logical_bytes;
	meta.remote_parent_id = info->parent_id;
	meta.vmm = info->vmm;
	/* Its network policy (sealed below: a changed label fails the
	 * check before any restore). */
	if (vmd_egress_from_label(label_of(info, "network"), &meta.network) !=
	    MOAT_OK) {
		free(path);
		*errmsg = moat_asprintf("its network label \"%.200s\" is "
		                        "malformed: it is not restored",
		    label_of(info, "network"));
		return MOAT_DATA_LOSS;
	}
	/* The pusher's seal (none from a vmd before issue 14: such a
	 * snapshot is refused at restore, not here). */
	if (!vmd_seal_from_info(info, &meta, &seal)) {
		free(path);
		*errmsg = strdup("its seal labels are malformed: it was "
		                 "not pushed by a moat-vmd and is not "
		                 "restored");
		moat__v1__network_policy__free_unpacked(meta.network, NULL);
		return MOAT_DATA_LOSS;
	}
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
		moat__v1__network_policy__free_unpacked(meta.network, NULL);
		*errmsg = strdup("out of memory or a catalog entry too large");
		return MOAT_INTERNAL;
	}
	moat__v1__local_snapshot__pack(&meta, packed);
	e = moat_write_file_atomic(path, packed, len, 0600);
	moat__v1__network_policy__free_unpacked(meta.network, NULL);
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
	/* The parent's manifest as this node recorded it when it pulled
	 * the parent (NULL: no seed), and where the parent is. */
	Moat__V1__SnapshotInfo *parent;
	char *parent_dir;
	struct fetch_counts fc;
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
 * from the parent snapshot's copy when this node pulled the parent. */
static int
fetch_pull(struct fetch *f, const Moat__V1__SnapArtifact *a, size_t k,
    const char *target, char **errmsg)
{
	struct seed sd;
	bool seeded = f->parent != NULL &&
	    seed_open(&sd, f->parent, a, f->parent_dir,
	        vmd_snap_artifacts[k].file);
	int rv;

	rv = pull_seeded(f->vmd, f->snapd_tenant, f->id, a, target,
	    seeded ? &sd : NULL, &f->fc, errmsg);
	if (seeded)
		seed_free(&sd);
	return rv;
}

/* Writes <tmp>/FETCH_MANIFEST: the manifest the files were written from
 * (see seed_manifest). */
static int
fetch_write_manifest(const Moat__V1__SnapshotInfo *info, const char *tmp,
    char **errmsg)
{
	char *path = moat_asprintf("%s/" FETCH_MANIFEST, tmp);
	size_t len = moat__v1__snapshot_info__get_packed_size(info);
	uint8_t *packed = malloc(len ? len : 1);
	int e;

	if (path == NULL || packed == NULL) {
		free(path);
		free(packed);
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	moat__v1__snapshot_info__pack(info, packed);
	e = moat_write_file_atomic(path, packed, len, 0600);
	free(packed);
	free(path);
	if (e != 0) {
		*errmsg = moat_asprintf("cannot write its chunk list: %s",
		    strerror(e));
		return moat_status_from_errno(e);
	}
	return MOAT_OK;
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
	f.fc.describe_ms = moat_rpc_now_ms() - t0;
	if ((rv = fetch_make_tmp(&f, dir)) != MOAT_OK)
		goto out;
	if (info->parent_id[0] != '\0' &&
	    (f.parent = seed_manifest(f.root, info->parent_id)) != NULL)
		f.parent_dir = moat_asprintf("%s/%s", f.root, info->parent_id);
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
	if ((rv = fetch_write_manifest(info, f.tmp, &err)) != MOAT_OK ||
	    (rv = fetch_write_meta(info, f.tmp, dir, &err)) != MOAT_OK) {
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
	    "pulled (%" PRIu64 " B) in %" PRIu64 " ms, %" PRIu64 " copied "
	    "from parent %s here in %" PRIu64 " ms, described in %" PRIu64
	    " ms",
	    id, moat_rpc_now_ms() - t0, info->logical_bytes, f.fc.remote,
	    f.fc.remote_bytes, f.fc.pull_ms, f.fc.local,
	    info->parent_id[0] ? info->parent_id : "(none)", f.fc.seed_ms,
	    f.fc.describe_ms);
	*pulled_bytes = f.fc.remote_bytes;
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
	if (f.parent != NULL)
		protobuf_c_message_free_unpacked(&f.parent->base, NULL);
	free(f.parent_dir);
	free(f.ram);
	free(f.link);
	free(f.tmp);
	free(f.root);
	free(err);
	return rv;
}
