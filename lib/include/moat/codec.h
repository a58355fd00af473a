/*
 * codec.h: protobuf <-> JSON for any moat message, driven by protobuf-c's
 * descriptors and following the proto3 JSON mapping: lowerCamelCase
 * names, 64-bit integers as strings, bytes as standard base64, enums by
 * value name, repeated fields as arrays, map fields as objects, oneof
 * members present when set, default values left out unless asked. The
 * gateway's HTTP door and the CLI's --json both use it, so one mapping
 * holds for every RPC and no message has a hand-written one.
 * Both directions: message -> JSON (codec.c) and JSON -> message
 * (codec_decode.c), sharing the name rules below (moat_codec_json_name),
 * so both accept the same spelling.
 * Not for: the well-known types' special forms (Timestamp, Duration,
 * Any, wrappers): moat's protos do not use them.
 */
#ifndef MOAT_CODEC_H
#define MOAT_CODEC_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum moat_codec_flags {
	/* Also write fields that hold their default value (0, "", false,
	 * empty arrays and maps, the first enum value). Unset sub-messages
	 * and unset oneof members are still left out. */
	MOAT_CODEC_EMIT_DEFAULTS = 1u << 0,
	/* Use the .proto field names (snake_case) instead of lowerCamelCase. */
	MOAT_CODEC_PROTO_NAMES = 1u << 1,
	/* Write enums as their numbers instead of their names. */
	MOAT_CODEC_ENUMS_AS_INTS = 1u << 2,
	/* Decoding: skip keys that name no field instead of failing. */
	MOAT_CODEC_IGNORE_UNKNOWN = 1u << 3,
};

/* Decoding refuses messages nested deeper than this. */
#define MOAT_CODEC_MAX_DECODE_DEPTH 32

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
    int pretty, char **out, char **errmsg) __attribute__((warn_unused_result));

/* moat_codec_is_map_entry: whether `d` is the NameEntry message protoc
 * makes of `map<K, V> name` (protobuf-c keeps no map flag): such a
 * repeated field is a JSON object in both directions. */
bool moat_codec_is_map_entry(const ProtobufCMessageDescriptor *d);

/* moat_codec_json_name: the proto3 JSON name of a field name
 * ("memory_mib" -> "memoryMib") into buf (always NUL-terminated,
 * truncated to buflen - 1). Returns the length it needed. */
size_t moat_codec_json_name(const char *field_name, char *buf, size_t buflen);

/* moat_codec_base64: standard base64 with padding of `len` bytes. Heap
 * string the caller frees, or NULL on allocation failure. */
char *moat_codec_base64(const void *data, size_t len);

/* moat_codec_from_json: decodes the JSON object `in` (borrowed, not
 * modified) into a new message of `d`, per the proto3 JSON mapping: keys
 * are lowerCamelCase or .proto names; 64-bit integers numbers or decimal
 * strings; 32-bit integers numbers or strings, range checked; floats and
 * doubles numbers or "NaN", "Infinity", "-Infinity"; bytes standard or
 * URL-safe base64, padding optional; enums by value name or number;
 * repeated fields arrays; maps objects; null leaves a field at its
 * default. Flags: MOAT_CODEC_IGNORE_UNKNOWN (others are ignored).
 * On MOAT_OK *out is a heap message whose every member is from malloc,
 * freed by the caller with protobuf_c_message_free_unpacked(*out, NULL).
 * On failure *out is NULL and *errmsg (heap, caller frees) names the
 * field by its path and says what was wrong
 * ("exec.timeoutMs: expected uint32 (a number or a numeric string), got
 * \"abc\""): INVALID_ARGUMENT for anything in the JSON (wrong type, out
 * of range, unknown field, two members of one oneof, a field set twice,
 * nesting past MOAT_CODEC_MAX_DECODE_DEPTH), RESOURCE_EXHAUSTED when out
 * of memory, INTERNAL for a bad descriptor. Thread-safe. */
int moat_codec_from_json(const ProtobufCMessageDescriptor *d, json_t *in,
    unsigned flags, ProtobufCMessage **out, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_codec_from_json_text: the same from JSON text of `len` bytes (any
 * bytes: malformed JSON, or an object with a duplicated key, is
 * INVALID_ARGUMENT naming the line and column). Ownership as above. */
int moat_codec_from_json_text(const ProtobufCMessageDescriptor *d,
    const char *text, size_t len, unsigned flags, ProtobufCMessage **out,
    char **errmsg) __attribute__((warn_unused_result));

/* moat_codec_find_field: the field of `d` whose .proto name or JSON name
 * is `name`, or NULL. The descriptor is static; nothing to free. */
const ProtobufCFieldDescriptor *
moat_codec_find_field(const ProtobufCMessageDescriptor *d, const char *name);

/* moat_codec_base64_decode: standard or URL-safe base64, with or without
 * padding, of `len` bytes at s. On MOAT_OK *out is a heap buffer of
 * *out_len bytes the caller frees (NULL when empty);
 * INVALID_ARGUMENT when s is not base64, RESOURCE_EXHAUSTED. */
int moat_codec_base64_decode(const char *s, size_t len, uint8_t **out,
    size_t *out_len) __attribute__((warn_unused_result));

#endif
