/*
 * accel.h: the accelerator decision, KVM or TCG, with one probe boot
 * (accel.c). Not for: booting (sandbox_boot.h).
 */
#ifndef MOAT_VMD_ACCEL_H
#define MOAT_VMD_ACCEL_H

#include <stdbool.h>

struct vmd;

/* vmd_accel_init: sets up the decision from cfg.accel. */
void vmd_accel_init(struct vmd *vmd);

/* vmd_accel_choose: the accelerator for the next boot. When *probe is set
 * on return, this boot is the KVM probe: the caller boots with "kvm" and a
 * short deadline, then must call vmd_accel_settle with what happened.
 * Other callers wait here while a probe runs. `kernel` is the image's
 * kernel (part of the cache key). Returns "kvm" or "tcg" (static). */
const char *vmd_accel_choose(struct vmd *vmd, const char *kernel, bool *probe);

/* vmd_accel_settle: ends a probe. `kvm_works`: the guest answered.
 * `known`: false when the probe ended for an unrelated reason (the
 * sandbox was destroyed): nothing is decided and the next boot probes. */
void vmd_accel_settle(struct vmd *vmd, const char *kernel, bool known,
    bool kvm_works);

/* vmd_accel_permit: may a VM run under `accel` ("kvm", "tcg", or ""
 * while undecided: yes)? TCG only with accel=tcg or allow-tcg = true.
 * Returns 0, or MOAT_FAILED_PRECONDITION with *why (heap) naming the
 * key. */
int vmd_accel_permit(struct vmd *vmd, const char *accel, char **why)
    __attribute__((warn_unused_result));

/* vmd_accel_current: "", "kvm" or "tcg" into buf. */
void vmd_accel_current(struct vmd *vmd, char buf[8]);

#endif
