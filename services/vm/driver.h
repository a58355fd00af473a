/*
 * driver.h: which VMM this vmd drives, chosen once at start from a table
 * of drivers (driver.c) by `[vmd] driver=auto|qemu|firecracker`. Each
 * entry names a driver's ops (vmm.h, whose probe says whether it can run
 * here), the [vmd] key of its binary, and its configure op, which reads
 * the driver's own config section into the driver's own state. Not for:
 * the drivers themselves (drivers/) or the accelerator of a QEMU boot
 * (accel.c).
 */
#ifndef MOAT_VMD_DRIVER_H
#define MOAT_VMD_DRIVER_H

#include "node.h"

struct moat_config;

/* vmd_driver_check_name: MOAT_OK when `name` is "auto" or a driver of
 * the table; else MOAT_INVALID_ARGUMENT with *errmsg (heap, caller
 * frees) listing the names there are. For the config check at start,
 * before anything on the node is touched. */
int vmd_driver_check_name(const char *name, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_driver_select: picks the VMM driver from cfg.driver: the entry of
 * that name, or with "auto" the first entry, in the table's order
 * (Firecracker, then QEMU), whose probe passes: Firecracker when its
 * binary runs and KVM can create a VM, else QEMU. Each driver tried is
 * configured first (a bad setting fails the start even under auto).
 * Sets vmd->vmm, vmm_binary and vmm_version (heap, freed with vmd); a
 * driver that forces an accelerator (Firecracker: KVM) sets cfg.accel.
 * Main thread, once. On failure returns a status with *errmsg (heap,
 * caller frees) naming what to install. */
int vmd_driver_select(struct vmd *vmd, const struct moat_config *c,
    char **errmsg) __attribute__((warn_unused_result));

#endif
