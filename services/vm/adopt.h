/*
 * adopt.h: sandboxes that outlive their vmd (issue 15, part 2). Each
 * listed sandbox has a state file, <sandbox dir>/state, written
 * atomically (rename) when it starts running and when vmd stops without
 * destroying it: what it is (tenant, image, sizes, labels, network,
 * template and snapshot lineage) and where its VMM is (driver, pid, jail
 * uid). A starting vmd reads them all (vmd_adopt_all): a live VMM that
 * matches its file is re-adopted (QMP checked, agent link, console and
 * egress reconnected, jail and cgroup taken over); a file that does not
 * match a live VMM makes that sandbox FAILED with the reason; a directory
 * without a file (a boot the old vmd never finished) is cleaned up.
 * Execs that ran across the restart are lost: their ids sit at or below
 * the sandbox's exec_id_floor and answer UNAVAILABLE. Not for: booting
 * (sandbox_boot.h) or what a destroy removes (sandbox.h).
 */
#ifndef MOAT_VMD_ADOPT_H
#define MOAT_VMD_ADOPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct sandbox;
struct vmd;

/* The state file's name in a sandbox directory. */
#define VMD_STATE_FILE "state"
/* Its first line. */
#define VMD_STATE_MAGIC "moat-sandbox-state 1"
/* The most a state file may hold (labels included). */
#define VMD_STATE_MAX (64u << 10)
/* Exec ids of the vmd that adopted a sandbox for the n-th time start
 * above n << VMD_EXEC_ID_GEN_SHIFT. */
#define VMD_EXEC_ID_GEN_SHIFT 40

/* What a state file says. Every string is heap (NULL: not set), owned by
 * the record; free with vmd_state_record_fini. */
struct vmd_state_record {
	char *id;
	char *tenant;
	char *image;
	char *test_mode;
	char *template_id;
	char *restored_from;
	char *network; /* vmd_egress_label form: "none", "allowlist:..." */
	char *accel;
	char *driver;
	char *failure;  /* set: the sandbox had FAILED, with this reason */
	char *vmm_info; /* the driver's struct moat_vmm adopt_info; absent
	                   in older files (NULL) */
	char **label_keys;
	char **label_values;
	size_t n_labels;
	uint32_t vcpus;
	uint32_t memory_mib;
	uint64_t scratch_mib;
	uint32_t boot_timeout_ms;
	uint64_t created_unix_ms;
	uint64_t pulled_bytes;
	uint64_t boot_ms;
	bool no_egress_port;
	int64_t pid;
	uint32_t jail_uid;
	uint32_t adoptions; /* vmds that re-adopted it so far */
	/* Lifetime (lifetime.h); absent in older files: 0, none. */
	uint64_t expires_unix_ms;
	uint32_t idle_timeout_s;
	uint64_t last_active_unix_ms;
};

/* vmd_state_encode: r as the state file's text. Returns 0 with *text
 * (heap, NUL-terminated, the caller frees) and *len, or MOAT_INTERNAL
 * when out of memory. */
int vmd_state_encode(const struct vmd_state_record *r, char **text,
    size_t *len) __attribute__((warn_unused_result));

/* vmd_state_decode: parses `len` bytes of a state file into *r (zeroed
 * first; fini it whatever this returns). Returns 0, or
 * MOAT_INVALID_ARGUMENT with *why (heap) naming the line and what is
 * wrong (truncated, unknown version, a bad number, a missing field). */
int vmd_state_decode(const char *text, size_t len, struct vmd_state_record *r,
    char **why) __attribute__((warn_unused_result));

/* vmd_state_record_fini: frees r's strings; r is zeroed. */
void vmd_state_record_fini(struct vmd_state_record *r);

/* vmd_adopt_save: writes sb's state file now (atomically). Thread-safe;
 * takes sb->mu. Returns 0 or a status after a log line (the sandbox
 * runs on; only a later restart would lose it). */
int vmd_adopt_save(struct sandbox *sb);

/* vmd_adopt_all: at start, before serving, after the driver and the
 * jail are set up: re-adopts, fails or cleans up each directory in
 * <state>/vms (see above), and logs one line for each. */
void vmd_adopt_all(struct vmd *vmd);

/* vmd_adopt_detach_all: at shutdown without [vmd]
 * stop-sandboxes-on-exit: refuses new sandboxes, destroys the ones that
 * were still booting, and lets the others run on: their state files are
 * written, their guest links, consoles and egress proxies close, and
 * their VMMs stay for the next vmd. */
void vmd_adopt_detach_all(struct vmd *vmd);

#endif
