/*
 * test_cgroup.c: services/vm/cgroup.c against a fake cgroupfs (a plain
 * directory tree in a temp dir): v2 (cgroup.controllers at the root:
 * the controllers enabled for "moat", memory.max, pids.max, cpu.max)
 * and v1 (memory/, pids/, cpu/: memory.limit_in_bytes, pids.max,
 * cpu.cfs_*), a root lacking a controller, and removal. With the
 * argument "real": the same on the host's /sys/fs/cgroup when it is v2
 * with the memory, pids and cpu controllers and we are root, with a
 * child placed in the group by the spawner; else exit 77 (Skipped).
 */
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

#include "cgroup.h"
#include "moat/status.h"
#include "moat/util.h"
#include "spawn.h"

static const struct vmd_cgroup_limits lim = {
	.memory_bytes = 416ull << 20,
	.pids = 256,
	.cpu_quota_us = 200000,
	.cpu_period_us = 100000,
};

static char *
read_text(const char *dir, const char *file)
{
	char *path = moat_asprintf("%s/%s", dir, file);
	char *text = NULL;
	size_t len;

	assert_non_null(path);
	if (moat_read_file(path, 4096, &text, &len) != 0)
		fail_msg("cannot read %s: %s", path, strerror(errno));
	free(path);
	return text;
}

static void
assert_file(const char *dir, const char *file, const char *want)
{
	char *text = read_text(dir, file);
	size_t n = strlen(text);

	while (n > 0 && text[n - 1] == '\n')
		text[--n] = '\0';
	assert_string_equal(text, want);
	free(text);
}

static void
write_text(const char *dir, const char *file, const char *text)
{
	char *path = moat_asprintf("%s/%s", dir, file);

	assert_int_equal(moat_write_file_atomic(path, text, strlen(text),
	                     0644),
	    0);
	free(path);
}

static char *
tmp_tree(void)
{
	char *dir = strdup("/tmp/moat-cgroup-test-XXXXXX");

	assert_non_null(dir);
	assert_non_null(mkdtemp(dir));
	return dir;
}

static void
test_fake_v2(void **state)
{
	struct vmd_cgroup_host h;
	struct vmd_cgroup cg;
	char *root = tmp_tree();
	char *why = NULL, *err = NULL, *moat = NULL;

	(void)state;
	write_text(root, "cgroup.controllers", "cpuset cpu io memory pids\n");
	assert_int_equal(vmd_cgroup_detect(root, &h, &why), MOAT_OK);
	assert_int_equal(h.version, 2);
	assert_int_equal(h.n_base, 1);
	moat = moat_asprintf("%s/moat", root);
	assert_string_equal(h.base[0], moat);
	assert_file(root, "cgroup.subtree_control", "+memory +pids +cpu");
	assert_file(moat, "cgroup.subtree_control", "+memory +pids +cpu");

	assert_int_equal(vmd_cgroup_create(&h, "sb-1", &lim, &cg, &err),
	    MOAT_OK);
	assert_int_equal(cg.n, 1);
	assert_file(cg.dir[0], "memory.max", "436207616");
	assert_file(cg.dir[0], "pids.max", "256");
	assert_file(cg.dir[0], "cpu.max", "200000 100000");
	assert_non_null(strstr(cg.procs[0], "/moat/sb-1/cgroup.procs"));
	/* Bad names never reach the tree. */
	{
		struct vmd_cgroup bad;

		assert_int_equal(vmd_cgroup_create(&h, "../x", &lim, &bad,
		                     &err),
		    MOAT_FAILED_PRECONDITION);
		free(err);
		err = NULL;
	}
	{
		char *dir = strdup(cg.dir[0]);

		vmd_cgroup_remove(&cg);
		assert_int_equal(access(dir, F_OK), -1);
		free(dir);
	}
	vmd_cgroup_host_fini(&h);
	assert_int_equal(moat_rm_rf(root), 0);
	free(moat);
	free(root);
}

static void
test_fake_v1(void **state)
{
	static const char *const ctl[] = { "memory", "pids", "cpu" };
	struct vmd_cgroup_host h;
	struct vmd_cgroup cg;
	char *root = tmp_tree();
	char *why = NULL, *err = NULL;

	(void)state;
	for (int i = 0; i < 3; i++) {
		char *d = moat_asprintf("%s/%s", root, ctl[i]);

		assert_int_equal(mkdir(d, 0755), 0);
		free(d);
	}
	assert_int_equal(vmd_cgroup_detect(root, &h, &why), MOAT_OK);
	assert_int_equal(h.version, 1);
	assert_int_equal(h.n_base, 3);
	assert_int_equal(vmd_cgroup_create(&h, "sb-2", &lim, &cg, &err),
	    MOAT_OK);
	assert_int_equal(cg.n, 3);
	assert_non_null(strstr(cg.dir[0], "/memory/moat/sb-2"));
	assert_file(cg.dir[0], "memory.limit_in_bytes", "436207616");
	assert_file(cg.dir[1], "pids.max", "256");
	assert_file(cg.dir[2], "cpu.cfs_period_us", "100000");
	assert_file(cg.dir[2], "cpu.cfs_quota_us", "200000");
	vmd_cgroup_remove(&cg);
	for (int i = 0; i < 3; i++) {
		char *d = moat_asprintf("%s/%s/moat/sb-2", root, ctl[i]);

		assert_int_equal(access(d, F_OK), -1);
		free(d);
	}
	vmd_cgroup_host_fini(&h);
	assert_int_equal(moat_rm_rf(root), 0);
	free(root);
}

/* A v2 root without the pids controller, and a root with nothing. */
static void
test_missing(void **state)
{
	struct vmd_cgroup_host h;
	char *root = tmp_tree();
	char *why = NULL;

	(void)state;
	write_text(root, "cgroup.controllers", "cpu memory io\n");
	assert_int_equal(vmd_cgroup_detect(root, &h, &why),
	    MOAT_FAILED_PRECONDITION);
	assert_int_equal(h.version, 0);
	assert_non_null(strstr(why, "controllers"));
	free(why);
	why = NULL;
	assert_int_equal(vmd_cgroup_detect("/nonexistent-cgroup", &h, &why),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(why, "memory"));
	free(why);
	assert_int_equal(moat_rm_rf(root), 0);
	free(root);
}

/* The host's cgroup v2: a child joins the group through the spawner. */
static void
test_real_v2(void **state)
{
	static const char *const argv[] = { "sleep", "30", NULL };
	struct vmd_cgroup_host h;
	struct vmd_cgroup cg;
	struct moat_jail jail = { 0 };
	struct moat_spawn_req req = { .argv = argv, .jail = &jail };
	const char *procs[1];
	char *why = NULL, *err = NULL, *text, *line;
	char path[64];
	size_t len;
	pid_t pid;
	int status;

	(void)state;
	assert_int_equal(vmd_cgroup_detect("auto", &h, &why), MOAT_OK);
	assert_int_equal(h.version, 2);
	assert_int_equal(vmd_cgroup_create(&h, "moat-unit-test", &lim, &cg,
	                     &err),
	    MOAT_OK);
	assert_file(cg.dir[0], "memory.max", "436207616");
	assert_file(cg.dir[0], "cpu.max", "200000 100000");
	procs[0] = cg.procs[0];
	jail.cgroup_procs = procs;
	jail.n_cgroups = 1;
	assert_int_equal(moat_spawner_start(), 0);
	assert_int_equal(moat_spawn(&req, &pid, &err), MOAT_OK);
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	assert_int_equal(moat_read_file(path, 4096, &text, &len), 0);
	line = strstr(text, "0::/moat/moat-unit-test");
	assert_non_null(line);
	free(text);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	vmd_cgroup_remove(&cg);
	moat_spawner_stop();
	vmd_cgroup_host_fini(&h);
}

/* Is /sys/fs/cgroup v2 with the memory, pids and cpu controllers? */
static bool
host_has_v2(void)
{
	char *text = NULL;
	size_t len;
	bool ok;

	if (geteuid() != 0 ||
	    moat_read_file("/sys/fs/cgroup/cgroup.controllers", 4096, &text,
	        &len) != 0)
		return false;
	ok = strstr(text, "memory") && strstr(text, "pids") &&
	    strstr(text, "cpu");
	free(text);
	return ok;
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest fake[] = {
		cmocka_unit_test(test_fake_v2),
		cmocka_unit_test(test_fake_v1),
		cmocka_unit_test(test_missing),
	};
	const struct CMUnitTest real[] = {
		cmocka_unit_test(test_real_v2),
	};

	if (argc > 1 && strcmp(argv[1], "real") == 0) {
		if (!host_has_v2()) {
			printf("SKIPPED: vm_cgroup_v2_real (/sys/fs/cgroup is "
			       "not cgroup v2 with memory, pids and cpu, or "
			       "not root)\n");
			return 77;
		}
		return cmocka_run_group_tests(real, NULL, NULL);
	}
	return cmocka_run_group_tests(fake, NULL, NULL);
}
