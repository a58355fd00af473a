/*
 * test_bounds.c: a node's bounds (issue 14) without a real VMM: the
 * accelerator rule (a fake "no KVM": accel=auto refuses TCG without
 * allow-tcg, before any VMM starts, naming the key), the exec output
 * budget (a stream past it ends with the marker and nothing more is
 * kept; freeing gives it back), scratch admission against free space
 * and the reserve, and the capped console (rotation keeps the newest
 * bytes, and vmd_log_tail reads across the two files). The fake driver
 * (fake_vmm.c) stands in for the VMM. Not for: real guests
 * (tests/integration/vm/test_bound.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_node.h"
#include "fake_vmm.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "accel.h"
#include "console.h"
#include "exec.h"
#include "node.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "scratch.h"
#include "snapram.h"
#include "spawn.h"
#include "vmhost.h"

struct env {
	struct vmd vmd;
	char root[64];
	struct moat_rpc_call call;
};

/* A node with the fake driver, accel=auto and a KVM device that does
 * not exist: the fake "no KVM". allow-tcg stays false. */
static int
setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	fake_node_init(&e->vmd, e->root, sizeof(e->root), "bounds", "auto",
	    "/nonexistent/kvm");
	e->vmd.cfg.exec_output_budget = 64 * 1024;
	fake_node_call_init(&e->call);
	*state = e;
	return 0;
}

static int
teardown(void **state)
{
	struct env *e = *state;

	fake_node_fini(&e->vmd, e->root);
	free(e->call.error_message);
	free(e);
	return 0;
}

static struct sandbox *
new_sandbox(struct env *e)
{
	return fake_node_sandbox(&e->vmd, &e->call, 0);
}

/* ---- accel ---- */

static void
test_accel_refuses_tcg(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = NULL;
	char cur[8];
	char *why = NULL;

	vmd_accel_current(&e->vmd, cur);
	assert_string_equal(cur, "tcg"); /* no KVM: decided at init */
	assert_int_equal(vmd_accel_permit(&e->vmd, "tcg", &why),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(why, "allow-tcg"));
	assert_non_null(strstr(why, "/nonexistent/kvm"));
	free(why);
	assert_int_equal(vmd_accel_permit(&e->vmd, "kvm", &why), MOAT_OK);
	assert_int_equal(vmd_accel_permit(&e->vmd, "", &why), MOAT_OK);

	/* A create is refused before anything is made or started. */
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call,
	                     new_sandbox(e), NULL, NULL, BRING_UP_LISTED, NULL,
	                     &sb),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(e->call.error_message, "allow-tcg"));
	assert_int_equal(fake_vmm_starts(), 0);
	assert_int_equal(e->vmd.memory_mib_reserved, 0);
	/* So is a restore of a snapshot taken under TCG. */
	free(e->call.error_message);
	e->call.error_message = NULL;
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call,
	                     new_sandbox(e), e->root, "tcg", BRING_UP_LISTED,
	                     NULL, &sb),
	    MOAT_FAILED_PRECONDITION);
	assert_int_equal(fake_vmm_starts(), 0);

	/* allow-tcg = true, or accel = tcg said outright: permitted. */
	e->vmd.cfg.allow_tcg = true;
	assert_int_equal(vmd_accel_permit(&e->vmd, "tcg", &why), MOAT_OK);
	e->vmd.cfg.allow_tcg = false;
	e->vmd.cfg.accel = "tcg";
	assert_int_equal(vmd_accel_permit(&e->vmd, "tcg", &why), MOAT_OK);
	e->vmd.cfg.accel = "kvm";
	assert_int_equal(vmd_accel_permit(&e->vmd, "tcg", &why),
	    MOAT_FAILED_PRECONDITION);
	free(why);
}

/* ---- exec output budget ---- */

static void
output(struct sandbox *sb, uint64_t id, size_t len)
{
	static uint8_t data[16384];
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecOutput o = MOAT__V1__EXEC_OUTPUT__INIT;
	char *why = NULL;

	memset(data, 'o', sizeof(data));
	m.id = id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT;
	m.exec_output = &o;
	o.stream = MOAT__V1__STREAM__STREAM_STDOUT;
	while (len > 0) {
		o.data.data = data;
		o.data.len = len < sizeof(data) ? len : sizeof(data);
		len -= o.data.len;
		assert_int_equal(vmd_exec_on_message(sb, &m, &why), 0);
	}
}

static struct exec *
add_exec(struct sandbox *sb, uint64_t id)
{
	struct exec *x = calloc(1, sizeof(*x));

	assert_non_null(x);
	x->id = id;
	x->out[0].cap = x->out[1].cap = 1 << 20;
	x->next = sb->execs;
	sb->execs = x;
	sb->execs_running++;
	return x;
}

static void
test_exec_budget(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e);
	const char *mark = "exec-output-budget-mib";
	struct exec *a = add_exec(sb, 1), *b = add_exec(sb, 2);

	vmd_exec_register(&e->vmd);
	/* a takes 24 KiB (32 KiB allocated) of the 64 KiB budget, b would
	 * take 100 KiB: it keeps at most the 32 KiB left. */
	output(sb, 1, 24 * 1024);
	assert_false(a->out[0].truncated);
	output(sb, 2, 100 * 1024);
	assert_true(b->out[0].truncated);
	assert_true(b->out[0].budget_cut);
	assert_true(b->out[0].len >= 16 * 1024);
	assert_true(b->out[0].len <= 32 * 1024 + 256);
	assert_non_null(
	    memmem(b->out[0].buf, b->out[0].len, mark, strlen(mark)));
	/* Within the budget but for the markers' few bytes. */
	assert_true(e->vmd.exec_output_used <= 64 * 1024 + 256);
	assert_int_equal(e->vmd.exec_output_cut, 1);
	/* Once cut, nothing more is kept even when room comes back. */
	output(sb, 2, 1024);
	assert_true(b->out[0].received == 101 * 1024);
	/* Freeing gives the budget back. */
	vmd_sandbox_put(sb); /* frees the execs */
	assert_int_equal(e->vmd.exec_output_used, 0);
}

/* ---- scratch admission ---- */

static void
test_scratch_admit(void **state)
{
	struct env *e = *state;
	struct statvfs fs;
	uint64_t avail;
	char *why = NULL;

	assert_int_equal(statvfs(e->vmd.cfg.state_dir, &fs), 0);
	avail = (uint64_t)fs.f_bavail * fs.f_frsize;
	e->vmd.cfg.disk_reserve_bytes =
	    avail > (256u << 20) ? avail - (256u << 20) : 0;
	/* 128 MiB fits, twice not (the first still being made). */
	assert_int_equal(vmd_scratch_admit(&e->vmd, 128u << 20, &why),
	    MOAT_OK);
	assert_int_equal(vmd_scratch_admit(&e->vmd, 192u << 20, &why),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(why, "disk-reserve-mib"));
	assert_non_null(strstr(why, "MiB free"));
	free(why);
	vmd_scratch_admit_done(&e->vmd, 128u << 20);
	/* A sparse file under vms/ counts at its full size. */
	{
		char *dir = moat_asprintf("%s/vms/sb-1", e->vmd.cfg.state_dir);
		char *f = moat_asprintf("%s/scratch.ext4", dir);
		int fd;

		assert_int_equal(moat_mkdir_p(dir, 0700), 0);
		assert_true((fd = open(f, O_CREAT | O_WRONLY, 0600)) >= 0);
		assert_int_equal(ftruncate(fd, 192 << 20), 0);
		close(fd);
		assert_int_equal(vmd_scratch_admit(&e->vmd, 128u << 20, &why),
		    MOAT_RESOURCE_EXHAUSTED);
		free(why);
		unlink(f);
		assert_int_equal(vmd_scratch_admit(&e->vmd, 128u << 20, &why),
		    MOAT_OK);
		vmd_scratch_admit_done(&e->vmd, 128u << 20);
		free(f);
		free(dir);
	}
}

/* ---- console ---- */

static void
test_console_rotates(void **state)
{
	struct env *e = *state;
	char *path = moat_asprintf("%s/console.log", e->root);
	char *older = moat_asprintf("%s/console.log.1", e->root);
	struct vmd_console *c = NULL;
	char *errmsg = NULL, *tail;
	char line[64];
	uint64_t written, dropped;
	struct stat a, b;
	int fd;

	assert_int_equal(vmd_console_open(path, 32 * 1024, &c, &fd, &errmsg),
	    MOAT_OK);
	assert_true(fd > 2);
	for (int i = 0; i < 20000; i++) {
		int n = snprintf(line, sizeof(line), "line %05d\n", i);

		assert_int_equal(write(fd, line, (size_t)n), n);
	}
	close(fd);
	vmd_console_settle(c, 2000);
	vmd_console_bytes(c, &written, &dropped);
	assert_int_equal(written, 20000 * 11);
	assert_int_equal(dropped, 0);
	vmd_console_close(c);
	assert_int_equal(stat(path, &a), 0);
	assert_int_equal(stat(older, &b), 0);
	assert_true(a.st_size + b.st_size <= 32 * 1024);
	assert_int_equal(b.st_size, 16 * 1024);
	assert_int_equal(a.st_mode & 0777, 0600);
	/* The tail spans both files when the newer is short. */
	tail = vmd_log_tail(path, 2000);
	assert_non_null(strstr(tail, "line 19999"));
	assert_true(strlen(tail) > (size_t)a.st_size);
	free(tail);
	free(path);
	free(older);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_accel_refuses_tcg, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_exec_budget, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_scratch_admit, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_console_rotates, setup,
		    teardown),
	};

	if (moat_spawner_start() != 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
