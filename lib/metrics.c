/*
 * metrics.c: the registry of moat/metrics.h: counters, gauges and
 * histograms, their atomic updates, and the Prometheus text (format
 * 0.0.4) a scrape reads, with the process figures every service shows.
 * Families keep their registration order, so a scrape reads the same
 * way each time. Not for: serving the text (metrics_server.c) or what
 * a service measures.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/util.h"

#define MAX_HOOKS 8
#define MAX_BUCKETS 64

const double moat_metrics_latency_buckets[MOAT_METRICS_LATENCY_N] = {
	0.001,
	0.0025,
	0.005,
	0.01,
	0.025,
	0.05,
	0.1,
	0.25,
	0.5,
	1,
	2.5,
	5,
	10,
	30,
	60,
	120,
};

enum kind { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM };

static const char *const kind_names[] = { "counter", "gauge", "histogram" };

struct moat_counter {
	uint64_t value; /* atomic */
};

struct moat_gauge {
	uint64_t bits; /* atomic: a double's bits */
};

struct moat_histogram {
	size_t n_bounds;
	double *bounds;    /* ascending, finite */
	uint64_t *counts;  /* n_bounds + 1 (the last: above every bound),
	                     not cumulative; atomic */
	uint64_t sum_bits; /* atomic: a double's bits */
};

struct series {
	struct series *next;
	char *labels; /* `a="x",b="y"`, escaped; "" without labels */
	struct moat_counter counter;
	struct moat_gauge gauge;
	struct moat_histogram hist;
};

struct family {
	struct family *next;
	char *name;
	char *help;
	enum kind kind;
	struct series *series, *last;
};

struct hook {
	void (*fn)(void *ctx);
	void *ctx;
};

struct process;

struct moat_metrics {
	pthread_mutex_t lock; /* guards families and hooks */
	struct family *families, *last;
	struct hook hooks[MAX_HOOKS];
	size_t n_hooks;
	/* One scrape at a time runs the hooks, so a hook may compute its
	 * figures and set them without racing another scrape. */
	pthread_mutex_t scrape_lock;
	struct process *process; /* moat_metrics_process's; owned */
};

/* ---- atomics over doubles ---- */

static uint64_t
bits_of(double v)
{
	uint64_t b;

	memcpy(&b, &v, sizeof(b));
	return b;
}

static double
double_of(uint64_t b)
{
	double v;

	memcpy(&v, &b, sizeof(v));
	return v;
}

static void
atomic_add_double(uint64_t *bits, double delta)
{
	uint64_t old = __atomic_load_n(bits, __ATOMIC_RELAXED), next;

	do {
		next = bits_of(double_of(old) + delta);
	} while (!__atomic_compare_exchange_n(bits, &old, next, true,
	    __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

/* ---- registry ---- */

int
moat_metrics_new(struct moat_metrics **out)
{
	struct moat_metrics *reg = calloc(1, sizeof(*reg));

	*out = NULL;
	if (reg == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	pthread_mutex_init(&reg->lock, NULL);
	pthread_mutex_init(&reg->scrape_lock, NULL);
	*out = reg;
	return MOAT_OK;
}

void
moat_metrics_free(struct moat_metrics *reg)
{
	struct family *f, *fn;
	struct series *s, *sn;

	if (reg == NULL)
		return;
	for (f = reg->families; f != NULL; f = fn) {
		fn = f->next;
		for (s = f->series; s != NULL; s = sn) {
			sn = s->next;
			free(s->labels);
			free(s->hist.bounds);
			free(s->hist.counts);
			free(s);
		}
		free(f->name);
		free(f->help);
		free(f);
	}
	pthread_mutex_destroy(&reg->lock);
	pthread_mutex_destroy(&reg->scrape_lock);
	free(reg->process);
	free(reg);
}

static bool
valid_name(const char *name, bool colon)
{
	if (name == NULL || name[0] == '\0' ||
	    (name[0] >= '0' && name[0] <= '9'))
		return false;
	for (const char *p = name; *p != '\0'; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		        (*p >= '0' && *p <= '9') || *p == '_' ||
		        (colon && *p == ':')))
			return false;
	return true;
}

size_t
moat_metrics_escape_label(char *out, size_t cap, const char *value)
{
	size_t n = 0;

	for (const char *p = value ? value : ""; *p != '\0'; p++) {
		const char *esc = *p == '\\' ? "\\\\" :
		    *p == '"'                ? "\\\"" :
		    *p == '\n'               ? "\\n" :
		                               NULL;
		char one[2] = { *p, '\0' };

		for (const char *e = esc ? esc : one; *e != '\0'; e++, n++)
			if (n + 1 < cap)
				out[n] = *e;
	}
	if (cap > 0)
		out[n < cap ? n : cap - 1] = '\0';
	return n;
}

/* render_labels: `labels` as `a="x",b="y"` (heap); NULL on a bad label
 * name, too many labels, "le" (histograms own it), or out of memory. */
static char *
render_labels(const char *metric, const char *const *labels)
{
	char *text = NULL;
	size_t len = 0, i;
	FILE *f;

	if ((f = open_memstream(&text, &len)) == NULL)
		return NULL;
	for (i = 0; labels != NULL && labels[i] != NULL; i += 2) {
		const char *name = labels[i], *value = labels[i + 1];
		size_t need = moat_metrics_escape_label(NULL, 0, value);
		char *esc = malloc(need + 1);

		if (i / 2 >= MOAT_METRICS_MAX_LABELS || value == NULL ||
		    !valid_name(name, false) || strcmp(name, "le") == 0 ||
		    strncmp(name, "__", 2) == 0 || esc == NULL) {
			moat_error(0,
			    "metric %s: label %zu (\"%s\") is refused: "
			    "at most %d labels named [a-zA-Z_][a-zA-Z0-9_]*, "
			    "not le or __*, each with a value",
			    metric, i / 2, name, MOAT_METRICS_MAX_LABELS);
			free(esc);
			fclose(f);
			free(text);
			return NULL;
		}
		moat_metrics_escape_label(esc, need + 1, value);
		fprintf(f, "%s%s=\"%s\"", i ? "," : "", name, esc);
		free(esc);
	}
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

static bool
bounds_ok(const char *name, const double *bounds, size_t n)
{
	bool ok = n >= 1 && n <= MAX_BUCKETS && bounds != NULL;

	for (size_t i = 0; ok && i < n; i++)
		ok = isfinite(bounds[i]) &&
		    (i == 0 || bounds[i] > bounds[i - 1]);
	if (!ok)
		moat_error(0,
		    "histogram %s: its bounds must be 1 to %d finite "
		    "numbers in ascending order",
		    name, MAX_BUCKETS);
	return ok;
}

/* family_get: the family `name` of `kind` (made when new); NULL on a
 * kind that differs from the name's, or out of memory. Under reg->lock. */
static struct family *
family_get(struct moat_metrics *reg, const char *name, const char *help,
    enum kind kind)
{
	struct family *f;

	for (f = reg->families; f != NULL; f = f->next)
		if (strcmp(f->name, name) == 0)
			break;
	if (f != NULL) {
		if (f->kind == kind)
			return f;
		moat_error(0, "metric %s is a %s, not a %s", name,
		    kind_names[f->kind], kind_names[kind]);
		return NULL;
	}
	if ((f = calloc(1, sizeof(*f))) == NULL ||
	    (f->name = strdup(name)) == NULL ||
	    (f->help = strdup(help ? help : "")) == NULL) {
		if (f != NULL)
			free(f->name);
		free(f);
		return NULL;
	}
	f->kind = kind;
	if (reg->last != NULL)
		reg->last->next = f;
	else
		reg->families = f;
	reg->last = f;
	return f;
}

/* series_get: the series of `name` with `labels`, made when new. */
static struct series *
series_get(struct moat_metrics *reg, const char *name, const char *help,
    const char *const *labels, enum kind kind, const double *bounds,
    size_t n_bounds)
{
	struct series *s = NULL;
	struct family *f;
	char *text;

	if (reg == NULL)
		return NULL;
	if (!valid_name(name, true)) {
		moat_error(0,
		    "metric name \"%s\" is refused: "
		    "[a-zA-Z_:][a-zA-Z0-9_:]*",
		    name ? name : "(null)");
		return NULL;
	}
	if (kind == KIND_HISTOGRAM && !bounds_ok(name, bounds, n_bounds))
		return NULL;
	if ((text = render_labels(name, labels)) == NULL)
		return NULL;
	pthread_mutex_lock(&reg->lock);
	if ((f = family_get(reg, name, help, kind)) == NULL)
		goto out;
	for (s = f->series; s != NULL; s = s->next)
		if (strcmp(s->labels, text) == 0)
			goto out;
	if ((s = calloc(1, sizeof(*s))) == NULL)
		goto out;
	if (kind == KIND_HISTOGRAM) {
		s->hist.n_bounds = n_bounds;
		s->hist.bounds = malloc(n_bounds * sizeof(double));
		s->hist.counts = calloc(n_bounds + 1, sizeof(uint64_t));
		if (s->hist.bounds == NULL || s->hist.counts == NULL) {
			free(s->hist.bounds);
			free(s->hist.counts);
			free(s);
			s = NULL;
			goto out;
		}
		memcpy(s->hist.bounds, bounds, n_bounds * sizeof(double));
	}
	s->labels = text;
	text = NULL;
	if (f->last != NULL)
		f->last->next = s;
	else
		f->series = s;
	f->last = s;
out:
	pthread_mutex_unlock(&reg->lock);
	free(text);
	return s;
}

struct moat_counter *
moat_metrics_counter(struct moat_metrics *reg, const char *name,
    const char *help, const char *const *labels)
{
	struct series *s =
	    series_get(reg, name, help, labels, KIND_COUNTER, NULL, 0);

	return s ? &s->counter : NULL;
}

struct moat_gauge *
moat_metrics_gauge(struct moat_metrics *reg, const char *name,
    const char *help, const char *const *labels)
{
	struct series *s =
	    series_get(reg, name, help, labels, KIND_GAUGE, NULL, 0);

	return s ? &s->gauge : NULL;
}

struct moat_histogram *
moat_metrics_histogram(struct moat_metrics *reg, const char *name,
    const char *help, const char *const *labels, const double *bounds,
    size_t n_bounds)
{
	struct series *s = series_get(reg, name, help, labels, KIND_HISTOGRAM,
	    bounds, n_bounds);

	return s ? &s->hist : NULL;
}

int
moat_metrics_on_scrape(struct moat_metrics *reg, void (*fn)(void *ctx),
    void *ctx)
{
	int rv = MOAT_OK;

	pthread_mutex_lock(&reg->lock);
	if (reg->n_hooks == MAX_HOOKS)
		rv = MOAT_RESOURCE_EXHAUSTED;
	else
		reg->hooks[reg->n_hooks++] = (struct hook){ fn, ctx };
	pthread_mutex_unlock(&reg->lock);
	return rv;
}

/* ---- updates ---- */

void
moat_counter_add(struct moat_counter *c, uint64_t n)
{
	if (c != NULL)
		__atomic_fetch_add(&c->value, n, __ATOMIC_RELAXED);
}

void
moat_counter_inc(struct moat_counter *c)
{
	moat_counter_add(c, 1);
}

void
moat_counter_set(struct moat_counter *c, uint64_t v)
{
	if (c != NULL)
		__atomic_store_n(&c->value, v, __ATOMIC_RELAXED);
}

uint64_t
moat_counter_get(const struct moat_counter *c)
{
	return c ? __atomic_load_n(&c->value, __ATOMIC_RELAXED) : 0;
}

void
moat_gauge_set(struct moat_gauge *g, double v)
{
	if (g != NULL)
		__atomic_store_n(&g->bits, bits_of(v), __ATOMIC_RELAXED);
}

void
moat_gauge_add(struct moat_gauge *g, double delta)
{
	if (g != NULL)
		atomic_add_double(&g->bits, delta);
}

double
moat_gauge_get(const struct moat_gauge *g)
{
	return g ? double_of(__atomic_load_n(&g->bits, __ATOMIC_RELAXED)) : 0;
}

void
moat_histogram_observe(struct moat_histogram *h, double v)
{
	size_t b = 0;

	if (h == NULL || isnan(v))
		return;
	while (b < h->n_bounds && v > h->bounds[b])
		b++;
	/* The sum first: a scrape that sees the count sees the sum. */
	atomic_add_double(&h->sum_bits, v);
	__atomic_fetch_add(&h->counts[b], 1, __ATOMIC_RELEASE);
}

void
moat_histogram_observe_ms(struct moat_histogram *h, uint64_t ms)
{
	moat_histogram_observe(h, (double)ms / 1000.0);
}

double
moat_metrics_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint64_t
moat_histogram_count(const struct moat_histogram *h)
{
	uint64_t n = 0;

	for (size_t b = 0; h != NULL && b <= h->n_bounds; b++)
		n += __atomic_load_n(&h->counts[b], __ATOMIC_ACQUIRE);
	return n;
}

/* ---- the text ---- */

/* format_number: `v` the shortest way that reads back the same. */
static void
format_number(char out[32], double v)
{
	if (isnan(v)) {
		strcpy(out, "NaN");
		return;
	}
	if (isinf(v)) {
		strcpy(out, v > 0 ? "+Inf" : "-Inf");
		return;
	}
	snprintf(out, 32, "%.15g", v);
	if (strtod(out, NULL) != v)
		snprintf(out, 32, "%.17g", v);
}

/* write_help: `help` with backslash and newline escaped, as the format
 * wants in a HELP line. */
static void
write_help(FILE *f, const struct family *fam)
{
	fprintf(f, "# HELP %s ", fam->name);
	for (const char *p = fam->help; *p != '\0'; p++)
		if (*p == '\\')
			fputs("\\\\", f);
		else if (*p == '\n')
			fputs("\\n", f);
		else
			fputc(*p, f);
	fprintf(f, "\n# TYPE %s %s\n", fam->name, kind_names[fam->kind]);
}

static void
write_histogram(FILE *f, const char *name, const struct series *s)
{
	const struct moat_histogram *h = &s->hist;
	const char *sep = s->labels[0] ? "," : "";
	uint64_t cum = 0;
	char num[32];

	/* Counts read once each, the cumulative sums from those reads: the
	 * +Inf bucket and _count always agree. */
	for (size_t b = 0; b <= h->n_bounds; b++) {
		cum += __atomic_load_n(&h->counts[b], __ATOMIC_ACQUIRE);
		if (b < h->n_bounds)
			format_number(num, h->bounds[b]);
		else
			strcpy(num, "+Inf");
		fprintf(f, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, s->labels,
		    sep, num, (unsigned long long)cum);
	}
	format_number(num,
	    double_of(__atomic_load_n(&h->sum_bits, __ATOMIC_RELAXED)));
	if (s->labels[0] != '\0') {
		fprintf(f, "%s_sum{%s} %s\n", name, s->labels, num);
		fprintf(f, "%s_count{%s} %llu\n", name, s->labels,
		    (unsigned long long)cum);
	} else {
		fprintf(f, "%s_sum %s\n%s_count %llu\n", name, num, name,
		    (unsigned long long)cum);
	}
}

static void
write_series(FILE *f, const struct family *fam, const struct series *s)
{
	char num[32];

	if (fam->kind == KIND_HISTOGRAM) {
		write_histogram(f, fam->name, s);
		return;
	}
	if (fam->kind == KIND_COUNTER)
		snprintf(num, sizeof(num), "%llu",
		    (unsigned long long)moat_counter_get(&s->counter));
	else
		format_number(num, moat_gauge_get(&s->gauge));
	if (s->labels[0] != '\0')
		fprintf(f, "%s{%s} %s\n", fam->name, s->labels, num);
	else
		fprintf(f, "%s %s\n", fam->name, num);
}

int
moat_metrics_write(struct moat_metrics *reg, FILE *f)
{
	struct hook hooks[MAX_HOOKS];
	size_t n_hooks;

	pthread_mutex_lock(&reg->scrape_lock);
	pthread_mutex_lock(&reg->lock);
	n_hooks = reg->n_hooks;
	memcpy(hooks, reg->hooks, sizeof(hooks));
	pthread_mutex_unlock(&reg->lock);
	/* Outside reg->lock: a hook takes its service's locks. */
	for (size_t i = 0; i < n_hooks; i++)
		hooks[i].fn(hooks[i].ctx);
	pthread_mutex_lock(&reg->lock);
	for (const struct family *fam = reg->families; fam; fam = fam->next) {
		if (fam->series == NULL)
			continue;
		write_help(f, fam);
		for (const struct series *s = fam->series; s; s = s->next)
			write_series(f, fam, s);
	}
	pthread_mutex_unlock(&reg->lock);
	pthread_mutex_unlock(&reg->scrape_lock);
	return ferror(f) ? EIO : 0;
}

char *
moat_metrics_text(struct moat_metrics *reg, size_t *len)
{
	size_t n = 0;
	char *text = NULL;
	FILE *f = open_memstream(&text, &n);
	int err;

	if (f == NULL)
		return NULL;
	err = moat_metrics_write(reg, f);
	if (fclose(f) != 0 || err != 0) {
		free(text);
		return NULL;
	}
	if (len != NULL)
		*len = n;
	return text;
}

/* ---- the process ---- */

struct process {
	struct moat_gauge *uptime, *rss, *fds, *start;
	struct timespec started; /* monotonic */
};

static uint64_t
resident_bytes(void)
{
	unsigned long long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f == NULL)
		return 0;
	if (fscanf(f, "%llu %llu", &size, &resident) != 2)
		resident = 0;
	fclose(f);
	return resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

static unsigned
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	unsigned n = 0;

	while (d != NULL && (e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	if (d != NULL) {
		closedir(d);
		n--; /* the directory's own descriptor */
	}
	return n;
}

static void
process_scrape(void *ctx)
{
	struct process *p = ctx;
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	moat_gauge_set(p->uptime,
	    (double)(now.tv_sec - p->started.tv_sec) +
	        (double)(now.tv_nsec - p->started.tv_nsec) / 1e9);
	moat_gauge_set(p->rss, (double)resident_bytes());
	moat_gauge_set(p->fds, (double)open_fds());
}

int
moat_metrics_process(struct moat_metrics *reg, const char *service)
{
	struct process *proc;
	struct timespec wall;
	char name[128];

	if (reg->process != NULL)
		return MOAT_ALREADY_EXISTS;
	if ((proc = reg->process = calloc(1, sizeof(*proc))) == NULL)
		return MOAT_RESOURCE_EXHAUSTED;
	clock_gettime(CLOCK_MONOTONIC, &proc->started);
	clock_gettime(CLOCK_REALTIME, &wall);
#define PROCESS_GAUGE(field, suffix, help)                                    \
	snprintf(name, sizeof(name), "moat_%s_%s", service, suffix);          \
	if ((proc->field = moat_metrics_gauge(reg, name, help, NULL)) ==      \
	    NULL)                                                             \
		return MOAT_INVALID_ARGUMENT;
	PROCESS_GAUGE(uptime, "uptime_seconds", "Seconds since it started.")
	PROCESS_GAUGE(start, "start_time_seconds",
	    "When it started, in seconds since the Unix epoch.")
	PROCESS_GAUGE(rss, "resident_memory_bytes",
	    "Its resident memory (RSS).")
	PROCESS_GAUGE(fds, "open_fds", "Its open file descriptors.")
#undef PROCESS_GAUGE
	moat_gauge_set(proc->start,
	    (double)wall.tv_sec + (double)wall.tv_nsec / 1e9);
	return moat_metrics_on_scrape(reg, process_scrape, proc);
}
