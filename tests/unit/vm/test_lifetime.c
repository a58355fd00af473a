/*
 * test_lifetime.c: the expiry rules of sandbox lifetimes (services/vm/
 * lifetime.c, issue 15) as pure functions: a timeout fires at its
 * instant, busy or not; an idle timeout only without a call and without
 * a running exec; SetTimeout's rules (extend from now, leave, clear) and
 * its refusals; and the state file keeps the lifetime, while a file of an
 * older vmd (without the keys) still loads, with none. No vmd, no VM.
 * cmocka; label "unit".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "moat/status.h"
#include "adopt.h"
#include "lifetime_rules.h"

#define T0 1700000000000ull

static void
test_timeout_fires_at_its_instant(void **state)
{
	struct vmd_lifetime lt;
	(void)state;

	vmd_lifetime_init(&lt, 3, 0, T0);
	assert_int_equal(lt.expires_unix_ms, T0 + 3000);
	assert_int_equal(vmd_lifetime_due(&lt, false, T0 + 2999),
	    VMD_EXPIRY_NONE);
	assert_int_equal(vmd_lifetime_due(&lt, false, T0 + 3000),
	    VMD_EXPIRY_TIMEOUT);
	/* A running exec does not keep a timeout from firing. */
	assert_int_equal(vmd_lifetime_due(&lt, true, T0 + 5000),
	    VMD_EXPIRY_TIMEOUT);
	/* 0: never. */
	vmd_lifetime_init(&lt, 0, 0, T0);
	assert_int_equal(lt.expires_unix_ms, 0);
	assert_int_equal(vmd_lifetime_due(&lt, false, UINT64_MAX / 2),
	    VMD_EXPIRY_NONE);
	assert_string_equal(vmd_expiry_name(VMD_EXPIRY_TIMEOUT), "timeout");
}

static void
test_idle_fires_only_without_calls(void **state)
{
	struct vmd_lifetime lt;
	(void)state;

	vmd_lifetime_init(&lt, 0, 2, T0);
	assert_int_equal(vmd_lifetime_due(&lt, false, T0 + 1999),
	    VMD_EXPIRY_NONE);
	/* A call at +1.5 s moves the idle deadline to +3.5 s. */
	lt.last_active_unix_ms = T0 + 1500;
	assert_int_equal(vmd_lifetime_due(&lt, false, T0 + 3000),
	    VMD_EXPIRY_NONE);
	assert_int_equal(vmd_lifetime_due(&lt, false, T0 + 3500),
	    VMD_EXPIRY_IDLE);
	/* A running exec is activity. */
	assert_int_equal(vmd_lifetime_due(&lt, true, T0 + 60000),
	    VMD_EXPIRY_NONE);
	/* The timeout wins when both are due. */
	lt.expires_unix_ms = T0 + 3000;
	assert_int_equal(vmd_lifetime_due(&lt, false, T0 + 4000),
	    VMD_EXPIRY_TIMEOUT);
	assert_string_equal(vmd_expiry_name(VMD_EXPIRY_IDLE), "idle timeout");
}

static void
test_set_timeout_rules(void **state)
{
	struct vmd_lifetime lt;
	const char *why;
	(void)state;

	vmd_lifetime_init(&lt, 3, 5, T0);
	/* Extend from now, past the first expiry; idle left as it was. */
	vmd_lifetime_set(&lt, 10, 0, false, T0 + 2000);
	assert_int_equal(lt.expires_unix_ms, T0 + 12000);
	assert_int_equal(lt.idle_timeout_s, 5);
	assert_int_equal(lt.last_active_unix_ms, T0 + 2000);
	assert_int_equal(vmd_lifetime_due(&lt, false, T0 + 4000),
	    VMD_EXPIRY_NONE);
	/* Timeout left, idle timeout changed, then cleared. */
	vmd_lifetime_set(&lt, 0, 60, false, T0 + 3000);
	assert_int_equal(lt.expires_unix_ms, T0 + 12000);
	assert_int_equal(lt.idle_timeout_s, 60);
	vmd_lifetime_set(&lt, 0, 0, true, T0 + 3000);
	assert_int_equal(lt.idle_timeout_s, 0);
	/* Requests that ask nothing, or both idle and clear, are refused
	 * with what to send. */
	assert_int_equal(vmd_lifetime_check_request(0, 0, false, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "timeout_s"));
	assert_int_equal(vmd_lifetime_check_request(0, 5, true, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "clear_idle_timeout"));
	assert_int_equal(vmd_lifetime_check_request(5, 0, false, &why),
	    MOAT_OK);
	assert_int_equal(vmd_lifetime_check_request(0, 0, true, &why),
	    MOAT_OK);
}

static struct vmd_state_record
record(void)
{
	struct vmd_state_record r = { 0 };

	r.id = "sb-0123456789abcdef";
	r.tenant = "acme";
	r.image = "default";
	r.network = "none";
	r.accel = "tcg";
	r.driver = "qemu";
	r.vcpus = 1;
	r.memory_mib = 256;
	r.scratch_mib = 1024;
	r.created_unix_ms = T0;
	r.pid = 42;
	return r;
}

/* Removes every line starting with `key ` from text (in place). */
static void
drop_line(char *text, const char *key)
{
	char *p = strstr(text, key);
	char *nl;

	assert_non_null(p);
	nl = strchr(p, '\n');
	assert_non_null(nl);
	memmove(p, nl + 1, strlen(nl + 1) + 1);
}

static void
test_state_file_keeps_lifetime(void **state)
{
	struct vmd_state_record in = record(), out;
	char *text = NULL, *why = NULL;
	size_t len;
	(void)state;

	in.expires_unix_ms = T0 + 3000;
	in.idle_timeout_s = 7;
	in.last_active_unix_ms = T0 + 1000;
	assert_int_equal(vmd_state_encode(&in, &text, &len), MOAT_OK);
	assert_int_equal(vmd_state_decode(text, len, &out, &why), MOAT_OK);
	assert_int_equal(out.expires_unix_ms, T0 + 3000);
	assert_int_equal(out.idle_timeout_s, 7);
	assert_int_equal(out.last_active_unix_ms, T0 + 1000);
	vmd_state_record_fini(&out);
	/* An older vmd's file has none of the keys: it loads, no timeout. */
	drop_line(text, "expires-unix-ms ");
	drop_line(text, "idle-timeout-s ");
	drop_line(text, "last-active-unix-ms ");
	assert_int_equal(vmd_state_decode(text, strlen(text), &out, &why),
	    MOAT_OK);
	assert_int_equal(out.expires_unix_ms, 0);
	assert_int_equal(out.idle_timeout_s, 0);
	assert_string_equal(out.id, "sb-0123456789abcdef");
	vmd_state_record_fini(&out);
	free(text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_timeout_fires_at_its_instant),
		cmocka_unit_test(test_idle_fires_only_without_calls),
		cmocka_unit_test(test_set_timeout_rules),
		cmocka_unit_test(test_state_file_keeps_lifetime),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
