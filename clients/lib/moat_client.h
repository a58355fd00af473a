/*
 * moat_client.h: libmoat, the C client of moat-gateway. One call per
 * Gateway RPC, typed with the protobuf-c messages of proto/ (moat.v1),
 * plus file transfers that move files of any size in 1 MiB pieces.
 *
 * Conventions for every call below:
 * - Returns MOAT_OK (0) or a moat status (moat/status.h). On failure
 *   *errmsg is a heap string the caller frees: the gateway's or node's
 *   message (what failed and what to do), or the transport's when the
 *   gateway did not answer. On success *errmsg is NULL.
 * - A returned message (`Moat__V1__Sandbox **out` ...) belongs to the
 *   caller, who frees it with moat_client_free_msg (or the message's own
 *   *_free_unpacked). On failure *out is NULL.
 * - Requests passed in are only read; the caller keeps them.
 * - A client may be used from many threads at once.
 * - Mutating calls are sent once (the rpc layer never resends); a call
 *   that timed out may still have run: check before retrying.
 * Not for: HTTP.
 */
#ifndef MOAT_CLIENT_H
#define MOAT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway.pb-c.h"
#include "moat/status.h"
#include "session.pb-c.h"
#include "vm.pb-c.h"

#define MOAT_CLIENT_FILE_CHUNK (1u << 20)    /* bytes per ReadFile/WriteFile */
#define MOAT_CLIENT_CREATE_TIMEOUT_MS 300000 /* a boot may retry once */

struct moat_client;

/* moat_client_open: a client of the gateway at `url` (ipc://, tcp://,
 * tls+tcp://; NULL: $MOAT_GATEWAY, else ipc://<state dir>/gateway.sock),
 * TLS from MOAT_TLS_* (moat_client_open_tls).
 * `auth` is the API key sent with every call (NULL or "": none; copied).
 * Does not contact the gateway: the first call does. On MOAT_OK *out is
 * the caller's (moat_client_close). */
int moat_client_open(struct moat_client **out, const char *url,
    const char *auth, char **errmsg) __attribute__((warn_unused_result));

/* TLS to the gateway (tls+tcp://). Each field NULL (or insecure false)
 * falls back to the environment: MOAT_TLS_CA, MOAT_TLS_CERT,
 * MOAT_TLS_KEY, MOAT_TLS_NAME, MOAT_INSECURE=1. */
struct moat_client_tls {
	const char *ca;          /* CAs trusted for the gateway (PEM) */
	const char *cert;        /* own certificate, when the gateway
	                            asks for one (optional) */
	const char *key;         /* its key */
	const char *server_name; /* the name in the gateway's
	                            certificate; default: the url's host */
	bool insecure;           /* allow plain tcp:// off loopback */
};

/* moat_client_open_tls: moat_client_open with TLS settings (tls NULL:
 * the environment only, as moat_client_open does). A tls+tcp:// url
 * needs a CA; a plain tcp:// url off loopback is refused unless
 * insecure. */
int moat_client_open_tls(struct moat_client **out, const char *url,
    const char *auth, const struct moat_client_tls *tls, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_client_rpc: the client's RPC connection (owned by c), for
 * callers that send raw Gateway calls (`moat mcp`). */
struct moat_rpc_client *moat_client_rpc(struct moat_client *c);

/* moat_client_close: safe on NULL; no call may be in flight. */
void moat_client_close(struct moat_client *c);

/* moat_client_url: the gateway url in use (owned by c). */
const char *moat_client_url(const struct moat_client *c);

/* moat_client_set_timeout: per-call timeout in ms for every later call
 * (0: MOAT_RPC_DEFAULT_TIMEOUT_MS; creates use at least
 * MOAT_CLIENT_CREATE_TIMEOUT_MS unless set explicitly here). */
void moat_client_set_timeout(struct moat_client *c, uint32_t timeout_ms);

/* moat_client_free_msg: frees any message returned by this library.
 * Safe on NULL. */
void moat_client_free_msg(void *msg);

/* ---- cluster ---- */

int moat_client_health(struct moat_client *c, Moat__V1__HealthReply **out,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_info: version, nodes and the health of every service. */
int moat_client_info(struct moat_client *c, Moat__V1__ClusterInfo **out,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_nodes: the nodes the gateway knows, available or not. */
int moat_client_nodes(struct moat_client *c, Moat__V1__NodeList **out,
    char **errmsg) __attribute__((warn_unused_result));

/* ---- sandboxes ---- */

/* moat_client_create: boots a sandbox (req may be NULL: all defaults).
 * The gateway places it on a node and sets its tenant. */
int moat_client_create(struct moat_client *c,
    const Moat__V1__CreateSandboxRequest *req, Moat__V1__Sandbox **out,
    char **errmsg) __attribute__((warn_unused_result));
int moat_client_get(struct moat_client *c, const char *sandbox_id,
    Moat__V1__Sandbox **out, char **errmsg)
    __attribute__((warn_unused_result));
int moat_client_list(struct moat_client *c, Moat__V1__SandboxList **out,
    char **errmsg) __attribute__((warn_unused_result));
int moat_client_destroy(struct moat_client *c, const char *sandbox_id,
    char **errmsg) __attribute__((warn_unused_result));
int moat_client_sandbox_info(struct moat_client *c, const char *sandbox_id,
    Moat__V1__GuestInfo **out, char **errmsg)
    __attribute__((warn_unused_result));

/* ---- exec ---- */

/* moat_client_exec: runs a program to the end and returns all of its
 * output (capped by req->output_cap or the node's default). */
int moat_client_exec(struct moat_client *c, const Moat__V1__ExecRequest *req,
    Moat__V1__ExecResult **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_exec_start: starts a program; read its output with
 * moat_client_exec_read. */
int moat_client_exec_start(struct moat_client *c,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecHandle **out,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_exec_read: output from the given offsets, waiting up to
 * req->wait_ms for some (long-poll). The call's timeout is the client's
 * plus wait_ms. */
int moat_client_exec_read(struct moat_client *c,
    const Moat__V1__ExecReadRequest *req, Moat__V1__ExecReadReply **out,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_exec_write: sends stdin bytes (data may be NULL when len is
 * 0) and closes stdin when `close`. */
int moat_client_exec_write(struct moat_client *c, const char *sandbox_id,
    uint64_t exec_id, const void *data, size_t len, bool close, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_exec_wait: waits up to wait_ms (0: the call's timeout) for
 * the program to end; *out->exited says whether it did. */
int moat_client_exec_wait(struct moat_client *c, const char *sandbox_id,
    uint64_t exec_id, uint32_t wait_ms, Moat__V1__ExecStatus **out,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_exec_kill: signals the program's process group (0:
 * SIGKILL). */
int moat_client_exec_kill(struct moat_client *c, const char *sandbox_id,
    uint64_t exec_id, int signal, char **errmsg)
    __attribute__((warn_unused_result));

/* ---- files ---- */

/* moat_client_read_file: the whole file at `path`, read in
 * MOAT_CLIENT_FILE_CHUNK pieces. Refuses (RESOURCE_EXHAUSTED) a file
 * larger than `max` bytes (0: no limit). On MOAT_OK *data is a heap
 * buffer of *len bytes plus a NUL (caller frees); *mode (optional) is
 * the file's mode. */
int moat_client_read_file(struct moat_client *c, const char *sandbox_id,
    const char *path, size_t max, uint8_t **data, size_t *len, uint32_t *mode,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_client_read_file_to_fd: streams the file to `fd` in pieces, so
 * any size works; *size (optional) gets the bytes written, *mode
 * (optional) the file's mode. A write error on fd is reported with its
 * errno's status. */
int moat_client_read_file_to_fd(struct moat_client *c, const char *sandbox_id,
    const char *path, int fd, uint64_t *size, uint32_t *mode, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_client_write_file: replaces the file at `path` with `len` bytes
 * (data may be NULL when len is 0), creating it with `mode` (0: 0644)
 * and, when make_parents, its directories. Sent in pieces; *out
 * (optional, may be NULL) is the final FileInfo. */
int moat_client_write_file(struct moat_client *c, const char *sandbox_id,
    const char *path, const void *data, size_t len, uint32_t mode,
    bool make_parents, Moat__V1__FileInfo **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_client_write_file_from_fd: the same, reading `fd` to its end. */
int moat_client_write_file_from_fd(struct moat_client *c,
    const char *sandbox_id, const char *path, int fd, uint32_t mode,
    bool make_parents, Moat__V1__FileInfo **out, char **errmsg)
    __attribute__((warn_unused_result));

/* ---- directories as tar archives (issue 17) ---- */
#define MOAT_CLIENT_ARCHIVE_CHUNK (4u << 20) /* bytes per Put/GetArchive */

/* moat_client_put_archive_fd: sends the tar archive in `fd` (a regular
 * file, from offset 0) in MOAT_CLIENT_ARCHIVE_CHUNK pieces with
 * PutArchive, to be checked and unpacked into `path`. *out (optional)
 * is the last reply (done, files, dirs, symlinks, bytes). */
int moat_client_put_archive_fd(struct moat_client *c, const char *sandbox_id,
    const char *path, int fd, Moat__V1__ArchivePutReply **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_client_get_archive_fd: GetArchive of `path` (a directory or file)
 * until eof, the archive written to `fd`; *size (optional) gets its
 * size. */
int moat_client_get_archive_fd(struct moat_client *c, const char *sandbox_id,
    const char *path, int fd, uint64_t *size, char **errmsg)
    __attribute__((warn_unused_result));

int moat_client_list_files(struct moat_client *c, const char *sandbox_id,
    const char *path, Moat__V1__FileList **out, char **errmsg)
    __attribute__((warn_unused_result));
int moat_client_stat(struct moat_client *c, const char *sandbox_id,
    const char *path, Moat__V1__FileInfo **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_remove: a file, or a directory (with its contents when
 * recursive). */
int moat_client_remove(struct moat_client *c, const char *sandbox_id,
    const char *path, bool recursive, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_mkdir: mode 0: 0755; parents: like mkdir -p. *out
 * optional. */
int moat_client_mkdir(struct moat_client *c, const char *sandbox_id,
    const char *path, uint32_t mode, bool parents, Moat__V1__FileInfo **out,
    char **errmsg) __attribute__((warn_unused_result));

/* ---- recorded sessions (issue 3) ---- */

/* moat_client_list_sessions: one page of the tenant's sessions, oldest
 * first; sandbox_id NULL or "": every sandbox's; page_token NULL or "":
 * the first page. */
int moat_client_list_sessions(struct moat_client *c, const char *sandbox_id,
    const char *page_token, Moat__V1__ListSessionsReply **out, char **errmsg)
    __attribute__((warn_unused_result));
int moat_client_get_session(struct moat_client *c, const char *session_id,
    Moat__V1__SessionInfo **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_get_session_tree: the session and the branches made from
 * it, depth first (issue 18). */
int moat_client_get_session_tree(struct moat_client *c, const char *session_id,
    Moat__V1__SessionTreeReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_list_steps: one page of a session's steps (outputs left
 * out unless include_outputs). */
int moat_client_list_steps(struct moat_client *c, const char *session_id,
    const char *page_token, bool include_outputs,
    Moat__V1__ListStepsReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_diff: where sessions `a` and `b` part, step by step, and
 * how their net effects on the filesystem differ. */
int moat_client_diff(struct moat_client *c, const char *a, const char *b,
    Moat__V1__DiffReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_list_audit: the newest `limit` (0: 100) entries of the
 * audit log of the caller's tenant, oldest first. */
int moat_client_list_audit(struct moat_client *c, uint32_t limit,
    Moat__V1__ListAuditReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_compare: scores of `n` sessions (2..32), best first. */
int moat_client_compare(struct moat_client *c, char *const *session_ids,
    size_t n, Moat__V1__CompareReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_export_session: the session and all its steps with their
 * outputs; as_json: the same as JSON text in (*out)->json instead. */
int moat_client_export_session(struct moat_client *c, const char *session_id,
    bool as_json, Moat__V1__ExportSessionReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_delete_session: deletes the session and the snapshots no
 * other session names; *out optional (the steps gone, the snapshots
 * deleted and the bytes they freed). Timeout as
 * moat_client_restore_step. */
int moat_client_delete_session(struct moat_client *c, const char *session_id,
    Moat__V1__DeleteSessionReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_set_step_keep: pins step `index` (from 1) of a session so
 * snapshot retention keeps its snapshot (keep false: unpins it); *out
 * optional (the step, without outputs). */
int moat_client_set_step_keep(struct moat_client *c, const char *session_id,
    uint64_t index, bool keep, Moat__V1__Step **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_client_set_sandbox_timeout: SetTimeout (issue 15): req's timeout_s from
 * now (0: the tenant's default when nothing else is asked), idle
 * timeout (clear_idle_timeout removes it); *out optional (the sandbox
 * with its new expires_unix_ms). */
int moat_client_set_sandbox_timeout(struct moat_client *c,
    const Moat__V1__SetTimeoutRequest *req, Moat__V1__Sandbox **out,
    char **errmsg) __attribute__((warn_unused_result));

/* ---- snapshots and time travel (issue 3) ---- */

/* moat_client_snapshot: snapshots a running sandbox on its node (paused
 * for the copy). On a recorded sandbox with the MANUAL policy it becomes
 * the snapshot of the latest step (step 0 before any). */
int moat_client_snapshot(struct moat_client *c, const char *sandbox_id,
    Moat__V1__LocalSnapshot **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_list_snapshots: the tenant's snapshots on every node. */
int moat_client_list_snapshots(struct moat_client *c,
    Moat__V1__LocalSnapshotList **out, char **errmsg)
    __attribute__((warn_unused_result));
int moat_client_delete_snapshot(struct moat_client *c, const char *snapshot_id,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_gc_snapshots: removes the tenant's snapshots nothing names
 * (dry_run: only lists them), sparing those younger than min_age_s (0:
 * 60 s). Timeout as moat_client_restore_step. */
int moat_client_gc_snapshots(struct moat_client *c, bool dry_run,
    uint32_t min_age_s, Moat__V1__GcSnapshotsReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_restore_step: brings a sandbox back to the state after
 * req->step of req->session_id from that step's snapshot; FAILED_
 * PRECONDITION when the step has none (the message lists those that
 * do). The timeout is the client's when set, else
 * MOAT_CLIENT_CREATE_TIMEOUT_MS (as creates). */
int moat_client_restore_step(struct moat_client *c,
    const Moat__V1__RestoreStepRequest *req, Moat__V1__RestoreStepReply **out,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_fork: req->count (1..16) new sandboxes from one step's
 * snapshot; each copy's outcome is in (*out)->copies. */
int moat_client_fork(struct moat_client *c, const Moat__V1__ForkRequest *req,
    Moat__V1__ForkReply **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_replay: re-runs the session's inputs in a fresh recorded
 * sandbox and counts the steps that came out the same. Timeout as
 * moat_client_restore_step. */
int moat_client_replay(struct moat_client *c,
    const Moat__V1__ReplayRequest *req, Moat__V1__ReplayReply **out,
    char **errmsg) __attribute__((warn_unused_result));

/* ---- code contexts ---- */

/* moat_client_run_code: runs req->code in the sandbox's named context
 * (a long-lived interpreter: state survives between runs). On MOAT_OK
 * *out (free with moat_client_free_msg) has the CodeResult, which says
 * whether the code raised. The call's timeout is the client's plus
 * req->timeout_ms, or the exec default when neither is set. */
int moat_client_run_code(struct moat_client *c,
    const Moat__V1__RunCodeRequest *req, Moat__V1__RunCodeResult **out,
    char **errmsg) __attribute__((warn_unused_result));
/* moat_client_close_context: ends a code context ("" : "default") and
 * its interpreter; NOT_FOUND when none of that name is open. */
int moat_client_close_context(struct moat_client *c, const char *sandbox_id,
    const char *context, char **errmsg) __attribute__((warn_unused_result));

/* moat_client_cordon_node: cordons (or, cordoned false, uncordons) node
 * `node_id` with `reason` (NULL: none); *out is the node's answer. An
 * operator call ([gateway] operator-tenants). */
int moat_client_cordon_node(struct moat_client *c, const char *node_id,
    bool cordoned, const char *reason, Moat__V1__Node **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_client_drain_node: cordons node `node_id` and moves each of its
 * sandboxes to `target` (NULL or "": placement picks), keeping ids. The
 * timeout is the client's when set, else 30 minutes. An operator call. */
#define MOAT_CLIENT_DRAIN_TIMEOUT_MS 1800000
int moat_client_drain_node(struct moat_client *c, const char *node_id,
    const char *target, const char *reason, Moat__V1__DrainNodeReply **out,
    char **errmsg) __attribute__((warn_unused_result));

/* ---- images (issue 17) ---- */

/* moat_client_start_image_build: starts building `req` (name, spec text,
 * the files its [files] section names) on a node; *out says where (pass
 * its id and node_id to moat_client_get_image_build). An operator call.
 * moat_client_get_image_build: the build's steps from `from_step` on,
 * waiting up to wait_ms (at most 30000) for a new one or the end; the
 * call's timeout allows for the wait. */
int moat_client_start_image_build(struct moat_client *c,
    const Moat__V1__ImageBuildRequest *req, Moat__V1__ImageBuild **out,
    char **errmsg) __attribute__((warn_unused_result));
int moat_client_get_image_build(struct moat_client *c, const char *build_id,
    const char *node_id, uint32_t from_step, uint32_t wait_ms,
    Moat__V1__ImageBuild **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_list_images: every image (`name` NULL or "": all) with
 * the nodes holding it and whether moat-snapd stores it. */
int moat_client_list_images(struct moat_client *c, const char *name,
    Moat__V1__ImageList **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_push_image: stores image `name` of node `node_id` (NULL or
 * "": any holding it) in moat-snapd. The timeout is the client's when
 * set, else MOAT_CLIENT_PUSH_TIMEOUT_MS. An operator call. */
#define MOAT_CLIENT_PUSH_TIMEOUT_MS 1800000
int moat_client_push_image(struct moat_client *c, const char *name,
    const char *node_id, Moat__V1__ImageInfo **out, char **errmsg)
    __attribute__((warn_unused_result));
/* moat_client_remove_image: removes image `name` from every node and
 * moat-snapd (refused while a sandbox uses it). An operator call. */
int moat_client_remove_image(struct moat_client *c, const char *name,
    Moat__V1__RemoveImageReply **out, char **errmsg)
    __attribute__((warn_unused_result));

#endif
