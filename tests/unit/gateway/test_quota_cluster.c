/*
 * test_quota_cluster.c: tenants' quotas counted across gateways (issue
 * 15, gateway/quota_remote.c) with a real moat-sessiond: two gateways'
 * admissions (each its own inventory, reservations and sessiond client)
 * create at the same moment for a tenant of max-sandboxes = 1 and
 * exactly one passes, round after round; a landed sandbox that neither
 * inventory lists yet still counts on the other gateway, a released
 * reservation does not. With sessiond not answering, both fall back to
 * their own count (and both pass: what the reservation prevents),
 * counted in moat_gateway_quota_local_fallbacks_total, never blocked.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "admission.h"
#include "gateway.h"
#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"

#define ROUNDS 20

/* One gateway: its admission, metrics and sessiond client. */
struct gw {
	struct moat_admission *adm;
	struct moat_metrics *reg;
	struct moat_rpc_client *client;
	Moat__V1__Node node, *nodes[1];
};

static struct {
	char dir[64];
	char *url;
	pid_t pid;
	struct moat_config *cfg;
} E;

static struct moat_config *
config(const char *text)
{
	char path[] = "/tmp/moat-test-quota-XXXXXX";
	int fd = mkstemp(path);
	struct moat_config *cfg = NULL;
	char *err = NULL;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	assert_int_equal(moat_config_load(&cfg, path, &err), MOAT_OK);
	unlink(path);
	return cfg;
}

static void
wait_health(struct moat_rpc_client *c)
{
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	ProtobufCMessage *reply = NULL;
	char *err = NULL;
	int rv = MOAT_UNAVAILABLE;

	for (int i = 0; i < 400 && rv != MOAT_OK; i++) {
		struct moat_rpc_opts o = { .timeout_ms = 500 };

		rv = moat_rpc_call(c, "moat.v1.Session", "Health", &req.base,
		    &moat__v1__health_reply__descriptor, &reply, &o, &err);
		free(err);
		err = NULL;
		if (rv != MOAT_OK)
			usleep(25 * 1000);
	}
	assert_int_equal(rv, MOAT_OK);
	protobuf_c_message_free_unpacked(reply, NULL);
}

static int
setup(void **state)
{
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", E.dir,
		NULL };

	(void)state;
	moat_log_init("test", MOAT_LOG_ERROR);
	snprintf(E.dir, sizeof(E.dir), "/tmp/moat-quotac-XXXXXX");
	assert_non_null(mkdtemp(E.dir));
	E.url = moat_asprintf("ipc://%s/sessiond.sock", E.dir);
	if ((E.pid = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(E.pid > 0);
	E.cfg = config("[tenants]\nmax-sandboxes = 1\n");
	return 0;
}

static int
teardown(void **state)
{
	char cmd[128];

	(void)state;
	if (E.pid > 0) {
		kill(E.pid, SIGTERM);
		waitpid(E.pid, NULL, 0);
	}
	moat_config_free(E.cfg);
	free(E.url);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", E.dir);
	if (system(cmd) != 0)
		return -1;
	return 0;
}

/* gw_open: a gateway's admission with quotas through sessiond at `url`
 * (NULL: no sessiond) and one roomy node. */
static void
gw_open(struct gw *g, const char *url)
{
	char *err = NULL;

	memset(g, 0, sizeof(*g));
	assert_int_equal(moat_metrics_new(&g->reg), MOAT_OK);
	assert_int_equal(moat_admission_new(&g->adm, E.cfg, g->reg, &err),
	    MOAT_OK);
	if (url != NULL) {
		assert_int_equal(moat_rpc_client_open(&g->client, url, &err),
		    MOAT_OK);
		moat_admission_set_remote(g->adm,
		    moat_quota_remote_new(g->client, url));
	}
}

static void
gw_close(struct gw *g)
{
	moat_admission_free(g->adm);
	moat_rpc_client_close(g->client);
	moat_metrics_free(g->reg);
}

/* What one create holds while its node makes the sandbox. */
struct create {
	struct gw *g;
	const char *tenant;
	pthread_barrier_t *start;
	int rv;
	struct moat_quota_hold hold;
	uint64_t local;
	char *err; /* the refusal's message (heap) */
};

/* create_main: the quota part of moat_gw_create: sessiond's
 * reservation, then placement with this gateway's own count when
 * sessiond did not hold it. */
static void *
create_main(void *arg)
{
	struct create *c = arg;
	struct moat_place_req req = { .vcpus = 1 };
	size_t chosen;
	char *err = NULL;

	moat__v1__node__init(&c->g->node);
	c->g->node.node_id = (char *)"n1";
	c->g->node.rpc_url = (char *)"ipc:///nowhere";
	c->g->node.available = true;
	c->g->node.protocol_version = MOAT_PROTOCOL_VERSION_MIN;
	c->g->node.vcpus_total = 64;
	c->g->node.memory_mib_total = 65536;
	c->g->node.max_vcpus = 8;
	c->g->node.max_memory_mib = 8192;
	c->g->nodes[0] = &c->g->node;
	pthread_barrier_wait(c->start);
	c->rv = moat_quota_reserve(c->g->adm, c->tenant, 1, 1, 256,
	    moat_rpc_now_ms() + 10000, &c->hold, &err);
	if (c->rv == MOAT_OK)
		c->rv = moat_admission_place(c->g->adm, c->g->nodes, 1,
		    c->tenant, &req, c->hold.local, &chosen, &c->local, &err);
	c->err = err;
	return NULL;
}

/* race: one create through each gateway at once; how many passed. */
static int
race(struct gw *g1, struct gw *g2, const char *tenant, struct create c[2])
{
	pthread_barrier_t start;
	pthread_t th[2];
	int passed = 0;

	pthread_barrier_init(&start, NULL, 2);
	c[0] = (struct create){ .g = g1, .tenant = tenant, .start = &start };
	c[1] = (struct create){ .g = g2, .tenant = tenant, .start = &start };
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&th[i], NULL, create_main,
		                     &c[i]),
		    0);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		if (c[i].rv == MOAT_OK)
			passed++;
		else
			assert_int_equal(c[i].rv, MOAT_RESOURCE_EXHAUSTED);
		/* The limit, its key and what to do; not where sessiond
		 * is. */
		if (c[i].rv != MOAT_OK &&
		    (strncmp(c[i].err, "tenant ", 7) != 0 ||
		        strstr(c[i].err, "([tenants] max-sandboxes.") ==
		            NULL ||
		        strstr(c[i].err, "max-sandboxes=N)") == NULL))
			fail_msg("refusal: %s", c[i].err);
		free(c[i].err);
		c[i].err = NULL;
	}
	pthread_barrier_destroy(&start);
	return passed;
}

static void
test_two_gateways_one_passes(void **state)
{
	struct gw g1, g2;
	struct create c[2];
	char tenant[32];

	(void)state;
	gw_open(&g1, E.url);
	gw_open(&g2, E.url);
	wait_health(g1.client);
	for (int round = 0; round < ROUNDS; round++) {
		snprintf(tenant, sizeof(tenant), "t%d", round);
		assert_int_equal(race(&g1, &g2, tenant, c), 1);
		/* The winner's sandbox lands; neither inventory lists it
		 * yet, and the other gateway is still refused. */
		for (int i = 0; i < 2; i++) {
			const char *id = "sb-made";

			if (c[i].rv != MOAT_OK)
				continue;
			assert_false(c[i].hold.local);
			moat_quota_landed(c[i].g->adm, tenant, &c[i].hold, &id,
			    1);
			assert_int_equal(race(&g1, &g2, tenant, c), 0);
			break;
		}
	}
	/* A released reservation frees its share at once. */
	assert_int_equal(race(&g1, &g2, "r", c), 1);
	for (int i = 0; i < 2; i++)
		moat_quota_release(c[i].g->adm, "r", &c[i].hold);
	assert_int_equal(race(&g1, &g2, "r", c), 1);
	assert_int_equal(moat_counter_get(moat_metrics_counter(g1.reg,
	                     "moat_gateway_quota_local_fallbacks_total", "",
	                     NULL)) +
	        moat_counter_get(moat_metrics_counter(g2.reg,
	            "moat_gateway_quota_local_fallbacks_total", "", NULL)),
	    0);
	gw_close(&g1);
	gw_close(&g2);
}

/* No sessiond answering: each gateway counts alone, both pass (the
 * overshoot the reservation prevents), and nothing blocks. */
static void
test_sessiond_down_falls_back(void **state)
{
	struct gw g1, g2;
	struct create c[2];
	char *nowhere = moat_asprintf("ipc://%s/none.sock", E.dir);

	(void)state;
	gw_open(&g1, nowhere);
	gw_open(&g2, nowhere);
	assert_int_equal(race(&g1, &g2, "down", c), 2);
	assert_true(c[0].hold.local && c[1].hold.local);
	/* Each gateway's own count still holds its own limit. */
	assert_int_equal(race(&g1, &g2, "down", c), 0);
	assert_int_equal(moat_counter_get(moat_metrics_counter(g1.reg,
	                     "moat_gateway_quota_local_fallbacks_total", "",
	                     NULL)),
	    2);
	gw_close(&g1);
	gw_close(&g2);
	free(nowhere);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_gateways_one_passes),
		cmocka_unit_test(test_sessiond_down_falls_back),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
