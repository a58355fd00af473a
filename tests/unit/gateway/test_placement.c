/*
 * test_placement.c: which node placement picks, and why it refuses:
 * fewest sandboxes first, free memory and per-sandbox limits respected,
 * unavailable nodes skipped, nodes holding the image first, and each
 * refusal's status and message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway.h"

static Moat__V1__Node nodes_storage[4];
static Moat__V1__Node *nodes[4];

static void
set_node(int i, const char *id, bool available, uint32_t sandboxes,
    uint64_t total, uint64_t used)
{
	Moat__V1__Node *n = &nodes_storage[i];

	moat__v1__node__init(n);
	n->node_id = (char *)id;
	n->rpc_url = (char *)"ipc:///nowhere";
	n->protocol_version = 2;
	n->available = available;
	n->sandboxes = sandboxes;
	n->memory_mib_total = total;
	n->memory_mib_used = used;
	n->vcpus_total = 8;
	n->max_vcpus = 4;
	n->max_memory_mib = 2048;
	nodes[i] = n;
}

static int
choose(size_t n, uint32_t vcpus, uint32_t mem, const char *image,
    size_t *chosen, char **msg)
{
	*msg = NULL;
	return moat_placement_choose(nodes, n, vcpus, mem, image,
	    "ipc:///state/survey.sock", chosen, msg);
}

static void
test_fewest_sandboxes_first(void **state)
{
	size_t chosen;
	char *msg;

	set_node(0, "a", true, 3, 4096, 768);
	set_node(1, "b", true, 1, 4096, 256);
	set_node(2, "c", true, 2, 4096, 512);
	assert_int_equal(choose(3, 0, 0, "", &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 1);
	assert_null(msg);
}

static void
test_tie_breaks_on_free_memory_then_id(void **state)
{
	size_t chosen;
	char *msg;

	set_node(0, "a", true, 1, 4096, 1024);
	set_node(1, "b", true, 1, 8192, 1024);
	assert_int_equal(choose(2, 1, 256, NULL, &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 1);
	set_node(1, "b", true, 1, 4096, 1024);
	assert_int_equal(choose(2, 1, 256, NULL, &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 0); /* same everything: "a" < "b" */
}

static void
test_skips_unavailable_and_full(void **state)
{
	size_t chosen;
	char *msg;

	set_node(0, "down", false, 0, 65536, 0);
	set_node(1, "full", true, 0, 1024, 1000);
	set_node(2, "ok", true, 5, 4096, 2048);
	assert_int_equal(choose(3, 1, 512, "", &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 2);
}

static void
test_no_node_is_unavailable(void **state)
{
	size_t chosen;
	char *msg;

	assert_int_equal(choose(0, 0, 0, "", &chosen, &msg), MOAT_UNAVAILABLE);
	assert_non_null(strstr(msg, "no vmd node is available"));
	assert_non_null(strstr(msg, "deploy/moat-stack start"));
	assert_non_null(strstr(msg, "ipc:///state/survey.sock"));
	free(msg);
	set_node(0, "down", false, 0, 4096, 0);
	assert_int_equal(choose(1, 0, 0, "", &chosen, &msg), MOAT_UNAVAILABLE);
	free(msg);
}

static void
test_full_nodes_are_resource_exhausted(void **state)
{
	size_t chosen;
	char *msg;

	set_node(0, "a", true, 7, 2048, 1900);
	set_node(1, "b", true, 7, 2048, 1800);
	assert_int_equal(choose(2, 1, 512, "", &chosen, &msg),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(msg, "full"));
	assert_non_null(strstr(msg, "248 MiB free"));
	free(msg);
}

static void
test_too_big_is_invalid_argument(void **state)
{
	size_t chosen;
	char *msg;

	set_node(0, "a", true, 0, 65536, 0);
	assert_int_equal(choose(1, 16, 256, "", &chosen, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "4 vcpus"));
	free(msg);
	assert_int_equal(choose(1, 1, 4096, "", &chosen, &msg),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(msg, "2048 MiB"));
	free(msg);
}

/* Issue 17: a node holding the image wins over one that would pull it
 * (even with more sandboxes); an image no node holds goes where the
 * other rules say (that node pulls it from moat-snapd); "" is
 * "default". */
static void
test_image_holders_preferred(void **state)
{
	static char *images[] = { (char *)"default", (char *)"python" };
	size_t chosen;
	char *msg;

	set_node(0, "a", true, 0, 4096, 0);
	set_node(1, "b", true, 3, 4096, 0);
	nodes_storage[1].images = images;
	nodes_storage[1].n_images = 2;
	nodes_storage[0].images = images;
	nodes_storage[0].n_images = 1;
	assert_int_equal(choose(2, 0, 0, "python", &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 1);
	assert_int_equal(choose(2, 0, 0, "rust", &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 0);
	assert_null(msg);
	/* The holder is full: the node that must pull is still chosen. */
	set_node(1, "b", true, 3, 4096, 4000);
	nodes_storage[1].images = images;
	nodes_storage[1].n_images = 2;
	assert_int_equal(choose(2, 0, 0, "python", &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 0);
	/* "" is "default", which only "b" lists now. */
	set_node(1, "b", true, 3, 4096, 0);
	nodes_storage[1].images = images;
	nodes_storage[1].n_images = 2;
	nodes_storage[0].images = images + 1;
	nodes_storage[0].n_images = 1;
	assert_int_equal(choose(2, 0, 0, "", &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 1);
	/* The only eligible node lacks it: chosen anyway. */
	nodes_storage[1].available = false;
	assert_int_equal(choose(2, 0, 0, "", &chosen, &msg), MOAT_OK);
	assert_int_equal(chosen, 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fewest_sandboxes_first),
		cmocka_unit_test(test_tie_breaks_on_free_memory_then_id),
		cmocka_unit_test(test_skips_unavailable_and_full),
		cmocka_unit_test(test_no_node_is_unavailable),
		cmocka_unit_test(test_full_nodes_are_resource_exhausted),
		cmocka_unit_test(test_too_big_is_invalid_argument),
		cmocka_unit_test(test_image_holders_preferred),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
