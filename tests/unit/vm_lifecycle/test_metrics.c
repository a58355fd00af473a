/*
 * test_metrics.c: vmd's metrics (services/vm/metrics.c) against the fake
 * driver: a cold boot, a restore and a boot that fails move the boot
 * histogram and the failure counter of their kind; a scrape reads the
 * sandboxes by state, vCPUs and memory from the node's table and the
 * RAM dir figures through the hook; the listener answers GET /metrics
 * and nothing is counted while metrics are off. Not for: the registry
 * itself (tests/unit/lib/test_metrics.c) or real guests
 * (tests/integration/stack/metrics_test.py).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_node.h"
#include "fake_vmm.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "metrics.h"
#include "node.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "spawn.h"

struct env {
	struct vmd vmd;
	char root[64];
	char snap_dir[128];
	struct moat_rpc_call call;
};

static int
setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	fake_node_init(&e->vmd, e->root, sizeof(e->root), "metrics", "tcg",
	    "/dev/null");
	snprintf(e->snap_dir, sizeof(e->snap_dir), "%s/snap", e->root);
	assert_int_equal(moat_mkdir_p(e->snap_dir, 0700), 0);
	fake_node_touch(e->snap_dir, MOAT_VMM_SNAP_SCRATCH);
	fake_node_call_init(&e->call);
	*state = e;
	return 0;
}

static int
teardown(void **state)
{
	struct env *e = *state;

	vmd_metrics_stop();
	fake_node_fini(&e->vmd, e->root);
	free(e->call.error_message);
	free(e);
	return 0;
}

/* The hook a scrape reads the RAM dir through (vmd_snapram_fill in
 * moat-vmd): fixed figures. */
static void
node_fill(struct vmd *vmd, Moat__V1__Node *node)
{
	(void)vmd;
	node->ram_dir_capacity_bytes = 123456;
	node->snapshot_ram_budget_bytes = 789;
	node->snapshot_evictions = 5;
	node->snapshots_in_ram = 2;
}

/* has: `line` (a whole sample line) is in the scrape. */
static bool
has(const char *line)
{
	char *text = vmd_metrics_text(), *want = moat_asprintf("\n%s\n", line);
	bool found = text != NULL && strstr(text, want) != NULL;

	if (!found)
		fprintf(stderr, "not in the scrape: %s\n", line);
	free(text);
	free(want);
	return found;
}

static struct sandbox *
bring_up(struct env *e, const char *snap_dir, int want)
{
	struct sandbox *sb = fake_node_sandbox(&e->vmd, &e->call, 2000);
	struct sandbox *out = NULL;

	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb, snap_dir,
	                     snap_dir ? "tcg" : NULL, BRING_UP_LISTED, NULL,
	                     &out),
	    want);
	free(e->call.error_message);
	e->call.error_message = NULL;
	return out;
}

static void
test_off_counts_nothing(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = bring_up(e, NULL, MOAT_OK);

	assert_null(vmd_metrics_text());
	vmd_metrics_boot(VMD_BOOT_COLD, 5); /* no metrics: nothing happens */
	vmd_metrics_push(true, 1, 2, 3);
	vmd_sandbox_put(sb);
}

static void
test_boots_and_node_figures(void **state)
{
	struct env *e = *state;
	struct sandbox *a, *b;
	char *errmsg = NULL;

	assert_int_equal(vmd_metrics_start(&e->vmd, "127.0.0.1:0", node_fill,
	                     &errmsg),
	    MOAT_OK);
	assert_true(has("moat_vmd_boot_seconds_count{kind=\"cold\"} 0"));
	a = bring_up(e, NULL, MOAT_OK);
	b = bring_up(e, e->snap_dir, MOAT_OK);
	fake_script.start_fails = true;
	assert_null(bring_up(e, NULL, MOAT_INTERNAL));
	fake_script.start_fails = false;
	fake_script.restore_fails = true;
	assert_null(bring_up(e, e->snap_dir, MOAT_UNAVAILABLE));
	fake_script.restore_fails = false;

	assert_true(has("moat_vmd_boot_seconds_count{kind=\"cold\"} 1"));
	assert_true(has("moat_vmd_boot_seconds_count{kind=\"restore\"} 1"));
	assert_true(has("moat_vmd_boot_seconds_bucket{kind=\"cold\","
	                "le=\"+Inf\"} 1"));
	assert_true(has("moat_vmd_boot_failures_total{kind=\"cold\"} 1"));
	assert_true(has("moat_vmd_boot_failures_total{kind=\"restore\"} 1"));
	assert_true(has("moat_vmd_sandboxes{state=\"running\"} 2"));
	assert_true(has("moat_vmd_sandboxes{state=\"creating\"} 0"));
	assert_true(has("moat_vmd_vcpus_total 8"));
	assert_true(has("moat_vmd_vcpus_used 2"));
	assert_true(has("moat_vmd_memory_reserved_bytes 268435456"));
	assert_true(has("moat_vmd_memory_total_bytes 4294967296"));
	assert_true(has("moat_vmd_ram_dir_capacity_bytes 123456"));
	assert_true(has("moat_vmd_snapshot_ram_budget_bytes 789"));
	assert_true(has("moat_vmd_snapshot_evictions_total 5"));
	assert_true(has("moat_vmd_snapshots{location=\"ram\"} 2"));

	vmd_metrics_snapshot_pause(false, 12.5);
	vmd_metrics_restore(40, true);
	vmd_metrics_push(true, 30, 1000, 4000);
	vmd_metrics_push(false, 30, 0, 0);
	assert_true(has("moat_vmd_snapshot_pause_seconds_sum{kind="
	                "\"snapshot\"} 0.0125"));
	assert_true(has("moat_vmd_restores_total{source=\"snapd\"} 1"));
	assert_true(has("moat_vmd_restore_seconds_bucket{le=\"0.05\"} 1"));
	assert_true(has("moat_vmd_pushes_total{result=\"ok\"} 1"));
	assert_true(has("moat_vmd_pushes_total{result=\"failed\"} 1"));
	assert_true(has("moat_vmd_push_stored_bytes_total 1000"));
	assert_true(has("moat_vmd_push_logical_bytes_total 4000"));
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, a->id.str),
	    MOAT_OK);
	assert_true(has("moat_vmd_sandboxes{state=\"running\"} 1"));
	vmd_sandbox_put(a);
	vmd_sandbox_put(b);
	vmd_metrics_stop();
	assert_null(vmd_metrics_text());
	vmd_metrics_stop(); /* twice is fine */
}

static void
test_bad_address(void **state)
{
	struct env *e = *state;
	char *errmsg = NULL;

	assert_int_equal(vmd_metrics_start(&e->vmd, "localhost", node_fill,
	                     &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(errmsg, "HOST:PORT"));
	free(errmsg);
	assert_null(vmd_metrics_text());
}

int
main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_off_counts_nothing),
		T(test_boots_and_node_figures),
		T(test_bad_address),
	};
#undef T
	int rv;

	/* As moat-vmd does: the fake agent may write to a link vmd has
	 * closed (the restore that fails). */
	signal(SIGPIPE, SIG_IGN);
	/* mkfs.ext4 for the scratch disks runs through vmd's spawner. */
	if (moat_spawner_start() != 0) {
		fprintf(stderr, "cannot start the spawner\n");
		return 1;
	}
	rv = cmocka_run_group_tests(tests, NULL, NULL);
	moat_spawner_stop();
	return rv;
}
