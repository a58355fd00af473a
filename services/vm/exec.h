/*
 * exec.h: processes in a sandbox (exec.c): the RPC handlers' work and
 * the bookkeeping of their output, fed by the guest events exec.c
 * registers for. Not for: files (files.h) or code contexts (code.h).
 *
 * Each takes the decoded request (borrowed) and fills `reply`, which the
 * RPC server initialised and frees: every field set is heap memory. On
 * failure each returns a status after moat_rpc_error(call, ...) and the
 * reply is left to the server. They block at most until the call's
 * deadline (vmd_call_deadline) and hold no lock while they wait on the
 * guest.
 */
#ifndef MOAT_VMD_EXEC_H
#define MOAT_VMD_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "moat/rpc.h"
#include "vm.pb-c.h"
#include "guest.pb-c.h"

struct sandbox;
struct vmd;
struct exec_waiter;

/* One exec's output stream: what was kept (at most cap bytes) and what
 * the program produced. */
struct exec_stream {
	uint8_t *buf; /* owned */
	size_t len;   /* bytes kept */
	size_t alloc;
	uint64_t cap;
	uint64_t received; /* bytes the guest sent for it */
	bool truncated;
	bool budget_cut; /* the node's exec output budget ran out: the
	                    marker was added and nothing more is kept */
};

/* One process started in a sandbox. Guarded by its sandbox's mu. */
struct exec {
	struct exec *next;
	uint64_t id; /* the guest request id of ExecStart */
	int32_t pid;
	bool started; /* ExecStarted came */
	bool pty;     /* under a pseudo-terminal: ExecResize applies */
	bool exited;
	int32_t exit_code;
	int32_t signal;
	bool timed_out;
	uint64_t duration_ms;
	uint64_t stdout_bytes; /* as the guest reported at exit */
	uint64_t stderr_bytes;
	uint64_t start_ms;         /* monotonic */
	uint64_t finish_seq;       /* order of exits, for eviction */
	struct exec_stream out[2]; /* STREAM_STDOUT, STREAM_STDERR */
	/* A one-shot Exec whose reply was deferred waits for this exec
	 * (exec.c's waiter); kept from eviction until it is answered. */
	struct exec_waiter *waiter;
	/* Deferred ExecWait / ExecRead calls watching this exec
	 * (exec_async.c): each output or exit kicks them; kept from
	 * eviction while any watches. */
	uint32_t watchers;
};

int vmd_exec_start(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecHandle *reply)
    __attribute__((warn_unused_result));
int vmd_exec_read(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecReadRequest *req, Moat__V1__ExecReadReply *reply)
    __attribute__((warn_unused_result));
/* vmd_exec_resize: a pty exec's new window size, passed to the agent. */
int vmd_exec_resize(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecResizeRequest *req)
    __attribute__((warn_unused_result));
int vmd_exec_write(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWriteRequest *req) __attribute__((warn_unused_result));
int vmd_exec_wait(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWaitRequest *req, Moat__V1__ExecStatus *reply)
    __attribute__((warn_unused_result));
int vmd_exec_kill(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecKillRequest *req) __attribute__((warn_unused_result));
int vmd_exec_run(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecResult *reply)
    __attribute__((warn_unused_result));

/* vmd_exec_run_on: vmd_exec_run in sandbox `sb` (a reference the caller
 * holds; req->sandbox_id is not looked up), also for sandboxes in no
 * table (the template builder's). */
int vmd_exec_run_on(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, Moat__V1__ExecResult *reply)
    __attribute__((warn_unused_result));

/* vmd_exec_on_message: exec output and exits of sandbox `sb`, as the
 * guest handler (see vmd_exec_register). Returns 0, or a status with
 * *why (heap) when the guest broke the protocol. Takes sb->mu. */
int vmd_exec_on_message(struct sandbox *sb, const Moat__V1__GuestMessage *m,
    char **why);

/* vmd_exec_free_all: frees every exec of a sandbox (last reference). */
void vmd_exec_free_all(struct sandbox *sb);

/* vmd_exec_stop: after the RPC server stopped: every one-shot Exec
 * still waiting (or queued to start) is answered UNAVAILABLE (its
 * outcome unknown) and its sandbox reference dropped; waits up to 5 s
 * for that. */
void vmd_exec_stop(void);

/* vmd_exec_register: makes exec.c the handler of every sandbox's exec
 * output and exits (vmd_sandbox_set_guest_handler). Call before
 * serving. */
void vmd_exec_register(struct vmd *vmd);

/* ---- shared by exec.c and exec_async.c only ---- */

/* What a one-shot exec still running at its call's deadline answers
 * (after it is killed). */
#define EXEC_DEADLINE_FMT                                                     \
	"exec %" PRIu64 " in sandbox %s still ran when the call's deadline "  \
	"came, and was killed: give the call a longer timeout than the "      \
	"exec's timeout_ms"

/* vmd_exec_find: exec `id` of sb, or NULL. sb->mu held. */
struct exec *vmd_exec_find(struct sandbox *sb, uint64_t id);

/* vmd_exec_evict: drops the oldest finished execs past the keep limit.
 * sb->mu held. */
void vmd_exec_evict(struct sandbox *sb);

/* vmd_exec_launch: registers and starts exec `req` in sb (the guest
 * round trip), its id and pid in *id, *pid; `default_timeout_ms` applies
 * when req->timeout_ms is 0. A status after moat_rpc_error on failure.
 * sb->mu not held. */
int vmd_exec_launch(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req, uint32_t default_timeout_ms,
    uint64_t *id, int32_t *pid);

/* vmd_exec_result_locked: the ExecResult of exited exec `e` into
 * `reply`; MOAT_OK or MOAT_INTERNAL (out of memory). sb->mu held. */
int vmd_exec_result_locked(const struct exec *e, Moat__V1__ExecResult *reply);

/* vmd_exec_signal: sends `sig` to exec `id`'s process group. sb->mu not
 * held. */
int vmd_exec_signal(struct sandbox *sb, struct moat_rpc_call *call,
    uint64_t id, int sig, uint64_t deadline_ms);

/* vmd_exec_waiters_kick: wakes the waiter thread (an exec with a waiter
 * exited). Any lock but the waiters'. */
void vmd_exec_waiters_kick(void);

/* vmd_exec_watch: defers an ExecWait (`wreq`) or a waiting ExecRead
 * (`rreq`, wait_ms > 0) that would block, so it holds no RPC worker:
 * the waiter thread answers it, as the call would have been answered,
 * once its exec has exited (ExecWait) or has output past the offsets
 * (ExecRead), its sandbox stopped, or its wait ended. False when the
 * call is answered at once by the caller: it would not block, or cannot
 * be deferred (a call built outside the server, no waiter thread). */
bool vmd_exec_watch(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ExecWaitRequest *wreq,
    const Moat__V1__ExecReadRequest *rreq);

/* vmd_exec_enqueue: defers the one-shot exec call and queues its launch;
 * false when it cannot be (a unit test's sandbox, a call built outside
 * the server, the waiter or launch threads missing, the queue full): the
 * caller then runs it on its own thread. */
bool vmd_exec_enqueue(struct sandbox *sb, struct moat_rpc_call *call,
    const Moat__V1__ExecRequest *req);

#endif
