/*
 * test_ramdir.c: the RAM directory setting (services/vm/ramdir.c): what
 * it refuses, the reflink probe on tmpfs (none) and on an XFS with
 * reflinks where deploy/ramfs.sh can make one (root, xfsprogs, a loop
 * device; otherwise that case says it was skipped), which files purge may
 * treat as RAM files, and the record purge reads back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/status.h"
#include "moat/util.h"
#include "ramdir.h"

static void
test_refuses_bad_dirs(void **state)
{
	char *errmsg = NULL;

	(void)state;
	assert_int_equal(vmd_ram_dir_set("relative/dir", &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(errmsg, "absolute"));
	free(errmsg);
	assert_int_equal(vmd_ram_dir_set("/dev/shm/../etc", &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	assert_int_equal(vmd_ram_dir_set("/a,b", &errmsg),
	    MOAT_INVALID_ARGUMENT);
	free(errmsg);
	assert_int_equal(vmd_ram_dir_set("/nonexistent/moat-ram", &errmsg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(errmsg, "not a writable directory"));
	free(errmsg);
	/* A refused setting leaves the directory as it was. */
	assert_string_equal(vmd_ram_dir(), "/dev/shm");
}

static void
test_tmpfs_has_no_reflinks(void **state)
{
	char *errmsg = NULL;

	(void)state;
	assert_int_equal(vmd_ram_dir_set("/dev/shm/", &errmsg), MOAT_OK);
	assert_string_equal(vmd_ram_dir(), "/dev/shm");
	assert_false(vmd_ram_dir_reflinks());
}

static void
test_paths_ours(void **state)
{
	char *errmsg = NULL;

	(void)state;
	assert_int_equal(vmd_ram_dir_set("/dev/shm", &errmsg), MOAT_OK);
	assert_true(vmd_ram_path_ours("/dev/shm/moat-sb-1.ram"));
	assert_true(vmd_ram_path_ours("/dev/shm/moat-spare-tpl-1-0.ram"));
	assert_false(vmd_ram_path_ours("/dev/shm/other.ram"));
	assert_false(vmd_ram_path_ours("/dev/shm/sub/moat-x.ram"));
	assert_false(vmd_ram_path_ours("/dev/shmx/moat-x.ram"));
	assert_false(vmd_ram_path_ours("/dev/moat-x.ram"));
	assert_false(vmd_ram_path_ours("/etc/passwd"));
	assert_false(vmd_ram_path_ours("moat-x.ram"));
}

static void
test_record_recall(void **state)
{
	char dir[] = "/tmp/moat-test-ramdir-XXXXXX";
	char *errmsg = NULL, *ram;

	(void)state;
	assert_non_null(mkdtemp(dir));
	ram = moat_asprintf("%s/ram", dir);
	assert_int_equal(mkdir(ram, 0700), 0);
	/* Nothing recorded: recall keeps the default. */
	assert_int_equal(vmd_ram_dir_set("/dev/shm", &errmsg), MOAT_OK);
	assert_int_equal(vmd_ram_dir_recall(dir), 0);
	assert_string_equal(vmd_ram_dir(), "/dev/shm");
	assert_int_equal(vmd_ram_dir_set(ram, &errmsg), MOAT_OK);
	assert_int_equal(vmd_ram_dir_record(dir), 0);
	assert_int_equal(vmd_ram_dir_set("/dev/shm", &errmsg), MOAT_OK);
	assert_int_equal(vmd_ram_dir_recall(dir), 0);
	assert_string_equal(vmd_ram_dir(), ram);
	/* A recorded directory that is gone is reported, not used. */
	assert_int_equal(vmd_ram_dir_set("/dev/shm", &errmsg), MOAT_OK);
	assert_int_equal(rmdir(ram), 0);
	assert_int_not_equal(vmd_ram_dir_recall(dir), 0);
	assert_string_equal(vmd_ram_dir(), "/dev/shm");
	assert_int_equal(moat_rm_rf(dir), 0);
	free(ram);
}

/* An XFS made by deploy/ramfs.sh has reflinks, and the probe sees them. */
static void
test_xfs_has_reflinks(void **state)
{
	char dir[] = "/tmp/moat-test-ramfs-XXXXXX";
	const char *script = getenv("MOAT_RAMFS_SCRIPT");
	char *cmd, *errmsg = NULL;
	int rc;

	(void)state;
	if (script == NULL || getuid() != 0 ||
	    system("command -v mkfs.xfs >/dev/null 2>&1") != 0) {
		printf("SKIPPED: test_xfs_has_reflinks (needs root, mkfs.xfs "
		       "and MOAT_RAMFS_SCRIPT)\n");
		skip();
	}
	assert_non_null(mkdtemp(dir));
	cmd = moat_asprintf("bash '%s' up '%s' 1G >/dev/null", script, dir);
	rc = system(cmd);
	free(cmd);
	if (rc != 0) {
		rmdir(dir);
		fail_msg("deploy/ramfs.sh up %s failed (%d): no loop device?",
		    dir, rc);
	}
	assert_int_equal(vmd_ram_dir_set(dir, &errmsg), MOAT_OK);
	assert_true(vmd_ram_dir_reflinks());
	assert_int_equal(vmd_ram_dir_set("/dev/shm", &errmsg), MOAT_OK);
	cmd = moat_asprintf("bash '%s' down '%s'", script, dir);
	assert_int_equal(system(cmd), 0);
	free(cmd);
	assert_int_equal(rmdir(dir), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_refuses_bad_dirs),
		cmocka_unit_test(test_tmpfs_has_no_reflinks),
		cmocka_unit_test(test_paths_ours),
		cmocka_unit_test(test_record_recall),
		cmocka_unit_test(test_xfs_has_reflinks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
