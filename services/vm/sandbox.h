/*
 * sandbox.h: one sandbox on this node: the object (VMM process, guest
 * link, execs), its reference count and the node's table of them, and
 * its lifecycle, driven only through vmd_sandbox_step (the table is in
 * sandbox_state.h). sb->mu guards one sandbox's state and execs; take
 * vmd->mu before sb->mu, never the other way, and never hold either
 * across a guest call or a wait on another thread. Not for: booting
 * (sandbox_boot.h), supervision and relinks (sandbox_supervise.h),
 * creates (sandbox_create.h) or restores (sandbox_restore.h).
 */
#ifndef MOAT_VMD_SANDBOX_H
#define MOAT_VMD_SANDBOX_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "guest.pb-c.h"
#include "moat/rpc.h"
#include "node.h"
#include "sandbox_state.h"
#include "vm.pb-c.h"
#include "vmm.h"
#include "egress.h"
#include "lifetime_rules.h"

struct exec;
struct guest_link;

/* The label that turns on a test hook in the guest ([vmd] test-hooks). */
#define VMD_TEST_LABEL "moat.test"

/* A sandbox id: "sb-" and 16 hex digits. Its own type so it is never
 * mixed up with an exec id or a node id. */
struct sandbox_id {
	char str[24];
};

/* The shape of a sandbox: a create request's resolved sizes (also what
 * a template serves). */
struct vmd_shape {
	const char *image;
	uint32_t vcpus;
	uint32_t memory_mib;
	uint64_t scratch_mib;
};

/* Who handles the guest's messages that are not the agent's own
 * (exec output and exits): registered once, before serving, so the
 * sandbox layer never calls exec.c by name. */
struct vmd_guest_handler {
	/* on_message: one event of sandbox `sb`. Returns 0, or a status
	 * with *why (heap) when the guest broke the protocol (the link is
	 * then closed). Called on the link's reader thread, no lock held. */
	int (*on_message)(struct sandbox *sb, const Moat__V1__GuestMessage *m,
	    char **why);
	/* release: frees what on_message kept in sb (its last reference). */
	void (*release)(struct sandbox *sb);
};

/* The phases of one create or restore, in ms (proto CreateTimings). */
struct vmd_create_timings {
	const char *kind; /* "boot", "template", "restore"; NULL: none */
	double t0;        /* vmd_now_ms_exact() when the call began */
	double total_ms, prepare_ms, admit_ms, disk_ms, vmm_spawn_ms;
	double agent_connect_ms, reset_ms, boot_wait_ms, finish_ms;
	struct moat_vmm_timings vmm; /* resume's (vmm.h) */
};

/* The highest link_id_floor a restore takes: request ids never wrap. */
#define VMD_LINK_ID_FLOOR_MAX (UINT64_C(1) << 56)

struct sandbox {
	struct sandbox *next; /* vmd->sandboxes, under vmd->mu */
	struct vmd *vmd;
	int refs; /* under vmd->mu */
	/* Resource facts, not lifecycle: which table and which memory
	 * account hold it (a hidden sandbox runs unlisted; a restore in
	 * place swaps its way in). Under vmd->mu. */
	bool listed;          /* in vmd->sandboxes */
	bool memory_reserved; /* counted in vmd's memory_mib_reserved */
	bool ram_mapped;      /* restored with ram-sharing private: also in
	                         memory_mib_mapped (no RAM file in the RAM
	                         dir) */

	/* Fixed at creation; read without a lock. */
	struct sandbox_id id;
	char *dir;
	char *image;
	char *tenant;
	char **label_keys;
	char **label_values;
	size_t n_labels;
	char *test_mode; /* NULL unless a test hook is on */
	uint32_t vcpus;
	uint32_t memory_mib;
	uint64_t scratch_mib;
	uint32_t boot_timeout_ms;
	uint64_t created_unix_ms;
	char *template_id;       /* the template it was cloned from, or
	                              NULL (booted or restored) */
	char *restored_from;     /* the snapshot it was restored from, or
	                              NULL */
	uint64_t pulled_bytes;   /* from snapd by the restore that made it
	                        * (Sandbox.pulled_bytes); 0: none */
	char *ram_source;        /* a template clone's RAM source
	                              (vmd_template_ram), or NULL */
	char *ram_spare;         /* a template clone's ready RAM copy
	                              (vmd_template_take_spare), or NULL */
	struct moat_vmm *pooled; /* a template clone's pre-started VMM
	                              (pool.h), until its boot takes it as
	                              sb->vmm; heap, or NULL */
	bool from_pool;          /* its VMM came from the pool: its
	                              directory and disk are ready */
	struct guest_link *pooled_link; /* a pre-warmed pooled VMM's link
	                              (pool.h: its guest already runs and
	                              was reset once), until its boot takes
	                              it as sb->link; or NULL */
	bool prewarmed; /* its VMM came running from the pool: the
	                              restore only resets the guest */
	struct vmd_egress_policy *egress_policy; /* network "allowlist"
	                              (egress.h), or NULL: no network */
	struct vmd_egress *egress; /* its proxy thread while a VMM runs;
	                              under mu */
	bool keep_rng;       /* a restore in place or a drain's, not asked to
	                  reseed: the code contexts keep their recorded
	                  random generators (issue 18); any other restore
	                  or clone reseeds them */
	bool no_egress_port; /* restored from a snapshot taken before every
	                        VM had the egress port (its network unset):
	                        its VM has none, nor its snapshots */

	pthread_mutex_t mu;           /* guards everything below */
	pthread_cond_t cv;            /* any change below */
	enum sandbox_state lifecycle; /* only through vmd_sandbox_step */
	char *failure_reason;         /* heap, once FAILED */
	char accel[8];
	uint64_t boot_ms;
	/* Where the create or restore that made it spent its time
	 * (CreateTimings; issue 18); the creating thread's until it is
	 * RUNNING, then read under mu. */
	struct vmd_create_timings timings;

	/* Facts about the current VMM process and its supervisor thread,
	 * not the lifecycle: one boot may start several (a retry), and
	 * the lifecycle reacts to them through events. */
	struct moat_vmm vmm;
	bool vmm_exited;         /* reaped by the supervisor */
	int vmm_status;          /* waitpid status */
	bool supervisor_running; /* joinable */
	pthread_t supervisor;

	/* Facts about the current guest link, likewise: a relink replaces
	 * it while the sandbox stays RELINKING. */
	struct guest_link *link; /* NULL before connect */
	bool agent_ready;
	/* Paused by a snapshot's leave_paused (a drain moving it, issue
	 * 15): guest calls answer UNAVAILABLE until vmd_snapshot_resume or
	 * its destroy. Set before the snapshot pauses the VM. */
	bool paused_for_move;
	uint32_t ready_count; /* AgentReady messages seen, all links */
	bool link_closed;
	char *link_error;                  /* why the link closed, heap */
	bool relink_lost;                  /* a link closed while RELINKING */
	struct guest_link **retired_links; /* replaced by a relink: shut,
	                              fd closed, freed with the sandbox
	                              (an RPC may still hold one) */
	size_t n_retired_links;

	/* Set before the sandbox is served when a restarted vmd re-adopts
	 * it (adopt.c), then read without a lock: exec ids up to the floor
	 * belong to an earlier vmd (ExecWait/ExecRead answer UNAVAILABLE),
	 * and how many vmds re-adopted it (Sandbox.adoptions). */
	uint64_t exec_id_floor;
	/* Restored: the snapshot's LocalSnapshot.link_last_id. The new link
	 * numbers its requests above it, so an answer the captured guest
	 * still owed the snapshot's vmd is dropped, never taken for one of
	 * ours. Set before the VMM starts. */
	uint64_t link_id_floor; /* at most VMD_LINK_ID_FLOOR_MAX */
	uint32_t adoptions;
	bool vmm_adopted;      /* the VMM is not vmd's child: watched by
	                           pidfd, never reaped here */
	int supervise_stop_fd; /* eventfd: the supervisor returns without
	                           reaping (vmd stops, the VMM stays) */

	struct exec *execs; /* exec.c's */
	uint32_t execs_running;
	uint32_t execs_finished;
	uint64_t exec_finish_seq;

	/* Timeout and idle timeout (lifetime.h): under mu, but for
	 * life.last_active_unix_ms (atomics). */
	struct vmd_lifetime life;
};

/* vmd_sandbox_set_guest_handler: `h` (static) gets every sandbox's
 * guest events from now on. Call before serving. */
void vmd_sandbox_set_guest_handler(struct vmd *vmd,
    const struct vmd_guest_handler *h);

/* vmd_sandbox_step: applies `ev` to sb's lifecycle per the table;
 * sb->mu held. Wakes sb->cv waiters when the state moved. A refused
 * (illegal) event is logged and changes nothing. */
enum sandbox_step vmd_sandbox_step(struct sandbox *sb, enum sandbox_event ev);

/* vmd_sandbox_api_state: what the API shows for sb; sb->mu held. */
Moat__V1__SandboxState vmd_sandbox_api_state(const struct sandbox *sb);

/* vmd_sandbox_stop_asked: destroyed or aborted (ABORTING or STOPPED):
 * whoever waits on the VM gives up. sb->mu held. */
bool vmd_sandbox_stop_asked(const struct sandbox *sb);

/* vmd_sandbox_get: a referenced sandbox by id, or MOAT_NOT_FOUND after
 * moat_rpc_error (call may be NULL: no message). With a call, the lookup
 * is the call's tenant's (moat_rpc_tenant: INVALID_ARGUMENT without
 * one): another tenant's sandbox is NOT_FOUND, worded as a missing one.
 * Every sandbox-scoped RPC finds its sandbox here. */
int vmd_sandbox_get(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, struct sandbox **out) __attribute__((warn_unused_result));

/* vmd_sandbox_get_running: like get, but also refuses a sandbox that is
 * not RUNNING (FAILED_PRECONDITION with the failure reason, UNAVAILABLE
 * while it boots). */
int vmd_sandbox_get_running(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, struct sandbox **out) __attribute__((warn_unused_result));

/* vmd_sandbox_put: drops a reference; the last one frees the object. */
void vmd_sandbox_put(struct sandbox *sb);

/* vmd_sandbox_free: frees an object that never got a second reference
 * (a failed setup). */
void vmd_sandbox_free(struct sandbox *sb);

/* vmd_sandbox_validate: checks a create request (sizes, image name,
 * labels, test hooks, the image being built). Returns 0 or a status
 * after moat_rpc_error. *test_mode points into req (or NULL). */
int vmd_sandbox_validate(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, const char *image,
    const char **test_mode) __attribute__((warn_unused_result));

/* vmd_sandbox_alloc: a new BOOTING sandbox with one reference (the
 * caller's), in no table, nothing reserved; NULL when out of memory. */
struct sandbox *vmd_sandbox_alloc(struct vmd *vmd,
    const Moat__V1__CreateSandboxRequest *req, const char *image,
    const char *test_mode);

/* vmd_sandbox_unreserve: gives sb's memory back to the node (once). */
void vmd_sandbox_unreserve(struct sandbox *sb);

/* vmd_sandbox_fail_locked: FAIL with `reason` (copied; first reason
 * wins); kills the VMM and drops the guest's RAM file. sb->mu held.
 * Returns true when the state moved (the caller then unreserves,
 * unlocked). */
bool vmd_sandbox_fail_locked(struct sandbox *sb, const char *reason);

/* vmd_sandbox_fail: turns a RUNNING sandbox FAILED with `reason`
 * (copied) and kills its VMM. Thread-safe; first reason wins; ignored
 * while it boots (the boot waiter judges) and once stopped. */
void vmd_sandbox_fail(struct sandbox *sb, const char *reason);

/* vmd_sandbox_vmm_teardown: stops the current VMM (if any), joins its
 * supervisor, shuts the guest link down and releases the driver's
 * files. With `free_link` the link object goes too (only when no RPC
 * can hold it: during boot). */
void vmd_sandbox_vmm_teardown(struct sandbox *sb, bool free_link,
    const char *why);

/* vmd_sandbox_teardown: VMM, link, files, memory: all of it. */
void vmd_sandbox_teardown(struct sandbox *sb, const char *why);

/* vmd_sandbox_list_locked: puts sb in the table, which takes a
 * reference. vmd->mu held; the caller checked shutting_down. */
void vmd_sandbox_list_locked(struct sandbox *sb);

/* vmd_sandbox_unlist: takes sb out of the table (if it is there) and
 * drops the table's reference. */
void vmd_sandbox_unlist(struct sandbox *sb);

/* vmd_sandbox_swap_in: puts running `sb` in the table in place of `old`
 * (same id; the table's reference moves to sb). False when old is no
 * longer listed (destroyed meanwhile) or the node is shutting down. */
bool vmd_sandbox_swap_in(struct vmd *vmd, struct sandbox *old,
    struct sandbox *sb);

/* vmd_sandbox_destroy: stops the VMM, removes the sandbox's files and
 * forgets it. NOT_FOUND for an unknown id. */
int vmd_sandbox_destroy(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id) __attribute__((warn_unused_result));

/* vmd_sandbox_destroy_id: a destroy by the node itself (no call, any
 * tenant): MOAT_OK, or MOAT_NOT_FOUND when no sandbox has that id. */
int vmd_sandbox_destroy_id(struct vmd *vmd, const char *id,
    uint64_t request_id);

/* vmd_sandbox_destroy_unlisted: a destroy of sb, which the caller took
 * out of the table (its reference stays the caller's). */
void vmd_sandbox_destroy_unlisted(struct sandbox *sb, uint64_t request_id);

/* vmd_sandbox_destroy_all: at shutdown. Refuses new sandboxes first. */
void vmd_sandbox_destroy_all(struct vmd *vmd);

/* vmd_sandbox_destroy_hidden: tears down a sandbox in no table (a
 * template build's) and drops the caller's reference. */
void vmd_sandbox_destroy_hidden(struct sandbox *sb);

/* vmd_sandbox_abort: makes a booting or running sandbox give up (as a
 * destroy would) without unlisting it; its owner cleans up. */
void vmd_sandbox_abort(struct sandbox *sb);

/* vmd_sandbox_to_proto: fills `msg` (initialised by the caller) with
 * heap copies; the RPC server frees them. Returns 0 or MOAT_INTERNAL. */
int vmd_sandbox_to_proto(struct sandbox *sb, Moat__V1__Sandbox *msg)
    __attribute__((warn_unused_result));

#endif
