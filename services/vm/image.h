/*
 * image.h: the guest images on this node as files (image.c). Not for:
 * booting them (sandbox_boot.h).
 */
#ifndef MOAT_VMD_IMAGE_H
#define MOAT_VMD_IMAGE_H

#include <stdbool.h>
#include <stddef.h>

struct vmd;

/* Console lines an error message quotes. */
#define VMD_CONSOLE_LINES 10

/* vmd_image_path: <image-dir>/<image>/<file>, heap. */
char *vmd_image_path(const struct vmd *vmd, const char *image,
    const char *file);

/* vmd_image_stamp: "<size>.<mtime ns>" of each of the image's files, so a
 * snapshot can tell that its image was rebuilt since (heap; NULL when a
 * file is missing or on allocation failure). */
char *vmd_image_stamp(const struct vmd *vmd, const char *image);

/* vmd_image_present: every file of `image` is there and readable. */
bool vmd_image_present(const struct vmd *vmd, const char *image);

/* vmd_image_name_ok: `s` is a name an image may have (no path). */
bool vmd_image_name_ok(const char *s);

/* vmd_images_list: names of the images present (heap array of heap
 * strings, caller frees both). */
int vmd_images_list(const struct vmd *vmd, char ***names, size_t *n);

#endif
