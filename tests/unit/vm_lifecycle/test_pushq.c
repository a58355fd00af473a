/*
 * test_pushq.c: vmd's background push queue (services/vm/pushq.h)
 * against a fake moat-snapd served in-process, whose Health can be held
 * so a push stays "running": pushes run one at a time in order and
 * record their outcome in the snapshot's meta; settling a queued push
 * cancels it, settling the running one waits for it; stop finishes the
 * running push and abandons the queued ones. Not for: the push itself
 * (tests/integration/vm pushes to a real snapd).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "node.h"
#include "pushq.h"
#include "snapshot.pb-c.h"
#include "snapshot_meta.h"
#include "snapshot_push.h"

struct fake_snapd {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool hold;   /* Health waits while set */
	int healths; /* Health calls that arrived */
};

static struct fake_snapd fs;

/* Health: waits while fs.hold (at most 1.5 s, under vmd's ping timeout),
 * so the push that sent it is the running one meanwhile. */
static int
h_health(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	uint64_t until = moat_rpc_now_ms() + 1500;

	(void)call;
	(void)req;
	(void)reply;
	pthread_mutex_lock(&fs.mu);
	fs.healths++;
	pthread_cond_broadcast(&fs.cv);
	while (fs.hold && moat_rpc_now_ms() < until) {
		pthread_mutex_unlock(&fs.mu);
		usleep(5000);
		pthread_mutex_lock(&fs.mu);
	}
	pthread_mutex_unlock(&fs.mu);
	return MOAT_OK;
}

/* Everything else: refused, so a push fails fast with remote_error. */
static int
h_refuse(struct moat_rpc_call *call, const ProtobufCMessage *req,
    ProtobufCMessage *reply)
{
	(void)req;
	(void)reply;
	return moat_rpc_error(call, MOAT_UNAVAILABLE, "fake snapd is full");
}

static const struct moat_rpc_method snapd_rows[] = {
	{ "Health", h_health, false, false },
	{ "MissingChunks", h_refuse, false, false },
	{ "PutChunks", h_refuse, true, false },
	{ "GetChunks", h_refuse, false, false },
	{ "CommitManifest", h_refuse, true, false },
	{ "GetSnapshot", h_refuse, false, false },
	{ "ListSnapshots", h_refuse, false, false },
	{ "DeleteSnapshot", h_refuse, true, false },
	{ "Stats", h_refuse, false, false },
};

struct env {
	struct vmd vmd;
	char root[64];
	char *dirs[2];
	struct moat_rpc_server *srv;
};

static const char *const ids[2] = { "snap-node-test-0000000000000001",
	"snap-node-test-0000000000000002" };

static void
set_hold(bool hold)
{
	pthread_mutex_lock(&fs.mu);
	fs.hold = hold;
	pthread_mutex_unlock(&fs.mu);
}

/* Waits (up to 5 s) until `n` Health calls arrived. */
static void
wait_healths(int n)
{
	uint64_t until = moat_rpc_now_ms() + 5000;

	pthread_mutex_lock(&fs.mu);
	while (fs.healths < n && moat_rpc_now_ms() < until) {
		pthread_mutex_unlock(&fs.mu);
		usleep(2000);
		pthread_mutex_lock(&fs.mu);
	}
	assert_true(fs.healths >= n);
	pthread_mutex_unlock(&fs.mu);
}

/* The remote_error snapshot k's meta records ("" : no push ended). */
static char *
remote_error(struct env *e, int k)
{
	Moat__V1__LocalSnapshot *m = NULL;
	char *err;

	assert_int_equal(vmd_snapshot_read_meta(e->dirs[k], &m), 0);
	err = strdup(m->remote_error);
	moat__v1__local_snapshot__free_unpacked(m, NULL);
	return err;
}

static int
setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct moat_rpc_service svc = { .descriptor =
		                            &moat__v1__snapshot__descriptor,
		.methods = snapd_rows,
		.n_methods = sizeof(snapd_rows) / sizeof(snapd_rows[0]) };
	char *url, *msg = NULL;

	assert_non_null(e);
	snprintf(e->root, sizeof(e->root), "/tmp/moat-pushq-XXXXXX");
	assert_non_null(mkdtemp(e->root));
	for (int k = 0; k < 2; k++) {
		Moat__V1__LocalSnapshot m = MOAT__V1__LOCAL_SNAPSHOT__INIT;

		e->dirs[k] = moat_asprintf("%s/snapshots/%s", e->root, ids[k]);
		assert_int_equal(moat_mkdir_p(e->dirs[k], 0700), 0);
		m.snapshot_id = (char *)ids[k];
		m.sandbox_id = "sb-1";
		m.tenant = "tenant-a";
		m.dir = e->dirs[k];
		assert_int_equal(vmd_snapshot_write_meta(e->dirs[k], &m), 0);
		/* Artifacts of one chunk each: the push asks snapd about
		 * them (and is refused). */
		for (int i = 0; i < VMD_SNAP_N_ARTIFACTS; i++) {
			char *p = moat_asprintf("%s/%s", e->dirs[k],
			    vmd_snap_artifacts[i].file);

			assert_int_equal(moat_write_file_atomic(p, "x", 1,
			                     0600),
			    0);
			free(p);
		}
	}
	memset(&fs, 0, sizeof(fs));
	pthread_mutex_init(&fs.mu, NULL);
	pthread_cond_init(&fs.cv, NULL);
	url = moat_asprintf("ipc://%s/snapd.sock", e->root);
	assert_int_equal(moat_rpc_server_start(&e->srv, url, &svc, 4, &msg),
	    MOAT_OK);
	assert_int_equal(moat_rpc_client_open(&e->vmd.snapd, url, &msg),
	    MOAT_OK);
	free(url);
	e->vmd.cfg.node_id = "node-test";
	e->vmd.cfg.snapd_url = "(fake snapd)";
	assert_int_equal(vmd_pushq_start(&e->vmd), MOAT_OK);
	assert_non_null(e->vmd.pushq);
	*state = e;
	return 0;
}

static int
teardown(void **state)
{
	struct env *e = *state;

	set_hold(false);
	vmd_pushq_stop(&e->vmd);
	moat_rpc_client_close(e->vmd.snapd);
	moat_rpc_server_stop(e->srv);
	(void)moat_rm_rf(e->root);
	free(e->dirs[0]);
	free(e->dirs[1]);
	free(e);
	return 0;
}

struct settler {
	struct env *e;
	const char *id;
	atomic_bool done;
};

static void *
settle_main(void *arg)
{
	struct settler *s = arg;

	vmd_pushq_settle(&s->e->vmd, s->id);
	atomic_store(&s->done, true);
	return NULL;
}

static void *
stop_main(void *arg)
{
	struct settler *s = arg;

	vmd_pushq_stop(&s->e->vmd);
	atomic_store(&s->done, true);
	return NULL;
}

static void
test_settle_cancels_queued_waits_running(void **state)
{
	struct env *e = *state;
	struct settler s = { .e = e, .id = ids[0] };
	pthread_t t;
	char *err;

	set_hold(true);
	assert_true(vmd_pushq_add(&e->vmd, 1, ids[0], e->dirs[0], "sb-1"));
	wait_healths(1); /* the first push is running */
	assert_true(vmd_pushq_add(&e->vmd, 2, ids[1], e->dirs[1], "sb-1"));
	assert_true(vmd_pushq_pending(&e->vmd, ids[0]));
	assert_true(vmd_pushq_pending(&e->vmd, ids[1]));

	/* Queued: cancelled at once, and never pushed. */
	vmd_pushq_settle(&e->vmd, ids[1]);
	assert_false(vmd_pushq_pending(&e->vmd, ids[1]));

	/* Running: settle waits until the push ended. */
	assert_int_equal(pthread_create(&t, NULL, settle_main, &s), 0);
	usleep(150000);
	assert_false(atomic_load(&s.done));
	set_hold(false);
	pthread_join(t, NULL);
	assert_true(atomic_load(&s.done));
	assert_false(vmd_pushq_pending(&e->vmd, ids[0]));
	/* The push ended (refused) and its meta says so; the cancelled one
	 * was never tried. */
	err = remote_error(e, 0);
	assert_true(err[0] != '\0');
	free(err);
	err = remote_error(e, 1);
	assert_string_equal(err, "");
	free(err);
	usleep(50000);
	pthread_mutex_lock(&fs.mu);
	assert_int_equal(fs.healths, 1);
	pthread_mutex_unlock(&fs.mu);
}

static void
test_pushes_run_in_order(void **state)
{
	struct env *e = *state;
	uint64_t until = moat_rpc_now_ms() + 10000;
	char *err0, *err1;

	assert_true(vmd_pushq_add(&e->vmd, 1, ids[0], e->dirs[0], "sb-1"));
	assert_true(vmd_pushq_add(&e->vmd, 2, ids[1], e->dirs[1], "sb-1"));
	while ((vmd_pushq_pending(&e->vmd, ids[0]) ||
	           vmd_pushq_pending(&e->vmd, ids[1])) &&
	    moat_rpc_now_ms() < until)
		usleep(5000);
	assert_false(vmd_pushq_pending(&e->vmd, ids[1]));
	err0 = remote_error(e, 0);
	err1 = remote_error(e, 1);
	assert_non_null(strstr(err0, "fake snapd is full"));
	assert_non_null(strstr(err1, "fake snapd is full"));
	free(err0);
	free(err1);
	pthread_mutex_lock(&fs.mu);
	assert_int_equal(fs.healths, 2);
	pthread_mutex_unlock(&fs.mu);
}

static void
test_stop_finishes_running_abandons_queued(void **state)
{
	struct env *e = *state;
	struct settler s = { .e = e };
	pthread_t t;
	char *err;

	set_hold(true);
	assert_true(vmd_pushq_add(&e->vmd, 1, ids[0], e->dirs[0], "sb-1"));
	wait_healths(1);
	assert_true(vmd_pushq_add(&e->vmd, 2, ids[1], e->dirs[1], "sb-1"));
	assert_int_equal(pthread_create(&t, NULL, stop_main, &s), 0);
	usleep(150000);
	assert_false(atomic_load(&s.done)); /* the running push first */
	set_hold(false);
	pthread_join(t, NULL);
	assert_null(e->vmd.pushq);
	err = remote_error(e, 0);
	assert_true(err[0] != '\0');
	free(err);
	err = remote_error(e, 1); /* abandoned: never tried */
	assert_string_equal(err, "");
	free(err);
	/* Without a queue, nothing is queued: the caller pushes itself. */
	assert_false(vmd_pushq_add(&e->vmd, 3, ids[1], e->dirs[1], "sb-1"));
	assert_false(vmd_pushq_pending(&e->vmd, ids[1]));
	vmd_pushq_settle(&e->vmd, ids[1]);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int
main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_settle_cancels_queued_waits_running),
		T(test_pushes_run_in_order),
		T(test_stop_finishes_running_abandons_queued),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
