/*
 * qmp.c: the QEMU driver's QMP client (see qmp.h): one Unix stream, one
 * command in flight, line-delimited JSON parsed with jansson, every read
 * bounded by a deadline and a line cap, so a wedged or hostile QEMU cannot
 * hang or grow vmd. Not for: the meaning of commands (qemu.c).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "qmp.h"

void
qmp_close(struct qmp *q)
{
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	free(q->buf);
	q->buf = NULL;
	q->len = 0;
}

/* Reads one JSON line into *out (a new reference). Returns a status. */
static int
qmp_read_line(struct qmp *q, json_t **out, char **errmsg)
{
	for (;;) {
		char *nl = memchr(q->buf, '\n', q->len);
		uint64_t now = moat_rpc_now_ms();
		struct pollfd pfd = { .fd = q->fd, .events = POLLIN };
		json_error_t jerr;
		ssize_t n;
		int rv;

		if (nl != NULL) {
			size_t line = (size_t)(nl - q->buf) + 1;

			*out = json_loadb(q->buf, line, 0, &jerr);
			memmove(q->buf, q->buf + line, q->len - line);
			q->len -= line;
			if (*out == NULL || !json_is_object(*out)) {
				json_decref(*out);
				*out = NULL;
				*errmsg = moat_asprintf(
				    "QEMU sent a QMP "
				    "line that is not a JSON object: %s",
				    jerr.text);
				return MOAT_INTERNAL;
			}
			return MOAT_OK;
		}
		if (q->len >= QMP_LINE_MAX) {
			*errmsg = moat_asprintf("QEMU sent a QMP line over %u "
			                        "bytes",
			    QMP_LINE_MAX);
			return MOAT_INTERNAL;
		}
		if (now >= q->deadline_ms) {
			*errmsg = strdup("QEMU did not answer on QMP in time");
			return MOAT_DEADLINE_EXCEEDED;
		}
		rv = poll(&pfd, 1, (int)(q->deadline_ms - now));
		if (rv < 0 && errno == EINTR)
			continue;
		if (rv <= 0)
			continue;
		n = read(q->fd, q->buf + q->len, QMP_LINE_MAX - q->len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0) {
			*errmsg = moat_asprintf("QEMU closed its QMP "
			                        "socket%s%s",
			    n < 0 ? ": " : "", n < 0 ? strerror(errno) : "");
			return MOAT_UNAVAILABLE;
		}
		q->len += (size_t)n;
	}
}

/* Sends `msg`; with `pass_fd` >= 0 that fd rides on the first byte. */
static int
qmp_send(struct qmp *q, json_t *msg, int pass_fd, char **errmsg)
{
	char *text = json_dumps(msg, JSON_COMPACT);
	size_t len, off = 0;

	if (text == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	len = strlen(text);
	while (off < len) {
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { text + off, len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (pass_fd >= 0 && off == 0) {
			struct cmsghdr *c;

			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = sizeof(ctl.buf);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
		}
		n = sendmsg(q->fd, &mh, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			*errmsg = moat_asprintf("cannot write to QEMU's QMP "
			                        "socket: %s",
			    strerror(errno));
			free(text);
			return MOAT_UNAVAILABLE;
		}
		off += (size_t)n;
	}
	free(text);
	return MOAT_OK;
}

static int
qmp_exec(struct qmp *q, const char *cmd, json_t *args, int pass_fd,
    json_t **ret, char **errmsg)
{
	json_t *msg = json_pack("{s:s}", "execute", cmd);
	int rv;

	*errmsg = NULL;
	if (ret != NULL)
		*ret = NULL;
	if (msg == NULL ||
	    (args != NULL && json_object_set(msg, "arguments", args) != 0)) {
		json_decref(msg);
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	rv = qmp_send(q, msg, pass_fd, errmsg);
	json_decref(msg);
	if (rv != MOAT_OK)
		return rv;
	for (;;) {
		json_t *line = NULL, *r, *e;

		if ((rv = qmp_read_line(q, &line, errmsg)) != MOAT_OK)
			return rv;
		if ((r = json_object_get(line, "return")) != NULL) {
			if (ret != NULL)
				*ret = json_incref(r);
			json_decref(line);
			return MOAT_OK;
		}
		if ((e = json_object_get(line, "error")) != NULL) {
			const char *desc =
			    json_string_value(json_object_get(e, "desc"));

			*errmsg = moat_asprintf("QEMU refused %s: %s", cmd,
			    desc ? desc : "(no description)");
			json_decref(line);
			return MOAT_FAILED_PRECONDITION;
		}
		json_decref(line); /* an event or the greeting */
	}
}

int
qmp_run(struct qmp *q, const char *cmd, json_t *args, json_t **ret,
    char **errmsg)
{
	return qmp_exec(q, cmd, args, -1, ret, errmsg);
}

int
qmp_pass_fd(struct qmp *q, const char *name, int fd, char **errmsg)
{
	json_t *args = json_pack("{s:s}", "fdname", name);
	int rv;

	if (args == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	rv = qmp_exec(q, "getfd", args, fd, NULL, errmsg);
	json_decref(args);
	return rv;
}

int
qmp_open(struct qmp *q, const char *path, uint64_t deadline_ms, char **errmsg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	json_t *greeting = NULL;
	int rv;

	*errmsg = NULL;
	q->fd = -1;
	q->len = 0;
	q->deadline_ms = deadline_ms;
	if ((q->buf = malloc(QMP_LINE_MAX)) == NULL) {
		*errmsg = strdup("out of memory");
		return MOAT_INTERNAL;
	}
	if (strlen(path) >= sizeof(sa.sun_path)) {
		*errmsg =
		    moat_asprintf("QMP socket path %s is too long", path);
		rv = MOAT_FAILED_PRECONDITION;
		goto fail;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if ((q->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
		*errmsg = moat_asprintf("socket: %s", strerror(errno));
		rv = moat_status_from_errno(errno);
		goto fail;
	}
	if (connect(q->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		*errmsg = moat_asprintf("cannot connect to QEMU's QMP socket "
		                        "%s: %s",
		    path, strerror(errno));
		rv = MOAT_UNAVAILABLE;
		goto fail;
	}
	if ((rv = qmp_read_line(q, &greeting, errmsg)) != MOAT_OK)
		goto fail;
	json_decref(greeting);
	if ((rv = qmp_run(q, "qmp_capabilities", NULL, NULL, errmsg)) !=
	    MOAT_OK)
		goto fail;
	return MOAT_OK;
fail:
	qmp_close(q);
	return rv;
}
