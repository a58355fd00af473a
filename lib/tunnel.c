/*
 * tunnel.c: streams over one pipe (moat/tunnel.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "moat/tunnel.h"

static bool
buf_add(struct moat_tun_buf *b, const void *data, size_t len)
{
	if (b->len + len > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		uint8_t *p;

		while (cap < b->len + len)
			cap *= 2;
		if ((p = realloc(b->p, cap)) == NULL)
			return false;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, len);
	b->len += len;
	return true;
}

static void
buf_drop(struct moat_tun_buf *b, size_t n)
{
	memmove(b->p, b->p + n, b->len - n);
	b->len -= n;
}

static void
put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint32_t
get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	    (uint32_t)p[3] << 24;
}

static void
frame(struct moat_tun *t, uint8_t type, uint32_t id, const void *data,
    size_t len)
{
	uint8_t h[MOAT_TUN_HEADER] = { type };

	put32(h + 4, id);
	put32(h + 8, (uint32_t)len);
	if (!buf_add(&t->out, h, sizeof(h)) ||
	    (len > 0 && !buf_add(&t->out, data, len)))
		t->broken = true; /* out of memory: give up the pipe */
}

bool
moat_tun_init(struct moat_tun *t, int fd, size_t max_streams,
    const struct moat_tun_hooks *hooks, void *ctx)
{
	static const struct moat_tun_hooks none;

	memset(t, 0, sizeof(*t));
	t->fd = fd;
	t->max_streams = max_streams;
	t->hooks = hooks ? hooks : &none;
	t->ctx = ctx;
	t->next_id = 1;
	t->s = calloc(max_streams, sizeof(*t->s));
	return t->s != NULL;
}

static void
stream_free(struct moat_tun *t, struct moat_tun_stream *s)
{
	if (t->hooks->on_free)
		t->hooks->on_free(t, s);
	if (s->fd >= 0)
		close(s->fd);
	free(s->to_fd.p);
	memset(s, 0, sizeof(*s));
	s->fd = -1;
}

void
moat_tun_fini(struct moat_tun *t)
{
	for (size_t i = 0; t->s && i < t->max_streams; i++)
		if (t->s[i].used)
			stream_free(t, &t->s[i]);
	free(t->s);
	free(t->out.p);
	free(t->in.p);
	memset(t, 0, sizeof(*t));
	t->fd = -1;
}

static struct moat_tun_stream *
stream_new(struct moat_tun *t, uint32_t id)
{
	for (size_t i = 0; i < t->max_streams; i++) {
		struct moat_tun_stream *s = &t->s[i];

		if (s->used)
			continue;
		memset(s, 0, sizeof(*s));
		s->used = true;
		s->id = id;
		s->fd = -1;
		s->credit = MOAT_TUN_WINDOW;
		return s;
	}
	return NULL;
}

static struct moat_tun_stream *
stream_find(struct moat_tun *t, uint32_t id)
{
	for (size_t i = 0; i < t->max_streams; i++)
		if (t->s[i].used && t->s[i].id == id)
			return &t->s[i];
	return NULL;
}

size_t
moat_tun_count(const struct moat_tun *t)
{
	size_t n = 0;

	for (size_t i = 0; i < t->max_streams; i++)
		n += t->s[i].used;
	return n;
}

struct moat_tun_stream *
moat_tun_open(struct moat_tun *t, int fd)
{
	struct moat_tun_stream *s = stream_new(t, t->next_id);

	if (s == NULL)
		return NULL;
	t->next_id = t->next_id == UINT32_MAX ? 1 : t->next_id + 1;
	s->fd = fd;
	frame(t, MOAT_TUN_OPEN, s->id, NULL, 0);
	return s;
}

void
moat_tun_send(struct moat_tun *t, struct moat_tun_stream *s, const void *data,
    size_t len)
{
	const uint8_t *p = data;

	while (len > 0) {
		size_t n = len < MOAT_TUN_FRAME_MAX ? len : MOAT_TUN_FRAME_MAX;

		frame(t, MOAT_TUN_DATA, s->id, p, n);
		p += n;
		len -= n;
	}
}

/*
 * The peer closed and all it sent is written: the local socket sees its
 * EOF now. Called where either condition turns true, since nothing else
 * may wake the loop that owns the socket (its reader waits on it).
 */
static void
stream_eof_out(struct moat_tun_stream *s)
{
	if (s->peer_closed && s->to_fd.len == 0 && s->fd >= 0 &&
	    !s->connecting && !s->fd_shut) {
		(void)shutdown(s->fd, SHUT_WR);
		s->fd_shut = true;
	}
}

/* A stream ends when both sides have closed and nothing waits for fd. */
static bool
stream_done(struct moat_tun *t, struct moat_tun_stream *s)
{
	if (s->sent_close && s->peer_closed && s->to_fd.len == 0) {
		stream_free(t, s);
		return true;
	}
	return false;
}

void
moat_tun_finish(struct moat_tun *t, struct moat_tun_stream *s)
{
	if (!s->sent_close)
		frame(t, MOAT_TUN_CLOSE, s->id, NULL, 0);
	s->sent_close = true;
	/* The peer's CLOSE still ends the stream: only the bytes go. */
	if (s->fd < 0 || s->connecting)
		s->to_fd.len = 0;
	if (s->to_fd.len == 0 && s->fd >= 0 && !s->connecting) {
		close(s->fd);
		s->fd = -1;
	}
	(void)stream_done(t, s);
}

size_t
moat_tun_pollfds(struct moat_tun *t, struct pollfd *fds)
{
	size_t n = 1;

	fds[0].fd = t->fd;
	fds[0].events = POLLIN | (t->out.len ? POLLOUT : 0);
	fds[0].revents = 0;
	for (size_t i = 0; i < t->max_streams; i++) {
		struct moat_tun_stream *s = &t->s[i];
		short ev = 0;

		if (!s->used || s->fd < 0)
			continue;
		if (s->connecting)
			ev = POLLOUT;
		else {
			if (!s->sent_close && s->credit > 0 &&
			    t->out.len < MOAT_TUN_OUT_MAX)
				ev |= POLLIN;
			if (s->to_fd.len > 0)
				ev |= POLLOUT;
		}
		fds[n].fd = s->fd;
		fds[n].events = ev;
		fds[n].revents = 0;
		n++;
	}
	return n;
}

static void
peer_frame(struct moat_tun *t, uint8_t type, uint32_t id, const uint8_t *p,
    uint32_t len)
{
	struct moat_tun_stream *s = stream_find(t, id);

	if (type < MOAT_TUN_OPEN || type > MOAT_TUN_WINDOW_FRAME) {
		t->broken = true; /* not a frame of ours */
		return;
	}
	if (type == MOAT_TUN_OPEN) {
		if (s != NULL) {
			t->broken = true; /* an id in use */
			return;
		}
		if ((s = stream_new(t, id)) == NULL) {
			/* Full: refuse at once. */
			frame(t, MOAT_TUN_CLOSE, id, NULL, 0);
			return;
		}
		if (t->hooks->on_open)
			t->hooks->on_open(t, s);
		return;
	}
	if (s == NULL)
		return; /* a stream we already ended */
	if (type == MOAT_TUN_WINDOW_FRAME && len == 4) {
		uint32_t more = get32(p);

		s->credit = more > MOAT_TUN_WINDOW - s->credit ?
		    MOAT_TUN_WINDOW :
		    s->credit + more;
	} else if (type == MOAT_TUN_DATA) {
		/* Twice the window: an owner may grow what it holds (a
		 * rewritten request head). */
		if (s->peer_closed ||
		    s->to_fd.len + len > 2 * MOAT_TUN_WINDOW) {
			t->broken = true; /* past its window */
			return;
		}
		if (s->sent_close && (s->fd < 0 || s->connecting))
			return; /* finished: dropped */
		if (!buf_add(&s->to_fd, p, len)) {
			t->broken = true;
			return;
		}
		if (s->fd < 0 && t->hooks->on_data)
			t->hooks->on_data(t, s);
	} else if (type == MOAT_TUN_CLOSE) {
		s->peer_closed = true;
		stream_eof_out(s);
		(void)stream_done(t, s);
	} else {
		t->broken = true;
	}
}

static void
pipe_read(struct moat_tun *t)
{
	uint8_t chunk[65536];
	ssize_t n = read(t->fd, chunk, sizeof(chunk));

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		t->broken = true;
		return;
	}
	if (n < 0 || !buf_add(&t->in, chunk, (size_t)n)) {
		t->broken = t->broken || n > 0;
		return;
	}
	while (!t->broken && t->in.len >= MOAT_TUN_HEADER) {
		uint32_t len = get32(t->in.p + 8);

		if (len > MOAT_TUN_FRAME_MAX) {
			t->broken = true;
			return;
		}
		if (t->in.len < MOAT_TUN_HEADER + len)
			return;
		peer_frame(t, t->in.p[0], get32(t->in.p + 4),
		    t->in.p + MOAT_TUN_HEADER, len);
		buf_drop(&t->in, MOAT_TUN_HEADER + len);
	}
}

static void
pipe_write(struct moat_tun *t)
{
	ssize_t n = write(t->fd, t->out.p, t->out.len);

	if (n > 0)
		buf_drop(&t->out, (size_t)n);
	else if (n < 0 && errno != EAGAIN && errno != EINTR)
		t->broken = true;
}

/* Bytes from the local socket to the peer, within the window. */
static void
stream_read(struct moat_tun *t, struct moat_tun_stream *s)
{
	uint8_t chunk[MOAT_TUN_FRAME_MAX];
	size_t want = s->credit < sizeof(chunk) ? s->credit : sizeof(chunk);
	ssize_t n = read(s->fd, chunk, want);

	if (n > 0) {
		frame(t, MOAT_TUN_DATA, s->id, chunk, (size_t)n);
		s->credit -= (uint32_t)n;
	} else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
		frame(t, MOAT_TUN_CLOSE, s->id, NULL, 0);
		s->sent_close = true;
	}
}

/* Bytes from the peer to the local socket; WINDOW them back. */
static void
stream_write(struct moat_tun *t, struct moat_tun_stream *s)
{
	ssize_t n = write(s->fd, s->to_fd.p, s->to_fd.len);

	if (n > 0) {
		uint32_t earn = (uint32_t)n;
		uint32_t skip = s->ack_skip < earn ? s->ack_skip : earn;

		buf_drop(&s->to_fd, (size_t)n);
		s->ack_skip -= skip;
		s->unacked += earn - skip;
		if (s->unacked > 0 &&
		    (s->unacked >= MOAT_TUN_WINDOW / 4 || s->to_fd.len == 0)) {
			uint8_t w[4];

			put32(w, s->unacked);
			frame(t, MOAT_TUN_WINDOW_FRAME, s->id, w, 4);
			s->unacked = 0;
		}
	} else if (n < 0 && errno != EAGAIN && errno != EINTR) {
		/* The local end is gone: nothing more either way. */
		s->to_fd.len = 0;
		if (!s->sent_close)
			frame(t, MOAT_TUN_CLOSE, s->id, NULL, 0);
		s->sent_close = true;
	}
}

static void
stream_event(struct moat_tun *t, struct moat_tun_stream *s, short re,
    uint64_t now)
{
	if (s->connecting) {
		int err = 0;
		socklen_t el = sizeof(err);

		if (re == 0 && now < s->deadline)
			return;
		if (re == 0)
			err = ETIMEDOUT;
		else if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el) !=
		    0)
			err = errno;
		s->connecting = false;
		if (t->hooks->on_connected)
			t->hooks->on_connected(t, s, err);
		stream_eof_out(s); /* the peer may have closed meanwhile */
		return;
	}
	if (re & POLLOUT)
		stream_write(t, s);
	if ((re & (POLLIN | POLLHUP | POLLERR)) && !s->sent_close)
		stream_read(t, s);
	stream_eof_out(s);
	(void)stream_done(t, s);
}

void
moat_tun_service(struct moat_tun *t, const struct pollfd *fds, size_t n,
    uint64_t now_ms)
{
	/* Streams first: the pipe's frames may free or add some. */
	for (size_t k = 1; k < n; k++)
		for (size_t i = 0; i < t->max_streams; i++) {
			struct moat_tun_stream *s = &t->s[i];

			if (s->used && s->fd == fds[k].fd) {
				stream_event(t, s, fds[k].revents, now_ms);
				break;
			}
		}
	if (fds[0].revents & POLLOUT)
		pipe_write(t);
	if (fds[0].revents & (POLLIN | POLLHUP | POLLERR))
		pipe_read(t);
	if (t->out.len > 0 && !t->broken)
		pipe_write(t);
}

int
moat_tun_timeout_ms(const struct moat_tun *t, uint64_t now_ms)
{
	uint64_t soonest = UINT64_MAX;

	for (size_t i = 0; i < t->max_streams; i++)
		if (t->s[i].used && t->s[i].connecting &&
		    t->s[i].deadline < soonest)
			soonest = t->s[i].deadline;
	if (soonest == UINT64_MAX)
		return -1;
	return soonest <= now_ms ? 0 : (int)(soonest - now_ms);
}
