/*
 * test_adopt.c: vmd restarts keep sandboxes (issue 15, part 2), with real
 * VMs (QEMU; TCG here, allowed by MOAT_VMD_ALLOW_TCG where /dev/kvm is
 * missing). One state directory, four vmds in turn:
 *   - vmd 1 makes 4 sandboxes: one with a python context holding a
 *     variable, one running a background process, one idle, one whose
 *     VMM is killed later; each gets a file. An exec is left running
 *     (ExecStart) and a one-shot Exec is in flight when vmd 1 is killed
 *     with SIGKILL; the in-flight call answers UNAVAILABLE, not a hang.
 *     The fourth VMM is then killed too, and its state file made to
 *     name a live process that is no VMM (this test).
 *   - vmd 2 on the same state dir re-adopts the 3 live ones (same VMM
 *     pid, adoptions 1): files, the python variable and the background
 *     process are there; the running exec's id answers UNAVAILABLE
 *     saying vmd restarted; an adopted one snapshots; the fourth is
 *     FAILED with the reason and destroys cleanly. vmd 2 gets SIGTERM: the sandboxes stay.
 *   - vmd 3 re-adopts them again (adoptions 2) with --stop-sandboxes;
 *     its SIGTERM destroys them: no VMM is left, the vms dir is empty.
 * Needs the default image (MOAT_IMAGE_DIR or <repo>/images/out); skipped
 * (77) without it. Not for: the state file's codec (tests/unit/vm/
 * test_adopt_state.c).
 */
#include <errno.h>
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "vm.pb-c.h"
#include "vmd_harness.h"

#define LONG_MS 300000u

static char image_dir[1024];
static char state_root[128];
static bool have_image;

/* vmd_spawn's child: moat-vmd with the qemu driver; `arg` non-NULL adds
 * --stop-sandboxes. Sandboxes are kept on SIGTERM unless told. */
static void
exec_vmd(const struct vmd_proc *v, void *arg)
{
	char cache[400];

	snprintf(cache, sizeof(cache), "%s/cache", v->state);
	setenv("MOAT_VMD_TEMPLATES", "off", 1);
	setenv("MOAT_VMD_STOP_SANDBOXES_ON_EXIT", "false", 1);
	if (access("/dev/kvm", R_OK | W_OK) != 0)
		setenv("MOAT_VMD_ALLOW_TCG", "true", 1);
	if (arg != NULL)
		execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", v->state,
		    "--driver", "qemu", "--image-dir", image_dir, "--listen",
		    v->url, "--cache-dir", cache, "--node-id", "adopt-node",
		    "--stop-sandboxes", (char *)NULL);
	else
		execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", v->state,
		    "--driver", "qemu", "--image-dir", image_dir, "--listen",
		    v->url, "--cache-dir", cache, "--node-id", "adopt-node",
		    (char *)NULL);
}

static void
start_vmd(struct vmd_proc *v, bool stop_sandboxes)
{
	char state[300];

	snprintf(state, sizeof(state), "%s/node", state_root);
	vmd_spawn(v, state, exec_vmd, stop_sandboxes ? (void *)1 : NULL,
	    60000);
}

/* Protobuf bytes as a string (heap): empty bytes have a NULL data. */
static char *
bytes_str(const ProtobufCBinaryData *b)
{
	return b->len > 0 ? strndup((const char *)b->data, b->len) :
	                    strdup("");
}

/* One-shot `sh -c script` that must work; returns its stdout (heap). */
static char *
sh(struct vmd_proc *v, const char *id, const char *script, int want_rc)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *res = NULL;
	char *out;

	req.sandbox_id = (char *)id;
	req.shell = (char *)script;
	req.timeout_ms = 60000;
	if (vmd_call(v, "Exec", &req.base, &moat__v1__exec_result__descriptor,
	        (ProtobufCMessage **)&res, 90000) != MOAT_OK)
		fail_msg("Exec \"%.60s\" in %s: %s", script, id, vmd_last_err);
	if (res->status->exit_code != want_rc)
		fail_msg("Exec \"%.60s\" in %s: rc %d (stderr %.*s)", script,
		    id, res->status->exit_code, (int)res->stderr.len,
		    (const char *)res->stderr.data);
	out = bytes_str(&res->stdout);
	protobuf_c_message_free_unpacked(&res->base, NULL);
	return out;
}

static Moat__V1__Sandbox *
get_sandbox(struct vmd_proc *v, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__Sandbox *sb = NULL;

	ref.sandbox_id = (char *)id;
	if (vmd_call(v, "GetSandbox", &ref.base,
	        &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&sb,
	        30000) != MOAT_OK)
		fail_msg("GetSandbox %s: %s", id, vmd_last_err);
	return sb;
}

/* RunCode in context "ctx" of sandbox id; returns the result's repr. */
static char *
run_code(struct vmd_proc *v, const char *id, const char *code)
{
	Moat__V1__RunCodeRequest req = MOAT__V1__RUN_CODE_REQUEST__INIT;
	Moat__V1__RunCodeResult *r = NULL;
	char *out;

	req.sandbox_id = (char *)id;
	req.context = "ctx";
	req.code = (char *)code;
	req.timeout_ms = 60000;
	if (vmd_call(v, "RunCode", &req.base,
	        &moat__v1__run_code_result__descriptor,
	        (ProtobufCMessage **)&r, 90000) != MOAT_OK)
		fail_msg("RunCode \"%s\": %s", code, vmd_last_err);
	assert_non_null(r->result);
	if (r->result->error_name[0] != '\0')
		fail_msg("RunCode \"%s\": %s: %s", code, r->result->error_name,
		    r->result->error_value);
	out = strdup(r->result->result);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return out;
}

static char *
read_file(struct vmd_proc *v, const char *id, const char *path)
{
	Moat__V1__FileReadRequest req = MOAT__V1__FILE_READ_REQUEST__INIT;
	Moat__V1__FileData *fd = NULL;
	char *out;

	req.sandbox_id = (char *)id;
	req.path = (char *)path;
	if (vmd_call(v, "ReadFile", &req.base,
	        &moat__v1__file_data__descriptor, (ProtobufCMessage **)&fd,
	        30000) != MOAT_OK)
		fail_msg("ReadFile %s in %s: %s", path, id, vmd_last_err);
	out = bytes_str(&fd->data);
	protobuf_c_message_free_unpacked(&fd->base, NULL);
	return out;
}

/* Issue 15: a snapshot with leave_paused leaves sandbox `id` paused
 * (GetSandbox says so; a file call answers UNAVAILABLE naming the
 * move); ResumeSandbox runs it again; a second is FAILED_PRECONDITION. */
static void
paused_move(struct vmd_proc *v, const char *id)
{
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__FileReadRequest fr = MOAT__V1__FILE_READ_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	Moat__V1__Sandbox *sb = NULL;
	char *text;

	sr.sandbox_id = ref.sandbox_id = fr.sandbox_id = (char *)id;
	sr.leave_paused = true;
	fr.path = "/tmp/adopt.txt";
	if (vmd_call(v, "SnapshotSandbox", &sr.base,
	        &moat__v1__local_snapshot__descriptor, NULL,
	        LONG_MS) != MOAT_OK)
		fail_msg("snapshot with leave_paused: %s", vmd_last_err);
	assert_int_equal(vmd_call(v, "GetSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor,
	                     (ProtobufCMessage **)&sb, 10000),
	    MOAT_OK);
	assert_true(sb->paused);
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	assert_int_equal(vmd_call(v, "ReadFile", &fr.base,
	                     &moat__v1__file_data__descriptor, NULL, 10000),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(vmd_last_err, "being moved"));
	sb = NULL;
	if (vmd_call(v, "ResumeSandbox", &ref.base,
	        &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&sb,
	        10000) != MOAT_OK)
		fail_msg("ResumeSandbox: %s", vmd_last_err);
	assert_false(sb->paused);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	assert_int_equal(vmd_call(v, "ResumeSandbox", &ref.base,
	                     &moat__v1__sandbox__descriptor, NULL, 10000),
	    MOAT_FAILED_PRECONDITION);
	text = read_file(v, id, "/tmp/adopt.txt");
	assert_non_null(strstr(text, id));
	free(text);
}

/* A one-shot `sleep 600` on its own connection, in flight when vmd is
 * killed: its status (UNAVAILABLE expected) and message. */
struct inflight {
	const char *url;
	const char *id;
	int rv;
	char err[512];
};

static void *
inflight_main(void *arg)
{
	struct inflight *f = arg;
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 120000,
		.tenant = VMD_TENANT };
	struct moat_rpc_client *c = NULL;
	ProtobufCMessage *r = NULL;
	char *err = NULL;

	if (moat_rpc_client_open(&c, f->url, &err) != MOAT_OK) {
		f->rv = -1;
		snprintf(f->err, sizeof(f->err), "%s", err ? err : "?");
		free(err);
		return NULL;
	}
	req.sandbox_id = (char *)f->id;
	req.shell = "sleep 600";
	f->rv = moat_rpc_call(c, VMD_SERVICE, "Exec", &req.base,
	    &moat__v1__exec_result__descriptor, &r, &opts, &err);
	snprintf(f->err, sizeof(f->err), "%s", err ? err : "");
	free(err);
	if (r != NULL)
		protobuf_c_message_free_unpacked(r, NULL);
	moat_rpc_client_close(c);
	return NULL;
}

static uint64_t
exec_start(struct vmd_proc *v, const char *id, const char *script)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecHandle *h = NULL;
	uint64_t exec_id;

	req.sandbox_id = (char *)id;
	req.shell = (char *)script;
	if (vmd_call(v, "ExecStart", &req.base,
	        &moat__v1__exec_handle__descriptor, (ProtobufCMessage **)&h,
	        30000) != MOAT_OK)
		fail_msg("ExecStart: %s", vmd_last_err);
	exec_id = h->exec_id;
	protobuf_c_message_free_unpacked(&h->base, NULL);
	return exec_id;
}

static bool
pid_alive(pid_t pid)
{
	return pid > 0 && kill(pid, 0) == 0;
}

/* Waits (up to 30 s) until the VMM pid is gone. */
static bool
pid_gone(pid_t pid)
{
	for (int i = 0; i < 300; i++) {
		if (!pid_alive(pid))
			return true;
		usleep(100000);
	}
	return false;
}

static int
vms_entries(void)
{
	char path[400];
	DIR *d;
	struct dirent *e;
	int n = 0;

	snprintf(path, sizeof(path), "%s/node/vms", state_root);
	if ((d = opendir(path)) == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Rewrites the pid line of sandbox id's state file to this process. */
static void
point_state_at_me(const char *id)
{
	char path[400], line[64];
	char *text = NULL, *p, *nl, *out;
	size_t len;

	snprintf(path, sizeof(path), "%s/node/vms/%s/state", state_root, id);
	assert_int_equal(moat_read_file(path, 1 << 16, &text, &len), 0);
	assert_non_null(p = strstr(text, "\npid "));
	assert_non_null(nl = strchr(p + 1, '\n'));
	snprintf(line, sizeof(line), "\npid %d", (int)getpid());
	*p = '\0';
	out = moat_asprintf("%s%s%s", text, line, nl);
	assert_non_null(out);
	assert_int_equal(moat_write_file_atomic(path, out, strlen(out), 0600),
	    0);
	free(out);
	free(text);
}

enum { PY, BG, IDLE, DEAD, N_SB };

/* The sandboxes, their VMM pids and each one's file text. */
static char ids[N_SB][32];
static pid_t pids[N_SB];

/* Checks that vmd `v` adopted the three live ones for the n-th time. */
static void
check_adopted(struct vmd_proc *v, uint32_t n)
{
	for (int i = PY; i <= IDLE; i++) {
		Moat__V1__Sandbox *sb = get_sandbox(v, ids[i]);
		char want[256];
		char *text;

		if (sb->state !=
		    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING)
			fail_msg("%s is not RUNNING after the restart: %s",
			    ids[i], sb->failure_reason);
		assert_int_equal(sb->vmm_pid, pids[i]);
		assert_int_equal(sb->adoptions, n);
		protobuf_c_message_free_unpacked(&sb->base, NULL);
		text = read_file(v, ids[i], "/tmp/adopt.txt");
		snprintf(want, sizeof(want), "file of %s\n", ids[i]);
		assert_string_equal(text, want);
		free(text);
	}
	free(sh(v, ids[IDLE], "true", 0));
	free(sh(v, ids[BG], "kill -0 $(cat /tmp/bg.pid)", 0));
	/* The console is drained again (its named pipe reopened). */
	{
		char mark[64], cmd[128], path[400];
		bool seen = false;

		snprintf(mark, sizeof(mark), "moat-adopt-console-%u", n);
		snprintf(cmd, sizeof(cmd), "echo %s > /dev/ttyS0", mark);
		free(sh(v, ids[IDLE], cmd, 0));
		snprintf(path, sizeof(path), "%s/node/vms/%s/console.log",
		    state_root, ids[IDLE]);
		for (int i = 0; i < 100 && !seen; i++) {
			char *log = NULL;
			size_t len = 0;

			if (moat_read_file(path, 1 << 22, &log, &len) == 0)
				seen = memmem(log, len, mark, strlen(mark)) !=
				    NULL;
			free(log);
			if (!seen)
				usleep(100000);
		}
		if (!seen)
			fail_msg("console.log of %s lacks the mark after "
			         "adoption %u",
			    ids[IDLE], n);
	}
}

static void
test_restart_keeps_sandboxes(void **state)
{
	struct vmd_proc v1, v2, v3;
	struct inflight fl = { 0 };
	Moat__V1__ExecWaitRequest wr = MOAT__V1__EXEC_WAIT_REQUEST__INIT;
	Moat__V1__Sandbox *sb;
	pthread_t th;
	uint64_t running_exec;
	char *text;
	int status;
	(void)state;

	if (!have_image)
		skip();
	start_vmd(&v1, false);
	for (int i = 0; i < N_SB; i++) {
		char cmd[256];

		sb = vmd_create_or_fail(&v1, 256, 256, LONG_MS);
		snprintf(ids[i], sizeof(ids[i]), "%s", sb->id);
		pids[i] = sb->vmm_pid;
		assert_true(pid_alive(pids[i]));
		protobuf_c_message_free_unpacked(&sb->base, NULL);
		snprintf(cmd, sizeof(cmd),
		    "echo 'file of %s' > /tmp/adopt.txt", ids[i]);
		free(sh(&v1, ids[i], cmd, 0));
	}
	text = run_code(&v1, ids[PY], "x = 41\nx");
	assert_string_equal(text, "41");
	free(text);
	/* Its own session: the exec that started it ends, it stays. */
	free(sh(&v1, ids[BG],
	    "setsid sh -c 'echo $$ > /tmp/bg.pid; exec sleep 100000' "
	    "</dev/null >/dev/null 2>&1 & sleep 1; kill -0 $(cat /tmp/bg.pid)",
	    0));
	running_exec = exec_start(&v1, ids[PY], "sleep 600");
	fl.url = v1.url;
	fl.id = ids[IDLE];
	assert_int_equal(pthread_create(&th, NULL, inflight_main, &fl), 0);
	sleep(2); /* the one-shot exec reaches the guest */

	/* kill -9: the VMMs outlive vmd; the in-flight call does not hang. */
	kill(v1.pid, SIGKILL);
	assert_int_equal(waitpid(v1.pid, &status, 0), v1.pid);
	v1.pid = 0;
	pthread_join(th, NULL);
	assert_int_equal(fl.rv, MOAT_UNAVAILABLE);
	moat_rpc_client_close(v1.client);
	v1.client = NULL;
	for (int i = 0; i < N_SB; i++)
		assert_true(pid_alive(pids[i]));
	/* The fourth's state file now names a pid that is no VMM: this
	 * test's own (its VMM is gone). */
	kill(pids[DEAD], SIGKILL);
	assert_true(pid_gone(pids[DEAD]));
	point_state_at_me(ids[DEAD]);

	start_vmd(&v2, false);
	check_adopted(&v2, 1);
	text = run_code(&v2, ids[PY], "x + 1");
	assert_string_equal(text, "42");
	free(text);
	wr.sandbox_id = ids[PY];
	wr.exec_id = running_exec;
	assert_int_equal(vmd_call(&v2, "ExecWait", &wr.base,
	                     &moat__v1__exec_status__descriptor, NULL, 30000),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(vmd_last_err, "restarted"));
	sb = get_sandbox(&v2, ids[DEAD]);
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED);
	if (strstr(sb->failure_reason, "another process") == NULL)
		fail_msg("reason: %s", sb->failure_reason);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	vmd_destroy_sandbox(&v2, ids[DEAD]);
	/* An adopted VM snapshots (QMP, its RAM file and disk are found
	 * again) and runs on after it. */
	{
		Moat__V1__SnapshotSandboxRequest sr =
		    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
		Moat__V1__LocalSnapshot *snap = NULL;

		sr.sandbox_id = ids[IDLE];
		if (vmd_call(&v2, "SnapshotSandbox", &sr.base,
		        &moat__v1__local_snapshot__descriptor,
		        (ProtobufCMessage **)&snap, LONG_MS) != MOAT_OK)
			fail_msg("snapshot of an adopted sandbox: %s",
			    vmd_last_err);
		assert_true(snap->ram_bytes > 0);
		protobuf_c_message_free_unpacked(&snap->base, NULL);
		text = read_file(&v2, ids[IDLE], "/tmp/adopt.txt");
		assert_non_null(strstr(text, ids[IDLE]));
		free(text);
	}
	paused_move(&v2, ids[IDLE]);
	/* A new exec after the adoption works and gets a new id. */
	assert_true(exec_start(&v2, ids[PY], "true") > running_exec);

	/* SIGTERM keeps them by default. */
	vmd_stop(&v2);
	for (int i = PY; i <= IDLE; i++)
		assert_true(pid_alive(pids[i]));
	assert_int_equal(vms_entries(), 3);

	/* --stop-sandboxes: adopted once more, then destroyed on SIGTERM. */
	start_vmd(&v3, true);
	check_adopted(&v3, 2);
	text = run_code(&v3, ids[PY], "x");
	assert_string_equal(text, "41");
	free(text);
	vmd_stop(&v3);
	for (int i = PY; i <= IDLE; i++)
		assert_true(pid_gone(pids[i]));
	assert_int_equal(vms_entries(), 0);
}

/* cgroup_dirs: how many control group directories named `name` exist
 * under any hierarchy's moat/ parent (v1 or v2). */
static int
cgroup_dirs(const char *name)
{
	const char *roots[] = { "/sys/fs/cgroup/moat",
		"/sys/fs/cgroup/memory/moat", "/sys/fs/cgroup/pids/moat",
		"/sys/fs/cgroup/cpu/moat", "/sys/fs/cgroup/cpu,cpuacct/moat" };
	char path[512];
	struct stat st;
	int n = 0;

	for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", roots[i], name);
		n += stat(path, &st) == 0 && S_ISDIR(st.st_mode);
	}
	return n;
}

/* A vmd killed with its sandboxes running, then `moat-vmd purge`: the
 * VMMs are killed, their control groups and the state go. */
static void
test_purge_after_kill(void **state)
{
	struct vmd_proc v;
	Moat__V1__Sandbox *sb;
	char id[64], *cmd, path[400];
	pid_t pid;
	int status;
	(void)state;

	if (!have_image)
		skip();
	start_vmd(&v, false);
	sb = vmd_create_or_fail(&v, 256, 256, LONG_MS);
	snprintf(id, sizeof(id), "%s", sb->id);
	pid = sb->vmm_pid;
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	kill(v.pid, SIGKILL);
	assert_int_equal(waitpid(v.pid, &status, 0), v.pid);
	v.pid = 0;
	moat_rpc_client_close(v.client);
	v.client = NULL;
	assert_true(pid_alive(pid));
	if (cgroup_dirs(id) == 0)
		fprintf(stderr, "NOTE: no jail cgroup for %s here\n", id);
	cmd = moat_asprintf("'%s' purge '%s/node'", MOAT_VMD_BIN, state_root);
	assert_int_equal(system(cmd), 0);
	free(cmd);
	assert_true(pid_gone(pid));
	assert_int_equal(cgroup_dirs(id), 0);
	snprintf(path, sizeof(path), "%s/node", state_root);
	assert_int_equal(access(path, F_OK), -1);
	vmd_stop(&v);
}

/* ---- group ---- */

static int
group_setup(void **state)
{
	const char *env = getenv("MOAT_IMAGE_DIR");
	char path[1100];

	(void)state;
	snprintf(image_dir, sizeof(image_dir), "%s",
	    env && env[0] ? env : MOAT_REPO_DIR "/images/out");
	snprintf(path, sizeof(path), "%s/default/rootfs.ext4", image_dir);
	have_image = access(path, R_OK) == 0;
	if (!have_image)
		fprintf(stderr, "NOTE: no image at %s/default: skipped\n",
		    image_dir);
	snprintf(state_root, sizeof(state_root), "/tmp/moat-adopt-XXXXXX");
	return mkdtemp(state_root) == NULL ? -1 : 0;
}

static int
group_teardown(void **state)
{
	/* purge also kills VMMs a failed run left behind. */
	char *cmd =
	    moat_asprintf("'%s' purge '%s/node' 2>/dev/null; rm -rf '%s'",
	        MOAT_VMD_BIN, state_root, state_root);

	(void)state;
	if (cmd != NULL)
		(void)!system(cmd);
	free(cmd);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restart_keeps_sandboxes),
		cmocka_unit_test(test_purge_after_kill),
	};
	int rv;

	signal(SIGPIPE, SIG_IGN);
	rv = cmocka_run_group_tests(tests, group_setup, group_teardown);
	if (rv == 0 && !have_image)
		return 77;
	return rv;
}
