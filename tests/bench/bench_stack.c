/*
 * bench_stack.c: the stack a benchmark starts for itself (bench_stack.h):
 * deploy/moat-stack start in a fresh state directory, purge at exit.
 * Not for: anything measured: it only sets up and tears down.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_stack.h"

#define STACKS_MAX 4

static const char *stack_repo;
/* Every stack this program started, purged at exit. */
static char stack_state[STACKS_MAX][64];
static int n_stacks;

void
bench_stack_die(const char *what, const char *detail)
{
	fprintf(stderr, "bench: %s: %s\n", what, detail ? detail : "");
	exit(1);
}

/* stack: `bash deploy/moat-stack VERB` with the bench's environment;
 * its exit status. */
static int
stack(const char *verb)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), "bash '%s/deploy/moat-stack' %s >&2",
	    stack_repo, verb);
	return system(cmd);
}

static void
purge_at_exit(void)
{
	for (int i = 0; i < n_stacks; i++) {
		setenv("MOAT_STATE_DIR", stack_state[i], 1);
		if (stack("purge") != 0)
			fprintf(stderr, "bench: purge of %s failed\n",
			    stack_state[i]);
		rmdir(stack_state[i]);
	}
}

/* free_port: a TCP port on 127.0.0.1 that nothing listens on now. */
static unsigned
free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	unsigned port;
	int fd;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
		bench_stack_die("free port", "cannot bind 127.0.0.1:0");
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

/* read_line: the first line of `path` into buf (newline dropped). */
static void
read_line(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");

	if (f == NULL || fgets(buf, (int)cap, f) == NULL)
		bench_stack_die("cannot read", path);
	fclose(f);
	buf[strcspn(buf, "\r\n")] = '\0';
}

void
bench_stack_start(struct bench_stack *s, const char *name, const char *repo,
    const char *bin_dir, bool with_grpc)
{
	char path[512], addr[32], comm[32];

	memset(s, 0, sizeof(*s));
	if (n_stacks == STACKS_MAX)
		bench_stack_die("stack", "too many stacks in one bench");
	stack_repo = repo;
	snprintf(s->state_dir, sizeof(s->state_dir),
	    "/tmp/moat-bench-%s.XXXXXX", name);
	if (mkdtemp(s->state_dir) == NULL)
		bench_stack_die("mkdtemp", s->state_dir);
	snprintf(stack_state[n_stacks], sizeof(stack_state[0]), "%s",
	    s->state_dir);
	if (n_stacks++ == 0)
		atexit(purge_at_exit);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", free_port());
	snprintf(s->http_base, sizeof(s->http_base), "http://%s", addr);
	setenv("MOAT_STATE_DIR", s->state_dir, 1);
	setenv("MOAT_GATEWAY_HTTP", addr, 1);
	if (with_grpc) {
		s->grpc_port = free_port();
		snprintf(addr, sizeof(addr), "127.0.0.1:%u", s->grpc_port);
		setenv("MOAT_GATEWAY_GRPC", addr, 1);
	}
	/* The benches measure the doors' throughput: no rate limits. */
	setenv("MOAT_GATEWAY_RATE_LIMIT_RPS", "0", 0);
	setenv("MOAT_TENANTS_KEY_RPS", "0", 0);
	setenv("MOAT_BIN_DIR", bin_dir, 0);
	if (stack("start") != 0)
		bench_stack_die("stack",
		    "deploy/moat-stack start failed (logs above)");
	snprintf(path, sizeof(path), "%s/api-key", s->state_dir);
	read_line(path, s->api_key, sizeof(s->api_key));
	snprintf(path, sizeof(path), "%s/run/gateway.pid", s->state_dir);
	read_line(path, comm, sizeof(comm));
	s->gateway_pid = atol(comm);
	snprintf(path, sizeof(path), "/proc/%ld/comm", s->gateway_pid);
	read_line(path, comm, sizeof(comm));
	if (strcmp(comm, "moat-gateway") != 0)
		bench_stack_die("run/gateway.pid is not moat-gateway's", comm);
	snprintf(s->gateway_url, sizeof(s->gateway_url),
	    "ipc://%s/gateway.sock", s->state_dir);
}

unsigned long long
bench_stack_cpu_ticks(long pid)
{
	char path[64], line[2048], *p;
	unsigned long long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	if ((f = fopen(path, "r")) == NULL ||
	    fgets(line, sizeof(line), f) == NULL)
		bench_stack_die("cannot read", path);
	fclose(f);
	/* Fields after the command name, which may hold spaces: state is
	 * field 3, utime 14 and stime 15. */
	if ((p = strrchr(line, ')')) == NULL ||
	    sscanf(p + 2,
	        "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
	        &st) != 2)
		bench_stack_die("cannot parse", path);
	return ut + st;
}
