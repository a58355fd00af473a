/*
 * extents.h: sparse file copies (extents.c). Not for: anything else.
 */
#ifndef MOAT_VMD_EXTENTS_H
#define MOAT_VMD_EXTENTS_H

#include <stdint.h>

/* vmd_copy_sparse: copies `src` to a new file `dst` (created 0600, must
 * not exist), keeping holes: a reflink when the filesystem can, else only
 * the allocated extents. *copied (may be NULL) gets the bytes of data
 * copied (the allocated size for a reflink). Returns 0 or an errno value;
 * on failure `dst` is removed. Thread-safe. */
int vmd_copy_sparse(const char *src, const char *dst, uint64_t *copied)
    __attribute__((warn_unused_result));

/* vmd_copy_extents: copies the allocated extents of open file `in` into
 * open file `out` at the same offsets (out already has in's size and
 * holes where in has them), or clones `in` into it where the filesystem
 * has reflinks. *copied (may be NULL) gets the bytes copied (allocated
 * for a clone).
 * Returns 0 or an errno value. */
int vmd_copy_extents(int in, int out, uint64_t *copied)
    __attribute__((warn_unused_result));

#endif
