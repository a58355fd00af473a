/*
 * loop.c: moat-agent's one thread: a poll() loop over the host link, the
 * SIGCHLD signalfd and every exec's pipes, with the timers (exec
 * timeouts, pipe drains, port retries) as poll's timeout. Also the request
 * table: each GuestRequest op, its handler, and what is checked before the
 * handler runs (request id, strings without NUL bytes). Not for: the
 * transport (link.c) or what a request does (exec.c, files.c, info.c,
 * fstrace.c).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "moat/log.h"
#include "moat/status.h"

#define LOOP_FDS (2 + 3 * AGENT_EXEC_MAX + 4 * AGENT_CODE_MAX)
#define WIRE_DEPTH_MAX 8

struct agent_op {
	Moat__V1__GuestRequest__OpCase op;
	const char *name;
	agent_handler_fn fn;
};

static int agent_shutdown(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why);

/* Listed once; the dispatcher checks what every request needs. */
static const struct agent_op agent_ops[] = {
	{ MOAT__V1__GUEST_REQUEST__OP_EXEC_START, "exec_start",
	    agent_exec_start },
	{ MOAT__V1__GUEST_REQUEST__OP_EXEC_INPUT, "exec_input",
	    agent_exec_input },
	{ MOAT__V1__GUEST_REQUEST__OP_EXEC_SIGNAL, "exec_signal",
	    agent_exec_signal },
	{ MOAT__V1__GUEST_REQUEST__OP_EXEC_RESIZE, "exec_resize",
	    agent_exec_resize },
	{ MOAT__V1__GUEST_REQUEST__OP_FILE_READ, "file_read",
	    agent_file_read },
	{ MOAT__V1__GUEST_REQUEST__OP_FILE_WRITE, "file_write",
	    agent_file_write },
	{ MOAT__V1__GUEST_REQUEST__OP_FILE_LIST, "file_list",
	    agent_file_list },
	{ MOAT__V1__GUEST_REQUEST__OP_FILE_STAT, "file_stat",
	    agent_file_stat },
	{ MOAT__V1__GUEST_REQUEST__OP_FILE_REMOVE, "file_remove",
	    agent_file_remove },
	{ MOAT__V1__GUEST_REQUEST__OP_MKDIR, "mkdir", agent_file_mkdir },
	{ MOAT__V1__GUEST_REQUEST__OP_INFO, "info", agent_info },
	{ MOAT__V1__GUEST_REQUEST__OP_FS_TRACE, "fs_trace", agent_fs_trace },
	{ MOAT__V1__GUEST_REQUEST__OP_SHUTDOWN, "shutdown", agent_shutdown },
	{ MOAT__V1__GUEST_REQUEST__OP_RESET, "reset",
	    agent_reset_after_restore },
	{ MOAT__V1__GUEST_REQUEST__OP_CODE_RUN, "code_run", agent_code_run },
	{ MOAT__V1__GUEST_REQUEST__OP_CODE_CONTEXT_CLOSE, "code_context_close",
	    agent_code_close },
	{ MOAT__V1__GUEST_REQUEST__OP_EGRESS, "egress", agent_egress_mode },
	{ MOAT__V1__GUEST_REQUEST__OP_ARCHIVE_PUT, "archive_put",
	    agent_archive_put },
	{ MOAT__V1__GUEST_REQUEST__OP_ARCHIVE_GET, "archive_get",
	    agent_archive_get },
};

uint64_t
agent_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t
agent_now_ms(void)
{
	return agent_now_us() / 1000u;
}

static int
wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	unsigned shift = 0;

	*v = 0;
	while (*p < end && shift < 64) {
		uint8_t b = *(*p)++;

		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return 0;
		shift += 7;
	}
	return -1;
}

/* wire_has_nul: whether a string field anywhere in the encoded message
 * holds a NUL byte. protobuf-c hands strings over as C strings, so such a
 * byte would silently cut a path or an argument short; the raw bytes are
 * the only place to see it. */
static bool
wire_has_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len,
    int depth)
{
	const uint8_t *end = p + len;
	uint64_t tag, n;

	while (p < end) {
		const ProtobufCFieldDescriptor *f;

		if (wire_varint(&p, end, &tag) != 0)
			return false;
		switch (tag & 7) {
		case 0:
			if (wire_varint(&p, end, &n) != 0)
				return false;
			continue;
		case 1:
			p += (size_t)(end - p) < 8 ? (size_t)(end - p) : 8;
			continue;
		case 5:
			p += (size_t)(end - p) < 4 ? (size_t)(end - p) : 4;
			continue;
		case 2:
			break;
		default:
			return false;
		}
		if (wire_varint(&p, end, &n) != 0 || n > (uint64_t)(end - p))
			return false;
		f = protobuf_c_message_descriptor_get_field(d,
		    (unsigned)(tag >> 3));
		if (f != NULL && f->type == PROTOBUF_C_TYPE_STRING &&
		    memchr(p, '\0', (size_t)n) != NULL)
			return true;
		if (f != NULL && f->type == PROTOBUF_C_TYPE_MESSAGE &&
		    depth < WIRE_DEPTH_MAX &&
		    wire_has_nul(f->descriptor, p, (size_t)n, depth + 1))
			return true;
		p += n;
	}
	return false;
}

void
agent_dispatch(struct agent *a, const uint8_t *body, size_t len)
{
	Moat__V1__GuestRequest *req;
	const struct agent_op *op = NULL;
	char *why = NULL;
	size_t i;
	int rv;

	req = moat__v1__guest_request__unpack(NULL, len, body);
	if (req == NULL) {
		agent_send_error(a, 0, MOAT_INVALID_ARGUMENT,
		    "a %zu-byte frame from the host is not a moat.v1."
		    "GuestRequest; it was dropped, send a valid one",
		    len);
		return;
	}
	if (req->id == 0) {
		agent_send_error(a, 0, MOAT_INVALID_ARGUMENT,
		    "request id 0 is reserved for link messages; number "
		    "requests from 1");
		goto out;
	}
	for (i = 0; i < sizeof(agent_ops) / sizeof(agent_ops[0]); i++)
		if (agent_ops[i].op == req->op_case)
			op = &agent_ops[i];
	if (op == NULL) {
		agent_send_error(a, req->id, MOAT_UNIMPLEMENTED,
		    "request %d is not known to moat-agent %s; update the "
		    "guest image",
		    (int)req->op_case, MOAT_VERSION);
		goto out;
	}
	if (wire_has_nul(&moat__v1__guest_request__descriptor, body, len, 0)) {
		agent_send_error(a, req->id, MOAT_INVALID_ARGUMENT,
		    "%s: a string in the request holds a NUL byte; paths, "
		    "arguments and env entries cannot",
		    op->name);
		goto out;
	}
	if (a->stopping) {
		agent_send_error(a, req->id, MOAT_UNAVAILABLE,
		    "%s: the agent is shutting down", op->name);
		goto out;
	}
	moat_debug(req->id, "%s", op->name);
	if ((rv = op->fn(a, req, &why)) != MOAT_OK) {
		agent_send_error(a, req->id, rv, "%s: %s", op->name,
		    why ? why : moat_strerror(rv));
		free(why);
	}
out:
	moat__v1__guest_request__free_unpacked(req, NULL);
}

static int
agent_shutdown(struct agent *a, const Moat__V1__GuestRequest *req, char **why)
{
	a->stopping = true;
	a->stop_reboot = req->shutdown->reboot;
	a->stop_by_ms = agent_now_ms() + 2000;
	agent_send_ack(a, req->id);
	moat_info(req->id, "shutdown asked (%s)",
	    a->stop_reboot ? "reboot" : "power off");
	return MOAT_OK;
}

/* loop_signals: reads the signalfd. SIGCHLD reaps; SIGTERM and SIGINT
 * (host mode only; PID 1 does not take them) stop the agent. */
static void
loop_signals(struct agent *a)
{
	struct signalfd_siginfo si[8];
	bool reap = false;
	ssize_t n, i;

	while ((n = read(a->sig_fd, si, sizeof(si))) > 0) {
		for (i = 0; i < n / (ssize_t)sizeof(si[0]); i++) {
			if (si[i].ssi_signo == SIGCHLD)
				reap = true;
			else if (!a->pid1) {
				moat_info(0, "signal %u: stopping",
				    si[i].ssi_signo);
				a->stopping = true;
				a->stop_by_ms = agent_now_ms();
			}
		}
	}
	/* SIGCHLDs coalesce; reap on every wakeup that had one */
	if (reap)
		agent_exec_reap(a);
}

static int
loop_min_timeout(int cur, int t)
{
	if (t < 0)
		return cur;
	if (cur < 0 || t < cur)
		return t;
	return cur;
}

int
agent_run(struct agent *a)
{
	struct pollfd pfd[LOOP_FDS];
	int map[3 * AGENT_EXEC_MAX];
	int code_map[4 * AGENT_CODE_MAX];

	for (;;) {
		uint64_t now = agent_now_ms();
		int timeout = -1, nl, ne, nc, n = 0;
		bool paused;

		if (a->stopping &&
		    (a->link.fd < 0 || a->link.out_head == NULL ||
		        now >= a->stop_by_ms))
			return 0;
		timeout = loop_min_timeout(timeout, agent_exec_timer(a, now));
		timeout = loop_min_timeout(timeout, agent_link_timer(a, now));
		timeout = loop_min_timeout(timeout, agent_code_timer(a, now));
		timeout =
		    loop_min_timeout(timeout, agent_archive_timer(a, now));
		if (a->stopping)
			timeout = loop_min_timeout(timeout,
			    (int)(a->stop_by_ms - now));
		paused = a->link.out_bytes >= AGENT_OUT_HIGH;
		pfd[n].fd = a->sig_fd;
		pfd[n].events = POLLIN;
		pfd[n++].revents = 0;
		nl = agent_link_pollfds(a, pfd + n, paused);
		n += nl;
		ne = agent_exec_pollfds(a, pfd + n, map, paused);
		n += ne;
		nc = agent_code_pollfds(a, pfd + n, code_map);
		n += nc;
		if (poll(pfd, (nfds_t)n, timeout) < 0) {
			if (errno == EINTR)
				continue;
			moat_error(0, "poll: %s", strerror(errno));
			return errno;
		}
		/* execs first: their map is only good until a request adds
		 * or finishes one */
		agent_exec_events(a, pfd + 1 + nl, map, ne);
		agent_code_events(a, pfd + 1 + nl + ne, code_map, nc);
		if (pfd[0].revents)
			loop_signals(a);
		agent_link_events(a, pfd + 1, nl);
	}
}
