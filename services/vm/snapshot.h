/*
 * snapshot.h: local snapshots under <state>/snapshots (snapshot.c):
 * taking, listing, deleting and opening them. Not for: restoring one
 * (sandbox_restore.h) or snapd (snapshot_push.h).
 */
#ifndef MOAT_VMD_SNAPSHOT_H
#define MOAT_VMD_SNAPSHOT_H

#include <stdbool.h>
#include "moat/rpc.h"
#include "vm.pb-c.h"

struct sandbox;
struct vmd;

#define VMD_SNAPSHOT_TIMEOUT_MS 60000u
/* A new guest link after a snapshot that reset the old one (Firecracker):
 * the guest runs already, so its agent answers within ms. */
#define VMD_RELINK_TIMEOUT_MS 10000u

/* vmd_snapshot_take: snapshots running sandbox req->sandbox_id (the
 * sandbox keeps running) and fills `reply` (heap fields, the RPC server
 * frees them). Refused while execs run in it: their output would reach
 * a clone that knows nothing of them. */
int vmd_snapshot_take(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SnapshotSandboxRequest *req,
    Moat__V1__LocalSnapshot *reply) __attribute__((warn_unused_result));
/* vmd_snapshot_resume: ResumeSandbox: runs again a sandbox a snapshot
 * with leave_paused left paused (FAILED_PRECONDITION if not paused);
 * fills `reply` as GetSandbox does. */
int vmd_snapshot_resume(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SandboxRef *req, Moat__V1__Sandbox *reply)
    __attribute__((warn_unused_result));
/* vmd_snapshot_unpause: sb runs again if paused for a move (else 0 at
 * once); a VM that cannot resume fails the sandbox, *errmsg (heap,
 * optional) says why. */
int vmd_snapshot_unpause(struct vmd *vmd, uint64_t request_id,
    struct sandbox *sb, char **errmsg);
int vmd_snapshot_list(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ListLocalSnapshotsRequest *req,
    Moat__V1__LocalSnapshotList *reply) __attribute__((warn_unused_result));
int vmd_snapshot_delete(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__LocalSnapshotRef *req) __attribute__((warn_unused_result));

/* A node template's last step before it is sealed and published: called
 * with its id and its still unpublished directory (templates.c moves
 * its RAM in, so a clone made as soon as it appears finds it whole). */
typedef void vmd_template_prepare_fn(struct vmd *vmd, const char *id,
    const char *dir);

/* vmd_snapshot_make: snapshots running sandbox `sb` (a reference the
 * caller keeps) as snapshot `id` into directory `dir` (absent: written
 * as dir.tmp and renamed when complete; on failure nothing is left).
 * `template_prepare` (non-NULL) marks a node template: never pushed to
 * snapd, and prepared by it before it is sealed. Fills
 * `reply` (may be NULL; heap fields, the caller's message frees them).
 * A full file system is RESOURCE_EXHAUSTED naming dir's parent. Errors
 * go through moat_rpc_error(call, ...); the sandbox keeps running. */
int vmd_snapshot_make(struct vmd *vmd, struct moat_rpc_call *call,
    struct sandbox *sb, const char *id, const char *dir,
    vmd_template_prepare_fn *template_prepare,
    const Moat__V1__SnapshotSandboxRequest *req,
    Moat__V1__LocalSnapshot *reply) __attribute__((warn_unused_result));

/* vmd_snapshot_remove_dir: removes a snapshot directory and the RAM copy
 * its "ram" link points to (warns on failure). */
void vmd_snapshot_remove_dir(const char *dir);

/* vmd_snapshot_open: snapshot `id`'s catalog entry (*meta, caller frees
 * with moat__v1__local_snapshot__free_unpacked) and directory (*dir,
 * heap); one this node lacks is pulled from snapd (vmd --snapd), and
 * *pulled_bytes (may be NULL) says how many bytes came from there (0:
 * none). A snapshot of another tenant (when `tenant` is not "": RPCs
 * always name one; "" is for vmd's own use) is NOT_FOUND. Errors go
 * through moat_rpc_error. */
int vmd_snapshot_open(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, const char *tenant, Moat__V1__LocalSnapshot **meta,
    char **dir, uint64_t *pulled_bytes) __attribute__((warn_unused_result));

#endif
