/*
 * sandbox_boot.c: bringing a sandbox up: admission (RAM dir, memory,
 * the table), its directory and scratch disk, one boot or restore of the
 * VMM under a deadline (spawn, connect the agent, wait for AgentReady),
 * the boot with one retry and the accelerator probe, and the step to
 * RUNNING (or, for a restore in place, the swap into the old sandbox's
 * place). Also the hidden boots the template builder asks for. Not for:
 * what a create or restore request means (sandbox_create.c,
 * sandbox_restore.c) or watching a sandbox once it runs
 * (sandbox_supervise.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "accel.h"
#include "extents.h"
#include "adopt.h"
#include "guest_link.h"
#include "image.h"
#include "metrics.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "ramdir.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "sandbox_supervise.h"
#include "scratch.h"
#include "snapram.h"
#include "sync.h"
#include "vmhost.h"

/* ---- boot ---- */

enum boot_outcome {
	BOOT_READY,
	BOOT_SPAWN_FAILED, /* the VMM did not start at all */
	BOOT_FAILED,       /* started, the guest never answered */
	BOOT_ABORTED,      /* destroyed meanwhile */
};

int
vmd_guest_reset(struct guest_link *link, const char *hostname, bool reseed,
    bool egress_on, uint64_t deadline, char **why)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ResetAfterRestore reset =
	    MOAT__V1__RESET_AFTER_RESTORE__INIT;
	Moat__V1__EgressMode egress = MOAT__V1__EGRESS_MODE__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	uint8_t entropy[64];
	struct timespec now;
	char *err = NULL;
	int rv;

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
	reset.hostname = (char *)hostname;
	reset.reseed = reseed;
	egress.on = egress_on;
	reset.egress = &egress;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_RESET;
	req.reset = &reset;
	rv = guest_link_call(link, &req, deadline, &reply, &err);
	explicit_bzero(entropy, sizeof(entropy));
	if (rv != MOAT_OK) {
		*why = moat_asprintf("the restored guest's agent did not "
		                     "answer the reset: %s",
		    err ? err : "?");
		free(err);
		return rv;
	}
	if (reply->code != MOAT__V1__CODE__OK) {
		*why =
		    moat_asprintf("the restored guest's agent refused the "
		                  "reset (clock, RNG, hostname, egress): %s",
		        reply->message);
		rv = (int)reply->code;
	}
	moat__v1__guest_message__free_unpacked(reply, NULL);
	return rv;
}

/* After a restore: lets the paused VMM load its device state and run
 * (unless it came running from the pool), then resets the guest
 * (vmd_guest_reset) as this sandbox: its clock, RNG (and, but in a
 * restore in place, its code contexts' generators), name and egress.
 * The agent was connected before the guest ran, so it keeps its session
 * and sends no new AgentReady. Returns 0 or a status with *why (heap). */
static int
sandbox_restore_finish(struct sandbox *sb, struct guest_link *link,
    const char *snap_dir, uint64_t deadline, char **why)
{
	uint64_t left = 0, t = moat_rpc_now_ms(), t_resumed;
	double t_resumed_exact;
	char *err = NULL;
	int rv;

	if (deadline > t)
		left = deadline - t;
	/* A pre-warmed pooled VMM runs already (pool.h). */
	if (!sb->prewarmed &&
	    (rv = sb->vmd->vmm->resume(&sb->vmm, snap_dir, (uint32_t)left,
	         &err)) != MOAT_OK) {
		*why = moat_asprintf("the VMM did not resume from the "
		                     "snapshot: %s",
		    err ? err : "?");
		free(err);
		return rv;
	}
	t_resumed = moat_rpc_now_ms();
	t_resumed_exact = vmd_now_ms_exact();
	/* The code contexts' random generators: reseeded in every new
	 * sandbox, kept by a restore in place (issue 18); this sandbox's
	 * egress, not the snapshot's origin's (issue 14). */
	rv = vmd_guest_reset(link, sb->id.str, !sb->keep_rng,
	    sb->egress_policy != NULL, deadline, why);
	sb->timings.reset_ms = vmd_now_ms_exact() - t_resumed_exact;
	moat_debug(0,
	    "sandbox %s: device state loaded and resumed in %" PRIu64
	    " ms, agent reset in %" PRIu64 " ms%s",
	    sb->id.str, t_resumed - t, moat_rpc_now_ms() - t_resumed,
	    sb->prewarmed ? " (a pre-warmed pooled VMM)" : "");
	return rv;
}

/* After a cold boot of an allowlist sandbox: turns the agent's egress
 * proxy on (issue 14; it is off until told, and a restore is told in its
 * reset). Returns 0 or a status with *why (heap). */
static int
boot_egress_on(struct sandbox *sb, uint64_t deadline, char **why)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__EgressMode mode = MOAT__V1__EGRESS_MODE__INIT;
	Moat__V1__GuestMessage *reply = NULL;
	struct guest_link *link;
	char *err = NULL;
	int rv;

	pthread_mutex_lock(&sb->mu);
	link = sb->link;
	pthread_mutex_unlock(&sb->mu);
	if (link == NULL) {
		*why = strdup("the guest link closed during boot");
		return MOAT_UNAVAILABLE;
	}
	mode.on = true;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EGRESS;
	req.egress = &mode;
	if ((rv = guest_link_call(link, &req, deadline, &reply, &err)) !=
	    MOAT_OK) {
		*why = moat_asprintf("the guest's agent did not answer the "
		                     "egress request: %s",
		    err ? err : "?");
		free(err);
		return rv;
	}
	if (reply->code != MOAT__V1__CODE__OK) {
		*why = moat_asprintf("the guest's agent cannot turn egress "
		                     "on: %s (an image older than this vmd? "
		                     "rebuild it with images/build.sh)",
		    reply->message);
		rv = (int)reply->code;
	}
	moat__v1__guest_message__free_unpacked(reply, NULL);
	return rv;
}

void
vmd_boot_files_free(struct vmd_boot_files *f)
{
	free(f->kernel);
	free(f->initrd);
	free(f->rootfs);
	free(f->scratch);
	free(f->extra);
	free(f->egress);
}

bool
vmd_boot_spec_make(struct sandbox *sb, const char *accel, const char *snap_dir,
    struct vmd_boot_files *f, struct moat_vmm_spec *spec)
{
	struct vmd *vmd = sb->vmd;
	const char *slash = strrchr(sb->dir, '/');

	f->kernel = vmd_image_path(vmd, sb->image, "vmlinux");
	f->initrd = vmd_image_path(vmd, sb->image, "initrd.img");
	f->rootfs = vmd_image_path(vmd, sb->image, "rootfs.ext4");
	f->scratch = moat_asprintf("%s/scratch.ext4", sb->dir);
	f->extra = sb->test_mode ?
	    moat_asprintf(VMD_TEST_LABEL "=%s", sb->test_mode) :
	    NULL;
	f->egress = sb->egress_policy ?
	    moat_asprintf("%s/egress.sock", sb->dir) :
	    NULL;
	if (!f->kernel || !f->initrd || !f->rootfs || !f->scratch ||
	    (sb->test_mode && !f->extra) || (sb->egress_policy && !f->egress))
		return false;
	/* The directory's name: the sandbox id, but for a restore in place,
	 * whose VM runs beside the one it replaces under a name of its own
	 * (the driver's files and ids must not collide). */
	spec->sandbox_id = slash ? slash + 1 : sb->id.str;
	spec->dir = sb->dir;
	spec->kernel = f->kernel;
	spec->initrd = f->initrd;
	spec->rootfs = f->rootfs;
	spec->scratch_disk = f->scratch;
	spec->vcpus = sb->vcpus;
	spec->memory_mib = sb->memory_mib;
	spec->accel = accel;
	spec->extra_cmdline = f->extra;
	spec->egress_socket = f->egress;
	spec->no_egress_port = sb->no_egress_port;
	spec->ram_source = snap_dir ? sb->ram_source : NULL;
	spec->ram_ready = snap_dir ? sb->ram_spare : NULL;
	spec->console_max_bytes = vmd->cfg.console_max_bytes;
	return true;
}

/* Starts (or restores) the VMM of `spec` and its supervisor. Returns
 * BOOT_READY when both run (the caller goes on), else the outcome with
 * *why (heap). */
static enum boot_outcome
boot_spawn(struct sandbox *sb, const struct moat_vmm_spec *spec,
    const char *snap_dir, char **why)
{
	struct vmd *vmd = sb->vmd;
	struct moat_vmm vm = { 0 };
	char *err = NULL;
	bool supervised;
	int rv;

	pthread_mutex_lock(&sb->mu);
	sb->agent_ready = false;
	sb->link_closed = false;
	free(sb->link_error);
	sb->link_error = NULL;
	sb->vmm_exited = false;
	sb->vmm_status = 0;
	pthread_mutex_unlock(&sb->mu);

	if (snap_dir != NULL && sb->pooled != NULL) {
		/* A pooled VMM (pool.h): started by the same restore for
		 * this directory, paused, waiting for the device state. */
		vm = *sb->pooled;
		free(sb->pooled);
		sb->pooled = NULL;
		moat_info(0,
		    "sandbox %s: restoring into a pooled VMM (pid %d%s)",
		    sb->id.str, (int)vm.pid,
		    sb->prewarmed ? ", pre-warmed" : "");
		rv = MOAT_OK;
	} else {
		rv = snap_dir == NULL ?
		    vmd->vmm->start(vmd->vmm_binary, spec, &vm, &err) :
		    vmd->vmm->restore(vmd->vmm_binary, spec, snap_dir, &vm,
		        &err);
	}
	if (sb->ram_spare != NULL) {
		/* Taken (renamed) by a driver that uses it; else it would
		 * hold tmpfs until vmd stops. Once only: a retry copies. */
		(void)unlink(sb->ram_spare);
		free(sb->ram_spare);
		sb->ram_spare = NULL;
	}
	if (rv != MOAT_OK) {
		*why = err ? err : strdup("the VMM did not start");
		return BOOT_SPAWN_FAILED;
	}
	pthread_mutex_lock(&sb->mu);
	sb->vmm = vm;
	sb->vmm.timings = &sb->timings.vmm; /* resume's phases */
	snprintf(sb->accel, sizeof(sb->accel), "%s", spec->accel);
	if (vmd_thread_create(&sb->supervisor, vmd_sandbox_supervise, sb) == 0)
		sb->supervisor_running = true;
	/* The proxy for this VM's egress port (a retry's VM gets its own). */
	if (spec->egress_socket != NULL && sb->egress == NULL)
		sb->egress = vmd_egress_start(vmd, spec->egress_socket,
		    sb->egress_policy, sb->tenant, sb->id.str);
	supervised = sb->supervisor_running;
	pthread_mutex_unlock(&sb->mu);
	if (!supervised) {
		*why = strdup("cannot start the supervisor thread");
		return BOOT_FAILED;
	}
	return BOOT_READY;
}

/* Connects the guest link (retrying while the VMM makes its socket)
 * and sets sb->link. Returns 0 (sb->link may stay NULL when the VMM
 * stopped or the deadline passed: the wait judges) or a status with
 * *why. */
static int
boot_connect(struct sandbox *sb, uint64_t deadline, char **why)
{
	struct vmd *vmd = sb->vmd;
	struct guest_link *link = NULL;
	char *err = NULL;
	int fd = -1;
	int rv;

	if (sb->pooled_link != NULL) {
		/* A pre-warmed pooled VMM's link, connected before its guest
		 * ran: its events are this sandbox's from now on. */
		link = sb->pooled_link;
		sb->pooled_link = NULL;
		if (!guest_link_set_hooks(link, &vmd_sandbox_link_hooks, sb)) {
			guest_link_shutdown(link, NULL);
			guest_link_free(link);
			*why = strdup("the pooled VM's guest link had closed");
			return MOAT_UNAVAILABLE;
		}
		pthread_mutex_lock(&sb->mu);
		sb->link = link;
		pthread_mutex_unlock(&sb->mu);
		return MOAT_OK;
	}
	/* QEMU makes the agent socket early in its start; retry until. */
	for (;;) {
		bool stop;

		rv = vmd->vmm->connect_agent(&sb->vmm, &fd, &err);
		if (rv == MOAT_OK)
			break;
		if (rv != MOAT_UNAVAILABLE) {
			*why = err;
			return rv;
		}
		free(err);
		err = NULL;
		pthread_mutex_lock(&sb->mu);
		stop = sb->vmm_exited || vmd_sandbox_stop_asked(sb);
		pthread_mutex_unlock(&sb->mu);
		if (stop || moat_rpc_now_ms() >= deadline)
			return MOAT_OK;
		/* A restore waits here for QEMU's start (~35 ms), half a
		 * poll on average: keep the poll short. */
		vmd_sleep_ms(2);
	}
	if ((rv = guest_link_open(&link, fd, 0, &vmd_sandbox_link_hooks, sb,
	         &err)) != MOAT_OK) {
		*why = err;
		return rv;
	}
	/* A restored guest may still answer the snapshot's vmd. */
	guest_link_skip_ids(link, sb->link_id_floor);
	pthread_mutex_lock(&sb->mu);
	sb->link = link;
	pthread_mutex_unlock(&sb->mu);
	return MOAT_OK;
}

/* Waits until the agent is ready, the VMM or link went, the sandbox is
 * destroyed, or `deadline`. Returns the outcome (*why, heap, unless
 * BOOT_READY). */
static enum boot_outcome
boot_wait_ready(struct sandbox *sb, uint64_t t0, uint64_t deadline,
    uint32_t timeout_ms, char **why)
{
	enum boot_outcome outcome = BOOT_FAILED;

	pthread_mutex_lock(&sb->mu);
	while (!sb->agent_ready && !sb->vmm_exited && !sb->link_closed &&
	    !vmd_sandbox_stop_asked(sb) && sb->link != NULL) {
		if (vmd_cond_wait_until(&sb->cv, &sb->mu, deadline) ==
		    ETIMEDOUT)
			break;
	}
	if (sb->agent_ready && !vmd_sandbox_stop_asked(sb)) {
		sb->boot_ms = moat_rpc_now_ms() - t0;
		outcome = BOOT_READY;
	} else if (vmd_sandbox_stop_asked(sb)) {
		outcome = BOOT_ABORTED;
		*why = strdup("the sandbox was destroyed while it booted");
	} else if (sb->vmm_exited) {
		char *how = vmd_exit_status_text(sb->vmm_status);
		char *said = vmd_log_tail(sb->vmm.vmm_log, 5);

		*why = moat_asprintf("the VMM exited during boot (%s)%s%s",
		    how ? how : "?", said && said[0] ? "; it said: " : "",
		    said ? said : "");
		free(how);
		free(said);
	} else if (sb->link_closed) {
		*why = strdup(sb->link_error ?
		        sb->link_error :
		        "the guest link closed during boot");
	} else {
		*why = moat_asprintf("the guest agent did not answer within "
		                     "%u ms",
		    timeout_ms);
	}
	pthread_mutex_unlock(&sb->mu);
	return outcome;
}

/* One boot attempt with accelerator `accel` and `timeout_ms` (a restore
 * from `snap_dir` when that is not NULL). Leaves the VMM running on
 * BOOT_READY; otherwise the caller tears it down. *why is heap (caller
 * frees) when not ready. */
static enum boot_outcome
sandbox_boot_once(struct sandbox *sb, const char *accel, uint32_t timeout_ms,
    const char *snap_dir, char **why)
{
	struct moat_vmm_spec spec = { 0 };
	struct vmd_boot_files files = { 0 };
	enum boot_outcome outcome;
	struct guest_link *link;
	uint64_t t0, deadline;
	double t = vmd_now_ms_exact(), t1;

	*why = NULL;
	if (!vmd_boot_spec_make(sb, accel, snap_dir, &files, &spec)) {
		*why = strdup("out of memory");
		outcome = BOOT_SPAWN_FAILED;
		goto out;
	}
	t0 = moat_rpc_now_ms();
	deadline = t0 + timeout_ms;
	if ((outcome = boot_spawn(sb, &spec, snap_dir, why)) != BOOT_READY)
		goto out;
	t1 = vmd_now_ms_exact();
	sb->timings.vmm_spawn_ms = t1 - t;
	outcome = BOOT_FAILED;
	if (boot_connect(sb, deadline, why) != MOAT_OK)
		goto out;
	t = vmd_now_ms_exact();
	sb->timings.agent_connect_ms = t - t1;
	if (snap_dir != NULL) {
		pthread_mutex_lock(&sb->mu);
		link = sb->link;
		pthread_mutex_unlock(&sb->mu);
		if (link == NULL) {
			*why =
			    moat_asprintf("the restored VM's agent "
			                  "socket did not open within %u ms",
			        timeout_ms);
			goto out;
		}
		if (sandbox_restore_finish(sb, link, snap_dir, deadline,
		        why) != MOAT_OK)
			goto out;
		pthread_mutex_lock(&sb->mu);
		sb->agent_ready = true;
		pthread_mutex_unlock(&sb->mu);
	}
	outcome = boot_wait_ready(sb, t0, deadline, timeout_ms, why);
	if (snap_dir == NULL)
		sb->timings.boot_wait_ms = vmd_now_ms_exact() - t;
	if (outcome == BOOT_READY && snap_dir == NULL &&
	    sb->egress_policy != NULL &&
	    boot_egress_on(sb, deadline, why) != MOAT_OK)
		outcome = BOOT_FAILED;
out:
	vmd_boot_files_free(&files);
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
	if (vmd_accel_permit(vmd, accel, why) != MOAT_OK) {
		free(kernel);
		return MOAT_FAILED_PRECONDITION;
	}
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
		console = vmd_log_tail(sb->vmm.console_log, VMD_CONSOLE_LINES);
		vmd_sandbox_vmm_teardown(sb, true, "the sandbox is stopping");
		pthread_mutex_lock(&sb->mu);
		if (vmd_sandbox_stop_asked(sb))
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
			if (vmd_accel_permit(vmd, accel, why) != MOAT_OK) {
				free(kernel);
				return MOAT_FAILED_PRECONDITION;
			}
			continue;
		}
		if (outcome == BOOT_SPAWN_FAILED || ++attempts >= 2) {
			*why = moat_asprintf("%s%s%s", reason ? reason : "?",
			    console && console[0] ? "; last console lines:\n" :
			                            " (the console is "
			                            "empty)",
			    console ? console : "");
			free(reason);
			free(console);
			free(kernel);
			return outcome == BOOT_SPAWN_FAILED ? MOAT_INTERNAL :
			                                      MOAT_UNAVAILABLE;
		}
		moat_warn(0,
		    "sandbox %s: boot attempt %d failed (%s); "
		    "retrying once",
		    sb->id.str, attempts, reason ? reason : "?");
		free(reason);
		free(console);
	}
}

/* ---- bringing a sandbox up ---- */

/* Admits sb on the node: room in the RAM dir for all of its memory,
 * its memory in the node's account, and (BRING_UP_LISTED) its place in
 * the table. On failure drops the caller's reference and returns a
 * status after moat_rpc_error. */
static int
bring_up_admit(struct vmd *vmd, struct moat_rpc_call *call, struct sandbox *sb,
    enum vmd_bring_up_mode mode)
{
	/* A pooled VMM's sandbox: its memory came counted with it. A
	 * private mapping of a snapshot's RAM puts nothing in the RAM dir. */
	bool pooled = sb->memory_reserved;
	uint64_t ram_bytes =
	    pooled || sb->ram_mapped ? 0 : (uint64_t)sb->memory_mib << 20;
	char what[64];
	int rv;

	/* Its RAM file may grow to all of its memory: the RAM dir must hold
	 * that on top of what it has promised, or the VMM would die of
	 * SIGBUS the day it touches a page that cannot be backed. */
	snprintf(what, sizeof(what), "a sandbox of %u MiB", sb->memory_mib);
	if (!pooled &&
	    (rv = vmd_ram_admit(vmd, call, ram_bytes, what)) != MOAT_OK) {
		vmd_sandbox_put(sb);
		return rv;
	}
	pthread_mutex_lock(&vmd->mu);
	if (vmd->shutting_down) {
		pthread_mutex_unlock(&vmd->mu);
		vmd_ram_admit_done(vmd, ram_bytes);
		if (pooled)
			vmd_sandbox_unreserve(sb);
		vmd_sandbox_put(sb);
		return moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "node %s is "
		    "shutting down: create the sandbox elsewhere",
		    vmd->cfg.node_id);
	}
	if (!pooled &&
	    vmd->memory_mib_reserved + sb->memory_mib >
	        vmd->cfg.memory_mib_total) {
		uint64_t free_mib =
		    vmd->cfg.memory_mib_total - vmd->memory_mib_reserved;
		pthread_mutex_unlock(&vmd->mu);
		vmd_ram_admit_done(vmd, ram_bytes);
		rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
		    "sandbox "
		    "needs %u MiB of memory but node %s has %" PRIu64
		    " of %" PRIu64
		    " MiB free: destroy sandboxes or ask for less "
		    "memory_mib",
		    sb->memory_mib, vmd->cfg.node_id, free_mib,
		    vmd->cfg.memory_mib_total);
		vmd_sandbox_put(sb);
		return rv;
	}
	/* A drain's restore takes a given id (sandbox_restore.c): two at
	 * once must not both list it. */
	for (struct sandbox *o = vmd->sandboxes;
	     mode == BRING_UP_LISTED && o != NULL; o = o->next) {
		if (strcmp(o->id.str, sb->id.str) != 0)
			continue;
		pthread_mutex_unlock(&vmd->mu);
		vmd_ram_admit_done(vmd, ram_bytes);
		rv = moat_rpc_error(call, MOAT_ALREADY_EXISTS,
		    "node %s already has a sandbox %s", vmd->cfg.node_id,
		    sb->id.str);
		if (pooled)
			vmd_sandbox_unreserve(sb);
		vmd_sandbox_put(sb);
		return rv;
	}
	if (!pooled) {
		vmd->memory_mib_reserved += sb->memory_mib;
		if (sb->ram_mapped)
			vmd->memory_mib_mapped += sb->memory_mib;
		sb->memory_reserved = true;
	}
	if (mode == BRING_UP_LISTED)
		vmd_sandbox_list_locked(sb);
	pthread_mutex_unlock(&vmd->mu);
	/* Counted in memory_mib_reserved from here on. */
	vmd_ram_admit_done(vmd, ram_bytes);
	return MOAT_OK;
}

/* Makes sb's directory and its scratch disk: a new one, or for a
 * restore a copy of the snapshot's (the snapshot's stays as it was).
 * Returns 0 or a status with *why (heap). */
static int
bring_up_disk(struct vmd *vmd, struct sandbox *sb, const char *snap_dir,
    char **why)
{
	char *scratch = NULL;
	char *src = NULL;
	uint64_t bytes = 0;
	struct stat st;
	int err;
	int rv = MOAT_OK;

	if ((err = moat_mkdir_p(sb->dir, 0700)) != 0) {
		*why = moat_asprintf("cannot create %s: %s", sb->dir,
		    strerror(err));
		return MOAT_INTERNAL;
	}
	/* A pooled VMM's directory holds its copy of the disk already. */
	if (sb->from_pool)
		return MOAT_OK;
	if ((scratch = moat_asprintf("%s/scratch.ext4", sb->dir)) == NULL) {
		*why = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if (snap_dir != NULL &&
	    (src = moat_asprintf("%s/" MOAT_VMM_SNAP_SCRATCH, snap_dir)) ==
	        NULL) {
		free(scratch);
		*why = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	/* The disk at its full size against the state dir's free space. */
	if (snap_dir == NULL)
		bytes = sb->scratch_mib << 20;
	else if (stat(src, &st) == 0)
		bytes = (uint64_t)st.st_size;
	if ((rv = vmd_scratch_admit(vmd, bytes, why)) != MOAT_OK)
		goto out;
	if (snap_dir == NULL) {
		rv = vmd_scratch_make(vmd, scratch, sb->scratch_mib, why);
		vmd_scratch_admit_done(vmd, bytes);
		goto out;
	}
	err = vmd_copy_sparse(src, scratch, NULL);
	vmd_scratch_admit_done(vmd, bytes);
	if (err != 0) {
		*why = moat_asprintf("cannot copy the snapshot's scratch disk "
		                     "%s: %s",
		    src, strerror(err));
		rv = moat_status_from_errno(err);
	}
out:
	free(src);
	free(scratch);
	return rv;
}

/* Boots sb (with retries) or restores it from `snap_dir` under `accel`
 * (once: a restore that fails is the caller's to judge). Returns 0 with
 * the VMM running, or a status with *why (heap), the VMM torn down. */
static int
bring_up_vmm(struct sandbox *sb, const char *snap_dir, const char *accel,
    char **why)
{
	if (snap_dir == NULL)
		return sandbox_boot(sb, why);
	if (vmd_accel_permit(sb->vmd, accel, why) != MOAT_OK)
		return MOAT_FAILED_PRECONDITION;
	if (sandbox_boot_once(sb, accel, sb->boot_timeout_ms, snap_dir, why) !=
	    BOOT_READY) {
		vmd_sandbox_vmm_teardown(sb, true, "the sandbox is stopping");
		return MOAT_UNAVAILABLE;
	}
	return MOAT_OK;
}

/* A restore in place: the new VM takes the old one's place in the table
 * and the old VM goes, only now that the new one runs. Returns 0 or a
 * status with *why (heap); then `replace` is left as it was. */
static int
bring_up_replace(struct vmd *vmd, struct sandbox *sb, struct sandbox *replace,
    char **why)
{
	bool stopped;

	pthread_mutex_lock(&sb->mu);
	stopped = sb->link_closed || sb->vmm_exited;
	pthread_mutex_unlock(&sb->mu);
	if (stopped) {
		*why = strdup("the restored VM stopped right after it "
		              "resumed");
		return MOAT_UNAVAILABLE;
	}
	if (!vmd_sandbox_swap_in(vmd, replace, sb)) {
		*why = moat_asprintf("sandbox %s was destroyed during the "
		                     "restore",
		    replace->id.str);
		return MOAT_ABORTED;
	}
	pthread_mutex_lock(&replace->mu);
	(void)vmd_sandbox_step(replace, SANDBOX_EV_DESTROY);
	pthread_mutex_unlock(&replace->mu);
	vmd_sandbox_teardown(replace, "the sandbox was restored in place");
	vmd_sandbox_put(replace); /* the table's reference */
	return MOAT_OK;
}

/* The VMM runs and the agent answered: BOOTED, unless the sandbox was
 * destroyed meanwhile (MOAT_ABORTED with *why). A guest that went wrong
 * right after it said ready leaves the sandbox FAILED (still MOAT_OK:
 * the client sees why). */
static int
bring_up_running(struct vmd *vmd, struct sandbox *sb,
    enum vmd_bring_up_mode mode, struct sandbox *replace, char **why)
{
	bool changed = false;
	int rv;

	pthread_mutex_lock(&sb->mu);
	if (vmd_sandbox_stop_asked(sb) ||
	    vmd_sandbox_step(sb, SANDBOX_EV_BOOTED) != SANDBOX_STEP_MOVED) {
		pthread_mutex_unlock(&sb->mu);
		*why = strdup("the sandbox was destroyed while it booted");
		return MOAT_ABORTED;
	}
	pthread_mutex_unlock(&sb->mu);
	if (mode == BRING_UP_REPLACE &&
	    (rv = bring_up_replace(vmd, sb, replace, why)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	if (sb->link_closed || sb->vmm_exited) {
		/* The guest went wrong right after it said ready. */
		char *reason = moat_asprintf("%s; the sandbox was stopped",
		    sb->link_error ? sb->link_error : "the VM stopped");

		changed = vmd_sandbox_fail_locked(sb,
		    reason ? reason : "the guest link closed");
		free(reason);
	}
	pthread_mutex_unlock(&sb->mu);
	if (changed)
		vmd_sandbox_unreserve(sb);
	return MOAT_OK;
}

/* The creating thread gives up: everything goes, the sandbox is
 * STOPPED (a destroy waiting for that returns), and the call's error
 * says why. Drops the caller's reference. */
static int
bring_up_fail(struct moat_rpc_call *call, struct sandbox *sb,
    const char *snap_dir, int rv, const char *why)
{
	moat_warn(call->request_id, "sandbox %s: %s failed: %s", sb->id.str,
	    snap_dir ? "restore" : "create", why ? why : "?");
	vmd_sandbox_teardown(sb, "the sandbox is stopping");
	vmd_sandbox_unlist(sb);
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_GAVE_UP);
	pthread_mutex_unlock(&sb->mu);
	if (rv == MOAT_UNAVAILABLE)
		rv = moat_rpc_error(call, rv, "sandbox %s did not %s: %s",
		    sb->id.str, snap_dir ? "restore" : "boot",
		    why ? why : "?");
	else
		rv = moat_rpc_error(call, rv, "sandbox %s: %s", sb->id.str,
		    why ? why : "?");
	vmd_sandbox_put(sb);
	return rv;
}

/* The sandbox runs: its phases end (finish from `t_finish`), go to the
 * log's "running" line and the phase histograms. */
static void
bring_up_timed(struct moat_rpc_call *call, struct sandbox *sb,
    const char *snap_dir, double t_finish)
{
	struct vmd_create_timings *tm = &sb->timings;
	double now = vmd_now_ms_exact();
	double ph[VMD_PHASE_N];

	pthread_mutex_lock(&sb->mu);
	if (tm->kind == NULL)
		tm->kind = snap_dir ? "restore" : "boot";
	tm->finish_ms = now - t_finish;
	tm->total_ms = now - tm->t0;
	pthread_mutex_unlock(&sb->mu);
	moat_info(call->request_id,
	    "sandbox %s: running (%s, pid %d, %s "
	    "%" PRIu64 " ms; %s %.1f ms: prepare %.1f, admit %.1f, disk %.1f, "
	    "spawn %.1f, agent connect %.1f, qmp %.1f, ram wait %.1f "
	    "(copy %.1f), device load %.1f, resume %.1f, reset %.1f, "
	    "boot wait %.1f, finish %.1f)",
	    sb->id.str, sb->accel, (int)sb->vmm.pid,
	    snap_dir ? "restore" : "boot", sb->boot_ms, tm->kind, tm->total_ms,
	    tm->prepare_ms, tm->admit_ms, tm->disk_ms, tm->vmm_spawn_ms,
	    tm->agent_connect_ms, tm->vmm.qmp_wait_ms, tm->vmm.ram_wait_ms,
	    tm->vmm.ram_copy_ms, tm->vmm.device_load_ms, tm->vmm.resume_ms,
	    tm->reset_ms, tm->boot_wait_ms, tm->finish_ms);
	ph[VMD_PHASE_TOTAL] = tm->total_ms;
	ph[VMD_PHASE_PREPARE] = tm->prepare_ms;
	ph[VMD_PHASE_ADMIT] = tm->admit_ms;
	ph[VMD_PHASE_DISK] = tm->disk_ms;
	ph[VMD_PHASE_VMM_SPAWN] = tm->vmm_spawn_ms;
	ph[VMD_PHASE_AGENT_CONNECT] = tm->agent_connect_ms;
	ph[VMD_PHASE_QMP_WAIT] = tm->vmm.qmp_wait_ms;
	ph[VMD_PHASE_RAM_WAIT] = tm->vmm.ram_wait_ms;
	ph[VMD_PHASE_DEVICE_LOAD] = tm->vmm.device_load_ms;
	ph[VMD_PHASE_RESUME] = tm->vmm.resume_ms;
	ph[VMD_PHASE_RESET] = tm->reset_ms;
	ph[VMD_PHASE_BOOT_WAIT] = tm->boot_wait_ms;
	vmd_metrics_create_phases(ph);
}

int
vmd_sandbox_bring_up(struct vmd *vmd, struct moat_rpc_call *call,
    struct sandbox *sb, const char *snap_dir, const char *accel,
    enum vmd_bring_up_mode mode, struct sandbox *replace, struct sandbox **out)
{
	struct vmd_create_timings *tm = &sb->timings;
	char *why = NULL;
	char cur[8];
	double t;
	int rv;

	if (tm->t0 == 0)
		tm->t0 = vmd_now_ms_exact();
	t = vmd_now_ms_exact();
	tm->prepare_ms = t - tm->t0;
	/* No silent TCG (accel.c): refused before anything is made. */
	vmd_accel_current(vmd, cur);
	if (vmd_accel_permit(vmd, snap_dir ? accel : cur, &why) != MOAT_OK) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION, "%s", why);
		free(why);
		vmd_sandbox_put(sb);
		return rv;
	}
	/* As the driver maps it (qemu.c's qemu_ram_backing). */
	if (!sb->memory_reserved)
		sb->ram_mapped = snap_dir != NULL && vmd_ram_private();
	if ((rv = bring_up_admit(vmd, call, sb, mode)) != MOAT_OK)
		return rv;
	tm->admit_ms = vmd_now_ms_exact() - t;
	moat_info(call->request_id,
	    "sandbox %s: %s (image %s, %u vcpus, "
	    "%u MiB, scratch %" PRIu64 " MiB%s%s)",
	    sb->id.str, snap_dir ? "restoring" : "creating", sb->image,
	    sb->vcpus, sb->memory_mib, sb->scratch_mib,
	    sb->test_mode ? ", test mode " : "",
	    sb->test_mode ? sb->test_mode : "");
	t = vmd_now_ms_exact();
	if ((rv = bring_up_disk(vmd, sb, snap_dir, &why)) == MOAT_OK)
		tm->disk_ms = vmd_now_ms_exact() - t;
	if (rv == MOAT_OK)
		rv = bring_up_vmm(sb, snap_dir, accel, &why);
	t = vmd_now_ms_exact();
	if (rv != MOAT_OK ||
	    (rv = bring_up_running(vmd, sb, mode, replace, &why)) != MOAT_OK) {
		vmd_metrics_boot_failed(
		    snap_dir ? VMD_BOOT_RESTORE : VMD_BOOT_COLD);
		rv = bring_up_fail(call, sb, snap_dir, rv, why);
		free(why);
		return rv;
	}
	vmd_metrics_boot(snap_dir ? VMD_BOOT_RESTORE : VMD_BOOT_COLD,
	    sb->boot_ms);
	free(why);
	/* The boot is not idleness: the idle timeout counts from now. */
	vmd_lifetime_touch(&sb->life, moat_now_unix_ms());
	/* A restarted vmd re-adopts what this file names (adopt.h). */
	if (mode != BRING_UP_HIDDEN)
		(void)vmd_adopt_save(sb);
	bring_up_timed(call, sb, snap_dir, t);
	*out = sb;
	return MOAT_OK;
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
	if ((rv = vmd_sandbox_validate(vmd, call, &req, shape->image,
	         &test_mode)) != MOAT_OK)
		return rv;
	if ((sb = vmd_sandbox_alloc(vmd, &req, shape->image, NULL)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	/* The slot's own reference, so an abort can reach it mid-boot. */
	sb->refs++;
	pthread_mutex_lock(slot_mu);
	*slot = sb;
	pthread_mutex_unlock(slot_mu);
	return vmd_sandbox_bring_up(vmd, call, sb, NULL, NULL, BRING_UP_HIDDEN,
	    NULL, out);
}
