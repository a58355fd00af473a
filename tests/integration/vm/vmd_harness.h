/*
 * vmd_harness.h: what the tests that drive a real moat-vmd binary share
 * (tests/integration/vm/test_*.c and
 * tests/integration/firecracker/test_vmd_firecracker.c): starting a vmd
 * as a child on a state directory of the test's, waiting for it to answer
 * Health, calling its RPCs, creating and destroying a sandbox, stopping it
 * and looking at the processes it leaves. Every test keeps its own
 * command line and environment for vmd (the callback of vmd_spawn) and
 * its own checks. Not for: unit tests of vmd's code in process (those
 * link moat_vmd_core and use tests/unit/vm_lifecycle/fake_vmm.h).
 */
#ifndef MOAT_TESTS_VMD_HARNESS_H
#define MOAT_TESTS_VMD_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "moat/rpc.h"
#include "vm.pb-c.h"

/* The service every call names. */
#define VMD_SERVICE "moat.v1.Vm"
/* The tenant of every sandbox these tests make (Envelope.tenant). */
#define VMD_TENANT "default"

/* One running moat-vmd: its pid (0 when not running), state directory,
 * listen URL (ipc://<state>/vmd.sock), log file (<state>.log, its stdout
 * and stderr) and an RPC client connected to it. */
struct vmd_proc {
	pid_t pid;
	char state[300];
	char url[360];
	char log[360];
	struct moat_rpc_client *client;
};

/* The error message of the last vmd_call or vmd_call_as ("" on OK), for
 * failure messages. Not for: anything but the last call of this thread
 * (one buffer for the whole test). */
extern char vmd_last_err[4096];

/* Runs in the forked child of vmd_spawn with stdout and stderr already
 * going to v->log and SIGTERM set to come when the test dies: sets what
 * environment vmd needs and execs it (returning means the exec failed:
 * the child exits 127). */
typedef void (*vmd_exec_fn)(const struct vmd_proc *v, void *arg);

/* Fills v for state directory `state`, forks and runs exec_vmd(v, arg)
 * in the child, opens the client and polls Health (1 s a try, every 50
 * ms) until it answers; fails the test, with the log's tail, if vmd
 * exits or does not answer within health_ms. Not for: writing vmd's
 * config (the caller does that before, and names it in exec_vmd). */
void vmd_spawn(struct vmd_proc *v, const char *state, vmd_exec_fn exec_vmd,
    void *arg, uint32_t health_ms);

/* Stops v with SIGTERM and reaps it; returns the wait status (0: exited
 * 0; -1: not reaped), printing the log's tail when not 0. No-op (0) when
 * v is not running. Not for: a vmd that must die hard (SIGKILL it). */
int vmd_stop_status(struct vmd_proc *v);

/* vmd_stop_status, failing the test unless vmd exited 0 (it destroyed
 * its sandboxes, and no sanitizer reported anything). */
void vmd_stop(struct vmd_proc *v);

/* Prints the last `lines` lines of v's log to stderr under a header
 * naming it. Not for: reading the log (moat_read_file v->log). */
void vmd_log_tail(const struct vmd_proc *v, int lines);

/* One RPC of VMD_SERVICE for `tenant` (NULL: no Envelope.tenant) with
 * timeout_ms: returns the status; on OK *reply (when reply is not NULL)
 * is the caller's to free, else the reply is dropped. Sets
 * vmd_last_err. Not for: other services (snapd: moat_rpc_call). */
int vmd_call_as(struct vmd_proc *v, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **reply, uint32_t timeout_ms);

/* vmd_call_as for VMD_TENANT. */
int vmd_call(struct vmd_proc *v, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **reply, uint32_t timeout_ms);

/* CreateSandbox of the default image with memory_mib and scratch_mib
 * (nothing else set): the status, *out the sandbox on OK. Not for: a
 * request with labels, cold_boot or other fields (build it and
 * vmd_call "CreateSandbox"). */
int vmd_create_sandbox(struct vmd_proc *v, uint32_t memory_mib,
    uint64_t scratch_mib, Moat__V1__Sandbox **out, uint32_t timeout_ms);

/* vmd_create_sandbox that must work: on any other status the log's tail
 * goes to stderr and the test fails with the error. Returns the sandbox
 * (the caller frees it). Not for: a create that may be refused. */
Moat__V1__Sandbox *vmd_create_or_fail(struct vmd_proc *v, uint32_t memory_mib,
    uint64_t scratch_mib, uint32_t timeout_ms);

/* DestroySandbox of id; fails the test unless it is OK (60 s). */
void vmd_destroy_sandbox(struct vmd_proc *v, const char *id);

/* The directory (heap) of a template v made, one whose meta.pb is
 * written (<state>/templates/tpl-*), or NULL while there is none. Not
 * for: waiting for one (poll it). */
char *vmd_template_dir(const struct vmd_proc *v);

/* VmRSS of pid in KiB, or -1. */
long vmd_rss_kib(pid_t pid);

/* Live processes (zombies and this test aside) whose command line
 * mentions needle. Not for: waiting (poll it). */
int vmd_procs_mentioning(const char *needle);

/* Starts moat-snapd (next to MOAT_VMD_BIN in the build) on state
 * directory `dir` (made) listening on `url`, its stderr to <dir>.log,
 * and polls Health until it answers; fails the test if it does not.
 * Returns its pid. Not for: a snapd with TLS or a config file. */
pid_t vmd_snapd_spawn(const char *dir, const char *url);

/* Stops a vmd_snapd_spawn'd snapd with SIGTERM and reaps it; *pid = 0.
 * No-op when *pid is 0. */
void vmd_snapd_stop(pid_t *pid);

#endif
