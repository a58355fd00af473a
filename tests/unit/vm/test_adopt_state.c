/*
 * test_adopt_state.c: the codec of a sandbox's state file (services/vm/
 * adopt_state.c, issue 15): a round trip of every field with awkward
 * values, and every bad or truncated file refused with a reason that
 * names what is wrong. No vmd, no files. cmocka; label "unit".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "moat/status.h"
#include "adopt.h"

static char *keys[] = { "team", "with space", "pct%and\nnewline" };
static char *values[] = { "a", "", "é\t\x01" };

static struct vmd_state_record
sample(void)
{
	struct vmd_state_record r = { 0 };

	r.id = "sb-0123456789abcdef";
	r.tenant = "acme corp";
	r.image = "python";
	r.test_mode = NULL;
	r.template_id = "tpl-1";
	r.restored_from = "snap-9";
	r.network = "allowlist:example.com:443,*.pypi.org";
	r.accel = "tcg";
	r.driver = "qemu";
	r.failure = NULL;
	r.label_keys = keys;
	r.label_values = values;
	r.n_labels = 3;
	r.vcpus = 2;
	r.memory_mib = 512;
	r.scratch_mib = 1024;
	r.boot_timeout_ms = 60000;
	r.created_unix_ms = 1700000000123ull;
	r.pulled_bytes = 1ull << 40;
	r.boot_ms = 2345;
	r.no_egress_port = true;
	r.pid = 4242;
	r.jail_uid = 200007;
	r.adoptions = 3;
	return r;
}

static char *
encode(const struct vmd_state_record *r, size_t *len)
{
	char *text = NULL;

	assert_int_equal(vmd_state_encode(r, &text, len), MOAT_OK);
	assert_non_null(text);
	return text;
}

static void
test_round_trip(void **state)
{
	struct vmd_state_record in = sample(), out;
	char *why = NULL;
	size_t len;
	char *text;
	(void)state;

	in.failure = "the VM exited unexpectedly (killed by signal 9);\n"
	             "last console lines: 100% gone";
	in.vmm_info = "slot=3 jailed=1 root=/srv/jail er/firecracker/sb-1";
	text = encode(&in, &len);
	assert_int_equal(strlen(text), len);
	/* One field a line: no raw newline or space in a value. */
	assert_null(strstr(text, "100% gone"));
	assert_int_equal(vmd_state_decode(text, len, &out, &why), MOAT_OK);
	assert_null(why);
	assert_string_equal(out.id, in.id);
	assert_string_equal(out.tenant, in.tenant);
	assert_string_equal(out.image, in.image);
	assert_null(out.test_mode);
	assert_string_equal(out.template_id, in.template_id);
	assert_string_equal(out.restored_from, in.restored_from);
	assert_string_equal(out.network, in.network);
	assert_string_equal(out.accel, in.accel);
	assert_string_equal(out.driver, in.driver);
	assert_string_equal(out.failure, in.failure);
	assert_string_equal(out.vmm_info, in.vmm_info);
	assert_int_equal(out.n_labels, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_string_equal(out.label_keys[i], keys[i]);
		assert_string_equal(out.label_values[i], values[i]);
	}
	assert_int_equal(out.vcpus, 2);
	assert_int_equal(out.memory_mib, 512);
	assert_int_equal(out.scratch_mib, 1024);
	assert_int_equal(out.boot_timeout_ms, 60000);
	assert_true(out.created_unix_ms == in.created_unix_ms);
	assert_true(out.pulled_bytes == in.pulled_bytes);
	assert_int_equal(out.boot_ms, 2345);
	assert_true(out.no_egress_port);
	assert_int_equal(out.pid, 4242);
	assert_int_equal(out.jail_uid, 200007);
	assert_int_equal(out.adoptions, 3);
	vmd_state_record_fini(&out);
	assert_null(out.id);
	free(text);
}

/* Decodes `text` expecting a refusal whose reason holds `want`. */
static void
refused(const char *text, size_t len, const char *want)
{
	struct vmd_state_record out;
	char *why = NULL;

	assert_int_equal(vmd_state_decode(text, len, &out, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(why);
	if (strstr(why, want) == NULL)
		fail_msg("reason \"%s\" does not say \"%s\"", why, want);
	vmd_state_record_fini(&out);
	free(why);
}

static void
test_every_truncation_refused(void **state)
{
	struct vmd_state_record in = sample();
	size_t len;
	char *text = encode(&in, &len);
	(void)state;

	/* Every cut short of the whole file is refused, never half read. */
	for (size_t n = 0; n < len; n++) {
		struct vmd_state_record out;
		char *why = NULL;

		assert_int_equal(vmd_state_decode(text, n, &out, &why),
		    MOAT_INVALID_ARGUMENT);
		assert_non_null(why);
		if (n > strlen(VMD_STATE_MAGIC) + 1 && n < len - 1 &&
		    strstr(why, "truncated") == NULL &&
		    strstr(why, "escape") == NULL)
			fail_msg("cut at %zu: \"%s\"", n, why);
		vmd_state_record_fini(&out);
		free(why);
	}
	refused(text, 0, "empty");
	free(text);
}

static void
test_bad_files_refused(void **state)
{
	(void)state;
	refused("moat-sandbox-state 2\nend\n", 25, "does not start");
	refused("garbage", 7, "does not start");
#define HEAD "moat-sandbox-state 1\n"
#define BODY "tenant t\nimage python\ndriver qemu\nvcpus 1\nmemory-mib 256\n"
	{
		const char *t =
		    HEAD "id sb-0123456789abcdef\n" BODY "pid 77\nend\n";
		struct vmd_state_record out;
		char *why = NULL;

		/* The minimal file is fine. */
		assert_int_equal(vmd_state_decode(t, strlen(t), &out, &why),
		    MOAT_OK);
		vmd_state_record_fini(&out);
	}
	{
		const char *t = HEAD BODY "pid 77\nend\n";
		refused(t, strlen(t), "no id");
	}
	{
		const char *t = HEAD "id sb-XYZ\n" BODY "pid 77\nend\n";
		refused(t, strlen(t), "not a sandbox id");
	}
	{
		const char *t = HEAD "id sb-0123456789abcdef\n" BODY "end\n";
		refused(t, strlen(t), "no VMM pid");
	}
	{
		const char *t =
		    HEAD "id sb-0123456789abcdef\n" BODY "pid -3\nend\n";
		refused(t, strlen(t), "line 8: pid");
	}
	{
		const char *t = HEAD "id sb-0123456789abcdef\n" BODY
		                     "vcpus 99999999999\npid 7\nend\n";
		refused(t, strlen(t), "not a number");
	}
	{
		const char *t = HEAD "id sb-0123456789abcdef\n" BODY
		                     "tenant a%zz\npid 7\nend\n";
		refused(t, strlen(t), "escape");
	}
	{
		const char *t = HEAD "id sb-0123456789abcdef\n" BODY
		                     "tenant a%00b\npid 7\nend\n";
		refused(t, strlen(t), "escape");
	}
	{
		const char *t = HEAD "id sb-0123456789abcdef\n" BODY
		                     "label onlykey\npid 7\nend\n";
		refused(t, strlen(t), "label");
	}
	{
		const char *t =
		    HEAD "id sb-0123456789abcdef\n" BODY "pid 7\nend\nmore\n";
		refused(t, strlen(t), "after the end");
	}
	{
		static const char t[] =
		    HEAD "id sb-0123456789abcdef\n"
		         "tenant a\0b\n" BODY "pid 7\nend\n";
		refused(t, sizeof(t) - 1, "NUL");
	}
	{
		char *big = calloc(1, VMD_STATE_MAX + 2);

		assert_non_null(big);
		memset(big, 'x', VMD_STATE_MAX + 1);
		refused(big, VMD_STATE_MAX + 1, "cap");
		free(big);
	}
}

static void
test_unknown_keys_skipped(void **state)
{
	const char *t = HEAD "id sb-0123456789abcdef\n" BODY
	                     "a-newer-field 12\npid 7\nend\n";
	struct vmd_state_record out;
	char *why = NULL;
	(void)state;

	assert_int_equal(vmd_state_decode(t, strlen(t), &out, &why), MOAT_OK);
	assert_int_equal(out.pid, 7);
	vmd_state_record_fini(&out);
}

/* A file from before the driver kept its vmm-info line still reads;
 * the driver then says why it cannot adopt (firecracker.c). */
static void
test_without_vmm_info(void **state)
{
	struct vmd_state_record in = sample(), out;
	char *why = NULL;
	size_t len;
	char *text;
	(void)state;

	text = encode(&in, &len);
	assert_null(strstr(text, "vmm-info"));
	assert_int_equal(vmd_state_decode(text, len, &out, &why), MOAT_OK);
	assert_null(out.vmm_info);
	assert_int_equal(out.pid, 4242);
	vmd_state_record_fini(&out);
	free(text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_without_vmm_info),
		cmocka_unit_test(test_every_truncation_refused),
		cmocka_unit_test(test_bad_files_refused),
		cmocka_unit_test(test_unknown_keys_skipped),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
