/*
 * test_pool.c: the warm VMM pool's bookkeeping (services/vm/pool.c)
 * against the fake driver (fake_vmm.h): the register's names, a pool
 * filled to [vmd] vmm-pool with a register entry and a directory per
 * pooled VMM, a take that gives the sandbox that VMM's id and directory
 * and leaves the register, a refill with other ids, a taken VMM no
 * sandbox ran killed with its files, a forgotten template's VMMs
 * killed (also one whose directory went), snapshots' pools (4 at
 * most: the oldest goes), pooled VMMs' memory (made while they fit,
 * handed over by a take, shed for a sandbox), vmd_pool_fini leaving
 * none, a start that fails, and the
 * leftovers of a dead vmd reaped before adoption. No QEMU; seconds.
 * Not for: real VMMs (tests/integration/vm/test_pool.c).
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_node.h"
#include "fake_vmm.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "pool.h"
#include "ramdir.h"
#include "sandbox.h"
#include "snapshot_meta.h"
#include "spawn.h"

struct env {
	struct vmd vmd;
	char root[64];
	char tdir[128];
	struct moat_vmm_ops ops; /* the fake, with reap_orphan counted */
};

static int reaped;
static char reaped_dir[512];

static bool
counting_reap_orphan(const char *dir, const char *id)
{
	(void)id;
	reaped++;
	snprintf(reaped_dir, sizeof(reaped_dir), "%s", dir);
	return true;
}

static int
setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	fake_node_init(&e->vmd, e->root, sizeof(e->root), "pool", "tcg", NULL);
	e->ops = fake_vmm_ops;
	e->ops.reap_orphan = counting_reap_orphan;
	e->vmd.vmm = &e->ops;
	e->vmd.cfg.vmm_pool = 2;
	e->vmd.cfg.templates = true;
	/* A template directory with the disk a pooled VMM gets a copy of. */
	snprintf(e->tdir, sizeof(e->tdir), "%s/tpl-1", e->root);
	assert_int_equal(moat_mkdir_p(e->tdir, 0700), 0);
	fake_node_touch(e->tdir, "scratch.ext4");
	fake_node_touch(e->tdir, "ram");
	reaped = 0;
	*state = e;
	return 0;
}

static int
teardown(void **state)
{
	struct env *e = *state;

	vmd_pool_fini(&e->vmd);
	e->vmd.vmm = &fake_vmm_ops;
	fake_node_fini(&e->vmd, e->root);
	free(e);
	return 0;
}

/* The register's entries: ids into ids[n][24], pids into pids[]. */
static int
reg_list(struct env *e, char ids[][24], pid_t *pids, int max)
{
	char path[512];
	struct dirent *de;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "%s/pool", e->vmd.cfg.state_dir);
	if ((d = opendir(path)) == NULL)
		return 0;
	while ((de = readdir(d)) != NULL && n < max) {
		char id[20], file[800], *text = NULL;
		size_t len;

		if (!vmd_pool_reg_name(de->d_name, id))
			continue;
		snprintf(ids[n], 24, "%s", id);
		snprintf(file, sizeof(file), "%s/%s", path, de->d_name);
		pids[n] = 0;
		if (moat_read_file(file, 64, &text, &len) == 0)
			pids[n] = (pid_t)atoi(text);
		free(text);
		n++;
	}
	closedir(d);
	return n;
}

/* Waits until the register has `want` entries, all started. */
static int
wait_reg(struct env *e, int want, char ids[][24], pid_t *pids)
{
	int n = 0;

	for (int i = 0; i < 500; i++) {
		bool started = true;

		n = reg_list(e, ids, pids, 8);
		for (int j = 0; j < n; j++)
			started = started && pids[j] > 0;
		if (n == want && started)
			return n;
		usleep(10 * 1000);
	}
	return n;
}

static bool
vm_dir_exists(struct env *e, const char *id)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/vms/%s", e->vmd.cfg.state_dir, id);
	return access(path, F_OK) == 0;
}

static bool
gone(pid_t pid)
{
	/* The fake's VMMs are this process's children: reaped by the
	 * pool, so no such child is left. */
	return waitpid(pid, NULL, WNOHANG) < 0;
}

static void
want_tpl(struct env *e)
{
	struct vmd_shape shape = { .image = "default",
		.vcpus = 1,
		.memory_mib = 128,
		.scratch_mib = 64 };

	vmd_pool_want(&e->vmd, "tpl-1", e->tdir, &shape, "tcg", false);
}

static void
test_reg_name(void **state)
{
	char id[20];

	(void)state;
	assert_true(vmd_pool_reg_name("sb-0123456789abcdef.pid", id));
	assert_string_equal(id, "sb-0123456789abcdef");
	assert_false(vmd_pool_reg_name("sb-0123456789abcdef.pid.tmp", id));
	assert_false(vmd_pool_reg_name("sb-0123456789ABCDEF.pid", id));
	assert_false(vmd_pool_reg_name("sb-0123456789abcde.pid", id));
	assert_false(vmd_pool_reg_name("tpl-0123456789abcd.pid", id));
	assert_false(vmd_pool_reg_name("../../etc/passwd", id));
}

static void
test_off(void **state)
{
	struct env *e = *state;
	struct moat_rpc_call call = { 0 };
	struct sandbox *sb;

	e->vmd.cfg.vmm_pool = 0;
	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	assert_null(e->vmd.pool);
	want_tpl(e); /* nothing happens */
	fake_node_call_init(&call);
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_false(vmd_pool_take(&e->vmd, "tpl-1", sb));
	assert_false(sb->from_pool);
	vmd_sandbox_put(sb);
	free(call.error_message);
}

static void
test_fill_take_refill(void **state)
{
	struct env *e = *state;
	struct moat_rpc_call call = { 0 };
	char ids[8][24], ids2[8][24];
	pid_t pids[8], pids2[8];
	struct sandbox *sb;
	char old_id[24];
	pid_t taken;
	int n;

	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	assert_non_null(e->vmd.pool);
	fake_node_call_init(&call);
	/* Nothing wanted yet: a take misses. */
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_false(vmd_pool_take(&e->vmd, "tpl-1", sb));
	vmd_sandbox_put(sb);

	want_tpl(e);
	assert_int_equal(wait_reg(e, 2, ids, pids), 2);
	assert_string_not_equal(ids[0], ids[1]);
	for (int i = 0; i < 2; i++) {
		char disk[512];

		assert_true(vm_dir_exists(e, ids[i]));
		snprintf(disk, sizeof(disk), "%s/vms/%s/scratch.ext4",
		    e->vmd.cfg.state_dir, ids[i]);
		assert_int_equal(access(disk, F_OK), 0);
		assert_int_equal(kill(pids[i], 0), 0);
	}

	/* A take: the sandbox is the pooled VMM's, which leaves the
	 * register (the pool then refills with a new id). */
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	snprintf(old_id, sizeof(old_id), "%s", sb->id.str);
	assert_true(vmd_pool_take(&e->vmd, "tpl-1", sb));
	assert_true(sb->from_pool);
	assert_non_null(sb->pooled);
	assert_string_not_equal(sb->id.str, old_id);
	assert_true(strcmp(sb->id.str, ids[0]) == 0 ||
	    strcmp(sb->id.str, ids[1]) == 0);
	assert_non_null(strstr(sb->dir, sb->id.str));
	taken = sb->pooled->pid;
	/* No refill until the create ends (vmd_pool_want). */
	usleep(100 * 1000);
	assert_int_equal(reg_list(e, ids2, pids2, 8), 1);
	want_tpl(e);
	assert_int_equal(wait_reg(e, 2, ids2, pids2), 2);
	for (int i = 0; i < 2; i++) {
		assert_string_not_equal(ids2[i], sb->id.str);
		assert_int_not_equal(pids2[i], taken);
	}
	/* Never run: the sandbox's end kills it and removes its files. */
	snprintf(old_id, sizeof(old_id), "%s", sb->id.str);
	vmd_sandbox_put(sb);
	assert_true(gone(taken));
	assert_false(vm_dir_exists(e, old_id));

	/* The template goes: so do its pooled VMMs, and no refill. */
	vmd_pool_forget(&e->vmd, "tpl-1");
	n = reg_list(e, ids, pids, 8);
	assert_int_equal(n, 0);
	for (int i = 0; i < 2; i++) {
		assert_true(gone(pids2[i]));
		assert_false(vm_dir_exists(e, ids2[i]));
	}
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_false(vmd_pool_take(&e->vmd, "tpl-1", sb));
	vmd_sandbox_put(sb);
	usleep(50 * 1000);
	assert_int_equal(reg_list(e, ids, pids, 8), 0);
	free(call.error_message);
}

/* Pooled VMMs count in the node's memory apart from its sandboxes':
 * made only while they fit beside them, handed over with the take (the
 * sandbox admits no more for it), given up whole for a sandbox that
 * needs the room (vmd_pool_shed), and not made again until the pool is
 * used again. */
static void
test_room(void **state)
{
	struct env *e = *state;
	struct moat_rpc_call call = { 0 };
	char ids[8][24];
	pid_t pids[8];
	struct sandbox *sb;

	/* Room for one pooled VMM of 128 MiB beside a sandbox's 128. */
	e->vmd.cfg.memory_mib_total = 300;
	e->vmd.memory_mib_reserved = 128;
	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	want_tpl(e);
	assert_int_equal(wait_reg(e, 1, ids, pids), 1);
	usleep(100 * 1000);
	assert_int_equal(reg_list(e, ids, pids, 8), 1);
	assert_int_equal(e->vmd.memory_mib_pooled, 128);
	assert_int_equal(e->vmd.memory_mib_reserved, 128);

	/* Given up for a sandbox: killed, its files and memory back. */
	assert_int_equal(vmd_pool_shed(&e->vmd), 1);
	assert_int_equal(e->vmd.memory_mib_pooled, 0);
	assert_int_equal(reg_list(e, ids, pids, 8), 0);
	assert_true(gone(pids[0]));
	assert_false(vm_dir_exists(e, ids[0]));
	usleep(100 * 1000);
	assert_int_equal(reg_list(e, ids, pids, 8), 0);

	/* Used again: it refills, and a take hands its memory over. */
	want_tpl(e);
	assert_int_equal(wait_reg(e, 1, ids, pids), 1);
	fake_node_call_init(&call);
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_true(vmd_pool_take(&e->vmd, "tpl-1", sb));
	assert_true(sb->memory_reserved);
	assert_int_equal(e->vmd.memory_mib_pooled, 0);
	assert_int_equal(e->vmd.memory_mib_reserved, 256);
	vmd_sandbox_unreserve(sb);
	assert_int_equal(e->vmd.memory_mib_reserved, 128);
	vmd_sandbox_put(sb);
	e->vmd.memory_mib_reserved = 0;
	free(call.error_message);
}

/* With ram-sharing = private a pooled VMM maps its source's RAM: its
 * memory counts in the node's, and in memory_mib_mapped, which the RAM
 * dir's admission leaves out; the take hands both to the sandbox. */
static void
test_room_mapped(void **state)
{
	struct env *e = *state;
	struct moat_rpc_call call = { 0 };
	char ids[8][24], *err = NULL;
	pid_t pids[8];
	struct sandbox *sb;

	assert_int_equal(vmd_ram_sharing_set("private", "/bin/sh", &err),
	    MOAT_OK);
	e->vmd.cfg.vmm_pool = 1;
	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	want_tpl(e);
	assert_int_equal(wait_reg(e, 1, ids, pids), 1);
	assert_int_equal(e->vmd.memory_mib_pooled, 128);
	assert_int_equal(e->vmd.memory_mib_mapped, 128);
	fake_node_call_init(&call);
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_true(vmd_pool_take(&e->vmd, "tpl-1", sb));
	assert_true(sb->memory_reserved);
	assert_true(sb->ram_mapped);
	assert_int_equal(e->vmd.memory_mib_pooled, 0);
	assert_int_equal(e->vmd.memory_mib_reserved, 128);
	assert_int_equal(e->vmd.memory_mib_mapped, 128);
	vmd_sandbox_unreserve(sb);
	assert_int_equal(e->vmd.memory_mib_reserved, 0);
	assert_int_equal(e->vmd.memory_mib_mapped, 0);
	vmd_sandbox_put(sb);
	/* Shed: its mapped memory goes with it. */
	want_tpl(e);
	assert_int_equal(wait_reg(e, 1, ids, pids), 1);
	assert_int_equal(e->vmd.memory_mib_mapped, 128);
	assert_int_equal(vmd_pool_shed(&e->vmd), 1);
	assert_int_equal(e->vmd.memory_mib_mapped, 0);
	assert_int_equal(e->vmd.memory_mib_pooled, 0);
	assert_int_equal(vmd_ram_sharing_set("copy", NULL, &err), MOAT_OK);
	free(call.error_message);
}

static void
test_fini_kills_all(void **state)
{
	struct env *e = *state;
	char ids[8][24];
	pid_t pids[8];

	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	want_tpl(e);
	assert_int_equal(wait_reg(e, 2, ids, pids), 2);
	vmd_pool_fini(&e->vmd);
	assert_null(e->vmd.pool);
	assert_int_equal(reg_list(e, ids, pids, 8), 0);
	for (int i = 0; i < 2; i++) {
		assert_true(gone(pids[i]));
		assert_false(vm_dir_exists(e, ids[i]));
	}
}

/* A template removed other than by vmd_pool_forget (its image went):
 * the refill thread finds it gone and empties its pool. */
static void
test_template_gone(void **state)
{
	struct env *e = *state;
	char ids[8][24];
	pid_t pids[8];
	int n = 2;

	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	want_tpl(e);
	assert_int_equal(wait_reg(e, 2, ids, pids), 2);
	assert_int_equal(moat_rm_rf(e->tdir), 0);
	for (int i = 0; i < 100 && n > 0; i++) {
		char more[8][24];
		pid_t mp[8];

		usleep(100 * 1000);
		n = reg_list(e, more, mp, 8);
	}
	assert_int_equal(n, 0);
	for (int i = 0; i < 2; i++) {
		assert_true(gone(pids[i]));
		assert_false(vm_dir_exists(e, ids[i]));
	}
}

/* A snapshot directory `name` under root with a meta, a disk and its
 * RAM: a link to a copy in <root>/<name>.ram, as in the RAM dir. */
static void
make_snapshot(struct env *e, const char *name, char *dir, size_t size)
{
	Moat__V1__LocalSnapshot m = MOAT__V1__LOCAL_SNAPSHOT__INIT;
	char copy[512], link[600];

	snprintf(dir, size, "%s/%s", e->root, name);
	assert_int_equal(moat_mkdir_p(dir, 0700), 0);
	fake_node_touch(dir, "scratch.ext4");
	snprintf(copy, sizeof(copy), "%s.ram", name);
	fake_node_touch(e->root, copy);
	snprintf(copy, sizeof(copy), "%s/%s.ram", e->root, name);
	snprintf(link, sizeof(link), "%s/ram", dir);
	assert_int_equal(symlink(copy, link), 0);
	m.snapshot_id = (char *)name;
	m.image = "default";
	assert_int_equal(vmd_snapshot_write_meta(dir, &m), 0);
}

/* A snapshot whose RAM copy is evicted to disk (its link in the
 * snapshot directory dangles): its pooled VMMs, which would keep that
 * RAM in memory, are killed by the refill thread. */
static void
test_snapshot_evicted(void **state)
{
	struct env *e = *state;
	struct vmd_shape shape = { .image = "default",
		.vcpus = 1,
		.memory_mib = 128,
		.scratch_mib = 64 };
	char dir[512], copy[600], ids[8][24];
	pid_t pids[8];
	int n = 2;

	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	make_snapshot(e, "snap-ev", dir, sizeof(dir));
	vmd_pool_want(&e->vmd, "snap-ev", dir, &shape, "tcg", true);
	assert_int_equal(wait_reg(e, 2, ids, pids), 2);
	snprintf(copy, sizeof(copy), "%s/snap-ev.ram", e->root);
	assert_int_equal(unlink(copy), 0);
	for (int i = 0; i < 100 && n > 0; i++) {
		char more[8][24];
		pid_t mp[8];

		usleep(100 * 1000);
		n = reg_list(e, more, mp, 8);
	}
	assert_int_equal(n, 0);
	for (int i = 0; i < 2; i++)
		assert_true(gone(pids[i]));
}

/* Snapshots get pools too (restores and forks), the 4 most recently
 * wanted only: a 5th empties the oldest's. A snapshot without a meta
 * gets none (its files cannot be verified). */
static void
test_snapshot_pools(void **state)
{
	struct env *e = *state;
	struct vmd_shape shape = { .image = "default",
		.vcpus = 1,
		.memory_mib = 128,
		.scratch_mib = 64 };
	struct moat_rpc_call call = { 0 };
	char ids[8][24], first_ids[8][24];
	pid_t pids[8], first_pids[8];
	char dir[256], name[32];
	struct sandbox *sb;
	int n = 0;

	e->vmd.cfg.vmm_pool = 1;
	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	for (int i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "snap-test-%d", i);
		make_snapshot(e, name, dir, sizeof(dir));
		vmd_pool_want(&e->vmd, name, dir, &shape, "tcg", true);
		usleep(20 * 1000); /* distinct want times */
	}
	assert_int_equal(wait_reg(e, 4, first_ids, first_pids), 4);
	/* A 5th: the oldest (snap-test-0) loses its pool. */
	make_snapshot(e, "snap-test-4", dir, sizeof(dir));
	vmd_pool_want(&e->vmd, "snap-test-4", dir, &shape, "tcg", true);
	for (int i = 0; i < 300; i++) {
		bool started = true;

		n = reg_list(e, ids, pids, 8);
		for (int j = 0; j < n; j++)
			started = started && pids[j] > 0;
		if (n == 4 && started) {
			bool has_new = false;

			for (int j = 0; j < n; j++) {
				bool old = false;

				for (int k = 0; k < 4; k++)
					old = old ||
					    strcmp(ids[j], first_ids[k]) == 0;
				has_new = has_new || !old;
			}
			if (has_new)
				break;
		}
		usleep(10 * 1000);
	}
	assert_int_equal(n, 4);
	fake_node_call_init(&call);
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_false(vmd_pool_take(&e->vmd, "snap-test-0", sb));
	assert_true(vmd_pool_take(&e->vmd, "snap-test-4", sb));
	assert_true(sb->from_pool);
	vmd_sandbox_put(sb);
	/* No meta: nothing pooled. */
	snprintf(dir, sizeof(dir), "%s/snap-bad", e->root);
	assert_int_equal(moat_mkdir_p(dir, 0700), 0);
	vmd_pool_want(&e->vmd, "snap-bad", dir, &shape, "tcg", true);
	usleep(800 * 1000);
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_false(vmd_pool_take(&e->vmd, "snap-bad", sb));
	vmd_sandbox_put(sb);
	free(call.error_message);
}

static void
test_start_fails(void **state)
{
	struct env *e = *state;
	struct moat_rpc_call call = { 0 };
	char ids[8][24];
	pid_t pids[8];
	struct sandbox *sb;

	fake_script.restore_fails = true;
	assert_int_equal(vmd_pool_init(&e->vmd), MOAT_OK);
	want_tpl(e);
	usleep(200 * 1000);
	/* Logged, nothing left, and a create misses (it starts its own). */
	assert_int_equal(reg_list(e, ids, pids, 8), 0);
	fake_node_call_init(&call);
	sb = fake_node_sandbox(&e->vmd, &call, 0);
	assert_false(vmd_pool_take(&e->vmd, "tpl-1", sb));
	vmd_sandbox_put(sb);
	free(call.error_message);
	fake_script.restore_fails = false;
}

static void
test_reap_leftovers(void **state)
{
	struct env *e = *state;
	char path[512], dir[512];
	char ids[8][24];
	pid_t pids[8];

	/* What a killed vmd leaves: a register entry and its directory. */
	snprintf(path, sizeof(path), "%s/pool", e->vmd.cfg.state_dir);
	assert_int_equal(moat_mkdir_p(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/pool/sb-00000000000000aa.pid",
	    e->vmd.cfg.state_dir);
	assert_int_equal(moat_write_file_atomic(path, "12345\n", 6, 0600), 0);
	snprintf(dir, sizeof(dir), "%s/vms/sb-00000000000000aa",
	    e->vmd.cfg.state_dir);
	assert_int_equal(moat_mkdir_p(dir, 0700), 0);
	fake_node_touch(dir, "qemu.pid");
	/* And a half-written entry. */
	snprintf(path, sizeof(path), "%s/pool/sb-00000000000000bb.pid.tmp",
	    e->vmd.cfg.state_dir);
	assert_int_equal(moat_write_file_atomic(path, "0\n", 2, 0600), 0);

	assert_int_equal(vmd_pool_reap_leftovers(&e->vmd), 1);
	assert_int_equal(reaped, 1);
	assert_string_equal(reaped_dir, dir);
	assert_int_equal(access(dir, F_OK), -1);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(reg_list(e, ids, pids, 8), 0);
	/* Nothing there: nothing done. */
	assert_int_equal(vmd_pool_reap_leftovers(&e->vmd), 0);
	assert_int_equal(reaped, 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reg_name),
		cmocka_unit_test_setup_teardown(test_off, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fill_take_refill, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_room, setup, teardown),
		cmocka_unit_test_setup_teardown(test_room_mapped, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_fini_kills_all, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_template_gone, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_snapshot_evicted, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_snapshot_pools, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_start_fails, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_reap_leftovers, setup,
		    teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	if (moat_spawner_start() != 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
