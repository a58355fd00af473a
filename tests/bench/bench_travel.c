/*
 * bench_travel.c: measures time travel through a running stack's gateway
 * and writes JSON: the wall time of RestoreStep into a new sandbox (one
 * restore, branch session included) and of Fork with 8 copies from the
 * same step, p50 and p95 of each over ROUNDS rounds measured side by side
 * in one run, and the ratio fork-of-8 / one restore (issue 3's goal is
 * <= 2: the copies restore in parallel and share the snapshot's RAM
 * file). A first round is a warm-up, not counted (the node makes its
 * template in the background then), and each timed call starts SETTLE_MS
 * after the last destroy, so that neither side pays for the teardown of
 * the other's sandboxes (QEMU exits, freed RAM files). Every sandbox it
 * makes is destroyed. Not a test: it asserts
 * nothing about time. Run against a started stack (deploy/moat-stack) as
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
	struct timespec ts = { SETTLE_MS / 1000, (SETTLE_MS % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static struct moat_client *gw;

static void
die(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench-travel: %s: %s: %s\n", what,
	    moat_strerror(rv), msg ? msg : "");
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

int
main(int argc, char **argv)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__ExecRequest ereq = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__Sandbox *sb = NULL;
	Moat__V1__ExecResult *res = NULL;
	double restore_ms[ROUNDS_MAX], fork_ms[ROUNDS_MAX];
	int rounds = argc > 3 ? atoi(argv[3]) : ROUNDS_DEFAULT;
	char *msg = NULL, session[128];
	json_t *out;
	int rv;

	if (argc < 3) {
		fprintf(stderr, "usage: moat-bench-travel GATEWAY_URL "
		    "OUT.json [ROUNDS]\n");
		return 2;
	}
	if (rounds < 1 || rounds > ROUNDS_MAX)
		rounds = ROUNDS_DEFAULT;
	if ((rv = moat_client_open(&gw, argv[1], getenv("MOAT_API_KEY"), &msg)) != MOAT_OK)
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
		Moat__V1__ForkRequest freq = MOAT__V1__FORK_REQUEST__INIT;
		Moat__V1__RestoreStepReply *rr = NULL;
		Moat__V1__ForkReply *fr = NULL;
		double t0;

		rreq.session_id = session;
		rreq.step = 1;
		rreq.new_sandbox = true;
		settle();
		t0 = bench_now_ms();
		if ((rv = moat_client_restore_step(gw, &rreq, &rr, &msg)) !=
		    MOAT_OK)
			die("restore", rv, msg);
		if (i >= 0)
			restore_ms[i] = bench_now_ms() - t0;
		destroy(rr->sandbox->id);
		moat_client_free_msg(rr);

		freq.session_id = session;
		freq.step = 1;
		freq.count = FORK_COPIES;
		settle();
		t0 = bench_now_ms();
		if ((rv = moat_client_fork(gw, &freq, &fr, &msg)) != MOAT_OK)
			die("fork", rv, msg);
		if (i >= 0)
			fork_ms[i] = bench_now_ms() - t0;
		if (fr->succeeded != FORK_COPIES)
			fprintf(stderr, "bench-travel: round %d: %u of %d "
			    "copies\n", i, fr->succeeded, FORK_COPIES);
		for (size_t j = 0; j < fr->n_copies; j++)
			if (fr->copies[j]->sandbox != NULL)
				destroy(fr->copies[j]->sandbox->id);
		moat_client_free_msg(fr);
		if (i >= 0)
			fprintf(stderr, "round %d: restore %.0f ms, fork of %d "
			    "%.0f ms\n", i, restore_ms[i], FORK_COPIES,
			    fork_ms[i]);
	}
	destroy(sb->id);
	moat_client_free_msg(sb);

	{
		json_t *r = bench_summary(restore_ms, (size_t)rounds);
		json_t *f = bench_summary(fork_ms, (size_t)rounds);
		double r50 = json_real_value(json_object_get(r, "p50_ms"));
		double r95 = json_real_value(json_object_get(r, "p95_ms"));
		double f50 = json_real_value(json_object_get(f, "p50_ms"));
		double f95 = json_real_value(json_object_get(f, "p95_ms"));

		/* The copies restore in parallel only as far as there are
		 * CPUs: under TCG each one is CPU-bound. */
		out = json_pack("{s:s, s:i, s:i, s:i, s:o, s:o, s:f, s:f, s:f}",
		    "bench", "travel", "rounds", rounds, "host_cpus",
		    (int)sysconf(_SC_NPROCESSORS_ONLN), "fork_copies",
		    FORK_COPIES, "restore_one", r, "fork", f,
		    "fork_over_restore_p50", r50 > 0 ? f50 / r50 : 0.0,
		    "fork_over_restore_p95", r95 > 0 ? f95 / r95 : 0.0,
		    "goal_ratio_max", 2.0);
	}
	if (out == NULL || json_dump_file(out, argv[2], JSON_INDENT(2)) != 0) {
		fprintf(stderr, "bench-travel: cannot write %s\n", argv[2]);
		return 1;
	}
	json_decref(out);
	moat_client_close(gw);
	return 0;
}
