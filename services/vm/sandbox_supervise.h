/*
 * sandbox_supervise.h: watching a running sandbox (sandbox_supervise.c):
 * the supervisor thread, the guest link hooks, and relinks after a
 * snapshot. Not for: starting a VMM (sandbox_boot.h).
 */
#ifndef MOAT_VMD_SANDBOX_SUPERVISE_H
#define MOAT_VMD_SANDBOX_SUPERVISE_H

#include <stdint.h>

#include "guest_link.h"

struct sandbox;

/* The hooks every guest link of a sandbox is opened with (arg: sb). */
extern const struct guest_link_hooks vmd_sandbox_link_hooks;

/* vmd_sandbox_supervise: the supervisor thread of sb's current VMM
 * (arg: sb, started by the boot, joined by vmd_sandbox_vmm_teardown):
 * waits for the process, reaps it under sb->mu, and FAILs a sandbox
 * whose VM died while it ran. */
void *vmd_sandbox_supervise(void *arg);

/* vmd_exit_status_text: a waitpid status in words for a person, heap. */
char *vmd_exit_status_text(int status);

/* vmd_sandbox_relink_begin, vmd_sandbox_relink: around a snapshot whose
 * driver resets the agent's stream (vmm.h snapshot_resets_agent_link):
 * begin (SNAPSHOTTING -> RELINKING) makes a close of the link expected;
 * relink (after the snapshot, the VMM running) shuts the old link,
 * connects a new one and waits for its AgentReady until `deadline_ms`,
 * retrying while the new stream is also closed. Returns 0, or a status
 * with *why (heap) after which the caller fails the sandbox. Either way
 * the relink window ends (RELINKING -> SNAPSHOTTING). */
void vmd_sandbox_relink_begin(struct sandbox *sb);
int vmd_sandbox_relink(struct sandbox *sb, uint64_t deadline_ms, char **why)
    __attribute__((warn_unused_result));

#endif
