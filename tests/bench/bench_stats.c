/*
 * bench_stats.c: the clock, percentiles and JSON summaries of
 * bench_stats.h, shared by every benchmark here.
 * Not for: anything outside tests/bench.
 */
#include <stdlib.h>
#include <time.h>

#include "bench_stats.h"

double
bench_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int
bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double
bench_percentile(double *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), bench_cmp_double);
	return v[(size_t)(p * (double)(n - 1) + 0.5)];
}

json_t *
bench_summary(double *v, size_t n)
{
	double p50 = bench_percentile(v, n, 0.50);
	double p95 = bench_percentile(v, n, 0.95);

	return json_pack("{s:i, s:f, s:f, s:f, s:f}", "n", (int)n,
	    "p50_ms", p50, "p95_ms", p95, "min_ms", n ? v[0] : 0.0,
	    "max_ms", n ? v[n - 1] : 0.0);
}
