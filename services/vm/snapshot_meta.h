/*
 * snapshot_meta.h: a local snapshot's catalog entry on disk
 * (snapshot_meta.c). Not for: the catalog's RPCs (snapshot.h).
 */
#ifndef MOAT_VMD_SNAPSHOT_META_H
#define MOAT_VMD_SNAPSHOT_META_H

#include <stdbool.h>

#include "vm.pb-c.h"

#define VMD_SNAPSHOT_META "meta.pb"
#define VMD_SNAPSHOT_META_MAX (64u << 10)

/* vmd_snapshot_read_meta: <dir>/meta.pb. Returns 0 with *meta (caller
 * frees with moat__v1__local_snapshot__free_unpacked) or an errno. */
int vmd_snapshot_read_meta(const char *dir, Moat__V1__LocalSnapshot **meta)
    __attribute__((warn_unused_result));

/* vmd_snapshot_write_meta: replaces <dir>/meta.pb atomically. Returns 0
 * or an errno value. */
int vmd_snapshot_write_meta(const char *dir,
    const Moat__V1__LocalSnapshot *meta) __attribute__((warn_unused_result));

/* vmd_snapshot_parent: the snapd id of the newest pushed snapshot of
 * sandbox `sandbox_id` among the snapshot directories under `root`
 * (heap), or NULL: the parent of its next push. */
char *vmd_snapshot_parent(const char *root, const char *sandbox_id);

#endif
