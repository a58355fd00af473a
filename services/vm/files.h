/*
 * files.h: file calls into a sandbox and the one guest call every
 * handler uses (files.c). Same contract as exec.h's handlers. Not for:
 * execs (exec.h).
 */
#ifndef MOAT_VMD_FILES_H
#define MOAT_VMD_FILES_H

#include <stdbool.h>
#include <stdint.h>
#include "guest.pb-c.h"
#include "moat/rpc.h"
#include "vm.pb-c.h"

struct sandbox;
struct vmd;

int vmd_file_read(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__FileReadRequest *req, Moat__V1__FileData *reply)
    __attribute__((warn_unused_result));
int vmd_file_write(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__FileWriteRequest *req, Moat__V1__FileInfo *reply)
    __attribute__((warn_unused_result));
int vmd_file_list(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req, Moat__V1__FileList *reply)
    __attribute__((warn_unused_result));
int vmd_file_stat(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req, Moat__V1__FileInfo *reply)
    __attribute__((warn_unused_result));
int vmd_file_remove(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req) __attribute__((warn_unused_result));
int vmd_file_mkdir(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__PathRequest *req, Moat__V1__FileInfo *reply)
    __attribute__((warn_unused_result));
/* PutArchive and GetArchive (issue 17): each RPC chunk (at most
 * VMD_ARCHIVE_CHUNK_MAX) goes to the agent in MOAT_GUEST_IO_MAX pieces;
 * the agent stages, checks and unpacks or packs (guest/agent/archive.c).
 */
#define VMD_ARCHIVE_CHUNK_MAX (4u << 20)
int vmd_archive_put(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ArchivePutRequest *req, Moat__V1__ArchivePutReply *reply)
    __attribute__((warn_unused_result));
int vmd_archive_get(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ArchiveGetRequest *req, Moat__V1__ArchiveGetReply *reply)
    __attribute__((warn_unused_result));
int vmd_guest_info(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SandboxRef *req, Moat__V1__GuestInfo *reply)
    __attribute__((warn_unused_result));
int vmd_fs_trace(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__FsTraceCall *req, Moat__V1__FsTrace *reply)
    __attribute__((warn_unused_result));

/* vmd_guest_call: one request to a running sandbox's agent, bounded by the
 * call's deadline. On MOAT_OK *reply is the agent's answer with code OK
 * and, when `want` is not NOT_SET, that body (the caller frees it with
 * moat__v1__guest_message__free_unpacked). Otherwise returns the agent's
 * code and message (or the link's error) through moat_rpc_error. */
int vmd_guest_call(struct sandbox *sb, struct moat_rpc_call *call,
    Moat__V1__GuestRequest *req, Moat__V1__GuestMessage__BodyCase want,
    Moat__V1__GuestMessage **reply) __attribute__((warn_unused_result));

/* vmd_guest_call_until: vmd_guest_call with an explicit deadline; sets
 * *answered (may be NULL) when the agent's own reply decided the result,
 * so callers can tell a refusal from a lost request. */
int vmd_guest_call_until(struct sandbox *sb, struct moat_rpc_call *call,
    Moat__V1__GuestRequest *req, Moat__V1__GuestMessage__BodyCase want,
    uint64_t deadline_ms, Moat__V1__GuestMessage **reply, bool *answered)
    __attribute__((warn_unused_result));

/* vmd_call_deadline: the call's deadline less a margin to send the reply
 * back before the caller gives up. */
uint64_t vmd_call_deadline(const struct moat_rpc_call *call);

#endif
