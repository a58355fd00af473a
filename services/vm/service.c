/*
 * service.c: the moat.v1.Vm service: its method table (one row per RPC,
 * with whether it mutates) and thin handlers that cast the decoded request
 * and call the file that does the work. The RPC layer (moat/rpc.h) has
 * already decoded and validated the envelope. Not for: logic.
 */
#include <stdlib.h>
#include <string.h>

#include "moat/log.h"
#include "moat/rpc_tenant.h"
#include "moat/status.h"
#include "code.h"
#include "cordon.h"
#include "egress.h"
#include "exec.h"
#include "files.h"
#include "image.h"
#include "image_build.h"
#include "image_store.h"
#include "lifetime.h"
#include "node.h"
#include "pool.h"
#include "sandbox.h"
#include "sandbox_create.h"
#include "sandbox_restore.h"
#include "service.h"
#include "snapshot.h"
#include "survey.h"

#define VMD(call) ((struct vmd *)(call)->service_ctx)

static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct vmd *vmd = VMD(call);
	Moat__V1__HealthReply *r = (Moat__V1__HealthReply *)reply;

	r->service = strdup("moat.v1.Vm");
	r->version = strdup(MOAT_VERSION);
	r->uptime_ms = moat_rpc_now_ms() - vmd->started_ms;
	r->node_id = strdup(vmd->cfg.node_id);
	r->state_dir = strdup(vmd->cfg.state_dir);
	if (!r->service || !r->version || !r->node_id || !r->state_dir)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	return MOAT_OK;
}

static int
h_node_info(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	if (vmd_node_fill(VMD(call), (Moat__V1__Node *)reply) != MOAT_OK)
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	return MOAT_OK;
}

static int
h_create_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	struct sandbox *sb;
	int rv;

	const Moat__V1__CreateSandboxRequest *req =
	    (const Moat__V1__CreateSandboxRequest *)request;
	const char *image = req->image[0] ? req->image : "default";

	if ((rv = vmd_cordon_check(VMD(call), call, "create")) != MOAT_OK)
		return rv;
	/* An image this node lacks comes from moat-snapd first (issue 17);
	 * a bad name or no [vmd] snapd is the create's to report. */
	if (vmd_image_name_ok(image) &&
	    (rv = vmd_image_ensure(VMD(call), call, image)) != MOAT_OK)
		return rv;
	if ((rv = vmd_sandbox_create(VMD(call), call,
	         (const Moat__V1__CreateSandboxRequest *)request, &sb)) !=
	    MOAT_OK)
		return rv;
	rv = vmd_sandbox_to_proto(sb, (Moat__V1__Sandbox *)reply);
	vmd_sandbox_put(sb);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;
}

static int
h_get_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__SandboxRef *ref =
	    (const Moat__V1__SandboxRef *)request;
	struct sandbox *sb;
	int rv;

	if ((rv = vmd_sandbox_get(VMD(call), call, ref->sandbox_id, &sb)) != 0)
		return rv;
	rv = vmd_sandbox_to_proto(sb, (Moat__V1__Sandbox *)reply);
	vmd_sandbox_put(sb);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;
}

/* list_sandboxes: the sandboxes of `tenant` (NULL: every tenant's) into
 * list. */
static int
list_sandboxes(struct moat_rpc_call *call, const char *tenant,
    Moat__V1__SandboxList *list)
{
	struct vmd *vmd = VMD(call);
	struct sandbox **refs = NULL;
	size_t n = 0, cap = 0;
	int rv = MOAT_OK;

	/* Take references under the table lock, fill outside it. */
	pthread_mutex_lock(&vmd->mu);
	for (struct sandbox *sb = vmd->sandboxes; sb != NULL; sb = sb->next)
		cap++;
	if (cap > 0 && (refs = calloc(cap, sizeof(*refs))) == NULL) {
		pthread_mutex_unlock(&vmd->mu);
		return moat_rpc_error(call, MOAT_INTERNAL, "out of memory");
	}
	for (struct sandbox *sb = vmd->sandboxes; sb != NULL; sb = sb->next) {
		if (tenant != NULL && strcmp(tenant, sb->tenant) != 0)
			continue;
		sb->refs++;
		refs[n++] = sb;
	}
	pthread_mutex_unlock(&vmd->mu);

	if (n > 0 &&
	    (list->sandboxes = calloc(n, sizeof(*list->sandboxes))) == NULL)
		rv = MOAT_INTERNAL;
	for (size_t i = 0; i < n; i++) {
		Moat__V1__Sandbox *m;

		if (rv == MOAT_OK && (m = malloc(sizeof(*m))) != NULL) {
			moat__v1__sandbox__init(m);
			list->sandboxes[list->n_sandboxes++] = m;
			rv = vmd_sandbox_to_proto(refs[i], m);
		} else {
			rv = MOAT_INTERNAL;
		}
		vmd_sandbox_put(refs[i]);
	}
	free(refs);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;
}

static int
h_list_sandboxes(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__ListSandboxesRequest *req =
	    (const Moat__V1__ListSandboxesRequest *)request;
	const char *tenant;
	int rv;

	/* One tenant's sandboxes, never all of them: an empty tenant is
	 * refused (rpc_tenant.h); ListAllSandboxes is the gateway's. */
	if ((rv = moat_rpc_tenant(call, req->tenant, &tenant)) != MOAT_OK)
		return rv;
	return list_sandboxes(call, tenant, (Moat__V1__SandboxList *)reply);
}

/* h_list_all_sandboxes: every tenant's sandboxes, for the gateway's
 * inventory (the only caller allowed past the node's listener). */
static int
h_list_all_sandboxes(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	(void)request;
	return list_sandboxes(call, NULL, (Moat__V1__SandboxList *)reply);
}

static int
h_destroy_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_sandbox_destroy(VMD(call), call,
	    ((const Moat__V1__SandboxRef *)request)->sandbox_id);
}

static int
h_exec_start(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_exec_start(VMD(call), call,
	    (const Moat__V1__ExecRequest *)request,
	    (Moat__V1__ExecHandle *)reply);
}

static int
h_exec_read(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_exec_read(VMD(call), call,
	    (const Moat__V1__ExecReadRequest *)request,
	    (Moat__V1__ExecReadReply *)reply);
}

static int
h_exec_write(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_exec_write(VMD(call), call,
	    (const Moat__V1__ExecWriteRequest *)request);
}

static int
h_exec_wait(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_exec_wait(VMD(call), call,
	    (const Moat__V1__ExecWaitRequest *)request,
	    (Moat__V1__ExecStatus *)reply);
}

static int
h_exec_kill(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_exec_kill(VMD(call), call,
	    (const Moat__V1__ExecKillRequest *)request);
}

static int
h_exec_resize(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	(void)reply;
	return vmd_exec_resize(VMD(call), call,
	    (const Moat__V1__ExecResizeRequest *)request);
}

static int
h_exec(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_exec_run(VMD(call), call,
	    (const Moat__V1__ExecRequest *)request,
	    (Moat__V1__ExecResult *)reply);
}

static int
h_read_file(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_file_read(VMD(call), call,
	    (const Moat__V1__FileReadRequest *)request,
	    (Moat__V1__FileData *)reply);
}

static int
h_write_file(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_file_write(VMD(call), call,
	    (const Moat__V1__FileWriteRequest *)request,
	    (Moat__V1__FileInfo *)reply);
}

static int
h_put_archive(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_archive_put(VMD(call), call,
	    (const Moat__V1__ArchivePutRequest *)request,
	    (Moat__V1__ArchivePutReply *)reply);
}

static int
h_get_archive(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_archive_get(VMD(call), call,
	    (const Moat__V1__ArchiveGetRequest *)request,
	    (Moat__V1__ArchiveGetReply *)reply);
}

static int
h_list_files(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_file_list(VMD(call), call,
	    (const Moat__V1__PathRequest *)request,
	    (Moat__V1__FileList *)reply);
}

static int
h_stat_file(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_file_stat(VMD(call), call,
	    (const Moat__V1__PathRequest *)request,
	    (Moat__V1__FileInfo *)reply);
}

static int
h_remove_file(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_file_remove(VMD(call), call,
	    (const Moat__V1__PathRequest *)request);
}

static int
h_make_dir(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_file_mkdir(VMD(call), call,
	    (const Moat__V1__PathRequest *)request,
	    (Moat__V1__FileInfo *)reply);
}

static int
h_sandbox_info(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_guest_info(VMD(call), call,
	    (const Moat__V1__SandboxRef *)request,
	    (Moat__V1__GuestInfo *)reply);
}

static int
h_trace_fs(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_fs_trace(VMD(call), call,
	    (const Moat__V1__FsTraceCall *)request,
	    (Moat__V1__FsTrace *)reply);
}

static int
h_snapshot_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_snapshot_take(VMD(call), call,
	    (const Moat__V1__SnapshotSandboxRequest *)request,
	    (Moat__V1__LocalSnapshot *)reply);
}

static int
h_resume_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_snapshot_resume(VMD(call), call,
	    (const Moat__V1__SandboxRef *)request, (Moat__V1__Sandbox *)reply);
}

static int
h_restore_sandbox(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	const Moat__V1__RestoreSandboxRequest *req =
	    (const Moat__V1__RestoreSandboxRequest *)request;
	struct sandbox *sb;
	int rv;

	/* A cordoned node takes no new sandbox; a restore in place replaces
	 * one it has, and a drain's (keep_sandbox_id) is let in. */
	if (req->replace_sandbox_id[0] == '\0' &&
	    req->keep_sandbox_id[0] == '\0' &&
	    (rv = vmd_cordon_check(VMD(call), call, "restore")) != MOAT_OK)
		return rv;
	if ((rv = vmd_sandbox_restore(VMD(call), call, req, &sb)) != MOAT_OK)
		return rv;
	rv = vmd_sandbox_to_proto(sb, (Moat__V1__Sandbox *)reply);
	vmd_sandbox_put(sb);
	if (rv != MOAT_OK)
		return moat_rpc_error(call, rv, "out of memory");
	return MOAT_OK;
}

static int
h_list_local_snapshots(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	return vmd_snapshot_list(VMD(call), call,
	    (const Moat__V1__ListLocalSnapshotsRequest *)request,
	    (Moat__V1__LocalSnapshotList *)reply);
}

static int
h_delete_local_snapshot(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	const Moat__V1__LocalSnapshotRef *req =
	    (const Moat__V1__LocalSnapshotRef *)request;
	int rv = vmd_snapshot_delete(VMD(call), call, req);

	/* Its pooled VMMs hold its RAM (mapped, or a copy): they go now. */
	if (rv == MOAT_OK)
		vmd_pool_forget(VMD(call), req->snapshot_id);
	return rv;
}

static int
h_run_code(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_code_run(VMD(call), call,
	    (const Moat__V1__RunCodeRequest *)request,
	    (Moat__V1__RunCodeResult *)reply);
}

static int
h_close_code_context(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	(void)reply;
	return vmd_code_close(VMD(call), call,
	    (const Moat__V1__CodeContextCall *)request);
}

static int
h_egress_events(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_egress_events(VMD(call), call,
	    (const Moat__V1__EgressEventsRequest *)request,
	    (Moat__V1__EgressEventList *)reply);
}

static int
h_cordon(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	int rv;

	if ((rv = vmd_cordon_set(VMD(call), call,
	         (const Moat__V1__CordonRequest *)request)) != MOAT_OK)
		return rv;
	return h_node_info(call, request, reply);
}

static int
h_set_timeout(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_lifetime_set_timeout(VMD(call), call,
	    (const Moat__V1__SetTimeoutRequest *)request,
	    (Moat__V1__Sandbox *)reply);
}

static int
h_start_image_build(struct moat_rpc_call *call,
    const ProtobufCMessage *request, ProtobufCMessage *reply)
{
	return vmd_image_build_start(VMD(call), call,
	    (const Moat__V1__ImageBuildRequest *)request,
	    (Moat__V1__ImageBuild *)reply);
}

static int
h_get_image_build(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_image_build_get(VMD(call), call,
	    (const Moat__V1__ImageBuildRef *)request,
	    (Moat__V1__ImageBuild *)reply);
}

static int
h_list_images(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_images_list_rpc(VMD(call), call,
	    (const Moat__V1__ListImagesRequest *)request,
	    (Moat__V1__ImageList *)reply);
}

static int
h_push_image(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_image_push(VMD(call), call,
	    ((const Moat__V1__ImageRef *)request)->name,
	    (Moat__V1__ImageInfo *)reply);
}

static int
h_pull_image(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_image_pull(VMD(call), call,
	    ((const Moat__V1__ImageRef *)request)->name,
	    (Moat__V1__ImageInfo *)reply);
}

static int
h_remove_image(struct moat_rpc_call *call, const ProtobufCMessage *request,
    ProtobufCMessage *reply)
{
	return vmd_image_remove(VMD(call), call,
	    ((const Moat__V1__ImageRef *)request)->name,
	    (Moat__V1__RemoveImageReply *)reply);
}

/* Auth is the gateway's job: vmd listens where only it can reach. */
static const struct moat_rpc_method vm_methods[] = {
	{ .name = "Health", .handler = h_health },
	{ .name = "NodeInfo", .handler = h_node_info },
	{ .name = "CreateSandbox",
	    .handler = h_create_sandbox,
	    .mutating = true },
	{ .name = "GetSandbox", .handler = h_get_sandbox },
	{ .name = "ListSandboxes", .handler = h_list_sandboxes },
	{ .name = "ListAllSandboxes", .handler = h_list_all_sandboxes },
	{ .name = "DestroySandbox",
	    .handler = h_destroy_sandbox,
	    .mutating = true },
	{ .name = "ExecStart", .handler = h_exec_start, .mutating = true },
	{ .name = "ExecRead", .handler = h_exec_read },
	{ .name = "ExecWrite", .handler = h_exec_write, .mutating = true },
	{ .name = "ExecWait", .handler = h_exec_wait },
	{ .name = "ExecKill", .handler = h_exec_kill, .mutating = true },
	{ .name = "Exec", .handler = h_exec, .mutating = true },
	{ .name = "ExecResize", .handler = h_exec_resize, .mutating = true },
	{ .name = "ReadFile", .handler = h_read_file },
	{ .name = "WriteFile", .handler = h_write_file, .mutating = true },
	{ .name = "ListFiles", .handler = h_list_files },
	{ .name = "StatFile", .handler = h_stat_file },
	{ .name = "RemoveFile", .handler = h_remove_file, .mutating = true },
	{ .name = "MakeDir", .handler = h_make_dir, .mutating = true },
	{ .name = "PutArchive", .handler = h_put_archive, .mutating = true },
	{ .name = "GetArchive", .handler = h_get_archive },
	{ .name = "SandboxInfo", .handler = h_sandbox_info },
	{ .name = "TraceFs", .handler = h_trace_fs },
	{ .name = "SnapshotSandbox",
	    .handler = h_snapshot_sandbox,
	    .mutating = true },
	{ .name = "RestoreSandbox",
	    .handler = h_restore_sandbox,
	    .mutating = true },
	{ .name = "ListLocalSnapshots", .handler = h_list_local_snapshots },
	{ .name = "DeleteLocalSnapshot",
	    .handler = h_delete_local_snapshot,
	    .mutating = true },
	{ .name = "ResumeSandbox",
	    .handler = h_resume_sandbox,
	    .mutating = true },
	{ .name = "RunCode", .handler = h_run_code, .mutating = true },
	{ .name = "CloseCodeContext",
	    .handler = h_close_code_context,
	    .mutating = true },
	{ .name = "EgressEvents", .handler = h_egress_events },
	{ .name = "Cordon", .handler = h_cordon, .mutating = true },
	{ .name = "SetTimeout", .handler = h_set_timeout, .mutating = true },
	{ .name = "StartImageBuild",
	    .handler = h_start_image_build,
	    .mutating = true },
	{ .name = "GetImageBuild", .handler = h_get_image_build },
	{ .name = "ListImages", .handler = h_list_images },
	{ .name = "PushImage", .handler = h_push_image, .mutating = true },
	{ .name = "PullImage", .handler = h_pull_image, .mutating = true },
	{ .name = "RemoveImage", .handler = h_remove_image, .mutating = true },
};

void
vmd_service(struct vmd *vmd, struct moat_rpc_service *svc)
{
	svc->descriptor = &moat__v1__vm__descriptor;
	svc->methods = vm_methods;
	svc->n_methods = sizeof(vm_methods) / sizeof(vm_methods[0]);
	svc->ctx = vmd;
}
