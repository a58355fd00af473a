/*
 * test_labels.c: the node's labels ([vmd] labels, --label): k=v lists
 * parsed, a later value wins, bad entries refused with what to write,
 * and the copies put in a Node freed cleanly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "labels.h"
#include "moat/status.h"

static void
test_parse_and_fill(void **state)
{
	struct vmd_labels l = { 0 };
	Moat__V1__Node node = MOAT__V1__NODE__INIT;
	char *err = NULL;

	(void)state;
	assert_int_equal(vmd_labels_parse(&l, "zone=a, kvm=true,,",
	                     "[vmd] "
	                     "labels",
	                     &err),
	    MOAT_OK);
	assert_int_equal(vmd_labels_parse(&l,
	                     "zone=b,example.com/disk=", "--label", &err),
	    MOAT_OK);
	assert_int_equal(l.n, 3);
	assert_string_equal(l.keys[0], "zone");
	assert_string_equal(l.values[0], "b");
	assert_string_equal(l.values[1], "true");
	assert_string_equal(l.keys[2], "example.com/disk");
	assert_string_equal(l.values[2], "");
	assert_int_equal(vmd_labels_fill(&l, &node), MOAT_OK);
	assert_int_equal(node.n_labels, 3);
	assert_string_equal(node.labels[1]->key, "kvm");
	vmd_labels_fill_free(&node);
	assert_int_equal(node.n_labels, 0);
	assert_int_equal(vmd_labels_parse(&l, NULL, "x", &err), MOAT_OK);
	vmd_labels_free(&l);
}

static void
test_bad_labels(void **state)
{
	static const char *const bad[] = { "zone", "=a", "zo ne=a", "zone=a/b",
		"k=v,x" };
	struct vmd_labels l = { 0 };
	char *err = NULL;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(vmd_labels_parse(&l, bad[i], "[vmd] labels",
		                     &err),
		    MOAT_INVALID_ARGUMENT);
		assert_non_null(strstr(err, "[vmd] labels"));
		assert_non_null(strstr(err, "key=value"));
		free(err);
		err = NULL;
	}
	vmd_labels_free(&l);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_and_fill),
		cmocka_unit_test(test_bad_labels),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
