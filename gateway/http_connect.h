/*
 * http_connect.h: the framing of the HTTP door's protobuf protocols
 * (http_connect.c): which protocol a Content-Type names (Connect unary,
 * Connect streaming, gRPC-Web, gRPC-Web-text), Connect's code names,
 * the 5-byte envelopes both streaming forms share, Connect's
 * end-of-stream message and gRPC-Web's trailers frame. Pure functions on
 * buffers, public for their unit test (tests/unit/gateway/test_connect.c).
 * Not for: serving requests (http.c does, through the gateway's
 * dispatcher), or the gRPC door's HTTP/2 (grpc.c); the envelope's
 * length prefix and grpc-message's percent-encoding are grpc.h's.
 */
#ifndef MOAT_GATEWAY_HTTP_CONNECT_H
#define MOAT_GATEWAY_HTTP_CONNECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The flag byte of an envelope: a message, Connect's end of stream,
 * gRPC-Web's trailers. (1, compression, is refused: moat_grpc_unframe.) */
#define MOAT_HTTP_FLAG_MESSAGE 0x00
#define MOAT_HTTP_FLAG_END_STREAM 0x02
#define MOAT_HTTP_FLAG_TRAILERS 0x80

/* What a POST /moat.v1.Gateway/<Method>'s Content-Type asks for. */
enum moat_http_wire {
	MOAT_WIRE_OTHER,         /* none of these: 415 */
	MOAT_WIRE_JSON,          /* Connect unary, application/json */
	MOAT_WIRE_PROTO,         /* Connect unary, application/proto */
	MOAT_WIRE_CONNECT_JSON,  /* Connect streaming, connect+json */
	MOAT_WIRE_CONNECT_PROTO, /* Connect streaming, connect+proto */
	MOAT_WIRE_GRPC_WEB,      /* grpc-web or grpc-web+proto */
	MOAT_WIRE_GRPC_WEB_TEXT, /* grpc-web-text[+proto]: base64 */
	MOAT_WIRE_SSE,           /* text/event-stream: never a request's */
};

/* The Content-Types the door names in a 415 (Accept-Post). */
#define MOAT_HTTP_WIRE_TYPES                                                  \
	"application/json, application/proto, application/connect+json, "     \
	"application/connect+proto, application/grpc-web+proto, "             \
	"application/grpc-web-text+proto"

/* moat_http_wire_of: the protocol of Content-Type `ct` (NULL: none),
 * case-insensitive, parameters (charset) ignored. */
enum moat_http_wire moat_http_wire_of(const char *ct);

/* moat_http_wire_type: the Content-Type a reply in `w` carries. */
const char *moat_http_wire_type(enum moat_http_wire w);

/* moat_http_wire_streams: whether `w` is an enveloped (streaming) form:
 * Connect streaming or gRPC-Web. */
bool moat_http_wire_streams(enum moat_http_wire w);

/* moat_http_connect_code: Connect's name of status `code` ("not_found";
 * "canceled" with one l); "unknown" when out of range. */
const char *moat_http_connect_code(int code);

/* A growing byte buffer; data is heap (caller frees), NULL when empty. */
struct moat_http_buf {
	uint8_t *data;
	size_t len;
};

/* moat_http_frame: appends an envelope, `flag` then `len` big-endian in
 * 4 bytes then the `len` bytes at msg. False when out of memory (or
 * len over 4 GiB); b is then as it was. */
bool moat_http_frame(struct moat_http_buf *b, uint8_t flag, const void *msg,
    size_t len) __attribute__((warn_unused_result));

/* moat_http_connect_end: appends Connect's end-of-stream envelope: {}
 * for MOAT_OK, else {"error": {"code": <name>, "message": message}}. */
bool moat_http_connect_end(struct moat_http_buf *b, int code,
    const char *message) __attribute__((warn_unused_result));

/* moat_http_grpc_web_trailers: appends gRPC-Web's trailers frame,
 * "grpc-status: N\r\ngrpc-message: <percent-encoded>\r\n" (no
 * grpc-message for MOAT_OK). */
bool moat_http_grpc_web_trailers(struct moat_http_buf *b, int code,
    const char *message) __attribute__((warn_unused_result));

/* moat_http_unenvelope: the one message of a request body in `w`
 * (base64 first for gRPC-Web-text): *msg points into `body` or into
 * *owned (heap, caller frees; NULL when unused). MOAT_OK; otherwise a
 * status (UNIMPLEMENTED for a compressed message) with *why a static
 * string saying what is wrong. */
int moat_http_unenvelope(enum moat_http_wire w, const uint8_t *body,
    size_t len, uint8_t **owned, const uint8_t **msg, size_t *msg_len,
    const char **why) __attribute__((warn_unused_result));

/* moat_http_cors_allowed: whether a browser page of `origin`
 * ("https://app.example") may read the door's replies: `list` ([gateway]
 * http-cors-origins; NULL or "": none) names it (origins separated by
 * commas or blanks, compared without case) or is "*". */
bool moat_http_cors_allowed(const char *list, const char *origin);

#endif
