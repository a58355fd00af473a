/*
 * moat/metrics.h: a service's metrics in the Prometheus text format 0.0.4
 * (counters, gauges and histograms with fixed buckets, each with a fixed
 * set of labels), and the small HTTP listener that serves them at GET
 * /metrics (`--metrics ADDR` on moat-vmd, moat-sessiond, moat-snapd).
 * Updates are lock-free atomics, safe from any thread; a registry's lock
 * guards only its list of metrics (registration and the scrape).
 * Figures that are cheaper to read when asked (memory in use, sandboxes
 * by state) are set by scrape hooks (moat_metrics_on_scrape).
 * Not for: what a service measures (its own files), or the gateway's
 * HTTP door (libmicrohttpd serves its /metrics with moat_metrics_write).
 */
#ifndef MOAT_METRICS_H
#define MOAT_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct moat_metrics;
struct moat_counter;
struct moat_gauge;
struct moat_histogram;
struct moat_metrics_server;

/* Latency buckets in seconds for calls of a millisecond to two minutes;
 * MOAT_METRICS_LATENCY_N of them. */
#define MOAT_METRICS_LATENCY_N 16
extern const double moat_metrics_latency_buckets[MOAT_METRICS_LATENCY_N];

/* The option every service with metrics has, for getopt_long's table,
 * and its line of --help. */
#define MOAT_METRICS_OPTION                                                   \
	{                                                                     \
		"metrics", required_argument, NULL, 0x7430                    \
	}
#define MOAT_METRICS_USAGE                                                    \
	"  --metrics ADDR       serve Prometheus metrics at "                 \
	"http://ADDR/metrics\n"                                               \
	"                       (e.g. 127.0.0.1:9101; default off)\n"

/* Labels of a metric series: up to this many name/value pairs. */
#define MOAT_METRICS_MAX_LABELS 4

/* moat_metrics_new: an empty registry; *out is the caller's
 * (moat_metrics_free). Returns 0 or MOAT_RESOURCE_EXHAUSTED. */
int moat_metrics_new(struct moat_metrics **out)
    __attribute__((warn_unused_result));

/* moat_metrics_free: the registry and every metric of it (their pointers
 * die with it). Safe on NULL. No update may run or follow. */
void moat_metrics_free(struct moat_metrics *reg);

/* moat_metrics_counter, _gauge, _histogram: the series `name` with
 * `labels` (NULL, or name, value, name, value, ..., NULL; values are
 * escaped here), made on the first call and the same pointer after.
 * Every series of one name shares its type and help (the first one's).
 * A histogram takes `n_bounds` ascending finite upper bounds (copied;
 * +Inf is added). Owned by the registry. Returns NULL on a name or label
 * that Prometheus refuses, a type that differs from the name's, bad
 * bounds (each logged: these are programmer errors) or out of memory;
 * every update function takes NULL and does nothing, so a service runs
 * on without the metric. Thread-safe. */
struct moat_counter *moat_metrics_counter(struct moat_metrics *reg,
    const char *name, const char *help, const char *const *labels);
struct moat_gauge *moat_metrics_gauge(struct moat_metrics *reg,
    const char *name, const char *help, const char *const *labels);
struct moat_histogram *moat_metrics_histogram(struct moat_metrics *reg,
    const char *name, const char *help, const char *const *labels,
    const double *bounds, size_t n_bounds);

/* Updates: atomic, from any thread, never block. */
void moat_counter_add(struct moat_counter *c, uint64_t n);
void moat_counter_inc(struct moat_counter *c);
/* moat_counter_set: for a count kept elsewhere that only grows (snapshot
 * evictions in snapram.c), copied in by a scrape hook. */
void moat_counter_set(struct moat_counter *c, uint64_t v);
uint64_t moat_counter_get(const struct moat_counter *c);
void moat_gauge_set(struct moat_gauge *g, double v);
void moat_gauge_add(struct moat_gauge *g, double delta);
double moat_gauge_get(const struct moat_gauge *g);
void moat_histogram_observe(struct moat_histogram *h, double v);
/* moat_histogram_observe_ms: `ms` milliseconds, observed in seconds. */
void moat_histogram_observe_ms(struct moat_histogram *h, uint64_t ms);
/* moat_metrics_now: CLOCK_MONOTONIC in seconds, finer than a
 * millisecond, for timing what a histogram observes. */
double moat_metrics_now(void);
/* moat_histogram_count: observations so far. */
uint64_t moat_histogram_count(const struct moat_histogram *h);

/* moat_metrics_on_scrape: `fn(ctx)` runs at each scrape before the text
 * is written, in registration order, on the scraping thread, so it can
 * set gauges from the service's state (`ctx` must outlive the
 * registry, or the listener). It must not register metrics. Returns 0
 * or MOAT_RESOURCE_EXHAUSTED. */
int moat_metrics_on_scrape(struct moat_metrics *reg, void (*fn)(void *ctx),
    void *ctx) __attribute__((warn_unused_result));

/* moat_metrics_process: `moat_<service>_uptime_seconds`,
 * `_resident_memory_bytes`, `_open_fds` and `_start_time_seconds`,
 * read from /proc/self at each scrape. Returns 0 or a status. */
int moat_metrics_process(struct moat_metrics *reg, const char *service)
    __attribute__((warn_unused_result));

/* moat_metrics_write: runs the scrape hooks, then writes every metric to
 * `f` in registration order, HELP and TYPE once per name, histograms
 * with cumulative buckets, _sum and _count. Returns 0, or an errno value
 * when `f` failed. */
int moat_metrics_write(struct moat_metrics *reg, FILE *f);

/* moat_metrics_text: moat_metrics_write into a heap string (the caller
 * frees), *len set when len is not NULL; NULL when out of memory. */
char *moat_metrics_text(struct moat_metrics *reg, size_t *len);

/* moat_metrics_escape_label: `value` as a label value is written between
 * the quotes (backslash, double quote and newline escaped) into `out`
 * (cap bytes, always NUL-terminated). Returns the length the whole
 * escaped text needs (like snprintf: truncated when >= cap). */
size_t moat_metrics_escape_label(char *out, size_t cap, const char *value);

/* moat_metrics_serve: listens on `addr` ("HOST:PORT", "[V6]:PORT" or
 * ":PORT" for every address; port 0 picks a free one) and answers GET
 * /metrics with `reg`'s text from a thread of its own; any other path is
 * 404, any other method 405, a malformed request 400. At most a few
 * connections at once, each with a 4 KiB request cap and a 10 s
 * deadline, so a slow client cannot grow it. `reg` must outlive the
 * listener. On success *out is the caller's (moat_metrics_server_stop);
 * on failure returns a status and sets *errmsg (heap, caller frees)
 * naming the address and what to do. */
int moat_metrics_serve(struct moat_metrics_server **out,
    struct moat_metrics *reg, const char *addr, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_metrics_respond: the listener's answer to one HTTP request (the
 * bytes up to the blank line after its headers, NUL-terminated at
 * request_len; 4095 bytes or more: 431), status line to body: GET or
 * HEAD /metrics 200 with `reg`'s text, other paths 404, other methods
 * 405, a malformed request line 400. *response is heap (caller frees).
 * Returns the HTTP status, or 0 when out of memory (*response NULL).
 * For the listener and the fuzz target. */
int moat_metrics_respond(struct moat_metrics *reg, const char *request,
    size_t request_len, char **response, size_t *response_len);

/* moat_metrics_server_port: the TCP port it listens on (the one picked
 * for port 0). */
uint16_t moat_metrics_server_port(const struct moat_metrics_server *srv);

/* moat_metrics_server_url: "http://HOST:PORT/metrics" with the port it
 * listens on, for the log. Heap (caller frees); NULL: out of memory. */
char *moat_metrics_server_url(const struct moat_metrics_server *srv);

/* moat_metrics_start: what a service does to serve `reg` at `addr`: adds
 * `scrape` (may be NULL) as its scrape hook with `ctx`, starts the
 * listener (moat_metrics_serve) and logs "WHO: metrics at URL". On
 * failure `reg` is left to the caller to free; errors as
 * moat_metrics_serve. */
int moat_metrics_start(struct moat_metrics_server **out,
    struct moat_metrics *reg, void (*scrape)(void *ctx), void *ctx,
    const char *addr, const char *who, char **errmsg)
    __attribute__((warn_unused_result));

/* moat_metrics_server_stop: closes the listener and its connections,
 * joins its thread and frees it. Safe on NULL. */
void moat_metrics_server_stop(struct moat_metrics_server *srv);

#endif
