/*
 * snapshot_fetch.h: a snapd snapshot into the local catalog
 * (snapshot_fetch.c). Not for: pushing (snapshot_push.h).
 */
#ifndef MOAT_VMD_SNAPSHOT_FETCH_H
#define MOAT_VMD_SNAPSHOT_FETCH_H

#include "moat/rpc.h"

struct vmd;

/* vmd_snapshot_fetch: pulls snapd snapshot `id` of `tenant` (required:
 * INVALID_ARGUMENT when empty) into directory `dir` (absent; made via
 * dir.tmp and a rename), verifying every chunk; *pulled_bytes is the
 * chunk bytes that came from snapd (0 when another restore fetched it
 * meanwhile). Returns MOAT_OK, or sets the call's error: NOT_FOUND,
 * DATA_LOSS naming the snapshot for a corrupt chunk, UNAVAILABLE when
 * snapd does not answer. */
int vmd_snapshot_fetch(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, const char *tenant, const char *dir,
    uint64_t *pulled_bytes) __attribute__((warn_unused_result));

#endif
