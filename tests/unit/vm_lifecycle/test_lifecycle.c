/*
 * test_lifecycle.c: a sandbox's lifecycle (services/vm/sandbox_state.h)
 * against the fake VMM driver: every cell of the transition table on its
 * own, then each path through real sandbox code: boot, boot timeout and
 * retry, a VMM that does not start or dies while booting, restore and
 * its failures, restore in place, destroy while creating and while
 * snapshotting, a relink, the agent lost and the VMM dying while it
 * runs, and illegal events refused. The state is asserted after every
 * event. Not for: a real VMM or guest (tests/integration/vm).
 */
#include <errno.h>
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
#include <unistd.h>

#include <cmocka.h>

#include "fake_node.h"
#include "fake_vmm.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "accel.h"
#include "node.h"
#include "sandbox.h"
#include "sandbox_boot.h"
#include "sandbox_state.h"
#include "sandbox_supervise.h"
#include "snapram.h"
#include "spawn.h"
#include "sync.h"

#define CREATING MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING
#define RUNNING MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING
#define FAILED MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED
#define STOPPED MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED

/* ---- the table alone ---- */

/* The table as sandbox_state.h draws it: the target state, or -1 for
 * ignored, -2 for refused. */
static const int expected[SANDBOX_N_STATES][SANDBOX_N_EVENTS] = {
	/* BOOTED, GAVE_UP, FAIL, DESTROY, SNAP_B, SNAP_E, RELN_B, RELN_E */
	[SANDBOX_BOOTING] = { SANDBOX_RUNNING, SANDBOX_STOPPED, -1,
	    SANDBOX_ABORTING, -2, -2, -2, -2 },
	[SANDBOX_ABORTING] = { -2, SANDBOX_STOPPED, -1, -1, -2, -2, -2, -2 },
	[SANDBOX_RUNNING] = { -2, SANDBOX_STOPPED, SANDBOX_FAILED,
	    SANDBOX_STOPPED, SANDBOX_SNAPSHOTTING, -2, -2, -2 },
	[SANDBOX_SNAPSHOTTING] = { -2, -2, SANDBOX_FAILED, SANDBOX_STOPPED, -2,
	    SANDBOX_RUNNING, SANDBOX_RELINKING, -2 },
	[SANDBOX_RELINKING] = { -2, -2, SANDBOX_FAILED, SANDBOX_STOPPED, -2,
	    -2, -2, SANDBOX_SNAPSHOTTING },
	[SANDBOX_FAILED] = { -2, SANDBOX_STOPPED, -1, SANDBOX_STOPPED, -2, -1,
	    -1, -1 },
	[SANDBOX_STOPPED] = { -2, -1, -1, -1, -2, -1, -1, -1 },
};

static void
test_table_every_cell(void **state)
{
	(void)state;
	for (int s = 0; s < SANDBOX_N_STATES; s++) {
		for (int e = 0; e < SANDBOX_N_EVENTS; e++) {
			enum sandbox_state to;
			enum sandbox_step step =
			    vmd_sandbox_state_next(s, e, &to);

			if (expected[s][e] >= 0) {
				assert_int_equal(step, SANDBOX_STEP_MOVED);
				assert_int_equal(to, expected[s][e]);
			} else {
				assert_int_equal(step,
				    expected[s][e] == -1 ?
				        SANDBOX_STEP_IGNORED :
				        SANDBOX_STEP_REFUSED);
				assert_int_equal(to, s);
			}
		}
	}
	/* Out of range is refused, never read past the table. */
	{
		enum sandbox_state to;

		assert_int_equal(vmd_sandbox_state_next(SANDBOX_N_STATES, 0,
		                     &to),
		    SANDBOX_STEP_REFUSED);
		assert_int_equal(vmd_sandbox_state_next(SANDBOX_RUNNING,
		                     SANDBOX_N_EVENTS, &to),
		    SANDBOX_STEP_REFUSED);
		assert_int_equal(to, SANDBOX_RUNNING);
	}
}

static void
test_api_mapping(void **state)
{
	(void)state;
	assert_int_equal(vmd_sandbox_state_api(SANDBOX_BOOTING), CREATING);
	assert_int_equal(vmd_sandbox_state_api(SANDBOX_ABORTING), CREATING);
	assert_int_equal(vmd_sandbox_state_api(SANDBOX_RUNNING), RUNNING);
	assert_int_equal(vmd_sandbox_state_api(SANDBOX_SNAPSHOTTING), RUNNING);
	assert_int_equal(vmd_sandbox_state_api(SANDBOX_RELINKING), RUNNING);
	assert_int_equal(vmd_sandbox_state_api(SANDBOX_FAILED), FAILED);
	assert_int_equal(vmd_sandbox_state_api(SANDBOX_STOPPED), STOPPED);
	assert_true(vmd_sandbox_state_live(SANDBOX_RELINKING));
	assert_false(vmd_sandbox_state_live(SANDBOX_ABORTING));
	assert_false(vmd_sandbox_state_live(SANDBOX_FAILED));
}

/* ---- a node with the fake driver ---- */

struct env {
	struct vmd vmd;
	char root[64];
	char snap_dir[128]; /* a snapshot directory to restore */
	struct moat_rpc_call call;
};

static int
setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	fake_node_init(&e->vmd, e->root, sizeof(e->root), "lifecycle", "tcg",
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

	fake_node_fini(&e->vmd, e->root);
	assert_int_equal(e->vmd.memory_mib_reserved, 0);
	free(e->call.error_message);
	free(e);
	return 0;
}

/* A new sandbox of 128 MiB with `boot_timeout_ms`, plus the test's own
 * reference (*mine) so its state can be read after a failure. */
static struct sandbox *
new_sandbox(struct env *e, uint32_t boot_timeout_ms)
{
	struct sandbox *sb =
	    fake_node_sandbox(&e->vmd, &e->call, boot_timeout_ms);

	assert_int_equal(sb->lifecycle, SANDBOX_BOOTING);
	pthread_mutex_lock(&e->vmd.mu);
	sb->refs++; /* the test's */
	pthread_mutex_unlock(&e->vmd.mu);
	return sb;
}

static enum sandbox_state
state_of(struct sandbox *sb)
{
	enum sandbox_state s;

	pthread_mutex_lock(&sb->mu);
	s = sb->lifecycle;
	pthread_mutex_unlock(&sb->mu);
	return s;
}

/* Waits up to 5 s for sb to reach `want`. */
static enum sandbox_state
wait_state(struct sandbox *sb, enum sandbox_state want)
{
	uint64_t until = moat_rpc_now_ms() + 5000;
	enum sandbox_state s;

	pthread_mutex_lock(&sb->mu);
	while (sb->lifecycle != want &&
	    vmd_cond_wait_until(&sb->cv, &sb->mu, until) == 0)
		;
	s = sb->lifecycle;
	pthread_mutex_unlock(&sb->mu);
	return s;
}

/* Waits up to 2 s for the node's reserved memory to be `want` MiB. */
static uint64_t
wait_reserved(struct env *e, uint64_t want)
{
	uint64_t until = moat_rpc_now_ms() + 2000;
	uint64_t got;

	for (;;) {
		pthread_mutex_lock(&e->vmd.mu);
		got = e->vmd.memory_mib_reserved;
		pthread_mutex_unlock(&e->vmd.mu);
		if (got == want || moat_rpc_now_ms() >= until)
			return got;
		vmd_sleep_ms(5);
	}
}

static enum sandbox_step
step(struct sandbox *sb, enum sandbox_event ev)
{
	enum sandbox_step r;

	pthread_mutex_lock(&sb->mu);
	r = vmd_sandbox_step(sb, ev);
	pthread_mutex_unlock(&sb->mu);
	return r;
}

static void
clear_error(struct env *e)
{
	free(e->call.error_message);
	e->call.error_message = NULL;
}

/* Boots a listed sandbox that runs. */
static struct sandbox *
boot_running(struct env *e)
{
	struct sandbox *sb = new_sandbox(e, 0);
	struct sandbox *out = NULL;

	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb, NULL,
	                     NULL, BRING_UP_LISTED, NULL, &out),
	    MOAT_OK);
	assert_ptr_equal(out, sb);
	vmd_sandbox_put(out); /* bring-up's; the test keeps its own */
	assert_int_equal(state_of(sb), SANDBOX_RUNNING);
	pthread_mutex_lock(&sb->mu);
	assert_int_equal(vmd_sandbox_api_state(sb), RUNNING);
	pthread_mutex_unlock(&sb->mu);
	return sb;
}

/* ---- boot ---- */

static void
test_boot_then_destroy(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);

	assert_int_equal(fake_vmm_starts(), 1);
	assert_int_equal(e->vmd.memory_mib_reserved, 128);
	/* RUNNING + DESTROY -> STOPPED */
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, sb->id.str),
	    MOAT_OK);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_int_equal(e->vmd.memory_mib_reserved, 0);
	/* A second destroy finds nothing. */
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, sb->id.str),
	    MOAT_NOT_FOUND);
	vmd_sandbox_put(sb);
}

static void
test_boot_timeout_retries_once(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 300);
	struct sandbox *out = NULL;

	fake_script.agent = FAKE_AGENT_SILENT;
	/* BOOTING + GAVE_UP -> STOPPED, after two attempts. */
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb, NULL,
	                     NULL, BRING_UP_LISTED, NULL, &out),
	    MOAT_UNAVAILABLE);
	assert_null(out);
	assert_int_equal(fake_vmm_starts(), 2);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_non_null(strstr(e->call.error_message,
	    "did not answer "
	    "within 300 ms"));
	assert_false(sb->listed);
	assert_int_equal(e->vmd.memory_mib_reserved, 0);
	vmd_sandbox_put(sb);
}

static void
test_boot_vmm_does_not_start(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 0);
	struct sandbox *out = NULL;

	fake_script.start_fails = true;
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb, NULL,
	                     NULL, BRING_UP_LISTED, NULL, &out),
	    MOAT_INTERNAL);
	assert_int_equal(fake_vmm_starts(), 0);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_non_null(strstr(e->call.error_message, "told to fail"));
	vmd_sandbox_put(sb);
}

static void
test_boot_vmm_exits(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 2000);
	struct sandbox *out = NULL;

	fake_script.vmm_exits = true;
	fake_script.agent = FAKE_AGENT_SILENT;
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb, NULL,
	                     NULL, BRING_UP_LISTED, NULL, &out),
	    MOAT_UNAVAILABLE);
	assert_int_equal(fake_vmm_starts(), 2);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_non_null(strstr(e->call.error_message, "exit status 3"));
	vmd_sandbox_put(sb);
}

static void
test_boot_agent_hangs_up(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 2000);
	struct sandbox *out = NULL;

	fake_script.agent = FAKE_AGENT_CLOSES;
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb, NULL,
	                     NULL, BRING_UP_LISTED, NULL, &out),
	    MOAT_UNAVAILABLE);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	vmd_sandbox_put(sb);
}

/* ---- destroy while creating ---- */

struct bringer {
	struct env *e;
	struct sandbox *sb;
	int rv;
};

static void *
bringer_main(void *arg)
{
	struct bringer *b = arg;
	struct sandbox *out = NULL;

	b->rv = vmd_sandbox_bring_up(&b->e->vmd, &b->e->call, b->sb, NULL,
	    NULL, BRING_UP_LISTED, NULL, &out);
	if (out != NULL)
		vmd_sandbox_put(out);
	return NULL;
}

static void
test_destroy_while_creating(void **state)
{
	struct env *e = *state;
	struct bringer b = { .e = e };
	uint64_t t0, until;
	pthread_t t;
	bool started = false;

	fake_script.agent = FAKE_AGENT_SILENT;
	b.sb = new_sandbox(e, 20000);
	assert_int_equal(pthread_create(&t, NULL, bringer_main, &b), 0);
	until = moat_rpc_now_ms() + 5000;
	while (!started && moat_rpc_now_ms() < until) {
		pthread_mutex_lock(&b.sb->mu);
		started = b.sb->vmm.pid > 0 && b.sb->link != NULL;
		pthread_mutex_unlock(&b.sb->mu);
		if (!started)
			vmd_sleep_ms(5);
	}
	assert_true(started);
	assert_int_equal(state_of(b.sb), SANDBOX_BOOTING);
	/* BOOTING + DESTROY -> ABORTING; the creator gives up:
	 * ABORTING + GAVE_UP -> STOPPED, long before the boot deadline. */
	t0 = moat_rpc_now_ms();
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, b.sb->id.str),
	    MOAT_OK);
	assert_true(moat_rpc_now_ms() - t0 < 5000);
	assert_int_equal(state_of(b.sb), SANDBOX_STOPPED);
	pthread_join(t, NULL);
	assert_int_equal(b.rv, MOAT_ABORTED);
	assert_int_equal(fake_vmm_starts(), 1);
	vmd_sandbox_put(b.sb);
}

static void
test_abort_booting_hidden(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 0);

	/* A hidden sandbox that has not started yet: abort is
	 * BOOTING + DESTROY -> ABORTING, twice is ignored, BOOTED is
	 * refused, and the creator's GAVE_UP ends it. */
	vmd_sandbox_abort(sb);
	assert_int_equal(state_of(sb), SANDBOX_ABORTING);
	pthread_mutex_lock(&sb->mu);
	assert_int_equal(vmd_sandbox_api_state(sb), CREATING);
	assert_true(vmd_sandbox_stop_asked(sb));
	pthread_mutex_unlock(&sb->mu);
	vmd_sandbox_abort(sb);
	assert_int_equal(state_of(sb), SANDBOX_ABORTING);
	assert_int_equal(step(sb, SANDBOX_EV_BOOTED), SANDBOX_STEP_REFUSED);
	assert_int_equal(step(sb, SANDBOX_EV_FAIL), SANDBOX_STEP_IGNORED);
	assert_int_equal(step(sb, SANDBOX_EV_GAVE_UP), SANDBOX_STEP_MOVED);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	vmd_sandbox_put(sb);
	vmd_sandbox_put(sb);
}

/* ---- while running ---- */

static void
test_vmm_dies_while_running(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);

	/* RUNNING + FAIL (the supervisor saw the VMM go) -> FAILED */
	fake_vmm_ops.stop(&sb->vmm, true);
	assert_int_equal(wait_state(sb, SANDBOX_FAILED), SANDBOX_FAILED);
	pthread_mutex_lock(&sb->mu);
	assert_int_equal(vmd_sandbox_api_state(sb), FAILED);
	assert_non_null(strstr(sb->failure_reason, "exited unexpectedly"));
	pthread_mutex_unlock(&sb->mu);
	/* The memory goes back just after the state changed. */
	assert_int_equal(wait_reserved(e, 0), 0);
	/* FAILED + FAIL is ignored: the first reason stays. */
	vmd_sandbox_fail(sb, "a second reason");
	pthread_mutex_lock(&sb->mu);
	assert_null(strstr(sb->failure_reason, "second"));
	pthread_mutex_unlock(&sb->mu);
	/* FAILED + DESTROY -> STOPPED */
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, sb->id.str),
	    MOAT_OK);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	vmd_sandbox_put(sb);
}

static void
test_agent_lost_while_running(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);

	fake_vmm_agent_lost(&sb->vmm);
	assert_int_equal(wait_state(sb, SANDBOX_FAILED), SANDBOX_FAILED);
	pthread_mutex_lock(&sb->mu);
	assert_non_null(strstr(sb->failure_reason, "kept running"));
	pthread_mutex_unlock(&sb->mu);
	vmd_sandbox_put(sb);
}

static void
test_illegal_events_refused(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);

	assert_int_equal(step(sb, SANDBOX_EV_BOOTED), SANDBOX_STEP_REFUSED);
	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_END),
	    SANDBOX_STEP_REFUSED);
	assert_int_equal(step(sb, SANDBOX_EV_RELINK_BEGIN),
	    SANDBOX_STEP_REFUSED);
	assert_int_equal(step(sb, SANDBOX_EV_RELINK_END),
	    SANDBOX_STEP_REFUSED);
	assert_int_equal(state_of(sb), SANDBOX_RUNNING);
	assert_int_equal(step(sb, SANDBOX_EV_DESTROY), SANDBOX_STEP_MOVED);
	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_BEGIN),
	    SANDBOX_STEP_REFUSED);
	assert_int_equal(step(sb, SANDBOX_EV_BOOTED), SANDBOX_STEP_REFUSED);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	vmd_sandbox_put(sb);
}

/* ---- snapshots ---- */

static void
test_snapshot_and_relink(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);
	struct guest_link *before;
	char *why = NULL;

	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_BEGIN),
	    SANDBOX_STEP_MOVED);
	assert_int_equal(state_of(sb), SANDBOX_SNAPSHOTTING);
	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_BEGIN),
	    SANDBOX_STEP_REFUSED);
	before = sb->link;
	vmd_sandbox_relink_begin(sb);
	assert_int_equal(state_of(sb), SANDBOX_RELINKING);
	pthread_mutex_lock(&sb->mu);
	assert_int_equal(vmd_sandbox_api_state(sb), RUNNING);
	pthread_mutex_unlock(&sb->mu);
	/* The old link closing now is expected, not a failure. */
	assert_int_equal(vmd_sandbox_relink(sb, moat_rpc_now_ms() + 3000,
	                     &why),
	    MOAT_OK);
	assert_null(why);
	assert_int_equal(state_of(sb), SANDBOX_SNAPSHOTTING);
	assert_ptr_not_equal(sb->link, before);
	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_END),
	    SANDBOX_STEP_MOVED);
	assert_int_equal(state_of(sb), SANDBOX_RUNNING);
	vmd_sandbox_put(sb);
}

static void
test_destroy_while_snapshotting(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);

	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_BEGIN),
	    SANDBOX_STEP_MOVED);
	/* SNAPSHOTTING + DESTROY -> STOPPED; the snapshot's end changes
	 * nothing. */
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, sb->id.str),
	    MOAT_OK);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_END),
	    SANDBOX_STEP_IGNORED);
	/* A snapshot that gets to its relink only now: nothing to do. */
	assert_int_equal(step(sb, SANDBOX_EV_RELINK_BEGIN),
	    SANDBOX_STEP_IGNORED);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	vmd_sandbox_put(sb);
}

static void
test_destroy_while_relinking(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);
	char *why = NULL;

	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_BEGIN),
	    SANDBOX_STEP_MOVED);
	vmd_sandbox_relink_begin(sb);
	/* RELINKING + DESTROY -> STOPPED; the relink gives up and its end
	 * changes nothing. */
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, sb->id.str),
	    MOAT_OK);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_int_not_equal(vmd_sandbox_relink(sb, moat_rpc_now_ms() + 1000,
	                         &why),
	    MOAT_OK);
	assert_non_null(why);
	free(why);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	vmd_sandbox_put(sb);
}

static void
test_vmm_dies_while_snapshotting(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = boot_running(e);

	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_BEGIN),
	    SANDBOX_STEP_MOVED);
	vmd_sandbox_relink_begin(sb);
	/* RELINKING + FAIL -> FAILED; both ends are then ignored. */
	fake_vmm_ops.stop(&sb->vmm, true);
	assert_int_equal(wait_state(sb, SANDBOX_FAILED), SANDBOX_FAILED);
	assert_int_equal(step(sb, SANDBOX_EV_RELINK_END),
	    SANDBOX_STEP_IGNORED);
	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_END),
	    SANDBOX_STEP_IGNORED);
	assert_int_equal(state_of(sb), SANDBOX_FAILED);
	vmd_sandbox_put(sb);

	sb = boot_running(e);
	assert_int_equal(step(sb, SANDBOX_EV_SNAPSHOT_BEGIN),
	    SANDBOX_STEP_MOVED);
	/* SNAPSHOTTING + FAIL -> FAILED */
	vmd_sandbox_fail(sb, "the guest broke the protocol");
	assert_int_equal(state_of(sb), SANDBOX_FAILED);
	vmd_sandbox_put(sb);
}

/* ---- restore ---- */

static void
test_restore(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 2000);
	struct sandbox *out = NULL;

	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb,
	                     e->snap_dir, "tcg", BRING_UP_LISTED, NULL, &out),
	    MOAT_OK);
	vmd_sandbox_put(out);
	assert_int_equal(state_of(sb), SANDBOX_RUNNING);
	assert_int_equal(fake_vmm_starts(), 1);
	vmd_sandbox_put(sb);
}

static void
test_restore_fails(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 2000);
	struct sandbox *out = NULL;

	/* A restore is tried once: BOOTING + GAVE_UP -> STOPPED. */
	fake_script.restore_fails = true;
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb,
	                     e->snap_dir, "tcg", BRING_UP_LISTED, NULL, &out),
	    MOAT_UNAVAILABLE);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_non_null(strstr(e->call.error_message, "did not restore"));
	vmd_sandbox_put(sb);
	clear_error(e);

	fake_script.restore_fails = false;
	fake_script.resume_fails = true;
	sb = new_sandbox(e, 2000);
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb,
	                     e->snap_dir, "tcg", BRING_UP_LISTED, NULL, &out),
	    MOAT_UNAVAILABLE);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_non_null(strstr(e->call.error_message, "did not resume"));
	assert_int_equal(fake_vmm_starts(), 1);
	vmd_sandbox_put(sb);
}

static void
test_restore_in_place(void **state)
{
	struct env *e = *state;
	struct sandbox *old = boot_running(e);
	struct sandbox *sb = new_sandbox(e, 2000);
	struct sandbox *found = NULL;
	struct sandbox *out = NULL;

	sb->id = old->id;
	/* The new one runs, then takes the old one's place: the old one
	 * goes RUNNING + DESTROY -> STOPPED. */
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb,
	                     e->snap_dir, "tcg", BRING_UP_REPLACE, old, &out),
	    MOAT_OK);
	vmd_sandbox_put(out);
	assert_int_equal(state_of(sb), SANDBOX_RUNNING);
	assert_int_equal(state_of(old), SANDBOX_STOPPED);
	assert_int_equal(vmd_sandbox_get(&e->vmd, NULL, old->id.str, &found),
	    MOAT_OK);
	assert_ptr_equal(found, sb);
	vmd_sandbox_put(found);
	vmd_sandbox_put(old);
	vmd_sandbox_put(sb);
}

static void
test_restore_in_place_target_gone(void **state)
{
	struct env *e = *state;
	struct sandbox *old = boot_running(e);
	struct sandbox *sb = new_sandbox(e, 2000);
	struct sandbox *out = NULL;

	sb->id = old->id;
	assert_int_equal(vmd_sandbox_destroy(&e->vmd, &e->call, old->id.str),
	    MOAT_OK);
	/* RUNNING + GAVE_UP -> STOPPED: the new VM ran but had nowhere to
	 * go. */
	assert_int_equal(vmd_sandbox_bring_up(&e->vmd, &e->call, sb,
	                     e->snap_dir, "tcg", BRING_UP_REPLACE, old, &out),
	    MOAT_ABORTED);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	vmd_sandbox_put(old);
	vmd_sandbox_put(sb);
}

static void
test_failed_gives_up(void **state)
{
	struct env *e = *state;
	struct sandbox *sb = new_sandbox(e, 0);

	/* The creator's GAVE_UP also ends one that failed meanwhile. */
	assert_int_equal(step(sb, SANDBOX_EV_BOOTED), SANDBOX_STEP_MOVED);
	assert_int_equal(step(sb, SANDBOX_EV_FAIL), SANDBOX_STEP_MOVED);
	assert_int_equal(step(sb, SANDBOX_EV_GAVE_UP), SANDBOX_STEP_MOVED);
	assert_int_equal(state_of(sb), SANDBOX_STOPPED);
	assert_int_equal(step(sb, SANDBOX_EV_GAVE_UP), SANDBOX_STEP_IGNORED);
	vmd_sandbox_put(sb);
	vmd_sandbox_put(sb);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_table_every_cell),
		cmocka_unit_test(test_api_mapping),
		T(test_boot_then_destroy),
		T(test_boot_timeout_retries_once),
		T(test_boot_vmm_does_not_start),
		T(test_boot_vmm_exits),
		T(test_boot_agent_hangs_up),
		T(test_destroy_while_creating),
		T(test_abort_booting_hidden),
		T(test_vmm_dies_while_running),
		T(test_agent_lost_while_running),
		T(test_illegal_events_refused),
		T(test_snapshot_and_relink),
		T(test_destroy_while_snapshotting),
		T(test_destroy_while_relinking),
		T(test_vmm_dies_while_snapshotting),
		T(test_restore),
		T(test_restore_fails),
		T(test_restore_in_place),
		T(test_restore_in_place_target_gone),
		T(test_failed_gives_up),
	};

	int failed;

	/* As moat-vmd does (main.c): the fake agent may write to a link
	 * vmd has already closed (a restore that fails); that write must
	 * fail with EPIPE, not kill the test. */
	signal(SIGPIPE, SIG_IGN);
	/* mkfs.ext4 for the scratch disks runs through vmd's spawner. */
	if (moat_spawner_start() != 0) {
		fprintf(stderr, "cannot start the spawner\n");
		return 1;
	}
	failed = cmocka_run_group_tests(tests, NULL, NULL);
	moat_spawner_stop();
	return failed;
}
