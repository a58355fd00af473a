/*
 * fuzz_fc_api.c: fuzz target for the Firecracker API client
 * (services/vm/drivers/firecracker/api.c) reading what a hostile
 * Firecracker answers: a thread of this process listens on a Unix socket
 * in a temporary directory as the API socket and answers every request
 * with the input's bytes (status line, headers, body: anything), then
 * hangs up. moat_fc_api_call (GET /machine-config wanting the JSON, or
 * PUT /actions with a body, by the input's length) must return a status
 * with a message, or OK with a JSON value only for a 200, never crash or
 * keep more than MOAT_FC_API_MAX_REPLY bytes. Not for: libcurl's HTTP
 * parser itself (not instrumented), or what firecracker.c does next.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "api.h"
#include "fuzz.h"
#include "moat/status.h"
#include "moat/util.h"

static struct {
	pthread_mutex_t lock;
	const uint8_t *data;
	size_t size;
	int listen_fd;
	char path[108];
} S = { .lock = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1 };

/* serve: reads a request (up to the blank line, and a little more for a
 * body), answers the current input, hangs up. Forever. */
static void *
serve(void *arg)
{
	char req[8192];

	for (;;) {
		int fd = accept(S.listen_fd, NULL, NULL);
		size_t got = 0;
		ssize_t n;

		if (fd < 0)
			continue;
		while (got < sizeof(req) - 1 &&
		    (n = read(fd, req + got, sizeof(req) - 1 - got)) > 0) {
			got += (size_t)n;
			req[got] = '\0';
			if (strstr(req, "\r\n\r\n") != NULL &&
			    (strncmp(req, "PUT", 3) != 0 ||
			        strstr(req, "\r\n\r\n")[4] != '\0'))
				break;
		}
		pthread_mutex_lock(&S.lock);
		if (S.size > 0 && write(fd, S.data, S.size) < 0)
			(void)0;
		pthread_mutex_unlock(&S.lock);
		close(fd);
	}
	return arg;
}

static char dir[] = "/tmp/moat-fuzz-fc-XXXXXX";

static void
cleanup(void)
{
	moat_rm_rf(dir);
}

static void
start_server(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	pthread_t t;

	moat_fuzz_check(mkdtemp(dir) != NULL, "mkdtemp");
	atexit(cleanup);
	snprintf(S.path, sizeof(S.path), "%s/api.sock", dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", S.path);
	S.listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
	moat_fuzz_check(S.listen_fd >= 0 &&
	        bind(S.listen_fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	        listen(S.listen_fd, 16) == 0,
	    "listen on the fake API socket");
	moat_fuzz_check(pthread_create(&t, NULL, serve, NULL) == 0,
	    "pthread_create");
	pthread_detach(t);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *reply = NULL, *body = NULL;
	char *errmsg = NULL;
	bool put = size % 2 == 1;
	int rv;

	if (S.listen_fd < 0)
		start_server();
	pthread_mutex_lock(&S.lock);
	S.data = data;
	S.size = size;
	pthread_mutex_unlock(&S.lock);
	if (put)
		body = json_pack("{s:s}", "action_type", "InstanceStart");
	rv = moat_fc_api_call(S.path, put ? "PUT" : "GET",
	    put ? "/actions" : "/machine-config", body, 2000,
	    put ? NULL : &reply, &errmsg);
	json_decref(body);
	if (rv == MOAT_OK) {
		moat_fuzz_check(errmsg == NULL, "OK with a message");
	} else {
		moat_fuzz_check(errmsg != NULL, "a failure without a message");
		moat_fuzz_check(reply == NULL, "a failure with a reply");
		moat_fuzz_check(rv != MOAT_DEADLINE_EXCEEDED,
		    "an answer that ended was waited for");
	}
	json_decref(reply);
	free(errmsg);
	pthread_mutex_lock(&S.lock);
	S.data = NULL;
	S.size = 0;
	pthread_mutex_unlock(&S.lock);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const char *const seeds[] = {
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
		"Content-Length: 40\r\n\r\n"
		"{\"vcpu_count\": 2, \"mem_size_mib\": 256}",
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 400 Bad Request\r\nContent-Length: 33\r\n\r\n"
		"{\"fault_message\": \"bad vcpu \"}",
		"HTTP/1.1 500 Internal\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
		"5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[",
		"HTTP/1.0 200 OK\r\n\r\n{\"x\": [1, 2, 3]}",
		"garbage\r\n\r\n",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		add((const uint8_t *)seeds[i], strlen(seeds[i]));
}
