/*
 * image_store_internal.h: what image_store.c, image_pull.c and
 * image_build.c share: the image files, manifest ids, the snapd entries
 * of a name, and the index of chunks this node's images hold. Not for:
 * callers outside those files (image_store.h).
 */
#ifndef MOAT_VMD_IMAGE_STORE_INTERNAL_H
#define MOAT_VMD_IMAGE_STORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "moat/rpc.h"
#include "snapshot.pb-c.h"
#include "vm.pb-c.h"

struct vmd;

#define VMD_IMAGE_N_FILES 5
extern const char *const vmd_image_files[VMD_IMAGE_N_FILES];

/* vmd_image_set_str: a message's string field set to a copy of v (the
 * old value freed unless it is protobuf-c's empty string). */
void vmd_image_set_str(char **field, const char *v);

/* vmd_image_manifest_id: SHA-256 hex of <dir>/manifest.json; with
 * `text`, its bytes too (heap). Returns 0 or a status with *errmsg. */
int vmd_image_manifest_id(const char *dir, char id[65], char **text,
    size_t *len, char **errmsg);

/* vmd_image_info_dir: ImageInfo of the image in `dir` (named `name`). */
int vmd_image_info_dir(const char *dir, const char *name,
    Moat__V1__ImageInfo *out, char **errmsg);

/* vmd_image_name_check: a valid name (and with `present`, an image of
 * this node), else a status after moat_rpc_error. */
int vmd_image_name_check(struct vmd *vmd, struct moat_rpc_call *call,
    const char *name, bool present);

/* vmd_image_list_entries: the snapd entries labelled kind=image,
 * name=`name`, oldest first; *hold is the reply to free
 * (protobuf_c_message_free_unpacked). */
int vmd_image_list_entries(struct vmd *vmd, const char *name,
    Moat__V1__SnapshotInfo ***out, size_t *n, void **hold, char **errmsg);

/* vmd_image_label: label `key` of entry s, "" when absent. */
const char *vmd_image_label(const Moat__V1__SnapshotInfo *s, const char *key);

/* The chunk index (image_pull.c): for local images stored in snapd,
 * each file's chunk ids, so a pull reads shared chunks locally.
 * _add copies the artifacts' chunk lists; _forget drops a name; _fill
 * sets info's stored and snapshot_id when the index knows the image's
 * entry. */
void vmd_image_index_add(struct vmd *vmd, const char *name, const char *id,
    const char *snapshot_id, const Moat__V1__SnapArtifact *const *arts,
    size_t n);
void vmd_image_index_forget(struct vmd *vmd, const char *name);
void vmd_image_index_fill(struct vmd *vmd, const char *name,
    Moat__V1__ImageInfo *info);

#endif
