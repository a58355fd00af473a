/*
 * harness.c: see harness.h. The process's log goes to <dir>/sessiond.log
 * so a failing test can be read afterwards.
 * Not for: assertions about sessiond's answers.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "harness.h"
#include "moat/util.h"

#define SERVICE "moat.v1.Session"
#define MAX_PROCS 16

/* Processes started and not stopped, for ses_reap_all. Tests start them
 * from their main thread only. */
static struct ses_proc *live[MAX_PROCS];

static void
live_set(struct ses_proc *p, bool on)
{
	for (int i = 0; i < MAX_PROCS; i++) {
		if (on && live[i] == p)
			return;
		if (!on && live[i] == p)
			live[i] = NULL;
	}
	for (int i = 0; on && i < MAX_PROCS; i++)
		if (live[i] == NULL) {
			live[i] = p;
			return;
		}
}

int
ses_reap_all(void **state)
{
	for (int i = 0; i < MAX_PROCS; i++) {
		struct ses_proc *p = live[i];

		if (p == NULL)
			continue;
		if (p->pid > 0) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, NULL, 0);
			p->pid = 0;
		}
		moat_rpc_client_close(p->client);
		p->client = NULL;
		if (p->dir[0] != '\0')
			moat_rm_rf(p->dir);
		live[i] = NULL;
	}
	return 0;
}

void
ses_start(struct ses_proc *p, char *const extra[])
{
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 500 };
	ProtobufCMessage *reply = NULL;
	char *argv[16], *errmsg = NULL, *log;
	int n = 0, rv = MOAT_UNAVAILABLE;

	if (p->dir[0] == '\0') {
		snprintf(p->dir, sizeof(p->dir), "/tmp/moat-ses-XXXXXX");
		assert_non_null(mkdtemp(p->dir));
	}
	if (p->url == NULL)
		p->url = moat_asprintf("ipc://%s/sessiond.sock", p->dir);
	argv[n++] = (char *)SESSIOND_BIN;
	argv[n++] = (char *)"--state-dir";
	argv[n++] = p->dir;
	for (int i = 0; extra != NULL && extra[i] != NULL && n < 15; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	log = moat_asprintf("%s/sessiond.log", p->dir);
	if ((p->pid = fork()) == 0) {
		if (freopen(log, "a", stderr) == NULL ||
		    freopen("/dev/null", "w", stdout) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(SESSIOND_BIN, argv);
		_exit(127);
	}
	free(log);
	assert_true(p->pid > 0);
	live_set(p, true);
	if (p->client == NULL)
		assert_int_equal(moat_rpc_client_open(&p->client, p->url,
		                     &errmsg),
		    MOAT_OK);
	for (int i = 0; i < 100 && rv != MOAT_OK; i++) {
		free(errmsg);
		errmsg = NULL;
		rv = moat_rpc_call(p->client, SERVICE, "Health", &req.base,
		    &moat__v1__health_reply__descriptor, &reply, &opts,
		    &errmsg);
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	if (rv != MOAT_OK)
		fail_msg("moat-sessiond never answered: %s", errmsg);
	protobuf_c_message_free_unpacked(reply, NULL);
}

int
ses_kill(struct ses_proc *p, int sig)
{
	int status = 0;

	if (p->pid <= 0)
		return 0;
	kill(p->pid, sig);
	for (int i = 0; i < 1000; i++) {
		if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
			p->pid = 0;
			return status;
		}
		nng_msleep(10);
	}
	kill(p->pid, SIGKILL);
	waitpid(p->pid, &status, 0);
	p->pid = 0;
	fail_msg("moat-sessiond did not exit on signal %d", sig);
	return status;
}

void
ses_stop(struct ses_proc *p)
{
	int status = ses_kill(p, SIGTERM);

	moat_rpc_client_close(p->client);
	p->client = NULL;
	free(p->url);
	p->url = NULL;
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	moat_rm_rf(p->dir);
	p->dir[0] = '\0';
	live_set(p, false);
}

int
ses_call(struct ses_proc *p, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc, ProtobufCMessage **reply,
    char **errmsg)
{
	return ses_call_as(p, NULL, method, req, desc, reply, errmsg);
}

int
ses_call_as(struct ses_proc *p, const char *tenant, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **reply, char **errmsg)
{
	struct moat_rpc_opts opts = { .timeout_ms = 30000, .tenant = tenant };
	char *msg = NULL;
	int rv;

	*reply = NULL;
	rv = moat_rpc_call(p->client, SERVICE, method, req, desc, reply, &opts,
	    &msg);
	if (errmsg != NULL)
		*errmsg = msg;
	else
		free(msg);
	return rv;
}

char *
ses_create(struct ses_proc *p, const char *tenant, const char *sandbox)
{
	Moat__V1__CreateSessionRequest req =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL, *id;
	int rv;

	req.tenant = (char *)tenant;
	req.sandbox_id = (char *)sandbox;
	rv = ses_call(p, "CreateSession", &req.base,
	    &moat__v1__session_info__descriptor, &reply, &errmsg);
	if (rv != MOAT_OK)
		fail_msg("CreateSession: %s: %s", moat_strerror(rv), errmsg);
	id = strdup(((Moat__V1__SessionInfo *)reply)->id);
	protobuf_c_message_free_unpacked(reply, NULL);
	return id;
}

int
ses_append(struct ses_proc *p, const char *tenant, const char *id,
    const char *input, const void *out, size_t out_len, uint64_t *index,
    char **errmsg)
{
	Moat__V1__AppendStepRequest req = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	ProtobufCMessage *reply;
	int rv;

	req.tenant = (char *)tenant;
	req.session_id = (char *)id;
	req.step = &step;
	step.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	step.input = (char *)input;
	step.stdout.data = (uint8_t *)out;
	step.stdout.len = out_len;
	step.started_ms = 1000;
	step.ended_ms = 1001;
	rv = ses_call(p, "AppendStep", &req.base,
	    &moat__v1__append_step_reply__descriptor, &reply, errmsg);
	if (rv == MOAT_OK) {
		*index = ((Moat__V1__AppendStepReply *)reply)->index;
		protobuf_c_message_free_unpacked(reply, NULL);
	}
	return rv;
}

void
ses_expect(int rv, char *errmsg, int code, const char *needle)
{
	if (rv != code)
		fail_msg("expected %s, got %s: %s", moat_strerror(code),
		    moat_strerror(rv), errmsg ? errmsg : "(no message)");
	if (needle != NULL && (errmsg == NULL || !strstr(errmsg, needle)))
		fail_msg("message \"%s\" does not mention \"%s\"",
		    errmsg ? errmsg : "", needle);
	free(errmsg);
}

int
ses_case_setup(void **state)
{
	struct ses_proc *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return -1;
	ses_start(p, NULL);
	*state = p;
	return 0;
}

int
ses_case_teardown(void **state)
{
	struct ses_proc *p = *state;

	if (p->pid > 0)
		ses_stop(p);
	ses_reap_all(state);
	free(p);
	return 0;
}
