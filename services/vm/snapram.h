/*
 * snapram.h: the node's RAM dir as a budget (issue 11): how much of it
 * snapshot RAM copies may hold ([vmd] snapshot-ram-mib), which copies to
 * evict to the on-disk store when over (least recently used first), the
 * rebuild of an evicted copy before a restore, and the admission of
 * anything that will map or grow a file there (a create, a restore, a
 * snapshot), so no VMM meets a full filesystem (SIGBUS). Not for: taking
 * or listing snapshots (snapshot.c) or moving chunks (snapshot_push.c).
 */
#ifndef MOAT_VMD_SNAPRAM_H
#define MOAT_VMD_SNAPRAM_H

#include <stdbool.h>
#include <stdint.h>

#include "vm.pb-c.h"

struct vmd;
struct moat_rpc_call;

/* Room kept free in the RAM dir beyond every reservation: files vmd does
 * not count (QEMU's own, metadata) and rounding. */
#define VMD_RAM_DIR_SLACK ((uint64_t)64 << 20)

/* vmd_snapram_init: the index of this node's snapshots and where their
 * RAM is, from <state>/snapshots (a snapshot whose RAM copy vanished, as
 * after a reboot, is marked on disk when snapd or a local copy has it);
 * then evicts down to the budget. Call at start, after the RAM dir and
 * snapd client are set, before serving. Returns 0 or MOAT_INTERNAL. */
int vmd_snapram_init(struct vmd *vmd) __attribute__((warn_unused_result));
void vmd_snapram_fini(struct vmd *vmd);

/* vmd_snapram_added: snapshot `id` (directory `dir`, RAM copy of
 * `resident` bytes in the RAM dir) is complete: it is the most recently
 * used; copies are evicted while the budget is exceeded. */
void vmd_snapram_added(struct vmd *vmd, uint64_t request_id, const char *id,
    const char *dir, uint64_t resident);

/* vmd_snapram_forget: snapshot `id` is being deleted: waits (until
 * `deadline_ms`) for a restore or an eviction using it to finish and
 * drops it from the index. Returns MOAT_OK, or MOAT_UNAVAILABLE after
 * moat_rpc_error when it stays in use. */
int vmd_snapram_forget(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, uint64_t deadline_ms) __attribute__((warn_unused_result));

/* vmd_snapram_acquire: before restoring snapshot `id` (directory `dir`,
 * *meta as read): pins it so no eviction removes its RAM copy, and when
 * it was evicted rebuilds the copy from the on-disk store (reserving the
 * room first) and rewrites *meta's location. Marks it used now. On
 * MOAT_OK the caller calls vmd_snapram_release once its VMM has the RAM;
 * otherwise nothing is held and the call's error is set. Snapshots not
 * under <state>/snapshots (templates) pass through. */
int vmd_snapram_acquire(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, const char *dir, Moat__V1__LocalSnapshot **meta)
    __attribute__((warn_unused_result));
void vmd_snapram_release(struct vmd *vmd, const char *id);

/* vmd_ram_has_room: whether the RAM dir could take `bytes` more now,
 * without evicting anything (the warm pool asks before it starts a
 * VMM; nothing is promised). */
bool vmd_ram_has_room(struct vmd *vmd, uint64_t bytes);

/* vmd_ram_admit: makes sure the RAM dir can take `bytes` more for `what`
 * ("a sandbox of 256 MiB"), evicting snapshot RAM copies when it cannot;
 * the bytes stay reserved until vmd_ram_admit_done(vmd, bytes). Returns
 * MOAT_OK, or MOAT_RESOURCE_EXHAUSTED after moat_rpc_error naming the RAM
 * dir, the budget and what holds the room. */
int vmd_ram_admit(struct vmd *vmd, struct moat_rpc_call *call, uint64_t bytes,
    const char *what) __attribute__((warn_unused_result));
void vmd_ram_admit_done(struct vmd *vmd, uint64_t bytes);

/* vmd_snapram_fill: the budget, use and evictions into a Node. */
void vmd_snapram_fill(struct vmd *vmd, Moat__V1__Node *node);

/* vmd_snapram_resident: bytes allocated to the RAM copy of snapshot
 * directory `dir` (its "ram" link's target), 0 when there is none. */
uint64_t vmd_snapram_resident(const char *dir);

#endif
