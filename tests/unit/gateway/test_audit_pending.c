/*
 * test_audit_pending.c: audit entries a gateway keeps in its own log
 * while moat-sessiond does not answer reach sessiond once it does (issue
 * 15, gateway/audit_remote.c moat_audit_pending_push): three entries
 * appended with sessiond down are in the local log only; sessiond
 * started, the next batch sends them too, and sessiond's log then holds
 * all four in order, and nothing is pending any more (a later batch
 * sends no duplicates).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "auth.h"
#include "moat/log.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"

static pid_t sessiond_pid; /* killed by teardown, also after a failure */
static char dir[] = "/tmp/moat-auditpend-XXXXXX";

static int
teardown(void **state)
{
	int status;

	(void)state;
	if (sessiond_pid > 0) {
		kill(sessiond_pid, SIGKILL);
		waitpid(sessiond_pid, &status, 0);
	}
	moat_rm_rf(dir);
	return 0;
}

static void
append(struct moat_auth *a, const char *method)
{
	json_t *e =
	    json_pack("{s:s, s:s}", "method", method, "sandboxId", "sb-1");
	char *err = NULL;

	assert_int_equal(moat_auth_audit_append(a, "acme", e, &err), MOAT_OK);
	json_decref(e);
	moat_auth_audit_flush(a);
}

static size_t
remote_count(struct moat_rpc_client *c, const char *url, json_t **out)
{
	char *err = NULL;

	*out = NULL;
	if (moat_audit_remote_list(c, url, "acme", 100, out, &err) !=
	    MOAT_OK) {
		free(err);
		return (size_t)-1;
	}
	return json_array_size(*out);
}

static const char *
method_at(json_t *list, size_t i)
{
	return json_string_value(
	    json_object_get(json_array_get(list, i), "method"));
}

static void
test_pushed_when_back(void **state)
{
	char *url, *err = NULL;
	char *argv[] = { (char *)SESSIOND_BIN, (char *)"--state-dir", dir,
		(char *)"--listen", NULL, NULL };
	struct moat_rpc_client *c = NULL;
	struct moat_auth *a = NULL;
	json_t *list = NULL;
	size_t n = (size_t)-1;
	pid_t pid;

	(void)state;
	moat_log_init("test", MOAT_LOG_ERROR);
	assert_non_null(mkdtemp(dir));
	url = moat_asprintf("ipc://%s/sessiond.sock", dir);
	argv[4] = url;
	assert_int_equal(moat_auth_open(&a, dir, &err), MOAT_OK);
	assert_int_equal(moat_rpc_client_open(&c, url, &err), MOAT_OK);
	moat_auth_use_sessiond(a, c, url, 0);

	/* sessiond down: kept locally (each batch waits out its call). */
	append(a, "CreateSandbox");
	append(a, "Exec");
	append(a, "DestroySandbox");

	if ((pid = fork()) == 0) {
		if (freopen("/dev/null", "w", stderr) == NULL ||
		    freopen("/dev/null", "w", stdout) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(argv[0], argv);
		_exit(127);
	}
	assert_true(pid > 0);
	sessiond_pid = pid;
	for (int i = 0; i < 100 && n == (size_t)-1; i++) {
		nng_msleep(50);
		n = remote_count(c, url, &list);
		json_decref(list);
	}
	assert_int_equal(n, 0);

	/* Back: the next batch takes the kept ones along. */
	append(a, "RunCode");
	n = remote_count(c, url, &list);
	if (n != 4)
		fail_msg("sessiond holds %zu entries, not the 4 (3 kept while "
		         "it was away, then 1)",
		    n);
	assert_string_equal(method_at(list, 0), "CreateSandbox");
	assert_string_equal(method_at(list, 2), "DestroySandbox");
	json_decref(list);
	append(a, "Fork");
	assert_int_equal(remote_count(c, url, &list), 5);
	json_decref(list);

	moat_auth_close(a);
	moat_rpc_client_close(c);
	free(url);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_pushed_when_back, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
