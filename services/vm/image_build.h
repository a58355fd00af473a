/*
 * image_build.h: image builds on this node (image_build.c): the build
 * script run on a spec and its input files, its steps long-polled, the
 * image pushed to moat-snapd when done. Not for: the build itself
 * (images/build.sh) or storing images (image_store.h).
 */
#ifndef MOAT_VMD_IMAGE_BUILD_H
#define MOAT_VMD_IMAGE_BUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moat/rpc.h"
#include "vm.pb-c.h"

struct vmd;

#define VMD_BUILD_SPEC_MAX (64u << 10)
#define VMD_BUILD_INPUTS_MAX (64u << 20)
#define VMD_BUILD_STEPS_MAX 500u
#define VMD_BUILD_TAIL 4096u
#define VMD_BUILD_WAIT_MAX_MS 30000u

int vmd_image_builds_init(struct vmd *vmd) __attribute__((warn_unused_result));
/* vmd_image_builds_fini: kills a running build's process group, waits
 * for its thread and removes every build directory. */
void vmd_image_builds_fini(struct vmd *vmd);

/* StartImageBuild: one at a time per node (RESOURCE_EXHAUSTED naming the
 * running one). */
int vmd_image_build_start(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ImageBuildRequest *req, Moat__V1__ImageBuild *reply)
    __attribute__((warn_unused_result));

/* GetImageBuild: steps from ref->from_step, waiting up to ref->wait_ms
 * (at most VMD_BUILD_WAIT_MAX_MS) for a new one or the end. */
int vmd_image_build_get(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ImageBuildRef *ref, Moat__V1__ImageBuild *reply)
    __attribute__((warn_unused_result));

/* vmd_image_build_parse_step: a build script's stderr line
 * "images: [S.mmms] text" as its text (into text, cap bytes) and its
 * time in ms; false for any other line. Pure. */
bool vmd_image_build_parse_step(const char *line, char *text, size_t cap,
    uint64_t *at_ms);

/* vmd_image_input_name_ok: a spec input's file name: 1-255 bytes, no
 * '/', not "." or "..", no NUL, not starting with '.'. Pure. */
bool vmd_image_input_name_ok(const char *name);

#endif
