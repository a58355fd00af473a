/*
 * main.c: moat-vmd, one per KVM host. Reads its settings (flags > MOAT_VMD_*
 * environment > moat.conf [vmd] > defaults), takes the state directory's
 * lock, cleans up what a killed vmd left, checks the VMM, and serves the
 * moat.v1.Vm service over nng until SIGTERM or SIGINT, when it destroys
 * every sandbox and exits 0. With --survey it also answers the gateway's
 * node surveys. Not for: sandbox logic (sandbox.c and friends).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "moat/config.h"
#include "moat/log.h"
#include "moat/metrics.h"
#include "moat/rpc.h"
#include "moat/status.h"
#include "moat/tls.h"
#include "moat/util.h"
#include "spawn.h"
#include "ramdir.h"
#include "snapram.h"
#include "accel.h"
#include "adopt.h"
#include "cgroup.h"
#include "cordon.h"
#include "console.h"
#include "driver.h"
#include "egress.h"
#include "exec.h"
#include "image_build.h"
#include "image_store.h"
#include "lifetime.h"
#include "metrics.h"
#include "node.h"
#include "pool.h"
#include "pushq.h"
#include "sandbox.h"
#include "service.h"
#include "survey.h"
#include "templates.h"
#include "verify.h"
#include "vmhost.h"

#define SECTION "vmd"

static const struct option vmd_options[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "listen", required_argument, NULL, 'l' },
	{ "survey", required_argument, NULL, 's' },
	{ "state-dir", required_argument, NULL, 'd' },
	{ "image-dir", required_argument, NULL, 'i' },
	{ "node-id", required_argument, NULL, 'n' },
	{ "accel", required_argument, NULL, 'a' },
	{ "cache-dir", required_argument, NULL, 'C' },
	{ "driver", required_argument, NULL, 'D' },
	{ "snapd", required_argument, NULL, 'S' },
	{ "templates", required_argument, NULL, 'T' },
	{ "template-spares", required_argument, NULL, 'P' },
	{ "vmm-pool", required_argument, NULL, 'O' },
	{ "ram-dir", required_argument, NULL, 'R' },
	{ "ram-sharing", required_argument, NULL, 0x7440 },
	{ "snapshot-ram-mib", required_argument, NULL, 'B' },
	{ "snapd-tls-name", required_argument, NULL, 0x7410 },
	{ "survey-tls-name", required_argument, NULL, 0x7411 },
	{ "snapshot-key-file", required_argument, NULL, 0x7412 },
	MOAT_METRICS_OPTION,
	{ "stop-sandboxes", no_argument, NULL, 0x7413 },
	{ "label", required_argument, NULL, 0x7430 },
	MOAT_TLS_OPTIONS,
	{ "version", no_argument, NULL, 'V' },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: moat-vmd [options]\n"
	    "       moat-vmd purge STATE_DIR   delete a stopped vmd's state\n"
	    "                          and its snapshots' RAM copies on "
	    "tmpfs\n"
	    "  --config FILE      moat.conf (default $MOAT_CONFIG)\n"
	    "  --listen URL       RPC address (default "
	    "ipc://<state>/vmd.sock)\n"
	    "  --survey URL       a gateway's survey address to answer\n"
	    "                     (repeat, or commas: every gateway)\n"
	    "  --state-dir DIR    default $MOAT_STATE_DIR or /var/lib/moat\n"
	    "  --image-dir DIR    built images (default <state>/images)\n"
	    "  --node-id ID       default the host name\n"
	    "  --accel MODE       auto, kvm or tcg (default auto)\n"
	    "  --cache-dir DIR    default /var/cache/moat\n"
	    "  --driver NAME      auto, qemu or firecracker (default auto:\n"
	    "                     firecracker when installed and KVM works)\n"
	    "  --snapd URL        moat-snapd: snapshots are pushed there "
	    "after\n"
	    "                     the sandbox resumes, and restores of ids "
	    "this\n"
	    "                     node lacks pull from it (default: none)\n"
	    "  --templates on|off creates without cold_boot clone the node's\n"
	    "                     ready snapshot of their shape (image,\n"
	    "                     sizes, accel), made in the background\n"
	    "                     after the first cold boot (default on)\n"
	    "  --template-spares N ready RAM copies kept per template in\n"
	    "                     /dev/shm, so a clone renames one instead "
	    "of\n"
	    "                     copying the RAM; each costs the template's\n"
	    "                     RAM data in tmpfs (~93 MB for a 256 MiB\n"
	    "                     guest); removed when vmd stops (default 2,\n"
	    "                     0: none; not made where --ram-dir has\n"
	    "                     reflinks: a clone is then a reflink)\n"
	    "  --vmm-pool N       VMMs kept started per template in use and\n"
	    "                     recently restored snapshot, so a create,\n"
	    "                     restore or fork copy skips the VMM's start\n"
	    "                     (QEMU: paused, -incoming defer; a\n"
	    "                     template's already run once, pre-warmed);\n"
	    "                     each holds a copy of its source's RAM and\n"
	    "                     disk, counted in the node's memory and\n"
	    "                     given up for a sandbox that needs the room\n"
	    "                     (default 2, 0: off)\n"
	    "  --ram-dir DIR      guest RAM files and snapshots' RAM copies\n"
	    "                     (default /dev/shm). On XFS or btrfs with\n"
	    "                     reflinks a snapshot clones RAM instead of\n"
	    "                     copying it while the guest is paused\n"
	    "  --ram-sharing MODE copy: a restored VM's RAM is its own copy\n"
	    "                     of the snapshot's; private: the VMM maps\n"
	    "                     the snapshot's RAM file privately, so\n"
	    "                     clones share the pages they have not\n"
	    "                     written (no copy at restore; a snapshot of\n"
	    "                     such a clone writes its RAM out); auto\n"
	    "                     (default): private with QEMU when vmd is\n"
	    "                     root and lib/libmoat-qemu-ramro.so is\n"
	    "                     there, else copy\n"
	    "  --snapshot-ram-mib N  RAM dir room for snapshots' RAM copies;\n"
	    "                     past it the least recently used go to disk\n"
	    "                     (snapd's chunks, else the state dir) and a\n"
	    "                     restore brings them back (default a "
	    "quarter\n"
	    "                     of host memory; 0: every copy goes at "
	    "once)\n" MOAT_TLS_USAGE
	    "                     (callers: the gateway's CA; tls-ca: "
	    "snapd's and\n"
	    "                     the gateway's)\n"
	    "  --snapd-tls-name N name in snapd's certificate (default "
	    "snapd)\n"
	    "  --survey-tls-name N name in the gateway's survey certificate\n"
	    "  --label K=V        a node label for node_selector "
	    "(repeatable;\n"
	    "                     with [vmd] labels = zone=a,kvm=true)\n"
	    "                     (default gateway)\n"
	    "  --snapshot-key-file F  the key snapshots are sealed with (32\n"
	    "                     bytes, made at first start; nodes that\n"
	    "                     restore each other's snapshots share it;\n"
	    "                     default <state>/snapshot.key)\n"
	    "  --metrics ADDR     serve Prometheus metrics at "
	    "http://ADDR/metrics\n"
	    "                     (e.g. 127.0.0.1:9101; default off)\n"
	    "  --stop-sandboxes   SIGTERM destroys every sandbox (default: "
	    "they\n"
	    "                     run on and the next vmd on this state dir\n"
	    "                     re-adopts them; [vmd] "
	    "stop-sandboxes-on-exit)\n"
	    "  --version, --help\n"
	    "Every option is also [vmd] KEY in moat.conf and MOAT_VMD_KEY in\n"
	    "the environment; further keys: advertise-url, qemu, "
	    "firecracker,\n"
	    "kvm-device, test-hooks, max-vcpus, max-memory-mib, memory-mib,\n"
	    "vcpus, boot-timeout-ms, allow-tcg (accel=auto may fall back to\n"
	    "TCG, no security boundary), console-max-kib, "
	    "exec-output-budget-mib,\n"
	    "disk-reserve-mib, egress-hosts, egress-max-conns,\n"
	    "image-build-script, image-build-agent, image-build-timeout-s,\n"
	    "isolation, jail-uid-base, jail-uid-count, jail-gid,\n"
	    "vmm-overhead-mib, vmm-pids, vmm-nofile, cgroup-root;\n"
	    "[firecracker] jailer, jailer-binary,\n"
	    "chroot-base, cgroup-root, parent-cgroup, netns, uid-base,\n"
	    "id-count, new-pid-ns, memory-overhead-mib, vsock-port.\n");
}

static uint64_t
host_memory_mib(void)
{
	char *text = NULL;
	size_t len;
	uint64_t kib = 0;
	char *p;

	if (moat_read_file("/proc/meminfo", 1 << 16, &text, &len) != 0)
		return 1024;
	if ((p = strstr(text, "MemTotal:")) != NULL)
		kib = strtoull(p + 9, NULL, 10);
	free(text);
	return kib ? kib / 1024 : 1024;
}

static char *
cfg_str(const struct moat_config *c, const char *key, const char *def)
{
	const char *v = moat_config_get(c, SECTION, key, NULL);

	if (v == NULL || v[0] == '\0')
		v = def;
	return v ? strdup(v) : NULL;
}

/* Fills cfg's directories, addresses and names, and checks the driver
 * and accel. Returns 0 or a status after printing why. */
static int
vmd_configure_strings(struct vmd_config *cfg, const struct moat_config *c)
{
	char host[256] = "localhost";
	char *errmsg = NULL;
	char *def = NULL;

	gethostname(host, sizeof(host) - 1);
	if ((cfg->state_dir = moat_config_state_dir(c, SECTION)) == NULL)
		return MOAT_INTERNAL;
	/* Trailing slashes would make two spellings of one directory. */
	for (size_t n = strlen(cfg->state_dir);
	     n > 1 && cfg->state_dir[n - 1] == '/'; n--)
		cfg->state_dir[n - 1] = '\0';

	def = moat_asprintf("%s/images", cfg->state_dir);
	cfg->image_dir = cfg_str(c, "image-dir", def);
	free(def);
	def = moat_asprintf("ipc://%s/vmd.sock", cfg->state_dir);
	cfg->listen_url = cfg_str(c, "listen", def);
	free(def);
	cfg->survey_url = cfg_str(c, "survey", "");
	cfg->advertise_url = cfg_str(c, "advertise-url", "");
	cfg->cache_dir = cfg_str(c, "cache-dir", "/var/cache/moat");
	cfg->node_id = cfg_str(c, "node-id", host);
	cfg->accel = cfg_str(c, "accel", "auto");
	cfg->qemu_binary = cfg_str(c, "qemu", "qemu-system-x86_64");
	cfg->kvm_device = cfg_str(c, "kvm-device", "/dev/kvm");
	cfg->driver = cfg_str(c, "driver", "auto");
	cfg->firecracker_binary = cfg_str(c, "firecracker", "firecracker");
	cfg->snapd_url = cfg_str(c, "snapd", "");
	/* "" : found next to the binary when a build starts (image_build.c). */
	cfg->image_build_script = cfg_str(c, "image-build-script", "");
	cfg->image_build_agent = cfg_str(c, "image-build-agent", "");
	if (!cfg->image_build_script || !cfg->image_build_agent)
		return MOAT_INTERNAL;
	cfg->ram_dir = cfg_str(c, "ram-dir", "/dev/shm");
	cfg->ram_sharing = cfg_str(c, "ram-sharing", "auto");
	cfg->snapd_tls_name = cfg_str(c, "snapd-tls-name", "snapd");
	cfg->survey_tls_name = cfg_str(c, "survey-tls-name", "gateway");
	def = moat_asprintf("%s/snapshot.key", cfg->state_dir);
	cfg->snapshot_key_file =
	    def ? cfg_str(c, "snapshot-key-file", def) : NULL;
	free(def);
	if (cfg->snapshot_key_file == NULL)
		return MOAT_INTERNAL;
	if (!cfg->driver || !cfg->firecracker_binary || !cfg->snapd_url ||
	    !cfg->ram_dir || !cfg->ram_sharing || !cfg->snapd_tls_name ||
	    !cfg->survey_tls_name)
		return MOAT_INTERNAL;
	if (moat_tls_from_config(c, SECTION, &cfg->tls, &errmsg) != MOAT_OK) {
		fprintf(stderr, "moat-vmd: %s\n",
		    errmsg ? errmsg : "out of memory");
		free(errmsg);
		return MOAT_INVALID_ARGUMENT;
	}
	if (vmd_driver_check_name(cfg->driver, &errmsg) != MOAT_OK) {
		fprintf(stderr, "moat-vmd: %s\n",
		    errmsg ? errmsg : "out of memory");
		free(errmsg);
		return MOAT_INVALID_ARGUMENT;
	}
	if (!cfg->image_dir || !cfg->listen_url || !cfg->survey_url ||
	    !cfg->advertise_url || !cfg->cache_dir || !cfg->node_id ||
	    !cfg->accel || !cfg->qemu_binary || !cfg->kvm_device)
		return MOAT_INTERNAL;
	if (cfg->image_dir[0] != '/') {
		/* VMMs start in their sandbox's directory (and jailed, in
		 * their own root): a relative image path names nothing
		 * there, and the guest would fail with no console. */
		char *abs = realpath(cfg->image_dir, NULL);

		if (abs == NULL) {
			fprintf(stderr,
			    "moat-vmd: image-dir \"%s\": %s: give the "
			    "folder images/build.sh wrote (images/out), as "
			    "an absolute path\n",
			    cfg->image_dir, strerror(errno));
			return MOAT_INVALID_ARGUMENT;
		}
		free(cfg->image_dir);
		cfg->image_dir = abs;
	}
	if (strcmp(cfg->accel, "auto") && strcmp(cfg->accel, "kvm") &&
	    strcmp(cfg->accel, "tcg")) {
		fprintf(stderr,
		    "moat-vmd: accel \"%s\" is not one of auto, "
		    "kvm, tcg\n",
		    cfg->accel);
		return MOAT_INVALID_ARGUMENT;
	}
	return MOAT_OK;
}

/* Fills cfg's sizes, limits and switches; host-dependent defaults come
 * from `ncpu` and the host's memory. Returns 0 or a status after
 * printing why. */
static int
vmd_configure_limits(struct vmd_config *cfg, const struct moat_config *c,
    long ncpu)
{
	char *errmsg = NULL;
	uint64_t v;
	int rv;

#define U64(key, def, dst, lo, hi)                                            \
	do {                                                                  \
		if ((rv = moat_config_get_u64(c, SECTION, key, def, &v,       \
		         &errmsg)) != 0) {                                    \
			fprintf(stderr, "moat-vmd: %s\n", errmsg);            \
			free(errmsg);                                         \
			return rv;                                            \
		}                                                             \
		if (v < (lo) || v > (hi)) {                                   \
			fprintf(stderr,                                       \
			    "moat-vmd: %s=%" PRIu64 " is out "                \
			    "of range %" PRIu64 "..%" PRIu64 "\n",            \
			    key, v, (uint64_t)(lo), (uint64_t)(hi));          \
			return MOAT_INVALID_ARGUMENT;                         \
		}                                                             \
		dst = v;                                                      \
	} while (0)

	U64("vcpus", (uint64_t)ncpu, cfg->vcpus_total, 1, 4096);
	U64("memory-mib", host_memory_mib(), cfg->memory_mib_total, 128,
	    UINT64_C(1) << 32);
	U64("max-vcpus", ncpu < 8 ? (uint64_t)ncpu : 8, cfg->max_vcpus, 1,
	    255);
	U64("max-memory-mib", 8192, cfg->max_memory_mib, VMD_MIN_MEMORY_MIB,
	    UINT32_MAX);
	U64("boot-timeout-ms", VMD_DEFAULT_BOOT_TIMEOUT_MS,
	    cfg->boot_timeout_ms, 100, 3600000);
	U64("image-build-timeout-s", 1800, cfg->image_build_timeout_s, 1,
	    86400);
	/* No lower bound: 0 turns the spares off. */
	if ((rv = moat_config_get_u64(c, SECTION, "template-spares", 2, &v,
	         &errmsg)) != 0) {
		fprintf(stderr, "moat-vmd: %s\n", errmsg);
		free(errmsg);
		return rv;
	}
	if (v > 64) {
		fprintf(stderr,
		    "moat-vmd: template-spares=%" PRIu64 " is out "
		    "of range 0..64\n",
		    v);
		return MOAT_INVALID_ARGUMENT;
	}
	cfg->template_spares = (uint32_t)v;
	/* No lower bound: 0 turns the pool off. */
	if ((rv = moat_config_get_u64(c, SECTION, "vmm-pool", 2, &v,
	         &errmsg)) != 0) {
		fprintf(stderr, "moat-vmd: %s\n", errmsg);
		free(errmsg);
		return rv;
	}
	if (v > 16) {
		fprintf(stderr,
		    "moat-vmd: vmm-pool=%" PRIu64 " is out of range 0..16 "
		    "(pre-started VMMs per template or snapshot in use)\n",
		    v);
		return MOAT_INVALID_ARGUMENT;
	}
	cfg->vmm_pool = (uint32_t)v;
	/* No lower bound: 0 sends every snapshot's RAM to disk at once. */
	if ((rv = moat_config_get_u64(c, SECTION, "snapshot-ram-mib",
	         host_memory_mib() / 4, &v, &errmsg)) != 0) {
		fprintf(stderr, "moat-vmd: %s\n", errmsg);
		free(errmsg);
		return rv;
	}
	if (v > (UINT64_C(1) << 30)) {
		fprintf(stderr,
		    "moat-vmd: snapshot-ram-mib=%" PRIu64 " is out "
		    "of range 0..%" PRIu64 "\n",
		    v, UINT64_C(1) << 30);
		return MOAT_INVALID_ARGUMENT;
	}
	cfg->snapshot_ram_mib = v;
#undef U64
	if ((rv = moat_config_get_bool(c, SECTION, "test-hooks", false,
	         &cfg->test_hooks, &errmsg)) != 0 ||
	    (rv = moat_config_get_bool(c, SECTION, "templates", true,
	         &cfg->templates, &errmsg)) != 0 ||
	    (rv = moat_config_get_bool(c, SECTION, "template-reflink", false,
	         &cfg->template_reflink, &errmsg)) != 0 ||
	    (rv = moat_config_get_bool(c, SECTION, "allow-tcg", false,
	         &cfg->allow_tcg, &errmsg)) != 0 ||
	    (rv = moat_config_get_bool(c, SECTION, "stop-sandboxes-on-exit",
	         false, &cfg->stop_sandboxes, &errmsg)) != 0 ||
	    (rv = moat_config_get_bool(c, SECTION, "stop-sandboxes",
	         cfg->stop_sandboxes, &cfg->stop_sandboxes, &errmsg)) != 0) {
		fprintf(stderr, "moat-vmd: %s\n", errmsg);
		free(errmsg);
		return rv;
	}
	return MOAT_OK;
}

/* Fills the bounds of issue 14: the console cap, the exec output budget
 * and the disk reserve (allow-tcg is with the switches). Returns 0 or a
 * status after printing why. */
static int
vmd_configure_bounds(struct vmd_config *cfg, const struct moat_config *c)
{
	char *errmsg = NULL;
	uint64_t v;
	int rv;

#define U64(key, def, lo, hi)                                                 \
	do {                                                                  \
		if ((rv = moat_config_get_u64(c, SECTION, key, def, &v,       \
		         &errmsg)) != 0) {                                    \
			fprintf(stderr, "moat-vmd: %s\n", errmsg);            \
			free(errmsg);                                         \
			return rv;                                            \
		}                                                             \
		if (v < (lo) || v > (hi)) {                                   \
			fprintf(stderr,                                       \
			    "moat-vmd: %s=%" PRIu64 " is out "                \
			    "of range %" PRIu64 "..%" PRIu64 "\n",            \
			    key, v, (uint64_t)(lo), (uint64_t)(hi));          \
			return MOAT_INVALID_ARGUMENT;                         \
		}                                                             \
	} while (0)
	U64("console-max-kib", VMD_CONSOLE_DEFAULT_MAX / 1024,
	    VMD_CONSOLE_MIN_MAX / 1024, UINT64_C(1) << 30);
	cfg->console_max_bytes = v * 1024;
	U64("exec-output-budget-mib", 256, 1, UINT64_C(1) << 30);
	cfg->exec_output_budget = v << 20;
	U64("archive-max-mib", 2048, 1, UINT64_C(1) << 20);
	cfg->archive_max_bytes = v << 20;
	/* No lower bound: 0 lets scratch disks claim the whole disk. */
	if ((rv = moat_config_get_u64(c, SECTION, "disk-reserve-mib", 2048, &v,
	         &errmsg)) != 0) {
		fprintf(stderr, "moat-vmd: %s\n", errmsg);
		free(errmsg);
		return rv;
	}
	if (v > (UINT64_C(1) << 40)) {
		fprintf(stderr,
		    "moat-vmd: disk-reserve-mib=%" PRIu64 " is out "
		    "of range 0..%" PRIu64 "\n",
		    v, UINT64_C(1) << 40);
		return MOAT_INVALID_ARGUMENT;
	}
	cfg->disk_reserve_bytes = v << 20;
#undef U64
	return MOAT_OK;
}

/* Reads the jail's keys (jail.h) into cfg->jail. Returns 0 or a status
 * after printing why. */
static int
vmd_configure_jail(struct vmd_config *cfg, const struct moat_config *c)
{
	static const struct {
		const char *key;
		uint64_t def, lo, hi;
		size_t off;
	} keys[] = {
		{ "jail-uid-base", 200000, 1, UINT32_MAX - 1,
		    offsetof(struct vmd_jail_settings, uid_base) },
		{ "jail-uid-count", 4096, 1, 1u << 20,
		    offsetof(struct vmd_jail_settings, uid_count) },
		{ "vmm-overhead-mib", 160, 16, 1u << 20,
		    offsetof(struct vmd_jail_settings, overhead_mib) },
		{ "vmm-pids", 256, 16, 1u << 22,
		    offsetof(struct vmd_jail_settings, pids) },
		{ "vmm-nofile", 1024, 64, 1u << 20,
		    offsetof(struct vmd_jail_settings, nofile) },
	};
	const char *iso = moat_config_get(c, SECTION, "isolation", "strict");
	char *errmsg = NULL;
	uint64_t v;
	int rv;

	bool hooks = false;

	if (strcmp(iso, "strict") != 0 && strcmp(iso, "relaxed") != 0 &&
	    strcmp(iso, "off") != 0) {
		fprintf(stderr,
		    "moat-vmd: isolation \"%s\" is not strict or "
		    "relaxed\n",
		    iso);
		return MOAT_INVALID_ARGUMENT;
	}
	/* off: no jail, for the isolation benchmark on a test node only. */
	if (strcmp(iso, "off") == 0 &&
	    (moat_config_get_bool(c, SECTION, "test-hooks", false, &hooks,
	         &errmsg) != 0 ||
	        !hooks)) {
		free(errmsg);
		fprintf(stderr,
		    "moat-vmd: isolation = off needs test-hooks = "
		    "true (a test node): use strict or relaxed\n");
		return MOAT_INVALID_ARGUMENT;
	}
	cfg->jail.relaxed = strcmp(iso, "relaxed") == 0;
	cfg->jail.off = strcmp(iso, "off") == 0;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if ((rv = moat_config_get_u64(c, SECTION, keys[i].key,
		         keys[i].def, &v, &errmsg)) != 0) {
			fprintf(stderr, "moat-vmd: %s\n", errmsg);
			free(errmsg);
			return rv;
		}
		if (v < keys[i].lo || v > keys[i].hi) {
			fprintf(stderr,
			    "moat-vmd: %s=%" PRIu64 " is out of range "
			    "%" PRIu64 "..%" PRIu64 "\n",
			    keys[i].key, v, keys[i].lo, keys[i].hi);
			return MOAT_INVALID_ARGUMENT;
		}
		*(uint32_t *)(void *)((char *)&cfg->jail + keys[i].off) =
		    (uint32_t)v;
	}
	if ((rv = moat_config_get_u64(c, SECTION, "jail-gid",
	         cfg->jail.uid_base, &v, &errmsg)) != 0) {
		fprintf(stderr, "moat-vmd: %s\n", errmsg);
		free(errmsg);
		return rv;
	}
	if (v == 0 || v >= UINT32_MAX) {
		fprintf(stderr,
		    "moat-vmd: jail-gid=%" PRIu64 " must be a "
		    "non-root group id\n",
		    v);
		return MOAT_INVALID_ARGUMENT;
	}
	cfg->jail.gid = (uint32_t)v;
	if ((cfg->cgroup_root = cfg_str(c, "cgroup-root", "auto")) == NULL)
		return MOAT_INTERNAL;
	cfg->jail.cgroup_root = cfg->cgroup_root;
	return MOAT_OK;
}

/* vmd_configure_labels: [vmd] labels, then every --label (joined by
 * main into [vmd] label). */
static int
vmd_configure_labels(struct vmd_config *cfg, const struct moat_config *c)
{
	char *errmsg = NULL;
	int rv;

	if ((rv = vmd_labels_parse(&cfg->labels,
	         moat_config_get(c, SECTION, "labels", ""), "[vmd] labels",
	         &errmsg)) == MOAT_OK)
		rv = vmd_labels_parse(&cfg->labels,
		    moat_config_get(c, SECTION, "label", ""), "--label",
		    &errmsg);
	if (rv != MOAT_OK)
		fprintf(stderr, "moat-vmd: %s\n",
		    errmsg ? errmsg : "out of memory");
	free(errmsg);
	return rv;
}

/* labels_from_args: the values of every --label K=V (or --label=K=V),
 * joined by commas (heap; NULL when none): getopt keeps the last only. */
static char *
labels_from_args(int argc, char **argv)
{
	char *joined = NULL;

	for (int i = 1; i < argc; i++) {
		const char *v = NULL;
		char *next;

		if (strcmp(argv[i], "--label") == 0 && i + 1 < argc)
			v = argv[++i];
		else if (strncmp(argv[i], "--label=", 8) == 0)
			v = argv[i] + 8;
		if (v == NULL)
			continue;
		next = joined ? moat_asprintf("%s,%s", joined, v) : strdup(v);
		free(joined);
		if ((joined = next) == NULL)
			return NULL;
	}
	return joined;
}

/* Fills vmd->cfg. Returns 0 or a status after printing why. */
static int
vmd_configure(struct vmd *vmd, const struct moat_config *c)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int rv;

	if (ncpu < 1)
		ncpu = 1;
	if ((rv = vmd_configure_strings(&vmd->cfg, c)) != MOAT_OK ||
	    (rv = vmd_configure_jail(&vmd->cfg, c)) != MOAT_OK)
		return rv;
	if ((rv = vmd_configure_limits(&vmd->cfg, c, ncpu)) != MOAT_OK ||
	    (rv = vmd_configure_labels(&vmd->cfg, c)) != MOAT_OK)
		return rv;
	return vmd_configure_bounds(&vmd->cfg, c);
}

static void
vmd_config_fini(struct vmd_config *cfg)
{
	vmd_labels_free(&cfg->labels);
	free(cfg->state_dir);
	free(cfg->image_dir);
	free(cfg->cache_dir);
	free(cfg->listen_url);
	free(cfg->survey_url);
	free(cfg->advertise_url);
	free(cfg->node_id);
	free(cfg->accel);
	free(cfg->qemu_binary);
	free(cfg->kvm_device);
	free(cfg->driver);
	free(cfg->firecracker_binary);
	free(cfg->snapd_url);
	free(cfg->image_build_script);
	free(cfg->image_build_agent);
	free(cfg->ram_dir);
	free(cfg->ram_sharing);
	free(cfg->snapd_tls_name);
	free(cfg->survey_tls_name);
	free(cfg->snapshot_key_file);
	free(cfg->cgroup_root);
	moat_tls_free(cfg->tls);
}

/* Only one vmd may own a state directory: the orphan cleanup at start
 * would otherwise kill a live vmd's sandboxes. The lock dies with us. */
static int
state_lock(const char *state_dir, int *fd_out)
{
	char *path = moat_asprintf("%s/vmd.lock", state_dir);
	int fd;

	if (path == NULL)
		return MOAT_INTERNAL;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		fprintf(stderr, "moat-vmd: cannot open %s: %s\n", path,
		    strerror(errno));
		free(path);
		return moat_status_from_errno(errno);
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		char pid[32] = "?";
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);

		if (n > 0)
			pid[strcspn(pid, "\n")] = '\0';
		fprintf(stderr,
		    "moat-vmd: another moat-vmd (pid %s) uses state "
		    "directory %s: stop it or pick another --state-dir\n",
		    pid, state_dir);
		close(fd);
		free(path);
		return MOAT_FAILED_PRECONDITION;
	}
	if (ftruncate(fd, 0) == 0)
		dprintf(fd, "%d\n", (int)getpid());
	free(path);
	*fd_out = fd;
	return MOAT_OK;
}

/* purge_ram_links: removes the tmpfs RAM copies that symlinks under
 * `dir` point at (snapshots keep their RAM in /dev/shm/moat-*.ram with a
 * link in their directory), so deleting a state directory frees them. */
static void
purge_ram_links(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		char target[PATH_MAX];
		char *path;
		ssize_t n;
		struct stat st;

		if (strcmp(e->d_name, ".") == 0 ||
		    strcmp(e->d_name, "..") == 0)
			continue;
		if ((path = moat_asprintf("%s/%s", dir, e->d_name)) == NULL)
			continue;
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
			purge_ram_links(path);
		} else if (S_ISLNK(st.st_mode) &&
		    (n = readlink(path, target, sizeof(target) - 1)) > 0) {
			target[n] = '\0';
			if (vmd_ram_path_ours(target))
				(void)unlink(target);
		}
		free(path);
	}
	closedir(d);
}

/* purge_spares: removes the spare RAM copies of the templates under
 * `state_dir` from /dev/shm (templates.c names them by template id). */
static void
purge_spares(const char *state_dir)
{
	char *root = moat_asprintf("%s/templates", state_dir);
	DIR *d = root ? opendir(root) : NULL;
	struct dirent *e;

	while (d != NULL && (e = readdir(d)) != NULL) {
		char *id, *dot;

		if (strncmp(e->d_name, "tpl-", 4) != 0 ||
		    (id = strdup(e->d_name)) == NULL)
			continue;
		if ((dot = strchr(id, '.')) != NULL)
			*dot = '\0';
		vmd_template_spares_purge(id);
		free(id);
	}
	if (d != NULL)
		closedir(d);
	free(root);
}

/* purge_sandbox_ram: removes the RAM files of the sandboxes that have a
 * directory under <state_dir>/vms ("sb-<hex>" or "sb-<hex>-r<hex>"): a
 * vmd killed with its sandboxes running leaves them behind. */
static void
purge_sandbox_ram(const char *state_dir)
{
	char *root = moat_asprintf("%s/vms", state_dir);
	DIR *d = root ? opendir(root) : NULL;
	struct dirent *e;

	while (d != NULL && (e = readdir(d)) != NULL) {
		char *id, *r, *path;

		if (strncmp(e->d_name, "sb-", 3) != 0 ||
		    (id = strdup(e->d_name)) == NULL)
			continue;
		if ((r = strstr(id + 3, "-r")) != NULL)
			*r = '\0';
		if ((path = vmd_ram_sandbox_path(id)) != NULL &&
		    vmd_ram_path_ours(path))
			(void)vmd_ram_unlink(path);
		free(path);
		free(id);
	}
	if (d != NULL)
		closedir(d);
	free(root);
}

/* Kills the VMMs a stopped vmd left running for the next one (adopt.h):
 * each one whose pidfile names a process started from its directory;
 * and removes each sandbox's control groups. */
static void
purge_vmms(const char *state_dir)
{
	char *root = moat_asprintf("%s/vms", state_dir);
	DIR *d = root ? opendir(root) : NULL;
	struct dirent *e;

	while (d != NULL && (e = readdir(d)) != NULL) {
		char *pidfile, *mark;

		if (e->d_name[0] == '.')
			continue;
		pidfile = moat_asprintf("%s/%s/qemu.pid", root, e->d_name);
		mark = moat_asprintf("%s/%s/", root, e->d_name);
		if (pidfile != NULL && mark != NULL &&
		    vmd_kill_orphan(pidfile, mark, false))
			fprintf(stderr, "moat-vmd: killed the VMM of %s\n",
			    e->d_name);
		/* Its jail's control groups, which only vmd removes. */
		vmd_cgroup_remove_named(moat_config_get(NULL, "vmd",
		                            "cgroup-root", "auto"),
		    e->d_name);
		free(pidfile);
		free(mark);
	}
	if (d != NULL)
		closedir(d);
	free(root);
}

/* `moat-vmd purge DIR`: deletes a stopped vmd's state directory with
 * everything it holds outside it (its snapshots' RAM copies on tmpfs)
 * and kills the VMMs it left running. */
static int
purge_main(const char *state_dir)
{
	int fd = -1, rv, err;

	if ((rv = state_lock(state_dir, &fd)) != MOAT_OK)
		return moat_status_exit_code(rv);
	/* The RAM dir the vmd used (default /dev/shm if none recorded). */
	if ((err = vmd_ram_dir_recall(state_dir)) != 0)
		fprintf(stderr,
		    "moat-vmd: the recorded RAM dir of %s is gone "
		    "(%s); RAM files there are not removed\n",
		    state_dir, strerror(err));
	purge_vmms(state_dir);
	purge_ram_links(state_dir);
	purge_spares(state_dir);
	purge_sandbox_ram(state_dir);
	close(fd);
	if ((err = moat_rm_rf(state_dir)) != 0) {
		fprintf(stderr, "moat-vmd: cannot remove %s: %s\n", state_dir,
		    strerror(err));
		return moat_status_exit_code(moat_status_from_errno(err));
	}
	return 0;
}

/* Signals are taken by sigwait in main; every thread made after this
 * inherits the mask (the spawner unblocks them in children). */
static void
vmd_block_signals(sigset_t *sigs)
{
	sigemptyset(sigs);
	sigaddset(sigs, SIGTERM);
	sigaddset(sigs, SIGINT);
	sigaddset(sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* Creates <state>/vms. Returns 0 or a status after printing why. */
static int
vmd_make_vms_dir(const struct vmd *vmd)
{
	char *vms = moat_asprintf("%s/vms", vmd->cfg.state_dir);
	int err = 0;

	if (vms == NULL || (err = moat_mkdir_p(vms, 0700)) != 0) {
		fprintf(stderr, "moat-vmd: cannot create %s: %s\n",
		    vms ? vms : "state dir", strerror(vms ? err : ENOMEM));
		free(vms);
		return MOAT_FAILED_PRECONDITION;
	}
	free(vms);
	return MOAT_OK;
}

/* Takes [vmd] ram-sharing; the library a private mapping needs is
 * <moat-vmd's directory>/../lib/libmoat-qemu-ramro.so. Returns 0 or a
 * status after logging why. */
static int
vmd_ram_sharing_open(const struct vmd *vmd)
{
	char exe[PATH_MAX];
	char *preload = NULL, *errmsg = NULL, *slash;
	const char *mode;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	int rv;

	if (n > 0) {
		exe[n] = '\0';
		if ((slash = strrchr(exe, '/')) != NULL)
			*slash = '\0';
		preload =
		    moat_asprintf("%s/../lib/libmoat-qemu-ramro.so", exe);
	}
	/* auto: private is QEMU's (Firecracker maps guest RAM its own way). */
	mode = vmd->cfg.ram_sharing;
	if (strcmp(mode, "auto") == 0 &&
	    strcmp(vmd->cfg.driver, "firecracker") == 0)
		mode = "copy";
	rv = vmd_ram_sharing_set(mode, preload, &errmsg);
	free(preload);
	if (rv != MOAT_OK) {
		moat_error(0, "%s (fix [vmd] ram-sharing / --ram-sharing)",
		    errmsg ? errmsg : "ram-sharing");
		free(errmsg);
		return rv;
	}
	moat_info(0, "guest RAM sharing: %s%s%s", vmd_ram_sharing(),
	    vmd_ram_private() ? ", preload " : "", vmd_ram_preload());
	return MOAT_OK;
}

/* Sets up the guest RAM dir, records it for `moat-vmd purge` and says
 * how snapshots will copy RAM there. Returns 0 or a status after
 * logging why. */
static int
vmd_ram_dir_open(const struct vmd *vmd)
{
	char *errmsg = NULL;
	int rv, err;

	if ((rv = vmd_ram_dir_set(vmd->cfg.ram_dir, &errmsg)) != MOAT_OK) {
		moat_error(0, "%s (fix [vmd] ram-dir / --ram-dir)", errmsg);
		free(errmsg);
		return rv;
	}
	if ((rv = vmd_ram_sharing_open(vmd)) != MOAT_OK)
		return rv;
	if ((err = vmd_ram_dir_record(vmd->cfg.state_dir)) != 0)
		moat_warn(0,
		    "cannot record the RAM dir in %s: %s; `moat-vmd "
		    "purge` will look in /dev/shm",
		    vmd->cfg.state_dir, strerror(err));
	moat_info(0, "guest RAM in %s: snapshots %s", vmd_ram_dir(),
	    vmd_ram_dir_reflinks() ?
	        "clone it (reflinks), the pause does "
	        "not grow with RAM" :
	        "copy it while the guest is paused (no "
	        "reflinks there; XFS or btrfs would avoid the copy)");
	return MOAT_OK;
}

/* Loads (or makes) the snapshot key and checks every image against its
 * manifest (verify.h). Returns 0 or a status after logging why. */
static int
vmd_verify_open(struct vmd *vmd)
{
	uint8_t key[VMD_SNAPSHOT_KEY_LEN];
	char *errmsg = NULL;
	bool created = false;
	unsigned bad;
	int rv;

	if ((rv = vmd_verify_key_load(vmd->cfg.snapshot_key_file, key,
	         &created, &errmsg)) != MOAT_OK) {
		moat_error(0, "%s", errmsg ? errmsg : "snapshot key");
		free(errmsg);
		return rv;
	}
	if (created)
		moat_info(0,
		    "snapshot key %s made: copy it to every node that "
		    "restores this node's snapshots (and set [vmd] "
		    "snapshot-key-file there)",
		    vmd->cfg.snapshot_key_file);
	vmd->verify = vmd_verify_new(key);
	OPENSSL_cleanse(key, sizeof(key));
	if (vmd->verify == NULL) {
		moat_error(0, "out of memory");
		return MOAT_INTERNAL;
	}
	if ((bad = vmd_images_verify_all(vmd)) > 0)
		moat_warn(0,
		    "%u image(s) refused: they do not match their "
		    "manifest.json (see above)",
		    bad);
	return MOAT_OK;
}

/* With [vmd] metrics set, serves vmd's metrics there (metrics.h).
 * Returns 0 or a status after logging why. */
static int
vmd_metrics_open(struct vmd *vmd, const struct moat_config *c)
{
	const char *addr = moat_config_get(c, SECTION, "metrics", "");
	char *errmsg = NULL;
	int rv;

	if (addr[0] == '\0')
		return MOAT_OK;
	if ((rv = vmd_metrics_start(vmd, addr, vmd_snapram_fill, &errmsg)) !=
	    MOAT_OK) {
		moat_error(0, "%s", errmsg ? errmsg : "metrics");
		free(errmsg);
		return rv;
	}
	return MOAT_OK;
}

/* Starts the RPC server on cfg.listen_url and, with a survey URL, the
 * survey respondent; warns when the gateway could not dial what is
 * advertised. Returns 0 or a status after logging why. */
static int
vmd_serve(struct vmd *vmd, struct moat_rpc_service *svc,
    struct moat_rpc_server **server, struct vmd_survey **survey)
{
	const struct vmd_config *cfg = &vmd->cfg;
	char *errmsg = NULL;
	int rv;

	/* Callers prove the gateway role by their certificate's CA
	 * (tls-peer-ca); the gateway proves this node's id by the name in
	 * ours. */
	struct moat_rpc_server_opts so = {
		.tls = cfg->tls,
		.peer = MOAT_TLS_PEER_REQUIRED,
		.what = "the vmd listener ([vmd] listen)",
	};
	vmd_service(vmd, svc);
	if ((rv = moat_rpc_server_start_opts(server, cfg->listen_url, svc, &so,
	         &errmsg)) != MOAT_OK) {
		moat_error(0, "%s", errmsg ? errmsg : "cannot listen");
		free(errmsg);
		return rv;
	}
	if (cfg->survey_url[0] != '\0' && cfg->advertise_url[0] == '\0' &&
	    (strstr(cfg->listen_url, "://0.0.0.0") != NULL ||
	        strstr(cfg->listen_url, "://*") != NULL ||
	        strstr(cfg->listen_url, "://[::]") != NULL))
		moat_warn(0,
		    "listening on %s, which the gateway cannot dial: "
		    "set [vmd] advertise-url to this host's reachable address",
		    cfg->listen_url);
	if (cfg->survey_url[0] != '\0' &&
	    (rv = vmd_survey_start(vmd, cfg->survey_url, survey, &errmsg)) !=
	        MOAT_OK) {
		moat_error(0, "%s", errmsg ? errmsg : "survey");
		free(errmsg);
		return rv;
	}
	return MOAT_OK;
}

int
main(int argc, char **argv)
{
	static struct vmd vmd;
	struct moat_config *config = NULL;
	struct moat_rpc_server *server = NULL;
	struct moat_rpc_service svc;
	struct vmd_survey *survey = NULL;
	char *errmsg = NULL;
	sigset_t sigs;
	int lock_fd = -1;
	int sig = 0;
	int rv;
	int err;

	moat_log_init("vmd", MOAT_LOG_INFO);
	moat_service_malloc_init();
	if (argc == 3 && strcmp(argv[1], "purge") == 0)
		return purge_main(argv[2]);
	if ((rv = moat_config_from_args(argc, argv, vmd_options, "moat-vmd",
	         SECTION, usage, &config)) != -1)
		return rv;
	if ((rv = vmd_survey_flags(argc, argv, config)) != MOAT_OK)
		goto out;
	{
		char *labels = labels_from_args(argc, argv);

		if (labels != NULL &&
		    moat_config_set_flag(config, SECTION, "label", labels) !=
		        MOAT_OK) {
			free(labels);
			moat_config_free(config);
			return moat_status_exit_code(MOAT_RESOURCE_EXHAUSTED);
		}
		free(labels);
	}
	if ((rv = vmd_configure(&vmd, config)) != MOAT_OK)
		goto out;
	if ((rv = vmd_egress_node_init(&vmd, config, &errmsg)) != MOAT_OK) {
		fprintf(stderr, "moat-vmd: %s\n", errmsg ? errmsg : "egress");
		free(errmsg);
		errmsg = NULL;
		goto out;
	}

	vmd_block_signals(&sigs);

	vmd.started_ms = moat_rpc_now_ms();
	pthread_mutex_init(&vmd.mu, NULL);
	pthread_mutex_init(&vmd.scratch_mu, NULL);
	if ((rv = vmd_make_vms_dir(&vmd)) != MOAT_OK ||
	    (rv = state_lock(vmd.cfg.state_dir, &lock_fd)) != MOAT_OK ||
	    (rv = vmd_ram_dir_open(&vmd)) != MOAT_OK)
		goto out;
	vmd_cordon_load(&vmd);
	if ((rv = vmd_jail_init(&vmd.cfg.jail, &errmsg)) != MOAT_OK) {
		moat_error(0, "%s", errmsg ? errmsg : "out of memory");
		free(errmsg);
		errmsg = NULL;
		goto out;
	}
	if ((rv = vmd_driver_select(&vmd, config, &errmsg)) != MOAT_OK) {
		moat_error(0, "%s", errmsg ? errmsg : "the VMM is not usable");
		free(errmsg);
		errmsg = NULL;
		goto out;
	}
	vmd_accel_init(&vmd);
	pthread_mutex_init(&vmd.fetch_mu, NULL);
	/* The dial does not block: a snapd that is down only makes pushes
	 * report remote_stored=false until it is up. */
	struct moat_rpc_client_opts snapd_opts = {
		.tls = vmd.cfg.tls,
		.server_name = vmd.cfg.snapd_tls_name,
		.what = "the dial to snapd ([vmd] snapd)",
	};
	if (vmd.cfg.snapd_url[0] != '\0' &&
	    (rv = moat_rpc_client_open_opts(&vmd.snapd, vmd.cfg.snapd_url,
	         &snapd_opts, &errmsg)) != MOAT_OK) {
		moat_error(0, "snapd %s: %s (fix [vmd] snapd / --snapd)",
		    vmd.cfg.snapd_url, errmsg ? errmsg : "cannot dial");
		free(errmsg);
		errmsg = NULL;
		goto out;
	}
	for (int i = 0; vmd.snapd != NULL && i < VMD_SNAPD_BULK; i++)
		if (moat_rpc_client_open_opts(&vmd.snapd_bulk[i],
		        vmd.cfg.snapd_url, &snapd_opts, &errmsg) != MOAT_OK) {
			/* Pulls then use vmd.snapd alone: slower, not wrong. */
			moat_warn(0, "snapd %s: an extra connection: %s",
			    vmd.cfg.snapd_url, errmsg ? errmsg : "?");
			free(errmsg);
			errmsg = NULL;
		}
	if ((err = moat_spawner_start()) != 0) {
		moat_error(0, "cannot start the spawner thread: %s",
		    strerror(err));
		rv = MOAT_INTERNAL;
		goto out;
	}
	vmd_exec_register(&vmd);
	/* Pooled VMMs an earlier vmd left are no sandboxes: they go first,
	 * so the adoption never sees them. */
	(void)vmd_pool_reap_leftovers(&vmd);
	/* Before serving: what an earlier vmd left runs on as before. */
	vmd_adopt_all(&vmd);
	/* After the adoption: what expired meanwhile goes first. */
	(void)!vmd_lifetime_start(&vmd);
	if ((rv = vmd_verify_open(&vmd)) != MOAT_OK)
		goto out;
	if ((rv = vmd_snapram_init(&vmd)) != MOAT_OK ||
	    (rv = vmd_templates_init(&vmd)) != MOAT_OK ||
	    (rv = vmd_pool_init(&vmd)) != MOAT_OK ||
	    (rv = vmd_images_init(&vmd)) != MOAT_OK ||
	    (rv = vmd_image_builds_init(&vmd)) != MOAT_OK) {
		moat_error(0, "out of memory");
		goto out;
	}
	/* Without the thread, pushes run before SnapshotSandbox answers. */
	(void)!vmd_pushq_start(&vmd);
	if ((rv = vmd_metrics_open(&vmd, config)) != MOAT_OK)
		goto out;

	if ((rv = vmd_serve(&vmd, &svc, &server, &survey)) != MOAT_OK)
		goto out;
	{
		char accel[8];
		vmd_accel_current(&vmd, accel);
		moat_info(0,
		    "moat-vmd %s node %s listening on %s (state %s, "
		    "images %s, accel %s%s%s, %s)",
		    MOAT_VERSION, vmd.cfg.node_id, vmd.cfg.listen_url,
		    vmd.cfg.state_dir, vmd.cfg.image_dir, vmd.cfg.accel,
		    accel[0] ? " -> " : "", accel, vmd.vmm_version);
	}

	while (sigwait(&sigs, &sig) != 0 || sig == SIGHUP)
		;
	moat_info(0, "%s: %s and stopping", strsignal(sig),
	    vmd.cfg.stop_sandboxes ?
	        "destroying every sandbox" :
	        "leaving every sandbox running for the next vmd");
	rv = MOAT_OK;
out:
	vmd_survey_stop(survey);
	vmd_lifetime_stop(&vmd);
	/* Also when the start failed after the adoption: leave them. */
	if (!vmd.cfg.stop_sandboxes)
		vmd_adopt_detach_all(&vmd);
	vmd_sandbox_destroy_all(&vmd);
	moat_rpc_server_stop(server);
	/* Deferred execs still waiting drop their sandboxes. */
	vmd_exec_stop();
	/* After the server: no create takes a pooled VMM any more; every
	 * one not taken is killed and its files removed. */
	vmd_pool_fini(&vmd);
	/* After the server: no create can start a build any more. */
	vmd_templates_fini(&vmd);
	/* A running image build is killed and its directory removed. */
	vmd_image_builds_fini(&vmd);
	vmd_images_fini(&vmd);
	/* After the server and the template builds: nothing queues or
	 * settles a push any more; the running one ends, queued ones are
	 * abandoned (pushed when evicted). */
	vmd_pushq_stop(&vmd);
	vmd_metrics_stop();
	vmd_snapram_fini(&vmd);
	vmd_verify_free(vmd.verify);
	moat_rpc_client_close(vmd.snapd);
	for (int i = 0; i < VMD_SNAPD_BULK; i++)
		moat_rpc_client_close(vmd.snapd_bulk[i]);
	moat_spawner_stop();
	moat_config_free(config);
	if (lock_fd >= 0)
		close(lock_fd);
	free(vmd.vmm_version);
	vmd_config_fini(&vmd.cfg);
	vmd_egress_node_fini(&vmd);
	if (rv == MOAT_OK)
		moat_info(0, "stopped");
	return rv == MOAT_OK ? 0 : moat_status_exit_code(rv);
}
