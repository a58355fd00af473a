/*
 * bench_sessiond.c: the durable AppendStep rate of moat-sessiond. Starts
 * the real binary in a fresh directory on the disk under test, then for
 * each number of concurrent writers (each recording its own session, as
 * sandboxes do; 16 is the figure the goal names) appends small steps for
 * a few seconds and records steps/s and the latency of each append. It
 * also times a bare write + fdatasync in the same directory: an LMDB
 * commit takes two of them, so W synchronous writers cannot exceed
 * W / (2 x fdatasync) appends/s however the server batches; and it runs
 * 16 threads of Health calls, the RPC layer's own ceiling on this machine
 * at this moment (the CPU, not the disk, is often the limit). Writes
 * JSON; asserts nothing about time.
 * Usage: moat-bench-sessiond [OUT.json] [SECONDS] [DIR] [SESSIOND]
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moat/rpc.h"
#include "moat/util.h"
#include "session.pb-c.h"

#define SVC "moat.v1.Session"
#define TENANT "bench"
#define MAX_WRITERS 128
#define MAX_SAMPLES 200000

static const int writer_counts[] = { 1, 4, 16, 64, 128 };

struct writer {
	struct moat_rpc_client *client;
	char *session;
	double stop_at;
	double *lat; /* ms of each append */
	size_t n;
	size_t cap;
	int failures;
	bool health; /* Health calls: the RPC layer alone */
};

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double
pct(const double *v, size_t n, double p)
{
	return n ? v[(size_t)(p * (double)(n - 1) + 0.5)] : 0;
}

static void
die(const char *what, const char *msg)
{
	fprintf(stderr, "bench_sessiond: %s: %s\n", what, msg ? msg : "");
	exit(1);
}

/* fsync_ms: the mean time of a 4 KiB write + fdatasync in dir. */
static double
fsync_ms(const char *dir)
{
	char *path = moat_asprintf("%s/fsync.probe", dir);
	char block[4096];
	int fd = open(path, O_CREAT | O_WRONLY, 0600);
	double t0;
	int n = 200;

	if (fd < 0)
		die("fsync probe", strerror(errno));
	memset(block, 'x', sizeof(block));
	t0 = now_ms();
	for (int i = 0; i < n; i++)
		if (pwrite(fd, block, sizeof(block), (i % 16) * 4096) < 0 ||
		    fdatasync(fd) != 0)
			die("fsync probe", strerror(errno));
	t0 = (now_ms() - t0) / n;
	close(fd);
	unlink(path);
	free(path);
	return t0;
}

/* writer_totals: sessiond logs its writes and commits when it stops. */
static void
writer_totals(const char *log, unsigned long long *writes,
    unsigned long long *commits)
{
	char line[1024];
	const char *p;
	FILE *f = fopen(log, "r");

	while (f != NULL && fgets(line, sizeof(line), f) != NULL)
		if ((p = strstr(line, "writer stopped after ")) != NULL)
			sscanf(p, "writer stopped after %llu writes in %llu",
			    writes, commits);
	if (f != NULL)
		fclose(f);
}

static char *
create_session(struct moat_rpc_client *c)
{
	Moat__V1__CreateSessionRequest req =
	    MOAT__V1__CREATE_SESSION_REQUEST__INIT;
	ProtobufCMessage *reply;
	char *errmsg = NULL, *id;

	req.tenant = (char *)TENANT;
	req.sandbox_id = (char *)"sbx-bench";
	if (moat_rpc_call(c, SVC, "CreateSession", &req.base,
	        &moat__v1__session_info__descriptor, &reply, NULL,
	        &errmsg) != MOAT_OK)
		die("CreateSession", errmsg);
	id = strdup(((Moat__V1__SessionInfo *)reply)->id);
	protobuf_c_message_free_unpacked(reply, NULL);
	return id;
}

static void *
writer_main(void *arg)
{
	struct writer *w = arg;
	Moat__V1__AppendStepRequest req = MOAT__V1__APPEND_STEP_REQUEST__INIT;
	Moat__V1__Step step = MOAT__V1__STEP__INIT;
	Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
	char out[512];

	memset(out, 'o', sizeof(out));
	req.tenant = (char *)TENANT;
	req.session_id = w->session;
	req.step = &step;
	step.kind = MOAT__V1__STEP_KIND__STEP_KIND_EXEC;
	step.input = (char *)"python3 -c 'print(1)'";
	step.stdout.data = (uint8_t *)out;
	step.stdout.len = sizeof(out);
	while (now_ms() < w->stop_at) {
		ProtobufCMessage *reply = NULL;
		char *errmsg = NULL;
		double t0 = now_ms();

		if ((w->health ?
		            moat_rpc_call(w->client, SVC, "Health", &hreq.base,
		                &moat__v1__health_reply__descriptor, &reply,
		                NULL, &errmsg) :
		            moat_rpc_call(w->client, SVC, "AppendStep",
		                &req.base,
		                &moat__v1__append_step_reply__descriptor,
		                &reply, NULL, &errmsg)) != MOAT_OK) {
			w->failures++;
			free(errmsg);
			continue;
		}
		protobuf_c_message_free_unpacked(reply, NULL);
		if (w->n < w->cap)
			w->lat[w->n++] = now_ms() - t0;
	}
	return NULL;
}

/* run: `n` writers for `seconds` (Health callers when `health`);
 * returns the JSON of the round. */
static json_t *
run(struct moat_rpc_client *c, int n, double seconds, bool health)
{
	static struct writer ws[MAX_WRITERS];
	pthread_t th[MAX_WRITERS];
	size_t total = 0, k = 0;
	int failures = 0;
	double t0, elapsed, *all;
	json_t *j;

	for (int i = 0; i < n; i++) {
		ws[i] = (struct writer){ .client = c,
			.session = create_session(c),
			.health = health,
			.cap = MAX_SAMPLES / (size_t)n };
		ws[i].lat = malloc(ws[i].cap * sizeof(double));
	}
	t0 = now_ms();
	for (int i = 0; i < n; i++) {
		ws[i].stop_at = t0 + seconds * 1e3;
		pthread_create(&th[i], NULL, writer_main, &ws[i]);
	}
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	elapsed = (now_ms() - t0) / 1e3;
	for (int i = 0; i < n; i++) {
		total += ws[i].n;
		failures += ws[i].failures;
	}
	all = malloc((total ? total : 1) * sizeof(double));
	for (int i = 0; i < n; i++) {
		memcpy(all + k, ws[i].lat, ws[i].n * sizeof(double));
		k += ws[i].n;
		free(ws[i].lat);
		free(ws[i].session);
	}
	qsort(all, total, sizeof(double), cmp_double);
	j = json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:i}", "writers", n,
	    "calls", (int)total, "seconds", elapsed, "calls_per_s",
	    (double)total / elapsed, "p50_ms", pct(all, total, 0.50), "p95_ms",
	    pct(all, total, 0.95), "failures", failures);
	fprintf(stderr,
	    "%3d %s: %8.0f calls/s  p50 %.2f ms  p95 "
	    "%.2f ms\n",
	    n, health ? "Health callers" : "writers", (double)total / elapsed,
	    pct(all, total, 0.5), pct(all, total, 0.95));
	free(all);
	return j;
}

int
main(int argc, char **argv)
{
	const char *out = argc > 1 ? argv[1] :
	                             "tests/bench/results/"
	                             "sessiond.json";
	double seconds = argc > 2 ? atof(argv[2]) : 3.0;
	const char *parent = argc > 3 ? argv[3] : "/var/tmp";
	const char *bin = argc > 4 ? argv[4] : SESSIOND_BIN;
	char *dir = moat_asprintf("%s/moat-bench-ses-XXXXXX", parent);
	char *url, *log, *errmsg = NULL;
	unsigned long long writes = 0, commits = 0;
	struct moat_rpc_client *c = NULL;
	json_t *doc, *rounds, *r16 = NULL, *rpc16;
	double fs;
	pid_t pid;
	int status;

	if (mkdtemp(dir) == NULL)
		die(dir, strerror(errno));
	url = moat_asprintf("ipc://%s/sessiond.sock", dir);
	fs = fsync_ms(dir);
	log = moat_asprintf("%s/sessiond.log", dir);
	if ((pid = fork()) == 0) {
		if (freopen(log, "w", stderr) == NULL)
			_exit(126);
		execl(bin, bin, "--state-dir", dir, "--workers", "200",
		    (char *)NULL);
		_exit(127);
	}
	if (moat_rpc_client_open(&c, url, &errmsg) != MOAT_OK)
		die(url, errmsg);
	for (int i = 0; i < 100; i++) {
		Moat__V1__HealthRequest hreq = MOAT__V1__HEALTH_REQUEST__INIT;
		struct moat_rpc_opts o = { .timeout_ms = 300 };
		ProtobufCMessage *reply = NULL;

		free(errmsg);
		errmsg = NULL;
		if (moat_rpc_call(c, SVC, "Health", &hreq.base,
		        &moat__v1__health_reply__descriptor, &reply, &o,
		        &errmsg) == MOAT_OK) {
			protobuf_c_message_free_unpacked(reply, NULL);
			break;
		}
		usleep(50000);
	}
	fprintf(stderr,
	    "write + fdatasync in %s: %.2f ms; ceiling for 16 "
	    "synchronous writers at two per commit: %.0f appends/s\n",
	    parent, fs, 16.0 / (2 * fs / 1e3));
	/* What the RPC layer alone allows on this machine right now. */
	rpc16 = run(c, 16, seconds, true);
	rounds = json_array();
	for (size_t i = 0;
	     i < sizeof(writer_counts) / sizeof(writer_counts[0]); i++) {
		json_t *r = run(c, writer_counts[i], seconds, false);

		if (writer_counts[i] == 16)
			r16 = json_incref(r);
		json_array_append_new(rounds, r);
	}
	kill(pid, SIGTERM);
	waitpid(pid, &status, 0);
	moat_rpc_client_close(c);
	writer_totals(log, &writes, &commits);
	fprintf(stderr, "sessiond: %llu writes in %llu commits\n", writes,
	    commits);
	doc = json_pack("{s:s, s:s, s:f, s:f, s:f, s:f, s:o, s:o, s:o}",
	    "benchmark", "sessiond durable AppendStep", "disk_dir", parent,
	    "mean_writes_per_commit",
	    commits ? (double)writes / (double)commits : 0.0, "fdatasync_ms",
	    fs, "ceiling_16_writers_per_s", 16.0 / (2 * fs / 1e3),
	    "goal_appends_per_s", 5000.0, "writers_16",
	    r16 ? r16 : json_null(), "rounds", rounds, "health_16_callers",
	    rpc16);
	if (json_dump_file(doc, out, JSON_INDENT(2)) != 0)
		die(out, "cannot write");
	fprintf(stderr, "wrote %s\n", out);
	json_decref(doc);
	moat_rm_rf(dir);
	free(dir);
	free(url);
	free(log);
	return 0;
}
