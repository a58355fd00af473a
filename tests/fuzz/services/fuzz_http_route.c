/*
 * fuzz_http_route.c: fuzz target for the gateway HTTP door's router and
 * request decoding (gateway/http.c, moat_http_decode): the input is
 * "METHOD URL[?QUERY]\n" then the body. The URL is unescaped as
 * libmicrohttpd does, routed over the door's table ({} ids, the Allow
 * list), and the query arguments (split and unescaped as libmicrohttpd
 * does) or the JSON body become the Gateway method's input message
 * through the codec. Any input must give a message or a status with a
 * message; a message must encode. Not for: libmicrohttpd's HTTP parser,
 * or calling the gateway (the door's unit tests).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "fuzz.h"
#include "gateway.pb-c.h"
#include "http.h"
#include "moat/status.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nl = memchr(data, '\n', size);
	size_t line = nl ? (size_t)(nl - data) : size;
	char *head, *url, *query;
	ProtobufCMessage *msg = NULL;
	char *errmsg = NULL;
	int rv;

	if ((head = malloc(line + 1)) == NULL)
		return 0;
	memcpy(head, data, line);
	head[line] = '\0';
	if ((url = strchr(head, ' ')) == NULL) {
		free(head);
		return 0;
	}
	*url++ = '\0';
	if ((query = strchr(url, '?')) != NULL)
		*query++ = '\0';
	MHD_http_unescape(url);
	rv = moat_http_decode(&moat__v1__gateway__descriptor, head, url, query,
	    nl ? (const char *)nl + 1 : NULL, nl ? size - line - 1 : 0, &msg,
	    &errmsg);
	if (rv == MOAT_OK) {
		moat_fuzz_check(errmsg == NULL, "OK with a message");
		if (msg != NULL) {
			size_t n = protobuf_c_message_get_packed_size(msg);
			uint8_t *buf = malloc(n ? n : 1);

			moat_fuzz_check(buf != NULL, "malloc");
			moat_fuzz_check(protobuf_c_message_pack(msg, buf) == n,
			    "pack size");
			free(buf);
			protobuf_c_message_free_unpacked(msg, NULL);
		}
	} else {
		moat_fuzz_check(errmsg != NULL, "a failure without a message");
		moat_fuzz_check(msg == NULL, "a failure with a message");
	}
	free(errmsg);
	free(head);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const char *const seeds[] = {
		"POST /v1/sandboxes\n{\"image\": \"python\", \"vcpus\": 2, "
		"\"memory_mib\": 512, \"labels\": {\"a\": \"b\"}}",
		"GET /v1/sandboxes?label_selector=a%3Db&page_size=10\n",
		"GET /v1/sandboxes/sb-1234\n",
		"DELETE /v1/sandboxes/sb-1234?force=true\n",
		"POST /v1/sandboxes/sb-1/exec\n{\"argv\": [\"sh\", \"-c\", "
		"\"echo hi\"], \"timeout_ms\": 1000, \"env\": [\"A=1\"]}",
		"GET /v1/sandboxes/sb-1/files?path=%2Ftmp%2Fx&offset=0\n",
		"PUT /v1/sandboxes/sb-1/files?path=/tmp/x&mode=420\nbytes",
		"GET /v1/sessions/s-1/steps?page_token=abc\n",
		"GET /v1/audit?limit=5\n",
		"POST /v1/rpc/CreateSandbox\n{\"image\": \"x\"}",
		"POST /v1/rpc/Nope\n{}",
		"GET /healthz\n",
		"PATCH /v1/sandboxes/x/\n",
		"POST /v1/sandboxes/sb-1/exec\n{\"sandbox_id\": \"x\"}",
		"GET /v1/sessions?x=1&x=2\n",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		add((const uint8_t *)seeds[i], strlen(seeds[i]));
}
