/*
 * egress.c: the guest's end of guest egress (issue 14). A child process
 * of PID 1 listens on 127.0.0.1:3128 and carries every connection, bytes
 * untouched, to vmd's proxy as one stream of the tunnel over the
 * virtio-serial port moat.egress= names (moat/tunnel.h). vmd decides
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
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "moat/log.h"
#include "moat/tunnel.h"

#define EGRESS_LISTEN_PORT 3128
#define EGRESS_MAX_STREAMS 256
#define EGRESS_RETRY_MS 200

bool agent_egress_on;

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

int
agent_egress_start(const char *port_path)
{
	pid_t pid = fork();

	if (pid < 0) {
		int err = errno;

		moat_error(0, "egress: fork: %s", strerror(err));
		return err;
	}
	if (pid == 0)
		egress_child(port_path);
	agent_egress_on = true;
	return 0;
}
