/*
 * sessiond_proc.c: a moat-sessiond child for gateway unit tests (see
 * sessiond_proc.h).
 * Not for: anything but tests.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "common.pb-c.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "sessiond_proc.h"

pid_t
test_sessiond_start(const char *bin, const char *dir)
{
	Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_client *c = NULL;
	ProtobufCMessage *reply = NULL;
	char *url = moat_asprintf("ipc://%s/sessiond.sock", dir);
	char *errmsg = NULL;
	int rv = MOAT_UNAVAILABLE;
	pid_t pid;

	assert_non_null(url);
	if ((pid = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execl(bin, bin, "--state-dir", dir, (char *)NULL);
		_exit(127);
	}
	assert_true(pid > 0);
	assert_int_equal(moat_rpc_client_open(&c, url, &errmsg), MOAT_OK);
	/* Up to 10 s: a sanitizer build starts slowly. */
	for (int i = 0; i < 200 && rv != MOAT_OK; i++) {
		struct moat_rpc_opts o = { .timeout_ms = 500 };

		rv = moat_rpc_call(c, "moat.v1.Session", "Health", &hreq.base,
		    &moat__v1__health_reply__descriptor, &reply, &o, &errmsg);
		free(errmsg);
		errmsg = NULL;
		protobuf_c_message_free_unpacked(reply, NULL);
		reply = NULL;
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	moat_rpc_client_close(c);
	free(url);
	if (rv != MOAT_OK) {
		test_sessiond_stop(pid);
		fail_msg("moat-sessiond (%s) did not answer Health", bin);
	}
	return pid;
}

void
test_sessiond_stop(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	(void)waitpid(pid, NULL, 0);
}
