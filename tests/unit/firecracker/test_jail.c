/*
 * test_jail.c: the jail of a Firecracker (jail.c) with the chroot base
 * and the cgroup root in a temporary folder: its paths, uid/gid from the
 * range, ids the jailer would refuse, the cgroup v2 controllers enabled
 * for the parent, the jailer's exact argv with memory and CPU limits, and
 * cleanup that removes the jail and the cgroup but never what was linked
 * into it. Not for: running a jailer (test_driver.c uses a fake one).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "jail.h"
#include "moat/status.h"
#include "moat/util.h"

struct fixture {
	char tmp[64];
	char *base;
	char *cgroot;
	struct moat_fc_jail_config cfg;
};

static void
write_text(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static char *
read_text(const char *path)
{
	char *buf = NULL;
	size_t len;

	assert_int_equal(moat_read_file(path, 4096, &buf, &len), 0);
	return buf;
}

static int
setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char *p;

	snprintf(f->tmp, sizeof(f->tmp), "/tmp/fc-jail-XXXXXX");
	assert_non_null(mkdtemp(f->tmp));
	f->base = moat_asprintf("%s/jailer", f->tmp);
	f->cgroot = moat_asprintf("%s/cgroup", f->tmp);
	assert_int_equal(moat_mkdir_p(f->cgroot, 0755), 0);
	/* What a cgroup v2 mount shows at its root. */
	p = moat_asprintf("%s/cgroup.subtree_control", f->cgroot);
	write_text(p, "");
	free(p);
	f->cfg.jailer = "/usr/local/bin/jailer";
	f->cfg.chroot_base = f->base;
	f->cfg.cgroup_root = f->cgroot;
	f->cfg.parent_cgroup = "moat";
	f->cfg.uid_base = 900000;
	f->cfg.id_count = 8;
	f->cfg.memory_overhead_mib = 64;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *f = *state;

	(void)moat_rm_rf(f->tmp);
	free(f->base);
	free(f->cgroot);
	free(f);
	return 0;
}

static void
test_paths_and_ids(void **state)
{
	struct fixture *f = *state;
	struct moat_fc_jail j;
	char *err = NULL;
	char *want;

	assert_int_equal(moat_fc_jail_init(&f->cfg, "/opt/fc/firecracker-v1.7",
	                     "sb-00ff", 3, &j, &err),
	    MOAT_OK);
	assert_null(err);
	want = moat_asprintf("%s/firecracker-v1.7/sb-00ff", f->base);
	assert_string_equal(j.dir, want);
	free(want);
	want = moat_asprintf("%s/firecracker-v1.7/sb-00ff/root", f->base);
	assert_string_equal(j.root, want);
	free(want);
	want = moat_asprintf("%s/firecracker-v1.7/sb-00ff/root/"
	                     "firecracker-v1.7.pid",
	    f->base);
	assert_string_equal(j.pid_file, want);
	free(want);
	want = moat_asprintf("%s/moat/sb-00ff", f->cgroot);
	assert_string_equal(j.cgroup, want);
	free(want);
	assert_int_equal(j.uid, 900003);
	assert_int_equal(j.gid, 900003);
	moat_fc_jail_fini(&j);
	moat_fc_jail_fini(&j); /* safe twice */
}

static void
test_refuses_bad_ids(void **state)
{
	struct fixture *f = *state;
	struct moat_fc_jail j;
	char *err = NULL;
	char longid[70];

	assert_int_equal(moat_fc_jail_init(&f->cfg, "firecracker", "../x", 0,
	                     &j, &err),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(err, "../x"));
	free(err);
	assert_int_equal(moat_fc_jail_init(&f->cfg, "firecracker", "a/b", 0,
	                     &j, &err),
	    MOAT_INVALID_ARGUMENT);
	free(err);
	memset(longid, 'a', 65);
	longid[65] = '\0';
	assert_int_equal(moat_fc_jail_init(&f->cfg, "firecracker", longid, 0,
	                     &j, &err),
	    MOAT_INVALID_ARGUMENT);
	free(err);
	assert_int_equal(moat_fc_jail_init(&f->cfg, "firecracker", "sb-1", 8,
	                     &j, &err),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(err, "jail-id-count"));
	free(err);
	assert_null(j.dir);
}

static void
test_prepare_enables_controllers(void **state)
{
	struct fixture *f = *state;
	struct moat_fc_jail j;
	struct stat st;
	char *err = NULL;
	char *p;
	char *text;

	assert_int_equal(moat_fc_jail_init(&f->cfg, "firecracker", "sb-1", 1,
	                     &j, &err),
	    MOAT_OK);
	/* The kernel makes the parent's control files when it is created;
	 * here the test does. */
	p = moat_asprintf("%s/moat", f->cgroot);
	assert_int_equal(mkdir(p, 0755), 0);
	free(p);
	p = moat_asprintf("%s/moat/cgroup.subtree_control", f->cgroot);
	write_text(p, "");
	assert_int_equal(moat_fc_jail_prepare(&f->cfg, &j, &err), MOAT_OK);
	assert_null(err);
	text = read_text(p);
	assert_non_null(strstr(text, "+cpu"));
	assert_non_null(strstr(text, "+memory"));
	free(text);
	free(p);
	p = moat_asprintf("%s/cgroup.subtree_control", f->cgroot);
	text = read_text(p);
	assert_non_null(strstr(text, "+memory"));
	free(text);
	/* Already enabled: nothing more written. */
	write_text(p, "cpuset cpu io memory pids");
	assert_int_equal(moat_fc_jail_prepare(&f->cfg, &j, &err), MOAT_OK);
	text = read_text(p);
	assert_string_equal(text, "cpuset cpu io memory pids");
	free(text);
	free(p);
	assert_int_equal(stat(j.root, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0750);
	if (geteuid() == 0) {
		assert_int_equal(st.st_uid, 900001);
		assert_int_equal(st.st_gid, 900001);
	}
	moat_fc_jail_fini(&j);
}

static void
test_prepare_without_cgroup_v2(void **state)
{
	struct fixture *f = *state;
	struct moat_fc_jail j;
	char *err = NULL;

	f->cfg.cgroup_root = "/nonexistent-cgroup";
	assert_int_equal(moat_fc_jail_init(&f->cfg, "firecracker", "sb-1", 0,
	                     &j, &err),
	    MOAT_OK);
	assert_int_not_equal(moat_fc_jail_prepare(&f->cfg, &j, &err), MOAT_OK);
	assert_non_null(strstr(err, "cgroup v2"));
	assert_non_null(strstr(err, "cgroup-root"));
	free(err);
	moat_fc_jail_fini(&j);
}

static void
test_argv(void **state)
{
	struct fixture *f = *state;
	struct moat_fc_jail j;
	/* No --id after "--": the jailer passes it to Firecracker. */
	const char *fc_args[] = { "--api-sock", "/api.sock", NULL };
	char *err = NULL;
	char **argv;
	char *joined = strdup("");

	f->cfg.netns = "/var/run/netns/moat";
	f->cfg.new_pid_ns = true;
	assert_int_equal(moat_fc_jail_init(&f->cfg, "/opt/firecracker", "sb-7",
	                     2, &j, &err),
	    MOAT_OK);
	argv = moat_fc_jail_argv(&f->cfg, &j, "/opt/firecracker", 2, 256,
	    fc_args);
	assert_non_null(argv);
	for (int i = 0; argv[i] != NULL; i++) {
		char *next =
		    moat_asprintf("%s%s[%s]", joined, i ? " " : "", argv[i]);
		free(joined);
		joined = next;
	}
	char *want = moat_asprintf(
	    "[/usr/local/bin/jailer] [--id] [sb-7] "
	    "[--exec-file] [/opt/firecracker] [--uid] [900002] [--gid] "
	    "[900002] [--chroot-base-dir] [%s] [--cgroup-version] [2] "
	    "[--parent-cgroup] [moat] [--cgroup] [memory.max=335544320] "
	    "[--cgroup] [cpu.max=200000 100000] [--netns] "
	    "[/var/run/netns/moat] [--new-pid-ns] [--] [--api-sock] "
	    "[/api.sock]",
	    f->base);
	assert_string_equal(joined, want);
	free(want);
	free(joined);
	moat_fc_jail_argv_free(argv);
	moat_fc_jail_argv_free(NULL);
	moat_fc_jail_fini(&j);
}

static void
test_clean(void **state)
{
	struct fixture *f = *state;
	struct moat_fc_jail j;
	struct stat st;
	char *err = NULL;
	char *disk = moat_asprintf("%s/scratch.ext4", f->tmp);
	char *inside;
	char *p;

	assert_int_equal(moat_fc_jail_init(&f->cfg, "firecracker", "sb-9", 0,
	                     &j, &err),
	    MOAT_OK);
	p = moat_asprintf("%s/moat", f->cgroot);
	assert_int_equal(mkdir(p, 0755), 0);
	free(p);
	p = moat_asprintf("%s/moat/cgroup.subtree_control", f->cgroot);
	write_text(p, "cpu memory");
	free(p);
	assert_int_equal(moat_fc_jail_prepare(&f->cfg, &j, &err), MOAT_OK);
	/* What the jailer and the driver leave: a linked disk, a device
	 * node stand-in, the cgroup of the VM. */
	write_text(disk, "disk");
	inside = moat_asprintf("%s/scratch.ext4", j.root);
	assert_int_equal(link(disk, inside), 0);
	p = moat_asprintf("%s/dev", j.root);
	assert_int_equal(mkdir(p, 0755), 0);
	free(p);
	assert_int_equal(mkdir(j.cgroup, 0755), 0);

	assert_int_equal(moat_fc_jail_clean(&j), 0);
	assert_int_equal(stat(j.dir, &st), -1);
	assert_int_equal(errno, ENOENT);
	assert_int_equal(stat(j.cgroup, &st), -1);
	assert_int_equal(stat(disk, &st), 0); /* the original stays */
	assert_int_equal(st.st_nlink, 1);
	/* The parent jail folder and cgroup stay for other sandboxes. */
	p = moat_asprintf("%s/moat", f->cgroot);
	assert_int_equal(stat(p, &st), 0);
	free(p);
	/* Again: nothing left is fine. */
	assert_int_equal(moat_fc_jail_clean(&j), 0);
	free(inside);
	free(disk);
	moat_fc_jail_fini(&j);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_paths_and_ids, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_refuses_bad_ids, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_prepare_enables_controllers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prepare_without_cgroup_v2,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_argv, setup, teardown),
		cmocka_unit_test_setup_teardown(test_clean, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
