/*
 * agent_client.c: the moat-agent tests' side of the guest link: spawns
 * the agent in host mode, speaks length-prefixed guest.proto frames on
 * its Unix socket, and collects exec events. Not for: production code.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_client.h"
#include "moat/status.h"
#include "moat/util.h"

static uint64_t
tagent_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
tagent_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

int
tagent_start(struct tagent *t, const char *const *extra, bool no_root)
{
	const char *argv[32];
	char listen[300];
	int n = 0, i;

	memset(t, 0, sizeof(*t));
	t->fd = -1;
	t->next_id = 1;
	snprintf(t->dir, sizeof(t->dir), "/tmp/moat-agent-test.XXXXXX");
	if (mkdtemp(t->dir) == NULL)
		return -1;
	snprintf(t->sock, sizeof(t->sock), "%s/sock", t->dir);
	snprintf(t->root, sizeof(t->root), "%s/root", t->dir);
	if (mkdir(t->root, 0755) != 0)
		return -1;
	snprintf(listen, sizeof(listen), "unix:%s", t->sock);
	argv[n++] = MOAT_AGENT_BIN;
	argv[n++] = "--listen";
	argv[n++] = listen;
	if (!no_root) {
		argv[n++] = "--root";
		argv[n++] = t->root;
	}
	for (i = 0; extra != NULL && extra[i] != NULL && n < 30; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	if ((t->pid = fork()) < 0)
		return -1;
	if (t->pid == 0) {
		/* a test that fails half-way must not leave agents behind */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	return tagent_connect(t);
}

int
tagent_connect(struct tagent *t)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	uint64_t deadline = tagent_now_ms() + TAGENT_WAIT_MS;
	Moat__V1__GuestMessage *m;

	tagent_disconnect(t);
	if (strlen(t->sock) >= sizeof(sun.sun_path))
		return -1;
	memcpy(sun.sun_path, t->sock, strlen(t->sock) + 1);
	for (;;) {
		int st;

		t->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (t->fd < 0)
			return -1;
		if (connect(t->fd, (struct sockaddr *)&sun, sizeof(sun)) == 0)
			break;
		close(t->fd);
		t->fd = -1;
		if (waitpid(t->pid, &st, WNOHANG) == t->pid) {
			t->pid = 0;
			print_error("moat-agent exited before listening\n");
			return -1;
		}
		if (tagent_now_ms() > deadline)
			return -1;
		tagent_sleep_ms(10);
	}
	moat_frame_reader_init(&t->reader, MOAT_FRAME_MAX);
	if ((m = tagent_recv(t)) == NULL)
		return -1;
	if (m->body_case != MOAT__V1__GUEST_MESSAGE__BODY_READY ||
	    m->id != 0) {
		print_error("first message is not AgentReady\n");
		moat__v1__guest_message__free_unpacked(m, NULL);
		return -1;
	}
	if (t->ready != NULL)
		moat__v1__agent_ready__free_unpacked(t->ready, NULL);
	t->ready = m->ready;
	m->ready = NULL;
	m->body_case = MOAT__V1__GUEST_MESSAGE__BODY__NOT_SET;
	moat__v1__guest_message__free_unpacked(m, NULL);
	return 0;
}

void
tagent_disconnect(struct tagent *t)
{
	if (t->fd >= 0) {
		close(t->fd);
		t->fd = -1;
	}
	moat_frame_reader_fini(&t->reader);
}

int
tagent_stop(struct tagent *t)
{
	uint64_t deadline = tagent_now_ms() + TAGENT_WAIT_MS;
	int st = -1;

	tagent_disconnect(t);
	if (t->pid > 0) {
		kill(t->pid, SIGTERM);
		while (waitpid(t->pid, &st, WNOHANG) == 0) {
			if (tagent_now_ms() > deadline) {
				kill(t->pid, SIGKILL);
				waitpid(t->pid, &st, 0);
				break;
			}
			tagent_sleep_ms(10);
		}
		t->pid = 0;
	}
	if (t->ready != NULL)
		moat__v1__agent_ready__free_unpacked(t->ready, NULL);
	t->ready = NULL;
	if (t->dir[0] != '\0')
		(void)moat_rm_rf(t->dir);
	t->dir[0] = '\0';
	return st;
}

int
tagent_send_raw(struct tagent *t, const void *data, size_t len)
{
	return moat_frame_write_all(t->fd, data, len) == 0 ? 0 : -1;
}

int
tagent_send(struct tagent *t, Moat__V1__GuestRequest *req)
{
	size_t body, flen;
	uint8_t *buf, *frame;
	int rv;

	if (req->id == 0)
		req->id = t->next_id++;
	body = moat__v1__guest_request__get_packed_size(req);
	if ((buf = malloc(body + 1)) == NULL)
		return -1;
	moat__v1__guest_request__pack(req, buf);
	frame = moat_frame_encode(buf, body, &flen);
	free(buf);
	if (frame == NULL)
		return -1;
	rv = tagent_send_raw(t, frame, flen);
	free(frame);
	return rv;
}

uint8_t *
tagent_recv_frame(struct tagent *t, size_t *len)
{
	uint64_t deadline = tagent_now_ms() + TAGENT_WAIT_MS;
	static uint8_t chunk[65536];
	uint8_t *frame;

	for (;;) {
		struct pollfd pfd = { .fd = t->fd, .events = POLLIN };
		uint64_t now = tagent_now_ms();
		ssize_t n;
		int rv;

		rv = moat_frame_reader_next(&t->reader, &frame, len);
		if (rv == 0)
			return frame;
		if (rv != MOAT_UNAVAILABLE) /* else: not whole yet */
			return NULL;
		if (now >= deadline ||
		    poll(&pfd, 1, (int)(deadline - now)) <= 0)
			return NULL;
		n = read(t->fd, chunk, sizeof(chunk));
		if (n <= 0)
			return NULL;
		if (moat_frame_reader_feed(&t->reader, chunk, (size_t)n) != 0)
			return NULL;
	}
}

Moat__V1__GuestMessage *
tagent_recv(struct tagent *t)
{
	Moat__V1__GuestMessage *m;
	uint8_t *frame;
	size_t len;

	if ((frame = tagent_recv_frame(t, &len)) == NULL)
		return NULL;
	m = moat__v1__guest_message__unpack(NULL, len, frame);
	free(frame);
	return m;
}

Moat__V1__GuestMessage *
tagent_call(struct tagent *t, Moat__V1__GuestRequest *req)
{
	Moat__V1__GuestMessage *m;

	if (tagent_send(t, req) != 0)
		return NULL;
	while ((m = tagent_recv(t)) != NULL) {
		if (m->id == req->id)
			return m;
		print_error("unexpected message id %llu body %d (%s) while "
		            "waiting for %llu\n",
		    (unsigned long long)m->id, (int)m->body_case, m->message,
		    (unsigned long long)req->id);
		moat__v1__guest_message__free_unpacked(m, NULL);
		return NULL;
	}
	return NULL;
}

static int
texec_append(struct texec *res, int s, const uint8_t *data, size_t len)
{
	uint8_t *nb = realloc(res->out[s], res->len[s] + len + 1);

	if (nb == NULL)
		return -1;
	memcpy(nb + res->len[s], data, len);
	res->len[s] += len;
	nb[res->len[s]] = '\0';
	res->out[s] = nb;
	if (len > res->max_chunk)
		res->max_chunk = len;
	return 0;
}

int
tagent_exec_wait(struct tagent *t, uint64_t id, struct texec *res)
{
	Moat__V1__GuestMessage *m;

	while ((m = tagent_recv(t)) != NULL) {
		Moat__V1__GuestMessage__BodyCase body = m->body_case;
		int rv = 0;

		if (m->id != id) {
			print_error("message for id %llu during exec %llu\n",
			    (unsigned long long)m->id, (unsigned long long)id);
			rv = -1;
		} else if (body == MOAT__V1__GUEST_MESSAGE__BODY_EXEC_OUTPUT) {
			int s = m->exec_output->stream ==
			    MOAT__V1__STREAM__STREAM_STDERR;

			rv = texec_append(res, s, m->exec_output->data.data,
			    m->exec_output->data.len);
		} else if (body == MOAT__V1__GUEST_MESSAGE__BODY_EXEC_EXIT) {
			res->exit = m->exec_exit;
			res->exit_msg = m;
			return 0;
		} else {
			print_error("unexpected body %d during exec\n",
			    (int)body);
			rv = -1;
		}
		moat__v1__guest_message__free_unpacked(m, NULL);
		if (rv != 0)
			return -1;
	}
	return -1;
}

int
tagent_exec(struct tagent *t, Moat__V1__ExecStart *es, uint64_t id,
    struct texec *res)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__GuestMessage *m;

	memset(res, 0, sizeof(*res));
	req.id = id;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_EXEC_START;
	req.exec_start = es;
	if ((m = tagent_call(t, &req)) == NULL)
		return -1;
	res->code = m->code;
	if (m->code != 0) {
		res->message = strdup(m->message);
		moat__v1__guest_message__free_unpacked(m, NULL);
		return 0;
	}
	if (m->body_case != MOAT__V1__GUEST_MESSAGE__BODY_EXEC_STARTED) {
		moat__v1__guest_message__free_unpacked(m, NULL);
		return -1;
	}
	res->pid = m->exec_started->pid;
	moat__v1__guest_message__free_unpacked(m, NULL);
	return tagent_exec_wait(t, req.id, res);
}

void
texec_free(struct texec *res)
{
	free(res->out[0]);
	free(res->out[1]);
	free(res->message);
	if (res->exit_msg != NULL)
		moat__v1__guest_message__free_unpacked(res->exit_msg, NULL);
	memset(res, 0, sizeof(*res));
}

const char *
tagent_host_path(struct tagent *t, const char *guest_path)
{
	static char buf[1024];

	snprintf(buf, sizeof(buf), "%s%s", t->root, guest_path);
	return buf;
}

bool
tagent_wait_group_gone(pid_t pgid)
{
	uint64_t deadline = tagent_now_ms() + TAGENT_WAIT_MS;

	while (kill(-pgid, 0) == 0 || errno != ESRCH) {
		if (tagent_now_ms() > deadline)
			return false;
		tagent_sleep_ms(10);
	}
	return true;
}
