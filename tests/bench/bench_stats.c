/*
 * bench_stats.c: the clock, percentiles and JSON summaries of
 * bench_stats.h, shared by every benchmark here.
 * Not for: anything outside tests/bench.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "bench_stats.h"

double
bench_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double
bench_host_busy_ms(void)
{
	unsigned long long v[10] = { 0 };
	FILE *f = fopen("/proc/stat", "r");
	long hz = sysconf(_SC_CLK_TCK);
	int n;

	if (f == NULL)
		return -1;
	/* cpu user nice system idle iowait irq softirq steal guest guest_nice */
	n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu",
	    &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8],
	    &v[9]);
	fclose(f);
	if (n < 8 || hz <= 0)
		return -1;
	/* Guest time is already in user; idle, iowait and steal (time the
	 * hypervisor under this machine ran something else) are left out. */
	return (double)(v[0] + v[1] + v[2] + v[5] + v[6]) * 1000.0 /
	    (double)hz;
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

	return json_pack("{s:i, s:f, s:f, s:f, s:f}", "n", (int)n, "p50_ms",
	    p50, "p95_ms", p95, "min_ms", n ? v[0] : 0.0, "max_ms",
	    n ? v[n - 1] : 0.0);
}
