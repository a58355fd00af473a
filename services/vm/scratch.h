/*
 * scratch.h: a sandbox's scratch disk (scratch.c). Not for: the
 * snapshot's copy of one (sandbox_boot.c).
 */
#ifndef MOAT_VMD_SCRATCH_H
#define MOAT_VMD_SCRATCH_H

#include <stdint.h>

struct vmd;

/* vmd_scratch_make: creates the sparse ext4 scratch disk `path` of `mib`
 * MiB (labelled moat-scratch) by copying the allocated extents of a
 * template kept in the state dir (made once per size with mkfs.ext4).
 * Returns 0 or a status with *errmsg (heap). */
int vmd_scratch_make(struct vmd *vmd, const char *path, uint64_t mib,
    char **errmsg) __attribute__((warn_unused_result));

/* vmd_scratch_admit: may a new scratch disk of `bytes` (its full size:
 * the file is sparse, and the guest may fill it) be made? Yes when the
 * state dir's filesystem has room for it, for what the scratch disks
 * under <state>/vms may still grow by and for the ones being admitted,
 * and keeps [vmd] disk-reserve-mib free besides. Returns 0 (then call
 * vmd_scratch_admit_done with `bytes` once the file exists or failed),
 * or MOAT_RESOURCE_EXHAUSTED with *errmsg (heap) giving the figures. */
int vmd_scratch_admit(struct vmd *vmd, uint64_t bytes, char **errmsg)
    __attribute__((warn_unused_result));
void vmd_scratch_admit_done(struct vmd *vmd, uint64_t bytes);

/* vmd_scratch_free: bytes new scratch disks may still claim, as
 * vmd_scratch_admit counts them (at least 1; 0 when the state dir cannot
 * be measured): Node.scratch_free_bytes. */
uint64_t vmd_scratch_free(struct vmd *vmd);

#endif
