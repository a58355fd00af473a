/*
 * qmp.h: a minimal, blocking QMP client for the QEMU driver: connect to a
 * VMM's QMP socket, negotiate, run one command at a time and read its
 * answer (events in between are skipped). Not for: knowing what the
 * commands mean (qemu.c) or anything asynchronous.
 */
#ifndef MOAT_VMD_QMP_H
#define MOAT_VMD_QMP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define QMP_LINE_MAX (256u << 10)

struct qmp {
	int fd;    /* -1 when closed */
	char *buf; /* QMP_LINE_MAX bytes, owned */
	size_t len;
	uint64_t deadline_ms; /* monotonic; every read stops there */
};

/* qmp_open: connects to `path`, reads the greeting and sends
 * qmp_capabilities, all before `deadline_ms`. On success q is the
 * caller's (qmp_close). On failure q is closed and *errmsg (heap, caller
 * frees) names the socket and what went wrong. */
int qmp_open(struct qmp *q, const char *path, uint64_t deadline_ms,
    char **errmsg) __attribute__((warn_unused_result));

/* qmp_run: sends {"execute": cmd, "arguments": args} (args borrowed, may
 * be NULL) and waits for its answer. On success *ret (may be NULL: not
 * wanted) is the "return" value, a new reference the caller decrefs.
 * QEMU's error replies become MOAT_FAILED_PRECONDITION with its text in
 * *errmsg (heap); a dead socket MOAT_UNAVAILABLE; the deadline
 * MOAT_DEADLINE_EXCEEDED. */
int qmp_run(struct qmp *q, const char *cmd, json_t *args, json_t **ret,
    char **errmsg) __attribute__((warn_unused_result));

/* qmp_pass_fd: hands QEMU a copy of `fd` under `name` (QMP getfd, the fd
 * sent alongside as SCM_RIGHTS), for "fd:<name>" migration URIs: no shell
 * and no cat process in the way. The caller keeps its `fd`. Same errors
 * as qmp_run. */
int qmp_pass_fd(struct qmp *q, const char *name, int fd, char **errmsg)
    __attribute__((warn_unused_result));

/* qmp_close: safe on a zeroed or closed q (fd must be -1 or open). */
void qmp_close(struct qmp *q);

#endif
