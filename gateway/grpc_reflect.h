/*
 * grpc_reflect.h: gRPC server reflection (grpc.reflection.v1alpha, see
 * proto/grpc/reflection_v1alpha.proto) for the gRPC door, as pure
 * functions (grpc_reflect.c): the FileDescriptorSet that the build made
 * from proto/ (grpc_desc.c, generated) split into its files, the lookup
 * of a file by name or by a symbol it declares, and the answer to one
 * ServerReflectionRequest.
 * Not for: the stream that carries the requests (grpc.c), or a general
 * protobuf descriptor parser: only names of files, their dependencies
 * and their top-level messages, enums and services are read.
 */
#ifndef MOAT_GATEWAY_GRPC_REFLECT_H
#define MOAT_GATEWAY_GRPC_REFLECT_H

#include <stddef.h>
#include <stdint.h>

/* The embedded FileDescriptorSet of proto/ and the reflection
 * proto (protoc-c --include_imports -o, at build time). */
extern const uint8_t moat_grpc_descriptor_set[];
extern const size_t moat_grpc_descriptor_set_len;

#define MOAT_GRPC_REFLECT_MAX_REQUEST (16u << 10) /* one request message */

struct moat_grpc_descset;

/* moat_grpc_descset_parse: splits the FileDescriptorSet `buf` (borrowed:
 * it must outlive the result) into its files. MOAT_OK with *out (the
 * caller's, moat_grpc_descset_free); INVALID_ARGUMENT when it is not a
 * FileDescriptorSet; RESOURCE_EXHAUSTED when out of memory. */
int moat_grpc_descset_parse(const uint8_t *buf, size_t len,
    struct moat_grpc_descset **out) __attribute__((warn_unused_result));

void moat_grpc_descset_free(struct moat_grpc_descset *s);

/* moat_grpc_descset_count: how many files the set has. */
size_t moat_grpc_descset_count(const struct moat_grpc_descset *s);

/* moat_grpc_descset_by_name: the index of the file named `name` (as
 * protoc saw it, e.g. "gateway.proto"), or -1. */
long moat_grpc_descset_by_name(const struct moat_grpc_descset *s,
    const char *name);

/* moat_grpc_descset_by_symbol: the index of the file declaring the
 * fully-qualified top-level message, enum or service `symbol` (no
 * leading dot), or a method or field of one ("moat.v1.Gateway.Exec"),
 * or -1. */
long moat_grpc_descset_by_symbol(const struct moat_grpc_descset *s,
    const char *symbol);

/* moat_grpc_descset_file: file `i`'s FileDescriptorProto bytes and
 * name. */
const uint8_t *moat_grpc_descset_file(const struct moat_grpc_descset *s,
    size_t i, size_t *len, const char **name);

/* moat_grpc_reflect_answer: the ServerReflectionResponse to the request
 * message `req` (`len` bytes, from anyone) into *out (heap, caller
 * frees). A file answers with itself and every file it imports, over
 * and over. MOAT_OK (an unknown file or symbol is an error_response
 * NOT_FOUND inside an OK answer); INVALID_ARGUMENT when `req` is not a
 * ServerReflectionRequest, with *why static; RESOURCE_EXHAUSTED when
 * out of memory. */
int moat_grpc_reflect_answer(const struct moat_grpc_descset *s,
    const uint8_t *req, size_t len, uint8_t **out, size_t *out_len,
    const char **why) __attribute__((warn_unused_result));

#endif
