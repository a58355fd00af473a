/*
 * image_store.h: this node's guest images and moat-snapd (issue 17):
 * push an image there, pull one this node lacks (also before a create
 * of it), list and remove this node's copies (image_store.c). Not for:
 * the image files' paths and checks (image.h, verify.h) or builds
 * (image_build.h).
 */
#ifndef MOAT_VMD_IMAGE_STORE_H
#define MOAT_VMD_IMAGE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"
#include "vm.pb-c.h"

struct vmd;

/* Images are cut in chunks of this size in moat-snapd: an ext4 image
 * rebuilt with a few files changed differs in scattered 4 KiB blocks
 * (data, inode table, bitmaps); 64 KiB keeps each change's cost small
 * while a 400 MB image stays at 6,400 ids (a 200 KiB manifest) and each
 * GetChunks carries a few MiB. */
#define VMD_IMAGE_CHUNK_SIZE (64u << 10)

/* vmd_images_init: the image state, after removing what a crashed pull
 * or removal left in the image dir (.NAME.pull.*, .NAME.rm). Returns 0
 * or MOAT_INTERNAL (out of memory). vmd_images_fini frees it. */
int vmd_images_init(struct vmd *vmd) __attribute__((warn_unused_result));
void vmd_images_fini(struct vmd *vmd);

/* vmd_image_info: ImageInfo of local image `name` from its manifest.json
 * (heap fields, freed with the message). Returns 0 or a status after
 * moat_rpc_error. */
int vmd_image_info(struct vmd *vmd, struct moat_rpc_call *call,
    const char *name, Moat__V1__ImageInfo *out)
    __attribute__((warn_unused_result));

/* PushImage: local image `name`, checked, into moat-snapd (only chunks
 * snapd lacks); an entry of the same id is answered as is; an older id
 * of the name is deleted after the new entry is committed. */
int vmd_image_push(struct vmd *vmd, struct moat_rpc_call *call,
    const char *name, Moat__V1__ImageInfo *out)
    __attribute__((warn_unused_result));

/* PullImage: the newest moat-snapd entry of `name` into the image dir,
 * every chunk verified (chunks held by local images are read here), the
 * manifest and files checked, renamed into place whole. Concurrent
 * pulls of one name wait for one. `out` may be NULL. */
int vmd_image_pull(struct vmd *vmd, struct moat_rpc_call *call,
    const char *name, Moat__V1__ImageInfo *out)
    __attribute__((warn_unused_result));

/* vmd_image_ensure: MOAT_OK when `name` is present, else pulled from
 * moat-snapd (without [vmd] snapd: MOAT_OK, the caller reports it). */
int vmd_image_ensure(struct vmd *vmd, struct moat_rpc_call *call,
    const char *name) __attribute__((warn_unused_result));

/* ListImages: this node's images (req->name: only that one). */
int vmd_images_list_rpc(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ListImagesRequest *req, Moat__V1__ImageList *reply)
    __attribute__((warn_unused_result));

/* RemoveImage: this node's copy, refused (FAILED_PRECONDITION naming up
 * to 5) while a sandbox or local snapshot of this node uses it; drops
 * its templates. */
int vmd_image_remove(struct vmd *vmd, struct moat_rpc_call *call,
    const char *name, Moat__V1__RemoveImageReply *reply)
    __attribute__((warn_unused_result));

/* vmd_image_find_hex_id: the first run of 64 hex digits in `msg`
 * (lower-cased into out) — how an error names a chunk. Pure. */
bool vmd_image_find_hex_id(const char *msg, char out[65]);

#endif
