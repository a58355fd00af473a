/*
 * metrics.h: moat-vmd's metrics (`--metrics ADDR`, [vmd] metrics): boot,
 * restore and snapshot-pause latencies, pushes to snapd, and at each
 * scrape the sandboxes by state, memory, RAM dir, snapshot RAM and
 * scratch disk in use (metrics.c). The event calls are cheap atomics and
 * do nothing while metrics are off, so the files where events happen
 * call them unconditionally.
 * Not for: the registry and the listener (moat/metrics.h).
 */
#ifndef MOAT_VMD_METRICS_H
#define MOAT_VMD_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "vm.pb-c.h"

struct vmd;

/* Fills the snapshot RAM and RAM dir figures of a Node, allocating
 * nothing (snapram.c's vmd_snapram_fill; a hook, so this module depends
 * on none that report to it). */
typedef void vmd_metrics_node_fill(struct vmd *vmd, Moat__V1__Node *node);

/* How a sandbox came up (moat_vmd_boot_seconds's kind label). */
enum vmd_boot_kind {
	VMD_BOOT_COLD,    /* a cold boot of an image */
	VMD_BOOT_RESTORE, /* a restore from a snapshot (template clones too) */
};

/* vmd_metrics_start: registers vmd's metrics and serves them on `addr`
 * (moat/metrics.h's moat_metrics_serve); each scrape reads the node's
 * snapshot RAM through `node_fill`. `vmd` must outlive
 * vmd_metrics_stop. Call once, before serving RPCs. On failure returns a
 * status with *errmsg (heap, caller frees). */
int vmd_metrics_start(struct vmd *vmd, const char *addr,
    vmd_metrics_node_fill *node_fill, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_metrics_stop: stops the listener and frees the metrics; the event
 * calls do nothing after. Safe when never started. Call after the RPC
 * server and every worker thread stopped. */
void vmd_metrics_stop(void);

/* vmd_metrics_text: what a scrape reads now (the hooks run); heap,
 * the caller frees; NULL while metrics are off. For tests. */
char *vmd_metrics_text(void);

/* Events; thread-safe, no-ops while metrics are off. */
/* vmd_metrics_boot: a sandbox's VMM came up and its agent answered,
 * `ms` after the VMM was started. */
void vmd_metrics_boot(enum vmd_boot_kind kind, uint64_t ms);
/* vmd_metrics_boot_failed: a create or restore that did not come up. */
void vmd_metrics_boot_failed(enum vmd_boot_kind kind);
/* The phases of moat_vmd_create_phase_seconds, in the order of
 * vmd_metrics_create_phases's array (CreateTimings). */
enum {
	VMD_PHASE_TOTAL,
	VMD_PHASE_PREPARE,
	VMD_PHASE_ADMIT,
	VMD_PHASE_DISK,
	VMD_PHASE_VMM_SPAWN,
	VMD_PHASE_AGENT_CONNECT,
	VMD_PHASE_QMP_WAIT,
	VMD_PHASE_RAM_WAIT,
	VMD_PHASE_DEVICE_LOAD,
	VMD_PHASE_RESUME,
	VMD_PHASE_RESET,
	VMD_PHASE_BOOT_WAIT,
	VMD_PHASE_N
};
/* vmd_metrics_create_phases: one create's or restore's phases in ms
 * (0: the phase did not happen, not observed). */
void vmd_metrics_create_phases(const double ms[VMD_PHASE_N]);
/* vmd_metrics_restore: a RestoreSandbox answered OK after `ms` (the
 * whole call: fetch, verify, boot); `pulled` when it pulled from snapd. */
void vmd_metrics_restore(uint64_t ms, bool pulled);
/* vmd_metrics_snapshot_pause: a snapshot (or a template's) kept its guest
 * paused `ms` milliseconds. */
void vmd_metrics_snapshot_pause(bool is_template, double ms);
/* vmd_metrics_image_pull: an image pulled from snapd (image_pull.c),
 * `fetched` bytes from snapd and `local` read from this node's images. */
void vmd_metrics_image_pull(uint64_t fetched, uint64_t local);

/* vmd_metrics_push: a push to snapd ended, after `ms`; bytes new to
 * snapd and the snapshot's logical size when `ok`. */
void vmd_metrics_push(bool ok, uint64_t ms, uint64_t stored_bytes,
    uint64_t logical_bytes);
/* vmd_metrics_expired: the expiry thread destroyed a sandbox at its
 * timeout (idle false) or idle timeout (lifetime.h). */
void vmd_metrics_expired(bool idle);
/* vmd_metrics_vmm_pool: a template clone or snapshot restore with [vmd]
 * vmm-pool on took a pooled VMM (`hit`) or found none ready (pool.h). */
void vmd_metrics_vmm_pool(bool hit);

#endif
