/*
 * client_smoke.c: a program built outside the tree against an installed
 * libmoat, by `pkg-config --cflags --libs moat` (install_test.sh). It
 * needs no server: the status strings, and a call to a 127.0.0.1 port
 * nobody listens on, which must fail with a status and a message rather
 * than crash or hang. Exits 0 when all of that holds. Not for: testing
 * the client's calls (tests/unit/clients).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <moat_client.h>

/* unused_port: a port the kernel just handed out and took back, so
 * nothing listens on it. 0 on failure. */
static int
unused_port(void)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int fd, port = 0;

	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
		return 0;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

int
main(void)
{
	Moat__V1__HealthReply *health = NULL;
	struct moat_client *c = NULL;
	char *errmsg = NULL;
	char url[64];
	const char *s;
	int port, rv;

	s = moat_strerror(MOAT_NOT_FOUND);
	if (s == NULL || s[0] == '\0') {
		fprintf(stderr, "client_smoke: moat_strerror gave nothing\n");
		return 1;
	}
	if ((port = unused_port()) == 0) {
		fprintf(stderr, "client_smoke: no free port\n");
		return 1;
	}
	snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
	if ((rv = moat_client_open(&c, url, NULL, &errmsg)) != MOAT_OK) {
		fprintf(stderr, "client_smoke: open %s: %s\n", url,
		    errmsg ? errmsg : moat_strerror(rv));
		free(errmsg);
		return 1;
	}
	moat_client_set_timeout(c, 2000);
	rv = moat_client_health(c, &health, &errmsg);
	if (rv == MOAT_OK || health != NULL || errmsg == NULL) {
		fprintf(stderr,
		    "client_smoke: Health on %s, where nothing "
		    "listens, did not fail cleanly (status %d)\n",
		    url, rv);
		return 1;
	}
	printf("client_smoke: %s -> %s: %s\n", url, moat_strerror(rv), errmsg);
	free(errmsg);
	moat_client_close(c);
	return 0;
}
