/*
 * grpc_client.c: the gRPC door's test client (grpc_client.h) on
 * libnghttp2's client session over a blocking socket with a receive
 * timeout. Each stream's user data is its struct grpc_stream, which
 * collects grpc-status, grpc-message and the DATA bytes.
 * Not for: anything but the door's unit tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "grpc.h"
#include "grpc_client.h"

static ssize_t
c_send(nghttp2_session *s, const uint8_t *d, size_t n, int fl, void *ud)
{
	struct grpc_client *c = ud;

	(void)s;
	(void)fl;
	return send(c->fd, d, n, MSG_NOSIGNAL);
}

static int
c_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
    size_t nl, const uint8_t *v, size_t vl, uint8_t fl, void *ud)
{
	struct grpc_stream *st =
	    nghttp2_session_get_stream_user_data(s, f->hd.stream_id);

	(void)fl;
	(void)ud;
	if (st == NULL)
		return 0;
	if (nl == 11 && memcmp(name, "grpc-status", 11) == 0)
		st->grpc_status = atoi((const char *)v);
	if (nl == 12 && memcmp(name, "grpc-message", 12) == 0 &&
	    vl < sizeof(st->message))
		memcpy(st->message, v, vl);
	return 0;
}

static int
c_data(nghttp2_session *s, uint8_t fl, int32_t id, const uint8_t *d, size_t n,
    void *ud)
{
	struct grpc_stream *st = nghttp2_session_get_stream_user_data(s, id);

	(void)fl;
	(void)ud;
	if (st != NULL && st->data_len + n <= sizeof(st->data)) {
		memcpy(st->data + st->data_len, d, n);
		st->data_len += n;
	}
	return 0;
}

static int
c_close(nghttp2_session *s, int32_t id, uint32_t err, void *ud)
{
	struct grpc_stream *st = nghttp2_session_get_stream_user_data(s, id);

	(void)err;
	(void)ud;
	if (st != NULL)
		st->closed = true;
	return 0;
}

static ssize_t
c_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct grpc_stream *st = src->ptr;
	size_t n = st->body_len - st->body_off;

	(void)s;
	(void)id;
	(void)ud;
	if (n > len)
		n = len;
	memcpy(buf, st->body + st->body_off, n);
	st->body_off += n;
	if (st->body_off == st->body_len)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

void
grpc_client_open(struct grpc_client *c, uint16_t port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct timeval tv = { .tv_sec = 60 };
	nghttp2_session_callbacks *cbs;

	c->fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(c->fd >= 0);
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	sin.sin_port = htons(port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(c->fd, (struct sockaddr *)&sin, sizeof(sin)),
	    0);
	assert_int_equal(nghttp2_session_callbacks_new(&cbs), 0);
	nghttp2_session_callbacks_set_send_callback(cbs, c_send);
	nghttp2_session_callbacks_set_on_header_callback(cbs, c_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, c_data);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, c_close);
	assert_int_equal(nghttp2_session_client_new(&c->s, cbs, c), 0);
	nghttp2_session_callbacks_del(cbs);
	assert_int_equal(nghttp2_submit_settings(c->s, NGHTTP2_FLAG_NONE, NULL,
	                     0),
	    0);
}

void
grpc_client_close(struct grpc_client *c)
{
	nghttp2_session_del(c->s);
	close(c->fd);
}

void
grpc_client_request(struct grpc_client *c, struct grpc_stream *st,
    const char *method, const char *path, const char *timeout,
    const uint8_t *body, size_t len)
{
	nghttp2_data_provider dp = { .source.ptr = st,
		.read_callback = c_body };
	nghttp2_nv nv[6];
	size_t n = 0;

#define H(k, v)                                                               \
	nv[n++] = (nghttp2_nv){ (uint8_t *)(k), (uint8_t *)(v), strlen(k),    \
		strlen(v), NGHTTP2_NV_FLAG_NONE }
	st->id = 0;
	st->grpc_status = -1;
	st->message[0] = '\0';
	st->data_len = 0;
	st->closed = false;
	st->body = body;
	st->body_len = len;
	st->body_off = 0;
	H(":method", method);
	H(":scheme", "http");
	H(":authority", "localhost");
	H(":path", path);
	H("content-type", "application/grpc");
	if (timeout != NULL)
		H("grpc-timeout", timeout);
#undef H
	st->id = nghttp2_submit_request(c->s, NULL, nv, n, &dp, st);
	assert_true(st->id > 0);
	assert_int_equal(nghttp2_session_send(c->s), 0);
}

void
grpc_client_call(struct grpc_client *c, struct grpc_stream *st,
    const char *path, const char *timeout, const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);

	assert_true(len + MOAT_GRPC_PREFIX <= sizeof(st->own));
	moat_grpc_frame_header(st->own, (uint32_t)len);
	protobuf_c_message_pack(msg, st->own + MOAT_GRPC_PREFIX);
	grpc_client_request(c, st, "POST", path, timeout, st->own,
	    len + MOAT_GRPC_PREFIX);
}

void
grpc_client_pump(struct grpc_client *c)
{
	uint8_t buf[16384];
	ssize_t got = recv(c->fd, buf, sizeof(buf), 0);

	if (got <= 0)
		fail_msg("the door closed the connection or did not answer");
	assert_true(nghttp2_session_mem_recv(c->s, buf, (size_t)got) >= 0);
	assert_int_equal(nghttp2_session_send(c->s), 0);
}

void
grpc_client_until(struct grpc_client *c, struct grpc_stream *st,
    bool (*done)(const struct grpc_stream *))
{
	while (!done(st))
		grpc_client_pump(c);
}

bool
grpc_stream_closed(const struct grpc_stream *st)
{
	return st->closed;
}

bool
grpc_stream_has_data(const struct grpc_stream *st)
{
	return st->data_len > 0 || st->closed;
}
