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

#endif
