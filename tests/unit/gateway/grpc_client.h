/*
 * grpc_client.h: a small gRPC client on libnghttp2's client session for
 * the gRPC door's unit tests (test_grpc_wire, test_grpc_exec): one
 * cleartext HTTP/2 connection to 127.0.0.1, streams whose headers, body
 * and trailers the test chooses, and what came back on each. Failures
 * are cmocka failures; a door that never answers fails the test (a
 * receive timeout), it does not hang it.
 * Not for: anything but tests, or TLS (grpc_python covers that).
 */
#ifndef MOAT_TEST_GRPC_CLIENT_H
#define MOAT_TEST_GRPC_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>
#include <protobuf-c/protobuf-c.h>

/* One stream as the client sees it. */
struct grpc_stream {
	int32_t id;
	int grpc_status; /* -1: none yet */
	char message[512];
	uint8_t data[8192]; /* DATA received (more is dropped) */
	size_t data_len;
	bool closed;
	const uint8_t *body; /* what the request sends */
	size_t body_len, body_off;
	uint8_t own[512]; /* a packed message's bytes (grpc_client_call) */
};

struct grpc_client {
	int fd;
	nghttp2_session *s;
};

/* grpc_client_open: connects to 127.0.0.1:port and sends SETTINGS. */
void grpc_client_open(struct grpc_client *c, uint16_t port);

/* grpc_client_close: the session and the socket. */
void grpc_client_close(struct grpc_client *c);

/* grpc_client_request: a new stream on c: `method` `path`, content-type
 * application/grpc, grpc-timeout `timeout` (NULL: none), and the body
 * `body` of `len` bytes (kept by the caller until sent). */
void grpc_client_request(struct grpc_client *c, struct grpc_stream *st,
    const char *method, const char *path, const char *timeout,
    const uint8_t *body, size_t len);

/* grpc_client_call: a POST of `path` with `msg` as one length-prefixed
 * message (at most sizeof(st->own) bytes). */
void grpc_client_call(struct grpc_client *c, struct grpc_stream *st,
    const char *path, const char *timeout, const ProtobufCMessage *msg);

/* grpc_client_pump: reads once what the door sent, and answers it. */
void grpc_client_pump(struct grpc_client *c);

/* grpc_client_until: pumps until done(st). */
void grpc_client_until(struct grpc_client *c, struct grpc_stream *st,
    bool (*done)(const struct grpc_stream *));

/* Conditions for grpc_client_until. */
bool grpc_stream_closed(const struct grpc_stream *st);
bool grpc_stream_has_data(const struct grpc_stream *st);

#endif
