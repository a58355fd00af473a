/*
 * test_jail.c: the VMM jail (services/vm/jail.h) with a real QEMU (TCG):
 * for a running sandbox, /proc/<vmm>/status shows a non-zero Uid,
 * NoNewPrivs 1 and Seccomp 2; its mount, pid and net namespaces differ
 * from vmd's; its root hides the host (no /etc/passwd, no other state);
 * its cgroup (v1 or v2, whichever vmd found) has the memory, pids and
 * CPU limits; its RAM file is 0600 and owned by its uid; after destroy
 * the process, the cgroup and the RAM file are gone. Then a node without
 * a usable cgroup (cgroup-root pointing nowhere) refuses CreateSandbox
 * with FAILED_PRECONDITION naming `isolation = relaxed`, and with
 * isolation = relaxed runs the sandbox and says "relaxed" in Node and
 * Sandbox. Needs root and the image; else exits 77 (Skipped).
 */
#include <errno.h>
#include <fcntl.h>
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

#define LONG_MS 180000u
#define MEMORY_MIB 256u
#define OVERHEAD_MIB (160u + 256u) /* vmm-overhead-mib + TCG's buffer */

static char image_dir[1024];
static char state_root[128];

/* vmd_spawn's child: MOAT_VMD_<k>=<v> pairs from `arg` (NULL-terminated)
 * on top of this process's environment, then moat-vmd with the qemu
 * driver under TCG. */
static void
exec_vmd(const struct vmd_proc *v, void *arg)
{
	const char *const *env = arg;
	char cache[400];

	snprintf(cache, sizeof(cache), "%s/cache", v->state);
	setenv("MOAT_VMD_TEMPLATES", "off", 1);
	unsetenv("MOAT_VMD_SURVEY");
	for (size_t i = 0; env != NULL && env[i] != NULL; i += 2)
		setenv(env[i], env[i + 1], 1);
	execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", v->state, "--accel",
	    "tcg", "--driver", "qemu", "--image-dir", image_dir, "--listen",
	    v->url, "--cache-dir", cache, "--node-id", "jail-node",
	    (char *)NULL);
}

/* Starts moat-vmd in <state_root>/<name> with `env` (see exec_vmd). */
static void
vmd_start(struct vmd_proc *v, const char *name, const char *const *env)
{
	char state[300];

	snprintf(state, sizeof(state), "%s/%s", state_root, name);
	vmd_spawn(v, state, exec_vmd, (void *)env, 15000);
}

static Moat__V1__Node *
node_info(struct vmd_proc *v)
{
	Moat__V1__Empty e = MOAT__V1__EMPTY__INIT;
	Moat__V1__Node *node = NULL;

	assert_int_equal(vmd_call(v, "NodeInfo", &e.base,
	                     &moat__v1__node__descriptor,
	                     (ProtobufCMessage **)&node, 5000),
	    MOAT_OK);
	return node;
}

/* The value after "<key>:" in /proc/<pid>/status, or -1. */
static long
status_field(pid_t pid, const char *key)
{
	char path[64], *text = NULL, *p;
	size_t len;
	long v = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (moat_read_file(path, 1 << 16, &text, &len) != 0)
		return -1;
	if ((p = strstr(text, key)) != NULL && p[strlen(key)] == ':')
		v = strtol(p + strlen(key) + 1, NULL, 10);
	free(text);
	return v;
}

static void
assert_ns_differs(pid_t a, pid_t b, const char *ns)
{
	char pa[64], pb[64], la[128] = "", lb[128] = "";

	snprintf(pa, sizeof(pa), "/proc/%d/ns/%s", (int)a, ns);
	snprintf(pb, sizeof(pb), "/proc/%d/ns/%s", (int)b, ns);
	assert_true(readlink(pa, la, sizeof(la) - 1) > 0);
	assert_true(readlink(pb, lb, sizeof(lb) - 1) > 0);
	if (strcmp(la, lb) == 0)
		fail_msg("the VMM shares vmd's %s namespace (%s)", ns, la);
}

/* Reads a number from `dir`/`file`. */
static unsigned long long
read_num(const char *dir, const char *file)
{
	char *path = moat_asprintf("%s/%s", dir, file);
	char *text = NULL;
	size_t len;
	unsigned long long v;

	assert_non_null(path);
	if (moat_read_file(path, 4096, &text, &len) != 0)
		fail_msg("cannot read %s: %s", path, strerror(errno));
	v = strtoull(text, NULL, 10);
	free(text);
	free(path);
	return v;
}

/* The cgroup directory of `pid` in hierarchy `ctl` ("memory", ... or
 * "" for v2), as /sys/fs/cgroup/... (heap), or NULL. */
static char *
cgroup_dir(pid_t pid, const char *ctl)
{
	char path[64], *text = NULL, *line, *save = NULL, *dir = NULL;
	size_t len;

	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	if (moat_read_file(path, 1 << 16, &text, &len) != 0)
		return NULL;
	for (line = strtok_r(text, "\n", &save); line && !dir;
	     line = strtok_r(NULL, "\n", &save)) {
		char *c1 = strchr(line, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

		if (c2 == NULL)
			continue;
		*c2 = '\0';
		if (ctl[0] == '\0' ? strcmp(line, "0") == 0 :
		                     strcmp(c1 + 1, ctl) == 0)
			dir = ctl[0] == '\0' ?
			    moat_asprintf("/sys/fs/cgroup%s", c2 + 1) :
			    moat_asprintf("/sys/fs/cgroup/%s%s", ctl, c2 + 1);
	}
	free(text);
	return dir;
}

/* Checks the VMM's cgroup limits; returns the directories (heap, NULL
 * ended) to check they go with the sandbox. */
static void
check_cgroup(pid_t pid, uint32_t vcpus, char **dirs)
{
	unsigned long long mem = (MEMORY_MIB + OVERHEAD_MIB) * 1048576ull;
	char *mdir = cgroup_dir(pid, "memory");

	if (mdir != NULL && strstr(mdir, "/moat/") != NULL) {
		char *pdir = cgroup_dir(pid, "pids");
		char *cdir = cgroup_dir(pid, "cpu");

		assert_non_null(pdir);
		assert_non_null(cdir);
		assert_true(read_num(mdir, "memory.limit_in_bytes") == mem);
		assert_true(read_num(pdir, "pids.max") == 256);
		assert_true(read_num(cdir, "cpu.cfs_period_us") == 100000);
		assert_true(read_num(cdir, "cpu.cfs_quota_us") ==
		    vcpus * 100000ull + 50000);
		dirs[0] = mdir;
		dirs[1] = pdir;
		dirs[2] = cdir;
		return;
	}
	free(mdir);
	/* cgroup v2 */
	mdir = cgroup_dir(pid, "");
	if (mdir == NULL || strstr(mdir, "/moat/") == NULL)
		fail_msg("the VMM is in no moat cgroup (%s)",
		    mdir ? mdir : "none");
	assert_true(read_num(mdir, "memory.max") == mem);
	assert_true(read_num(mdir, "pids.max") == 256);
	assert_true(read_num(mdir, "cpu.max") == vcpus * 100000ull + 50000);
	dirs[0] = mdir;
}

static void
test_strict(void **state)
{
	struct vmd_proc v;
	Moat__V1__Node *node;
	Moat__V1__Sandbox *sb = NULL;
	char *dirs[4] = { 0 };
	char ram[160], path[400];
	struct stat st;
	pid_t pid;
	long uid;

	(void)state;
	vmd_start(&v, "strict", NULL);
	node = node_info(&v);
	assert_string_equal(node->isolation, "strict");
	protobuf_c_message_free_unpacked(&node->base, NULL);
	if (vmd_create_sandbox(&v, MEMORY_MIB, 256, &sb, LONG_MS) != MOAT_OK) {
		vmd_log_tail(&v, 30);
		fail_msg("CreateSandbox: %s", vmd_last_err);
	}
	assert_string_equal(sb->isolation, "strict");
	pid = sb->vmm_pid;
	assert_true(pid > 0);

	uid = status_field(pid, "Uid");
	assert_true(uid >= 200000 && uid < 200000 + 4096);
	assert_int_equal(status_field(pid, "Gid"), 200000);
	assert_int_equal(status_field(pid, "NoNewPrivs"), 1);
	assert_int_equal(status_field(pid, "Seccomp"), 2);
	assert_ns_differs(pid, v.pid, "mnt");
	assert_ns_differs(pid, v.pid, "pid");
	assert_ns_differs(pid, v.pid, "net");
	assert_ns_differs(pid, v.pid, "ipc");
	assert_ns_differs(pid, v.pid, "uts");
	/* Its root holds only what it needs. */
	snprintf(path, sizeof(path), "/proc/%d/root/etc/passwd", (int)pid);
	assert_int_equal(access(path, F_OK), -1);
	snprintf(path, sizeof(path), "/proc/%d/root%s/vmd.sock", (int)pid,
	    v.state);
	assert_int_equal(access(path, F_OK), -1);
	snprintf(path, sizeof(path), "/proc/%d/root/usr/bin", (int)pid);
	assert_int_equal(access(path, F_OK), 0);

	check_cgroup(pid, sb->vcpus, dirs);
	/* The sandbox directory stays root's (sticky, group jail-gid): the
	 * VMM cannot swap vmd's files there. */
	snprintf(path, sizeof(path), "%s/vms/%s", v.state, sb->id);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 01770);
	assert_int_equal(st.st_uid, 0);
	assert_int_equal(st.st_gid, 200000);
	snprintf(path, sizeof(path), "%s/vms/%s/scratch.ext4", v.state,
	    sb->id);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0660);
	assert_int_equal(st.st_uid, 0);
	/* The guest works under those limits. */
	{
		Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
		Moat__V1__ExecResult *res = NULL;

		req.sandbox_id = sb->id;
		req.language = "python";
		req.code = "print(sum(range(1000)))";
		req.timeout_ms = 60000;
		assert_int_equal(vmd_call(&v, "Exec", &req.base,
		                     &moat__v1__exec_result__descriptor,
		                     (ProtobufCMessage **)&res, LONG_MS),
		    MOAT_OK);
		assert_int_equal(res->status->exit_code, 0);
		assert_int_equal(res->stdout.len, 7);
		assert_memory_equal(res->stdout.data, "499500\n", 7);
		protobuf_c_message_free_unpacked(&res->base, NULL);
	}
	if (strstr(dirs[0], "/memory/") != NULL)
		printf("VMM memory peak %.1f MiB of %u MiB\n",
		    (double)read_num(dirs[0], "memory.max_usage_in_bytes") /
		        1048576.0,
		    MEMORY_MIB + OVERHEAD_MIB);

	snprintf(ram, sizeof(ram), "/dev/shm/moat-%s.ram", sb->id);
	assert_int_equal(stat(ram, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal((long)st.st_uid, uid);

	vmd_destroy_sandbox(&v, sb->id);
	assert_true(kill(pid, 0) != 0);
	assert_int_equal(stat(ram, &st), -1);
	for (int i = 0; dirs[i] != NULL; i++) {
		if (access(dirs[i], F_OK) == 0)
			fail_msg("cgroup %s outlived its sandbox", dirs[i]);
		free(dirs[i]);
	}
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	vmd_stop(&v);
}

static void
test_relaxed(void **state)
{
	static const char *const broken[] = { "MOAT_VMD_CGROUP_ROOT",
		"/nonexistent-cgroup", NULL };
	static const char *const relaxed[] = { "MOAT_VMD_CGROUP_ROOT",
		"/nonexistent-cgroup", "MOAT_VMD_ISOLATION", "relaxed", NULL };
	struct vmd_proc v;
	Moat__V1__Node *node;
	Moat__V1__Sandbox *sb = NULL;

	(void)state;
	vmd_start(&v, "refuses", broken);
	node = node_info(&v);
	assert_true(strncmp(node->isolation, "refused: no cgroup", 18) == 0);
	protobuf_c_message_free_unpacked(&node->base, NULL);
	assert_int_equal(vmd_create_sandbox(&v, MEMORY_MIB, 256, &sb, LONG_MS),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(vmd_last_err, "isolation = relaxed"));
	assert_non_null(strstr(vmd_last_err, "cgroup"));
	vmd_stop(&v);

	vmd_start(&v, "relaxed", relaxed);
	node = node_info(&v);
	assert_true(strncmp(node->isolation, "relaxed: no cgroup", 18) == 0);
	protobuf_c_message_free_unpacked(&node->base, NULL);
	if (vmd_create_sandbox(&v, MEMORY_MIB, 256, &sb, LONG_MS) != MOAT_OK) {
		vmd_log_tail(&v, 30);
		fail_msg("CreateSandbox (relaxed): %s", vmd_last_err);
	}
	assert_true(strncmp(sb->isolation, "relaxed: no cgroup", 18) == 0);
	/* The pieces the host has still apply. */
	assert_true(status_field(sb->vmm_pid, "Uid") >= 200000);
	assert_int_equal(status_field(sb->vmm_pid, "Seccomp"), 2);
	vmd_destroy_sandbox(&v, sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	vmd_stop(&v);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_strict),
		cmocka_unit_test(test_relaxed),
	};
	const char *env = getenv("MOAT_IMAGE_DIR");
	char path[1100];
	int rv;

	signal(SIGPIPE, SIG_IGN);
	snprintf(image_dir, sizeof(image_dir), "%s",
	    env && env[0] ? env : MOAT_REPO_DIR "/images/out");
	snprintf(path, sizeof(path), "%s/default/rootfs.ext4", image_dir);
	if (access(path, R_OK) != 0) {
		printf("SKIPPED: vm_jail (no image at %s/default)\n",
		    image_dir);
		return 77;
	}
	if (geteuid() != 0) {
		printf("SKIPPED: vm_jail (needs root to switch uids)\n");
		return 77;
	}
	snprintf(state_root, sizeof(state_root), "/tmp/moat-jail-test-XXXXXX");
	if (mkdtemp(state_root) == NULL)
		return 1;
	rv = cmocka_run_group_tests(tests, NULL, NULL);
	{
		char *cmd =
		    moat_asprintf("for d in '%s'/*/; do '%s' purge "
		                  "\"$d\" >/dev/null 2>&1; done; rm -rf "
		                  "'%s'",
		        state_root, MOAT_VMD_BIN, state_root);

		if (cmd != NULL)
			(void)!system(cmd);
		free(cmd);
	}
	return rv;
}
