/*
 * sandbox.c: a sandbox's life on this node: validation of a create
 * request, capacity, the per-sandbox directory and scratch disk, booting
 * under the boot deadline (kill and retry once, then give up with the
 * guest console's last lines), the supervisor thread that turns a dead VMM
 * into a FAILED sandbox, the guest link's hooks, destroy, and the cleanup
 * of what an earlier (killed) vmd left behind; creates from a template
 * (templates.c finds and makes them), restores, and restores in place
 * (the new VM takes the old one's id once it runs). A sandbox object is
 * reference counted: the table holds one reference, every RPC in flight
 * on it another, so destroy never frees what a handler still uses.
 * Not for: exec and file calls (exec.c, files.c) or the VMM command line
 * (drivers/).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "extents.h"
#include "guest_link.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "ramdir.h"
#include "snapram.h"
#include "vmd.h"

#define SANDBOX_MAX_LABELS 64
#define SANDBOX_MAX_LABEL_KEY 128
#define SANDBOX_MAX_LABEL_VALUE 1024
#define SANDBOX_STOP_GRACE_MS 3000
#define SANDBOX_CONSOLE_LINES 10
#define TEST_LABEL "moat.test"

static const char *const sandbox_image_files[] = { "vmlinux", "initrd.img",
	"rootfs.ext4" };

static const char *
state_name(Moat__V1__SandboxState s)
{
	switch (s) {
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING:
		return "CREATING";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING:
		return "RUNNING";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED:
		return "FAILED";
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED:
		return "STOPPED";
	default:
		return "UNSPECIFIED";
	}
}

char *
vmd_image_path(const struct vmd *vmd, const char *image, const char *file)
{
	return moat_asprintf("%s/%s/%s", vmd->cfg.image_dir, image, file);
}

char *
vmd_image_stamp(const struct vmd *vmd, const char *image)
{
	char *stamp = strdup("");

	for (size_t i = 0; stamp != NULL && i < sizeof(sandbox_image_files) /
	    sizeof(sandbox_image_files[0]); i++) {
		char *p = vmd_image_path(vmd, image, sandbox_image_files[i]);
		char *next = NULL;
		struct stat st;

		if (p != NULL && stat(p, &st) == 0)
			next = moat_asprintf("%s%s%jd.%jd%09ld", stamp,
			    i ? "/" : "", (intmax_t)st.st_size,
			    (intmax_t)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
		free(p);
		free(stamp);
		stamp = next;
	}
	return stamp;
}

static bool
image_present(const struct vmd *vmd, const char *image)
{
	for (size_t i = 0; i < sizeof(sandbox_image_files) /
	    sizeof(sandbox_image_files[0]); i++) {
		char *p = vmd_image_path(vmd, image, sandbox_image_files[i]);
		bool ok = p != NULL && access(p, R_OK) == 0;

		free(p);
		if (!ok)
			return false;
	}
	return true;
}

int
vmd_images_list(const struct vmd *vmd, char ***names, size_t *n)
{
	DIR *d = opendir(vmd->cfg.image_dir);
	struct dirent *de;
	char **list = NULL;
	size_t count = 0;

	*names = NULL;
	*n = 0;
	if (d == NULL)
		return MOAT_OK;
	while ((de = readdir(d)) != NULL && count < 256) {
		char **grown;

		if (de->d_name[0] == '.' || !image_present(vmd, de->d_name))
			continue;
		if ((grown = realloc(list, (count + 1) * sizeof(*list)))
		    == NULL)
			break;
		list = grown;
		if ((list[count] = strdup(de->d_name)) == NULL)
			break;
		count++;
	}
	closedir(d);
	*names = list;
	*n = count;
	return MOAT_OK;
}

char *
vmd_console_tail(const char *path, int lines)
{
	enum { TAIL_BYTES = 16384 };
	char *buf = NULL;
	char *start;
	int fd;
	off_t size;
	ssize_t got;
	int seen = 0;

	if (path == NULL || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return strdup("");
	size = lseek(fd, 0, SEEK_END);
	if (size <= 0 || (buf = malloc(TAIL_BYTES + 1)) == NULL) {
		close(fd);
		return strdup("");
	}
	got = pread(fd, buf, TAIL_BYTES, size > TAIL_BYTES ?
	    size - TAIL_BYTES : 0);
	close(fd);
	if (got <= 0) {
		free(buf);
		return strdup("");
	}
	buf[got] = '\0';
	for (ssize_t i = 0; i < got; i++) {
		unsigned char c = (unsigned char)buf[i];
		if (c == '\r' || c == '\0')
			buf[i] = ' ';
		else if (c != '\n' && (c < 0x20 || c > 0x7e))
			buf[i] = '?';
	}
	while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == ' '))
		buf[--got] = '\0';
	start = buf + got;
	while (start > buf) {
		if (start[-1] == '\n' && ++seen >= lines)
			break;
		start--;
	}
	start = strdup(start);
	free(buf);
	return start ? start : strdup("");
}

/* ---- references and lookup ---- */

static void
sandbox_free(struct sandbox *sb)
{
	guest_link_free(sb->link);
	for (size_t i = 0; i < sb->n_retired_links; i++)
		guest_link_free(sb->retired_links[i]);
	free(sb->retired_links);
	vmd_exec_free_all(sb);
	sb->vmd->vmm->release(&sb->vmm);
	for (size_t i = 0; i < sb->n_labels; i++) {
		free(sb->label_keys[i]);
		free(sb->label_values[i]);
	}
	free(sb->label_keys);
	free(sb->label_values);
	free(sb->dir);
	free(sb->image);
	free(sb->tenant);
	free(sb->test_mode);
	free(sb->template_id);
	free(sb->restored_from);
	free(sb->ram_source);
	free(sb->ram_spare);
	free(sb->failure_reason);
	free(sb->link_error);
	pthread_mutex_destroy(&sb->mu);
	pthread_cond_destroy(&sb->cv);
	free(sb);
}

void
vmd_sandbox_put(struct sandbox *sb)
{
	struct vmd *vmd;
	bool last;

	if (sb == NULL)
		return;
	vmd = sb->vmd;
	pthread_mutex_lock(&vmd->mu);
	last = --sb->refs == 0;
	pthread_mutex_unlock(&vmd->mu);
	if (last)
		sandbox_free(sb);
}

static struct sandbox *
sandbox_find_ref(struct vmd *vmd, const char *id)
{
	struct sandbox *sb;

	pthread_mutex_lock(&vmd->mu);
	for (sb = vmd->sandboxes; sb != NULL; sb = sb->next)
		if (strcmp(sb->id.str, id) == 0)
			break;
	if (sb != NULL)
		sb->refs++;
	pthread_mutex_unlock(&vmd->mu);
	return sb;
}

int
vmd_sandbox_get(struct vmd *vmd, struct moat_rpc_call *call, const char *id,
    struct sandbox **out)
{
	*out = sandbox_find_ref(vmd, id ? id : "");
	if (*out != NULL)
		return MOAT_OK;
	if (call == NULL)
		return MOAT_NOT_FOUND;
	if (id == NULL || id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "sandbox_id is empty: name a sandbox (moat sandbox ls "
		    "lists sandboxes)");
	return moat_rpc_error(call, MOAT_NOT_FOUND, "sandbox %s not found "
	    "(moat sandbox ls lists sandboxes)", id);
}

int
vmd_sandbox_get_running(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id, struct sandbox **out)
{
	struct sandbox *sb;
	int rv;

	if ((rv = vmd_sandbox_get(vmd, call, id, &sb)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	switch (sb->state) {
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING:
		rv = MOAT_OK;
		break;
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING:
		rv = moat_rpc_error(call, MOAT_UNAVAILABLE, "sandbox %s is "
		    "still booting: try again when it is RUNNING", id);
		break;
	case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED:
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION, "sandbox "
		    "%s has failed: %s. Destroy it and create a new one", id,
		    sb->failure_reason ? sb->failure_reason : "unknown");
		break;
	default:
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION, "sandbox "
		    "%s is %s", id, state_name(sb->state));
		break;
	}
	pthread_mutex_unlock(&sb->mu);
	if (rv != MOAT_OK) {
		vmd_sandbox_put(sb);
		return rv;
	}
	*out = sb;
	return MOAT_OK;
}

/* ---- memory accounting ---- */

static void
sandbox_unreserve(struct sandbox *sb)
{
	struct vmd *vmd = sb->vmd;

	pthread_mutex_lock(&vmd->mu);
	if (sb->memory_reserved) {
		vmd->memory_mib_reserved -= sb->memory_mib;
		sb->memory_reserved = false;
	}
	pthread_mutex_unlock(&vmd->mu);
}

/* ---- failure and supervision ---- */

/* Sets FAILED with `reason` if RUNNING; sb->mu held. Returns true when it
 * changed the state (the caller then unreserves, unlocked). */
static bool
sandbox_fail_locked(struct sandbox *sb, const char *reason)
{
	if (sb->state != MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING ||
	    sb->destroying)
		return false;
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED;
	free(sb->failure_reason);
	sb->failure_reason = strdup(reason);
	if (sb->vmm.pid > 0 && !sb->vmm_exited)
		sb->vmd->vmm->stop(&sb->vmm, true);
	/* Guest RAM is the memory the node needs back. */
	if (sb->vmm.ram_file != NULL)
		(void)vmd_ram_unlink(sb->vmm.ram_file);
	pthread_cond_broadcast(&sb->cv);
	moat_warn(0, "sandbox %s failed: %s", sb->id.str, reason);
	return true;
}

void
vmd_sandbox_fail(struct sandbox *sb, const char *reason)
{
	bool changed;

	pthread_mutex_lock(&sb->mu);
	changed = sandbox_fail_locked(sb, reason);
	pthread_mutex_unlock(&sb->mu);
	if (changed)
		sandbox_unreserve(sb);
}

static char *
exit_status_text(int status)
{
	if (WIFEXITED(status))
		return moat_asprintf("exit status %d", WEXITSTATUS(status));
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS)
		return moat_asprintf("killed by signal %d (%s): the VMM "
		    "touched guest RAM that its file in %s could not back, "
		    "most likely because that filesystem is full", SIGBUS,
		    strsignal(SIGBUS), vmd_ram_dir());
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
		return moat_asprintf("killed by signal %d (%s): by the "
		    "host's out-of-memory killer or by someone on the host",
		    SIGKILL, strsignal(SIGKILL));
	if (WIFSIGNALED(status))
		return moat_asprintf("killed by signal %d (%s)",
		    WTERMSIG(status), strsignal(WTERMSIG(status)));
	return moat_asprintf("status %d", status);
}

/* Waits for the VMM process without reaping it, then reaps it under
 * sb->mu, so a stop() under the lock never signals a recycled pid. */
static void *
sandbox_supervisor_main(void *arg)
{
	struct sandbox *sb = arg;
	pid_t pid = sb->vmm.pid;
	siginfo_t si;
	int status = 0;
	char *console = NULL;
	char *vmm_said = NULL;
	char *how = NULL;
	char *reason = NULL;
	bool changed = false;

	while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) != 0 &&
	    errno == EINTR)
		;
	console = vmd_console_tail(sb->vmm.console_log,
	    SANDBOX_CONSOLE_LINES);
	/* Why a VMM died is in its own log more than on the console
	 * (Firecracker's logger file, QEMU's stderr). */
	if (sb->vmm.vmm_log != NULL && (sb->vmm.console_log == NULL ||
	    strcmp(sb->vmm.vmm_log, sb->vmm.console_log) != 0))
		vmm_said = vmd_console_tail(sb->vmm.vmm_log,
		    SANDBOX_CONSOLE_LINES);
	pthread_mutex_lock(&sb->mu);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	sb->vmm_exited = true;
	sb->vmm_status = status;
	how = exit_status_text(status);
	if (sb->state == MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING &&
	    !sb->destroying) {
		reason = moat_asprintf("the VM exited unexpectedly (%s%s%s); "
		    "last console lines:\n%s%s%s%s%s", how ? how : "?",
		    sb->link_error ? "; " : "",
		    sb->link_error ? sb->link_error : "",
		    console ? console : "",
		    vmm_said && vmm_said[0] ? "\nlast lines of the VMM's log "
		    "(" : "", vmm_said && vmm_said[0] ? sb->vmm.vmm_log : "",
		    vmm_said && vmm_said[0] ? "):\n" : "",
		    vmm_said ? vmm_said : "");
		changed = sandbox_fail_locked(sb, reason ? reason :
		    "the VM exited unexpectedly");
	}
	pthread_cond_broadcast(&sb->cv);
	pthread_mutex_unlock(&sb->mu);
	if (changed)
		sandbox_unreserve(sb);
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
	moat_debug(0, "sandbox %s: agent %s ready (guest uptime %" PRIu64
	    " ms, kernel %s)", sb->id.str, ready->agent_version,
	    ready->boot_ms, ready->kernel);
}

static int
hook_event(void *arg, const Moat__V1__GuestMessage *msg, char **why)
{
	return vmd_exec_on_message(arg, msg, why);
}

static void
hook_closed(void *arg, bool violation, const char *reason)
{
	struct sandbox *sb = arg;
	uint64_t until = moat_rpc_now_ms() + 1000;
	char *msg = NULL;
	bool changed = false;

	pthread_mutex_lock(&sb->mu);
	if (sb->relinking && !violation) {
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
	if (sb->state != MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING ||
	    sb->destroying) {
		/* Booting: the boot waiter sees link_closed. */
		pthread_mutex_unlock(&sb->mu);
		return;
	}
	if (violation) {
		msg = moat_asprintf("%s; the sandbox was stopped", reason);
	} else {
		/* Usually the VMM just died: let the supervisor say how. */
		while (!sb->vmm_exited && vmd_cond_wait_until(&sb->cv, &sb->mu,
		    until) == 0)
			;
		if (!sb->vmm_exited)
			msg = moat_asprintf("%s while the VM kept running; the "
			    "sandbox was stopped", reason);
	}
	if (msg != NULL)
		changed = sandbox_fail_locked(sb, msg);
	pthread_mutex_unlock(&sb->mu);
	if (changed)
		sandbox_unreserve(sb);
	free(msg);
}

static const struct guest_link_hooks sandbox_link_hooks = {
	.ready = hook_ready,
	.event = hook_event,
	.closed = hook_closed,
};

/* ---- a new guest link after a snapshot ---- */

void
vmd_sandbox_relink_begin(struct sandbox *sb)
{
	pthread_mutex_lock(&sb->mu);
	sb->relinking = true;
	sb->relink_lost = false;
	pthread_mutex_unlock(&sb->mu);
}

int
vmd_sandbox_relink(struct sandbox *sb, uint64_t deadline_ms, char **why)
{
	const struct moat_vmm_ops *ops = sb->vmd->vmm;
	struct guest_link *old;
	struct guest_link *link = NULL;
	struct guest_link **grown;
	char *err = NULL;
	int rv;

	*why = NULL;
	pthread_mutex_lock(&sb->mu);
	old = sb->link;
	/* Room for the old link first: the swap below cannot fail. */
	grown = realloc(sb->retired_links, (sb->n_retired_links + 1) *
	    sizeof(*grown));
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
		uint32_t seen;
		bool stop;
		int fd = -1;

		pthread_mutex_lock(&sb->mu);
		stop = sb->vmm_exited || sb->destroying;
		pthread_mutex_unlock(&sb->mu);
		if (stop) {
			*why = strdup("the VM stopped while vmd replaced its "
			    "guest link after a snapshot");
			rv = MOAT_UNAVAILABLE;
			break;
		}
		if (moat_rpc_now_ms() >= deadline_ms) {
			*why = moat_asprintf("the guest agent took no new link "
			    "after the snapshot reset the old one (%s)",
			    err ? err : "no AgentReady");
			rv = MOAT_DEADLINE_EXCEEDED;
			break;
		}
		free(err);
		err = NULL;
		rv = ops->connect_agent(&sb->vmm, &fd, &err);
		if (rv == MOAT_UNAVAILABLE) {
			vmd_sleep_ms(10);
			continue;
		}
		if (rv != MOAT_OK) {
			*why = err;
			err = NULL;
			break;
		}
		pthread_mutex_lock(&sb->mu);
		seen = sb->ready_count;
		sb->relink_lost = false;
		pthread_mutex_unlock(&sb->mu);
		if ((rv = guest_link_open(&link, fd, 0, &sandbox_link_hooks, sb,
		    &err)) != MOAT_OK) {
			*why = err;
			err = NULL;
			break;
		}
		/* Exec ids are request ids: never one an exec had before. */
		guest_link_continue_ids(link, old);
		pthread_mutex_lock(&sb->mu);
		while (sb->ready_count == seen && !sb->relink_lost &&
		    !sb->vmm_exited && !sb->destroying &&
		    vmd_cond_wait_until(&sb->cv, &sb->mu, deadline_ms) == 0)
			;
		if (sb->ready_count != seen && !sb->relink_lost) {
			sb->retired_links[sb->n_retired_links++] = old;
			sb->link = link;
			sb->link_closed = false;
			free(sb->link_error);
			sb->link_error = NULL;
			sb->relinking = false;
			pthread_mutex_unlock(&sb->mu);
			moat_debug(0, "sandbox %s: new guest link after the "
			    "snapshot", sb->id.str);
			return MOAT_OK;
		}
		pthread_mutex_unlock(&sb->mu);
		/* Reset too (the guest saw the reset late), or silent: no
		 * RPC has seen this link, so it can go at once. */
		guest_link_shutdown(link, NULL);
		guest_link_free(link);
		link = NULL;
		free(err);
		err = strdup("the new link closed before AgentReady");
	}
out:
	free(err);
	pthread_mutex_lock(&sb->mu);
	sb->relinking = false;
	pthread_mutex_unlock(&sb->mu);
	return rv;
}

/* ---- stopping a VMM ---- */

/* Stops the current VMM (if any), joins its supervisor, shuts the guest
 * link down, and releases the driver's files. With `free_link` the link
 * object goes too (only when no RPC can hold it: during boot). */
static void
sandbox_vmm_teardown(struct sandbox *sb, bool free_link, const char *why)
{
	const struct moat_vmm_ops *ops = sb->vmd->vmm;
	struct guest_link *link;
	bool join;

	pthread_mutex_lock(&sb->mu);
	if (sb->vmm.pid > 0 && !sb->vmm_exited) {
		uint64_t until = moat_rpc_now_ms() + SANDBOX_STOP_GRACE_MS;

		ops->stop(&sb->vmm, false);
		while (!sb->vmm_exited && sb->supervisor_running &&
		    vmd_cond_wait_until(&sb->cv, &sb->mu, until) == 0)
			;
		if (!sb->vmm_exited)
			ops->stop(&sb->vmm, true);
	}
	join = sb->supervisor_running;
	sb->supervisor_running = false;
	link = sb->link;
	if (free_link)
		sb->link = NULL;
	pthread_mutex_unlock(&sb->mu);

	if (join)
		pthread_join(sb->supervisor, NULL);
	guest_link_shutdown(link, why);
	if (free_link)
		guest_link_free(link);

	pthread_mutex_lock(&sb->mu);
	if (sb->vmm.pid > 0 && !sb->vmm_exited) {
		/* No supervisor ran (it could not start): reap here. */
		int status = 0;
		ops->stop(&sb->vmm, true);
		while (waitpid(sb->vmm.pid, &status, 0) < 0 && errno == EINTR)
			;
		sb->vmm_exited = true;
		sb->vmm_status = status;
	}
	ops->release(&sb->vmm);
	pthread_mutex_unlock(&sb->mu);
}

/* ---- boot ---- */

enum boot_outcome {
	BOOT_READY,
	BOOT_SPAWN_FAILED,         /* the VMM did not start at all */
	BOOT_FAILED,               /* started, the guest never answered */
	BOOT_ABORTED,              /* destroyed meanwhile */
};

/* After a restore: lets the paused VMM load its device state and run,
 * then has the agent reset the clock, reseed the RNG and take this
 * sandbox's name (clones must never share randomness). The agent was
 * connected before the guest ran, so it keeps its session and sends no
 * new AgentReady. Returns 0 or a status with *why (heap). */
static int
sandbox_restore_finish(struct sandbox *sb, struct guest_link *link,
    const char *snap_dir, uint64_t deadline, char **why)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ResetAfterRestore reset = MOAT__V1__RESET_AFTER_RESTORE__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	uint8_t entropy[64];
	struct timespec now;
	uint64_t left = 0, t = moat_rpc_now_ms(), t_resumed;
	char *err = NULL;
	int rv;

	if (deadline > t)
		left = deadline - t;
	if ((rv = sb->vmd->vmm->resume(&sb->vmm, snap_dir, (uint32_t)left,
	    &err)) != MOAT_OK) {
		*why = moat_asprintf("the VMM did not resume from the "
		    "snapshot: %s", err ? err : "?");
		free(err);
		return rv;
	}
	if (getrandom(entropy, sizeof(entropy), 0) !=
	    (ssize_t)sizeof(entropy)) {
		*why = moat_asprintf("no host randomness for the clone: %s",
		    strerror(errno));
		return MOAT_INTERNAL;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	reset.unix_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	reset.entropy.data = entropy;
	reset.entropy.len = sizeof(entropy);
	reset.hostname = sb->id.str;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_RESET;
	req.reset = &reset;
	t_resumed = moat_rpc_now_ms();
	rv = guest_link_call(link, &req, deadline, &reply, &err);
	explicit_bzero(entropy, sizeof(entropy));
	moat_debug(0, "sandbox %s: device state loaded and resumed in %"
	    PRIu64 " ms, agent reset in %" PRIu64 " ms", sb->id.str,
	    t_resumed - t, moat_rpc_now_ms() - t_resumed);
	if (rv != MOAT_OK) {
		*why = moat_asprintf("the restored guest's agent did not "
		    "answer the reset: %s", err ? err : "?");
		free(err);
		return rv;
	}
	if (reply->code != MOAT__V1__CODE__OK) {
		*why = moat_asprintf("the restored guest's agent refused the "
		    "reset (clock, RNG, hostname): %s", reply->message);
		rv = (int)reply->code;
	}
	moat__v1__guest_message__free_unpacked(reply, NULL);
	return rv;
}

/* One boot attempt with accelerator `accel` and `timeout_ms` (a restore
 * from `snap_dir` when that is not NULL). Leaves the VMM running on
 * BOOT_READY; otherwise the caller tears it down. *why is heap (caller
 * frees) when not ready. */
static enum boot_outcome
sandbox_boot_once(struct sandbox *sb, const char *accel, uint32_t timeout_ms,
    const char *snap_dir, char **why)
{
	struct vmd *vmd = sb->vmd;
	struct moat_vmm_spec spec = { 0 };
	struct moat_vmm vm = { 0 };
	char *kernel = vmd_image_path(vmd, sb->image, "vmlinux");
	char *initrd = vmd_image_path(vmd, sb->image, "initrd.img");
	char *rootfs = vmd_image_path(vmd, sb->image, "rootfs.ext4");
	char *scratch = moat_asprintf("%s/scratch.ext4", sb->dir);
	char *extra = sb->test_mode ? moat_asprintf(TEST_LABEL "=%s",
	    sb->test_mode) : NULL;
	struct guest_link *link = NULL;
	enum boot_outcome outcome = BOOT_FAILED;
	uint64_t t0, deadline;
	char *err = NULL;
	int fd = -1;
	int rv;

	*why = NULL;
	if (!kernel || !initrd || !rootfs || !scratch ||
	    (sb->test_mode && !extra)) {
		*why = strdup("out of memory");
		outcome = BOOT_SPAWN_FAILED;
		goto out;
	}
	/* The directory's name: the sandbox id, but for a restore in place,
	 * whose VM runs beside the one it replaces under a name of its own
	 * (the driver's files and ids must not collide). */
	spec.sandbox_id = strrchr(sb->dir, '/') ? strrchr(sb->dir, '/') + 1 :
	    sb->id.str;
	spec.dir = sb->dir;
	spec.kernel = kernel;
	spec.initrd = initrd;
	spec.rootfs = rootfs;
	spec.scratch_disk = scratch;
	spec.vcpus = sb->vcpus;
	spec.memory_mib = sb->memory_mib;
	spec.accel = accel;
	spec.extra_cmdline = extra;
	spec.ram_source = snap_dir ? sb->ram_source : NULL;
	spec.ram_ready = snap_dir ? sb->ram_spare : NULL;

	pthread_mutex_lock(&sb->mu);
	sb->agent_ready = false;
	sb->link_closed = false;
	free(sb->link_error);
	sb->link_error = NULL;
	sb->vmm_exited = false;
	sb->vmm_status = 0;
	pthread_mutex_unlock(&sb->mu);

	t0 = moat_rpc_now_ms();
	deadline = t0 + timeout_ms;
	rv = snap_dir == NULL ? vmd->vmm->start(vmd->vmm_binary, &spec, &vm,
	    &err) : vmd->vmm->restore(vmd->vmm_binary, &spec, snap_dir, &vm,
	    &err);
	if (sb->ram_spare != NULL) {
		/* Taken (renamed) by a driver that uses it; else it would
		 * hold tmpfs until vmd stops. Once only: a retry copies. */
		(void)unlink(sb->ram_spare);
		free(sb->ram_spare);
		sb->ram_spare = NULL;
	}
	if (rv != MOAT_OK) {
		*why = err ? err : strdup("the VMM did not start");
		err = NULL;
		outcome = BOOT_SPAWN_FAILED;
		goto out;
	}
	pthread_mutex_lock(&sb->mu);
	sb->vmm = vm;
	snprintf(sb->accel, sizeof(sb->accel), "%s", accel);
	if (vmd_thread_create(&sb->supervisor, sandbox_supervisor_main, sb)
	    == 0)
		sb->supervisor_running = true;
	pthread_mutex_unlock(&sb->mu);
	if (!sb->supervisor_running) {
		*why = strdup("cannot start the supervisor thread");
		goto out;
	}

	/* QEMU makes the agent socket early in its start; retry until. */
	for (;;) {
		bool stop;

		rv = vmd->vmm->connect_agent(&sb->vmm, &fd, &err);
		if (rv == MOAT_OK)
			break;
		if (rv != MOAT_UNAVAILABLE) {
			*why = err;
			err = NULL;
			goto out;
		}
		pthread_mutex_lock(&sb->mu);
		stop = sb->vmm_exited || sb->destroying;
		pthread_mutex_unlock(&sb->mu);
		if (stop || moat_rpc_now_ms() >= deadline)
			break;
		/* A restore waits here for QEMU's start (~35 ms), half a
		 * poll on average: keep the poll short. */
		vmd_sleep_ms(2);
	}
	if (fd >= 0) {
		if ((rv = guest_link_open(&link, fd, 0, &sandbox_link_hooks, sb,
		    &err)) != MOAT_OK) {
			*why = err;
			err = NULL;
			goto out;
		}
		pthread_mutex_lock(&sb->mu);
		sb->link = link;
		pthread_mutex_unlock(&sb->mu);
	}
	if (snap_dir != NULL) {
		if (link == NULL) {
			*why = moat_asprintf("the restored VM's agent "
			    "socket did not open within %u ms", timeout_ms);
			goto out;
		}
		if (sandbox_restore_finish(sb, link, snap_dir, deadline, why)
		    != MOAT_OK)
			goto out;
		pthread_mutex_lock(&sb->mu);
		sb->agent_ready = true;
		pthread_mutex_unlock(&sb->mu);
	}

	pthread_mutex_lock(&sb->mu);
	while (!sb->agent_ready && !sb->vmm_exited && !sb->link_closed &&
	    !sb->destroying && sb->link != NULL) {
		if (vmd_cond_wait_until(&sb->cv, &sb->mu, deadline) ==
		    ETIMEDOUT)
			break;
	}
	if (sb->agent_ready && !sb->destroying) {
		sb->boot_ms = moat_rpc_now_ms() - t0;
		outcome = BOOT_READY;
	} else if (sb->destroying) {
		outcome = BOOT_ABORTED;
		*why = strdup("the sandbox was destroyed while it booted");
	} else if (sb->vmm_exited) {
		char *how = exit_status_text(sb->vmm_status);
		char *said = vmd_console_tail(sb->vmm.vmm_log, 5);

		*why = moat_asprintf("the VMM exited during boot (%s)%s%s",
		    how ? how : "?", said && said[0] ? "; it said: " : "",
		    said ? said : "");
		free(how);
		free(said);
	} else if (sb->link_closed) {
		*why = strdup(sb->link_error ? sb->link_error :
		    "the guest link closed during boot");
	} else {
		*why = moat_asprintf("the guest agent did not answer within "
		    "%u ms", timeout_ms);
	}
	pthread_mutex_unlock(&sb->mu);
out:
	free(err);
	free(kernel);
	free(initrd);
	free(rootfs);
	free(scratch);
	free(extra);
	return outcome;
}

/* Boots with retries and the accelerator probe. Returns MOAT_OK with the
 * VMM running, or a status with *why (heap). */
static int
sandbox_boot(struct sandbox *sb, char **why)
{
	struct vmd *vmd = sb->vmd;
	char *kernel = vmd_image_path(vmd, sb->image, "vmlinux");
	const char *accel;
	bool probe = false;
	int attempts = 0;

	*why = NULL;
	if (kernel == NULL) {
		*why = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	accel = vmd_accel_choose(vmd, kernel, &probe);
	for (;;) {
		uint32_t timeout = sb->boot_timeout_ms;
		enum boot_outcome outcome;
		char *reason = NULL;
		char *console;

		if (probe && timeout > VMD_ACCEL_PROBE_MS)
			timeout = VMD_ACCEL_PROBE_MS;
		outcome = sandbox_boot_once(sb, accel, timeout, NULL, &reason);
		if (outcome == BOOT_READY) {
			if (probe)
				vmd_accel_settle(vmd, kernel, true, true);
			free(kernel);
			return MOAT_OK;
		}
		console = vmd_console_tail(sb->vmm.console_log,
		    SANDBOX_CONSOLE_LINES);
		sandbox_vmm_teardown(sb, true, "the sandbox is stopping");
		pthread_mutex_lock(&sb->mu);
		if (sb->destroying)
			outcome = BOOT_ABORTED;
		pthread_mutex_unlock(&sb->mu);
		if (outcome == BOOT_ABORTED) {
			if (probe)
				vmd_accel_settle(vmd, kernel, false, false);
			*why = reason;
			free(console);
			free(kernel);
			return MOAT_ABORTED;
		}
		if (probe) {
			/* Whatever went wrong under KVM, TCG is next. */
			moat_info(0, "sandbox %s: KVM probe boot failed: %s",
			    sb->id.str, reason ? reason : "?");
			vmd_accel_settle(vmd, kernel, true, false);
			probe = false;
			accel = "tcg";
			free(reason);
			free(console);
			continue;
		}
		if (outcome == BOOT_SPAWN_FAILED || ++attempts >= 2) {
			*why = moat_asprintf("%s%s%s", reason ? reason : "?",
			    console && console[0] ?
			    "; last console lines:\n" : " (the console is "
			    "empty)", console ? console : "");
			free(reason);
			free(console);
			free(kernel);
			return outcome == BOOT_SPAWN_FAILED ? MOAT_INTERNAL :
			    MOAT_UNAVAILABLE;
		}
		moat_warn(0, "sandbox %s: boot attempt %d failed (%s); "
		    "retrying once", sb->id.str, attempts, reason ?
		    reason : "?");
		free(reason);
		free(console);
	}
}

/* ---- create ---- */

static bool
image_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 64 || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
			return false;
	}
	return true;
}

static int
sandbox_validate(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, const char *image,
    const char **test_mode)
{
	const struct vmd_config *cfg = &vmd->cfg;
	uint32_t vcpus = req->vcpus ? req->vcpus : VMD_DEFAULT_VCPUS;
	uint32_t mem = req->memory_mib ? req->memory_mib :
	    VMD_DEFAULT_MEMORY_MIB;
	uint64_t scratch = req->scratch_mib ? req->scratch_mib :
	    VMD_DEFAULT_SCRATCH_MIB;

	*test_mode = NULL;
	if (vcpus > cfg->max_vcpus)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "vcpus %u is "
		    "out of range: node %s allows 1 to %u per sandbox", vcpus,
		    cfg->node_id, cfg->max_vcpus);
	if (mem < VMD_MIN_MEMORY_MIB || mem > cfg->max_memory_mib)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "memory_mib "
		    "%u is out of range: node %s allows %u to %u MiB per "
		    "sandbox", mem, cfg->node_id, VMD_MIN_MEMORY_MIB,
		    cfg->max_memory_mib);
	if (scratch < VMD_MIN_SCRATCH_MIB || scratch > VMD_MAX_SCRATCH_MIB)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "scratch_mib "
		    "%" PRIu64 " is out of range: %u to %u MiB", scratch,
		    VMD_MIN_SCRATCH_MIB, VMD_MAX_SCRATCH_MIB);
	if (!image_name_ok(image))
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "image name "
		    "\"%s\" is not valid: use letters, digits, '-', '_' and "
		    "'.'", image);
	if (req->n_labels > SANDBOX_MAX_LABELS)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "%zu labels "
		    "given: at most %d", req->n_labels, SANDBOX_MAX_LABELS);
	for (size_t i = 0; i < req->n_labels; i++) {
		const char *k = req->labels[i]->key;
		const char *v = req->labels[i]->value;

		if (strlen(k) == 0 || strlen(k) > SANDBOX_MAX_LABEL_KEY ||
		    strlen(v) > SANDBOX_MAX_LABEL_VALUE)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "label \"%.40s\" is empty or too long: keys take 1 "
			    "to %d bytes, values at most %d", k,
			    SANDBOX_MAX_LABEL_KEY, SANDBOX_MAX_LABEL_VALUE);
		if (strcmp(k, TEST_LABEL) != 0)
			continue;
		if (!cfg->test_hooks)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "label " TEST_LABEL " is for moat's own tests: set "
			    "[vmd] test-hooks=true on this node to use it");
		if (strcmp(v, "garbage") != 0 && strcmp(v, "oversize") != 0 &&
		    strcmp(v, "flood") != 0)
			return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
			    "label " TEST_LABEL "=%s is unknown: use garbage, "
			    "oversize or flood", v);
		*test_mode = v;
	}
	if (!image_present(vmd, image))
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION, "image "
		    "\"%s\" is not built: run images/build.sh --name %s "
		    "--out %s as root (looked in %s/%s)", image, image,
		    cfg->image_dir, cfg->image_dir, image);
	return MOAT_OK;
}

static void
sandbox_new_id(struct sandbox_id *id)
{
	uint8_t r[8];

	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
		uint64_t t = moat_rpc_now_ms() ^ ((uint64_t)getpid() << 32) ^
		    (uint64_t)(uintptr_t)id;
		memcpy(r, &t, sizeof(r));
	}
	snprintf(id->str, sizeof(id->str), "sb-%02x%02x%02x%02x%02x%02x%02x"
	    "%02x", r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
}

static struct sandbox *
sandbox_alloc(struct vmd *vmd, const Moat__V1__CreateSandboxRequest *req,
    const char *image, const char *test_mode)
{
	struct sandbox *sb = calloc(1, sizeof(*sb));
	bool oom = false;

	if (sb == NULL)
		return NULL;
	sb->vmd = vmd;
	pthread_mutex_init(&sb->mu, NULL);
	vmd_cond_init(&sb->cv);
	sandbox_new_id(&sb->id);
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING;
	sb->vcpus = req->vcpus ? req->vcpus : VMD_DEFAULT_VCPUS;
	sb->memory_mib = req->memory_mib ? req->memory_mib :
	    VMD_DEFAULT_MEMORY_MIB;
	sb->scratch_mib = req->scratch_mib ? req->scratch_mib :
	    VMD_DEFAULT_SCRATCH_MIB;
	sb->boot_timeout_ms = req->boot_timeout_ms ? req->boot_timeout_ms :
	    vmd->cfg.boot_timeout_ms;
	sb->created_unix_ms = moat_now_unix_ms();
	sb->dir = moat_asprintf("%s/vms/%s", vmd->cfg.state_dir, sb->id.str);
	sb->image = strdup(image);
	sb->tenant = strdup(req->tenant ? req->tenant : "");
	sb->test_mode = test_mode ? strdup(test_mode) : NULL;
	oom = !sb->dir || !sb->image || !sb->tenant ||
	    (test_mode && !sb->test_mode);
	if (req->n_labels > 0) {
		sb->label_keys = calloc(req->n_labels, sizeof(char *));
		sb->label_values = calloc(req->n_labels, sizeof(char *));
		oom = oom || !sb->label_keys || !sb->label_values;
		for (size_t i = 0; !oom && i < req->n_labels; i++) {
			sb->label_keys[i] = strdup(req->labels[i]->key);
			sb->label_values[i] = strdup(req->labels[i]->value);
			sb->n_labels = i + 1;
			oom = !sb->label_keys[i] || !sb->label_values[i];
		}
	}
	sb->refs = 1;
	if (oom) {
		sandbox_free(sb);
		return NULL;
	}
	return sb;
}

/* Tears a sandbox down completely: VMM, link, files, memory. */
static void
sandbox_teardown(struct sandbox *sb, const char *why)
{
	int err;

	sandbox_vmm_teardown(sb, false, why);
	if ((err = moat_rm_rf(sb->dir)) != 0)
		moat_warn(0, "sandbox %s: cannot remove %s: %s", sb->id.str,
		    sb->dir, strerror(err));
	sandbox_unreserve(sb);
}

static void
sandbox_unlist(struct sandbox *sb)
{
	struct vmd *vmd = sb->vmd;
	struct sandbox **pp;
	bool drop = false;

	pthread_mutex_lock(&vmd->mu);
	for (pp = &vmd->sandboxes; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == sb) {
			*pp = sb->next;
			sb->listed = false;
			drop = true;
			break;
		}
	}
	pthread_mutex_unlock(&vmd->mu);
	if (drop)
		vmd_sandbox_put(sb);
}

/* How sandbox_bring_up makes the sandbox known. */
enum bring_up_mode {
	BRING_UP_LISTED,           /* in the table from the start */
	BRING_UP_HIDDEN,           /* never in the table (template builds) */
	BRING_UP_REPLACE,          /* takes `replace`'s place once running */
};

/* Swaps running `sb` into the table in place of `old` (same id). Returns
 * false when old is no longer listed (destroyed meanwhile). */
static bool
sandbox_swap_in(struct vmd *vmd, struct sandbox *old, struct sandbox *sb)
{
	struct sandbox **pp;

	pthread_mutex_lock(&vmd->mu);
	for (pp = &vmd->sandboxes; *pp != NULL && *pp != old;
	    pp = &(*pp)->next)
		;
	if (*pp == NULL || vmd->shutting_down) {
		pthread_mutex_unlock(&vmd->mu);
		return false;
	}
	/* The table's reference moves from old to sb. */
	sb->next = old->next;
	*pp = sb;
	sb->listed = true;
	sb->refs++;
	old->listed = false;
	pthread_mutex_unlock(&vmd->mu);
	return true;
}

/* Lists `sb` (a fresh sandbox_alloc) and brings it up: a boot, or with
 * `snap_dir` a restore from that snapshot under `accel`. Same contract
 * as vmd_sandbox_create; takes the caller's reference to sb. `mode` says
 * when (if ever) it enters the table; with BRING_UP_REPLACE, `replace`
 * (a reference the caller keeps) is stopped once sb runs, and left as
 * it was when sb fails. */
static int
sandbox_bring_up(struct vmd *vmd, struct moat_rpc_call *call,
    struct sandbox *sb, const char *snap_dir, const char *accel,
    enum bring_up_mode mode, struct sandbox *replace, struct sandbox **out)
{
	char *why = NULL;
	char *scratch = NULL;
	uint64_t ram_bytes = (uint64_t)sb->memory_mib << 20;
	char what[64];
	int err;
	int rv;

	/* Its RAM file may grow to all of its memory: the RAM dir must hold
	 * that on top of what it has promised, or the VMM would die of
	 * SIGBUS the day it touches a page that cannot be backed. */
	snprintf(what, sizeof(what), "a sandbox of %u MiB", sb->memory_mib);
	if ((rv = vmd_ram_admit(vmd, call, ram_bytes, what)) != MOAT_OK) {
		vmd_sandbox_put(sb);
		return rv;
	}
	pthread_mutex_lock(&vmd->mu);
	if (vmd->shutting_down) {
		pthread_mutex_unlock(&vmd->mu);
		vmd_ram_admit_done(vmd, ram_bytes);
		vmd_sandbox_put(sb);
		return moat_rpc_error(call, MOAT_UNAVAILABLE, "node %s is "
		    "shutting down: create the sandbox elsewhere",
		    vmd->cfg.node_id);
	}
	if (vmd->memory_mib_reserved + sb->memory_mib >
	    vmd->cfg.memory_mib_total) {
		uint64_t free_mib = vmd->cfg.memory_mib_total -
		    vmd->memory_mib_reserved;
		pthread_mutex_unlock(&vmd->mu);
		vmd_ram_admit_done(vmd, ram_bytes);
		rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED, "sandbox "
		    "needs %u MiB of memory but node %s has %" PRIu64 " of %"
		    PRIu64 " MiB free: destroy sandboxes or ask for less "
		    "memory_mib", sb->memory_mib, vmd->cfg.node_id, free_mib,
		    vmd->cfg.memory_mib_total);
		vmd_sandbox_put(sb);
		return rv;
	}
	vmd->memory_mib_reserved += sb->memory_mib;
	sb->memory_reserved = true;
	if (mode == BRING_UP_LISTED) {
		sb->listed = true;
		sb->refs = 2;      /* the table's and ours */
		sb->next = vmd->sandboxes;
		vmd->sandboxes = sb;
	}
	pthread_mutex_unlock(&vmd->mu);
	/* Counted in memory_mib_reserved from here on. */
	vmd_ram_admit_done(vmd, ram_bytes);
	moat_info(call->request_id, "sandbox %s: %s (image %s, %u vcpus, "
	    "%u MiB, scratch %" PRIu64 " MiB%s%s)", sb->id.str,
	    snap_dir ? "restoring" : "creating", sb->image,
	    sb->vcpus, sb->memory_mib, sb->scratch_mib,
	    sb->test_mode ? ", test mode " : "",
	    sb->test_mode ? sb->test_mode : "");

	if ((err = moat_mkdir_p(sb->dir, 0700)) != 0) {
		why = moat_asprintf("cannot create %s: %s", sb->dir,
		    strerror(err));
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if ((scratch = moat_asprintf("%s/scratch.ext4", sb->dir)) == NULL) {
		why = strdup("out of memory");
		rv = MOAT_INTERNAL;
		goto fail;
	}
	if (snap_dir == NULL) {
		if ((rv = vmd_scratch_make(vmd, scratch, sb->scratch_mib,
		    &why)) != MOAT_OK)
			goto fail;
		if ((rv = sandbox_boot(sb, &why)) != MOAT_OK)
			goto fail;
	} else {
		char *src = moat_asprintf("%s/" MOAT_VMM_SNAP_SCRATCH,
		    snap_dir);

		/* The clone's own disk: the snapshot's stays as it was. */
		err = src ? vmd_copy_sparse(src, scratch, NULL) : ENOMEM;
		if (err != 0) {
			why = moat_asprintf("cannot copy the snapshot's "
			    "scratch disk %s: %s", src ? src : "?",
			    strerror(err));
			free(src);
			rv = moat_status_from_errno(err);
			goto fail;
		}
		free(src);
		if (sandbox_boot_once(sb, accel, sb->boot_timeout_ms, snap_dir,
		    &why) != BOOT_READY) {
			sandbox_vmm_teardown(sb, true, "the sandbox is "
			    "stopping");
			rv = MOAT_UNAVAILABLE;
			goto fail;
		}
	}

	pthread_mutex_lock(&sb->mu);
	if (sb->destroying) {
		pthread_mutex_unlock(&sb->mu);
		free(why);
		why = strdup("the sandbox was destroyed while it booted");
		rv = MOAT_ABORTED;
		goto fail;
	}
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	pthread_cond_broadcast(&sb->cv);
	if (mode == BRING_UP_REPLACE && (sb->link_closed || sb->vmm_exited)) {
		pthread_mutex_unlock(&sb->mu);
		free(why);
		why = strdup("the restored VM stopped right after it resumed");
		rv = MOAT_UNAVAILABLE;
		goto fail;
	}
	if (mode == BRING_UP_REPLACE) {
		pthread_mutex_unlock(&sb->mu);
		if (!sandbox_swap_in(vmd, replace, sb)) {
			free(why);
			why = moat_asprintf("sandbox %s was destroyed during "
			    "the restore", replace->id.str);
			rv = MOAT_ABORTED;
			goto fail;
		}
		/* The old VM goes only now that the new one runs. */
		pthread_mutex_lock(&replace->mu);
		replace->destroying = true;
		replace->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED;
		pthread_cond_broadcast(&replace->cv);
		pthread_mutex_unlock(&replace->mu);
		sandbox_teardown(replace, "the sandbox was restored in place");
		vmd_sandbox_put(replace);  /* the table's reference */
		pthread_mutex_lock(&sb->mu);
	}
	if (sb->link_closed || sb->vmm_exited) {
		/* The guest went wrong right after it said ready. */
		char *reason = moat_asprintf("%s; the sandbox was stopped",
		    sb->link_error ? sb->link_error : "the VM stopped");
		bool changed = sandbox_fail_locked(sb, reason ? reason :
		    "the guest link closed");
		pthread_mutex_unlock(&sb->mu);
		free(reason);
		if (changed)
			sandbox_unreserve(sb);
	} else {
		pthread_mutex_unlock(&sb->mu);
	}
	moat_info(call->request_id, "sandbox %s: running (%s, pid %d, %s "
	    "%" PRIu64 " ms)", sb->id.str, sb->accel, (int)sb->vmm.pid,
	    snap_dir ? "restore" : "boot", sb->boot_ms);
	free(scratch);
	*out = sb;
	return MOAT_OK;

fail:
	moat_warn(call->request_id, "sandbox %s: %s failed: %s",
	    sb->id.str, snap_dir ? "restore" : "create", why ? why : "?");
	sandbox_teardown(sb, "the sandbox is stopping");
	sandbox_unlist(sb);
	pthread_mutex_lock(&sb->mu);
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED;
	sb->gone = true;
	pthread_cond_broadcast(&sb->cv);
	pthread_mutex_unlock(&sb->mu);
	if (rv == MOAT_UNAVAILABLE)
		rv = moat_rpc_error(call, rv, "sandbox %s did not %s: %s",
		    sb->id.str, snap_dir ? "restore" : "boot",
		    why ? why : "?");
	else
		rv = moat_rpc_error(call, rv, "sandbox %s: %s", sb->id.str,
		    why ? why : "?");
	free(why);
	free(scratch);
	vmd_sandbox_put(sb);
	return rv;
}

/* A create as a clone of the template of `shape` under `accel`: MOAT_OK
 * with *out; MOAT_NOT_FOUND when the create should boot cold instead
 * (no template, or one that did not restore: it is dropped with a
 * warning, and the call's error cleared); another status after
 * moat_rpc_error (out of memory, full, destroyed, shutting down). */
static int
sandbox_create_templated(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, const struct vmd_shape *shape,
    const char *accel, struct sandbox **out)
{
	struct sandbox *sb;
	char *tdir = NULL, *tid = NULL;
	bool stopping;
	int rv;

	if (vmd_template_find(vmd, shape, accel, &tdir, &tid) != MOAT_OK)
		return MOAT_NOT_FOUND;
	if ((sb = sandbox_alloc(vmd, req, shape->image, NULL)) == NULL ||
	    (sb->template_id = strdup(tid)) == NULL) {
		if (sb != NULL)
			sandbox_free(sb);
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	sb->ram_source = vmd_template_ram(vmd, tid, tdir);
	sb->ram_spare = vmd_template_take_spare(vmd, tid);
	rv = sandbox_bring_up(vmd, call, sb, tdir, accel, BRING_UP_LISTED,
	    NULL, out);
	pthread_mutex_lock(&vmd->mu);
	stopping = vmd->shutting_down;
	pthread_mutex_unlock(&vmd->mu);
	if (rv == MOAT_OK || rv == MOAT_ABORTED ||
	    rv == MOAT_RESOURCE_EXHAUSTED || stopping)
		goto out;
	/* A bad template never fails a creation. */
	moat_warn(call->request_id, "template %s did not restore (%s): "
	    "dropped; booting cold", tid, call->error_message ?
	    call->error_message : "?");
	free(call->error_message);
	call->error_message = NULL;
	vmd_template_drop(vmd, tdir);
	rv = MOAT_NOT_FOUND;
out:
	free(tdir);
	free(tid);
	return rv;
}

int
vmd_sandbox_create(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, struct sandbox **out)
{
	const char *image = req->image && req->image[0] ? req->image :
	    "default";
	const char *test_mode = NULL;
	struct vmd_shape shape;
	struct sandbox *sb;
	bool templated;
	char accel[8];
	int rv;

	*out = NULL;
	if ((rv = sandbox_validate(vmd, call, req, image, &test_mode)) != 0)
		return rv;
	shape.image = image;
	shape.vcpus = req->vcpus ? req->vcpus : VMD_DEFAULT_VCPUS;
	shape.memory_mib = req->memory_mib ? req->memory_mib :
	    VMD_DEFAULT_MEMORY_MIB;
	shape.scratch_mib = req->scratch_mib ? req->scratch_mib :
	    VMD_DEFAULT_SCRATCH_MIB;
	/* A test mode changes how the guest boots: never from a template.
	 * Before the accelerator is decided (the KVM probe) there is no
	 * template to match: that create boots and decides it. */
	templated = vmd->cfg.templates && !req->cold_boot &&
	    test_mode == NULL && vmd->vmm->restore != NULL &&
	    vmd->vmm->snapshot != NULL;
	vmd_accel_current(vmd, accel);
	if (templated && accel[0] != '\0' &&
	    (rv = sandbox_create_templated(vmd, call, req, &shape, accel,
	    out)) != MOAT_NOT_FOUND)
		return rv;
	if ((sb = sandbox_alloc(vmd, req, image, test_mode)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	rv = sandbox_bring_up(vmd, call, sb, NULL, NULL, BRING_UP_LISTED,
	    NULL, out);
	/* The first cold boot of a shape makes its template, after this
	 * boot, so the two do not share the CPU. */
	if (rv == MOAT_OK && templated) {
		pthread_mutex_lock(&sb->mu);
		snprintf(accel, sizeof(accel), "%s", sb->accel);
		pthread_mutex_unlock(&sb->mu);
		vmd_template_build_async(vmd, &shape, accel);
	}
	return rv;
}

int
vmd_sandbox_create_hidden(struct vmd *vmd, struct moat_rpc_call *call,
    const struct vmd_shape *shape, pthread_mutex_t *slot_mu,
    struct sandbox **slot, struct sandbox **out)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	const char *test_mode = NULL;
	struct sandbox *sb;
	int rv;

	*out = NULL;
	req.vcpus = shape->vcpus;
	req.memory_mib = shape->memory_mib;
	req.scratch_mib = shape->scratch_mib;
	req.image = (char *)shape->image;
	if ((rv = sandbox_validate(vmd, call, &req, shape->image, &test_mode))
	    != MOAT_OK)
		return rv;
	if ((sb = sandbox_alloc(vmd, &req, shape->image, NULL)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	/* The slot's own reference, so an abort can reach it mid-boot. */
	sb->refs++;
	pthread_mutex_lock(slot_mu);
	*slot = sb;
	pthread_mutex_unlock(slot_mu);
	return sandbox_bring_up(vmd, call, sb, NULL, NULL, BRING_UP_HIDDEN,
	    NULL, out);
}

void
vmd_sandbox_destroy_hidden(struct sandbox *sb)
{
	if (sb == NULL)
		return;
	pthread_mutex_lock(&sb->mu);
	sb->destroying = true;
	sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED;
	pthread_cond_broadcast(&sb->cv);
	pthread_mutex_unlock(&sb->mu);
	sandbox_teardown(sb, "the template VM is done");
	vmd_sandbox_put(sb);
}

void
vmd_sandbox_abort(struct sandbox *sb)
{
	pthread_mutex_lock(&sb->mu);
	sb->destroying = true;
	pthread_cond_broadcast(&sb->cv);
	if (sb->vmm.pid > 0 && !sb->vmm_exited)
		sb->vmd->vmm->stop(&sb->vmm, true);
	pthread_mutex_unlock(&sb->mu);
}

int
vmd_sandbox_restore(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct sandbox **out)
{
	Moat__V1__CreateSandboxRequest create =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *meta = NULL;
	Moat__V1__CreateSandboxRequest__LabelsEntry **labels = NULL;
	Moat__V1__CreateSandboxRequest__LabelsEntry *entries = NULL;
	const char *test_mode = NULL;
	struct sandbox *sb;
	struct sandbox *old = NULL;
	char *snap_dir = NULL;
	int rv;

	*out = NULL;
	if (vmd->vmm->restore == NULL || vmd->vmm->resume == NULL)
		return moat_rpc_error(call, MOAT_UNIMPLEMENTED, "the %s driver "
		    "of node %s cannot restore snapshots", vmd->vmm->name,
		    vmd->cfg.node_id);
	if ((rv = vmd_snapshot_open(vmd, call, req->snapshot_id, req->tenant,
	    &meta, &snap_dir)) != MOAT_OK)
		return rv;
	/* Its RAM copy stays until the clone has its own (an evicted one is
	 * rebuilt here first). */
	if ((rv = vmd_snapram_acquire(vmd, call, req->snapshot_id, snap_dir,
	    &meta)) != MOAT_OK) {
		free(snap_dir);
		moat__v1__local_snapshot__free_unpacked(meta, NULL);
		return rv;
	}
	if (meta->vmm[0] != '\0' && strcmp(meta->vmm, vmd->vmm->name) != 0) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION, "snapshot "
		    "%s was taken under the %s VMM and restores only under "
		    "%s; node %s runs %s: restore it on a node with --driver "
		    "%s", meta->snapshot_id, meta->vmm, meta->vmm,
		    vmd->cfg.node_id, vmd->vmm->name, meta->vmm);
		goto out;
	}
	if (req->replace_sandbox_id != NULL &&
	    req->replace_sandbox_id[0] != '\0') {
		/* Another tenant's sandbox is as good as absent. */
		bool creating;

		if (vmd_sandbox_get(vmd, NULL, req->replace_sandbox_id, &old)
		    != MOAT_OK || strcmp(old->tenant, meta->tenant) != 0 ||
		    (req->tenant[0] != '\0' &&
		    strcmp(old->tenant, req->tenant) != 0)) {
			rv = moat_rpc_error(call, MOAT_NOT_FOUND,
			    "sandbox %.40s to restore in place not found "
			    "(moat sandbox ls lists sandboxes; it must be "
			    "the snapshot's tenant's)",
			    req->replace_sandbox_id);
			goto out;
		}
		pthread_mutex_lock(&old->mu);
		creating = old->state ==
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING;
		pthread_mutex_unlock(&old->mu);
		if (creating) {
			rv = moat_rpc_error(call, MOAT_UNAVAILABLE,
			    "sandbox %s is still booting: restore into it "
			    "once it is RUNNING", old->id.str);
			goto out;
		}
	}
	/* The clone is the snapshot's sandbox in size and image; only its
	 * labels are its own. */
	create.vcpus = meta->vcpus;
	create.memory_mib = meta->memory_mib;
	create.image = meta->image;
	create.scratch_mib = meta->scratch_mib;
	create.tenant = meta->tenant;
	if (old != NULL && req->n_labels == 0 && old->n_labels > 0) {
		/* In place without labels: the sandbox keeps its own. */
		if ((labels = calloc(old->n_labels, sizeof(*labels))) == NULL ||
		    (entries = calloc(old->n_labels, sizeof(*entries))) ==
		    NULL) {
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
			goto out;
		}
		for (size_t i = 0; i < old->n_labels; i++) {
			moat__v1__create_sandbox_request__labels_entry__init(
			    &entries[i]);
			entries[i].key = old->label_keys[i];
			entries[i].value = old->label_values[i];
			labels[i] = &entries[i];
		}
		create.labels = labels;
		create.n_labels = old->n_labels;
	}
	if (req->n_labels > 0 &&
	    ((labels = calloc(req->n_labels, sizeof(*labels))) == NULL ||
	    (entries = calloc(req->n_labels, sizeof(*entries))) == NULL)) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	/* The request's strings, borrowed, in a create request's entries. */
	for (size_t i = 0; i < req->n_labels; i++) {
		moat__v1__create_sandbox_request__labels_entry__init(
		    &entries[i]);
		entries[i].key = req->labels[i]->key;
		entries[i].value = req->labels[i]->value;
		labels[i] = &entries[i];
	}
	if (req->n_labels > 0) {
		create.labels = labels;
		create.n_labels = req->n_labels;
	}
	if ((rv = sandbox_validate(vmd, call, &create, meta->image,
	    &test_mode)) != MOAT_OK)
		goto out;
	{
		/* The guest's memory holds the kernel and the root filesystem's
		 * cache as they were: another build of the image under the
		 * same name would boot into corruption, not a restore. */
		char *stamp = vmd_image_stamp(vmd, meta->image);
		bool same = stamp != NULL && strcmp(stamp,
		    meta->image_stamp) == 0;

		free(stamp);
		if (!same) {
			rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
			    "snapshot %s was taken with another build of "
			    "image \"%s\" than the one on node %s now: it "
			    "cannot be restored exactly; take a new snapshot",
			    meta->snapshot_id, meta->image, vmd->cfg.node_id);
			goto out;
		}
	}
	if (test_mode != NULL) {
		rv = moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "label "
		    TEST_LABEL " cannot be given to a restore: it changes how "
		    "a guest boots, and a restored guest does not boot");
		goto out;
	}
	if ((sb = sandbox_alloc(vmd, &create, meta->image, NULL)) == NULL) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	if ((sb->restored_from = strdup(meta->snapshot_id)) == NULL) {
		sandbox_free(sb);
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	if (old != NULL) {
		/* The old VM runs on in its own directory until the swap;
		 * the new one gets a directory (and so a RAM file) of its
		 * own under the same id. */
		uint8_t r[4] = { 0 };
		char *dir;

		(void)!getrandom(r, sizeof(r), 0);
		dir = moat_asprintf("%s/vms/%s-r%02x%02x%02x%02x",
		    vmd->cfg.state_dir, old->id.str, r[0], r[1], r[2], r[3]);
		if (dir == NULL) {
			sandbox_free(sb);
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
			goto out;
		}
		free(sb->dir);
		sb->dir = dir;
		sb->id = old->id;
	}
	rv = sandbox_bring_up(vmd, call, sb, snap_dir, meta->accel[0] ?
	    meta->accel : "tcg", old ? BRING_UP_REPLACE : BRING_UP_LISTED,
	    old, out);
out:
	vmd_snapram_release(vmd, req->snapshot_id);
	vmd_sandbox_put(old);
	free(labels);
	free(entries);
	free(snap_dir);
	moat__v1__local_snapshot__free_unpacked(meta, NULL);
	return rv;
}

/* ---- destroy ---- */

/* Unlists `id` and tears it down. Returns MOAT_OK or MOAT_NOT_FOUND. */
static int
sandbox_destroy(struct vmd *vmd, const char *id, uint64_t request_id)
{
	struct sandbox *sb;
	struct sandbox **pp;

	pthread_mutex_lock(&vmd->mu);
	for (pp = &vmd->sandboxes; *pp != NULL; pp = &(*pp)->next)
		if (strcmp((*pp)->id.str, id) == 0)
			break;
	if ((sb = *pp) == NULL) {
		pthread_mutex_unlock(&vmd->mu);
		return MOAT_NOT_FOUND;
	}
	/* The table's reference becomes ours. */
	*pp = sb->next;
	sb->listed = false;
	pthread_mutex_unlock(&vmd->mu);

	pthread_mutex_lock(&sb->mu);
	sb->destroying = true;
	pthread_cond_broadcast(&sb->cv);
	if (sb->state == MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING) {
		/* The creating thread owns the VMM until it gives up; make
		 * it give up now and wait until it has cleaned up. */
		if (sb->vmm.pid > 0 && !sb->vmm_exited)
			vmd->vmm->stop(&sb->vmm, true);
		while (!sb->gone)
			pthread_cond_wait(&sb->cv, &sb->mu);
		pthread_mutex_unlock(&sb->mu);
	} else {
		sb->state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED;
		pthread_mutex_unlock(&sb->mu);
		sandbox_teardown(sb, "the sandbox was destroyed");
	}
	moat_info(request_id, "sandbox %s: destroyed", id);
	vmd_sandbox_put(sb);
	return MOAT_OK;
}

int
vmd_sandbox_destroy(struct vmd *vmd, struct moat_rpc_call *call,
    const char *id)
{
	if (id == NULL || id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT, "sandbox_id "
		    "is empty: name a sandbox (moat sandbox ls lists "
		    "sandboxes)");
	if (sandbox_destroy(vmd, id, call->request_id) == MOAT_NOT_FOUND)
		return moat_rpc_error(call, MOAT_NOT_FOUND, "sandbox %s not "
		    "found (moat sandbox ls lists sandboxes)", id);
	return MOAT_OK;
}

void
vmd_sandbox_destroy_all(struct vmd *vmd)
{
	for (;;) {
		struct sandbox_id id;

		pthread_mutex_lock(&vmd->mu);
		vmd->shutting_down = true;
		if (vmd->sandboxes == NULL) {
			pthread_mutex_unlock(&vmd->mu);
			return;
		}
		id = vmd->sandboxes->id;
		pthread_mutex_unlock(&vmd->mu);
		(void)sandbox_destroy(vmd, id.str, 0);
	}
}

/* ---- reporting ---- */

int
vmd_sandbox_to_proto(struct sandbox *sb, Moat__V1__Sandbox *msg)
{
	struct vmd *vmd = sb->vmd;

	pthread_mutex_lock(&sb->mu);
	msg->state = sb->state;
	msg->boot_ms = sb->boot_ms;
	msg->vmm_pid = sb->vmm_exited ? 0 : sb->vmm.pid;
	msg->running_execs = sb->execs_running;
	msg->accel = strdup(sb->accel);
	msg->failure_reason = strdup(sb->failure_reason ? sb->failure_reason :
	    "");
	pthread_mutex_unlock(&sb->mu);
	msg->id = strdup(sb->id.str);
	msg->node_id = strdup(vmd->cfg.node_id);
	msg->vcpus = sb->vcpus;
	msg->memory_mib = sb->memory_mib;
	msg->image = strdup(sb->image);
	msg->scratch_mib = sb->scratch_mib;
	msg->driver = strdup(vmd->vmm->name);
	msg->created_unix_ms = sb->created_unix_ms;
	msg->tenant = strdup(sb->tenant);
	msg->template_id = strdup(sb->template_id ? sb->template_id : "");
	msg->restored_from = strdup(sb->restored_from ? sb->restored_from :
	    "");
	if (!msg->accel || !msg->failure_reason || !msg->id || !msg->node_id ||
	    !msg->image || !msg->driver || !msg->tenant || !msg->template_id ||
	    !msg->restored_from)
		return MOAT_INTERNAL;
	if (sb->n_labels > 0) {
		msg->labels = calloc(sb->n_labels, sizeof(*msg->labels));
		if (msg->labels == NULL)
			return MOAT_INTERNAL;
		for (size_t i = 0; i < sb->n_labels; i++) {
			Moat__V1__Sandbox__LabelsEntry *e = malloc(sizeof(*e));
			if (e == NULL)
				return MOAT_INTERNAL;
			moat__v1__sandbox__labels_entry__init(e);
			msg->labels[i] = e;
			msg->n_labels = i + 1;
			e->key = strdup(sb->label_keys[i]);
			e->value = strdup(sb->label_values[i]);
			if (e->key == NULL || e->value == NULL)
				return MOAT_INTERNAL;
		}
	}
	return MOAT_OK;
}

/* ---- orphans ---- */

void
vmd_reap_orphans(struct vmd *vmd)
{
	char *vms = moat_asprintf("%s/vms", vmd->cfg.state_dir);
	DIR *d;
	struct dirent *de;

	if (vms == NULL || (d = opendir(vms)) == NULL) {
		free(vms);
		return;
	}
	while ((de = readdir(d)) != NULL) {
		char *dir;
		bool killed;
		int err;

		if (de->d_name[0] == '.')
			continue;
		if ((dir = moat_asprintf("%s/%s", vms, de->d_name)) == NULL)
			continue;
		killed = vmd->vmm->reap_orphan(dir, de->d_name);
		if ((err = moat_rm_rf(dir)) != 0)
			moat_warn(0, "cannot remove %s left by an earlier vmd: "
			    "%s", dir, strerror(err));
		moat_info(0, "cleaned up sandbox %s left by an earlier vmd%s",
		    de->d_name, killed ? " (its VMM was still running and "
		    "was killed)" : "");
		free(dir);
	}
	closedir(d);
	free(vms);
}
