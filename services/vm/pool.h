/*
 * pool.h: the warm VMM pool ([vmd] vmm-pool = N, issue 18): per
 * template in use and per recently restored snapshot, up to N VMMs
 * already started as a clone of it would be (the driver's restore: QEMU
 * paused with -incoming defer, its RAM file a copy of the source's, its
 * scratch disk a copy of the source's), each in a sandbox directory
 * <state>/vms/<sb-id> of its own, so that a create (a template clone)
 * or a restore or fork (a snapshot clone) takes one and only loads the
 * device state. The key is the source, so the RAM a VMM holds (and
 * whatever backs it) is always the right one.
 * A template's pooled VMMs are pre-warmed: loaded, resumed, reset once
 * (their own name, the host's entropy) and run through one exec over a
 * link of the pool's, so TCG has translated what a first exec runs; a
 * create takes the running VM and its link and only resets it again as
 * its sandbox. A snapshot's pooled VMMs stay paused: a restore gives
 * the recorded state, not one that ran on.
 * One background thread refills the pools after a take, off the request
 * path. The pool's register <state>/pool/<sb-id>.pid names every pooled
 * VMM not yet taken (its pid once ready to take, 0 before): a vmd
 * that starts kills those and removes their files before it adopts
 * anything, and a vmd that stops kills its own.
 * A pooled VMM is taken once, by one sandbox, and goes with it; it is
 * never put back. Only drivers with restore; only clones without
 * network allowlist or test mode (their VMM's command line differs), and
 * not a restore in place or a drain's (their directory is named apart).
 * Not for: templates (templates.c) or the restore itself (the driver).
 */
#ifndef MOAT_VMD_POOL_H
#define MOAT_VMD_POOL_H

#include <stdbool.h>
#include <sys/types.h>

struct vmd;
struct sandbox;
struct vmd_shape;

#define VMD_POOL_DIR "pool" /* under the state dir */

/* vmd_pool_reap_leftovers: kills the pooled VMMs an earlier vmd left
 * (its register under <state>/pool) and removes their directories, RAM
 * files and register entries. Call before vmd_adopt_all (a pooled VMM is
 * never adopted as a sandbox). Returns how many VMMs were still running
 * and were killed. */
int vmd_pool_reap_leftovers(struct vmd *vmd);

/* vmd_pool_init: vmd->pool when [vmd] vmm-pool > 0 and the driver can
 * restore (else NULL: off). Starts nothing until the first want.
 * Returns 0 or MOAT_INTERNAL (out of memory). */
int vmd_pool_init(struct vmd *vmd) __attribute__((warn_unused_result));

/* vmd_pool_fini: stops the refill thread, kills every pooled VMM and
 * removes its files. After the RPC server stopped. Safe when off. */
void vmd_pool_fini(struct vmd *vmd);

/* vmd_pool_want: template or snapshot `src` (its directory `dir`, of
 * `shape` under `accel`; `snapshot`: a snapshot's, whose files are
 * verified before a pooled VMM reads them) is in use: keep its pool
 * full, in the background, starting a little after this call (call it
 * once a create or restore has ended, so the refill does not compete
 * with it). Only the 4 most recently wanted snapshots keep a pool. */
void vmd_pool_want(struct vmd *vmd, const char *src, const char *dir,
    const struct vmd_shape *shape, const char *accel, bool snapshot);

/* vmd_pool_take: gives sb (a fresh vmd_sandbox_alloc clone of template
 * or snapshot `src`) a pooled VMM of it when one is ready: sb takes its
 * id and directory (sb->pooled, sb->from_pool set). Counts a hit or a
 * miss. No refill starts until the next vmd_pool_want. False when none
 * (then sb is unchanged). */
bool vmd_pool_take(struct vmd *vmd, const char *src, struct sandbox *sb);

/* vmd_pool_shed: gives up every pooled VMM not taken (killed, their
 * files removed, their memory back) and refills no pool until it is
 * used again (vmd_pool_make_room). Returns how many went. */
uint32_t vmd_pool_shed(struct vmd *vmd);

/* vmd_pool_make_room: before sb (not a pooled VMM's; a clone when
 * `restore`) is admitted: when the pooled VMMs not taken stand in its
 * way, in the node's memory or its RAM dir, they are given up
 * (vmd_pool_shed). */
void vmd_pool_make_room(struct vmd *vmd, const struct sandbox *sb,
    bool restore);

/* vmd_pool_forget: template or snapshot `src` is gone: its pooled VMMs
 * are killed and their files removed. (Ones removed otherwise, a
 * template with its image or a deleted snapshot, are found by the
 * refill thread within seconds.) */
void vmd_pool_forget(struct vmd *vmd, const char *src);

/* vmd_pool_reg_name: whether `name` is a register entry ("sb-<16
 * hex>.pid"); copies the sandbox id into id[20]. For tests. */
bool vmd_pool_reg_name(const char *name, char id[20]);

#endif
