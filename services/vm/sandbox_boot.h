/*
 * sandbox_boot.h: bringing a sandbox up (sandbox_boot.c): admission, its
 * disk, the boot or restore of its VMM under the boot deadline, and the
 * step to RUNNING; and the hidden boots of the template builder. Not
 * for: what a create or restore request means (sandbox_create.h,
 * sandbox_restore.h).
 */
#ifndef MOAT_VMD_SANDBOX_BOOT_H
#define MOAT_VMD_SANDBOX_BOOT_H

#include <pthread.h>
#include <stdbool.h>

#include "moat/rpc.h"

struct sandbox;
struct vmd;
struct vmd_shape;
struct moat_vmm_spec;
struct guest_link;

/* The image and disk paths of one boot (heap; vmd_boot_files_free). */
struct vmd_boot_files {
	char *kernel;
	char *initrd;
	char *rootfs;
	char *scratch;
	char *extra;  /* the test label's cmdline, or NULL */
	char *egress; /* the egress port's socket, or NULL */
};

/* vmd_boot_spec_make: fills `spec` for one boot of sb (a restore from
 * `snap_dir` when not NULL), its strings in *f (free them with
 * vmd_boot_files_free). The one place a VMM's spec is made: a boot, a
 * restore and a pooled VMM (pool.c) alike. False when out of memory. */
bool vmd_boot_spec_make(struct sandbox *sb, const char *accel,
    const char *snap_dir, struct vmd_boot_files *f,
    struct moat_vmm_spec *spec);
void vmd_boot_files_free(struct vmd_boot_files *f);

/* vmd_guest_reset: tells a restored guest's agent (over `link`) that it
 * is a new VM: the host's clock and fresh entropy, `hostname`, its code
 * contexts' random generators reseeded when `reseed`, and its egress
 * proxy on or off. Waits until `deadline`. Returns 0 or a status with
 * *why (heap). The one place a reset is sent: a restore, and the pool's
 * pre-warm (pool.c). */
int vmd_guest_reset(struct guest_link *link, const char *hostname, bool reseed,
    bool egress_on, uint64_t deadline, char **why)
    __attribute__((warn_unused_result));

/* How vmd_sandbox_bring_up makes the sandbox known. */
enum vmd_bring_up_mode {
	BRING_UP_LISTED,  /* in the table from the start */
	BRING_UP_HIDDEN,  /* never in the table (template builds) */
	BRING_UP_REPLACE, /* takes `replace`'s place once running */
};

/* vmd_sandbox_bring_up: admits `sb` (a fresh BOOTING vmd_sandbox_alloc)
 * and brings it up: a boot (retried once, with the accelerator probe),
 * or with `snap_dir` a restore from that snapshot under `accel`. Takes
 * the caller's reference to sb. On success *out holds a reference and
 * sb is RUNNING (or FAILED when the guest went wrong right after it said
 * ready). On failure returns a status after moat_rpc_error; sb is
 * STOPPED and its files are gone. `mode` says when (if ever) it enters
 * the table; with BRING_UP_REPLACE, `replace` (a reference the caller
 * keeps) is stopped once sb runs, and left as it was when sb fails. */
int vmd_sandbox_bring_up(struct vmd *vmd, struct moat_rpc_call *call,
    struct sandbox *sb, const char *snap_dir, const char *accel,
    enum vmd_bring_up_mode mode, struct sandbox *replace, struct sandbox **out)
    __attribute__((warn_unused_result));

/* vmd_sandbox_create_hidden: boots a sandbox of `shape` that is in no
 * table (no id a client can name), for the template builder. Same
 * contract as vmd_sandbox_create; release with vmd_sandbox_destroy_hidden.
 * Before booting it stores the sandbox in *slot under slot_mu with a
 * reference of the slot's own (the caller clears the slot and puts it,
 * success or not), so another thread can vmd_sandbox_abort it. */
int vmd_sandbox_create_hidden(struct vmd *vmd, struct moat_rpc_call *call,
    const struct vmd_shape *shape, pthread_mutex_t *slot_mu,
    struct sandbox **slot, struct sandbox **out)
    __attribute__((warn_unused_result));

#endif
