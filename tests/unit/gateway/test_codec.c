/*
 * test_codec.c: the protobuf -> JSON codec against the proto3 JSON
 * mapping, on moat's own messages: lowerCamelCase names, 64-bit integers
 * as strings, bytes as base64, enums by name (numbers when unknown), maps
 * as objects, repeated as arrays, oneofs, defaults left out unless asked,
 * invalid UTF-8 replaced rather than producing invalid JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gateway.pb-c.h"
#include "guest.pb-c.h"
#include "moat/codec.h"
#include "moat/status.h"
#include "vm.pb-c.h"

static json_t *
encode(const void *msg, unsigned flags)
{
	json_t *j = NULL;
	char *errmsg = NULL;

	assert_int_equal(moat_codec_to_json(msg, flags, &j, &errmsg), MOAT_OK);
	assert_null(errmsg);
	assert_non_null(j);
	return j;
}

static void
test_names(void **state)
{
	char buf[64];

	assert_int_equal(moat_codec_json_name("memory_mib", buf, sizeof(buf)),
	    9);
	assert_string_equal(buf, "memoryMib");
	moat_codec_json_name("last_seen_unix_ms", buf, sizeof(buf));
	assert_string_equal(buf, "lastSeenUnixMs");
	moat_codec_json_name("id", buf, sizeof(buf));
	assert_string_equal(buf, "id");
	moat_codec_json_name("stdout", buf, 4);
	assert_string_equal(buf, "std");
}

static void
test_base64(void **state)
{
	char *s;

	s = moat_codec_base64("", 0);
	assert_string_equal(s, "");
	free(s);
	s = moat_codec_base64("f", 1);
	assert_string_equal(s, "Zg==");
	free(s);
	s = moat_codec_base64("fo", 2);
	assert_string_equal(s, "Zm8=");
	free(s);
	s = moat_codec_base64("foobar", 6);
	assert_string_equal(s, "Zm9vYmFy");
	free(s);
	s = moat_codec_base64("\x00\xff\xfe", 3);
	assert_string_equal(s, "AP/+");
	free(s);
}

static void
test_sandbox_scalars_enum_map(void **state)
{
	Moat__V1__Sandbox sb = MOAT__V1__SANDBOX__INIT;
	Moat__V1__Sandbox__LabelsEntry e1 =
	    MOAT__V1__SANDBOX__LABELS_ENTRY__INIT;
	Moat__V1__Sandbox__LabelsEntry e2 =
	    MOAT__V1__SANDBOX__LABELS_ENTRY__INIT;
	Moat__V1__Sandbox__LabelsEntry *labels[] = { &e1, &e2 };
	json_t *j, *l;

	sb.id = (char *)"sb-1";
	sb.state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING;
	sb.memory_mib = 256;
	sb.created_unix_ms = 18446744073709551615ull;
	sb.vmm_pid = -5;
	e1.key = (char *)"team";
	e1.value = (char *)"blue";
	e2.key = (char *)"run";
	e2.value = (char *)"42";
	sb.labels = labels;
	sb.n_labels = 2;

	j = encode(&sb, 0);
	assert_string_equal(json_string_value(json_object_get(j, "id")),
	    "sb-1");
	assert_string_equal(json_string_value(json_object_get(j, "state")),
	    "SANDBOX_STATE_RUNNING");
	assert_int_equal(json_integer_value(json_object_get(j, "memoryMib")),
	    256);
	/* uint64 as a string, all 20 digits kept. */
	assert_true(json_is_string(json_object_get(j, "createdUnixMs")));
	assert_string_equal(json_string_value(json_object_get(j,
	    "createdUnixMs")), "18446744073709551615");
	assert_int_equal(json_integer_value(json_object_get(j, "vmmPid")),
	    -5);
	l = json_object_get(j, "labels");
	assert_true(json_is_object(l));
	assert_int_equal(json_object_size(l), 2);
	assert_string_equal(json_string_value(json_object_get(l, "team")),
	    "blue");
	assert_string_equal(json_string_value(json_object_get(l, "run")),
	    "42");
	/* Defaults are left out. */
	assert_null(json_object_get(j, "vcpus"));
	assert_null(json_object_get(j, "nodeId"));
	assert_null(json_object_get(j, "bootMs"));
	json_decref(j);

	/* ... unless asked for, and with .proto names when asked. */
	j = encode(&sb, MOAT_CODEC_EMIT_DEFAULTS | MOAT_CODEC_PROTO_NAMES);
	assert_int_equal(json_integer_value(json_object_get(j, "vcpus")), 0);
	assert_string_equal(json_string_value(json_object_get(j, "node_id")),
	    "");
	assert_string_equal(json_string_value(json_object_get(j,
	    "boot_ms")), "0");
	assert_non_null(json_object_get(j, "memory_mib"));
	assert_null(json_object_get(j, "memoryMib"));
	json_decref(j);

	j = encode(&sb, MOAT_CODEC_ENUMS_AS_INTS);
	assert_int_equal(json_integer_value(json_object_get(j, "state")), 2);
	json_decref(j);

	/* A value this build does not know is written as its number. */
	sb.state = 99;
	j = encode(&sb, 0);
	assert_int_equal(json_integer_value(json_object_get(j, "state")), 99);
	json_decref(j);
}

static void
test_bytes_nested_and_int64(void **state)
{
	Moat__V1__ExecResult r = MOAT__V1__EXEC_RESULT__INIT;
	Moat__V1__ExecStatus st = MOAT__V1__EXEC_STATUS__INIT;
	Moat__V1__FileInfo fi = MOAT__V1__FILE_INFO__INIT;
	json_t *j, *s;
	char *text = NULL, *errmsg = NULL;

	r.stdout.data = (uint8_t *)"hi\n";
	r.stdout.len = 3;
	r.stderr.data = (uint8_t *)"\x00\x01\xff";
	r.stderr.len = 3;
	st.exited = 1;
	st.exit_code = 3;
	st.stdout_bytes = 3;
	r.status = &st;
	j = encode(&r, 0);
	assert_string_equal(json_string_value(json_object_get(j, "stdout")),
	    "aGkK");
	assert_string_equal(json_string_value(json_object_get(j, "stderr")),
	    "AAH/");
	s = json_object_get(j, "status");
	assert_true(json_is_object(s));
	assert_true(json_is_true(json_object_get(s, "exited")));
	assert_int_equal(json_integer_value(json_object_get(s, "exitCode")),
	    3);
	assert_string_equal(json_string_value(json_object_get(s,
	    "stdoutBytes")), "3");
	assert_null(json_object_get(s, "timedOut"));
	json_decref(j);

	fi.name = (char *)"f";
	fi.mtime_ns = -1234567890123ll;
	fi.type = MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
	assert_int_equal(moat_codec_to_json_string(&fi.base, 0, 0, &text,
	    &errmsg), MOAT_OK);
	assert_string_equal(text, "{\"name\":\"f\",\"mtimeNs\":"
	    "\"-1234567890123\",\"type\":\"FILE_TYPE_DIRECTORY\"}");
	free(text);
}

static void
test_repeated_and_oneof(void **state)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__NodeList nl = MOAT__V1__NODE_LIST__INIT;
	char *argv[] = { (char *)"ls", (char *)"-l" };
	json_t *j, *e, *a;

	es.argv = argv;
	es.n_argv = 2;
	req.id = 9;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = &es;
	j = encode(&req, 0);
	assert_string_equal(json_string_value(json_object_get(j, "id")), "9");
	e = json_object_get(j, "execStart");
	assert_true(json_is_object(e));
	a = json_object_get(e, "argv");
	assert_true(json_is_array(a));
	assert_int_equal(json_array_size(a), 2);
	assert_string_equal(json_string_value(json_array_get(a, 1)), "-l");
	/* Only the member that is set; none of the others. */
	assert_null(json_object_get(j, "execInput"));
	assert_null(json_object_get(j, "fileRead"));
	json_decref(j);

	/* Empty repeated: left out, or [] with defaults. */
	j = encode(&nl, 0);
	assert_int_equal(json_object_size(j), 0);
	json_decref(j);
	j = encode(&nl, MOAT_CODEC_EMIT_DEFAULTS);
	assert_true(json_is_array(json_object_get(j, "nodes")));
	json_decref(j);
}

static void
test_doubles_and_bad_utf8(void **state)
{
	Moat__V1__GuestInfo gi = MOAT__V1__GUEST_INFO__INIT;
	json_t *j;

	gi.load1 = 0.5;
	gi.load5 = 1.0 / 0.0;
	gi.load15 = -1.0 / 0.0;
	gi.kernel = (char *)"6.1\xff\xfe-ok\xc3\xa9";
	j = encode(&gi, 0);
	assert_true(json_is_real(json_object_get(j, "load1")));
	assert_string_equal(json_string_value(json_object_get(j, "load5")),
	    "Infinity");
	assert_string_equal(json_string_value(json_object_get(j, "load15")),
	    "-Infinity");
	assert_string_equal(json_string_value(json_object_get(j, "kernel")),
	    "6.1\xef\xbf\xbd\xef\xbf\xbd-ok\xc3\xa9");
	json_decref(j);
}

static void
test_null_message(void **state)
{
	json_t *j = (json_t *)1;
	char *errmsg = NULL;

	assert_int_equal(moat_codec_to_json(NULL, 0, &j, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(j);
	assert_non_null(errmsg);
	free(errmsg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_base64),
		cmocka_unit_test(test_sandbox_scalars_enum_map),
		cmocka_unit_test(test_bytes_nested_and_int64),
		cmocka_unit_test(test_repeated_and_oneof),
		cmocka_unit_test(test_doubles_and_bad_utf8),
		cmocka_unit_test(test_null_message),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
