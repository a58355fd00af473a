/*
 * test_grpc_stream.c: the pure pieces of the gRPC door's streams and
 * reflection (gateway/grpc_stream.c, gateway/grpc_reflect.c): the
 * stream queue's caps (its own and the door's shared one) and what it
 * gives back, the request stream's message splitter, where an
 * ExecStream stands after a read; the embedded descriptor set split
 * into its files, file and symbol lookups, and reflection answers
 * decoded field by field.
 * Not for: the door on the wire (test_grpc_wire, tests/integration/grpc).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grpc.h"
#include "grpc_reflect.h"
#include "grpc_stream.h"
#include "moat/status.h"

static void
test_queue_caps(void **state)
{
	struct moat_grpc_queue a, b;
	size_t total = 0;
	uint8_t msg[100] = { 7 }, out[64];
	size_t n, got = 0;

	(void)state;
	moat_grpc_queue_init(&a, 250, &total, 400);
	moat_grpc_queue_init(&b, 1000, &total, 400);
	assert_true(moat_grpc_queue_room(&a));
	assert_int_equal(moat_grpc_queue_push(&a, msg, sizeof(msg)), MOAT_OK);
	assert_int_equal(a.bytes, 105);
	assert_int_equal(moat_grpc_queue_push(&a, msg, sizeof(msg)), MOAT_OK);
	assert_true(moat_grpc_queue_room(&a)); /* 210 < 250 */
	assert_int_equal(moat_grpc_queue_push(&a, msg, sizeof(msg)), MOAT_OK);
	/* Its own cap: no room for the producer. */
	assert_false(moat_grpc_queue_room(&a));
	assert_true(moat_grpc_queue_room(&b));
	assert_int_equal(moat_grpc_queue_push(&b, msg, sizeof(msg)), MOAT_OK);
	/* The door's: 420 >= 400, b is under its own but full all the same. */
	assert_int_equal(total, 420);
	assert_false(moat_grpc_queue_room(&b));
	/* Draining gives room back, byte for byte, prefix first. */
	n = moat_grpc_queue_read(&a, out, sizeof(out));
	assert_int_equal(n, 64);
	assert_int_equal(out[0], 0);
	assert_int_equal(out[4], 100);
	assert_int_equal(out[5], 7);
	got = n;
	while ((n = moat_grpc_queue_read(&a, out, sizeof(out))) > 0)
		got += n;
	assert_int_equal(got, 315);
	assert_int_equal(a.bytes, 0);
	assert_int_equal(total, 105);
	assert_true(moat_grpc_queue_room(&a));
	assert_true(moat_grpc_queue_room(&b));
	moat_grpc_queue_clear(&b);
	assert_int_equal(total, 0);
	/* Over the message limit: refused, nothing counted. */
	assert_int_equal(moat_grpc_queue_push(&a, msg,
	                     (size_t)MOAT_GRPC_MAX_MESSAGE + 1),
	    MOAT_RESOURCE_EXHAUSTED);
	assert_int_equal(total, 0);
}

static void
test_next_message(void **state)
{
	uint8_t buf[32] = { 0, 0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0, 0, 0 };
	const uint8_t *msg;
	size_t len, used;
	const char *why;

	(void)state;
	assert_int_equal(moat_grpc_next_message(buf, 4, 100, &msg, &len, &used,
	                     &why),
	    0);
	assert_int_equal(moat_grpc_next_message(buf, 7, 100, &msg, &len, &used,
	                     &why),
	    0);
	assert_int_equal(moat_grpc_next_message(buf, 14, 100, &msg, &len,
	                     &used, &why),
	    1);
	assert_int_equal(len, 3);
	assert_int_equal(used, 8);
	assert_memory_equal(msg, "abc", 3);
	/* The second, empty message follows. */
	assert_int_equal(moat_grpc_next_message(buf + 8, 6, 100, &msg, &len,
	                     &used, &why),
	    1);
	assert_int_equal(len, 0);
	assert_int_equal(moat_grpc_next_message(buf, 8, 2, &msg, &len, &used,
	                     &why),
	    -1);
	buf[0] = 1;
	assert_int_equal(moat_grpc_next_message(buf, 8, 100, &msg, &len, &used,
	                     &why),
	    -1);
	assert_string_equal(why, "compression not supported");
}

static void
test_exec_advance(void **state)
{
	struct moat_grpc_exec_pos p = { 0 };
	Moat__V1__ExecReadReply rr = MOAT__V1__EXEC_READ_REPLY__INIT;
	Moat__V1__ExecStatus st = MOAT__V1__EXEC_STATUS__INIT;
	uint8_t out[5] = "line1";

	(void)state;
	rr.stdout.data = out;
	rr.stdout.len = 5;
	rr.stdout_next = 5;
	assert_false(moat_grpc_exec_advance(&p, &rr));
	assert_int_equal(p.stdout_offset, 5);
	/* A node that leaves *_next 0: counted from what came. */
	rr.stdout_next = 0;
	assert_false(moat_grpc_exec_advance(&p, &rr));
	assert_int_equal(p.stdout_offset, 10);
	/* Exited with output still coming: not over yet. */
	st.exited = true;
	rr.status = &st;
	assert_false(moat_grpc_exec_advance(&p, &rr));
	rr.stdout.len = 0;
	assert_true(moat_grpc_exec_advance(&p, &rr));
	rr.status = NULL;
	rr.eof = true;
	assert_true(moat_grpc_exec_advance(&p, &rr));
}

/* field: the first field `f` (length-delimited) of message m, or NULL;
 * a test's own reader, apart from grpc_reflect.c's. */
static const uint8_t *
field(const uint8_t *m, size_t len, unsigned f, size_t *flen)
{
	size_t i = 0;

	while (i < len) {
		uint64_t key = 0, n = 0;
		unsigned sh = 0;
		do
			key |= (uint64_t)(m[i] & 0x7f) << sh, sh += 7;
		while (m[i++] & 0x80);
		if ((key & 7) == 0) {
			while (m[i++] & 0x80)
				;
			continue;
		}
		assert_int_equal(key & 7, 2);
		sh = 0;
		do
			n |= (uint64_t)(m[i] & 0x7f) << sh, sh += 7;
		while (m[i++] & 0x80);
		if ((key >> 3) == f) {
			*flen = (size_t)n;
			return m + i;
		}
		i += (size_t)n;
	}
	return NULL;
}

static struct moat_grpc_descset *
embedded(void)
{
	struct moat_grpc_descset *s = NULL;

	assert_int_equal(moat_grpc_descset_parse(moat_grpc_descriptor_set,
	                     moat_grpc_descriptor_set_len, &s),
	    MOAT_OK);
	return s;
}

static void
test_descset(void **state)
{
	struct moat_grpc_descset *s = embedded();
	const char *name;
	size_t len;
	long i;

	(void)state;
	/* common, guest, vm, gateway, session, snapshot, reflection,
	 * health. */
	assert_int_equal(moat_grpc_descset_count(s), 8);
	assert_true(moat_grpc_descset_by_name(s, "gateway.proto") >= 0);
	assert_int_equal(moat_grpc_descset_by_name(s, "nope.proto"), -1);
	i = moat_grpc_descset_by_symbol(s, "moat.v1.Gateway");
	assert_true(i >= 0);
	moat_grpc_descset_file(s, (size_t)i, &len, &name);
	assert_string_equal(name, "gateway.proto");
	/* A method: the service's file. */
	assert_int_equal(moat_grpc_descset_by_symbol(s,
	                     "moat.v1.Gateway.ExecStream"),
	    i);
	i = moat_grpc_descset_by_symbol(s, "moat.v1.ExecEvent");
	moat_grpc_descset_file(s, (size_t)i, &len, &name);
	assert_string_equal(name, "vm.proto");
	i = moat_grpc_descset_by_symbol(s,
	    "grpc.reflection.v1alpha.ServerReflection");
	assert_true(i >= 0);
	i = moat_grpc_descset_by_symbol(s, "grpc.health.v1.Health");
	assert_true(i >= 0);
	moat_grpc_descset_file(s, (size_t)i, &len, &name);
	assert_string_equal(name, "grpc/health_v1.proto");
	assert_int_equal(moat_grpc_descset_by_symbol(s, "moat.v1.Nope"), -1);
	assert_int_equal(moat_grpc_descset_by_symbol(s, "moat.v1"), -1);
	assert_int_equal(moat_grpc_descset_by_symbol(s, ""), -1);
	moat_grpc_descset_free(s);
	/* Not a descriptor set. */
	{
		static const uint8_t bad[] = { 0x0a, 0x05, 0x01 };
		assert_int_equal(moat_grpc_descset_parse(bad, sizeof(bad), &s),
		    MOAT_INVALID_ARGUMENT);
		assert_null(s);
	}
}

/* ask: the answer to a request of one string field f = arg. */
static uint8_t *
ask(struct moat_grpc_descset *s, unsigned f, const char *arg, size_t *len)
{
	uint8_t req[256];
	uint8_t *out = NULL;
	size_t n = strlen(arg);
	const char *why;

	req[0] = (uint8_t)(f << 3 | 2);
	req[1] = (uint8_t)n;
	memcpy(req + 2, arg, n);
	assert_int_equal(moat_grpc_reflect_answer(s, req, n + 2, &out, len,
	                     &why),
	    MOAT_OK);
	return out;
}

static void
test_reflect_answers(void **state)
{
	struct moat_grpc_descset *s = embedded();
	const uint8_t *p, *q;
	size_t len, plen, qlen;
	uint8_t *out;
	const char *why;

	(void)state;
	/* list_services: three, Gateway first. */
	out = ask(s, 7, "", &len);
	assert_non_null(p = field(out, len, 6, &plen));
	assert_non_null(q = field(p, plen, 1, &qlen));
	assert_non_null(q = field(q, qlen, 1, &qlen));
	assert_int_equal(qlen, strlen("moat.v1.Gateway"));
	assert_memory_equal(q, "moat.v1.Gateway", qlen);
	assert_non_null(field(out, len, 2, &qlen)); /* original_request */
	free(out);
	/* file_containing_symbol: gateway.proto first, then its imports. */
	out = ask(s, 4, "moat.v1.Gateway", &len);
	assert_non_null(p = field(out, len, 4, &plen));
	assert_non_null(q = field(p, plen, 1, &qlen));
	assert_non_null(q = field(q, qlen, 1, &qlen)); /* its name */
	assert_memory_equal(q, "gateway.proto", qlen);
	free(out);
	/* Unknown: error_response NOT_FOUND (5). */
	out = ask(s, 4, "moat.v1.Nope", &len);
	assert_null(field(out, len, 4, &plen));
	assert_non_null(p = field(out, len, 7, &plen));
	assert_int_equal(p[0], 0x08);
	assert_int_equal(p[1], 5);
	free(out);
	out = ask(s, 3, "nope.proto", &len);
	assert_non_null(p = field(out, len, 7, &plen));
	assert_int_equal(p[1], 5);
	free(out);
	out = ask(s, 3, "vm.proto", &len);
	assert_non_null(field(out, len, 4, &plen));
	free(out);
	/* Not a request at all. */
	{
		static const uint8_t bad[] = { 0x22, 0x09, 'x' };
		assert_int_equal(moat_grpc_reflect_answer(s, bad, sizeof(bad),
		                     &out, &len, &why),
		    MOAT_INVALID_ARGUMENT);
	}
	moat_grpc_descset_free(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_queue_caps),
		cmocka_unit_test(test_next_message),
		cmocka_unit_test(test_exec_advance),
		cmocka_unit_test(test_descset),
		cmocka_unit_test(test_reflect_answers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
