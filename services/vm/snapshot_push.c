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
 * A fetch pulls only the chunks this node lacks: when this node pulled
 * the snapshot's parent, the parent's recorded chunk list says which of
 * its chunks the new files share; those are copied locally (see
 * snapshot_fetch.c) and only the rest cross the wire, several GetChunks
 * in flight, every one verified.
 * Not for: pausing and copying (the driver) or the local catalog
 * (snapshot.c); the push never fails a snapshot, it records why not.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
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
#include "metrics.h"
#include "node.h"
#include "sync.h"
#include "snapshot_push.h"
#include "egress.h"
#include "verify.h"

#define PUSH_HEALTH_MS 2000u /* a snapd that is down, found fast */

/* The artifacts of a snapshot directory, by their manifest names. */
const struct vmd_snap_artifact vmd_snap_artifacts[VMD_SNAP_N_ARTIFACTS] = {
	{ "ram", MOAT_VMM_SNAP_RAM },
	{ "disk", MOAT_VMM_SNAP_SCRATCH },
	{ "device_state", MOAT_VMM_SNAP_DEVICE_STATE },
};

/* Is snapd there? A short Health, so a snapd that is down costs the
 * snapshot seconds, not the RPC default. */
int
vmd_snapd_ping(struct vmd *vmd, char **errmsg)
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
	Moat__V1__SnapArtifact arts[VMD_SNAP_N_ARTIFACTS];
	Moat__V1__SnapArtifact *art_ptrs[VMD_SNAP_N_ARTIFACTS];
	Moat__V1__SnapLabel labels[16];
	Moat__V1__SnapLabel *label_ptrs[16];
	Moat__V1__SnapshotInfo *info = NULL;
	ProtobufCMessage *reply = NULL;
	const char *tenant = meta->tenant;
	char scratch_mib[24], link_last_id[24];
	char seal_kv[VMD_SEAL_N + 1][2][VMD_SEAL_LABEL_MAX];
	char *err = NULL, *path = NULL, *network = NULL;
	size_t n_labels = 0;
	uint64_t t0;
	int rv;

	memset(res, 0, sizeof(*res));
	for (size_t i = 0; i < VMD_SNAP_N_ARTIFACTS; i++)
		moat__v1__snap_artifact__init(&arts[i]);
	if (vmd->snapd == NULL)
		return;
	t0 = moat_rpc_now_ms();
	if ((rv = vmd_snapd_ping(vmd, &err)) != MOAT_OK)
		goto fail;
	for (size_t i = 0; i < VMD_SNAP_N_ARTIFACTS; i++) {
		struct moat_snap_push_stats st = { 0 };

		free(path);
		path = moat_asprintf("%s/%s", dir, vmd_snap_artifacts[i].file);
		if (path == NULL) {
			rv = MOAT_INTERNAL;
			err = strdup("out of memory");
			goto fail;
		}
		if ((rv = moat_snap_push_file(vmd->snapd, tenant,
		         vmd_snap_artifacts[i].name, path, MOAT_CHUNK_SIZE,
		         &arts[i], &st, &err)) != MOAT_OK)
			goto fail;
		art_ptrs[i] = &arts[i];
	}
#define LABEL(k, v)                                                           \
	do {                                                                  \
		moat__v1__snap_label__init(&labels[n_labels]);                \
		labels[n_labels].key = (char *)(k);                           \
		labels[n_labels].value = (char *)(v);                         \
		label_ptrs[n_labels] = &labels[n_labels];                     \
		n_labels++;                                                   \
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
	snprintf(link_last_id, sizeof(link_last_id), "%" PRIu64,
	    meta->link_last_id);
	LABEL("link_last_id", link_last_id);
	/* Its network policy (sealed): a node that pulls it restores the
	 * clone with it (issue 14). */
	if (meta->network != NULL &&
	    (network = vmd_egress_label(meta->network)) == NULL) {
		rv = MOAT_INTERNAL;
		err = strdup("out of memory");
		goto fail;
	}
	if (network != NULL) /* none: taken without the egress port */
		LABEL("network", network);
	/* Its seal (verify.h) travels with it: a node that pulls it checks
	 * it under the cluster's snapshot key before restoring. */
	for (size_t i = 0; i <= VMD_SEAL_N &&
	     vmd_seal_label(meta, i, seal_kv[i][0], seal_kv[i][1]);
	     i++)
		LABEL(seal_kv[i][0], seal_kv[i][1]);
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
	req.n_artifacts = VMD_SNAP_N_ARTIFACTS;
	if ((rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE,
	         "CommitManifest", &req.base,
	         &moat__v1__snapshot_info__descriptor, &reply, NULL, &err)) !=
	    MOAT_OK)
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
	moat_info(request_id,
	    "snapshot %s: stored in moat-snapd as %s "
	    "(tenant %s, parent %s): %" PRIu64 " B new of %" PRIu64 " B",
	    meta->snapshot_id, info->id, tenant,
	    req.parent_id[0] ? req.parent_id : "none", info->stored_bytes,
	    info->logical_bytes);
	vmd_metrics_push(true, moat_rpc_now_ms() - t0, info->stored_bytes,
	    info->logical_bytes);
	goto out;
fail:
	res->error = moat_asprintf("not stored in moat-snapd %s (%s): %s",
	    vmd->cfg.snapd_url, moat_strerror(rv), err ? err : "?");
	moat_warn(request_id, "snapshot %s: %s; it stays local to node %s",
	    meta->snapshot_id, res->error ? res->error : "not stored",
	    vmd->cfg.node_id);
	vmd_metrics_push(false, moat_rpc_now_ms() - t0, 0, 0);
out:
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	for (size_t i = 0; i < VMD_SNAP_N_ARTIFACTS; i++)
		moat_snap_artifact_clear(&arts[i]);
	free(path);
	free(network);
	free(err);
}

/* ---- chunks from snapd, several GetChunks in flight ---- */

#define PULL_THREADS 8u
/* Missing chunks per GetChunks (1 MiB at the default chunk size): small
 * enough that PULL_THREADS replies overlap, large enough that the round
 * trips do not dominate. */
#define PULL_BATCH 64u

/* The ranges of chunk indexes the pullers share: each [lo, hi) holds
 * about PULL_BATCH missing chunks and starts and ends on a multiple of 8
 * (or the end), so every thread owns whole bytes of the writer's bitmap. */
struct pull_plan {
	uint64_t (*r)[2];
	size_t n;
	atomic_size_t next;
};

/* One puller thread: takes ranges from the plan until none is left or
 * one fails. */
struct pull_job {
	struct vmd *vmd;
	struct moat_rpc_client *client; /* the connection it asks on */
	const char *tenant;
	const char *snap_id;
	const Moat__V1__SnapArtifact *art;
	struct moat_chunk_writer *w;
	struct pull_plan *plan;
	atomic_bool *failed;
	uint64_t pulled;
	int rv;
	char *err; /* heap, with rv */
	pthread_t thread;
	bool started;
};

static void *
pull_main(void *arg)
{
	struct pull_job *j = arg;
	size_t i;

	while (j->rv == MOAT_OK && !atomic_load(j->failed) &&
	    (i = atomic_fetch_add(&j->plan->next, 1)) < j->plan->n) {
		j->rv = moat_snap_pull_chunks(j->client, j->tenant, j->snap_id,
		    j->art, j->w, j->plan->r[i][0], j->plan->r[i][1],
		    MOAT_SNAP_PULL_BATCH, &j->pulled, &j->err);
		if (j->rv != MOAT_OK)
			atomic_store(j->failed, true);
	}
	return NULL;
}

/* Cuts what `w` misses into the plan's ranges. */
static int
pull_plan_make(struct pull_plan *p, const struct moat_chunk_writer *w,
    uint64_t n_ids, char **errmsg)
{
	uint64_t idx, lo = 0, count = 0;
	size_t cap = 0;

	memset(p, 0, sizeof(*p));
	for (idx = moat_chunk_writer_next_missing(w, 0); idx != UINT64_MAX;
	     idx = moat_chunk_writer_next_missing(w, idx + 1)) {
		if (count == 0)
			lo = idx & ~(uint64_t)7;
		if (++count < PULL_BATCH && idx + 1 < n_ids)
			continue;
		if (p->n == cap) {
			uint64_t(*r)[2];

			cap = cap ? cap * 2 : 64;
			if ((r = realloc(p->r, cap * sizeof(*r))) == NULL) {
				free(p->r);
				*errmsg = strdup("out of memory");
				return MOAT_RESOURCE_EXHAUSTED;
			}
			p->r = r;
		}
		p->r[p->n][0] = lo;
		idx = (idx | 7) + 1 < n_ids ? (idx | 7) + 1 : n_ids;
		p->r[p->n++][1] = idx;
		count = 0;
		idx--; /* the next search starts at the range's end */
	}
	if (count > 0) { /* the last missing chunk ended no range */
		if (p->n == cap) {
			uint64_t(*r)[2] =
			    realloc(p->r, (cap + 1) * sizeof(*r));

			if (r == NULL) {
				free(p->r);
				*errmsg = strdup("out of memory");
				return MOAT_RESOURCE_EXHAUSTED;
			}
			p->r = r;
		}
		p->r[p->n][0] = lo;
		p->r[p->n++][1] = n_ids;
	}
	return MOAT_OK;
}

int
vmd_snapshot_pull_missing(struct vmd *vmd, const char *tenant,
    const char *snap_id, const Moat__V1__SnapArtifact *art,
    struct moat_chunk_writer *w, uint64_t *pulled, char **errmsg)
{
	struct pull_job jobs[PULL_THREADS];
	struct pull_plan plan;
	atomic_bool failed = false;
	uint32_t k, n_jobs;
	int rv;

	*errmsg = NULL;
	if ((rv = pull_plan_make(&plan, w,
	         art->chunk_ids.len / MOAT_CHUNK_ID_LEN, errmsg)) != MOAT_OK)
		return rv;
	atomic_init(&plan.next, 0);
	memset(jobs, 0, sizeof(jobs));
	n_jobs = plan.n < PULL_THREADS ? (uint32_t)plan.n : PULL_THREADS;
	for (k = 0; k < n_jobs; k++) {
		struct pull_job *j = &jobs[k];
		/* Jobs spread over snapd's connections: one TLS stream
		 * carries one reply at a time. */
		struct moat_rpc_client *bulk = k % (VMD_SNAPD_BULK + 1) ?
		    vmd->snapd_bulk[k % (VMD_SNAPD_BULK + 1) - 1] :
		    NULL;

		*j = (struct pull_job){ .vmd = vmd,
			.client = bulk != NULL ? bulk : vmd->snapd,
			.tenant = tenant,
			.snap_id = snap_id,
			.art = art,
			.w = w,
			.plan = &plan,
			.failed = &failed };
		/* The first range is pulled by this thread; a thread that
		 * cannot start leaves its share to the others. */
		j->started =
		    k > 0 && vmd_thread_create(&j->thread, pull_main, j) == 0;
	}
	if (n_jobs > 0)
		pull_main(&jobs[0]);
	for (k = 0; k < n_jobs; k++) {
		if (jobs[k].started)
			pthread_join(jobs[k].thread, NULL);
		if (pulled != NULL)
			*pulled += jobs[k].pulled;
		if (jobs[k].rv != MOAT_OK && rv == MOAT_OK) {
			rv = jobs[k].rv;
			*errmsg = jobs[k].err;
			jobs[k].err = NULL;
		}
		free(jobs[k].err);
	}
	free(plan.r);
	/* This thread took every range the others did not: none is left
	 * untried unless a failure stopped them, and then rv says so. */
	return rv;
}

int
vmd_snapshot_pull_ram(struct vmd *vmd, const Moat__V1__LocalSnapshot *meta,
    const char *path, char **errmsg)
{
	Moat__V1__GetSnapshotRequest req =
	    MOAT__V1__GET_SNAPSHOT_REQUEST__INIT;
	const Moat__V1__SnapArtifact *ram = NULL;
	struct moat_chunk_writer *w = NULL;
	ProtobufCMessage *reply = NULL;
	Moat__V1__SnapshotInfo *info;
	int rv;

	*errmsg = NULL;
	req.tenant = meta->tenant;
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
	if ((rv = vmd_snapshot_pull_missing(vmd, req.tenant, meta->remote_id,
	         ram, w, NULL, errmsg)) == MOAT_OK)
		rv = moat_chunk_writer_commit(w, errmsg);
	else
		moat_chunk_writer_abort(w);
out:
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
	req.tenant = (char *)tenant;
	req.id = (char *)remote_id;
	rv = moat_rpc_call(vmd->snapd, MOAT_SNAP_SERVICE, "DeleteSnapshot",
	    &req.base, &moat__v1__delete_snapshot_reply__descriptor, &reply,
	    NULL, errmsg);
	if (rv == MOAT_OK)
		*freed_bytes =
		    ((Moat__V1__DeleteSnapshotReply *)reply)->freed_bytes;
	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	if (rv == MOAT_NOT_FOUND) {
		free(*errmsg);
		*errmsg = NULL;
		rv = MOAT_OK;
	}
	return rv;
}
