/*
 * metrics.h: moat-sessiond's metrics (`--metrics ADDR`, [sessiond]
 * metrics): writes by kind and their latency (queue to durable), the
 * writer's commits and their fsync time, and at each scrape the
 * recordings kept, the write queue and the LMDB map in use (metrics.c).
 * The event calls do nothing while metrics are off.
 * Not for: the registry and the listener (moat/metrics.h).
 */
#ifndef MOAT_SESSIOND_METRICS_H
#define MOAT_SESSIOND_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "sessiond.h"

/* sessiond_metrics_start: registers sessiond's metrics and serves them
 * on `addr`; `sd` must outlive sessiond_metrics_stop. Call once, before
 * the RPC server starts. On failure returns a status with *errmsg (heap,
 * caller frees). */
int sessiond_metrics_start(struct sessiond *sd, const char *addr,
    char **errmsg) __attribute__((warn_unused_result));

/* sessiond_metrics_stop: stops the listener and frees the metrics. Safe
 * when never started. Call after the RPC server and the writer stopped. */
void sessiond_metrics_stop(void);

/* sessiond_metrics_write: a write of `kind` answered `status` after
 * `seconds` (queued, applied, committed durably). Thread-safe. */
void sessiond_metrics_write(enum sessiond_op_kind kind, int status,
    double seconds);

/* sessiond_metrics_commit: the writer committed `ops` writes in one
 * transaction (`ok` false: the commit failed) in `seconds`, its fsync
 * included. */
void sessiond_metrics_commit(size_t ops, bool ok, double seconds);

#endif
