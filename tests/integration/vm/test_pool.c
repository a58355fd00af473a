/*
 * test_pool.c: the warm VMM pool (issue 18 part 3, [vmd] vmm-pool) with
 * real VMs (QEMU under TCG, allowed by MOAT_VMD_ALLOW_TCG). One state directory, two vmds in turn, vmm-pool = 1:
 *   - vmd 1: a first create boots cold and makes the template; the next
 *     create clones it (the pool is empty: a miss) and fills the pool;
 *     the pool's register (<state>/pool/<sb-id>.pid) then names one
 *     live pooled VMM, and the next create takes it: the sandbox gets
 *     that id, that VMM's pid and the log says so; it runs a command,
 *     and its snapshot restores exactly (a file by content), first with
 *     a fresh VMM, then with one from the snapshot's pool, which goes
 *     when the snapshot is deleted. After it is
 *     destroyed, the next create takes another pooled VMM (another pid):
 *     a pooled process is never reused.
 *   - vmd 1 is killed with SIGKILL with a pooled VMM waiting: vmd 2 on
 *     the same state directory kills it before it adopts, its directory
 *     and register entry are gone, no process mentions them, and the
 *     sandboxes are adopted as before.
 *   - vmd 2 refills its pool; its SIGTERM kills the pooled VMM and
 *     removes its files (the sandboxes stay, as without a pool).
 * Needs the default image (MOAT_IMAGE_DIR or <repo>/images/out); skipped
 * (77) without it. Not for: timings (tests/bench/bench_pool.c).
 */
#include <dirent.h>
#include <errno.h>
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
#define MEM_MIB 256u
#define SCRATCH_MIB 256u

static char image_dir[1024];
static char state_root[128];
static bool have_image;

static void
exec_vmd(const struct vmd_proc *v, void *arg)
{
	char cache[400];

	(void)arg;
	snprintf(cache, sizeof(cache), "%s/cache", v->state);
	setenv("MOAT_VMD_VMM_POOL", "1", 1);
	setenv("MOAT_VMD_STOP_SANDBOXES_ON_EXIT", "false", 1);
	/* TCG: the pool's point is the VMM's start, which TCG has too. */
	setenv("MOAT_VMD_ALLOW_TCG", "true", 1);
	execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", v->state, "--accel",
	    "tcg", "--driver", "qemu", "--image-dir", image_dir, "--listen",
	    v->url, "--cache-dir", cache, "--node-id", "pool-node",
	    (char *)NULL);
}

static void
start_vmd(struct vmd_proc *v)
{
	char state[300];

	snprintf(state, sizeof(state), "%s/node", state_root);
	vmd_spawn(v, state, exec_vmd, NULL, 60000);
}

/* The pool's register: the one entry's sandbox id and pid (0 while it
 * starts). Returns the number of entries. */
static int
pool_entry(char id[24], pid_t *pid)
{
	char path[400];
	DIR *d;
	struct dirent *e;
	int n = 0;

	id[0] = '\0';
	*pid = 0;
	snprintf(path, sizeof(path), "%s/node/pool", state_root);
	if ((d = opendir(path)) == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		char file[700];
		char *text = NULL;
		size_t len;

		if (e->d_name[0] == '.' || strlen(e->d_name) != 23)
			continue;
		n++;
		snprintf(id, 24, "%.19s", e->d_name);
		snprintf(file, sizeof(file), "%s/%s", path, e->d_name);
		if (moat_read_file(file, 64, &text, &len) == 0)
			*pid = (pid_t)atoi(text);
		free(text);
	}
	closedir(d);
	return n;
}

/* The register's started entries (pid > 0, alive): their ids into
 * ids[max][24]; returns how many (all entries must be started, else
 * 0). */
static int
pool_entries(char ids[][24], int max)
{
	char path[400];
	DIR *d;
	struct dirent *e;
	int n = 0;
	bool started = true;

	snprintf(path, sizeof(path), "%s/node/pool", state_root);
	if ((d = opendir(path)) == NULL)
		return 0;
	while ((e = readdir(d)) != NULL) {
		char file[700];
		char *text = NULL;
		size_t len;
		pid_t pid = 0;

		if (e->d_name[0] == '.' || strlen(e->d_name) != 23)
			continue;
		snprintf(file, sizeof(file), "%s/%s", path, e->d_name);
		if (moat_read_file(file, 64, &text, &len) == 0)
			pid = (pid_t)atoi(text);
		free(text);
		started = started && pid > 0 && kill(pid, 0) == 0;
		if (n < max)
			snprintf(ids[n], 24, "%.19s", e->d_name);
		n++;
	}
	closedir(d);
	return started ? n : 0;
}

/* Waits (up to 5 min: a TCG start under load) until the register names
 * one started pooled VMM other than `not`; returns its pid. */
static pid_t
wait_pooled(struct vmd_proc *v, char id[24], pid_t not )
{
	for (int i = 0; i < 3000; i++) {
		pid_t pid;

		if (pool_entry(id, &pid) == 1 && pid > 0 &&
		    pid != not &&kill(pid, 0) == 0)
			return pid;
		usleep(100 * 1000);
	}
	vmd_log_tail(v, 30);
	fail_msg("no pooled VMM was started");
	return 0;
}

static bool
alive(pid_t pid)
{
	char path[64], *text = NULL;
	size_t len;
	bool zombie;

	if (kill(pid, 0) != 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (moat_read_file(path, 4096, &text, &len) != 0)
		return false;
	zombie = strstr(text, ") Z ") != NULL;
	free(text);
	return !zombie;
}

/* The pid in sandbox id's qemu.pid. */
static pid_t
vmm_pid(const char *id)
{
	char path[400], *text = NULL;
	size_t len;
	pid_t pid;

	snprintf(path, sizeof(path), "%s/node/vms/%s/qemu.pid", state_root,
	    id);
	assert_int_equal(moat_read_file(path, 64, &text, &len), 0);
	pid = (pid_t)atoi(text);
	free(text);
	return pid;
}

static char *
sh(struct vmd_proc *v, const char *id, const char *script)
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
	if (res->status->exit_code != 0)
		fail_msg("Exec \"%.60s\" in %s: rc %d", script, id,
		    res->status->exit_code);
	/* Empty bytes have a NULL data. */
	out = res->stdout.len > 0 ?
	    strndup((const char *)res->stdout.data, res->stdout.len) :
	    strdup("");
	protobuf_c_message_free_unpacked(&res->base, NULL);
	return out;
}

static bool
log_has(const struct vmd_proc *v, const char *needle)
{
	char *text = NULL;
	size_t len;
	bool has;

	if (moat_read_file(v->log, 64 << 20, &text, &len) != 0)
		return false;
	has = strstr(text, needle) != NULL;
	free(text);
	return has;
}

/* Whether the log's first line with `start` also has `needle`. */
static bool
log_line_has(const struct vmd_proc *v, const char *start, const char *needle)
{
	char *text = NULL, *at, *nl;
	size_t len;
	bool has = false;

	if (moat_read_file(v->log, 64 << 20, &text, &len) != 0)
		return false;
	if ((at = strstr(text, start)) != NULL) {
		if ((nl = strchr(at, '\n')) != NULL)
			*nl = '\0';
		has = strstr(at, needle) != NULL;
	}
	free(text);
	return has;
}

/* Creates a sandbox that must take the pooled VMM `id` (pid `pid`). */
static Moat__V1__Sandbox *
create_pooled(struct vmd_proc *v, const char *id, pid_t pid)
{
	Moat__V1__Sandbox *sb =
	    vmd_create_or_fail(v, MEM_MIB, SCRATCH_MIB, LONG_MS);
	char line[128], *out;

	if (strcmp(sb->id, id) != 0) {
		vmd_log_tail(v, 30);
		fail_msg("the create did not take pooled VMM %s (got %s)", id,
		    sb->id);
	}
	/* A template's pooled VMM comes running: pre-warmed (pool.h). */
	snprintf(line, sizeof(line),
	    "sandbox %s: restoring into a pooled VMM (pid %d, pre-warmed)", id,
	    (int)pid);
	assert_true(log_has(v, line));
	assert_int_equal(vmm_pid(id), pid);
	/* Reset as this sandbox: its own name. */
	out = sh(v, sb->id, "hostname");
	snprintf(line, sizeof(line), "%s\n", sb->id);
	assert_string_equal(out, line);
	free(out);
	return sb;
}

/* Restores snapshot snap_id as a new sandbox: it has the file. Returns
 * the clone's id (heap); destroyed. */
static char *
restore_check(struct vmd_proc *v, const char *snap_id)
{
	Moat__V1__RestoreSandboxRequest rr =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *clone = NULL;
	char *out, *id;

	rr.snapshot_id = (char *)snap_id;
	if (vmd_call(v, "RestoreSandbox", &rr.base,
	        &moat__v1__sandbox__descriptor, (ProtobufCMessage **)&clone,
	        LONG_MS) != MOAT_OK)
		fail_msg("RestoreSandbox: %s", vmd_last_err);
	out = sh(v, clone->id, "cat /tmp/pool.txt");
	assert_string_equal(out, "pooled-42\n");
	free(out);
	vmd_destroy_sandbox(v, clone->id);
	id = strdup(clone->id);
	protobuf_c_message_free_unpacked(&clone->base, NULL);
	return id;
}

/* Snapshot of id after writing a file; a restore as a new sandbox has
 * the file (a fresh VMM), fills the snapshot's pool, and a second
 * restore takes the pooled VMM and has the file too. The snapshot is
 * then deleted: its pool goes with it. */
static void
exact_restore(struct vmd_proc *v, const char *id)
{
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	Moat__V1__LocalSnapshot *snap = NULL;
	char ids[2][24], line[128], *clone;
	int n = 0;

	free(sh(v, id, "echo pooled-$((6*7)) > /tmp/pool.txt; sync"));
	sr.sandbox_id = (char *)id;
	if (vmd_call(v, "SnapshotSandbox", &sr.base,
	        &moat__v1__local_snapshot__descriptor,
	        (ProtobufCMessage **)&snap, LONG_MS) != MOAT_OK)
		fail_msg("SnapshotSandbox %s: %s", id, vmd_last_err);
	free(restore_check(v, snap->snapshot_id));
	/* The template's pool and now the snapshot's: two started. */
	for (int i = 0; i < 3000 && n != 2; i++) {
		n = pool_entries(ids, 2);
		if (n != 2)
			usleep(100 * 1000);
	}
	if (n != 2) {
		vmd_log_tail(v, 30);
		fail_msg("the snapshot's pool was not filled");
	}
	clone = restore_check(v, snap->snapshot_id);
	assert_true(strcmp(clone, ids[0]) == 0 || strcmp(clone, ids[1]) == 0);
	snprintf(line, sizeof(line), "sandbox %s: restoring into a pooled VMM",
	    clone);
	assert_true(log_has(v, line));
	/* A snapshot's pooled VMM waits paused: the restore loads the
	 * recorded state itself, never a state that ran on. */
	assert_false(log_line_has(v, line, "pre-warmed"));
	free(clone);
	ref.snapshot_id = snap->snapshot_id;
	if (vmd_call(v, "DeleteLocalSnapshot", &ref.base,
	        &moat__v1__empty__descriptor, NULL, LONG_MS) != MOAT_OK)
		fail_msg("DeleteLocalSnapshot: %s", vmd_last_err);
	protobuf_c_message_free_unpacked(&snap->base, NULL);
}

static void
assert_slot_gone(const char *id, pid_t pid)
{
	char path[400];
	pid_t p;

	for (int i = 0; i < 100 && alive(pid); i++)
		usleep(100 * 1000);
	assert_false(alive(pid));
	snprintf(path, sizeof(path), "%s/node/vms/%s", state_root, id);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(vmd_procs_mentioning(path), 0);
	assert_int_equal(pool_entry((char[24]){ 0 }, &p), 0);
}

static void
test_pool(void **state)
{
	struct vmd_proc v = { 0 };
	Moat__V1__Sandbox *first, *miss, *hit, *hit2;
	char *tpl = NULL, *out;
	char id[24], id2[24], id3[24];
	pid_t pid, pid2, pid3;

	(void)state;
	if (!have_image)
		skip();
	start_vmd(&v);
	/* A cold boot makes the template in the background. */
	first = vmd_create_or_fail(&v, MEM_MIB, SCRATCH_MIB, LONG_MS);
	for (int i = 0; i < 3000 && (tpl = vmd_template_dir(&v)) == NULL; i++)
		usleep(100 * 1000);
	if (tpl == NULL) {
		vmd_log_tail(&v, 30);
		fail_msg("no template was made");
	}
	free(tpl);
	vmd_destroy_sandbox(&v, first->id);
	protobuf_c_message_free_unpacked(&first->base, NULL);
	/* The first clone finds the pool empty and fills it. */
	miss = vmd_create_or_fail(&v, MEM_MIB, SCRATCH_MIB, LONG_MS);
	vmd_destroy_sandbox(&v, miss->id);
	protobuf_c_message_free_unpacked(&miss->base, NULL);

	pid = wait_pooled(&v, id, 0);
	hit = create_pooled(&v, id, pid);
	out = sh(&v, hit->id, "echo $((6*7))");
	assert_string_equal(out, "42\n");
	free(out);
	exact_restore(&v, hit->id);
	/* Never reused: once the sandbox is gone its VMM is gone, and the
	 * next create takes another. */
	pid2 = wait_pooled(&v, id2, pid);
	vmd_destroy_sandbox(&v, hit->id);
	for (int i = 0; i < 100 && alive(pid); i++)
		usleep(100 * 1000);
	assert_false(alive(pid));
	assert_string_not_equal(id2, id);
	hit2 = create_pooled(&v, id2, pid2);
	assert_int_not_equal(pid2, pid);
	protobuf_c_message_free_unpacked(&hit->base, NULL);

	/* kill -9 with a pooled VMM waiting: it outlives vmd... */
	pid3 = wait_pooled(&v, id3, pid2);
	assert_int_equal(kill(v.pid, SIGKILL), 0);
	assert_int_equal(waitpid(v.pid, NULL, 0), v.pid);
	v.pid = 0;
	moat_rpc_client_close(v.client);
	v.client = NULL;
	assert_true(alive(pid3));
	/* ...until the next vmd starts: gone, with its files. */
	start_vmd(&v);
	assert_slot_gone(id3, pid3);
	assert_true(log_has(&v,
	    "left by an earlier vmd (it was still "
	    "running and was killed)"));
	/* The pooled sandbox itself was adopted as any other. */
	assert_true(alive(pid2));
	out = sh(&v, hit2->id, "echo adopted");
	assert_string_equal(out, "adopted\n");
	free(out);

	/* vmd 2's pool fills on its first clone; SIGTERM leaves none. */
	vmd_destroy_sandbox(&v, hit2->id);
	protobuf_c_message_free_unpacked(&hit2->base, NULL);
	miss = vmd_create_or_fail(&v, MEM_MIB, SCRATCH_MIB, LONG_MS);
	pid = wait_pooled(&v, id, 0);
	vmd_destroy_sandbox(&v, miss->id);
	protobuf_c_message_free_unpacked(&miss->base, NULL);
	vmd_stop(&v);
	assert_slot_gone(id, pid);
}

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
	snprintf(state_root, sizeof(state_root), "/tmp/moat-pool-XXXXXX");
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
		cmocka_unit_test(test_pool),
	};
	int rv;

	signal(SIGPIPE, SIG_IGN);
	rv = cmocka_run_group_tests(tests, group_setup, group_teardown);
	if (rv == 0 && !have_image)
		return 77;
	return rv;
}
