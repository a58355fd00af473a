/*
 * templates.h: the node's ready snapshots, one per shape (templates.c).
 * Not for: creating a sandbox from one (sandbox_create.h).
 */
#ifndef MOAT_VMD_TEMPLATES_H
#define MOAT_VMD_TEMPLATES_H

#include "sandbox.h"

struct vmd;

/* vmd_templates_init / _fini: the build table (fini joins the builder
 * threads; call after vmd_sandbox_destroy_all refused new work). */
int vmd_templates_init(struct vmd *vmd) __attribute__((warn_unused_result));
void vmd_templates_fini(struct vmd *vmd);

/* vmd_template_find: the directory and id (heap, caller frees both) of a
 * usable template of `shape` under accelerator `accel`, or
 * MOAT_NOT_FOUND. A template of another image build is removed. */
int vmd_template_find(struct vmd *vmd, const struct vmd_shape *shape,
    const char *accel, char **dir, char **id)
    __attribute__((warn_unused_result));

/* vmd_template_build_async: starts making the template of `shape` under
 * `accel` in a background thread unless one exists or is being made.
 * Never blocks on the build; failures are logged. */
void vmd_template_build_async(struct vmd *vmd, const struct vmd_shape *shape,
    const char *accel);

/* vmd_template_ram: where a restore of template `id` (directory `dir`)
 * copies its RAM from: "/proc/self/fd/N" of a copy vmd holds in memory
 * (loaded on first use), heap; NULL: use <dir>/ram. */
char *vmd_template_ram(struct vmd *vmd, const char *id, const char *dir);

/* vmd_template_take_spare: a ready RAM copy of template `id` taken
 * from its pool of spares ([vmd] template-spares; heap path of a file
 * in the RAM dir that the caller renames into its own RAM file name), or
 * NULL when none is ready (then copy from vmd_template_ram). Wakes the
 * thread that refills the pool. */
char *vmd_template_take_spare(struct vmd *vmd, const char *id);

/* vmd_template_spares_purge: removes every spare RAM copy of template
 * `id` from the RAM dir (ready or half made). For templates.c and purge. */
void vmd_template_spares_purge(const char *id);

/* vmd_template_drop: removes template directory `dir` (it failed to
 * restore). */
void vmd_template_drop(struct vmd *vmd, const char *dir);

/* vmd_templates_drop_image: removes every template of `image` (its
 * image is being removed: RemoveImage). */
void vmd_templates_drop_image(struct vmd *vmd, const char *image);

#endif
