/*
 * fuzz_guest.c: fuzz target for the guest link's messages: the host
 * decodes moat.v1.GuestMessage from a guest it does not trust, and the
 * agent decodes moat.v1.GuestRequest. Any bytes must decode or be refused
 * without a crash, and what decodes must encode back to bytes that decode
 * to the same encoding. Not for: the frame layer (fuzz_frame.c) or what
 * vmd does with a message.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_proto.h"
#include "guest.pb-c.h"

/* True if m or any message inside it kept unknown fields. protobuf-c
 * keeps them and writes them back, and it accepts some it will not read
 * back (field number 0 in a non-minimal tag, 0x82 0x00), so re-encoding
 * is only checked for messages without them. */
static bool
has_unknown(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	if (m->n_unknown_fields != 0)
		return true;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const char *base = (const char *)m;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n =
			    *(const size_t *)(base + f->quantifier_offset);
			ProtobufCMessage *const *arr =
			    *(ProtobufCMessage *const *const *)(base +
			        f->offset);

			for (size_t j = 0; j < n; j++)
				if (arr[j] != NULL && has_unknown(arr[j]))
					return true;
			continue;
		}
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(const uint32_t *)(base + f->quantifier_offset) != f->id)
			continue;
		{
			const ProtobufCMessage *sub =
			    *(ProtobufCMessage *const *)(base + f->offset);

			if (sub != NULL && has_unknown(sub))
				return true;
		}
	}
	return false;
}

static void
round_trip(const ProtobufCMessageDescriptor *d, const uint8_t *data,
    size_t size)
{
	ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size, data);
	ProtobufCMessage *m2;
	uint8_t *b1, *b2;
	size_t n1, n2;

	if (m == NULL)
		return;
	if (has_unknown(m)) {
		protobuf_c_message_free_unpacked(m, NULL);
		return;
	}
	n1 = protobuf_c_message_get_packed_size(m);
	b1 = malloc(n1 ? n1 : 1);
	moat_fuzz_check(b1 != NULL, "malloc");
	moat_fuzz_check(protobuf_c_message_pack(m, b1) == n1, "pack size");
	m2 = protobuf_c_message_unpack(d, NULL, n1, b1);
	moat_fuzz_check(m2 != NULL, "re-encoded message does not decode");
	n2 = protobuf_c_message_get_packed_size(m2);
	b2 = malloc(n2 ? n2 : 1);
	moat_fuzz_check(b2 != NULL, "malloc");
	protobuf_c_message_pack(m2, b2);
	moat_fuzz_check(n1 == n2 && memcmp(b1, b2, n1) == 0,
	    "encoding not stable");
	free(b1);
	free(b2);
	protobuf_c_message_free_unpacked(m2, NULL);
	protobuf_c_message_free_unpacked(m, NULL);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	round_trip(&moat__v1__guest_message__descriptor, data, size);
	round_trip(&moat__v1__guest_request__descriptor, data, size);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	Moat__V1__GuestRequest rq = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ExecStart es = MOAT__V1__EXEC_START__INIT;
	Moat__V1__GuestFileWrite fw = MOAT__V1__GUEST_FILE_WRITE__INIT;
	Moat__V1__GuestMessage gm = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__ExecOutput eo = MOAT__V1__EXEC_OUTPUT__INIT;
	Moat__V1__ExecExit ee = MOAT__V1__EXEC_EXIT__INIT;
	Moat__V1__GuestInfo gi = MOAT__V1__GUEST_INFO__INIT;
	char *argv[] = { "python3", "-c", "print(1)" };
	char *env[] = { "A=1" };

	rq.id = 7;
	es.n_argv = 3;
	es.argv = argv;
	es.n_env = 1;
	es.env = env;
	es.cwd = "/root";
	es.timeout_ms = 1000;
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	rq.exec_start = &es;
	moat_fuzz_add_packed(add, &rq.base);

	fw.path = "/tmp/x";
	fw.data.data = (uint8_t *)"hello";
	fw.data.len = 5;
	fw.make_parents = 1;
	rq.op_case = MOAT__V1__GUEST_REQUEST__OP_FILE_WRITE;
	rq.file_write = &fw;
	moat_fuzz_add_packed(add, &rq.base);

	gm.id = 7;
	eo.data.data = (uint8_t *)"1\n";
	eo.data.len = 2;
	gm.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT;
	gm.exec_output = &eo;
	moat_fuzz_add_packed(add, &gm.base);

	ee.exit_code = -1;
	ee.signal = 9;
	ee.timed_out = 1;
	ee.duration_us = 123456789;
	gm.body_case = MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT;
	gm.exec_exit = &ee;
	moat_fuzz_add_packed(add, &gm.base);

	gi.uptime_ms = 99;
	gm.code = MOAT__V1__CODE__NOT_FOUND;
	gm.message = "no such file";
	gm.body_case = MOAT__V1__GUEST_MESSAGE__BODY_INFO;
	gm.info = &gi;
	moat_fuzz_add_packed(add, &gm.base);
}
