/*
 * bench_snapshot.c: measures local snapshots with the QEMU driver and
 * writes JSON: the pause of SnapshotSandbox (p50/p95 over N snapshots of
 * one running 256 MiB sandbox), RestoreSandbox -> first exec reply versus
 * cold CreateSandbox -> first exec reply (p50/p95 of each and the ratio of
 * the p50s; issue 3's goal is <= 0.15), the sizes of what a snapshot
 * holds, and templates: CreateSandbox from the node's template -> first
 * exec reply against CreateSandbox with cold_boot -> first exec reply,
 * alternated in pairs in the same run (p50 and p95 of each and their
 * ratios; goal <= 0.15). It starts its own moat-vmd (templates on) on a
 * fresh state directory and stops it (and so every VM) at the end.
 * Not a test: it asserts nothing about time. Run as
 *   moat-bench-snapshot IMAGE_DIR tests/bench/results/snapshot.json
 */
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
#include "moat/util.h"
#include "vm.pb-c.h"
#include "bench_stats.h"

#define VM "moat.v1.Vm"
#define LONG_MS 180000u
#define SNAPSHOTS 10
#define BOOTS 3
#define RESTORES 5
#define TEMPLATE_PAIRS 6

static struct moat_rpc_client *vmd;

static void
die(const char *what, int rv, const char *msg)
{
	fprintf(stderr, "bench-snapshot: %s: %s: %s\n", what,
	    moat_strerror(rv), msg ? msg : "");
	exit(1);
}

static ProtobufCMessage *
rpc(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc)
{
	struct moat_rpc_opts o = { .timeout_ms = LONG_MS,
		.tenant = "default" }; /* as the gateway's calls name it */
	ProtobufCMessage *rep = NULL;
	char *msg = NULL;
	int rv;

	rv = moat_rpc_call(vmd, VM, method, req, desc, &rep, &o, &msg);
	if (rv != MOAT_OK)
		die(method, rv, msg);
	free(msg);
	return rep;
}

static void
exec_true(const char *id)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;

	req.sandbox_id = (char *)id;
	req.argv = (char *[]){ "true" };
	req.n_argv = 1;
	protobuf_c_message_free_unpacked(
	    rpc("Exec", &req.base, &moat__v1__exec_result__descriptor), NULL);
}

static void
destroy(const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;

	ref.sandbox_id = (char *)id;
	protobuf_c_message_free_unpacked(rpc("DestroySandbox", &ref.base,
	                                     &moat__v1__empty__descriptor),
	    NULL);
}

/* Create (cold_boot as `cold_boot`) -> first exec reply, ms; *id (heap)
 * keeps the sandbox when not NULL, else it is destroyed. *templated (may
 * be NULL) says whether it was a clone of a template. */
static double
create_exec(bool cold_boot, char **id, bool *templated)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb;
	double t0 = bench_now_ms(), t;

	req.memory_mib = 256;
	req.scratch_mib = 256;
	req.cold_boot = cold_boot;
	sb = (Moat__V1__Sandbox *)rpc("CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor);
	exec_true(sb->id);
	t = bench_now_ms() - t0;
	if (templated != NULL)
		*templated = sb->template_id[0] != '\0';
	if (id != NULL)
		*id = strdup(sb->id);
	else
		destroy(sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return t;
}

static double
cold(char **id)
{
	return create_exec(true, id, NULL);
}

static pid_t
vmd_start(const char *state, const char *image_dir, const char *url)
{
	pid_t pid = fork();

	if (pid == 0) {
		char *log = moat_asprintf("%s.log", state);
		FILE *f = log ? freopen(log, "a", stderr) : NULL;

		(void)f;
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", state,
		    "--accel", "tcg", "--image-dir", image_dir, "--listen",
		    url, "--node-id", "bench", (char *)NULL);
		_exit(127);
	}
	return pid;
}

int
main(int argc, char **argv)
{
	char state[] = "/tmp/moat-bench-snapshot-XXXXXX";
	double pause[SNAPSHOTS], boot[BOOTS], restore[RESTORES];
	double tpl[TEMPLATE_PAIRS], tpl_cold[TEMPLATE_PAIRS];
	size_t n_tpl = 0;
	uint64_t dev_bytes = 0, ram_bytes = 0, disk_bytes = 0;
	char *url, *msg = NULL, *id = NULL, *snap_id = NULL, *rm;
	json_t *out;
	pid_t pid;
	int rv;

	if (argc != 3) {
		fprintf(stderr, "usage: %s IMAGE_DIR OUT.json\n", argv[0]);
		return 2;
	}
	if (mkdtemp(state) == NULL)
		die("mkdtemp", MOAT_INTERNAL, "cannot make a state directory");
	url = moat_asprintf("ipc://%s/vmd.sock", state);
	pid = vmd_start(state, argv[1], url);
	if ((rv = moat_rpc_client_open(&vmd, url, &msg)) != 0)
		die("connect", rv, msg);
	for (int i = 0; i < 300; i++) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		struct moat_rpc_opts o = { .timeout_ms = 1000 };
		ProtobufCMessage *r = NULL;
		char *err = NULL;

		rv = moat_rpc_call(vmd, VM, "Health", &h.base,
		    &moat__v1__health_reply__descriptor, &r, &o, &err);
		free(err);
		if (rv == 0) {
			protobuf_c_message_free_unpacked(r, NULL);
			break;
		}
		usleep(50000);
	}

	/* Cold boots, the first one kept as the sandbox to snapshot. */
	for (int i = 0; i < BOOTS; i++)
		boot[i] = cold(i == 0 ? &id : NULL);
	for (int i = 0; i < SNAPSHOTS; i++) {
		Moat__V1__SnapshotSandboxRequest sr =
		    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
		Moat__V1__LocalSnapshotRef ref =
		    MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
		Moat__V1__LocalSnapshot *s;

		sr.sandbox_id = id;
		s = (Moat__V1__LocalSnapshot *)rpc("SnapshotSandbox", &sr.base,
		    &moat__v1__local_snapshot__descriptor);
		pause[i] = s->pause_ms_exact;
		dev_bytes = s->device_state_bytes;
		ram_bytes = s->ram_bytes;
		disk_bytes = s->disk_bytes;
		if (i == SNAPSHOTS - 1) {
			snap_id = strdup(s->snapshot_id);
		} else {
			ref.snapshot_id = s->snapshot_id;
			protobuf_c_message_free_unpacked(
			    rpc("DeleteLocalSnapshot", &ref.base,
			        &moat__v1__empty__descriptor),
			    NULL);
		}
		protobuf_c_message_free_unpacked(&s->base, NULL);
		exec_true(id);
	}
	for (int i = 0; i < RESTORES; i++) {
		Moat__V1__RestoreSandboxRequest rr =
		    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
		Moat__V1__Sandbox *sb;
		double t0 = bench_now_ms();

		rr.snapshot_id = snap_id;
		sb = (Moat__V1__Sandbox *)rpc("RestoreSandbox", &rr.base,
		    &moat__v1__sandbox__descriptor);
		exec_true(sb->id);
		restore[i] = bench_now_ms() - t0;
		destroy(sb->id);
		protobuf_c_message_free_unpacked(&sb->base, NULL);
	}
	/* Templates: the first create without cold_boot boots and makes
	 * the template in the background; wait for it, then alternate. */
	(void)create_exec(false, NULL, NULL);
	for (int i = 0; i < 1200; i++) {
		char *cmd = moat_asprintf("ls -d '%s'/templates/tpl-*/meta.pb "
		                          ">/dev/null 2>&1",
		    state);
		int found = cmd ? system(cmd) : -1;

		free(cmd);
		if (found == 0)
			break;
		usleep(100000);
	}
	/* Not measured: it may overlap the end of the template build (the
	 * builder VM's teardown). */
	(void)create_exec(false, NULL, NULL);
	for (int i = 0; i < TEMPLATE_PAIRS; i++) {
		bool templated = false;
		double t = create_exec(false, NULL, &templated);

		tpl_cold[i] = create_exec(true, NULL, NULL);
		if (templated)
			tpl[n_tpl++] = t;
		else
			fprintf(stderr,
			    "bench-snapshot: create %d was not "
			    "from a template\n",
			    i);
	}
	destroy(id);
	{
		/* Its RAM copy lives on tmpfs: only a delete frees it. */
		Moat__V1__LocalSnapshotRef ref =
		    MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;

		ref.snapshot_id = snap_id;
		protobuf_c_message_free_unpacked(
		    rpc("DeleteLocalSnapshot", &ref.base,
		        &moat__v1__empty__descriptor),
		    NULL);
	}

	out = json_object();
	json_object_set_new(out, "benchmark", json_string("snapshot"));
	json_object_set_new(out, "guest_memory_mib", json_integer(256));
	json_object_set_new(out, "accel", json_string("tcg"));
	/* Where vmd kept guest RAM: tmpfs copies it in the pause, an XFS
	 * with reflinks (tests/bench/run.sh makes one) clones it. */
	json_object_set_new(out, "ram_dir",
	    json_string(getenv("MOAT_VMD_RAM_DIR") ?
	            getenv("MOAT_VMD_RAM_DIR") :
	            "/dev/shm"));
	json_object_set_new(out, "snapshot_pause",
	    bench_summary(pause, SNAPSHOTS));
	json_object_set_new(out, "goal_snapshot_pause_p50_ms",
	    json_real(20.0));
	json_object_set_new(out, "cold_create_to_first_exec",
	    bench_summary(boot, BOOTS));
	json_object_set_new(out, "restore_to_first_exec",
	    bench_summary(restore, RESTORES));
	json_object_set_new(out, "restore_over_cold_p50",
	    json_real(bench_percentile(restore, RESTORES, 0.5) /
	        bench_percentile(boot, BOOTS, 0.5)));
	json_object_set_new(out, "goal_restore_over_cold_p50",
	    json_real(0.15));
	json_object_set_new(out, "template_create_to_first_exec",
	    bench_summary(tpl, n_tpl));
	json_object_set_new(out, "cold_boot_create_to_first_exec",
	    bench_summary(tpl_cold, TEMPLATE_PAIRS));
	json_object_set_new(out, "template_over_cold_p50",
	    json_real(bench_percentile(tpl, n_tpl, 0.5) /
	        bench_percentile(tpl_cold, TEMPLATE_PAIRS, 0.5)));
	json_object_set_new(out, "template_over_cold_p95",
	    json_real(bench_percentile(tpl, n_tpl, 0.95) /
	        bench_percentile(tpl_cold, TEMPLATE_PAIRS, 0.95)));
	json_object_set_new(out, "goal_template_over_cold", json_real(0.15));
	json_object_set_new(out, "device_state_bytes",
	    json_integer((json_int_t)dev_bytes));
	json_object_set_new(out, "ram_bytes_copied",
	    json_integer((json_int_t)ram_bytes));
	json_object_set_new(out, "disk_bytes_copied",
	    json_integer((json_int_t)disk_bytes));
	if (json_dump_file(out, argv[2], JSON_INDENT(2)) != 0)
		fprintf(stderr, "bench-snapshot: cannot write %s\n", argv[2]);
	json_dumpf(out, stdout, JSON_INDENT(2));
	putchar('\n');
	json_decref(out);

	moat_rpc_client_close(vmd);
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	/* The vmd log stays (with MOAT_LOG_LEVEL=debug it holds each
	 * snapshot's phases); the state directory goes. */
	fprintf(stderr, "bench-snapshot: vmd log in %s.log\n", state);
	if ((rm = moat_asprintf("'%s' purge '%s'; rm -rf '%s'", MOAT_VMD_BIN,
	         state, state)) != NULL)
		(void)!system(rm);
	free(rm);
	free(url);
	free(id);
	free(snap_id);
	return 0;
}
