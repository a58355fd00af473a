/*
 * harness.h: runs the real moat-sessiond for a test: a fresh state
 * directory (mkdtemp), the process started, stopped, killed and started
 * again on the same directory, and small helpers for the calls the tests
 * make. Failures are cmocka failures.
 * Not for: checking behaviour (each test file does that).
 */
#ifndef MOAT_TEST_SESSIOND_HARNESS_H
#define MOAT_TEST_SESSIOND_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "moat/rpc.h"
#include "session.pb-c.h"

struct ses_proc {
	char dir[64]; /* state directory */
	char *url;    /* heap */
	pid_t pid;    /* 0 when not running */
	struct moat_rpc_client *client;
};

/* ses_start: starts moat-sessiond on p->dir (made with mkdtemp when
 * empty) with the extra arguments (NULL-terminated, may be NULL), and
 * waits until it answers Health. */
void ses_start(struct ses_proc *p, char *const extra[]);

/* ses_kill: sends `sig` and reaps the process; returns its wait status. */
int ses_kill(struct ses_proc *p, int sig);

/* ses_stop: SIGTERM (it must exit 0), client closed, directory removed. */
void ses_stop(struct ses_proc *p);

/* ses_case_setup / ses_case_teardown: a cmocka case's own sessiond
 * (*state is its struct ses_proc, started with ses_start), stopped and
 * reaped after the case. */
int ses_case_setup(void **state);
int ses_case_teardown(void **state);
#define SES_CASE(t)                                                           \
	cmocka_unit_test_setup_teardown(t, ses_case_setup, ses_case_teardown)

/* ses_reap_all: a cmocka teardown: kills (SIGKILL) every sessiond a
 * failed test left running and removes its directory. */
int ses_reap_all(void **state);

/* ses_call: one call to moat.v1.Session; *reply (caller frees with
 * protobuf_c_message_free_unpacked) on MOAT_OK, else *errmsg (heap, caller
 * frees; may be NULL when errmsg is NULL: then it is freed here). */
int ses_call(struct ses_proc *p, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **reply, char **errmsg);

/* ses_call_as: ses_call with Envelope.tenant `tenant` (NULL: none), as
 * the gateway sends it. */
int ses_call_as(struct ses_proc *p, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **reply, char **errmsg);

/* ses_create: a new session of tenant/sandbox; returns its id (heap). */
char *ses_create(struct ses_proc *p, const char *tenant, const char *sandbox);

/* ses_append: appends an EXEC step with `input` and `out` as stdout;
 * returns the status, *index set on MOAT_OK. */
int ses_append(struct ses_proc *p, const char *tenant, const char *id,
    const char *input, const void *out, size_t out_len, uint64_t *index,
    char **errmsg);

/* ses_expect: asserts that a call failed with `code` and that its
 * message contains `needle`. */
void ses_expect(int rv, char *errmsg, int code, const char *needle);

#endif
