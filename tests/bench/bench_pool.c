/*
 * bench_pool.c: the warm VMM pool (issue 18 part 3, [vmd] vmm-pool) with
 * the QEMU driver under TCG: CreateSandbox (a template clone) -> first
 * exec reply with the pool off and on, p50/p95 of each and their ratio,
 * and the CPU a create costs: the VMM process's utime+stime from its
 * start until the first exec reply (with the pool, the part it spent
 * before the request, starting in the pool, is also reported apart),
 * and the host's busy CPU during the create call (every process: vmd,
 * QEMU, kernel, and anything else the host runs). Two moat-vmds run side
 * by side on fresh state directories, pool off and on: on each a first
 * create boots and makes the template and one more is not measured;
 * then CREATES measured creates alternate between them, each destroyed
 * before the next; with the pool on, each waits until the pool holds a
 * started VMM again (so each is a hit, counted). Then RestoreSandbox of
 * one snapshot (a clone's, taken on each vmd) -> first exec reply, off
 * and on alike, RESTORES times (what a fork does, one copy at a time;
 * the first restore fills the snapshot's pool and is not measured).
 * Not a test: it asserts nothing about time. Run as
 *   moat-bench-pool IMAGE_DIR tests/bench/results/pool.json
 */
#include <dirent.h>
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
#define CREATES 12
#define RESTORES 8

static struct moat_rpc_client *vmd;

static void
die(const char *what, int rv, const char *msg)
{
	fprintf(stderr, "bench-pool: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	exit(1);
}

static ProtobufCMessage *
rpc(const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc)
{
	struct moat_rpc_opts o = { .timeout_ms = LONG_MS,
		.tenant = "default" };
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

/* utime+stime of pid in ms, or -1. */
static double
proc_cpu_ms(pid_t pid)
{
	char path[64], *text = NULL, *p;
	unsigned long long ut = 0, st = 0;
	size_t len;
	double ms = -1;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (moat_read_file(path, 4096, &text, &len) != 0)
		return -1;
	/* After the command's closing parenthesis: field 3 on; utime and
	 * stime are fields 14 and 15. */
	if ((p = strrchr(text, ')')) != NULL &&
	    sscanf(p + 2,
	        "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
	        &st) == 2)
		ms = (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
	free(text);
	return ms;
}

static pid_t
read_pid(const char *path)
{
	char *text = NULL;
	size_t len;
	pid_t pid = 0;

	if (moat_read_file(path, 64, &text, &len) == 0)
		pid = (pid_t)atoi(text);
	free(text);
	return pid;
}

/* The pool's register: its entries' ids (ids[8][24]) and pids (0 while
 * starting); returns how many. */
static int
pooled(const char *state, char ids[8][24], pid_t pids[8])
{
	char *root = moat_asprintf("%s/pool", state);
	DIR *d = root ? opendir(root) : NULL;
	struct dirent *e;
	int n = 0;

	while (d != NULL && n < 8 && (e = readdir(d)) != NULL) {
		char *path;

		if (strlen(e->d_name) != 23 || e->d_name[0] == '.')
			continue;
		path = moat_asprintf("%s/%s", root, e->d_name);
		pids[n] = path != NULL ? read_pid(path) : 0;
		snprintf(ids[n], 24, "%.19s", e->d_name);
		n++;
		free(path);
	}
	if (d != NULL)
		closedir(d);
	free(root);
	return n;
}

static pid_t
vmd_start(const char *state, const char *image_dir, const char *url, bool pool)
{
	pid_t pid = fork();

	if (pid == 0) {
		char *log = moat_asprintf("%s.log", state);
		FILE *f = log ? freopen(log, "a", stderr) : NULL;

		(void)f;
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		setenv("MOAT_VMD_VMM_POOL", pool ? "1" : "0", 1);
		setenv("MOAT_VMD_ALLOW_TCG", "true", 1);
		execl(MOAT_VMD_BIN, MOAT_VMD_BIN, "--state-dir", state,
		    "--accel", "tcg", "--image-dir", image_dir, "--listen",
		    url, "--node-id", "bench", (char *)NULL);
		_exit(127);
	}
	return pid;
}

static void
wait_health(void)
{
	for (int i = 0; i < 300; i++) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		struct moat_rpc_opts o = { .timeout_ms = 1000 };
		ProtobufCMessage *r = NULL;
		char *err = NULL;
		int rv;

		rv = moat_rpc_call(vmd, VM, "Health", &h.base,
		    &moat__v1__health_reply__descriptor, &r, &o, &err);
		free(err);
		if (rv == 0) {
			protobuf_c_message_free_unpacked(r, NULL);
			return;
		}
		usleep(50000);
	}
	die("Health", MOAT_UNAVAILABLE, "vmd did not answer");
}

struct phase {
	double latency[CREATES];
	double vmm_cpu[CREATES];      /* VMM start .. first exec reply */
	double prestart_cpu[CREATES]; /* pooled: spent before the request */
	double host_cpu[CREATES];     /* host busy during the create */
	double restore[CREATES];      /* Sandbox.boot_ms: VMM to agent */
	size_t n, hits;
};

/* One create -> first exec reply; destroyed after. */
/* One clone -> first exec reply, destroyed after: a create (a
 * template's clone) or, with snap_id, a restore of that snapshot. With
 * the pool on it first waits until `want` pooled VMMs are started and
 * idle (the template's, and the snapshot's once it has a pool). */
static void
one_clone(const char *state, bool pool, int want, const char *snap_id,
    struct phase *ph)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__RestoreSandboxRequest rr =
	    MOAT__V1__RESTORE_SANDBOX_REQUEST__INIT;
	Moat__V1__Sandbox *sb;
	double t0, t, busy0, busy, pre[8] = { 0 };
	char pid_path[400], ids[8][24];
	pid_t pid, pids[8];
	int n = 0;

	for (int i = 0; pool && i < 600; i++) {
		bool started = (n = pooled(state, ids, pids)) >= want;

		for (int j = 0; j < n; j++)
			started = started && pids[j] > 0;
		if (started)
			break;
		n = 0;
		usleep(50000);
	}
	/* Let their start finish: paused, they spend no more CPU. */
	for (int i = 0; i < 30 && n > 0; i++) {
		bool same = true;

		for (int j = 0; j < n; j++) {
			double c = proc_cpu_ms(pids[j]);

			same = same && c == pre[j];
			pre[j] = c;
		}
		if (same && i > 0)
			break;
		usleep(100000);
	}
	busy0 = bench_host_busy_ms();
	t0 = bench_now_ms();
	if (snap_id != NULL) {
		rr.snapshot_id = (char *)snap_id;
		sb = (Moat__V1__Sandbox *)rpc("RestoreSandbox", &rr.base,
		    &moat__v1__sandbox__descriptor);
	} else {
		req.memory_mib = 256;
		req.scratch_mib = 256;
		sb = (Moat__V1__Sandbox *)rpc("CreateSandbox", &req.base,
		    &moat__v1__sandbox__descriptor);
	}
	exec_true(sb->id);
	t = bench_now_ms() - t0;
	busy = bench_host_busy_ms() - busy0;
	snprintf(pid_path, sizeof(pid_path), "%s/vms/%s/qemu.pid", state,
	    sb->id);
	pid = read_pid(pid_path);
	if (snap_id == NULL && sb->template_id[0] == '\0')
		fprintf(stderr, "bench-pool: a create was not a clone\n");
	ph->latency[ph->n] = t;
	ph->vmm_cpu[ph->n] = pid > 0 ? proc_cpu_ms(pid) : -1;
	ph->host_cpu[ph->n] = busy;
	ph->restore[ph->n] = (double)sb->boot_ms;
	ph->prestart_cpu[ph->n] = 0;
	for (int j = 0; j < n; j++) {
		if (strcmp(sb->id, ids[j]) == 0) {
			ph->hits++;
			ph->prestart_cpu[ph->n] = pre[j];
		}
	}
	ph->n++;
	destroy(sb->id);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
}

/* A snapshot of a fresh clone (its id, heap), for the restores. */
static char *
take_snapshot(void)
{
	Moat__V1__CreateSandboxRequest req =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshot *snap;
	Moat__V1__Sandbox *sb;
	char *id;

	req.memory_mib = 256;
	req.scratch_mib = 256;
	sb = (Moat__V1__Sandbox *)rpc("CreateSandbox", &req.base,
	    &moat__v1__sandbox__descriptor);
	exec_true(sb->id);
	sr.sandbox_id = sb->id;
	snap = (Moat__V1__LocalSnapshot *)rpc("SnapshotSandbox", &sr.base,
	    &moat__v1__local_snapshot__descriptor);
	id = strdup(snap->snapshot_id);
	destroy(sb->id);
	protobuf_c_message_free_unpacked(&snap->base, NULL);
	protobuf_c_message_free_unpacked(&sb->base, NULL);
	return id;
}

/* One vmd of the bench: its state directory, pid and client. */
struct node {
	char state[64];
	char *url;
	pid_t pid;
	struct moat_rpc_client *client;
};

/* Starts a vmd (pool on or off) and makes its template: a first create
 * boots, then one clone is not measured (it fills the pool). */
static void
node_start(struct node *n, const char *image_dir, bool pool)
{
	char *msg = NULL;
	int rv;

	snprintf(n->state, sizeof(n->state), "/tmp/moat-bench-pool-XXXXXX");
	if (mkdtemp(n->state) == NULL)
		die("mkdtemp", MOAT_INTERNAL, "cannot make a state directory");
	n->url = moat_asprintf("ipc://%s/vmd.sock", n->state);
	n->pid = vmd_start(n->state, image_dir, n->url, pool);
	if ((rv = moat_rpc_client_open(&n->client, n->url, &msg)) != 0)
		die("connect", rv, msg);
	vmd = n->client;
	wait_health();
	{
		Moat__V1__CreateSandboxRequest req =
		    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
		Moat__V1__Sandbox *sb;

		req.memory_mib = 256;
		req.scratch_mib = 256;
		sb = (Moat__V1__Sandbox *)rpc("CreateSandbox", &req.base,
		    &moat__v1__sandbox__descriptor);
		destroy(sb->id);
		protobuf_c_message_free_unpacked(&sb->base, NULL);
	}
	for (int i = 0; i < 1200; i++) {
		char *cmd = moat_asprintf("ls -d '%s'/templates/tpl-*/meta.pb "
		                          ">/dev/null 2>&1",
		    n->state);
		int found = cmd ? system(cmd) : -1;

		free(cmd);
		if (found == 0)
			break;
		usleep(100000);
	}
	{
		struct phase warm = { 0 };

		one_clone(n->state, false, 0, NULL, &warm);
	}
}

static void
node_stop(struct node *n)
{
	char *rm;

	moat_rpc_client_close(n->client);
	n->client = NULL;
	kill(n->pid, SIGTERM);
	waitpid(n->pid, NULL, 0);
	fprintf(stderr, "bench-pool: vmd log in %s.log\n", n->state);
	if ((rm = moat_asprintf("'%s' purge '%s'; rm -rf '%s'", MOAT_VMD_BIN,
	         n->state, n->state)) != NULL)
		(void)!system(rm);
	free(rm);
	free(n->url);
}

static json_t *
phase_json(struct phase *ph, bool pool)
{
	json_t *o = json_object();
	double total[CREATES];

	for (size_t i = 0; i < ph->n; i++)
		total[i] = ph->vmm_cpu[i];
	json_object_set_new(o, "request_to_first_exec",
	    bench_summary(ph->latency, ph->n));
	/* vmd's own figure: the VMM's start (or take) to the agent's
	 * answer, the part of the create the pool cuts. */
	json_object_set_new(o, "restore_boot_ms",
	    bench_summary(ph->restore, ph->n));
	json_object_set_new(o, "vmm_cpu_until_first_exec",
	    bench_summary(total, ph->n));
	json_object_set_new(o, "host_busy_cpu_during_request",
	    bench_summary(ph->host_cpu, ph->n));
	if (pool) {
		json_object_set_new(o, "vmm_cpu_before_request",
		    bench_summary(ph->prestart_cpu, ph->n));
		json_object_set_new(o, "pool_hits",
		    json_integer((json_int_t)ph->hits));
	}
	return o;
}

int
main(int argc, char **argv)
{
	struct node n_off = { 0 }, n_on = { 0 };
	struct phase off, on, r_off, r_on, warm = { 0 };
	char *snap_off, *snap_on;
	json_t *out;

	if (argc != 3) {
		fprintf(stderr, "usage: %s IMAGE_DIR OUT.json\n", argv[0]);
		return 2;
	}
	/* Both vmds run side by side and the creates alternate, so a
	 * busy host weighs on both alike. */
	node_start(&n_off, argv[1], false);
	node_start(&n_on, argv[1], true);
	memset(&off, 0, sizeof(off));
	memset(&on, 0, sizeof(on));
	for (int i = 0; i < CREATES; i++) {
		vmd = n_off.client;
		one_clone(n_off.state, false, 0, NULL, &off);
		vmd = n_on.client;
		one_clone(n_on.state, true, 1, NULL, &on);
	}
	/* Restores of one snapshot (what a fork does): the first of each
	 * is not measured (it fills the snapshot's pool). */
	vmd = n_off.client;
	snap_off = take_snapshot();
	one_clone(n_off.state, false, 0, snap_off, &warm);
	vmd = n_on.client;
	snap_on = take_snapshot();
	one_clone(n_on.state, true, 1, snap_on, &warm);
	memset(&r_off, 0, sizeof(r_off));
	memset(&r_on, 0, sizeof(r_on));
	for (int i = 0; i < RESTORES; i++) {
		vmd = n_off.client;
		one_clone(n_off.state, false, 0, snap_off, &r_off);
		vmd = n_on.client;
		one_clone(n_on.state, true, 2, snap_on, &r_on);
	}
	free(snap_off);
	free(snap_on);
	node_stop(&n_off);
	node_stop(&n_on);

	out = json_object();
	json_object_set_new(out, "benchmark", json_string("pool"));
	json_object_set_new(out, "guest_memory_mib", json_integer(256));
	json_object_set_new(out, "accel", json_string("tcg"));
	json_object_set_new(out, "creates_per_phase", json_integer(CREATES));
	json_object_set_new(out, "cpu_note",
	    json_string("vmm_cpu_until_first_exec: utime+stime of the "
	                "sandbox's QEMU from its start to the first exec "
	                "reply (pooled: including its start in the pool, "
	                "vmm_cpu_before_request); host_busy_cpu_during_"
	                "request: every CPU of the host, busy, over the "
	                "create or restore call and the first exec (a "
	                "shared host: other load counts too); "
	                "restore_boot_ms: vmd's Sandbox.boot_ms, the "
	                "VMM's start (or take) to the agent's answer"));
	json_object_set_new(out, "pool_off", phase_json(&off, false));
	json_object_set_new(out, "pool_on", phase_json(&on, true));
	json_object_set_new(out, "restores_per_phase", json_integer(RESTORES));
	json_object_set_new(out, "restore_pool_off",
	    phase_json(&r_off, false));
	json_object_set_new(out, "restore_pool_on", phase_json(&r_on, true));
	json_object_set_new(out, "restore_pool_on_over_off_p50",
	    json_real(bench_percentile(r_on.latency, r_on.n, 0.5) /
	        bench_percentile(r_off.latency, r_off.n, 0.5)));
	json_object_set_new(out, "pool_on_over_off_p50",
	    json_real(bench_percentile(on.latency, on.n, 0.5) /
	        bench_percentile(off.latency, off.n, 0.5)));
	json_object_set_new(out, "pool_on_over_off_p95",
	    json_real(bench_percentile(on.latency, on.n, 0.95) /
	        bench_percentile(off.latency, off.n, 0.95)));
	if (json_dump_file(out, argv[2], JSON_INDENT(2)) != 0)
		fprintf(stderr, "bench-pool: cannot write %s\n", argv[2]);
	json_dumpf(out, stdout, JSON_INDENT(2));
	putchar('\n');
	json_decref(out);
	return 0;
}
