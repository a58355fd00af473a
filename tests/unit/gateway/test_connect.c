/*
 * test_connect.c: the framing of the HTTP door's Connect and gRPC-Web
 * forms (gateway/http_connect.c): Content-Type dispatch, envelopes,
 * Connect's end-of-stream JSON, gRPC-Web's trailers frame with its
 * percent-encoded message, request envelopes that are short, longer
 * than the body, compressed or not base64, and CORS origin lists.
 * Not for: the door on the wire (test_http, with a fake node; the stack
 * test tests/integration/stack/webdoor_test.sh with VMs).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "http_connect.h"
#include "moat/status.h"

static void
test_wire_of(void **state)
{
	(void)state;
	assert_int_equal(moat_http_wire_of("application/json"),
	    MOAT_WIRE_JSON);
	assert_int_equal(moat_http_wire_of("Application/JSON; charset=utf-8"),
	    MOAT_WIRE_JSON);
	assert_int_equal(moat_http_wire_of("application/proto"),
	    MOAT_WIRE_PROTO);
	assert_int_equal(moat_http_wire_of("application/connect+json"),
	    MOAT_WIRE_CONNECT_JSON);
	assert_int_equal(moat_http_wire_of("application/connect+proto "),
	    MOAT_WIRE_CONNECT_PROTO);
	assert_int_equal(moat_http_wire_of("application/grpc-web"),
	    MOAT_WIRE_GRPC_WEB);
	assert_int_equal(moat_http_wire_of("application/grpc-web+proto"),
	    MOAT_WIRE_GRPC_WEB);
	assert_int_equal(moat_http_wire_of("application/grpc-web-text"),
	    MOAT_WIRE_GRPC_WEB_TEXT);
	/* Not served: gRPC-Web's JSON, gRPC itself, prefixes, none. */
	assert_int_equal(moat_http_wire_of("application/grpc-web+json"),
	    MOAT_WIRE_OTHER);
	assert_int_equal(moat_http_wire_of("application/grpc"),
	    MOAT_WIRE_OTHER);
	assert_int_equal(moat_http_wire_of("application/js"), MOAT_WIRE_OTHER);
	assert_int_equal(moat_http_wire_of("text/event-stream"),
	    MOAT_WIRE_OTHER);
	assert_int_equal(moat_http_wire_of(NULL), MOAT_WIRE_OTHER);
	assert_true(moat_http_wire_streams(MOAT_WIRE_CONNECT_JSON));
	assert_true(moat_http_wire_streams(MOAT_WIRE_GRPC_WEB_TEXT));
	assert_false(moat_http_wire_streams(MOAT_WIRE_PROTO));
	assert_false(moat_http_wire_streams(MOAT_WIRE_SSE));
	assert_string_equal(moat_http_wire_type(MOAT_WIRE_GRPC_WEB),
	    "application/grpc-web+proto");
	assert_string_equal(moat_http_wire_type(MOAT_WIRE_CONNECT_PROTO),
	    "application/connect+proto");
	assert_string_equal(moat_http_connect_code(MOAT_CANCELLED),
	    "canceled");
	assert_string_equal(moat_http_connect_code(MOAT_DEADLINE_EXCEEDED),
	    "deadline_exceeded");
	assert_string_equal(moat_http_connect_code(99), "unknown");
}

/* The 5-byte prefix: flag, then the length big-endian. */
static void
test_frame(void **state)
{
	struct moat_http_buf b = { 0 };
	static const uint8_t want[] = { 0x00, 0, 0, 0, 3, 'a', 'b', 'c', 0x80,
		0, 0, 0, 0 };

	(void)state;
	assert_true(moat_http_frame(&b, MOAT_HTTP_FLAG_MESSAGE, "abc", 3));
	assert_true(moat_http_frame(&b, MOAT_HTTP_FLAG_TRAILERS, NULL, 0));
	assert_int_equal(b.len, sizeof(want));
	assert_memory_equal(b.data, want, sizeof(want));
	free(b.data);
}

/* end_json: the JSON of the one end-of-stream envelope in b. */
static json_t *
end_json(const struct moat_http_buf *b)
{
	uint32_t n;

	assert_true(b->len >= 5);
	assert_int_equal(b->data[0], MOAT_HTTP_FLAG_END_STREAM);
	n = (uint32_t)b->data[1] << 24 | (uint32_t)b->data[2] << 16 |
	    (uint32_t)b->data[3] << 8 | b->data[4];
	assert_int_equal(n, b->len - 5);
	return json_loadb((const char *)b->data + 5, n, 0, NULL);
}

static void
test_connect_end(void **state)
{
	struct moat_http_buf b = { 0 };
	json_t *j, *err;

	(void)state;
	assert_true(moat_http_connect_end(&b, MOAT_OK, "ignored"));
	j = end_json(&b);
	assert_non_null(j);
	assert_int_equal(json_object_size(j), 0); /* {} */
	json_decref(j);
	free(b.data);

	b = (struct moat_http_buf){ 0 };
	assert_true(
	    moat_http_connect_end(&b, MOAT_DEADLINE_EXCEEDED, "too \"slow\""));
	j = end_json(&b);
	err = json_object_get(j, "error");
	assert_string_equal(json_string_value(json_object_get(err, "code")),
	    "deadline_exceeded");
	assert_string_equal(json_string_value(json_object_get(err, "message")),
	    "too \"slow\"");
	json_decref(j);
	free(b.data);
}

static void
test_grpc_web_trailers(void **state)
{
	struct moat_http_buf b = { 0 };
	const char *ok = "grpc-status: 0\r\n";
	const char *bad = "grpc-status: 5\r\ngrpc-message: no 100%25 caf%C3%A9"
	                  "\r\n";

	(void)state;
	assert_true(moat_http_grpc_web_trailers(&b, MOAT_OK, NULL));
	assert_int_equal(b.data[0], MOAT_HTTP_FLAG_TRAILERS);
	assert_int_equal(b.data[4], strlen(ok));
	assert_memory_equal(b.data + 5, ok, strlen(ok));
	free(b.data);
	b = (struct moat_http_buf){ 0 };
	assert_true(moat_http_grpc_web_trailers(&b, MOAT_NOT_FOUND,
	    "no 100% caf\xc3\xa9"));
	assert_int_equal(b.data[0], 0x80);
	assert_int_equal(b.len, 5 + strlen(bad));
	assert_memory_equal(b.data + 5, bad, strlen(bad));
	free(b.data);
}

static void
test_unenvelope(void **state)
{
	static const uint8_t good[] = { 0, 0, 0, 0, 2, 0x0a, 0x00 };
	static const uint8_t longer[] = { 0, 0, 0, 0, 9, 0x0a, 0x00 };
	static const uint8_t zipped[] = { 1, 0, 0, 0, 2, 0x0a, 0x00 };
	const char *b64 = "AAAAAAIKAA==", *why = NULL;
	const uint8_t *msg;
	uint8_t *owned;
	size_t len;

	(void)state;
	assert_int_equal(moat_http_unenvelope(MOAT_WIRE_CONNECT_PROTO, good,
	                     sizeof(good), &owned, &msg, &len, &why),
	    MOAT_OK);
	assert_int_equal(len, 2);
	assert_ptr_equal(msg, good + 5);
	assert_null(owned);
	/* Short, longer than the body, compressed. */
	assert_int_equal(moat_http_unenvelope(MOAT_WIRE_CONNECT_JSON, good, 3,
	                     &owned, &msg, &len, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "5-byte prefix"));
	assert_int_equal(moat_http_unenvelope(MOAT_WIRE_GRPC_WEB, longer,
	                     sizeof(longer), &owned, &msg, &len, &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "does not match the body"));
	assert_int_equal(moat_http_unenvelope(MOAT_WIRE_CONNECT_PROTO, zipped,
	                     sizeof(zipped), &owned, &msg, &len, &why),
	    MOAT_UNIMPLEMENTED);
	assert_string_equal(why, "compression not supported");
	assert_int_equal(moat_http_unenvelope(MOAT_WIRE_CONNECT_PROTO, NULL, 0,
	                     &owned, &msg, &len, &why),
	    MOAT_INVALID_ARGUMENT);
	/* gRPC-Web-text: base64 first. */
	assert_int_equal(moat_http_unenvelope(MOAT_WIRE_GRPC_WEB_TEXT,
	                     (const uint8_t *)b64, strlen(b64), &owned, &msg,
	                     &len, &why),
	    MOAT_OK);
	assert_non_null(owned);
	assert_int_equal(len, 2);
	assert_memory_equal(msg, good + 5, 2);
	free(owned);
	assert_int_equal(moat_http_unenvelope(MOAT_WIRE_GRPC_WEB_TEXT,
	                     (const uint8_t *)"!!!", 3, &owned, &msg, &len,
	                     &why),
	    MOAT_INVALID_ARGUMENT);
	assert_non_null(strstr(why, "base64"));
	free(owned);
}

static void
test_cors(void **state)
{
	(void)state;
	assert_false(moat_http_cors_allowed(NULL, "https://a.example"));
	assert_false(moat_http_cors_allowed("", "https://a.example"));
	assert_true(moat_http_cors_allowed("*", "https://a.example"));
	assert_true(
	    moat_http_cors_allowed("https://b.example, https://A.example",
	        "https://a.example"));
	assert_true(
	    moat_http_cors_allowed("https://b.example https://a.example",
	        "https://a.example"));
	/* Whole origins only: no prefix or suffix matches. */
	assert_false(moat_http_cors_allowed("https://a.example",
	    "https://a.example.evil"));
	assert_false(moat_http_cors_allowed("https://a.example.evil",
	    "https://a.example"));
	assert_false(moat_http_cors_allowed("https://a.example", ""));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wire_of),
		cmocka_unit_test(test_frame),
		cmocka_unit_test(test_connect_end),
		cmocka_unit_test(test_grpc_web_trailers),
		cmocka_unit_test(test_unenvelope),
		cmocka_unit_test(test_cors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
