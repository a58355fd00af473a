/*
 * tunnel.h: many byte streams over one byte pipe (guest egress, issue 14:
 * the guest agent's proxy listener and vmd's egress proxy, over a
 * virtio-serial port). Frames are a 12-byte header (type u8, 3 zero
 * bytes, stream u32 LE, length u32 LE) and a payload of at most
 * MOAT_TUN_FRAME_MAX bytes:
 *   OPEN   (guest -> host) a new stream, no payload;
 *   DATA   stream bytes; never more than the receiver's window allows;
 *   CLOSE  the sender sends no more on the stream (a half close); a
 *          stream ends when both sides have sent CLOSE;
 *   WINDOW u32 LE: the receiver took that many more bytes.
 * Each side may send MOAT_TUN_WINDOW bytes per stream before a WINDOW, so
 * one slow socket never stalls the others. Single-threaded: one poll loop
 * owns a struct moat_tun. Not for: what a stream means (egress.c, the
 * agent's egress.c decide).
 */
#ifndef MOAT_TUNNEL_H
#define MOAT_TUNNEL_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOAT_TUN_OPEN 1
#define MOAT_TUN_DATA 2
#define MOAT_TUN_CLOSE 3
#define MOAT_TUN_WINDOW_FRAME 4
#define MOAT_TUN_HEADER 12
#define MOAT_TUN_FRAME_MAX 16384
#define MOAT_TUN_WINDOW 65536
#define MOAT_TUN_OUT_MAX (1024 * 1024) /* frames queued before reads stop */

struct moat_tun_buf {
	uint8_t *p;
	size_t len, cap;
};

struct moat_tun_stream {
	bool used;
	uint32_t id;
	int fd;            /* the local socket; -1 while the owner has none */
	bool connecting;   /* fd's non-blocking connect() is under way */
	uint64_t deadline; /* ms: when a connect gives up */
	struct moat_tun_buf to_fd; /* from the peer, not yet written to fd */
	uint32_t credit;           /* bytes we may still send the peer */
	uint32_t unacked;          /* written to fd, not yet WINDOWed */
	uint32_t ack_skip;         /* next bytes written earn no WINDOW (the
	                              owner added them to to_fd itself) */
	bool peer_closed;          /* peer sent CLOSE */
	bool sent_close;           /* we sent CLOSE */
	bool fd_shut;              /* shutdown(SHUT_WR) done */
	void *user;                /* the owner's */
};

struct moat_tun;

/* What the owner hears. All optional. */
struct moat_tun_hooks {
	/* The peer opened stream s (fd -1): the owner reads s->to_fd as it
	 * fills (on_data) and then connects s->fd or refuses. */
	void (*on_open)(struct moat_tun *t, struct moat_tun_stream *s);
	/* Bytes arrived for s while s->fd < 0. */
	void (*on_data)(struct moat_tun *t, struct moat_tun_stream *s);
	/* s's connect finished: err 0 or an errno. */
	void (*on_connected)(struct moat_tun *t, struct moat_tun_stream *s,
	    int err);
	/* s is about to be freed (its fd is closed after). */
	void (*on_free)(struct moat_tun *t, struct moat_tun_stream *s);
};

struct moat_tun {
	int fd; /* the pipe (non-blocking) */
	struct moat_tun_buf out, in;
	struct moat_tun_stream *s;
	size_t max_streams;
	uint32_t next_id;
	bool broken; /* the pipe closed or the peer spoke nonsense */
	const struct moat_tun_hooks *hooks;
	void *ctx; /* the owner's */
};

/* moat_tun_init: t over pipe `fd` with room for max_streams streams.
 * Returns false when out of memory. */
bool moat_tun_init(struct moat_tun *t, int fd, size_t max_streams,
    const struct moat_tun_hooks *hooks, void *ctx);
/* moat_tun_fini: closes every stream's fd and frees; not t->fd. */
void moat_tun_fini(struct moat_tun *t);

/* moat_tun_open: a new stream for local socket fd (sends OPEN); NULL
 * when full (the caller closes fd). */
struct moat_tun_stream *moat_tun_open(struct moat_tun *t, int fd);

/* moat_tun_send: queues bytes to the peer on s outside the window (small
 * replies the owner makes itself). */
void moat_tun_send(struct moat_tun *t, struct moat_tun_stream *s,
    const void *data, size_t len);

/* moat_tun_finish: sends CLOSE on s, drops what the peer sends from now
 * on, and closes s->fd (if any) once what was queued for it is written. */
void moat_tun_finish(struct moat_tun *t, struct moat_tun_stream *s);

/* moat_tun_count: streams in use. */
size_t moat_tun_count(const struct moat_tun *t);

/* moat_tun_pollfds: fills fds (room for 1 + max_streams) for the pipe and
 * each stream; returns how many. */
size_t moat_tun_pollfds(struct moat_tun *t, struct pollfd *fds);

/* moat_tun_service: handles poll's answer on fds[0..n) and the connect
 * deadlines at `now_ms`. Sets t->broken when the pipe is gone. */
void moat_tun_service(struct moat_tun *t, const struct pollfd *fds, size_t n,
    uint64_t now_ms);

/* moat_tun_timeout_ms: how long poll may sleep (-1: no deadline). */
int moat_tun_timeout_ms(const struct moat_tun *t, uint64_t now_ms);

#endif
