/*
 * adopt.c: sandboxes that outlive their vmd (see adopt.h): the state
 * file written for each listed sandbox, the re-adoption of live VMMs by
 * a starting vmd, and the shutdown that leaves them running. The codec
 * is adopt_state.c. Not for: booting (sandbox_boot.c) or destroying
 * (sandbox.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adopt.h"
#include "egress.h"
#include "guest_link.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "sandbox.h"
#include "sandbox_supervise.h"
#include "sync.h"

/* How long an adopted guest's agent has to greet the new link (it looks
 * for a host every 20 ms; a TCG guest on a busy host is slow). */
#define ADOPT_AGENT_MS 30000u
/* One link's wait for AgentReady, and how long the agent's port is left
 * without a host before the next link (see adopt_link). */
#define ADOPT_TRY_MS 4000u
#define ADOPT_GAP_MS 1000u
/* How long a shutdown waits for a snapshot in progress before it leaves
 * the sandbox anyway. */
#define DETACH_SNAPSHOT_WAIT_MS 30000u

/* ---- the state file ---- */

/* Fills r from sb (borrowing sb's strings: do not fini r). sb->mu held.
 * *network is heap (the caller frees). */
static bool
record_of(struct sandbox *sb, struct vmd_state_record *r, char **network)
{
	Moat__V1__NetworkPolicy *np = vmd_egress_to_proto(sb->egress_policy);

	*network = np ? vmd_egress_label(np) : NULL;
	if (np != NULL)
		moat__v1__network_policy__free_unpacked(np, NULL);
	if (*network == NULL)
		return false;
	memset(r, 0, sizeof(*r));
	r->id = sb->id.str;
	r->tenant = sb->tenant;
	r->image = sb->image;
	r->test_mode = sb->test_mode;
	r->template_id = sb->template_id;
	r->restored_from = sb->restored_from;
	r->network = *network;
	r->accel = sb->accel;
	r->driver = (char *)sb->vmd->vmm->name;
	r->vmm_info = sb->vmm_exited ? NULL : sb->vmm.adopt_info;
	r->failure = sb->lifecycle == SANDBOX_FAILED ?
	    (sb->failure_reason ? sb->failure_reason : "it failed") :
	    NULL;
	r->label_keys = sb->label_keys;
	r->label_values = sb->label_values;
	r->n_labels = sb->n_labels;
	r->vcpus = sb->vcpus;
	r->memory_mib = sb->memory_mib;
	r->scratch_mib = sb->scratch_mib;
	r->boot_timeout_ms = sb->boot_timeout_ms;
	r->created_unix_ms = sb->created_unix_ms;
	r->pulled_bytes = sb->pulled_bytes;
	r->boot_ms = sb->boot_ms;
	r->no_egress_port = sb->no_egress_port;
	r->pid = sb->vmm_exited ? 0 : sb->vmm.pid;
	r->jail_uid = (uint32_t)vmd_jail_uid(sb->vmm.jail);
	r->adoptions = sb->adoptions;
	r->expires_unix_ms = sb->life.expires_unix_ms;
	r->idle_timeout_s = sb->life.idle_timeout_s;
	r->last_active_unix_ms =
	    __atomic_load_n(&sb->life.last_active_unix_ms, __ATOMIC_RELAXED);
	return true;
}

/* Writes the state file atomically. A jailed VMM may write its sandbox
 * directory (not replace vmd's files in it: the sticky bit), so the
 * temporary file is made fresh (O_EXCL, no symlink followed) and the
 * state file stays vmd's own: a VMM cannot plant or edit what the next
 * vmd trusts. Returns 0 or an errno value. */
static int
state_write(const char *path, const char *text, size_t len)
{
	char *tmp = moat_asprintf("%s.tmp", path);
	int fd = -1, err = 0;

	if (tmp == NULL)
		return ENOMEM;
	(void)unlink(tmp);
	if ((fd = open(tmp,
	         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) <
	    0) {
		err = errno;
		free(tmp);
		return err;
	}
	while (err == 0 && len > 0) {
		ssize_t n = write(fd, text, len);

		if (n < 0 && errno != EINTR)
			err = errno;
		if (n > 0) {
			text += n;
			len -= (size_t)n;
		}
	}
	if (err == 0 && fsync(fd) != 0)
		err = errno;
	close(fd);
	if (err == 0 && rename(tmp, path) != 0)
		err = errno;
	if (err != 0)
		(void)unlink(tmp);
	free(tmp);
	return err;
}

/* Reads a state file that vmd wrote: a regular file of vmd's own user
 * (not a symlink, not one a VMM made). Returns 0 with *text (heap) or
 * an errno value (EPERM: someone else's). */
static int
state_read(const char *path, char **text, size_t *len)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	size_t got = 0;
	char *buf;
	int err = 0;

	*text = NULL;
	*len = 0;
	if (fd < 0)
		return errno;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_uid != geteuid()) {
		close(fd);
		return EPERM;
	}
	if ((buf = malloc(VMD_STATE_MAX + 2)) == NULL) {
		close(fd);
		return ENOMEM;
	}
	/* One byte over the cap: the decoder says it is too big. */
	while (got < VMD_STATE_MAX + 1) {
		ssize_t n = read(fd, buf + got, VMD_STATE_MAX + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			err = errno;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	if (err != 0) {
		free(buf);
		return err;
	}
	buf[got] = '\0';
	*text = buf;
	*len = got;
	return 0;
}

int
vmd_adopt_save(struct sandbox *sb)
{
	struct vmd_state_record r;
	char *network = NULL, *text = NULL, *path;
	size_t len = 0;
	int err, rv = MOAT_OK;

	pthread_mutex_lock(&sb->mu);
	if (!record_of(sb, &r, &network) ||
	    vmd_state_encode(&r, &text, &len) != MOAT_OK)
		rv = MOAT_INTERNAL;
	pthread_mutex_unlock(&sb->mu);
	free(network);
	path = moat_asprintf("%s/" VMD_STATE_FILE, sb->dir);
	if (rv != MOAT_OK || path == NULL) {
		moat_warn(0,
		    "sandbox %s: out of memory writing its state file",
		    sb->id.str);
		free(text);
		free(path);
		return MOAT_INTERNAL;
	}
	if ((err = state_write(path, text, len)) != 0) {
		moat_warn(0,
		    "sandbox %s: cannot write %s: %s (a vmd restart would "
		    "lose the sandbox: free space in the state dir)",
		    sb->id.str, path, strerror(err));
		rv = moat_status_from_errno(err);
	}
	free(text);
	free(path);
	return rv;
}

/* ---- re-adoption ---- */

/* A new sandbox object for r, in directory `dir` (not listed, BOOTING,
 * one reference), or NULL with *why. */
static struct sandbox *
adopt_alloc(struct vmd *vmd, const struct vmd_state_record *r, const char *dir,
    char **why)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__NetworkPolicy *np = NULL;
	Moat__V1__CreateSandboxRequest__LabelsEntry *entries = NULL;
	Moat__V1__CreateSandboxRequest__LabelsEntry **labels = NULL;
	struct sandbox *sb = NULL;

	if (r->network != NULL && r->network[0] != '\0' &&
	    vmd_egress_from_label(r->network, &np) != MOAT_OK) {
		*why = moat_asprintf("its network \"%.80s\" is not a policy",
		    r->network);
		return NULL;
	}
	req.vcpus = r->vcpus;
	req.memory_mib = r->memory_mib;
	req.scratch_mib = r->scratch_mib;
	req.boot_timeout_ms = r->boot_timeout_ms;
	req.tenant = r->tenant;
	req.network = np;
	if (r->n_labels > 0) {
		entries = calloc(r->n_labels, sizeof(*entries));
		labels = calloc(r->n_labels, sizeof(*labels));
		if (entries == NULL || labels == NULL)
			goto out;
		for (size_t i = 0; i < r->n_labels; i++) {
			moat__v1__create_sandbox_request__labels_entry__init(
			    &entries[i]);
			entries[i].key = r->label_keys[i];
			entries[i].value = r->label_values[i];
			labels[i] = &entries[i];
		}
		req.labels = labels;
		req.n_labels = r->n_labels;
	}
	if ((sb = vmd_sandbox_alloc(vmd, &req, r->image, r->test_mode)) ==
	    NULL)
		goto out;
	snprintf(sb->id.str, sizeof(sb->id.str), "%s", r->id);
	free(sb->dir);
	sb->dir = strdup(dir);
	sb->created_unix_ms = r->created_unix_ms;
	sb->template_id = r->template_id ? strdup(r->template_id) : NULL;
	sb->restored_from = r->restored_from ? strdup(r->restored_from) : NULL;
	sb->pulled_bytes = r->pulled_bytes;
	sb->boot_ms = r->boot_ms;
	sb->no_egress_port = r->no_egress_port;
	snprintf(sb->accel, sizeof(sb->accel), "%s", r->accel ? r->accel : "");
	sb->adoptions = r->adoptions + 1;
	/* The lifetime goes on; the restart itself counts as activity
	 * (no call could reach the sandbox while vmd was down). */
	sb->life.expires_unix_ms = r->expires_unix_ms;
	sb->life.idle_timeout_s = r->idle_timeout_s;
	sb->exec_id_floor = (uint64_t)sb->adoptions << VMD_EXEC_ID_GEN_SHIFT;
	if (sb->dir == NULL || (r->template_id && !sb->template_id) ||
	    (r->restored_from && !sb->restored_from)) {
		vmd_sandbox_free(sb);
		sb = NULL;
	}
out:
	if (sb == NULL && *why == NULL)
		*why = strdup("out of memory");
	free(entries);
	free(labels);
	if (np != NULL)
		moat__v1__network_policy__free_unpacked(np, NULL);
	return sb;
}

/* One try at a guest link to the adopted VM: connects and waits until
 * `try_until` for the agent's AgentReady. Returns 0 with sb->link set;
 * MOAT_UNAVAILABLE to try again (the link is gone again); another
 * status when the VM is gone. *why (heap) says what happened. */
static int
adopt_link_try(struct sandbox *sb, uint64_t try_until, char **why)
{
	const struct moat_vmm_ops *ops = sb->vmd->vmm;
	struct guest_link *link = NULL;
	char *err = NULL;
	int fd = -1;
	int rv;

	while ((rv = ops->connect_agent(&sb->vmm, &fd, &err)) ==
	        MOAT_UNAVAILABLE &&
	    moat_rpc_now_ms() < try_until)
		vmd_sleep_ms(20);
	if (rv != MOAT_OK) {
		*why = moat_asprintf("cannot connect to its agent socket: %s",
		    err ? err : "it is not there");
		free(err);
		return rv == MOAT_UNAVAILABLE ? MOAT_FAILED_PRECONDITION : rv;
	}
	if ((rv = guest_link_open(&link, fd, 0, &vmd_sandbox_link_hooks, sb,
	         &err)) != MOAT_OK) {
		*why = err;
		return rv;
	}
	/* Exec ids of earlier vmds are never handed out again. */
	guest_link_skip_ids(link, sb->exec_id_floor);
	pthread_mutex_lock(&sb->mu);
	sb->link = link;
	while (!sb->agent_ready && !sb->link_closed && !sb->vmm_exited &&
	    vmd_cond_wait_until(&sb->cv, &sb->mu, try_until) == 0)
		;
	if (sb->agent_ready) {
		pthread_mutex_unlock(&sb->mu);
		return MOAT_OK;
	}
	rv = sb->vmm_exited ? MOAT_FAILED_PRECONDITION : MOAT_UNAVAILABLE;
	*why = strdup(sb->vmm_exited ? "the VMM exited" :
	        sb->link_error       ? sb->link_error :
	                               "no AgentReady");
	/* No RPC has seen this link: it goes at once. */
	sb->link = NULL;
	sb->link_closed = false;
	free(sb->link_error);
	sb->link_error = NULL;
	pthread_mutex_unlock(&sb->mu);
	guest_link_shutdown(link, NULL);
	guest_link_free(link);
	return rv;
}

/* Opens a new guest link to the adopted VM and waits for its agent's
 * AgentReady. The agent greets a host it sees arrive after one it saw
 * leave; one that missed the gap (a busy TCG guest) still serves the
 * old session, so a silent link is dropped for a while (the agent then
 * sees the port without a host, ending that session) and made again.
 * Returns 0 or a status with *why (heap). */
static int
adopt_link(struct sandbox *sb, char **why)
{
	uint64_t deadline = moat_rpc_now_ms() + ADOPT_AGENT_MS;
	char *err = NULL;
	int rv;

	for (int tries = 1;; tries++) {
		uint64_t try_until = moat_rpc_now_ms() + ADOPT_TRY_MS;

		free(err);
		err = NULL;
		if (try_until > deadline)
			try_until = deadline;
		if ((rv = adopt_link_try(sb, try_until, &err)) !=
		    MOAT_UNAVAILABLE)
			break;
		if (moat_rpc_now_ms() + ADOPT_GAP_MS >= deadline)
			break;
		moat_info(0,
		    "sandbox %s: its agent did not greet link %d (%s); "
		    "dropping it for %u ms and trying again",
		    sb->id.str, tries, err ? err : "?", ADOPT_GAP_MS);
		vmd_sleep_ms(ADOPT_GAP_MS);
	}
	if (rv != MOAT_OK) {
		*why =
		    moat_asprintf("its guest agent did not greet a new link "
		                  "within %u ms (%s)",
		        ADOPT_AGENT_MS, err ? err : "?");
		rv = rv == MOAT_UNAVAILABLE ? MOAT_FAILED_PRECONDITION : rv;
	}
	free(err);
	return rv;
}

/* Takes over the live VMM of sb per r: the driver's checks, the
 * supervisor, the guest link and the egress proxy. Returns 0 with sb
 * RUNNING, or a status with *why (heap); sb then still BOOTING, and the
 * caller fails it. */
static int
adopt_vmm(struct sandbox *sb, const struct vmd_state_record *r, char **why)
{
	struct vmd *vmd = sb->vmd;
	struct moat_vmm_spec spec = { 0 };
	const char *slash = strrchr(sb->dir, '/');
	char *egress_sock = NULL;
	int rv;

	spec.sandbox_id = slash ? slash + 1 : sb->id.str;
	spec.dir = sb->dir;
	spec.vcpus = sb->vcpus;
	spec.memory_mib = sb->memory_mib;
	spec.accel = sb->accel;
	spec.console_max_bytes = vmd->cfg.console_max_bytes;
	spec.adopt_info = r->vmm_info;
	if ((rv = vmd->vmm->adopt(&spec, (pid_t)r->pid, (uid_t)r->jail_uid,
	         &sb->vmm, why)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	sb->vmm_adopted = true;
	if (vmd_thread_create(&sb->supervisor, vmd_sandbox_supervise, sb) == 0)
		sb->supervisor_running = true;
	pthread_mutex_unlock(&sb->mu);
	if (!sb->supervisor_running) {
		*why = strdup("cannot start its supervisor thread");
		return MOAT_INTERNAL;
	}
	if ((rv = adopt_link(sb, why)) != MOAT_OK)
		return rv;
	if (sb->egress_policy != NULL) {
		if ((egress_sock = moat_asprintf("%s/egress.sock", sb->dir)) ==
		    NULL) {
			*why = strdup("out of memory");
			return MOAT_INTERNAL;
		}
		pthread_mutex_lock(&sb->mu);
		sb->egress = vmd_egress_start(vmd, egress_sock,
		    sb->egress_policy, sb->tenant, sb->id.str);
		pthread_mutex_unlock(&sb->mu);
		free(egress_sock);
	}
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_BOOTED);
	pthread_mutex_unlock(&sb->mu);
	return MOAT_OK;
}

/* Leaves sb FAILED with `reason` and no VMM: what the old vmd left of
 * its VMM is stopped and its RAM file, cgroup and jail are released (the
 * directory stays until the sandbox is destroyed). */
static void
adopt_fail(struct sandbox *sb, const char *reason)
{
	struct vmd *vmd = sb->vmd;
	const char *slash = strrchr(sb->dir, '/');
	bool was_live;

	pthread_mutex_lock(&sb->mu);
	was_live = sb->vmm.pid > 0;
	pthread_mutex_unlock(&sb->mu);
	if (was_live)
		vmd_sandbox_vmm_teardown(sb, false, reason);
	/* A VMM the driver would not adopt (no QMP, wrong state) must not
	 * run on unwatched. */
	(void)vmd->vmm->reap_orphan(sb->dir, slash ? slash + 1 : sb->id.str);
	pthread_mutex_lock(&sb->mu);
	/* Never ran under this vmd: straight to FAILED. */
	sb->lifecycle = SANDBOX_FAILED;
	free(sb->failure_reason);
	sb->failure_reason = strdup(reason);
	pthread_cond_broadcast(&sb->cv);
	pthread_mutex_unlock(&sb->mu);
}

/* Reserves sb's memory and lists it. False when its id is listed
 * already (a second directory of one sandbox). */
static bool
adopt_list(struct vmd *vmd, struct sandbox *sb)
{
	pthread_mutex_lock(&vmd->mu);
	for (struct sandbox *o = vmd->sandboxes; o != NULL; o = o->next)
		if (strcmp(o->id.str, sb->id.str) == 0) {
			pthread_mutex_unlock(&vmd->mu);
			return false;
		}
	if (sb->lifecycle != SANDBOX_FAILED) {
		vmd->memory_mib_reserved += sb->memory_mib;
		sb->memory_reserved = true;
	}
	vmd_sandbox_list_locked(sb);
	pthread_mutex_unlock(&vmd->mu);
	return true;
}

/* Cleans up `dir` (of name `name`) as an earlier vmd's leftover. */
static void
adopt_reap(struct vmd *vmd, const char *dir, const char *name, const char *why)
{
	bool killed = vmd->vmm->reap_orphan(dir, name);
	int err;

	if ((err = moat_rm_rf(dir)) != 0)
		moat_warn(0, "cannot remove %s left by an earlier vmd: %s",
		    dir, strerror(err));
	moat_info(0, "cleaned up sandbox %s left by an earlier vmd%s: %s",
	    name, killed ? " (its VMM was still running and was killed)" : "",
	    why);
}

/* One directory of <state>/vms named `name`. */
static void
adopt_one(struct vmd *vmd, const char *dir, const char *name)
{
	struct vmd_state_record r;
	struct sandbox *sb = NULL;
	char *path = moat_asprintf("%s/" VMD_STATE_FILE, dir);
	char *text = NULL, *why = NULL, *reason = NULL;
	size_t len = 0;
	int err;

	memset(&r, 0, sizeof(r));
	if (path == NULL)
		return;
	if ((err = state_read(path, &text, &len)) != 0) {
		adopt_reap(vmd, dir, name,
		    err == ENOENT    ? "no state file: it never ran" :
		        err == EPERM ? "its state file is not vmd's own" :
		                       strerror(err));
		goto out;
	}
	if (vmd_state_decode(text, len, &r, &why) != MOAT_OK) {
		/* Without a whole file there is no tenant to show it to. */
		char *what =
		    moat_asprintf("state file %s: %s", path, why ? why : "?");

		adopt_reap(vmd, dir, name, what ? what : "bad state file");
		free(what);
		goto out;
	}
	free(why);
	why = NULL;
	if ((sb = adopt_alloc(vmd, &r, dir, &why)) == NULL) {
		moat_warn(0, "sandbox %s: cannot adopt it: %s", r.id,
		    why ? why : "?");
		adopt_reap(vmd, dir, name, why ? why : "?");
		goto out;
	}
	if (r.failure != NULL) {
		reason = strdup(r.failure);
	} else if (strcmp(r.driver, vmd->vmm->name) != 0 ||
	    vmd->vmm->adopt == NULL) {
		reason = moat_asprintf("vmd restarted with VMM driver %s, and "
		                       "this sandbox's VMM (%s) cannot be "
		                       "re-adopted by it: destroy the sandbox",
		    vmd->vmm->name, r.driver);
	} else if (adopt_vmm(sb, &r, &why) != MOAT_OK) {
		reason = moat_asprintf("vmd restarted and could not re-adopt "
		                       "this sandbox: %s (state file %s); "
		                       "destroy it",
		    why ? why : "?", path);
	}
	if (reason != NULL)
		adopt_fail(sb, reason);
	if (!adopt_list(vmd, sb)) {
		/* Another directory holds this id: a restore in place that
		 * vmd died in the middle of. The first one listed stays. */
		vmd_sandbox_teardown(sb, "a duplicate of a listed sandbox");
		moat_warn(0, "sandbox %s: %s is a second copy; removed", r.id,
		    dir);
		goto out;
	}
	(void)vmd_adopt_save(sb);
	if (reason != NULL)
		moat_warn(0, "sandbox %s: FAILED on adoption: %s", r.id,
		    reason);
	else
		moat_info(0,
		    "sandbox %s: re-adopted its running VMM (pid %d, %s; "
		    "adoption %u; execs from before are lost)",
		    r.id, (int)sb->vmm.pid, sb->accel, sb->adoptions);
out:
	vmd_sandbox_put(sb);
	vmd_state_record_fini(&r);
	free(reason);
	free(why);
	free(text);
	free(path);
}

void
vmd_adopt_all(struct vmd *vmd)
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

		if (de->d_name[0] == '.')
			continue;
		if ((dir = moat_asprintf("%s/%s", vms, de->d_name)) == NULL)
			continue;
		adopt_one(vmd, dir, de->d_name);
		free(dir);
	}
	closedir(d);
	free(vms);
}

/* ---- shutdown without destroying ---- */

/* Lets sb's VMM run on: writes its state file, stops watching it and
 * closes what vmd held of it. sb is unlisted by the caller. */
static void
detach_one(struct sandbox *sb)
{
	const struct moat_vmm_ops *ops = sb->vmd->vmm;
	struct guest_link *link;
	struct vmd_egress *egress;
	uint64_t one = 1;
	bool join;

	(void)vmd_adopt_save(sb);
	pthread_mutex_lock(&sb->mu);
	join = sb->supervisor_running;
	sb->supervisor_running = false;
	link = sb->link;
	egress = sb->egress;
	sb->egress = NULL;
	pthread_mutex_unlock(&sb->mu);
	if (join) {
		(void)!write(sb->supervise_stop_fd, &one, sizeof(one));
		pthread_join(sb->supervisor, NULL);
	}
	vmd_egress_stop(egress);
	guest_link_shutdown(link,
	    "vmd is stopping; the sandbox runs on for "
	    "the next vmd");
	pthread_mutex_lock(&sb->mu);
	ops->detach(&sb->vmm);
	memset(&sb->vmm, 0, sizeof(sb->vmm));
	pthread_mutex_unlock(&sb->mu);
	moat_info(0, "sandbox %s: left running for the next vmd", sb->id.str);
}

/* Takes the first listed sandbox out of the table (its reference
 * becomes the caller's), or NULL when none is left. */
static struct sandbox *
detach_take(struct vmd *vmd)
{
	struct sandbox *sb;

	pthread_mutex_lock(&vmd->mu);
	vmd->shutting_down = true;
	if ((sb = vmd->sandboxes) != NULL) {
		vmd->sandboxes = sb->next;
		sb->listed = false;
	}
	pthread_mutex_unlock(&vmd->mu);
	return sb;
}

void
vmd_adopt_detach_all(struct vmd *vmd)
{
	struct sandbox *sb;

	while ((sb = detach_take(vmd)) != NULL) {
		uint64_t until = moat_rpc_now_ms() + DETACH_SNAPSHOT_WAIT_MS;
		bool keep, failed;

		pthread_mutex_lock(&sb->mu);
		/* A snapshot in progress pauses the guest: let it end. */
		while ((sb->lifecycle == SANDBOX_SNAPSHOTTING ||
		           sb->lifecycle == SANDBOX_RELINKING) &&
		    vmd_cond_wait_until(&sb->cv, &sb->mu, until) == 0)
			;
		keep = vmd_sandbox_state_live(sb->lifecycle) &&
		    sb->vmm.pid > 0 && !sb->vmm_exited &&
		    vmd->vmm->detach != NULL && sb->supervise_stop_fd >= 0;
		failed =
		    sb->lifecycle == SANDBOX_FAILED && vmd->vmm->adopt != NULL;
		pthread_mutex_unlock(&sb->mu);
		if (keep) {
			detach_one(sb);
		} else if (failed) {
			/* Kept, with its reason, for the next vmd to show. */
			(void)vmd_adopt_save(sb);
			vmd_sandbox_vmm_teardown(sb, false, "vmd is stopping");
		} else {
			vmd_sandbox_destroy_unlisted(sb, 0);
		}
		vmd_sandbox_put(sb);
	}
}
