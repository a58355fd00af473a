/*
 * snapshot_push.h: local snapshots to and from moat-snapd
 * (snapshot_push.c). Not for: the local catalog (snapshot.h).
 */
#ifndef MOAT_VMD_SNAPSHOT_PUSH_H
#define MOAT_VMD_SNAPSHOT_PUSH_H

#include <stdint.h>
#include "moat/rpc.h"
#include "snapshot.pb-c.h"
#include "vm.pb-c.h"

struct vmd;

/* The artifacts of a snapshot directory: manifest name and file. */
#define VMD_SNAP_N_ARTIFACTS 3
struct vmd_snap_artifact {
	const char *name;
	const char *file;
};
extern const struct vmd_snap_artifact vmd_snap_artifacts[VMD_SNAP_N_ARTIFACTS];

/* vmd_snapd_ping: a short Health to vmd->snapd, so a snapd that is down
 * costs seconds, not the RPC default. Returns a status with *errmsg. */
int vmd_snapd_ping(struct vmd *vmd, char **errmsg)
    __attribute__((warn_unused_result));

/* What a push to snapd left (the caller owns the strings: free). */
struct vmd_push_result {
	char *remote_id; /* NULL when not stored */
	char *error;     /* NULL when stored */
	uint64_t stored_bytes;
	uint64_t logical_bytes;
};

/* vmd_snapshot_push: pushes the complete snapshot directory `dir`
 * (described by *meta) to vmd->snapd as one manifest with parent
 * `parent_id` ("" : none). Never fails the snapshot: a snapd that is
 * down, full or refuses leaves res->error. Blocking (seconds for a first
 * push of a large RAM file); call after the sandbox resumed. */
void vmd_snapshot_push(struct vmd *vmd, uint64_t request_id,
    const Moat__V1__LocalSnapshot *meta, const char *dir,
    const char *parent_id, struct vmd_push_result *res);

/* vmd_snapshot_pull_ram: writes the RAM of snapshot *meta (stored in
 * snapd as meta->remote_id) to the new file `path` from its chunks, every
 * one verified, several GetChunks in flight. Returns MOAT_OK or a status
 * with *errmsg (heap); on failure `path` is not left. Blocking. */
int vmd_snapshot_pull_ram(struct vmd *vmd, const Moat__V1__LocalSnapshot *meta,
    const char *path, char **errmsg) __attribute__((warn_unused_result));

struct moat_chunk_writer;

/* vmd_snapshot_pull_missing: pulls from vmd->snapd every chunk writer
 * `w` (the caller's, opened on artifact `art` of snapd snapshot
 * `snap_id`) still misses, several GetChunks in flight; each chunk is
 * verified by the writer. Adds the chunks pulled to *pulled (may be
 * NULL). Returns MOAT_OK or the first failure's status with *errmsg
 * (heap); the writer is left to the caller (commit or abort). */
int vmd_snapshot_pull_missing(struct vmd *vmd, const char *tenant,
    const char *snap_id, const Moat__V1__SnapArtifact *art,
    struct moat_chunk_writer *w, uint64_t *pulled, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_snapshot_delete_remote: deletes snapd snapshot `remote_id` of
 * `tenant` (the snapshot's; snapd refuses none); a snapshot already gone
 * is fine. Returns
 * MOAT_OK or a status with *errmsg (heap). */
int vmd_snapshot_delete_remote(struct vmd *vmd, const char *tenant,
    const char *remote_id, uint64_t *freed_bytes, char **errmsg)
    __attribute__((warn_unused_result));

#endif
