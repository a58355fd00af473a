/*
 * vmd.h: moat-vmd's own model, shared by its files: the node (struct vmd,
 * its settings and sandbox table), a sandbox (VMM process, guest link,
 * execs), and the functions each file offers the others. Locks: vmd->mu
 * guards the sandbox table, refcounts and memory accounting; sb->mu
 * guards one sandbox's state and execs. Take vmd->mu before sb->mu, never
 * the other way, and never hold either across a guest call or a wait on
 * another thread. Not for: the RPC wire format (service.c maps it) or the
 * VMM's command line (drivers/).
 */
#ifndef MOAT_VMD_H
#define MOAT_VMD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.pb-c.h"
#include "guest.pb-c.h"
#include "vm.pb-c.h"
#include "moat/rpc.h"
#include "sync.h"
#include "vmm.h"
#include "driver.h"

struct guest_link;

/* Limits a client can reach; each is checked with a message naming it. */
#define VMD_MIN_MEMORY_MIB 128u
#define VMD_MIN_SCRATCH_MIB 64u
#define VMD_MAX_SCRATCH_MIB 65536u
#define VMD_DEFAULT_VCPUS 1u
#define VMD_DEFAULT_MEMORY_MIB 256u
#define VMD_DEFAULT_SCRATCH_MIB 1024u
#define VMD_DEFAULT_BOOT_TIMEOUT_MS 60000u
#define VMD_ACCEL_PROBE_MS 15000u
#define VMD_EXEC_DEFAULT_TIMEOUT_MS 300000u
#define VMD_EXEC_MAX_TIMEOUT_MS 86400000u      /* 24 h */
#define VMD_EXEC_DEFAULT_CAP (1u << 20)
#define VMD_EXEC_MAX_CAP (64u << 20)
#define VMD_EXEC_KEEP_FINISHED 32u
#define VMD_EXEC_MAX_RUNNING 256u
#define VMD_FILE_READ_MAX (8u << 20)

/* A sandbox id: "sb-" and 16 hex digits. Its own type so it is never
 * mixed up with an exec id or a node id. */
struct sandbox_id {
	char str[24];
};

struct vmd_config {
	char *state_dir;
	char *image_dir;
	char *cache_dir;
	char *listen_url;
	char *survey_url;          /* "" : no survey respondent */
	char *advertise_url;       /* Node.rpc_url; default listen_url */
	char *node_id;
	char *accel;               /* "auto", "kvm" or "tcg" */
	char *qemu_binary;
	char *kvm_device;          /* accel=auto checks that it opens */
	char *driver;              /* "auto", "qemu" or "firecracker" */
	char *firecracker_binary;
	bool test_hooks;
	uint32_t vcpus_total;
	uint64_t memory_mib_total;
	uint32_t max_vcpus;        /* per sandbox */
	uint32_t max_memory_mib;
	uint32_t boot_timeout_ms;
	char *snapd_url;           /* "" : snapshots stay local (no push) */
	bool templates;            /* creates clone the node's ready
	                              snapshot of the shape (templates.c) */
	uint32_t template_spares;  /* ready RAM copies kept per template in
	                              the RAM dir for clones to take (0:
	                              none; unused where it has reflinks) */
	char *ram_dir;             /* [vmd] ram-dir (ramdir.c) */
	uint64_t snapshot_ram_mib; /* [vmd] snapshot-ram-mib: RAM copies of
	                              snapshots kept in the RAM dir before
	                              the least used go to disk (snapram.c) */
};

/* The accelerator decision (accel.c). mu guards the rest. */
struct vmd_accel {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char decided[8];           /* "", "kvm", "tcg" */
	bool probing;              /* one boot is finding out */
};

struct sandbox;

struct vmd {
	struct vmd_config cfg;
	const struct moat_vmm_ops *vmm;
	const char *vmm_binary;    /* the chosen driver's binary (cfg) */
	char *vmm_version;         /* from probe */
	uint64_t started_ms;       /* monotonic */
	struct vmd_accel accel;
	pthread_mutex_t scratch_mu; /* one scratch template made at a time */
	struct moat_rpc_client *snapd; /* NULL without [vmd] snapd; owned */
	pthread_mutex_t fetch_mu;  /* one snapshot pulled from snapd at a time */

	struct vmd_templates *templates; /* templates.c; owned */
	struct vmd_snapram *snapram; /* snapram.c; owned */

	pthread_mutex_t mu;        /* guards the fields below */
	struct sandbox *sandboxes; /* singly linked, newest first */
	uint64_t memory_mib_reserved;
	bool shutting_down;
};

/* One exec's output stream: what was kept (at most cap bytes) and what
 * the program produced. */
struct exec_stream {
	uint8_t *buf;              /* owned */
	size_t len;                /* bytes kept */
	size_t alloc;
	uint64_t cap;
	uint64_t received;         /* bytes the guest sent for it */
	bool truncated;
};

/* One process started in a sandbox. Guarded by its sandbox's mu. */
struct exec {
	struct exec *next;
	uint64_t id;               /* the guest request id of ExecStart */
	int32_t pid;
	bool started;              /* ExecStarted came */
	bool exited;
	int32_t exit_code;
	int32_t signal;
	bool timed_out;
	uint64_t duration_ms;
	uint64_t stdout_bytes;     /* as the guest reported at exit */
	uint64_t stderr_bytes;
	uint64_t start_ms;         /* monotonic */
	uint64_t finish_seq;       /* order of exits, for eviction */
	struct exec_stream out[2]; /* STREAM_STDOUT, STREAM_STDERR */
};

struct sandbox {
	struct sandbox *next;      /* vmd->sandboxes, under vmd->mu */
	struct vmd *vmd;
	int refs;                  /* under vmd->mu */
	bool listed;               /* in vmd->sandboxes, under vmd->mu */
	bool memory_reserved;      /* counted in vmd's, under vmd->mu */

	/* Fixed at creation; read without a lock. */
	struct sandbox_id id;
	char *dir;
	char *image;
	char *tenant;
	char **label_keys;
	char **label_values;
	size_t n_labels;
	char *test_mode;           /* NULL unless a test hook is on */
	uint32_t vcpus;
	uint32_t memory_mib;
	uint64_t scratch_mib;
	uint32_t boot_timeout_ms;
	uint64_t created_unix_ms;
	char *template_id;         /* the template it was cloned from, or
	                              NULL (booted or restored) */
	char *restored_from;       /* the snapshot it was restored from, or
	                              NULL */
	char *ram_source;          /* a template clone's RAM source
	                              (vmd_template_ram), or NULL */
	char *ram_spare;           /* a template clone's ready RAM copy
	                              (vmd_template_take_spare), or NULL */

	pthread_mutex_t mu;        /* guards everything below */
	pthread_cond_t cv;         /* any change below */
	Moat__V1__SandboxState state;
	char *failure_reason;      /* heap, once FAILED */
	char accel[8];
	uint64_t boot_ms;
	bool destroying;           /* Destroy or shutdown asked */
	bool snapshotting;         /* a SnapshotSandbox is running on it */
	bool gone;                 /* torn down by the creating thread */
	struct moat_vmm vmm;
	bool vmm_exited;           /* reaped by the supervisor */
	int vmm_status;            /* waitpid status */
	bool supervisor_running;   /* joinable */
	pthread_t supervisor;
	struct guest_link *link;   /* NULL before connect */
	bool agent_ready;
	uint32_t ready_count;      /* AgentReady messages seen, all links */
	bool link_closed;
	char *link_error;          /* why the link closed, heap */
	bool relinking;            /* vmd_sandbox_relink: a link closing
	                              now is expected, not a failure */
	bool relink_lost;          /* one closed while relinking */
	struct guest_link **retired_links; /* replaced by a relink: shut,
	                              fd closed, freed with the sandbox
	                              (an RPC may still hold one) */
	size_t n_retired_links;
	struct exec *execs;
	uint32_t execs_running;
	uint32_t execs_finished;
	uint64_t exec_finish_seq;
};

/* ---- sandbox.c ---- */

/* vmd_sandbox_create: validates `req`, boots a sandbox and waits for its
 * agent; with [vmd] templates and no req->cold_boot, a clone of the
 * template of its shape when there is one (Sandbox.template_id), and
 * after a cold boot the template is made in the background. On success
 * *out holds a reference (vmd_sandbox_put). On failure returns a status
 * after moat_rpc_error(call, ...); nothing is left. */
int vmd_sandbox_create(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, struct sandbox **out)
    __attribute__((warn_unused_result));

/* vmd_sandbox_restore: a new sandbox (a clone) from local snapshot
 * req->snapshot_id: same contract as vmd_sandbox_create. With
 * req->replace_sandbox_id the clone takes over that sandbox's id (same
 * tenant, else NOT_FOUND) and the old VM is stopped once the new one
 * runs; on failure the old one is left as it was. */
int vmd_sandbox_restore(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct sandbox **out)
    __attribute__((warn_unused_result));

/* vmd_sandbox_get: a referenced sandbox by id, or MOAT_NOT_FOUND after
 * moat_rpc_error (call may be NULL: no message). */
int vmd_sandbox_get(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, struct sandbox **out) __attribute__((warn_unused_result));

/* vmd_sandbox_get_running: like get, but also refuses a sandbox that is
 * not RUNNING (FAILED_PRECONDITION with the failure reason, UNAVAILABLE
 * while it boots). */
int vmd_sandbox_get_running(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, struct sandbox **out) __attribute__((warn_unused_result));

/* vmd_sandbox_put: drops a reference; the last one frees the object. */
void vmd_sandbox_put(struct sandbox *sb);

/* vmd_sandbox_destroy: stops the VMM, removes the sandbox's files and
 * forgets it. NOT_FOUND for an unknown id. */
int vmd_sandbox_destroy(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id) __attribute__((warn_unused_result));

/* vmd_sandbox_destroy_all: at shutdown. Refuses new sandboxes first. */
void vmd_sandbox_destroy_all(struct vmd *vmd);

/* vmd_sandbox_to_proto: fills `msg` (initialised by the caller) with
 * heap copies; the RPC server frees them. Returns 0 or MOAT_INTERNAL. */
int vmd_sandbox_to_proto(struct sandbox *sb, Moat__V1__Sandbox *msg)
    __attribute__((warn_unused_result));

/* vmd_sandbox_fail: turns a RUNNING or CREATING sandbox FAILED with
 * `reason` (copied) and kills its VMM. Thread-safe; first reason wins. */
void vmd_sandbox_fail(struct sandbox *sb, const char *reason);

/* vmd_sandbox_relink_begin, vmd_sandbox_relink: around a snapshot whose
 * driver resets the agent's stream (vmm.h snapshot_resets_agent_link):
 * begin makes a close of the link expected; relink (after the snapshot,
 * the VMM running) shuts the old link, connects a new one and waits for
 * its AgentReady until `deadline_ms`, retrying while the new stream is
 * also closed. Returns 0, or a status with *why (heap) after which the
 * caller fails the sandbox. Either way the relink window ends. The caller
 * holds the sandbox as snapshotting, so no other relink runs. */
void vmd_sandbox_relink_begin(struct sandbox *sb);
int vmd_sandbox_relink(struct sandbox *sb, uint64_t deadline_ms,
    char **why) __attribute__((warn_unused_result));

/* vmd_reap_orphans: at start, before serving: removes what an earlier
 * vmd left in <state>/vms. */
void vmd_reap_orphans(struct vmd *vmd);

/* vmd_console_tail: the last `lines` lines of a console log as a heap
 * string (non-printable bytes replaced), "" when empty. Caller frees. */
char *vmd_console_tail(const char *path, int lines);

/* vmd_image_stamp: "<size>.<mtime ns>" of each of the image's files, so a
 * snapshot can tell that its image was rebuilt since (heap; NULL when a
 * file is missing or on allocation failure). */
char *vmd_image_stamp(const struct vmd *vmd, const char *image);

/* vmd_image_path: <image-dir>/<image>/<file>, heap. */
char *vmd_image_path(const struct vmd *vmd, const char *image,
    const char *file);

/* vmd_images_list: names of the images present (heap array of heap
 * strings, caller frees both). */
int vmd_images_list(const struct vmd *vmd, char ***names, size_t *n);

/* ---- accel.c ---- */

/* vmd_accel_init: sets up the decision from cfg.accel. */
void vmd_accel_init(struct vmd *vmd);

/* vmd_accel_choose: the accelerator for the next boot. When *probe is set
 * on return, this boot is the KVM probe: the caller boots with "kvm" and a
 * short deadline, then must call vmd_accel_settle with what happened.
 * Other callers wait here while a probe runs. `kernel` is the image's
 * kernel (part of the cache key). Returns "kvm" or "tcg" (static). */
const char *vmd_accel_choose(struct vmd *vmd, const char *kernel,
    bool *probe);

/* vmd_accel_settle: ends a probe. `kvm_works`: the guest answered.
 * `known`: false when the probe ended for an unrelated reason (the
 * sandbox was destroyed): nothing is decided and the next boot probes. */
void vmd_accel_settle(struct vmd *vmd, const char *kernel, bool known,
    bool kvm_works);

/* vmd_accel_current: "", "kvm" or "tcg" into buf. */
void vmd_accel_current(struct vmd *vmd, char buf[8]);

/* ---- exec.c, files.c: the RPC handlers' work ----
 * Each takes the decoded request (borrowed) and fills `reply`, which the
 * RPC server initialised and frees: every field set is heap memory. On
 * failure each returns a status after moat_rpc_error(call, ...) and the
 * reply is left to the server. They block at most until the call's
 * deadline (vmd_call_deadline) and hold no lock while they wait on the
 * guest. */

/* ---- exec.c ---- */

int vmd_exec_start(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecHandle *reply)
    __attribute__((warn_unused_result));
int vmd_exec_read(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecReadRequest *req, Moat__V1__ExecReadReply *reply)
    __attribute__((warn_unused_result));
int vmd_exec_write(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWriteRequest *req)
    __attribute__((warn_unused_result));
int vmd_exec_wait(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWaitRequest *req, Moat__V1__ExecStatus *reply)
    __attribute__((warn_unused_result));
int vmd_exec_kill(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecKillRequest *req)
    __attribute__((warn_unused_result));
int vmd_exec_run(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecResult *reply)
    __attribute__((warn_unused_result));

/* vmd_exec_run_on: vmd_exec_run in sandbox `sb` (a reference the caller
 * holds; req->sandbox_id is not looked up), also for sandboxes in no
 * table (the template builder's). */
int vmd_exec_run_on(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecResult *reply)
    __attribute__((warn_unused_result));

/* vmd_exec_on_message: the guest link's event hook for exec_output and
 * exec_exit of sandbox `sb`. Returns 0, or a status with *why (heap) when
 * the guest broke the protocol. Takes sb->mu. */
int vmd_exec_on_message(struct sandbox *sb, const Moat__V1__GuestMessage *m,
    char **why);

/* vmd_exec_free_all: frees every exec of a sandbox (last reference). */
void vmd_exec_free_all(struct sandbox *sb);

/* ---- code.c: persistent code contexts ---- */

/* vmd_code_run: RunCode; one CodeRun to the agent, answered with the
 * cell's CodeResult (reply->result, heap, the server frees it). */
int vmd_code_run(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RunCodeRequest *req, Moat__V1__RunCodeResult *reply)
    __attribute__((warn_unused_result));
/* vmd_code_close: CloseCodeContext; NOT_FOUND when no such context. */
int vmd_code_close(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CodeContextCall *req) __attribute__((warn_unused_result));

/* ---- files.c ---- */

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

/* ---- survey.c ---- */

/* vmd_node_fill: NodeInfo / survey answer, heap fields. */
int vmd_node_fill(struct vmd *vmd, Moat__V1__Node *node)
    __attribute__((warn_unused_result));

struct vmd_survey;

/* vmd_survey_start: dials `url` as an nng respondent and answers each
 * survey with this node. *out is the caller's (vmd_survey_stop). */
int vmd_survey_start(struct vmd *vmd, const char *url,
    struct vmd_survey **out, char **errmsg)
    __attribute__((warn_unused_result));
void vmd_survey_stop(struct vmd_survey *s);

/* ---- service.c ---- */

/* vmd_service: the Vm service with its method table; ctx = vmd. */
void vmd_service(struct vmd *vmd, struct moat_rpc_service *svc);

/* ---- snapshot.c: local snapshots under <state>/snapshots ---- */

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
int vmd_snapshot_list(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ListLocalSnapshotsRequest *req,
    Moat__V1__LocalSnapshotList *reply) __attribute__((warn_unused_result));
int vmd_snapshot_delete(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__LocalSnapshotRef *req)
    __attribute__((warn_unused_result));

/* vmd_snapshot_make: snapshots running sandbox `sb` (a reference the
 * caller keeps) as snapshot `id` into directory `dir` (absent: written
 * as dir.tmp and renamed when complete; on failure nothing is left).
 * `is_template` marks a node template: never pushed to snapd. Fills
 * `reply` (may be NULL; heap fields, the caller's message frees them).
 * A full file system is RESOURCE_EXHAUSTED naming dir's parent. Errors
 * go through moat_rpc_error(call, ...); the sandbox keeps running. */
int vmd_snapshot_make(struct vmd *vmd, struct moat_rpc_call *call,
    struct sandbox *sb, const char *id, const char *dir, bool is_template,
    const Moat__V1__SnapshotSandboxRequest *req,
    Moat__V1__LocalSnapshot *reply) __attribute__((warn_unused_result));

/* vmd_snapshot_remove_dir: removes a snapshot directory and the RAM copy
 * its "ram" link points to (warns on failure). */
void vmd_snapshot_remove_dir(const char *dir);

/* vmd_snapshot_read_meta: <dir>/meta.pb. Returns 0 with *meta (caller
 * frees with moat__v1__local_snapshot__free_unpacked) or an errno. */
int vmd_snapshot_read_meta(const char *dir, Moat__V1__LocalSnapshot **meta)
    __attribute__((warn_unused_result));

/* vmd_snapshot_write_meta: replaces <dir>/meta.pb atomically. Returns 0
 * or an errno value. */
int vmd_snapshot_write_meta(const char *dir,
    const Moat__V1__LocalSnapshot *meta) __attribute__((warn_unused_result));

/* ---- templates.c: the node's ready snapshots, one per shape ---- */

/* The shape a template serves: a create request's resolved sizes. */
struct vmd_shape {
	const char *image;
	uint32_t vcpus;
	uint32_t memory_mib;
	uint64_t scratch_mib;
};

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

/* vmd_sandbox_create_hidden: boots a sandbox of `shape` that is in no
 * table (no id a client can name), for the template builder. Same
 * contract as vmd_sandbox_create; release with vmd_sandbox_destroy_hidden.
 * Before booting it stores the sandbox in *slot under slot_mu with a
 * reference of the slot's own (the caller clears the slot and puts it,
 * success or not), so another thread can vmd_sandbox_abort it. */
int vmd_sandbox_create_hidden(struct vmd *vmd, struct moat_rpc_call *call,
    const struct vmd_shape *shape, pthread_mutex_t *slot_mu,
    struct sandbox **slot, struct sandbox **out)
    __attribute__((warn_unused_result));
void vmd_sandbox_destroy_hidden(struct sandbox *sb);

/* vmd_sandbox_abort: makes a booting or running sandbox give up (as a
 * destroy would) without unlisting it; its owner cleans up. */
void vmd_sandbox_abort(struct sandbox *sb);

/* ---- snapshot_push.c: local snapshots to and from moat-snapd ---- */

/* What a push to snapd left (the caller owns the strings: free). */
struct vmd_push_result {
	char *remote_id;           /* NULL when not stored */
	char *error;               /* NULL when stored */
	uint64_t stored_bytes;
	uint64_t logical_bytes;
};

/* vmd_snapshot_push: pushes the complete snapshot directory `dir`
 * (described by *meta) to vmd->snapd as one manifest with parent
 * `parent_id` ("" : none). Never fails the snapshot: a snapd that is
 * down, full or refuses leaves res->error. Blocking (seconds for a first
 * push of a large RAM file); call after the sandbox resumed. */
void vmd_snapshot_push(struct vmd *vmd, uint64_t request_id,
    const Moat__V1__LocalSnapshot *meta, const char *dir,
    const char *parent_id, struct vmd_push_result *res);

/* vmd_snapshot_pull_ram: writes the RAM of snapshot *meta (stored in
 * snapd as meta->remote_id) to the new file `path` from its chunks, every
 * one verified, several GetChunks in flight. Returns MOAT_OK or a status
 * with *errmsg (heap); on failure `path` is not left. Blocking. */
int vmd_snapshot_pull_ram(struct vmd *vmd,
    const Moat__V1__LocalSnapshot *meta, const char *path, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_snapshot_delete_remote: deletes snapd snapshot `remote_id` of
 * `tenant` ("" : "default"); a snapshot already gone is fine. Returns
 * MOAT_OK or a status with *errmsg (heap). */
int vmd_snapshot_delete_remote(struct vmd *vmd, const char *tenant,
    const char *remote_id, uint64_t *freed_bytes, char **errmsg)
    __attribute__((warn_unused_result));

/* vmd_snapshot_fetch: pulls snapd snapshot `id` of `tenant` ("" :
 * "default") into directory `dir` (absent; made via dir.tmp and a
 * rename), verifying every chunk. Returns MOAT_OK, or sets the call's
 * error: NOT_FOUND, DATA_LOSS naming the snapshot for a corrupt chunk,
 * UNAVAILABLE when snapd does not answer. */
int vmd_snapshot_fetch(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, const char *tenant, const char *dir)
    __attribute__((warn_unused_result));

/* vmd_snapshot_open: snapshot `id`'s catalog entry (*meta, caller frees
 * with moat__v1__local_snapshot__free_unpacked) and directory (*dir,
 * heap). A snapshot of another tenant (when `tenant` is not "") is
 * NOT_FOUND. Errors go through moat_rpc_error. */
int vmd_snapshot_open(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, const char *tenant, Moat__V1__LocalSnapshot **meta,
    char **dir) __attribute__((warn_unused_result));

/* ---- scratch.c ---- */

/* vmd_scratch_make: creates the sparse ext4 scratch disk `path` of `mib`
 * MiB (labelled moat-scratch) by copying the allocated extents of a
 * template kept in the state dir (made once per size with mkfs.ext4).
 * Returns 0 or a status with *errmsg (heap). */
int vmd_scratch_make(struct vmd *vmd, const char *path, uint64_t mib,
    char **errmsg) __attribute__((warn_unused_result));

#endif
