/*
 * codec.h: protobuf <-> JSON for any moat message, driven by protobuf-c's
 * descriptors and following the proto3 JSON mapping: lowerCamelCase
 * names, 64-bit integers as strings, bytes as standard base64, enums by
 * value name, repeated fields as arrays, map fields as objects, oneof
 * members present when set, default values left out unless asked. The
 * gateway's HTTP door and the CLI's --json both use it, so one mapping
 * holds for every RPC and no message has a hand-written one.
 * This issue implements message -> JSON; JSON -> message comes later and
 * will share the name rules below (moat_codec_json_name), so both
 * directions accept the same spelling.
 * Not for: the well-known types' special forms (Timestamp, Duration,
 * Any, wrappers): moat's protos do not use them.
 */
#ifndef MOAT_CODEC_H
#define MOAT_CODEC_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

enum moat_codec_flags {
	/* Also write fields that hold their default value (0, "", false,
	 * empty arrays and maps, the first enum value). Unset sub-messages
	 * and unset oneof members are still left out. */
	MOAT_CODEC_EMIT_DEFAULTS = 1u << 0,
	/* Use the .proto field names (snake_case) instead of lowerCamelCase. */
	MOAT_CODEC_PROTO_NAMES = 1u << 1,
	/* Write enums as their numbers instead of their names. */
	MOAT_CODEC_ENUMS_AS_INTS = 1u << 2,
};

/* moat_codec_to_json: encodes `msg` (any protobuf-c message, not
 * modified) as a JSON object. On MOAT_OK *out is a new reference the
 * caller releases with json_decref. Strings that are not valid UTF-8 are
 * written with U+FFFD in place of the bad bytes (JSON text must be
 * UTF-8). On failure (allocation, a descriptor this codec does not know)
 * *out is NULL and *errmsg is a heap string the caller frees. */
int moat_codec_to_json(const ProtobufCMessage *msg, unsigned flags,
    json_t **out, char **errmsg) __attribute__((warn_unused_result));

/* moat_codec_to_json_string: the same, dumped as text (compact, or
 * indented by 2 when `pretty`). On MOAT_OK *out is a heap string the
 * caller frees. */
int moat_codec_to_json_string(const ProtobufCMessage *msg, unsigned flags,
    int pretty, char **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_codec_json_name: the proto3 JSON name of a field name
 * ("memory_mib" -> "memoryMib") into buf (always NUL-terminated,
 * truncated to buflen - 1). Returns the length it needed. */
size_t moat_codec_json_name(const char *field_name, char *buf,
    size_t buflen);

/* moat_codec_base64: standard base64 with padding of `len` bytes. Heap
 * string the caller frees, or NULL on allocation failure. */
char *moat_codec_base64(const void *data, size_t len);

#endif
