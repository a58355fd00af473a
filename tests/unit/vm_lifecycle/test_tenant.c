/*
 * test_tenant.c: vmd's tenant checks, through its real RPC service (an
 * ipc:// server in a temporary directory) on the fake VMM driver: every
 * sandbox-scoped call names a tenant (Envelope.tenant; none is
 * INVALID_ARGUMENT), another tenant's sandbox or local snapshot is
 * NOT_FOUND worded as a missing one, ListSandboxes never lists every
 * tenant, CreateSandbox's request tenant must agree with the envelope's,
 * and a restore says how many bytes it pulled (none from a local
 * snapshot). Not for: the lifecycle itself (test_lifecycle.c) or a real
 * VMM (tests/integration/vm).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fake_node.h"
#include "fake_vmm.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "accel.h"
#include "image.h"
#include "node.h"
#include "sandbox.h"
#include "service.h"
#include "snapram.h"
#include "snapshot_meta.h"
#include "spawn.h"

#define VM "moat.v1.Vm"
#define TENANT_A "tenant-a"
#define TENANT_B "tenant-b"
#define SNAP_ID "snap-node-test-0123456789abcdef"

struct env {
	struct vmd vmd;
	char root[64];
	struct moat_rpc_server *srv;
	struct moat_rpc_client *cli;
	char *sandbox; /* tenant A's, created in setup */
};

/* One call as `tenant` (NULL: no Envelope.tenant). On MOAT_OK *reply is
 * the caller's; otherwise *msg (heap) says why. */
static int
call_as(struct env *e, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **reply, char **msg)
{
	struct moat_rpc_opts opts = { .timeout_ms = 10000, .tenant = tenant };

	*msg = NULL;
	return moat_rpc_call(e->cli, VM, method, req, desc, reply, &opts, msg);
}

/* call_as when only the status and message matter. */
static int
status_as(struct env *e, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    char **msg)
{
	ProtobufCMessage *reply = NULL;
	int rv = call_as(e, tenant, method, req, desc, &reply, msg);

	if (reply != NULL)
		protobuf_c_message_free_unpacked(reply, NULL);
	return rv;
}

/* A local snapshot of tenant A's on disk, as SnapshotSandbox leaves one:
 * its catalog entry and a scratch copy the fake driver restores. */
static void
write_snapshot(struct env *e)
{
	Moat__V1__LocalSnapshot m = MOAT__V1__LOCAL_SNAPSHOT__INIT;
	char *dir =
	    moat_asprintf("%s/snapshots/%s", e->vmd.cfg.state_dir, SNAP_ID);
	char *stamp = vmd_image_stamp(&e->vmd, "default");

	assert_non_null(dir);
	assert_non_null(stamp);
	assert_int_equal(moat_mkdir_p(dir, 0700), 0);
	fake_node_touch(dir, MOAT_VMM_SNAP_SCRATCH);
	m.snapshot_id = SNAP_ID;
	m.sandbox_id = e->sandbox;
	m.dir = dir;
	m.tenant = TENANT_A;
	m.image = "default";
	m.vcpus = 1;
	m.memory_mib = 128;
	m.scratch_mib = 64;
	m.accel = "tcg";
	m.image_stamp = stamp;
	m.vmm = "fake";
	m.location = "ram";
	assert_int_equal(vmd_snapshot_write_meta(dir, &m), 0);
	free(stamp);
	free(dir);
}

static int
setup(void **state)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	struct moat_rpc_service svc;
	Moat__V1__Sandbox *sb = NULL;
	struct env *e = calloc(1, sizeof(*e));
	char *url, *msg = NULL;

	assert_non_null(e);
	fake_node_init(&e->vmd, e->root, sizeof(e->root), "tenant", "tcg",
	    "/dev/null");
	e->vmd.started_ms = moat_rpc_now_ms();
	vmd_service(&e->vmd, &svc);
	url = moat_asprintf("ipc://%s/vmd.sock", e->root);
	assert_int_equal(moat_rpc_server_start(&e->srv, url, &svc, 8, &msg),
	    MOAT_OK);
	assert_int_equal(moat_rpc_client_open(&e->cli, url, &msg), MOAT_OK);
	free(url);
	/* Tenant A's sandbox, named by the envelope alone. */
	req.image = "default";
	req.memory_mib = 128;
	req.scratch_mib = 64;
	assert_int_equal(call_as(e, TENANT_A, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor,
	                     (ProtobufCMessage **)&sb, &msg),
	    MOAT_OK);
	assert_string_equal(sb->tenant, TENANT_A);
	assert_int_equal(sb->pulled_bytes, 0);
	assert_non_null(e->sandbox = strdup(sb->id));
	moat__v1__sandbox__free_unpacked(sb, NULL);
	write_snapshot(e);
	*state = e;
	return 0;
}

static int
teardown(void **state)
{
	struct env *e = *state;

	moat_rpc_client_close(e->cli);
	moat_rpc_server_stop(e->srv);
	fake_node_fini(&e->vmd, e->root);
	free(e->sandbox);
	free(e);
	return 0;
}

/* `method` with `req` as tenant B is NOT_FOUND, in the words used for a
 * sandbox that does not exist; with no tenant it is INVALID_ARGUMENT. */
static void
refused_to_others(struct env *e, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc)
{
	char *msg = NULL, *want;

	assert_int_equal(status_as(e, TENANT_B, method, req, desc, &msg),
	    MOAT_NOT_FOUND);
	want = moat_asprintf("sandbox %s not found", e->sandbox);
	assert_non_null(strstr(msg, want));
	free(want);
	free(msg);
	assert_int_equal(status_as(e, NULL, method, req, desc, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "tenant is required"));
	free(msg);
}

static void
test_sandbox_calls_check_the_tenant(void **state)
{
	struct env *e = *state;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__ExecRequest exec = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecReadRequest rd = MOAT__V1__EXEC_READ_REQUEST__INIT;
	Moat__V1__FileReadRequest file = MOAT__V1__FILE_READ_REQUEST__INIT;
	Moat__V1__PathRequest path = MOAT__V1__PATH_REQUEST__INIT;
	Moat__V1__FsTraceCall trace = MOAT__V1__FS_TRACE_CALL__INIT;
	Moat__V1__SnapshotSandboxRequest snap =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__RunCodeRequest code = MOAT__V1__RUN_CODE_REQUEST__INIT;
	char *argv[] = { "true" }, *msg = NULL;

	ref.sandbox_id = e->sandbox;
	exec.sandbox_id = e->sandbox;
	exec.argv = argv;
	exec.n_argv = 1;
	rd.sandbox_id = e->sandbox;
	rd.exec_id = 1;
	file.sandbox_id = e->sandbox;
	file.path = "/etc/hostname";
	path.sandbox_id = e->sandbox;
	path.path = "/tmp";
	trace.sandbox_id = e->sandbox;
	snap.sandbox_id = e->sandbox;
	code.sandbox_id = e->sandbox;
	code.code = "1";

	refused_to_others(e, "GetSandbox", &ref.base,
	    &moat__v1__sandbox__descriptor);
	refused_to_others(e, "SandboxInfo", &ref.base,
	    &moat__v1__guest_info__descriptor);
	refused_to_others(e, "Exec", &exec.base,
	    &moat__v1__exec_result__descriptor);
	refused_to_others(e, "ExecStart", &exec.base,
	    &moat__v1__exec_handle__descriptor);
	refused_to_others(e, "ExecRead", &rd.base,
	    &moat__v1__exec_read_reply__descriptor);
	refused_to_others(e, "ReadFile", &file.base,
	    &moat__v1__file_data__descriptor);
	refused_to_others(e, "ListFiles", &path.base,
	    &moat__v1__file_list__descriptor);
	refused_to_others(e, "MakeDir", &path.base,
	    &moat__v1__file_info__descriptor);
	refused_to_others(e, "TraceFs", &trace.base,
	    &moat__v1__fs_trace__descriptor);
	refused_to_others(e, "SnapshotSandbox", &snap.base,
	    &moat__v1__local_snapshot__descriptor);
	refused_to_others(e, "RunCode", &code.base,
	    &moat__v1__run_code_result__descriptor);
	refused_to_others(e, "DestroySandbox", &ref.base,
	    &moat__v1__empty__descriptor);

	/* The owner still has it, and B's destroy left it alone. */
	assert_int_equal(status_as(e, TENANT_A, "GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, &msg),
	    MOAT_OK);
	assert_int_equal(status_as(e, TENANT_A, "DestroySandbox", &ref.base,
	                     &moat__v1__empty__descriptor, &msg),
	    MOAT_OK);
	assert_int_equal(status_as(e, TENANT_A, "GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, &msg),
	    MOAT_NOT_FOUND);
	free(msg);
}

/* ListSandboxes as `tenant` with the request's field `field`: its
 * status, and on MOAT_OK *n the sandboxes listed. */
static int
list_as(struct env *e, const char *tenant, const char *field, size_t *n)
{
	Moat__V1__ListSandboxesRequest req =
	    MOAT__V1__LIST_SANDBOXES_REQUEST__INIT;
	Moat__V1__SandboxList *list = NULL;
	char *msg = NULL;
	int rv;

	req.tenant = (char *)field;
	rv = call_as(e, tenant, "ListSandboxes", &req.base,
	    &moat__v1__sandbox_list__descriptor, (ProtobufCMessage **)&list,
	    &msg);
	if (rv == MOAT_OK) {
		*n = list->n_sandboxes;
		moat__v1__sandbox_list__free_unpacked(list, NULL);
	} else {
		assert_non_null(strstr(msg, "tenant"));
	}
	free(msg);
	return rv;
}

static void
test_list_sandboxes_never_all(void **state)
{
	struct env *e = *state;
	size_t n = 99;

	/* An empty tenant never means every tenant. */
	assert_int_equal(list_as(e, NULL, "", &n), MOAT_INVALID_ARGUMENT);
	assert_int_equal(list_as(e, "", "", &n), MOAT_INVALID_ARGUMENT);
	/* The envelope and the request must agree. */
	assert_int_equal(list_as(e, TENANT_B, TENANT_A, &n),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(list_as(e, TENANT_B, "", &n), MOAT_OK);
	assert_int_equal(n, 0);
	assert_int_equal(list_as(e, TENANT_A, "", &n), MOAT_OK);
	assert_int_equal(n, 1);
	assert_int_equal(list_as(e, NULL, TENANT_A, &n), MOAT_OK);
	assert_int_equal(n, 1);
	assert_int_equal(list_as(e, TENANT_A, TENANT_A, &n), MOAT_OK);
	assert_int_equal(n, 1);
}

static void
test_create_names_one_tenant(void **state)
{
	struct env *e = *state;
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	char *msg = NULL;

	req.image = "default";
	req.memory_mib = 128;
	req.scratch_mib = 64;
	assert_int_equal(status_as(e, NULL, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "tenant is required"));
	free(msg);
	req.tenant = TENANT_A;
	assert_int_equal(status_as(e, TENANT_B, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, TENANT_B));
	free(msg);
	/* The request's field alone names it too (direct use). */
	req.tenant = TENANT_B;
	assert_int_equal(call_as(e, NULL, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor,
	                     (ProtobufCMessage **)&sb, &msg),
	    MOAT_OK);
	assert_string_equal(sb->tenant, TENANT_B);
	moat__v1__sandbox__free_unpacked(sb, NULL);
}

static void
test_local_snapshots_check_the_tenant(void **state)
{
	struct env *e = *state;
	Moat__V1__ListLocalSnapshotsRequest list =
	    MOAT__V1__LIST_LOCAL_SNAPSHOTS_REQUEST__INIT;
	Moat__V1__RestoreSandboxRequest restore =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	Moat__V1__LocalSnapshotList *l = NULL;
	Moat__V1__Sandbox *sb = NULL;
	char *msg = NULL;

	assert_int_equal(status_as(e, NULL, "ListLocalSnapshots", &list.base,
	                     &moat__v1__local_snapshot_list__descriptor, &msg),
	    MOAT_INVALID_ARGUMENT);
	free(msg);
	assert_int_equal(call_as(e, TENANT_B, "ListLocalSnapshots", &list.base,
	                     &moat__v1__local_snapshot_list__descriptor,
	                     (ProtobufCMessage **)&l, &msg),
	    MOAT_OK);
	assert_int_equal(l->n_snapshots, 0);
	moat__v1__local_snapshot_list__free_unpacked(l, NULL);
	assert_int_equal(call_as(e, TENANT_A, "ListLocalSnapshots", &list.base,
	                     &moat__v1__local_snapshot_list__descriptor,
	                     (ProtobufCMessage **)&l, &msg),
	    MOAT_OK);
	assert_int_equal(l->n_snapshots, 1);
	moat__v1__local_snapshot_list__free_unpacked(l, NULL);

	/* B can neither restore nor delete A's snapshot, nor tell it is
	 * there; without a tenant nobody can. */
	restore.snapshot_id = SNAP_ID;
	ref.snapshot_id = SNAP_ID;
	assert_int_equal(status_as(e, NULL, "RestoreSandbox", &restore.base,
	                     &moat__v1__sandbox__descriptor, &msg),
	    MOAT_INVALID_ARGUMENT);
	free(msg);
	assert_int_equal(status_as(e, TENANT_B, "RestoreSandbox",
	                     &restore.base, &moat__v1__sandbox__descriptor,
	                     &msg),
	    MOAT_NOT_FOUND);
	assert_non_null(strstr(msg, "snapshot " SNAP_ID " not found"));
	free(msg);
	assert_int_equal(status_as(e, TENANT_B, "DeleteLocalSnapshot",
	                     &ref.base, &moat__v1__empty__descriptor, &msg),
	    MOAT_NOT_FOUND);
	free(msg);
	assert_int_equal(status_as(e, NULL, "DeleteLocalSnapshot", &ref.base,
	                     &moat__v1__empty__descriptor, &msg),
	    MOAT_INVALID_ARGUMENT);
	free(msg);
	/* B cannot restore into A's sandbox in place either. */
	restore.replace_sandbox_id = e->sandbox;
	restore.tenant = TENANT_B;
	assert_int_equal(status_as(e, TENANT_B, "RestoreSandbox",
	                     &restore.base, &moat__v1__sandbox__descriptor,
	                     &msg),
	    MOAT_NOT_FOUND);
	free(msg);

	/* A restores it (nothing pulled: it is local) and deletes it. */
	restore.replace_sandbox_id = "";
	restore.tenant = "";
	assert_int_equal(call_as(e, TENANT_A, "RestoreSandbox", &restore.base,
	                     &moat__v1__sandbox__descriptor,
	                     (ProtobufCMessage **)&sb, &msg),
	    MOAT_OK);
	assert_string_equal(sb->tenant, TENANT_A);
	assert_string_equal(sb->restored_from, SNAP_ID);
	assert_int_equal(sb->pulled_bytes, 0);
	moat__v1__sandbox__free_unpacked(sb, NULL);
	assert_int_equal(status_as(e, TENANT_A, "DeleteLocalSnapshot",
	                     &ref.base, &moat__v1__empty__descriptor, &msg),
	    MOAT_OK);
}

/* A resent mutating call is answered from memory only for the same
 * tenant: B reusing A's request id learns nothing of A's reply. */
static void
test_dedup_is_per_tenant(void **state)
{
	struct env *e = *state;
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 10000,
		.request_id = 0x5eed,
		.tenant = TENANT_A };
	ProtobufCMessage *reply = NULL;
	char *msg = NULL;

	req.image = "default";
	req.memory_mib = 128;
	req.scratch_mib = 64;
	assert_int_equal(moat_rpc_call(e->cli, VM, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, &reply, &opts,
	                     &msg),
	    MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
	opts.tenant = TENANT_B;
	assert_int_equal(moat_rpc_call(e->cli, VM, "CreateSandbox", &req.base,
	                     &moat__v1__sandbox__descriptor, &reply, &opts,
	                     &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(reply);
	assert_non_null(strstr(msg, "already used"));
	free(msg);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int
main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_sandbox_calls_check_the_tenant),
		T(test_list_sandboxes_never_all),
		T(test_create_names_one_tenant),
		T(test_local_snapshots_check_the_tenant),
		T(test_dedup_is_per_tenant),
	};
	int failed;

	signal(SIGPIPE, SIG_IGN);
	if (moat_spawner_start() != 0) {
		fprintf(stderr, "cannot start the spawner\n");
		return 1;
	}
	failed = cmocka_run_group_tests(tests, NULL, NULL);
	moat_spawner_stop();
	return failed;
}
