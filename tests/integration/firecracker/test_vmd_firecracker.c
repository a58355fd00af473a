/*
 * test_vmd_firecracker.c: the contract test of moat-vmd driving its
 * Firecracker driver end to end, with no Firecracker and no KVM: the real
 * moat-vmd binary runs with driver=firecracker, and the `firecracker` it
 * finds on PATH is a wrapper around tests/unit/firecracker/fc_double.py
 * in agent mode (every API request checked against Firecracker's OpenAPI
 * spec; the guest side of the hybrid vsock proxied to a real moat-agent
 * in host mode), so exec and files through vmd's RPC really reach an
 * agent. Cases: create (vmm firecracker, accel kvm, no request refused by
 * the double); exec `echo hi`; a file written and read back; a snapshot
 * (LocalSnapshot.vmm firecracker, files in place, the sandbox still
 * serving after it); a restore into a fresh double (snapshot load, no
 * boot) that serves and holds the file; the same snapshot refused with
 * FAILED_PRECONDITION by a vmd running the qemu driver; a double killed
 * with SIGKILL, or exiting 1 by itself, turning its sandbox FAILED with
 * the signal or exit status and the last lines of its console and log; destroy leaving no process and no file;
 * vmd restarts that keep sandboxes (issue 15, part 2, as
 * tests/integration/vm/test_adopt.c checks for QEMU): after kill -9 of
 * vmd the next one re-adopts a live double (same id and VMM pid, exec,
 * its file, a background process alive, an exec from before UNAVAILABLE)
 * and fails, with the reason, one whose double died and one whose state
 * file names a pid that is no Firecracker or that lacks vmm-info (an
 * older vmd's); its console drained again; SIGTERM keeps it (also
 * paused by a snapshot: the next vmd resumes it), and
 * stop-sandboxes-on-exit destroys; a snapshot with leave_paused (a
 * drain's move) then ResumeSandbox serving on a new guest link, or then
 * destroy;
 * and a jailed start through tests/integration/firecracker/jailer (a
 * stand-in that checks the jailer's arguments and builds its chroot
 * layout without chrooting), re-adopted after kill -9 of its vmd,
 * snapshotted and restored into a jail of its own, with the jails and
 * the cgroup gone after destroy. KVM is not asked for ([firecracker] test-no-kvm-check, which
 * vmd accepts only with [vmd] test-hooks=true). The double's restore is
 * not a VM restore (see its docstring); without test-hooks vmd refuses
 * test-no-kvm-check. Not for: real VMs (that is
 * tests/integration/vm with MOAT_TEST_DRIVER=firecracker) or the driver
 * alone (tests/unit/firecracker).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "vm.pb-c.h"
#include "vmd_harness.h"

#define CALL_MS 30000u
#define NOTE "written before the snapshot\n"

static char root[64]; /* the test's temporary folder */
static char images[128];
static char jail_base[128];
static char cgroup_root[128];
static char jailer_record[128];
static struct vmd_proc vmd; /* driver=firecracker, not jailed */
static struct vmd_proc jailed_vmd;
static struct vmd_proc qemu_vmd; /* driver=qemu, same state directory */
/* The next vmd started keeps its sandboxes on SIGTERM (the harness makes
 * vmds destroy them, so that a failed test leaves nothing running). */
static bool keep_on_exit;
/* A process started in the background in a sandbox: it leaves the
 * sandbox's agent, so the test ends it (teardown too, after a failure). */
static pid_t bg_pid;

/* ---- helpers ---- */

static void
write_text(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static bool
path_exists(const char *p)
{
	struct stat st;

	return lstat(p, &st) == 0;
}

/* One call to v for tenant "default" (every sandbox call names its
 * tenant, as the gateway's do), CALL_MS. */
static int
call(struct vmd_proc *v, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply)
{
	return vmd_call(v, method, req, desc, reply, CALL_MS);
}

/* vmd_spawn's child: moat-vmd on the config `arg`. */
static void
exec_vmd(const struct vmd_proc *v, void *arg)
{
	if (keep_on_exit)
		setenv("MOAT_VMD_STOP_SANDBOXES_ON_EXIT", "false", 1);
	execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--config", (const char *)arg,
	    "--state-dir", v->state, "--image-dir", images, "--listen", v->url,
	    "--cache-dir", root, "--node-id", "fc-test", (char *)NULL);
}

/* Writes <state>.conf and starts moat-vmd on it; waits for Health. The
 * timeouts are generous: a Python double starting on a loaded two-core
 * CI machine under ASan has taken over 5 s to listen. */
static void
vmd_start(struct vmd_proc *v, const char *name, const char *driver,
    bool jailed)
{
	char state[300];
	char conf[400];
	char *text;

	snprintf(state, sizeof(state), "%s/%s", root, name);
	snprintf(conf, sizeof(conf), "%s.conf", state);
	text = moat_asprintf("[vmd]\n"
	                     "driver = %s\n"
	                     "test-hooks = true\n"
	                     "templates = off\n"
	                     "boot-timeout-ms = 30000\n"
	                     "[firecracker]\n"
	                     "test-no-kvm-check = true\n"
	                     "api-timeout-ms = 20000\n"
	                     "%s%s%s%s%s%s%s",
	    driver,
	    jailed ? "jailer = true\njailer-binary = " : "jailer = false\n",
	    jailed ? MOAT_FAKE_JAILER : "", jailed ? "\nchroot-base = " : "",
	    jailed ? jail_base : "", jailed ? "\ncgroup-root = " : "",
	    jailed ? cgroup_root : "",
	    jailed ? "\nparent-cgroup = moat\nnew-pid-ns = true\n"
	             "uid-base = 900000\nid-count = 16\n" :
	             "");
	assert_non_null(text);
	write_text(conf, text, 0644);
	free(text);
	vmd_spawn(v, state, exec_vmd, conf, 15000);
}

/* Waits up to 5 s for no process to mention `needle`. */
static void
assert_no_process(const char *needle)
{
	uint64_t until = moat_rpc_now_ms() + 5000;

	while (vmd_procs_mentioning(needle) > 0 && moat_rpc_now_ms() < until)
		usleep(50 * 1000);
	if (vmd_procs_mentioning(needle) > 0)
		fail_msg("a process still mentions %s", needle);
}

static Moat__V1__Sandbox *
create(struct vmd_proc *v)
{
	Moat__V1__Sandbox *sb = vmd_create_or_fail(v, 256, 64, CALL_MS);

	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	assert_string_equal(sb->driver, "firecracker");
	assert_string_equal(sb->accel, "kvm");
	assert_true(sb->vmm_pid > 0);
	return sb;
}

/* Destroys `sb` and checks nothing of it is left: no process mentions
 * its id (the double has --id, its agent the sandbox folder), the VMM
 * pid is gone (reaped, not even a zombie), its folder is gone. */
static void
destroy_and_check_gone(struct vmd_proc *v, const Moat__V1__Sandbox *sb)
{
	char *dir = moat_asprintf("%s/vms/%s", v->state, sb->id);
	char proc[64];
	uint64_t until = moat_rpc_now_ms() + 5000;

	vmd_destroy_sandbox(v, sb->id);
	snprintf(proc, sizeof(proc), "/proc/%d", (int)sb->vmm_pid);
	/* A double that outlived its vmd is this test's child now (the
	 * test is a subreaper): reap it. */
	while (path_exists(proc) && moat_rpc_now_ms() < until) {
		(void)waitpid(sb->vmm_pid, NULL, WNOHANG);
		usleep(20 * 1000);
	}
	assert_false(path_exists(proc));
	assert_no_process(sb->id);
	assert_false(path_exists(dir));
	free(dir);
}

/* `echo hi` through vmd's Exec; wants "hi\n". */
static void
exec_echo_hi(struct vmd_proc *v, const char *id)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *res = NULL;

	req.sandbox_id = (char *)id;
	req.language = "bash";
	req.code = "echo hi";
	req.timeout_ms = 10000;
	if (call(v, "Exec", &req.base, &moat__v1__exec_result__descriptor,
	        (ProtobufCMessage **)&res) != MOAT_OK) {
		vmd_log_tail(v, 40);
		fail_msg("Exec in %s: %s", id, vmd_last_err);
	}
	assert_true(res->status->exited);
	assert_int_equal(res->status->exit_code, 0);
	assert_int_equal(res->stdout.len, 3);
	assert_memory_equal(res->stdout.data, "hi\n", 3);
	protobuf_c_message_free_unpacked(&res->base, NULL);
}

/* ExecStart of bash `code`, waited for; returns its exec id. */
static uint64_t
exec_started(struct vmd_proc *v, const char *id, const char *code)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecWaitRequest wr = MOAT__V1__EXEC_WAIT_REQUEST__INIT;
	Moat__V1__ExecHandle *h = NULL;
	Moat__V1__ExecStatus *st = NULL;
	uint64_t exec_id;

	req.sandbox_id = (char *)id;
	req.language = "bash";
	req.code = (char *)code;
	if (call(v, "ExecStart", &req.base, &moat__v1__exec_handle__descriptor,
	        (ProtobufCMessage **)&h) != MOAT_OK)
		fail_msg("ExecStart in %s: %s", id, vmd_last_err);
	exec_id = h->exec_id;
	protobuf_c_message_free_unpacked(&h->base, NULL);
	wr.sandbox_id = (char *)id;
	wr.exec_id = exec_id;
	wr.wait_ms = 10000;
	if (call(v, "ExecWait", &wr.base, &moat__v1__exec_status__descriptor,
	        (ProtobufCMessage **)&st) != MOAT_OK)
		fail_msg("ExecWait in %s: %s", id, vmd_last_err);
	assert_true(st->exited);
	protobuf_c_message_free_unpacked(&st->base, NULL);
	return exec_id;
}

/* ExecRead of exec `exec_id` from the start; wants stdout `text`. */
static void
exec_output_is(struct vmd_proc *v, const char *id, uint64_t exec_id,
    const char *text)
{
	Moat__V1__ExecReadRequest rr = MOAT__V1__EXEC_READ_REQUEST__INIT;
	Moat__V1__ExecReadReply *r = NULL;

	rr.sandbox_id = (char *)id;
	rr.exec_id = exec_id;
	if (call(v, "ExecRead", &rr.base,
	        &moat__v1__exec_read_reply__descriptor,
	        (ProtobufCMessage **)&r) != MOAT_OK)
		fail_msg("ExecRead %" PRIu64 " in %s: %s", exec_id, id,
		    vmd_last_err);
	assert_int_equal(r->stdout.len, strlen(text));
	assert_memory_equal(r->stdout.data, text, strlen(text));
	protobuf_c_message_free_unpacked(&r->base, NULL);
}

static void
write_file(struct vmd_proc *v, const char *id, const char *path,
    const char *text)
{
	Moat__V1__FileWriteRequest wr = MOAT__V1__FILE_WRITE_REQUEST__INIT;

	wr.sandbox_id = (char *)id;
	wr.path = (char *)path;
	wr.data.data = (uint8_t *)text;
	wr.data.len = strlen(text);
	if (call(v, "WriteFile", &wr.base, &moat__v1__file_info__descriptor,
	        NULL) != MOAT_OK)
		fail_msg("WriteFile %s: %s", path, vmd_last_err);
}

/* ReadFile of `path`; wants exactly `text`. */
static void
read_file_is(struct vmd_proc *v, const char *id, const char *path,
    const char *text)
{
	Moat__V1__FileReadRequest rr = MOAT__V1__FILE_READ_REQUEST__INIT;
	Moat__V1__FileData *fd = NULL;

	rr.sandbox_id = (char *)id;
	rr.path = (char *)path;
	if (call(v, "ReadFile", &rr.base, &moat__v1__file_data__descriptor,
	        (ProtobufCMessage **)&fd) != MOAT_OK)
		fail_msg("ReadFile %s: %s", path, vmd_last_err);
	assert_int_equal(fd->data.len, strlen(text));
	assert_memory_equal(fd->data.data, text, strlen(text));
	protobuf_c_message_free_unpacked(&fd->base, NULL);
}

/* The double's request log (double.jsonl in Firecracker's working
 * folder): fails if the double refused any request vmd made (each was
 * checked against the OpenAPI spec); returns the whole log (heap). */
static char *
double_log_clean(const char *folder)
{
	char *path = moat_asprintf("%s/double.jsonl", folder);
	char *text = NULL;
	size_t len;

	assert_int_equal(moat_read_file(path, 1 << 20, &text, &len), 0);
	if (strstr(text, "\"status\": 400") != NULL)
		fail_msg("the double refused a request of vmd:\n%s", text);
	free(path);
	return text;
}

static Moat__V1__Sandbox *
get_sandbox(struct vmd_proc *v, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__Sandbox *sb = NULL;

	ref.sandbox_id = (char *)id;
	assert_int_equal(call(v, "GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor,
	                     (ProtobufCMessage **)&sb),
	    MOAT_OK);
	return sb;
}

static int
restore(struct vmd_proc *v, const char *snap_id, Moat__V1__Sandbox **out)
{
	Moat__V1__RestoreSandboxRequest req =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;

	req.snapshot_id = (char *)snap_id;
	return call(v, "RestoreSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, (ProtobufCMessage **)out);
}

/* ---- setup ---- */

static int
group_setup(void **state)
{
	char path[256], cmd[768];
	char *text;
	/* An ELF header is all the double checks of a kernel. */
	static const char elf[64] = "\177ELF\2\1\1";
	int fd;

	(void)state;
	snprintf(root, sizeof(root), "/tmp/fcv-XXXXXX");
	if (mkdtemp(root) == NULL)
		return -1;
	snprintf(images, sizeof(images), "%s/images", root);
	snprintf(jail_base, sizeof(jail_base), "%s/jail", root);
	snprintf(cgroup_root, sizeof(cgroup_root), "%s/cgroup", root);
	snprintf(jailer_record, sizeof(jailer_record), "%s/jailer.jsonl",
	    root);
	snprintf(path, sizeof(path), "%s/default", images);
	if (moat_mkdir_p(path, 0755) != 0 || moat_mkdir_p(jail_base, 0755) ||
	    moat_mkdir_p(cgroup_root, 0755) != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/default/vmlinux", images);
	if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0 ||
	    write(fd, elf, sizeof(elf)) != (ssize_t)sizeof(elf))
		return -1;
	close(fd);
	snprintf(path, sizeof(path), "%s/default/initrd.img", images);
	write_text(path, "initrd stand-in\n", 0644);
	snprintf(path, sizeof(path), "%s/default/rootfs.ext4", images);
	write_text(path, "rootfs stand-in\n", 0644);
	/* vmd refuses an image whose files do not match its manifest.json
	 * (issue 14): list the stand-ins with their digests. */
	snprintf(cmd, sizeof(cmd),
	    "cd '%s/default' && { printf '{\"files\": {'; sep=; "
	    "for f in vmlinux initrd.img rootfs.ext4; do "
	    "printf '%%s\"%%s\": {\"sha256\": \"%%s\", \"size\": %%s}' "
	    "\"$sep\" $f $(sha256sum < $f | cut -c1-64) $(stat -c %%s $f); "
	    "sep=', '; done; printf '}}\\n'; } > manifest.json",
	    images);
	if (system(cmd) != 0)
		return -1;

	/* What vmd finds on PATH: Firecracker (a wrapper around the double,
	 * a real file, so the jailer copies it and names the jail after it)
	 * and, for the qemu vmd, a QEMU that only says its version. */
	snprintf(path, sizeof(path), "%s/bin", root);
	if (mkdir(path, 0755) != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/bin/firecracker", root);
	text = moat_asprintf("#!/bin/sh\nexec /usr/bin/env python3 '%s' "
	                     "\"$@\"\n",
	    MOAT_FC_DOUBLE);
	write_text(path, text, 0755);
	free(text);
	snprintf(path, sizeof(path), "%s/bin/qemu-system-x86_64", root);
	write_text(path,
	    "#!/bin/sh\necho 'QEMU emulator version 7.2.0 "
	    "(moat test stand-in, never started)'\n",
	    0755);
	snprintf(path, sizeof(path), "%s/bin", root);
	text = moat_asprintf("%s:%s", path,
	    getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
	setenv("PATH", text, 1);
	free(text);

	/* The cgroup v2 root the jail is prepared under: a plain folder
	 * holding what the driver reads (cgroupfs would make these). */
	snprintf(path, sizeof(path), "%s/cgroup.subtree_control", cgroup_root);
	write_text(path, "cpu memory\n", 0644);
	snprintf(path, sizeof(path), "%s/moat", cgroup_root);
	if (mkdir(path, 0755) != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/moat/cgroup.subtree_control",
	    cgroup_root);
	write_text(path, "cpu memory\n", 0644);

	/* Doubles that outlive a killed vmd come to this test (not to a
	 * pid 1 that might never reap them), so their exit is seen. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
		return -1;
	setenv("FC_DOUBLE_AGENT", MOAT_AGENT_BIN, 1);
	setenv("FC_DOUBLE_SPEC", MOAT_FC_API_SPEC, 1);
	setenv("FC_DOUBLE_VSOCK_CLOSE", "1", 1);
	setenv("FAKE_JAILER_RECORD", jailer_record, 1);
	setenv("FAKE_JAILER_CGROUP_ROOT", cgroup_root, 1);
	unsetenv("FC_DOUBLE_LOG");
	unsetenv("FC_DOUBLE_MODE");
	unsetenv("MOAT_CONFIG");
	vmd_start(&vmd, "state", "firecracker", false);
	return 0;
}

static int
group_teardown(void **state)
{
	struct vmd_proc *all[] = { &vmd, &jailed_vmd, &qemu_vmd };
	int rv = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		int status = 0;

		if (all[i]->pid <= 0)
			continue;
		moat_rpc_client_close(all[i]->client);
		kill(all[i]->pid, SIGTERM);
		waitpid(all[i]->pid, &status, 0);
		if (status != 0) {
			vmd_log_tail(all[i], 40);
			fprintf(stderr, "FAIL: moat-vmd exited %d\n", status);
			rv = -1;
		}
	}
	if (bg_pid > 0)
		(void)kill(bg_pid, SIGKILL);
	if (vmd_procs_mentioning(root) > 0) {
		fprintf(stderr, "FAIL: processes still mention %s\n", root);
		rv = -1;
	}
	if (getenv("MOAT_TEST_KEEP") == NULL)
		(void)moat_rm_rf(root);
	return rv;
}

/* ---- cases ---- */

/* Create, exec, files, the double's view of it all, destroy. */
static void
test_create_exec_files_destroy(void **state)
{
	Moat__V1__Sandbox *sb = create(&vmd);
	char *folder = moat_asprintf("%s/vms/%s", vmd.state, sb->id);
	char *log;

	(void)state;
	exec_echo_hi(&vmd, sb->id);
	write_file(&vmd, sb->id, "/root/note.txt", NOTE);
	read_file_is(&vmd, sb->id, "/root/note.txt", NOTE);
	/* The file is in the double's guest: the agent really wrote it. */
	{
		char *p = moat_asprintf("%s/guest-root/root/note.txt", folder);
		assert_true(path_exists(p));
		free(p);
	}
	log = double_log_clean(folder);
	assert_non_null(strstr(log, "\"/actions\""));
	assert_non_null(strstr(log, "InstanceStart"));
	free(log);
	destroy_and_check_gone(&vmd, sb);
	free(folder);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
}

/* Snapshot, the source serving on, restore into a fresh double, and the
 * snapshot refused by a qemu vmd. */
static void
test_snapshot_restore(void **state)
{
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *snap = NULL;
	Moat__V1__Sandbox *sb = create(&vmd);
	Moat__V1__Sandbox *clone = NULL;
	Moat__V1__Sandbox *after = NULL;
	char *p, *folder, *log;
	char snap_id[128];
	uint64_t before, after_id;

	(void)state;
	write_file(&vmd, sb->id, "/root/note.txt", NOTE);
	before = exec_started(&vmd, sb->id, "echo before");
	sr.sandbox_id = sb->id;
	if (call(&vmd, "SnapshotSandbox", &sr.base,
	        &moat__v1__local_snapshot__descriptor,
	        (ProtobufCMessage **)&snap) != MOAT_OK) {
		vmd_log_tail(&vmd, 40);
		fail_msg("SnapshotSandbox: %s", vmd_last_err);
	}
	assert_string_equal(snap->vmm, "firecracker");
	assert_string_equal(snap->sandbox_id, sb->id);
	assert_string_equal(snap->accel, "kvm");
	assert_true(snap->device_state_bytes > 0);
	assert_true(snap->ram_bytes > 0);
	snprintf(snap_id, sizeof(snap_id), "%s", snap->snapshot_id);
	p = moat_asprintf("%s/device_state", snap->dir);
	assert_true(path_exists(p));
	free(p);
	p = moat_asprintf("%s/ram", snap->dir);
	assert_true(path_exists(p));
	free(p);
	/* Firecracker's own files were moved into the snapshot. */
	p = moat_asprintf("%s/vms/%s/moat-snapshot.mem", vmd.state, sb->id);
	assert_false(path_exists(p));
	free(p);

	/* The source runs on and still serves after its snapshot. */
	usleep(1200 * 1000);
	after = get_sandbox(&vmd, sb->id);
	if (after->state != MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING)
		fail_msg("the snapshotted sandbox is %d, not RUNNING: %s",
		    after->state, after->failure_reason);
	protobuf_c_message_free_unpacked(&after->base, NULL);
	exec_echo_hi(&vmd, sb->id);
	/* On the new link, exec ids go on: the old exec still reads as its
	 * own. */
	after_id = exec_started(&vmd, sb->id, "echo after");
	assert_true(after_id > before);
	exec_output_is(&vmd, sb->id, before, "before\n");
	exec_output_is(&vmd, sb->id, after_id, "after\n");

	/* A fresh double loads it, and the guest's file is there. */
	if (restore(&vmd, snap_id, &clone) != MOAT_OK) {
		vmd_log_tail(&vmd, 40);
		fail_msg("RestoreSandbox: %s", vmd_last_err);
	}
	assert_int_equal(clone->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	assert_string_equal(clone->driver, "firecracker");
	assert_string_not_equal(clone->id, sb->id);
	assert_true(clone->vmm_pid > 0 && clone->vmm_pid != sb->vmm_pid);
	exec_echo_hi(&vmd, clone->id);
	read_file_is(&vmd, clone->id, "/root/note.txt", NOTE);
	folder = moat_asprintf("%s/vms/%s", vmd.state, clone->id);
	log = double_log_clean(folder);
	assert_non_null(strstr(log, "\"/snapshot/load\""));
	assert_null(strstr(log, "InstanceStart"));
	free(log);
	free(folder);
	destroy_and_check_gone(&vmd, clone);
	destroy_and_check_gone(&vmd, sb);
	protobuf_c_message_free_unpacked(&clone->base, NULL);
	clone = NULL;

	/* The same state directory under the qemu driver: refused, naming
	 * the VMM the snapshot needs. */
	vmd_stop(&vmd);
	vmd_start(&qemu_vmd, "state", "qemu", false);
	assert_int_equal(restore(&qemu_vmd, snap_id, &clone),
	    MOAT_FAILED_PRECONDITION);
	assert_null(clone);
	assert_non_null(strstr(vmd_last_err, "firecracker"));
	vmd_stop(&qemu_vmd);
	vmd_start(&vmd, "state", "firecracker", false);

	protobuf_c_message_free_unpacked(&snap->base, NULL);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
}

/* Waits for `id` to turn FAILED; returns it (caller frees). */
static Moat__V1__Sandbox *
wait_failed(struct vmd_proc *v, const char *id)
{
	uint64_t until = moat_rpc_now_ms() + 15000;
	Moat__V1__Sandbox *now;

	for (;;) {
		now = get_sandbox(v, id);
		if (now->state ==
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED)
			return now;
		protobuf_c_message_free_unpacked(&now->base, NULL);
		if (moat_rpc_now_ms() > until)
			fail_msg("sandbox %s never turned FAILED", id);
		usleep(50 * 1000);
	}
}

/* A Firecracker that exits by itself (exit code 1, a fatal line in its
 * log): FAILED with the code and that line. */
static void
test_vmm_exits(void **state)
{
	Moat__V1__Sandbox *sb = create(&vmd);
	Moat__V1__Sandbox *now;

	(void)state;
	assert_int_equal(kill(sb->vmm_pid, SIGUSR2), 0);
	now = wait_failed(&vmd, sb->id);
	assert_non_null(strstr(now->failure_reason, "exit status 1"));
	assert_non_null(
	    strstr(now->failure_reason, "Firecracker exiting with code 1"));
	assert_non_null(
	    strstr(now->failure_reason, "Fatal error: SIGUSR2 from the test"));
	assert_no_process(sb->id);
	protobuf_c_message_free_unpacked(&now->base, NULL);
	destroy_and_check_gone(&vmd, sb);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
}

/* A Firecracker that is killed: FAILED, with how and its last lines. */
static void
test_vmm_killed(void **state)
{
	Moat__V1__Sandbox *sb = create(&vmd);
	Moat__V1__Sandbox *now = NULL;

	(void)state;
	exec_echo_hi(&vmd, sb->id);
	assert_int_equal(kill(sb->vmm_pid, SIGKILL), 0);
	now = wait_failed(&vmd, sb->id);
	fprintf(stderr, "failure reason: %s\n", now->failure_reason);
	assert_non_null(strstr(now->failure_reason, "killed by signal 9"));
	/* Its console (the double's stdout) and its log file's last lines. */
	assert_non_null(strstr(now->failure_reason, "Running Firecracker"));
	assert_non_null(strstr(now->failure_reason, "firecracker.log"));
	assert_non_null(strstr(now->failure_reason, "PUT /actions done"));
	/* The agent died with the double. */
	assert_no_process(sb->id);
	protobuf_c_message_free_unpacked(&now->base, NULL);
	destroy_and_check_gone(&vmd, sb);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
}

/* ---- vmd restarts keep sandboxes (issue 15, part 2) ---- */

/* bash `code` through Exec; wants exit code `rc`; returns its stdout
 * (heap). */
static char *
sh_out(struct vmd_proc *v, const char *id, const char *code, int rc)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *res = NULL;
	char *out;

	req.sandbox_id = (char *)id;
	req.language = "bash";
	req.code = (char *)code;
	req.timeout_ms = 10000;
	if (call(v, "Exec", &req.base, &moat__v1__exec_result__descriptor,
	        (ProtobufCMessage **)&res) != MOAT_OK) {
		vmd_log_tail(v, 40);
		fail_msg("Exec \"%s\" in %s: %s", code, id, vmd_last_err);
	}
	if (!res->status->exited || res->status->exit_code != rc)
		fail_msg("Exec \"%s\" in %s: exit %d, not %d", code, id,
		    res->status->exit_code, rc);
	/* No output: protobuf-c leaves data NULL. */
	out = strndup(res->stdout.len ? (const char *)res->stdout.data : "",
	    res->stdout.len);
	assert_non_null(out);
	protobuf_c_message_free_unpacked(&res->base, NULL);
	return out;
}

/* kill -9 of vmd `v`: it is gone, and nothing else was told. */
static void
vmd_kill9(struct vmd_proc *v)
{
	int status;

	assert_int_equal(kill(v->pid, SIGKILL), 0);
	assert_int_equal(waitpid(v->pid, &status, 0), v->pid);
	v->pid = 0;
	moat_rpc_client_close(v->client);
	v->client = NULL;
}

/* Whether `pid` runs (a zombie this test has not reaped does not). */
static bool
pid_runs(pid_t pid)
{
	char path[64], *text = NULL;
	size_t len;
	bool zombie;

	(void)waitpid(pid, NULL, WNOHANG);
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (moat_read_file(path, 4096, &text, &len) != 0)
		return false;
	zombie = strstr(text, ") Z ") != NULL;
	free(text);
	return !zombie;
}

/* Waits up to 10 s for `pid` to stop running. */
static void
assert_pid_gone(pid_t pid)
{
	uint64_t until = moat_rpc_now_ms() + 10000;

	while (pid_runs(pid) && moat_rpc_now_ms() < until)
		usleep(20 * 1000);
	if (pid_runs(pid))
		fail_msg("pid %d still runs", (int)pid);
}

/* Rewrites the pid line of sandbox `id`'s state file (in v's state
 * directory) to `pid`. */
static void
state_pid_set(const struct vmd_proc *v, const char *id, pid_t pid)
{
	char *path = moat_asprintf("%s/vms/%s/state", v->state, id);
	char *text = NULL, *p, *nl, *out;
	size_t len;

	assert_int_equal(moat_read_file(path, 1 << 16, &text, &len), 0);
	assert_non_null(p = strstr(text, "\npid "));
	assert_non_null(nl = strchr(p + 1, '\n'));
	*p = '\0';
	out = moat_asprintf("%s\npid %d%s", text, (int)pid, nl);
	assert_int_equal(moat_write_file_atomic(path, out, strlen(out), 0600),
	    0);
	free(out);
	free(text);
	free(path);
}

/* Drops the vmm-info line from sandbox `id`'s state file, as a vmd
 * before Firecracker adoption wrote it. */
static void
state_drop_vmm_info(const struct vmd_proc *v, const char *id)
{
	char *path = moat_asprintf("%s/vms/%s/state", v->state, id);
	char *text = NULL, *p, *nl, *out;
	size_t len;

	assert_int_equal(moat_read_file(path, 1 << 16, &text, &len), 0);
	assert_non_null(p = strstr(text, "\nvmm-info "));
	assert_non_null(nl = strchr(p + 1, '\n'));
	*p = '\0';
	out = moat_asprintf("%s%s", text, nl);
	assert_int_equal(moat_write_file_atomic(path, out, strlen(out), 0600),
	    0);
	free(out);
	free(text);
	free(path);
}

/* How often `needle` is in sandbox `id`'s console.log. */
static int
console_count(const struct vmd_proc *v, const char *id, const char *needle)
{
	char *path = moat_asprintf("%s/vms/%s/console.log", v->state, id);
	char *text = NULL;
	size_t len;
	int n = 0;

	if (moat_read_file(path, 1 << 22, &text, &len) == 0)
		for (char *p = text; (p = strstr(p, needle)) != NULL; p++)
			n++;
	free(text);
	free(path);
	return n;
}

/* A RUNNING sandbox `id` with VMM `pid`, adopted `n` times, that
 * serves exec and holds its note. */
static void
assert_adopted(struct vmd_proc *v, const char *id, pid_t pid, uint32_t n)
{
	Moat__V1__Sandbox *sb = get_sandbox(v, id);

	if (sb->state != MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING)
		fail_msg("%s is not RUNNING after the restart: %s", id,
		    sb->failure_reason);
	assert_string_equal(sb->id, id);
	assert_int_equal(sb->vmm_pid, pid);
	assert_int_equal(sb->adoptions, n);
	assert_false(sb->paused);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	exec_echo_hi(v, id);
	read_file_is(v, id, "/root/note.txt", NOTE);
}

/* A snapshot that leaves `id` paused: GetSandbox says so, guest calls
 * wait (UNAVAILABLE, "being moved"); then ResumeSandbox (`resume`)
 * lets it serve again on a new guest link, or the caller destroys it. */
static void
paused_snapshot(struct vmd_proc *v, const char *id, bool resume)
{
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__FileReadRequest fr = MOAT__V1__FILE_READ_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__Sandbox *sb = NULL;

	sr.sandbox_id = ref.sandbox_id = fr.sandbox_id = (char *)id;
	sr.leave_paused = true;
	fr.path = "/root/note.txt";
	if (call(v, "SnapshotSandbox", &sr.base,
	        &moat__v1__local_snapshot__descriptor, NULL) != MOAT_OK) {
		vmd_log_tail(v, 40);
		fail_msg("snapshot with leave_paused: %s", vmd_last_err);
	}
	sb = get_sandbox(v, id);
	assert_true(sb->paused);
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	assert_int_equal(call(v, "ReadFile", &fr.base,
	                     &moat__v1__file_data__descriptor, NULL),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(vmd_last_err, "being moved"));
	if (!resume)
		return;
	sb = NULL;
	if (call(v, "ResumeSandbox", &ref.base, &moat__v1__sandbox__descriptor,
	        (ProtobufCMessage **)&sb) != MOAT_OK) {
		vmd_log_tail(v, 40);
		fail_msg("ResumeSandbox: %s", vmd_last_err);
	}
	assert_false(sb->paused);
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	assert_int_equal(call(v, "ResumeSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, NULL),
	    MOAT_FAILED_PRECONDITION);
	exec_echo_hi(v, id);
	read_file_is(v, id, "/root/note.txt", NOTE);
}

/* The FAILED sandbox `id` says `why`; destroying it leaves nothing. */
static void
assert_failed_with(struct vmd_proc *v, const Moat__V1__Sandbox *sb,
    const char *why)
{
	Moat__V1__Sandbox *now = get_sandbox(v, sb->id);

	assert_int_equal(now->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED);
	if (strstr(now->failure_reason, why) == NULL)
		fail_msg("%s failed with \"%s\", not \"%s\"", sb->id,
		    now->failure_reason, why);
	protobuf_c_message_free_unpacked(&now->base, NULL);
	destroy_and_check_gone(v, sb);
}

/* kill -9 of vmd with three sandboxes: the next vmd re-adopts the live
 * one (same id and VMM, its file, a background process and exec), and
 * fails the one whose VMM died and the one whose state file names a pid
 * that is no Firecracker, with the reason. An exec running across the
 * restart answers UNAVAILABLE. A paused snapshot of the adopted one
 * resumes. SIGTERM keeps it for a third vmd, which has
 * stop-sandboxes-on-exit: there a paused snapshot is destroyed, and
 * SIGTERM destroys the rest. */
static void
test_restart_keeps_sandboxes(void **state)
{
	Moat__V1__ExecWaitRequest wr = MOAT__V1__EXEC_WAIT_REQUEST__INIT;
	Moat__V1__Sandbox *live, *dead, *wrong, *old, *last;
	char *out, *cmd, *dir;
	uint64_t running, until;
	int links;
	pid_t bg;

	(void)state;
	vmd_stop(&vmd);
	keep_on_exit = true;
	vmd_start(&vmd, "state", "firecracker", false);
	live = create(&vmd);
	dead = create(&vmd);
	wrong = create(&vmd);
	old = create(&vmd);
	write_file(&vmd, live->id, "/root/note.txt", NOTE);
	/* Its own session: the exec that starts it ends, it stays. */
	out = sh_out(&vmd, live->id,
	    "setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo $!", 0);
	bg_pid = bg = (pid_t)atoi(out);
	free(out);
	assert_true(bg > 1 && pid_runs(bg));
	{
		Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
		Moat__V1__ExecHandle *h = NULL;

		req.sandbox_id = live->id;
		req.language = "bash";
		req.code = "sleep 600";
		assert_int_equal(call(&vmd, "ExecStart", &req.base,
		                     &moat__v1__exec_handle__descriptor,
		                     (ProtobufCMessage **)&h),
		    MOAT_OK);
		running = h->exec_id;
		protobuf_c_message_free_unpacked(&h->base, NULL);
	}

	/* The agent logs each guest link on the console. */
	links = console_count(&vmd, live->id, "host link open");
	assert_true(links > 0);

	/* kill -9: every double outlives vmd. */
	vmd_kill9(&vmd);
	assert_true(pid_runs(live->vmm_pid));
	assert_true(pid_runs(dead->vmm_pid));
	assert_true(pid_runs(wrong->vmm_pid));
	assert_int_equal(kill(dead->vmm_pid, SIGKILL), 0);
	assert_pid_gone(dead->vmm_pid);
	state_pid_set(&vmd, wrong->id, getpid());
	state_drop_vmm_info(&vmd, old->id);

	vmd_start(&vmd, "state", "firecracker", false);
	assert_adopted(&vmd, live->id, live->vmm_pid, 1);
	cmd = moat_asprintf("kill -0 %d", (int)bg);
	free(sh_out(&vmd, live->id, cmd, 0));
	wr.sandbox_id = live->id;
	wr.exec_id = running;
	assert_int_equal(call(&vmd, "ExecWait", &wr.base,
	                     &moat__v1__exec_status__descriptor, NULL),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(vmd_last_err, "restarted"));
	assert_failed_with(&vmd, dead, "is not running any more");
	/* Its double was stopped: it is no Firecracker vmd would adopt. */
	assert_failed_with(&vmd, wrong, "another process");
	assert_failed_with(&vmd, old, "no vmm-info");
	/* The console is drained again: the new link's line is there. */
	until = moat_rpc_now_ms() + 10000;
	while (console_count(&vmd, live->id, "host link open") <= links &&
	    moat_rpc_now_ms() < until)
		usleep(50 * 1000);
	assert_true(console_count(&vmd, live->id, "host link open") > links);
	paused_snapshot(&vmd, live->id, true);
	free(sh_out(&vmd, live->id, cmd, 0));

	/* SIGTERM keeps it, even paused by a snapshot (the next vmd resumes
	 * it): the double runs on, its directory stays. */
	paused_snapshot(&vmd, live->id, false);
	vmd_stop(&vmd);
	assert_true(pid_runs(live->vmm_pid));
	dir = moat_asprintf("%s/vms/%s/state", vmd.state, live->id);
	assert_true(path_exists(dir));
	free(dir);

	/* A vmd that destroys its sandboxes when it stops. */
	keep_on_exit = false;
	vmd_start(&vmd, "state", "firecracker", false);
	assert_adopted(&vmd, live->id, live->vmm_pid, 2);
	free(sh_out(&vmd, live->id, cmd, 0));
	paused_snapshot(&vmd, live->id, false);
	destroy_and_check_gone(&vmd, live);
	last = create(&vmd);
	write_file(&vmd, last->id, "/root/note.txt", NOTE);
	vmd_stop(&vmd);
	assert_pid_gone(last->vmm_pid);
	assert_no_process(last->id);
	dir = moat_asprintf("%s/vms/%s", vmd.state, last->id);
	assert_false(path_exists(dir));
	free(dir);
	vmd_start(&vmd, "state", "firecracker", false);

	(void)kill(bg, SIGKILL);
	bg_pid = 0;
	free(cmd);
	protobuf_c_message_free_unpacked(&live->base, NULL);
	protobuf_c_message_free_unpacked(&dead->base, NULL);
	protobuf_c_message_free_unpacked(&wrong->base, NULL);
	protobuf_c_message_free_unpacked(&old->base, NULL);
	protobuf_c_message_free_unpacked(&last->base, NULL);
}

/* Through the jailer stand-in: the start works, the jail is where the
 * driver put it, and destroy removes the jail and its cgroup. */
static void
test_jailed(void **state)
{
	struct vmd_proc *jv = &jailed_vmd;
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *snap = NULL;
	Moat__V1__Sandbox *sb, *clone = NULL;
	char *jail_dir, *jail_root, *clone_jail, *p, *rec = NULL, *log;
	size_t len;

	(void)state;
	if (geteuid() != 0) {
		fprintf(stderr,
		    "SKIPPED test_jailed: the jailer needs vmd to "
		    "run as root (it gives the jail to another uid)\n");
		skip();
	}
	vmd_start(jv, "jailed", "firecracker", true);
	sb = create(jv);
	jail_dir = moat_asprintf("%s/firecracker/%s", jail_base, sb->id);
	jail_root = moat_asprintf("%s/root", jail_dir);
	exec_echo_hi(jv, sb->id);
	write_file(jv, sb->id, "/root/jailed.txt", NOTE);
	read_file_is(jv, sb->id, "/root/jailed.txt", NOTE);
	/* kill -9 of vmd: the next one finds the jailed double again (its
	 * jail from the state file) and it serves on. */
	vmd_kill9(jv);
	assert_true(pid_runs(sb->vmm_pid));
	vmd_start(jv, "jailed", "firecracker", true);
	{
		Moat__V1__Sandbox *now = get_sandbox(jv, sb->id);

		if (now->state !=
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING)
			fail_msg("jailed %s is not RUNNING after the restart: "
			         "%s",
			    sb->id, now->failure_reason);
		assert_int_equal(now->vmm_pid, sb->vmm_pid);
		assert_int_equal(now->adoptions, 1);
		protobuf_c_message_free_unpacked(&now->base, NULL);
	}
	exec_echo_hi(jv, sb->id);
	read_file_is(jv, sb->id, "/root/jailed.txt", NOTE);

	/* The chroot layout: the copied binary, its pid file (--new-pid-ns),
	 * the API and vsock sockets and the disks inside the jail. */
	p = moat_asprintf("%s/firecracker", jail_root);
	assert_true(path_exists(p));
	free(p);
	p = moat_asprintf("%s/firecracker.pid", jail_root);
	assert_int_equal(moat_read_file(p, 64, &rec, &len), 0);
	assert_int_equal(atoi(rec), sb->vmm_pid);
	free(rec);
	free(p);
	for (int i = 0; i < 4; i++) {
		static const char *const names[] = { "api.sock", "vsock.sock",
			"rootfs.ext4", "scratch.ext4" };

		p = moat_asprintf("%s/%s", jail_root, names[i]);
		if (!path_exists(p))
			fail_msg("%s is missing from the jail", p);
		free(p);
	}
	p = moat_asprintf("%s/moat/%s", cgroup_root, sb->id);
	assert_true(path_exists(p));
	free(p);
	log = double_log_clean(jail_root);
	free(log);
	/* What the jailer was told. */
	assert_int_equal(moat_read_file(jailer_record, 1 << 16, &rec, &len),
	    0);
	assert_non_null(strstr(rec, "\"--cgroup-version\", \"2\""));
	assert_non_null(strstr(rec, "\"--new-pid-ns\""));
	assert_non_null(strstr(rec, "\"--parent-cgroup\", \"moat\""));
	assert_non_null(strstr(rec, "memory.max"));
	assert_non_null(strstr(rec, "\"--api-sock\", \"/api.sock\""));
	free(rec);

	/* Snapshot out of the jail, restore into a jail of its own: the
	 * snapshot's files are linked in, and both VMs serve. */
	sr.sandbox_id = sb->id;
	if (call(jv, "SnapshotSandbox", &sr.base,
	        &moat__v1__local_snapshot__descriptor,
	        (ProtobufCMessage **)&snap) != MOAT_OK) {
		vmd_log_tail(jv, 40);
		fail_msg("SnapshotSandbox (jailed): %s", vmd_last_err);
	}
	assert_string_equal(snap->vmm, "firecracker");
	exec_echo_hi(jv, sb->id);
	if (restore(jv, snap->snapshot_id, &clone) != MOAT_OK) {
		vmd_log_tail(jv, 40);
		fail_msg("RestoreSandbox (jailed): %s", vmd_last_err);
	}
	read_file_is(jv, clone->id, "/root/jailed.txt", NOTE);
	clone_jail = moat_asprintf("%s/firecracker/%s", jail_base, clone->id);
	assert_true(path_exists(clone_jail));
	vmd_destroy_sandbox(jv, clone->id);
	assert_no_process(clone->id);
	assert_false(path_exists(clone_jail));

	vmd_destroy_sandbox(jv, sb->id);
	assert_no_process(sb->id);
	assert_false(path_exists(jail_dir));
	p = moat_asprintf("%s/moat/%s", cgroup_root, sb->id);
	assert_false(path_exists(p));
	free(p);
	p = moat_asprintf("%s/vms/%s", jv->state, sb->id);
	assert_false(path_exists(p));
	free(p);
	/* Nothing of any sandbox is left in the jail base. */
	p = moat_asprintf("%s/firecracker", jail_base);
	{
		DIR *d = opendir(p);
		struct dirent *de;

		assert_non_null(d);
		while ((de = readdir(d)) != NULL)
			if (de->d_name[0] != '.')
				fail_msg("%s/%s is left", p, de->d_name);
		closedir(d);
	}
	free(p);
	vmd_stop(jv);
	free(jail_dir);
	free(jail_root);
	free(clone_jail);
	protobuf_c_message_free_unpacked(&snap->base, NULL);
	protobuf_c_message_free_unpacked(&clone->base, NULL);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
}

/* The KVM check is skipped only on a node marked for tests: a stray
 * test-no-kvm-check elsewhere stops vmd at start, saying why. */
static void
test_no_kvm_check_needs_test_hooks(void **state)
{
	char conf[300], log[300], dir[300];
	char *text = NULL;
	size_t len;
	int status = 0;
	pid_t pid;

	(void)state;
	snprintf(conf, sizeof(conf), "%s/nohooks.conf", root);
	snprintf(log, sizeof(log), "%s/nohooks.log", root);
	snprintf(dir, sizeof(dir), "%s/nohooks", root);
	write_text(conf,
	    "[vmd]\ndriver = firecracker\ntest-hooks = false\n"
	    "[firecracker]\ntest-no-kvm-check = true\n",
	    0644);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--config", conf,
		    "--state-dir", dir, "--image-dir", images, "--cache-dir",
		    root, (char *)NULL);
		_exit(127);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_not_equal(WEXITSTATUS(status), 0);
	assert_int_not_equal(WEXITSTATUS(status), 127);
	assert_int_equal(moat_read_file(log, 1 << 16, &text, &len), 0);
	assert_non_null(strstr(text, "test-no-kvm-check"));
	assert_non_null(strstr(text, "test-hooks=true"));
	free(text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_exec_files_destroy),
		cmocka_unit_test(test_snapshot_restore),
		cmocka_unit_test(test_vmm_killed),
		cmocka_unit_test(test_vmm_exits),
		cmocka_unit_test(test_restart_keeps_sandboxes),
		cmocka_unit_test(test_jailed),
		cmocka_unit_test(test_no_kvm_check_needs_test_hooks),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
