/*
 * test_api.c: the Firecracker REST client (api.c) against fc_double.py,
 * the test double that checks each request against Firecracker's OpenAPI
 * spec: answers reach the caller, and every refusal (unknown field, wrong
 * type, missing field, unknown path, a state rule) comes back as a status
 * with Firecracker's fault_message in it; no socket and a socket that
 * never answers are told apart. Also proves the double really enforces
 * the spec, which the driver's contract test relies on. Not for: the
 * driver's call sequence (test_driver.c).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "api.h"
#include "moat/status.h"
#include "moat/util.h"

struct double_proc {
	char dir[64];
	char *sock;
	pid_t pid;
};

static void
wait_for_socket(const char *sock)
{
	for (int i = 0; i < 500; i++) {
		json_t *r = NULL;
		char *err = NULL;
		int rv =
		    moat_fc_api_call(sock, "GET", "/", NULL, 1000, &r, &err);

		json_decref(r);
		free(err);
		if (rv == MOAT_OK)
			return;
		usleep(10000);
	}
	fail_msg("the test double did not listen on %s", sock);
}

static int
setup(void **state)
{
	struct double_proc *d = calloc(1, sizeof(*d));
	const char *dbl = getenv("FC_DOUBLE");

	assert_non_null(d);
	assert_non_null(dbl);
	snprintf(d->dir, sizeof(d->dir), "/tmp/fc-api-XXXXXX");
	assert_non_null(mkdtemp(d->dir));
	d->sock = moat_asprintf("%s/api.sock", d->dir);
	if ((d->pid = fork()) == 0) {
		if (chdir(d->dir) != 0)
			_exit(127);
		execl(dbl, dbl, "--api-sock", d->sock, "--id", "sb-api",
		    (char *)NULL);
		_exit(127);
	}
	assert_true(d->pid > 0);
	wait_for_socket(d->sock);
	*state = d;
	return 0;
}

static int
teardown(void **state)
{
	struct double_proc *d = *state;

	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	(void)moat_rm_rf(d->dir);
	free(d->sock);
	free(d);
	return 0;
}

/* PUT `json` to `path`; returns the status and the message (heap). */
static int
put(struct double_proc *d, const char *path, const char *json, char **err)
{
	json_t *body = json ? json_loads(json, 0, NULL) : NULL;
	int rv;

	if (json != NULL)
		assert_non_null(body);
	rv = moat_fc_api_call(d->sock, "PUT", path, body, 2000, NULL, err);
	json_decref(body);
	return rv;
}

static void
expect_fault(struct double_proc *d, const char *path, const char *json,
    const char *needle)
{
	char *err = NULL;
	int rv = put(d, path, json, &err);

	assert_int_equal(rv, MOAT_FAILED_PRECONDITION);
	assert_non_null(err);
	if (strstr(err, needle) == NULL || strstr(err, "HTTP 400") == NULL)
		fail_msg("message \"%s\" lacks \"%s\"", err, needle);
	free(err);
}

static void
test_get_instance_info(void **state)
{
	struct double_proc *d = *state;
	json_t *info = NULL;
	char *err = NULL;

	assert_int_equal(moat_fc_api_call(d->sock, "GET", "/", NULL, 2000,
	                     &info, &err),
	    MOAT_OK);
	assert_null(err);
	assert_non_null(info);
	assert_string_equal(json_string_value(json_object_get(info, "state")),
	    "Not started");
	assert_string_equal(json_string_value(json_object_get(info, "id")),
	    "sb-api");
	json_decref(info);
}

static void
test_put_ok(void **state)
{
	struct double_proc *d = *state;
	char *err = NULL;

	assert_int_equal(put(d, "/machine-config",
	                     "{\"vcpu_count\": 2, \"mem_size_mib\": 256}",
	                     &err),
	    MOAT_OK);
	assert_null(err);
}

static void
test_spec_is_enforced(void **state)
{
	struct double_proc *d = *state;

	expect_fault(d, "/machine-config",
	    "{\"vcpu_count\": 1, "
	    "\"mem_size_mib\": 128, \"bogus\": true}",
	    "unknown field `bogus`");
	expect_fault(d, "/machine-config",
	    "{\"vcpu_count\": \"two\", "
	    "\"mem_size_mib\": 128}",
	    "expected an integer");
	expect_fault(d, "/machine-config",
	    "{\"vcpu_count\": 33, "
	    "\"mem_size_mib\": 128}",
	    "above 32");
	expect_fault(d, "/machine-config",
	    "{\"vcpu_count\": true, "
	    "\"mem_size_mib\": 128}",
	    "expected an integer");
	expect_fault(d, "/boot-source", "{}",
	    "missing field `kernel_image_path`");
	expect_fault(d, "/drives/rootfs",
	    "{\"drive_id\": \"rootfs\", "
	    "\"is_root_device\": \"no\"}",
	    "expected a boolean");
	expect_fault(d, "/drives/rootfs",
	    "{\"drive_id\": \"other\", "
	    "\"is_root_device\": false}",
	    "does not match");
	expect_fault(d, "/drives/bad-id",
	    "{\"drive_id\": \"bad-id\", "
	    "\"is_root_device\": false}",
	    "Invalid ID");
	expect_fault(d, "/actions", "{\"action_type\": \"Reboot\"}",
	    "is not one of");
	expect_fault(d, "/no-such-thing", "{}", "Invalid request method");
	expect_fault(d, "/actions", NULL, "Empty PUT request");
	expect_fault(d, "/vsock", "{\"guest_cid\": 2, \"uds_path\": \"v\"}",
	    "below 3");
}

static void
test_state_rules(void **state)
{
	struct double_proc *d = *state;
	json_t *body = json_pack("{s:s}", "state", "Paused");
	char *err = NULL;
	int rv;

	/* Post-boot only, before boot. */
	rv = moat_fc_api_call(d->sock, "PATCH", "/vm", body, 2000, NULL, &err);
	json_decref(body);
	assert_int_equal(rv, MOAT_FAILED_PRECONDITION);
	assert_non_null(strstr(err, "before starting the microVM"));
	free(err);
	/* InstanceStart without a boot source. */
	expect_fault(d, "/actions", "{\"action_type\": \"InstanceStart\"}",
	    "without kernel");
}

static void
test_no_socket(void **state)
{
	char *err = NULL;

	(void)state;
	assert_int_equal(moat_fc_api_call("/nonexistent/api.sock", "GET", "/",
	                     NULL, 500, NULL, &err),
	    MOAT_UNAVAILABLE);
	assert_non_null(strstr(err, "/nonexistent/api.sock"));
	free(err);
}

static void
test_silent_socket_times_out(void **state)
{
	struct double_proc *d = *state;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char *path = moat_asprintf("%s/silent.sock", d->dir);
	char *err = NULL;
	int s = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(s, 4), 0);
	/* Connects (the backlog takes it), then nothing answers. */
	assert_int_equal(moat_fc_api_call(path, "GET", "/", NULL, 300, NULL,
	                     &err),
	    MOAT_DEADLINE_EXCEEDED);
	assert_non_null(strstr(err, "within 300 ms"));
	free(err);
	close(s);
	free(path);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_get_instance_info, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_put_ok, setup, teardown),
		cmocka_unit_test_setup_teardown(test_spec_is_enforced, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_state_rules, setup,
		    teardown),
		cmocka_unit_test(test_no_socket),
		cmocka_unit_test_setup_teardown(test_silent_socket_times_out,
		    setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
