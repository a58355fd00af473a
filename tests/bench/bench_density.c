/*
 * bench_density.c: how many idle sandboxes this host holds (issue 18):
 * per [vmd] ram-sharing mode (copy: each clone copies its template's RAM;
 * private: clones map the template's RAM file privately), one moat-vmd
 * (TCG, templates on) makes idle 256 MiB sandboxes from its template with
 * 4 clients at a time up to each count N, and at each N measures:
 * creates per second, PSS per VMM (smaps_rollup), the drop in
 * MemAvailable per sandbox since before the first clone, and idle CPU
 * per VMM (utime + stime over IDLE_S seconds, in % of a core). It also
 * snapshots one clone (the pause, and the whole call) in each mode, since
 * a private clone's snapshot writes its RAM out. Other processes on the
 * host move MemAvailable: run it on a quiet host. Not a test: it asserts
 * nothing. Run as
 *   moat-bench-density IMAGE_DIR OUT.json [MODES [COUNTS [IDLE_S]]]
 * e.g. moat-bench-density images/out tests/bench/results/density.json
 *      copy,private 10,30 30
 */
#include <jansson.h>
#include <pthread.h>
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
#include "vm.pb-c.h"
#include "bench_stats.h"

#define VM "moat.v1.Vm"
#define LONG_MS 300000u
#define MAX_SB 256
#define CLIENTS 4
#define SETTLE_S 10

struct node {
	const char *mode;
	char state[300];
	char url[340];
	pid_t pid;
	char *url_s;
	char *ids[MAX_SB];
	pid_t vmm[MAX_SB];
	int n;
	double create_ms[MAX_SB]; /* each create's call, by n at its end */
	int want;
	int failed;
	char *fail_msg;
	pthread_mutex_t mu;
};

static void
die(const char *what, int rv, const char *msg)
{
	fprintf(stderr, "bench-density: %s: %s: %s\n", what, moat_strerror(rv),
	    msg ? msg : "");
	exit(1);
}

static int
rpc_try(struct moat_rpc_client *c, const char *method,
    const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
    ProtobufCMessage **rep, char **msg)
{
	struct moat_rpc_opts o = { .timeout_ms = LONG_MS,
		.tenant = "default" };

	*rep = NULL;
	*msg = NULL;
	return moat_rpc_call(c, VM, method, req, desc, rep, &o, msg);
}

static ProtobufCMessage *
rpc(struct moat_rpc_client *c, const char *method, const ProtobufCMessage *req,
    const ProtobufCMessageDescriptor *desc)
{
	ProtobufCMessage *rep;
	char *msg;
	int rv = rpc_try(c, method, req, desc, &rep, &msg);

	if (rv != MOAT_OK)
		die(method, rv, msg);
	free(msg);
	return rep;
}

static void
wait_health(struct moat_rpc_client *c)
{
	for (int i = 0; i < 600; i++) {
		Moat__V1__HealthRequest h = MOAT__V1__HEALTH_REQUEST__INIT;
		struct moat_rpc_opts o = { .timeout_ms = 1000 };
		ProtobufCMessage *r = NULL;
		char *err = NULL;
		int rv = moat_rpc_call(c, VM, "Health", &h.base,
		    &moat__v1__health_reply__descriptor, &r, &o, &err);

		free(err);
		if (rv == MOAT_OK) {
			protobuf_c_message_free_unpacked(r, NULL);
			return;
		}
		usleep(50000);
	}
	die("Health", MOAT_UNAVAILABLE, VM);
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

static Moat__V1__Sandbox *
create(struct moat_rpc_client *c, char **msg, int *rv)
{
	Moat__V1__CreateSandboxRequest cr =
	    MOAT__V1__CREATE_SANDBOX_REQUEST__INIT;
	ProtobufCMessage *rep;

	cr.memory_mib = 256;
	/* Idle sandboxes write little; vmd counts each scratch disk at its
	 * full size against the state disk (1024 MiB by default stops at
	 * ~73 here). */
	cr.scratch_mib = 256;
	*rv = rpc_try(c, "CreateSandbox", &cr.base,
	    &moat__v1__sandbox__descriptor, &rep, msg);
	return (Moat__V1__Sandbox *)rep;
}

static void
destroy(struct moat_rpc_client *c, const char *id)
{
	Moat__V1__SandboxRef ref = MOAT__V1__SANDBOX_REF__INIT;

	ref.sandbox_id = (char *)id;
	protobuf_c_message_free_unpacked(rpc(c, "DestroySandbox", &ref.base,
	                                     &moat__v1__empty__descriptor),
	    NULL);
}

/* One client: creates sandboxes while the node wants more. */
static void *
client_main(void *arg)
{
	struct node *n = arg;
	struct moat_rpc_client *c = NULL;
	char *msg = NULL;
	double t0;
	int rv;

	if ((rv = moat_rpc_client_open(&c, n->url, &msg)) != 0)
		die("client", rv, msg);
	for (;;) {
		Moat__V1__Sandbox *sb;

		pthread_mutex_lock(&n->mu);
		if (n->n + n->failed >= n->want || n->failed > 0) {
			pthread_mutex_unlock(&n->mu);
			break;
		}
		n->want--; /* claimed: given back below */
		pthread_mutex_unlock(&n->mu);
		t0 = bench_now_ms();
		sb = create(c, &msg, &rv);
		t0 = bench_now_ms() - t0;
		pthread_mutex_lock(&n->mu);
		n->want++;
		if (rv == MOAT_OK && n->n < MAX_SB) {
			n->create_ms[n->n] = t0;
			n->ids[n->n] = strdup(sb->id);
			n->vmm[n->n] = (pid_t)sb->vmm_pid;
			n->n++;
		} else {
			n->failed++;
			if (n->fail_msg == NULL)
				n->fail_msg = moat_asprintf("%s: %s",
				    moat_strerror(rv), msg ? msg : "");
		}
		pthread_mutex_unlock(&n->mu);
		if (sb != NULL)
			protobuf_c_message_free_unpacked(&sb->base, NULL);
		free(msg);
		msg = NULL;
	}
	moat_rpc_client_close(c);
	return NULL;
}

static long
meminfo_kib(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = -1;
	size_t k = strlen(key);

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, key, k) == 0 && line[k] == ':') {
			v = atol(line + k + 1);
			break;
		}
	fclose(f);
	return v;
}

static long
pss_kib(pid_t pid)
{
	char path[64], line[256];
	FILE *f;
	long v = -1;

	snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "Pss:", 4) == 0) {
			v = atol(line + 4);
			break;
		}
	fclose(f);
	return v;
}

/* utime + stime of pid in clock ticks, or -1. */
static long long
cpu_ticks(pid_t pid)
{
	char path[64], buf[2048], *p;
	unsigned long long ut = 0, st = 0;
	FILE *f;
	size_t got;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return -1;
	got = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[got] = '\0';
	if ((p = strrchr(buf, ')')) == NULL)
		return -1;
	/* After ") ": state(3) ... utime is field 14, stime 15. */
	if (sscanf(p + 2,
	        "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
	        &st) != 2)
		return -1;
	return (long long)(ut + st);
}

/* KSM (mode "private+ksm"): /sys/kernel/mm/ksm, and ksmd's pid. */
#define KSM_DIR "/sys/kernel/mm/ksm/"

static long
ksm_read(const char *name)
{
	char path[128], buf[64];
	FILE *f;
	long v = -1;

	snprintf(path, sizeof(path), KSM_DIR "%s", name);
	if ((f = fopen(path, "r")) != NULL) {
		if (fgets(buf, sizeof(buf), f) != NULL)
			v = atol(buf);
		fclose(f);
	}
	return v;
}

static void
ksm_write(const char *name, long v)
{
	char path[128];
	FILE *f;

	snprintf(path, sizeof(path), KSM_DIR "%s", name);
	if ((f = fopen(path, "w")) != NULL) {
		fprintf(f, "%ld\n", v);
		fclose(f);
	}
}

static pid_t
ksmd_pid(void)
{
	FILE *p = popen("pgrep -x ksmd", "r");
	int pid = 0;

	if (p != NULL) {
		if (fscanf(p, "%d", &pid) != 1)
			pid = 0;
		pclose(p);
	}
	return (pid_t)pid;
}

/* Measures node n at its current count into a JSON object. */
static json_t *
measure(struct node *n, long avail0, double create_s, int created, int idle_s)
{
	json_t *o = json_object();
	long long t0[MAX_SB], t1, k0 = -1, k1;
	pid_t ksmd = strstr(n->mode, "ksm") ? ksmd_pid() : 0;
	double pss = 0, cpu = 0, tick = (double)sysconf(_SC_CLK_TCK);
	long avail;
	int alive = 0;

	sleep(SETTLE_S);
	avail = meminfo_kib("MemAvailable");
	for (int i = 0; i < n->n; i++) {
		long p = pss_kib(n->vmm[i]);

		if (p > 0) {
			pss += (double)p;
			alive++;
		}
	}
	for (int i = 0; i < n->n; i++)
		t0[i] = cpu_ticks(n->vmm[i]);
	if (ksmd > 0)
		k0 = cpu_ticks(ksmd);
	sleep((unsigned)idle_s);
	if (ksmd > 0 && k0 >= 0 && (k1 = cpu_ticks(ksmd)) >= 0) {
		json_object_set_new(o, "ksmd_cpu_pct_of_core",
		    json_real((double)(k1 - k0) / tick / idle_s * 100.0));
		json_object_set_new(o, "ksm_pages_sharing",
		    json_integer(ksm_read("pages_sharing")));
		json_object_set_new(o, "ksm_pages_shared",
		    json_integer(ksm_read("pages_shared")));
		fprintf(stderr,
		    "ksm: ksmd %.2f %% of a core, %ld pages "
		    "sharing\n",
		    (double)(k1 - k0) / tick / idle_s * 100.0,
		    ksm_read("pages_sharing"));
	}
	for (int i = 0; i < n->n; i++)
		if (t0[i] >= 0 && (t1 = cpu_ticks(n->vmm[i])) >= 0)
			cpu += (double)(t1 - t0[i]);
	json_object_set_new(o, "sandboxes", json_integer(n->n));
	{
		double lat[MAX_SB];
		int k = n->n - created;

		memcpy(lat, n->create_ms + k,
		    sizeof(double) * (size_t)created);
		json_object_set_new(o, "create_call",
		    bench_summary(lat, (size_t)created));
	}
	json_object_set_new(o, "created_in_s", json_real(create_s));
	json_object_set_new(o, "creates_per_s",
	    json_real(create_s > 0 ? created / create_s : 0));
	json_object_set_new(o, "pss_mib_per_vmm",
	    json_real(alive ? pss / alive / 1024.0 : 0));
	json_object_set_new(o, "pss_pct_of_guest_ram",
	    json_real(alive ? pss / alive / 1024.0 / 256.0 * 100.0 : 0));
	json_object_set_new(o, "memavailable_drop_mib_per_sandbox",
	    json_real(n->n ? (double)(avail0 - avail) / n->n / 1024.0 : 0));
	json_object_set_new(o, "memavailable_drop_pct_of_guest_ram",
	    json_real(n->n ?
	            (double)(avail0 - avail) / n->n / 1024.0 / 256.0 * 100.0 :
	            0));
	json_object_set_new(o, "idle_cpu_pct_of_core_per_vmm",
	    json_real(n->n ? cpu / tick / idle_s / n->n * 100.0 : 0));
	json_object_set_new(o, "idle_window_s", json_integer(idle_s));
	fprintf(stderr,
	    "density %s N=%d: %.2f creates/s, PSS %.1f MiB/VMM, "
	    "MemAvailable -%.1f MiB/sandbox, idle CPU %.2f %% of a core/VMM\n",
	    n->mode, n->n, create_s > 0 ? created / create_s : 0,
	    alive ? pss / alive / 1024.0 : 0,
	    n->n ? (double)(avail0 - avail) / n->n / 1024.0 : 0,
	    n->n ? cpu / tick / idle_s / n->n * 100.0 : 0);
	return o;
}

/* Where an idle guest's wakeups come from: the guest's /proc/interrupts
 * over 10 s (counts per second by source, the busiest first), from
 * inside sandbox `id`. */
static json_t *
guest_interrupts(struct moat_rpc_client *c, const char *id)
{
	Moat__V1__ExecRequest req = MOAT__V1__EXEC_REQUEST__INIT;
	Moat__V1__ExecResult *r;
	json_t *o;

	req.sandbox_id = (char *)id;
	req.language = "sh";
	req.code = "a=$(cat /proc/interrupts); sleep 10; "
	           "b=$(cat /proc/interrupts); "
	           "echo \"$a\" > /tmp/ia; echo \"$b\" > /tmp/ib; "
	           "awk 'NR==FNR{if(NR>1)x[$1]=$2;next} FNR>1{d=($2-x[$1])/10;"
	           "if(d>0){$2=\"\";print d, $0}}' /tmp/ia /tmp/ib | "
	           "sort -rn | head -8";
	r = (Moat__V1__ExecResult *)rpc(c, "Exec", &req.base,
	    &moat__v1__exec_result__descriptor);
	o = json_stringn((const char *)r->stdout.data, r->stdout.len);
	fprintf(stderr, "guest interrupts/s (idle):\n%.*s", (int)r->stdout.len,
	    (const char *)r->stdout.data);
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return o;
}

/* One snapshot of clone `id`: its pause and the whole call, in ms. */
static json_t *
snapshot_once(struct moat_rpc_client *c, const char *id)
{
	Moat__V1__SnapshotSandboxRequest sr =
	    MOAT__V1__SNAPSHOT_SANDBOX_REQUEST__INIT;
	Moat__V1__LocalSnapshotRef ref = MOAT__V1__LOCAL_SNAPSHOT_REF__INIT;
	Moat__V1__LocalSnapshot *s;
	json_t *o = json_object();
	double t0 = bench_now_ms();

	sr.sandbox_id = (char *)id;
	s = (Moat__V1__LocalSnapshot *)rpc(c, "SnapshotSandbox", &sr.base,
	    &moat__v1__local_snapshot__descriptor);
	json_object_set_new(o, "call_ms", json_real(bench_now_ms() - t0));
	json_object_set_new(o, "pause_ms", json_real(s->pause_ms_exact));
	json_object_set_new(o, "ram_bytes",
	    json_integer((json_int_t)s->ram_bytes));
	ref.snapshot_id = s->snapshot_id;
	protobuf_c_message_free_unpacked(rpc(c, "DeleteLocalSnapshot",
	                                     &ref.base,
	                                     &moat__v1__empty__descriptor),
	    NULL);
	protobuf_c_message_free_unpacked(&s->base, NULL);
	return o;
}

static json_t *
run_mode(const char *images, const char *root, const char *mode,
    const int *counts, int n_counts, int idle_s)
{
	char vmd_bin[] = MOAT_VMD_BIN;
	char log[360], *msg = NULL;
	struct node n = { .mode = mode };
	struct moat_rpc_client *c = NULL;
	json_t *out = json_object(), *by_n = json_array();
	long avail0;
	int rv, warm = 0;
	pid_t tpl_warm[8];
	char *warm_ids[8];

	const char *sharing =
	    strncmp(mode, "private", 7) == 0 ? "private" : "copy";
	long ksm_was = -1;

	if (strstr(mode, "ksm") != NULL) {
		/* KSM merges anonymous pages: a private clone's written ones
		 * (QEMU marks guest RAM mergeable). Back as it was after. */
		ksm_was = ksm_read("run");
		ksm_write("pages_to_scan", 1000);
		ksm_write("run", 1);
	}
	pthread_mutex_init(&n.mu, NULL);
	snprintf(n.state, sizeof(n.state), "%s/%s", root, mode);
	snprintf(n.url, sizeof(n.url), "ipc://%s/%s/vmd.sock", root, mode);
	snprintf(log, sizeof(log), "%s.log", n.state);
	{
		/* MOAT_BENCH_OVERCOMMIT=MIB: vmd admits guests up to MIB of
		 * memory ([vmd] memory-mib, MOAT_VMD_MEMORY_MIB) with RAM in
		 * a tmpfs of that size: its admission counts each guest's
		 * whole memory, which stops 256 MiB guests at ~92 on a
		 * 24 GiB host. */
		const char *oc = getenv("MOAT_BENCH_OVERCOMMIT");
		char ramdir[340], cmd[800];
		char *a[] = { vmd_bin, "--state-dir", n.state, "--accel",
			"tcg", "--image-dir", (char *)images, "--listen",
			n.url, "--node-id", (char *)mode, "--templates", "on",
			"--ram-sharing", (char *)sharing, NULL, NULL, NULL,
			NULL, NULL };

		if (oc != NULL && atoi(oc) > 0) {
			snprintf(ramdir, sizeof(ramdir), "%s/%s-ram", root,
			    mode);
			snprintf(cmd, sizeof(cmd),
			    "mkdir -p '%s' && mount -t tmpfs -o size=%dm "
			    "moat-bench '%s'",
			    ramdir, atoi(oc), ramdir);
			if (system(cmd) != 0)
				die("mount", MOAT_INTERNAL, cmd);
			a[15] = "--ram-dir";
			a[16] = ramdir;
			setenv("MOAT_VMD_MEMORY_MIB", oc, 1);
		}
		n.pid = spawn(a, log);
		unsetenv("MOAT_VMD_MEMORY_MIB");
	}
	if ((rv = moat_rpc_client_open(&c, n.url, &msg)) != 0)
		die("vmd", rv, msg);
	wait_health(c);
	/* Cold boots until the template is made and a create clones it. */
	for (int i = 0; i < 120 && warm < 8; i++) {
		Moat__V1__Sandbox *sb = create(c, &msg, &rv);
		bool cloned;

		if (rv != MOAT_OK)
			die("CreateSandbox (warm-up)", rv, msg);
		cloned = sb->template_id != NULL && sb->template_id[0];
		warm_ids[warm] = strdup(sb->id);
		tpl_warm[warm++] = (pid_t)sb->vmm_pid;
		protobuf_c_message_free_unpacked(&sb->base, NULL);
		if (cloned)
			break;
		sleep(2);
	}
	(void)tpl_warm;
	for (int i = 0; i < warm; i++)
		destroy(c, warm_ids[i]);
	for (int i = 0; i < warm; i++)
		free(warm_ids[i]);
	sleep(5);
	avail0 = meminfo_kib("MemAvailable");
	for (int k = 0; k < n_counts; k++) {
		pthread_t th[CLIENTS];
		int before = n.n;
		double t0, dt;

		n.want = counts[k];
		t0 = bench_now_ms();
		for (int i = 0; i < CLIENTS; i++)
			pthread_create(&th[i], NULL, client_main, &n);
		for (int i = 0; i < CLIENTS; i++)
			pthread_join(th[i], NULL);
		dt = (bench_now_ms() - t0) / 1000.0;
		json_array_append_new(by_n,
		    measure(&n, avail0, dt, n.n - before, idle_s));
		if (n.failed) {
			fprintf(stderr, "density %s: stopped at %d: %s\n",
			    mode, n.n, n.fail_msg);
			json_object_set_new(out, "stopped_at",
			    json_integer(n.n));
			json_object_set_new(out, "stopped_because",
			    json_string(n.fail_msg ? n.fail_msg : "?"));
			break;
		}
	}
	if (n.n > 0) {
		json_t *snaps = json_array();

		for (int i = 0; i < 3; i++)
			json_array_append_new(snaps,
			    snapshot_once(c, n.ids[i % n.n]));
		json_object_set_new(out, "clone_snapshots", snaps);
		json_object_set_new(out, "guest_interrupts_per_s_idle",
		    guest_interrupts(c, n.ids[0]));
	}
	for (int i = 0; i < n.n; i++) {
		destroy(c, n.ids[i]);
		free(n.ids[i]);
	}
	json_object_set_new(out, "by_count", by_n);
	moat_rpc_client_close(c);
	kill(n.pid, SIGTERM);
	waitpid(n.pid, NULL, 0);
	if (ksm_was >= 0) {
		ksm_write("run", ksm_was);
		ksm_write("pages_to_scan", 100);
	}
	if (getenv("MOAT_BENCH_OVERCOMMIT") != NULL) {
		char cmd[400];

		snprintf(cmd, sizeof(cmd),
		    "'%s' purge '%s' >/dev/null 2>&1; umount '%s/%s-ram'",
		    MOAT_VMD_BIN, n.state, root, mode);
		(void)!system(cmd);
		json_object_set_new(out, "overcommit_memory_mib",
		    json_integer(atoi(getenv("MOAT_BENCH_OVERCOMMIT"))));
	}
	free(n.fail_msg);
	return out;
}

int
main(int argc, char **argv)
{
	char root[] = "/tmp/moat-bench-density-XXXXXX";
	const char *modes = argc > 3 ? argv[3] : "copy,private";
	const char *counts_s = argc > 4 ? argv[4] : "10,30";
	int idle_s = argc > 5 ? atoi(argv[5]) : 30;
	int counts[16], n_counts = 0;
	char *dup, *tok, *save = NULL;
	json_t *out, *by_mode;
	char cmd[400];

	if (argc < 3 || idle_s < 1) {
		fprintf(stderr,
		    "usage: %s IMAGE_DIR OUT.json [MODES [COUNTS [IDLE_S]]]\n",
		    argv[0]);
		return 2;
	}
	dup = strdup(counts_s);
	for (tok = strtok_r(dup, ",", &save); tok && n_counts < 16;
	     tok = strtok_r(NULL, ",", &save))
		if (atoi(tok) > 0 && atoi(tok) <= MAX_SB)
			counts[n_counts++] = atoi(tok);
	free(dup);
	if (mkdtemp(root) == NULL)
		die("mkdtemp", MOAT_INTERNAL, root);
	out = json_object();
	by_mode = json_object();
	json_object_set_new(out, "benchmark", json_string("density"));
	json_object_set_new(out, "guest_memory_mib", json_integer(256));
	json_object_set_new(out, "scratch_mib", json_integer(256));
	json_object_set_new(out, "accel", json_string("tcg"));
	json_object_set_new(out, "clients", json_integer(CLIENTS));
	json_object_set_new(out, "host_mem_total_mib",
	    json_integer(meminfo_kib("MemTotal") / 1024));
	json_object_set_new(out, "host_cpus",
	    json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
	dup = strdup(modes);
	for (tok = strtok_r(dup, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save))
		json_object_set_new(by_mode, tok,
		    run_mode(argv[1], root, tok, counts, n_counts, idle_s));
	free(dup);
	json_object_set_new(out, "modes", by_mode);
	if (json_dump_file(out, argv[2], JSON_INDENT(2)) != 0)
		die("write", MOAT_INTERNAL, argv[2]);
	json_decref(out);
	if (getenv("MOAT_BENCH_KEEP") != NULL) {
		fprintf(stderr, "bench-density: logs kept in %s\n", root);
		return 0;
	}
	snprintf(cmd, sizeof(cmd), "'%s' purge '%s'/* >/dev/null 2>&1",
	    MOAT_VMD_BIN, root);
	(void)!system(cmd);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	(void)!system(cmd);
	return 0;
}
