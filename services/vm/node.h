/*
 * node.h: the node as moat-vmd sees it: its settings (struct
 * vmd_config), the limits a client can reach, and struct vmd with the
 * sandbox table and the shared resources every file reaches through it.
 * Locks: vmd->mu guards the sandbox table, refcounts and memory
 * accounting; take it before any sb->mu, never the other way, and never
 * hold it across a guest call or a wait on another thread. Not for: a
 * sandbox itself (sandbox.h) or the RPC wire format (service.c).
 */
#ifndef MOAT_VMD_NODE_H
#define MOAT_VMD_NODE_H

#include "labels.h"
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "moat/rpc.h"
#include "jail.h"
#include "vmm.h"

/* Limits a client can reach; each is checked with a message naming it. */
#define VMD_MIN_MEMORY_MIB 128u
#define VMD_MIN_SCRATCH_MIB 64u
#define VMD_MAX_SCRATCH_MIB 65536u
#define VMD_DEFAULT_VCPUS 1u
#define VMD_DEFAULT_MEMORY_MIB 256u
#define VMD_DEFAULT_SCRATCH_MIB 1024u
#define VMD_DEFAULT_BOOT_TIMEOUT_MS 60000u
#define VMD_ACCEL_PROBE_MS 15000u
#define VMD_EXEC_DEFAULT_TIMEOUT_MS 300000u
#define VMD_EXEC_MAX_TIMEOUT_MS 86400000u /* 24 h */
#define VMD_EXEC_DEFAULT_CAP (1u << 20)
#define VMD_EXEC_MAX_CAP (64u << 20)
#define VMD_EXEC_KEEP_FINISHED 32u
#define VMD_EXEC_MAX_RUNNING 256u
#define VMD_FILE_READ_MAX (8u << 20)

struct vmd_config {
	char *state_dir;
	char *image_dir;
	char *cache_dir;
	char *listen_url;
	char *survey_url;    /* "" : no survey respondent */
	char *advertise_url; /* Node.rpc_url; default listen_url */
	char *node_id;
	char *accel; /* "auto", "kvm" or "tcg" */
	char *qemu_binary;
	char *kvm_device; /* accel=auto checks that it opens */
	char *driver;     /* "auto", "qemu" or "firecracker" */
	char *firecracker_binary;
	bool test_hooks;
	uint32_t vcpus_total;
	uint64_t memory_mib_total;
	uint32_t max_vcpus; /* per sandbox */
	uint32_t max_memory_mib;
	uint32_t boot_timeout_ms;
	char *snapd_url;          /* "" : snapshots stay local (no push) */
	bool templates;           /* creates clone the node's ready
	                              snapshot of the shape (templates.c) */
	bool template_reflink;    /* [vmd] template-reflink: with reflinks,
	                             clones reflink the template's RAM (off,
	                             the default: they copy it) */
	uint32_t template_spares; /* ready RAM copies kept per template in
	                              the RAM dir for clones to take (0:
	                              none; unused where it has reflinks) */
	uint32_t vmm_pool;        /* [vmd] vmm-pool: pre-started VMMs kept
	                              per template (pool.h); 0: off */
	char *ram_dir;            /* [vmd] ram-dir (ramdir.c) */
	char *ram_sharing;        /* [vmd] ram-sharing (ramdir.c) */
	/* TLS (moat/tls.h): tls-cert, tls-key, tls-ca (snapd's and the
	 * gateway's CAs), tls-peer-ca (callers: the gateway's), insecure;
	 * owned. The names snapd's and the gateway survey's certificates
	 * must carry. */
	struct moat_tls *tls;
	char *snapd_tls_name;  /* [vmd] snapd-tls-name, default "snapd" */
	char *survey_tls_name; /* [vmd] survey-tls-name, default "gateway" */
	/* The VMM jail (jail.h): isolation, jail-uid-base, jail-uid-count,
	 * jail-gid, vmm-overhead-mib, vmm-pids, vmm-nofile, cgroup-root
	 * (owned: cgroup_root). */
	struct vmd_jail_settings jail;
	char *cgroup_root;
	uint64_t snapshot_ram_mib; /* [vmd] snapshot-ram-mib: RAM copies of
	                              snapshots kept in the RAM dir before
	                              the least used go to disk (snapram.c) */
	char *snapshot_key_file;   /* [vmd] snapshot-key-file (verify.h) */
	/* Bounds (issue 14, B). */
	bool allow_tcg; /* [vmd] allow-tcg: accel=auto may fall back to TCG
	                   (accel.c) */
	bool stop_sandboxes;         /* [vmd] stop-sandboxes-on-exit (--stop-
	                        sandboxes): SIGTERM destroys them; else they
	                        run on for the next vmd (adopt.h) */
	uint64_t console_max_bytes;  /* [vmd] console-max-kib (console.h) */
	uint64_t exec_output_budget; /* [vmd] exec-output-budget-mib: exec
	                                output all sandboxes may hold in vmd
	                                (exec.c) */
	uint64_t archive_max_bytes;  /* [vmd] archive-max-mib: one tar
	                                archive PutArchive takes and what it
	                                unpacks to (files.c, issue 17) */
	uint64_t disk_reserve_bytes; /* [vmd] disk-reserve-mib: free space in
	                                the state dir that scratch disks may
	                                never claim (scratch.c) */
	struct vmd_labels labels;    /* [vmd] labels and --label (labels.h) */
	/* Image builds (image_build.c): [vmd] image-build-script,
	 * image-build-agent ("" : found next to the binary) and
	 * image-build-timeout-s. */
	char *image_build_script;
	char *image_build_agent;
	uint32_t image_build_timeout_s;
};

/* The accelerator decision (accel.c). mu guards the rest. */
struct vmd_accel {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	char decided[8]; /* "", "kvm", "tcg" */
	bool probing;    /* one boot is finding out */
};

struct moat_tls;
struct sandbox;
struct vmd_guest_handler;
struct vmd_templates;
struct vmd_pool;
struct vmd_snapram;
struct vmd_pushq;
struct vmd_verify;
struct vmd_egress_node;
struct vmd_lifetime_node;
struct vmd_images;
struct vmd_image_builds;

/* Extra connections to snapd that pulls spread their requests over. */
#define VMD_SNAPD_BULK 3

struct vmd {
	struct vmd_config cfg;
	const struct moat_vmm_ops *vmm;
	const char *vmm_binary; /* the chosen driver's binary (cfg) */
	char *vmm_version;      /* from probe */
	uint64_t started_ms;    /* monotonic */
	struct vmd_accel accel;
	pthread_mutex_t scratch_mu; /* one scratch template made at a time */
	struct moat_rpc_client *snapd; /* NULL without [vmd] snapd; owned */
	/* More connections to the same snapd for a pull's GetChunks (one
	 * TLS stream carries one reply at a time); NULL ones fall back to
	 * snapd. Owned. */
	struct moat_rpc_client *snapd_bulk[VMD_SNAPD_BULK];
	pthread_mutex_t
	    fetch_mu; /* one snapshot pulled from snapd at a time */

	struct vmd_templates *templates; /* templates.c; owned */
	struct vmd_pool *pool;           /* pool.c; owned; NULL: off */
	struct vmd_snapram *snapram;     /* snapram.c; owned */
	struct vmd_pushq *pushq; /* pushq.c; owned; NULL: pushes inline */
	/* The snapshot key and verified-once cache (verify.c); owned.
	 * NULL only in unit tests: nothing is sealed or checked. */
	struct vmd_verify *verify;
	struct vmd_egress_node *egress;  /* egress.c: egress-hosts, events */
	struct vmd_images *images;       /* image_pull.c: pulls, chunk index */
	struct vmd_image_builds *builds; /* image_build.c; owned */

	/* How guest events beyond the agent's own reach whoever handles
	 * them (exec.c registers itself: vmd_sandbox_set_guest_handler);
	 * set before serving, read without a lock. */
	const struct vmd_guest_handler *guest_handler;

	/* Exec output held in vmd's buffers, all sandboxes, against
	 * cfg.exec_output_budget; and how many streams the budget cut
	 * short. Atomics (exec.c). */
	uint64_t exec_output_used;
	uint64_t exec_output_cut;

	pthread_mutex_t mu;        /* guards the fields below */
	struct sandbox *sandboxes; /* singly linked, newest first */
	uint64_t memory_mib_reserved;
	/* The warm pool's VMMs not yet taken (pool.c): in the RAM dir's
	 * count, but not in memory_mib_reserved (a create that needs the
	 * room has the pool give them up first). */
	uint64_t memory_mib_pooled;
	/* Of the two above: guests whose RAM is a private mapping of a
	 * snapshot's file (ram-sharing private), which their writes never
	 * put in the RAM dir (its admission leaves them out). */
	uint64_t memory_mib_mapped;
	bool shutting_down;
	bool cordoned;       /* cordon.c: no new sandboxes */
	char *cordon_reason; /* heap or NULL */

	/* The expiry thread (lifetime.c); NULL when not running. */
	struct vmd_lifetime_node *lifetime;
};

#endif
