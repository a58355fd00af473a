/*
 * codec_internal.h: what the two halves of the codec share (codec.c
 * encodes, codec_decode.c decodes): the shape of map entries and the size
 * of one repeated element.
 * Not for: anything outside lib/codec*.c; nothing here is a stable
 * interface.
 */
#ifndef MOAT_CODEC_INTERNAL_H
#define MOAT_CODEC_INTERNAL_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>

/* moat_codec_elem_size: bytes of one element of a repeated field of
 * type t, as protobuf-c lays the array out. */
size_t moat_codec_elem_size(ProtobufCType t);

#endif
