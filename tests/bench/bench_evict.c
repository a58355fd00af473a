/*
 * bench_evict.c: restore of a snapshot whose RAM copy is in the node's
 * RAM dir against restore of one whose copy was evicted to disk (issue
 * 11), for a 256 MiB guest under TCG. Three moat-vmd side by side, one
 * moat-snapd: "ram" keeps its copies (a large snapshot-ram-mib), "chunks"
 * has a budget of 0 (every copy goes to snapd's chunks, so every restore
 * first pulls the RAM back, eight GetChunks in flight), "local" has a
 * budget of 0 and no snapd (the copy goes to a sparse file in the state
 * directory on disk). Each takes one snapshot of a sandbox that ran
 * python, then the restores alternate ram / chunks / local, each timed
 * from RestoreSandbox to the reply of a first exec of `true`, and
 * destroyed after.
 * Writes p50/p95 of each and the ratios of the p50s and p95s to the
 * "ram" ones (goal: from disk <= 3x from RAM). Not a test: it asserts
 * nothing about time. Run as
 *   moat-bench-evict IMAGE_DIR tests/bench/results/evict.json [ROUNDS]
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/util.h"
#include "snapshot.pb-c.h"
#include "vm.pb-c.h"
#include "bench_stats.h"

#define VM "moat.v1.Vm"
#define LONG_MS 180000u
#define MAX_ROUNDS 100
#define N_KINDS 3

struct node {
	const char *kind; /* "ram", "chunks", "local" */
	const char *budget_mib;
	bool with_snapd;
	char state[300];
	char url[340];
	pid_t pid;
	struct moat_rpc_client *client;
	char *sandbox_id;
	char *snapshot_id;
	double restore[MAX_ROUNDS];
};

static void
die(const char *what, int rv, const char *msg)
{
	fprintf(stderr, "bench-evict: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	exit(1);
}

static ProtobufCMessage *
rpc(struct moat_rpc_client *c, const char *service, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc)
{
	/* Every sandbox call names its tenant, as the gateway's do. */
	struct moat_rpc_opts o = { .timeout_ms = LONG_MS,
		.tenant = "default" };
	ProtobufCMessage *rep = NULL;
	char *msg = NULL;
	int rv;

	if ((rv = moat_rpc_call(c, service, method, req, desc, &rep, &o,
	         &msg)) != MOAT_OK)
		die(method, rv, msg);
	free(msg);
	return rep;
}

static void
wait_health(struct moat_rpc_client *c, const char *service)
{
	for (int i = 0; i < 300; i++) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		struct moat_rpc_opts o = { .timeout_ms = 1000 };
		ProtobufCMessage *r = NULL;
		char *err = NULL;
		int rv = moat_rpc_call(c, service, "Health", &h.base,
		    &moat__v1__health_reply__descriptor, &r, &o, &err);

		free(err);
		if (rv == MOAT_OK) {
			protobuf_c_message_free_unpacked(r, NULL);
			return;
		}
		usleep(50000);
	}
	die("Health", MOAT_UNAVAILABLE, service);
}

static pid_t
spawn(char *const argv[], const char *log)
{
	pid_t pid = fork();

	if (pid == 0) {
		FILE *f = freopen(log, "a", stderr);

		(void)f;
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		execv(argv[0], argv);
		_exit(127);
	}
	return pid;
}

static void
exec_python(struct node *n, const char *id, const char *code)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;

	req.sandbox_id = (char *)id;
	req.language = "python";
	req.code = (char *)code;
	protobuf_c_message_free_unpacked(
	    rpc(n->client, VM, "Exec", &req.base,
	        &moat__v1__exec_result__descriptor),
	    NULL);
}

static void
exec_true(struct node *n, const char *id)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	char *argv[] = { "true" };

	req.sandbox_id = (char *)id;
	req.argv = argv;
	req.n_argv = 1;
	protobuf_c_message_free_unpacked(
	    rpc(n->client, VM, "Exec", &req.base,
	        &moat__v1__exec_result__descriptor),
	    NULL);
}

static void
destroy(struct node *n, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;

	ref.sandbox_id = (char *)id;
	protobuf_c_message_free_unpacked(rpc(n->client, VM, "DestroySandbox",
	                                     &ref.base,
	                                     &moat__v1__empty__descriptor),
	    NULL);
}

static double
restore_once(struct node *n)
{
	Moat__V1__RestoreSandboxRequest rr =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb;
	double t0 = bench_now_ms(), t;

	rr.snapshot_id = n->snapshot_id;
	sb = (Moat__V1__Sandbox *)rpc(n->client, VM, "RestoreSandbox",
	    &rr.base, &moat__v1__sandbox__descriptor);
	exec_true(n, sb->id);
	t = bench_now_ms() - t0;
	destroy(n, sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return t;
}

int
main(int argc, char **argv)
{
	char root[] = "/tmp/moat-bench-evict-XXXXXX";
	char vmd_bin[] = MOAT_VMD_BIN;
	struct node nodes[N_KINDS] = {
		{ .kind = "ram", .budget_mib = "65536", .with_snapd = true },
		{ .kind = "chunks", .budget_mib = "0", .with_snapd = true },
		{ .kind = "local", .budget_mib = "0", .with_snapd = false },
	};
	char snapd_url[340], snapd_state[320], log[360], *slash, *msg = NULL;
	char *snapd_bin;
	struct moat_rpc_client *snapd = NULL;
	int rounds = argc > 3 ? atoi(argv[3]) : 10;
	pid_t snapd_pid;
	json_t *out;
	int rv;

	if (argc < 3 || rounds < 1 || rounds > MAX_ROUNDS) {
		fprintf(stderr,
		    "usage: %s IMAGE_DIR OUT.json [ROUNDS 1..%d]\n", argv[0],
		    MAX_ROUNDS);
		return 2;
	}
	if (mkdtemp(root) == NULL)
		die("mkdtemp", MOAT_INTERNAL, root);
	slash = strrchr(vmd_bin, '/');
	*slash = '\0';
	snapd_bin = moat_asprintf("%s/moat-snapd", vmd_bin);
	*slash = '/';
	snprintf(snapd_state, sizeof(snapd_state), "%s/snapd", root);
	snprintf(snapd_url, sizeof(snapd_url), "ipc://%s/snapd.sock", root);
	snprintf(log, sizeof(log), "%s/snapd.log", root);
	mkdir(snapd_state, 0700);
	{
		char *a[] = { snapd_bin, "--state-dir", snapd_state,
			"--listen", snapd_url, NULL };

		snapd_pid = spawn(a, log);
	}
	if ((rv = moat_rpc_client_open(&snapd, snapd_url, &msg)) != 0)
		die("snapd", rv, msg);
	wait_health(snapd, "moat.v1.Snapshot");
	for (int k = 0; k < N_KINDS; k++) {
		struct node *n = &nodes[k];
		char *a[] = { vmd_bin, "--state-dir", n->state, "--accel",
			"tcg", "--image-dir", argv[1], "--listen", n->url,
			"--node-id", (char *)n->kind, "--templates", "off",
			"--snapshot-ram-mib", (char *)n->budget_mib, "--snapd",
			n->with_snapd ? snapd_url : "", NULL };

		snprintf(n->state, sizeof(n->state), "%s/%s", root, n->kind);
		snprintf(n->url, sizeof(n->url), "ipc://%s/%s/vmd.sock", root,
		    n->kind);
		snprintf(log, sizeof(log), "%s.log", n->state);
		n->pid = spawn(a, log);
		if ((rv = moat_rpc_client_open(&n->client, n->url, &msg)) != 0)
			die("vmd", rv, msg);
		wait_health(n->client, VM);
	}
	/* One sandbox and one snapshot per node, after python ran. */
	for (int k = 0; k < N_KINDS; k++) {
		struct node *n = &nodes[k];
		Moat__V1__CreateSandboxRequest cr =
		    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
		Moat__V1__SnapshotSandboxRequest sr =
		    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
		Moat__V1__Sandbox *sb;
		Moat__V1__LocalSnapshot *s;

		cr.memory_mib = 256;
		sb = (Moat__V1__Sandbox *)rpc(n->client, VM, "CreateSandbox",
		    &cr.base, &moat__v1__sandbox__descriptor);
		n->sandbox_id = strdup(sb->id);
		protobuf_c_message_free_unpacked(&sb->base, NULL);
		exec_python(n, n->sandbox_id, "import json; print(1)");
		sr.sandbox_id = n->sandbox_id;
		s = (Moat__V1__LocalSnapshot *)rpc(n->client, VM,
		    "SnapshotSandbox", &sr.base,
		    &moat__v1__local_snapshot__descriptor);
		n->snapshot_id = strdup(s->snapshot_id);
		protobuf_c_message_free_unpacked(&s->base, NULL);
		destroy(n, n->sandbox_id);
	}
	/* A warm-up round, then the measured ones, interleaved. */
	for (int k = 0; k < N_KINDS; k++)
		(void)restore_once(&nodes[k]);
	for (int i = 0; i < rounds; i++)
		for (int k = 0; k < N_KINDS; k++) {
			sleep(1);
			nodes[k].restore[i] = restore_once(&nodes[k]);
		}

	out = json_object();
	json_object_set_new(out, "benchmark", json_string("evict"));
	json_object_set_new(out, "guest_memory_mib", json_integer(256));
	json_object_set_new(out, "accel", json_string("tcg"));
	json_object_set_new(out, "rounds", json_integer(rounds));
	{
		double p50_ram =
		    bench_percentile(nodes[0].restore, rounds, 0.5);
		double p95_ram =
		    bench_percentile(nodes[0].restore, rounds, 0.95);

		for (int k = 0; k < N_KINDS; k++) {
			char key[64];
			double p50 =
			    bench_percentile(nodes[k].restore, rounds, 0.5);
			double p95 =
			    bench_percentile(nodes[k].restore, rounds, 0.95);

			snprintf(key, sizeof(key), "restore_from_%s",
			    nodes[k].kind);
			json_object_set_new(out, key,
			    bench_summary(nodes[k].restore, rounds));
			if (k == 0)
				continue;
			snprintf(key, sizeof(key), "%s_over_ram_p50",
			    nodes[k].kind);
			json_object_set_new(out, key,
			    json_real(p50 / p50_ram));
			snprintf(key, sizeof(key), "%s_over_ram_p95",
			    nodes[k].kind);
			json_object_set_new(out, key,
			    json_real(p95 / p95_ram));
		}
	}
	json_object_set_new(out, "goal_disk_over_ram", json_real(3.0));
	if (json_dump_file(out, argv[2], JSON_INDENT(2)) != 0)
		fprintf(stderr, "bench-evict: cannot write %s\n", argv[2]);
	json_dumpf(out, stdout, JSON_INDENT(2));
	putchar('\n');
	json_decref(out);

	for (int k = 0; k < N_KINDS; k++) {
		Moat__V1__LocalSnapshotRef ref =
		    MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
		char *rm;

		ref.snapshot_id = nodes[k].snapshot_id;
		protobuf_c_message_free_unpacked(
		    rpc(nodes[k].client, VM, "DeleteLocalSnapshot", &ref.base,
		        &moat__v1__empty__descriptor),
		    NULL);
		moat_rpc_client_close(nodes[k].client);
		kill(nodes[k].pid, SIGTERM);
		waitpid(nodes[k].pid, NULL, 0);
		if ((rm = moat_asprintf("'%s' purge '%s'", MOAT_VMD_BIN,
		         nodes[k].state)) != NULL)
			(void)!system(rm);
		free(rm);
		free(nodes[k].sandbox_id);
		free(nodes[k].snapshot_id);
	}
	moat_rpc_client_close(snapd);
	kill(snapd_pid, SIGTERM);
	waitpid(snapd_pid, NULL, 0);
	fprintf(stderr, "bench-evict: logs in %s\n", root);
	free(snapd_bin);
	return 0;
}
