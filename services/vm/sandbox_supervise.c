/*
 * sandbox_supervise.c: watching a sandbox that runs: the supervisor
 * thread that turns a dead VMM into a FAILED sandbox (with the console's
 * and the VMM's last words), the guest link's hooks (agent ready, guest
 * events handed to the registered handler, a lost link), and the new
 * guest link after a snapshot that reset the old one (RELINKING). Not
 * for: starting the VMM (sandbox_boot.c) or what a guest event means
 * (exec.c registers for those).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

#include "console.h"
#include "guest_link.h"
#include "image.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "ramdir.h"
#include "sandbox.h"
#include "sandbox_supervise.h"
#include "sync.h"
#include "vmhost.h"

char *
vmd_exit_status_text(int status)
{
	if (WIFEXITED(status))
		return moat_asprintf("exit status %d", WEXITSTATUS(status));
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS)
		return moat_asprintf(
		    "killed by signal %d (%s): the VMM "
		    "touched guest RAM that its file in %s could not back, "
		    "most likely because that filesystem is full",
		    SIGBUS, strsignal(SIGBUS), vmd_ram_dir());
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
		return moat_asprintf(
		    "killed by signal %d (%s): by the "
		    "host's out-of-memory killer or by someone on the host",
		    SIGKILL, strsignal(SIGKILL));
	if (WIFSIGNALED(status))
		return moat_asprintf("killed by signal %d (%s)",
		    WTERMSIG(status), strsignal(WTERMSIG(status)));
	return moat_asprintf("status %d", status);
}

/* Waits until the VMM process `pid` ends, without reaping it, or until
 * vmd detaches from it (sb->supervise_stop_fd). Returns false on detach.
 * A pidfd serves vmd's own children and adopted VMMs alike; without one
 * (an old kernel) a child is waited for by waitid. */
static bool
supervise_wait(struct sandbox *sb, pid_t pid)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	siginfo_t si;

	if (pidfd < 0 && sb->vmm_adopted)
		return true; /* ESRCH: gone already */
	if (pidfd < 0) {
		while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) != 0 &&
		    errno == EINTR)
			;
		return true;
	}
	for (;;) {
		struct pollfd p[2] = {
			{ .fd = pidfd, .events = POLLIN },
			{ .fd = sb->supervise_stop_fd, .events = POLLIN },
		};

		if (poll(p, sb->supervise_stop_fd >= 0 ? 2 : 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			vmd_sleep_ms(10);
			continue;
		}
		if (p[0].revents != 0)
			break;
		if (p[1].revents != 0) {
			close(pidfd);
			return false;
		}
	}
	close(pidfd);
	return true;
}

/* Waits for the VMM process without reaping it, then reaps it under
 * sb->mu, so a stop() under the lock never signals a recycled pid. An
 * adopted VMM is not vmd's child: its status goes to its new parent. */
void *
vmd_sandbox_supervise(void *arg)
{
	struct sandbox *sb = arg;
	pid_t pid = sb->vmm.pid;
	int status = 0;
	char *console = NULL;
	char *vmm_said = NULL;
	char *how = NULL;
	char *reason = NULL;
	bool changed = false;

	if (!supervise_wait(sb, pid))
		return NULL;
	/* Its last words may still be in the console pipe: let the
	 * drainer write them before the tail is read. */
	vmd_console_settle(sb->vmm.console, 200);
	console = vmd_log_tail(sb->vmm.console_log, VMD_CONSOLE_LINES);
	/* Why a VMM died is in its own log more than on the console
	 * (Firecracker's logger file, QEMU's stderr). */
	if (sb->vmm.vmm_log != NULL &&
	    (sb->vmm.console_log == NULL ||
	        strcmp(sb->vmm.vmm_log, sb->vmm.console_log) != 0))
		vmm_said = vmd_log_tail(sb->vmm.vmm_log, VMD_CONSOLE_LINES);
	pthread_mutex_lock(&sb->mu);
	if (!sb->vmm_adopted)
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
	sb->vmm_exited = true;
	sb->vmm_status = status;
	how = sb->vmm_adopted ?
	    strdup("its exit status went elsewhere: it was started by an "
	           "earlier vmd") :
	    vmd_exit_status_text(status);
	if (vmd_sandbox_state_live(sb->lifecycle)) {
		reason = moat_asprintf("the VM exited unexpectedly (%s%s%s); "
		                       "last console lines:\n%s%s%s%s%s",
		    how ? how : "?", sb->link_error ? "; " : "",
		    sb->link_error ? sb->link_error : "",
		    console ? console : "",
		    vmm_said && vmm_said[0] ? "\nlast lines of the VMM's log "
		                              "(" :
		                              "",
		    vmm_said && vmm_said[0] ? sb->vmm.vmm_log : "",
		    vmm_said && vmm_said[0] ? "):\n" : "",
		    vmm_said ? vmm_said : "");
		changed = vmd_sandbox_fail_locked(sb,
		    reason ? reason : "the VM exited unexpectedly");
	}
	pthread_cond_broadcast(&sb->cv);
	pthread_mutex_unlock(&sb->mu);
	if (changed)
		vmd_sandbox_unreserve(sb);
	moat_debug(0, "sandbox %s: VMM pid %d ended (%s)", sb->id.str,
	    (int)pid, how ? how : "?");
	free(how);
	free(reason);
	free(console);
	free(vmm_said);
	return NULL;
}

/* ---- guest link hooks ---- */

static void
hook_ready(void *arg, const Moat__V1__AgentReady *ready)
{
	struct sandbox *sb = arg;

	pthread_mutex_lock(&sb->mu);
	sb->agent_ready = true;
	sb->ready_count++;
	pthread_cond_broadcast(&sb->cv);
	pthread_mutex_unlock(&sb->mu);
	moat_debug(0,
	    "sandbox %s: agent %s ready (guest uptime %" PRIu64
	    " ms, kernel %s)",
	    sb->id.str, ready->agent_version, ready->boot_ms, ready->kernel);
}

static int
hook_event(void *arg, const Moat__V1__GuestMessage *msg, char **why)
{
	struct sandbox *sb = arg;
	const struct vmd_guest_handler *h = sb->vmd->guest_handler;

	/* No handler (a test without execs): nothing to keep. */
	return h != NULL ? h->on_message(sb, msg, why) : 0;
}

static void
hook_closed(void *arg, bool violation, const char *reason)
{
	struct sandbox *sb = arg;
	uint64_t until = moat_rpc_now_ms() + 1000;
	char *msg = NULL;
	bool changed = false;

	pthread_mutex_lock(&sb->mu);
	/* Paused after a snapshot that reset the stream (leave_paused):
	 * the unpause relinks (vmd_snapshot_unpause). */
	if (!violation &&
	    (sb->lifecycle == SANDBOX_RELINKING ||
	        (sb->paused_for_move &&
	            sb->vmd->vmm->snapshot_resets_agent_link))) {
		/* The snapshot reset the stream; vmd_sandbox_relink replaces
		 * it (and retries if the new one is the one that closed). */
		sb->relink_lost = true;
		pthread_cond_broadcast(&sb->cv);
		pthread_mutex_unlock(&sb->mu);
		return;
	}
	sb->link_closed = true;
	if (sb->link_error == NULL)
		sb->link_error = strdup(reason);
	pthread_cond_broadcast(&sb->cv);
	if (!vmd_sandbox_state_live(sb->lifecycle)) {
		/* Booting: the boot waiter sees link_closed. */
		pthread_mutex_unlock(&sb->mu);
		return;
	}
	if (violation) {
		msg = moat_asprintf("%s; the sandbox was stopped", reason);
	} else {
		/* Usually the VMM just died: let the supervisor say how. */
		while (!sb->vmm_exited &&
		    vmd_cond_wait_until(&sb->cv, &sb->mu, until) == 0)
			;
		if (!sb->vmm_exited)
			msg =
			    moat_asprintf("%s while the VM kept running; the "
			                  "sandbox was stopped",
			        reason);
	}
	if (msg != NULL)
		changed = vmd_sandbox_fail_locked(sb, msg);
	pthread_mutex_unlock(&sb->mu);
	if (changed)
		vmd_sandbox_unreserve(sb);
	free(msg);
}

const struct guest_link_hooks vmd_sandbox_link_hooks = {
	.ready = hook_ready,
	.event = hook_event,
	.closed = hook_closed,
};

/* ---- a new guest link after a snapshot ---- */

void
vmd_sandbox_relink_begin(struct sandbox *sb)
{
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_RELINK_BEGIN);
	sb->relink_lost = false;
	pthread_mutex_unlock(&sb->mu);
}

/* One try at a new link: connects and waits for its AgentReady until
 * `deadline_ms`, then swaps it in (RELINKING -> SNAPSHOTTING). Returns
 * MOAT_OK; MOAT_UNAVAILABLE to try again (not listening yet, or the new
 * stream closed or stayed silent; *err says which); another status with
 * *err when it cannot work. */
static int
relink_try(struct sandbox *sb, struct guest_link *old, uint64_t deadline_ms,
    char **err)
{
	const struct moat_vmm_ops *ops = sb->vmd->vmm;
	struct guest_link *link = NULL;
	uint32_t seen;
	int fd = -1;
	int rv;

	rv = ops->connect_agent(&sb->vmm, &fd, err);
	if (rv == MOAT_UNAVAILABLE)
		vmd_sleep_ms(10);
	if (rv != MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	seen = sb->ready_count;
	sb->relink_lost = false;
	pthread_mutex_unlock(&sb->mu);
	if ((rv = guest_link_open(&link, fd, 0, &vmd_sandbox_link_hooks, sb,
	         err)) != MOAT_OK)
		return rv == MOAT_UNAVAILABLE ? MOAT_INTERNAL : rv;
	/* Exec ids are request ids: never one an exec had before. */
	guest_link_continue_ids(link, old);
	pthread_mutex_lock(&sb->mu);
	while (sb->ready_count == seen && !sb->relink_lost &&
	    !sb->vmm_exited && !vmd_sandbox_stop_asked(sb) &&
	    vmd_cond_wait_until(&sb->cv, &sb->mu, deadline_ms) == 0)
		;
	if (sb->ready_count != seen && !sb->relink_lost) {
		sb->retired_links[sb->n_retired_links++] = old;
		sb->link = link;
		sb->link_closed = false;
		free(sb->link_error);
		sb->link_error = NULL;
		(void)vmd_sandbox_step(sb, SANDBOX_EV_RELINK_END);
		pthread_mutex_unlock(&sb->mu);
		moat_debug(0, "sandbox %s: new guest link after the snapshot",
		    sb->id.str);
		return MOAT_OK;
	}
	pthread_mutex_unlock(&sb->mu);
	/* Reset too (the guest saw the reset late), or silent: no RPC has
	 * seen this link, so it can go at once. */
	guest_link_shutdown(link, NULL);
	guest_link_free(link);
	*err = strdup("the new link closed before AgentReady");
	return MOAT_UNAVAILABLE;
}

int
vmd_sandbox_relink(struct sandbox *sb, uint64_t deadline_ms, char **why)
{
	struct guest_link *old;
	struct guest_link **grown;
	char *err = NULL;
	int rv;

	*why = NULL;
	pthread_mutex_lock(&sb->mu);
	old = sb->link;
	/* Room for the old link first: the swap cannot fail. */
	grown = realloc(sb->retired_links,
	    (sb->n_retired_links + 1) * sizeof(*grown));
	if (grown != NULL)
		sb->retired_links = grown;
	pthread_mutex_unlock(&sb->mu);
	if (grown == NULL) {
		*why = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto out;
	}
	/* Whatever the guest still says on the old stream is from before
	 * the reset; calls still on it fail UNAVAILABLE. */
	guest_link_shutdown(old, "the snapshot reset the guest link");
	guest_link_close_fd(old);
	for (;;) {
		bool stop;

		pthread_mutex_lock(&sb->mu);
		stop = sb->vmm_exited || vmd_sandbox_stop_asked(sb);
		pthread_mutex_unlock(&sb->mu);
		if (stop) {
			*why = strdup("the VM stopped while vmd replaced its "
			              "guest link after a snapshot");
			rv = MOAT_UNAVAILABLE;
			break;
		}
		if (moat_rpc_now_ms() >= deadline_ms) {
			*why = moat_asprintf(
			    "the guest agent took no new link "
			    "after the snapshot reset the old one (%s)",
			    err ? err : "no AgentReady");
			rv = MOAT_DEADLINE_EXCEEDED;
			break;
		}
		free(err);
		err = NULL;
		if ((rv = relink_try(sb, old, deadline_ms, &err)) == MOAT_OK) {
			free(err);
			return MOAT_OK;
		}
		if (rv != MOAT_UNAVAILABLE) {
			*why = err;
			err = NULL;
			break;
		}
	}
out:
	free(err);
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_RELINK_END);
	pthread_mutex_unlock(&sb->mu);
	return rv;
}
