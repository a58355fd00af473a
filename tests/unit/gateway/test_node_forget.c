/*
 * test_node_forget.c: the node table drops a node that has been gone for
 * the stated time (MOAT_GATEWAY_NODE_FORGET_S, default 600 s, counted in
 * surveys missed), and only such a node: one just marked unavailable
 * stays listed, one that answers stays, 0 means never, a dropped node is
 * unknown to the connection cache and joins again when it answers.
 * moat_discovery_start turns the setting into rounds of its interval and
 * refuses a bad value naming it. A call that failed on the connection
 * of a vmd before its restart does not mark the node down once it has
 * answered again (moat_nodes_mark_down's since). Drives the table directly
 * (moat_nodes_seen, moat_nodes_round_end). Not for: the survey loop with
 * real respondents (test_discovery).
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

#include "gateway.h"
#include "moat/config.h"
#include "moat/util.h"

/* seen: node `id` answers a survey. */
static void
seen(struct moat_nodes *nodes, const char *id)
{
	Moat__V1__Node *n = calloc(1, sizeof(*n));

	assert_non_null(n);
	moat__v1__node__init(n);
	/* Freed by the table with free_unpacked, which uses free(). */
	n->node_id = strdup(id);
	n->rpc_url = strdup("ipc:///nowhere");
	assert_non_null(n->node_id);
	assert_non_null(n->rpc_url);
	assert_int_equal(moat_nodes_seen(nodes, n, moat_now_unix_ms()),
	    MOAT_OK);
}

/* listed: whether `id` is in ListNodes' view, and its availability. */
static bool
listed(struct moat_nodes *nodes, const char *id, bool *available)
{
	Moat__V1__Node **list;
	bool found = false;
	size_t n;

	assert_int_equal(moat_nodes_snapshot(nodes, &list, &n), MOAT_OK);
	for (size_t i = 0; i < n; i++)
		if (strcmp(list[i]->node_id, id) == 0) {
			found = true;
			if (available != NULL)
				*available = list[i]->available;
		}
	moat_nodes_snapshot_free(list, n);
	return found;
}

static int
table_setup(void **state)
{
	static struct moat_nodes nodes;

	if (moat_nodes_init(&nodes) != MOAT_OK)
		return -1;
	*state = &nodes;
	return 0;
}

static int
table_teardown(void **state)
{
	moat_nodes_fini(*state);
	return 0;
}

static void
test_gone_node_drops_out(void **state)
{
	struct moat_nodes *nodes = *state;
	struct moat_node_conn *conn;
	struct moat_node_id id;
	char *errmsg = NULL;
	bool available = false;

	nodes->forget_rounds = 6;
	seen(nodes, "gone");
	seen(nodes, "live");
	moat_nodes_round_end(nodes);
	for (int round = 1; round <= 5; round++) {
		seen(nodes, "live");
		moat_nodes_round_end(nodes);
		/* Unavailable after MOAT_GW_MISSED_SURVEYS, still listed. */
		assert_true(listed(nodes, "gone", &available));
		assert_int_equal(available, round < MOAT_GW_MISSED_SURVEYS);
	}
	seen(nodes, "live");
	moat_nodes_round_end(nodes);
	assert_false(listed(nodes, "gone", NULL));
	assert_true(listed(nodes, "live", &available));
	assert_true(available);
	/* Nor does the connection cache know it. */
	assert_true(moat_node_id_set(&id, "gone"));
	assert_int_equal(moat_nodes_conn_get(nodes, &id, &conn, NULL, &errmsg),
	    MOAT_NOT_FOUND);
	free(errmsg);
	/* It joins again when it answers. */
	seen(nodes, "gone");
	assert_true(listed(nodes, "gone", &available));
	assert_true(available);
}

/* A call sent before the node's last survey answer or answered call
 * (the vmd restarted meanwhile) failing late leaves the node available;
 * one sent after marks it down at once, until it answers again. */
static void
test_stale_call_keeps_node(void **state)
{
	struct moat_nodes *nodes = *state;
	struct moat_node_id id;
	uint64_t before;
	bool available = false;

	assert_true(moat_node_id_set(&id, "vm"));
	before = moat_rpc_now_ms();
	usleep(2000);
	seen(nodes, "vm");
	moat_nodes_mark_down(nodes, &id, "Test", before);
	assert_true(listed(nodes, "vm", &available));
	assert_true(available);
	assert_true(moat_nodes_is_available(nodes, &id));
	usleep(2000);
	moat_nodes_mark_down(nodes, &id, "Test", moat_rpc_now_ms());
	assert_true(listed(nodes, "vm", &available));
	assert_false(available);
	assert_false(moat_nodes_is_available(nodes, &id));
	seen(nodes, "vm");
	assert_true(moat_nodes_is_available(nodes, &id));
	/* A call answered (Health, say) counts as much as a survey. */
	before = moat_rpc_now_ms();
	usleep(2000);
	moat_nodes_answered(nodes, &id);
	moat_nodes_mark_down(nodes, &id, "Test", before);
	assert_true(moat_nodes_is_available(nodes, &id));
	/* And keeps the node from counting as silent this round. */
	for (int round = 0; round < MOAT_GW_MISSED_SURVEYS + 1; round++) {
		moat_nodes_answered(nodes, &id);
		moat_nodes_round_end(nodes);
	}
	assert_true(moat_nodes_is_available(nodes, &id));
}

static void
test_zero_never_forgets(void **state)
{
	struct moat_nodes *nodes = *state;

	assert_int_equal(nodes->forget_rounds, 0);
	seen(nodes, "ancient");
	for (int i = 0; i < 1000; i++)
		moat_nodes_round_end(nodes);
	assert_true(listed(nodes, "ancient", NULL));
}

/* start_with_config: moat_discovery_start on a fresh ipc url with
 * `config` (NULL: none) and MOAT_GATEWAY_NODE_FORGET_S = forget (NULL:
 * unset); returns its status and the table's forget_rounds in *rounds. */
static int
start_with_config(const struct moat_config *config, const char *forget,
    uint32_t interval_ms, uint32_t *rounds, char **errmsg)
{
	struct moat_discovery *d = NULL;
	struct moat_nodes nodes;
	char dir[] = "/tmp/moat-test-forget-XXXXXX";
	char url[64];
	int rv;

	if (forget != NULL)
		setenv("MOAT_GATEWAY_NODE_FORGET_S", forget, 1);
	else
		unsetenv("MOAT_GATEWAY_NODE_FORGET_S");
	assert_non_null(mkdtemp(dir));
	snprintf(url, sizeof(url), "ipc://%s/survey.sock", dir);
	assert_int_equal(moat_nodes_init(&nodes), MOAT_OK);
	rv =
	    moat_discovery_start(&d, &nodes, url, interval_ms, config, errmsg);
	*rounds = nodes.forget_rounds;
	moat_discovery_stop(d);
	moat_nodes_fini(&nodes);
	moat_rm_rf(dir);
	unsetenv("MOAT_GATEWAY_NODE_FORGET_S");
	return rv;
}

static int
start_with(const char *forget, uint32_t interval_ms, uint32_t *rounds,
    char **errmsg)
{
	return start_with_config(NULL, forget, interval_ms, rounds, errmsg);
}

/* [gateway] node-forget-s in moat.conf is read as the variable is. */
static void
test_config_key(void **state)
{
	char path[] = "/tmp/moat-test-forget-conf-XXXXXX";
	struct moat_config *config = NULL;
	char *errmsg = NULL;
	uint32_t rounds;
	FILE *f;
	int fd;

	(void)state;
	assert_true((fd = mkstemp(path)) >= 0);
	assert_non_null(f = fdopen(fd, "w"));
	fputs("[gateway]\nnode-forget-s = 20\n", f);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(moat_config_load(&config, path, &errmsg), MOAT_OK);
	assert_int_equal(start_with_config(config, NULL, 500, &rounds,
	                     &errmsg),
	    MOAT_OK);
	assert_int_equal(rounds, 40);
	moat_config_free(config);
	unlink(path);
}

static void
test_setting_becomes_rounds(void **state)
{
	char *errmsg = NULL;
	uint32_t rounds;

	(void)state;
	/* Default: 600 s; at one survey a second, 600 rounds. */
	assert_int_equal(start_with(NULL, 1000, &rounds, &errmsg), MOAT_OK);
	assert_int_equal(rounds, MOAT_GW_NODE_FORGET_S);
	assert_int_equal(start_with("30", 250, &rounds, &errmsg), MOAT_OK);
	assert_int_equal(rounds, 120);
	/* Rounded up: never dropped sooner than stated. */
	assert_int_equal(start_with("1", 300, &rounds, &errmsg), MOAT_OK);
	assert_int_equal(rounds, 4);
	assert_int_equal(start_with("0", 1000, &rounds, &errmsg), MOAT_OK);
	assert_int_equal(rounds, 0);
	assert_int_equal(start_with("ten minutes", 1000, &rounds, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(errmsg);
	assert_non_null(strstr(errmsg, "MOAT_GATEWAY_NODE_FORGET_S"));
	free(errmsg);
	errmsg = NULL;
	assert_int_equal(start_with("99999999999", 1000, &rounds, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(errmsg, "MOAT_GATEWAY_NODE_FORGET_S"));
	free(errmsg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_gone_node_drops_out,
		    table_setup, table_teardown),
		cmocka_unit_test_setup_teardown(test_zero_never_forgets,
		    table_setup, table_teardown),
		cmocka_unit_test_setup_teardown(test_stale_call_keeps_node,
		    table_setup, table_teardown),
		cmocka_unit_test(test_setting_becomes_rounds),
		cmocka_unit_test(test_config_key),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
