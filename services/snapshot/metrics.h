/*
 * metrics.h: moat-snapd's metrics (`--metrics ADDR`, [snapd] metrics):
 * chunk bytes in and out, PutChunks and GetChunks latency, and at each
 * scrape the stored and logical bytes of every tenant together (the
 * dedup ratio) and the LMDB map in use (metrics.c). The event calls do
 * nothing while metrics are off.
 * Not for: the registry and the listener (moat/metrics.h).
 */
#ifndef MOAT_SNAPD_METRICS_H
#define MOAT_SNAPD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "snapd.h"

/* snapd_metrics_start: registers snapd's metrics and serves them on
 * `addr`; `sd` must outlive snapd_metrics_stop. Call once, before the
 * RPC server starts. On failure returns a status with *errmsg (heap,
 * caller frees). */
int snapd_metrics_start(struct snapd *sd, const char *addr, char **errmsg)
    __attribute__((warn_unused_result));

/* snapd_metrics_stop: stops the listener and frees the metrics. Safe
 * when never started. Call after the RPC server stopped. */
void snapd_metrics_stop(void);

/* snapd_metrics_put: a PutChunks answered `status` after `seconds`:
 * `received` chunks of `received_bytes`, of which `stored` were new
 * (`stored_bytes`). Thread-safe. */
void snapd_metrics_put(int status, double seconds, size_t received,
    uint64_t received_bytes, size_t stored, uint64_t stored_bytes);

/* snapd_metrics_get: a GetChunks answered `status` after `seconds`,
 * sending `chunks` chunks of `bytes`. Thread-safe. */
void snapd_metrics_get(int status, double seconds, size_t chunks,
    uint64_t bytes);

#endif
