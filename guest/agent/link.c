/*
 * link.c: moat-agent's end of the guest link. It owns the one byte stream
 * to the host: a virtio-serial port (QEMU), an accepted AF_VSOCK stream
 * (Firecracker) or an accepted Unix stream (host mode, for tests). Input
 * goes through a capped moat_frame_reader into agent_dispatch; output is
 * a queue of encoded frames written as the stream takes them, so a slow
 * host never blocks the loop (the loop stops reading pipes and requests
 * while the queue is above AGENT_OUT_HIGH). Each new host gets AgentReady
 * first. Not for: what requests mean (loop.c and the handlers).
 *
 * A virtio-serial port is opened once (retrying every PORT_RETRY_MS until
 * the device is there) and kept open: closing and reopening it would tell
 * QEMU each time (a VSERPORT_CHANGE event). It reports POLLHUP while no
 * host is attached to its chardev; the agent then ends the session (what
 * was read is taken to EOF first, so nothing of the old host is left) and
 * looks again every PORT_RETRY_MS; when POLLHUP clears, a new host is
 * there and gets AgentReady. A host that drops and comes back between two
 * looks is not noticed: it gets no new AgentReady.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent.h"
#include "moat/log.h"
#include "moat/status.h"

#define PORT_RETRY_MS 20
#define LINK_READ_CHUNK (64u << 10)
#define LINK_READ_BUDGET (1u << 20) /* per loop turn, for fairness */

struct agent_out {
	struct agent_out *next;
	size_t len, off;
	uint8_t data[];
};

static int
link_queue(struct agent *a, struct agent_out *o)
{
	struct agent_link *l = &a->link;

	o->next = NULL;
	if (l->out_tail != NULL)
		l->out_tail->next = o;
	else
		l->out_head = o;
	l->out_tail = o;
	l->out_bytes += o->len;
	return 0;
}

int
agent_link_queue_raw(struct agent *a, const void *data, size_t len)
{
	struct agent_out *o;

	if (a->link.fd < 0 || a->link.muted)
		return 0;
	if ((o = malloc(sizeof(*o) + len)) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	o->len = len;
	o->off = 0;
	memcpy(o->data, data, len);
	return link_queue(a, o);
}

/* link_encode: msg as one queued frame, or NULL (too big, no memory). */
static struct agent_out *
link_encode(const Moat__V1__GuestMessage *msg)
{
	struct agent_out *o;
	size_t body = moat__v1__guest_message__get_packed_size(msg);

	if (body > MOAT_FRAME_MAX) {
		moat_error(msg->id, "reply of %zu bytes is over the frame cap",
		    body);
		return NULL;
	}
	if ((o = malloc(sizeof(*o) + 4 + body)) == NULL) {
		moat_error(msg->id, "out of memory for a %zu-byte reply",
		    body);
		return NULL;
	}
	o->len = 4 + body;
	o->off = 0;
	o->data[0] = (uint8_t)(body >> 24);
	o->data[1] = (uint8_t)(body >> 16);
	o->data[2] = (uint8_t)(body >> 8);
	o->data[3] = (uint8_t)body;
	moat__v1__guest_message__pack(msg, o->data + 4);
	return o;
}

int
agent_send(struct agent *a, const Moat__V1__GuestMessage *msg)
{
	Moat__V1__GuestMessage err = MOAT__V1__GUEST_MESSAGE__INIT;
	struct agent_out *o;

	if (a->link.fd < 0 || a->link.muted)
		return 0;
	if ((o = link_encode(msg)) != NULL)
		return link_queue(a, o);
	/* The host waits for an answer to this id: give it a small one
	 * rather than none. */
	err.id = msg->id;
	err.code = MOAT__V1__CODE__RESOURCE_EXHAUSTED;
	err.message = (char *)"the answer did not fit in one frame or in "
	                      "the agent's memory; ask for less";
	if ((o = link_encode(&err)) != NULL)
		(void)link_queue(a, o);
	return MOAT_RESOURCE_EXHAUSTED;
}

void
agent_send_error(struct agent *a, uint64_t id, int code, const char *fmt, ...)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	char text[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	m.id = id;
	m.code = (Moat__V1__Code)code;
	m.message = text;
	moat_debug(id, "error %s: %s", moat_strerror(code), text);
	(void)agent_send(a, &m);
}

void
agent_send_ack(struct agent *a, uint64_t id)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__Empty empty = MOAT__V1__EMPTY__INIT;

	m.id = id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_ACK;
	m.ack = &empty;
	(void)agent_send(a, &m);
}

static void
link_drop_queue(struct agent_link *l)
{
	struct agent_out *o, *next;

	for (o = l->out_head; o != NULL; o = next) {
		next = o->next;
		free(o);
	}
	l->out_head = l->out_tail = NULL;
	l->out_bytes = 0;
}

void
agent_link_close(struct agent *a, const char *why)
{
	struct agent_link *l = &a->link;

	if (l->fd >= 0) {
		moat_info(0, "host link closed: %s", why);
		if (l->fd != l->listen_fd) /* a port stays open */
			close(l->fd);
		l->fd = -1;
		agent_exec_drop_all(a);
		agent_code_drop_host(a);
	}
	link_drop_queue(l);
	moat_frame_reader_fini(&l->reader);
	l->muted = false;
	l->flooding = false;
	if (l->kind == AGENT_LINK_PORT)
		l->retry_at_ms = agent_now_ms() + PORT_RETRY_MS;
}

/* link_session_start: a host is there: the first thing it reads is
 * AgentReady. */
static void
link_session_start(struct agent *a, int fd)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__AgentReady ready = MOAT__V1__AGENT_READY__INIT;

	a->link.fd = fd;
	moat_frame_reader_init(&a->link.reader, MOAT_FRAME_MAX);
	ready.agent_version = (char *)MOAT_VERSION;
	ready.boot_ms = a->boot_ms;
	ready.kernel = a->kernel;
	m.id = 0;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_READY;
	m.ready = &ready;
	(void)agent_send(a, &m);
	moat_info(0, "host link open; AgentReady queued");
	if (a->test_mode[0] != '\0')
		agent_test_mode_start(a);
}

static int
link_listen_unix(struct agent_link *l)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	int fd, rv;

	if (strlen(l->path) >= sizeof(sun.sun_path)) {
		moat_error(0, "socket path %s is longer than %zu bytes",
		    l->path, sizeof(sun.sun_path) - 1);
		return ENAMETOOLONG;
	}
	memcpy(sun.sun_path, l->path, strlen(l->path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return errno;
	(void)unlink(l->path);
	if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0 ||
	    chmod(l->path, 0600) != 0 || listen(fd, 4) != 0) {
		rv = errno;
		moat_error(0, "listen on unix:%s: %s", l->path, strerror(rv));
		close(fd);
		return rv;
	}
	l->listen_fd = fd;
	return 0;
}

static int
link_listen_vsock(struct agent_link *l)
{
	struct sockaddr_vm svm = { .svm_family = AF_VSOCK };
	int fd, rv;

	svm.svm_cid = VMADDR_CID_ANY;
	svm.svm_port = l->vsock_port;
	if ((fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
		rv = errno;
		moat_error(0,
		    "AF_VSOCK socket: %s (is the vsock module "
		    "loaded?)",
		    strerror(rv));
		return rv;
	}
	if (bind(fd, (struct sockaddr *)&svm, sizeof(svm)) != 0 ||
	    listen(fd, 4) != 0) {
		rv = errno;
		moat_error(0, "listen on vsock port %u: %s", l->vsock_port,
		    strerror(rv));
		close(fd);
		return rv;
	}
	l->listen_fd = fd;
	return 0;
}

int
agent_link_listen(struct agent *a)
{
	struct agent_link *l = &a->link;

	l->fd = -1;
	l->listen_fd = -1;
	l->retry_at_ms = 0;
	switch (l->kind) {
	case AGENT_LINK_UNIX:
		return link_listen_unix(l);
	case AGENT_LINK_VSOCK:
		return link_listen_vsock(l);
	case AGENT_LINK_PORT:
		return 0;
	}
	return EINVAL;
}

/* link_port_try: opens the port if it is not open yet, and starts a
 * session if a host is attached to it. */
static void
link_port_try(struct agent *a, uint64_t now)
{
	struct agent_link *l = &a->link;
	struct pollfd pfd;

	l->retry_at_ms = now + PORT_RETRY_MS;
	if (l->listen_fd < 0) {
		l->listen_fd =
		    open(l->path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (l->listen_fd < 0)
			return; /* ENOENT: not there yet; EBUSY: held */
	}
	pfd.fd = l->listen_fd;
	pfd.events = POLLIN | POLLOUT;
	pfd.revents = 0;
	if (poll(&pfd, 1, 0) < 0)
		return;
	if (pfd.revents & (POLLERR | POLLNVAL)) {
		moat_warn(0, "port %s failed; opening it again", l->path);
		close(l->listen_fd);
		l->listen_fd = -1;
		return;
	}
	if (pfd.revents & POLLHUP)
		return; /* no host yet */
	link_session_start(a, l->listen_fd);
}

int
agent_link_timer(struct agent *a, uint64_t now)
{
	struct agent_link *l = &a->link;

	if (l->kind != AGENT_LINK_PORT || l->fd >= 0)
		return -1;
	if (now >= l->retry_at_ms)
		link_port_try(a, now);
	if (l->fd >= 0)
		return -1;
	return (int)(l->retry_at_ms > now ? l->retry_at_ms - now : 0);
}

int
agent_link_pollfds(struct agent *a, struct pollfd *pfd, bool paused)
{
	struct agent_link *l = &a->link;

	if (l->fd < 0) {
		/* a port without a host is looked at by the timer: it would
		 * report POLLHUP on every turn */
		if (l->listen_fd < 0 || l->kind == AGENT_LINK_PORT)
			return 0;
		pfd[0].fd = l->listen_fd;
		pfd[0].events = POLLIN;
		pfd[0].revents = 0;
		return 1;
	}
	if (l->flooding)
		agent_test_flood_refill(a);
	pfd[0].fd = l->fd;
	pfd[0].events = (paused ? 0 : POLLIN) | (l->out_head ? POLLOUT : 0);
	pfd[0].revents = 0;
	return 1;
}

/* link_write: writes queued frames until the stream would block. Returns
 * 0, or an errno value when the host is gone. */
static int
link_write(struct agent_link *l)
{
	while (l->out_head != NULL) {
		struct agent_out *o = l->out_head;
		ssize_t n = write(l->fd, o->data + o->off, o->len - o->off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return errno;
		}
		o->off += (size_t)n;
		l->out_bytes -= (size_t)n;
		if (o->off == o->len) {
			l->out_head = o->next;
			if (l->out_head == NULL)
				l->out_tail = NULL;
			free(o);
		}
	}
	return 0;
}

/* link_take_frames: hands every whole buffered frame to the dispatcher.
 * Returns 0, or -1 when the stream declared a frame over the cap (it is
 * then out of step and cannot be read further). */
static int
link_take_frames(struct agent *a)
{
	uint8_t *frame;
	size_t len;
	int rv;

	while (a->link.fd >= 0 &&
	    (rv = moat_frame_reader_next(&a->link.reader, &frame, &len)) ==
	        MOAT_OK) {
		agent_dispatch(a, frame, len);
		free(frame);
	}
	if (a->link.fd >= 0 && rv == MOAT_OUT_OF_RANGE)
		return -1;
	return 0;
}

/* link_bad_stream: the host declared a frame over the cap. Tell it, then
 * drop the stream: a socket is closed (the host reconnects); a port
 * cannot be, so its bytes so far are thrown away and reading goes on. */
static void
link_bad_stream(struct agent *a)
{
	agent_send_error(a, 0, MOAT_INVALID_ARGUMENT,
	    "the host sent a frame longer than the %u-byte cap; the stream "
	    "is out of step, so the agent drops it: reconnect and keep "
	    "frames under the cap",
	    MOAT_FRAME_MAX);
	if (a->link.kind == AGENT_LINK_PORT) {
		moat_frame_reader_fini(&a->link.reader);
		moat_frame_reader_init(&a->link.reader, MOAT_FRAME_MAX);
		return;
	}
	agent_link_flush(a, agent_now_ms() + 200);
	agent_link_close(a, "frame over the cap from the host");
}

/* link_read: reads what the host sent (up to a budget) and dispatches
 * whole frames. Returns 0, or -1 when the host is gone. */
static int
link_read(struct agent *a)
{
	static uint8_t chunk[LINK_READ_CHUNK];
	struct agent_link *l = &a->link;
	size_t budget = LINK_READ_BUDGET;

	while (budget > 0 && l->fd >= 0) {
		ssize_t n = read(l->fd, chunk, sizeof(chunk));
		size_t off = 0;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN ? 0 : -1;
		}
		if (n == 0)
			return -1;
		budget -= (size_t)n < budget ? (size_t)n : budget;
		if (l->muted)
			continue;
		while (off < (size_t)n && l->fd >= 0) {
			size_t room = l->reader.max_frame + 4 - l->reader.len;
			size_t take = (size_t)n - off;

			if (take > room)
				take = room;
			if (moat_frame_reader_feed(&l->reader, chunk + off,
			        take) != MOAT_OK) {
				agent_link_close(a,
				    "out of memory for a frame");
				return 0;
			}
			off += take;
			if (link_take_frames(a) != 0) {
				link_bad_stream(a);
				break;
			}
		}
	}
	return 0;
}

void
agent_link_events(struct agent *a, const struct pollfd *pfd, int n)
{
	struct agent_link *l = &a->link;
	int fd, rv;

	if (n < 1 || pfd[0].revents == 0)
		return;
	if (pfd[0].fd == l->listen_fd && l->fd < 0 &&
	    l->kind != AGENT_LINK_PORT) {
		fd = accept4(l->listen_fd, NULL, NULL,
		    SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0)
			link_session_start(a, fd);
		else if (errno != EAGAIN && errno != EINTR)
			moat_warn(0, "accept: %s", strerror(errno));
		return;
	}
	if (pfd[0].fd != l->fd)
		return;
	if ((pfd[0].revents & POLLOUT) && (rv = link_write(l)) != 0) {
		agent_link_close(a, strerror(rv));
		return;
	}
	if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
		if (link_read(a) != 0) {
			agent_link_close(a, "the host hung up");
			return;
		}
		/* POLLHUP without data left: a port whose host went away */
		if ((pfd[0].revents & (POLLHUP | POLLERR)) &&
		    !(pfd[0].revents & POLLIN) && l->fd >= 0)
			agent_link_close(a, "the host hung up");
	}
}

void
agent_link_flush(struct agent *a, uint64_t deadline_ms)
{
	struct agent_link *l = &a->link;

	while (l->fd >= 0 && l->out_head != NULL) {
		struct pollfd pfd = { .fd = l->fd, .events = POLLOUT };
		uint64_t now = agent_now_ms();
		int rv;

		if (now >= deadline_ms)
			return;
		rv = poll(&pfd, 1, (int)(deadline_ms - now));
		if (rv < 0 && errno != EINTR)
			return;
		if (rv > 0 && (pfd.revents & POLLOUT) && link_write(l) != 0)
			return;
		if (rv > 0 && (pfd.revents & (POLLHUP | POLLERR)) &&
		    !(pfd.revents & POLLOUT))
			return;
	}
}
