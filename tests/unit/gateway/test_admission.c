/*
 * test_admission.c: admission and placement over fake node tables
 * (issue 15, parts 4 and 6): a burst spreads over equal nodes through
 * reservations, a node that refused is skipped, node_selector, vcpu
 * overcommit, cordoned and old-protocol nodes skipped (with the reason
 * ListNodes shows), reservations dropped by the next survey, tenant
 * spread, quota refusals and per-key rate refusals with their messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "admission.h"
#include "gateway.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/util.h"

#define N_NODES 3

static Moat__V1__Node storage[N_NODES];
static Moat__V1__Node *nodes[N_NODES];

static void
set_node(int i, const char *id)
{
	Moat__V1__Node *n = &storage[i];

	moat__v1__node__init(n);
	n->node_id = (char *)id;
	n->rpc_url = (char *)"ipc:///nowhere";
	n->available = true;
	n->protocol_version = MOAT_PROTOCOL_VERSION_MIN;
	n->vcpus_total = 64;
	n->memory_mib_total = 65536;
	n->max_vcpus = 8;
	n->max_memory_mib = 8192;
	n->last_seen_unix_ms = 1; /* an old survey answer */
	nodes[i] = n;
}

/* config: a moat_config from `text` (a file in /tmp). */
static struct moat_config *
config(const char *text)
{
	char path[] = "/tmp/moat-test-admission-XXXXXX";
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

static struct moat_admission *
admission(const struct moat_config *cfg, struct moat_metrics *reg)
{
	struct moat_admission *a = NULL;
	char *err = NULL;

	assert_int_equal(moat_admission_new(&a, cfg, reg, &err), MOAT_OK);
	return a;
}

/* place: one placement for `tenant`, its node's index or -1 (the
 * status in *rv, the message in *msg, freed by the caller). */
static int
place(struct moat_admission *a, struct moat_place_req *req, const char *tenant,
    size_t n, int *rv, char **msg)
{
	size_t chosen;
	uint64_t handle;

	*msg = NULL;
	*rv = moat_admission_place(a, nodes, n, tenant, req, true, &chosen,
	    &handle, msg);
	return *rv == MOAT_OK ? (int)chosen : -1;
}

/* Twenty creates at once over two equal nodes: each sees the ones
 * before it through their reservations, so they split 10/10 (the issue
 * allows 12/8). */
static void
test_burst_spreads(void **state)
{
	struct moat_admission *a = admission(NULL, NULL);
	struct moat_place_req req = { .vcpus = 1 };
	int count[2] = { 0, 0 }, rv;
	char *msg;

	(void)state;
	for (int k = 0; k < 20; k++) {
		/* Each create reads a fresh copy of the table: the surveys
		 * have not counted any of them yet. */
		set_node(0, "a");
		set_node(1, "b");
		int i = place(a, &req, "acme", 2, &rv, &msg);

		assert_int_equal(rv, MOAT_OK);
		count[i]++;
	}
	assert_true(count[0] <= 12 && count[1] <= 12);
	assert_int_equal(count[0] + count[1], 20);
	moat_admission_free(a);
}

/* A node that refused is skipped; when every node refused, the pick
 * says so. */
static void
test_refusing_node_skipped(void **state)
{
	struct moat_admission *a = admission(NULL, NULL);
	bool skip[2] = { true, false };
	struct moat_place_req req = { .skip = skip };
	int rv;
	char *msg;

	(void)state;
	set_node(0, "a");
	set_node(1, "b");
	storage[1].sandboxes = 5; /* a would win on its own */
	assert_int_equal(place(a, &req, "acme", 2, &rv, &msg), 1);
	skip[1] = true;
	assert_int_equal(place(a, &req, "acme", 2, &rv, &msg), -1);
	assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(msg, "refused"));
	free(msg);
	moat_admission_free(a);
}

static void
test_node_selector(void **state)
{
	Moat__V1__Node__LabelsEntry zone = MOAT__V1__NODE__LABELS_ENTRY__INIT,
	                            kvm = MOAT__V1__NODE__LABELS_ENTRY__INIT;
	Moat__V1__Node__LabelsEntry *labels[] = { &zone, &kvm };
	Moat__V1__CreateSandboxRequest__NodeSelectorEntry s1 =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__NODE_SELECTOR_ENTRY__INIT;
	Moat__V1__CreateSandboxRequest__NodeSelectorEntry s2 = s1;
	Moat__V1__CreateSandboxRequest__NodeSelectorEntry *sel[] = { &s1,
		&s2 };
	struct moat_place_req req = { .selector = sel, .n_selector = 1 };
	size_t chosen;
	char *msg = NULL;

	(void)state;
	zone.key = (char *)"zone";
	zone.value = (char *)"b";
	kvm.key = (char *)"kvm";
	kvm.value = (char *)"true";
	set_node(0, "a");
	set_node(1, "b");
	storage[1].labels = labels;
	storage[1].n_labels = 2;
	storage[1].sandboxes = 9;
	s1.key = (char *)"zone";
	s1.value = (char *)"b";
	assert_int_equal(moat_placement_pick(nodes, 2, &req, &chosen, &msg),
	    MOAT_OK);
	assert_int_equal(chosen, 1);
	/* Every entry must match. */
	s2.key = (char *)"kvm";
	s2.value = (char *)"false";
	req.n_selector = 2;
	assert_int_equal(moat_placement_pick(nodes, 2, &req, &chosen, &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "zone=b,kvm=false"));
	assert_non_null(strstr(msg, "--label"));
	free(msg);
}

/* vcpus_used + asked <= vcpus_total * ratio. */
static void
test_overcommit(void **state)
{
	struct moat_config *cfg = config("[gateway]\nvcpu-overcommit = 1.5\n");
	struct moat_admission *a = admission(cfg, NULL);
	struct moat_place_req req = { .vcpus = 2 };
	size_t chosen;
	char *msg = NULL;
	int rv;

	(void)state;
	assert_true(moat_admission_overcommit(a) == 1.5);
	set_node(0, "a");
	storage[0].vcpus_total = 4; /* 6 with the ratio */
	storage[0].vcpus_used = 4;
	assert_int_equal(place(a, &req, "acme", 1, &rv, &msg), 0);
	/* The reservation holds 2 more: 6 + 2 > 6. */
	set_node(0, "a");
	storage[0].vcpus_total = 4;
	storage[0].vcpus_used = 4;
	assert_int_equal(place(a, &req, "acme", 1, &rv, &msg), -1);
	assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(msg, "vcpus"));
	assert_non_null(strstr(msg, "vcpu-overcommit"));
	free(msg);
	/* Without a ratio given: 4. */
	req.overcommit = 0;
	set_node(0, "a");
	storage[0].vcpus_total = 2;
	storage[0].vcpus_used = 6;
	assert_int_equal(moat_placement_pick(nodes, 1, &req, &chosen, &msg),
	    MOAT_OK);
	moat_admission_free(a);
	moat_config_free(cfg);
	/* Not a ratio: said at start. */
	cfg = config("[gateway]\nvcpu-overcommit = lots\n");
	assert_int_equal(moat_admission_new(&a, cfg, NULL, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "vcpu-overcommit"));
	free(msg);
	moat_config_free(cfg);
}

static void
test_cordoned_and_old_protocol_skipped(void **state)
{
	struct moat_place_req req = { .vcpus = 1 };
	char why[256];
	size_t chosen;
	char *msg = NULL;

	(void)state;
	set_node(0, "old");
	set_node(1, "cordoned");
	set_node(2, "ok");
	storage[0].protocol_version = 0; /* counts as 1 */
	storage[1].cordoned = true;
	storage[1].cordon_reason = (char *)"disk swap";
	storage[2].sandboxes = 50;
	assert_string_equal(moat_placement_unusable(&storage[0], why,
	                        sizeof(why)),
	    "protocol version 1 < 2: upgrade moat-vmd");
	assert_non_null(
	    strstr(moat_placement_unusable(&storage[1], why, sizeof(why)),
	        "moat node uncordon cordoned"));
	assert_null(moat_placement_unusable(&storage[2], why, sizeof(why)));
	assert_int_equal(moat_placement_pick(nodes, 3, &req, &chosen, &msg),
	    MOAT_OK);
	assert_int_equal(chosen, 2);
	assert_int_equal(moat_placement_pick(nodes, 2, &req, &chosen, &msg),
	    MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(msg, "upgrade moat-vmd"));
	assert_non_null(strstr(msg, "disk swap"));
	free(msg);
}

/* A landed reservation lasts until the node's next survey answer; a
 * pending one until the node refuses it (released). */
static void
test_reservation_until_survey(void **state)
{
	struct moat_admission *a = admission(NULL, NULL);
	struct moat_place_req req = { .vcpus = 2, .memory_mib = 512 };
	uint64_t h1, h2;

	(void)state;
	h1 = moat_admission_reserve(a, "a", "acme", &req);
	h2 = moat_admission_reserve(a, "a", "acme", &req);
	assert_true(h1 != 0 && h2 != 0 && h1 != h2);
	moat_admission_landed(a, h1, "sb-1");
	set_node(0, "a");
	moat_admission_apply(a, nodes, 1, "acme", NULL);
	assert_int_equal(storage[0].sandboxes, 2);
	assert_int_equal(storage[0].vcpus_used, 4);
	assert_int_equal(storage[0].memory_mib_used, 1024);
	/* The node says one is being created: the older reservation is
	 * taken to be that one, not counted twice. */
	set_node(0, "a");
	storage[0].sandboxes = 1;
	storage[0].sandboxes_creating = 1;
	moat_admission_apply(a, nodes, 1, "acme", NULL);
	assert_int_equal(storage[0].sandboxes, 2);
	/* A survey answer after h1 landed counts it: only h2 is left. */
	set_node(0, "a");
	storage[0].last_seen_unix_ms = moat_now_unix_ms() + 1;
	moat_admission_apply(a, nodes, 1, "acme", NULL);
	assert_int_equal(storage[0].sandboxes, 1);
	moat_admission_release(a, h2);
	set_node(0, "a");
	moat_admission_apply(a, nodes, 1, "acme", NULL);
	assert_int_equal(storage[0].sandboxes, 0);
	moat_admission_free(a);
}

/* A tenant's sandboxes spread even when the other node holds more of
 * everyone's. */
static void
test_tenant_spread(void **state)
{
	struct moat_admission *a = admission(NULL, NULL);
	struct moat_place_req req = { .vcpus = 1 };
	uint32_t counts[2] = { 3, 0 };
	size_t chosen;
	char *msg = NULL;

	(void)state;
	set_node(0, "a");
	set_node(1, "b");
	storage[1].sandboxes = 10; /* others' */
	req.tenant_sandboxes = counts;
	assert_int_equal(moat_placement_pick(nodes, 2, &req, &chosen, &msg),
	    MOAT_OK);
	assert_int_equal(chosen, 1);
	moat_admission_free(a);
}

static void
test_quota_refusals(void **state)
{
	struct moat_metrics *reg = NULL;
	struct moat_config *cfg =
	    config("[tenants]\nmax-sandboxes = 100\nmax-sandboxes.acme = 2\n"
	           "max-memory-mib.bob = 1000\nmax-snapshot-bytes = 1000\n");
	struct moat_admission *a;
	struct moat_place_req req = { .memory_mib = 512 };
	char *msg = NULL, *text;
	int rv;

	(void)state;
	assert_int_equal(moat_metrics_new(&reg), 0);
	a = admission(cfg, reg);
	set_node(0, "a");
	assert_int_equal(place(a, &req, "acme", 1, &rv, &msg), 0);
	assert_int_equal(place(a, &req, "acme", 1, &rv, &msg), 0);
	assert_int_equal(place(a, &req, "acme", 1, &rv, &msg), -1);
	assert_int_equal(rv, MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(msg, "tenant acme has 2 sandboxes"));
	assert_non_null(strstr(msg, "([tenants] max-sandboxes.acme)"));
	assert_non_null(strstr(msg, "raise the limit"));
	free(msg);
	/* Another tenant has its own count; bob's memory: 512 + 512 >
	 * 1000. */
	assert_int_equal(place(a, &req, "bob", 1, &rv, &msg), 0);
	assert_int_equal(place(a, &req, "bob", 1, &rv, &msg), -1);
	assert_non_null(strstr(msg, "max-memory-mib.bob"));
	free(msg);
	/* Fork: copies counted at once. */
	assert_int_equal(moat_admission_quota(a, "carol", 101, 0, 0, &msg),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(msg, "asked for 101 more"));
	free(msg);
	assert_int_equal(moat_admission_quota(a, "carol", 100, 0, 0, &msg),
	    MOAT_OK);
	assert_int_equal(moat_admission_snapshot_quota(a, "acme", 1000, &msg),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(msg, "max-snapshot-bytes.acme"));
	free(msg);
	text = moat_metrics_text(reg, NULL);
	assert_non_null(strstr(text,
	    "moat_gateway_quota_refusals_total{"
	    "limit=\"max-sandboxes\"} 2"));
	assert_non_null(strstr(text,
	    "moat_gateway_reservations{node=\"a\"} "
	    "3"));
	free(text);
	moat_admission_free(a);
	moat_metrics_free(reg);
	moat_config_free(cfg);
}

/* Sandboxes destroyed free their quota: a refusal does not keep the
 * reservations of sandboxes a node's answer has counted (they once did,
 * so a tenant at its limit was refused for good). */
static void
test_quota_after_destroy(void **state)
{
	struct moat_config *cfg = config("[tenants]\nmax-sandboxes = 2\n");
	struct moat_admission *a = admission(cfg, NULL);
	struct moat_place_req req = { .vcpus = 1 };
	uint64_t h[2];
	size_t chosen;
	char *msg = NULL;
	int rv;

	(void)state;
	set_node(0, "a");
	for (int i = 0; i < 2; i++) {
		assert_int_equal(moat_admission_place(a, nodes, 1, "acme",
		                     &req, true, &chosen, &h[i], &msg),
		    MOAT_OK);
		moat_admission_landed(a, h[i], i ? "sb-2" : "sb-1");
	}
	assert_int_equal(place(a, &req, "acme", 1, &rv, &msg), -1);
	free(msg);
	/* The node answered since, without them: both were destroyed. */
	set_node(0, "a");
	storage[0].last_seen_unix_ms = moat_now_unix_ms() + 1;
	assert_int_equal(place(a, &req, "acme", 1, &rv, &msg), 0);
	moat_admission_free(a);
	moat_config_free(cfg);
}

static void
test_key_rate(void **state)
{
	struct moat_config *cfg =
	    config("[tenants]\nkey-rps = 1000\nkey-rps.acme = 1\n"
	           "key-burst.acme = 2\n");
	struct moat_admission *a = admission(cfg, NULL);
	uint32_t retry = 0;
	char *msg = NULL;

	(void)state;
	assert_true(moat_admission_key(a, "acme", "k1", NULL, &retry, &msg));
	assert_true(moat_admission_key(a, "acme", "k1", NULL, &retry, &msg));
	assert_false(moat_admission_key(a, "acme", "k1", NULL, &retry, &msg));
	assert_int_equal(retry, 1);
	assert_non_null(strstr(msg, "key-rps.acme"));
	assert_non_null(strstr(msg, "retry in 1 s"));
	free(msg);
	/* Per key: another key of acme has its own bucket; bob's rate is
	 * the plain key-rps. No key (auth off): no limit. */
	assert_true(moat_admission_key(a, "acme", "k2", NULL, &retry, &msg));
	for (int i = 0; i < 50; i++)
		assert_true(
		    moat_admission_key(a, "bob", "k3", NULL, &retry, &msg));
	for (int i = 0; i < 50; i++)
		assert_true(
		    moat_admission_key(a, "acme", "", NULL, &retry, &msg));
	moat_admission_free(a);
	moat_config_free(cfg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_burst_spreads),
		cmocka_unit_test(test_refusing_node_skipped),
		cmocka_unit_test(test_node_selector),
		cmocka_unit_test(test_overcommit),
		cmocka_unit_test(test_cordoned_and_old_protocol_skipped),
		cmocka_unit_test(test_reservation_until_survey),
		cmocka_unit_test(test_tenant_spread),
		cmocka_unit_test(test_quota_refusals),
		cmocka_unit_test(test_quota_after_destroy),
		cmocka_unit_test(test_key_rate),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
