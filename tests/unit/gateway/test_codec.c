/*
 * test_codec.c: the protobuf -> JSON codec against the proto3 JSON
 * mapping, on moat's own messages: lowerCamelCase names, 64-bit integers
 * as strings, bytes as base64, enums by name (numbers when unknown), maps
 * as objects, repeated as arrays, oneofs, defaults left out unless asked,
 * invalid UTF-8 replaced rather than producing invalid JSON; and JSON ->
 * message: every field type survives the round trip, every spelling the
 * mapping allows is accepted, and every kind of bad input is refused
 * with the field's path named (and nothing leaked, under ASan).
 */
#include <math.h>
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
	assert_string_equal(json_string_value(
	                        json_object_get(j, "createdUnixMs")),
	    "18446744073709551615");
	assert_int_equal(json_integer_value(json_object_get(j, "vmmPid")), -5);
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
	assert_string_equal(json_string_value(json_object_get(j, "boot_ms")),
	    "0");
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
	assert_string_equal(json_string_value(
	                        json_object_get(s, "stdoutBytes")),
	    "3");
	assert_null(json_object_get(s, "timedOut"));
	json_decref(j);

	fi.name = (char *)"f";
	fi.mtime_ns = -1234567890123ll;
	fi.type = MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
	assert_int_equal(moat_codec_to_json_string(&fi.base, 0, 0, &text,
	                     &errmsg),
	    MOAT_OK);
	assert_string_equal(text,
	    "{\"name\":\"f\",\"mtimeNs\":"
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

/* ---- JSON -> message ---- */

/* decode_ok: `text` decoded as `d`; fails the test on any error. */
static ProtobufCMessage *
decode_ok(const ProtobufCMessageDescriptor *d, const char *text,
    unsigned flags)
{
	ProtobufCMessage *m = NULL;
	char *errmsg = NULL;
	int rv = moat_codec_from_json_text(d, text, strlen(text), flags, &m,
	    &errmsg);

	if (rv != MOAT_OK)
		fail_msg("decoding %s as %s: %s", text, d->name, errmsg);
	assert_null(errmsg);
	assert_non_null(m);
	return m;
}

/* decode_err: decoding `text` as `d` fails with `code` and a message that
 * contains `want`. */
static void
decode_err(const ProtobufCMessageDescriptor *d, const char *text, int code,
    const char *want)
{
	ProtobufCMessage *m = (ProtobufCMessage *)1;
	char *errmsg = NULL;
	int rv =
	    moat_codec_from_json_text(d, text, strlen(text), 0, &m, &errmsg);

	if (rv != code || errmsg == NULL || strstr(errmsg, want) == NULL)
		fail_msg("decoding %s as %s: got %s \"%s\", want %s \"%s\"",
		    text, d->name, moat_strerror(rv), errmsg ? errmsg : "",
		    moat_strerror(code), want);
	assert_null(m);
	free(errmsg);
}

/* round_trip: msg -> JSON (with flags) -> message encodes to the same
 * protobuf bytes as msg. */
static void
round_trip(const ProtobufCMessage *msg, unsigned flags)
{
	ProtobufCMessage *back = NULL;
	char *text = NULL, *errmsg = NULL;
	size_t n1 = protobuf_c_message_get_packed_size(msg), n2;
	uint8_t *b1 = malloc(n1 + 1), *b2;

	assert_int_equal(moat_codec_to_json_string(msg, flags, 0, &text,
	                     &errmsg),
	    MOAT_OK);
	back = decode_ok(msg->descriptor, text, 0);
	n2 = protobuf_c_message_get_packed_size(back);
	b2 = malloc(n2 + 1);
	protobuf_c_message_pack(msg, b1);
	protobuf_c_message_pack(back, b2);
	if (n1 != n2 || memcmp(b1, b2, n1) != 0)
		fail_msg("%s did not survive JSON (flags %u): %s",
		    msg->descriptor->name, flags, text);
	free(b1);
	free(b2);
	free(text);
	protobuf_c_message_free_unpacked(back, NULL);
}

static void
round_trip_all_flags(const ProtobufCMessage *msg)
{
	round_trip(msg, 0);
	round_trip(msg, MOAT_CODEC_PROTO_NAMES);
	round_trip(msg, MOAT_CODEC_ENUMS_AS_INTS | MOAT_CODEC_EMIT_DEFAULTS);
}

static void
test_decode_round_trips(void **state)
{
	Moat__V1__Sandbox sb = MOAT__V1__SANDBOX__INIT;
	Moat__V1__Sandbox__LabelsEntry e1 =
	    MOAT__V1__SANDBOX__LABELS_ENTRY__INIT;
	Moat__V1__Sandbox__LabelsEntry e2 =
	    MOAT__V1__SANDBOX__LABELS_ENTRY__INIT;
	Moat__V1__Sandbox__LabelsEntry *labels[] = { &e1, &e2 };
	Moat__V1__SandboxList list = MOAT__V1__SANDBOX_LIST__INIT;
	Moat__V1__Sandbox *sbs[] = { &sb, &sb };
	Moat__V1__ExecRequest ex = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult er = MOAT__V1__EXEC_RESULT__INIT;
	Moat__V1__ExecStatus st = MOAT__V1__EXEC_STATUS__INIT;
	Moat__V1__GuestRequest gr = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ResetAfterRestore rar = MOAT__V1__RESET_AFTER_RESTORE__INIT;
	Moat__V1__GuestInfo gi = MOAT__V1__GUEST_INFO__INIT;
	Moat__V1__FileInfo fi = MOAT__V1__FILE_INFO__INIT;
	Moat__V1__CreateSandboxRequest cr =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	char *argv[] = { (char *)"sh", (char *)"-c", (char *)"", (char *)"é" };
	uint8_t all[256];

	for (int i = 0; i < 256; i++)
		all[i] = (uint8_t)i;
	/* Strings, enum, uint32, uint64 at its maximum, negative int32,
	 * map<string, string>. */
	sb.id = (char *)"sb-1";
	sb.state = MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED;
	sb.vcpus = 4294967295u;
	sb.memory_mib = 256;
	sb.created_unix_ms = 18446744073709551615ull;
	sb.boot_ms = 1;
	sb.vmm_pid = -2147483647 - 1;
	e1.key = (char *)"team";
	e1.value = (char *)"blue \"quoted\" \\ \n";
	e2.key = (char *)"";
	e2.value = (char *)"";
	sb.labels = labels;
	sb.n_labels = 2;
	round_trip_all_flags(&sb.base);
	/* Repeated messages. */
	list.sandboxes = sbs;
	list.n_sandboxes = 2;
	round_trip_all_flags(&list.base);
	/* Repeated strings, bytes (every byte value), bool, uint32,
	 * uint64. */
	ex.sandbox_id = (char *)"sb-1";
	ex.argv = argv;
	ex.n_argv = 4;
	ex.stdin.data = all;
	ex.stdin.len = sizeof(all);
	ex.stdin_open = 1;
	ex.timeout_ms = 5000;
	ex.output_cap = 1ull << 40;
	round_trip_all_flags(&ex.base);
	/* A nested message; bytes of every length mod 3. */
	st.exited = 1;
	st.exit_code = -1;
	st.signal = 9;
	st.duration_ms = 12;
	er.status = &st;
	er.stdout.data = all;
	er.stdout.len = 1;
	er.stderr.data = all + 1;
	er.stderr.len = 2;
	round_trip_all_flags(&er.base);
	/* An empty nested message is kept as present. */
	st = (Moat__V1__ExecStatus)MOAT__V1__EXEC_STATUS__INIT;
	round_trip_all_flags(&er.base);
	/* A oneof member (a nested message with bytes). */
	rar.unix_ns = -9223372036854775807ll - 1;
	rar.entropy.data = all;
	rar.entropy.len = 32;
	gr.id = 7;
	gr.op_case = MOAT__V1__GUEST_REQUEST__OP_RESET;
	gr.reset = &rar;
	round_trip_all_flags(&gr.base);
	/* int64 and enum; doubles with NaN and infinities. */
	fi.name = (char *)"f";
	fi.mtime_ns = 9223372036854775807ll;
	fi.type = MOAT__V1__FILE_TYPE__FILE_TYPE_DIRECTORY;
	round_trip_all_flags(&fi.base);
	gi.load1 = 0.1;
	gi.load5 = 1.0 / 0.0;
	gi.load15 = -1e300;
	round_trip_all_flags(&gi.base);
	gi.load15 = -1.0 / 0.0;
	round_trip_all_flags(&gi.base);
	/* Enum of another file, bool. */
	cr.record = 1;
	cr.snapshot_policy = 2;
	cr.image = (char *)"python";
	round_trip_all_flags(&cr.base);
}

static void
test_decode_spellings(void **state)
{
	Moat__V1__ExecRequest *ex;
	Moat__V1__Sandbox *sb;
	Moat__V1__GuestInfo *gi;
	Moat__V1__GuestRequest *gr;

	/* .proto and JSON names; 32-bit and 64-bit ints as strings and
	 * numbers (integral reals and exponents too); URL-safe base64
	 * without padding; null is the default. */
	ex = (Moat__V1__ExecRequest *)decode_ok(
	    &moat__v1__exec_request__descriptor,
	    "{\"sandbox_id\": \"sb\", \"timeoutMs\": \"4294967295\", "
	    "\"output_cap\": 1e3, \"stdin\": \"_-8\", \"stdinOpen\": true, "
	    "\"argv\": [\"a\", \"b\"], \"shell\": null, \"env\": null, "
	    "\"cwd\": \"/\"}",
	    0);
	assert_string_equal(ex->sandbox_id, "sb");
	assert_int_equal(ex->timeout_ms, 4294967295u);
	assert_int_equal(ex->output_cap, 1000);
	assert_int_equal(ex->stdin.len, 2);
	assert_memory_equal(ex->stdin.data, "\xff\xef", 2);
	assert_true(ex->stdin_open);
	assert_int_equal(ex->n_argv, 2);
	assert_string_equal(ex->argv[1], "b");
	assert_string_equal(ex->shell, "");
	assert_int_equal(ex->n_env, 0);
	protobuf_c_message_free_unpacked(&ex->base, NULL);

	/* Standard base64 with and without padding. */
	ex = (Moat__V1__ExecRequest *)decode_ok(
	    &moat__v1__exec_request__descriptor, "{\"stdin\": \"+/8=\"}", 0);
	assert_memory_equal(ex->stdin.data, "\xfb\xff", 2);
	protobuf_c_message_free_unpacked(&ex->base, NULL);
	ex = (Moat__V1__ExecRequest *)decode_ok(
	    &moat__v1__exec_request__descriptor, "{\"stdin\": \"Zm9vYg\"}", 0);
	assert_int_equal(ex->stdin.len, 4);
	assert_memory_equal(ex->stdin.data, "foob", 4);
	protobuf_c_message_free_unpacked(&ex->base, NULL);
	ex = (Moat__V1__ExecRequest *)decode_ok(
	    &moat__v1__exec_request__descriptor, "{\"stdin\": \"\"}", 0);
	assert_int_equal(ex->stdin.len, 0);
	protobuf_c_message_free_unpacked(&ex->base, NULL);

	/* Enums by number (known or not: proto3 enums are open) and by
	 * name; int64 as a number; an int32 as a string. */
	sb = (Moat__V1__Sandbox *)decode_ok(&moat__v1__sandbox__descriptor,
	    "{\"state\": 2, \"bootMs\": 9007199254740993, \"vmmPid\": \"-7\","
	    " \"labels\": {\"a\": \"1\", \"b\": \"\"}}",
	    0);
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING);
	assert_int_equal(sb->boot_ms, 9007199254740993ull);
	assert_int_equal(sb->vmm_pid, -7);
	assert_int_equal(sb->n_labels, 2);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	sb = (Moat__V1__Sandbox *)decode_ok(&moat__v1__sandbox__descriptor,
	    "{\"state\": 77}", 0);
	assert_int_equal(sb->state, 77);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	sb = (Moat__V1__Sandbox *)decode_ok(&moat__v1__sandbox__descriptor,
	    "{\"state\": \"SANDBOX_STATE_STOPPED\"}", 0);
	assert_int_equal(sb->state,
	    MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED);
	protobuf_c_message_free_unpacked(&sb->base, NULL);

	/* Doubles: numbers, numeric strings, NaN and infinities. */
	gi =
	    (Moat__V1__GuestInfo *)decode_ok(&moat__v1__guest_info__descriptor,
	        "{\"load1\": \"NaN\", \"load5\": \"-Infinity\", \"load15\": "
	        "\"2.5e-1\"}",
	        0);
	assert_true(isnan(gi->load1));
	assert_true(isinf(gi->load5) && gi->load5 < 0);
	assert_true(gi->load15 == 0.25);
	protobuf_c_message_free_unpacked(&gi->base, NULL);

	/* A oneof member, and null for the other members. */
	gr = (Moat__V1__GuestRequest *)decode_ok(
	    &moat__v1__guest_request__descriptor,
	    "{\"id\": \"3\", \"fileRead\": null, \"execStart\": {\"argv\": "
	    "[\"ls\"]}}",
	    0);
	assert_int_equal(gr->op_case, MOAT__V1__GUEST_REQUEST__OP_EXEC_START);
	assert_string_equal(gr->exec_start->argv[0], "ls");
	protobuf_c_message_free_unpacked(&gr->base, NULL);

	/* Unknown fields, when asked to, are skipped. */
	ex = (Moat__V1__ExecRequest *)
	    decode_ok(&moat__v1__exec_request__descriptor,
	        "{\"future\": {\"x\": [1]}, \"cwd\": \"/tmp\"}",
	        MOAT_CODEC_IGNORE_UNKNOWN);
	assert_string_equal(ex->cwd, "/tmp");
	protobuf_c_message_free_unpacked(&ex->base, NULL);
}

static void
test_decode_errors(void **state)
{
	const ProtobufCMessageDescriptor *exd =
	    &moat__v1__exec_request__descriptor;
	const ProtobufCMessageDescriptor *erd =
	    &moat__v1__exec_result__descriptor;
	const ProtobufCMessageDescriptor *sbd = &moat__v1__sandbox__descriptor;
	const ProtobufCMessageDescriptor *grd =
	    &moat__v1__guest_request__descriptor;
	const int BAD = MOAT_INVALID_ARGUMENT;
	ProtobufCMessage *m = NULL;
	char *errmsg = NULL;

	/* Wrong types, with the field path and what came. */
	decode_err(exd, "{\"timeoutMs\": \"abc\"}", BAD,
	    "timeoutMs: expected uint32 (a number or a numeric string), got "
	    "\"abc\"");
	decode_err(erd, "{\"status\": {\"exitCode\": \"x1\"}}", BAD,
	    "status.exitCode: expected int32");
	decode_err(exd, "{\"timeoutMs\": 1.5}", BAD,
	    "timeoutMs: expected uint32");
	decode_err(exd, "{\"timeoutMs\": true}", BAD, "got true");
	decode_err(exd, "{\"timeoutMs\": \" 1\"}", BAD, "expected uint32");
	decode_err(exd, "{\"timeoutMs\": \"1x\"}", BAD, "expected uint32");
	decode_err(exd, "{\"timeoutMs\": \"\"}", BAD, "expected uint32");
	decode_err(exd, "{\"shell\": 5}", BAD,
	    "shell: expected a string, got 5");
	/* NUL: refused by the parser, and by the codec in a json_t built
	 * otherwise. */
	decode_err(exd, "{\"shell\": \"a\\u0000b\"}", BAD, "malformed JSON");
	{
		json_t *j = json_pack("{s:s%}", "shell", "a\0b", (size_t)3);
		assert_int_equal(moat_codec_from_json(exd, j, 0, &m, &errmsg),
		    BAD);
		assert_non_null(strstr(errmsg,
		    "shell: strings may not "
		    "contain NUL"));
		assert_null(m);
		free(errmsg);
		errmsg = NULL;
		json_decref(j);
	}
	decode_err(exd, "{\"stdinOpen\": \"true\"}", BAD,
	    "stdinOpen: expected true or false, got \"true\"");
	decode_err(exd, "{\"stdin\": \"*\"}", BAD, "stdin: expected base64");
	decode_err(exd, "{\"stdin\": \"Z\"}", BAD, "stdin: expected base64");
	decode_err(exd, "{\"stdin\": \"Zg=\"}", BAD, "expected base64");
	decode_err(exd, "{\"stdin\": [1]}", BAD, "got an array");
	decode_err(exd, "{\"argv\": \"ls\"}", BAD,
	    "argv: expected an array, got \"ls\"");
	decode_err(exd, "{\"argv\": [\"ls\", 1]}", BAD,
	    "argv[1]: expected a string, got 1");
	decode_err(exd, "{\"argv\": [null]}", BAD,
	    "argv[0]: array elements "
	    "may not be null");
	decode_err(sbd, "{\"labels\": [\"a\"]}", BAD,
	    "labels: expected an object (a map)");
	decode_err(sbd, "{\"labels\": {\"k\": 1}}", BAD,
	    "labels[\"k\"]: expected a string, got 1");
	decode_err(sbd, "{\"labels\": {\"k\": null}}", BAD,
	    "map values may not be null");
	decode_err(sbd, "{\"state\": \"BOGUS\"}", BAD,
	    "state: not a value of moat.v1.SandboxState, got \"BOGUS\"");
	decode_err(sbd, "{\"state\": 1.5}", BAD,
	    "state: expected a value "
	    "name or number");
	decode_err(erd, "{\"status\": 5}", BAD,
	    "status: expected an object "
	    "(moat.v1.ExecStatus), got 5");
	decode_err(&moat__v1__guest_info__descriptor, "{\"load1\": \"inf\"}",
	    BAD, "load1: expected a double");
	decode_err(&moat__v1__guest_info__descriptor,
	    "{\"load1\": "
	    "\"1e999\"}",
	    BAD, "load1: out of range for double");
	/* Ranges. */
	decode_err(exd, "{\"timeoutMs\": 4294967296}", BAD,
	    "timeoutMs: out of range for uint32, got 4294967296");
	decode_err(exd, "{\"timeoutMs\": -1}", BAD, "out of range for uint32");
	decode_err(exd, "{\"timeoutMs\": 1e10}", BAD,
	    "out of range for uint32");
	decode_err(sbd, "{\"vmmPid\": 2147483648}", BAD,
	    "vmmPid: out of range for int32");
	decode_err(sbd, "{\"vmmPid\": \"-2147483649\"}", BAD,
	    "out of range for int32");
	decode_err(exd, "{\"outputCap\": \"-1\"}", BAD,
	    "outputCap: out of range for uint64");
	decode_err(exd, "{\"outputCap\": \"18446744073709551616\"}", BAD,
	    "out of range for uint64");
	/* A number in a string is digits after one '-' at most: no white
	 * space or '+' first (strtoull would skip "\n" and wrap "-5"). */
	decode_err(exd, "{\"outputCap\": \"\\n-5\"}", BAD,
	    "outputCap: expected");
	decode_err(exd, "{\"outputCap\": \" 5\"}", BAD, "expected");
	decode_err(exd, "{\"outputCap\": \"+5\"}", BAD, "expected");
	decode_err(exd, "{\"outputCap\": \"-\"}", BAD, "expected");
	decode_err(sbd, "{\"vmmPid\": \"\\r-7\"}", BAD, "vmmPid: expected");
	decode_err(exd, "{\"outputCap\": 1.8446744073709552e19}", BAD,
	    "out of range for uint64");
	decode_err(&moat__v1__file_info__descriptor, "{\"mtimeNs\": 9.3e18}",
	    BAD, "mtimeNs: out of range for int64");
	decode_err(&moat__v1__file_info__descriptor,
	    "{\"mtimeNs\": \"9223372036854775808\"}", BAD,
	    "out of range for int64");
	/* Unknown fields, at the top and nested. */
	decode_err(exd, "{\"bogus\": 1}", BAD,
	    "bogus: unknown field of moat.v1.ExecRequest");
	decode_err(erd, "{\"status\": {\"nope\": true}}", BAD,
	    "status.nope: unknown field of moat.v1.ExecStatus");
	decode_err(grd, "{\"execStart\": {\"argv\": [], \"Argv\": []}}", BAD,
	    "execStart.Argv: unknown field");
	/* One field twice; two members of one oneof. */
	decode_err(exd, "{\"timeoutMs\": 1, \"timeout_ms\": 2}", BAD,
	    "set twice");
	decode_err(grd, "{\"execStart\": {}, \"fileRead\": {}}", BAD,
	    "only one member of a oneof may be set");
	/* Not an object; not JSON; a key twice. */
	decode_err(exd, "[1, 2]", BAD,
	    "expected an object (moat.v1.ExecRequest), got an array");
	decode_err(exd, "{\"cwd\": ", BAD, "malformed JSON at line 1");
	decode_err(exd, "", BAD, "malformed JSON");
	decode_err(exd, "{\"cwd\": \"a\", \"cwd\": \"b\"}", BAD,
	    "malformed JSON");
	/* A failure half-way through a repeated message frees what was
	 * built (ASan checks the leak). */
	decode_err(&moat__v1__sandbox_list__descriptor,
	    "{\"sandboxes\": [{\"id\": \"a\", \"labels\": {\"x\": \"y\"}}, "
	    "{\"id\": \"b\", \"vcpus\": \"many\"}]}",
	    BAD, "sandboxes[1].vcpus: expected uint32");
	decode_err(grd, "{\"id\": 1, \"execStart\": {\"argv\": [\"a\", 2]}}",
	    BAD, "execStart.argv[1]");

	/* Bad arguments. */
	assert_int_equal(moat_codec_from_json(exd, NULL, 0, &m, &errmsg),
	    MOAT_INVALID_ARGUMENT);
	assert_null(m);
	free(errmsg);
}

/* A message protoc-c would make of
 *   message Deep { Deep child = 1; float f = 2; sint32 s = 3;
 *     sfixed64 sf = 4; fixed32 fx = 5; optional uint32 opt = 6;
 *     map<int32, bool> flags = 7; }
 * written by hand: moat's protos have no recursion (for the depth limit)
 * and none of these types. */
typedef struct Deep Deep;
typedef struct {
	ProtobufCMessage base;
	int32_t key;
	protobuf_c_boolean value;
} DeepFlagsEntry;
struct Deep {
	ProtobufCMessage base;
	Deep *child;
	float f;
	int32_t s;
	int64_t sf;
	uint32_t fx;
	protobuf_c_boolean has_opt;
	uint32_t opt;
	size_t n_flags;
	DeepFlagsEntry **flags;
};
static const ProtobufCMessageDescriptor deep_descriptor;
static const ProtobufCMessageDescriptor deep_flags_entry_descriptor;

static void
deep_init(ProtobufCMessage *m)
{
	memset(m, 0, sizeof(Deep));
	m->descriptor = &deep_descriptor;
}

static void
deep_flags_entry_init(ProtobufCMessage *m)
{
	memset(m, 0, sizeof(DeepFlagsEntry));
	m->descriptor = &deep_flags_entry_descriptor;
}

static const ProtobufCFieldDescriptor deep_flags_entry_fields[] = {
	{ "key", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_INT32, 0,
	    offsetof(DeepFlagsEntry, key), NULL, NULL, 0, 0, NULL, NULL },
	{ "value", 2, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_BOOL, 0,
	    offsetof(DeepFlagsEntry, value), NULL, NULL, 0, 0, NULL, NULL },
};
static const unsigned deep_flags_entry_sorted[] = { 0, 1 };
static const ProtobufCIntRange deep_flags_entry_ranges[] = { { 1, 0 },
	{ 0, 2 } };
static const ProtobufCMessageDescriptor deep_flags_entry_descriptor = {
	PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
	"test.Deep.FlagsEntry",
	"FlagsEntry",
	"DeepFlagsEntry",
	"test",
	sizeof(DeepFlagsEntry),
	2,
	deep_flags_entry_fields,
	deep_flags_entry_sorted,
	1,
	deep_flags_entry_ranges,
	deep_flags_entry_init,
	NULL,
	NULL,
	NULL,
};

static const ProtobufCFieldDescriptor deep_fields[] = {
	{ "child", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_MESSAGE, 0,
	    offsetof(Deep, child), &deep_descriptor, NULL, 0, 0, NULL, NULL },
	{ "f", 2, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_FLOAT, 0,
	    offsetof(Deep, f), NULL, NULL, 0, 0, NULL, NULL },
	{ "s", 3, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_SINT32, 0,
	    offsetof(Deep, s), NULL, NULL, 0, 0, NULL, NULL },
	{ "sf", 4, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_SFIXED64, 0,
	    offsetof(Deep, sf), NULL, NULL, 0, 0, NULL, NULL },
	{ "fx", 5, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_FIXED32, 0,
	    offsetof(Deep, fx), NULL, NULL, 0, 0, NULL, NULL },
	{ "opt", 6, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_UINT32,
	    offsetof(Deep, has_opt), offsetof(Deep, opt), NULL, NULL, 0, 0,
	    NULL, NULL },
	{ "flags", 7, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_MESSAGE,
	    offsetof(Deep, n_flags), offsetof(Deep, flags),
	    &deep_flags_entry_descriptor, NULL, 0, 0, NULL, NULL },
};
static const unsigned deep_sorted[] = { 0, 1, 6, 5, 2, 3, 4 };
static const ProtobufCIntRange deep_ranges[] = { { 1, 0 }, { 0, 7 } };
static const ProtobufCMessageDescriptor deep_descriptor = {
	PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
	"test.Deep",
	"Deep",
	"Deep",
	"test",
	sizeof(Deep),
	7,
	deep_fields,
	deep_sorted,
	1,
	deep_ranges,
	deep_init,
	NULL,
	NULL,
	NULL,
};

/* nested_json: {"child": {"child": ... {}}} with `levels` children. */
static char *
nested_json(int levels)
{
	char *s = malloc((size_t)levels * 12 + 8), *p = s;

	for (int i = 0; i < levels; i++)
		p += sprintf(p, "{\"child\": ");
	p += sprintf(p, "{}");
	for (int i = 0; i < levels; i++)
		*p++ = '}';
	*p = '\0';
	return s;
}

static void
test_decode_other_types_and_depth(void **state)
{
	Deep *d, *back;
	char *text = NULL, *errmsg = NULL;

	d = (Deep *)decode_ok(&deep_descriptor,
	    "{\"f\": 1.5, \"s\": -3, "
	    "\"sf\": \"-9223372036854775808\", \"fx\": 4294967295, "
	    "\"opt\": 0, \"flags\": {\"-5\": true, \"7\": false}, "
	    "\"child\": {\"f\": \"Infinity\"}}",
	    0);
	assert_true(d->f == 1.5f);
	assert_int_equal(d->s, -3);
	assert_true(d->sf == INT64_MIN);
	assert_int_equal(d->fx, 4294967295u);
	/* proto3 optional: present although 0. */
	assert_true(d->has_opt);
	assert_int_equal(d->n_flags, 2);
	assert_int_equal(d->flags[0]->key, -5);
	assert_true(d->flags[0]->value);
	assert_true(isinf(d->child->f));
	/* ... and back. */
	assert_int_equal(moat_codec_to_json_string(&d->base, 0, 0, &text,
	                     &errmsg),
	    MOAT_OK);
	back = (Deep *)decode_ok(&deep_descriptor, text, 0);
	assert_true(back->has_opt && back->sf == INT64_MIN &&
	    back->n_flags == 2 && back->flags[1]->key == 7 &&
	    isinf(back->child->f));
	free(text);
	protobuf_c_message_free_unpacked(&back->base, NULL);
	protobuf_c_message_free_unpacked(&d->base, NULL);

	decode_err(&deep_descriptor, "{\"f\": 1e39}", MOAT_INVALID_ARGUMENT,
	    "f: out of range for float");
	decode_err(&deep_descriptor, "{\"s\": 2147483648}",
	    MOAT_INVALID_ARGUMENT, "s: out of range for int32");
	decode_err(&deep_descriptor, "{\"flags\": {\"x\": true}}",
	    MOAT_INVALID_ARGUMENT, "flags[\"x\"]: expected int32");
	decode_err(&deep_descriptor, "{\"flags\": {\"1\": 1}}",
	    MOAT_INVALID_ARGUMENT, "flags[\"1\"]: expected true or false");
	decode_err(&deep_descriptor,
	    "{\"child\": {\"child\": {\"s\": "
	    "\"x\"}}}",
	    MOAT_INVALID_ARGUMENT, "child.child.s: expected");

	/* 32 levels of nesting decode; 33 do not. */
	text = nested_json(32);
	d = (Deep *)decode_ok(&deep_descriptor, text, 0);
	protobuf_c_message_free_unpacked(&d->base, NULL);
	free(text);
	text = nested_json(33);
	decode_err(&deep_descriptor, text, MOAT_INVALID_ARGUMENT,
	    "nested deeper than 32 levels");
	free(text);
	text = nested_json(1000);
	decode_err(&deep_descriptor, text, MOAT_INVALID_ARGUMENT,
	    "nested deeper than 32 levels");
	free(text);
}

static void
test_base64_decode(void **state)
{
	static const char *good[][2] = {
		{ "", "" },
		{ "Zg", "f" },
		{ "Zg==", "f" },
		{ "Zm8", "fo" },
		{ "Zm8=", "fo" },
		{ "Zm9v", "foo" },
		{ "Zm9vYmFy", "foobar" },
	};
	uint8_t *out;
	size_t n;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		assert_int_equal(moat_codec_base64_decode(good[i][0],
		                     strlen(good[i][0]), &out, &n),
		    MOAT_OK);
		assert_int_equal(n, strlen(good[i][1]));
		if (n > 0)
			assert_memory_equal(out, good[i][1], n);
		free(out);
	}
	assert_int_equal(moat_codec_base64_decode("AP/+", 4, &out, &n),
	    MOAT_OK);
	assert_memory_equal(out, "\x00\xff\xfe", 3);
	free(out);
	assert_int_equal(moat_codec_base64_decode("AP_-", 4, &out, &n),
	    MOAT_OK);
	assert_memory_equal(out, "\x00\xff\xfe", 3);
	free(out);
	assert_int_equal(moat_codec_base64_decode("Zm9vY", 5, &out, &n),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(moat_codec_base64_decode("Zm=v", 4, &out, &n),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(moat_codec_base64_decode("Z===", 4, &out, &n),
	    MOAT_INVALID_ARGUMENT);
	assert_int_equal(moat_codec_base64_decode("Zm 9", 4, &out, &n),
	    MOAT_INVALID_ARGUMENT);
	assert_null(out);
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
		cmocka_unit_test(test_decode_round_trips),
		cmocka_unit_test(test_decode_spellings),
		cmocka_unit_test(test_decode_errors),
		cmocka_unit_test(test_decode_other_types_and_depth),
		cmocka_unit_test(test_base64_decode),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
