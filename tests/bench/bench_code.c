/*
 * bench_code.c: measures persistent code contexts straight to moat-vmd
 * (no gateway): the first RunCode of a context (the interpreter starts)
 * and a trivial RunCode (`1+1`) in the warm python context, p50/p95, as
 * JSON. It starts its own moat-vmd in a temporary state dir with the
 * given image dir and one sandbox. Not a test: it asserts nothing about
 * time. Run as
 *   build/bin/moat-bench-code IMAGE_DIR tests/bench/results/code.json [N]
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "vm.pb-c.h"
#include "bench_stats.h"

#define VM "moat.v1.Vm"

static void
die(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	exit(1);
}

/* run_code: one RunCode; returns ms taken. */
static double
run_code(struct moat_rpc_client *c, const char *id, const char *code,
    const char *want)
{
	Moat__V1__RunCodeRequest req = MOAT__V1__RUN_CODE_REQUEST__INIT;
	struct moat_rpc_opts o = { .timeout_ms = 60000, .tenant = "default" };
	Moat__V1__RunCodeResult *rep = NULL;
	char *msg = NULL;
	double t0 = bench_now_ms(), t;
	int rv;

	req.sandbox_id = (char *)id;
	req.code = (char *)code;
	rv = moat_rpc_call(c, VM, "RunCode", &req.base,
	    &moat__v1__run_code_result__descriptor, (ProtobufCMessage **)&rep,
	    &o, &msg);
	t = bench_now_ms() - t0;
	if (rv != MOAT_OK)
		die("RunCode", rv, msg);
	if (want != NULL && strcmp(rep->result->result, want) != 0)
		die("RunCode", MOAT_INTERNAL, rep->result->result);
	protobuf_c_message_free_unpacked(&rep->base, NULL);
	return t;
}

int
main(int argc, char **argv)
{
	Moat__V1__CreateSandboxRequest creq =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	/* Every sandbox call names its tenant, as the gateway's do. */
	struct moat_rpc_opts long_o = { .timeout_ms = 300000,
		.tenant = "default" };
	struct moat_rpc_client *c = NULL;
	char state[] = "/tmp/moat-bench-code.XXXXXX", url[512], *msg = NULL;
	ProtobufCMessage *rep = NULL;
	double *warm, first, t0;
	int calls = 500, rv, st;
	char *id;
	json_t *out;
	pid_t vmd;

	if (argc < 3) {
		fprintf(stderr, "usage: %s IMAGE_DIR OUT.json [CALLS]\n",
		    argv[0]);
		return 2;
	}
	if (argc > 3)
		calls = atoi(argv[3]);
	if (calls < 1 || calls > 100000 || mkdtemp(state) == NULL) {
		fprintf(stderr, "bench: CALLS 1..100000, and a tmp dir\n");
		return 2;
	}
	snprintf(url, sizeof(url), "ipc://%s/vmd.sock", state);
	if ((vmd = fork()) == 0) {
		char log[128];

		snprintf(log, sizeof(log), "%s/vmd.log", state);
		if (freopen(log, "a", stderr) == NULL ||
		    freopen(log, "a", stdout) == NULL)
			_exit(127);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		/* accel=auto refuses TCG unless allowed (issue 14). */
		if (access("/dev/kvm", R_OK | W_OK) != 0)
			setenv("MOAT_VMD_ALLOW_TCG", "true", 0);
		execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", state,
		    "--image-dir", argv[1], "--listen", url, "--node-id",
		    "bench", (char *)NULL);
		_exit(127);
	}
	if ((rv = moat_rpc_client_open(&c, url, &msg)) != 0)
		die("vmd", rv, msg);
	for (t0 = bench_now_ms();; usleep(100000)) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		struct moat_rpc_opts o = { .timeout_ms = 1000 };

		free(msg);
		msg = NULL;
		if (moat_rpc_call(c, VM, "Health", &h.base,
		        &moat__v1__health_reply__descriptor, &rep, &o,
		        &msg) == 0)
			break;
		if (bench_now_ms() - t0 > 15000)
			die("vmd did not start", MOAT_UNAVAILABLE, msg);
	}
	protobuf_c_message_free_unpacked(rep, NULL);
	creq.vcpus = 1;
	creq.memory_mib = 256;
	if ((rv = moat_rpc_call(c, VM, "CreateSandbox", &creq.base,
	         &moat__v1__sandbox__descriptor, &rep, &long_o, &msg)) != 0)
		die("CreateSandbox", rv, msg);
	id = strdup(((Moat__V1__Sandbox *)rep)->id);
	protobuf_c_message_free_unpacked(rep, NULL);

	first = run_code(c, id, "x = 1", NULL);
	for (int i = 0; i < 20; i++) /* warm up */
		(void)run_code(c, id, "1+1", "2");
	if ((warm = calloc((size_t)calls, sizeof(double))) == NULL)
		die("alloc", MOAT_RESOURCE_EXHAUSTED, NULL);
	for (int i = 0; i < calls; i++)
		warm[i] = run_code(c, id, "1+1", "2");

	out = json_pack("{s:s, s:f, s:o}", "what",
	    "RunCode straight to "
	    "moat-vmd, python context",
	    "first_run_ms", first, "warm_1plus1",
	    bench_summary(warm, (size_t)calls));
	if (json_dump_file(out, argv[2], JSON_INDENT(2)) != 0)
		die("write", MOAT_INTERNAL, argv[2]);
	json_dumpf(out, stdout, JSON_INDENT(2));
	printf("\n");
	json_decref(out);

	ref.sandbox_id = id;
	if ((rv = moat_rpc_call(c, VM, "DestroySandbox", &ref.base,
	         &moat__v1__empty__descriptor, &rep, &long_o, &msg)) != 0)
		die("DestroySandbox", rv, msg);
	protobuf_c_message_free_unpacked(rep, NULL);
	moat_rpc_client_close(c);
	kill(vmd, SIGTERM);
	while (waitpid(vmd, &st, 0) < 0 && errno == EINTR)
		;
	snprintf(url, sizeof(url), "%s purge %s; rm -rf %s", MOAT_VMD_BIN,
	    state, state);
	if (system(url) != 0)
		fprintf(stderr, "bench: could not remove %s\n", state);
	free(warm);
	free(id);
	return 0;
}
