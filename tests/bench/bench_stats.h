/*
 * bench_stats.h: what every benchmark here measures with: a monotonic
 * clock in ms, percentiles of a sample, and the JSON summary each result
 * file carries per measure ({n, p50_ms, p95_ms, min_ms, max_ms}).
 * Not for: pass/fail tests (timings never decide a test).
 */
#ifndef MOAT_BENCH_STATS_H
#define MOAT_BENCH_STATS_H

#include <jansson.h>
#include <stddef.h>

/* bench_now_ms: CLOCK_MONOTONIC in ms, sub-millisecond detail kept. */
double bench_now_ms(void);

/* bench_host_busy_ms: the CPU time this host has spent not idle since
 * boot, summed over its CPUs, in ms (from /proc/stat; -1 when it cannot
 * be read). The difference across a call is the CPU the call cost the
 * host, whichever processes spent it (VMMs, services, kernel threads). */
double bench_host_busy_ms(void);

/* bench_cmp_double: qsort order of doubles, ascending. */
int bench_cmp_double(const void *a, const void *b);

/* bench_percentile: sorts v in place (ascending) and returns its p-th
 * quantile (p in 0..1, nearest rank); 0 for an empty sample. */
double bench_percentile(double *v, size_t n, double p);

/* bench_summary: sorts v and returns a new JSON object {n, p50_ms,
 * p95_ms, min_ms, max_ms} (the caller owns the reference; NULL on
 * allocation failure). */
json_t *bench_summary(double *v, size_t n);

#endif
