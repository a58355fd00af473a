/*
 * egress.c: the guest's end of guest egress (issue 14). While vmd says
 * it is on (the EgressMode request after a cold boot, or the one in
 * ResetAfterRestore after every restore: a snapshot's guest may have had
 * another mode), a child process of PID 1 listens on 127.0.0.1:3128 and
 * carries every connection, bytes untouched, to vmd's proxy as one
 * stream of the tunnel over the virtio-serial port org.moat.egress
 * (moat/tunnel.h; every QEMU guest has it). vmd decides
 * everything (which host, which port, refusals): this side only moves
 * bytes, so nothing in the guest can widen the policy. There is no DNS
 * in the guest: programs reach names through the proxy (http_proxy and
 * https_proxy are set for every exec, exec.c). Not for: the agent's own
 * link (link.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "boot.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/tunnel.h"
#include "moat/util.h"

#define EGRESS_LISTEN_PORT 3128
#define EGRESS_MAX_STREAMS 256
#define EGRESS_RETRY_MS 200
#define EGRESS_PORT_NAME "org.moat.egress"
#define EGRESS_PORT_WAIT_MS 2000

bool agent_egress_on;
static pid_t egress_pid; /* the proxy child, 0 when none */

static void
egress_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static uint64_t
egress_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int
egress_listen(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
		.sin_port = htons(EGRESS_LISTEN_PORT),
		.sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1;
	int fd =
	    socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 ||
	    listen(fd, 128) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* egress_serve: one session over the open port until it breaks. */
static void
egress_serve(int port, int lfd, struct pollfd *fds)
{
	struct moat_tun t;

	if (!moat_tun_init(&t, port, EGRESS_MAX_STREAMS, NULL, NULL))
		return;
	while (!t.broken) {
		size_t n = moat_tun_pollfds(&t, fds);
		bool room = moat_tun_count(&t) < EGRESS_MAX_STREAMS;

		fds[n].fd = lfd;
		fds[n].events = room ? POLLIN : 0;
		fds[n].revents = 0;
		if (poll(fds, n + 1, -1) < 0 && errno != EINTR)
			break;
		moat_tun_service(&t, fds, n, egress_now_ms());
		if (fds[n].revents & POLLIN) {
			int c = accept4(lfd, NULL, NULL,
			    SOCK_NONBLOCK | SOCK_CLOEXEC);

			if (c >= 0 && moat_tun_open(&t, c) == NULL)
				close(c);
		}
	}
	/* vmd went away (or the VM is being restored): every connection
	 * ends; new ones wait for the next session. */
	moat_tun_fini(&t);
}

static void __attribute__((noreturn)) egress_child(const char *port_path)
{
	struct pollfd *fds = calloc(EGRESS_MAX_STREAMS + 2, sizeof(*fds));
	int lfd;

	/* Only what it needs: the console (0-2), the port, the listener. */
	(void)close_range(3, ~0u, 0);
	moat_log_init("agent-egress", MOAT_LOG_INFO);
	if (fds == NULL || (lfd = egress_listen()) < 0) {
		moat_error(0,
		    "egress: cannot listen on " AGENT_EGRESS_ADDR ": %s",
		    strerror(errno));
		_exit(1);
	}
	moat_info(0, "egress: proxy on " AGENT_EGRESS_ADDR " via %s",
	    port_path);
	for (;;) {
		int port = open(port_path, O_RDWR | O_NONBLOCK | O_CLOEXEC);

		if (port >= 0) {
			egress_serve(port, lfd, fds);
			close(port);
		}
		egress_sleep_ms(EGRESS_RETRY_MS);
	}
}

/* egress_stop: ends the proxy child (its connections with it) and reaps
 * it, so its listener is gone before a new one binds. */
static void
egress_stop(void)
{
	pid_t pid = egress_pid;

	egress_pid = 0;
	if (pid <= 0)
		return;
	(void)kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
}

/* egress_start: forks a fresh proxy child on the egress port. */
static int
egress_start(uint64_t id, char **why)
{
	char path[256];
	uint64_t deadline = egress_now_ms() + EGRESS_PORT_WAIT_MS;
	pid_t pid;

	while (!agent_boot_find_port(EGRESS_PORT_NAME, path, sizeof(path))) {
		if (egress_now_ms() >= deadline) {
			*why = moat_asprintf("this guest has no virtio-serial "
			                     "port " EGRESS_PORT_NAME
			                     ": guest egress needs the qemu "
			                     "driver");
			return MOAT_FAILED_PRECONDITION;
		}
		egress_sleep_ms(5);
	}
	if ((pid = fork()) < 0) {
		int err = errno;

		*why = moat_asprintf("egress: fork: %s", strerror(err));
		return moat_status_from_errno(err);
	}
	if (pid == 0)
		egress_child(path);
	egress_pid = pid;
	moat_info(id, "egress: on (proxy pid %d)", (int)pid);
	return MOAT_OK;
}

int
agent_egress_set(struct agent *a, uint64_t id, bool on, char **why)
{
	int rv = MOAT_OK;

	if (!a->pid1) {
		/* Never a listener on the host a test runs on. */
		moat_info(id, "egress %s: host mode: not applied",
		    on ? "on" : "off");
		return MOAT_OK;
	}
	/* On again restarts it: after a restore its tunnel session (and
	 * every connection on it) belonged to the VM it was taken from. */
	egress_stop();
	agent_egress_on = false;
	if (on && (rv = egress_start(id, why)) == MOAT_OK)
		agent_egress_on = true;
	if (!on)
		moat_info(id, "egress: off");
	return rv;
}

void
agent_egress_reaped(pid_t pid, int status)
{
	if (pid <= 0 || pid != egress_pid)
		return;
	egress_pid = 0;
	agent_egress_on = false;
	moat_warn(0,
	    "egress: the proxy process ended (status %d): egress is "
	    "off until vmd turns it on again",
	    status);
}

int
agent_egress_mode(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	int rv = agent_egress_set(a, req->id, req->egress->on, why);

	if (rv == MOAT_OK)
		agent_send_ack(a, req->id);
	return rv;
}
