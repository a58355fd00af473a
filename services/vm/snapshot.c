/*
 * snapshot.c: this node's local snapshots (issue 3, before snapd): each
 * is a directory <state>/snapshots/<id> holding what the VMM driver wrote
 * (device state, a copy of guest RAM, a copy of the scratch disk) and
 * meta.pb, the LocalSnapshot that describes it. A snapshot is made in
 * <id>.tmp and renamed into place when complete, so a crash never leaves
 * a half snapshot that lists. Ids name the node ("snap-<node>-<16 hex>")
 * so a gateway can route a restore to the node that holds the files.
 * With [vmd] snapd a finished snapshot is also pushed to moat-snapd (after
 * the sandbox resumed; snapshot_push.c) and its snapd id recorded here; a
 * restore of a snapd id this node lacks pulls it into the same layout.
 * Not for: pausing and copying (the driver's snapshot op) or booting the
 * clone (sandbox.c).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/rpc_tenant.h"
#include "moat/status.h"
#include "moat/util.h"
#include "ramdir.h"
#include "snapram.h"
#include "files.h"
#include "image.h"
#include "metrics.h"
#include "node.h"
#include "pushq.h"
#include "sandbox.h"
#include "sandbox_supervise.h"
#include "snapshot.h"
#include "snapshot_fetch.h"
#include "snapshot_meta.h"
#include "snapshot_push.h"
#include "verify.h"

#define SNAP_ID_MAX 160u
#define SNAP_LIST_MAX 4096u

/* Ids become directory names: letters, digits, '-', '_', '.', not
 * starting with '.', and never a ".tmp" (in progress). */
static bool
snap_id_ok(const char *id)
{
	size_t n = id ? strlen(id) : 0;

	if (n < 6 || n > SNAP_ID_MAX || strncmp(id, "snap-", 5) != 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		        (c >= '0' && c <= '9') || c == '-' || c == '_' ||
		        c == '.'))
			return false;
	}
	return strcmp(id + n - 4, ".tmp") != 0;
}

static char *
snap_root(const struct vmd *vmd)
{
	return moat_asprintf("%s/snapshots", vmd->cfg.state_dir);
}

static char *
snap_dir(const struct vmd *vmd, const char *id)
{
	return moat_asprintf("%s/snapshots/%s", vmd->cfg.state_dir, id);
}

/* "snap-<node>-<16 hex>", the node id with unsafe characters as '_'. */
static char *
snap_new_id(const struct vmd *vmd)
{
	uint8_t r[8];
	char *node = strdup(vmd->cfg.node_id);
	char *id;

	if (node == NULL)
		return NULL;
	for (char *p = node; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		        (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
		        *p == '.'))
			*p = '_';
	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
		free(node);
		return NULL;
	}
	id = moat_asprintf("snap-%.64s-%02x%02x%02x%02x%02x%02x%02x%02x", node,
	    r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
	free(node);
	return id;
}

/* Heap copies of meta's fields into reply (the RPC server frees). */
static int
snap_meta_copy(const Moat__V1__LocalSnapshot *m, Moat__V1__LocalSnapshot *r)
{
	r->snapshot_id = strdup(m->snapshot_id);
	r->sandbox_id = strdup(m->sandbox_id);
	r->dir = strdup(m->dir);
	r->tenant = strdup(m->tenant);
	r->image = strdup(m->image);
	r->accel = strdup(m->accel);
	r->image_stamp = strdup(m->image_stamp);
	r->device_state_bytes = m->device_state_bytes;
	r->ram_bytes = m->ram_bytes;
	r->disk_bytes = m->disk_bytes;
	r->pause_ms = m->pause_ms;
	r->pause_ms_exact = m->pause_ms_exact;
	r->created_unix_ms = m->created_unix_ms;
	r->vcpus = m->vcpus;
	r->memory_mib = m->memory_mib;
	r->scratch_mib = m->scratch_mib;
	r->remote_id = strdup(m->remote_id);
	r->remote_stored = m->remote_stored;
	r->remote_error = strdup(m->remote_error);
	r->remote_stored_bytes = m->remote_stored_bytes;
	r->remote_logical_bytes = m->remote_logical_bytes;
	r->remote_parent_id = strdup(m->remote_parent_id);
	r->vmm = strdup(m->vmm);
	r->template_ = m->template_;
	/* Snapshots taken before issue 11 have no location: in RAM. */
	r->location = strdup(m->location[0] ? m->location : "ram");
	r->evicted_to = strdup(m->evicted_to);
	r->last_used_unix_ms =
	    m->last_used_unix_ms ? m->last_used_unix_ms : m->created_unix_ms;
	r->session_id = strdup(m->session_id);
	r->step = m->step;
	r->ram_resident_bytes = m->ram_resident_bytes;
	r->link_last_id = m->link_last_id;
	if (m->network != NULL &&
	    (r->network = vmd_egress_proto_copy(m->network)) == NULL)
		return MOAT_INTERNAL;
	if (!r->location || !r->evicted_to || !r->session_id)
		return MOAT_INTERNAL;
	if (!r->vmm || !r->snapshot_id || !r->sandbox_id || !r->dir ||
	    !r->tenant || !r->image || !r->accel || !r->image_stamp ||
	    !r->remote_id || !r->remote_error || !r->remote_parent_id)
		return MOAT_INTERNAL;
	return MOAT_OK;
}

/* Removes the target of <dir>/ram when it is a symlink (the driver keeps
 * RAM copies on tmpfs); the link itself goes with the directory. */
static void
snap_remove_ram(const char *dir)
{
	char *link = moat_asprintf("%s/" MOAT_VMM_SNAP_RAM, dir);
	char target[4096];
	ssize_t n;
	int e;

	if (link != NULL &&
	    (n = readlink(link, target, sizeof(target) - 1)) > 0) {
		target[n] = '\0';
		if ((e = vmd_ram_unlink(target)) != 0 && e != ENOENT)
			moat_warn(0, "cannot remove %s: %s", target,
			    strerror(e));
	}
	free(link);
}

void
vmd_snapshot_remove_dir(const char *dir)
{
	int e;

	snap_remove_ram(dir);
	if ((e = moat_rm_rf(dir)) != 0)
		moat_warn(0, "cannot remove snapshot directory %s: %s", dir,
		    strerror(e));
}

/* True when a failure (status rv, driver message err) came from a full
 * file system: ENOSPC from a copy, or QEMU's write of the device state. */
static bool
snap_no_space(int rv, const char *err, const char *dir)
{
	struct statvfs fs;

	if (rv == MOAT_RESOURCE_EXHAUSTED ||
	    (err != NULL &&
	        (strstr(err, "No space left") != NULL ||
	            strstr(err, "ENOSPC") != NULL)))
		return true;
	/* QEMU's failed write of the device state does not always say why:
	 * a file system left with under 1 MiB did it. */
	return statvfs(dir, &fs) == 0 &&
	    (uint64_t)fs.f_bavail * fs.f_frsize < (1u << 20);
}

/* Marks sb SNAPSHOTTING: one snapshot at a time, and none while execs
 * run (their output would reach a clone that knows nothing of them).
 * Returns 0 or a status after moat_rpc_error. */
static int
snap_begin(struct moat_rpc_call *call, struct sandbox *sb, bool leave_paused)
{
	int rv;

	pthread_mutex_lock(&sb->mu);
	if (sb->lifecycle == SANDBOX_SNAPSHOTTING ||
	    sb->lifecycle == SANDBOX_RELINKING) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox %s is being snapshotted already: wait for that "
		    "snapshot",
		    sb->id.str);
	} else if (sb->lifecycle != SANDBOX_RUNNING) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox %s is %s: only a RUNNING sandbox can be "
		    "snapshotted",
		    sb->id.str,
		    vmd_sandbox_api_state_name(vmd_sandbox_api_state(sb)));
	} else if (sb->execs_running > 0) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox %s has %u running exec(s): wait for them or kill "
		    "them, then snapshot (processes started in the background "
		    "are fine)",
		    sb->id.str, sb->execs_running);
	} else if (vmd_sandbox_step(sb, SANDBOX_EV_SNAPSHOT_BEGIN) !=
	    SANDBOX_STEP_MOVED) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox "
		    "%s cannot be snapshotted now",
		    sb->id.str);
	} else {
		/* Whether this VM can be captured is the driver's to say
		 * (QEMU needs the RAM file every VM now has; Firecracker
		 * writes its memory file through its API). */
		rv = MOAT_OK;
		sb->paused_for_move = leave_paused;
	}
	pthread_mutex_unlock(&sb->mu);
	return rv;
}

/* A new guest link for sb, RELINKING (vmd_sandbox_relink), after its
 * VMM reset the old one; a link that cannot be made fails the sandbox,
 * saying `when` it was lost. */
static void
snap_relink_or_fail(struct sandbox *sb, const char *when)
{
	char *why = NULL;

	if (vmd_sandbox_relink(sb, moat_rpc_now_ms() + VMD_RELINK_TIMEOUT_MS,
	        &why) != MOAT_OK) {
		char *reason = moat_asprintf("its guest link was lost %s: %s",
		    when, why ? why : "?");

		vmd_sandbox_fail(sb,
		    reason ? reason : "its guest link was lost");
		free(reason);
	}
	free(why);
}

/* Has the driver write sb's snapshot `id` into directory `tmp` (in
 * `root`): the RAM dir's room for the copy first, a new guest link
 * after when the driver resets it. Returns 0 with *st, or a status
 * after moat_rpc_error. *admitted: RAM dir bytes the caller gives back
 * (vmd_ram_admit_done), also on failure. */
static int
snap_capture(struct vmd *vmd, struct moat_rpc_call *call, struct sandbox *sb,
    const char *id, const char *tmp, const char *root,
    struct moat_vmm_snapshot_stats *st, uint64_t *admitted)
{
	bool leave_paused = sb->paused_for_move; /* set by snap_begin */
	char *scratch = moat_asprintf("%s/scratch.ext4", sb->dir);
	char *err = NULL;
	int rv;

	*admitted = 0;
	if (scratch == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	/* The RAM copy lands in the RAM dir: make room first (with
	 * reflinks it shares the guest's blocks, and the guest's own
	 * claim on the dir already covers rewriting them). */
	if (!vmd_ram_dir_reflinks() && sb->vmm.ram_file != NULL) {
		struct stat ram_st;
		uint64_t bytes = 0;
		char what[96];

		if (stat(sb->vmm.ram_file, &ram_st) == 0)
			bytes = (uint64_t)ram_st.st_blocks * 512u;
		snprintf(what, sizeof(what), "a snapshot of sandbox %s",
		    sb->id.str);
		if ((rv = vmd_ram_admit(vmd, call, bytes, what)) != MOAT_OK) {
			free(scratch);
			return rv;
		}
		*admitted = bytes;
	}
	/* The guest link is not held: guest calls wait out the pause. */
	if (vmd->vmm->snapshot_resets_agent_link)
		vmd_sandbox_relink_begin(sb);
	rv = vmd->vmm->snapshot(&sb->vmm, scratch, tmp,
	    VMD_SNAPSHOT_TIMEOUT_MS, leave_paused, st, &err);
	free(scratch);
	if (vmd->vmm->snapshot_resets_agent_link && leave_paused &&
	    rv == MOAT_OK) {
		/* Left paused: the guest cannot take a new link before it
		 * runs, so the unpause relinks (vmd_snapshot_unpause). Calls
		 * wait out the pause (paused_for_move) meanwhile. */
		pthread_mutex_lock(&sb->mu);
		(void)vmd_sandbox_step(sb, SANDBOX_EV_RELINK_END);
		pthread_mutex_unlock(&sb->mu);
	} else if (vmd->vmm->snapshot_resets_agent_link) {
		/* Whether or not the snapshot worked, the VMM may have reset
		 * the agent's stream (Firecracker does so on every snapshot
		 * create): connect a new one, or the sandbox cannot go on. */
		snap_relink_or_fail(sb, "after a snapshot");
	}
	if (rv != MOAT_OK) {
		pthread_mutex_lock(&sb->mu);
		sb->paused_for_move = false; /* the driver resumed it */
		pthread_mutex_unlock(&sb->mu);
		if (snap_no_space(rv, err, tmp))
			rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "no space left for snapshot %s of sandbox %s in "
			    "%s (the sandbox keeps running; nothing was "
			    "kept): %s; free space there or delete "
			    "snapshots",
			    id, sb->id.str, root, err ? err : "?");
		else
			rv = moat_rpc_error(call, rv,
			    "snapshot of sandbox %s "
			    "failed (the sandbox keeps running): %s",
			    sb->id.str, err ? err : "?");
	}
	free(err);
	return rv;
}

/* The catalog entry of snapshot `id` of sb just captured into `tmp`
 * (every string borrowed: from sb, req, image_stamp, the arguments). */
static void
snap_meta_fill(struct vmd *vmd, Moat__V1__LocalSnapshot *meta,
    struct sandbox *sb, const char *id, const char *dir, const char *tmp,
    bool is_template, const Moat__V1__SnapshotSandboxRequest *req,
    const struct moat_vmm_snapshot_stats *st, char *image_stamp)
{
	meta->snapshot_id = (char *)id;
	meta->sandbox_id = sb->id.str;
	meta->dir = (char *)dir;
	meta->device_state_bytes = st->device_state_bytes;
	meta->ram_bytes = st->ram_bytes;
	meta->disk_bytes = st->disk_bytes;
	meta->pause_ms = (uint64_t)(st->pause_ms + 0.5);
	meta->pause_ms_exact = st->pause_ms;
	meta->created_unix_ms = moat_now_unix_ms();
	meta->tenant = sb->tenant;
	meta->image = sb->image;
	meta->vcpus = sb->vcpus;
	meta->memory_mib = sb->memory_mib;
	meta->scratch_mib = sb->scratch_mib;
	meta->accel = sb->accel;
	meta->image_stamp = image_stamp;
	meta->vmm = (char *)vmd->vmm->name;
	meta->template_ = is_template;
	meta->location = "ram";
	meta->ram_resident_bytes = vmd_snapram_resident(tmp);
	meta->last_used_unix_ms = meta->created_unix_ms;
	/* Read after the capture: no request the captured guest saw can
	 * have a higher id. */
	pthread_mutex_lock(&sb->mu);
	meta->link_last_id = guest_link_last_id(sb->link);
	pthread_mutex_unlock(&sb->mu);
	if (req != NULL) {
		meta->session_id = req->session_id;
		meta->step = req->step;
	}
}

/* Seals meta with the digests of the artifacts in tmp (verify.h);
 * *seal_ms: how long it took. Returns 0 or a status after
 * moat_rpc_error. */
static int
snap_seal(struct vmd *vmd, struct moat_rpc_call *call,
    Moat__V1__LocalSnapshot *meta, const char *tmp, struct vmd_seal *seal,
    uint64_t *seal_ms)
{
	uint64_t t0 = moat_rpc_now_ms();
	char *err = NULL;
	int rv;

	if ((rv = vmd_snapshot_seal(vmd, meta, tmp, seal, &err)) != MOAT_OK) {
		rv = moat_rpc_error(call, rv,
		    "snapshot %s of sandbox %s cannot be sealed (the sandbox "
		    "keeps running; nothing was kept): %s",
		    meta->snapshot_id, meta->sandbox_id, err ? err : "?");
		free(err);
		return rv;
	}
	*seal_ms = moat_rpc_now_ms() - t0;
	return MOAT_OK;
}

/* Writes `meta` into `tmp` and renames tmp to `dir`: the snapshot
 * exists from here on. Returns 0 or a status after moat_rpc_error. */
static int
snap_store(struct moat_rpc_call *call, struct sandbox *sb,
    const Moat__V1__LocalSnapshot *meta, const char *tmp, const char *root)
{
	size_t len = moat__v1__local_snapshot__get_packed_size(meta);
	char *meta_path = moat_asprintf("%s/" VMD_SNAPSHOT_META, tmp);
	uint8_t *packed = malloc(len ? len : 1);
	int rv = MOAT_OK;
	int e;

	if (meta_path == NULL || packed == NULL) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	moat__v1__local_snapshot__pack(meta, packed);
	if ((e = moat_write_file_atomic(meta_path, packed, len, 0600)) != 0 ||
	    (rename(tmp, meta->dir) != 0 && (e = errno) != 0)) {
		if (e == ENOSPC || e == EDQUOT)
			rv = moat_rpc_error(call, MOAT_RESOURCE_EXHAUSTED,
			    "no space left for snapshot %s of sandbox %s in "
			    "%s (the sandbox keeps running; nothing was "
			    "kept): %s; free space there or delete "
			    "snapshots",
			    meta->snapshot_id, sb->id.str, root, strerror(e));
		else
			rv = moat_rpc_error(call, moat_status_from_errno(e),
			    "cannot store snapshot %s in %s: %s",
			    meta->snapshot_id, meta->dir, strerror(e));
	}
out:
	free(meta_path);
	free(packed);
	return rv;
}

int
vmd_snapshot_make(struct vmd *vmd, struct moat_rpc_call *call,
    struct sandbox *sb, const char *id, const char *dir,
    vmd_template_prepare_fn *template_prepare,
    const Moat__V1__SnapshotSandboxRequest *req,
    Moat__V1__LocalSnapshot *reply)
{
	bool is_template = template_prepare != NULL;
	Moat__V1__LocalSnapshot meta = MOAT__V1__LOCAL_SNAPSHOT__INIT;
	struct moat_vmm_snapshot_stats st = { 0 };
	char *tmp = NULL, *root = NULL, *slash;
	char *image_stamp = NULL, *parent = NULL;
	struct vmd_push_result push = { 0 };
	struct vmd_seal seal;
	uint64_t admitted = 0, seal_ms = 0;
	/* Templates are the node's own and never leave it; a step's
	 * snapshot is pushed in the background unless the caller waits. */
	bool pushed = vmd->snapd != NULL && !is_template;
	bool background =
	    pushed && vmd->pushq != NULL && !(req != NULL && req->wait_push);
	bool queued = false;
	int rv, e;

	if (vmd->vmm->snapshot == NULL)
		return moat_rpc_error(call, MOAT_UNIMPLEMENTED,
		    "the %s driver "
		    "of node %s cannot take snapshots",
		    vmd->vmm->name, vmd->cfg.node_id);
	/* A driver that resets the guest link on a snapshot (Firecracker)
	 * relinks once the guest runs again: at unpause, for leave_paused
	 * (vmd_snapshot_unpause). */
	if (req != NULL && req->leave_paused && vmd->vmm->unpause == NULL)
		return moat_rpc_error(call, MOAT_UNIMPLEMENTED,
		    "the %s driver of node %s cannot leave a sandbox paused "
		    "after a snapshot: snapshot without leave_paused",
		    vmd->vmm->name, vmd->cfg.node_id);
	if ((rv = snap_begin(call, sb, req != NULL && req->leave_paused)) !=
	    MOAT_OK)
		return rv;

	root = strdup(dir);
	if (root != NULL && (slash = strrchr(root, '/')) != NULL)
		*slash = '\0';
	tmp = moat_asprintf("%s.tmp", dir);
	image_stamp = vmd_image_stamp(vmd, sb->image);
	if (!root || !tmp || !image_stamp) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	if ((e = moat_mkdir_p(root, 0700)) != 0 || mkdir(tmp, 0700) != 0) {
		e = e ? e : errno;
		rv = moat_rpc_error(call, moat_status_from_errno(e),
		    "cannot "
		    "create snapshot directory %s: %s",
		    tmp, strerror(e));
		goto out;
	}
	if ((rv = snap_capture(vmd, call, sb, id, tmp, root, &st,
	         &admitted)) != MOAT_OK)
		goto out_rm;
	/* Whole before it is sealed and published. */
	if (template_prepare != NULL)
		template_prepare(vmd, id, tmp);
	snap_meta_fill(vmd, &meta, sb, id, dir, tmp, is_template, req, &st,
	    image_stamp);
	/* The sandbox's network policy, sealed with the rest (issue 14):
	 * a clone of this snapshot gets it, and nothing wider. Unset: its
	 * VM has no egress port (restored from a snapshot without one). */
	if (!sb->no_egress_port &&
	    (meta.network = vmd_egress_to_proto(sb->egress_policy)) == NULL) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out_rm;
	}
	/* Sealed before anything reads it back (a push, a restore): the
	 * digests also fill the verified-once cache, so the first restore
	 * does not hash again. */
	if ((rv = snap_seal(vmd, call, &meta, tmp, &seal, &seal_ms)) !=
	    MOAT_OK)
		goto out_rm;
	/* The sandbox runs again: hashing and pushing cost it no pause. */
	if (pushed && !background) {
		parent = vmd_snapshot_parent(root, sb->id.str);
		vmd_snapshot_push(vmd, call->request_id, &meta, tmp,
		    parent ? parent : "", &push);
		meta.remote_id = push.remote_id ? push.remote_id : "";
		meta.remote_stored = push.remote_id != NULL;
		meta.remote_error = push.error ? push.error : "";
		meta.remote_stored_bytes = push.stored_bytes;
		meta.remote_logical_bytes = push.logical_bytes;
		meta.remote_parent_id = parent && push.remote_id ? parent : "";
	}
	if ((rv = snap_store(call, sb, &meta, tmp, root)) != MOAT_OK)
		goto out_rm;
	if (background &&
	    !(queued =
	            vmd_pushq_add(vmd, call->request_id, id, dir, sb->id.str)))
		moat_warn(call->request_id,
		    "snapshot %s: not queued for moat-snapd (out of memory "
		    "or stopping): it is pushed when evicted",
		    id);
	if (reply != NULL && snap_meta_copy(&meta, reply) != MOAT_OK) {
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
		goto out;
	}
	if (reply != NULL)
		reply->remote_pending = queued;
	moat_info(call->request_id,
	    "%s %s of sandbox %s: paused %.1f "
	    "ms, device state %" PRIu64 " B, RAM %" PRIu64 " B, disk %" PRIu64
	    " B, sealed in %" PRIu64 " ms",
	    is_template ? "template" : "snapshot", id, sb->id.str, st.pause_ms,
	    st.device_state_bytes, st.ram_bytes, st.disk_bytes, seal_ms);
	vmd_metrics_snapshot_pause(is_template, st.pause_ms);
	vmd_ram_admit_done(vmd, admitted);
	admitted = 0;
	/* Over budget now: the least recently used copies go to disk
	 * (pushed already, so mostly an unlink), this one last. */
	if (!is_template)
		vmd_snapram_added(vmd, call->request_id, id, dir,
		    meta.ram_resident_bytes);
	goto out;
out_rm:
	vmd_snapshot_remove_dir(tmp);
out:
	vmd_ram_admit_done(vmd, admitted);
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_SNAPSHOT_END);
	pthread_mutex_unlock(&sb->mu);
	/* A failed snapshot never leaves the sandbox paused. */
	if (rv != MOAT_OK &&
	    vmd_snapshot_unpause(vmd, call->request_id, sb, NULL) != MOAT_OK)
		moat_warn(call->request_id,
		    "sandbox %s stays paused after its failed snapshot: "
		    "ResumeSandbox or destroy it",
		    sb->id.str);
	free(root);
	free(tmp);
	free(image_stamp);
	free(parent);
	free(push.remote_id);
	free(push.error);
	moat__v1__network_policy__free_unpacked(meta.network, NULL);
	return rv;
}

int
vmd_snapshot_take(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SnapshotSandboxRequest *req,
    Moat__V1__LocalSnapshot *reply)
{
	struct sandbox *sb = NULL;
	char *id = NULL, *dir = NULL;
	int rv;

	if ((rv = vmd_sandbox_get_running(vmd, call, req->sandbox_id, &sb)) !=
	    MOAT_OK)
		return rv;
	id = snap_new_id(vmd);
	dir = id ? snap_dir(vmd, id) : NULL;
	if (dir == NULL)
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	else
		rv = vmd_snapshot_make(vmd, call, sb, id, dir, NULL, req,
		    reply);
	/* Its caller gave up already: nobody would resume or destroy it. */
	if (rv == MOAT_OK && req->leave_paused && call->deadline_ms != 0 &&
	    moat_rpc_now_ms() >= call->deadline_ms) {
		(void)vmd_snapshot_unpause(vmd, call->request_id, sb, NULL);
		rv = moat_rpc_error(call, MOAT_DEADLINE_EXCEEDED,
		    "snapshot %s of sandbox %s ended after the call's "
		    "deadline: the sandbox was resumed (the snapshot is kept)",
		    id, sb->id.str);
	}
	vmd_sandbox_put(sb);
	free(id);
	free(dir);
	return rv;
}

/* The directory (heap) of the local snapshot this node pushed to snapd
 * as `remote_id`, or NULL: a restore by snapd id of a snapshot taken here
 * needs no pull. */
static char *
snap_find_remote(const struct vmd *vmd, const char *remote_id)
{
	char *root = snap_root(vmd);
	char *found = NULL;
	struct dirent *de;
	DIR *d = root ? opendir(root) : NULL;

	while (d != NULL && found == NULL && (de = readdir(d)) != NULL) {
		Moat__V1__LocalSnapshot *m = NULL;
		char *dir;

		if (!snap_id_ok(de->d_name) ||
		    (dir = moat_asprintf("%s/%s", root, de->d_name)) == NULL)
			continue;
		if (vmd_snapshot_read_meta(dir, &m) == 0 && m->remote_stored &&
		    strcmp(m->remote_id, remote_id) == 0) {
			found = dir;
			dir = NULL;
		}
		moat__v1__local_snapshot__free_unpacked(m, NULL);
		free(dir);
	}
	if (d != NULL)
		closedir(d);
	free(root);
	return found;
}

/* vmd_snapshot_open without the fetch when `fetch` is false. */
static int
snap_open(struct vmd *vmd, struct moat_rpc_call *call, const char *id,
    const char *tenant, Moat__V1__LocalSnapshot **meta, char **dir, bool fetch,
    uint64_t *pulled_bytes)
{
	int e;

	*meta = NULL;
	*dir = NULL;
	if (pulled_bytes != NULL)
		*pulled_bytes = 0;
	if (id == NULL || id[0] == '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "snapshot_id is empty: name a snapshot "
		    "(ListLocalSnapshots "
		    "lists them)");
	if (!snap_id_ok(id))
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "snapshot %.80s not found: it is not a snapshot id "
		    "(\"snap-...\")",
		    id);
	if ((*dir = snap_dir(vmd, id)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	e = vmd_snapshot_read_meta(*dir, meta);
	if (e == ENOENT && fetch && vmd->snapd != NULL) {
		char *local = snap_find_remote(vmd, id);
		uint64_t pulled = 0;
		int rv = MOAT_OK;

		if (local != NULL) {
			free(*dir);
			*dir = local;
		} else {
			rv = vmd_snapshot_fetch(vmd, call, id, tenant, *dir,
			    &pulled);
			if (pulled_bytes != NULL)
				*pulled_bytes = pulled;
		}
		if (rv != MOAT_OK) {
			free(*dir);
			*dir = NULL;
			return rv;
		}
		e = vmd_snapshot_read_meta(*dir, meta);
	}
	if (e != 0 ||
	    (tenant != NULL && tenant[0] != '\0' &&
	        strcmp(tenant, (*meta)->tenant) != 0)) {
		moat__v1__local_snapshot__free_unpacked(*meta, NULL);
		*meta = NULL;
		free(*dir);
		*dir = NULL;
		/* A catalog entry that does not parse was changed on
		 * disk: as a seal that does not match (verify.h). */
		if (e == EINVAL)
			return moat_rpc_error(call, MOAT_DATA_LOSS,
			    "snapshot %s on node %s: its manifest (meta.pb) "
			    "does not parse: changed since it was taken; "
			    "nothing was started; delete it and take another",
			    id, vmd->cfg.node_id);
		if (e != 0 && e != ENOENT)
			return moat_rpc_error(call, MOAT_INTERNAL,
			    "snapshot %s on node %s cannot be read (%s): "
			    "delete it and take another",
			    id, vmd->cfg.node_id, strerror(e));
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "snapshot %s not "
		    "found on node %s (ListLocalSnapshots lists them)",
		    id, vmd->cfg.node_id);
	}
	return MOAT_OK;
}

int
vmd_snapshot_open(struct vmd *vmd, struct moat_rpc_call *call, const char *id,
    const char *tenant, Moat__V1__LocalSnapshot **meta, char **dir,
    uint64_t *pulled_bytes)
{
	return snap_open(vmd, call, id, tenant, meta, dir, true, pulled_bytes);
}

int
vmd_snapshot_list(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__ListLocalSnapshotsRequest *req,
    Moat__V1__LocalSnapshotList *reply)
{
	char *root;
	const char *tenant;
	DIR *d;
	struct dirent *de;
	int rv;

	/* One tenant's snapshots, never every tenant's (rpc_tenant.h). */
	if ((rv = moat_rpc_tenant(call, req->tenant, &tenant)) != MOAT_OK)
		return rv;
	if ((root = snap_root(vmd)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	if ((d = opendir(root)) == NULL) {
		free(root);
		return MOAT_OK; /* none taken yet */
	}
	while (rv == MOAT_OK && (de = readdir(d)) != NULL &&
	    reply->n_snapshots < SNAP_LIST_MAX) {
		Moat__V1__LocalSnapshot *m = NULL, *r, **grown;
		char *dir;

		if (!snap_id_ok(de->d_name) ||
		    (dir = moat_asprintf("%s/%s", root, de->d_name)) == NULL)
			continue;
		if (vmd_snapshot_read_meta(dir, &m) != 0 ||
		    strcmp(tenant, m->tenant) != 0) {
			moat__v1__local_snapshot__free_unpacked(m, NULL);
			free(dir);
			continue;
		}
		free(dir);
		grown = realloc(reply->snapshots,
		    (reply->n_snapshots + 1) * sizeof(*grown));
		r = grown ? malloc(sizeof(*r)) : NULL;
		if (grown != NULL)
			reply->snapshots = grown;
		if (r == NULL) {
			rv = MOAT_INTERNAL;
		} else {
			moat__v1__local_snapshot__init(r);
			reply->snapshots[reply->n_snapshots++] = r;
			rv = snap_meta_copy(m, r);
			r->remote_pending =
			    vmd_pushq_pending(vmd, m->snapshot_id);
		}
		moat__v1__local_snapshot__free_unpacked(m, NULL);
	}
	closedir(d);
	free(root);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;
}

int
vmd_snapshot_delete(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__LocalSnapshotRef *req)
{
	Moat__V1__LocalSnapshot *meta = NULL;
	const char *tenant;
	char *dir = NULL;
	int rv, e;

	if ((rv = moat_rpc_tenant(call, req->tenant, &tenant)) != MOAT_OK)
		return rv;
	/* Deleting never pulls; the copy in snapd (if any) stays. */
	if ((rv = snap_open(vmd, call, req->snapshot_id, tenant, &meta, &dir,
	         false, NULL)) != MOAT_OK)
		return rv;
	/* A push of it still queued is cancelled, a running one finished
	 * (and its copy in snapd then deleted below): read it again. */
	if (vmd_pushq_pending(vmd, req->snapshot_id)) {
		vmd_pushq_settle(vmd, req->snapshot_id);
		moat__v1__local_snapshot__free_unpacked(meta, NULL);
		meta = NULL;
		free(dir);
		dir = NULL;
		if ((rv = snap_open(vmd, call, req->snapshot_id, tenant, &meta,
		         &dir, false, NULL)) != MOAT_OK)
			return rv;
	}
	if ((rv = vmd_snapram_forget(vmd, call, req->snapshot_id,
	         vmd_call_deadline(call))) != MOAT_OK)
		goto out;
	/* Its copy in snapd goes too (chunks other snapshots share stay):
	 * a deleted snapshot must free its store, not only this node. */
	if (meta->remote_stored && !req->keep_remote && vmd->snapd != NULL) {
		char *err = NULL;
		uint64_t freed = 0;

		if (vmd_snapshot_delete_remote(vmd, meta->tenant,
		        meta->remote_id, &freed, &err) != MOAT_OK)
			moat_warn(call->request_id,
			    "snapshot %s: its copy %s "
			    "in moat-snapd stays (%s): `moat snapshot gc` "
			    "removes it later",
			    req->snapshot_id, meta->remote_id,
			    err ? err : "?");
		else
			moat_info(call->request_id,
			    "snapshot %s: deleted "
			    "from moat-snapd as %s (%" PRIu64 " B freed)",
			    req->snapshot_id, meta->remote_id, freed);
		free(err);
	}
	snap_remove_ram(dir);
	/* Clones have their own copies of the RAM file: removing the
	 * snapshot's never touches a running clone. */
	if ((e = moat_rm_rf(dir)) != 0)
		rv = moat_rpc_error(call, moat_status_from_errno(e),
		    "cannot "
		    "remove snapshot %s (%s): %s",
		    req->snapshot_id, dir, strerror(e));
	else
		moat_info(call->request_id, "snapshot %s: deleted",
		    req->snapshot_id);
out:
	moat__v1__local_snapshot__free_unpacked(meta, NULL);
	free(dir);
	return rv;
}

/* After the unpause of a sandbox whose snapshot reset its guest link
 * (vmd_snapshot_unpause put it in RELINKING): a new link once the guest
 * runs (`resumed`), then back to RUNNING; a link that cannot be made
 * fails the sandbox. */
static void
unpause_relink(struct sandbox *sb, bool resumed)
{
	if (!resumed) {
		pthread_mutex_lock(&sb->mu);
		(void)vmd_sandbox_step(sb, SANDBOX_EV_RELINK_END);
		pthread_mutex_unlock(&sb->mu);
	} else {
		snap_relink_or_fail(sb, "when it resumed after a snapshot");
	}
	pthread_mutex_lock(&sb->mu);
	(void)vmd_sandbox_step(sb, SANDBOX_EV_SNAPSHOT_END);
	pthread_mutex_unlock(&sb->mu);
}

int
vmd_snapshot_unpause(struct vmd *vmd, uint64_t request_id, struct sandbox *sb,
    char **errmsg)
{
	char *err = NULL;
	bool relink = false;
	int rv;

	pthread_mutex_lock(&sb->mu);
	rv = sb->paused_for_move ? MOAT_OK : MOAT_FAILED_PRECONDITION;
	/* The snapshot reset the guest link (Firecracker) and the paused
	 * guest could not take a new one: the snapshot's relink happens
	 * now, in its states (SNAPSHOTTING, RELINKING), so no other
	 * snapshot starts and a link that closes is replaced. */
	if (rv == MOAT_OK && vmd->vmm->snapshot_resets_agent_link &&
	    vmd_sandbox_step(sb, SANDBOX_EV_SNAPSHOT_BEGIN) ==
	        SANDBOX_STEP_MOVED) {
		relink = true;
		(void)vmd_sandbox_step(sb, SANDBOX_EV_RELINK_BEGIN);
		sb->relink_lost = false;
	}
	pthread_mutex_unlock(&sb->mu);
	if (rv != MOAT_OK)
		return MOAT_OK; /* not paused: nothing to do */
	rv = vmd->vmm->unpause != NULL ?
	    vmd->vmm->unpause(&sb->vmm, VMD_RELINK_TIMEOUT_MS, &err) :
	    MOAT_UNIMPLEMENTED;
	if (relink)
		unpause_relink(sb, rv == MOAT_OK);
	if (rv == MOAT_OK) {
		pthread_mutex_lock(&sb->mu);
		sb->paused_for_move = false;
		pthread_mutex_unlock(&sb->mu);
		moat_info(request_id, "sandbox %s resumed after its snapshot",
		    sb->id.str);
	} else {
		/* Stuck paused: it is no use to anyone. */
		char *reason = moat_asprintf("it could not be resumed after "
		                             "a snapshot: %s",
		    err ? err : "no unpause in this driver");

		vmd_sandbox_fail(sb,
		    reason ? reason : "it could not be resumed");
		pthread_mutex_lock(&sb->mu);
		sb->paused_for_move = false;
		pthread_mutex_unlock(&sb->mu);
		if (errmsg != NULL)
			*errmsg = reason;
		else
			free(reason);
	}
	free(err);
	return rv;
}

int
vmd_snapshot_resume(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__SandboxRef *req, Moat__V1__Sandbox *reply)
{
	struct sandbox *sb = NULL;
	char *err = NULL;
	int rv;

	if ((rv = vmd_sandbox_get(vmd, call, req->sandbox_id, &sb)) != MOAT_OK)
		return rv;
	pthread_mutex_lock(&sb->mu);
	if (!sb->paused_for_move)
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox %s is not paused (only a snapshot with "
		    "leave_paused pauses one): nothing to resume",
		    sb->id.str);
	else if (sb->lifecycle == SANDBOX_SNAPSHOTTING)
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "sandbox %s is still being snapshotted: resume it once "
		    "its SnapshotSandbox answered",
		    sb->id.str);
	pthread_mutex_unlock(&sb->mu);
	if (rv == MOAT_OK &&
	    (rv = vmd_snapshot_unpause(vmd, call->request_id, sb, &err)) !=
	        MOAT_OK)
		rv = moat_rpc_error(call, rv,
		    "sandbox %s: %s (it is FAILED now: destroy it)",
		    sb->id.str, err ? err : "?");
	if (rv == MOAT_OK && vmd_sandbox_to_proto(sb, reply) != MOAT_OK)
		rv = moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	free(err);
	vmd_sandbox_put(sb);
	return rv;
}
