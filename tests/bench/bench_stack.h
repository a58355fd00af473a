/*
 * bench_stack.h: the local stack a benchmark starts for itself
 * (bench_stack.c): deploy/moat-stack in a fresh state directory, the HTTP
 * door (and the gRPC door when asked) on free loopback ports, no rate
 * limits; its API key, gateway address and pid; purged at exit.
 * Not for: tests (they have their own scripts) or timing anything.
 */
#ifndef MOAT_BENCH_STACK_H
#define MOAT_BENCH_STACK_H

#include <stdbool.h>

struct bench_stack {
	char state_dir[64];
	char api_key[256];
	char gateway_url[300]; /* ipc://STATE/gateway.sock */
	char http_base[64];    /* http://127.0.0.1:PORT */
	unsigned grpc_port;    /* 0: the gRPC door is off */
	long gateway_pid;
};

/* bench_stack_start: starts the stack for bench `name` (the temporary
 * directory's name) from the repository at `repo` with the binaries of
 * `bin_dir` (MOAT_BIN_DIR wins); with_grpc: the gRPC door too. Exits
 * the program, saying why, when the stack does not start. Up to 4
 * stacks may run side by side (each call starts one with the
 * environment of that moment, e.g. MOAT_STACK_RAMFS); all are purged at
 * exit. */
void bench_stack_start(struct bench_stack *s, const char *name,
    const char *repo, const char *bin_dir, bool with_grpc);

/* bench_stack_cpu_ticks: utime + stime of process `pid` in clock
 * ticks (sysconf(_SC_CLK_TCK) a second). */
unsigned long long bench_stack_cpu_ticks(long pid);

/* bench_stack_die: prints "bench: what: detail" and exits 1 (the stack
 * is purged at exit). */
void bench_stack_die(const char *what, const char *detail)
    __attribute__((noreturn));

#endif
