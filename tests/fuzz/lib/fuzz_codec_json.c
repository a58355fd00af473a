/*
 * fuzz_codec_json.c: fuzz target for the JSON -> message decoder
 * (lib/codec_decode.c), which the gateway's HTTP door runs on every
 * request body from the network. The input's first byte picks the
 * message; the rest is the JSON text. Invariants: a failure returns no
 * message and a message naming the problem; a success re-encodes to JSON
 * that decodes to the same protobuf bytes; nothing leaks (ASan).
 * Not for: the encoder on its own (its input is our own messages).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "gateway.pb-c.h"
#include "guest.pb-c.h"
#include "moat/codec.h"
#include "moat/status.h"
#include "vm.pb-c.h"

static const ProtobufCMessageDescriptor *const messages[] = {
	&moat__v1__create_sandbox_request__descriptor,
	&moat__v1__exec_request__descriptor,
	&moat__v1__file_write_request__descriptor,
	&moat__v1__guest_request__descriptor,
	&moat__v1__sandbox_list__descriptor,
	&moat__v1__exec_result__descriptor,
	&moat__v1__guest_info__descriptor,
	&moat__v1__restore_step_request__descriptor,
};
#define N_MESSAGES (sizeof(messages) / sizeof(messages[0]))

static uint8_t *
packed(const ProtobufCMessage *m, size_t *len)
{
	uint8_t *b;

	*len = protobuf_c_message_get_packed_size(m);
	b = malloc(*len + 1);
	moat_fuzz_check(b != NULL, "out of memory");
	protobuf_c_message_pack(m, b);
	return b;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const ProtobufCMessageDescriptor *d;
	ProtobufCMessage *m = NULL, *again = NULL;
	char *errmsg = NULL, *text = NULL;
	uint8_t *b1, *b2;
	size_t n1, n2;
	int rv;

	if (size < 1)
		return 0;
	d = messages[data[0] % N_MESSAGES];
	rv = moat_codec_from_json_text(d, (const char *)data + 1, size - 1,
	    (data[0] & 0x80) ? MOAT_CODEC_IGNORE_UNKNOWN : 0, &m, &errmsg);
	if (rv != MOAT_OK) {
		moat_fuzz_check(m == NULL, "a message returned with an error");
		moat_fuzz_check(errmsg != NULL && errmsg[0] != '\0',
		    "an error without a message");
		moat_fuzz_check(rv == MOAT_INVALID_ARGUMENT ||
		        rv == MOAT_RESOURCE_EXHAUSTED,
		    "error status");
		free(errmsg);
		return 0;
	}
	moat_fuzz_check(m != NULL && errmsg == NULL, "success shape");
	moat_fuzz_check(moat_codec_to_json_string(m, 0, 0, &text, &errmsg) ==
	        MOAT_OK,
	    "re-encoding a decoded message");
	moat_fuzz_check(moat_codec_from_json_text(d, text, strlen(text), 0,
	                    &again, &errmsg) == MOAT_OK,
	    "decoding our own encoding");
	b1 = packed(m, &n1);
	b2 = packed(again, &n2);
	moat_fuzz_check(n1 == n2 && memcmp(b1, b2, n1) == 0,
	    "JSON round trip changed the message");
	free(b1);
	free(b2);
	free(text);
	protobuf_c_message_free_unpacked(again, NULL);
	protobuf_c_message_free_unpacked(m, NULL);
	return 0;
}

static void
add_text(void (*add)(const uint8_t *, size_t), uint8_t which, const char *json)
{
	size_t n = strlen(json);
	uint8_t *buf = malloc(n + 1);

	if (buf == NULL)
		return;
	buf[0] = which;
	memcpy(buf + 1, json, n);
	add(buf, n + 1);
	free(buf);
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	add_text(add, 0,
	    "{\"vcpus\": 2, \"memoryMib\": \"512\", \"labels\": "
	    "{\"a\": \"b\"}, \"record\": true, \"snapshotPolicy\": 1}");
	add_text(add, 1,
	    "{\"sandboxId\": \"sb\", \"argv\": [\"ls\", \"-l\"], "
	    "\"stdin\": \"aGkK\", \"timeoutMs\": 5000, \"outputCap\": "
	    "\"18446744073709551615\"}");
	add_text(add, 2,
	    "{\"path\": \"/x\", \"data\": \"_-8\", \"offset\": "
	    "1e3, \"truncate\": null}");
	add_text(add, 3,
	    "{\"id\": \"7\", \"execStart\": {\"argv\": "
	    "[\"a\"]}}");
	add_text(add, 4,
	    "{\"sandboxes\": [{\"id\": \"a\", \"state\": "
	    "\"SANDBOX_STATE_RUNNING\"}, {\"vmmPid\": -1}]}");
	add_text(add, 5,
	    "{\"status\": {\"exitCode\": -1, \"exited\": true}, "
	    "\"stdout\": \"\"}");
	add_text(add, 6,
	    "{\"load1\": \"NaN\", \"load5\": 1.5e300, "
	    "\"load15\": \"-Infinity\"}");
	add_text(add, 0x87,
	    "{\"sessionId\": \"s\", \"step\": 3, \"x\": [], "
	    "\"labels\": {}}");
}
