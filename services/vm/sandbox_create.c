/*
 * sandbox_create.c: CreateSandbox: a clone of the node's template of the
 * request's shape when there is one ([vmd] templates; a template that
 * does not restore is dropped and the create boots cold), else a cold
 * boot, after which the template of that shape is made in the
 * background. Not for: the boot itself (sandbox_boot.c) or making
 * templates (templates.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accel.h"
#include "moat/log.h"
#include "moat/rpc_tenant.h"
#include "moat/status.h"
#include "node.h"
#include "pool.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "sandbox_create.h"
#include "templates.h"
#include "vmhost.h"

/* A create as a clone of the template of `shape` under `accel`: MOAT_OK
 * with *out; MOAT_NOT_FOUND when the create should boot cold instead
 * (no template, or one that did not restore: it is dropped with a
 * warning, and the call's error cleared); another status after
 * moat_rpc_error (out of memory, full, destroyed, shutting down). */
static int
sandbox_create_templated(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *req, const struct vmd_shape *shape,
    const char *accel, double t0, struct sandbox **out)
{
	struct sandbox *sb;
	char *tdir = NULL, *tid = NULL;
	bool stopping, pooled = false;
	int rv;

	if (vmd_template_find(vmd, shape, accel, &tdir, &tid) != MOAT_OK)
		return MOAT_NOT_FOUND;
	for (int attempt = 0; attempt < 2; attempt++) {
		if ((sb = vmd_sandbox_alloc(vmd, req, shape->image, NULL)) ==
		        NULL ||
		    (sb->template_id = strdup(tid)) == NULL) {
			if (sb != NULL)
				vmd_sandbox_free(sb);
			rv = moat_rpc_error(call, MOAT_INTERNAL,
			    "out of memory");
			goto out;
		}
		sb->timings.t0 = t0;
		sb->timings.kind = "template";
		sb->ram_source = vmd_template_ram(vmd, tid, tdir);
		/* A pooled VMM was started for a clone without network or
		 * test mode: another one's command line differs. */
		pooled = attempt == 0 && sb->egress_policy == NULL &&
		    sb->test_mode == NULL && vmd_pool_take(vmd, tid, sb);
		if (!pooled)
			sb->ram_spare = vmd_template_take_spare(vmd, tid);
		vmd_pool_make_room(vmd, sb, true);
		rv = vmd_sandbox_bring_up(vmd, call, sb, tdir, accel,
		    BRING_UP_LISTED, NULL, out);
		/* The template is in use: keep its pool full (after the
		 * create, not competing with it). */
		vmd_pool_want(vmd, tid, tdir, shape, accel, false);
		pthread_mutex_lock(&vmd->mu);
		stopping = vmd->shutting_down;
		pthread_mutex_unlock(&vmd->mu);
		if (rv == MOAT_OK || rv == MOAT_ABORTED ||
		    rv == MOAT_RESOURCE_EXHAUSTED || stopping || !pooled)
			break;
		/* A pooled VMM that failed says nothing of the template:
		 * once more with a VMM of its own. */
		moat_warn(call->request_id,
		    "template %s: the pooled VMM did not restore (%s); "
		    "starting a fresh one",
		    tid, call->error_message ? call->error_message : "?");
		free(call->error_message);
		call->error_message = NULL;
	}
	if (rv == MOAT_OK || rv == MOAT_ABORTED ||
	    rv == MOAT_RESOURCE_EXHAUSTED || stopping)
		goto out;
	/* A bad template never fails a creation. */
	moat_warn(call->request_id,
	    "template %s did not restore (%s): "
	    "dropped; booting cold",
	    tid, call->error_message ? call->error_message : "?");
	free(call->error_message);
	call->error_message = NULL;
	vmd_template_drop(vmd, tdir);
	vmd_pool_forget(vmd, tid);
	rv = MOAT_NOT_FOUND;
out:
	free(tdir);
	free(tid);
	return rv;
}

int
vmd_sandbox_create(struct vmd *vmd, struct moat_rpc_call *call,
    const Moat__V1__CreateSandboxRequest *request, struct sandbox **out)
{
	Moat__V1__CreateSandboxRequest owned = *request;
	const Moat__V1__CreateSandboxRequest *req = &owned;
	const char *image =
	    req->image && req->image[0] ? req->image : "default";
	const char *test_mode = NULL, *tenant;
	struct vmd_shape shape;
	struct sandbox *sb;
	bool templated;
	char accel[8];
	double t0 = vmd_now_ms_exact();
	int rv;

	*out = NULL;
	/* The sandbox is the call's tenant's: Envelope.tenant or the
	 * request's field (equal when both are set), never empty. */
	if ((rv = moat_rpc_tenant(call, request->tenant, &tenant)) != MOAT_OK)
		return rv;
	owned.tenant = (char *)tenant;
	{
		/* A node that cannot jail its VMMs runs none unless told
		 * (isolation = relaxed). */
		char *why = NULL;

		if ((rv = vmd_jail_admit(&why)) != MOAT_OK) {
			rv = moat_rpc_error(call, rv, "%s",
			    why ? why : "out of memory");
			free(why);
			return rv;
		}
	}
	if ((rv = vmd_sandbox_validate(vmd, call, req, image, &test_mode)) !=
	    0)
		return rv;
	shape.image = image;
	shape.vcpus = req->vcpus ? req->vcpus : VMD_DEFAULT_VCPUS;
	shape.memory_mib =
	    req->memory_mib ? req->memory_mib : VMD_DEFAULT_MEMORY_MIB;
	shape.scratch_mib =
	    req->scratch_mib ? req->scratch_mib : VMD_DEFAULT_SCRATCH_MIB;
	/* A test mode changes how the guest boots: never from a template.
	 * Before the accelerator is decided (the KVM probe) there is no
	 * template to match: that create boots and decides it. */
	/* Network allowlist sandboxes too: every QEMU VM has the egress
	 * port, and the restore's reset turns the guest's proxy on. */
	templated = vmd->cfg.templates && !req->cold_boot &&
	    test_mode == NULL && vmd->vmm->restore != NULL &&
	    vmd->vmm->snapshot != NULL;
	vmd_accel_current(vmd, accel);
	if (templated && accel[0] != '\0' &&
	    (rv = sandbox_create_templated(vmd, call, req, &shape, accel, t0,
	         out)) != MOAT_NOT_FOUND)
		return rv;
	if ((sb = vmd_sandbox_alloc(vmd, req, image, test_mode)) == NULL)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	sb->timings.t0 = t0;
	sb->timings.kind = "boot";
	vmd_pool_make_room(vmd, sb, false);
	rv = vmd_sandbox_bring_up(vmd, call, sb, NULL, NULL, BRING_UP_LISTED,
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
