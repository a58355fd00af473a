/*
 * sync.h: the thread helpers every vmd file uses: threads with a small
 * stack (vmd keeps a few per sandbox, and an idle sandbox must cost little
 * memory) and condition variables on the monotonic clock, waited on with
 * absolute deadlines in moat_rpc_now_ms() units. Not for: locks with a
 * domain meaning (each lives with what it guards).
 */
#ifndef MOAT_VMD_SYNC_H
#define MOAT_VMD_SYNC_H

#include <pthread.h>
#include <stdint.h>

#define VMD_THREAD_STACK (128u * 1024u)

/* vmd_thread_create: a joinable thread with a VMD_THREAD_STACK stack.
 * Returns 0 or an errno value. */
int vmd_thread_create(pthread_t *t, void *(*fn)(void *), void *arg)
    __attribute__((warn_unused_result));

/* vmd_cond_init: a condition variable on CLOCK_MONOTONIC. */
void vmd_cond_init(pthread_cond_t *cv);

/* vmd_cond_wait_until: waits on cv (mu held) until signalled or until the
 * monotonic time `deadline_ms`; UINT64_MAX waits without a deadline.
 * Returns 0, or ETIMEDOUT once the deadline has passed. Spurious wakeups
 * return 0: callers re-check their condition. */
int vmd_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
    uint64_t deadline_ms);

/* vmd_sleep_ms: sleeps, restarting on signals. */
void vmd_sleep_ms(uint32_t ms);

#endif
