/*
 * metrics_server.c: the scrape listener of moat/metrics.h: one thread
 * polling a TCP socket and a few connections, answering GET /metrics
 * with the registry's text and closing each connection after its
 * answer (HTTP/1.0 style: no keep-alive, no chunking). Requests are
 * capped at 4 KiB and each connection at 10 s, so a slow or hostile
 * client holds one slot for a while at most and never grows the
 * process. Not for: the text itself (metrics.c) or any other HTTP (the
 * gateway's door is libmicrohttpd).
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/util.h"

#define MAX_CONNS 8
#define REQUEST_MAX 4096
#define CONN_DEADLINE_MS 10000
#define ADDR_USAGE                                                            \
	"give HOST:PORT, e.g. 127.0.0.1:9101, [::1]:9101 or :9101 (all "      \
	"addresses), to --metrics or `metrics =`"

struct conn {
	int fd; /* -1: free slot */
	uint64_t deadline_ms;
	char request[REQUEST_MAX];
	size_t request_len;
	char *response; /* heap; NULL while reading the request */
	size_t response_len, sent;
};

struct moat_metrics_server {
	struct moat_metrics *reg; /* borrowed */
	int listen_fd;
	int wake[2]; /* stop writes a byte to wake[1] */
	pthread_t thread;
	bool thread_started;
	uint16_t port;
	char host[256];               /* as given: "" for every address */
	struct conn conns[MAX_CONNS]; /* the thread's alone */
};

static uint64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
conn_close(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	free(c->response);
	c->fd = -1;
	c->response = NULL;
	c->request_len = c->response_len = c->sent = 0;
}

/* An answer being made: the whole of it, status line to body. */
struct answer {
	int code;
	char *text; /* heap; NULL: out of memory */
	size_t len;
};

static void
respond(struct answer *a, int code, const char *reason,
    const char *content_type, const char *extra, const char *body,
    size_t body_len, bool head)
{
	char *hdr = moat_asprintf("HTTP/1.1 %d %s\r\n"
	                          "Content-Type: %s\r\n"
	                          "Content-Length: %zu\r\n"
	                          "%s"
	                          "Connection: close\r\n\r\n",
	    code, reason, content_type, body_len, extra ? extra : "");
	size_t hlen = hdr ? strlen(hdr) : 0;

	a->code = code;
	if (hdr == NULL ||
	    (a->text = malloc(hlen + (head ? 0 : body_len))) == NULL) {
		free(hdr);
		return;
	}
	memcpy(a->text, hdr, hlen);
	if (!head)
		memcpy(a->text + hlen, body, body_len);
	a->len = hlen + (head ? 0 : body_len);
	free(hdr);
}

static void
respond_text(struct answer *a, int code, const char *reason, const char *extra,
    const char *text)
{
	respond(a, code, reason, "text/plain; charset=utf-8", extra, text,
	    strlen(text), false);
}

int
moat_metrics_respond(struct moat_metrics *reg, const char *request,
    size_t request_len, char **response, size_t *response_len)
{
	char method[16], target[1024], version[16], line[1100];
	struct answer a = { 0 };
	size_t n = strcspn(request, "\r\n");
	char *body;
	size_t len;
	bool head;

	/* The request line alone, whatever follows it. */
	n = n < request_len ? n : request_len;
	n = n < sizeof(line) - 1 ? n : sizeof(line) - 1;
	memcpy(line, request, n);
	line[n] = '\0';
	if (request_len >= REQUEST_MAX - 1) {
		respond_text(&a, 431, "Request Header Fields Too Large", NULL,
		    "request over 4 KiB: send GET /metrics alone\n");
	} else if (sscanf(line, "%15s %1023s %15s", method, target, version) !=
	        3 ||
	    strncmp(version, "HTTP/1.", 7) != 0) {
		respond_text(&a, 400, "Bad Request", NULL,
		    "bad request: send GET /metrics HTTP/1.1\n");
	} else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		respond_text(&a, 405, "Method Not Allowed",
		    "Allow: GET, HEAD\r\n",
		    "only GET /metrics is served here\n");
	} else if ((target[strcspn(target, "?")] = '\0',
	               strcmp(target, "/metrics") != 0)) {
		respond_text(&a, 404, "Not Found", NULL,
		    "not found: the metrics are at /metrics\n");
	} else if ((body = moat_metrics_text(reg, &len)) == NULL) {
		respond_text(&a, 500, "Internal Server Error", NULL,
		    "out of memory while writing the metrics\n");
	} else {
		head = strcmp(method, "HEAD") == 0;
		respond(&a, 200, "OK",
		    "text/plain; version=0.0.4; charset=utf-8", NULL, body,
		    len, head);
		free(body);
	}
	*response = a.text;
	*response_len = a.len;
	return a.text != NULL ? a.code : 0;
}

/* answer: the request in c->request is complete (or at its cap): its
 * response goes to c->response, or the connection closes (out of
 * memory). */
static void
answer(struct moat_metrics_server *srv, struct conn *c)
{
	if (moat_metrics_respond(srv->reg, c->request, c->request_len,
	        &c->response, &c->response_len) == 0)
		conn_close(c);
}

static void
conn_read(struct moat_metrics_server *srv, struct conn *c)
{
	ssize_t n = recv(c->fd, c->request + c->request_len,
	    REQUEST_MAX - 1 - c->request_len, 0);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		conn_close(c);
		return;
	}
	c->request_len += (size_t)n;
	c->request[c->request_len] = '\0';
	if (strstr(c->request, "\r\n\r\n") != NULL ||
	    strstr(c->request, "\n\n") != NULL ||
	    c->request_len == REQUEST_MAX - 1)
		answer(srv, c);
}

static void
conn_write(struct conn *c)
{
	ssize_t n = send(c->fd, c->response + c->sent,
	    c->response_len - c->sent, MSG_NOSIGNAL);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n < 0) {
		conn_close(c);
		return;
	}
	c->sent += (size_t)n;
	if (c->sent == c->response_len) {
		shutdown(c->fd, SHUT_WR);
		conn_close(c);
	}
}

static void
accept_one(struct moat_metrics_server *srv)
{
	int fd =
	    accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return;
	for (size_t i = 0; i < MAX_CONNS; i++)
		if (srv->conns[i].fd < 0) {
			srv->conns[i].fd = fd;
			srv->conns[i].deadline_ms =
			    now_ms() + CONN_DEADLINE_MS;
			return;
		}
	close(fd); /* not polled while full; a race at most */
}

static void *
server_main(void *arg)
{
	struct moat_metrics_server *srv = arg;
	struct pollfd fds[MAX_CONNS + 2];
	size_t slot[MAX_CONNS + 2];

	for (;;) {
		uint64_t now = now_ms(), next = now + 1000;
		nfds_t n = 0;
		bool room = false;

		fds[n++] =
		    (struct pollfd){ .fd = srv->wake[0], .events = POLLIN };
		for (size_t i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &srv->conns[i];

			if (c->fd < 0) {
				room = true;
				continue;
			}
			if (now >= c->deadline_ms) {
				conn_close(c);
				room = true;
				continue;
			}
			next = c->deadline_ms < next ? c->deadline_ms : next;
			slot[n] = i;
			fds[n++] = (struct pollfd){ .fd = c->fd,
				.events = c->response ? POLLOUT : POLLIN };
		}
		if (room)
			fds[n++] = (struct pollfd){ .fd = srv->listen_fd,
				.events = POLLIN };
		if (poll(fds, n, (int)(next - now)) < 0 && errno != EINTR)
			break;
		if (fds[0].revents != 0)
			break;
		for (nfds_t i = 1; i < n; i++) {
			if (fds[i].revents == 0)
				continue;
			if (fds[i].fd == srv->listen_fd) {
				accept_one(srv);
				continue;
			}
			struct conn *c = &srv->conns[slot[i]];

			if (c->response == NULL)
				conn_read(srv, c);
			else
				conn_write(c);
		}
	}
	return NULL;
}

/* split_addr: HOST and PORT of `addr` into host (NULL: every address)
 * and port; false when it is not HOST:PORT. */
static bool
split_addr(const char *addr, char host[256], char port[8])
{
	const char *colon = strrchr(addr, ':'), *h = addr;
	size_t hlen;

	if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) > 5 ||
	    strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
	    atoi(colon + 1) > 65535)
		return false;
	hlen = (size_t)(colon - addr);
	if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
		h++;
		hlen -= 2;
	} else if (memchr(h, ':', hlen) != NULL) {
		return false; /* an IPv6 address wants its brackets */
	}
	if (hlen >= 256)
		return false;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	strcpy(port, colon + 1);
	return true;
}

/* listen_on: a bound, listening, non-blocking socket for `addr`, or -1
 * with *errmsg. */
static int
listen_on(const char *addr, char host[256], uint16_t *port_out, char **errmsg)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_PASSIVE | AI_NUMERICSERV },
	                *res = NULL, *ai;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char port[8];
	int fd = -1, err = 0, on = 1, rc;

	if (!split_addr(addr, host, port)) {
		*errmsg = moat_asprintf("metrics address \"%s\" is not "
		                        "HOST:PORT: " ADDR_USAGE,
		    addr);
		return -1;
	}
	if ((rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res)) !=
	    0) {
		*errmsg =
		    moat_asprintf("metrics address \"%s\": %s: " ADDR_USAGE,
		        addr, gai_strerror(rc));
		return -1;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family,
		    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			err = errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
		    listen(fd, 16) == 0)
			break;
		err = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		*errmsg = moat_asprintf("cannot serve metrics on %s: %s: pick "
		                        "a free port ([section] metrics, "
		                        "--metrics)",
		    addr, strerror(err ? err : EADDRNOTAVAIL));
		return -1;
	}
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
		*port_out = ntohs(ss.ss_family == AF_INET6 ?
		        ((struct sockaddr_in6 *)&ss)->sin6_port :
		        ((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

int
moat_metrics_serve(struct moat_metrics_server **out, struct moat_metrics *reg,
    const char *addr, char **errmsg)
{
	struct moat_metrics_server *srv;
	int rc;

	*out = NULL;
	if ((srv = calloc(1, sizeof(*srv))) == NULL) {
		*errmsg = moat_asprintf("out of memory");
		return MOAT_RESOURCE_EXHAUSTED;
	}
	srv->reg = reg;
	srv->wake[0] = srv->wake[1] = -1;
	for (size_t i = 0; i < MAX_CONNS; i++)
		srv->conns[i].fd = -1;
	if ((srv->listen_fd = listen_on(addr, srv->host, &srv->port, errmsg)) <
	    0) {
		moat_metrics_server_stop(srv);
		return MOAT_INVALID_ARGUMENT;
	}
	rc = pipe2(srv->wake, O_CLOEXEC | O_NONBLOCK) != 0 ?
	    errno :
	    pthread_create(&srv->thread, NULL, server_main, srv);
	if (rc != 0) {
		*errmsg = moat_asprintf("cannot start the metrics thread: %s",
		    strerror(rc));
		moat_metrics_server_stop(srv);
		return MOAT_INTERNAL;
	}
	srv->thread_started = true;
	*out = srv;
	return MOAT_OK;
}

uint16_t
moat_metrics_server_port(const struct moat_metrics_server *srv)
{
	return srv ? srv->port : 0;
}

char *
moat_metrics_server_url(const struct moat_metrics_server *srv)
{
	const char *h = srv->host[0] ? srv->host : "0.0.0.0";
	bool v6 = strchr(h, ':') != NULL;

	return moat_asprintf("http://%s%s%s:%u/metrics", v6 ? "[" : "", h,
	    v6 ? "]" : "", (unsigned)srv->port);
}

int
moat_metrics_start(struct moat_metrics_server **out, struct moat_metrics *reg,
    void (*scrape)(void *ctx), void *ctx, const char *addr, const char *who,
    char **errmsg)
{
	char *url;
	int rv;

	*out = NULL;
	if (scrape != NULL &&
	    (rv = moat_metrics_on_scrape(reg, scrape, ctx)) != MOAT_OK) {
		*errmsg = moat_asprintf("%s: cannot add its metrics: %s", who,
		    moat_strerror(rv));
		return rv;
	}
	if ((rv = moat_metrics_serve(out, reg, addr, errmsg)) != MOAT_OK)
		return rv;
	url = moat_metrics_server_url(*out);
	moat_info(0, "%s: metrics at %s", who, url ? url : addr);
	free(url);
	return MOAT_OK;
}

void
moat_metrics_server_stop(struct moat_metrics_server *srv)
{
	if (srv == NULL)
		return;
	if (srv->thread_started) {
		while (write(srv->wake[1], "x", 1) < 0 && errno == EINTR)
			;
		pthread_join(srv->thread, NULL);
	}
	for (size_t i = 0; i < MAX_CONNS; i++)
		conn_close(&srv->conns[i]);
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	if (srv->wake[0] >= 0)
		close(srv->wake[0]);
	if (srv->wake[1] >= 0)
		close(srv->wake[1]);
	free(srv);
}
