/*
 * test_tunnel.c: moat/tunnel.h, the stream mux of guest egress (issue
 * 14), with both ends in one thread over socketpairs (no network): bytes
 * both ways past several windows, half closes, a peer past its window, a
 * garbage frame, a full stream table. cmocka; label "unit".
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "moat/tunnel.h"

#define BIG (5 * MOAT_TUN_WINDOW + 123)

struct host_ctx {
	int server_fd; /* given to the first stream the guest opens */
	int opened;
};

static void
host_on_data(struct moat_tun *t, struct moat_tun_stream *s)
{
	struct host_ctx *h = t->ctx;

	if (s->fd < 0 && h->server_fd >= 0) {
		s->fd = h->server_fd;
		h->server_fd = -1;
		h->opened++;
	}
}

static const struct moat_tun_hooks host_hooks = { .on_data = host_on_data };

static void
pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0,
	                     sv),
	    0);
}

/* One round of both ends. */
static void
spin(struct moat_tun *a, struct moat_tun *b)
{
	struct pollfd fa[8], fb[8];
	size_t na = moat_tun_pollfds(a, fa), nb = moat_tun_pollfds(b, fb);

	(void)poll(fa, na, 5);
	moat_tun_service(a, fa, na, 0);
	(void)poll(fb, nb, 5);
	moat_tun_service(b, fb, nb, 0);
}

static void
test_bytes_both_ways(void **state)
{
	int pipe_sv[2], client[2], server[2];
	struct moat_tun g, h;
	struct host_ctx hc;
	char *out = malloc(BIG), *in = malloc(BIG), *back = malloc(BIG);
	size_t sent = 0, got = 0, sent_back = 0, got_back = 0;
	(void)state;

	pair(pipe_sv);
	pair(client);
	pair(server);
	for (size_t i = 0; i < BIG; i++)
		out[i] = (char)(i * 7 + 3);
	hc.server_fd = server[0];
	hc.opened = 0;
	assert_true(moat_tun_init(&g, pipe_sv[0], 4, NULL, NULL));
	assert_true(moat_tun_init(&h, pipe_sv[1], 4, &host_hooks, &hc));
	assert_non_null(moat_tun_open(&g, client[0]));
	for (int round = 0; round < 20000 && (got < BIG || got_back < BIG);
	     round++) {
		ssize_t n;

		if (sent < BIG &&
		    (n = write(client[1], out + sent, BIG - sent)) > 0)
			sent += (size_t)n;
		if ((n = read(server[1], in + got, BIG - got)) > 0)
			got += (size_t)n;
		if (sent_back < got &&
		    (n = write(server[1], in + sent_back, got - sent_back)) >
		        0)
			sent_back += (size_t)n;
		if ((n = read(client[1], back + got_back, BIG - got_back)) > 0)
			got_back += (size_t)n;
		spin(&g, &h);
		assert_false(g.broken);
		assert_false(h.broken);
	}
	assert_int_equal(hc.opened, 1);
	assert_int_equal(got, BIG);
	assert_int_equal(got_back, BIG);
	assert_memory_equal(out, in, BIG);
	assert_memory_equal(out, back, BIG);

	/* Half closes: the guest's client stops writing, then the server. */
	shutdown(client[1], SHUT_WR);
	for (int round = 0; round < 200; round++)
		spin(&g, &h);
	assert_int_equal(read(server[1], in, 16), 0); /* EOF arrived */
	close(server[1]);
	for (int round = 0; round < 200 && moat_tun_count(&g) > 0; round++)
		spin(&g, &h);
	assert_int_equal(moat_tun_count(&g), 0);
	assert_int_equal(moat_tun_count(&h), 0);
	assert_int_equal(read(client[1], in, 16), 0);
	moat_tun_fini(&g);
	moat_tun_fini(&h);
	close(client[1]);
	close(pipe_sv[0]);
	close(pipe_sv[1]);
	free(out);
	free(in);
	free(back);
}

/* Frames a misbehaving peer writes by hand. */
static void
raw_frame(int fd, uint8_t type, uint32_t id, const void *p, uint32_t len)
{
	uint8_t h[MOAT_TUN_HEADER] = { type, 0, 0, 0, (uint8_t)id,
		(uint8_t)(id >> 8), (uint8_t)(id >> 16), (uint8_t)(id >> 24),
		(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
		(uint8_t)(len >> 24) };

	assert_int_equal(write(fd, h, sizeof(h)), sizeof(h));
	if (len > 0)
		assert_int_equal(write(fd, p, len), (ssize_t)len);
}

static void
service_once(struct moat_tun *t)
{
	struct pollfd f[8];
	size_t n = moat_tun_pollfds(t, f);

	(void)poll(f, n, 20);
	moat_tun_service(t, f, n, 0);
}

static void
test_bad_peers(void **state)
{
	static char junk[MOAT_TUN_FRAME_MAX];
	int sv[2];
	struct moat_tun h;
	(void)state;

	/* Past its window without WINDOW frames: the pipe is dropped. */
	pair(sv);
	fcntl(sv[1], F_SETFL, 0);
	assert_true(moat_tun_init(&h, sv[0], 2, NULL, NULL));
	raw_frame(sv[1], MOAT_TUN_OPEN, 9, NULL, 0);
	for (int i = 0;
	     i < 2 * MOAT_TUN_WINDOW / MOAT_TUN_FRAME_MAX + 1 && !h.broken;
	     i++) {
		raw_frame(sv[1], MOAT_TUN_DATA, 9, junk, sizeof(junk));
		service_once(&h);
	}
	assert_true(h.broken);
	moat_tun_fini(&h);
	close(sv[0]);
	close(sv[1]);

	/* An oversized or unknown frame. */
	pair(sv);
	assert_true(moat_tun_init(&h, sv[0], 2, NULL, NULL));
	raw_frame(sv[1], 77, 1, NULL, 0);
	service_once(&h);
	assert_true(h.broken);
	moat_tun_fini(&h);
	close(sv[0]);
	close(sv[1]);
	pair(sv);
	assert_true(moat_tun_init(&h, sv[0], 2, NULL, NULL));
	{
		uint8_t hd[MOAT_TUN_HEADER] = { MOAT_TUN_DATA, 0, 0, 0, 1, 0,
			0, 0, 0xff, 0xff, 0xff, 0x7f };
		assert_int_equal(write(sv[1], hd, sizeof(hd)), sizeof(hd));
	}
	service_once(&h);
	assert_true(h.broken);
	moat_tun_fini(&h);
	close(sv[0]);
	close(sv[1]);

	/* A full table refuses the third stream with a CLOSE, no harm. */
	pair(sv);
	assert_true(moat_tun_init(&h, sv[0], 2, NULL, NULL));
	raw_frame(sv[1], MOAT_TUN_OPEN, 1, NULL, 0);
	raw_frame(sv[1], MOAT_TUN_OPEN, 2, NULL, 0);
	raw_frame(sv[1], MOAT_TUN_OPEN, 3, NULL, 0);
	raw_frame(sv[1], MOAT_TUN_DATA, 42, "x", 1); /* unknown: ignored */
	service_once(&h);
	service_once(&h);
	assert_false(h.broken);
	assert_int_equal(moat_tun_count(&h), 2);
	{
		uint8_t back[64];
		ssize_t n = read(sv[1], back, sizeof(back));

		assert_int_equal(n, MOAT_TUN_HEADER);
		assert_int_equal(back[0], MOAT_TUN_CLOSE);
		assert_int_equal(back[4], 3);
	}
	moat_tun_fini(&h);
	close(sv[0]);
	close(sv[1]);
}

/*
 * The peer's CLOSE arrives alone, after its bytes were written: the
 * local socket gets its EOF in that same service, since nothing else
 * would wake a loop blocked in poll (a client waiting for the end of a
 * response through CONNECT hung until its timeout).
 */
static void
test_close_alone(void **state)
{
	int sv[2], server[2];
	struct moat_tun h;
	struct host_ctx hc;
	char buf[16];
	(void)state;

	pair(sv);
	pair(server);
	hc.server_fd = server[0];
	hc.opened = 0;
	assert_true(moat_tun_init(&h, sv[0], 2, &host_hooks, &hc));
	raw_frame(sv[1], MOAT_TUN_OPEN, 5, NULL, 0);
	raw_frame(sv[1], MOAT_TUN_DATA, 5, "GET", 3);
	for (int i = 0; i < 10 && read(server[1], buf, sizeof(buf)) != 3; i++)
		service_once(&h);
	assert_int_equal(hc.opened, 1);
	raw_frame(sv[1], MOAT_TUN_CLOSE, 5, NULL, 0);
	service_once(&h);
	assert_int_equal(read(server[1], buf, sizeof(buf)), 0);
	moat_tun_fini(&h);
	close(server[1]);
	close(sv[0]);
	close(sv[1]);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bytes_both_ways),
		cmocka_unit_test(test_bad_peers),
		cmocka_unit_test(test_close_alone),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
