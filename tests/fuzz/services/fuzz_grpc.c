/*
 * fuzz_grpc.c: fuzz target for what the gateway's gRPC door reads from a
 * client past HTTP/2 (libnghttp2 parses the frames): grpc-timeout
 * values, a unary call's length-prefixed body (moat_grpc_unframe), a
 * request stream split into messages (moat_grpc_next_message), and each
 * of those answered as a ServerReflectionRequest against the embedded
 * descriptor set; also the descriptor-set splitter itself on any bytes.
 * The first input byte picks which. Invariants: a message found lies
 * inside the input; every reflection request gets an answer or
 * INVALID_ARGUMENT with a reason, and an answer echoes the request.
 * Not for: nghttp2's own framing (its project fuzzes it), or the door's
 * threads (tests/unit/gateway/test_grpc_wire.c).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "grpc.h"
#include "grpc_reflect.h"
#include "grpc_stream.h"
#include "moat/status.h"

static struct moat_grpc_descset *desc;

static void
fuzz_unary(const uint8_t *data, size_t size)
{
	const uint8_t *msg;
	size_t msg_len;
	const char *why = NULL;
	char *t, *enc;
	uint64_t ms;

	if (moat_grpc_unframe(data, size, &msg, &msg_len, &why) == MOAT_OK)
		moat_fuzz_check(msg == data + MOAT_GRPC_PREFIX &&
		        msg_len == size - MOAT_GRPC_PREFIX,
		    "unframe's message is the body past its prefix");
	else
		moat_fuzz_check(why != NULL, "unframe says why");
	if ((t = strndup((const char *)data, size > 16 ? 16 : size)) == NULL)
		return;
	if (moat_grpc_parse_timeout(t, &ms))
		moat_fuzz_check(ms <= UINT32_MAX, "a timeout fits 32 bits");
	if ((enc = moat_grpc_percent_encode(t)) != NULL) {
		for (const char *p = enc; *p; p++)
			moat_fuzz_check(*p >= 0x20 && *p <= 0x7e,
			    "grpc-message is printable ASCII");
		free(enc);
	}
	free(t);
}

static void
fuzz_stream(const uint8_t *data, size_t size)
{
	const uint8_t *msg;
	size_t msg_len, used, out_len;
	const char *why = NULL;
	uint8_t *out;
	int r, rv;

	while ((r = moat_grpc_next_message(data, size,
	            MOAT_GRPC_REFLECT_MAX_REQUEST, &msg, &msg_len, &used,
	            &why)) == 1) {
		moat_fuzz_check(used <= size && msg + msg_len <= data + size,
		    "a message lies inside what came");
		rv = moat_grpc_reflect_answer(desc, msg, msg_len, &out,
		    &out_len, &why);
		if (rv == MOAT_OK) {
			moat_fuzz_check(out != NULL, "an answer has bytes");
			moat_fuzz_check(out_len >= msg_len,
			    "an answer echoes its request");
			free(out);
		} else {
			moat_fuzz_check(rv == MOAT_INVALID_ARGUMENT ||
			        rv == MOAT_RESOURCE_EXHAUSTED,
			    "a refused request is malformed");
			moat_fuzz_check(out == NULL, "no answer when refused");
		}
		data += used;
		size -= used;
	}
	moat_fuzz_check(r == 0 || why != NULL, "a bad message says why");
}

static void
fuzz_descset(const uint8_t *data, size_t size)
{
	struct moat_grpc_descset *s = NULL;
	char name[32];
	size_t n = size < sizeof(name) - 1 ? size : sizeof(name) - 1;

	if (moat_grpc_descset_parse(data, size, &s) != MOAT_OK) {
		moat_fuzz_check(s == NULL, "a refused set is not kept");
		return;
	}
	memcpy(name, data, n);
	name[n] = '\0';
	(void)moat_grpc_descset_by_name(s, name);
	(void)moat_grpc_descset_by_symbol(s, name);
	moat_grpc_descset_free(s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (desc == NULL &&
	    moat_grpc_descset_parse(moat_grpc_descriptor_set,
	        moat_grpc_descriptor_set_len, &desc) != MOAT_OK)
		abort();
	if (size == 0)
		return 0;
	switch (data[0] % 3) {
	case 0:
		fuzz_unary(data + 1, size - 1);
		break;
	case 1:
		fuzz_stream(data + 1, size - 1);
		break;
	default:
		fuzz_descset(data + 1, size - 1);
		break;
	}
	return 0;
}

/* seed: the mode byte, then `len` bytes. */
static void
seed(void (*add)(const uint8_t *, size_t), uint8_t mode, const void *p,
    size_t len)
{
	uint8_t b[256];

	if (len + 1 > sizeof(b))
		return;
	b[0] = mode;
	memcpy(b + 1, p, len);
	add(b, len + 1);
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const uint8_t unary[] = { 0, 0, 0, 0, 2, 0x08, 0x01 };
	/* list_services, then file_containing_symbol moat.v1.Gateway,
	 * then file_by_filename vm.proto, each length-prefixed. */
	static const uint8_t stream[] = { 0, 0, 0, 0, 2, 0x3a, 0x00, 0, 0, 0,
		0, 17, 0x22, 15, 'm', 'o', 'a', 't', '.', 'v', '1', '.', 'G',
		'a', 't', 'e', 'w', 'a', 'y', 0, 0, 0, 0, 10, 0x1a, 8, 'v',
		'm', '.', 'p', 'r', 'o', 't', 'o' };
	static const char timeout[] = "100m";

	seed(add, 0, unary, sizeof(unary));
	seed(add, 0, timeout, sizeof(timeout) - 1);
	seed(add, 1, stream, sizeof(stream));
	/* The start of the real set: one file's worth of structure. */
	seed(add, 2, moat_grpc_descriptor_set,
	    moat_grpc_descriptor_set_len < 200 ? moat_grpc_descriptor_set_len :
	                                         200);
}
