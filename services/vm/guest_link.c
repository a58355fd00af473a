/*
 * guest_link.c: vmd's end of a guest link (see guest_link.h): the reader
 * thread, request ids, callers waiting for answers, and writes bounded by
 * the caller's deadline so a guest that stops reading cannot hang an RPC
 * worker. Not for: what the messages mean.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "guest_link.h"
#include "moat/frame.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sync.h"

#define LINK_READ_CHUNK (64u * 1024u)

/* A caller waiting for the answer to one request; on its stack. */
struct pending {
	struct pending *next;
	uint64_t id;
	Moat__V1__GuestMessage *reply; /* set by the reader */
};

struct guest_link {
	int fd; /* non-blocking; owned */
	size_t max_frame;
	const struct guest_link_hooks *hooks;
	void *arg;
	pthread_t reader;
	bool reader_started;

	/* write_mu: one frame at a time on the stream. */
	pthread_mutex_t write_mu;

	pthread_mutex_t mu; /* guards the fields below */
	pthread_cond_t cv;  /* a reply came, or the link closed */
	uint64_t last_id;   /* highest id handed out */
	unsigned in_hook;   /* reader calls into hooks now (set_hooks waits) */
	struct pending *pending;
	bool closed;
	bool shut;          /* guest_link_shutdown was called */
	char *close_reason; /* heap */
};

static void
link_mark_closed(struct guest_link *gl, const char *reason)
{
	pthread_mutex_lock(&gl->mu);
	if (!gl->closed) {
		gl->closed = true;
		gl->close_reason = strdup(reason);
	}
	pthread_cond_broadcast(&gl->cv);
	pthread_mutex_unlock(&gl->mu);
}

/* The hooks to call now and their arg, counted in use until hook_end,
 * so guest_link_set_hooks can wait out a call to the old ones. */
static const struct guest_link_hooks *
hook_begin(struct guest_link *gl, void **arg)
{
	const struct guest_link_hooks *h;

	pthread_mutex_lock(&gl->mu);
	h = gl->hooks;
	*arg = gl->arg;
	gl->in_hook++;
	pthread_mutex_unlock(&gl->mu);
	return h;
}

static void
hook_end(struct guest_link *gl)
{
	pthread_mutex_lock(&gl->mu);
	gl->in_hook--;
	pthread_cond_broadcast(&gl->cv);
	pthread_mutex_unlock(&gl->mu);
}

/* Handles one decoded frame. Returns 0, or -1 with *why (heap) for a
 * protocol violation. Takes ownership of msg. */
static int
link_dispatch(struct guest_link *gl, Moat__V1__GuestMessage *msg,
    bool *ready_seen, char **why)
{
	const struct guest_link_hooks *h;
	struct pending *p;
	void *arg;
	int rv = 0;

	switch (msg->body_case) {
	case MOAT__V1__GUEST_MESSAGE__BODY_READY:
		if (msg->id != 0 || *ready_seen) {
			*why = moat_asprintf("AgentReady %s",
			    *ready_seen ? "sent twice" : "with a non-zero id");
			rv = -1;
			break;
		}
		*ready_seen = true;
		h = hook_begin(gl, &arg);
		if (h->ready != NULL)
			h->ready(arg, msg->ready);
		hook_end(gl);
		break;
	case MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT:
	case MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT:
		h = hook_begin(gl, &arg);
		if (h->event == NULL || h->event(arg, msg, why) != 0) {
			if (*why == NULL)
				*why = strdup("an event nobody expected");
			rv = -1;
		}
		hook_end(gl);
		break;
	default:
		pthread_mutex_lock(&gl->mu);
		if (msg->id == 0 || msg->id > gl->last_id) {
			pthread_mutex_unlock(&gl->mu);
			*why = moat_asprintf("an answer to request %" PRIu64
			                     ", which was never sent",
			    msg->id);
			rv = -1;
			break;
		}
		for (p = gl->pending; p != NULL; p = p->next) {
			if (p->id == msg->id && p->reply == NULL) {
				p->reply = msg;
				msg = NULL;
				pthread_cond_broadcast(&gl->cv);
				break;
			}
		}
		/* No waiter: its caller gave up (deadline); drop it. */
		pthread_mutex_unlock(&gl->mu);
		break;
	}
	if (msg != NULL)
		moat__v1__guest_message__free_unpacked(msg, NULL);
	return rv;
}

/* Decodes and dispatches every complete frame in `fr`. Returns false
 * with *reason (heap) set, and *violation when the guest broke the
 * protocol. */
static bool
link_drain_frames(struct guest_link *gl, struct moat_frame_reader *fr,
    bool *ready_seen, char **reason, bool *violation)
{
	uint8_t *frame;
	size_t len;
	int rv;

	while ((rv = moat_frame_reader_next(fr, &frame, &len)) == MOAT_OK) {
		Moat__V1__GuestMessage *msg;
		char *why = NULL;

		msg = moat__v1__guest_message__unpack(NULL, len, frame);
		free(frame);
		if (msg == NULL) {
			*reason = moat_asprintf("the guest "
			                        "sent a malformed frame: %zu "
			                        "bytes "
			                        "that do not decode as a "
			                        "GuestMessage",
			    len);
			*violation = true;
			return false;
		}
		if (link_dispatch(gl, msg, ready_seen, &why) != 0) {
			*reason = moat_asprintf("the guest "
			                        "sent a malformed frame: %s",
			    why ? why : "?");
			free(why);
			*violation = true;
			return false;
		}
	}
	if (rv == MOAT_OUT_OF_RANGE) {
		size_t declared = ((size_t)fr->buf[0] << 24) |
		    ((size_t)fr->buf[1] << 16) | ((size_t)fr->buf[2] << 8) |
		    (size_t)fr->buf[3];
		*reason =
		    moat_asprintf("the guest sent a "
		                  "malformed frame: a frame of %zu bytes, "
		                  "over the %zu-byte cap",
		        declared, fr->max_frame);
		*violation = true;
		return false;
	}
	if (rv != MOAT_UNAVAILABLE) {
		*reason = strdup("out of memory for the guest "
		                 "link");
		return false;
	}
	return true;
}

/* Feeds the `n` bytes read into `chunk` to `fr`, no more than a frame's
 * room at a time (so the reader's buffer stays capped), dispatching
 * frames as they complete. Errors as link_drain_frames. */
static bool
link_consume(struct guest_link *gl, struct moat_frame_reader *fr,
    const uint8_t *chunk, size_t n, bool *ready_seen, char **reason,
    bool *violation)
{
	size_t off = 0;

	while (off < n) {
		size_t room = fr->max_frame + 4 - fr->len;
		size_t take = n - off;

		if (take > room)
			take = room;
		if (moat_frame_reader_feed(fr, chunk + off, take) != MOAT_OK) {
			*reason = strdup("out of memory for the guest "
			                 "link");
			return false;
		}
		off += take;
		if (!link_drain_frames(gl, fr, ready_seen, reason, violation))
			return false;
	}
	return true;
}

/* The reader's end: marks the link closed (keeping a writer's earlier
 * reason unless the guest broke the protocol), wakes waiters, and tells
 * the owner unless it shut the link itself. */
static void
link_reader_close(struct guest_link *gl, const char *reason, bool violation)
{
	const struct guest_link_hooks *h;
	bool shut;
	const char *why = reason ? reason : "the guest link closed";
	void *arg;

	pthread_mutex_lock(&gl->mu);
	shut = gl->shut;
	/* Taken with `closed`: guest_link_set_hooks either sees it closed
	 * or swapped the hooks before this. */
	h = gl->hooks;
	arg = gl->arg;
	gl->in_hook++;
	if (!gl->closed) {
		gl->closed = true;
		gl->close_reason = strdup(why);
	} else if (!violation) {
		/* A writer closed it first and said why. */
		why = gl->close_reason;
	}
	pthread_cond_broadcast(&gl->cv);
	pthread_mutex_unlock(&gl->mu);
	/* Stop reading from a hostile or dead guest for good. */
	shutdown(gl->fd, SHUT_RDWR);
	if (!shut && h->closed != NULL)
		h->closed(arg, violation, why);
	hook_end(gl);
}

static void *
link_reader_main(void *arg)
{
	struct guest_link *gl = arg;
	struct moat_frame_reader fr;
	uint8_t *chunk = malloc(LINK_READ_CHUNK);
	bool ready_seen = false;
	bool violation = false;
	char *reason = NULL;

	moat_frame_reader_init(&fr, gl->max_frame);
	if (chunk == NULL) {
		reason = strdup("out of memory for the guest link");
		goto out;
	}
	for (;;) {
		struct pollfd pfd = { .fd = gl->fd, .events = POLLIN };
		ssize_t n;

		if (poll(&pfd, 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			reason = moat_asprintf("guest link poll: %s",
			    strerror(errno));
			goto out;
		}
		n = read(gl->fd, chunk, LINK_READ_CHUNK);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			reason = moat_asprintf("the guest link failed: %s",
			    strerror(errno));
			goto out;
		}
		if (n == 0) {
			reason = strdup("the guest link closed");
			goto out;
		}
		if (!link_consume(gl, &fr, chunk, (size_t)n, &ready_seen,
		        &reason, &violation))
			goto out;
	}
out:
	moat_frame_reader_fini(&fr);
	free(chunk);
	link_reader_close(gl, reason, violation);
	free(reason);
	return NULL;
}

int
guest_link_open(struct guest_link **out, int fd, size_t max_frame,
    const struct guest_link_hooks *hooks, void *arg, char **errmsg)
{
	struct guest_link *gl;
	int flags;
	int rv;

	*out = NULL;
	*errmsg = NULL;
	if ((gl = calloc(1, sizeof(*gl))) == NULL) {
		close(fd);
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	gl->fd = fd;
	gl->max_frame = max_frame ? max_frame : MOAT_FRAME_MAX;
	gl->hooks = hooks;
	gl->arg = arg;
	pthread_mutex_init(&gl->write_mu, NULL);
	pthread_mutex_init(&gl->mu, NULL);
	vmd_cond_init(&gl->cv);
	flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		*errmsg =
		    moat_asprintf("guest link: fcntl: %s", strerror(errno));
		guest_link_free(gl);
		return MOAT_INTERNAL;
	}
	if ((rv = vmd_thread_create(&gl->reader, link_reader_main, gl)) != 0) {
		*errmsg = moat_asprintf("guest link: cannot start its "
		                        "reader thread: %s",
		    strerror(rv));
		guest_link_free(gl);
		return MOAT_RESOURCE_EXHAUSTED;
	}
	gl->reader_started = true;
	*out = gl;
	return MOAT_OK;
}

uint64_t
guest_link_new_id(struct guest_link *gl)
{
	uint64_t id;

	pthread_mutex_lock(&gl->mu);
	id = ++gl->last_id;
	pthread_mutex_unlock(&gl->mu);
	return id;
}

/* Writes the whole frame or nothing usable: on a timeout after a partial
 * write the stream is broken and the link is closed. */
static int
link_write(struct guest_link *gl, const uint8_t *buf, size_t len,
    uint64_t deadline_ms, char **errmsg)
{
	size_t done = 0;
	int rv = MOAT_OK;

	pthread_mutex_lock(&gl->write_mu);
	while (done < len) {
		uint64_t now = moat_rpc_now_ms();
		struct pollfd pfd = { .fd = gl->fd, .events = POLLOUT };
		ssize_t n;
		int ms;

		if (gl->fd < 0) {
			*errmsg = strdup("the guest link was replaced");
			rv = MOAT_UNAVAILABLE;
			break;
		}
		if (now >= deadline_ms) {
			*errmsg = moat_asprintf(
			    "the guest did not take a "
			    "%zu-byte request before the deadline",
			    len);
			rv = MOAT_DEADLINE_EXCEEDED;
			break;
		}
		ms =
		    deadline_ms - now > 1000 ? 1000 : (int)(deadline_ms - now);
		if (poll(&pfd, 1, ms) < 0 && errno != EINTR) {
			*errmsg = moat_asprintf("guest link poll: %s",
			    strerror(errno));
			rv = MOAT_UNAVAILABLE;
			break;
		}
		pthread_mutex_lock(&gl->mu);
		if (gl->closed) {
			*errmsg =
			    strdup(gl->close_reason ? gl->close_reason :
			                              "the guest link closed");
			pthread_mutex_unlock(&gl->mu);
			rv = MOAT_UNAVAILABLE;
			break;
		}
		pthread_mutex_unlock(&gl->mu);
		if (!(pfd.revents & (POLLOUT | POLLERR | POLLHUP)))
			continue;
		n = send(gl->fd, buf + done, len - done, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			*errmsg = moat_asprintf("the guest link failed: %s",
			    strerror(errno));
			rv = MOAT_UNAVAILABLE;
			break;
		}
		done += (size_t)n;
	}
	if (rv != MOAT_OK && done > 0 && done < len) {
		/* Half a frame is on the wire: nothing after it can be
		 * understood. Under write_mu: guest_link_close_fd may not
		 * close the descriptor meanwhile. */
		link_mark_closed(gl,
		    "the guest stopped reading its link "
		    "in the middle of a request");
		shutdown(gl->fd, SHUT_RDWR);
	}
	pthread_mutex_unlock(&gl->write_mu);
	return rv;
}

int
guest_link_call(struct guest_link *gl, Moat__V1__GuestRequest *req,
    uint64_t deadline_ms, Moat__V1__GuestMessage **reply, char **errmsg)
{
	struct pending self = { 0 };
	struct pending **pp;
	uint8_t *body = NULL;
	uint8_t *frame = NULL;
	size_t body_len;
	size_t frame_len;
	int rv = MOAT_OK;

	*reply = NULL;
	*errmsg = NULL;
	if (req->id == 0)
		req->id = guest_link_new_id(gl);
	body_len = moat__v1__guest_request__get_packed_size(req);
	if (body_len > gl->max_frame) {
		*errmsg = moat_asprintf("a %zu-byte guest request is over the "
		                        "%zu-byte frame cap",
		    body_len, gl->max_frame);
		return MOAT_INVALID_ARGUMENT;
	}
	if ((body = malloc(body_len ? body_len : 1)) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	moat__v1__guest_request__pack(req, body);
	frame = moat_frame_encode(body, body_len, &frame_len);
	free(body);
	if (frame == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}

	self.id = req->id;
	pthread_mutex_lock(&gl->mu);
	if (gl->closed) {
		*errmsg = strdup(gl->close_reason ? gl->close_reason :
		                                    "the guest link closed");
		pthread_mutex_unlock(&gl->mu);
		free(frame);
		return MOAT_UNAVAILABLE;
	}
	self.next = gl->pending;
	gl->pending = &self;
	pthread_mutex_unlock(&gl->mu);

	rv = link_write(gl, frame, frame_len, deadline_ms, errmsg);
	free(frame);

	pthread_mutex_lock(&gl->mu);
	while (rv == MOAT_OK && self.reply == NULL) {
		if (gl->closed) {
			*errmsg =
			    strdup(gl->close_reason ? gl->close_reason :
			                              "the guest link closed");
			rv = MOAT_UNAVAILABLE;
			break;
		}
		if (vmd_cond_wait_until(&gl->cv, &gl->mu, deadline_ms) ==
		        ETIMEDOUT &&
		    self.reply == NULL) {
			*errmsg =
			    moat_asprintf("the guest agent did not "
			                  "answer request %" PRIu64 " in time",
			        self.id);
			rv = MOAT_DEADLINE_EXCEEDED;
		}
	}
	for (pp = &gl->pending; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == &self) {
			*pp = self.next;
			break;
		}
	}
	pthread_mutex_unlock(&gl->mu);
	if (rv != MOAT_OK) {
		if (self.reply != NULL)
			moat__v1__guest_message__free_unpacked(self.reply,
			    NULL);
		return rv;
	}
	*reply = self.reply;
	return MOAT_OK;
}

void
guest_link_shutdown(struct guest_link *gl, const char *why)
{
	bool join;

	if (gl == NULL)
		return;
	pthread_mutex_lock(&gl->mu);
	gl->shut = true;
	if (!gl->closed) {
		gl->closed = true;
		gl->close_reason = strdup(why ? why : "the guest link closed");
	}
	pthread_cond_broadcast(&gl->cv);
	join = gl->reader_started;
	gl->reader_started = false;
	pthread_mutex_unlock(&gl->mu);
	shutdown(gl->fd, SHUT_RDWR);
	if (join)
		pthread_join(gl->reader, NULL);
}

void
guest_link_continue_ids(struct guest_link *gl, struct guest_link *from)
{
	uint64_t last;

	if (gl == NULL || from == NULL)
		return;
	pthread_mutex_lock(&from->mu);
	last = from->last_id;
	pthread_mutex_unlock(&from->mu);
	pthread_mutex_lock(&gl->mu);
	if (gl->last_id < last)
		gl->last_id = last;
	pthread_mutex_unlock(&gl->mu);
}

void
guest_link_close_fd(struct guest_link *gl)
{
	if (gl == NULL)
		return;
	pthread_mutex_lock(&gl->write_mu);
	if (gl->fd >= 0)
		close(gl->fd);
	gl->fd = -1;
	pthread_mutex_unlock(&gl->write_mu);
}

void
guest_link_free(struct guest_link *gl)
{
	if (gl == NULL)
		return;
	if (gl->reader_started)
		guest_link_shutdown(gl, NULL);
	if (gl->fd >= 0)
		close(gl->fd);
	free(gl->close_reason);
	pthread_mutex_destroy(&gl->write_mu);
	pthread_mutex_destroy(&gl->mu);
	pthread_cond_destroy(&gl->cv);
	free(gl);
}

bool
guest_link_set_hooks(struct guest_link *gl,
    const struct guest_link_hooks *hooks, void *arg)
{
	bool open;

	pthread_mutex_lock(&gl->mu);
	while (gl->in_hook > 0)
		pthread_cond_wait(&gl->cv, &gl->mu);
	open = !gl->closed;
	if (open) {
		gl->hooks = hooks;
		gl->arg = arg;
	}
	pthread_mutex_unlock(&gl->mu);
	return open;
}

uint64_t
guest_link_last_id(struct guest_link *gl)
{
	uint64_t last;

	if (gl == NULL)
		return 0;
	pthread_mutex_lock(&gl->mu);
	last = gl->last_id;
	pthread_mutex_unlock(&gl->mu);
	return last;
}

void
guest_link_skip_ids(struct guest_link *gl, uint64_t last)
{
	if (gl == NULL)
		return;
	pthread_mutex_lock(&gl->mu);
	if (gl->last_id < last)
		gl->last_id = last;
	pthread_mutex_unlock(&gl->mu);
}
