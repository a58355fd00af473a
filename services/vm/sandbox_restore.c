/*
 * sandbox_restore.c: RestoreSandbox: a new sandbox (a clone) from a
 * local snapshot, checked against this node (driver, image build) and
 * sized as the snapshot's sandbox; with replace_sandbox_id a restore in
 * place, whose new VM takes the old one's id once it runs (the old one
 * is left as it was when the restore fails). Not for: the snapshot
 * catalog (snapshot.c), RAM copies (snapram.c) or the boot itself
 * (sandbox_boot.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "image.h"
#include "metrics.h"
#include "moat/log.h"
#include "moat/rpc_tenant.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "pool.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "sandbox_restore.h"
#include "snapram.h"
#include "snapshot.h"
#include "verify.h"
#include "vmhost.h"

/* What one restore holds while it runs (restore_done frees it). */
struct restore {
	Moat__V1__LocalSnapshot *meta; /* the catalog entry */
	char *snap_dir;
	bool acquired;         /* its RAM copy held (snapram) */
	struct sandbox *old;   /* a restore in place's target, ref */
	const char *keep_id;   /* a drain's: the clone's id, or NULL */
	bool reseed;           /* the request's */
	const char *tenant;    /* the call's (rpc_tenant.h) */
	uint64_t pulled_bytes; /* from snapd for this restore */
	bool drop_pulled;      /* pulled here and refused: not kept */
	Moat__V1__CreateSandboxRequest create; /* strings borrowed */
	Moat__V1__CreateSandboxRequest__LabelsEntry **labels;
	Moat__V1__CreateSandboxRequest__LabelsEntry *entries;
};

/* drop_pulled: removes the local copy of a snapshot this restore pulled
 * from snapd and refused (it failed its checks: kept, it would only be
 * refused again and hold the node's disk and RAM); snapd's copy stays. */
static void
drop_pulled(struct vmd *vmd, const char *snapshot_id, const char *tenant)
{
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	struct moat_rpc_call call = { .service = "moat.v1.Vm",
		.method = "(refused pull)",
		.tenant = tenant,
		.deadline_ms = moat_rpc_now_ms() + 30000 };

	ref.snapshot_id = (char *)snapshot_id;
	ref.tenant = (char *)tenant;
	ref.keep_remote = true;
	if (vmd_snapshot_delete(vmd, &call, &ref) == MOAT_OK)
		moat_info(0,
		    "snapshot %s: the refused copy pulled from "
		    "moat-snapd was removed",
		    snapshot_id);
	else
		moat_warn(0,
		    "snapshot %s: the refused copy pulled from "
		    "moat-snapd stays: %s",
		    snapshot_id,
		    call.error_message ? call.error_message : "?");
	free(call.error_message);
}

static void
restore_done(struct vmd *vmd, const char *snapshot_id, struct restore *r)
{
	if (r->acquired)
		vmd_snapram_release(vmd, snapshot_id);
	if (r->drop_pulled && r->tenant != NULL)
		drop_pulled(vmd, snapshot_id, r->tenant);
	vmd_sandbox_put(r->old);
	free(r->labels);
	free(r->entries);
	free(r->snap_dir);
	if (r->meta != NULL)
		moat__v1__local_snapshot__free_unpacked(r->meta, NULL);
}

/* Opens the snapshot and holds its RAM copy until the clone has its own
 * (an evicted one is rebuilt here first); refuses one of another VMM,
 * and one whose seal or artifacts do not verify (verify.h). */
static int
restore_open(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct restore *r)
{
	Moat__V1__LocalSnapshot *meta;
	uint64_t t0;
	int rv;

	if (vmd->vmm->restore == NULL || vmd->vmm->resume == NULL)
		return moat_rpc_error(call, MOAT_UNIMPLEMENTED,
		    "the %s driver "
		    "of node %s cannot restore snapshots",
		    vmd->vmm->name, vmd->cfg.node_id);
	if ((rv = vmd_snapshot_open(vmd, call, req->snapshot_id, r->tenant,
	         &r->meta, &r->snap_dir, &r->pulled_bytes)) != MOAT_OK)
		return rv;
	if ((rv = vmd_snapram_acquire(vmd, call, req->snapshot_id, r->snap_dir,
	         &r->meta)) != MOAT_OK)
		return rv;
	r->acquired = true;
	meta = r->meta;
	if (meta->vmm[0] != '\0' && strcmp(meta->vmm, vmd->vmm->name) != 0)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "snapshot "
		    "%s was taken under the %s VMM and restores only under "
		    "%s; node %s runs %s: restore it on a node with --driver "
		    "%s",
		    meta->snapshot_id, meta->vmm, meta->vmm, vmd->cfg.node_id,
		    vmd->vmm->name, meta->vmm);
	/* Before any VMM reads them: the seal, then every artifact (its
	 * RAM copy rebuilt above when it was evicted). */
	t0 = moat_rpc_now_ms();
	if ((rv = vmd_snapshot_verify(vmd, call, meta, r->snap_dir, NULL)) !=
	    MOAT_OK) {
		moat_warn(call->request_id, "snapshot %s refused: %s",
		    meta->snapshot_id,
		    call->error_message ? call->error_message : "?");
		r->drop_pulled = r->pulled_bytes > 0;
		return rv;
	}
	moat_info(call->request_id, "snapshot %s: verified in %" PRIu64 " ms",
	    meta->snapshot_id, moat_rpc_now_ms() - t0);
	return MOAT_OK;
}

/* keep_sandbox_id (a drain, issue 15): the clone takes that id, which
 * must be a sandbox id no sandbox on this node has (checked again when
 * it is listed: sandbox_boot.c). Not with a restore in place. */
static int
restore_keep_id(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct restore *r)
{
	const char *id = req->keep_sandbox_id;
	struct sandbox *other;
	size_t n = strlen(id);
	bool hex = n == 19 && strncmp(id, "sb-", 3) == 0;

	if (n == 0)
		return MOAT_OK;
	for (size_t i = 3; hex && i < n; i++)
		hex = (id[i] >= '0' && id[i] <= '9') ||
		    (id[i] >= 'a' && id[i] <= 'f');
	if (!hex)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "keep_sandbox_id %.40s is not a sandbox id (\"sb-\" and "
		    "16 hex digits): give the id of the sandbox being moved",
		    id);
	if (req->replace_sandbox_id[0] != '\0')
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "keep_sandbox_id and replace_sandbox_id exclude each "
		    "other: a restore in place keeps its id already");
	if (vmd_sandbox_get(vmd, NULL, id, &other) == MOAT_OK) {
		vmd_sandbox_put(other);
		return moat_rpc_error(call, MOAT_ALREADY_EXISTS,
		    "node %s already has a sandbox %s: a restore cannot take "
		    "its id (destroy it first, or restore without "
		    "keep_sandbox_id)",
		    vmd->cfg.node_id, id);
	}
	r->keep_id = id;
	return MOAT_OK;
}

/* A restore in place: finds the sandbox to replace (r->old). Another
 * tenant's sandbox is as good as absent; one still booting is refused. */
static int
restore_find_target(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct restore *r)
{
	struct sandbox *old;
	bool creating;

	if (req->replace_sandbox_id == NULL ||
	    req->replace_sandbox_id[0] == '\0')
		return MOAT_OK;
	if (vmd_sandbox_get(vmd, NULL, req->replace_sandbox_id, &r->old) !=
	        MOAT_OK ||
	    strcmp(r->old->tenant, r->meta->tenant) != 0 ||
	    strcmp(r->old->tenant, r->tenant) != 0)
		return moat_rpc_error(call, MOAT_NOT_FOUND,
		    "sandbox %.40s to "
		    "restore in place not found (moat sandbox ls lists "
		    "sandboxes; it must be the snapshot's tenant's)",
		    req->replace_sandbox_id);
	old = r->old;
	pthread_mutex_lock(&old->mu);
	creating = vmd_sandbox_api_state(old) ==
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING;
	pthread_mutex_unlock(&old->mu);
	if (creating)
		return moat_rpc_error(call, MOAT_UNAVAILABLE,
		    "sandbox %s is "
		    "still booting: restore into it once it is RUNNING",
		    old->id.str);
	return MOAT_OK;
}

/* Sets r->create's labels to n borrowed key/value pairs. */
static int
restore_labels(struct moat_rpc_call *call, struct restore *r, size_t n,
    char *const *keys, char *const *values,
    Moat__V1__RestoreSandboxRequest__LabelsEntry *const *entries)
{
	if ((r->labels = calloc(n, sizeof(*r->labels))) == NULL ||
	    (r->entries = calloc(n, sizeof(*r->entries))) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		moat__v1__create_sandbox_request__labels_entry__init(
		    &r->entries[i]);
		r->entries[i].key = entries ? entries[i]->key : keys[i];
		r->entries[i].value = entries ? entries[i]->value : values[i];
		r->labels[i] = &r->entries[i];
	}
	r->create.labels = r->labels;
	r->create.n_labels = n;
	return MOAT_OK;
}

/* The create request the clone is made from: the snapshot's sandbox in
 * size and image; only its labels are its own (in place without labels:
 * the sandbox keeps its own). Validated like a create, and the image
 * must be the build the snapshot was taken with. */
static int
restore_request(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct restore *r)
{
	const Moat__V1__LocalSnapshot *meta = r->meta;
	const char *test_mode = NULL;
	char *stamp;
	bool same;
	int rv;

	moat__v1__create_sandbox_request__init(&r->create);
	r->create.vcpus = meta->vcpus;
	r->create.memory_mib = meta->memory_mib;
	r->create.image = meta->image;
	r->create.scratch_mib = meta->scratch_mib;
	r->create.tenant = meta->tenant;
	/* Its network policy is the snapshot's (sealed; issue 14): a
	 * restore request has none of its own, so it cannot widen it. In
	 * place, restore_alloc gives the clone the sandbox's own. */
	r->create.network = meta->network;
	if (req->n_labels > 0)
		rv = restore_labels(call, r, req->n_labels, NULL, NULL,
		    req->labels);
	else if (r->old != NULL && r->old->n_labels > 0)
		rv = restore_labels(call, r, r->old->n_labels,
		    r->old->label_keys, r->old->label_values, NULL);
	else
		rv = MOAT_OK;
	if (rv != MOAT_OK)
		return rv;
	if ((rv = vmd_sandbox_validate(vmd, call, &r->create, meta->image,
	         &test_mode)) != MOAT_OK)
		return rv;
	/* The guest's memory holds the kernel and the root filesystem's
	 * cache as they were: another build of the image under the same
	 * name would boot into corruption, not a restore. */
	stamp = vmd_image_stamp(vmd, meta->image);
	same = stamp != NULL && strcmp(stamp, meta->image_stamp) == 0;
	free(stamp);
	if (!same)
		return moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "snapshot %s was taken with another build of image "
		    "\"%s\" than the one on node %s now: it cannot be "
		    "restored exactly; take a new snapshot",
		    meta->snapshot_id, meta->image, vmd->cfg.node_id);
	if (test_mode != NULL)
		return moat_rpc_error(call, MOAT_INVALID_ARGUMENT,
		    "label " VMD_TEST_LABEL
		    " cannot be given to a restore: it changes "
		    "how a guest boots, and a restored guest does not boot");
	return MOAT_OK;
}

/* The clone's object. In place, the old VM runs on in its own directory
 * until the swap; the new one gets a directory (and so a RAM file) of
 * its own under the same id. */
static int
restore_alloc(struct vmd *vmd, struct moat_rpc_call *call, struct restore *r,
    struct sandbox **out)
{
	struct sandbox *sb;
	uint8_t rnd[4] = { 0 };
	char *dir;

	if ((sb = vmd_sandbox_alloc(vmd, &r->create, r->meta->image, NULL)) ==
	    NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	if ((sb->restored_from = strdup(r->meta->snapshot_id)) == NULL)
		goto oom;
	/* Taken before every VM had the egress port (issue 14). */
	sb->no_egress_port = r->meta->network == NULL;
	/* A new sandbox's code contexts never share their random
	 * generators' state with the snapshot's other copies; the same
	 * sandbox brought back (in place, or moved by a drain) keeps the
	 * recorded state exactly unless the call asks (issue 18). */
	sb->keep_rng = (r->old != NULL || r->keep_id != NULL) && !r->reseed;
	sb->pulled_bytes = r->pulled_bytes;
	/* Bounded: ids must not wrap (a pulled snapshot's label). */
	sb->link_id_floor = r->meta->link_last_id < VMD_LINK_ID_FLOOR_MAX ?
	    r->meta->link_last_id :
	    VMD_LINK_ID_FLOOR_MAX;
	if (r->keep_id != NULL) {
		/* Its directory apart from any the id had before here. */
		(void)!getrandom(rnd, sizeof(rnd), 0);
		dir = moat_asprintf("%s/vms/%s-r%02x%02x%02x%02x",
		    vmd->cfg.state_dir, r->keep_id, rnd[0], rnd[1], rnd[2],
		    rnd[3]);
		if (dir == NULL)
			goto oom;
		free(sb->dir);
		sb->dir = dir;
		snprintf(sb->id.str, sizeof(sb->id.str), "%s", r->keep_id);
	}
	if (r->old != NULL) {
		(void)!getrandom(rnd, sizeof(rnd), 0);
		dir = moat_asprintf("%s/vms/%s-r%02x%02x%02x%02x",
		    vmd->cfg.state_dir, r->old->id.str, rnd[0], rnd[1], rnd[2],
		    rnd[3]);
		if (dir == NULL)
			goto oom;
		free(sb->dir);
		sb->dir = dir;
		sb->id = r->old->id;
		/* ... and its lifetime (lifetime.h). */
		pthread_mutex_lock(&r->old->mu);
		sb->life.expires_unix_ms = r->old->life.expires_unix_ms;
		sb->life.idle_timeout_s = r->old->life.idle_timeout_s;
		pthread_mutex_unlock(&r->old->mu);
		/* A restore in place keeps the sandbox's network policy
		 * (checked against the snapshot in vmd_sandbox_restore). */
		free(sb->egress_policy);
		sb->egress_policy = NULL;
		if (r->old->egress_policy != NULL) {
			if ((sb->egress_policy = malloc(
			         sizeof(*sb->egress_policy))) == NULL)
				goto oom;
			*sb->egress_policy = *r->old->egress_policy;
		}
	}
	*out = sb;
	return MOAT_OK;
oom:
	vmd_sandbox_free(sb);
	return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
}

/* Brings sb up from the snapshot: a new clone (not in place, not a
 * drain's) without network allowlist takes a pooled VMM of the snapshot
 * when one is ready (pool.h); one that fails is retried once with a
 * fresh VMM. Then the snapshot's pool is kept full. Takes sb. */
static int
restore_bring_up(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct restore *r,
    struct sandbox *sb, struct sandbox **out)
{
	const char *accel = r->meta->accel[0] ? r->meta->accel : "tcg";
	bool poolable = r->old == NULL && r->keep_id == NULL &&
	    sb->egress_policy == NULL && !sb->no_egress_port &&
	    sb->test_mode == NULL;
	struct vmd_shape shape = { .image = r->meta->image,
		.vcpus = sb->vcpus,
		.memory_mib = sb->memory_mib,
		.scratch_mib = sb->scratch_mib };
	bool pooled = poolable && vmd_pool_take(vmd, req->snapshot_id, sb);
	bool stopping;
	int rv;

	vmd_pool_make_room(vmd, sb, true);
	rv = vmd_sandbox_bring_up(vmd, call, sb, r->snap_dir, accel,
	    r->old ? BRING_UP_REPLACE : BRING_UP_LISTED, r->old, out);
	pthread_mutex_lock(&vmd->mu);
	stopping = vmd->shutting_down;
	pthread_mutex_unlock(&vmd->mu);
	if (pooled && rv != MOAT_OK && rv != MOAT_ABORTED &&
	    rv != MOAT_RESOURCE_EXHAUSTED && !stopping) {
		moat_warn(call->request_id,
		    "snapshot %s: the pooled VMM did not restore (%s); "
		    "starting a fresh one",
		    req->snapshot_id,
		    call->error_message ? call->error_message : "?");
		free(call->error_message);
		call->error_message = NULL;
		if ((rv = restore_alloc(vmd, call, r, &sb)) == MOAT_OK) {
			vmd_pool_make_room(vmd, sb, true);
			rv = vmd_sandbox_bring_up(vmd, call, sb, r->snap_dir,
			    accel, BRING_UP_LISTED, NULL, out);
		}
	}
	/* The snapshot is in use (a fork restores it again and again):
	 * keep its pool full, after this restore. */
	if (poolable)
		vmd_pool_want(vmd, req->snapshot_id, r->snap_dir, &shape,
		    accel, true);
	return rv;
}

int
vmd_sandbox_restore(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__RestoreSandboxRequest *req, struct sandbox **out)
{
	struct restore r = { 0 };
	struct sandbox *sb = NULL;
	uint64_t t0 = moat_rpc_now_ms();
	double t0_exact = vmd_now_ms_exact();
	int rv;

	*out = NULL;
	/* The snapshot, and a sandbox restored in place, must be the
	 * call's tenant's; the clone is too. */
	if ((rv = moat_rpc_tenant(call, req->tenant, &r.tenant)) != MOAT_OK)
		return rv;
	r.reseed = req->reseed;
	if ((rv = restore_keep_id(vmd, call, req, &r)) != MOAT_OK ||
	    (rv = restore_open(vmd, call, req, &r)) != MOAT_OK ||
	    (rv = restore_find_target(vmd, call, req, &r)) != MOAT_OK ||
	    (rv = restore_request(vmd, call, req, &r)) != MOAT_OK ||
	    (rv = restore_alloc(vmd, call, &r, &sb)) != MOAT_OK)
		goto out;
	sb->timings.t0 = t0_exact;
	sb->timings.kind = "restore";
	if (sb->no_egress_port && sb->egress_policy != NULL) {
		rv = moat_rpc_error(call, MOAT_FAILED_PRECONDITION,
		    "snapshot %s was taken before snapshots kept guest "
		    "egress: it cannot be restored into sandbox %s, which "
		    "has network \"allowlist\"; restore it as a new "
		    "sandbox (--new) or use a newer snapshot",
		    r.meta->snapshot_id, sb->id.str);
		vmd_sandbox_free(sb);
		goto out;
	}
	rv = restore_bring_up(vmd, call, req, &r, sb, out);
out:
	if (rv == MOAT_OK)
		vmd_metrics_restore(moat_rpc_now_ms() - t0,
		    r.pulled_bytes > 0);
	restore_done(vmd, req->snapshot_id, &r);
	return rv;
}
