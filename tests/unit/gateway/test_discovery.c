/*
 * test_discovery.c: the node table's rules (a node silent for three
 * surveys is unavailable, and comes back when it answers) and real
 * discovery over a surveyor socket with fake respondents: a node appears,
 * drops out when it stops answering, and a respondent that answers
 * garbage is ignored without stopping the others.
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
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "fake_node.h"
#include "gateway.h"
#include "moat/util.h"

#define INTERVAL_MS 100

static Moat__V1__Node *
make_node(const char *id, const char *url)
{
	Moat__V1__Node *n = malloc(sizeof(*n));

	moat__v1__node__init(n);
	n->node_id = strdup(id);
	n->rpc_url = strdup(url);
	return n;
}

/* node_state: -1 unknown, 0 unavailable, 1 available. */
static int
node_state(struct moat_nodes *nodes, const char *id)
{
	Moat__V1__Node **list;
	size_t n;
	int state = -1;

	assert_int_equal(moat_nodes_snapshot(nodes, &list, &n), MOAT_OK);
	for (size_t i = 0; i < n; i++)
		if (strcmp(list[i]->node_id, id) == 0)
			state = list[i]->available ? 1 : 0;
	moat_nodes_snapshot_free(list, n);
	return state;
}

static void
test_three_missed_surveys(void **state)
{
	struct moat_nodes nodes;

	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	assert_int_equal(moat_nodes_seen(&nodes, make_node("n1", "ipc:///a"),
	                     1),
	    MOAT_OK);
	moat_nodes_round_end(&nodes); /* answered this round */
	assert_int_equal(node_state(&nodes, "n1"), 1);
	moat_nodes_round_end(&nodes); /* missed 1 */
	moat_nodes_round_end(&nodes); /* missed 2 */
	assert_int_equal(node_state(&nodes, "n1"), 1);
	moat_nodes_round_end(&nodes); /* missed 3 */
	assert_int_equal(node_state(&nodes, "n1"), 0);
	assert_int_equal(moat_nodes_seen(&nodes, make_node("n1", "ipc:///b"),
	                     2),
	    MOAT_OK);
	assert_int_equal(node_state(&nodes, "n1"), 1);
	moat_nodes_fini(&nodes);
}

static void
test_answer_without_id_is_refused(void **state)
{
	struct moat_nodes nodes;
	char long_id[300];

	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	assert_int_equal(moat_nodes_seen(&nodes, make_node("", "ipc:///a"), 1),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(moat_nodes_seen(&nodes, make_node("x", ""), 1),
	    MOAT_INVALID_ARGUMENT);
	memset(long_id, 'z', sizeof(long_id) - 1);
	long_id[sizeof(long_id) - 1] = '\0';
	assert_int_equal(moat_nodes_seen(&nodes,
	                     make_node(long_id, "ipc:///a"), 1),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(node_state(&nodes, "x"), -1);
	moat_nodes_fini(&nodes);
}

/* wait_state: polls until node `id` is in `want` or ~5 s pass. */
static int
wait_state(struct moat_nodes *nodes, const char *id, int want)
{
	int s = -2;

	for (int i = 0; i < 250; i++) {
		if ((s = node_state(nodes, id)) == want)
			return s;
		nng_msleep(20);
	}
	return s;
}

static void
test_survey_finds_and_drops_nodes(void **state)
{
	char dir[] = "/tmp/moat-disc-XXXXXX";
	struct fake_node good, bad;
	struct moat_nodes nodes;
	struct moat_discovery *d = NULL;
	char *survey_url, *errmsg = NULL;

	assert_non_null(mkdtemp(dir));
	survey_url = moat_asprintf("ipc://%s/survey.sock", dir);
	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	assert_int_equal(moat_discovery_start(&d, &nodes, survey_url,
	                     INTERVAL_MS, NULL, &errmsg),
	    MOAT_OK);

	assert_int_equal(fake_node_start(&bad, "bad", dir, survey_url), 0);
	atomic_store(&bad.garbage, true);
	assert_int_equal(fake_node_start(&good, "good", dir, survey_url), 0);

	assert_int_equal(wait_state(&nodes, "good", 1), 1);
	/* The garbage answers were read and ignored. */
	for (int i = 0; i < 100 && atomic_load(&bad.surveys_answered) < 2; i++)
		nng_msleep(20);
	assert_true(atomic_load(&bad.surveys_answered) >= 2);
	assert_int_equal(node_state(&nodes, "bad"), -1);

	/* A node that goes quiet drops out after three surveys... */
	atomic_store(&good.silent, true);
	nng_msleep(INTERVAL_MS);
	assert_int_equal(wait_state(&nodes, "good", 0), 0);
	/* ...and is back on its next answer. */
	atomic_store(&good.silent, false);
	assert_int_equal(wait_state(&nodes, "good", 1), 1);

	/* A node that never answers again drops out too. */
	fake_node_halt(&good);
	assert_int_equal(wait_state(&nodes, "good", 0), 0);

	/* Quiet peers first, then the surveyor, then the respondents (see
	 * fake_node_halt). */
	fake_node_halt(&bad);
	moat_discovery_stop(d);
	fake_node_stop(&good);
	fake_node_stop(&bad);
	moat_nodes_fini(&nodes);
	free(survey_url);
	moat_rm_rf(dir);
}

static void
test_survey_url_in_use(void **state)
{
	char dir[] = "/tmp/moat-disc-XXXXXX";
	struct moat_nodes nodes;
	struct moat_discovery *d1 = NULL, *d2 = NULL;
	char *url, *errmsg = NULL;

	assert_non_null(mkdtemp(dir));
	url = moat_asprintf("ipc://%s/survey.sock", dir);
	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	assert_int_equal(moat_discovery_start(&d1, &nodes, url, INTERVAL_MS,
	                     NULL, &errmsg),
	    MOAT_OK);
	assert_int_not_equal(moat_discovery_start(&d2, &nodes, url,
	                         INTERVAL_MS, NULL, &errmsg),
	    MOAT_OK);
	assert_null(d2);
	assert_non_null(strstr(errmsg, url));
	free(errmsg);
	moat_discovery_stop(d1);
	moat_nodes_fini(&nodes);
	free(url);
	moat_rm_rf(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_three_missed_surveys),
		cmocka_unit_test(test_answer_without_id_is_refused),
		cmocka_unit_test(test_survey_finds_and_drops_nodes),
		cmocka_unit_test(test_survey_url_in_use),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
