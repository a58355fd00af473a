/*
 * http_connect.c: the framing of the HTTP door's Connect and gRPC-Web
 * forms (http_connect.h): Content-Type dispatch, envelopes, Connect's
 * end-of-stream JSON and gRPC-Web's trailers frame. Both protocols
 * frame a message as gRPC does (a flag byte, a 4-byte big-endian
 * length), so grpc.h's unframe and percent-encoder serve here too.
 * Not for: serving (http.c) or any I/O: these only fill buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "grpc.h"
#include "http_connect.h"
#include "moat/codec.h"
#include "moat/status.h"
#include "moat/util.h"

/* The Content-Types by protocol; the first of each is what replies
 * carry. gRPC-Web without a codec suffix is protobuf. */
static const struct {
	const char *type;
	enum moat_http_wire wire;
} wire_types[] = {
	{ "application/json", MOAT_WIRE_JSON },
	{ "application/proto", MOAT_WIRE_PROTO },
	{ "application/connect+json", MOAT_WIRE_CONNECT_JSON },
	{ "application/connect+proto", MOAT_WIRE_CONNECT_PROTO },
	{ "application/grpc-web+proto", MOAT_WIRE_GRPC_WEB },
	{ "application/grpc-web", MOAT_WIRE_GRPC_WEB },
	{ "application/grpc-web-text+proto", MOAT_WIRE_GRPC_WEB_TEXT },
	{ "application/grpc-web-text", MOAT_WIRE_GRPC_WEB_TEXT },
};
#define WIRE_TYPES_N (sizeof(wire_types) / sizeof(wire_types[0]))

enum moat_http_wire
moat_http_wire_of(const char *ct)
{
	size_t n = ct ? strcspn(ct, ";") : 0;

	while (n > 0 && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
		n--;
	for (size_t i = 0; ct != NULL && i < WIRE_TYPES_N; i++)
		if (strlen(wire_types[i].type) == n &&
		    strncasecmp(ct, wire_types[i].type, n) == 0)
			return wire_types[i].wire;
	return MOAT_WIRE_OTHER;
}

const char *
moat_http_wire_type(enum moat_http_wire w)
{
	for (size_t i = 0; i < WIRE_TYPES_N; i++)
		if (wire_types[i].wire == w)
			return wire_types[i].type;
	return "application/json";
}

bool
moat_http_wire_streams(enum moat_http_wire w)
{
	return w == MOAT_WIRE_CONNECT_JSON || w == MOAT_WIRE_CONNECT_PROTO ||
	    w == MOAT_WIRE_GRPC_WEB || w == MOAT_WIRE_GRPC_WEB_TEXT;
}

/* Connect's names of the codes: gRPC's in lower snake case, but
 * "canceled" with one l. */
static const char *const connect_names[] = {
	[MOAT_OK] = "ok",
	[MOAT_CANCELLED] = "canceled",
	[MOAT_UNKNOWN] = "unknown",
	[MOAT_INVALID_ARGUMENT] = "invalid_argument",
	[MOAT_DEADLINE_EXCEEDED] = "deadline_exceeded",
	[MOAT_NOT_FOUND] = "not_found",
	[MOAT_ALREADY_EXISTS] = "already_exists",
	[MOAT_PERMISSION_DENIED] = "permission_denied",
	[MOAT_RESOURCE_EXHAUSTED] = "resource_exhausted",
	[MOAT_FAILED_PRECONDITION] = "failed_precondition",
	[MOAT_ABORTED] = "aborted",
	[MOAT_OUT_OF_RANGE] = "out_of_range",
	[MOAT_UNIMPLEMENTED] = "unimplemented",
	[MOAT_INTERNAL] = "internal",
	[MOAT_UNAVAILABLE] = "unavailable",
	[MOAT_DATA_LOSS] = "data_loss",
	[MOAT_UNAUTHENTICATED] = "unauthenticated",
};

const char *
moat_http_connect_code(int code)
{
	if (code < 0 || code > MOAT_STATUS_MAX)
		return "unknown";
	return connect_names[code];
}

bool
moat_http_frame(struct moat_http_buf *b, uint8_t flag, const void *msg,
    size_t len)
{
	uint8_t *nb;

	if (len > UINT32_MAX ||
	    (nb = realloc(b->data, b->len + MOAT_GRPC_PREFIX + len)) == NULL)
		return false;
	moat_grpc_frame_header(nb + b->len, (uint32_t)len);
	nb[b->len] = flag;
	if (len > 0)
		memcpy(nb + b->len + MOAT_GRPC_PREFIX, msg, len);
	b->data = nb;
	b->len += MOAT_GRPC_PREFIX + len;
	return true;
}

bool
moat_http_connect_end(struct moat_http_buf *b, int code, const char *message)
{
	json_t *j = code == MOAT_OK ?
	    json_object() :
	    json_pack("{s:{s:s, s:s}}", "error", "code",
	        moat_http_connect_code(code), "message",
	        message ? message : moat_http_connect_code(code));
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	bool ok = text != NULL &&
	    moat_http_frame(b, MOAT_HTTP_FLAG_END_STREAM, text, strlen(text));

	free(text);
	json_decref(j);
	return ok;
}

bool
moat_http_grpc_web_trailers(struct moat_http_buf *b, int code,
    const char *message)
{
	char *enc = code != MOAT_OK ?
	    moat_grpc_percent_encode(message ? message : "") :
	    NULL;
	char *text = code == MOAT_OK ?
	    moat_asprintf("grpc-status: 0\r\n") :
	    enc != NULL ?
	    moat_asprintf("grpc-status: %d\r\ngrpc-message: %s\r\n", code,
	        enc) :
	    NULL;
	bool ok = text != NULL &&
	    moat_http_frame(b, MOAT_HTTP_FLAG_TRAILERS, text, strlen(text));

	free(text);
	free(enc);
	return ok;
}

int
moat_http_unenvelope(enum moat_http_wire w, const uint8_t *body, size_t len,
    uint8_t **owned, const uint8_t **msg, size_t *msg_len, const char **why)
{
	size_t n = 0;

	*owned = NULL;
	if (w == MOAT_WIRE_GRPC_WEB_TEXT) {
		if (moat_codec_base64_decode((const char *)body, len, owned,
		        &n) != MOAT_OK) {
			*why = "a grpc-web-text body is base64: send the "
			       "enveloped message base64-encoded";
			return MOAT_INVALID_ARGUMENT;
		}
		body = *owned;
		len = n;
	}
	return moat_grpc_unframe(body ? body : (const uint8_t *)"", len, msg,
	    msg_len, why);
}

bool
moat_http_cors_allowed(const char *list, const char *origin)
{
	size_t n = strlen(origin);

	for (const char *p = list; p != NULL && *p != '\0';) {
		size_t len;

		p += strspn(p, ", \t");
		len = strcspn(p, ", \t");
		if ((len == 1 && p[0] == '*') ||
		    (len == n && len > 0 && strncasecmp(p, origin, n) == 0))
			return true;
		p += len;
	}
	return false;
}
