/*
 * sync.c: small-stack threads and monotonic condition waits for vmd.
 * Not for: anything that knows about sandboxes.
 */
#include <errno.h>
#include <time.h>

#include "moat/rpc.h"
#include "sync.h"

int
vmd_thread_create(pthread_t *t, void *(*fn)(void *), void *arg)
{
	pthread_attr_t attr;
	int rv;

	if ((rv = pthread_attr_init(&attr)) != 0)
		return rv;
	pthread_attr_setstacksize(&attr, VMD_THREAD_STACK);
	rv = pthread_create(t, &attr, fn, arg);
	pthread_attr_destroy(&attr);
	return rv;
}

void
vmd_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t attr;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &attr);
	pthread_condattr_destroy(&attr);
}

int
vmd_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
    uint64_t deadline_ms)
{
	struct timespec ts;

	if (deadline_ms == UINT64_MAX) {
		pthread_cond_wait(cv, mu);
		return 0;
	}
	if (moat_rpc_now_ms() >= deadline_ms)
		return ETIMEDOUT;
	ts.tv_sec = (time_t)(deadline_ms / 1000);
	ts.tv_nsec = (long)(deadline_ms % 1000) * 1000000L;
	if (pthread_cond_timedwait(cv, mu, &ts) == ETIMEDOUT)
		return ETIMEDOUT;
	return 0;
}

void
vmd_sleep_ms(uint32_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
		.tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}
