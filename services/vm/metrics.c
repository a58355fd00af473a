/*
 * metrics.c: moat-vmd's metrics (metrics.h). Latencies and counts are
 * recorded where they happen (sandbox_boot.c, sandbox_restore.c,
 * snapshot.c, snapshot_push.c); the node's figures (sandboxes by state,
 * memory, RAM dir, snapshot RAM, scratch disk) are read at each scrape,
 * from the same places the survey's Node reads them, so the two agree.
 * Not for: the registry, the text or the listener (lib/metrics*.c).
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/status.h"
#include "moat/util.h"
#include "metrics.h"
#include "node.h"
#include "sandbox.h"

/* Every metric of vmd; all NULL while metrics are off (the updates then
 * do nothing). Set once by vmd_metrics_start before the RPC server
 * starts, cleared by vmd_metrics_stop after it stopped. */
static struct vmd_metrics {
	struct moat_metrics *reg;
	struct moat_metrics_server *srv;
	struct vmd *vmd;
	vmd_metrics_node_fill *node_fill;
	struct moat_histogram *boot[2];
	struct moat_counter *boot_failed[2];
	struct moat_histogram *restore;
	struct moat_histogram *phase[VMD_PHASE_N];
	struct moat_counter *restores[2]; /* local, pulled */
	struct moat_histogram *pause[2];  /* snapshot, template */
	struct moat_histogram *push;
	struct moat_counter *pushes[2]; /* failed, ok */
	struct moat_counter *push_stored, *push_logical;
	struct moat_counter *image_pulls, *image_fetched, *image_local;
	/* Read at each scrape. */
	struct moat_gauge *sandboxes[4];
	struct moat_gauge *vcpus_total, *vcpus_used;
	struct moat_gauge *memory_total, *memory_reserved;
	struct moat_gauge *ram_dir_capacity, *ram_dir_reserved;
	struct moat_gauge *snap_ram_used, *snap_ram_budget;
	struct moat_gauge *snapshots[2]; /* in RAM, on disk */
	struct moat_counter *evictions;
	struct moat_gauge *scratch_alloc, *scratch_size;
	struct moat_gauge *exec_output;
	struct moat_counter *expired[2];  /* timeout, idle */
	struct moat_counter *vmm_pool[2]; /* miss, hit */
} m;

static const char *const phase_names[VMD_PHASE_N] = { "total", "prepare",
	"admit", "disk", "vmm_spawn", "agent_connect", "qmp_wait", "ram_wait",
	"device_load", "resume", "reset", "boot_wait" };

static const char *const state_names[4] = { "creating", "running", "failed",
	"stopped" };

#define MIB (1024.0 * 1024.0)

/* scratch_usage: what the scratch disks under <state>/vms hold on disk
 * (allocated) and may grow to (their sizes). */
static void
scratch_usage(const struct vmd *vmd, uint64_t *allocated, uint64_t *size)
{
	char *root = moat_asprintf("%s/vms", vmd->cfg.state_dir);
	DIR *d = root ? opendir(root) : NULL;
	struct dirent *e;

	*allocated = *size = 0;
	while (d != NULL && (e = readdir(d)) != NULL) {
		struct stat st;
		char *path;

		if (e->d_name[0] == '.' ||
		    (path = moat_asprintf("%s/%s/scratch.ext4", root,
		         e->d_name)) == NULL)
			continue;
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			*allocated += (uint64_t)st.st_blocks * 512;
			*size += (uint64_t)st.st_size;
		}
		free(path);
	}
	if (d != NULL)
		closedir(d);
	free(root);
}

/* sandbox_figures: sandboxes by state and the vCPUs and memory of those
 * not stopped, under vmd->mu as vmd_node_fill counts them. */
static void
sandbox_figures(struct vmd *vmd)
{
	uint32_t by_state[4] = { 0 }, vcpus = 0;
	uint64_t reserved;

	pthread_mutex_lock(&vmd->mu);
	reserved = vmd->memory_mib_reserved;
	for (struct sandbox *sb = vmd->sandboxes; sb != NULL; sb = sb->next) {
		pthread_mutex_lock(&sb->mu);
		switch (vmd_sandbox_api_state(sb)) {
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_CREATING:
			by_state[0]++;
			vcpus += sb->vcpus;
			break;
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_RUNNING:
			by_state[1]++;
			vcpus += sb->vcpus;
			break;
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_FAILED:
			by_state[2]++;
			break;
		case MOAT__V1__SANDBOX_STATE__SANDBOX_STATE_STOPPED:
			by_state[3]++;
			break;
		default:
			break;
		}
		pthread_mutex_unlock(&sb->mu);
	}
	pthread_mutex_unlock(&vmd->mu);
	for (size_t i = 0; i < 4; i++)
		moat_gauge_set(m.sandboxes[i], by_state[i]);
	moat_gauge_set(m.vcpus_used, vcpus);
	moat_gauge_set(m.memory_reserved, (double)reserved * MIB);
}

static void
vmd_scrape(void *ctx)
{
	struct vmd *vmd = ctx;
	Moat__V1__Node node = MOAT__V1__NODE__INIT;
	uint64_t allocated, size;

	sandbox_figures(vmd);
	m.node_fill(vmd, &node);
	moat_gauge_set(m.ram_dir_capacity,
	    (double)node.ram_dir_capacity_bytes);
	moat_gauge_set(m.ram_dir_reserved,
	    (double)node.ram_dir_reserved_bytes);
	moat_gauge_set(m.snap_ram_used, (double)node.snapshot_ram_used_bytes);
	moat_gauge_set(m.snap_ram_budget,
	    (double)node.snapshot_ram_budget_bytes);
	moat_gauge_set(m.snapshots[0], node.snapshots_in_ram);
	moat_gauge_set(m.snapshots[1], node.snapshots_on_disk);
	moat_counter_set(m.evictions, node.snapshot_evictions);
	scratch_usage(vmd, &allocated, &size);
	moat_gauge_set(m.scratch_alloc, (double)allocated);
	moat_gauge_set(m.scratch_size, (double)size);
	moat_gauge_set(m.exec_output,
	    (double)__atomic_load_n(&vmd->exec_output_used, __ATOMIC_RELAXED));
}

/* register_events: the metrics that events update. */
static void
register_events(struct moat_metrics *reg)
{
	static const char *const kinds[2][3] = {
		{ "kind", "cold", NULL },
		{ "kind", "restore", NULL },
	};
	static const char *const from[2][3] = {
		{ "source", "local", NULL },
		{ "source", "snapd", NULL },
	};
	static const char *const pause[2][3] = {
		{ "kind", "snapshot", NULL },
		{ "kind", "template", NULL },
	};
	static const char *const result[2][3] = {
		{ "result", "failed", NULL },
		{ "result", "ok", NULL },
	};
	const double *lat = moat_metrics_latency_buckets;
	const size_t n_lat = MOAT_METRICS_LATENCY_N;

	for (int i = 0; i < 2; i++) {
		m.boot[i] = moat_metrics_histogram(reg,
		    "moat_vmd_boot_seconds",
		    "From starting a sandbox's VMM to its guest agent's first "
		    "answer; kind cold (an image booted) or restore (from a "
		    "snapshot or a template).",
		    kinds[i], lat, n_lat);
		m.boot_failed[i] =
		    moat_metrics_counter(reg, "moat_vmd_boot_failures_total",
		        "Creates and restores whose sandbox did not come up.",
		        kinds[i]);
		m.restores[i] = moat_metrics_counter(reg,
		    "moat_vmd_restores_total",
		    "RestoreSandbox calls answered OK, by where the snapshot "
		    "came from.",
		    from[i]);
		m.pause[i] = moat_metrics_histogram(reg,
		    "moat_vmd_snapshot_pause_seconds",
		    "How long a snapshot kept its guest paused.", pause[i],
		    lat, n_lat);
		m.pushes[i] = moat_metrics_counter(reg,
		    "moat_vmd_pushes_total",
		    "Snapshots pushed to moat-snapd, by result.", result[i]);
	}
	for (int i = 0; i < VMD_PHASE_N; i++) {
		const char *const label[3] = { "phase", phase_names[i], NULL };

		m.phase[i] = moat_metrics_histogram(reg,
		    "moat_vmd_create_phase_seconds",
		    "Where creates and restores spend their time, by phase "
		    "(CreateTimings in proto/vm.proto; total is the node's "
		    "whole call).",
		    label, lat, n_lat);
	}
	m.restore = moat_metrics_histogram(reg, "moat_vmd_restore_seconds",
	    "A RestoreSandbox call answered OK, whole: fetch, verify, "
	    "boot.",
	    NULL, lat, n_lat);
	m.push = moat_metrics_histogram(reg, "moat_vmd_push_seconds",
	    "A snapshot's push to moat-snapd, whole.", NULL, lat, n_lat);
	m.push_stored =
	    moat_metrics_counter(reg, "moat_vmd_push_stored_bytes_total",
	        "Bytes pushes stored in moat-snapd (new chunks only).", NULL);
	m.push_logical =
	    moat_metrics_counter(reg, "moat_vmd_push_logical_bytes_total",
	        "Logical size of the snapshots pushed.", NULL);
	m.image_pulls =
	    moat_metrics_counter(reg, "moat_vmd_images_pulled_total",
	        "Images pulled from moat-snapd.", NULL);
	m.image_fetched = moat_metrics_counter(reg,
	    "moat_vmd_image_pull_fetched_bytes_total",
	    "Bytes of image chunks fetched from moat-snapd.", NULL);
	m.image_local =
	    moat_metrics_counter(reg, "moat_vmd_image_pull_local_bytes_total",
	        "Bytes of pulled images' chunks read from this node's images.",
	        NULL);
}

/* register_node: the metrics a scrape reads from the node's state. */
static void
register_node(struct moat_metrics *reg)
{
	static const char *const where[2][3] = {
		{ "location", "ram", NULL },
		{ "location", "disk", NULL },
	};

	for (int i = 0; i < 4; i++) {
		const char *labels[] = { "state", state_names[i], NULL };

		m.sandboxes[i] = moat_metrics_gauge(reg, "moat_vmd_sandboxes",
		    "Sandboxes on this node by state.", labels);
	}
	m.vcpus_total = moat_metrics_gauge(reg, "moat_vmd_vcpus_total",
	    "vCPUs this node offers ([vmd] vcpus).", NULL);
	m.vcpus_used = moat_metrics_gauge(reg, "moat_vmd_vcpus_used",
	    "vCPUs of the sandboxes creating or running.", NULL);
	m.memory_total = moat_metrics_gauge(reg, "moat_vmd_memory_total_bytes",
	    "Guest memory this node offers ([vmd] memory-mib).", NULL);
	m.memory_reserved =
	    moat_metrics_gauge(reg, "moat_vmd_memory_reserved_bytes",
	        "Guest memory reserved by its sandboxes.", NULL);
	m.ram_dir_capacity =
	    moat_metrics_gauge(reg, "moat_vmd_ram_dir_capacity_bytes",
	        "Size of the RAM dir ([vmd] ram-dir) guests' RAM files and "
	        "snapshot copies live in.",
	        NULL);
	m.ram_dir_reserved = moat_metrics_gauge(reg,
	    "moat_vmd_ram_dir_used_bytes",
	    "What guests and snapshot copies hold or may still claim of the "
	    "RAM dir.",
	    NULL);
	m.snap_ram_used =
	    moat_metrics_gauge(reg, "moat_vmd_snapshot_ram_bytes",
	        "What snapshots' RAM copies hold in the RAM dir.", NULL);
	m.snap_ram_budget = moat_metrics_gauge(reg,
	    "moat_vmd_snapshot_ram_budget_bytes",
	    "The budget for snapshots' RAM copies ([vmd] snapshot-ram-mib).",
	    NULL);
	for (int i = 0; i < 2; i++)
		m.snapshots[i] = moat_metrics_gauge(reg, "moat_vmd_snapshots",
		    "Snapshots on this node, by where their RAM is.",
		    where[i]);
	{
		static const char *const reason[2][3] = {
			{ "reason", "timeout", NULL },
			{ "reason", "idle", NULL },
		};

		for (int i = 0; i < 2; i++)
			m.expired[i] = moat_metrics_counter(reg,
			    "moat_vmd_sandboxes_expired_total",
			    "Sandboxes this node destroyed at their timeout "
			    "or idle timeout, by reason.",
			    reason[i]);
	}
	{
		static const char *const result[2][3] = {
			{ "result", "miss", NULL },
			{ "result", "hit", NULL },
		};

		for (int i = 0; i < 2; i++)
			m.vmm_pool[i] = moat_metrics_counter(reg,
			    "moat_vmd_vmm_pool_takes_total",
			    "Template clones and snapshot restores that took "
			    "a "
			    "pre-started VMM from the pool ([vmd] vmm-pool; "
			    "hit) or started one (miss), by result.",
			    result[i]);
	}
	m.evictions = moat_metrics_counter(reg,
	    "moat_vmd_snapshot_evictions_total",
	    "Snapshot RAM copies evicted to disk since vmd started.", NULL);
	m.scratch_alloc =
	    moat_metrics_gauge(reg, "moat_vmd_scratch_allocated_bytes",
	        "Disk the sandboxes' scratch disks use now.", NULL);
	m.scratch_size = moat_metrics_gauge(reg, "moat_vmd_scratch_size_bytes",
	    "What the sandboxes' scratch disks may grow to (their sizes).",
	    NULL);
	m.exec_output = moat_metrics_gauge(reg, "moat_vmd_exec_output_bytes",
	    "Exec output held in vmd's buffers ([vmd] "
	    "exec-output-budget-mib).",
	    NULL);
}

int
vmd_metrics_start(struct vmd *vmd, const char *addr,
    vmd_metrics_node_fill *node_fill, char **errmsg)
{
	struct moat_metrics *reg;
	int rv;

	if ((rv = moat_metrics_new(&reg)) != MOAT_OK ||
	    (rv = moat_metrics_process(reg, "vmd")) != MOAT_OK) {
		moat_metrics_free(reg);
		*errmsg = moat_asprintf("cannot make vmd's metrics: %s",
		    moat_strerror(rv));
		return rv;
	}
	m.vmd = vmd;
	m.node_fill = node_fill;
	register_events(reg);
	register_node(reg);
	moat_gauge_set(m.vcpus_total, vmd->cfg.vcpus_total);
	moat_gauge_set(m.memory_total,
	    (double)vmd->cfg.memory_mib_total * MIB);
	if ((rv = moat_metrics_start(&m.srv, reg, vmd_scrape, vmd, addr,
	         "moat-vmd", errmsg)) != MOAT_OK) {
		memset(&m, 0, sizeof(m));
		moat_metrics_free(reg);
		return rv;
	}
	m.reg = reg;
	return MOAT_OK;
}

void
vmd_metrics_stop(void)
{
	struct moat_metrics *reg = m.reg;

	moat_metrics_server_stop(m.srv);
	memset(&m, 0, sizeof(m));
	moat_metrics_free(reg);
}

char *
vmd_metrics_text(void)
{
	return m.reg != NULL ? moat_metrics_text(m.reg, NULL) : NULL;
}

void
vmd_metrics_boot(enum vmd_boot_kind kind, uint64_t ms)
{
	moat_histogram_observe_ms(m.boot[kind == VMD_BOOT_RESTORE], ms);
}

void
vmd_metrics_create_phases(const double ms[VMD_PHASE_N])
{
	for (int i = 0; i < VMD_PHASE_N; i++)
		if (ms[i] > 0)
			moat_histogram_observe(m.phase[i], ms[i] / 1000.0);
}

void
vmd_metrics_expired(bool idle)
{
	moat_counter_inc(m.expired[idle]);
}

void
vmd_metrics_vmm_pool(bool hit)
{
	moat_counter_inc(m.vmm_pool[hit]);
}

void
vmd_metrics_boot_failed(enum vmd_boot_kind kind)
{
	moat_counter_inc(m.boot_failed[kind == VMD_BOOT_RESTORE]);
}

void
vmd_metrics_restore(uint64_t ms, bool pulled)
{
	moat_histogram_observe_ms(m.restore, ms);
	moat_counter_inc(m.restores[pulled]);
}

void
vmd_metrics_snapshot_pause(bool is_template, double ms)
{
	moat_histogram_observe(m.pause[is_template], ms / 1000.0);
}

void
vmd_metrics_image_pull(uint64_t fetched, uint64_t local)
{
	moat_counter_inc(m.image_pulls);
	moat_counter_add(m.image_fetched, fetched);
	moat_counter_add(m.image_local, local);
}

void
vmd_metrics_push(bool ok, uint64_t ms, uint64_t stored_bytes,
    uint64_t logical_bytes)
{
	moat_histogram_observe_ms(m.push, ms);
	moat_counter_inc(m.pushes[ok]);
	if (ok) {
		moat_counter_add(m.push_stored, stored_bytes);
		moat_counter_add(m.push_logical, logical_bytes);
	}
}
