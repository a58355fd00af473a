/*
 * sessiond_proc.h: a real moat-sessiond run as a child process for the
 * gateway's unit tests that need recording lookups to answer (without
 * one, each ExecStart or Exec on a sandbox waits out the gateway's
 * sessiond timeout to learn whether it is recorded).
 * Not for: tests of sessiond itself (tests/unit/session).
 */
#ifndef MOAT_TEST_SESSIOND_PROC_H
#define MOAT_TEST_SESSIOND_PROC_H

#include <sys/types.h>

/* test_sessiond_start: runs `bin` with --state-dir `dir` (it listens on
 * ipc://DIR/sessiond.sock) and waits until it answers Health. Returns its
 * pid; fails the test when it does not start. */
pid_t test_sessiond_start(const char *bin, const char *dir);

/* test_sessiond_stop: SIGTERM, then waits for it. Safe on 0. */
void test_sessiond_stop(pid_t pid);

#endif
