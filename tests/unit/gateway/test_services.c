/*
 * test_services.c: moat-sessiond and moat-snapd as real processes in a
 * fresh state directory: they answer Health over the RPC layer with their
 * name, version and store directory, create their LMDB environment, exit
 * 0 on SIGTERM, refuse a store in another format and a bad map size with
 * the documented exit codes.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/supplemental/util/platform.h>

#include "common.pb-c.h"
#include "moat/rpc.h"
#include "moat/store.h"
#include "moat/util.h"

static char dir[64];

static int
setup(void **state)
{
	snprintf(dir, sizeof(dir), "/tmp/moat-svc-XXXXXX");
	assert_non_null(mkdtemp(dir));
	return 0;
}

static int
teardown(void **state)
{
	moat_rm_rf(dir);
	return 0;
}

static pid_t
spawn(const char *bin, char *const extra[])
{
	char *argv[16];
	int n = 0;
	pid_t pid;

	argv[n++] = (char *)bin;
	argv[n++] = (char *)"--state-dir";
	argv[n++] = dir;
	for (int i = 0; extra != NULL && extra[i] != NULL && n < 15; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	if ((pid = fork()) == 0) {
		/* Keep the test's output readable: logs to /dev/null. */
		if (freopen("/dev/null", "w", stderr) == NULL)
			_exit(126);
		unsetenv("MOAT_CONFIG");
		execv(bin, argv);
		_exit(127);
	}
	assert_true(pid > 0);
	return pid;
}

static int
wait_exit(pid_t pid)
{
	int status;

	for (int i = 0; i < 500; i++) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) :
			                           128 + WTERMSIG(status);
		nng_msleep(10);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	fail_msg("process %d did not exit", (int)pid);
	return -1;
}

static void
check_health(const char *bin, const char *service, const char *rpc,
    const char *sock, const char *store)
{
	Moat__V1__HealthRequest req = MOAT__V1__HEALTH_REQUEST__INIT;
	struct moat_rpc_opts opts = { .timeout_ms = 500 };
	struct moat_rpc_client *c = NULL;
	ProtobufCMessage *reply = NULL;
	Moat__V1__HealthReply *hr;
	char *url = moat_asprintf("ipc://%s/%s", dir, sock);
	char *store_dir = moat_asprintf("%s/%s", dir, store);
	char *mdb = moat_asprintf("%s/data.mdb", store_dir);
	char *errmsg = NULL;
	struct stat st;
	pid_t pid = spawn(bin, NULL);
	int rv = MOAT_UNAVAILABLE;

	assert_int_equal(moat_rpc_client_open(&c, url, &errmsg), MOAT_OK);
	for (int i = 0; i < 50 && rv != MOAT_OK; i++) {
		free(errmsg);
		errmsg = NULL;
		rv = moat_rpc_call(c, rpc, "Health", &req.base,
		    &moat__v1__health_reply__descriptor, &reply, &opts,
		    &errmsg);
		if (rv != MOAT_OK)
			nng_msleep(50);
	}
	if (rv != MOAT_OK)
		fail_msg("%s never answered: %s", service, errmsg);
	hr = (Moat__V1__HealthReply *)reply;
	assert_string_equal(hr->service, service);
	assert_string_equal(hr->version, MOAT_VERSION);
	assert_string_equal(hr->state_dir, store_dir);
	protobuf_c_message_free_unpacked(reply, NULL);
	assert_int_equal(stat(mdb, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(stat(store_dir, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	/* Its socket is the owner's only. */
	assert_int_equal(stat(url + 6, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);

	kill(pid, SIGTERM);
	assert_int_equal(wait_exit(pid), 0);
	moat_rpc_client_close(c);
	free(url);
	free(store_dir);
	free(mdb);
}

static void
test_sessiond_health(void **state)
{
	check_health(SESSIOND_BIN, "moat-sessiond", "moat.v1.Session",
	    "sessiond.sock", "sessiond");
	/* A second start reopens the same store. */
	check_health(SESSIOND_BIN, "moat-sessiond", "moat.v1.Session",
	    "sessiond.sock", "sessiond");
}

static void
test_snapd_health(void **state)
{
	check_health(SNAPD_BIN, "moat-snapd", "moat.v1.Snapshot", "snapd.sock",
	    "snapd");
}

static void
test_refuses_other_format(void **state)
{
	static const char *const dbs[] = { "meta", NULL };
	struct moat_store *st = NULL;
	struct moat_store_txn *txn;
	char *path = moat_asprintf("%s/sessiond", dir), *errmsg = NULL;

	assert_int_equal(moat_store_open(&st, path, 0, dbs, &errmsg), MOAT_OK);
	assert_int_equal(moat_store_txn_begin(st, true, &txn, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_put(txn, "meta", "format", 6, "99", 2,
	                     false, &errmsg),
	    MOAT_OK);
	assert_int_equal(moat_store_txn_commit(txn, &errmsg), MOAT_OK);
	moat_store_close(st);
	/* 64 + FAILED_PRECONDITION */
	assert_int_equal(wait_exit(spawn(SESSIOND_BIN, NULL)), 64 + 9);
	free(path);
}

static void
test_bad_map_size(void **state)
{
	char *args[] = { (char *)"--map-size-mib", (char *)"lots", NULL };
	char *zero[] = { (char *)"--map-size-mib", (char *)"0", NULL };

	/* 64 + INVALID_ARGUMENT */
	assert_int_equal(wait_exit(spawn(SNAPD_BIN, args)), 64 + 3);
	assert_int_equal(wait_exit(spawn(SNAPD_BIN, zero)), 64 + 3);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_sessiond_health, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_snapd_health, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_refuses_other_format,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_map_size, setup,
		    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
