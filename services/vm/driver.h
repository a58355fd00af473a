/*
 * driver.h: choosing the VMM driver at start (driver.c). Not for: the
 * drivers themselves (drivers/, vmm.h).
 */
#ifndef MOAT_VMD_DRIVER_H
#define MOAT_VMD_DRIVER_H

#include "node.h"

struct moat_config;

struct moat_config;

/* vmd_driver_select: picks the VMM driver from cfg.driver (auto: the
 * Firecracker driver when its binary runs and KVM works, else QEMU),
 * probes it, and sets vmd->vmm, vmm_binary and vmm_version (heap, freed
 * with vmd). Firecracker forces cfg.accel to "kvm". On failure returns a
 * status with *errmsg (heap, caller frees) naming what to install. */
int vmd_driver_select(struct vmd *vmd, const struct moat_config *c,
    char **errmsg) __attribute__((warn_unused_result));

#endif
