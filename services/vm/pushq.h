/*
 * pushq.h: the background push of step snapshots to moat-snapd
 * (pushq.c). SnapshotSandbox stores the snapshot on the node and answers
 * at once; one worker thread then pushes the queued snapshots in the
 * order they were taken (so a snapshot's parent is pushed before it) and
 * rewrites each one's meta with its snapd id. Whoever is about to evict
 * or delete a snapshot settles it first: a queued push is cancelled (the
 * caller pushes or not as it sees fit), a running one is waited for.
 * Not for: the push itself (snapshot_push.c) or templates (never pushed).
 */
#ifndef MOAT_VMD_PUSHQ_H
#define MOAT_VMD_PUSHQ_H

#include <stdbool.h>
#include <stdint.h>

struct vmd;

/* vmd_pushq_start: the queue and its worker (vmd->pushq), when vmd has a
 * snapd. Returns 0, or a status: vmd then pushes synchronously. */
int vmd_pushq_start(struct vmd *vmd) __attribute__((warn_unused_result));

/* vmd_pushq_stop: queued pushes are abandoned (their snapshots stay on
 * the node, not stored in snapd: an eviction pushes them later), the
 * running one is finished, the worker joined. Safe without a queue. */
void vmd_pushq_stop(struct vmd *vmd);

/* vmd_pushq_add: queues the push of snapshot `id` (directory `dir`, of
 * sandbox `sandbox_id`). false when there is no queue or no memory: the
 * caller pushes itself. */
bool vmd_pushq_add(struct vmd *vmd, uint64_t request_id, const char *id,
    const char *dir, const char *sandbox_id);

/* vmd_pushq_pending: whether snapshot `id` waits for or is in its push. */
bool vmd_pushq_pending(struct vmd *vmd, const char *id);

/* vmd_pushq_settle: before snapshot `id` is evicted or deleted: a queued
 * push of it is cancelled, a running one waited for. Afterwards its meta
 * says whether it is stored in snapd. */
void vmd_pushq_settle(struct vmd *vmd, const char *id);

#endif
