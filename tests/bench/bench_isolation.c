/*
 * bench_isolation.c: what the VMM jail costs (issue 14), in one run,
 * straight to moat-vmd (no gateway): create -> first exec (a cold boot,
 * templates off) and the round trip of exec `true`, p50/p95, with the
 * jail on (isolation = strict) and off (isolation = off, a test node),
 * alternating between the two each round so both see the same host. It
 * starts its own moat-vmd per round in a temporary state dir. Not a
 * test: it asserts nothing about time. Run as
 *   build/bin/moat-bench-isolation IMAGE_DIR OUT.json [ROUNDS] [CALLS]
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "vm.pb-c.h"
#include "bench_stats.h"

#define VM "moat.v1.Vm"

static const char *const modes[2] = { "off", "strict" };

static void
die(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	exit(1);
}

/* exec_true: one Exec of `true` in bash; returns ms taken. */
static double
exec_true(struct moat_rpc_client *c, const char *id)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	struct moat_rpc_opts o = { .timeout_ms = 60000, .tenant = "default" };
	Moat__V1__ExecResult *rep = NULL;
	char *msg = NULL;
	double t0 = bench_now_ms(), t;
	int rv;

	req.sandbox_id = (char *)id;
	req.language = "bash";
	req.code = "true";
	rv = moat_rpc_call(c, VM, "Exec", &req.base,
	    &moat__v1__exec_result__descriptor, (ProtobufCMessage **)&rep, &o,
	    &msg);
	t = bench_now_ms() - t0;
	if (rv != MOAT_OK)
		die("Exec", rv, msg);
	if (rep->status == NULL || rep->status->exit_code != 0)
		die("Exec true", MOAT_INTERNAL, "non-zero exit");
	protobuf_c_message_free_unpacked(&rep->base, NULL);
	return t;
}

/* Starts moat-vmd with isolation `mode` in a new state dir; *state is
 * that dir (heap). */
static pid_t
vmd_start(const char *images, const char *mode, char **state,
    struct moat_rpc_client **c)
{
	char dir[] = "/tmp/moat-bench-isolation.XXXXXX", url[512];
	char *msg = NULL;
	ProtobufCMessage *rep = NULL;
	double t0;
	pid_t vmd;
	int rv;

	if (mkdtemp(dir) == NULL)
		die("mkdtemp", MOAT_INTERNAL, strerror(errno));
	*state = strdup(dir);
	snprintf(url, sizeof(url), "ipc://%s/vmd.sock", dir);
	if ((vmd = fork()) == 0) {
		char log[128];

		snprintf(log, sizeof(log), "%s/vmd.log", dir);
		if (freopen(log, "a", stderr) == NULL ||
		    freopen(log, "a", stdout) == NULL)
			_exit(127);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		setenv("MOAT_VMD_ISOLATION", mode, 1);
		setenv("MOAT_VMD_TEST_HOOKS", "true", 1);
		setenv("MOAT_VMD_TEMPLATES", "off", 1);
		/* accel=auto refuses TCG unless allowed (issue 14). */
		if (access("/dev/kvm", R_OK | W_OK) != 0)
			setenv("MOAT_VMD_ALLOW_TCG", "true", 0);
		execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", dir,
		    "--image-dir", images, "--listen", url, "--node-id",
		    "bench", (char *)NULL);
		_exit(127);
	}
	if ((rv = moat_rpc_client_open(c, url, &msg)) != 0)
		die("vmd", rv, msg);
	for (t0 = bench_now_ms();; usleep(100000)) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		struct moat_rpc_opts o = { .timeout_ms = 1000 };

		free(msg);
		msg = NULL;
		if (moat_rpc_call(*c, VM, "Health", &h.base,
		        &moat__v1__health_reply__descriptor, &rep, &o,
		        &msg) == 0)
			break;
		if (bench_now_ms() - t0 > 15000)
			die("vmd did not start", MOAT_UNAVAILABLE, msg);
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	return vmd;
}

static void
vmd_stop(pid_t vmd, char *state, struct moat_rpc_client *c)
{
	char cmd[600];
	int st;

	moat_rpc_client_close(c);
	kill(vmd, SIGTERM);
	while (waitpid(vmd, &st, 0) < 0 && errno == EINTR)
		;
	snprintf(cmd, sizeof(cmd), "%s purge %s; rm -rf %s", MOAT_VMD_BIN,
	    state, state);
	if (system(cmd) != 0)
		fprintf(stderr, "bench: could not remove %s\n", state);
	free(state);
}

/* One round of `mode`: create -> first exec into first[], then `calls`
 * exec round trips into rt[]. */
static void
round_run(const char *images, const char *mode, int calls, double *first,
    double *rt)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	struct moat_rpc_opts long_o = { .timeout_ms = 300000,
		.tenant = "default" };
	struct moat_rpc_client *c = NULL;
	ProtobufCMessage *rep = NULL;
	char *state, *msg = NULL, *id;
	pid_t vmd = vmd_start(images, mode, &state, &c);
	double t0;
	int rv;

	creq.vcpus = 1;
	creq.memory_mib = 256;
	creq.cold_boot = true;
	t0 = bench_now_ms();
	if ((rv = moat_rpc_call(c, VM, "CreateSandbox", &creq.base,
	         &moat__v1__sandbox__descriptor, &rep, &long_o, &msg)) != 0)
		die("CreateSandbox", rv, msg);
	id = strdup(((Moat__V1__Sandbox *)rep)->id);
	protobuf_c_message_free_unpacked(rep, NULL);
	(void)exec_true(c, id);
	*first = bench_now_ms() - t0;
	for (int i = 0; i < 20; i++) /* warm up */
		(void)exec_true(c, id);
	for (int i = 0; i < calls; i++)
		rt[i] = exec_true(c, id);
	ref.sandbox_id = id;
	if ((rv = moat_rpc_call(c, VM, "DestroySandbox", &ref.base,
	         &moat__v1__empty__descriptor, &rep, &long_o, &msg)) != 0)
		die("DestroySandbox", rv, msg);
	protobuf_c_message_free_unpacked(rep, NULL);
	free(id);
	vmd_stop(vmd, state, c);
}

int
main(int argc, char **argv)
{
	int rounds = 3, calls = 200;
	double *first[2], *rt[2], p50_first[2], p50_rt[2];
	json_t *out, *by_mode;
	char *images;

	if (argc < 3) {
		fprintf(stderr,
		    "usage: %s IMAGE_DIR OUT.json [ROUNDS] [CALLS]\n",
		    argv[0]);
		return 2;
	}
	if (argc > 3)
		rounds = atoi(argv[3]);
	if (argc > 4)
		calls = atoi(argv[4]);
	if (rounds < 1 || rounds > 100 || calls < 1 || calls > 100000) {
		fprintf(stderr, "bench: ROUNDS 1..100, CALLS 1..100000\n");
		return 2;
	}
	for (int m = 0; m < 2; m++) {
		first[m] = calloc((size_t)rounds, sizeof(double));
		rt[m] = calloc((size_t)rounds * (size_t)calls, sizeof(double));
		if (first[m] == NULL || rt[m] == NULL)
			die("alloc", MOAT_RESOURCE_EXHAUSTED, NULL);
	}
	/* vmd and QEMU run elsewhere: the image dir must be absolute. */
	if ((images = realpath(argv[1], NULL)) == NULL) {
		fprintf(stderr, "bench: %s: %s\n", argv[1], strerror(errno));
		return 2;
	}
	for (int r = 0; r < rounds; r++)
		for (int m = 0; m < 2; m++)
			round_run(images, modes[(r + m) % 2], calls,
			    &first[(r + m) % 2][r],
			    rt[(r + m) % 2] + (size_t)r * (size_t)calls);
	by_mode = json_object();
	for (int m = 0; m < 2; m++) {
		size_t n = (size_t)rounds * (size_t)calls;

		p50_first[m] = bench_percentile(first[m], (size_t)rounds, 0.5);
		p50_rt[m] = bench_percentile(rt[m], n, 0.5);
		json_object_set_new(by_mode, modes[m],
		    json_pack("{s:o, s:o}", "create_to_first_exec",
		        bench_summary(first[m], (size_t)rounds),
		        "exec_true_round_trip", bench_summary(rt[m], n)));
	}
	out = json_pack("{s:s, s:i, s:i, s:o, s:f, s:f}", "what",
	    "the VMM jail's cost, straight to moat-vmd: cold create -> first "
	    "exec, and exec `true`; off = isolation off, strict = jailed",
	    "rounds", rounds, "calls_per_round", calls, "modes", by_mode,
	    "create_to_first_exec_p50_overhead_pct",
	    p50_first[0] > 0 ?
	        (p50_first[1] - p50_first[0]) * 100.0 / p50_first[0] :
	        0.0,
	    "exec_true_p50_overhead_ms", p50_rt[1] - p50_rt[0]);
	if (json_dump_file(out, argv[2], JSON_INDENT(2)) != 0)
		die("write", MOAT_INTERNAL, argv[2]);
	json_dumpf(out, stdout, JSON_INDENT(2));
	printf("\n");
	json_decref(out);
	for (int m = 0; m < 2; m++) {
		free(first[m]);
		free(rt[m]);
	}
	free(images);
	return 0;
}
