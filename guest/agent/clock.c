/*
 * clock.c: what the agent does after its VM was restored from a snapshot
 * or cloned from one (the `reset` request): set the wall clock to the
 * host's (the guest's clock stood still while the snapshot sat on disk),
 * mix host random bytes into the kernel's pool (every clone of one
 * snapshot starts with the same RNG state: without this they would hand
 * out the same "random" numbers), reseed the code contexts' random
 * generators when asked (code.c: a new sandbox's contexts must not draw
 * their siblings' numbers), and take the clone's own hostname. In
 * host mode (not PID 1: the agent runs as a process of the host, for
 * tests) none of that is done: the clock, RNG and hostname are the
 * host's, so the request is checked, logged with "host mode: not
 * applied" and acknowledged as a guest would. Not for: the link to the
 * host (link.c) or exec state (exec.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include <linux/random.h>

#include "agent.h"
#include "moat/log.h"
#include "moat/status.h"
#include "moat/util.h"

#define RESET_ENTROPY_MIN 32u
#define RESET_ENTROPY_MAX 512u
#define RESET_HOSTNAME_MAX 64u

/* Credits `len` host bytes to the kernel pool (RNDADDENTROPY needs
 * CAP_SYS_ADMIN: the agent is PID 1, root), then reseeds the crng from
 * it at once: a crng that is already ready reseeds only on its own
 * schedule (up to a minute), and until then every clone of a snapshot
 * would still read the same bytes from /dev/urandom. Returns 0 or an
 * errno. */
static int
clock_reseed(const uint8_t *bytes, size_t len)
{
	struct rand_pool_info *info;
	int fd, rv = 0;

	if ((info = calloc(1, sizeof(*info) + len)) == NULL)
		return ENOMEM;
	info->entropy_count = (int)(len * 8);
	info->buf_size = (int)len;
	memcpy(info->buf, bytes, len);
	if ((fd = open("/dev/urandom", O_RDWR | O_CLOEXEC)) < 0) {
		rv = errno;
	} else {
		if (ioctl(fd, RNDADDENTROPY, info) != 0)
			rv = errno;
		else if (ioctl(fd, RNDRESEEDCRNG) != 0 && errno != ENOTTY &&
		    errno != EINVAL)
			rv = errno; /* ENOTTY, EINVAL: a kernel before 4.17 */
		close(fd);
	}
	explicit_bzero(info, sizeof(*info) + len);
	free(info);
	return rv;
}

int
agent_reset_after_restore(struct agent *a, const Moat__V1__GuestRequest *req,
    char **why)
{
	const Moat__V1__ResetAfterRestore *r = req->reset;
	struct timespec ts;
	unsigned reseeded = 0;
	size_t hlen;
	int err;

	if (r->entropy.len < RESET_ENTROPY_MIN ||
	    r->entropy.len > RESET_ENTROPY_MAX) {
		*why = moat_asprintf("%zu bytes of entropy given: send %u to "
		                     "%u",
		    r->entropy.len, RESET_ENTROPY_MIN, RESET_ENTROPY_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if (r->unix_ns <= 0) {
		*why = moat_asprintf("unix_ns %lld is not a wall clock time",
		    (long long)r->unix_ns);
		return MOAT_INVALID_ARGUMENT;
	}
	hlen = strlen(r->hostname);
	if (hlen > RESET_HOSTNAME_MAX) {
		*why = moat_asprintf("hostname of %zu bytes: at most %u", hlen,
		    RESET_HOSTNAME_MAX);
		return MOAT_INVALID_ARGUMENT;
	}
	if (!a->pid1) {
		/* A test's reset must never set the host's clock or name, nor
		 * feed its RNG: answer what a guest would, and say so. The
		 * code contexts are the agent's own children: they are
		 * reseeded as in a guest. */
		moat_info(req->id,
		    "reset after restore: host mode: not "
		    "applied (clock %lld.%09lld, %zu bytes of entropy%s%s)",
		    (long long)(r->unix_ns / 1000000000),
		    (long long)(r->unix_ns % 1000000000), r->entropy.len,
		    hlen ? ", hostname " : "", hlen ? r->hostname : "");
		if (r->reseed)
			(void)agent_code_reseed(a, req->id);
		agent_send_ack(a, req->id);
		return MOAT_OK;
	}
	/* The restored sandbox's egress, which its origin's need not be:
	 * first, so a refusal leaves the clock and name untouched. */
	if ((err = agent_egress_set(a, req->id, r->egress && r->egress->on,
	         why)) != MOAT_OK)
		return err;
	/* The RNG first: a failure here must not leave a clone running with
	 * its siblings' randomness, so it is an error, not a warning. */
	if ((err = clock_reseed(r->entropy.data, r->entropy.len)) != 0) {
		*why = moat_asprintf("cannot add entropy to /dev/urandom: %s",
		    strerror(err));
		return moat_status_from_errno(err);
	}
	ts.tv_sec = (time_t)(r->unix_ns / 1000000000);
	ts.tv_nsec = (long)(r->unix_ns % 1000000000);
	if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
		err = errno;
		*why =
		    moat_asprintf("cannot set the clock: %s", strerror(err));
		return moat_status_from_errno(err);
	}
	if (hlen > 0 && sethostname(r->hostname, hlen) != 0) {
		err = errno;
		*why = moat_asprintf("cannot set hostname %s: %s", r->hostname,
		    strerror(err));
		return moat_status_from_errno(err);
	}
	/* After the entropy: the contexts draw their new seeds from the
	 * pool this sandbox alone has now. */
	if (r->reseed)
		reseeded = agent_code_reseed(a, req->id);
	moat_info(req->id,
	    "reset after restore: clock set, %zu bytes of "
	    "entropy added%s%s, %u code contexts reseeded%s",
	    r->entropy.len, hlen ? ", hostname " : "", hlen ? r->hostname : "",
	    reseeded, r->reseed ? "" : " (kept: a restore in place)");
	agent_send_ack(a, req->id);
	return MOAT_OK;
}
