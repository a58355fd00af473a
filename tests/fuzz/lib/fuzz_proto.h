/*
 * fuzz_proto.h: seeds from protobuf messages, for the fuzz targets whose
 * input is one encoded message (fuzz_guest.c, services/fuzz_agent.c).
 * Not for: seeds with a prefix before the message (fuzz_service_seed in
 * tests/fuzz/services/fuzz_service.h) or checking an encoding.
 */
#ifndef MOAT_FUZZ_PROTO_H
#define MOAT_FUZZ_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* moat_fuzz_add_packed: add()s m packed, when it packs into 4 KiB (a
 * larger message is left out: seeds stay small). */
static inline void
moat_fuzz_add_packed(void (*add)(const uint8_t *, size_t),
    const ProtobufCMessage *m)
{
	uint8_t buf[4096];
	size_t n = protobuf_c_message_get_packed_size(m);

	if (n > sizeof(buf))
		return;
	protobuf_c_message_pack(m, buf);
	add(buf, n);
}

#endif
