/*
 * bench_travel.c: measures time travel through a running stack's gateway
 * and writes JSON: the wall time of RestoreStep into a new sandbox (one
 * restore, branch session included) and of Fork with 8 copies from the
 * same step, p50 and p95 of each over ROUNDS rounds measured side by side
 * in one run, and the ratio fork-of-8 / one restore (issue 3's goal is
 * <= 2: the copies restore in parallel and share the snapshot's RAM
 * file). Beside them, each round also forks as many copies as the host
 * has CPUs, and every call's host CPU time (bench_host_busy_ms) is taken:
 * under TCG a copy is CPU-bound, so a fork of 8 cannot take less than
 * 8 copies' CPU over the host's CPUs, and those figures say how near to
 * that floor it is. A first round is a warm-up, not counted (the node
 * makes its template in the background then), and each timed call starts
 * SETTLE_MS after the last destroy, so that neither side pays for the
 * teardown of the other's sandboxes (QEMU exits, freed RAM files). Every
 * sandbox it makes is destroyed. Not a test: it asserts nothing about
 * time. Run against a started stack (deploy/moat-stack) on the stack's
 * host (the CPU figures are the host's) as
 *   moat-bench-travel GATEWAY_URL tests/bench/results/travel.json [ROUNDS]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moat/status.h"
#include "moat_client.h"
#include "bench_stats.h"

#define FORK_COPIES 8
#define ROUNDS_DEFAULT 5
#define ROUNDS_MAX 50
#define SETTLE_MS 2000

/* settle: lets the teardown of the sandboxes just destroyed finish. */
static void
settle(void)
{
	struct timespec ts = { SETTLE_MS / 1000,
		(SETTLE_MS % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static struct moat_client *gw;

static void
die(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench-travel: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	free(msg);
	exit(1);
}

static void
destroy(const char *id)
{
	char *msg = NULL;

	if (moat_client_destroy(gw, id, &msg) != MOAT_OK) {
		fprintf(stderr, "bench-travel: destroy %s: %s\n", id,
		    msg ? msg : "");
		free(msg);
	}
}

/* fork_once: forks `copies` copies of step 1 of `session`, destroys
 * them, and returns the call's wall ms (*cpu_ms: the host CPU it took). */
static double
fork_once(const char *session, int copies, int round, double *cpu_ms)
{
	Moat__V1__ForkRequest freq = MOAT__V1__FORK_REQUEST__INIT;
	Moat__V1__ForkReply *fr = NULL;
	double t0, c0, ms;
	char *msg = NULL;
	int rv;

	freq.session_id = (char *)session;
	freq.step = 1;
	freq.count = (uint32_t)copies;
	settle();
	c0 = bench_host_busy_ms();
	t0 = bench_now_ms();
	if ((rv = moat_client_fork(gw, &freq, &fr, &msg)) != MOAT_OK)
		die("fork", rv, msg);
	ms = bench_now_ms() - t0;
	*cpu_ms = bench_host_busy_ms() - c0;
	if (fr->succeeded != (uint32_t)copies)
		fprintf(stderr, "bench-travel: round %d: %u of %d copies\n",
		    round, fr->succeeded, copies);
	for (size_t j = 0; j < fr->n_copies; j++)
		if (fr->copies[j]->sandbox != NULL)
			destroy(fr->copies[j]->sandbox->id);
	moat_client_free_msg(fr);
	return ms;
}

/* p50: the median of n values (v is sorted in place). */
static double
p50(double *v, int n)
{
	return bench_percentile(v, (size_t)n, 0.5);
}

int
main(int argc, char **argv)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ereq = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__ExecResult *res = NULL;
	double restore_ms[ROUNDS_MAX], fork_ms[ROUNDS_MAX];
	double ncpu_ms[ROUNDS_MAX], restore_cpu[ROUNDS_MAX];
	double fork_cpu[ROUNDS_MAX], ncpu_cpu[ROUNDS_MAX];
	int rounds = argc > 3 ? atoi(argv[3]) : ROUNDS_DEFAULT;
	int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
	char *msg = NULL, session[128];
	json_t *out;
	int rv;

	if (argc < 3) {
		fprintf(stderr,
		    "usage: moat-bench-travel GATEWAY_URL "
		    "OUT.json [ROUNDS]\n");
		return 2;
	}
	if (rounds < 1 || rounds > ROUNDS_MAX)
		rounds = ROUNDS_DEFAULT;
	if (cpus < 1)
		cpus = 1;
	if (cpus > FORK_COPIES)
		cpus = FORK_COPIES;
	if ((rv = moat_client_open(&gw, argv[1], getenv("MOAT_API_KEY"),
	         &msg)) != MOAT_OK)
		die("open", rv, msg);
	moat_client_set_timeout(gw, 300000);

	creq.record = true;
	creq.snapshot_policy =
	    MOAT__V1__SNAPSHOT_POLICY__SNAPSHOT_POLICY_EVERY;
	creq.memory_mib = 256;
	if ((rv = moat_client_create(gw, &creq, &sb, &msg)) != MOAT_OK)
		die("create", rv, msg);
	snprintf(session, sizeof(session), "%s", sb->session_id);
	ereq.sandbox_id = sb->id;
	ereq.shell = (char *)"head -c 8000000 /dev/urandom >/root/state.bin";
	if ((rv = moat_client_exec(gw, &ereq, &res, &msg)) != MOAT_OK)
		die("exec", rv, msg);
	if (res->recording_error[0] != '\0')
		die("step 1", MOAT_INTERNAL, strdup(res->recording_error));
	moat_client_free_msg(res);

	for (int i = -1; i < rounds; i++) {
		Moat__V1__RestoreStepRequest rreq =
		    MOAT__V1__RESTORE_STEP_REQUEST__INIT;
		Moat__V1__RestoreStepReply *rr = NULL;
		double t0, c0, ms, cpu, fms, fcpu, nms, ncpu;

		rreq.session_id = session;
		rreq.step = 1;
		rreq.new_sandbox = true;
		settle();
		c0 = bench_host_busy_ms();
		t0 = bench_now_ms();
		if ((rv = moat_client_restore_step(gw, &rreq, &rr, &msg)) !=
		    MOAT_OK)
			die("restore", rv, msg);
		ms = bench_now_ms() - t0;
		cpu = bench_host_busy_ms() - c0;
		destroy(rr->sandbox->id);
		moat_client_free_msg(rr);
		fms = fork_once(session, FORK_COPIES, i, &fcpu);
		nms = fork_once(session, cpus, i, &ncpu);
		if (i < 0)
			continue;
		restore_ms[i] = ms;
		restore_cpu[i] = cpu;
		fork_ms[i] = fms;
		fork_cpu[i] = fcpu;
		ncpu_ms[i] = nms;
		ncpu_cpu[i] = ncpu;
		fprintf(stderr,
		    "round %d: restore %.0f ms (CPU %.0f), fork of "
		    "%d %.0f ms (CPU %.0f), fork of %d %.0f ms\n",
		    i, ms, cpu, FORK_COPIES, fms, fcpu, cpus, nms);
	}
	destroy(sb->id);
	moat_client_free_msg(sb);

	{
		json_t *r = bench_summary(restore_ms, (size_t)rounds);
		json_t *f = bench_summary(fork_ms, (size_t)rounds);
		json_t *n = bench_summary(ncpu_ms, (size_t)rounds);
		double r50 = json_real_value(json_object_get(r, "p50_ms"));
		double r95 = json_real_value(json_object_get(r, "p95_ms"));
		double f50 = json_real_value(json_object_get(f, "p50_ms"));
		double f95 = json_real_value(json_object_get(f, "p95_ms"));
		double n50 = json_real_value(json_object_get(n, "p50_ms"));
		double rc = p50(restore_cpu, rounds),
		       fc = p50(fork_cpu, rounds);
		double nc = p50(ncpu_cpu, rounds);

		/* The copies restore in parallel only as far as there are
		 * CPUs: under TCG each one is CPU-bound. fork_cpu_floor_ms is
		 * the fork's host CPU over the host's CPUs: no schedule of
		 * the same work on this host ends sooner. */
		out = json_pack(
		    "{s:s, s:i, s:i, s:i, s:o, s:o, s:f, s:f, s:f,"
		    " s:{s:f, s:f, s:f, s:f, s:f}, s:{s:i, s:o, s:f, s:f}}",
		    "bench", "travel", "rounds", rounds, "host_cpus",
		    (int)sysconf(_SC_NPROCESSORS_ONLN), "fork_copies",
		    FORK_COPIES, "restore_one", r, "fork", f,
		    "fork_over_restore_p50", r50 > 0 ? f50 / r50 : 0.0,
		    "fork_over_restore_p95", r95 > 0 ? f95 / r95 : 0.0,
		    "goal_ratio_max", 2.0, "host_cpu_p50_ms", "restore_one",
		    rc, "fork", fc, "fork_per_copy", fc / FORK_COPIES,
		    "fork_cpu_floor_ms",
		    fc / (double)sysconf(_SC_NPROCESSORS_ONLN),
		    "fork_cpu_floor_over_restore",
		    r50 > 0 ?
		        fc / (double)sysconf(_SC_NPROCESSORS_ONLN) / r50 :
		        0.0,
		    "fork_host_cpus_copies", "copies", cpus, "wall", n,
		    "over_restore_p50", r50 > 0 ? n50 / r50 : 0.0,
		    "host_cpu_p50_ms", nc);
	}
	if (out == NULL || json_dump_file(out, argv[2], JSON_INDENT(2)) != 0) {
		fprintf(stderr, "bench-travel: cannot write %s\n", argv[2]);
		return 1;
	}
	json_decref(out);
	moat_client_close(gw);
	return 0;
}
