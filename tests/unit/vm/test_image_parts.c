/*
 * test_image_parts.c: the pure pieces of vmd's images (issue 17): a
 * build script's step lines (services/vm/image_build.c), the names of a
 * build's input files, and finding the chunk id an error names
 * (image_store.c). Not for: pushes, pulls or builds themselves
 * (tests/integration/vm/test_images.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "image.h"
#include "image_build.h"
#include "image_store.h"

static void
test_step_lines(void **state)
{
	char text[64];
	uint64_t at = 0;

	(void)state;
	assert_true(vmd_image_build_parse_step(
	    "images: [12.345s] debootstrap bookworm", text, sizeof(text),
	    &at));
	assert_string_equal(text, "debootstrap bookworm");
	assert_int_equal(at, 12345);
	assert_true(vmd_image_build_parse_step("images: [0.001s] step one",
	    text, sizeof(text), &at));
	assert_int_equal(at, 1);
	/* A long text is cut to the buffer. */
	assert_true(vmd_image_build_parse_step("images: [1.000s] "
	                                       "0123456789abcdef",
	    text, 8, &at));
	assert_string_equal(text, "0123456");
	/* Not steps: errors, other output, a broken stamp, no text. */
	assert_false(vmd_image_build_parse_step("images: error: no spec", text,
	    sizeof(text), &at));
	assert_false(vmd_image_build_parse_step("some other output", text,
	    sizeof(text), &at));
	assert_false(vmd_image_build_parse_step("images: [x.001s] a", text,
	    sizeof(text), &at));
	assert_false(vmd_image_build_parse_step("images: [1.001] a", text,
	    sizeof(text), &at));
	assert_false(vmd_image_build_parse_step("images: [1.001s]   ", text,
	    sizeof(text), &at));
	assert_false(vmd_image_build_parse_step("", text, sizeof(text), &at));
}

static void
test_input_names(void **state)
{
	char long_name[300];

	(void)state;
	assert_true(vmd_image_input_name_ok("requirements.txt"));
	assert_true(vmd_image_input_name_ok("a..b"));
	assert_false(vmd_image_input_name_ok(""));
	assert_false(vmd_image_input_name_ok(".."));
	assert_false(vmd_image_input_name_ok("."));
	assert_false(vmd_image_input_name_ok(".hidden"));
	assert_false(vmd_image_input_name_ok("a/b"));
	assert_false(vmd_image_input_name_ok("/etc/passwd"));
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	assert_false(vmd_image_input_name_ok(long_name));
	/* Image names: what vmd_image_name_ok allows. */
	assert_true(vmd_image_name_ok("custom-1.2_x"));
	assert_false(vmd_image_name_ok(".custom.pull.abc"));
	assert_false(vmd_image_name_ok("a/b"));
}

static void
test_hex_id_in_message(void **state)
{
	const char *id =
	    "6a9c530c4b901761b6b0cc47933573d0a31a9e061931bfea4f670c05f5ffdf2b";
	char msg[256], out[65];

	(void)state;
	snprintf(msg, sizeof(msg),
	    "snapshot snap-01a246aa9cda889745206c4fa38dde72: chunk %s: "
	    "stored bytes do not hash",
	    id);
	assert_true(vmd_image_find_hex_id(msg, out));
	assert_string_equal(out, id);
	/* Upper case is read as lower case. */
	snprintf(msg, sizeof(msg),
	    "chunk 6A9C530C4B901761B6B0CC47933573D0A3"
	    "1A9E061931BFEA4F670C05F5FFDF2B bad");
	assert_true(vmd_image_find_hex_id(msg, out));
	assert_string_equal(out, id);
	/* 32 digits (a snapshot id) or 65 are no chunk id. */
	assert_false(vmd_image_find_hex_id(
	    "snap-01a246aa9cda889745206c4fa38dde72 failed", out));
	snprintf(msg, sizeof(msg), "%s0", id);
	assert_false(vmd_image_find_hex_id(msg, out));
	assert_false(vmd_image_find_hex_id("", out));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_step_lines),
		cmocka_unit_test(test_input_names),
		cmocka_unit_test(test_hex_id_in_message),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
