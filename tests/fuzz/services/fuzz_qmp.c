/*
 * fuzz_qmp.c: fuzz target for the QEMU driver's QMP client
 * (services/vm/drivers/qmp.c) reading what a hostile QEMU sends: the
 * input is everything "QEMU" writes on the socket (lines of JSON, events,
 * answers, junk, no newline at all) before it hangs up. qmp_run must
 * return a status with a message or a "return" value, never crash, hang
 * past its deadline or read past its line cap. A socketpair stands in for
 * QEMU's socket; the command qmp_run sends is drained. Not for: what
 * qemu.c does with an answer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "qmp.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct qmp q = { .fd = -1 };
	json_t *ret = NULL;
	char *errmsg = NULL;
	int sv[2], rv, sndbuf = 1 << 20;

	if (size > 128 * 1024)
		return 0;
	moat_fuzz_check(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0,
	    "socketpair");
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sndbuf, sizeof(sndbuf));
	/* "QEMU" says everything at once, then hangs up its write side. */
	if (size > 0 && write(sv[1], data, size) != (ssize_t)size) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	shutdown(sv[1], SHUT_WR);
	q.fd = sv[0];
	q.buf = malloc(QMP_LINE_MAX);
	moat_fuzz_check(q.buf != NULL, "malloc");
	/* Long enough that only a wait on the hung-up peer reaches it: at
	 * 200 ms a target starved of CPU (nice 19 beside a CI run) once
	 * passed it on a 6-byte input that takes 2 ms. */
	q.deadline_ms = moat_rpc_now_ms() + 5000;
	rv = qmp_run(&q, "query-status", NULL, &ret, &errmsg);
	if (rv == MOAT_OK) {
		moat_fuzz_check(errmsg == NULL, "OK with a message");
		json_decref(ret);
	} else {
		moat_fuzz_check(errmsg != NULL, "a failure without a message");
		moat_fuzz_check(ret == NULL, "a failure with a value");
		moat_fuzz_check(rv != MOAT_DEADLINE_EXCEEDED,
		    "a peer that hung up was waited for");
	}
	moat_fuzz_check(q.len <= QMP_LINE_MAX, "buffer past its cap");
	free(errmsg);
	qmp_close(&q);
	close(sv[1]);
	return 0;
}

void
moat_fuzz_seeds(void (*add)(const uint8_t *data, size_t len))
{
	static const char *const seeds[] = {
		"{\"return\": {\"status\": \"running\", \"running\": true}}\n",
		"{\"timestamp\": {\"seconds\": 1, \"microseconds\": 2}, "
		"\"event\": \"STOP\"}\r\n{\"return\": {}}\n",
		"{\"error\": {\"class\": \"GenericError\", \"desc\": "
		"\"no\"}}\n",
		"{\"error\": 5}\n",
		"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 0}}, "
		"\"capabilities\": []}}\n{\"return\": [1, 2]}\n",
		"[1,2,3]\n",
		"{\"return\": \"\\u0000\"}\n",
		"{\"return\"",
	};

	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		add((const uint8_t *)seeds[i], strlen(seeds[i]));
}
