/*
 * test_reset.c: the agent's `reset` (after a restore or clone) in host
 * mode. As a host process the agent must answer as a guest would but
 * never set the host's clock or hostname nor feed its RNG: the test asks
 * for a clock 20 years back and a hostname of its own and checks that the
 * host did not take that hostname, that its wall clock did not jump, and
 * that the agent's log says "host mode: not applied". Run as root (CI) this fails when the
 * agent applies the reset, since sethostname and clock_settime would
 * then succeed. Not for: the reset inside a real guest (vm_integration's
 * clone cases) or the checks of the request itself.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent_client.h"
#include "moat/status.h"

#define RESET_HOSTNAME "moat-reset-test-must-not-stick"
#define RESET_UNIX_S 1000000000LL /* 2001-09-09: far from now */
#define CLOCK_SLACK_S 5           /* a jump bigger than this fails */

/* clock_offset_s: CLOCK_REALTIME minus CLOCK_MONOTONIC, in seconds; it
 * moves only when someone sets the wall clock. */
static int64_t
clock_offset_s(void)
{
	struct timespec rt, mono;

	clock_gettime(CLOCK_REALTIME, &rt);
	clock_gettime(CLOCK_MONOTONIC, &mono);
	return (int64_t)rt.tv_sec - (int64_t)mono.tv_sec;
}

/* read_file: up to cap - 1 bytes of path, NUL-terminated. */
static void
read_file(const char *path, char *buf, size_t cap)
{
	ssize_t n;
	int fd;

	buf[0] = '\0';
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return;
	n = read(fd, buf, cap - 1);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
}

static void
test_reset_host_mode_not_applied(void **state)
{
	Moat__V1__GuestRequest req = MOAT__V1__GUEST_REQUEST__INIT;
	Moat__V1__ResetAfterRestore reset =
	    MOAT__V1__RESET_AFTER_RESTORE__INIT;
	Moat__V1__GuestMessage *m;
	struct tagent t;
	char log_path[] = "/tmp/moat-test-reset-XXXXXX";
	char host_before[256], host_after[256], log[16384];
	uint8_t entropy[64];
	int64_t offset_before, offset_after;
	int log_fd, saved_stderr;

	(void)state;
	memset(entropy, 0x5a, sizeof(entropy));
	assert_int_equal(gethostname(host_before, sizeof(host_before)), 0);
	assert_string_not_equal(host_before, RESET_HOSTNAME);
	offset_before = clock_offset_s();

	/* The agent inherits stderr, where it logs: point it at a file for
	 * the agent's life. */
	log_fd = mkstemp(log_path);
	assert_true(log_fd >= 0);
	saved_stderr = dup(2);
	assert_true(saved_stderr >= 0);
	assert_int_equal(dup2(log_fd, 2), 2);
	if (tagent_start(&t, NULL, false) != 0) {
		dup2(saved_stderr, 2);
		fail_msg("the agent did not start");
	}
	dup2(saved_stderr, 2);
	close(saved_stderr);

	reset.unix_ns = RESET_UNIX_S * 1000000000LL;
	reset.entropy.data = entropy;
	reset.entropy.len = sizeof(entropy);
	reset.hostname = RESET_HOSTNAME;
	req.op_case = MOAT__V1__GUEST_REQUEST__OP_RESET;
	req.reset = &reset;
	m = tagent_call(&t, &req);
	assert_non_null(m);
	/* Answered as a guest would, so vmd's clone path goes on. */
	assert_int_equal(m->code, MOAT_OK);
	assert_int_equal(m->body_case, MOAT__V1__GUEST_MESSAGE__BODY_ACK);
	moat__v1__guest_message__free_unpacked(m, NULL);
	tagent_stop(&t);

	assert_int_equal(gethostname(host_after, sizeof(host_after)), 0);
	offset_after = clock_offset_s();
	read_file(log_path, log, sizeof(log));
	unlink(log_path);
	close(log_fd);
	/* Compared with the name asked for, not with the one before: on a
	 * shared machine another program may rename the host meanwhile. */
	if (strcmp(host_after, RESET_HOSTNAME) == 0) {
		/* Put the host back before failing: the next test and the
		 * person at the machine expect their own name. */
		(void)sethostname(host_before, strlen(host_before));
		fail_msg("the agent changed the host's hostname from %s to %s",
		    host_before, host_after);
	}
	if (llabs(offset_after - offset_before) > CLOCK_SLACK_S)
		fail_msg("the host's wall clock moved by %lld s during the "
		         "reset",
		    (long long)(offset_after - offset_before));
	if (strstr(log, "host mode: not applied") == NULL)
		fail_msg("the agent's log does not say the reset was not "
		         "applied:\n%s",
		    log);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reset_host_mode_not_applied),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
