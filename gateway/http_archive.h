/*
 * http_archive.h: directories in and out through the HTTP door (issue
 * 17), http_archive.c: PUT /v1/sandboxes/{id}/files?path=DIR&archive=tar
 * streams its tar body into PutArchive chunks of at most 4 MiB as it
 * arrives (Content-Length or chunked), and GET ...?path=P&archive=tar
 * streams GetArchive's chunks back as application/x-tar. Also the few
 * pieces of the door (http.c) those two use, exported for them alone.
 * Not for: checking or unpacking archives (the guest agent does, behind
 * PutArchive), nor any route but these two.
 */
#ifndef MOAT_GATEWAY_HTTP_ARCHIVE_H
#define MOAT_GATEWAY_HTTP_ARCHIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>
#include <protobuf-c/protobuf-c.h>

#include "http.h"

struct moat_http_archive_put;

/* One PutArchive / GetArchive chunk (the .proto's "at most 4 MiB"). */
#define MOAT_HTTP_ARCHIVE_CHUNK (4u << 20)
/* The deadline of the calls that pack or unpack the whole archive (the
 * first GetArchive, the last PutArchive) when the client sets none: the
 * RPC default (30 s) is short for a large tree. */
#define MOAT_HTTP_ARCHIVE_PACK_MS 300000u

/* ---- from http.c, for http_archive.c ---- */

/* moat_http_call: runs Gateway method `method` with `req` as the api key
 * `auth` (request id `rid`, 0: a new one; timeout 0: the default). On
 * MOAT_OK *reply is the caller's; otherwise *errmsg (heap). */
int moat_http_call(struct moat_http *h, const char *auth, uint64_t rid,
    uint32_t timeout_ms, const char *method, const ProtobufCMessage *req,
    ProtobufCMessage **reply, char **errmsg);

/* moat_http_request_opts: the request's api key (into its headers),
 * request id and timeout from the headers, as every route reads them.
 * A status with *errmsg (heap) when malformed. */
int moat_http_request_opts(struct MHD_Connection *conn, const char **auth,
    uint64_t *rid, uint64_t *timeout, char **errmsg);

/* moat_http_error: {"code", "message"} with the HTTP status of `code`
 * (or `status` when not 0). */
enum MHD_Result moat_http_error(struct MHD_Connection *conn, unsigned status,
    int code, const char *message);

/* moat_http_reply: `reply` as proto3 JSON, 200 (an error if it does not
 * encode). */
enum MHD_Result moat_http_reply(struct MHD_Connection *conn,
    const ProtobufCMessage *reply);

/* moat_http_cors: the door's CORS headers on `resp` (none when the
 * Origin is not allowed). */
void moat_http_cors(struct MHD_Connection *conn, struct MHD_Response *resp);

/* ---- http_archive.c ---- */

/* moat_http_archive_asked: whether a request to `url` (whose route is
 * the files one: the caller matched it) asks for an archive (has the
 * query argument `archive`). */
bool moat_http_archive_asked(struct MHD_Connection *conn);

/* moat_http_archive_put_begin: from the headers of PUT
 * /v1/sandboxes/{id}/files?archive=...: checks the query (archive=tar,
 * a path) and Content-Length against `max_bytes`. On success *out is the
 * upload (free it with moat_http_archive_put_free) and false is
 * returned; otherwise the refusal is queued in *ret and true returned
 * (the body is then dropped). */
bool moat_http_archive_put_begin(struct moat_http *h,
    struct MHD_Connection *conn, const char *sandbox_id, uint64_t max_bytes,
    struct moat_http_archive_put **out, enum MHD_Result *ret);

/* moat_http_archive_put_data: `n` more bytes of the body: whole 4 MiB
 * chunks go to PutArchive as they fill. After a failure (a call failed,
 * over the cap) the rest is dropped. */
void moat_http_archive_put_data(struct moat_http_archive_put *p,
    const char *data, size_t n);

/* moat_http_archive_put_end: the body ended: the last chunk (last=true),
 * then the ArchivePutReply as JSON, or the first failure's error. */
enum MHD_Result moat_http_archive_put_end(struct moat_http_archive_put *p,
    struct MHD_Connection *conn);

/* moat_http_archive_put_free: safe on NULL. */
void moat_http_archive_put_free(struct moat_http_archive_put *p);

/* moat_http_archive_get: GET /v1/sandboxes/{id}/files?archive=tar: the
 * first GetArchive now (its errors as JSON errors; an archive over
 * `max_bytes` is a 413), then the rest as the body is read. */
enum MHD_Result moat_http_archive_get(struct moat_http *h,
    struct MHD_Connection *conn, const char *sandbox_id, uint64_t max_bytes);

/* moat_http_archive_openapi: the archive forms of the files routes in
 * the OpenAPI `paths` (their operations exist already): the `archive`
 * parameter, the tar bodies, and ArchivePutReply (whose schema the
 * caller added to the components). */
void moat_http_archive_openapi(json_t *paths);

#endif
