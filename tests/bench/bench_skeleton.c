/*
 * bench_skeleton.c: measures the walking skeleton against its goals and
 * writes JSON: cold create -> first exec reply (p50/p95); exec `true`
 * through the gateway versus straight to vmd on the same sandbox,
 * interleaved in one run (p50/p95 of each, and the gateway's added
 * latency), and the same for GetSandbox, a call that never reaches the
 * guest; vmd's own RSS growth per running sandbox. Not a test: it
 * asserts nothing about time. tests/bench/run.sh starts a stack for it.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moat/rpc.h"
#include "vm.pb-c.h"
#include "bench_stats.h"

#define GW "moat.v1.Gateway"

static void
die(const char *what, int rv, char *msg)
{
	fprintf(stderr, "bench: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	exit(1);
}

/* The stack's API key (run.sh exports MOAT_API_KEY from its state). */
static const char *api_key;
static struct moat_rpc_opts auth_opts;
/* The sandboxes' tenant (the key's), which direct calls to vmd name in
 * Envelope.tenant as the gateway does; the gateway ignores it. */
static char sandbox_tenant[128];

static char *
create(struct moat_rpc_client *c)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	struct moat_rpc_opts o = { .timeout_ms = 180000, .auth = api_key };
	ProtobufCMessage *rep = NULL;
	char *msg = NULL, *id;
	int rv;

	req.vcpus = 1;
	req.memory_mib = 256;
	req.cold_boot = true; /* a boot, not a template clone */
	rv = moat_rpc_call(c, GW, "CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor, &rep, &o, &msg);
	if (rv != MOAT_OK)
		die("create", rv, msg);
	id = strdup(((Moat__V1__Sandbox *)rep)->id);
	snprintf(sandbox_tenant, sizeof(sandbox_tenant), "%s",
	    ((Moat__V1__Sandbox *)rep)->tenant);
	auth_opts.tenant = sandbox_tenant;
	protobuf_c_message_free_unpacked(rep, NULL);
	return id;
}

static void
destroy(struct moat_rpc_client *c, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	ProtobufCMessage *rep = NULL;
	char *msg = NULL;
	int rv;

	ref.sandbox_id = (char *)id;
	rv = moat_rpc_call(c, GW, "DestroySandbox", &ref.base,
	    &moat__v1__empty__descriptor, &rep, &auth_opts, &msg);
	if (rv != MOAT_OK)
		die("destroy", rv, msg);
	protobuf_c_message_free_unpacked(rep, NULL);
}

/* exec_true: one-shot Exec of `true` on `service`; returns ms taken. */
static double
exec_true(struct moat_rpc_client *c, const char *service, const char *id)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[] = { "true" };
	ProtobufCMessage *rep = NULL;
	char *msg = NULL;
	double t0 = bench_now_ms();
	int rv;

	req.sandbox_id = (char *)id;
	req.n_argv = 1;
	req.argv = argv;
	rv = moat_rpc_call(c, service, "Exec", &req.base,
	    &moat__v1__exec_result__descriptor, &rep, &auth_opts, &msg);
	if (rv != MOAT_OK)
		die("exec", rv, msg);
	protobuf_c_message_free_unpacked(rep, NULL);
	return bench_now_ms() - t0;
}

/* exec_output: a one-shot Exec on the gateway that prints 64 KiB, the
 * kind of output an agent's step leaves in vmd's exec table. */
static void
exec_output(struct moat_rpc_client *c, const char *id)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	ProtobufCMessage *rep = NULL;
	char *msg = NULL;
	int rv;

	req.sandbox_id = (char *)id;
	req.shell = "yes x | head -c 65536";
	rv = moat_rpc_call(c, GW, "Exec", &req.base,
	    &moat__v1__exec_result__descriptor, &rep, &auth_opts, &msg);
	if (rv != MOAT_OK)
		die("exec", rv, msg);
	protobuf_c_message_free_unpacked(rep, NULL);
}

/* get_sandbox: GetSandbox on `service`; returns ms taken. A call that
 * never reaches the guest, so it isolates the gateway's hop. */
static double
get_sandbox(struct moat_rpc_client *c, const char *service, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;
	ProtobufCMessage *rep = NULL;
	char *msg = NULL;
	double t0 = bench_now_ms();
	int rv;

	ref.sandbox_id = (char *)id;
	rv = moat_rpc_call(c, service, "GetSandbox", &ref.base,
	    &moat__v1__sandbox__descriptor, &rep, &auth_opts, &msg);
	if (rv != MOAT_OK)
		die("get", rv, msg);
	protobuf_c_message_free_unpacked(rep, NULL);
	return bench_now_ms() - t0;
}

static long
rss_kib(int pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if ((f = fopen(path, "r")) == NULL)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

int
main(int argc, char **argv)
{
	struct moat_rpc_client *gw = NULL, *vmd = NULL;
	/* RSS: the slope from RSS_BASE to RSS_BASE + rss_sandboxes live
	 * sandboxes, so one-time allocations (thread stacks, pools, the
	 * first template) are not counted as per-sandbox cost. */
	enum { RSS_BASE = 4 };
	int boots = 5, calls = 200, rss_sandboxes = 12, vmd_pid;
	double *cold, *via_gw, *direct, *get_gw, *get_direct;
	char *msg = NULL, *id, *ids[RSS_BASE + 16];
	long rss0 = 0, rss1;
	double paired_median;
	json_t *out;
	int rv;

	if (argc < 5) {
		fprintf(stderr,
		    "usage: %s GATEWAY_URL VMD_URL VMD_PID "
		    "OUT.json [BOOTS CALLS]\n",
		    argv[0]);
		return 2;
	}
	vmd_pid = atoi(argv[3]);
	api_key = getenv("MOAT_API_KEY");
	auth_opts.auth = api_key;
	if (argc > 5)
		boots = atoi(argv[5]);
	if (argc > 6)
		calls = atoi(argv[6]);
	if (boots < 1 || boots > 100 || calls < 1 || calls > 100000) {
		fprintf(stderr, "bench: BOOTS 1..100, CALLS 1..100000\n");
		return 2;
	}
	if ((rv = moat_rpc_client_open(&gw, argv[1], &msg)) != 0)
		die("gateway", rv, msg);
	if ((rv = moat_rpc_client_open(&vmd, argv[2], &msg)) != 0)
		die("vmd", rv, msg);
	cold = calloc((size_t)boots, sizeof(double));
	via_gw = calloc((size_t)calls, sizeof(double));
	direct = calloc((size_t)calls, sizeof(double));
	get_gw = calloc((size_t)calls, sizeof(double));
	get_direct = calloc((size_t)calls, sizeof(double));
	if (!cold || !via_gw || !direct || !get_gw || !get_direct)
		die("alloc", MOAT_RESOURCE_EXHAUSTED, NULL);

	for (int i = 0; i < boots; i++) {
		double t0 = bench_now_ms();
		id = create(gw);
		exec_true(gw, GW, id);
		cold[i] = bench_now_ms() - t0;
		fprintf(stderr, "cold create+exec %d: %.0f ms\n", i, cold[i]);
		destroy(gw, id);
		free(id);
	}

	id = create(gw);
	for (int i = 0; i < 10; i++) /* warm both paths */
		exec_true(gw, GW, id), exec_true(vmd, "moat.v1.Vm", id);
	for (int i = 0; i < calls; i++) {
		/* Interleaved, so drift in the machine hits both alike. */
		via_gw[i] = exec_true(gw, GW, id);
		direct[i] = exec_true(vmd, "moat.v1.Vm", id);
	}
	for (int i = 0; i < calls; i++) {
		get_gw[i] = get_sandbox(gw, GW, id);
		get_direct[i] = get_sandbox(vmd, "moat.v1.Vm", id);
	}
	destroy(gw, id);
	free(id);

	for (int i = 0; i < RSS_BASE + rss_sandboxes; i++) {
		if (i == RSS_BASE)
			rss0 = rss_kib(vmd_pid);
		ids[i] = create(gw);
		exec_true(gw, GW, ids[i]);
		exec_output(gw, ids[i]);
	}
	rss1 = rss_kib(vmd_pid);
	for (int i = 0; i < RSS_BASE + rss_sandboxes; i++) {
		destroy(gw, ids[i]);
		free(ids[i]);
	}
	{
		/* The gateway's cost per call, call by call: the median of
		 * the paired differences, less noisy than p50 - p50. */
		double *pair = calloc((size_t)calls, sizeof(double));

		if (pair == NULL)
			die("alloc", MOAT_RESOURCE_EXHAUSTED, NULL);
		for (int i = 0; i < calls; i++)
			pair[i] = via_gw[i] - direct[i];
		paired_median = bench_percentile(pair, (size_t)calls, 0.5);
		free(pair);
	}

	out = json_object();
	json_object_set_new(out, "benchmark", json_string("skeleton"));
	json_object_set_new(out, "cold_create_to_first_exec",
	    bench_summary(cold, (size_t)boots));
	json_object_set_new(out, "exec_true_via_gateway",
	    bench_summary(via_gw, (size_t)calls));
	json_object_set_new(out, "exec_true_direct_vmd",
	    bench_summary(direct, (size_t)calls));
	json_object_set_new(out, "gateway_added_p50_ms",
	    json_real(bench_percentile(via_gw, (size_t)calls, 0.5) -
	        bench_percentile(direct, (size_t)calls, 0.5)));
	json_object_set_new(out, "gateway_added_p95_ms",
	    json_real(bench_percentile(via_gw, (size_t)calls, 0.95) -
	        bench_percentile(direct, (size_t)calls, 0.95)));
	json_object_set_new(out, "gateway_added_paired_median_ms",
	    json_real(paired_median));
	json_object_set_new(out, "goal_gateway_added_p50_ms", json_real(1.0));
	json_object_set_new(out, "get_sandbox_via_gateway",
	    bench_summary(get_gw, (size_t)calls));
	json_object_set_new(out, "get_sandbox_direct_vmd",
	    bench_summary(get_direct, (size_t)calls));
	json_object_set_new(out, "gateway_added_get_p50_ms",
	    json_real(bench_percentile(get_gw, (size_t)calls, 0.5) -
	        bench_percentile(get_direct, (size_t)calls, 0.5)));
	json_object_set_new(out, "vmd_rss_growth_per_sandbox_kib",
	    json_real((double)(rss1 - rss0) / rss_sandboxes));
	json_object_set_new(out, "goal_vmd_rss_per_sandbox_kib",
	    json_integer(2048));
	json_object_set_new(out, "vmd_rss_before_kib", json_integer(rss0));
	json_object_set_new(out, "vmd_rss_after_kib", json_integer(rss1));
	json_object_set_new(out, "sandboxes_for_rss",
	    json_integer(rss_sandboxes));
	json_object_set_new(out, "sandboxes_live_before_rss",
	    json_integer(RSS_BASE));
	json_object_set_new(out, "rss_exec_per_sandbox",
	    json_string("true, then 64 KiB of output"));
	if (json_dump_file(out, argv[4], JSON_INDENT(2)) != 0)
		die("write results", MOAT_INTERNAL, argv[4]);
	json_dumpf(out, stdout, JSON_INDENT(2));
	putchar('\n');
	json_decref(out);
	free(cold);
	free(via_gw);
	free(direct);
	free(get_gw);
	free(get_direct);
	moat_rpc_client_close(gw);
	moat_rpc_client_close(vmd);
	return 0;
}
