/*
 * nng_close.c: a bounded nng_close (see moat/nng_close.h): a detached
 * thread closes the socket and signals; the caller waits on a deadline.
 * The shared state is reference counted, so whichever side finishes last
 * frees it.
 * Not for: anything but closing sockets.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "moat/nng_close.h"

struct close_job {
	pthread_mutex_t lock; /* guards done and refs */
	pthread_cond_t cv;
	nng_socket sock;
	bool done;
	int refs;
};

static void
job_put(struct close_job *j)
{
	int left;

	pthread_mutex_lock(&j->lock);
	left = --j->refs;
	pthread_mutex_unlock(&j->lock);
	if (left > 0)
		return;
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->lock);
	free(j);
}

static void *
close_main(void *arg)
{
	struct close_job *j = arg;

	nng_close(j->sock);
	pthread_mutex_lock(&j->lock);
	j->done = true;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->lock);
	job_put(j);
	return NULL;
}

bool
moat_nng_close_bounded(nng_socket sock, uint32_t wait_ms)
{
	struct close_job *j;
	pthread_condattr_t attr;
	pthread_attr_t tattr;
	pthread_t t;
	struct timespec until;
	bool done;
	int rv = 0;

	if ((j = calloc(1, sizeof(*j))) == NULL) {
		nng_close(sock);
		return true;
	}
	j->sock = sock;
	j->refs = 2;
	pthread_mutex_init(&j->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&j->cv, &attr);
	pthread_condattr_destroy(&attr);
	pthread_attr_init(&tattr);
	pthread_attr_setdetachstate(&tattr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &tattr, close_main, j) != 0) {
		pthread_attr_destroy(&tattr);
		j->refs = 1;
		job_put(j);
		nng_close(sock);
		return true;
	}
	pthread_attr_destroy(&tattr);
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += wait_ms / 1000;
	until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&j->lock);
	while (!j->done && rv != ETIMEDOUT)
		rv = pthread_cond_timedwait(&j->cv, &j->lock, &until);
	done = j->done;
	pthread_mutex_unlock(&j->lock);
	job_put(j);
	return done;
}
